"""Stragglers: every collective ends when its last rank arrives, so one slow GPU sets the pace of all.

* **Jitter** (:func:`expected_slowest`): if each of n ranks' step times varies independently around
  the same mean with coefficient of variation cv, the step waits for the largest: E[max] over the
  mean = 1 + cv x E[max of n standard normals] (:func:`expected_max_normal`, an order statistic by
  quadrature); with one rank slower by a factor, a quadrature of the maximum's exact CDF.
* **One slow rank** (:func:`straggler_step_s`): the job runs at its pace. A slow clock is the
  step model (:func:`lib.training.step.training_step`) with the GEMM rate scaled; a slow link
  stretches the collectives that cross the network; a host stall adds itself.
* **Finding it** (:func:`simulate_rank_times`, :func:`find_stragglers`): per-rank compute times of a
  step (time from the step's start to entering its collective); the straggler is the rank whose
  time stands out by a robust z-score (median and MAD), found in one step when its excess is many
  times the jitter.
* **Causes** (:data:`CAUSES`): the usual suspects, what each slows, and the command that confirms it.

SI units: seconds; factors are dimensionless (1 = healthy).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["CAUSES", "Cause", "expected_max_normal", "expected_slowest", "find_stragglers", "robust_z", "simulate_rank_times",
           "straggler_step_s"]


@functools.lru_cache(maxsize=1)
def _normal_grid():
    import numpy as np

    x = np.linspace(0.0, 12.0, 12001)  # Phi on x >= 0; Phi(-x) = 1 - Phi(x)
    phi = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    return x, phi


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], by quadrature (trapezoid, step 0.001) of
    E[max] = int_0^inf (1 - Phi(x)^n) dx - int_0^inf Phi(-x)^n dx (0 for n = 1, 1/sqrt(pi) for n = 2)."""
    import numpy as np

    k = integer("n", n, 1)
    x, phi = _normal_grid()
    upper = -np.expm1(k * np.log(phi))
    lower = np.exp(k * np.log(np.maximum(1.0 - phi, 1e-300)))
    integrand = upper - lower
    return float(np.sum((integrand[1:] + integrand[:-1]) * np.diff(x)) / 2.0)


def _log_ndtr(z):
    """log Phi(z) for a numpy array, accurate in both tails (log1p of the upper tail; erfc below)."""
    import numpy as np

    erfc = np.frompyfunc(math.erfc, 1, 1)
    z = np.asarray(z, dtype=float)
    upper = np.asarray(erfc(z / math.sqrt(2.0)), dtype=float) / 2.0  # 1 - Phi(z)
    lower = np.asarray(erfc(-z / math.sqrt(2.0)), dtype=float) / 2.0  # Phi(z)
    with np.errstate(divide="ignore"):
        return np.where(z > 0, np.log1p(-upper), np.log(lower))


def expected_slowest(n: int, cv: float, slow_factor: float = 1.0, points: int = 2001) -> float:
    """E[max of n rank times] / the healthy mean, for rank times (1 + cv z) with z standard normal,
    one of them multiplied by ``slow_factor`` (1 = none slow). Exact to quadrature error: the
    maximum's CDF is F(t) = Phi((t / s - 1) / cv) Phi((t - 1) / cv)^(n - 1), and
    E[max] = t_lo + integral of (1 - F) from t_lo (where F is ~0) to t_hi (where F is ~1).
    With cv = 0 it is max(1, slow_factor)."""
    import numpy as np

    n = integer("n", n, 1)
    cv = real("cv", cv, 0, 0.2)
    s = real("slow_factor", slow_factor, 0, low_open=True)
    if cv == 0:
        return max(1.0, s) if n > 1 or s != 1.0 else 1.0
    if s == 1.0:  # no rank slow: 1 + cv E[max of n standard normals]
        return 1.0 + cv * expected_max_normal(n)
    lo = min(1.0, s) * (1 - 9 * cv)
    hi = max(1.0, s) * (1 + 9 * cv)
    t = np.linspace(lo, hi, integer("points", points, 101))
    log_f = _log_ndtr((t / s - 1) / cv) + (n - 1) * _log_ndtr((t - 1) / cv)
    tail = 1.0 - np.exp(log_f)
    return float(lo + np.sum((tail[1:] + tail[:-1]) / 2 * np.diff(t)))


def straggler_step_s(step, compute_slowdown: float = 1.0, network_slowdown: float = 1.0,
                     host_stall_s: float = 0.0) -> float:
    """The step time of ``step`` (a :class:`lib.training.step.TrainingStep`) when one rank is slow.
    The job runs at that rank's pace, so:

    * ``compute_slowdown`` c (>= 1; a clock at fraction f of its normal rate is c = 1 / f): the step
      model itself (:func:`lib.training.step.training_step`) on the same layout with the GEMM rate
      divided by c: the matmuls and the non-matmul kernels (priced in proportion) stretch, the
      pipeline bubble with the micro-batch, and the gradient collective hides under a longer backward;
      the optimizer (memory-bound, on the HBM clock) does not;
    * ``network_slowdown`` k (>= 1): every collective or send whose fabric is the network
      (``step.fabrics``) takes k times as long (a ring or tree runs at its slowest link); the part
      that was hidden under compute stays hidden: exposed' = max(0, k x total - hidden);
    * ``host_stall_s``: a stall per step on the rank's host (data loader, CPU contention), which
      the first collective after it waits for.
    Seconds."""
    from dataclasses import replace

    from lib.training.step import training_step

    c = real("compute_slowdown", compute_slowdown, 1.0)
    k = real("network_slowdown", network_slowdown, 1.0)
    h = real("host_stall_s", host_stall_s, 0.0, unit="seconds")
    if c != 1.0:
        step = training_step(step.layout, replace(step.assume, gemm_efficiency=step.assume.gemm_efficiency / c))
    fab = step.fabrics

    def extra(total, exposed, axis):  # what a k-times slower link adds to one bucket
        if fab.get(axis) != "network":
            return 0.0
        return max(0.0, k * total - (total - exposed)) - exposed

    lay = step.layout
    per_mb = sum(extra(t, e, a) for t, e, a in ((step.tp_s, step.tp_exposed_s, "TP"),
                                                (step.cp_s, step.cp_exposed_s, "CP"),
                                                (step.ep_s, step.ep_exposed_s, "EP"))) / lay.micro_batches
    mb_old = step.micro_batch_s
    bubble = step.bubble_s * ((mb_old + per_mb) / mb_old if mb_old > 0 else 1.0)
    p2p = step.p2p_exposed_s * (k if fab.get("PP") == "network" else 1.0)
    dp = step.dp_exposed_s + extra(step.dp_s, step.dp_exposed_s, "DP")
    return ((mb_old + per_mb) * lay.micro_batches + bubble + p2p + dp + step.optimizer_s + h)


def simulate_rank_times(n: int, steps: int, cv: float, slow: dict | None = None, base_s: float = 1.0,
                        seed: int = 0):
    """Per-rank compute times, array (steps, n): base x (1 + cv z), z standard normal, independent
    across ranks and steps; ``slow`` maps a rank to its slowdown factor (multiplies its times)."""
    import numpy as np

    n = integer("n", n, 1)
    steps = integer("steps", steps, 1)
    cv = real("cv", cv, 0, 0.2)
    base = real("base_s", base_s, 0, low_open=True, unit="seconds")
    rng = np.random.default_rng(integer("seed", seed, 0))
    t = base * (1.0 + cv * rng.standard_normal((steps, n)))
    for rank, factor in (slow or {}).items():
        r = integer("slow rank", rank, 0, n - 1)
        t[:, r] *= real(f"slow[{r}]", factor, 0, low_open=True)
    return t


def robust_z(times):
    """(t - median) / (1.4826 x MAD) per rank (1.4826 makes the MAD a standard deviation for normal
    data; a few stragglers do not move the median or the MAD, unlike the mean and the SD). For a 2-D
    array (steps, ranks) each rank's mean over the steps is scored."""
    import numpy as np

    t = np.asarray(times, dtype=float)
    if t.ndim == 2:
        t = t.mean(axis=0)
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"times must hold at least 3 ranks (1-D) or (steps, ranks) (2-D); got shape {np.shape(times)}")
    med = np.median(t)
    mad = 1.4826 * np.median(np.abs(t - med))
    if mad == 0:
        mad = max(abs(med) * 1e-12, 1e-300)
    return (t - med) / mad


def find_stragglers(times, z_threshold: float = 6.0, min_excess: float = 0.0) -> list[int]:
    """Ranks whose compute time stands out: robust z above ``z_threshold`` and time at least
    (1 + ``min_excess``) x the median, slowest first. ``times``: one step (ranks,) or several
    (steps, ranks), averaged per rank. With n normal ranks the chance that any healthy one passes
    z = 6 is about n x 1e-9 per step."""
    import numpy as np

    zt = real("z_threshold", z_threshold, 0, low_open=True)
    ex = real("min_excess", min_excess, 0)
    t = np.asarray(times, dtype=float)
    mean = t.mean(axis=0) if t.ndim == 2 else t
    z = robust_z(t)
    med = float(np.median(mean))
    hits = [int(r) for r in np.flatnonzero((z > zt) & (mean >= (1 + ex) * med))]
    return sorted(hits, key=lambda r: -mean[r])


@dataclass(frozen=True)
class Cause:
    """A usual cause of a slow rank: what it slows, how it shows in per-rank timing, the command
    that confirms it on the suspect node."""

    name: str
    slows: str  # "compute", "network", "host" or "nothing yet"
    signature: str
    command: str


CAUSES = (
    Cause("clocks throttled (thermal, power, or HW slowdown)", "compute",
          "its compute time is long on every step, its time inside collectives short",
          "nvidia-smi -q -d PERFORMANCE (clocks event reasons: SW Thermal Slowdown, HW Slowdown, SW Power Cap); "
          "nvidia-smi -q -d CLOCK,TEMPERATURE,POWER"),
    Cause("a slow or flapping link (NIC trained down, symbol errors, retransmits)", "network",
          "compute normal; the collectives its ring or tree crosses are slow for every member",
          "ibstat (port state and rate); perfquery -x (SymbolErrorCounter, LinkDownedCounter, PortRcvErrors); "
          "ethtool -S <interface> on RoCE"),
    Cause("a PCIe link downtrained (GPU or NIC on x8 or Gen4)", "network",
          "host copies and GPU-NIC traffic slow on one node",
          "nvidia-smi -q -d PCI or lspci -vv (LnkSta against LnkCap)"),
    Cause("a noisy host (CPU contention, data loader, swapping, other processes)", "host",
          "irregular stalls before the first kernel of a step, not a steady slowdown",
          "mpstat -P ALL 1 and pidstat -u 1 (busy cores, stolen time); the framework's data-loader timer"),
    Cause("memory errors (ECC corrections, row remapping)", "nothing yet",
          "usually no slowdown; a rising count predicts the Xid that will stop the job",
          "nvidia-smi -q -d ECC,ROW_REMAPPER (pending remaps, remapping failures); dcgmi diag -r 3 on the drained node"),
)
