"""Block-hash prefix cache tools (I092, I014): a KV-provenance oracle for
:class:`lib.kvcache.PrefixBlockCache`, weak and unchained hashes, a colliding-block finder, the
birthday bound, a replay of a trace through the block cache, and the KV bytes of one block.
The pool size in blocks is :func:`lib.perf.memory.memory_budget` (``.num_blocks``), not here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.kvcache import (
    CacheAllocation,
    PrefixBlockCache,
    hash_block,
)
from lib.kvcache.radix_scenarios import PrefixIds
from lib.perf.roofline import kv_shard_fraction
from lib.registry.models import Model, model

# ---- block caches: provenance oracle, hashes, collisions ---------------------------------------


BlockHashFn = Callable[[int | None, tuple[int, ...]], int]


def truncated_hash(bits: int) -> BlockHashFn:
    """A weak chained hash: the low ``bits`` bits of :func:`lib.kvcache.hash_block`.

    With 2^bits values, collisions among n blocks become likely near n ~ 2^(bits/2).
    """
    b = integer("bits", bits, 1, 64, unit="(hash_block gives 64)")
    mask = (1 << b) - 1

    def weak(parent: int | None, block_tokens: tuple[int, ...]) -> int:
        return hash_block(parent, block_tokens) & mask

    weak.__name__ = f"truncated_hash_{b}"
    return weak


def unchained_hash(parent_hash: int | None, block_tokens: tuple[int, ...]) -> int:
    """The classic mistake: hash a block by its own tokens only, ignoring the prefix before it.

    Two prompts with the same block at position i then name it alike, although its KV depends on
    every earlier token.
    """
    return hash_block(None, block_tokens)


def find_colliding_block(
    hash_fn: BlockHashFn,
    block_tokens: Sequence[int],
    *,
    parent_hash: int | None = None,
    vocab_size: int = 1000,
    seed: int = 0,
    max_tries: int = 1_000_000,
) -> tuple[int, ...]:
    """A block of the same length with different tokens but the same ``hash_fn(parent, block)``.

    Random search (seeded); raises ValueError if none is found in ``max_tries`` (a strong hash).
    """
    target_block = tuple(block_tokens)
    if not target_block:
        raise ValueError("block_tokens must hold at least one token")
    tries = integer("max_tries", max_tries, 1)
    v = integer("vocab_size", vocab_size, 2)
    target = hash_fn(parent_hash, target_block)
    rng = np.random.default_rng(seed)
    batch = 4096
    done = 0
    while done < tries:
        for row in rng.integers(0, v, (min(batch, tries - done), len(target_block))).tolist():
            cand = tuple(row)
            if cand != target_block and hash_fn(parent_hash, cand) == target:
                return cand
        done += batch
    raise ValueError(f"no colliding block found in {tries} tries: the hash looks strong enough")


def birthday_collision_probability(num_items: float, hash_bits: int) -> float:
    """P(at least two of n items share a hash of b bits) ~ 1 - exp(-n (n - 1) / 2^(b + 1))."""
    n = real("num_items", num_items, 0)
    b = integer("hash_bits", hash_bits, 1)
    return -math.expm1(-n * (n - 1) / 2.0 ** (b + 1))


class KVProvenanceOracle:
    """Wraps a :class:`lib.kvcache.PrefixBlockCache` and remembers, per block, the exact token
    prefix its KV was computed from. A hit on a block computed from a different prefix is wrong
    KV, whatever the hashes say: KV of block i is a function of tokens 0 .. end of block i.

    Uses only what ``allocate`` returns, never the cache's internals, so it watches any block cache
    whose ``allocate(request_id, tokens)`` returns ``.block_ids`` and ``.num_hit_blocks`` (give
    ``block_size`` when the cache has no ``block_size`` attribute).
    """

    def __init__(self, cache, block_size: int | None = None) -> None:
        if not all(callable(getattr(cache, m, None)) for m in ("allocate", "free")):
            raise ValueError(f"cache must be a block cache with allocate() and free(), e.g. a PrefixBlockCache; "
                             f"got {type(cache).__name__}")
        size = block_size if block_size is not None else getattr(cache, "block_size", None)
        self.block_size = integer("block_size", size, 1)
        self.cache = cache
        self.computed_from: dict[int, int] = {}  # block -> id of the prefix its KV came from
        self._ids = PrefixIds()
        self.violations: list[str] = []
        self.wrong_requests: set = set()
        self._tokens: dict = {}

    def allocate(self, request_id, tokens: Sequence[int]) -> CacheAllocation:
        """Allocate through the cache; check every hit block's provenance; record fresh ones."""
        tokens = tuple(tokens)
        alloc = self.cache.allocate(request_id, tokens)
        ids = self._ids.of(tokens, self.block_size)
        for i, block in enumerate(alloc.block_ids):
            prefix = ids[i]
            if i < alloc.num_hit_blocks:
                if self.computed_from.get(block) != prefix:
                    self.violations.append(
                        f"request {request_id!r} block {i}: reused block {block}, whose KV was computed"
                        " from a different prefix"
                    )
                    self.wrong_requests.add(request_id)
            else:
                self.computed_from[block] = prefix
        self._tokens[request_id] = tokens
        return alloc

    def free(self, request_id) -> None:
        self.cache.free(request_id)
        self._tokens.pop(request_id, None)

    def payload_matches(self, request_id) -> bool:
        """Whether the request's blocks hold its own tokens (the cache's stand-in for KV)."""
        return self.cache.read_tokens(request_id) == list(self._tokens[request_id])


@dataclass(frozen=True)
class BlockCacheRun:
    """Outcome of :func:`run_block_cache`."""

    hit_tokens: int
    prompt_tokens: int
    wrong_kv_requests: int  # requests handed KV computed from another prefix (provenance oracle)
    payload_mismatches: int  # requests whose blocks hold other tokens (a stricter, visible subset)
    max_stranded_blocks: int
    first_violation: str

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_block_cache(
    requests: Sequence[Sequence[int]],
    *,
    num_blocks: int,
    block_size: int,
    hash_fn: BlockHashFn = hash_block,
    verify_on_hit: bool = True,
    eviction_order: str = "tail_first",
    running: int = 1,
    track_stranded: bool = True,
) -> BlockCacheRun:
    """Replay ``requests`` through a PrefixBlockCache (``running`` at a time, oldest freed first)
    under the provenance oracle; count hits, wrong-KV requests and (if ``track_stranded``, an
    O(cache) scan per request) the most stranded blocks seen."""
    if not isinstance(verify_on_hit, bool):
        raise ValueError(f"verify_on_hit must be True or False, got {verify_on_hit!r}")
    run = integer("running", running, 1)
    cache = PrefixBlockCache(
        num_blocks,
        block_size,
        hash_fn=hash_fn,
        verify_on_hit=verify_on_hit,
        eviction_order=eviction_order,
    )
    oracle = KVProvenanceOracle(cache)
    live: deque[int] = deque()
    hits = prompt = mismatches = stranded = 0
    for k, r in enumerate(requests):
        alloc = oracle.allocate(k, r)
        hits += alloc.num_hit_tokens
        prompt += len(r)
        mismatches += not oracle.payload_matches(k)
        live.append(k)
        if len(live) >= run:
            oracle.free(live.popleft())
        if track_stranded:
            stranded = max(stranded, len(cache.stranded_blocks()))
    return BlockCacheRun(
        hits,
        prompt,
        len(oracle.wrong_requests),
        mismatches,
        stranded,
        oracle.violations[0] if oracle.violations else "",
    )


# ---- KV blocks in bytes -------------------------------------------------------------------------


def kv_block_bytes(
    mdl: str | Model, block_size: int = 16, kv_dtype: str = "bf16", tp: int = 1
) -> float:
    """KV bytes of one block of ``block_size`` tokens: block_size x kv_bytes_per_token x shard.

    tp = 1 gives the whole replica's block (all layers, all KV heads); tp > 1 one GPU's share.
    """
    m = model(mdl)
    bs = integer("block_size", block_size, 1)
    return bs * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, m.check_tp(tp))
