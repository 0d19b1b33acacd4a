"""Head-first vs tail-first eviction in a chained-hash prefix cache, and the bytes it strands.

A chained-hash lookup (see :mod:`lib.kvcache.chained_hash`) can only match block ``i`` if blocks
``0..i-1`` matched. So evicting the *head* of a cached chain strands every block behind it: they
stay resident, using memory, but no request can ever hit them. Evicting tails first (deepest
block first) never strands anything.

:func:`simulate` runs a workload through :class:`~lib.kvcache.chained_hash.PrefixBlockCache` one
request at a time (allocate, then free) and records hits and stranded bytes after each request.

Closed form (:func:`cyclic_steady_state`) for the cyclic workload
(:func:`cyclic_prefix_workload`): ``P`` distinct prefixes of ``n`` full blocks, requested
round-robin, capacity ``C`` blocks with ``n <= C < P * n``. With one request at a time and no
hits, the free queue always holds the last ``C`` blocks freed, and prefix ``p`` comes back after
the other ``P - 1`` prefixes pushed ``(P - 1) * n`` newer blocks in.

* head-first: each request frees head..tail, so a prefix's head is its oldest block and goes
  first; the requested prefix always misses (hit rate 0). The resident window is the last ``C``
  blocks freed, which ends on a chain boundary, so exactly one chain is cut: it keeps its last
  ``C mod n`` blocks and lost its head. Stranded bytes = ``(C mod n) * block_bytes``.
* tail-first: the cut chain keeps its *first* ``C mod n`` blocks, all reachable: stranded = 0.
  The requested prefix is the oldest chain, so it hits ``r = clip(C - (P - 1) n, 0, n)`` head
  blocks: hit rate ``r / n``.

If ``C >= P * n`` everything fits: after the first round every request hits fully and nothing is
stranded, under either policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lib.inputs import integer

from .chained_hash import PrefixBlockCache

__all__ = [
    "EvictionSimulation",
    "PrefixWorkload",
    "SteadyState",
    "cyclic_prefix_workload",
    "cyclic_steady_state",
    "shared_prefix_workload",
    "simulate",
]

Policy = Literal["head_first", "tail_first"]


def _check_policy(policy: object) -> None:
    if policy not in ("head_first", "tail_first"):
        raise ValueError(f"policy must be 'head_first' or 'tail_first', got {policy!r}")


@dataclass(frozen=True)
class PrefixWorkload:
    """A list of request prompts (token tuples) for a cache with ``block_size``-token blocks."""

    block_size: int
    requests: tuple[tuple[int, ...], ...]


def _fresh_blocks(num_blocks: int, block_size: int, next_token: list[int]) -> tuple[int, ...]:
    """``num_blocks`` blocks of token ids never used before (labels, not real vocabulary)."""
    start = next_token[0]
    next_token[0] += num_blocks * block_size
    return tuple(range(start, next_token[0]))


def cyclic_prefix_workload(
    num_prefixes: int, prefix_blocks: int, num_requests: int, block_size: int
) -> PrefixWorkload:
    """Request ``k`` is prefix ``k mod num_prefixes``: ``prefix_blocks`` full blocks, distinct
    tokens per prefix. The workload behind :func:`cyclic_steady_state`."""
    num_prefixes = integer("num_prefixes", num_prefixes, 1)
    prefix_blocks = integer("prefix_blocks", prefix_blocks, 1)
    num_requests = integer("num_requests", num_requests, 0)
    block_size = integer("block_size", block_size, 1)
    counter = [0]
    prefixes = [_fresh_blocks(prefix_blocks, block_size, counter) for _ in range(num_prefixes)]
    requests = tuple(prefixes[k % num_prefixes] for k in range(num_requests))
    return PrefixWorkload(block_size, requests)


def shared_prefix_workload(
    prefix_blocks: Sequence[int],
    num_requests: int,
    block_size: int,
    *,
    suffix_blocks: int = 0,
    seed: int = 0,
) -> PrefixWorkload:
    """Requests reusing a few shared prefixes (system prompts, documents), seeded.

    ``prefix_blocks[p]`` is the length of shared prefix ``p`` in full blocks. Each request picks
    a prefix uniformly at random and appends ``suffix_blocks`` blocks of its own (never shared).
    """
    lengths = [integer("prefix_blocks entry", n, 1) for n in prefix_blocks]
    if not lengths:
        raise ValueError("prefix_blocks must list at least one prefix length (in blocks)")
    num_requests = integer("num_requests", num_requests, 0)
    block_size = integer("block_size", block_size, 1)
    suffix_blocks = integer("suffix_blocks", suffix_blocks, 0)
    rng = np.random.default_rng(seed)
    counter = [0]
    prefixes = [_fresh_blocks(n, block_size, counter) for n in lengths]
    choices = rng.integers(0, len(prefixes), num_requests).tolist()
    requests = tuple(
        prefixes[p] + _fresh_blocks(suffix_blocks, block_size, counter) for p in choices
    )
    return PrefixWorkload(block_size, requests)


@dataclass(frozen=True)
class EvictionSimulation:
    """Per-request outcome of :func:`simulate` (index ``k`` = after request ``k`` finished)."""

    policy: str
    hit_tokens: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    stranded_bytes: tuple[int, ...]

    def hit_rate(self, skip_requests: int = 0) -> float:
        """Token hit rate ``sum(hit) / sum(prompt)`` over requests ``skip_requests`` onward."""
        skip_requests = integer("skip_requests", skip_requests, 0)
        total = sum(self.prompt_tokens[skip_requests:])
        return sum(self.hit_tokens[skip_requests:]) / total if total else 0.0

    @property
    def max_stranded_bytes(self) -> int:
        """Largest stranded footprint seen after any request, in bytes."""
        return max(self.stranded_bytes, default=0)


def simulate(
    policy: Policy, capacity_blocks: int, workload: PrefixWorkload, block_bytes: int
) -> EvictionSimulation:
    """Run ``workload`` one request at a time through a cache of ``capacity_blocks`` blocks.

    ``policy`` picks which end of a freed chain is evicted first. ``block_bytes`` is the KV size
    of one block in bytes (``2 * layers * kv_heads * head_dim * dtype_bytes * block_size``).
    Stranded bytes = ``len(cache.stranded_blocks()) * block_bytes`` after each request.
    """
    _check_policy(policy)
    capacity_blocks = integer("capacity_blocks", capacity_blocks, 1)
    block_bytes = integer("block_bytes", block_bytes, 1)
    if not isinstance(workload, PrefixWorkload):
        raise ValueError(f"workload must be a PrefixWorkload, got {type(workload).__name__}")
    cache = PrefixBlockCache(capacity_blocks, workload.block_size, eviction_order=policy)
    hits, prompts, stranded = [], [], []
    for index, tokens in enumerate(workload.requests):
        allocation = cache.allocate(index, tokens)  # raises OutOfBlocks if one request won't fit
        cache.free(index)
        hits.append(allocation.num_hit_tokens)
        prompts.append(len(tokens))
        stranded.append(len(cache.stranded_blocks()) * block_bytes)
    return EvictionSimulation(policy, tuple(hits), tuple(prompts), tuple(stranded))


@dataclass(frozen=True)
class SteadyState:
    """Closed-form steady state of the cyclic workload, reached after ``warmup_requests``."""

    hit_rate: float
    stranded_bytes: int
    warmup_requests: int


def cyclic_steady_state(
    policy: Policy, capacity_blocks: int, num_prefixes: int, prefix_blocks: int, block_bytes: int
) -> SteadyState:
    """Hit rate and stranded bytes of the cyclic workload in steady state (module docstring).

    With ``C = capacity_blocks``, ``n = prefix_blocks``, ``P = num_prefixes`` and ``C < P n``:
    head-first: hit rate 0, stranded ``(C mod n) * block_bytes``; tail-first: hit rate
    ``clip(C - (P - 1) n, 0, n) / n``, stranded 0. With ``C >= P n``: hit rate 1, stranded 0.
    Holds from request ``warmup_requests = max(P, ceil(C / n))`` on (0-based).
    """
    _check_policy(policy)
    n = integer("prefix_blocks", prefix_blocks, 1)
    c = integer("capacity_blocks", capacity_blocks, n)
    p = integer("num_prefixes", num_prefixes, 1)
    block_bytes = integer("block_bytes", block_bytes, 1)
    warmup = max(p, -(-c // n))
    if c >= p * n:
        return SteadyState(1.0, 0, p)
    if policy == "head_first":
        return SteadyState(0.0, (c % n) * block_bytes, warmup)
    resident_head_blocks = min(max(c - (p - 1) * n, 0), n)
    return SteadyState(resident_head_blocks / n, 0, warmup)
