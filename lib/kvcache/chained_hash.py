"""Block-level prefix caching by chained hashes (vLLM automatic-prefix-caching style).

A request's tokens are cut into blocks of ``block_size``; only *full* blocks are cacheable. Block
``i`` is named by a chained hash ``h_i = H(h_{i-1}, tokens of block i)`` (``h_{-1} = None``), so
``h_i`` stands for the whole prefix ``0..i``: two requests share block ``i`` only if they share
every block before it too. A lookup walks ``h_0, h_1, ...`` through a ``hash -> block`` map and
stops at the first miss.

When a request finishes its blocks are *not* wiped: refcount-0 blocks that hold a hash go to the
back of an LRU free queue and stay hittable until their memory is needed. A new allocation takes
blocks from the front of the queue (evicting their hash). Within one request's blocks,
``eviction_order="tail_first"`` queues the deepest block first, so a chain loses its tail before
its head; ``"head_first"`` does the opposite and leaves *stranded* blocks: cached, but behind a
missing ancestor, so no lookup can reach them.

Hashes can collide (a weak ``hash_fn`` makes that easy). With ``verify_on_hit=True`` a hit also
checks that the cached block holds the request's tokens and was computed right after the block
matched just before it (a parent link tagged with that block's incarnation); any mismatch is a
miss, so a collision costs a recompute but never hands a request wrong KV. ``verify_on_hit=False``
trusts the hash, as a naive cache would. Payloads are token ids standing in for K/V.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from lib.inputs import integer

from .allocator import OutOfBlocks

__all__ = ["CacheAllocation", "PrefixBlockCache", "chain_hashes", "hash_block"]

BlockHashFn = Callable[[int | None, tuple[int, ...]], int]


def hash_block(parent_hash: int | None, block_tokens: tuple[int, ...]) -> int:
    """Chained block hash: the first 8 bytes of SHA-256(parent_hash, block_tokens), as an int.

    Stable across processes (unlike Python's ``hash``); ``parent_hash`` is None for block 0.
    """
    payload = repr((parent_hash, tuple(block_tokens))).encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big")


def chain_hashes(
    tokens: Sequence[int], block_size: int, hash_fn: BlockHashFn = hash_block
) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: ``h_i = hash_fn(h_{i-1}, block_i)``."""
    block_size = integer("block_size", block_size, 1)
    hashes: list[int] = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_fn(parent, tuple(tokens[start : start + block_size]))
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class CacheAllocation:
    """Blocks given to a request; the first ``num_hit_blocks`` came from the cache."""

    block_ids: tuple[int, ...]
    num_hit_blocks: int
    block_size: int

    @property
    def num_hit_tokens(self) -> int:
        """Prompt tokens whose KV was reused (need no prefill)."""
        return self.num_hit_blocks * self.block_size


class PrefixBlockCache:
    """``num_blocks`` KV blocks of ``block_size`` tokens with chained-hash prefix caching."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hash_fn: BlockHashFn = hash_block,
        verify_on_hit: bool = True,
        eviction_order: Literal["tail_first", "head_first"] = "tail_first",
    ) -> None:
        num_blocks = integer("num_blocks", num_blocks, 1)
        block_size = integer("block_size", block_size, 1)
        if not callable(hash_fn):
            raise ValueError(
                f"hash_fn must be callable (parent_hash, tokens) -> int, got {hash_fn!r}"
            )
        if eviction_order not in ("tail_first", "head_first"):
            raise ValueError(
                f"eviction_order must be 'tail_first' or 'head_first', got {eviction_order!r}"
            )
        self._num_blocks, self._block_size = num_blocks, block_size
        self.hash_fn, self.verify_on_hit, self.eviction_order = (
            hash_fn,
            verify_on_hit,
            eviction_order,
        )
        self._refcount = [0] * num_blocks
        self._tokens: list[tuple[int, ...]] = [()] * num_blocks  # payload (stands in for KV)
        self._hash: list[int | None] = [None] * num_blocks  # hash this block is registered under
        self._incarnation = [0] * num_blocks  # bumped every time a block is refilled
        self._parent: list[tuple[int, int] | None] = [None] * num_blocks  # (block, incarnation)
        self._hash_to_block: dict[int, int] = {}
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._requests: dict[Hashable, list[int]] = {}

    # ----------------------------------------------------------------- introspection
    @property
    def num_blocks(self) -> int:
        """Total blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks with refcount 0 (some may still hold cached, hittable content)."""
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the hash map (in use or free)."""
        return len(self._hash_to_block)

    def refcount(self, block: int) -> int:
        """Number of running requests using ``block``."""
        self._check_block(block)
        return self._refcount[block]

    def block_hash(self, block: int) -> int | None:
        """The hash ``block`` is registered under, or None if it holds no cached content."""
        self._check_block(block)
        return self._hash[block]

    def eviction_queue(self) -> list[int]:
        """Free blocks in eviction order (front = taken next)."""
        return list(self._free_queue)

    def block_table(self, request_id: Hashable) -> list[int]:
        """Blocks held by a running request, in token order."""
        return list(self._request(request_id))

    def read_tokens(self, request_id: Hashable) -> list[int]:
        """What a request's KV blocks hold, concatenated (equals its tokens unless KV is wrong)."""
        return [token for block in self._request(request_id) for token in self._tokens[block]]

    def match_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` that an allocation now would find cached (no side effects)."""
        return len(self._lookup(tokens)) * self._block_size

    def stranded_blocks(self) -> list[int]:
        """Cached blocks no lookup can reach: an ancestor of their chain is no longer cached."""
        reachable: dict[int, bool] = {}

        def is_reachable(block: int) -> bool:
            if block not in reachable:
                link = self._parent[block]
                if link is None:
                    reachable[block] = True
                else:
                    parent, incarnation = link
                    parent_cached = (
                        self._incarnation[parent] == incarnation
                        and self._hash[parent] is not None
                        and self._hash_to_block.get(self._hash[parent]) == parent
                    )
                    reachable[block] = parent_cached and is_reachable(parent)
            return reachable[block]

        return sorted(b for b in self._hash_to_block.values() if not is_reachable(b))

    # ----------------------------------------------------------------- operations
    def allocate(self, request_id: Hashable, tokens: Sequence[int]) -> CacheAllocation:
        """Give ``request_id`` blocks for ``tokens``: cached prefix blocks first, then fresh ones.

        Fresh blocks come from the front of the free queue (evicting whatever they cached); their
        full blocks are registered under their chained hash. All or nothing: raises
        :class:`OutOfBlocks` (state unchanged) if the pool cannot hold the request.
        """
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already running; free it first")
        tokens = tuple(integer("token", token, 0, unit="(a token id)") for token in tokens)
        hits = self._lookup(tokens)
        num_needed = -(-len(tokens) // self._block_size)
        num_fresh = num_needed - len(hits)
        num_takeable = len(self._free_queue) - sum(1 for b in set(hits) if b in self._free_queue)
        if num_fresh > num_takeable:
            raise OutOfBlocks(
                f"request needs {num_fresh} fresh blocks, only {num_takeable} can be taken"
            )
        for block in hits:
            self._refcount[block] += 1
            self._free_queue.pop(block, None)
        table = list(hits)
        hashes = chain_hashes(tokens, self._block_size, self.hash_fn)
        for index in range(len(hits), num_needed):
            block = self._evict_front()
            start = index * self._block_size
            self._fill(
                block, tokens[start : start + self._block_size], table[-1] if table else None
            )
            self._refcount[block] = 1
            if index < len(hashes):
                self._register(block, hashes[index])
            table.append(block)
        self._requests[request_id] = table
        return CacheAllocation(tuple(table), len(hits), self._block_size)

    def free(self, request_id: Hashable) -> None:
        """Release a request's blocks; refcount-0 blocks join the free queue, still cached.

        Cached blocks go to the back in ``eviction_order`` (tail_first: deepest block queued
        first, so evicted first); blocks with no cached content go to the front.
        """
        table = self._request(request_id)
        del self._requests[request_id]
        released = []
        for block in table:
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                released.append(block)
        if self.eviction_order == "tail_first":
            released.reverse()
        for block in released:
            self._free_queue[block] = None
            if self._hash[block] is None:
                self._free_queue.move_to_end(block, last=False)

    # ----------------------------------------------------------------- internals
    def _check_block(self, block: int) -> None:
        block = integer("block", block, 0, self._num_blocks - 1)

    def _request(self, request_id: Hashable) -> list[int]:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"request_id {request_id!r} is not running") from None

    def _lookup(self, tokens: Sequence[int]) -> list[int]:
        """Cached blocks for the longest cached prefix of ``tokens`` (full blocks only)."""
        hits: list[int] = []
        for index, block_hash in enumerate(chain_hashes(tokens, self._block_size, self.hash_fn)):
            block = self._hash_to_block.get(block_hash)
            if block is None:
                break
            if self.verify_on_hit:
                start = index * self._block_size
                expected_parent = (hits[-1], self._incarnation[hits[-1]]) if hits else None
                if (
                    self._tokens[block] != tuple(tokens[start : start + self._block_size])
                    or self._parent[block] != expected_parent
                ):
                    break  # a hash collision: treat as a miss
            hits.append(block)
        return hits

    def _evict_front(self) -> int:
        """Take the block at the front of the free queue, dropping its cached content."""
        block, _ = self._free_queue.popitem(last=False)
        self._unregister(block)
        return block

    def _fill(self, block: int, block_tokens: Sequence[int], parent: int | None) -> None:
        self._incarnation[block] += 1
        self._tokens[block] = tuple(block_tokens)
        self._parent[block] = None if parent is None else (parent, self._incarnation[parent])

    def _register(self, block: int, block_hash: int) -> None:
        """Make ``block`` hittable under ``block_hash``.

        If a free block already holds that hash (stale content behind a missing ancestor, or a
        collision) the newcomer displaces it; if a block in use holds it, that block keeps it.
        """
        owner = self._hash_to_block.get(block_hash)
        if owner is not None:
            if self._refcount[owner] > 0:
                return
            self._unregister(owner)
            self._free_queue.move_to_end(owner, last=False)
        self._hash_to_block[block_hash] = block
        self._hash[block] = block_hash

    def _unregister(self, block: int) -> None:
        if self._hash[block] is not None:
            del self._hash_to_block[self._hash[block]]
            self._hash[block] = None
