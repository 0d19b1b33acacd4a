"""Practice mode for the per-connection byte budget (I099): graded against a plain model of the rules.

The candidate writes a class with the interface of :class:`Skeleton`. A case is a program of
operations ``("offer", n)`` (the engine offers an event of ``n`` bytes; the grader fills it with
a running counter so reordering or loss shows), ``("take",)`` (the writer asks for the bytes to
write), ``("wrote", n)`` (the socket accepted ``n`` bytes of them; the grader clips ``n`` to what
the last ``take`` returned), ``("disconnect",)``; the first operation is ``("config", budget)``.
After every operation the grader checks against :class:`Oracle`:

* ``offer`` accepts exactly when the bytes held, **queue plus the unsent part of the pending
  write**, plus the event fit the budget; ``held_bytes`` never exceeds the budget;
* an event that does not fit cancels the stream: ``on_cancel("overflow")`` once, nothing held
  afterwards, every later offer refused;
* ``disconnect`` cancels with ``"disconnect"`` once (nothing if already cancelled) and releases
  the buffers; ``on_cancel`` is never called twice;
* the bytes the writer hands out are, in order, exactly the accepted events (coalescing allowed:
  ``take`` returns the unsent rest of the pending write, or the whole queue when it is done).

The defective drafts (:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .backpressure import ConnectionBuffer

__all__ = ["QUESTION", "VARIANTS", "Oracle", "Skeleton", "cases", "check", "random_ops", "run", "variant"]

QUESTION = "Per-connection byte budget with cancellation (I099)"


class Skeleton:
    """A connection's output buffer: a queue of events plus the pending write, under a byte budget."""

    def __init__(self, budget_bytes: int, on_cancel: Callable[[str], None]):
        """``on_cancel(reason)`` cancels the engine request; call it at most once, with "overflow" or
        "disconnect"."""
        raise NotImplementedError

    @property
    def held_bytes(self) -> int:
        """Bytes held: the queued events plus the unsent part of the pending write."""
        raise NotImplementedError

    def offer(self, event: bytes) -> bool:
        """Queue the engine's event if it fits the budget; if not, cancel ("overflow") and return False.
        Return False, holding nothing, once cancelled."""
        raise NotImplementedError

    def take(self) -> bytes:
        """The bytes to write next: the unsent rest of the pending write, or, once it is fully sent, the
        whole queue as the new pending write (b'' if nothing; b'' once cancelled)."""
        raise NotImplementedError

    def wrote(self, n: int) -> None:
        """The socket accepted ``n`` more bytes of the pending write."""
        raise NotImplementedError

    def disconnect(self) -> None:
        """The client went away: cancel ("disconnect") unless already cancelled; release everything."""
        raise NotImplementedError


_DRAFTS = {
    "pending write not counted": (
        "the budget counts only the queue: while a large coalesced write is pending, the queue refills to the "
        "budget again, so the connection holds up to twice what it promised",
        {"offer": [("held = self.queued + len(self.pending) - self.sent", "held = self.queued")]}),
    "overflow drops the event": (
        "an event that does not fit is dropped and the stream goes on: the client's text silently loses a "
        "token and the engine keeps generating",
        {"offer": [('self._cancel("overflow")', "pass")]}),
    "disconnect does not cancel the engine": (
        "a disconnect releases the buffers but never tells the engine, which decodes to max_tokens for nobody",
        {"_cancel": [("self.on_cancel(reason)", 'if reason != "disconnect":\n    self.on_cancel(reason)')]}),
    "cancel called twice": (
        "a disconnect after an overflow cancels again: the engine sees a second abort for the same request "
        "(a double free when the id has been reused)",
        {"_cancel": [("if self.cancelled:\n    return", "")]}),
    "buffers kept after cancel": (
        "cancelling marks the stream but keeps its queue and pending write: a cancelled connection still "
        "holds its bytes until it is garbage-collected",
        {"_cancel": [('self.queue, self.queued, self.pending, self.sent = [], 0, b"", 0', "")]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return ConnectionBuffer
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(ConnectionBuffer, "Draft", f"Draft: {doc}.", **methods)


class Oracle:
    """The rules, written plainly: accepted bytes in one string, a cursor for what was handed out and
    what the socket accepted."""

    def __init__(self, budget: int):
        self.budget, self.accepted, self.handed, self.sent = budget, b"", 0, 0
        self.cancels: list[str] = []

    @property
    def held(self) -> int:
        return 0 if self.cancels else len(self.accepted) - self.sent

    def offer(self, event: bytes) -> bool:
        if self.cancels:
            return False
        if self.held + len(event) > self.budget:
            self.cancels.append("overflow")
            return False
        self.accepted += event
        return True

    def take(self) -> bytes:
        if self.cancels:
            return b""
        if self.sent == self.handed:  # the pending write is done: hand out everything queued
            self.handed = len(self.accepted)
        return self.accepted[self.sent:self.handed]

    def wrote(self, n: int) -> None:
        self.sent += n

    def disconnect(self) -> None:
        if not self.cancels:
            self.cancels.append("disconnect")


def _event(n: int, counter: int) -> bytes:
    return bytes((counter + i) % 251 for i in range(n))


def run(factory: Callable, ops: Sequence) -> None:
    """Run ``ops`` on ``factory(budget, on_cancel)`` and on the oracle; raise AssertionError at the first
    difference (module docstring)."""
    ops = list(ops)
    budget = ops.pop(0)[1] if ops and ops[0][0] == "config" else 1000
    calls: list[str] = []
    buf, oracle = factory(budget, calls.append), Oracle(budget)
    counter, last_take = 0, 0
    for op in ops:
        kind = op[0]
        if kind == "offer":
            ev = _event(op[1], counter)
            counter += op[1]
            before = oracle.held
            got, want = buf.offer(ev), oracle.offer(ev)
            if bool(got) != want:
                raise AssertionError(f"{op}: offer returned {got!r}, expected {want} (held {before} of the "
                                     f"budget {budget} before it, counting the unsent pending write)")
        elif kind == "take":
            got, want = bytes(buf.take()), oracle.take()
            last_take = len(want)
            if got != want:
                raise AssertionError(f"{op}: take returned {len(got)} bytes, expected {len(want)} (the unsent pending "
                                     f"write, or the whole queue once it is done), content "
                                     f"{'equal' if got[:len(want)] == want[:len(got)] else 'different'}")
        elif kind == "wrote":
            n = min(op[1], last_take)
            buf.wrote(n)
            oracle.wrote(n)
            last_take -= n
        elif kind == "disconnect":
            buf.disconnect()
            oracle.disconnect()
        else:
            raise ValueError(f"unknown operation {op!r}")
        if oracle.cancels:
            last_take = 0  # a cancelled stream writes nothing more
        if calls != oracle.cancels:
            raise AssertionError(f"after {op}: on_cancel was called with {calls}, expected {oracle.cancels} "
                                 "(overflow and disconnect each cancel the engine request, once in all)")
        if buf.held_bytes != oracle.held:
            raise AssertionError(f"after {op}: held_bytes is {buf.held_bytes}, expected {oracle.held} (queue plus the "
                                 "unsent part of the pending write; 0 once cancelled)")
        if buf.held_bytes > budget:
            raise AssertionError(f"after {op}: {buf.held_bytes} bytes held, over the budget of {budget}")


def random_ops(seed: int, n: int = 40, budget: int = 600) -> tuple:
    """A random program: offers of events up to a third of the budget, takes, partial writes, rarely a
    disconnect."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = [("config", budget)]
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            ops.append(("offer", int(rng.integers(1, budget // 3))))
        elif r < 0.75:
            ops.append(("take",))
        elif r < 0.97:
            ops.append(("wrote", int(rng.integers(0, budget // 2))))
        else:
            ops.append(("disconnect",))
    return tuple(ops)


def cases() -> list[Case]:
    """Hand-made cases (each a classic defect), then random programs."""
    c = ("config", 100)
    return [
        Case("events within the budget", (c, ("offer", 40), ("offer", 40), ("take",), ("wrote", 80), ("take",))),
        Case("a pending write still counts", (c, ("offer", 60), ("take",), ("wrote", 10), ("offer", 60))),
        Case("an event that exactly fills the budget", (c, ("offer", 60), ("offer", 40), ("take",))),
        Case("only the unsent part of a write counts", (c, ("offer", 60), ("take",), ("wrote", 30), ("offer", 70),
                                                        ("take",))),
        Case("overflow cancels the request", (c, ("offer", 70), ("offer", 40), ("offer", 1))),
        Case("disconnect cancels the request", (c, ("offer", 30), ("take",), ("disconnect",), ("offer", 10))),
        Case("overflow then disconnect: one cancellation", (c, ("offer", 90), ("offer", 20), ("disconnect",))),
        Case("an event larger than the budget", (c, ("offer", 101))),
        Case("partial writes, then a coalesced write", (c, ("offer", 30), ("take",), ("wrote", 10), ("offer", 30),
                                                        ("take",), ("wrote", 20), ("take",), ("wrote", 30),
                                                        ("offer", 50), ("take",))),
        *[Case(f"random program {k}", random_ops(k)) for k in range(12)],
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {op}" for op in ops)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first failing
    program, shrunk (a program shrunk past its config line runs with a 1,000-byte budget)."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
