"""Paged KV-cache block allocator with reference counts and copy-on-write (vLLM-style).

The KV cache is cut into ``num_blocks`` fixed-size blocks of ``block_size`` token slots. Each
sequence owns a *block table*: the list of block ids that hold its tokens in order, so token ``i``
lives in block ``table[i // block_size]`` at slot ``i % block_size``.

``fork`` (parallel sampling, beam search) lets a child share every block of its parent: no copy,
just ``refcount += 1`` per block. Sharing is safe while nobody writes. A sequence that wants to
append into a *partially filled, shared* last block must first copy it to a private block
(copy-on-write), so the other owners keep reading exactly what they wrote. Full blocks are never
written again, so they stay shared forever.

Every block is either on the free list (refcount 0) or owned (refcount = number of block tables
that hold it). Every allocation is all-or-nothing: when there are not enough free blocks the call
raises :class:`OutOfBlocks` and leaves the allocator exactly as it was.

Payloads are token ids standing in for K/V vectors, so tests can check that what a sequence reads
is exactly what it wrote. Freed blocks keep their stale slots (GPU memory is not zeroed); a
sequence only ever reads its first ``num_tokens`` slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Literal

from lib.inputs import integer

__all__ = [
    "PROTOCOL",
    "BlockAllocator",
    "CopyEvent",
    "NaiveCowAllocator",
    "OutOfBlocks",
    "read_sequence",
    "require_protocol",
]


class OutOfBlocks(ValueError):
    """Raised when an allocation needs more free blocks than exist; state is left unchanged."""


@dataclass(frozen=True)
class CopyEvent:
    """One copy-on-write: ``seq_id`` stopped sharing ``src_block`` and now writes ``dst_block``."""

    seq_id: Hashable
    src_block: int
    dst_block: int


#: What a graded allocator must offer (any class: the grader never needs a BlockAllocator).
#: Operations: ``allocate(seq_id, tokens)``, ``fork(parent_id, child_id)``,
#: ``append_token(seq_id, token)``, ``free(seq_id)``, raising
#: :class:`~lib.kvcache.OutOfBlocks` when the pool is short. Inspection: ``block_table(seq_id)``
#: (block ids in token order), ``refcount(block)``, ``free_block_ids()``, ``read_block(block)``
#: (the block's slots as stored), and the attributes ``num_blocks`` and ``block_size``.
PROTOCOL: tuple[str, ...] = (
    "allocate",
    "fork",
    "append_token",
    "free",
    "block_table",
    "refcount",
    "free_block_ids",
    "read_block",
)


def require_protocol(alloc: object, what: str = "factory"):
    """Return ``alloc`` if it follows :data:`PROTOCOL`, else raise ``ValueError`` naming what lacks."""
    missing = [m for m in PROTOCOL if not callable(getattr(alloc, m, None))]
    missing += [a for a in ("num_blocks", "block_size") if not isinstance(getattr(alloc, a, None), int)]
    if missing:
        raise ValueError(
            f"{what} must return an allocator with methods {', '.join(PROTOCOL)} and integer "
            f"attributes num_blocks, block_size; {type(alloc).__name__} lacks {', '.join(missing)}"
        )
    return alloc


def read_sequence(alloc, seq_id: Hashable, length: int) -> list:
    """What ``seq_id`` reads: its first ``length`` slots through its block table and
    ``read_block`` (the way an attention kernel reads it), not the allocator's own bookkeeping."""
    flat = [t for b in alloc.block_table(seq_id) for t in alloc.read_block(b)]
    return flat[:length]


def _check_token(token: object) -> int:
    return integer("token", token, 0, unit="(a token id)")


class BlockAllocator:
    """Paged KV block allocator: ``num_blocks`` blocks of ``block_size`` token slots each.

    Capacity in tokens is ``num_blocks * block_size``. Sequences are named by any hashable id.
    Freeing an unknown or already-freed sequence raises ``ValueError`` (so a block can never be
    returned to the free list twice). ``copy_events`` lists every copy-on-write so far.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._num_blocks = integer("num_blocks", num_blocks, 1)
        self._block_size = integer("block_size", block_size, 1)
        # A stack; reversed so that block 0 is handed out first (easier to read in examples).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refcount: list[int] = [0] * num_blocks
        self._slots: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}
        self.copy_events: list[CopyEvent] = []

    # ----------------------------------------------------------------- introspection
    @property
    def num_blocks(self) -> int:
        """Total number of blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with refcount > 0 (owned by at least one sequence)."""
        return sum(1 for count in self._refcount if count > 0)

    def free_block_ids(self) -> list[int]:
        """The free list as stored (a copy), next block to be handed out last."""
        return list(self._free)

    def refcount(self, block: int) -> int:
        """Number of block tables that hold ``block``."""
        return self._refcount[integer("block", block, 0, self._num_blocks - 1)]

    def seq_ids(self) -> list[Hashable]:
        """Ids of live (allocated, not yet freed) sequences, in creation order."""
        return list(self._tables)

    def block_table(self, seq_id: Hashable) -> list[int]:
        """A copy of the block table of ``seq_id``: block ids in token order."""
        return list(self._table(seq_id))

    def num_tokens(self, seq_id: Hashable) -> int:
        """Number of tokens written by ``seq_id``."""
        self._table(seq_id)
        return self._lengths[seq_id]

    def read_block(self, block: int) -> list[int | None]:
        """The ``block_size`` slots of ``block`` as stored (what a kernel reading it would see).

        Slots never written hold None; a freed block keeps its stale tokens. Graders read a
        sequence through its block table with this, so they do not trust :meth:`tokens`.
        """
        return list(self._slots[integer("block", block, 0, self._num_blocks - 1)])

    def tokens(self, seq_id: Hashable) -> list[int]:
        """What ``seq_id`` reads back: its first ``num_tokens`` slots, block by block."""
        table = self._table(seq_id)
        flat = [token for block in table for token in self._slots[block]]
        return flat[: self._lengths[seq_id]]

    # ----------------------------------------------------------------- operations
    def allocate(self, seq_id: Hashable, tokens: Iterable[int]) -> list[int]:
        """Create sequence ``seq_id`` holding ``tokens`` (the prompt); return its block table.

        Takes ``ceil(len(tokens) / block_size)`` blocks, all or nothing (:class:`OutOfBlocks`).
        """
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is already allocated; free it or use a new id")
        prompt = [_check_token(token) for token in tokens]
        num_needed = -(-len(prompt) // self._block_size)
        blocks = self._take_blocks(num_needed)
        for block in blocks:
            self._refcount[block] = 1
        self._tables[seq_id] = blocks
        self._lengths[seq_id] = len(prompt)
        for position, token in enumerate(prompt):
            self._slots[blocks[position // self._block_size]][position % self._block_size] = token
        return list(blocks)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Create ``child_id`` sharing every block of ``parent_id`` (refcount + 1, no copy)."""
        parent_table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"child_id {child_id!r} is already allocated; pick a new id")
        for block in parent_table:
            self._refcount[block] += 1
        self._tables[child_id] = list(parent_table)
        self._lengths[child_id] = self._lengths[parent_id]

    def append_token(self, seq_id: Hashable, token: int) -> CopyEvent | None:
        """Append one token to ``seq_id``; return the :class:`CopyEvent` if it had to copy.

        Needs a new block when the last block is full, or a private copy of the last block when
        that block is partially filled and shared (refcount > 1). All or nothing.
        """
        table = self._table(seq_id)
        token = _check_token(token)
        position = self._lengths[seq_id]
        slot = position % self._block_size
        event = None
        if slot == 0:  # no blocks yet, or the last block is full
            [block] = self._take_blocks(1)
            self._refcount[block] = 1
            table.append(block)
        elif self._refcount[table[-1]] > 1:
            event = self._copy_on_write(seq_id)
        self._slots[table[-1]][slot] = token
        self._lengths[seq_id] = position + 1
        return event

    def append_tokens(self, seq_id: Hashable, tokens: Iterable[int]) -> CopyEvent | None:
        """Append several tokens to ``seq_id`` at once: the same blocks, slots and copy as calling
        :meth:`append_token` for each, all or nothing (:class:`OutOfBlocks` before anything changes).
        Needs ceil((len(tokens) - room in the last block) / block_size) new blocks, plus one for a
        copy when that last block is partially filled and shared."""
        table = self._table(seq_id)
        new = [_check_token(token) for token in tokens]
        if not new:
            return None
        size, position = self._block_size, self._lengths[seq_id]
        slot = position % size
        room = size - slot if slot else 0
        copy = bool(slot) and self._refcount[table[-1]] > 1
        fresh = -(-(len(new) - room) // size) if len(new) > room else 0
        if fresh + copy > len(self._free):
            raise OutOfBlocks(f"need {fresh + copy} free blocks, only {len(self._free)} free")
        event = self._copy_on_write(seq_id) if copy else None
        for block in self._take_blocks(fresh):
            self._refcount[block] = 1
            table.append(block)
        slots = self._slots
        for offset, token in enumerate(new, start=position):
            slots[table[offset // size]][offset % size] = token
        self._lengths[seq_id] = position + len(new)
        return event

    def free(self, seq_id: Hashable) -> list[int]:
        """Drop ``seq_id``; return the blocks whose refcount reached 0 (now on the free list)."""
        table = self._table(seq_id)
        released = []
        for block in reversed(table):
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                self._free.append(block)
                released.append(block)
        del self._tables[seq_id]
        del self._lengths[seq_id]
        return released

    # ----------------------------------------------------------------- internals
    def _table(self, seq_id: Hashable) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise ValueError(
                f"seq_id {seq_id!r} is not allocated (never allocated or already freed)"
            ) from None

    def _take_blocks(self, count: int) -> list[int]:
        """Pop ``count`` blocks off the free list, or raise OutOfBlocks having taken none."""
        if count > len(self._free):
            raise OutOfBlocks(f"need {count} free blocks, only {len(self._free)} free")
        return [self._free.pop() for _ in range(count)]

    def _copy_block(self, src: int, dst: int) -> None:
        """Copy the payload of block ``src`` into block ``dst`` (a device-to-device copy)."""
        self._slots[dst][:] = self._slots[src]

    def _copy_on_write(self, seq_id: Hashable) -> CopyEvent | None:
        """Give ``seq_id`` a private copy of its shared last block."""
        table = self._tables[seq_id]
        src = table[-1]
        [dst] = self._take_blocks(1)
        self._copy_block(src, dst)
        self._refcount[dst] = 1
        self._refcount[src] -= 1  # the other owners keep src
        table[-1] = dst
        event = CopyEvent(seq_id, src, dst)
        self.copy_events.append(event)
        return event


class NaiveCowAllocator(BlockAllocator):
    """A :class:`BlockAllocator` that gets copy-on-write wrong in one of two common ways.

    ``mistake="write_in_place"``: never copies; the writer scribbles into the shared block, so a
    sibling reads the other's token. ``mistake="forget_decref"``: copies, but leaves the source
    block's refcount one too high, so it can never return to the free list (a leak).
    For teaching: it must fail the ownership or content checks that the real allocator passes.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        mistake: Literal["write_in_place", "forget_decref"] = "write_in_place",
    ) -> None:
        if mistake not in ("write_in_place", "forget_decref"):
            raise ValueError(
                f"mistake must be 'write_in_place' or 'forget_decref', got {mistake!r}"
            )
        super().__init__(num_blocks, block_size)
        self.mistake = mistake

    def _copy_on_write(self, seq_id: Hashable) -> CopyEvent | None:
        if self.mistake == "write_in_place":
            return None  # the caller then writes into the shared block
        table = self._tables[seq_id]
        src = table[-1]
        [dst] = self._take_blocks(1)
        self._copy_block(src, dst)
        self._refcount[dst] = 1  # bug: src keeps the writer's reference
        table[-1] = dst
        event = CopyEvent(seq_id, src, dst)
        self.copy_events.append(event)
        return event
