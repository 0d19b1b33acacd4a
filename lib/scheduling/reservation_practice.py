"""Practice mode for token-reservation admission (I091): a predictive model, a grader, defective drafts.

:class:`ReservationModel` states the specification of :class:`lib.scheduling.reservation.
ReservationAdmission` without its data structures: the bucket's free tokens are the capacity minus
the needs of the running requests, the queue is a plain list, and admission walks it from the head.
:func:`check` grades ANY implementation of the interface (``factory(capacity)`` with ``submit``,
``complete``, ``cancel`` and ``free_tokens``) on scripted scenarios and seeded random programs:

* every return value against the model (``"admitted"`` / ``"queued"`` / ``"rejected"``, the ids a
  completion or cancellation admits, in order), and ``free_tokens`` after every operation;
* **the bound**: the worst cases of the requests the implementation says are running never add up
  to more than the capacity (checked from its own answers, before comparing with the model, so an
  over-admitting draft is told exactly that);
* misuse is refused with ValueError and changes nothing (a duplicate live id, completing twice or
  a request that never ran, reporting more tokens than reserved).

The first failing program is shrunk to a few operations (:func:`lib.book.practice.grade`).
``RESERVATION_VARIANTS`` are drafts with one classic defect each; every one must fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .reservation import ADMITTED, QUEUED, REJECTED, ReservationAdmission

__all__ = ["RESERVATION_VARIANTS", "ReservationModel", "check", "reservation_cases", "reservation_variant",
           "run_program"]

DEFAULT_CAPACITY = 100


class ReservationModel:
    """What a reservation bucket of ``capacity`` tokens must answer (the spec, module doc)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = integer("capacity", capacity, 1)
        self.running: dict = {}  # rid -> need (prompt + max_tokens)
        self.queue: list = []  # [(rid, need)], head first

    @property
    def free(self) -> int:
        return self.capacity - sum(self.running.values())

    def _live(self, rid) -> bool:
        return rid in self.running or any(r == rid for r, _ in self.queue)

    def submit(self, rid, prompt: int, max_tokens: int) -> str:
        if self._live(rid):
            raise ValueError("duplicate live id")
        need = prompt + max_tokens
        if need > self.capacity:
            return REJECTED
        self.queue.append((rid, need))
        admitted = self._admit()
        return ADMITTED if rid in admitted else QUEUED

    def complete(self, rid, used: int) -> list:
        if rid not in self.running:
            raise ValueError("not running")
        if not 0 <= used <= self.running[rid]:
            raise ValueError("used outside [0, reservation]")
        del self.running[rid]
        return self._admit()

    def cancel(self, rid) -> list:
        if rid in self.running:
            del self.running[rid]
        elif self._live(rid):
            self.queue = [(r, n) for r, n in self.queue if r != rid]
        else:
            raise ValueError("not live")
        return self._admit()

    def _admit(self) -> list:
        out = []
        while self.queue and self.queue[0][1] <= self.free:
            rid, need = self.queue.pop(0)
            self.running[rid] = need
            out.append(rid)
        return out


def _free_of(obj):
    got = getattr(obj, "free_tokens", None)
    return got() if callable(got) else got


def _describe(ops: Sequence) -> str:
    lines = [] if ops and ops[0][0] == "pool" else [f"  bucket = factory(capacity={DEFAULT_CAPACITY})"]
    for op in ops:
        if op[0] == "pool":
            lines.append(f"  bucket = factory(capacity={op[1]})")
        elif op[0] == "submit":
            lines.append(f"  bucket.submit({op[1]!r}, prompt_tokens={op[2]}, max_tokens={op[3]})")
        elif op[0] == "complete":
            lines.append(f"  bucket.complete({op[1]!r}, used_tokens={op[2]})")
        else:
            lines.append(f"  bucket.cancel({op[1]!r})")
    return "\n".join(lines)


def run_program(factory: Callable[[int], object], ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(capacity)`` beside a :class:`ReservationModel`; raise
    AssertionError at the first difference or broken bound (a leading ``("pool", C)`` sets C)."""
    ops = list(ops)
    capacity = ops[0][1] if ops and ops[0][0] == "pool" else DEFAULT_CAPACITY
    bucket, model = factory(capacity), ReservationModel(capacity)
    declared: dict = {}  # rid -> need of its latest submission
    held: dict = {}  # what the implementation says is running: rid -> need

    def admitted_now(step, rids, what):
        for rid in rids:
            if rid not in declared:
                raise AssertionError(f"step {step}: {what} admitted {rid!r}, which was never submitted")
            held[rid] = declared[rid]

    for step, op in enumerate((op for op in ops if op[0] != "pool"), 1):
        kind, rid = op[0], op[1]
        try:
            want = getattr(model, kind)(*op[1:])
            refused = None
        except ValueError as err:
            want, refused = None, err
        try:
            got = getattr(bucket, kind)(*op[1:])
        except ValueError as err:
            if refused is None:
                raise AssertionError(f"step {step}: {kind} raised ValueError ({err}) on a valid call") from None
            got = None
        else:
            if refused is not None:
                raise AssertionError(f"step {step}: {kind}({rid!r}) was accepted, but it must raise ValueError "
                                     f"({refused}) and change nothing") from None
        if refused is None:
            if kind == "submit":
                declared[rid] = op[2] + op[3]
                if got == ADMITTED:
                    held[rid] = declared[rid]
            else:
                held.pop(rid, None)
                admitted_now(step, list(got) if got is not None else [], kind)
            total = sum(held.values())
            if total > capacity:
                raise AssertionError(
                    f"step {step}: the bound broke: the requests you admitted reserve {total} tokens (prompt + "
                    f"max_tokens each) in a bucket of {capacity}; their KV can outgrow the pool mid-decode")
            if kind == "submit" and got != want:
                raise AssertionError(f"step {step}: submit returned {got!r}; expected {want!r}"
                                     + (" (its prompt + max_tokens can never fit: fail fast)" if want == REJECTED
                                        else " (FIFO: nobody passes a waiting head)" if want == QUEUED
                                        and model.queue and model.queue[0][0] != rid else ""))
            if kind != "submit" and list(got or []) != want:
                raise AssertionError(f"step {step}: {kind} admitted {list(got or [])}; expected {want} "
                                     "(refund the whole reservation, then admit from the head in FIFO order)")
        free = _free_of(bucket)
        if free is not None and free != model.free:
            raise AssertionError(f"after step {step}: free_tokens is {free}; the running requests reserve "
                                 f"{capacity - model.free} of {capacity}, leaving {model.free}")


def _random_program(rng: random.Random, num_ops: int, capacity: int) -> list:
    model = ReservationModel(capacity)
    ops: list = []
    next_id = 0
    for _ in range(num_ops):
        r = rng.random()
        running, queued = list(model.running), [rid for rid, _ in model.queue]
        if r < 0.5 or not (running or queued):
            if rng.random() < 0.08 and (running or queued):
                rid = rng.choice(running + queued)  # a duplicate live id: must be refused
            elif rng.random() < 0.1 and next_id:
                rid = f"r{rng.randrange(next_id)}"  # maybe reuse a finished id (allowed)
            else:
                rid, next_id = f"r{next_id}", next_id + 1
            prompt = rng.randint(1, max(1, capacity // 2))
            max_tokens = rng.randint(1, capacity if rng.random() < 0.15 else max(1, capacity // 2))
            op = ("submit", rid, prompt, max_tokens)
        elif r < 0.85 and running:
            rid = rng.choice(running)
            need = model.running[rid]
            used = need + rng.randint(1, 5) if rng.random() < 0.05 else rng.randint(0, need)
            op = ("complete", rid, used)
        elif r < 0.92 and (running or queued):
            op = ("cancel", rng.choice(running + queued))
        else:  # misuse: complete what is queued or not live
            op = ("complete", rng.choice(queued) if queued else f"r{next_id + 7}", 1)
        try:
            getattr(model, op[0])(*op[1:])
        except ValueError:
            pass
        ops.append(op)
    return ops


def reservation_cases(num_random: int = 150, *, seed: int = 0) -> list[Case]:
    """Scripted scenarios (fail fast, refund, FIFO head, cancelled head, exact fit, double completion,
    over-use, id reuse) and ``num_random`` seeded random programs on buckets of 10 to 100 tokens."""
    n = integer("num_random", num_random, 0)
    pool = ("pool", 100)
    cases = [
        Case("fail fast: a request bigger than the bucket", (pool, ("submit", "a", 60, 50), ("submit", "b", 10, 10))),
        Case("refund at completion admits the queue", (
            pool, ("submit", "a", 30, 50), ("submit", "b", 30, 30), ("complete", "a", 35), ("submit", "c", 5, 5))),
        Case("FIFO: a small request does not pass a waiting head", (
            pool, ("submit", "a", 50, 40), ("submit", "b", 20, 70), ("submit", "c", 1, 1), ("complete", "a", 60))),
        Case("a cancelled head unblocks the queue", (
            pool, ("submit", "a", 50, 40), ("submit", "b", 20, 70), ("submit", "c", 1, 1), ("cancel", "b"))),
        Case("an exact fit is admitted", (pool, ("submit", "a", 60, 40), ("submit", "b", 1, 1), ("complete", "a", 100))),
        Case("completing twice is refused", (pool, ("submit", "a", 30, 30), ("complete", "a", 40),
                                              ("complete", "a", 40), ("submit", "b", 50, 50))),
        Case("using more than reserved is refused", (pool, ("submit", "a", 10, 10), ("complete", "a", 25),
                                                      ("submit", "b", 45, 45))),
        Case("a queued request cannot complete", (pool, ("submit", "a", 50, 50), ("submit", "b", 50, 50),
                                                  ("complete", "b", 10), ("complete", "a", 100))),
        Case("an id can be reused once its request is done", (
            pool, ("submit", "a", 40, 40), ("complete", "a", 50), ("submit", "a", 40, 40), ("submit", "a", 1, 1))),
        Case("a running request can be cancelled", (pool, ("submit", "a", 70, 20), ("submit", "b", 20, 20),
                                                     ("cancel", "a"))),
    ]
    rng = random.Random(seed)
    for k in range(n):
        cap = rng.choice((10, 20, 50, 100))
        cases.append(Case(f"random program {k}", (("pool", cap), *_random_program(rng, rng.randint(6, 30), cap))))
    return cases


def check(factory: Callable[[int], object], *, num_random: int = 150, seed: int = 0) -> PracticeReport:
    """Grade any reservation bucket: ``factory(capacity)`` builds one with ``submit(rid, prompt_tokens,
    max_tokens) -> "admitted" | "queued" | "rejected"``, ``complete(rid, used_tokens) -> [ids admitted]``,
    ``cancel(rid) -> [ids admitted]`` and ``free_tokens``; misuse raises ValueError. The first
    failing case is shown shrunk."""
    return grade("token reservation admission", lambda: factory, reservation_cases(num_random, seed=seed),
                 run_program, describe=_describe)


# ---- defective drafts (each must fail the grader): the reference with one mistake each ---------------
# A draft is either the reference's methods with the mistake edited into their source (edited_class:
# the edits are the whole difference) or a subclass that wraps the reference's methods.


class _DoubleRefund(ReservationAdmission):
    """Never forgets a completed request: completing it again refunds again."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self._done: dict = {}

    def complete(self, rid, used_tokens):
        if rid in self._done and rid not in self._running:
            self._free += self._done[rid]
            return self._pump()
        held = self._running.get(rid)
        out = super().complete(rid, used_tokens)
        self._done[rid] = held
        return out


class _CancelDoesNotPump(ReservationAdmission):
    """Cancelling the waiting head does not look at the queue again: it stalls until a completion."""

    def cancel(self, rid):
        if rid in self._queue:
            del self._queue[rid]
            return []
        return super().cancel(rid)


_DRAFTS = {
    "reserves_prompt_only": edited_class(
        ReservationAdmission, "_ReservesPromptOnly",
        "Greedy admission passed off as reservation: holds the prompt only.",
        submit=[("if not self._queue and need <= self._free:",
                 "need = p  # the output's tokens are not held\nif not self._queue and need <= self._free:")]),
    "no_fail_fast": edited_class(
        ReservationAdmission, "_NoFailFast", "Queues a request that can never fit: it blocks the head forever.",
        submit=[("if need > self.capacity:\nreturn REJECTED  # fail fast: it could never be admitted", "")]),
    "refunds_used_only": edited_class(
        ReservationAdmission, "_RefundsUsedOnly",
        "Gives back only what was used: the unused part of every reservation leaks.",
        complete=[("self._free += held", "self._free += used")]),
    "skips_ahead": edited_class(
        ReservationAdmission, "_SkipsAhead",
        "Admits whatever fits, wherever it waits: small requests pass (and can starve) a large head.",
        submit=[("if not self._queue and need <= self._free:", "if need <= self._free:")],
        _pump=[("while self._queue:\nrid, need = next(iter(self._queue.items()))\nif need > self._free:\nbreak",
                "for rid, need in list(self._queue.items()):\n    if need > self._free:\n        continue")]),
    "double_refund": _DoubleRefund,
    "cancel_does_not_pump": _CancelDoesNotPump,
    "strict_fit": edited_class(
        ReservationAdmission, "_StrictFit", "need < free instead of need <= free: an exact fit waits.",
        submit=[("if not self._queue and need <= self._free:", "if not self._queue and need < self._free:")],
        _pump=[("if need > self._free:", "if need >= self._free:")]),
}
RESERVATION_VARIANTS = tuple(_DRAFTS)


def reservation_variant(name: str) -> Callable[[int], ReservationAdmission]:
    """A factory for the reference (``"reference"``) or a draft with one classic defect
    (``RESERVATION_VARIANTS``)."""
    if name == "reference":
        return ReservationAdmission
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(RESERVATION_VARIANTS)}, got {name!r}")
    return _DRAFTS[name]


# ---- the bound, as a property over time ----------------------------------------------------------------


def worst_pool_use(factory: Callable[[int], object], *, num_programs: int = 200, seed: int = 0) -> tuple[float, list]:
    """The most KV the requests an implementation admits ever write at once, as a fraction of the bucket,
    over ``num_programs`` seeded random programs in which running requests really decode.

    Each request has a hidden real cost between its prompt and prompt + max_tokens (known only when it
    ends); every tick each running request writes one more token until it reaches that cost and completes
    (reporting what it used). The written total is checked after every tick. Returns (worst fraction, the
    trace of the worst program: its operations). A correct reservation bucket never exceeds 1.0; a draft
    that overcommits does, which in an engine means a preemption.
    """
    n = integer("num_programs", num_programs, 1)
    rng = random.Random(seed)
    worst, worst_ops = 0.0, []
    for _ in range(n):
        cap = rng.choice((50, 100, 200))
        bucket = factory(cap)
        written: dict = {}  # running rid -> tokens written so far
        cost: dict = {}  # rid -> hidden real cost
        prompt: dict = {}
        ops: list = [("pool", cap)]
        peak = 0.0
        for k in range(rng.randint(10, 40)):
            if rng.random() < 0.5:
                rid = f"r{k}"
                p = rng.randint(1, cap // 3)
                m = rng.randint(1, cap // 2)
                prompt[rid], cost[rid] = p, p + rng.randint(1, m)
                ops.append(("submit", rid, p, m))
                if bucket.submit(rid, p, m) == ADMITTED:
                    written[rid] = p
            for rid in list(written):  # one decode tick: every running request writes a token
                written[rid] += 1
            peak = max(peak, sum(written.values()) / cap)
            for rid in [r for r, w in written.items() if w >= cost[r]]:
                used = written.pop(rid)
                ops.append(("complete", rid, used))
                try:
                    admitted = bucket.complete(rid, used)
                except ValueError:  # a draft that never reserved what the request used refuses it
                    admitted = []
                for new in admitted:
                    written[new] = prompt[new]
            peak = max(peak, sum(written.values()) / cap)
        if peak > worst:
            worst, worst_ops = peak, ops
    return worst, worst_ops
