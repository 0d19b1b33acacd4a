"""Practice mode for the batch-routing bug (I097): a grader for any launch/complete pair, and drafts.

The candidate writes a class built as ``factory(sort, packing, vocab)`` with

* ``launch(running) -> record``: ``running`` is ``{rid: tokens}`` in admission order; the record's
  ``.batch`` is a :class:`lib.scheduling.routing.Batch` built with
  :func:`~lib.scheduling.routing.pack` over every running request, in the order
  :func:`~lib.scheduling.routing.sort_order` gives for ``sort``;
* ``complete(record, out, running) -> None``: ``out`` is the model's
  :class:`~lib.scheduling.routing.Output` for ``record.batch``; append ``out.tokens[i]`` to the request
  that held slot i at launch if it is still running, and raise ValueError, changing nothing, when
  ``out`` does not match the launch.

A program is an optional ``("config", sort, packing)`` and operations ``("admit", rid, length)`` (a
new request with a deterministic ``length``-token prompt), ``("launch",)`` (one step in flight at a
time), ``("drop", rid)`` (the request leaves: finished, aborted or preempted; allowed while a step
runs), ``("complete",)`` (the model's output for the step in flight) and ``("complete", fault)`` with
fault ``"swap"`` (two rows swapped), ``"short"`` (a row missing), ``"phantom"`` (an extra row),
``"bad_id"`` (a token id outside the vocabulary), ``"stale"`` (the previous step's output) or
``"replay"`` (the previous step's output delivered again for the previous launch). A step still
in flight when the program ends completes then. Operations that make no sense at that point (a
second launch while one runs, a drop of an unknown id, an id admitted before) are skipped, so every
sub-program is a program and the first failure shrinks (:func:`lib.book.practice.grade`).

:func:`run_program` checks, against :class:`~lib.scheduling.routing.FakeLM` (the next token is a pure
function of a request's own tokens):

* the launch: every running request in exactly one slot, in the sort's order, and each slot's row
  holds that request's tokens where the sampler reads (the model's echoed checksum);
* a completion: every request launched and still running gains exactly its own continuation, no
  other request changes (the one that received another's token is named);
* a faulty delivery raises ValueError and changes nothing (a replay need only be refused while one
  of its requests still runs), and the genuine output is still accepted afterwards.

``VARIANTS`` are drafts with one classic defect each; :func:`check` must fail every one.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence

import numpy as np

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from . import routing as rt
from .routing import (
    PACKINGS,
    SORTS,
    VOCAB,
    FakeLM,
    Launch,
    Output,
    StepRouter,
    prompt_tokens,
    sort_order,
)

__all__ = ["DEFAULT_CONFIG", "FAULT_OPS", "QUESTION", "VARIANTS", "Skeleton", "cases", "check", "describe",
           "run_program", "shrunk_ops", "variant"]

QUESTION = "batch routing, launch to completion (I097)"
DEFAULT_CONFIG = ("config", "longest_first", "padded")
FAULT_OPS = ("swap", "short", "phantom", "bad_id", "stale", "replay")
_MODEL = FakeLM(0, VOCAB)
_FAULT_WORDS = {
    "swap": "with rows 0 and {last} swapped",
    "short": "with its last row missing",
    "phantom": "with one extra row",
    "bad_id": f"with row 0's token set to {VOCAB} (outside the vocabulary)",
    "stale": "the output of the previous step instead",
}


class Skeleton:
    """Launches one step over every running request and routes the model's rows back."""

    def __init__(self, sort: str, packing: str, vocab: int):
        self.sort, self.packing, self.vocab = sort, packing, vocab

    def launch(self, running: dict):
        """Order the running requests by ``sort_order(lengths, self.sort)``, pack them with
        ``pack(rids, token_lists, self.packing, step=...)`` and return a record whose ``.batch`` is
        that batch, holding whatever ``complete`` needs."""
        raise NotImplementedError

    def complete(self, record, out, running: dict) -> None:
        """Append ``out.tokens[i]`` to the request of slot i at launch if it still runs; raise
        ValueError, changing nothing, if ``out`` does not match the launch."""
        raise NotImplementedError


def _split(ops: Sequence) -> tuple[str, str, list]:
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    return cfg[1], cfg[2], [op for op in ops if op[0] != "config"]


def describe(ops: Sequence) -> str:
    """The program as the lines of code a reader can replay."""
    sort, packing, body = _split(ops)
    lines = [f"  router = factory(sort={sort!r}, packing={packing!r}, vocab={VOCAB})"]
    used, running, flight, launches, last_done, slots = set(), [], None, 0, None, 0
    for op in body:
        kind = op[0]
        if kind == "admit" and op[1] not in used:
            used.add(op[1])
            running.append(op[1])
            lines.append(f"  running[{op[1]}] = a {op[2]}-token prompt")
        elif kind == "drop" and op[1] in running:
            running.remove(op[1])
            lines.append(f"  del running[{op[1]}]   # request {op[1]} leaves"
                         + (f" while b{flight} runs" if flight is not None else ""))
        elif kind == "launch" and flight is None and running:
            launches += 1
            flight, slots = launches, len(running)
            lines.append(f"  b{flight} = router.launch(running)   # slots: {len(running)} request(s)")
        elif kind == "complete" and len(op) == 1 and flight is not None:
            lines.append(f"  router.complete(b{flight}, model(b{flight}.batch), running)")
            last_done, flight = flight, None
        elif kind == "complete" and len(op) == 2:
            fault = op[1]
            if fault == "replay" and last_done is not None:
                lines.append(f"  router.complete(b{last_done}, model(b{last_done}.batch), running)   "
                             "# delivered again: refuse it")
            elif fault == "stale" and flight is not None and last_done is not None:
                lines.append(f"  router.complete(b{flight}, model(b{last_done}.batch), running)   "
                             "# the previous step's output: refuse it")
            elif fault in _FAULT_WORDS and fault != "stale" and flight is not None and (fault != "swap" or slots > 1):
                words = _FAULT_WORDS[fault].format(last="last")
                lines.append(f"  router.complete(b{flight}, <model(b{flight}.batch) {words}>, running)   # refuse it")
    if flight is not None:
        lines.append(f"  router.complete(b{flight}, model(b{flight}.batch), running)   # the step in flight completes")
    return "\n".join(lines)


def _whose(token: int, snapshot: dict) -> str:
    owners = [rid for rid, toks in snapshot.items() if _MODEL.next_token(toks) == token]
    return f"request {owners[0]}'s continuation" if owners else "nobody's continuation in that batch"


def _deliver(router, record, out, running: dict, what: str) -> None:
    try:
        router.complete(record, out, running)
    except ValueError as err:
        raise AssertionError(f"{what}: refused a genuine output ({err})") from None


def run_program(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(sort, packing, vocab)``; raise AssertionError naming the first broken
    property (module doc)."""
    sort, packing, body = _split(ops)
    router = factory(sort, packing, VOCAB)
    running: dict = {}
    used: set = set()
    flight = None  # (record, output, snapshot {rid: tuple}, number)
    prev = None  # the last completed (record, output, snapshot)
    launches = 0

    def finish(what: str) -> None:
        nonlocal flight, prev
        record, out, snap, k = flight
        want = {rid: list(t) for rid, t in running.items()}
        for rid in snap:
            if rid in want:
                want[rid].append(_MODEL.next_token(snap[rid]))
        _deliver(router, record, out, running, what)
        for rid in want:
            got = running.get(rid)
            if got == want[rid]:
                continue
            if rid not in snap:
                raise AssertionError(f"{what}: request {rid} was admitted after b{k} was launched, yet it changed "
                                     f"to end in {got[-3:]}")
            if got is None or len(got) != len(want[rid]) or got[:-1] != want[rid][:-1]:
                raise AssertionError(f"{what}: request {rid} should have gained exactly one token, its own "
                                     f"continuation {want[rid][-1]}; it now ends in "
                                     f"{(got or [])[-3:]} ({0 if got is None else len(got) - len(snap[rid])} new)")
            raise AssertionError(f"{what}: request {rid} received token {got[-1]}, which is {_whose(got[-1], snap)}; "
                                 f"its own continuation is {want[rid][-1]} (right shape, valid id, wrong request)")
        prev, flight = (record, out, snap), None

    for op in body:
        kind = op[0]
        if kind == "admit":
            if op[1] in used:
                continue
            used.add(op[1])
            running[op[1]] = prompt_tokens(op[1], op[2], VOCAB)
        elif kind == "drop":
            running.pop(op[1], None)
        elif kind == "launch":
            if flight is not None or not running:
                continue
            launches += 1
            where = f"b{launches} = router.launch(running)"
            snap = {rid: tuple(t) for rid, t in running.items()}
            record = router.launch(running)
            if {rid: tuple(t) for rid, t in running.items()} != snap:
                raise AssertionError(f"{where}: launch changed the running requests")
            batch = getattr(record, "batch", None)
            if not isinstance(batch, rt.Batch):
                raise AssertionError(f"{where}: launch must return a record whose .batch is a Batch built by pack(); "
                                     f"got {type(batch).__name__}")
            ids = [int(r) for r in batch.rids]
            rids = list(running)
            want = [rids[i] for i in sort_order([len(running[r]) for r in rids], sort)]
            if sorted(ids) != sorted(rids):
                raise AssertionError(f"{where}: the batch holds requests {ids}; every running request {rids} needs "
                                     "exactly one slot")
            if ids != want:
                raise AssertionError(f"{where}: the batch holds requests in the order {ids}; sort {sort!r} puts them "
                                     f"in the order {want}")
            try:
                out = _MODEL.forward(batch)
            except ValueError as err:
                raise AssertionError(f"{where}: {err}") from None
            for i, rid in enumerate(ids):
                if int(out.checksums[i]) != rt.checksum(running[rid]):
                    raise AssertionError(f"{where}: slot {i} holds request {rid}, but the sampler reads its row at "
                                         f"offsets {int(batch.starts[i])}..{int(batch.last[i])}, which are not request "
                                         f"{rid}'s {len(running[rid])} tokens: its continuation would be of other text")
            flight = (record, out, snap, launches)
        elif kind == "complete" and len(op) == 1:
            if flight is not None:
                finish(f"completing b{flight[3]}")
        elif kind == "complete":
            fault = op[1]
            if fault == "replay":
                if prev is None:
                    continue
                record, out, snap = prev
                must = any(rid in running for rid in snap)
                where = "delivering the last completed step's output again"
            else:
                if flight is None or (fault == "stale" and prev is None) or (fault == "swap" and flight[1].rows < 2):
                    continue
                record = flight[0]
                kind_of = {"swap": "swapped_rows", "short": "short_output", "phantom": "phantom_row",
                           "bad_id": "bad_token", "stale": "stale_output"}[fault]
                out = rt.corrupt(flight[1], kind_of, vocab=VOCAB, other=prev[1] if prev else None)
                must = True
                where = f"completing b{flight[3]} with a faulty output"
            before = copy.deepcopy(running)
            try:
                router.complete(record, out, running)
                refused = None
            except ValueError as err:
                refused = err
            if running != before:
                changed = sorted(rid for rid in set(running) | set(before) if running.get(rid) != before.get(rid))
                raise AssertionError(f"{where}: the {fault} delivery changed requests {changed}"
                                     + (" before it was refused: check everything first, then append"
                                        if refused else ": it had to be refused"))
            if must and refused is None:
                raise AssertionError(f"{where}: the {fault} delivery was accepted; it does not match the launch and "
                                     "must raise ValueError")
    if flight is not None:
        finish("the final completion")


def _random_program(rng: random.Random) -> list:
    ops: list = [("config", rng.choice(SORTS), rng.choice(PACKINGS))]
    next_id, live = 1, []
    for _ in range(rng.randint(4, 22)):
        r = rng.random()
        if r < 0.3 or not live:
            n = 1 if live else rng.randint(1, 4)
            for _ in range(n):
                ops.append(("admit", next_id, rng.randint(1, 9)))
                live.append(next_id)
                next_id += 1
        elif r < 0.5:
            ops.append(("launch",))
        elif r < 0.65:
            victim = rng.choice(live)
            live.remove(victim)
            ops.append(("drop", victim))
        elif r < 0.85:
            ops.append(("complete",))
        else:
            ops.append(("complete", rng.choice(FAULT_OPS)))
    return ops


def cases(num_random: int = 120, *, seed: int = 0) -> list[Case]:
    """Scripted scenarios (a sort that permutes, a drop mid-step, an admission mid-step, ragged packing,
    each fault) and ``num_random`` seeded random programs."""
    n = integer("num_random", num_random, 0)
    a = ("admit",)
    scripted = [
        Case("a length sort permutes the batch", (("config", "longest_first", "padded"), (*a, 1, 3), (*a, 2, 6),
                                                   (*a, 3, 4), ("launch",), ("complete",))),
        Case("shortest first, ragged packing", (("config", "shortest_first", "ragged"), (*a, 1, 7), (*a, 2, 2),
                                                (*a, 3, 5), ("launch",), ("complete",))),
        Case("a request leaves while its step runs", (("config", "fcfs", "padded"), (*a, 1, 4), (*a, 2, 4),
                                                      (*a, 3, 4), ("launch",), ("drop", 1), ("complete",))),
        Case("a request arrives while a step runs", (("config", "fcfs", "ragged"), (*a, 1, 2), (*a, 2, 5),
                                                     ("launch",), ("drop", 1), (*a, 3, 3), ("complete",), ("launch",),
                                                     ("complete",))),
        Case("rows come back swapped", (("config", "fcfs", "padded"), (*a, 1, 3), (*a, 2, 3), ("launch",),
                                        ("complete", "swap"), ("complete",))),
        Case("a short output, an extra row, a bad id", (("config", "longest_first", "ragged"), (*a, 1, 2), (*a, 2, 6),
                                                         ("launch",), ("complete", "short"), ("complete", "phantom"),
                                                         ("complete", "bad_id"), ("complete",))),
        Case("the previous step's output", (("config", "fcfs", "padded"), (*a, 1, 3), (*a, 2, 5), ("launch",),
                                            ("complete",), ("launch",), ("complete", "stale"), ("complete",))),
        Case("a completion delivered twice", (("config", "longest_first", "padded"), (*a, 1, 3), ("launch",),
                                              ("complete",), ("complete", "replay"), ("launch",),
                                              ("complete",))),
        Case("equal lengths, several steps", (("config", "longest_first", "padded"), (*a, 1, 4), (*a, 2, 4),
                                              (*a, 3, 4), ("launch",), ("complete",), ("launch",), ("drop", 2),
                                              ("complete",), ("launch",), ("complete",))),
    ]
    rng = random.Random(seed)
    return scripted + [Case(f"random program {k}", tuple(_random_program(rng))) for k in range(n)]


def check(factory: Callable, *, num_random: int = 120, seed: int = 0) -> PracticeReport:
    """Grade any router: ``factory(sort, packing, vocab)`` builds one with ``launch(running) -> record``
    (``record.batch`` from ``pack``) and ``complete(record, out, running)``. Prints the first failing
    program shrunk."""
    return grade(QUESTION, lambda: factory, cases(num_random, seed=seed), run_program, describe=describe)


def shrunk_ops(report: PracticeReport) -> int:
    """How many operations the first failing program of a failed report was shrunk to (0 if it passed)."""
    if report.passed or "shrunk to " not in report.failure:
        return 0
    return int(report.failure.split("shrunk to ")[1].split(" ")[0])


# ---- defective drafts (each must fail the grader) ---------------------------------------------------------


class _Presort(StepRouter):
    """Checks the output, then scatters the rows by the admission order (the order before the sort)."""

    def complete(self, record, out, running):
        rt.verify_output(record, out, self.vocab)
        rt.complete(record, out, running, route="presort", checks=False, vocab=self.vocab)


class _RunningIndex(StepRouter):
    """Sends row i to the i-th request running at completion: right until the sort or a drop moves it."""

    def complete(self, record, out, running):
        rt.verify_output(record, out, self.vocab)
        rt.complete(record, out, running, route="running_index", checks=False, vocab=self.vocab)


class _FilterZip(StepRouter):
    """Drops the requests that left, then zips the rows with the rest: one drop shifts every later row."""

    def complete(self, record, out, running):
        rt.verify_output(record, out, self.vocab)
        rt.complete(record, out, running, route="filter_zip", checks=False, vocab=self.vocab)


class _IndexPresort(StepRouter):
    """Packs the sorted rows but takes each row's offsets from the pre-sort lengths."""

    def launch(self, running):
        record = rt.launch_presort_indices(running, self.sort, self.packing, micro_batch=self.micro_batch,
                                           step=self.steps)
        self.steps += 1
        return record


class _NoChecks(StepRouter):
    """Routes by the manifest but trusts the output: swapped rows, a stale output, a bad id all go through."""

    def complete(self, record, out, running):
        rt.complete(record, out, running, checks=False, vocab=self.vocab)


class _IdsOnly(StepRouter):
    """Checks the shape and the echoed ids, not the launch id, the checksums or the lengths: a stale or
    replayed output with the same requests is applied."""

    def complete(self, record: Launch, out: Output, running):
        if out.rows != len(record.manifest) or [int(r) for r in out.rids] != list(record.slot_rids):
            raise ValueError("the output does not match the launch's slots")
        if not ((np.asarray(out.tokens) >= 0) & (np.asarray(out.tokens) < self.vocab)).all():
            raise ValueError("token id outside the vocabulary")
        rt.complete(record, out, running, checks=False, vocab=self.vocab)


class _CrashesOnDrop(StepRouter):
    """Routes by the manifest and checks the output, but forgets that a request may have left: KeyError."""

    def complete(self, record, out, running):
        rt.verify_output(record, out, self.vocab)
        for i, slot in enumerate(record.manifest):
            running[slot.rid].append(int(out.tokens[i]))


_DRAFTS = {
    "presort": _Presort,
    "running_index": _RunningIndex,
    "filter_zip": _FilterZip,
    "index_presort": _IndexPresort,
    "no_checks": _NoChecks,
    "ids_only": _IdsOnly,
    "crashes_on_drop": _CrashesOnDrop,
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> Callable:
    """A factory for the reference (``"reference"``: :class:`~lib.scheduling.routing.StepRouter`) or a
    draft with one defect (``VARIANTS``)."""
    if name == "reference":
        return StepRouter
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return _DRAFTS[name]
