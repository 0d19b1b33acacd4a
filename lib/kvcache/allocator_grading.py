"""Grading a paged block allocator (I085, I095): seeded random operation programs and a checker
that tallies each allocator invariant separately (free or owned, refcount = holders, conservation,
copy before a shared write, reads what it wrote, no double free, all-or-nothing), plus the oracle
runs, admission traces and the operation parser the defect-hunt notebooks use.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import integer, integer_array
from lib.kvcache import BlockAllocator, Op

# =========================================================================== grading (I085, I095)
#: The invariants :func:`grade_allocator` checks, by key, with what each one means.
INVARIANTS: dict[str, str] = {
    "free_or_owned": "every block is free or owned: never both, never neither",
    "refcount_matches": "a block's refcount equals the number of block tables that hold it",
    "conservation": "free blocks + used blocks == total blocks",
    "copy_before_shared_write": (
        "a write into a shared, partly filled block goes to a fresh copy; no other sequence's "
        "tokens change"
    ),
    "reads_what_it_wrote": "every live sequence reads back exactly the tokens it wrote",
    "no_double_free": (
        "no block is on the free list twice; freeing a dead sequence raises and changes nothing"
    ),
    "all_or_nothing": "a failed allocation (OutOfBlocks) leaves the allocator exactly as it was",
    "valid_ops_accepted": "a valid operation either succeeds or raises OutOfBlocks",
}


def random_program(
    rng: random.Random,
    live: Sequence[Hashable],
    dead: Sequence[Hashable],
    next_id: int,
    *,
    max_prompt_tokens: int,
    num_token_values: int = 4,
    dead_free_probability: float = 0.1,
) -> Op:
    """Draw the next operation for a program: allocate, fork, append, or free (maybe a dead id).

    Weights: allocate 0.25, fork 0.15, append 0.45, free 0.15; allocate when nothing is live.
    A free picks a dead sequence with ``dead_free_probability`` (a double-free attempt).
    ``next_id`` names a newly created sequence.
    """
    kind = rng.choices(("allocate", "fork", "append", "free"), (0.25, 0.15, 0.45, 0.15))[0]
    if not live:
        kind = "allocate"
    if kind == "allocate":
        return Op("allocate", next_id, tuple(range(rng.randint(0, max_prompt_tokens))))
    if kind == "fork":
        return Op("fork", rng.choice(list(live)), next_id)
    if kind == "append":
        return Op("append", rng.choice(list(live)), rng.randrange(num_token_values))
    if dead and rng.random() < dead_free_probability:
        return Op("free", rng.choice(list(dead)))
    return Op("free", rng.choice(list(live)))


@dataclass
class GradeReport:
    """Per-invariant tallies over seeded random programs.

    ``checks[key]``: times the invariant was checked; ``violations[key]``: programs whose first
    failing operation broke it; ``first_failure[key]``: (the program's ops, message) of the first
    such program (not shrunk; ``str(op)`` prints an op).
    """

    name: str
    programs: int
    ops_run: int
    checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    first_failure: dict[str, tuple[list[Op], str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no invariant was ever violated."""
        return not any(self.violations.values())

    @property
    def failing(self) -> list[str]:
        """Keys of the violated invariants, in :data:`INVARIANTS` order."""
        return [k for k in INVARIANTS if self.violations[k]]

    def table(self) -> str:
        """One line per invariant: checks, programs violating, the invariant in words."""
        lines = [f"{self.name}: {self.programs} programs, {self.ops_run} operations"]
        for key, words in INVARIANTS.items():
            verdict = "ok  " if not self.violations[key] else "FAIL"
            lines.append(
                f"  {verdict} {key:<25}{self.checks[key]:>7} checks "
                f"{self.violations[key]:>4} failing programs   {words}"
            )
        return "\n".join(lines)


def _snapshot(alloc: BlockAllocator) -> tuple:
    return (
        alloc.free_block_ids(),
        [alloc.refcount(b) for b in range(alloc.num_blocks)],
        {s: alloc.block_table(s) for s in alloc.seq_ids()},
        {s: alloc.tokens(s) for s in alloc.seq_ids()},
    )


def _state_problems(alloc: BlockAllocator, shadow: dict) -> dict[str, str]:
    """The invariants that hold for any state (not tied to the last operation)."""
    problems: dict[str, str] = {}
    free = alloc.free_block_ids()
    free_set = set(free)
    if len(free) != len(free_set):
        doubled = sorted(b for b, c in Counter(free).items() if c > 1)
        problems["no_double_free"] = f"blocks {doubled} are on the free list twice"
    holders = Counter(b for s in alloc.seq_ids() for b in alloc.block_table(s))
    for block in range(alloc.num_blocks):
        count = alloc.refcount(block)
        if (block in free_set) == (count > 0):
            state = "free and owned" if count else "neither free nor owned (leaked)"
            problems.setdefault("free_or_owned", f"block {block} is {state}")
        if count != holders[block]:
            problems.setdefault(
                "refcount_matches",
                f"block {block} has refcount {count}, {holders[block]} tables hold it",
            )
    if alloc.num_free_blocks + alloc.num_used_blocks != alloc.num_blocks:
        problems["conservation"] = (
            f"free {alloc.num_free_blocks} + used {alloc.num_used_blocks} != {alloc.num_blocks}"
        )
    for seq, expected in shadow.items():
        got = alloc.tokens(seq) if seq in alloc.seq_ids() else None
        if got != expected:
            problems.setdefault("reads_what_it_wrote", f"seq {seq} reads {got}, wrote {expected}")
    return problems


def grade_allocator(
    factory: Callable[[], BlockAllocator],
    *,
    num_programs: int = 200,
    num_ops: int = 20,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    num_token_values: int = 4,
    name: str = "",
) -> GradeReport:
    """Run ``num_programs`` seeded random programs on fresh allocators; tally each invariant.

    Each program runs until its first violation (or ``num_ops`` operations). ``factory()`` must
    return a fresh, empty :class:`~lib.kvcache.BlockAllocator` (or subclass). Prompts are up to
    ``max_prompt_tokens`` long (default: the pool's capacity, so OutOfBlocks paths run).
    Deterministic for a given ``seed``.
    """
    n_prog = integer("num_programs", num_programs, 1)
    n_ops = integer("num_ops", num_ops, 1)
    seed = integer("seed", seed, 0)
    probe = factory()
    if not isinstance(probe, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(probe).__name__}")
    cap = probe.num_blocks * probe.block_size
    max_prompt = (
        cap if max_prompt_tokens is None else integer("max_prompt_tokens", max_prompt_tokens, 0)
    )
    report = GradeReport(name or type(probe).__name__, n_prog, 0)
    for index in range(n_prog):
        rng = random.Random(seed * 1_000_003 + index)
        alloc, shadow, dead, ops, next_id = factory(), {}, [], [], 0
        for _ in range(n_ops):
            op = random_program(
                rng,
                list(shadow),
                dead,
                next_id,
                max_prompt_tokens=max_prompt,
                num_token_values=num_token_values,
            )
            next_id += op.kind in ("allocate", "fork")
            ops.append(op)
            problems = _grade_op(alloc, shadow, dead, op, report)
            report.ops_run += 1
            if problems:
                for key, message in problems.items():
                    report.violations[key] += 1
                    report.first_failure.setdefault(key, (list(ops), message))
                break
    return report


def _grade_op(alloc: BlockAllocator, shadow: dict, dead: list, op: Op, report: GradeReport):
    """Apply ``op``, mirror it in ``shadow``, and return the invariants it broke."""
    before = _snapshot(alloc)
    problems: dict[str, str] = {}
    shared_partial = False
    if op.kind == "append":
        table = before[2][op.seq]
        length = len(before[3][op.seq])
        shared_partial = length % alloc.block_size != 0 and before[1][table[-1]] > 1
    try:
        if op.kind == "free" and op.seq in dead:
            try:
                alloc.free(op.seq)
            except ValueError:
                pass
            else:
                problems["no_double_free"] = f"free({op.seq}) of a freed sequence did not raise"
            report.checks["no_double_free"] += 1
            if _snapshot(alloc) != before:
                problems.setdefault(
                    "no_double_free", f"free({op.seq}) of a freed sequence changed state"
                )
            return problems
        op.apply(alloc, shadow)  # swallows OutOfBlocks, leaving shadow unchanged
    except (ValueError, KeyError, IndexError) as err:
        report.checks["valid_ops_accepted"] += 1
        problems["valid_ops_accepted"] = f"{op} raised {type(err).__name__}: {err}"
        return problems
    report.checks["valid_ops_accepted"] += 1
    failed = (
        op.kind in ("allocate", "fork")
        and (op.seq if op.kind == "allocate" else op.arg) not in shadow
    ) or (op.kind == "append" and len(shadow[op.seq]) == len(before[3][op.seq]))
    if failed:  # the operation raised OutOfBlocks inside apply
        report.checks["all_or_nothing"] += 1
        if _snapshot(alloc) != before:
            problems["all_or_nothing"] = f"{op} failed with OutOfBlocks but changed the state"
    if op.kind == "free":
        dead.append(op.seq)
    if op.kind == "append" and shared_partial and not failed:
        report.checks["copy_before_shared_write"] += 1
        after_table = alloc.block_table(op.seq)
        others = {s: t for s, t in before[3].items() if s != op.seq}
        changed = [s for s, t in others.items() if alloc.tokens(s) != t]
        if after_table[-1] == before[2][op.seq][-1]:
            problems["copy_before_shared_write"] = (
                f"{op} wrote into shared block {after_table[-1]} in place"
            )
        elif changed:
            problems["copy_before_shared_write"] = f"{op} changed what seq {changed[0]} reads"
    for key in ("free_or_owned", "refcount_matches", "conservation", "reads_what_it_wrote"):
        report.checks[key] += 1
    report.checks["no_double_free"] += 1
    for key, message in _state_problems(alloc, shadow).items():
        problems.setdefault(key, message)
    return problems


def oracle_failures(
    factory: Callable[[], BlockAllocator],
    oracle: Callable[[BlockAllocator, dict], list[str]],
    *,
    num_programs: int = 200,
    num_ops: int = 20,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
) -> tuple[int, list[Op] | None]:
    """Programs (of ``num_programs`` seeded random ones) after which ``oracle`` complains.

    ``oracle(allocator, shadow)`` is e.g. :func:`lib.kvcache.ownership_oracle` or
    :func:`lib.kvcache.content_oracle`; it runs after every op. Returns (failing programs, the
    first failing program's ops up to the failing op, or None). Same programs as
    :func:`grade_allocator` draws for the same seed, without double-free attempts.
    """
    n_prog = integer("num_programs", num_programs, 1)
    n_ops = integer("num_ops", num_ops, 1)
    seed = integer("seed", seed, 0)
    probe = factory()
    if not isinstance(probe, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(probe).__name__}")
    cap = probe.num_blocks * probe.block_size
    max_prompt = (
        cap if max_prompt_tokens is None else integer("max_prompt_tokens", max_prompt_tokens, 0)
    )
    failing, first = 0, None
    for index in range(n_prog):
        rng = random.Random(seed * 1_000_003 + index)
        alloc, shadow, ops, next_id = factory(), {}, [], 0
        for _ in range(n_ops):
            op = random_program(rng, list(shadow), [], next_id, max_prompt_tokens=max_prompt)
            next_id += op.kind in ("allocate", "fork")
            op.apply(alloc, shadow)
            ops.append(op)
            if oracle(alloc, shadow):
                failing += 1
                first = first or list(ops)
                break
    return failing, first


def admission_trace(
    factory: Callable[[], BlockAllocator], request_tokens: Iterable[int]
) -> tuple[np.ndarray, int]:
    """Serve requests FIFO on one allocator, preempting the oldest when the pool is full.

    For each request of ``L`` tokens: try ``allocate``; on :class:`~lib.kvcache.OutOfBlocks`
    free the oldest live request and retry, until it fits or nothing is left to preempt (then the
    request is rejected). Returns (usable blocks ``free + used`` after each request, rejected
    requests). A correct allocator keeps ``free + used == num_blocks`` throughout.
    """
    from lib.kvcache import OutOfBlocks

    alloc = factory()
    if not isinstance(alloc, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(alloc).__name__}")
    lengths = integer_array("request_tokens", list(request_tokens))
    live: list[int] = []
    usable = np.empty(lengths.size, dtype=np.int64)
    rejected = 0
    for i, length in enumerate(lengths.tolist()):
        while True:
            try:
                alloc.allocate(i, [0] * length)
                live.append(i)
                break
            except OutOfBlocks:
                if not live:
                    rejected += 1
                    break
                alloc.free(live.pop(0))
        usable[i] = alloc.num_free_blocks + alloc.num_used_blocks
    return usable, rejected


_OP_TEXT = re.compile(
    r"^(?:allocate\(seq=(?P<aseq>-?\d+), tokens=\[(?P<tokens>[\d, ]*)\]\)"
    r"|fork\(parent=(?P<parent>-?\d+), child=(?P<child>-?\d+)\)"
    r"|append\(seq=(?P<pseq>-?\d+), token=(?P<token>\d+)\)"
    r"|free\(seq=(?P<fseq>-?\d+)\))$"
)


def parse_op(text: str) -> Op:
    """Rebuild an :class:`~lib.kvcache.Op` from its printed form (``str(op)``).

    :func:`lib.kvcache.find_minimal_failure` returns programs as strings; this turns them back
    into operations that :func:`lib.kvcache.first_violation` can replay.
    """
    match = _OP_TEXT.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"op must look like allocate(seq=0, tokens=[0, 1]), fork(parent=0, child=1), "
            f"append(seq=0, token=3) or free(seq=0); got {text!r}"
        )
    g = match.groupdict()
    if g["aseq"] is not None:
        tokens = tuple(int(t) for t in g["tokens"].split(",") if t.strip())
        return Op("allocate", int(g["aseq"]), tokens)
    if g["parent"] is not None:
        return Op("fork", int(g["parent"]), int(g["child"]))
    if g["pseq"] is not None:
        return Op("append", int(g["pseq"]), int(g["token"]))
    return Op("free", int(g["fseq"]))
