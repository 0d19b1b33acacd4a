"""Model bandwidth utilization (MBU): its two operands, how a dashboard gets them wrong, and
how to split a measured MBU into buckets a profiler can confirm.

    MBU = (bytes the decode step must read) / step time / (GPUs x datasheet HBM bytes/s)

The numerator counts the weights the step reads (for MoE, only the experts the batch
touches) plus the KV cache it reads, each byte once however many tensor-parallel ranks hold
a replica; the step time is one decode step, not 1 / throughput; the denominator is the
datasheet bandwidth of every GPU in the replica, in the same byte unit as the numerator
(Databricks' definition, made precise). SI units: bytes, seconds, bytes/s.

The bytes here are counted from the parameters (the definition a dashboard should use); the
modelled step and its MBU (``DecodeStep.mbu = mbu_floor_s / total_s``) come from the one
decode-step model, :func:`lib.perf.step.decode_step`, which sums the same bytes kernel by
kernel: the two counts agree to a few parts per million (the step model leaves out the
embedding rows and norm weights, a few KB), which makes each a check on the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.book import figures
from lib.inputs import fraction, integer, real
from lib.perf.deployment import Deployment
from lib.perf.roofline import (
    kv_shard_fraction,
    lookup_bytes_read,
    weight_bytes_read_per_step,
    weight_bytes_streamed,
)
from lib.perf.step import DecodeStep
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import gpu
from lib.registry.models import Model, model
from lib.units import GB, GiB


def mbu(bytes_per_step: float, step_s: float, peak_bandwidth: float) -> float:
    """bytes / step_s / peak_bandwidth (all in bytes and seconds; peak is the whole replica's)."""
    real("bytes_per_step", bytes_per_step, 0)
    real("step_s", step_s, 0, low_open=True)
    real("peak_bandwidth", peak_bandwidth, 0, low_open=True)
    return bytes_per_step / step_s / peak_bandwidth


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step of a whole replica reads, and the wrong numerators next to them."""

    weights: (
        float  # weights the step reads (MoE: shared + attention + the experts the batch touches)
    )
    weights_all_experts: float  # as ``weights`` with every expert read (= weights for a dense model)
    kv: float  # KV-cache bytes read, each byte once
    kv_summed_over_ranks: float  # KV bytes summed over the TP ranks (replicas counted each time)

    @property
    def total(self) -> float:
        """The MBU numerator: weights + KV, unique bytes."""
        return self.weights + self.kv


def step_bytes(
    mdl: str | Model,
    batch: int,
    context: int,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> StepBytes:
    """Bytes of one decode step of ``batch`` sequences at ``context`` tokens on a TP-``tp`` replica.

    weights = weight_bytes_read_per_step (every weight once, the embedding table one row per
    sequence; MoE: expected experts touched, uniform routing); weights_all_experts = the same
    with every expert read (weight_bytes_streamed + the rows); kv = batch x context x KV bytes/token; summed over ranks = kv x tp x per-rank read fraction
    (MLA's latent is read by every rank; GQA heads are replicated once tp exceeds them).
    """
    m = model(mdl)
    batch, context = integer("batch", batch, 1), integer("context", context, 0)
    tp = integer("tp", tp, 1)
    kv = batch * context * m.kv_bytes_per_token(kv_dtype)
    return StepBytes(
        weights=weight_bytes_read_per_step(m, batch, weight_dtype),
        weights_all_experts=weight_bytes_streamed(m, weight_dtype)
        + lookup_bytes_read(m, batch, weight_dtype),
        kv=kv,
        kv_summed_over_ranks=kv * tp * kv_shard_fraction(m, tp),
    )


@dataclass(frozen=True)
class Scenario:
    """One real server: a replica of ``tp`` GPUs decoding ``batch`` sequences at ``context`` tokens."""

    model: str
    gpu: str
    tp: int
    batch: int
    context: int
    weight_dtype: str
    kv_dtype: str
    step_s: float  # measured time of one decode step
    busy_fraction: float = 1.0  # share of wall-clock time the replica spends in decode steps

    def __post_init__(self) -> None:
        _ = (
            model(self.model),
            gpu(self.gpu),
            bytes_per_element(self.weight_dtype),
            bytes_per_element(self.kv_dtype),
        )
        real("step_s", self.step_s, 0, low_open=True, unit="seconds")
        fraction("busy_fraction", self.busy_fraction, allow_zero=False)
        self.deployment  # noqa: B018 - a server that cannot exist (TP, weights that do not fit) is refused

    @property
    def deployment(self) -> Deployment:
        """The replica as a validated :class:`~lib.perf.deployment.Deployment`."""
        return Deployment(self.model, self.gpu, tp=self.tp, weight_dtype=self.weight_dtype,
                          kv_dtype=self.kv_dtype)

    @property
    def bytes(self) -> StepBytes:
        return step_bytes(
            self.model, self.batch, self.context, self.tp, self.weight_dtype, self.kv_dtype
        )

    @property
    def peak_bandwidth(self) -> float:
        """Datasheet HBM bytes/s of the whole replica: tp x per-GPU bandwidth."""
        return self.tp * gpu(self.gpu).memory_bandwidth

    @property
    def floor_s(self) -> float:
        """The step time at MBU = 100%."""
        return self.bytes.total / self.peak_bandwidth

    @property
    def mbu(self) -> float:
        """The true MBU of a decode step."""
        return mbu(self.bytes.total, self.step_s, self.peak_bandwidth)


@dataclass(frozen=True)
class Pitfall:
    """One wrong way to compute MBU and what it reports for a scenario."""

    key: str
    label: str
    reported: float
    true: float
    how: str

    @property
    def error_points(self) -> float:
        """Reported minus true, in percentage points."""
        return 100.0 * (self.reported - self.true)


def pitfalls(s: Scenario, wrong_gpu: str = "h100-sxm") -> list[Pitfall]:
    """The common ways to get MBU wrong, each priced for scenario ``s``.

    forgot_kv: weights only; all_experts: every stored expert; bf16_bytes: weights counted at 2
    bytes per parameter whatever their dtype; wrong_peak: the peak of ``wrong_gpu``; gib_vs_gb:
    bytes in GiB divided by a peak in GB/s; idle_averaged: bytes over wall-clock time
    (x busy_fraction); tp_replicated: KV summed over ranks; throughput_time: 1 / (tokens/s)
    used as the step time (x batch).
    """
    b, true = s.bytes, s.mbu
    peak, step = s.peak_bandwidth, s.step_s
    bf16_weights = b.weights * bytes_per_element("bf16") / bytes_per_element(s.weight_dtype)
    wrong_peak = s.tp * gpu(wrong_gpu).memory_bandwidth
    return [
        Pitfall(
            "forgot_kv",
            "forgot the KV-cache bytes",
            mbu(b.weights, step, peak),
            true,
            "numerator = weights only",
        ),
        Pitfall(
            "all_experts",
            "counted every expert",
            mbu(b.weights_all_experts + b.kv, step, peak),
            true,
            "numerator = all stored weights, not the experts the batch touched",
        ),
        Pitfall(
            "bf16_bytes",
            f"{s.weight_dtype.upper()} weights counted as BF16",
            mbu(bf16_weights + b.kv, step, peak),
            true,
            "numerator = parameters x 2 bytes",
        ),
        Pitfall(
            "wrong_peak",
            f"peak of {gpu(wrong_gpu).key}",
            mbu(b.total, step, wrong_peak),
            true,
            f"denominator = {wrong_gpu} datasheet bandwidth",
        ),
        Pitfall(
            "gib_vs_gb",
            "GiB over a GB/s peak",
            mbu(b.total / GiB * GB, step, peak),
            true,
            "numerator in GiB (2^30), peak in GB/s (1e9)",
        ),
        Pitfall(
            "idle_averaged",
            "averaged over idle time",
            mbu(b.total, step / s.busy_fraction, peak),
            true,
            "bytes of the decode steps over the wall-clock window",
        ),
        Pitfall(
            "tp_replicated",
            "counted replicated KV on every rank",
            mbu(b.weights + b.kv_summed_over_ranks, step, peak),
            true,
            "numerator = per-rank reads summed over the TP group",
        ),
        Pitfall(
            "throughput_time",
            "used 1 / throughput as the step time",
            mbu(b.total, step / s.batch, peak),
            true,
            "step time = 1 / (tokens/s of the whole batch)",
        ),
    ]


# ---- I005: splitting a measured MBU into owned buckets -----------------------------------------

BUCKET_INFO = {
    "kv_replication": (
        "KV read on every rank (replicated)",
        "Nsight Compute: attention-kernel DRAM bytes per rank against the KV cache size",
        "parallelism layout (DP attention)",
    ),
    "weight_bandwidth_shortfall": (
        "weight GEMVs below peak bandwidth",
        "Nsight Compute: dram__throughput on the GEMV kernels",
        "GEMM/kernels",
    ),
    "kv_bandwidth_shortfall": (
        "attention KV read below peak bandwidth",
        "Nsight Compute: dram__throughput on the decode-attention kernel",
        "attention kernels",
    ),
    "allreduce": (
        "tensor-parallel collectives",
        "Nsight Systems: all-reduce / all-gather kernel time x calls per step",
        "distributed/comms",
    ),
    "kernel_fixed": (
        "per-kernel fixed time",
        "Nsight Systems kernel summary: count x median duration of the norm, rotary, activation kernels",
        "compiler/fusion",
    ),
    "launch_gaps": (
        "launch gaps between kernels",
        "Nsight Systems: GPU idle between kernels inside a step",
        "runtime (CUDA graphs)",
    ),
    "sampling": (
        "sampling and the host sync",
        "Nsight Systems: logits-to-token kernels, D2H copy and stream sync",
        "serving/sampling",
    ),
    "scheduler": (
        "scheduler work between steps",
        "Nsight Systems: GPU idle between steps while the CPU prepares inputs",
        "serving/scheduler",
    ),
    "compute_excess": (
        "compute beyond the memory time",
        "Nsight Compute: tensor-pipe utilization near peak",
        "GEMM/kernels",
    ),
}


@dataclass(frozen=True)
class Diagnosis:
    """A measured step split into the floor, priced buckets and what the buckets leave unexplained."""

    floor_s: float
    measured_s: float
    buckets: dict  # name -> seconds (modelled), in BUCKET_INFO order
    residual_s: float  # measured - floor - sum(buckets)

    @property
    def gap_s(self) -> float:
        """The missing part of the step: measured - floor."""
        return self.measured_s - self.floor_s

    @property
    def measured_mbu(self) -> float:
        return self.floor_s / self.measured_s

    @property
    def modelled_s(self) -> float:
        return self.floor_s + sum(self.buckets.values())

    def points(self) -> dict[str, float]:
        """Each bucket (and the residual) as MBU percentage points it costs: 100 x t / measured."""
        out = {k: 100.0 * v / self.measured_s for k, v in self.buckets.items()}
        out["residual"] = 100.0 * self.residual_s / self.measured_s
        return out


def diagnose(step: DecodeStep, measured_mbu: float) -> Diagnosis:
    """Split the gap between a step's floor and the step implied by ``measured_mbu``.

    ``step``: the modelled step of the same replica (:func:`lib.perf.step.decode_step`).

    floor = unique bytes / bandwidth (``step.mbu_floor_s``); measured step = floor / measured_mbu;
    buckets = the modelled overheads of ``step``, replicated KV reads first;
    residual = measured - floor - sum(buckets) (what the priors do not explain: the profile's job).
    """
    if not isinstance(step, DecodeStep):
        raise ValueError(f"step must be a lib.perf.step.DecodeStep, got {type(step).__name__}")
    fraction("measured_mbu", measured_mbu, allow_zero=False)
    b = step.buckets
    buckets = {
        "kv_replication": b["kv_cache"] - b["kv_cache"] / step.kv_copies,
        "weight_bandwidth_shortfall": b["weight_bandwidth_shortfall"],
        "kv_bandwidth_shortfall": b["kv_bandwidth_shortfall"],
        "allreduce": step.collective_s,
        "kernel_fixed": b["kernel_fixed"],
        "launch_gaps": b["launch_gaps"],
        "sampling": b["sampling"],
        "scheduler": b["scheduler"],
        "compute_excess": b["compute_excess"],
    }
    floor = step.mbu_floor_s  # each KV byte once: replicas are a bucket, not part of the floor
    measured = floor / measured_mbu
    return Diagnosis(floor, measured, buckets, measured - floor - sum(buckets.values()))


_DIAGNOSIS_COLORS = ("#6baed6", "#9ecae1", "#c6dbef", "#d62728", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a",
                     "#9467bd")  # one per BUCKET_INFO entry, in order


def _diagnosis_build(fig) -> dict:
    fig.subplots_adjust(bottom=0.6, top=0.95)
    ax = fig.add_subplot()
    names = {"floor": "floor", **{name: info[0] for name, info in BUCKET_INFO.items()},
             "residual": "unexplained residual"}
    colors = ("#1f77b4", *_DIAGNOSIS_COLORS, "#cccccc")
    bars = {}
    for (name, label), color in zip(names.items(), colors, strict=True):
        bars[name] = ax.barh([0], [0.0], color=color)[0]
        bars[name].set_label(label)
    measured = ax.axvline(0.0, color="black", ls="--", lw=1, label="measured step")
    ax.set_yticks([])
    ax.set_xlabel("ms per decode step (dashed: measured)")
    return {"ax": ax, "bars": bars, "measured": measured}


def _diagnosis_draw(art: dict, d: Diagnosis) -> None:
    widths = {"floor": d.floor_s, **d.buckets, "residual": d.residual_s}
    left = 0.0
    for name, bar in art["bars"].items():
        w = widths[name] * 1e3
        bar.set_x(left)
        bar.set_width(w)
        bar.set_visible(name in ("floor", "residual") or w > 0)
        left += w if bar.get_visible() else 0.0
    art["bars"]["residual"].set_hatch("//" if d.residual_s < 0 else None)
    art["measured"].set_xdata([d.measured_s * 1e3] * 2)
    ax = art["ax"]
    ax.relim(visible_only=True)
    ax.autoscale_view()
    figures.legend(ax, [*art["bars"].values(), art["measured"]], fontsize=7, ncol=2, loc="upper center",
                   bbox_to_anchor=(0.5, -0.35))


def plot_diagnosis(d: Diagnosis):
    """One horizontal bar: floor, each priced bucket, the residual (hatched when negative); dashed
    line at the measured step. Returns a :class:`lib.book.figures.Drawing`."""
    return _DIAGNOSIS(d)


_DIAGNOSIS = figures.LiveFigure(6.5, 3.0, _diagnosis_build, _diagnosis_draw)
