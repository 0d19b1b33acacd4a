"""Five usual suspects for a broken p99 under a flat median (N029), each injected alone into seeded
evidence from the book's serving simulator, and the metric that separates each.

The fleet: ``replicas`` replicas of one deployment, each serving its own Poisson share of the traffic
(:func:`lib.scheduling.simulate`, continuous batching, ``max_running`` sequences at most, steps priced
by the book's step model). A request's **worst wait** is the longest time its user saw nothing:
max(TTFT, longest gap between two of its tokens). The suspects, each a change to one input:

* ``queueing``: the offered load rises to ``saturation`` of the replica's measured capacity (a
  saturated run's finished requests per second): waits before the first schedule grow as 1 / (1 - rho);
* ``long_prefill``: a share ``long_share`` of requests bring ``long_prompt`` tokens; while their
  prefill chunks run, every decode in the batch waits;
* ``preemption``: the KV pool shrinks to ``kv_fraction`` of what ``max_running`` average requests
  need (never above the deployment's own pool); running requests are preempted and recomputed;
* ``host_stall``: each engine step stalls ``stall_s`` more with probability ``stall_p`` (a garbage
  collection, a Python pause): every running request waits at once;
* ``bad_replica``: one replica's steps take ``slow_factor`` times longer (a throttled or faulty GPU)
  at the same traffic share.

:func:`tail_metrics` computes one separating number per suspect from the evidence alone (records,
step timelines, replica ids): the offered load over the measured capacity, the share of tail requests
that overlapped a long prefill, preemptions per 100 requests, the share that lived through an unexplained
step-time outlier, and the slowest replica's median TPOT over the fleet's. :func:`diagnose` names the
suspect whose metric is furthest past its threshold, once the symptoms a firing cause explains are set
aside (a long prompt's preemptions and slow replica). SI units: seconds, tokens.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import integer, real

__all__ = ["METRIC_NAMES", "SUSPECTS", "THRESHOLDS", "Evidence", "TailSetup", "all_evidence", "capacity_rps",
           "capacity_run", "diagnose", "evidence", "life_steps", "tail_metrics"]

SUSPECTS = ("queueing", "long_prefill", "preemption", "host_stall", "bad_replica")
METRIC_NAMES = {
    "queueing": "offered load over the measured capacity",
    "long_prefill": "share of tail requests that overlapped a long prefill",
    "preemption": "preemptions per 100 requests",
    "host_stall": "share of tail requests that lived through an unexplained step stall",
    "bad_replica": "slowest replica's median TPOT / fleet median",
}
# A metric "fires" past its threshold: an offered load where waits grow as 1 / (1 - rho) (0.85), most of
# the tail marked by one cause (0.5), any preemption to speak of (1 per 500 requests: a healthy pool
# preempts nothing, and two preempted requests out of 480 already own a p99), or a replica 20% slower at
# the median (a healthy fleet's replicas agree within a few percent).
THRESHOLDS = {"queueing": 0.85, "long_prefill": 0.5, "preemption": 0.2, "host_stall": 0.5, "bad_replica": 1.2}
# Downstream symptoms: a long prompt takes KV blocks (preemptions) and slows the replica it lands on (its
# median TPOT), so when the long-prefill metric fires those two firing with it are its effects, not causes.
EXPLAINS = {"long_prefill": ("preemption", "bad_replica")}


@dataclass(frozen=True)
class TailSetup:
    """The fleet, its traffic and the strength of each injected suspect (module doc)."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm"
    replicas: int = 4
    requests_per_replica: int = 120
    utilization: float = 0.6        # the healthy offered load, a fraction of the measured capacity
    max_running: int = 32
    prompt_median: int = 1000
    output_median: int = 100
    saturation: float = 0.97        # queueing: the offered load, a fraction of capacity
    long_prompt: int = 32000        # long_prefill: tokens of a long prompt
    long_share: float = 0.01        # long_prefill: share of requests that bring one
    kv_fraction: float = 0.35       # preemption: the pool over what max_running average requests need
    stall_s: float = 0.2            # host_stall: the pause
    stall_p: float = 0.001          # host_stall: probability that a step pauses
    slow_factor: float = 1.6        # bad_replica: its step time multiplier
    seed: int = 0

    def __post_init__(self) -> None:
        integer("replicas", self.replicas, 2, 16)
        integer("requests_per_replica", self.requests_per_replica, 20, 5000)
        real("utilization", self.utilization, 0.05, 0.9)
        integer("max_running", self.max_running, 1, 1024)
        integer("prompt_median", self.prompt_median, 16, 16000, unit="tokens")
        integer("output_median", self.output_median, 4, 4000, unit="tokens")
        real("saturation", self.saturation, 0.5, 1.2)
        integer("long_prompt", self.long_prompt, 1024, 131072, unit="tokens")
        if self.long_prompt < 8 * self.prompt_median:
            raise ValueError(f"long_prompt must be at least 8 x prompt_median ({8 * self.prompt_median:,} tokens): "
                             f"prompts are capped at 4 x the median and a long one counts from half of long_prompt, "
                             f"so a shorter one is indistinguishable from the ordinary traffic")
        real("long_share", self.long_share, 0.001, 0.2)
        real("kv_fraction", self.kv_fraction, 0.05, 1.0)
        real("stall_s", self.stall_s, 0.001, 10.0, unit="seconds")
        real("stall_p", self.stall_p, 1e-6, 0.2)
        real("slow_factor", self.slow_factor, 1.0, 5.0)
        integer("seed", self.seed, 0)


class _Scaled:
    """A StepCost whose steps are scaled and, with probability ``p`` each (seeded), stalled."""

    def __init__(self, base, factor: float = 1.0, stall_s: float = 0.0, p: float = 0.0, seed: int = 0) -> None:
        self.base, self.factor, self.stall_s, self.p = base, factor, stall_s, p
        self.rng = np.random.default_rng(seed)
        for name in ("kv_blocks", "block_size", "max_running", "token_budget"):
            setattr(self, name, getattr(base, name))

    def step_s(self, decode_seqs, context_tokens, chunks=()):
        t = self.base.step_s(decode_seqs, context_tokens, chunks)
        if t > 0 and self.p > 0 and self.rng.random() < self.p:
            t = t * self.factor + self.stall_s
        else:
            t = t * self.factor
        return t

    def swap_s(self, tokens):
        return self.base.swap_s(tokens)


def _deployment(model: str, gpu: str):
    from lib.perf.throughput import smallest_fitting_deployment

    return smallest_fitting_deployment(model, gpu)


def _lengths(s: TailSetup):
    from lib.scheduling.workloads import LogNormal

    return LogNormal(s.prompt_median, 0.5, cap=4 * s.prompt_median), LogNormal(s.output_median, 0.5,
                                                                                 cap=4 * s.output_median)


@functools.lru_cache(maxsize=32)
def capacity_run(s: TailSetup):
    """A load test of one replica: a burst of 4 x max_running requests served to the end (the
    :class:`~lib.scheduling.metrics.SimResult`)."""
    from lib.scheduling import Policy, simulate
    from lib.scheduling.cost import step_cost
    from lib.scheduling.workloads import Workload

    dep = _deployment(s.model, s.gpu)
    prompt, output = _lengths(s)
    wl = Workload(prompt=prompt, output=output, arrival="burst", rate=None, n_requests=4 * s.max_running)
    return simulate(wl, Policy(max_running=s.max_running), step_cost(dep, max_batch=s.max_running), seed=s.seed + 1)


def capacity_rps(s: TailSetup) -> float:
    """The replica's measured capacity (requests/s): the load test's (:func:`capacity_run`) finished
    requests over the time from the first arrival to the last finish."""
    return float(capacity_run(s).metrics().requests_per_s)


@dataclass(frozen=True)
class Evidence:
    """What an investigation can see: per request (replica, arrival, prompt, output, TTFT, queue, TPOT,
    worst wait, preemptions, life span) and per replica the step timeline (start, duration, prefill
    tokens, decode sequences)."""

    suspect: str | None
    replica: np.ndarray
    arrival_s: np.ndarray
    prompt_len: np.ndarray
    ttft_s: np.ndarray
    queue_s: np.ndarray
    tpot_s: np.ndarray
    worst_wait_s: np.ndarray
    preemptions: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    steps: tuple = field(repr=False)  # per replica: (start, duration, prefill tokens, decodes, context, pairs)
    long_prompt: int = 0
    capacity_rps: float = math.nan  # one replica's measured capacity (a load test), requests/s

    def __len__(self) -> int:
        return len(self.replica)


def evidence(s: TailSetup, suspect: str | None) -> Evidence:
    """Seeded evidence of the fleet with ``suspect`` injected alone (None: healthy)."""
    if suspect is not None and suspect not in SUSPECTS:
        raise ValueError(f"suspect must be None or one of {', '.join(SUSPECTS)}, got {suspect!r}")
    return _evidence(s, suspect)


def all_evidence(s: TailSetup) -> dict[str | None, Evidence]:
    """{None: the healthy fleet's evidence, suspect: the evidence with it injected} for every suspect of
    :data:`SUSPECTS`: :func:`evidence` of each (cached per setup, so a second call computes nothing)."""
    return {k: _evidence(s, k) for k in (None, *SUSPECTS)}


@functools.lru_cache(maxsize=64)
def _evidence(s: TailSetup, suspect: str | None) -> Evidence:
    from lib.scheduling import Policy, simulate
    from lib.scheduling.cost import step_cost
    from lib.scheduling.workloads import Workload, trace

    dep = _deployment(s.model, s.gpu)
    base = step_cost(dep, max_batch=s.max_running)
    prompt, output = _lengths(s)
    rate = s.utilization * capacity_rps(s)
    if suspect == "queueing":
        rate = s.saturation * capacity_rps(s)
    cols = {k: [] for k in ("replica", "arrival_s", "prompt_len", "ttft_s", "queue_s", "tpot_s", "worst_wait_s",
                            "preemptions", "start_s", "end_s")}
    steps = []
    for r in range(s.replicas):
        seed = s.seed * 100 + r
        reqs = Workload(prompt=prompt, output=output, rate=rate, n_requests=s.requests_per_replica).generate(seed)
        if suspect == "long_prefill":
            rng = np.random.default_rng(seed + 50)
            hit = rng.random(len(reqs)) < s.long_share
            reqs = trace([(q.arrival_s, s.long_prompt if h else q.prompt_len, q.output_len)
                          for q, h in zip(reqs, hit, strict=True)])
        kv_blocks = None
        if suspect == "preemption":
            need = s.max_running * (prompt.mean + output.mean) / base.block_size
            # never more than the deployment's own pool: the injection cuts memory, it cannot add any
            kv_blocks = min(base.kv_blocks,
                            max(int(s.kv_fraction * need), int(4 * (prompt.cap + output.cap) / base.block_size)))
        factor = s.slow_factor if suspect == "bad_replica" and r == 0 else 1.0
        p = s.stall_p if suspect == "host_stall" else 0.0
        cost = _Scaled(base, factor, s.stall_s, p, seed=seed + 77) if (factor != 1.0 or p > 0) else base
        res = simulate(reqs, Policy(max_running=s.max_running), cost, seed=seed, kv_blocks=kv_blocks)
        gaps = res.max_gaps()
        for i, rec in enumerate(res.requests):
            if rec.status != "finished":
                continue
            cols["replica"].append(r)
            cols["arrival_s"].append(rec.arrival_s)
            cols["prompt_len"].append(rec.prompt_len)
            cols["ttft_s"].append(rec.ttft_s)
            cols["queue_s"].append(rec.queue_s)
            cols["tpot_s"].append(rec.tpot_s if rec.output_len > 1 else math.nan)
            g = gaps[i] if np.isfinite(gaps[i]) else 0.0
            cols["worst_wait_s"].append(max(rec.ttft_s, g))
            cols["preemptions"].append(rec.preemptions)
            cols["start_s"].append(rec.arrival_s)
            cols["end_s"].append(rec.finish_s)
        tl = res.timeline
        pairs = np.array([sum(c * p + c * (c + 1) / 2 for _, c, p in step) for step in tl.chunks], dtype=float) \
            if len(tl.chunks) == len(tl) else np.zeros(len(tl))
        steps.append((np.asarray(tl.start_s), np.asarray(tl.duration_s), np.asarray(tl.prefill_tokens),
                      np.asarray(tl.decode_tokens), np.asarray(tl.context_tokens), pairs))
    arr = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    arr["replica"] = arr["replica"].astype(np.int64)
    arr["preemptions"] = arr["preemptions"].astype(np.int64)
    return Evidence(suspect, steps=tuple(steps), long_prompt=s.long_prompt, capacity_rps=capacity_rps(s), **arr)


def _tail(ev: Evidence, q: float) -> np.ndarray:
    cut = np.quantile(ev.worst_wait_s, q)
    return ev.worst_wait_s >= cut


def _outlier_steps(times, dur, prefill, decode, context, pairs) -> np.ndarray:
    """Indices of the steps the batch's composition does not explain: fit duration = a + b decode +
    c prefill tokens + d context tokens + e prefill (query, key) pairs by least squares over the
    replica's steps, then flag residuals above 10 robust deviations (1.4826 MAD) and above 20% of the
    fitted time."""
    if len(dur) < 20:
        return np.zeros(0)
    x = np.column_stack([np.ones(len(dur)), decode, prefill, context, pairs]).astype(float)
    coef, *_ = np.linalg.lstsq(x, dur, rcond=None)
    fit = x @ coef
    res = dur - fit
    mad = 1.4826 * float(np.median(np.abs(res - np.median(res))))
    out = (res > 10 * max(mad, 1e-6)) & (res > 0.2 * np.maximum(fit, 1e-6))
    return np.flatnonzero(out)


def tail_metrics(ev: Evidence, q: float = 0.99) -> dict[str, float]:
    """One separating number per suspect (module doc), computed on the requests at or above the
    q-quantile of the worst wait (the tail) and on the step timelines."""
    real("q", q, 0.5, 1, high_open=True)
    tail = _tail(ev, q)
    out = {}
    rates = []
    for r in np.unique(ev.replica):  # each replica's arrivals per second: (n - 1) gaps over their span
        a = np.sort(ev.arrival_s[ev.replica == r])
        if len(a) > 1 and a[-1] > a[0]:
            rates.append((len(a) - 1) / (a[-1] - a[0]))
    out["queueing"] = float(np.mean(rates) / ev.capacity_rps) if rates else math.nan
    # long prefill: did the request's life overlap a long prompt's time in the engine on its replica?
    long = ev.prompt_len >= 0.5 * ev.long_prompt if ev.long_prompt else np.zeros(len(ev), bool)
    overl = np.zeros(len(ev), bool)
    for r in np.unique(ev.replica):
        mine = ev.replica == r
        ls, le = ev.start_s[mine & long], ev.arrival_s[mine & long] + ev.ttft_s[mine & long]
        if len(ls):
            s0, e0 = ev.start_s[mine][:, None], ev.end_s[mine][:, None]
            overl[mine] = ((s0 <= le[None, :]) & (e0 >= ls[None, :])).any(axis=1)
    out["long_prefill"] = float(overl[tail & ~long].mean()) if (tail & ~long).any() else 0.0
    out["preemption"] = float(100 * ev.preemptions.sum() / len(ev))
    lived = np.zeros(len(ev), bool)
    for r, st in enumerate(ev.steps):
        hits = _outlier_steps(*st)
        if len(hits):  # the request's life overlaps the stalled step (it may arrive during it)
            mine = ev.replica == r
            h0, h1 = st[0][hits], st[0][hits] + st[1][hits]
            lived[mine] = ((ev.start_s[mine][:, None] <= h1[None, :]) & (ev.end_s[mine][:, None] >= h0[None, :])).any(1)
    out["host_stall"] = float(lived[tail].mean())
    med = np.array([np.nanmedian(ev.tpot_s[ev.replica == r]) for r in np.unique(ev.replica)])
    out["bad_replica"] = float(med.max() / np.median(med))
    return out


def life_steps(ev: Evidence) -> np.ndarray:
    """Per request, the engine steps of its replica that started during its life (arrival to finish)."""
    out = np.zeros(len(ev), dtype=np.int64)
    for r, st in enumerate(ev.steps):
        mine = np.flatnonzero(ev.replica == r)
        t0 = np.sort(st[0])
        out[mine] = np.searchsorted(t0, ev.end_s[mine], side="right") - np.searchsorted(t0, ev.start_s[mine], side="left")
    return out


def diagnose(metrics: dict[str, float]) -> str | None:
    """The suspect whose metric is furthest past its threshold (ratio to it), or None if none fires;
    a firing metric that another firing suspect explains (:data:`EXPLAINS`: the preemptions and the slow
    replica a long prompt causes) does not compete."""
    score = {k: metrics[k] / THRESHOLDS[k] for k in SUSPECTS}
    fired = [k for k in SUSPECTS if score[k] >= 1]
    explained = {e for k in fired for e in EXPLAINS.get(k, ())}
    left = [k for k in fired if k not in explained]
    return max(left, key=lambda k: score[k]) if left else None

