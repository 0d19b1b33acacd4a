"""The streaming path of a replica: how tokens get from the step loop to the clients, and what one
slow client does to every other stream under each design of that hand-off.

After every engine step each running sequence has one new token; the sampler returned its id, the
detokenizer turns it into text, and a sender writes it to the client's connection as one event (an
SSE chunk). A connection holds at most ``socket_tokens`` events its client has not read yet (the
kernel's send buffer plus the client's receive window, counted in events); a client reads an event
at most every ``1 / rate`` seconds (``rate = inf``: as soon as it arrives; ``0``: a client that has
stopped reading). Three designs of the hand-off (``mode``):

* ``"inline"``: the step loop writes each new token to each connection itself, in stream order,
  and a write to a full connection blocks until that client reads; the next step starts when the
  last write has returned. Once a slow client's connection is full, every step waits for it: the
  step interval becomes that client's read interval, for every stream.
* ``"shared"``: the loop appends every token to one unbounded FIFO and returns at once; a single
  sender takes the tokens in order and writes each, waiting on a full connection. The engine
  never waits, but every stream's tokens queue behind the slow client's, and the FIFO grows
  without bound.
* ``"per_stream"``: each stream has its own buffer of at most ``buffer_tokens`` events (None:
  unbounded) drained by its own sender; the loop's put never waits. A put into a full buffer
  triggers ``on_full``: ``"drop"`` aborts that stream (the client is disconnected; its batch
  slot and KV are freed), ``"pause"`` leaves that sequence out of the next steps until its buffer
  has room (backpressure into the scheduler, never into the loop), and gives up on it (drops it)
  once one pause lasts ``max_pause_s``. A stream's timing never depends on another's client.

Exact recurrences, token ``j`` (0-based) of stream ``i``, with ``S`` = socket_tokens,
``Q`` = buffer_tokens and ``g_i = 1 / rate_i``::

    send_ij = max(ready_ij, read_i,j-S)              a write waits for room in the connection
    read_ij = max(send_ij, read_i,j-1 + g_i)          (never, for a client that stopped reading)

``ready`` is, inline, the loop's cursor (the step's end, then each earlier write of the step);
shared, the sender's cursor (its previous write, or the token's step end if later), tokens in
(step, stream) order; per stream, max(generation, previous write of that stream). Inline, step
``k + 1`` starts at the last write of step ``k``; otherwise step ``k`` ends at ``(k + 1) step_s``.
Per stream, a put at ``gen_ij`` finds the buffer full iff ``send_i,j-Q > gen_ij``; with
``"pause"`` token ``j`` is made by the first step ``k > k_j-1`` that starts at or after
``send_i,j-Q``. Simplifications, stated once: every stream starts at step 0 and wants the same
number of tokens, the step time is one constant (the decode step of the batch), a write costs no
time and the network adds no delay beyond the client's read rate.
SI units: seconds, tokens (events) per second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["MODES", "ON_FULL", "StreamRun", "stream"]

MODES = ("inline", "shared", "per_stream")
ON_FULL = ("drop", "pause")
_INF = math.inf


def _rates(read_rates) -> np.ndarray:
    """Client read rates as a float array: each >= 0 (0: stopped reading) or inf (instant)."""
    try:
        arr = np.asarray([float(r) for r in read_rates], dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"read_rates must be a sequence of numbers >= 0 (tokens/s, inf allowed), "
                         f"got {read_rates!r}") from None
    if not len(arr):
        raise ValueError("read_rates must hold one rate per stream (at least one stream)")
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError(f"read_rates must be >= 0 tokens/s (0: a client that stopped reading; inf: "
                         f"instant), got {read_rates!r}")
    return arr


@dataclass(frozen=True)
class StreamRun:
    """The outcome of :func:`stream`: per stream and token, when it was generated, written to the
    connection and read by the client (``inf``: never), and the engine's steps.

    Arrays are ``(streams, tokens)``; ``dropped_s`` is ``(streams,)`` (``inf``: not dropped);
    ``step_ends_s`` holds the end of every engine step that ran (inline: stretched by blocking
    writes; ``inf`` once a write can never finish) and ``loop_waits_s`` how long the loop waited on
    writes after each of them (zero unless inline)."""

    mode: str
    on_full: str | None
    step_s: float
    socket_tokens: int
    buffer_tokens: int | None
    read_rates: np.ndarray
    generated_s: np.ndarray
    sent_s: np.ndarray
    read_s: np.ndarray
    dropped_s: np.ndarray
    step_ends_s: np.ndarray
    loop_waits_s: np.ndarray

    @property
    def streams(self) -> int:
        return self.generated_s.shape[0]

    @property
    def tokens(self) -> int:
        """Tokens each stream wants."""
        return self.generated_s.shape[1]

    @property
    def status(self) -> tuple[str, ...]:
        """Per stream: ``"finished"`` (every token read), ``"dropped"``, or ``"stuck"`` (neither:
        a client that stopped reading, or an engine blocked behind one)."""
        out = []
        for i in range(self.streams):
            if math.isfinite(self.dropped_s[i]):
                out.append("dropped")
            elif np.isfinite(self.read_s[i]).all():
                out.append("finished")
            else:
                out.append("stuck")
        return tuple(out)

    @property
    def generated(self) -> np.ndarray:
        """Tokens generated per stream (a dropped stream stops early)."""
        return np.isfinite(self.generated_s).sum(axis=1)

    @property
    def delivered(self) -> np.ndarray:
        """Tokens each client has read."""
        return np.isfinite(self.read_s).sum(axis=1)

    def delivered_tpot_s(self) -> np.ndarray:
        """Per stream, the mean gap between consecutive tokens its client read: (last read - first
        read) / (delivered - 1), seconds (the TPOT the user sees; nan for fewer than 2 tokens)."""
        out = np.full(self.streams, math.nan)
        for i in range(self.streams):
            r = self.read_s[i][np.isfinite(self.read_s[i])]
            if len(r) > 1:
                out[i] = (r[-1] - r[0]) / (len(r) - 1)
        return out

    def max_gap_s(self) -> np.ndarray:
        """Per stream, the longest wait between two tokens its client read, seconds (nan for < 2)."""
        out = np.full(self.streams, math.nan)
        for i in range(self.streams):
            r = self.read_s[i][np.isfinite(self.read_s[i])]
            if len(r) > 1:
                out[i] = float(np.diff(r).max())
        return out

    @property
    def engine_stall_s(self) -> float:
        """Time the step loop spent waiting on writes, seconds: the sum of ``loop_waits_s`` (0 unless
        inline; inf when a write never returns)."""
        return float(self.loop_waits_s.sum())

    @property
    def mean_step_interval_s(self) -> float:
        """Mean time from one step's end to the next: last step end / steps (step_s unless the
        loop waited on writes; inf when it is stuck)."""
        ends = self.step_ends_s
        return float(ends[-1] / len(ends)) if len(ends) else math.nan

    def buffered_tokens(self, t: float) -> int:
        """Tokens generated by ``t`` and not yet written to a connection nor discarded (the output
        path's memory: the shared FIFO, or the per-stream buffers; 0 inline)."""
        gen, leave = self._flow()
        return int(np.searchsorted(gen, t, "right") - np.searchsorted(leave, t, "right"))

    @property
    def peak_buffered_tokens(self) -> int:
        """The most tokens the output path held at once (buffered_tokens at its peak)."""
        gen, leave = self._flow()
        if not len(gen):
            return 0
        counts = np.arange(1, len(gen) + 1) - np.searchsorted(leave, gen, "right")
        return int(counts.max())

    def _flow(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted generation times, sorted times each token left the output path): written, or
        discarded when its stream was dropped; inf if it never leaves."""
        gen = self.generated_s
        leave = np.where(np.isfinite(self.sent_s), self.sent_s, self.dropped_s[:, None])
        leave = np.where(np.isfinite(gen), leave, math.inf)
        ok = np.isfinite(gen)
        return np.sort(gen[ok]), np.sort(leave[ok])


def _reads(send: np.ndarray, prev_read: np.ndarray, gap: np.ndarray, first: bool) -> np.ndarray:
    """read = max(send, previous read + gap) (just send for a stream's first token); never
    (inf) for a client that stopped reading (gap inf)."""
    if first:
        out = send.copy()
    else:
        with np.errstate(invalid="ignore"):
            out = np.maximum(send, prev_read + gap)
    out[np.isinf(gap)] = math.inf
    return out


def stream(step_s: float, tokens: int, read_rates: Sequence[float], *, mode: str = "per_stream",
           socket_tokens: int = 256, buffer_tokens: int | None = 64, on_full: str = "drop",
           max_pause_s: float | None = None) -> StreamRun:
    """Simulate the hand-off of ``tokens`` tokens to each of ``len(read_rates)`` streams whose
    engine makes one token per stream every ``step_s`` seconds (module doc: modes, recurrences).

    ``read_rates``: each client's read rate, tokens/s (0: stopped reading; inf: instant).
    ``socket_tokens``: events a connection holds unread before a write waits (>= 1).
    ``buffer_tokens``, ``on_full``, ``max_pause_s``: the per-stream bound and what a full buffer
    does (``mode="per_stream"`` only; ``buffer_tokens=None``: unbounded, nothing is ever full).
    Returns a :class:`StreamRun`.
    """
    step = real("step_s", step_s, 0, low_open=True, unit="seconds")
    n_tok = integer("tokens", tokens, 1, unit="tokens per stream")
    rates = _rates(read_rates)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    sock = integer("socket_tokens", socket_tokens, 1, unit="events")
    if mode == "per_stream":
        if on_full not in ON_FULL:
            raise ValueError(f"on_full must be one of {', '.join(ON_FULL)}; got {on_full!r}")
        if buffer_tokens is not None:
            integer("buffer_tokens", buffer_tokens, 1, unit="events")
        if max_pause_s is not None:
            real("max_pause_s", max_pause_s, 0, low_open=True, unit="seconds")
    gap = np.divide(1.0, rates, out=np.full(len(rates), math.inf), where=rates > 0)
    if mode == "inline":
        return _inline(step, n_tok, rates, gap, sock)
    if mode == "shared":
        return _shared(step, n_tok, rates, gap, sock)
    return _per_stream(step, n_tok, rates, gap, sock, buffer_tokens, on_full, max_pause_s)


def _room(read: np.ndarray, j: int, sock: int) -> np.ndarray:
    """When token j fits in each connection: once token j - S has been read (-inf before)."""
    return read[:, j - sock] if j >= sock else np.full(read.shape[0], -math.inf)


def _inline(step, n_tok, rates, gap, sock) -> StreamRun:
    n = len(rates)
    gen, send, read = (np.full((n, n_tok), math.inf) for _ in range(3))
    ends = np.empty(n_tok)
    waits = np.zeros(n_tok)
    start = 0.0
    for k in range(n_tok):
        end = start + step
        ends[k] = end
        gen[:, k] = end
        # the loop writes stream after stream; each write waits for room in its connection
        send[:, k] = np.maximum.accumulate(np.maximum(_room(read, k, sock), end))
        read[:, k] = _reads(send[:, k], read[:, k - 1] if k else None, gap, k == 0)
        start = float(send[-1, k])  # the next step starts when the last write has returned
        waits[k] = start - end  # exactly 0 when no write had to wait
        if math.isinf(start):
            ends[k + 1:] = math.inf
            break
    gen[:, np.isinf(ends)] = math.inf
    return StreamRun("inline", None, step, sock, None, rates, gen, send, read, np.full(n, math.inf), ends, waits)


def _shared(step, n_tok, rates, gap, sock) -> StreamRun:
    n = len(rates)
    ends = step * np.arange(1, n_tok + 1)
    gen = np.tile(ends, (n, 1))
    send, read = np.full((n, n_tok), math.inf), np.full((n, n_tok), math.inf)
    cursor = 0.0
    for k in range(n_tok):
        # one sender, tokens in FIFO order: (step, stream); it waits on a full connection
        send[:, k] = np.maximum.accumulate(np.maximum(_room(read, k, sock), max(cursor, ends[k])))
        read[:, k] = _reads(send[:, k], read[:, k - 1] if k else None, gap, k == 0)
        cursor = float(send[-1, k])
    return StreamRun("shared", None, step, sock, None, rates, gen, send, read, np.full(n, math.inf), ends,
                     np.zeros(n_tok))


def _per_stream(step, n_tok, rates, gap, sock, buf, on_full, max_pause_s) -> StreamRun:
    n = len(rates)
    gen, send, read = (np.full((n, n_tok), math.inf) for _ in range(3))
    dropped = np.full(n, math.inf)
    alive = np.ones(n, dtype=bool)
    last_step = np.full(n, -1.0)  # index of the step that made each stream's previous token
    for j in range(n_tok):
        k = last_step + 1
        if buf is not None and j >= buf:
            free_at = send[:, j - buf]  # the buffer has room once token j - Q has been written
            if on_full == "drop":
                made_at = (k + 1) * step
                full = alive & (free_at > made_at + 1e-12 * np.maximum(made_at, 1.0))
                dropped[full] = (k[full] + 1) * step
                alive &= ~full
            else:  # pause: the first step starting at or after free_at (inf: never)
                with np.errstate(invalid="ignore"):
                    wait_k = np.ceil(free_at / step - 1e-9)
                k = np.maximum(k, wait_k)
                if max_pause_s is not None:
                    paused = (k - last_step - 1) * step
                    give_up = alive & (paused >= max_pause_s)
                    dropped[give_up] = (last_step[give_up] + 1) * step + max_pause_s
                    alive &= ~give_up
                alive &= np.isfinite(k)  # paused forever: a client that stopped reading
        k = np.where(alive, k, math.inf)
        gen[:, j] = (k + 1) * step
        prev_send = send[:, j - 1] if j else np.full(n, -math.inf)
        send[:, j] = np.where(alive, np.maximum(np.maximum(gen[:, j], prev_send), _room(read, j, sock)), math.inf)
        read[:, j] = _reads(send[:, j], read[:, j - 1] if j else None, gap, j == 0)
        last_step = np.where(alive, k, last_step)
        if not alive.any():
            break
    # a dropped stream's buffer is discarded: what had not reached the connection is never sent
    lost = send > dropped[:, None]
    send[lost] = read[lost] = math.inf
    made = gen[np.isfinite(gen)]
    steps = int(round(made.max() / step)) if len(made) else 0
    ends = step * np.arange(1, steps + 1)
    return StreamRun("per_stream", on_full if buf is not None else None, step, sock, buf, rates, gen, send,
                     read, dropped, ends, np.zeros(steps))
