"""Practice mode for chained block hashes (I092): a predictive model and a grader for any block cache.

:class:`BlockCacheModel` predicts, from token sequences alone (no hashes, no block ids of the
cache under test), what a vLLM-style prefix block cache must do: a request hits the longest run
of full blocks whose whole prefix is cached; a finished request's blocks stay cached in an LRU
free queue (deepest block first, so a chain loses its tail before its head; blocks holding no
cached content go to the front); an allocation takes fresh blocks from the front, dropping what
they cached; a request that cannot get enough blocks changes nothing (``OutOfBlocks``).

:func:`check_block_cache` grades any implementation through a factory
``factory(num_blocks, block_size, hash_fn)``: with the full 64-bit hash every hit count and every
refusal must equal the model's; under an injected weak hash (a few bits, so collisions are
everywhere) the KV-provenance property must hold (every reused block was computed from exactly the
request's prefix: :class:`lib.kvcache.block_hash.KVProvenanceOracle`, which sees a block with the
right tokens computed after a wrong prefix, where comparing payloads cannot). Fresh blocks must
never be blocks a running request holds. The first failing program is printed, shrunk.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .allocator import OutOfBlocks
from .block_hash import KVProvenanceOracle, truncated_hash
from .chained_hash import PrefixBlockCache, hash_block

__all__ = ["BLOCK_CACHE_VARIANTS", "BlockCacheModel", "block_cache_cases", "block_cache_variant",
           "check_block_cache", "run_block_program"]


class _Block:
    __slots__ = ("key", "refs")

    def __init__(self) -> None:
        self.key: tuple[int, ...] | None = None  # the token prefix whose last full block this holds
        self.refs = 0


class BlockCacheModel:
    """What a chained-hash prefix block cache with tail-first LRU freeing must do (see module)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = integer("num_blocks", num_blocks, 1)
        self.block_size = integer("block_size", block_size, 1)
        blocks = [_Block() for _ in range(self.num_blocks)]
        self.free: OrderedDict[_Block, None] = OrderedDict.fromkeys(blocks)
        self.cached: dict[tuple[int, ...], _Block] = {}
        self.running: dict[object, list[_Block]] = {}

    def lookup(self, tokens: Sequence[int]) -> int:
        """Full blocks of ``tokens`` found cached, from block 0 on."""
        tokens, bs, hits = tuple(tokens), self.block_size, 0
        while (hits + 1) * bs <= len(tokens) and tokens[: (hits + 1) * bs] in self.cached:
            hits += 1
        return hits

    def allocate(self, request_id, tokens: Sequence[int]) -> int:
        """Blocks for a new request; returns its hit blocks or raises OutOfBlocks (state unchanged)."""
        tokens, bs = tuple(tokens), self.block_size
        hits = self.lookup(tokens)
        hit_blocks = [self.cached[tokens[: (i + 1) * bs]] for i in range(hits)]
        needed = -(-len(tokens) // bs)
        takeable = len(self.free) - sum(1 for b in set(hit_blocks) if b in self.free)
        if needed - hits > takeable:
            raise OutOfBlocks(f"needs {needed - hits} fresh blocks, only {takeable} can be taken")
        for b in hit_blocks:
            b.refs += 1
            self.free.pop(b, None)
        table = list(hit_blocks)
        for index in range(hits, needed):
            b, _ = self.free.popitem(last=False)
            if b.key is not None:
                del self.cached[b.key]
                b.key = None
            b.refs = 1
            end = (index + 1) * bs
            if end <= len(tokens):
                key = tokens[:end]
                owner = self.cached.get(key)
                if owner is None or owner.refs == 0:
                    if owner is not None:  # a free block held it: the newcomer displaces it
                        owner.key = None
                        self.free.move_to_end(owner, last=False)
                    b.key = key
                    self.cached[key] = b
            table.append(b)
        self.running[request_id] = table
        return hits

    def finish(self, request_id) -> None:
        """A request ends: blocks nobody else uses join the free queue, deepest first, still cached."""
        released = []
        for b in self.running.pop(request_id):
            b.refs -= 1
            if b.refs == 0:
                released.append(b)
        for b in reversed(released):
            self.free[b] = None
            if b.key is None:
                self.free.move_to_end(b, last=False)


# ---- grading ------------------------------------------------------------------------------


def _blocks_and_hits(result) -> tuple[tuple[int, ...], int]:
    if hasattr(result, "block_ids") and hasattr(result, "num_hit_blocks"):
        return tuple(result.block_ids), int(result.num_hit_blocks)
    try:
        blocks, hits = result
    except (TypeError, ValueError):
        raise AssertionError(f"allocate must return (block_ids, num_hit_blocks) or an object with .block_ids and "
                             f".num_hit_blocks, got {result!r}") from None
    return tuple(blocks), int(hits)


class _Adapter:
    """Lets KVProvenanceOracle watch any candidate (it needs allocate -> .block_ids/.num_hit_blocks)."""

    def __init__(self, cache, block_size: int) -> None:
        self.cache, self.block_size = cache, block_size

    def allocate(self, request_id, tokens):
        from .chained_hash import CacheAllocation

        blocks, hits = _blocks_and_hits(self.cache.allocate(request_id, list(tokens)))
        return CacheAllocation(blocks, hits, self.block_size)

    def free(self, request_id):
        self.cache.free(request_id)


def _describe_blocks(ops: Sequence) -> str:
    lines = [] if ops and ops[0][0] == "setup" else ["  cache = factory(num_blocks=8, block_size=2, hash_fn=hash_block)"]
    for op in ops:
        if op[0] == "setup":
            _, n, bs, bits = op
            h = "hash_block (64 bits)" if bits == 64 else f"a {bits}-bit hash"
            lines.append(f"  cache = factory(num_blocks={n}, block_size={bs}, hash_fn={h})")
        elif op[0] == "allocate":
            lines.append(f"  allocate({op[1]!r}, {list(op[2])})")
        else:
            lines.append(f"  free({op[1]!r})")
    return "\n".join(lines)


def run_block_program(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` (a leading ``("setup", num_blocks, block_size, hash_bits)``) on the candidate."""
    ops = list(ops)
    num_blocks, bs, bits = ops[0][1:] if ops and ops[0][0] == "setup" else (8, 2, 64)
    hash_fn = hash_block if bits == 64 else truncated_hash(bits)
    cache = factory(num_blocks, bs, hash_fn)
    oracle = KVProvenanceOracle(_Adapter(cache, bs), block_size=bs)
    model = BlockCacheModel(num_blocks, bs) if bits == 64 else None
    held: dict[object, tuple[int, ...]] = {}
    for op in ops:
        if op[0] == "setup":
            continue
        rid = op[1]
        if op[0] == "free":
            if rid not in held:
                continue
            oracle.free(rid)
            del held[rid]
            if model is not None:
                model.finish(rid)
            continue
        if rid in held:
            continue
        tokens = tuple(op[2])
        try:
            want = model.allocate(rid, tokens) if model is not None else None
            refused = False
        except OutOfBlocks:
            refused = True
        try:
            alloc = oracle.allocate(rid, tokens)
        except Exception as err:  # noqa: BLE001 - judged below
            if type(err).__name__ == "OutOfBlocks" or isinstance(err, OutOfBlocks):
                if model is None or refused:
                    continue
                raise AssertionError(f"allocate({rid!r}) raised OutOfBlocks, but the free queue can give the "
                                     "blocks it needs") from None
            raise
        if refused:
            raise AssertionError(f"allocate({rid!r}) succeeded, but the free queue cannot give all the blocks it "
                                 "needs (it should raise OutOfBlocks and change nothing)")
        blocks = alloc.block_ids
        need = -(-len(tokens) // bs)
        if len(blocks) != need or len(set(blocks)) != need or not all(
                isinstance(b, int) and 0 <= b < num_blocks for b in blocks):
            raise AssertionError(f"allocate({rid!r}) returned blocks {list(blocks)}; {need} distinct blocks in "
                                 f"0..{num_blocks - 1} are needed for {len(tokens)} tokens")
        in_use = {b for other in held.values() for b in other}
        stolen = [b for b in blocks[alloc.num_hit_blocks:] if b in in_use]
        if stolen:
            raise AssertionError(f"allocate({rid!r}) took block {stolen[0]} as a fresh block while a running "
                                 "request still holds it")
        if oracle.violations:
            raise AssertionError(oracle.violations[0] + " (its tokens may match, but its KV saw another prefix)")
        if model is not None and alloc.num_hit_blocks != want:
            raise AssertionError(f"allocate({rid!r}) hit {alloc.num_hit_blocks} blocks; the blocks still cached "
                                 f"(freed blocks stay hittable, tails evicted first) give {want}")
        held[rid] = blocks


PREFIXES = ((1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 7, 8), (9, 9, 1, 2), (2, 1, 4, 3, 6, 5), (5, 6, 1, 2, 3, 4))


def _random_program(rng: random.Random, length: int, bs: int) -> list[tuple]:
    ops, running, next_id = [], [], 0
    for _ in range(length):
        if running and rng.random() < 0.45:
            ops.append(("free", running.pop(rng.randrange(len(running)))))
            continue
        base = rng.choice(PREFIXES)
        if rng.random() < 0.5:  # the same tokens after another prefix: block k alike, context not
            other = rng.choice(PREFIXES)
            base = other[: rng.randint(0, len(other) // bs) * bs] + base[bs:]
        tokens = base + tuple(rng.randrange(10) for _ in range(rng.randint(0, 5)))
        ops.append(("allocate", next_id, tokens or (0,)))
        running.append(next_id)
        next_id += 1
    return ops


def block_cache_cases(num_random: int = 120, *, seed: int = 0) -> list[Case]:
    """The document example (same block 3 after two system prompts), the tail-vs-head pool, and
    seeded random programs: half under the full hash (hits predicted), half under a 2-4 bit hash."""
    n = integer("num_random", num_random, 0)
    bs = 2
    sys_a, sys_c, doc = (1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12), (20, 21)
    cases = [
        Case("same block 3 after two system prompts", (
            ("setup", 16, bs, 64), ("allocate", "A", sys_a + doc), ("free", "A"), ("allocate", "C", sys_c + doc),
            ("free", "C"), ("allocate", "A2", sys_a + doc))),
        Case("same block 3 after two system prompts, 1-bit hash", (
            ("setup", 16, bs, 1), ("allocate", "A", sys_a + doc), ("free", "A"), ("allocate", "C", sys_c + doc),
            ("free", "C"), ("allocate", "A2", sys_a + doc))),
        Case("a finished chain loses its tail first", (
            ("setup", 6, bs, 64), ("allocate", "A", tuple(range(8))), ("free", "A"),
            ("allocate", "X", tuple(range(100, 108))), ("free", "X"), ("allocate", "A2", tuple(range(8))))),
    ]
    rng = random.Random(seed)
    for k in range(n):
        bits = 64 if k % 2 == 0 else rng.choice((2, 3, 4))
        ops = _random_program(rng, rng.randint(6, 30), bs)
        cases.append(Case(f"random program {k} ({'64-bit' if bits == 64 else f'{bits}-bit'} hash)",
                          (("setup", rng.randint(6, 16), bs, bits), *ops)))
    return cases


def check_block_cache(factory: Callable, *, num_random: int = 120, seed: int = 0) -> PracticeReport:
    """Grade any block cache built by ``factory(num_blocks, block_size, hash_fn)`` with
    ``allocate(request_id, tokens) -> (block_ids, num_hit_blocks)`` (or an object with those
    attributes), ``free(request_id)``, and ``OutOfBlocks`` (lib.kvcache) when a request cannot fit."""
    return grade("chained block-hash cache", lambda: factory, block_cache_cases(num_random, seed=seed),
                 run_block_program, describe=_describe_blocks)


# ---- defective variants (the tests check each one fails) --------------------------------------


class _VerifyTokensOnly(PrefixBlockCache):
    def _lookup(self, tokens):
        hits = []
        for index, h in enumerate(self._chain(tokens)):
            block = self._hash_to_block.get(h)
            if block is None:
                break
            start = index * self._block_size
            if self._tokens[block] != tuple(tokens[start: start + self._block_size]):
                break  # checks the block's tokens, not the block it was computed after
            hits.append(block)
        return hits

    def _chain(self, tokens):
        from .chained_hash import chain_hashes

        return chain_hashes(tokens, self._block_size, self.hash_fn)


class _WipeOnFree(PrefixBlockCache):
    def free(self, request_id):
        table = self.block_table(request_id)
        super().free(request_id)
        for b in table:
            if self.refcount(b) == 0:
                self._unregister(b)


def block_cache_variant(name: str) -> Callable:
    """A factory ``(num_blocks, block_size, hash_fn)`` for the reference or a defect (``BLOCK_CACHE_VARIANTS``)."""
    table = {
        "reference": lambda n, bs, h: PrefixBlockCache(n, bs, hash_fn=h),
        "trusts_the_hash": lambda n, bs, h: PrefixBlockCache(n, bs, hash_fn=h, verify_on_hit=False),
        "verifies_tokens_only": lambda n, bs, h: _VerifyTokensOnly(n, bs, hash_fn=h),
        "unchained_unverified": lambda n, bs, h: PrefixBlockCache(
            n, bs, hash_fn=lambda parent, block: h(None, block), verify_on_hit=False),
        "head_first": lambda n, bs, h: PrefixBlockCache(n, bs, hash_fn=h, eviction_order="head_first"),
        "wipes_on_free": lambda n, bs, h: _WipeOnFree(n, bs, hash_fn=h),
    }
    if name not in table:
        raise ValueError(f"variant must be one of {', '.join(table)}, got {name!r}")
    return table[name]


BLOCK_CACHE_VARIANTS = ("trusts_the_hash", "verifies_tokens_only", "unchained_unverified", "head_first",
                        "wipes_on_free")
