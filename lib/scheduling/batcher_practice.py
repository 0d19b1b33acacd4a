"""Practice mode for the fixed-cost batcher (W04): a grader for any implementation, and defective drafts.

A program is an optional ``("config", max_batch, timeout_s, queue_limit, batch_s)`` followed by
``("arrive", t)`` operations (non-decreasing times). :func:`run_program` drives the candidate with
:func:`lib.scheduling.batcher.run_fixed_cost` and checks, in this order:

* the properties, from the candidate's own answers: every item answered exactly once (served in one
  batch, or rejected at submission), no batch above ``max_batch``, FIFO order, no item rejected
  while the queue had room, and with ``queue_limit <= max_batch`` no item waiting longer than
  ``max(timeout_s, batch_s)`` (at most the timeout plus one batch's service);
* then the exact schedule against :class:`~lib.scheduling.batcher.SizeTimeoutBatcher` (the spec is
  deterministic: which items are rejected, and when each batch leaves with which items).

:func:`check` grades ``factory(max_batch, timeout_s, queue_limit)`` on scripted scenarios and seeded
random programs; the first failing program is shrunk (:func:`lib.book.practice.grade`).
``BATCHER_VARIANTS`` are drafts with one classic defect each; every one must fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .batcher import SizeTimeoutBatcher, run_fixed_cost

__all__ = ["BATCHER_VARIANTS", "batcher_cases", "batcher_variant", "check", "run_program"]

DEFAULT_CONFIG = ("config", 4, 0.05, 4, 0.1)  # max_batch, timeout_s, queue_limit, batch_s


def _split(ops: Sequence):
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    return cfg[1:], [op[1] for op in ops if op[0] == "arrive"]


def _describe(ops: Sequence) -> str:
    (b, tau, limit, cost), times = _split(ops)
    lines = [f"  batcher = factory(max_batch={b}, timeout_s={tau}, queue_limit={limit}); every batch costs {cost} s"]
    lines += [f"  item {k} arrives at t = {t:.4g} s" for k, t in enumerate(times)]
    return "\n".join(lines)


def _fmt_batches(batches) -> str:
    return ", ".join(f"t={t:.4g}: {items}" for t, items in batches[:6]) + (" ..." if len(batches) > 6 else "")


def run_program(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(max_batch, timeout_s, queue_limit)``; raise AssertionError naming the
    first broken property, or the first difference from the reference schedule."""
    (b, tau, limit, cost), times = _split(ops)
    got = run_fixed_cost(factory(b, tau, limit), times, cost)
    sent = [item for _, batch in got.batches for item in batch]
    dup = {x for x in sent if sent.count(x) > 1}
    if dup:
        raise AssertionError(f"items {sorted(dup)} were sent in more than one batch")
    lost = [k for k in range(len(times)) if got.accepted[k] and k not in sent]
    if lost:
        raise AssertionError(f"items {lost} were accepted but never answered")
    for t, batch in got.batches:
        if len(batch) > b:
            raise AssertionError(f"the batch at t = {t:.4g} s holds {len(batch)} items, above max_batch = {b}")
    if sent != sorted(sent):
        raise AssertionError(f"items left out of arrival order: {_fmt_batches(got.batches)} (FIFO: oldest first)")
    if limit is not None and limit <= b:
        bound = max(tau, cost)
        for k in got.served:
            wait = got.dispatch[k] - times[k]
            if wait > bound + 1e-9:
                raise AssertionError(f"item {k} (arrived t = {times[k]:.4g} s) waited {wait:.4g} s for its batch; "
                                     f"with queue_limit <= max_batch no item may wait more than "
                                     f"max(timeout_s, batch cost) = {bound:.4g} s")
    want = run_fixed_cost(SizeTimeoutBatcher(b, tau, limit), times, cost)
    if got.accepted != want.accepted:
        k = next(k for k in range(len(times)) if got.accepted[k] != want.accepted[k])
        raise AssertionError(f"item {k} (t = {times[k]:.4g} s) was {'accepted' if got.accepted[k] else 'rejected'}; "
                             f"expected {'accepted' if want.accepted[k] else 'rejected'} (reject only when "
                             f"queue_limit = {limit} items already wait)")
    if [(round(t, 9), list(x)) for t, x in got.batches] != [(round(t, 9), list(x)) for t, x in want.batches]:
        raise AssertionError(f"batches {_fmt_batches(got.batches)}; expected {_fmt_batches(want.batches)} (a batch "
                             "leaves when the server is free and max_batch items wait or the oldest has waited "
                             "timeout_s)")


def _random_program(rng: random.Random) -> list:
    b = rng.choice((1, 2, 3, 4, 8))
    cost = rng.choice((0.1, 0.05, 0.2))
    tau = rng.choice((0.0, 0.02, 0.05, 0.1, 0.3))
    limit = rng.choice((None, b, b, 2 * b, max(1, b - 1)))
    rate = rng.choice((2.0, 10.0, 40.0, 100.0))
    t, ops = 0.0, [("config", b, tau, limit, cost)]
    for _ in range(rng.randint(3, 25)):
        t += round(rng.expovariate(rate), 4) if rng.random() > 0.15 else 0.0  # some simultaneous arrivals
        ops.append(("arrive", round(t, 4)))
    return ops


def batcher_cases(num_random: int = 120, *, seed: int = 0) -> list[Case]:
    """Scripted scenarios (size trigger, lone item times out, burst above the cap, full queue rejects,
    timeout zero, server busy) and ``num_random`` seeded random programs."""
    n = integer("num_random", num_random, 0)

    def arrive(*ts):
        return tuple(("arrive", t) for t in ts)

    cases = [
        Case("a full batch leaves at once", (("config", 3, 1.0, None, 0.1), *arrive(0.0, 0.01, 0.02))),
        Case("a lone item leaves at its timeout", (("config", 4, 0.05, None, 0.1), *arrive(0.0))),
        Case("a burst above the cap is split, oldest first", (("config", 2, 0.05, None, 0.1), *arrive(0, 0, 0, 0, 0))),
        Case("a full queue rejects the newcomer", (("config", 2, 0.05, 2, 0.1), *arrive(0, 0, 0, 0.01, 0.2))),
        Case("timeout zero sends whatever waits", (("config", 8, 0.0, None, 0.1), *arrive(0.0, 0.03, 0.05, 0.12))),
        Case("the server busy holds the batch back", (("config", 2, 0.01, None, 0.1), *arrive(0, 0, 0.02, 0.05))),
        Case("the timeout counts from the oldest item", (("config", 4, 0.05, None, 0.01),
                                                         *arrive(0.0, 0.03, 0.06, 0.09, 0.2))),
    ]
    rng = random.Random(seed)
    cases += [Case(f"random program {k}", tuple(_random_program(rng))) for k in range(n)]
    return cases


def check(factory: Callable, *, num_random: int = 120, seed: int = 0) -> PracticeReport:
    """Grade any fixed-cost batcher: ``factory(max_batch, timeout_s, queue_limit)`` builds one with
    ``submit(item, now) -> bool``, ``deadline() -> float | None`` and ``next_batch(now) -> list``.
    Prints the first failing program shrunk."""
    return grade("fixed-cost batcher", lambda: factory, batcher_cases(num_random, seed=seed), run_program,
                 describe=_describe)


# ---- defective drafts (each must fail the grader): the reference with one mistake each ---------------
# A draft is either the reference's methods with the mistake edited into their source (edited_class:
# the edits are the whole difference) or a subclass that wraps the reference's methods.


class _SizeOnly(SizeTimeoutBatcher):
    """No time trigger: a lone item waits for company forever."""

    def deadline(self):
        return None

    def next_batch(self, now):
        return super().next_batch(now) if len(self._queue) >= self.max_batch else []


class _DropsOverflow(SizeTimeoutBatcher):
    """Sends the first max_batch items and clears the queue: the rest are never answered."""

    def next_batch(self, now):
        batch = super().next_batch(now)
        if batch:
            self._queue.clear()
        return batch


_DRAFTS = {
    "size_only": _SizeOnly,
    "timeout_from_newest": edited_class(
        SizeTimeoutBatcher, "_TimeoutFromNewest",
        "The timer restarts on every arrival: a steady trickle postpones the batch again and again.",
        deadline=[("return self._queue[0][1] + self.timeout_s if self._queue else None",
                   "return self._queue[-1][1] + self.timeout_s if self._queue else None")]),
    "off_by_one": edited_class(
        SizeTimeoutBatcher, "_OffByOne", "``<=`` for ``<``: takes one item more than the cap.",
        next_batch=[
            ("if not self._queue or (len(self._queue) < self.max_batch and now < self.deadline()):",
             "if not self._queue or (len(self._queue) <= self.max_batch and now < self.deadline()):"),
            ("return [self._queue.popleft()[0] for _ in range(min(self.max_batch, len(self._queue)))]",
             "return [self._queue.popleft()[0] for _ in range(min(self.max_batch + 1, len(self._queue)))]"),
        ]),
    "unbounded_queue": edited_class(
        SizeTimeoutBatcher, "_Unbounded", "Ignores queue_limit: under overload the queue, and every latency, grows "
        "without bound.",
        submit=[("if self.queue_limit is not None and len(self._queue) >= self.queue_limit:\nreturn False", "")]),
    "newest_first": edited_class(
        SizeTimeoutBatcher, "_Newest", "Takes the newest items first (a stack): the oldest can starve.",
        next_batch=[("return [self._queue.popleft()[0] for _ in range(min(self.max_batch, len(self._queue)))]",
                     "return [self._queue.pop()[0] for _ in range(min(self.max_batch, len(self._queue)))]")]),
    "drops_overflow": _DropsOverflow,
}
BATCHER_VARIANTS = tuple(_DRAFTS)


def batcher_variant(name: str) -> Callable:
    """A factory for the reference (``"reference"``) or a draft with one defect (``BATCHER_VARIANTS``)."""
    if name == "reference":
        return SizeTimeoutBatcher
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(BATCHER_VARIANTS)}, got {name!r}")
    return _DRAFTS[name]
