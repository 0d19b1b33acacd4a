"""What a simulation returns: per-request records, the step timeline, and the metrics users feel.

* :class:`RequestRecord`: one request's life (arrival, first scheduled, first token, finish;
  status finished / rejected / expired / unfinished; preemptions, recomputed tokens, swaps).
  TTFT = first token - arrival; TPOT = (finish - first token) / (output - 1) (vLLM's mean
  inter-token latency of one request); end-to-end = finish - arrival; queue = first scheduled -
  arrival.
* :class:`Timeline`: one row per engine step (start, duration, decode and prefill tokens, running,
  waiting, swapped, free blocks, preemptions, swap time, cached tokens read): the batch
  composition a Gantt chart draws.
* :class:`SimResult`: both, plus every token's emission time (:meth:`SimResult.token_times`,
  :meth:`SimResult.inter_token_gaps`), :meth:`SimResult.metrics` under an :class:`SLO` (goodput:
  requests that meet both the TTFT and TPOT targets, per second) and :meth:`SimResult.littles_law`.
SI units: seconds, tokens, blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import real

__all__ = ["SLO", "LittleCheck", "Metrics", "RequestRecord", "SimResult", "Summary", "Timeline"]

STATUSES = ("finished", "rejected", "expired", "unfinished")


@dataclass(frozen=True)
class SLO:
    """Latency targets a request must meet to count as goodput: TTFT and TPOT, seconds (inf: none)."""

    ttft_s: float = math.inf
    tpot_s: float = math.inf

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if v != math.inf:
                real(name, v, 0, low_open=True, unit="seconds")

    def met(self, record: RequestRecord) -> bool:
        """Finished, TTFT <= target and (for outputs > 1 token) TPOT <= target."""
        if record.status != "finished" or not record.ttft_s <= self.ttft_s:
            return False
        return record.output_len == 1 or record.tpot_s <= self.tpot_s


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's life in the simulator (times in seconds; nan where it never happened)."""

    rid: int
    arrival_s: float
    prompt_len: int
    output_len: int
    priority: int
    max_tokens: int
    status: str  # finished | rejected | expired | unfinished
    reason: str  # why it was rejected or expired ("" otherwise)
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    departure_s: float  # when it left the system (finish, rejection, drop, or the end of the run)
    generated: int  # output tokens produced
    preemptions: int
    recomputed_tokens: int  # KV tokens discarded by recompute preemptions (computed again later)
    swaps: int
    refunded_blocks: int  # reserved at admission beyond what the request used (reserve admission)
    prefills: int  # prefill passes completed: 1, plus one per recompute that re-prefilled

    @property
    def ttft_s(self) -> float:
        """Time to first token: first token - arrival (includes the queue)."""
        return self.first_token_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        """Wait before the first step that scheduled it: first scheduled - arrival."""
        return self.first_scheduled_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        """End-to-end latency: finish - arrival."""
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first: (finish - first token) / (output - 1); nan for 1."""
        if self.output_len < 2:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    @property
    def sojourn_s(self) -> float:
        """Time in the system: departure - arrival (Little's W)."""
        return self.departure_s - self.arrival_s


@dataclass(frozen=True)
class Timeline:
    """One row per engine step; each field is a numpy array of the steps' values."""

    start_s: np.ndarray
    duration_s: np.ndarray
    decode_tokens: np.ndarray  # running decodes that got a token this step
    prefill_tokens: np.ndarray  # prompt (or recompute) tokens prefilled this step
    padding: np.ndarray  # finished members of a static batch still occupying their slot
    running: np.ndarray  # admitted, not finished, not preempted (after the step was built)
    waiting: np.ndarray
    swapped: np.ndarray
    free_blocks: np.ndarray  # free KV blocks while the step runs
    preemptions: np.ndarray
    swap_s: np.ndarray  # time of swap copies charged to this step
    context_tokens: np.ndarray  # cached tokens the step's decodes read (padding included)
    chunks: tuple = ()  # per step: ((rid, tokens, position), ...) of its prefill chunks

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def end_s(self) -> np.ndarray:
        """When each step ends: start + duration, seconds."""
        return self.start_s + self.duration_s

    @property
    def tokens(self) -> np.ndarray:
        """Tokens of each step: decode + prefill (what the token budget bounds)."""
        return self.decode_tokens + self.prefill_tokens


def _summary_of(x: np.ndarray) -> Summary:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    if not len(x):
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan)
    q = np.percentile(x, [50, 90, 95, 99])
    return Summary(len(x), float(x.mean()), *map(float, q), float(x.max()))


@dataclass(frozen=True)
class Summary:
    """Count, mean, p50, p90, p95, p99 and max of one latency (seconds; nan when empty)."""

    n: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @staticmethod
    def of(x) -> Summary:
        """Summary of the non-nan values of ``x`` (numpy's linear-interpolation percentiles)."""
        return _summary_of(x)


@dataclass(frozen=True)
class Metrics:
    """Aggregates of one run (rates per second of ``duration_s``, from the first arrival to the
    last departure)."""

    n_requests: int
    finished: int
    rejected: int
    expired: int
    unfinished: int
    duration_s: float
    output_tokens_per_s: float  # tokens generated by finished requests / duration
    requests_per_s: float  # finished / duration
    goodput_requests_per_s: float  # finished within the SLO / duration
    goodput_tokens_per_s: float  # their output tokens / duration
    slo_attainment: float  # requests within the SLO / all requests (rejected count as misses)
    ttft: Summary
    tpot: Summary
    itl: Summary  # every inter-token gap of finished requests
    e2e: Summary
    queue: Summary
    preemptions: int
    recomputed_tokens: int
    swaps: int
    swap_s: float
    mean_running: float  # time-average of running sequences over busy steps
    reasons: dict = field(default_factory=dict)  # rejection/expiry reason -> count


@dataclass(frozen=True)
class LittleCheck:
    """Little's law L = lambda W on one run: L from the step timeline's time-average count in the
    system, lambda = arrivals / span, W = mean time in system; ``identity_L`` is the same area
    computed from the records (equal to lambda W by construction on any sample path)."""

    L_timeline: float
    arrival_rate: float
    mean_sojourn_s: float
    identity_L: float

    @property
    def L_predicted(self) -> float:
        """lambda W."""
        return self.arrival_rate * self.mean_sojourn_s

    @property
    def relative_error(self) -> float:
        """|L_timeline / (lambda W) - 1|."""
        return abs(self.L_timeline / self.L_predicted - 1) if self.L_predicted else 0.0


class SimResult:
    """The outcome of :func:`lib.scheduling.simulate`: records, timeline, token times, metrics."""

    def __init__(self, requests, timeline, *, end_s, emits, tick_step, counters, policy, cost,
                 complete) -> None:
        self.requests: tuple[RequestRecord, ...] = tuple(requests)
        self.timeline: Timeline = timeline
        self.end_s = float(end_s)
        self._emits = emits  # per request: [(time,) | (tick0, tick1)]
        self._tick_step = np.asarray(tick_step, dtype=np.int64)
        self.counters: dict = dict(counters)
        self.policy = policy
        self.cost = cost
        self.complete = bool(complete)  # False when max_steps or horizon_s stopped it early
        self._flat = None

    def __repr__(self) -> str:
        c = self.counters
        return (f"SimResult({len(self.requests)} requests, {len(self.timeline)} steps, "
                f"{c.get('finished', 0)} finished, {c.get('rejected', 0)} rejected, "
                f"{c.get('preemptions', 0)} preemptions, end {self.end_s:.3g} s)")

    def _record(self, rid: int) -> RequestRecord:
        if not (isinstance(rid, int | np.integer) and 0 <= rid < len(self.requests)):
            raise ValueError(f"rid must be an integer in [0, {len(self.requests) - 1}], got {rid!r}")
        return self.requests[int(rid)]

    def _tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, offsets): every output token's emission time, request by request in order;
        request r's tokens are times[offsets[r]:offsets[r + 1]]. Built once, vectorized:
        each emission segment is a prefill's token (one time) or a decode run (ticks t0..t1-1,
        emitted at the ends of the steps that ran those ticks)."""
        if self._flat is None:
            # every token is read from one table: the end of each decode tick's step, then the
            # prefill tokens' times; segment k takes seg_len[k] entries from seg_src[k] on
            ticks = len(self._tick_step)
            seg_src, seg_len, points, per_req = [], [], [], []
            for emits in self._emits:
                n = 0
                for e in emits:
                    if len(e) == 1:  # a prefill's token
                        seg_src.append(ticks + len(points))
                        seg_len.append(1)
                        points.append(e[0])
                        n += 1
                    else:  # a decode run: ticks e[0]..e[1]-1
                        seg_src.append(e[0])
                        seg_len.append(e[1] - e[0])
                        n += e[1] - e[0]
                per_req.append(n)
            lens = np.asarray(seg_len, dtype=np.int64)
            src = np.arange(int(lens.sum())) + np.repeat(np.asarray(seg_src, dtype=np.int64) - (np.cumsum(lens) - lens),
                                                         lens)
            table = np.concatenate([self.timeline.end_s[self._tick_step], np.asarray(points, dtype=float)])
            times = table[src]
            offsets = np.concatenate([[0], np.cumsum(per_req)]).astype(np.int64)
            self._flat = (times, offsets)
        return self._flat

    def token_times(self, rid: int) -> np.ndarray:
        """Emission time (s) of each output token of request ``rid``, in order."""
        rec = self._record(rid)
        times, off = self._tokens()
        return times[off[rec.rid]:off[rec.rid + 1]]

    def _gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(gaps, owner): every gap between consecutive tokens of one request, and its request."""
        times, off = self._tokens()
        counts = np.diff(off)
        owner = np.repeat(np.arange(len(counts)), counts)
        same = owner[1:] == owner[:-1]
        return np.diff(times)[same], owner[1:][same]

    def inter_token_gaps(self, rids=None) -> np.ndarray:
        """Every gap between consecutive output tokens (s) of finished requests (or of ``rids``)."""
        gaps, owner = self._gaps()
        if rids is None:
            keep = np.array([r.status == "finished" for r in self.requests], dtype=bool)
        else:
            keep = np.zeros(len(self.requests), dtype=bool)
            keep[np.asarray(list(rids), dtype=np.int64)] = True
        return gaps[keep[owner]] if len(gaps) else np.zeros(0)

    def max_gaps(self) -> np.ndarray:
        """Per request, the longest gap between two of its tokens (s; nan for fewer than 2)."""
        gaps, owner = self._gaps()
        out = np.full(len(self.requests), -np.inf)
        np.maximum.at(out, owner, gaps)
        out[np.isneginf(out)] = math.nan
        return out

    def array(self, name: str, status: str | None = "finished") -> np.ndarray:
        """One record field or property (``ttft_s``, ``tpot_s``, ``prompt_len``...) as an array,
        over requests of ``status`` (None: all)."""
        if not hasattr(RequestRecord, name):
            raise ValueError(f"name must be a RequestRecord field or property, got {name!r}")
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)} or None; got {status!r}")
        return np.array([getattr(r, name) for r in self.requests
                         if status is None or r.status == status], dtype=float)

    def metrics(self, slo: SLO | None = None, priority: int | None = None) -> Metrics:
        """Throughput, goodput under ``slo`` (None: no targets), latency summaries and counts,
        over all requests or those of class ``priority``."""
        slo = slo or SLO()
        if not isinstance(slo, SLO):
            raise ValueError(f"slo must be an SLO(ttft_s, tpot_s), got {slo!r}")
        recs = [r for r in self.requests if priority is None or r.priority == priority]
        fin = [r for r in recs if r.status == "finished"]
        good = [r for r in fin if slo.met(r)]
        t0 = min((r.arrival_s for r in recs), default=0.0)
        t1 = max((r.departure_s for r in recs), default=t0)
        span = t1 - t0
        rate = (lambda x: x / span) if span > 0 else (lambda x: math.nan)
        reasons: dict = {}
        for r in recs:
            if r.reason:
                reasons[r.reason] = reasons.get(r.reason, 0) + 1
        tl = self.timeline
        busy = tl.duration_s.sum()
        return Metrics(
            n_requests=len(recs),
            finished=len(fin),
            rejected=sum(r.status == "rejected" for r in recs),
            expired=sum(r.status == "expired" for r in recs),
            unfinished=sum(r.status == "unfinished" for r in recs),
            duration_s=span,
            output_tokens_per_s=rate(sum(r.output_len for r in fin)),
            requests_per_s=rate(len(fin)),
            goodput_requests_per_s=rate(len(good)),
            goodput_tokens_per_s=rate(sum(r.output_len for r in good)),
            slo_attainment=len(good) / len(recs) if recs else math.nan,
            ttft=Summary.of([r.ttft_s for r in fin]),
            tpot=Summary.of([r.tpot_s for r in fin]),
            itl=Summary.of(self.inter_token_gaps([r.rid for r in fin])),
            e2e=Summary.of([r.e2e_s for r in fin]),
            queue=Summary.of([r.queue_s for r in fin]),
            preemptions=sum(r.preemptions for r in recs),
            recomputed_tokens=sum(r.recomputed_tokens for r in recs),
            swaps=sum(r.swaps for r in recs),
            swap_s=float(tl.swap_s.sum()),
            mean_running=float((tl.running * tl.duration_s).sum() / busy) if busy > 0 else 0.0,
            reasons=reasons,
        )

    def littles_law(self) -> LittleCheck:
        """L = lambda W on this run, from the first arrival to the last departure.

        ``L_timeline`` integrates the engine's own occupancy counts: each step's waiting +
        running + swapped (recorded when the step was built; a static batch's padding has
        finished, so it has left) over the step; a request
        that arrives during a step joins the queue at its end, so it adds (step end - arrival);
        between steps (idle, where the engine keeps no rows) the records' count of who has
        arrived and not left is integrated. ``identity_L``
        = sum of the records' times in system / span, which is lambda W on any sample path.
        Their agreement checks that the engine's counts and its records tell one story.
        """
        recs = self.requests
        if not recs:
            raise ValueError("littles_law needs at least one request")
        t0 = min(r.arrival_s for r in recs)
        t1 = max(r.departure_s for r in recs)
        span = t1 - t0
        if span <= 0:
            raise ValueError("littles_law needs a run that spans time (all requests left at once)")
        soj = np.array([r.sojourn_s for r in recs])
        arr = np.array([r.arrival_s for r in recs])
        tl = self.timeline
        start, end = tl.start_s, tl.end_s
        n_sys = tl.waiting + tl.running + tl.swapped  # padding has left (finished)
        area = float((n_sys * tl.duration_s).sum())
        # arrivals inside a step: in the system from their arrival, counted from the step's end
        stayed = arr[soj > 0]
        k = np.searchsorted(start, stayed, "right") - 1
        inside = (k >= 0) & (stayed > start[np.maximum(k, 0)]) & (stayed < end[np.maximum(k, 0)])
        area += float((end[k[inside]] - stayed[inside]).sum())
        # idle gaps between steps (the engine keeps no rows there): the records' count,
        # integrated exactly: int N = F_arr(b) - F_arr(a) - (F_dep(b) - F_dep(a)),
        # F_x(t) = sum over x_i <= t of (t - x_i)
        a = np.concatenate([[t0], end])
        b = np.concatenate([start, [t1]])
        keep = b > a
        a, b = a[keep], b[keep]

        def cumulative(x: np.ndarray, t: np.ndarray) -> np.ndarray:
            x = np.sort(x)
            csum = np.concatenate([[0.0], np.cumsum(x)])
            n = np.searchsorted(x, t, "right")
            return n * t - csum[n]

        dep = np.array([r.departure_s for r in recs])
        area += float((cumulative(arr, b) - cumulative(arr, a)
                       - cumulative(dep, b) + cumulative(dep, a)).sum())
        return LittleCheck(area / span, len(recs) / span, float(soj.mean()), float(soj.sum()) / span)
