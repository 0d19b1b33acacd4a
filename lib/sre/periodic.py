"""Periodic latency spikes (I079): from a period to a ranked list of periodic sources, and the one
correlation that tells a wall-clock source from a work-count source.

* :data:`SOURCES`: the usual periodic sources on an inference host, each with the range of periods it
  shows, what its period is locked to (``"wall"``: a timer, the same period whatever the traffic;
  ``"count"``: every N allocations or requests, so its period in seconds scales as 1 / traffic) and a
  prior share; :func:`rank_sources` keeps those whose range holds an observed period, by prior.
* :func:`spike_series`: a seeded engine-step series (the book's decode step for one batch, with a small
  jitter) over ``duration_s`` of traffic whose rate changes by ``rate_change`` halfway, with one source
  injected: a ``stall_s`` pause on the first step at or after each timer tick (wall) or after every N
  completed requests (count, N = period x the initial rate).
* :func:`detect_spikes`, :func:`period_estimate`, :func:`phase_concentration` and :func:`lock_test`:
  the diagnosis on the series alone: spike steps, their period, and the circular concentration of the
  spikes' phase against wall time (period P) and against the request count (N per spike); the larger
  one names the lock, and the period before and after the traffic change confirms it.
* :func:`window_latencies`: every request of n consecutive steps, for the p50 / p99 (the per-request
  probability of meeting a spike is :func:`lib.sre.tails.p_hit_any`).
SI units: seconds, requests, requests/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["LOCKS", "SOURCES", "Source", "SpikeSeries", "detect_spikes", "lock_test", "period_estimate",
           "phase_concentration", "rank_sources", "source", "spike_series", "window_latencies"]

LOCKS = ("wall", "count")


@dataclass(frozen=True)
class Source:
    """A periodic source: name, the periods it shows (s), what it is locked to, a prior share, and why."""

    key: str
    name: str
    low_s: float
    high_s: float
    lock: str
    prior: float
    why: str


# Defaults quoted in ``why`` are the tools' documented defaults (Prometheus global scrape_interval 1m;
# Kubernetes probe periodSeconds 10; OpenTelemetry BatchSpanProcessor schedule delay 5000 ms; Linux
# khugepaged scan_sleep_millisecs 10000; CPython gc thresholds (700, 10, 10)); the priors are judgement.
SOURCES = (
    Source("scrape", "metrics scrape", 10.0, 60.0, "wall", 0.25,
           "a Prometheus scrape (default every 1 min) whose exporter walks every GPU or process under a lock"),
    Source("gc", "Python garbage collection (gen 2)", 1.0, 600.0, "count", 0.25,
           "CPython collects generation 2 after 700 x 10 x 10 net allocations: every N requests, not every N seconds"),
    Source("cron", "cron or batch job", 60.0, 3600.0, "wall", 0.15,
           "a job on the host or the node (log shipping, a backup, a model sync) on whole minutes"),
    Source("health", "health check", 5.0, 30.0, "wall", 0.10,
           "a liveness or readiness probe (Kubernetes default every 10 s) that runs a generation"),
    Source("flush", "log or trace flush", 1.0, 60.0, "wall", 0.10,
           "a batch exporter (OpenTelemetry spans every 5 s by default) or a log rotation on the serving thread"),
    Source("allocator", "allocator defragmentation", 1.0, 600.0, "count", 0.10,
           "torch.cuda.empty_cache or a block-pool compaction every N requests or allocations"),
    Source("thp", "transparent huge page compaction", 10.0, 10.0, "wall", 0.05,
           "khugepaged scans every 10 s by default and can stall a process on a page fault"),
)


def source(key: str) -> Source:
    """The source of ``key`` (one of SOURCES' keys)."""
    for s in SOURCES:
        if s.key == key:
            return s
    raise ValueError(f"source must be one of {', '.join(s.key for s in SOURCES)}, got {key!r}")


def rank_sources(period_s: float, tolerance: float = 0.1) -> list[Source]:
    """The sources whose period range holds ``period_s`` (within ``tolerance``, relative), by prior
    (then by name)."""
    p = real("period_s", period_s, 0, low_open=True, unit="seconds")
    tol = real("tolerance", tolerance, 0, 1)
    hits = [s for s in SOURCES if s.low_s * (1 - tol) <= p <= s.high_s * (1 + tol)]
    return sorted(hits, key=lambda s: (-s.prior, s.name))


@dataclass(frozen=True)
class SpikeSeries:
    """Engine steps: start (s), duration (s), requests completed before the step; the injected spike
    steps (ground truth, for checks only) and the time the traffic changed."""

    start_s: np.ndarray
    dur_s: np.ndarray
    count: np.ndarray
    injected: np.ndarray
    change_s: float
    base_step_s: float


def spike_series(base_step_s: float, *, duration_s: float = 1200.0, source_key: str = "scrape",
                 period_s: float = 60.0, stall_s: float = 0.3, rate_rps: float = 10.0, rate_change: float = 1.5,
                 jitter: float = 0.03, seed: int = 0) -> SpikeSeries:
    """A seeded step series with one periodic source injected (module doc). Steps run back to back;
    each lasts ``base_step_s`` x lognormal(0, ``jitter``), plus ``stall_s`` on a spike step. Requests
    complete as a Poisson process at ``rate_rps``, times ``rate_change`` after ``duration_s / 2``."""
    b = real("base_step_s", base_step_s, 1e-5, 10.0, unit="seconds")
    dur = real("duration_s", duration_s, 10 * b, 1e5, unit="seconds")
    src = source(source_key)
    per = real("period_s", period_s, 20 * b, dur / 2, unit="seconds")
    stall = real("stall_s", stall_s, 0, 60.0, unit="seconds")
    rate = real("rate_rps", rate_rps, 0, 1e5, low_open=True, unit="requests/s")
    change = real("rate_change", rate_change, 0.1, 10.0)
    sig = real("jitter", jitter, 0, 0.5)
    integer("seed", seed, 0)
    rng = np.random.default_rng(seed)
    half = dur / 2
    n1 = rng.poisson(rate * half)
    n2 = rng.poisson(rate * change * half)
    done = np.sort(np.concatenate([rng.random(n1) * half, half + rng.random(n2) * half]))
    n_steps = int(dur / b * 1.2) + 10
    base = b * np.exp(sig * rng.standard_normal(n_steps)) if sig > 0 else np.full(n_steps, b)
    phase = rng.random() * per  # where the timer's ticks fall
    n_per = max(1, round(per * rate))  # count lock: requests per spike at the initial rate
    t0 = np.concatenate([[0.0], np.cumsum(base)])[:-1]  # step starts without any spike
    spikes: list[int] = []
    k = 0  # spikes so far: each shifts every later step by stall
    tick = phase
    while True:
        if src.lock == "wall":
            due = tick
        else:
            need = (k + 1) * n_per
            if need > len(done):
                break
            due = float(done[need - 1])  # the step that starts once the need-th request is done
        i = int(np.searchsorted(t0, due - stall * k, side="left"))  # first step starting at or after due
        if spikes and i <= spikes[-1]:
            i = spikes[-1] + 1
        if i >= n_steps or t0[i] + stall * k >= dur:
            break
        spikes.append(i)
        k += 1
        if src.lock == "wall":
            t_i = t0[i] + stall * (k - 1)
            while tick <= t_i:
                tick += per
    shift = np.zeros(n_steps)
    if spikes:
        bump = np.zeros(n_steps)
        bump[np.asarray(spikes)] = stall
        shift = np.concatenate([[0.0], np.cumsum(bump)])[:-1]
    starts = t0 + shift
    durs = base + (np.isin(np.arange(n_steps), spikes) * stall)
    keep = starts < dur
    starts, durs = starts[keep], durs[keep]
    counts = np.searchsorted(done, starts, side="right").astype(np.int64)
    return SpikeSeries(starts, durs, counts, np.asarray(spikes, dtype=np.int64), half, b)


def detect_spikes(dur_s) -> np.ndarray:
    """Indices of steps longer than twice the median and more than 10 robust deviations above it."""
    d = np.asarray(dur_s, dtype=float)
    if d.size < 10:
        raise ValueError("dur_s needs at least 10 steps")
    med = float(np.median(d))
    mad = 1.4826 * float(np.median(np.abs(d - med)))
    return np.flatnonzero((d > 2 * med) & (d > med + 10 * max(mad, 1e-9)))


def period_estimate(times) -> float:
    """The median gap between consecutive spike times (s); nan for fewer than two."""
    t = np.sort(np.asarray(times, dtype=float))
    return float(np.median(np.diff(t))) if t.size > 1 else math.nan


def phase_concentration(x, period: float) -> float:
    """|mean of exp(2 pi i x / period)|: 1 when every x sits at the same phase of the period, near 0
    (about 1 / sqrt(n)) when the phases are spread."""
    x = np.asarray(x, dtype=float)
    real("period", period, 0, low_open=True)
    if x.size == 0:
        return math.nan
    return float(abs(np.mean(np.exp(2j * math.pi * x / period))))


def lock_test(series: SpikeSeries) -> dict:
    """The diagnosis on the series alone: spike steps, the period in wall time, the requests per spike,
    the phase concentration against wall time and against the request count, the period before and after
    the traffic change, and the verdict (the larger concentration)."""
    idx = detect_spikes(series.dur_s)
    t = series.start_s[idx]
    c = series.count[idx]
    per = period_estimate(t)
    n_per = float(np.median(np.diff(c))) if len(c) > 1 else math.nan
    r_wall = phase_concentration(t, per) if per == per else math.nan
    r_count = phase_concentration(c, n_per) if n_per == n_per and n_per > 0 else math.nan
    before = period_estimate(t[t < series.change_s])
    after = period_estimate(t[t >= series.change_s])
    lock = "wall" if (r_wall if r_wall == r_wall else 0.0) >= (r_count if r_count == r_count else 0.0) else "count"
    return {"spikes": idx, "period_s": per, "requests_per_spike": n_per, "r_wall": r_wall, "r_count": r_count,
            "period_before_s": before, "period_after_s": after, "lock": lock}


def window_latencies(dur_s, n_steps: int) -> np.ndarray:
    """The time of every run of ``n_steps`` consecutive steps (a request that lives through them), s."""
    n = integer("n_steps", n_steps, 1)
    d = np.asarray(dur_s, dtype=float)
    if d.size <= n:
        raise ValueError(f"the series needs more than n_steps = {n} steps, has {d.size}")
    cs = np.concatenate([[0.0], np.cumsum(d)])
    return cs[n:] - cs[:-n]
