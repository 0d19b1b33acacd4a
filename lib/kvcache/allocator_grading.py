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
from lib.kvcache import Op
from lib.kvcache.allocator import read_sequence, require_protocol

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


def _snapshot(alloc, shadow: dict) -> tuple:
    """What a failed operation must leave unchanged, read through the protocol only."""
    return (
        list(alloc.free_block_ids()),
        [alloc.refcount(b) for b in range(alloc.num_blocks)],
        {s: list(alloc.block_table(s)) for s in shadow},
        {s: read_sequence(alloc, s, len(shadow[s])) for s in shadow},
    )


def _state_problems(alloc, shadow: dict) -> dict[str, str]:
    """The invariants that hold for any state (not tied to the last operation).

    Live sequences are the shadow's; holders are counted from their block tables; what a
    sequence reads comes from its block table and :meth:`read_block`, never from the allocator's
    own idea of its tokens.
    """
    problems: dict[str, str] = {}
    n = alloc.num_blocks
    free = list(alloc.free_block_ids())
    free_set = set(free)
    if len(free) != len(free_set):
        doubled = sorted(b for b, c in Counter(free).items() if c > 1)
        problems["no_double_free"] = f"blocks {doubled} are on the free list twice"
    stray = sorted(b for b in free_set if not (isinstance(b, int) and 0 <= b < n))
    if stray:
        problems["free_or_owned"] = f"free list holds {stray}, which are not block ids 0..{n - 1}"
    tables = {s: list(alloc.block_table(s)) for s in shadow}
    holders = Counter(b for table in tables.values() for b in table)
    refcounts = [alloc.refcount(b) for b in range(n)]
    for block in range(n):
        count = refcounts[block]
        if (block in free_set) == (count > 0):
            state = "free and owned" if count else "neither free nor owned (leaked)"
            problems.setdefault("free_or_owned", f"block {block} is {state}")
        if count != holders[block]:
            problems.setdefault(
                "refcount_matches",
                f"block {block} has refcount {count}, {holders[block]} tables hold it",
            )
    used = sum(1 for count in refcounts if count > 0)
    if len(free_set) + used != n:
        problems["conservation"] = f"free {len(free_set)} + used {used} != {n}"
    for seq, expected in shadow.items():
        got = read_sequence(alloc, seq, len(expected))
        if got != expected:
            problems.setdefault("reads_what_it_wrote", f"seq {seq} reads {got}, wrote {expected}")
    return problems


def grade_allocator(
    factory: Callable[[], object],
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
    return a fresh, empty allocator of any class that follows :data:`PROTOCOL` (the reference
    :class:`~lib.kvcache.BlockAllocator` does; no subclass is needed). Prompts are up to
    ``max_prompt_tokens`` long (default: the pool's capacity, so OutOfBlocks paths run).
    Deterministic for a given ``seed``.
    """
    n_prog = integer("num_programs", num_programs, 1)
    n_ops = integer("num_ops", num_ops, 1)
    seed = integer("seed", seed, 0)
    probe = require_protocol(factory())
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
            problems = grade_op(alloc, shadow, dead, op, report.checks)
            report.ops_run += 1
            if problems:
                for key, message in problems.items():
                    report.violations[key] += 1
                    report.first_failure.setdefault(key, (list(ops), message))
                break
    return report


def grade_op(alloc, shadow: dict, dead: list, op: Op, checks: dict | None = None) -> dict[str, str]:
    """Apply ``op`` to ``alloc``, mirror it in ``shadow``, and return the invariants it broke.

    ``shadow`` maps each live sequence to the tokens it wrote; ``dead`` lists freed ids (a free
    of one of them must raise ``ValueError`` and change nothing). ``checks`` (invariant ->
    count), when given, counts the checks made. Every check reads the allocator through
    :data:`PROTOCOL` only.
    """
    checks = checks if checks is not None else dict.fromkeys(INVARIANTS, 0)
    before = _snapshot(alloc, shadow)
    problems: dict[str, str] = {}
    shared_partial = False
    if op.kind == "append" and op.seq in shadow:
        table = before[2][op.seq]
        others = {b for s, t in before[2].items() if s != op.seq for b in t}
        shared_partial = len(shadow[op.seq]) % alloc.block_size != 0 and table[-1] in others
    if op.kind == "free" and op.seq not in shadow:  # a freed (or never allocated) sequence
        try:
            alloc.free(op.seq)
        except (ValueError, KeyError):
            pass
        else:
            problems["no_double_free"] = f"free({op.seq}) of a freed sequence did not raise"
        checks["no_double_free"] += 1
        if _snapshot(alloc, shadow) != before:
            problems.setdefault("no_double_free", f"free({op.seq}) of a freed sequence changed state")
        return problems
    try:
        op.apply(alloc, shadow)  # swallows OutOfBlocks, leaving shadow unchanged
    except (ValueError, KeyError, IndexError) as err:
        checks["valid_ops_accepted"] += 1
        problems["valid_ops_accepted"] = f"{op} raised {type(err).__name__}: {err}"
        return problems
    checks["valid_ops_accepted"] += 1
    failed = (
        op.kind in ("allocate", "fork")
        and (op.seq if op.kind == "allocate" else op.arg) not in shadow
    ) or (op.kind == "append" and len(shadow[op.seq]) == len(before[3][op.seq]))
    if failed:  # the operation raised OutOfBlocks inside apply
        checks["all_or_nothing"] += 1
        if _snapshot(alloc, shadow) != before:
            problems["all_or_nothing"] = f"{op} failed with OutOfBlocks but changed the state"
    if op.kind == "free":
        dead.append(op.seq)
    if op.kind == "append" and shared_partial and not failed:
        checks["copy_before_shared_write"] += 1
        after_table = list(alloc.block_table(op.seq))
        changed = [
            s for s, t in before[3].items() if s != op.seq and read_sequence(alloc, s, len(t)) != t
        ]
        if after_table[-1:] == before[2][op.seq][-1:]:
            problems["copy_before_shared_write"] = (
                f"{op} wrote into shared block {after_table[-1]} in place"
            )
        elif changed:
            problems["copy_before_shared_write"] = f"{op} changed what seq {changed[0]} reads"
    for key in ("free_or_owned", "refcount_matches", "conservation", "reads_what_it_wrote"):
        checks[key] += 1
    checks["no_double_free"] += 1
    for key, message in _state_problems(alloc, shadow).items():
        problems.setdefault(key, message)
    return problems


def oracle_failures(
    factory: Callable[[], object],
    oracle: Callable[[object, dict], list[str]],
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
    probe = require_protocol(factory())
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
    factory: Callable[[], object], request_tokens: Iterable[int]
) -> tuple[np.ndarray, int]:
    """Serve requests FIFO on one allocator, preempting the oldest when the pool is full.

    For each request of ``L`` tokens: try ``allocate``; on :class:`~lib.kvcache.OutOfBlocks`
    free the oldest live request and retry, until it fits or nothing is left to preempt (then the
    request is rejected). Returns (usable blocks ``free + used`` after each request, rejected
    requests). A correct allocator keeps ``free + used == num_blocks`` throughout.
    """
    from lib.kvcache import OutOfBlocks

    alloc = require_protocol(factory())
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
        free = set(alloc.free_block_ids())
        usable[i] = len(free) + sum(alloc.refcount(b) > 0 for b in range(alloc.num_blocks))
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
