"""Practice mode for the scheduler loop (I088): a skeleton, a grader, and the classic mistakes.

The candidate writes a function ``schedule_step(state, budget) -> Step`` with the rules of
:mod:`lib.scheduling.scheduler_loop` (decodes first, then running prefills, then resumes before
admissions, the newest running request preempted when the pool is short). :func:`check` grades
any such function: it runs whole request sets to completion with the candidate's decisions
(applied by :func:`~lib.scheduling.scheduler_loop.advance`) and at every step asserts the
invariants (:func:`~lib.scheduling.scheduler_loop.check_invariants`: budget, decodes first, one
queue per request, victims resume first), that the step does not over-allocate the pool, and
then that the decisions equal the reference's on the same state (the predictive oracle). A case
is a program:

- ``("config", budget, num_blocks, block_size, max_running)``: first op (default
  ``DEFAULT_CONFIG``); shrinking may drop it;
- ``("request", prompt_len, output_len)``: one request, rid = its position among the requests.

``VARIANTS`` are drafts with one classic mistake each; every one must fail (the unit tests say so).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .scheduler_loop import (
    SchedState,
    Step,
    advance,
    blocks_for,
    check_invariants,
    initial_state,
    schedule_step,
)

__all__ = ["DEFAULT_CONFIG", "QUESTION", "VARIANTS", "cases", "check", "describe", "run", "skeleton", "variant"]

QUESTION = "the scheduler loop (I088)"
DEFAULT_CONFIG = ("config", 16, 12, 4, 4)
MAX_STEPS = 2000


def skeleton(state: SchedState, budget: int) -> Step:
    """Decide one step: decodes first, then running prefills, then (if nobody was preempted)
    resumes from ``state.preempted`` and admissions from ``state.waiting``; at most ``budget``
    tokens; the newest running request is preempted while the pool is short."""
    raise NotImplementedError


# ---- defective drafts (each must fail the grader): the reference with one mistake each ---------------
# Each draft is schedule_step's own source with its mistake edited in (lib.book.drafts): the
# edits below are the whole difference from the reference.

_TEXT = {
    "prefill_first": "prefill chunks take the budget before the decodes (a long prompt starves running decodes)",
    "chunk_ignores_budget": "a chunk sized by what is left of the prompt, not by what is left of the budget",
    "admits_after_preempting": "new admissions in a step that had to preempt (they take the victim's blocks)",
    "waiting_before_preempted": "new requests admitted before preempted ones resume (a victim can starve)",
    "oldest_victim": "the oldest running request preempted instead of the newest",
    "admission_ignores_blocks": "admission that does not check the free blocks",
    "decode_budget_not_reserved": "prefill chunks sized from the whole budget, ignoring the decodes' tokens",
}

_EDITS = {  # name: the edits of schedule_step's source, (reference lines, draft lines) each
    "prefill_first": [
        ('for phase in ("decode", "prefill"):', 'for phase in ("prefill", "decode"):'),
        ("decodes.append(seq.rid)", "decodes.append(seq.rid)\nleft -= 1  # decodes get what the prefills left"),
    ],
    "chunk_ignores_budget": [
        ("c = 1 if seq.decoding else min(seq.prefill_left, left)", "c = 1 if seq.decoding else seq.prefill_left"),
        ("c = min(seq.prefill_left, left)", "c = seq.prefill_left"),
    ],
    "admits_after_preempting": [("if not preempted:", "if True:  # the check is missing")],
    "waiting_before_preempted": [
        ("for queue, taken in ((state.preempted, resumed), (state.waiting, admitted)):",
         "for queue, taken in ((state.waiting, admitted), (state.preempted, resumed)):"),
    ],
    "oldest_victim": [
        ("victim = running.pop()  # the newest running request", "victim = running.pop(0)  # the oldest"),
        # the oldest may have decoded earlier in this step: its token is taken back
        ("chunks = [(r, c) for r, c in chunks if r not in preempted]",
         "chunks = [(r, c) for r, c in chunks if r not in preempted]\n"
         "decodes = [r for r in decodes if r not in preempted]"),
    ],
    "admission_ignores_blocks": [("if need > free:\nbreak", "")],
    "decode_budget_not_reserved": [("left = budget - len(decodes)  # what the decodes leave", "left = budget")],
}

VARIANTS = tuple(_EDITS)
"""Defective schedulers the grader must fail."""


def _build(name: str) -> Callable[[SchedState, int], Step]:
    draft = edited(schedule_step, _EDITS[name], name=name)
    draft.__name__, draft.__doc__ = f"schedule_step_{name}", f"schedule_step with one mistake: {_TEXT[name]}."
    return draft


_DRAFTS = {name: _build(name) for name in VARIANTS}


def variant(name: str) -> Callable[[SchedState, int], Step]:
    """The reference (``"reference"``) or a defective draft (``VARIANTS``), as a function."""
    if name == "reference":
        return schedule_step
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return _DRAFTS[name]


# ---- the grader ----------------------------------------------------------------------------------


def _split(ops: Sequence) -> tuple[tuple, list]:
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    return cfg, [(op[1], op[2]) for op in ops if op[0] == "request"]


def _show(state: SchedState) -> str:
    def q(seqs):
        return "[" + ", ".join(f"{s.rid}(prefill_left={s.prefill_left}, ctx={s.context}, blocks={s.blocks})"
                               for s in seqs) + "]"
    return (f"waiting={q(state.waiting)} running={q(state.running)} preempted={q(state.preempted)} "
            f"free_blocks={state.free_blocks}")


def _matching(state, budget, got) -> str:
    for name in VARIANTS:
        try:
            if _DRAFTS[name](state, budget) == got:
                return f" It matches a known mistake: {_TEXT[name]}."
        except Exception:  # noqa: BLE001 - a draft that crashes differs anyway
            continue
    return ""


def run(fn: Callable[[SchedState, int], Step], ops: Sequence) -> None:
    """Run the program's requests to completion with ``fn``'s decisions; AssertionError at the
    first broken invariant, over-allocation or difference from the reference."""
    cfg, reqs = _split(ops)
    _, budget, num_blocks, bs, max_running = cfg
    if not reqs or any(blocks_for(p + o - 1, bs) > num_blocks for p, o in reqs):
        return  # nothing to schedule, or a request the pool can never hold: not a graded case
    state = initial_state(reqs, num_blocks, bs, max_running)
    for k in range(1, MAX_STEPS + 1):
        if not (state.waiting or state.running or state.preempted):
            return
        got = fn(state, budget)
        where = f"step {k}, state {_show(state)}, budget {budget}"
        if not isinstance(got, Step):
            raise AssertionError(f"{where}: schedule_step returned {type(got).__name__}, not a Step")
        try:
            check_invariants(state, budget, got)
        except AssertionError as err:
            raise AssertionError(f"{where}: {err}.{_matching(state, budget, got)}") from None
        want = schedule_step(state, budget)
        try:
            new, _ = advance(state, got)
        except ValueError as err:
            raise AssertionError(f"{where}: {err}.{_matching(state, budget, got)}") from None
        if got != want:
            raise AssertionError(f"{where}: decided {got}, the rules give {want}.{_matching(state, budget, got)}")
        state = new
    raise AssertionError(f"not finished after {MAX_STEPS} steps")


def _random_program(rng: random.Random) -> tuple:
    bs = rng.choice([1, 2, 4, 8])
    max_running = rng.randint(1, 6)
    budget = rng.randint(max_running, 32)
    reqs = [(rng.randint(1, 40), rng.randint(1, 12)) for _ in range(rng.randint(1, 8))]
    need = max(blocks_for(p + o - 1, bs) for p, o in reqs)
    blocks = rng.randint(need, 3 * need)  # often tight: preemption happens
    return (("config", budget, blocks, bs, max_running), *(("request", p, o) for p, o in reqs))


def cases(num_random: int = 60, seed: int = 0) -> list[Case]:
    """Scripted scenarios (decode then prefill, a long prompt chunked under the budget, a pool
    that forces preemption and a resume, max_running) then ``num_random`` seeded programs."""
    num_random = integer("num_random", num_random, 0)
    rng = random.Random(integer("seed", seed, 0))
    scripted = [
        Case("one request: prefill then decode", (DEFAULT_CONFIG, ("request", 5, 3))),
        Case("a long prompt chunked under the budget while another decodes",
             (("config", 8, 40, 4, 4), ("request", 3, 6), ("request", 30, 2))),
        Case("decodes first, then the waiting queue", (("config", 6, 40, 4, 4), ("request", 2, 5),
                                                       ("request", 2, 5), ("request", 9, 2))),
        Case("a tight pool: preempt the newest, resume it before new arrivals",
             (("config", 16, 6, 2, 4), ("request", 3, 6), ("request", 3, 6), ("request", 3, 4), ("request", 2, 2))),
        Case("max_running caps admission", (("config", 32, 40, 4, 2), ("request", 2, 3), ("request", 2, 3),
                                            ("request", 2, 3))),
    ]
    return scripted + [Case(f"random program {k}", _random_program(rng)) for k in range(num_random)]


def describe(ops: Sequence) -> str:
    """The (shrunk) program: its configuration and requests."""
    cfg, reqs = _split(ops)
    lines = [f"  budget={cfg[1]} tokens per step, num_blocks={cfg[2]}, block_size={cfg[3]}, max_running={cfg[4]}"]
    lines += [f"  request {rid}: prompt {p} tokens, output {o} tokens (all waiting at the start)"
              for rid, (p, o) in enumerate(reqs)]
    return "\n".join(lines)


def check(fn: Callable[[SchedState, int], Step], num_random: int = 60, seed: int = 0) -> PracticeReport:
    """Grade any ``schedule_step(state, budget) -> Step`` against the invariants and the reference."""
    if not callable(fn):
        raise ValueError(f"check() takes a function schedule_step(state, budget), got {fn!r}")
    return grade(QUESTION, lambda: fn, cases(num_random, seed), run, describe)
