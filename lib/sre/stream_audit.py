"""Auditing a recorded token stream (SSE) without inventing per-token timestamps (I084).

A client records what it received: for each server-sent event, the client's receive time and how
many tokens of text it carried. An event may carry metadata only (the role chunk, the final usage
chunk: ``tokens = 0``), one token, or several (a sender or proxy that buffers coalesces tokens into
one event). The client also knows when it created the request (``created_s``), and the server
stamps its own arrival time (``arrival_s``) in the stream's metadata (on any one event: the role
chunk, or the usage chunk at the end). Clocks are assumed synchronized (NTP, well under a step).

:func:`audit` (the reference; :class:`StreamAuditor` wraps it for the grader) reports only what
the events prove:

* ``launch_delay_s = arrival_s - created_s``: the client's own delay before the engine saw the
  request (event loop, connection pool, TLS, a cold start), not the engine's;
* ``ttft_s``: first event that carries a token - ``arrival_s`` (metadata events do not count),
  and ``client_ttft_s = launch_delay_s + ttft_s`` what the caller felt;
* ``gaps_s``: the gaps between consecutive token-bearing events, ``tokens_per_event`` their
  sizes; ``max_gap_s`` the longest stall the reader saw. A multi-token event's tokens all arrived
  at its time: spreading them across the preceding gap invents timestamps and hides the stall;
* ``rate_tok_s = (tokens - first event's tokens) / (last token event - first token event)``:
  the token-weighted delivery rate after the first event (not the mean of per-event rates);
* ``engine_s`` = last token event - ``arrival_s``: the engine's part of the end-to-end time.

:func:`coalesce` turns engine token times into events (a sender that flushes on a fixed tick),
and :func:`simulated_recordings` builds seeded recordings from the book's serving simulator
(:func:`lib.scheduling.simulate`) with a seeded client launch delay, so the audit can be checked
against the engine's own token times. SI units: seconds, tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer, real

__all__ = ["QUESTION", "VARIANTS", "Event", "Recording", "SimulatedStreams", "Skeleton", "StreamAudit", "StreamAuditor",
           "audit", "cases", "check", "coalesce", "default_lengths", "defect", "mean_event_rates", "run",
           "simulated_recordings", "spread_gaps", "variant"]

QUESTION = "Stream timing audit (I084)"


@dataclass(frozen=True)
class Event:
    """One received event: client receive time (s), tokens of text it carried (0: metadata only),
    and the server's arrival timestamp if this event's metadata carries it (None otherwise)."""

    t_s: float
    tokens: int
    arrival_s: float | None = None

    def __post_init__(self) -> None:
        real("t_s", self.t_s, 0, unit="seconds")
        integer("tokens", self.tokens, 0, unit="tokens")
        if self.arrival_s is not None:
            real("arrival_s", self.arrival_s, 0, unit="seconds")


@dataclass(frozen=True)
class Recording:
    """What a client recorded for one request: when it created it and the events, in receive order."""

    created_s: float
    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        real("created_s", self.created_s, 0, unit="seconds")
        ev = tuple(self.events)
        if not all(isinstance(e, Event) for e in ev):
            raise ValueError("events must be a sequence of Event")
        if any(b.t_s < a.t_s for a, b in zip(ev, ev[1:], strict=False)):
            raise ValueError("events must be in receive order (non-decreasing t_s)")
        object.__setattr__(self, "events", ev)


@dataclass(frozen=True)
class StreamAudit:
    """The audit of one recording (module doc); seconds, tokens, tokens/s."""

    launch_delay_s: float
    ttft_s: float
    client_ttft_s: float
    tokens: int
    token_events: int
    gaps_s: tuple[float, ...]
    tokens_per_event: tuple[int, ...]
    max_gap_s: float
    rate_tok_s: float
    engine_s: float


def audit(rec: Recording) -> StreamAudit:
    """Audit ``rec`` (module doc): the reference, :meth:`StreamAuditor.audit`. ValueError if no event
    carries the server's arrival time or no event carries a token."""
    return StreamAuditor().audit(rec)


# ---- the practice interface ---------------------------------------------------------------------------


class Skeleton:
    """Audit one recorded stream.

    audit(rec) -> an object (or dict) with launch_delay_s, ttft_s, client_ttft_s, tokens,
    token_events, gaps_s, tokens_per_event, max_gap_s, rate_tok_s, engine_s (see
    lib.sre.stream_audit's module doc). rec.created_s: the client's creation time; rec.events:
    Event(t_s, tokens, arrival_s=None), tokens = 0 for a metadata-only event; exactly one event
    (any of them) carries the server's arrival_s.
    """

    def audit(self, rec):
        raise NotImplementedError


class StreamAuditor:
    """The reference, with the Skeleton's interface."""

    def audit(self, rec: Recording) -> StreamAudit:
        if not isinstance(rec, Recording):
            raise ValueError(f"rec must be a Recording, got {type(rec).__name__}")
        arrival = next((e.arrival_s for e in rec.events if e.arrival_s is not None), None)
        if arrival is None:
            raise ValueError("no event carries the server's arrival_s: the launch delay cannot be separated")
        times = [e.t_s for e in rec.events if e.tokens > 0]
        sizes = [e.tokens for e in rec.events if e.tokens > 0]
        if not times:
            raise ValueError("no event carries a token: there is no first token")
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        span = times[-1] - times[0]
        rate = (sum(sizes) - sizes[0]) / span if span > 0 else math.nan
        launch = arrival - rec.created_s
        ttft = times[0] - arrival
        return StreamAudit(launch_delay_s=launch, ttft_s=ttft, client_ttft_s=launch + ttft, tokens=sum(sizes),
                           token_events=len(times), gaps_s=tuple(gaps), tokens_per_event=tuple(sizes),
                           max_gap_s=max(gaps) if gaps else math.nan, rate_tok_s=rate,
                           engine_s=times[-1] - arrival)


_DRAFTS = {
    "metadata event as the first token": (
        "TTFT taken at the first event of any kind: the role chunk, sent before the prefill, looks like a token",
        [("ttft = times[0] - arrival", "ttft = rec.events[0].t_s - arrival")]),
    "tokens spread across the gap": (
        "a k-token event's tokens spread evenly over the gap before it, as if they had arrived one by one",
        [("gaps = [b - a for a, b in zip(times, times[1:], strict=False)]",
          "gaps = [(b - a) / n for a, b, n in zip(times, times[1:], sizes[1:], strict=False) for _ in range(n)]"),
         ("token_events=len(times), gaps_s=tuple(gaps), tokens_per_event=tuple(sizes),",
          "token_events=sum(sizes), gaps_s=tuple(gaps), tokens_per_event=(1,) * sum(sizes),")]),
    "TTFT from the client's creation": (
        "TTFT measured from the client's creation time, so the client's launch delay is billed to the engine",
        [("ttft = times[0] - arrival", "ttft = times[0] - rec.created_s"),
         ("return StreamAudit(launch_delay_s=launch, ttft_s=ttft, client_ttft_s=launch + ttft, tokens=sum(sizes),",
          "return StreamAudit(launch_delay_s=launch, ttft_s=ttft, client_ttft_s=ttft, tokens=sum(sizes),")]),
    "last event dropped": (
        "an off-by-one over the events: the last one is never read (harmless after a usage chunk, wrong without one)",
        [("times = [e.t_s for e in rec.events if e.tokens > 0]", "times = [e.t_s for e in rec.events[:-1] if e.tokens > 0]"),
         ("sizes = [e.tokens for e in rec.events if e.tokens > 0]",
          "sizes = [e.tokens for e in rec.events[:-1] if e.tokens > 0]")]),
    "rate as the mean of per-event rates": (
        "the delivery rate averaged over events (each event's tokens over its gap), not weighted by tokens",
        [("rate = (sum(sizes) - sizes[0]) / span if span > 0 else math.nan",
          "rate = float(np.mean([n / g for n, g in zip(sizes[1:], gaps, strict=False)])) if span > 0 else math.nan")]),
    "arrival read from the first event only": (
        "the server's arrival time looked for on the first event only: a stream that stamps it on the usage chunk "
        "at the end has none",
        [("arrival = next((e.arrival_s for e in rec.events if e.arrival_s is not None), None)",
          "arrival = rec.events[0].arrival_s")]),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference class (``"reference"``) or a draft with one defect (one of ``VARIANTS``)."""
    if name == "reference":
        return StreamAuditor
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, edits = _DRAFTS[name]
    return edited_class(StreamAuditor, name.replace(" ", "_"), doc, audit=edits)


def defect(name: str) -> str:
    """One line on what draft ``name`` gets wrong."""
    if name not in _DRAFTS:
        raise ValueError(f"name must be one of {', '.join(VARIANTS)}, got {name!r}")
    return _DRAFTS[name][0]


# ---- the grader -----------------------------------------------------------------------------------------
# A case is ops: ("created", t) and ("event", t, tokens, arrival_or_None). The expected audit is computed
# from the ops by a separate, table-driven oracle (numpy over the token rows), not by the reference.

_FIELDS = ("launch_delay_s", "ttft_s", "client_ttft_s", "tokens", "token_events", "gaps_s", "tokens_per_event",
           "max_gap_s", "rate_tok_s", "engine_s")


def _recording(ops: Sequence) -> Recording | None:
    created = [op[1] for op in ops if op[0] == "created"]
    events = [Event(op[1], op[2], op[3]) for op in ops if op[0] == "event"]
    stamps = sum(e.arrival_s is not None for e in events)
    if len(created) != 1 or stamps != 1 or not any(e.tokens for e in events):
        return None  # not a valid recording: the shrinker tried removing something every recording needs
    return Recording(created[0], tuple(events))


def _oracle(ops: Sequence) -> dict:
    """The expected audit from a table of the events (numpy), independent of the reference's code."""
    t = np.array([op[1] for op in ops if op[0] == "event"], dtype=float)
    n = np.array([op[2] for op in ops if op[0] == "event"], dtype=np.int64)
    arr = np.array([np.nan if op[3] is None else op[3] for op in ops if op[0] == "event"], dtype=float)
    created = next(op[1] for op in ops if op[0] == "created")
    arrival = float(np.nanmax(arr))
    tok_t, tok_n = t[n > 0], n[n > 0]
    gaps = np.diff(tok_t)
    span = tok_t[-1] - tok_t[0]
    return {"launch_delay_s": arrival - created, "ttft_s": tok_t[0] - arrival, "client_ttft_s": tok_t[0] - created,
            "tokens": int(tok_n.sum()), "token_events": len(tok_t), "gaps_s": tuple(gaps.tolist()),
            "tokens_per_event": tuple(tok_n.tolist()), "max_gap_s": float(gaps.max()) if len(gaps) else math.nan,
            "rate_tok_s": float(tok_n[1:].sum() / span) if span > 0 else math.nan, "engine_s": tok_t[-1] - arrival}


def _field(result, name):
    if isinstance(result, dict):
        if name not in result:
            raise AssertionError(f"the audit has no {name!r}")
        return result[name]
    if not hasattr(result, name):
        raise AssertionError(f"the audit has no attribute {name!r}")
    return getattr(result, name)


def _same(got, want) -> bool:
    if isinstance(want, tuple):
        try:
            got = tuple(got)
        except TypeError:
            return False
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    try:
        g = float(got)
    except (TypeError, ValueError):
        return False
    if math.isnan(want):
        return math.isnan(g)
    return math.isclose(g, want, rel_tol=1e-9, abs_tol=1e-12)


_WHY = {
    "ttft_s": "TTFT runs from the engine's arrival to the first event that carries a token",
    "client_ttft_s": "the client's TTFT is the launch delay plus the engine's TTFT",
    "launch_delay_s": "the launch delay is the server's arrival stamp minus the client's creation time",
    "gaps_s": "gaps are between consecutive token-bearing events, as received: never per token",
    "tokens_per_event": "one entry per token-bearing event",
    "token_events": "count the events that carry tokens",
    "rate_tok_s": "the rate is the tokens after the first event over the time from the first to the last token event",
    "max_gap_s": "the longest gap between token-bearing events",
    "tokens": "every token of every event",
    "engine_s": "from the engine's arrival to the last token event",
}


def run(auditor, ops: Sequence) -> None:
    """Audit the recording of ``ops`` with ``auditor`` (a fresh instance) and compare every field with
    the oracle."""
    rec = _recording(ops)
    if rec is None:
        return
    got = auditor.audit(rec)
    want = _oracle(ops)
    for name in _FIELDS:
        value = _field(got, name)
        if not _same(value, want[name]):
            show = tuple(round(float(x), 6) for x in value) if isinstance(value, list | tuple) else value
            raise AssertionError(f"{name} is {show}, expected {want[name]}: {_WHY[name]}")


def describe(ops: Sequence) -> str:
    lines = []
    for op in ops:
        if op[0] == "created":
            lines.append(f"  client created the request at {op[1]:g} s")
        else:
            what = "metadata only" if op[2] == 0 else f"{op[2]} token(s)"
            stamp = f", carries the server's arrival_s = {op[3]:g} s" if op[3] is not None else ""
            lines.append(f"  event at {op[1]:g} s: {what}{stamp}")
    return "\n".join(lines)


def _ev(t, n, arrival=None) -> tuple:
    return ("event", float(t), int(n), None if arrival is None else float(arrival))


def _random_case(seed: int, n_events: int, coalesce_max: int, usage_stamp: bool) -> tuple:
    rng = np.random.default_rng(seed)
    created = float(np.round(rng.uniform(0, 1), 3))
    arrival = created + float(np.round(rng.lognormal(np.log(0.02), 0.8), 4))
    t = arrival + 0.005
    ops = [("created", created), _ev(t, 0, None if usage_stamp else arrival)]
    t += float(np.round(rng.uniform(0.05, 0.3), 4))
    for _ in range(n_events):
        ops.append(_ev(t, int(rng.integers(1, coalesce_max + 1))))
        t += float(np.round(rng.exponential(0.03) + 0.005, 4))
    ops.append(_ev(t, 0, arrival if usage_stamp else None))
    return tuple(ops)


def cases() -> list[Case]:
    """Edge cases first (each shows one defect), then seeded random streams."""
    return [
        Case("role chunk first, then single tokens, usage last",
             (("created", 0.0), _ev(0.05, 0, 0.04), _ev(0.30, 1), _ev(0.33, 1), _ev(0.36, 1), _ev(0.37, 0))),
        Case("a buffered stream: several tokens per event",
             (("created", 1.0), _ev(1.02, 0, 1.01), _ev(1.20, 1), _ev(1.30, 4), _ev(1.34, 1), _ev(1.50, 6),
              _ev(1.51, 0))),
        Case("a slow client launch (cold connection)",
             (("created", 2.0), _ev(2.41, 0, 2.40), _ev(2.50, 2), _ev(2.55, 3), _ev(2.56, 0))),
        Case("no usage chunk: the stream ends on a token event",
             (("created", 0.0), _ev(0.02, 0, 0.01), _ev(0.10, 1), _ev(0.12, 2), _ev(0.20, 3))),
        Case("the arrival stamp on the usage chunk at the end",
             (("created", 0.0), _ev(0.03, 0), _ev(0.20, 1), _ev(0.22, 1), _ev(0.24, 2), _ev(0.25, 0, 0.02))),
        Case("one event carries everything", (("created", 0.5), _ev(0.6, 0, 0.55), _ev(0.9, 7), _ev(0.91, 0))),
        Case("no role chunk: the arrival stamp rides on the first token event",
             (("created", 0.0), _ev(0.15, 2, 0.01), _ev(0.18, 1), _ev(0.21, 3), _ev(0.22, 0))),
        Case("two token events read at the same instant (one network read)",
             (("created", 0.0), _ev(0.02, 0, 0.01), _ev(0.10, 1), _ev(0.16, 2), _ev(0.16, 1), _ev(0.20, 1),
              _ev(0.21, 0))),
        Case("random coalescing, stamp first", _random_case(1, 12, 5, False)),
        Case("random coalescing, stamp last", _random_case(2, 9, 3, True)),
    ]


def check(candidate: Callable) -> PracticeReport:
    """Grade any class with the Skeleton's interface (built with no arguments) on every case."""
    return grade(QUESTION, candidate, cases(), run, describe)


# ---- streams from the book's models ----------------------------------------------------------------------


def coalesce(token_times_s, flush_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Group a stream's token times (s) into events as a sender that flushes on a fixed tick would.

    ``flush_s = 0``: every token is its own event at its own time. Otherwise a token made at ``g``
    leaves at the next tick ``ceil(g / flush_s) flush_s`` (a token made on a tick leaves on it),
    and the tokens that leave on one tick form one event. Returns (event times s, tokens per event).
    """
    g = np.asarray(token_times_s, dtype=float)
    if g.ndim != 1 or (len(g) and (not np.isfinite(g).all() or (np.diff(g) < 0).any())):
        raise ValueError("token_times_s must be a 1-D array of finite, non-decreasing times")
    real("flush_s", flush_s, 0, unit="seconds")
    if flush_s == 0 or len(g) == 0:
        return g.copy(), np.ones(len(g), dtype=np.int64)
    tick = np.ceil(g / flush_s - 1e-9)
    ticks, counts = np.unique(tick, return_counts=True)
    return ticks * flush_s, counts.astype(np.int64)


@dataclass(frozen=True)
class SimulatedStreams:
    """One simulated run and the recordings a sender flushing every ``flush_s`` makes of it: request i's
    recording is built on first use (:meth:`recording`); :meth:`with_flush` re-coalesces the same run."""

    created_s: np.ndarray           # when the client created each request (engine order)
    launch_delay_s: np.ndarray      # the seeded client delays, per request
    result: object                  # the SimResult (engine clock = the shared clock)
    net_s: float
    flush_s: float

    def recording(self, i: int) -> Recording:
        """Request i as its client recorded it: a role event on arrival (carrying the arrival stamp), the
        coalesced token events, and a closing event; a request the engine never served (rejected,
        expired) closes at once, empty. Every event reaches the client ``net_s`` after it leaves."""
        cache = self.__dict__.setdefault("_recordings", {})
        if i not in cache:
            r = self.result.requests[i]
            times, counts = coalesce(self.result.token_times(i), self.flush_s)
            ev = [Event(r.arrival_s + self.net_s, 0, r.arrival_s)]
            ev += [Event(float(t + self.net_s), int(n)) for t, n in zip(times, counts, strict=True)]
            ev.append(Event(float((times[-1] if len(times) else r.arrival_s) + self.net_s), 0))
            cache[i] = Recording(float(self.created_s[i]), tuple(ev))
        return cache[i]

    @property
    def recordings(self) -> tuple[Recording, ...]:
        """Every request's recording, in engine order."""
        return tuple(self.recording(i) for i in range(len(self.result.requests)))

    def with_flush(self, flush_s: float) -> SimulatedStreams:
        """The same run recorded by a sender that flushes every ``flush_s`` seconds."""
        return SimulatedStreams(self.created_s, self.launch_delay_s, self.result, self.net_s,
                                real("flush_s", flush_s, 0, unit="seconds"))


def default_lengths() -> tuple:
    """The page's prompt and output length distributions: lognormal around 1,000 (sigma 1, capped at 16,000)
    and 200 tokens (sigma 0.5, capped at 1,000), so a few long prefills stall the batch."""
    from lib.scheduling.workloads import LogNormal

    return LogNormal(1000, 1.0, cap=16000), LogNormal(200, 0.5, cap=1000)


def spread_gaps(recordings: Sequence[Recording]) -> np.ndarray:
    """The per-token gaps a spreading audit would invent (the defect, kept to measure its error): each
    event of n tokens after the first token event is taken as n tokens evenly spaced over the gap before
    it, so it contributes n gaps of gap / n. Pooled over ``recordings``, seconds."""
    out = []
    for rec in recordings:
        ev = [e for e in rec.events if e.tokens > 0]
        for a, b in zip(ev, ev[1:], strict=False):
            out += [(b.t_s - a.t_s) / b.tokens] * b.tokens
    return np.asarray(out, dtype=float)


def mean_event_rates(recordings: Sequence[Recording]) -> np.ndarray:
    """Per recording, the unweighted mean over events of (tokens / gap before it), tokens/s: the rate a
    per-event average reports (the defect, kept to measure its error); recordings with fewer than two
    token events, or a zero gap, are left out."""
    out = []
    for rec in recordings:
        ev = [e for e in rec.events if e.tokens > 0]
        pairs = [(b.tokens, b.t_s - a.t_s) for a, b in zip(ev, ev[1:], strict=False)]
        if pairs and all(g > 0 for _, g in pairs):
            out.append(float(np.mean([n / g for n, g in pairs])))
    return np.asarray(out, dtype=float)


def simulated_recordings(dep, *, n_requests: int = 100, rate: float = 6.0, prompt=None, output=None,
                         launch_median_s: float = 0.02, launch_sigma: float = 0.8, net_s: float = 0.005,
                         flush_s: float = 0.05, seed: int = 0) -> SimulatedStreams:
    """Seeded recordings of ``n_requests`` streams served by ``dep`` (the book's simulator).

    ``prompt`` / ``output``: length distributions or ints (None: :func:`default_lengths`).
    The client creates request i at a Poisson time c_i (``rate`` per second); the engine sees it
    d_i later, d_i ~ lognormal(median ``launch_median_s``, ``launch_sigma``) (the launch delay).
    The simulator (continuous batching, steps priced by the book's step model) gives each output
    token's engine time; a sender that flushes every ``flush_s`` (:func:`coalesce`) makes the
    events, and each reaches the client ``net_s`` later. A role event (metadata, carrying the
    arrival stamp) is sent on arrival, a usage event (metadata) after the last token.
    """
    from lib.scheduling import Policy, simulate
    from lib.scheduling.workloads import Workload, trace

    integer("n_requests", n_requests, 1)
    real("rate", rate, 0, low_open=True, unit="requests/s")
    real("launch_median_s", launch_median_s, 0, low_open=True, unit="seconds")
    real("launch_sigma", launch_sigma, 0, 3)
    real("net_s", net_s, 0, unit="seconds")
    real("flush_s", flush_s, 0, unit="seconds")
    integer("seed", seed, 0)
    d_prompt, d_output = default_lengths()
    prompt = d_prompt if prompt is None else prompt
    output = d_output if output is None else output
    base = Workload(prompt=prompt, output=output, rate=rate, n_requests=n_requests).generate(seed)
    rng = np.random.default_rng(seed + 7919)
    delay = rng.lognormal(math.log(launch_median_s), launch_sigma, size=len(base))
    created = np.array([r.arrival_s for r in base])
    reqs = trace([(float(c + d), r.prompt_len, r.output_len) for c, d, r in zip(created, delay, base, strict=True)])
    order = np.argsort(created + delay, kind="stable")  # trace renumbers by arrival
    created, delay = created[order], delay[order]
    res = simulate(reqs, Policy(), dep, seed=seed)
    return SimulatedStreams(created, delay, res, net_s, flush_s)
