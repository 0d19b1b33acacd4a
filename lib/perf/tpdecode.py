"""The tensor-parallel decode step: where its milliseconds go and why TP8 is not 8x faster.

One decode step on each of ``tp`` GPUs is modelled as a sum of buckets (seconds):

- ``weights``, ``kv_cache``: bytes the GPU must read / datasheet HBM bandwidth (the floor);
- ``weight_bandwidth_shortfall``, ``kv_bandwidth_shortfall``: the same bytes at the achieved
  fraction of bandwidth minus the floor, ``t x (1 / efficiency - 1)``;
- ``allreduce_latency``, ``allreduce_bandwidth``: ``n_ar`` all-reduces, each
  ``alpha(n) + 2 (n - 1) / n x message bytes / (link bytes/s x link efficiency)``;
- ``small_kernels``: kernels whose bytes are negligible (norms, rotary, KV write, activation),
  each a fixed GPU time;
- ``launch_gaps``: idle GPU time between consecutive kernels, per kernel;
- ``sampling``, ``scheduler``: per-step host work on the critical path;
- ``compute_excess``: FLOP time beyond the (achieved) memory time, if any.

Only the first four shrink with ``tp``; the rest do not (the all-reduces even grow), which
is why the speedup curve bends. Defaults come from ``data/assumptions.yaml``.
SI units inside: bytes, seconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.perf.collectives import ring_allreduce_bytes_per_gpu
from lib.perf.roofline import weight_bytes_read_per_step
from lib.registry.data import load_yaml
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.units import US

ALLREDUCE_ALGORITHMS = ("nccl-ring-ll", "one-shot", "network")
LEVELS = ("optimistic", "central", "pessimistic")
BUCKETS = (
    "weights",
    "kv_cache",
    "weight_bandwidth_shortfall",
    "kv_bandwidth_shortfall",
    "allreduce_latency",
    "allreduce_bandwidth",
    "small_kernels",
    "launch_gaps",
    "sampling",
    "scheduler",
    "compute_excess",
)


def _assumptions_doc() -> dict:
    """TRANSITIONAL: the old serving_assumptions keys mapped onto data/assumptions.yaml
    (this module is being folded into lib.perf.step)."""
    doc = load_yaml("assumptions.yaml")
    ds, co = doc["decode_step"], doc["collectives"]
    return {
        **{k: ds[k] for k in ("gemm_kernels_per_layer", "small_kernels_per_layer",
                              "attention_kernels_per_layer", "allreduces_per_layer",
                              "gemv_bandwidth_efficiency", "attention_kv_bandwidth_efficiency",
                              "launch_gap_us", "sampling_us", "scheduler_us")},
        "kernels_per_step": {"value": 3 + ds["sampling_kernels"]["value"]},
        "small_kernel_us": ds["kernel_fixed_us"],
        "eager_launch_gap_us": ds["eager_launch_us"],
        "allreduce_nccl_ring_ll": co["nvlink"]["ring_ll"],
        "allreduce_one_shot": co["nvlink"]["one_shot"],
        "allreduce_network": {"value_us": co["network"]["allreduce_latency_us"]["value"]},
        "allreduce_link_efficiency": co["nvlink"]["bus_efficiency"],
    }


# ---- all-reduce latency per call -----------------------------------------------------------


def allreduce_latency_s(n_gpus: int, algorithm: str = "nccl-ring-ll") -> float:
    """Latency term alpha(n) of one small all-reduce over ``n_gpus``, seconds.

    - ``nccl-ring-ll``: NCCL's cost model, alpha = base + 2 (n - 1) x per_step
      (6.6 us + 0.6 us per ring step: 15.0 us at n = 8);
    - ``one-shot``: measured one-shot custom kernel on H100 (4.5 / 4.8 / 7.8 us at 2 / 4 / 8),
      linear in n between and beyond the measured points;
    - ``network``: flat 46 us per call for a group that spans nodes over InfiniBand.

    One GPU: 0 (no communication).
    """
    n_gpus = integer("n_gpus", n_gpus, 1)
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(
            f"algorithm must be one of {', '.join(ALLREDUCE_ALGORITHMS)}; got {algorithm!r}"
        )
    if n_gpus == 1:
        return 0.0
    doc = _assumptions_doc()
    if algorithm == "nccl-ring-ll":
        a = doc["allreduce_nccl_ring_ll"]
        return (a["base_us"] + 2 * (n_gpus - 1) * a["per_step_us"]) * US
    if algorithm == "network":
        return doc["allreduce_network"]["value_us"] * US
    pts = doc["allreduce_one_shot"]
    xs, ys = pts["tp"], pts["us"]
    if n_gpus <= xs[0]:
        return ys[0] * US
    for (x0, y0), (x1, y1) in zip(
        zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False
    ):
        if n_gpus <= x1:
            return (y0 + (y1 - y0) * (n_gpus - x0) / (x1 - x0)) * US
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return (ys[-1] + slope * (n_gpus - xs[-1])) * US


# ---- assumptions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepAssumptions:
    """Everything about a decode step that is not the model, chip or workload. SI units."""

    gemv_efficiency: float
    kv_efficiency: float
    small_kernel_s: float
    launch_gap_s: float
    sampling_s: float
    scheduler_s: float
    link_efficiency: float
    gemm_kernels_per_layer: int
    small_kernels_per_layer: int
    attention_kernels_per_layer: int
    allreduces_per_layer: int
    kernels_per_step: int
    allreduce_algorithm: str = "nccl-ring-ll"
    allreduce_latency_override_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("gemv_efficiency", "kv_efficiency", "link_efficiency"):
            fraction(name, getattr(self, name), allow_zero=False)
        for name in ("small_kernel_s", "launch_gap_s", "sampling_s", "scheduler_s"):
            real(name, getattr(self, name), 0)
        for name in (
            "gemm_kernels_per_layer",
            "small_kernels_per_layer",
            "attention_kernels_per_layer",
            "allreduces_per_layer",
            "kernels_per_step",
        ):
            object.__setattr__(self, name, integer(name, getattr(self, name), 0))
        if self.allreduce_algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(
                f"allreduce_algorithm must be one of {', '.join(ALLREDUCE_ALGORITHMS)}; "
                f"got {self.allreduce_algorithm!r}"
            )
        if self.allreduce_latency_override_s is not None:
            real("allreduce_latency_override_s", self.allreduce_latency_override_s, 0)

    def replace(self, **changes) -> StepAssumptions:
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown assumption(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    @property
    def kernels_per_layer(self) -> int:
        """Every kernel a layer launches, all-reduces included."""
        return (
            self.gemm_kernels_per_layer
            + self.small_kernels_per_layer
            + self.attention_kernels_per_layer
            + self.allreduces_per_layer
        )

    def allreduce_alpha_s(self, n_gpus: int) -> float:
        """alpha(n) for this stack: the override if set (flat), else the algorithm's model."""
        if n_gpus == 1:
            return 0.0
        if self.allreduce_latency_override_s is not None:
            return self.allreduce_latency_override_s
        return allreduce_latency_s(n_gpus, self.allreduce_algorithm)


def assumptions(level: str = "central") -> StepAssumptions:
    """Step assumptions from ``data/assumptions.yaml``.

    ``central``: the values; ``optimistic``: the fast end of every range and the one-shot
    all-reduce; ``pessimistic``: the slow end, NCCL ring all-reduce.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}; got {level!r}")
    d = _assumptions_doc()

    def pick(key: str, fast: str, slow: str) -> float:
        entry = d[key]
        return (
            entry["value"] if level == "central" else entry[fast if level == "optimistic" else slow]
        )

    return StepAssumptions(
        gemv_efficiency=pick("gemv_bandwidth_efficiency", "high", "low"),
        kv_efficiency=pick("attention_kv_bandwidth_efficiency", "high", "low"),
        small_kernel_s=pick("small_kernel_us", "low", "high") * US,
        launch_gap_s=pick("launch_gap_us", "low", "high") * US,
        sampling_s=pick("sampling_us", "low", "high") * US,
        scheduler_s=pick("scheduler_us", "low", "high") * US,
        link_efficiency=d["allreduce_link_efficiency"]["value"],
        gemm_kernels_per_layer=d["gemm_kernels_per_layer"]["value"],
        small_kernels_per_layer=d["small_kernels_per_layer"]["value"],
        attention_kernels_per_layer=d["attention_kernels_per_layer"]["value"],
        allreduces_per_layer=d["allreduces_per_layer"]["value"],
        kernels_per_step=d["kernels_per_step"]["value"],
        allreduce_algorithm="one-shot" if level == "optimistic" else "nccl-ring-ll",
    )


def eager_launch_gap_s() -> float:
    """Idle GPU time per kernel when kernels are launched eagerly (no CUDA graph), seconds."""
    return _assumptions_doc()["eager_launch_gap_us"]["value"] * US


# ---- the step ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeStep:
    """One decode step on one of ``tp`` GPUs, bucket by bucket (seconds) with its counts."""

    model: str
    gpu: str
    tp: int
    batch: int
    context: int
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    message_bytes: float
    n_kernels: int
    n_small_kernels: int
    n_allreduces: int
    buckets: dict
    kv_copies: float = 1.0  # ranks holding each KV byte: 1 when split, > 1 when replicated

    def __getitem__(self, name: str) -> float:
        return self.buckets[name]

    @property
    def total_s(self) -> float:
        return sum(self.buckets.values())

    @property
    def floor_s(self) -> float:
        """Bytes this GPU reads / datasheet bandwidth (replicated KV included): the read floor."""
        return self.buckets["weights"] + self.buckets["kv_cache"]

    @property
    def mbu_floor_s(self) -> float:
        """The MBU = 100% step time: each KV byte counted once across the TP group."""
        return self.buckets["weights"] + self.buckets["kv_cache"] / self.kv_copies

    @property
    def sharded_s(self) -> float:
        """The reads and their bandwidth shortfall: 1 / tp of TP1's, except KV that is replicated
        (tp above the KV heads, or MLA's latent on every rank)."""
        b = self.buckets
        return (
            b["weights"]
            + b["kv_cache"]
            + b["weight_bandwidth_shortfall"]
            + b["kv_bandwidth_shortfall"]
        )

    @property
    def fixed_s(self) -> float:
        """Everything that does not shrink with tp (all-reduces, kernels, host, compute excess)."""
        return self.total_s - self.sharded_s

    @property
    def allreduce_s(self) -> float:
        return self.buckets["allreduce_latency"] + self.buckets["allreduce_bandwidth"]

    @property
    def kernel_overhead_s(self) -> float:
        """Small-kernel execution plus launch gaps: the per-kernel tax."""
        return self.buckets["small_kernels"] + self.buckets["launch_gaps"]

    @property
    def mbu(self) -> float:
        """Model bandwidth utilization of this step: MBU floor (unique bytes) / total."""
        return self.mbu_floor_s / self.total_s


def kv_read_fraction(mdl: str | Model, tp: int) -> float:
    """Share of the KV cache one rank reads: 1 / tp, or 1 / KV heads once tp exceeds them; 1 for MLA.

    Same rule as :func:`lib.perf.roofline.kv_shard_fraction`, without requiring tp to divide the
    heads (used for the idealized even split of non-divisor TP degrees).
    """
    m = model(mdl)
    tp = integer("tp", tp, 1)
    if m.is_mla:
        return 1.0
    return max(1.0 / tp, 1.0 / m.num_kv_heads)


def tp_divides(mdl: str | Model, tp: int) -> bool:
    """Whether a real engine can shard ``mdl`` ``tp`` ways: tp divides the query heads, and the
    KV heads divide by tp or tp by the KV heads (vLLM's rule)."""
    m = model(mdl)
    tp = integer("tp", tp, 1)
    kv = m.num_kv_heads
    return m.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def decode_step(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    batch: int = 1,
    context: int = 0,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    stack: StepAssumptions | None = None,
    strict: bool = True,
) -> DecodeStep:
    """Model one decode step of ``batch`` sequences at ``context`` tokens on each of ``tp`` GPUs.

    weights  = weight bytes read (MoE: experts the batch touches) / tp / W
    kv_cache = batch x context x KV bytes/token x read fraction / W
    shortfalls = each of those x (1 / efficiency - 1)
    allreduce  = L x ar_per_layer x [alpha(tp) + 2 (tp - 1) / tp x batch x d x b_act / (B_link x eta_link)]
    small_kernels = (L x small_per_layer) x t_small;  launch_gaps = (L x kernels_per_layer + extra) x t_gap
    sampling, scheduler: per step; compute_excess = max(0, FLOP time - achieved memory time).

    ``strict=True`` rejects TP degrees a real engine cannot shard; ``strict=False`` prices the
    idealized even split (used to draw the curve over every degree). The link is NVLink, or the
    NIC when the stack's all-reduce algorithm is ``network``.
    """
    m, g = model(mdl), gpu(chip)
    stack = stack or assumptions()
    tp = integer("tp", tp, 1)
    batch = integer("batch", batch, 1)
    context = integer("context", context, 0)
    if strict and not tp_divides(m, tp):
        raise ValueError(
            f"tp={tp} cannot shard {m.key}: it must divide the {m.num_attention_heads} query heads "
            f"and divide or be a multiple of the {m.num_kv_heads} KV heads"
        )
    link = g.scaleout_bandwidth if stack.allreduce_algorithm == "network" else g.scaleup_bandwidth
    if tp > 1 and not link:
        kind = "network" if stack.allreduce_algorithm == "network" else "NVLink-class"
        raise ValueError(
            f"{g.name} has no {kind} link in data/hardware.yaml; pick tp=1 or another GPU"
        )
    bw = g.memory_bandwidth
    weight_bytes = weight_bytes_read_per_step(m, batch, weight_dtype) / tp
    kv_bytes = batch * context * m.kv_bytes_per_token(kv_dtype) * kv_read_fraction(m, tp)
    weights_s, kv_s = weight_bytes / bw, kv_bytes / bw
    message = batch * m.hidden_size * bytes_per_element(act_dtype)
    n_ar = m.num_layers * stack.allreduces_per_layer if tp > 1 else 0
    alpha = stack.allreduce_alpha_s(tp)
    ar_bw = (
        ring_allreduce_bytes_per_gpu(message, tp) / (link * stack.link_efficiency)
        if tp > 1
        else 0.0
    )
    n_small = m.num_layers * stack.small_kernels_per_layer
    n_kernels = m.num_layers * (
        stack.kernels_per_layer - (0 if tp > 1 else stack.allreduces_per_layer)
    )
    n_kernels += stack.kernels_per_step
    memory_achieved = weights_s / stack.gemv_efficiency + kv_s / stack.kv_efficiency
    compute_s = (
        batch
        * m.flops_per_token(context)
        / tp
        / g.peak_flops(act_dtype if act_dtype in g.dtypes else "bf16")
    )
    buckets = {
        "weights": weights_s,
        "kv_cache": kv_s,
        "weight_bandwidth_shortfall": weights_s * (1 / stack.gemv_efficiency - 1),
        "kv_bandwidth_shortfall": kv_s * (1 / stack.kv_efficiency - 1),
        "allreduce_latency": n_ar * alpha,
        "allreduce_bandwidth": n_ar * ar_bw,
        "small_kernels": n_small * stack.small_kernel_s,
        "launch_gaps": n_kernels * stack.launch_gap_s,
        "sampling": stack.sampling_s,
        "scheduler": stack.scheduler_s,
        "compute_excess": max(0.0, compute_s - memory_achieved),
    }
    return DecodeStep(
        m.key,
        g.key,
        tp,
        batch,
        context,
        weight_bytes,
        kv_bytes,
        message,
        n_kernels,
        n_small,
        n_ar,
        buckets,
        kv_read_fraction(m, tp) * tp,
    )


# ---- scaling over TP degree ---------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedupPoint:
    """One TP degree on the speedup curve."""

    tp: int
    step_s: float
    speedup: float
    efficiency: float  # speedup / tp
    divides: bool  # a real engine can shard the model this way
    fits: bool  # weights / tp fit in one GPU's memory


def speedup_curve(
    mdl: str | Model,
    chip: str | GPU,
    degrees=range(1, 9),
    batch: int = 1,
    context: int = 0,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    stack: StepAssumptions | None = None,
    reference: DecodeStep | None = None,
) -> list[SpeedupPoint]:
    """Step time and speedup at each TP degree, against ``reference`` (default: TP1 on ``chip``).

    speedup(n) = T_ref / T(n); efficiency = speedup / n. Non-divisor degrees use the idealized
    even split (``divides`` is False); a TP1 reference on a card that cannot hold the model is
    hypothetical (check ``fits``).
    """
    m, g = model(mdl), gpu(chip)
    degrees = list(degrees)
    if not degrees:
        raise ValueError("degrees must list at least one TP degree")
    ref = reference or decode_step(
        m, g, 1, batch, context, weight_dtype, kv_dtype, stack=stack, strict=False
    )
    out = []
    for n in degrees:
        step = decode_step(
            m, g, n, batch, context, weight_dtype, kv_dtype, stack=stack, strict=False
        )
        fits = m.weight_bytes(weight_dtype) / n <= g.memory_bytes
        speedup = ref.total_s / step.total_s
        out.append(SpeedupPoint(n, step.total_s, speedup, speedup / n, tp_divides(m, n), fits))
    return out


def comm_crossover_tp(
    mdl: str | Model,
    chip: str | GPU,
    batch: int = 1,
    weight_dtype: str = "bf16",
    stack: StepAssumptions | None = None,
) -> float:
    """TP degree (real number) at which the all-reduce latency equals the achieved weight read.

    W / (n x eta x BW) = N_ar x alpha(n). Flat alpha: n* = W / (eta BW N_ar alpha).
    NCCL ring (alpha = a + 2c (n - 1)): the positive root of
    2 c N_ar n^2 + N_ar (a - 2c) n - W / (eta BW) = 0.
    Past n* adding GPUs buys less than the latency it costs. One-shot: solved numerically.
    """
    m, g = model(mdl), gpu(chip)
    stack = stack or assumptions()
    t_w = weight_bytes_read_per_step(m, batch, weight_dtype) / (
        stack.gemv_efficiency * g.memory_bandwidth
    )
    n_ar = m.num_layers * stack.allreduces_per_layer
    if n_ar == 0:
        raise ValueError("allreduces_per_layer is 0: there is no crossover")
    if stack.allreduce_latency_override_s is not None or stack.allreduce_algorithm == "network":
        alpha = stack.allreduce_alpha_s(2)
        if alpha == 0:
            raise ValueError("all-reduce latency is 0: there is no crossover")
        return t_w / (n_ar * alpha)
    if stack.allreduce_algorithm == "nccl-ring-ll":
        d = _assumptions_doc()["allreduce_nccl_ring_ll"]
        a, c = d["base_us"] * US, d["per_step_us"] * US
        qa, qb, qc = 2 * c * n_ar, n_ar * (a - 2 * c), -t_w
        return (-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa)
    lo, hi = 1.0, 1e6  # one-shot: alpha piecewise linear in n, increasing; bisection on f(n)

    def f(n: float) -> float:
        k = max(2, math.floor(n))
        frac = n - k
        alpha = (
            allreduce_latency_s(k, "one-shot") * (1 - frac)
            + allreduce_latency_s(k + 1, "one-shot") * frac
        )
        return t_w / n - n_ar * alpha

    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return lo


# ---- plots ------------------------------------------------------------------------------------

_COLORS = {
    "weights": "#1f77b4",
    "kv_cache": "#6baed6",
    "weight_bandwidth_shortfall": "#9ecae1",
    "kv_bandwidth_shortfall": "#c6dbef",
    "allreduce_latency": "#d62728",
    "allreduce_bandwidth": "#ff9896",
    "small_kernels": "#ff7f0e",
    "launch_gaps": "#ffbb78",
    "sampling": "#2ca02c",
    "scheduler": "#98df8a",
    "compute_excess": "#9467bd",
}


def plot_step_stack(steps: dict, ax=None, unit_s: float = 1e-3):
    """Horizontal stacked bars, one per labelled :class:`DecodeStep`; returns the Figure."""
    from lib.book.svgplot import Figure

    if ax is None:
        fig = Figure(figsize=(6.5, 0.5 * len(steps) + 1.5))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    labels = list(steps)
    seen: set[str] = set()
    for i, label in enumerate(labels):
        left = 0.0
        for name in BUCKETS:
            v = steps[label][name] / unit_s
            if v <= 0:
                continue
            ax.barh(
                [i],
                [v],
                left=left,
                color=_COLORS[name],
                label=None if name in seen else name.replace("_", " "),
            )
            seen.add(name)
            left += v
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per decode step" if unit_s == 1e-3 else "time")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles, names, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.subplots_adjust(left=0.2, bottom=0.42)
    return fig


def plot_speedup(curve: list[SpeedupPoint], ax=None, label: str = "modelled"):
    """Speedup against TP degree with the ideal line; deployable degrees filled. Returns the Figure."""
    from lib.book.svgplot import Figure

    if ax is None:
        fig = Figure(figsize=(5.0, 3.25))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    xs = [p.tp for p in curve]
    ax.plot(xs, xs, color="grey", ls="--", lw=1, label="ideal (n x)")
    ax.plot(xs, [p.speedup for p in curve], color="#d62728", lw=1.5, label=label)
    for p in curve:
        ax.plot([p.tp], [p.speedup], "o", color="#d62728", mfc="#d62728" if p.divides else "white")
    ax.set_xlabel("tensor-parallel degree n")
    ax.set_ylabel("speedup over TP1")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig
