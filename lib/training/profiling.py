"""Profiling a training step: a synthetic measurement, the gap to the step model, and who owns it.

A real job's step is measured (wall clock per step, plus per-rank counters: time blocked on the
data iterator, GEMM and memory-bound kernel time, tensor-core and HBM activity, time inside NCCL
kernels). This module makes such a measurement *deterministically* from the book's one step model
(:func:`lib.training.step.training_step`) plus injected causes (:class:`Causes`), so a page can show
the reading procedure and a test can hold that the procedure finds each cause.

The synthetic world (:func:`measure_step`):

* every rank r runs its kernels at pace ``p_r = s_r (1 + jitter z_r)`` (``s_r`` the straggler
  slow-down on the slow ranks, 1 elsewhere; ``z_r`` standard normal, seeded); GEMMs take
  ``gemm_slowdown`` times the modelled time, memory-bound kernels ``hbm_slowdown`` times;
* the job is synchronous (TP every layer, PP every micro-batch, DP every step), so it runs at the
  slowest rank's pace ``P = max_r p_r``: the critical path is the step model re-run with
  ``gemm_efficiency / (gemm_slowdown P)`` and ``nonmatmul_overhead x hbm_slowdown / gemm_slowdown``
  (bubble and DP overlap follow from the model itself);
* exposed communication (TP, CP, EP, pipeline sends, DP) takes ``network_slowdown`` times the
  critical path's; the host blocks ``loader_s`` per step on the data iterator (the GPU idles),
  and leaves the GPU idle ``host_gap_s`` more between kernels (launch-bound host code: no counter
  below sees it); ``grad_overlap=False`` reduces the gradients only after the backward ends (the
  step model with ``dp_overlap = 0``); the optimizer moves ``optimizer_slowdown`` times the bytes
  of a fused Adam (an unfused, per-tensor implementation);
* per rank: GEMM and memory-bound kernel time at its own pace; whatever of the step is not loader
  wait, own kernels, bubble or optimizer is time inside collectives (a fast rank waits there for
  the slowest one: a straggler shows up as collective time on every *other* rank).

The attribution (:func:`attribute_gap`) reads one metric per suspect, in the isolation order
``SUSPECTS`` (module docstring of the page: cheapest and least ambiguous first), and prices each
in seconds of step time; what no metric explains is the residual.

SI units: seconds, FLOP, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lib.inputs import integer, real
from lib.registry import assumptions
from lib.training.step import (
    TrainingAssumptions,
    TrainingLayout,
    TrainingStep,
    training_assumptions,
    training_step,
)

__all__ = ["CAUSE_FIELDS", "LANES", "SUSPECTS", "TIMELINE_CAUSES", "TRACE_KINDS", "StepTrace", "TimelineReading", "TraceEvent", "read_timeline", "step_trace", "Causes", "GapAttribution", "StepMeasurement", "attribute_gap", "cause_costs",
           "exposed_comm_s", "measure_step", "memory_bound_efficiency"]

SUSPECTS = ("dataloader", "tensor cores", "HBM", "collectives", "one machine")
# the field of :class:`Causes` each suspect owns; "host gaps" (GPU idle between kernels while the host
# launches them) is a cause none of the five counters sees: it stays in the residual (a timeline shows it)
CAUSE_FIELDS = {"dataloader": "loader_s", "tensor cores": "gemm_slowdown", "HBM": "hbm_slowdown",
                "collectives": "network_slowdown", "one machine": "straggler_slowdown", "host gaps": "host_gap_s",
                "no grad overlap": "grad_overlap", "optimizer": "optimizer_slowdown"}


@dataclass(frozen=True)
class Causes:
    """What is wrong with the measured job (1.0 / 0 = nothing): see the module docstring.

    ``straggler_gpus`` consecutive ranks from ``straggler_rank`` (one node's GPUs, when they share
    one) run ``straggler_slowdown`` times slower; ``jitter`` is the relative standard deviation of
    every rank's kernel time (seeded by ``seed``)."""

    loader_s: float = 0.0
    host_gap_s: float = 0.0
    gemm_slowdown: float = 1.0
    hbm_slowdown: float = 1.0
    network_slowdown: float = 1.0
    straggler_slowdown: float = 1.0
    straggler_rank: int = 0
    straggler_gpus: int = 1
    jitter: float = 0.0
    seed: int = 0
    grad_overlap: bool = True
    optimizer_slowdown: float = 1.0

    def __post_init__(self) -> None:
        real("loader_s", self.loader_s, 0, 60, unit="seconds")
        real("host_gap_s", self.host_gap_s, 0, 60, unit="seconds")
        for name in ("gemm_slowdown", "hbm_slowdown", "network_slowdown", "straggler_slowdown"):
            real(name, getattr(self, name), 1.0, 5.0)
        integer("straggler_rank", self.straggler_rank, 0)
        integer("straggler_gpus", self.straggler_gpus, 1)
        real("jitter", self.jitter, 0, 0.1)
        integer("seed", self.seed, 0)
        if not isinstance(self.grad_overlap, bool):
            raise ValueError(f"grad_overlap must be True or False, got {self.grad_overlap!r}")
        real("optimizer_slowdown", self.optimizer_slowdown, 1.0, 50.0)

    def only(self, suspect: str) -> Causes:
        """These causes with every suspect but ``suspect`` switched off (jitter and seed kept)."""
        if suspect not in CAUSE_FIELDS:
            raise ValueError(f"suspect must be one of {', '.join(CAUSE_FIELDS)}; got {suspect!r}")
        keep = (CAUSE_FIELDS[suspect],)
        base = Causes(straggler_rank=self.straggler_rank, straggler_gpus=self.straggler_gpus, jitter=self.jitter,
                      seed=self.seed)
        return replace(base, **{k: getattr(self, k) for k in keep})


def exposed_comm_s(st: TrainingStep) -> float:
    """Communication on the critical path of a modelled step: exposed TP + CP + EP + pipeline
    sends + DP, seconds (the buckets of :attr:`TrainingStep.buckets` that are communication)."""
    return st.tp_exposed_s + st.cp_exposed_s + st.ep_exposed_s + st.p2p_exposed_s + st.dp_exposed_s


@dataclass(frozen=True)
class StepMeasurement:
    """One synthetic measured step: the step time (synchronous: the same on every rank) and
    per-rank counters (arrays of length n_gpus), seconds unless named otherwise."""

    layout: TrainingLayout
    causes: Causes
    step_s: float
    loader_s: np.ndarray
    gemm_s: np.ndarray  # GEMM kernel time (recompute included)
    mem_s: np.ndarray  # memory-bound kernel time
    comm_s: np.ndarray  # inside NCCL kernels (exposed), waiting included
    bubble_s: float  # pipeline idle (same on every rank here)
    optimizer_s: float
    tensor_active: np.ndarray  # achieved GEMM FLOP/s / dense peak while GEMMs run
    hbm_active: np.ndarray  # achieved / datasheet HBM bandwidth while memory-bound kernels run
    critical: TrainingStep = field(repr=False)  # the step model at the slowest rank's pace

    @property
    def busy_s(self) -> np.ndarray:
        """Per-rank kernel time (GEMM + memory-bound): the spread metric's input."""
        return self.gemm_s + self.mem_s

    @property
    def mfu(self) -> float:
        return self.critical.model_flops_per_gpu / (self.layout.chip.peak_flops(self.layout.dtype) * self.step_s)


def _paces(n: int, c: Causes) -> np.ndarray:
    pace = np.ones(n)
    if c.straggler_slowdown > 1.0:
        if c.straggler_rank + c.straggler_gpus > n:
            raise ValueError(f"straggler ranks {c.straggler_rank}..{c.straggler_rank + c.straggler_gpus - 1} must lie "
                             f"in the job's {n:,} ranks (0..{n - 1})")
        pace[c.straggler_rank:c.straggler_rank + c.straggler_gpus] = c.straggler_slowdown
    if c.jitter > 0:
        z = np.random.default_rng(c.seed).standard_normal(n)
        pace = pace * np.clip(1.0 + c.jitter * z, 0.5, None)
    return pace


def memory_bound_efficiency() -> float:
    """Achieved / datasheet HBM bandwidth the modelled memory-bound kernels stream at (the book's
    streaming-kernel efficiency, ``decode_step.gemv_bandwidth_efficiency``): the baseline of the
    HBM counter."""
    return float(assumptions.value("decode_step.gemv_bandwidth_efficiency"))


def measure_step(layout: TrainingLayout, causes: Causes | None = None,
                 assume: TrainingAssumptions | None = None) -> StepMeasurement:
    """A deterministic synthetic measurement of one step of ``layout`` with ``causes`` (module
    docstring). With no causes it equals the model: ``step_s == training_step(layout).step_s``."""
    if not isinstance(layout, TrainingLayout):
        raise ValueError(f"layout must be a TrainingLayout, got {type(layout).__name__}")
    c = causes or Causes()
    a = assume or training_assumptions()
    n = layout.n_gpus
    pace = _paces(n, c)
    worst = float(pace.max())
    g, h = c.gemm_slowdown, c.hbm_slowdown
    crit_a = replace(a, gemm_efficiency=a.gemm_efficiency / (g * worst),
                     nonmatmul_overhead=a.nonmatmul_overhead * h / g,
                     dp_overlap=a.dp_overlap if c.grad_overlap else 0.0,
                     optimizer_bytes_per_param=a.optimizer_bytes_per_param * c.optimizer_slowdown)
    crit = training_step(layout, crit_a)
    comm = exposed_comm_s(crit) * c.network_slowdown
    step = c.loader_s + c.host_gap_s + crit.step_s + comm - exposed_comm_s(crit)
    gemm = crit.matmul_s * pace / worst
    mem = crit.nonmatmul_s * pace / worst
    loader = np.full(n, c.loader_s)
    comm_r = step - loader - c.host_gap_s - gemm - mem - crit.bubble_s - crit.optimizer_s
    peak = layout.chip.peak_flops(layout.dtype)
    tensor = crit.hardware_flops_per_gpu / (peak * gemm)
    base_mem = training_step(layout, a).nonmatmul_s
    hbm = memory_bound_efficiency() * base_mem / mem
    return StepMeasurement(layout, c, step, loader, gemm, mem, comm_r, crit.bubble_s, crit.optimizer_s,
                           tensor, hbm, crit)


@dataclass(frozen=True)
class GapAttribution:
    """The gap between a measured and a modelled step, split by suspect (seconds of step time).

    ``metrics[suspect] = (metric, modelled, measured)``; ``parts[suspect]`` the seconds that
    metric explains; ``residual_s`` what none does; ``slow_ranks`` the ranks the spread flags."""

    predicted_s: float
    measured_s: float
    parts: dict[str, float]
    metrics: dict[str, tuple[str, float, float]]
    slow_ranks: tuple[int, ...]
    node_gpus: int
    flag_ratio: float  # kernel time over the median above which a rank is flagged slow

    @property
    def gap_s(self) -> float:
        return self.measured_s - self.predicted_s

    @property
    def residual_s(self) -> float:
        r = self.gap_s - sum(self.parts.values())
        return 0.0 if abs(r) < 1e-9 * self.measured_s else r  # rounding, not idle time

    @property
    def top(self) -> str:
        """The suspect that explains the most step time."""
        return max(self.parts, key=lambda k: self.parts[k])

    def found(self, min_share: float = 0.1) -> tuple[str, ...]:
        """Suspects, largest first, each worth at least ``min_share`` of the gap (none if no gap)."""
        if self.gap_s <= 1e-9 * self.predicted_s:  # no gap (rounding aside)
            return ()
        return tuple(k for k in sorted(self.parts, key=lambda k: -self.parts[k])
                     if self.parts[k] >= min_share * self.gap_s)

    @property
    def slow_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({r // self.node_gpus for r in self.slow_ranks}))


def attribute_gap(predicted: TrainingStep, measured: StepMeasurement, spread_sigmas: float = 6.0) -> GapAttribution:
    """Split ``measured.step_s - predicted.step_s`` over :data:`SUSPECTS`, one metric each, read
    on the median rank (a healthy one) unless said otherwise. The kernel suspects are priced by
    re-running the step model with what the counters measured, so the pipeline bubble and the DP
    overlap move as the model says they do; in this order (an interaction goes to the later one):

    * dataloader: seconds blocked on the data iterator (modelled: 0);
    * tensor cores: GEMM time g = measured / modelled (tensor-core activity while GEMMs run falls
      by 1 / g): step(gemm_efficiency / g) - step;
    * HBM: memory-bound time h = measured / modelled (HBM throughput in them falls by 1 / h): the
      step with nonmatmul_overhead x h / g on top;
    * one machine: the slowest rank's kernel time over the median's, P: the step with
      gemm_efficiency / (g P) on top (the synchronous job runs at its slowest rank's pace);
    * collectives: time inside NCCL - that last step's exposed communication - the median rank's
      wait for the slowest one (max - median kernel time): what is left is the network's own.

    ``spread_sigmas``: a rank is flagged slow when its kernel time exceeds the median by that many
    robust standard deviations (1.4826 x MAD) and by 1%."""
    if not isinstance(predicted, TrainingStep) or not isinstance(measured, StepMeasurement):
        raise ValueError("attribute_gap takes a TrainingStep (the model) and a StepMeasurement")
    real("spread_sigmas", spread_sigmas, 0, low_open=True)
    lay, a = predicted.layout, predicted.assume
    med = {name: float(np.median(getattr(measured, name))) for name in ("loader_s", "gemm_s", "mem_s", "comm_s")}
    busy = measured.busy_s
    busy_med, busy_max = float(np.median(busy)), float(busy.max())
    g = med["gemm_s"] / predicted.matmul_s
    h = med["mem_s"] / predicted.nonmatmul_s if predicted.nonmatmul_s > 0 else 1.0
    p = busy_max / busy_med
    st_g = training_step(lay, replace(a, gemm_efficiency=min(1.0, a.gemm_efficiency / g),
                                      nonmatmul_overhead=a.nonmatmul_overhead / g))
    st_gh = training_step(lay, replace(st_g.assume, nonmatmul_overhead=min(5.0, a.nonmatmul_overhead * h / g)))
    st_ghp = training_step(lay, replace(st_gh.assume, gemm_efficiency=min(1.0, a.gemm_efficiency / (g * p))))
    pred_comm = exposed_comm_s(predicted)
    parts = {
        "dataloader": med["loader_s"],
        "tensor cores": st_g.step_s - predicted.step_s,
        "HBM": st_gh.step_s - st_g.step_s,
        "collectives": med["comm_s"] - exposed_comm_s(st_ghp) - (busy_max - busy_med),
        "one machine": st_ghp.step_s - st_gh.step_s,
    }
    noise = 1e-9 * measured.step_s  # rounding of the differences above, not a cost
    parts = {k: (0.0 if abs(v) < noise else v) for k, v in parts.items()}
    metrics = {
        "dataloader": ("seconds per step blocked on the data iterator", 0.0, med["loader_s"]),
        "tensor cores": ("tensor-core activity while GEMMs run (fraction of dense peak)", a.gemm_efficiency,
                         float(np.median(measured.tensor_active))),
        "HBM": ("HBM throughput in memory-bound kernels (fraction of datasheet)", memory_bound_efficiency(),
                float(np.median(measured.hbm_active))),
        "collectives": ("seconds per step inside NCCL kernels", pred_comm, med["comm_s"]),
        "one machine": ("slowest rank's kernel time / the median rank's", 1.0, p),
    }
    mad = 1.4826 * float(np.median(np.abs(busy - busy_med)))
    cut = busy_med + max(spread_sigmas * mad, 0.01 * busy_med)
    slow = tuple(int(r) for r in np.flatnonzero(busy > cut))
    return GapAttribution(predicted.step_s, measured.step_s, parts, metrics, slow, lay.node, cut / busy_med)


def cause_costs(layout: TrainingLayout, causes: Causes, assume: TrainingAssumptions | None = None) -> dict[str, float]:
    """The true cost of each injected cause alone: measured step with only that cause (jitter
    kept off) minus the modelled step, seconds by key of ``CAUSE_FIELDS`` (the five suspects and
    the host gaps). The oracle of :func:`attribute_gap` (it never reads a counter)."""
    base = training_step(layout, assume).step_s
    quiet = replace(causes, jitter=0.0)
    return {s: measure_step(layout, quiet.only(s), assume).step_s - base for s in CAUSE_FIELDS}


# ---- one step's timeline (N007) ------------------------------------------------------------------

LANES = ("host", "GPU compute", "GPU comm")
TRACE_KINDS = {  # kind -> lane
    "dataloader": "host", "python": "host",
    "forward": "GPU compute", "backward": "GPU compute", "tp": "GPU compute", "optimizer": "GPU compute",
    "pp": "GPU comm", "dp": "GPU comm",
}


@dataclass(frozen=True)
class TraceEvent:
    """One span of a step's timeline: ``kind`` (a key of :data:`TRACE_KINDS`) on its lane, seconds."""

    kind: str
    name: str
    start_s: float
    end_s: float

    @property
    def lane(self) -> str:
        return TRACE_KINDS[self.kind]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class StepTrace:
    """A synthetic trace of one step on pipeline stage 0 of the slowest rank (:func:`step_trace`)."""

    layout: TrainingLayout
    causes: Causes
    events: tuple[TraceEvent, ...]
    step_s: float
    model_flops_per_gpu: float
    peak_flops: float

    def lane(self, lane: str) -> list[TraceEvent]:
        if lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}; got {lane!r}")
        return [e for e in self.events if e.lane == lane]


def step_trace(layout: TrainingLayout, causes: Causes | None = None,
               assume: TrainingAssumptions | None = None) -> StepTrace:
    """The timeline of one step of ``layout`` with ``causes``, as three lanes (host, GPU compute
    stream, GPU communication stream), built from the buckets of the step that
    :func:`measure_step` takes as the critical path, so its length equals the measured step:

    * host: ``next(data_iter)`` for ``loader_s`` at the start (GPU idle); before each forward and
      backward, a launch-bound gap of ``host_gap_s / (2 m)`` (host busy in Python, GPU idle);
    * compute: 1F1B on stage 0 of ``pp``: min(pp, m) forwards, a wait for the first gradient
      ((pp - 1) / v backwards long), m - min(pp, m) backward-forward pairs, then the remaining
      backwards with a wait between each (the rest of the bubble); each forward or backward is its
      kernels (1/3 and 2/3 of a micro-batch's GEMM + memory-bound time) then its exposed TP
      collectives (2 of the 4, or 6 under full recompute, in the forward); the optimizer last;
    * comm: the pipeline waits (point-to-point receives, with the exposed sends), and the DP
      gradient reduction: its hidden part under the end of the backward, its exposed part after.

    Straggler and jitter are already in the critical step's pace; the trace is one rank's view."""
    c = causes or Causes()
    meas = measure_step(layout, c, assume)
    st, lay, net = meas.critical, layout, c.network_slowdown
    m, pp = lay.micro_batches, lay.pp
    kern = (st.matmul_s + st.nonmatmul_s) / m
    comm = (st.tp_exposed_s + st.cp_exposed_s + st.ep_exposed_s) * net / m
    fwd_share = 2 / (6 if lay.recompute == "full" else 4)
    f_k, b_k = kern / 3, 2 * kern / 3
    f_c, b_c = comm * fwd_share, comm * (1 - fwd_share)
    gap = c.host_gap_s / (2 * m)
    warm = min(pp, m)
    f_all, b_all = f_k + f_c + gap, b_k + b_c + gap
    bubble = st.bubble_s
    if warm > 1:
        first_wait = bubble * b_all / (f_all + b_all)
        cool_wait = (bubble - first_wait) / (warm - 1)
    else:
        first_wait, cool_wait = bubble, 0.0
    p2p = st.p2p_exposed_s * net
    ev: list[TraceEvent] = []
    t = 0.0
    if c.loader_s > 0:
        ev.append(TraceEvent("dataloader", "next(data_iter)", 0.0, c.loader_s))
        t = c.loader_s

    def run(kind: str, i: int, k_s: float, c_s: float) -> None:
        nonlocal t
        if gap > 0:
            ev.append(TraceEvent("python", "launch-bound host", t, t + gap))
            t += gap
        ev.append(TraceEvent(kind, f"{kind} {i}", t, t + k_s))
        t += k_s
        if c_s > 0:
            ev.append(TraceEvent("tp", f"TP collectives {i}", t, t + c_s))
            t += c_s

    def wait(d: float, name: str) -> None:
        nonlocal t
        if d > 0:
            ev.append(TraceEvent("pp", name, t, t + d))
            t += d

    for i in range(1, warm + 1):
        run("forward", i, f_k, f_c)
    wait(first_wait + p2p, "PP recv (bubble)")
    for i in range(1, m - warm + 1):
        run("backward", i, b_k, b_c)
        run("forward", warm + i, f_k, f_c)
    for j, i in enumerate(range(m - warm + 1, m + 1)):
        run("backward", i, b_k, b_c)
        if j < warm - 1:
            wait(cool_wait, "PP recv (bubble)")
    dp_total, dp_exposed = st.dp_s * net, st.dp_exposed_s * net
    if dp_total > 0:
        hidden = dp_total - dp_exposed
        ev.append(TraceEvent("dp", "DP gradient reduction", max(0.0, t - hidden), t + dp_exposed))
        t += dp_exposed
    if st.optimizer_s > 0:
        ev.append(TraceEvent("optimizer", "optimizer step", t, t + st.optimizer_s))
        t += st.optimizer_s
    return StepTrace(lay, c, tuple(ev), t, st.model_flops_per_gpu, lay.chip.peak_flops(lay.dtype))


TIMELINE_CAUSES = ("data loader stall", "host-bound launches", "gradient reduction exposed", "slow optimizer")


@dataclass(frozen=True)
class TimelineReading:
    """What :func:`read_timeline` found, in its reading order (seconds)."""

    step_s: float
    mfu: float
    ideal_s: float  # the step's model FLOPs at the dense peak
    gpu_idle_s: float  # compute stream empty
    idle_by: dict[str, float]  # idle time by what the host / comm lane was doing: dataloader, python, pp, dp, nothing
    dp_s: float
    dp_overlapped_s: float  # DP reduction time concurrent with backward kernels
    dp_exposed_s: float
    optimizer_s: float
    worth: dict[str, float]  # cause -> seconds above the model's expectation
    evidence: dict[str, str]

    @property
    def unaccounted_s(self) -> float:
        """Step time that is not model math at the dense peak."""
        return self.step_s - self.ideal_s

    def found(self, min_s: float = 0.0) -> tuple[str, ...]:
        """Causes worth more than ``min_s`` seconds (and more than 0.1% of the step), largest first."""
        cut = max(min_s, 1e-3 * self.step_s)
        return tuple(k for k in sorted(self.worth, key=lambda k: -self.worth[k]) if self.worth[k] > cut)


def _overlap(a0: float, a1: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for b0, b1 in spans)


def read_timeline(trace: StepTrace, predicted: TrainingStep) -> TimelineReading:
    """Read one step's trace in a fixed order against the model's ``predicted`` step:

    0. utilization: MFU = model FLOPs / (peak x step); the step minus its model math at peak is
       the time to account for;
    1. GPU idle: the gaps of the compute lane;
    2. host activity in the gaps: each idle second goes to what the host (``next(data_iter)``:
       loader; Python: launch-bound) or the comm lane (pipeline receive: the bubble; DP reduction:
       an exposed gradient reduction) was doing, else "nothing";
    3. overlap: the DP reduction's time under backward kernels versus after them; its exposed
       part minus the model's exposed DP (``predicted.dp_exposed_s``) is what the missing overlap costs;
    4. the optimizer: its span against the model's fused-Adam pass (bytes / HBM bandwidth).

    Reads only the events and the prediction (never the injected causes)."""
    if not isinstance(trace, StepTrace) or not isinstance(predicted, TrainingStep):
        raise ValueError("read_timeline takes a StepTrace and the model's TrainingStep")
    step = trace.step_s
    busy = sorted((e.start_s, e.end_s) for e in trace.lane("GPU compute"))
    idle: list[tuple[float, float]] = []
    t = 0.0
    for s0, s1 in busy:
        if s0 > t + 1e-15:
            idle.append((t, s0))
        t = max(t, s1)
    if step > t + 1e-15:
        idle.append((t, step))
    spans = {k: [(e.start_s, e.end_s) for e in trace.events if e.kind == k] for k in ("dataloader", "python", "pp", "dp")}
    idle_by = {k: 0.0 for k in (*spans, "nothing")}
    for a0, a1 in idle:
        left = a1 - a0
        for k in spans:
            got = min(left, _overlap(a0, a1, spans[k]))
            idle_by[k] += got
            left -= got
        idle_by["nothing"] += max(0.0, left)
    backward = [(e.start_s, e.end_s) for e in trace.events if e.kind == "backward"]
    dp_total = sum(e1 - e0 for e0, e1 in spans["dp"])
    dp_over = sum(_overlap(e0, e1, backward) for e0, e1 in spans["dp"])
    opt = sum(e.duration_s for e in trace.events if e.kind == "optimizer")
    ideal = trace.model_flops_per_gpu / trace.peak_flops
    worth = {
        "data loader stall": idle_by["dataloader"],
        "host-bound launches": idle_by["python"],
        "gradient reduction exposed": max(0.0, idle_by["dp"] - predicted.dp_exposed_s),
        "slow optimizer": max(0.0, opt - predicted.optimizer_s),
    }
    worth = {k: (v if v > 1e-9 * step else 0.0) for k, v in worth.items()}  # rounding of differences, not a cost
    n_py = len(spans["python"])
    evidence = {
        "data loader stall": f"GPU idle {idle_by['dataloader'] * 1e3:.1f} ms while the host sits in next(data_iter)",
        "host-bound launches": f"{n_py} gaps, {idle_by['python'] * 1e3:.1f} ms in all, with the host busy in Python "
                               "and no kernel queued",
        "gradient reduction exposed": (f"{dp_over / dp_total:.0%} of the {dp_total * 1e3:.1f} ms DP reduction runs under "
                                       f"backward kernels; {idle_by['dp'] * 1e3:.1f} ms after them with the GPU idle"
                                       if dp_total > 0 else "no DP reduction (one replica)"),
        "slow optimizer": f"{opt * 1e3:.1f} ms against {predicted.optimizer_s * 1e3:.1f} ms for a fused Adam's bytes "
                          "at HBM bandwidth",
    }
    return TimelineReading(step, trace.model_flops_per_gpu / (trace.peak_flops * step), ideal, sum(a1 - a0 for a0, a1 in idle),
                           idle_by, dp_total, dp_over, idle_by["dp"], opt, worth, evidence)
