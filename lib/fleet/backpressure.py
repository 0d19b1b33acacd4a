"""Per-connection output budgets for a streaming server, wired to engine cancellation (I099).

Between the engine (one event per generated token) and a client's socket sits a per-connection
output buffer. Unbounded, a client that reads slowly, or not at all, makes it grow for as long as
the engine generates; shared with other streams (one queue, or writes from the step loop), it
stalls every generation behind that client (:func:`lib.scheduling.streaming.stream` computes
both). :class:`ConnectionBuffer` is the bounded version:

* it holds two things: the **queue** (events offered by the engine, not yet handed to the socket)
  and the **pending write** (bytes handed to the transport in one write call, of which the socket
  has accepted ``sent`` so far). The writer coalesces the whole queue into one pending write when
  the previous one is done (what ``writev`` or an asyncio transport's buffer does), so the pending
  write can be as large as the budget itself;
* the **budget counts both**: ``held = queued + (pending - sent)``. An event is accepted only if
  ``held + len(event) <= budget``. A budget that counts only the queue lets the connection hold
  up to twice the budget: the queue refills while a budget-sized write is still pending;
* **overflow cancels**: an event that does not fit ends the stream. The buffer calls
  ``on_cancel("overflow")`` once (the engine aborts the request and frees its KV) and releases
  everything it held; silently dropping the event instead would corrupt the stream and keep the
  engine generating for a client that never gets it;
* **disconnect cancels**: ``disconnect()`` calls ``on_cancel("disconnect")`` once and releases
  the buffers; whichever of overflow and disconnect comes first is the only cancellation.

:func:`simulate_connection` runs one connection in time steps: the engine offers an event every
``step_s``, the writer fills the kernel's socket buffer from the pending write, and the client
drains the socket at its read rate. It reports the peak bytes held and when (and why) the stream
was cancelled. :func:`sse_event_bytes` sizes an event from the OpenAI-compatible
``chat.completion.chunk`` format. SI units: bytes, seconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["ConnectionBuffer", "ConnectionRun", "simulate_connection", "sse_event", "sse_event_bytes"]


def sse_event(text: str, model: str = "llama-3.1-70b", request_id: str = "chatcmpl-0123456789abcdef",
              created: int = 1_700_000_000) -> bytes:
    """One server-sent event carrying ``text`` as an OpenAI-compatible ``chat.completion.chunk``
    (``data: {json}`` and a blank line), UTF-8."""
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}
    return b"data: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def sse_event_bytes(text: str = " the", model: str = "llama-3.1-70b") -> int:
    """Bytes of one streamed token's event (:func:`sse_event`)."""
    return len(sse_event(text, model))


class ConnectionBuffer:
    """A connection's output buffer with a byte budget that counts the pending write (module docstring).

    ``on_cancel(reason)`` is called at most once, with ``"overflow"`` or ``"disconnect"``.
    """

    def __init__(self, budget_bytes: int, on_cancel: Callable[[str], None]):
        self.budget = integer("budget_bytes", budget_bytes, 1, unit="bytes")
        self.on_cancel = on_cancel
        self.queue: list[bytes] = []
        self.queued = 0  # bytes in the queue
        self.pending = b""  # the write handed to the transport
        self.sent = 0  # bytes of it the socket has accepted
        self.cancelled: str | None = None
        self.peak_held = 0

    @property
    def held_bytes(self) -> int:
        """Bytes this connection holds: the queue plus the unsent part of the pending write."""
        return self.queued + len(self.pending) - self.sent

    def offer(self, event: bytes) -> bool:
        """The engine's event for this stream; False if the stream is (now) cancelled."""
        if self.cancelled:
            return False
        held = self.queued + len(self.pending) - self.sent
        if held + len(event) > self.budget:
            self._cancel("overflow")
            return False
        self.queue.append(event)
        self.queued += len(event)
        self.peak_held = max(self.peak_held, self.held_bytes)
        return True

    def take(self) -> bytes:
        """The bytes the writer should hand to the socket next: the unsent rest of the pending write,
        or (when it is done) the whole queue coalesced into a new pending write; b'' if nothing."""
        if self.cancelled:
            return b""
        if self.sent == len(self.pending):
            self.pending, self.sent = b"".join(self.queue), 0
            self.queue, self.queued = [], 0
        return self.pending[self.sent:]

    def wrote(self, n: int) -> None:
        """The socket accepted ``n`` more bytes of the pending write."""
        n = integer("n", n, 0, len(self.pending) - self.sent, unit="bytes (at most the unsent pending write)")
        self.sent += n

    def disconnect(self) -> None:
        """The client went away: cancel the request (once) and release the buffers."""
        self._cancel("disconnect")

    def _cancel(self, reason: str) -> None:
        if self.cancelled:
            return
        self.cancelled = reason
        self.queue, self.queued, self.pending, self.sent = [], 0, b"", 0
        self.on_cancel(reason)


@dataclass(frozen=True)
class ConnectionRun:
    """What :func:`simulate_connection` found. ``held_s``/``held_bytes``: the bytes held after each
    engine step; ``cancel_s``: when the stream was cancelled (inf: never); ``reason``: why (or None);
    ``generated``: events the engine made; ``delivered_bytes``: bytes the client read."""

    held_s: tuple[float, ...]
    held_bytes: tuple[int, ...]
    peak_held: int
    cancel_s: float
    reason: str | None
    generated: int
    delivered_bytes: int


def simulate_connection(budget_bytes: int, event_bytes: int, tokens: int, step_s: float, read_bytes_per_s: float,
                        socket_bytes: int, *, buffer_cls: type = ConnectionBuffer,
                        disconnect_s: float = math.inf) -> ConnectionRun:
    """One stream: an event of ``event_bytes`` every ``step_s`` for ``tokens`` steps, written through
    a buffer of class ``buffer_cls`` (budget ``budget_bytes``) into a socket holding ``socket_bytes``
    unread, drained by the client at ``read_bytes_per_s`` (0: stopped reading; inf: instant). The
    client disconnects at ``disconnect_s``. After a cancellation the engine stops generating."""
    budget = integer("budget_bytes", budget_bytes, 1, unit="bytes")
    ev = integer("event_bytes", event_bytes, 1, unit="bytes")
    n = integer("tokens", tokens, 1, 1_000_000, unit="tokens")
    step = real("step_s", step_s, 0, low_open=True, unit="seconds")
    rate = _rate(read_bytes_per_s)
    sock = integer("socket_bytes", socket_bytes, 0, unit="bytes")
    disc = float(disconnect_s)
    if math.isnan(disc) or disc < 0:
        raise ValueError(f"disconnect_s must be >= 0 seconds (inf: never), got {disconnect_s!r}")
    cancels: list[str] = []
    buf = buffer_cls(budget, cancels.append)
    in_socket, read_total, generated = 0.0, 0.0, 0
    ts, held, cancel_s = [], [], math.inf
    payload = b"x" * ev
    for k in range(1, n + 1):
        t = k * step
        # the client drains the socket over the step, then the writer refills it
        drained = in_socket if math.isinf(rate) else min(in_socket, rate * step)
        in_socket -= drained
        read_total += drained
        if t >= disc and not cancels:
            buf.disconnect()
        if cancels:
            cancel_s = min(cancel_s, t)
            break
        buf.offer(payload)
        generated += 1
        if cancels:
            cancel_s = t
            break
        chunk = buf.take()
        room = int(sock - in_socket) if not math.isinf(rate) else len(chunk)
        k_sent = max(0, min(len(chunk), room))
        buf.wrote(k_sent)
        in_socket += k_sent
        if math.isinf(rate):
            read_total += in_socket
            in_socket = 0.0
        ts.append(t)
        held.append(buf.held_bytes)
    peak = max(held, default=0)
    return ConnectionRun(tuple(ts), tuple(held), peak, cancel_s, cancels[0] if cancels else None, generated,
                         int(read_total))


def _rate(value) -> float:
    """A read rate: a number >= 0, inf allowed (a client that reads instantly)."""
    if isinstance(value, bool):
        raise ValueError(f"read_bytes_per_s must be a number >= 0 (inf: instant), got {value!r}")
    try:
        r = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"read_bytes_per_s must be a number >= 0 (inf: instant), got {value!r}") from None
    if math.isnan(r) or r < 0:
        raise ValueError(f"read_bytes_per_s must be a number >= 0 (inf: instant), got {value!r}")
    return r
