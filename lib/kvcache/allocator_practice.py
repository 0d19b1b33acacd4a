"""Practice mode for the paged-allocator questions (I085, I095, I015): grade any implementation.

:func:`check` grades a candidate allocator: any class (or factory ``f(num_blocks, block_size)``)
that follows :data:`~lib.kvcache.allocator.PROTOCOL`, never a subclass of the reference. Every
graded program runs on a fresh pool and is checked after each operation twice:

* the reference grader's invariants (:data:`~lib.kvcache.allocator_grading.INVARIANTS`, through
  :func:`~lib.kvcache.allocator_grading.grade_op`): free or owned, refcount = holders,
  conservation, copy before a shared write, reads what it wrote (through the block table and
  ``read_block``), no double free, all-or-nothing;
* a predictive model, :class:`PoolModel`: the specification run on abstract blocks. It knows no
  block ids and never looks at the candidate; it predicts how many blocks each operation needs,
  hence exactly when ``OutOfBlocks`` must come, how many blocks are in use, and which sequences
  share which block (:data:`PREDICTED`).

The first failing program is shrunk (:func:`lib.book.practice.shrink`) and printed in the
:func:`~lib.kvcache.allocator_grading.parse_op` syntax, so it can be pasted back into a replay.
:func:`check_sharing_counts` grades a function that counts blocks and copies for parallel
sampling (I015) against :func:`simulate_parallel_sampling`, the same model driven step by step.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer
from lib.kvcache.allocator import require_protocol
from lib.kvcache.allocator_grading import INVARIANTS, grade_op, random_program
from lib.kvcache.defective import Op

#: What the predictive model adds to the invariants, by key.
PREDICTED: dict[str, str] = {
    "out_of_blocks_exactly_when_short": (
        "OutOfBlocks exactly when fewer blocks are free than the operation needs (ceil(tokens/B) "
        "for allocate, none for fork, one for an append that opens a block or copies a shared one)"
    ),
    "blocks_as_predicted": (
        "blocks in use and each table's length match the model: fork copies nothing, only a "
        "write into a shared, partly filled last block copies, and only that one block"
    ),
    "sharing_as_predicted": (
        "two tables hold the same block exactly where the model says they share it, and a "
        "block nobody had to copy keeps its id"
    ),
}

#: The pools :func:`check` grades on: (num_blocks, block_size). Small, so that they run out.
POOLS: tuple[tuple[int, int], ...] = ((4, 4), (8, 4), (6, 1), (5, 3))


class PoolModel:
    """The allocator's specification on abstract blocks: handles, refcounts, no block ids.

    ``tables[seq]`` lists model-local handles; ``tokens[seq]`` what ``seq`` wrote. :meth:`need`
    predicts the blocks an operation takes; :meth:`apply` performs it (or nothing, when the pool
    is short) and returns whether it happened.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = integer("num_blocks", num_blocks, 1)
        self.block_size = integer("block_size", block_size, 1)
        self.tables: dict[Hashable, list[int]] = {}
        self.tokens: dict[Hashable, list[int]] = {}
        self.refs: Counter = Counter()
        self.copies = 0
        self._next = 0

    @property
    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return sum(1 for count in self.refs.values() if count > 0)

    @property
    def free(self) -> int:
        """Blocks on the free list."""
        return self.num_blocks - self.used

    def valid(self, op: Op) -> bool:
        """Whether ``op`` makes sense here (a free of a dead sequence does: it must raise)."""
        if op.kind == "allocate":
            return op.seq not in self.tables
        if op.kind == "fork":
            return op.seq in self.tables and op.arg not in self.tables
        if op.kind == "append":
            return op.seq in self.tables
        return op.kind == "free"

    def need(self, op: Op) -> int:
        """Free blocks ``op`` needs: ceil(n/B) to allocate n tokens; one to append into a full
        last block (or none yet) or into a shared, partly filled one (the copy); else none."""
        if op.kind == "allocate":
            return -(-len(op.arg) // self.block_size)
        if op.kind == "append":
            table, length = self.tables[op.seq], len(self.tokens[op.seq])
            if length % self.block_size == 0:
                return 1
            return 1 if self.refs[table[-1]] > 1 else 0
        return 0

    def _new(self) -> int:
        self._next += 1
        self.refs[self._next] = 1
        return self._next

    def apply(self, op: Op) -> bool:
        """Perform ``op`` (which must be :meth:`valid`); False when the pool is short."""
        if op.kind == "free":
            for handle in self.tables.pop(op.seq, []):
                self.refs[handle] -= 1
            self.tokens.pop(op.seq, None)
            return True
        if self.need(op) > self.free:
            return False
        if op.kind == "allocate":
            self.tables[op.seq] = [self._new() for _ in range(self.need(op))]
            self.tokens[op.seq] = list(op.arg)
        elif op.kind == "fork":
            self.tables[op.arg] = list(self.tables[op.seq])
            self.tokens[op.arg] = list(self.tokens[op.seq])
            for handle in self.tables[op.arg]:
                self.refs[handle] += 1
        else:
            table, length = self.tables[op.seq], len(self.tokens[op.seq])
            if length % self.block_size == 0:
                table.append(self._new())
            elif self.refs[table[-1]] > 1:
                self.refs[table[-1]] -= 1
                table[-1] = self._new()
                self.copies += 1
            self.tokens[op.seq].append(op.arg)
        return True


def _took_effect(op: Op, shadow: dict, before_len: int | None) -> bool:
    if op.kind == "allocate":
        return op.seq in shadow
    if op.kind == "fork":
        return op.arg in shadow
    if op.kind == "append":
        return len(shadow[op.seq]) > before_len
    return True


def _predicted_problems(alloc, model: PoolModel, placed: dict) -> dict[str, str]:
    """Blocks in use, table lengths and the sharing pattern against the model.

    ``placed`` (model handle -> block id) persists across operations: a block that nobody
    copied keeps its id for life (the kernels read it through the block table).
    """
    problems: dict[str, str] = {}
    used = alloc.num_blocks - len(set(alloc.free_block_ids()))
    if used != model.used:
        problems["blocks_as_predicted"] = f"{used} blocks are in use; the model holds {model.used}"
    to_block = placed
    to_handle: dict[object, tuple] = {}
    for seq, handles in model.tables.items():
        table = list(alloc.block_table(seq))
        if len(table) != len(handles):
            problems.setdefault(
                "blocks_as_predicted",
                f"seq {seq} holds {len(table)} blocks for {len(model.tokens[seq])} tokens; "
                f"expected {len(handles)}",
            )
            continue
        for pos, (handle, block) in enumerate(zip(handles, table, strict=True)):
            if handle in to_block and to_block[handle] != block:
                problems.setdefault(
                    "sharing_as_predicted",
                    f"seq {seq} position {pos} is now block {block}, but it should still be "
                    f"block {to_block[handle]} (no copy was due there)",
                )
            elif block in to_handle and to_handle[block][0] != handle:
                other_seq, other_pos = to_handle[block][1:]
                problems.setdefault(
                    "sharing_as_predicted",
                    f"seq {seq} position {pos} and seq {other_seq} position {other_pos} both "
                    f"use block {block}, but they should hold separate blocks",
                )
            to_block.setdefault(handle, block)
            to_handle.setdefault(block, (handle, seq, pos))
    return problems


def run_program(alloc, ops: Sequence[Op], num_blocks: int, block_size: int) -> None:
    """Run ``ops`` on ``alloc`` (fresh, ``num_blocks`` x ``block_size``); raise AssertionError at
    the first operation that breaks an invariant or the model's prediction.

    Operations that make no sense for the model's state (an append to a sequence that was never
    created, after shrinking removed its allocate) are skipped; a free of a dead sequence is
    kept (it must raise and change nothing).
    """
    require_protocol(alloc, "the candidate")
    if (alloc.num_blocks, alloc.block_size) != (num_blocks, block_size):
        raise AssertionError(
            f"built with num_blocks={num_blocks}, block_size={block_size}, the allocator reports "
            f"num_blocks={alloc.num_blocks}, block_size={alloc.block_size}"
        )
    model, shadow, dead, placed = PoolModel(num_blocks, block_size), {}, [], {}
    for step, op in enumerate(ops, 1):
        if not model.valid(op):
            continue
        need, free = model.need(op) if op.kind != "free" else 0, model.free
        before_len = len(shadow[op.seq]) if op.kind == "append" else None
        problems = grade_op(alloc, shadow, dead, op)
        if "valid_ops_accepted" not in problems and (op.kind != "free" or op.seq in model.tables):
            happened = _took_effect(op, shadow, before_len)
            expected = model.apply(op)
            if happened and not expected:
                problems.setdefault(
                    "out_of_blocks_exactly_when_short",
                    f"{op} succeeded, but it needs {need} blocks and only {free} should be free",
                )
            elif expected and not happened:
                problems.setdefault(
                    "out_of_blocks_exactly_when_short",
                    f"{op} raised OutOfBlocks, but it needs {need} block(s) and {free} should be "
                    "free",
                )
            elif not problems:
                problems.update(_predicted_problems(alloc, model, placed))
        if problems:
            meaning = {**INVARIANTS, **PREDICTED}
            key, message = next(iter(problems.items()))
            where = f"at operation {step}" + ("" if str(op) in message else f", {op}")
            raise AssertionError(f"{where}: {message}\n  broken: {key} ({meaning[key]})")


def _scenarios(b: int) -> list[Case]:
    """Hand-written programs for a pool of blocks of ``b`` tokens (the cases drafts get wrong)."""
    part = tuple(range(b + 1)) if b > 1 else (0,)  # ends in a partly filled block when b > 1
    full = tuple(range(b))
    return [
        Case("allocate, append, read back", (
            Op("allocate", 0, part), Op("append", 0, 5), Op("append", 0, 6), Op("free", 0))),
        Case("fork, then the child writes first", (
            Op("allocate", 0, part), Op("fork", 0, 1), Op("append", 1, 7), Op("append", 0, 8))),
        Case("fork, then the parent writes first", (
            Op("allocate", 0, part), Op("fork", 0, 1), Op("append", 0, 7), Op("append", 1, 8))),
        Case("fork at a full block", (
            Op("allocate", 0, full), Op("fork", 0, 1), Op("append", 0, 7), Op("append", 1, 8))),
        Case("one writer after a fork, then free both", (
            Op("allocate", 0, part), Op("fork", 0, 1), Op("append", 1, 7), Op("append", 1, 8),
            Op("free", 1), Op("free", 0))),
        Case("double free", (Op("allocate", 0, part), Op("free", 0), Op("free", 0))),
        Case("three samples of one prompt", (
            Op("allocate", 0, part), Op("fork", 0, 1), Op("fork", 0, 2), Op("append", 2, 1),
            Op("append", 1, 2), Op("append", 0, 3), Op("free", 0), Op("append", 1, 3))),
    ]


def _scenarios_for_pool(n: int, b: int) -> list[Case]:
    """Scenarios that need the pool's size: running out, halfway and during a copy."""
    cap = n * b
    return [
        Case("the pool runs out halfway through an allocation", (
            Op("allocate", 0, tuple(range(b + 1))), Op("allocate", 1, tuple(range(cap))),
            Op("allocate", 2, tuple(range(b))))),
        Case("a copy-on-write needs a block when none is free", (
            Op("allocate", 0, tuple(range(cap - b + 1 if b > 1 else cap))), Op("fork", 0, 1),
            Op("append", 0, 9), Op("free", 1), Op("append", 0, 9))),
    ]


def practice_cases(num_blocks: int, block_size: int, *, num_programs: int = 60,
                   num_ops: int = 20, seed: int = 0) -> list[Case]:
    """The graded programs for one pool: the scenarios, then ``num_programs`` seeded random ones
    (allocate, fork, append, free and double-free attempts, prompts up to the pool's capacity)."""
    n = integer("num_blocks", num_blocks, 1)
    b = integer("block_size", block_size, 1)
    cases = _scenarios(b) + _scenarios_for_pool(n, b)
    for index in range(integer("num_programs", num_programs, 0)):
        rng = random.Random(integer("seed", seed, 0) * 1_000_003 + index)
        model, dead, ops, next_id = PoolModel(n, b), [], [], 0
        for _ in range(integer("num_ops", num_ops, 1)):
            op = random_program(rng, list(model.tables), dead, next_id, max_prompt_tokens=n * b)
            next_id += op.kind in ("allocate", "fork")
            if op.kind == "free" and op.seq in model.tables:
                dead.append(op.seq)
            model.apply(op)
            ops.append(op)
        cases.append(Case(f"random program {index}", tuple(ops)))
    return cases


def _combine(question: str, reports: list[PracticeReport], total: int) -> PracticeReport:
    done = sum(r.cases_run for r in reports)
    last = reports[-1]
    return PracticeReport(question, last.status, done if last.status != "passed" else total,
                          total, last.failure)


def check(candidate: Callable, *, num_programs: int = 60, num_ops: int = 20, seed: int = 0,
          pools: Sequence[tuple[int, int]] = POOLS,
          question: str = "paged block allocator") -> PracticeReport:
    """Grade ``candidate(num_blocks, block_size)`` (a class or a factory) on every pool of ``pools``.

    Each pool runs the scenarios and ``num_programs`` seeded random programs of ``num_ops``
    operations (:func:`practice_cases`) through :func:`run_program`. Returns the report of
    :func:`lib.book.practice.grade`: passed, not implemented, or the first failing program shrunk,
    with the broken property named.
    """
    if not callable(candidate):
        raise ValueError(f"check() takes a class or a factory f(num_blocks, block_size), got {candidate!r}")
    plan = [(n, b, practice_cases(n, b, num_programs=num_programs, num_ops=num_ops, seed=seed))
            for n, b in pools]
    total = sum(len(cases) for *_, cases in plan)
    reports = []
    for n, b, cases in plan:

        def describe(ops, n=n, b=b):
            lines = [f"  pool: {n} blocks of {b} tokens, i.e. candidate({n}, {b})"]
            return "\n".join(lines + [f"  {i}. {op}" for i, op in enumerate(ops, 1)])

        report = grade(question, lambda n=n, b=b: candidate(n, b), cases,
                       lambda alloc, ops, n=n, b=b: run_program(alloc, ops, n, b), describe)
        reports.append(report)
        if not report.passed:
            break
    return _combine(question, reports, total)


# ---------------------------------------------------------------- I015: counting blocks and copies
def simulate_parallel_sampling(prompt_tokens: int, output_tokens: int, num_samples: int,
                               block_size: int) -> tuple[int, int, int]:
    """(blocks with sharing, blocks without, copies) for ``n`` samples of a ``P``-token prompt
    after ``G`` tokens each, by driving :class:`PoolModel` op by op (allocate, ``n - 1`` forks,
    then ``G`` rounds of one append per sample), and ``n`` unshared sequences on another model.
    A simulation, not a formula: the independent oracle for the closed form."""
    p = integer("prompt_tokens", prompt_tokens, 1)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_samples", num_samples, 1)
    b = integer("block_size", block_size, 1)
    room = n * (-(-(p + g) // b)) + n
    shared, alone = PoolModel(room, b), PoolModel(room, b)
    shared.apply(Op("allocate", 0, tuple(range(p))))
    for i in range(n):
        alone.apply(Op("allocate", i, tuple(range(p))))
        if i:
            shared.apply(Op("fork", 0, i))
    for _ in range(g):
        for i in range(n):
            shared.apply(Op("append", i, i))
            alone.apply(Op("append", i, i))
    return shared.used, alone.used, shared.copies


def sharing_count_cases() -> list[Case]:
    """Parameter sets (P, G, n, B), smallest first, covering the edges: P < B, P mod B = 0,
    G = 0, one sample, B = 1, and the question's own setup."""
    grid = [(1, 0, 1, 1), (3, 1, 2, 4), (4, 1, 2, 4), (5, 0, 3, 4), (5, 3, 3, 4), (2, 9, 4, 1),
            (10, 1, 4, 4), (7, 6, 5, 3), (16, 16, 3, 16), (17, 15, 3, 16), (40, 400, 8, 16),
            (1000, 200, 8, 16), (1008, 200, 8, 16), (1023, 1, 64, 16)]
    return [Case(f"P={p}, G={g}, n={n}, B={b}", ((p, g, n, b),)) for p, g, n, b in grid]


def _run_count(func: Callable, ops: Sequence) -> None:
    for p, g, n, b in ops:
        got = func(p, g, n, b)
        try:
            got = tuple(int(v) for v in got)
        except TypeError:
            raise AssertionError(f"return (blocks_shared, blocks_unshared, copies), got {got!r}") from None
        want = simulate_parallel_sampling(p, g, n, b)
        if got != want:
            raise AssertionError(
                f"blocks with sharing, without, copies = {got}; the step-by-step simulation "
                f"gives {want}"
            )


def check_sharing_counts(func: Callable) -> PracticeReport:
    """Grade ``func(prompt_tokens, output_tokens, num_samples, block_size)`` returning
    (blocks with sharing, blocks without, copies) against :func:`simulate_parallel_sampling`."""
    if not callable(func):
        raise ValueError(f"check_sharing_counts() takes a function, got {func!r}")
    return grade("blocks and copies for parallel sampling", lambda: func, sharing_count_cases(),
                 _run_count, lambda ops: "\n".join(f"  P, G, n, B = {op}" for op in ops))


# ---------------------------------------------------------------- I095: the defect hunt, blind
#: The defect hunt's allocators, by neutral name. What each one gets wrong stays here, unprinted,
#: until the notebook's reveal (:func:`hunt_reveal`); "staging" is the one the question hands over.
_HUNT: dict[str, dict[str, bool]] = {
    "staging": {"leak_on_failed_allocation": True, "alias_copied_payload": True},
    "variant A": {"leak_on_failed_allocation": True},
    "variant B": {"alias_copied_payload": True},
    "fixed": {},
}
HUNT_NAMES: tuple[str, ...] = tuple(_HUNT)
#: The two symptoms of the question, each with the oracle that sees it.
SYMPTOMS: dict[str, str] = {
    "capacity": "usable capacity collapses (free + used < total: blocks neither free nor owned)",
    "sibling token": "a sample reads a token its sibling wrote (a sequence reads other than it wrote)",
}


def hunt_allocator(name: str, num_blocks: int, block_size: int):
    """A fresh allocator of the defect hunt by neutral ``name`` (see :data:`HUNT_NAMES`)."""
    from lib.kvcache.defective import DefectiveAllocator

    if name not in _HUNT:
        raise ValueError(f"name must be one of {', '.join(HUNT_NAMES)}; got {name!r}")
    return DefectiveAllocator(num_blocks, block_size, **_HUNT[name])


def hunt_reveal(name: str) -> str:
    """After the hunt: what the allocator called ``name`` gets wrong, in words."""
    words = {
        "leak_on_failed_allocation": "takes blocks one by one and, when the free list runs dry "
        "midway, raises without giving back the blocks already taken (a leak)",
        "alias_copied_payload": "copy-on-write points the new block at the source's payload "
        "instead of copying it (two blocks, one payload)",
    }
    if name not in _HUNT:
        raise ValueError(f"name must be one of {', '.join(HUNT_NAMES)}; got {name!r}")
    flags = [words[k] for k, on in _HUNT[name].items() if on]
    return "; and ".join(flags) if flags else "nothing: it is the reference allocator"


def _symptom_oracle(symptom: str):
    from lib.kvcache.defective import content_oracle, ownership_oracle

    return {"capacity": ownership_oracle, "sibling token": content_oracle}[symptom]


class HuntReport:
    """What :func:`check_reproducers` found, one line per symptom."""

    def __init__(self, lines: list[tuple[str, bool | None, str]]):
        self.lines = lines

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.lines)

    def __repr__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}
        return "\n".join(f"{mark[ok]} {symptom}: {text}" for symptom, ok, text in self.lines)


def check_reproducers(capacity: str = "", sibling_token: str = "", *, num_blocks: int = 4,
                      block_size: int = 4, shortest: dict[str, int] | None = None) -> HuntReport:
    """Grade the candidate's reproducers: typed programs (``parse_op`` syntax, separated by ";"
    or new lines) that show each symptom on the staging allocator of ``num_blocks`` x
    ``block_size``.

    A reproducer passes when its last operation is the first after which the symptom's oracle
    fires on the staging allocator, and the same program runs clean on the reference
    (:class:`~lib.kvcache.BlockAllocator`: so it shows a defect, not a wrong program).
    ``shortest`` (symptom -> operations), when given, is compared with the program's length;
    otherwise a program of up to 4 operations is compared with :func:`shortest_failure`.
    """
    from lib.kvcache.allocator import BlockAllocator
    from lib.kvcache.allocator_grading import parse_op
    from lib.kvcache.defective import content_oracle, first_violation, ownership_oracle

    lines = []
    for symptom, text in (("capacity", capacity), ("sibling token", sibling_token)):
        if not str(text or "").strip():
            lines.append((symptom, None, "not tried yet: type the program, e.g. "
                          "\"allocate(seq=0, tokens=[0, 1]); fork(parent=0, child=1)\""))
            continue
        try:
            ops = [parse_op(t) for t in str(text).replace("\n", ";").split(";") if t.strip()]
            staged = first_violation(hunt_allocator("staging", num_blocks, block_size), ops,
                                     _symptom_oracle(symptom))
            clean = first_violation(BlockAllocator(num_blocks, block_size), ops,
                                    lambda a, s: ownership_oracle(a, s) + content_oracle(a, s))
        except (ValueError, KeyError) as err:
            lines.append((symptom, False, f"the program does not run: {err}"))
            continue
        if clean is not None:
            lines.append((symptom, False, f"it fails on the reference allocator too (after op "
                          f"{clean[0] + 1}: {clean[1][0]}): the program, not the allocator, is wrong"))
        elif staged is None:
            lines.append((symptom, False, f"the staging allocator shows no {symptom} symptom "
                          f"on a {num_blocks} x {block_size} pool after these {len(ops)} ops"))
        elif staged[0] < len(ops) - 1:
            lines.append((symptom, False, f"the symptom shows after op {staged[0] + 1}; the ops "
                          "after it are not needed"))
        else:
            best = (shortest or {}).get(symptom)
            if best is None and 1 < len(ops) <= 4:  # is there anything shorter? (exhaustive)
                shorter = shortest_failure(lambda: hunt_allocator("staging", num_blocks, block_size),
                                           _symptom_oracle(symptom), max_ops=len(ops) - 1)
                best = len(shorter) if shorter else len(ops)
            size = f"{len(ops)} operation(s)"
            note = "" if best is None else (
                " (as short as the shortest known)" if len(ops) <= best
                else f" (a shorter program exists: {best} operation(s))")
            lines.append((symptom, True, f"{size} show it: {staged[1][0]}{note}"))
    return HuntReport(lines)


def shortest_failure(factory: Callable[[], object], oracle: Callable, *, max_ops: int = 3,
                     num_token_values: int = 2) -> list[str] | None:
    """The shortest program (fewest operations, up to ``max_ops``) after whose last operation
    ``oracle`` first complains, by exhaustive breadth-first search; None if there is none.

    The alphabet: allocate a new sequence with 0, 1, B - 1, B, B + 1, all-but-one-block,
    the pool's capacity or capacity + 1 tokens; fork, append (tokens ``0 .. num_token_values - 1``)
    or free any live sequence. A second method for the shrinker: hypothesis shrinks what it
    happened to find; this search proves nothing shorter exists within the alphabet.
    """
    from lib.kvcache.defective import first_violation

    probe = require_protocol(factory())
    n, b = probe.num_blocks, probe.block_size
    cap = n * b
    sizes = sorted({0, 1, max(b - 1, 0), b, b + 1, cap - b + 1, cap, cap + 1})
    limit = integer("max_ops", max_ops, 1)

    def extensions(ops: list[Op]) -> list[Op]:
        model = PoolModel(n, b)
        for op in ops:
            model.apply(op)
        live, fresh = list(model.tables), len(ops)
        out = [Op("allocate", fresh, tuple(range(k))) for k in sizes]
        for s in live:
            out.append(Op("fork", s, fresh))
            out += [Op("append", s, t) for t in range(num_token_values)]
            out.append(Op("free", s))
        return out

    frontier: list[list[Op]] = [[]]
    for _ in range(limit):
        grown = []
        for ops in frontier:
            for op in extensions(ops):
                program = ops + [op]
                try:
                    found = first_violation(factory(), program, oracle)
                except (ValueError, KeyError):  # acts on a sequence this allocator never created
                    continue
                if found is not None and found[0] == len(program) - 1:
                    return [str(o) for o in program]
                if found is None:
                    grown.append(program)
        frontier = grown
    return None
