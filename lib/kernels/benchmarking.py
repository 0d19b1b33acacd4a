"""The measurement model of a timed kernel (N008): what a benchmark script reports against what the
kernel takes, for each way the script can be set up.

**The kernel.** It moves ``bytes`` (HBM reads + writes per call) and does ``flops``; on one GPU its
device time is the per-kernel roofline of the decode-step model (:mod:`lib.perf.step`):

    t = kernel_fixed + max(bytes / BW, flops / (P x matmul_eff x clock))

with BW = W x gemv_eff (HBM, :func:`lib.perf.roofline.roofline_time` for W and P) when the inputs
come from HBM, or the chip's L2 read bandwidth (:func:`lib.kernels.l2.l2_read_bandwidth`) when they
are still in L2 from the previous call (an LRU L2 keeps a working set that fits:
:func:`lib.kernels.l2.lru_keeps`); ``clock`` is 1 for a short run at boost clocks and
``decode_step.sustained_clock_under_power_cap`` for a GPU under a sustained load or a power cap.
The **true time** is what production sees: inputs from HBM (unless ``production_hot``), the
sustained clock, no compilation.

**The measurement** (:class:`Protocol`): each timed repetition reports

* ``events``: the device time between two CUDA events (quantized at ``event_resolution_us``);
* ``events_batch``: one event pair around a CUDA graph of ``BATCH`` launches, divided by the batch:
  t + launch_gap per call (no host launch in the way), resolution / batch, inputs hot whenever
  they fit (no flush inside the batch);
* ``host_sync``: a host timer around launch + synchronize: launch + t + wake-up;
* ``host_nosync``: a host timer around the launch only: the launch's host time, whatever t is.

No warm-up adds ``first_call_s`` to the first repetition (the compile runs on the host; the GPU idles
between the events). No L2 flush makes the inputs hot if they fit. Unlocked clocks in a short run
give the boost rate. Every repetition is multiplied by a lognormal jitter (``noise_sigma``) and, with
probability ``outlier_probability``, by 1 + an exponential extra (mean ``outlier_extra``). The
reported number is the protocol's statistic (median, mean or min) over the repetitions.

Launch and fixed costs come from :func:`lib.perf.step.step_assumptions`; the rest from
``data/assumptions.yaml`` section ``kernels_benchmarking``. SI units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lib.inputs import fraction, integer, real
from lib.kernels.l2 import l2_read_bandwidth, lru_keeps
from lib.perf.roofline import roofline_time
from lib.perf.step import kernel_time_s, step_assumptions
from lib.registry import assumptions
from lib.registry.hardware import gpu
from lib.units import US, MiB

__all__ = ["TIMERS", "STATISTICS", "CONTROLS", "ARTIFACTS", "BenchAssumptions", "bench_assumptions", "KernelSpec",
           "device_time_s", "true_time_s", "fits_in_l2", "Protocol", "RIGHT", "Measurement", "measure",
           "expected_repetition_s", "artifact_factors", "different_work_factor", "statistic_demo",
           "expected_min_factor", "do_bench_flush_bytes", "with_mistake", "MISTAKES"]

TIMERS = ("events", "events_batch", "host_sync", "host_nosync")
STATISTICS = ("median", "mean", "min")
BATCH = 100  # launches per event pair for the events_batch timer

CONTROLS = {
    "warmup": "warm-up: the first call compiles, autotunes and loads modules; clocks ramp up",
    "synchronize": "synchronization: a launch returns before the kernel runs",
    "cache": "cache state: a repeated input is still in L2 unless flushed",
    "clocks": "clocks: a short run boosts, a long one throttles; lock them",
    "shapes": "representative shapes and dtypes: the work timed must be the work shipped",
    "timer": "the timer: CUDA events for device time, and the overhead a host timer adds",
}
"""The six things that decide whether a kernel timing means anything."""

ARTIFACTS = {
    "no_sync": "no synchronize: the host timer stopped when the launch returned",
    "cache_hot": "cache-hot inputs: the working set was read from L2, not HBM",
    "first_call": "a first-call compile or autotune inside the baseline's mean",
    "different_work": "different work: a smaller shape, another dtype, an output not written",
    "boost_clock": "a boosted clock against a throttled one",
    "host_timer": "a host timer on a microsecond kernel: launch and wake-up timed too",
}
"""The six ways a large speedup turns out to be a measurement artifact."""


@dataclass(frozen=True)
class BenchAssumptions:
    """What a measurement adds to the kernel (SI units); :func:`bench_assumptions` reads them."""

    launch_s: float  # host time of one launch (decode_step.eager_launch_us)
    kernel_fixed_s: float  # device time beyond bytes and FLOPs (decode_step.kernel_fixed_us)
    launch_gap_s: float  # device idle between back-to-back kernels (decode_step.launch_gap_us)
    hbm_efficiency: float  # achieved / datasheet HBM bandwidth of a streaming kernel
    matmul_efficiency: float  # achieved / dense peak of a large GEMM, short run
    sustained_clock: float  # compute rate kept under a sustained load / power cap
    sync_s: float
    first_call_s: float
    event_resolution_s: float
    noise_sigma: float
    outlier_probability: float
    outlier_extra: float

    def __post_init__(self) -> None:
        for name in ("launch_s", "kernel_fixed_s", "launch_gap_s", "sync_s", "first_call_s", "event_resolution_s",
                     "noise_sigma", "outlier_extra"):
            real(name, getattr(self, name), 0)
        for name in ("hbm_efficiency", "matmul_efficiency", "sustained_clock"):
            fraction(name, getattr(self, name), allow_zero=False)
        fraction("outlier_probability", self.outlier_probability)


def bench_assumptions(**overrides) -> BenchAssumptions:
    """Central values: launch, fixed cost, gap and efficiencies from :func:`lib.perf.step.step_assumptions`,
    the sustained clock from ``decode_step.sustained_clock_under_power_cap``, the rest from
    ``kernels_benchmarking``. Keyword arguments replace single fields."""
    s = step_assumptions()
    k = "kernels_benchmarking."
    values = dict(launch_s=s.eager_launch_s, kernel_fixed_s=s.kernel_fixed_s, launch_gap_s=s.launch_gap_s,
                  hbm_efficiency=s.gemv_efficiency, matmul_efficiency=s.matmul_efficiency,
                  sustained_clock=assumptions.value("decode_step.sustained_clock_under_power_cap"),
                  sync_s=assumptions.value(k + "sync_wakeup_us") * US,
                  first_call_s=assumptions.value(k + "first_call_s"),
                  event_resolution_s=assumptions.value(k + "event_resolution_us") * US,
                  noise_sigma=assumptions.value(k + "noise_sigma"),
                  outlier_probability=assumptions.value(k + "outlier_probability"),
                  outlier_extra=assumptions.value(k + "outlier_extra"))
    unknown = set(overrides) - set(values)
    if unknown:
        raise ValueError(f"unknown benchmark assumption(s) {sorted(unknown)}; valid: {sorted(values)}")
    values.update({key: v for key, v in overrides.items() if v is not None})
    return BenchAssumptions(**values)


def do_bench_flush_bytes() -> float:
    """Bytes triton.testing.do_bench writes between repetitions to evict the L2 (256 MiB)."""
    return assumptions.value("kernels_benchmarking.do_bench_flush_mib") * MiB


@dataclass(frozen=True)
class KernelSpec:
    """The kernel under test: HBM ``bytes`` (reads + writes) and ``flops`` per call on ``gpu``;
    ``production_hot``: in production its inputs are still in L2 from the kernel before."""

    gpu: str
    bytes: float
    flops: float = 0.0
    dtype: str = "bf16"
    production_hot: bool = False

    def __post_init__(self) -> None:
        gpu(self.gpu)
        real("bytes", self.bytes, 1, unit="bytes")
        real("flops", self.flops, 0, unit="FLOP")


def fits_in_l2(spec: KernelSpec) -> bool:
    """Whether a repeated call finds its whole working set in an LRU L2 (bytes <= L2 size)."""
    return lru_keeps(spec.bytes, 0.0, spec.gpu)


def device_time_s(spec: KernelSpec, a: BenchAssumptions, *, hot: bool, clock: float) -> float:
    """kernel_fixed + max(bytes / BW, flops / (P x matmul_eff x clock)), BW the L2 read bandwidth
    if ``hot`` and the working set fits, else W x hbm_efficiency (module docstring). Seconds."""
    clock = fraction("clock", clock, allow_zero=False)
    rt = roofline_time(spec.flops, spec.bytes, spec.gpu, spec.dtype)
    mem = spec.bytes / l2_read_bandwidth(spec.gpu) if hot and fits_in_l2(spec) else rt.memory_s / a.hbm_efficiency
    return kernel_time_s(a.kernel_fixed_s, mem, rt.compute_s / (a.matmul_efficiency * clock))


def true_time_s(spec: KernelSpec, a: BenchAssumptions) -> float:
    """The time production sees: inputs from HBM (in L2 if ``production_hot`` and they fit), the
    sustained clock, no compile. Seconds."""
    return device_time_s(spec, a, hot=spec.production_hot, clock=a.sustained_clock)


@dataclass(frozen=True)
class Protocol:
    """How a benchmark script times the kernel (module docstring)."""

    repetitions: int = 100
    warmup: bool = True
    timer: str = "events"
    flush_l2: bool = True
    locked_clock: bool = True  # clocks locked at the sustained rate (else: a short run at boost)
    statistic: str = "median"

    def __post_init__(self) -> None:
        integer("repetitions", self.repetitions, 1, 100_000)
        if self.timer not in TIMERS:
            raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {self.timer!r}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {self.statistic!r}")

    def mistakes(self) -> list[str]:
        """What this protocol gets wrong against :data:`RIGHT`, in words."""
        out = []
        if not self.warmup:
            out.append("no warm-up")
        if self.timer != "events":
            out.append({"events_batch": "one event pair around a CUDA graph of launches",
                        "host_sync": "a host timer around launch + synchronize",
                        "host_nosync": "a host timer with no synchronize"}[self.timer])
        if not self.flush_l2:
            out.append("no L2 flush")
        if not self.locked_clock:
            out.append("unlocked clocks in a short run")
        if self.statistic != "median":
            out.append(f"the {self.statistic} instead of the median")
        return out


RIGHT = Protocol()
"""Warm-up, CUDA events per call, L2 flushed between repetitions, clocks locked at the sustained
rate, the median of 100 repetitions (and its IQR)."""


def _hot(spec: KernelSpec, p: Protocol) -> bool:
    """Whether the measured repetitions find the inputs in L2 (the protocol's doing, not production's)."""
    return (not p.flush_l2 or p.timer == "events_batch") and fits_in_l2(spec)


def expected_repetition_s(spec: KernelSpec, p: Protocol, a: BenchAssumptions) -> float:
    """What one steady repetition reports, before jitter: the device time in the protocol's cache and
    clock state, seen through its timer (module docstring). Seconds."""
    d = device_time_s(spec, a, hot=_hot(spec, p), clock=a.sustained_clock if p.locked_clock else 1.0)
    return {"events": d, "events_batch": d + a.launch_gap_s, "host_sync": a.launch_s + d + a.sync_s,
            "host_nosync": a.launch_s}[p.timer]


@dataclass(frozen=True)
class Measurement:
    """Simulated repetitions of one protocol and what it reports, against the true time (seconds)."""

    samples: np.ndarray
    reported_s: float
    true_s: float
    protocol: Protocol

    @property
    def factor(self) -> float:
        """reported / true: above 1 the benchmark says slower than the kernel is, below 1 faster."""
        return self.reported_s / self.true_s

    @property
    def median_s(self) -> float:
        return float(np.median(self.samples))

    @property
    def iqr_s(self) -> float:
        q1, q3 = np.percentile(self.samples, [25, 75])
        return float(q3 - q1)

    @property
    def mean_s(self) -> float:
        return float(self.samples.mean())

    @property
    def min_s(self) -> float:
        return float(self.samples.min())


def _statistic(samples: np.ndarray, statistic: str) -> float:
    return float({"median": np.median, "mean": np.mean, "min": np.min}[statistic](samples))


def measure(spec: KernelSpec, p: Protocol = RIGHT, a: BenchAssumptions | None = None, seed: int = 0) -> Measurement:
    """Simulate ``p.repetitions`` timed repetitions (seeded) and the statistic the protocol reports."""
    a = a or bench_assumptions()
    rng = np.random.default_rng(integer("seed", seed, 0))
    base = expected_repetition_s(spec, p, a)
    r = p.repetitions
    per = BATCH if p.timer == "events_batch" else 1  # launches averaged into one sample
    noise = np.exp(a.noise_sigma * rng.standard_normal((r, per)))
    hit = rng.random((r, per)) < a.outlier_probability
    extra = rng.exponential(a.outlier_extra, (r, per)) if a.outlier_extra > 0 else np.zeros((r, per))
    samples = base * (noise * (1 + hit * extra)).mean(axis=1)
    if not p.warmup:
        samples[0] += a.first_call_s / per
    if p.timer in ("events", "events_batch"):
        step = a.event_resolution_s / per
        samples = np.round(samples / step) * step if step > 0 else samples
    return Measurement(samples, _statistic(samples, p.statistic), true_time_s(spec, a), p)


# ---- the six artifacts, in closed form -------------------------------------------------------------

def artifact_factors(spec: KernelSpec, a: BenchAssumptions | None = None, repetitions: int = 100) -> dict[str, float]:
    """Apparent speedup (correct time / mistaken time, > 1: looks faster than it is) of the same kernel
    measured with each single mistake of :data:`ARTIFACTS` (``different_work`` needs a second kernel:
    :func:`different_work_factor`; here it is 1). ``first_call``: the baseline's mean over
    ``repetitions`` includes the compile, so the new kernel looks faster by (R t + first) / (R t)."""
    a = a or bench_assumptions()
    t = true_time_s(spec, a)
    reps = integer("repetitions", repetitions, 1)
    return {
        "no_sync": t / a.launch_s,
        "cache_hot": t / device_time_s(spec, a, hot=True, clock=a.sustained_clock),
        "first_call": (reps * t + a.first_call_s) / (reps * t),
        "different_work": 1.0,
        "boost_clock": t / device_time_s(spec, a, hot=spec.production_hot, clock=1.0),
        "host_timer": t / (a.launch_s + t + a.sync_s),
    }


def different_work_factor(spec: KernelSpec, other: KernelSpec, a: BenchAssumptions | None = None) -> float:
    """true time of ``spec`` / true time of ``other``: the speedup a comparison shows when the two do
    different work (another shape or dtype, an output not written)."""
    a = a or bench_assumptions()
    return true_time_s(spec, a) / true_time_s(other, a)


# ---- which statistic ---------------------------------------------------------------------------------

def statistic_demo(spec: KernelSpec, a: BenchAssumptions | None = None, repetitions: int = 100,
                   seed: int = 0) -> dict[str, float]:
    """Reported / true time of one seeded run with no warm-up (a slow first call), jitter and
    outliers, for the statistics a script might report: the mean of the first 5 repetitions, the mean
    of all, the minimum, the median, the median of the repetitions after the first; and the IQR / median."""
    a = a or bench_assumptions()
    m = measure(spec, Protocol(repetitions=integer("repetitions", repetitions, 6), warmup=False), a, seed)
    s, t = m.samples, m.true_s
    q1, q3 = np.percentile(s, [25, 75])
    return {"mean_first_5": float(s[:5].mean()) / t, "mean": float(s.mean()) / t, "min": float(s.min()) / t,
            "median": float(np.median(s)) / t, "median_after_first": float(np.median(s[1:])) / t,
            "iqr_over_median": float((q3 - q1) / np.median(s))}


def expected_min_factor(sigma: float, repetitions: int) -> float:
    """E[min of R lognormal factors exp(sigma z)] ~ exp(sigma z_(1)), z_(1) = Phi^-1((1 - 0.375) / (R + 0.25))
    (Blom's approximation of the smallest of R standard normals): the minimum drifts lower as R grows."""
    from statistics import NormalDist

    s = real("sigma", sigma, 0)
    r = integer("repetitions", repetitions, 1)
    return math.exp(s * NormalDist().inv_cdf((1 - 0.375) / (r + 0.25)))


MISTAKES = {"no_warmup": dict(warmup=False), "no_sync": dict(timer="host_nosync"), "no_flush": dict(flush_l2=False),
             "unlocked_clock": dict(locked_clock=False), "host_timer": dict(timer="host_sync"),
             "mean": dict(statistic="mean"), "min": dict(statistic="min")}
"""One mistake each: the protocol fields it changes."""


def with_mistake(p: Protocol, mistake: str) -> Protocol:
    """``p`` with one mistake of :data:`MISTAKES` made."""
    if mistake not in MISTAKES:
        raise ValueError(f"mistake must be one of {', '.join(MISTAKES)}, got {mistake!r}")
    return replace(p, **MISTAKES[mistake])


def plot_distribution(m: Measurement, title: str):
    """The simulated repetitions of one :class:`Measurement`: every repetition on a log time axis (left)
    and the cluster around the median on a linear one (right), with the true time and the median, mean
    and minimum marked. Returns a :class:`lib.book.figures.Drawing`."""
    from lib.book import figures

    s = m.samples / US
    lo, hi = float(s.min()), float(s.max())
    if hi <= lo * 1.1:
        lo, hi = lo / 1.05, hi * 1.05
    z_lo = min(float(s.min()), m.true_s / US) * 0.99
    z_hi = max(float(np.percentile(s, 90)), m.true_s / US) * 1.03
    marks = ((m.true_s, "true time", "black", "-"),
             (m.median_s, f"median ({sig_ratio(m.median_s, m.true_s)})", "#1f77b4", "--"),
             (m.mean_s, f"mean ({sig_ratio(m.mean_s, m.true_s)})", "#ff7f0e", ":"),
             (m.min_s, f"minimum ({sig_ratio(m.min_s, m.true_s)})", "#2ca02c", ":"))
    with figures.style():
        fig = figures.new_figure(6.6, 3.6)
        fig.subplots_adjust(left=0.09, right=0.98, bottom=0.36, top=0.88, wspace=0.25)
        full, zoom = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        figures.log_scale(full, "x", base=10)
        counts, edges = np.histogram(s, bins=np.geomspace(lo, hi, 41))
        handles = [full.stairs(counts, edges, fill=True, color="#bbbbbb", label="repetitions (count per bin)")]
        inside = s[(s >= z_lo) & (s <= z_hi)]
        grid = np.unique(inside)
        step = float(np.diff(grid).min()) if grid.size > 1 else 0.0
        if 0 < step and (z_hi - z_lo) / step <= 60:  # quantized timings: one bin per timer tick
            bins = np.arange(z_lo - step / 2, z_hi + step, step)
        else:
            bins = np.linspace(z_lo, z_hi, 31)
        zc, ze = np.histogram(inside, bins=bins)
        zoom.stairs(zc, ze, fill=True, color="#bbbbbb")
        for x, label, color, style in marks:
            handles.append(full.axvline(x / US, color=color, ls=style, lw=1.6, label=label))
            if z_lo <= x / US <= z_hi:
                zoom.axvline(x / US, color=color, ls=style, lw=1.6)
        full.set_xlim(min(lo, m.min_s / US) / 1.3, max(hi, m.mean_s / US) * 1.3)
        zoom.set_xlim(z_lo, z_hi)
        full.set_xlabel("time per repetition (µs, log scale)")
        zoom.set_xlabel("the cluster (µs, linear)")
        full.set_ylabel("repetitions")
        fig.suptitle(title, fontsize=8)
        figures.legend(full, handles, loc="upper center", bbox_to_anchor=(1.1, -0.2), ncol=3, fontsize=7,
                       frameon=False)
    return figures.show(fig)


def sig_ratio(x: float, true: float) -> str:
    """``x`` against ``true`` as a short label: '1.00x the truth'."""
    from lib.units import fmt_ratio

    return f"{fmt_ratio(x / true)} the truth"
