"""A straggler detector for a synchronous training job (N074): a few lines of comparison, and the
threshold and the clock that make them right.

* **The clock** (:func:`simulate_reports`): each rank reports the end of its step's compute; the report
  carries the sender's timestamp (its host clock, off by a per-host offset that NTP leaves at milliseconds)
  and is stamped again by the collector on arrival (one clock for every rank, plus a small network
  jitter). Lateness is compared on the collector's receive time.
* **The comparison** (:class:`Detector`): per rank, the mean receive time over a window of steps; its
  robust z-score (:func:`lib.training.stragglers.robust_z`: median and MAD); report the ranks with z
  strictly above the threshold, slowest first (the same rule as
  :func:`lib.training.stragglers.find_stragglers`). At exactly the threshold a rank is not reported.
* **The threshold** (:func:`z_threshold`): a false-positive budget per day over N ranks and the windows
  of a day is a per-comparison probability alpha = budget / comparisons (the expected number of false
  alarms is the sum over comparisons, with or without independence); the threshold is the normal
  quantile at 1 - alpha (:class:`statistics.NormalDist`). For few ranks the MAD-based z has heavier
  tails than a normal (:func:`robust_z_exceedance`, by Monte Carlo).

SI units: seconds; probabilities are per comparison (one rank, one window).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from types import SimpleNamespace

from lib.inputs import integer, real
from lib.training.stragglers import robust_z, simulate_rank_times

__all__ = ["SECONDS_PER_DAY", "Detector", "comparisons_per_day", "detection_probability", "detection_rates",
           "detection_scores", "false_positives_per_day", "robust_z_exceedance", "simulate_reports", "z_threshold"]

SECONDS_PER_DAY = 86_400.0


def comparisons_per_day(n_ranks: int, step_s: float, window: int) -> float:
    """Rank-window comparisons a day: n_ranks x 86,400 / (step_s x window) (one z-score per rank per
    window of ``window`` steps of ``step_s`` seconds)."""
    n = integer("n_ranks", n_ranks, 1)
    s = real("step_s", step_s, 0, low_open=True, unit="seconds")
    w = integer("window", window, 1)
    return n * SECONDS_PER_DAY / (s * w)


def z_threshold(fp_per_day: float, n_ranks: int, step_s: float, window: int) -> float:
    """The z above which a healthy rank is reported ``fp_per_day`` times a day on average:
    alpha = fp_per_day / :func:`comparisons_per_day`, threshold = Phi^-1(1 - alpha) (one-sided: only late
    ranks are stragglers)."""
    fp = real("fp_per_day", fp_per_day, 0, low_open=True)
    alpha = fp / comparisons_per_day(n_ranks, step_s, window)
    if not alpha < 1:
        raise ValueError(f"fp_per_day must be below the comparisons a day ({comparisons_per_day(n_ranks, step_s, window):.4g}); "
                         f"got {fp_per_day!r}")
    return NormalDist().inv_cdf(1.0 - alpha)


def false_positives_per_day(z: float, n_ranks: int, step_s: float, window: int) -> float:
    """The inverse: expected healthy reports a day at threshold ``z`` for normal z-scores,
    comparisons x (1 - Phi(z)) = comparisons x erfc(z / sqrt 2) / 2."""
    zz = real("z", z, 0)
    return comparisons_per_day(n_ranks, step_s, window) * 0.5 * math.erfc(zz / math.sqrt(2.0))


def robust_z_exceedance(n_ranks: int, z: float, trials: int = 2000, seed: int = 0, delay_ratio: float = 0.0,
                        steps: int = 1) -> float:
    """Monte Carlo: the fraction of healthy ranks whose robust z (:func:`lib.training.stragglers.robust_z`
    on ``n_ranks`` independent times) exceeds ``z``, over ``trials`` draws. Each time is the mean over
    ``steps`` of a standard normal plus ``delay_ratio`` times the absolute value of another (the network
    delay of :func:`simulate_reports`: ``delay_jitter_s`` over the compute jitter's sd); with
    ``delay_ratio = 0`` one normal draw.
    For many ranks and no delay it tends to 1 - Phi(z); for few, the MAD's own noise makes it larger,
    and a delay comparable with the jitter adds its one-sided tail."""
    import numpy as np

    n = integer("n_ranks", n_ranks, 3, 100_000)
    zz = real("z", z, 0)
    k = integer("trials", trials, 1, 10_000_000)
    ratio = real("delay_ratio", delay_ratio, 0)
    m = integer("steps", steps, 1, 10_000)
    rng = np.random.default_rng(integer("seed", seed, 0))
    if ratio == 0:
        x = rng.standard_normal((k, n))  # a mean of normals is normal: the robust z is scale-free
    else:
        x = (rng.standard_normal((k, m, n)) + ratio * np.abs(rng.standard_normal((k, m, n)))).mean(axis=1)
    med = np.median(x, axis=1, keepdims=True)
    mad = 1.4826 * np.median(np.abs(x - med), axis=1, keepdims=True)
    return float(np.mean((x - med) / mad > zz))


def simulate_reports(n_ranks: int, steps: int, step_s: float, cv: float, slow: dict | None = None,
                     skew_s: float = 0.0, delay_jitter_s: float = 0.0, gpus_per_host: int = 8, seed: int = 0) -> dict:
    """Per-rank step reports, arrays (steps, ranks) of seconds since the collector's step start:

    * compute times from :func:`lib.training.stragglers.simulate_rank_times` (base ``step_s``, jitter
      ``cv``, ``slow`` maps a rank to its slowdown factor); every rank starts each step together (the
      previous collective released them);
    * ``sent_s``: the sender's timestamp, its compute time plus its host's clock offset (normal, sd
      ``skew_s``, one per host of ``gpus_per_host`` ranks, the same every step);
    * ``received_s``: the collector's clock on arrival, the compute time plus a network delay jitter
      (normal, sd ``delay_jitter_s``, independent per report, floored at 0).
    Returns {"sent_s", "received_s", "compute_s", "offset_s" (per rank)}."""
    import numpy as np

    n = integer("n_ranks", n_ranks, 3)
    g = integer("gpus_per_host", gpus_per_host, 1)
    skew = real("skew_s", skew_s, 0, unit="seconds")
    jit = real("delay_jitter_s", delay_jitter_s, 0, unit="seconds")
    compute = simulate_rank_times(n, steps, cv, slow=slow, base_s=step_s, seed=seed)
    rng = np.random.default_rng(integer("seed", seed, 0) + 7919)
    host_offset = rng.normal(0.0, skew, math.ceil(n / g))
    offset = host_offset[np.arange(n) // g]
    delay = np.abs(rng.normal(0.0, jit, compute.shape)) if jit > 0 else np.zeros_like(compute)
    return {"sent_s": compute + offset, "received_s": compute + delay, "compute_s": compute, "offset_s": offset}


class Detector:
    """The reference straggler detector: :meth:`threshold` from a false-positive budget, :meth:`detect`
    on the collector's receive times."""

    def threshold(self, fp_per_day, n_ranks, step_s, window):
        """z above which a healthy rank is reported fp_per_day times a day: alpha = fp_per_day / (n_ranks x
        86,400 / (step_s x window)), threshold = the normal quantile at 1 - alpha."""
        alpha = fp_per_day / comparisons_per_day(n_ranks, step_s, window)
        return NormalDist().inv_cdf(1.0 - alpha)

    def detect(self, reports, threshold):
        """Ranks whose mean receive time over the window has a robust z strictly above ``threshold``,
        slowest first. ``reports``: {"sent_s", "received_s"}, arrays (steps, ranks)."""
        import numpy as np

        t = np.asarray(reports["received_s"], dtype=float)
        per_rank = t.mean(axis=0) if t.ndim == 2 else t
        z = robust_z(per_rank)
        hits = [int(r) for r in np.flatnonzero(z > threshold)]
        return sorted(hits, key=lambda r: -per_rank[r])


# ---- detection power: how often the rule finds one slow rank (N050) ----------------------------------


@functools.lru_cache(maxsize=32)
def detection_scores(n_ranks: int, cv: float, slowdown: float, steps_avg: int = 1, trials: int = 200,
                     seed: int = 0) -> SimpleNamespace:
    """Robust z-scores (:func:`lib.training.stragglers.robust_z`) of ``trials`` simulated evaluations
    (:func:`~lib.training.stragglers.simulate_rank_times`, ``steps_avg`` steps averaged per rank)
    with one rank slowed by ``slowdown``, and of as many clean evaluations. Returns
    SimpleNamespace(slow_z: the slow rank's score per evaluation, healthy_z: the other ranks' scores
    (trials, n - 1), clean_z: (trials, n), z: the first evaluation's scores, slow_rank, trials, times:
    the first evaluation's per-rank times)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    r = int(rng.integers(n_ranks))  # where the slow rank sits does not matter to the scores; one place per call
    k = steps_avg
    slow_t = simulate_rank_times(n_ranks, trials * k, cv, {r: slowdown}, seed=seed * 2 + 1).reshape(trials, k, n_ranks)
    clean_t = simulate_rank_times(n_ranks, trials * k, cv, seed=seed * 2 + 2).reshape(trials, k, n_ranks)
    zs = np.array([robust_z(slow_t[i]) for i in range(trials)])
    zc = np.array([robust_z(clean_t[i]) for i in range(trials)])
    for a in (zs, zc, slow_t):
        a.setflags(write=False)  # cached: callers share these arrays
    return SimpleNamespace(slow_z=zs[:, r], healthy_z=np.delete(zs, r, axis=1), clean_z=zc, z=zs[0], slow_rank=r,
                           trials=trials, times=slow_t[0])


def detection_rates(n_ranks: int, cv: float, slowdown: float, z_threshold: float, steps_avg: int = 1,
                    trials: int = 200, seed: int = 0) -> SimpleNamespace:
    """The alert ``robust z > z_threshold`` (what :func:`lib.training.stragglers.find_stragglers`
    flags with no minimum excess) applied to :func:`detection_scores`: detect (share of evaluations
    that flag the slow rank), fp_per_eval (healthy ranks flagged per clean evaluation), any_fp (share of
    clean evaluations with a flag), plus the first evaluation's z and slow_rank."""
    sc = detection_scores(n_ranks, cv, slowdown, steps_avg, trials, seed)
    flags = (sc.clean_z > z_threshold).sum(axis=1)
    return SimpleNamespace(detect=float((sc.slow_z > z_threshold).mean()), fp_per_eval=float(flags.mean()),
                           any_fp=float((flags > 0).mean()), z=sc.z, slow_rank=sc.slow_rank, trials=trials,
                           times=sc.times)


def detection_probability(n_ranks: int, cv: float, slowdown: float, z_threshold: float, steps_avg: int = 1) -> tuple:
    """(detection probability, expected healthy ranks flagged per evaluation) for normal rank times
    with the median and MAD taken as exact (they are not for small groups: :func:`robust_z_exceedance`
    and :func:`detection_rates` measure the heavier tail): the slow rank's score is (f - 1) sqrt(k) / cv + f Z, so
    P(detect) = Phi(((f - 1) sqrt(k) / cv - z) / f); each healthy rank passes z with 1 - Phi(z)."""
    def phi(x):
        return 0.5 * math.erfc(-x / math.sqrt(2.0))

    k = max(1, int(steps_avg))
    if cv == 0:
        return (1.0 if slowdown > 1 else 0.0), 0.0
    return phi(((slowdown - 1) * math.sqrt(k) / cv - z_threshold) / slowdown), n_ranks * (1 - phi(z_threshold))
