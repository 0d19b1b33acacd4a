"""A deliberately defective block allocator, two oracles that catch it, and a shrinker.

:class:`DefectiveAllocator` is :class:`~lib.kvcache.allocator.BlockAllocator` with two seeded
defects, each behind a flag:

* ``leak_on_failed_allocation``: takes blocks one at a time and, when the free list runs dry
  midway, raises without giving back the blocks it already took (no rollback). The blocks are now
  neither free nor owned: ``free + used < total``.
* ``alias_copied_payload``: copy-on-write updates the block table and refcounts correctly but
  "copies" the payload by reference (``slots[dst] = slots[src]``), so after fork + write the two
  owners read one payload.

The two oracles check different things, and each defect slips past one of them:

* :func:`ownership_oracle` (block accounting) catches the leak, not the aliasing.
* :func:`content_oracle` (each sequence reads exactly what it wrote, against a shadow model of
  plain Python lists) catches the aliasing, not the leak.

:func:`find_minimal_failure` drives an allocator with random operation sequences (hypothesis),
and shrinks the first one that breaks an oracle to a minimal, printable list of operations.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from lib.inputs import integer

from .allocator import BlockAllocator, OutOfBlocks, read_sequence, require_protocol

__all__ = [
    "DefectiveAllocator",
    "Op",
    "Shadow",
    "content_oracle",
    "find_minimal_failure",
    "first_violation",
    "ownership_oracle",
]

#: The shadow model: sequence id -> the tokens it has written, as a plain list.
Shadow = dict[Hashable, list[int]]
Oracle = Callable[[BlockAllocator, Shadow], list[str]]


class DefectiveAllocator(BlockAllocator):
    """A :class:`BlockAllocator` with two switchable defects (both off = the correct allocator)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        leak_on_failed_allocation: bool = False,
        alias_copied_payload: bool = False,
    ) -> None:
        super().__init__(num_blocks, block_size)
        self.leak_on_failed_allocation = bool(leak_on_failed_allocation)
        self.alias_copied_payload = bool(alias_copied_payload)

    def _take_blocks(self, count: int) -> list[int]:
        if not self.leak_on_failed_allocation:
            return super()._take_blocks(count)
        taken = []
        for _ in range(count):
            if not self._free:  # defect: the blocks in `taken` are lost
                raise OutOfBlocks(f"need {count} free blocks, ran out after {len(taken)}")
            taken.append(self._free.pop())
        return taken

    def _copy_block(self, src: int, dst: int) -> None:
        if not self.alias_copied_payload:
            return super()._copy_block(src, dst)
        self._slots[dst] = self._slots[src]  # defect: both blocks now share one list


# --------------------------------------------------------------------------- oracles
def ownership_oracle(allocator, shadow: Shadow) -> list[str]:
    """Block-accounting violations (empty list = consistent).

    Checks: the free list has no duplicates; every block is either free or owned, never both or
    neither; free + used == ``num_blocks``; each block's refcount equals the number of block
    tables holding it (the tables of the shadow's live sequences); when the allocator lists its
    live sequences (``seq_ids()``), they are exactly the shadow's. Reads the allocator through
    :data:`~lib.kvcache.allocator.PROTOCOL` only, so it grades any class.
    """
    problems = []
    free = list(allocator.free_block_ids())
    if len(free) != len(set(free)):
        doubled = sorted(b for b, n in Counter(free).items() if n > 1)
        problems.append(f"blocks {doubled} are on the free list twice (double free)")
    free_set = set(free)
    holders = Counter(block for seq in shadow for block in allocator.block_table(seq))
    used = 0
    for block in range(allocator.num_blocks):
        is_free, count = block in free_set, allocator.refcount(block)
        used += count > 0
        if is_free and count:
            problems.append(f"block {block} is free but has refcount {count}")
        if not is_free and count == 0:
            problems.append(f"block {block} is neither free nor owned (leaked)")
        if count != holders[block]:
            problems.append(
                f"block {block} has refcount {count} but {holders[block]} block tables hold it"
            )
    if len(free_set) + used != allocator.num_blocks:
        problems.append(
            f"free {len(free_set)} + used {used} = {len(free_set) + used}"
            f" != {allocator.num_blocks} blocks"
        )
    if callable(getattr(allocator, "seq_ids", None)) and set(allocator.seq_ids()) != set(shadow):
        problems.append(f"live sequences {allocator.seq_ids()} != expected {sorted(shadow)}")
    return problems


def content_oracle(allocator, shadow: Shadow) -> list[str]:
    """Content violations: each live sequence must read exactly the tokens it wrote.

    Reads through the block table and ``read_block`` (what an attention kernel would see),
    against the shadow model of plain Python lists.
    """
    problems = []
    for seq_id, expected in shadow.items():
        try:
            got = read_sequence(allocator, seq_id, len(expected))
        except (ValueError, KeyError):
            problems.append(f"sequence {seq_id!r} is missing")
            continue
        if got != expected:
            problems.append(f"sequence {seq_id!r} reads {got}, wrote {expected}")
    return problems


# --------------------------------------------------------------------------- operations
@dataclass(frozen=True)
class Op:
    """One allocator operation. ``kind`` is allocate | fork | append | free.

    ``arg`` is the prompt (a tuple of tokens) for allocate, the child id for fork, the token for
    append, and unused for free.
    """

    kind: str
    seq: int
    arg: object = None

    def __str__(self) -> str:
        if self.kind == "allocate":
            return f"allocate(seq={self.seq}, tokens={list(self.arg)})"
        if self.kind == "fork":
            return f"fork(parent={self.seq}, child={self.arg})"
        if self.kind == "append":
            return f"append(seq={self.seq}, token={self.arg})"
        return f"free(seq={self.seq})"

    def apply(self, allocator: BlockAllocator, shadow: Shadow) -> None:
        """Run this op on ``allocator`` and mirror it in the ``shadow`` model.

        :class:`OutOfBlocks` is a legal outcome (the shadow stays unchanged); an op that is
        invalid for the current state (e.g. append to a freed sequence) raises ``ValueError``.
        """
        try:
            if self.kind == "allocate":
                allocator.allocate(self.seq, self.arg)
                shadow[self.seq] = list(self.arg)
            elif self.kind == "fork":
                allocator.fork(self.seq, self.arg)
                shadow[self.arg] = list(shadow[self.seq])
            elif self.kind == "append":
                allocator.append_token(self.seq, self.arg)
                shadow[self.seq].append(self.arg)
            elif self.kind == "free":
                allocator.free(self.seq)
                del shadow[self.seq]
            else:
                raise ValueError(f"kind must be allocate, fork, append or free, got {self.kind!r}")
        except OutOfBlocks:
            pass


def first_violation(
    allocator: BlockAllocator, ops: Sequence[Op], oracle: Oracle
) -> tuple[int, list[str]] | None:
    """Apply ``ops`` in order, checking ``oracle`` after each; return (op index, problems)."""
    shadow: Shadow = {}
    for index, op in enumerate(ops):
        op.apply(allocator, shadow)
        if problems := oracle(allocator, shadow):
            return index, problems
    return None


_KINDS = ("allocate", "fork", "append", "append", "free")  # append twice as likely


def _run_encoded(
    allocator: BlockAllocator,
    encoded: Sequence[tuple[int, int, int]],
    oracle: Oracle,
    num_token_values: int,
) -> tuple[list[Op], list[str]]:
    """Decode and run (kind, pick, value) triples until ``oracle`` complains.

    The encoding keeps every generated program valid, so hypothesis wastes no examples:
    allocate makes sequence ``next_id`` with prompt ``[0, 1, ..., value - 1]``; fork, append and
    free act on live sequence number ``pick % num_live`` (skipped when none is live); append
    writes token ``value % num_token_values``. Returns the ops run and the oracle's problems.
    """
    shadow: Shadow = {}
    ops: list[Op] = []
    next_id = 0
    for kind_index, pick, value in encoded:
        kind, live = _KINDS[kind_index], list(shadow)
        if kind == "allocate":
            op = Op("allocate", next_id, tuple(range(value)))
            next_id += 1
        elif not live:
            continue
        elif kind == "fork":
            op = Op("fork", live[pick % len(live)], next_id)
            next_id += 1
        elif kind == "append":
            op = Op("append", live[pick % len(live)], value % num_token_values)
        else:
            op = Op("free", live[pick % len(live)])
        op.apply(allocator, shadow)
        ops.append(op)
        if problems := oracle(allocator, shadow):
            return ops, problems
    return ops, []


def find_minimal_failure(
    variant_factory: Callable[[], BlockAllocator],
    oracle: Oracle,
    *,
    max_ops: int = 12,
    num_token_values: int = 4,
    max_examples: int = 300,
    seed: int = 0,
) -> list[str] | None:
    """Search random op programs for one that makes ``oracle`` fail; return it shrunk.

    Uses ``hypothesis.find``: it generates programs of up to ``max_ops`` operations (prompts up
    to one token more than the pool holds, so out-of-blocks paths run), and shrinks the first
    failing one to a minimal program. ``variant_factory()`` must return a fresh allocator of any class that follows
    :data:`~lib.kvcache.allocator.PROTOCOL`.
    Returns the ops as strings, e.g. ``["allocate(seq=0, tokens=[0])", "fork(parent=0,
    child=1)", ...]`` ending with the op after which the oracle failed, or None when all
    ``max_examples`` programs pass. Deterministic for a given ``seed``.
    """
    from hypothesis import HealthCheck, find, settings
    from hypothesis import strategies as st
    from hypothesis.errors import NoSuchExample

    max_ops = integer("max_ops", max_ops, 1)
    num_token_values = integer("num_token_values", num_token_values, 2)
    max_examples = integer("max_examples", max_examples, 1)
    probe = require_protocol(variant_factory(), "variant_factory")
    max_prompt_tokens = probe.num_blocks * probe.block_size + 1
    triple = st.tuples(
        st.integers(0, len(_KINDS) - 1), st.integers(0, 3), st.integers(0, max_prompt_tokens)
    )
    programs = st.lists(triple, max_size=max_ops)

    def breaks_oracle(encoded: list[tuple[int, int, int]]) -> bool:
        return bool(_run_encoded(variant_factory(), encoded, oracle, num_token_values)[1])

    search_settings = settings(
        max_examples=max_examples,
        derandomize=False,  # the seed below decides the search
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    try:
        encoded = find(
            programs, breaks_oracle, settings=search_settings, random=random.Random(seed)
        )
    except NoSuchExample:
        return None
    ops, _ = _run_encoded(variant_factory(), encoded, oracle, num_token_values)
    ops = _delete_redundant_ops(ops, lambda ops: _fails(variant_factory(), ops, oracle))
    return [str(op) for op in _renumber(ops)]


def _fails(allocator: BlockAllocator, ops: Sequence[Op], oracle: Oracle) -> bool:
    """True if the concrete program ``ops`` is valid and ends in an oracle violation."""
    try:
        found = first_violation(allocator, ops, oracle)
    except (ValueError, KeyError):  # deleting an op left a later op referring to a dead id
        return False
    return found is not None and found[0] == len(ops) - 1


def _delete_redundant_ops(ops: list[Op], fails: Callable[[list[Op]], bool]) -> list[Op]:
    """Delete runs of ops (longest first) while the program still fails, to a fixed point.

    Hypothesis shrinks the encoded program; with relative picks, deleting an op there can change
    which sequence later ops act on, so a few removable ops can survive. This pass cleans them up.
    """
    changed = True
    while changed:
        changed = False
        for size in range(len(ops) - 1, 0, -1):
            for start in range(len(ops) - size + 1):
                candidate = ops[:start] + ops[start + size :]
                if fails(candidate):
                    ops, changed = candidate, True
                    break
            if changed:
                break
    return ops


def _renumber(ops: list[Op]) -> list[Op]:
    """Rename sequence ids to 0, 1, 2, ... in order of creation."""
    new_id: dict[object, int] = {}
    for op in ops:
        created = op.seq if op.kind == "allocate" else op.arg if op.kind == "fork" else None
        if created is not None:
            new_id.setdefault(created, len(new_id))
    renamed = []
    for op in ops:
        arg = new_id[op.arg] if op.kind == "fork" else op.arg
        renamed.append(Op(op.kind, new_id[op.seq], arg))
    return renamed
