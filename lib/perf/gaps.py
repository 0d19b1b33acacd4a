"""Pricing the distance between a roofline floor and a real server, bucket by bucket.

Two uses:

* **A batch-1 gap** (why is my step 2.5x the floor?): :func:`decode_trace` lays one decode
  step out as a single-stream timeline (the view one profiler trace gives of one TP rank) from
  the per-kernel table of :mod:`lib.perf.decode_kernels` and a set of :class:`Overheads`;
  :func:`attribute_trace` sorts that timeline into suspects by what the trace shows (idle
  gaps, NCCL kernels, tiny kernels, GEMVs below the bandwidth roof, attention, sampling and the
  host). The buckets partition the step: floor + buckets = step, exactly.
  :func:`gap_buckets_closed_form` prices the same buckets from formulas, as a second method.
* **Where the roofline breaks** in a capacity plan: :func:`roofline_plan` (the twenty-line
  estimate), :func:`plan_waterfall` (what each break adds to a step), and single-number
  helpers for the breaks that are not additive (MoE load, L2 residency; KV capacity is
  :func:`lib.perf.memory.kv_capacity_tokens`).

Every constant that is not a datasheet number comes from ``data/assumptions.yaml``,
each with a source or an explicit assumption. SI units: seconds, bytes, FLOP.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lib.inputs import fraction, integer, real
from lib.perf import collectives
from lib.perf.decode_kernels import FUSION_LEVELS, KernelCost, decode_step_kernels
from lib.registry.data import load_yaml
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.units import US

BUCKETS = (
    "launch_gaps",
    "nccl",
    "tiny_kernels",
    "gemv_below_roof",
    "sampling_host",
    "attention_kv",
)
BUCKET_SIGNAL = {
    "launch_gaps": "white space between kernels on the GPU stream (CPU/launch-bound)",
    "nccl": "nccl*AllReduce / AllGather kernels, two per layer",
    "tiny_kernels": "a long tail of few-µs norm, add, rotary, activation kernels",
    "gemv_below_roof": "GEMV kernels whose bytes / duration sits below the HBM roof",
    "sampling_host": "sampling kernels, then a D2H copy + sync and an idle gap at the step edge",
    "attention_kv": "the attention kernel: its time grows with context",
}
BUCKET_LABEL = {
    "launch_gaps": "gaps between kernels (CPU / launch)",
    "nccl": "NCCL all-reduce kernels",
    "tiny_kernels": "tail of tiny kernels",
    "gemv_below_roof": "GEMVs below the bandwidth roof",
    "sampling_host": "sampling + host sync",
    "attention_kv": "attention (KV read)",
}


# ---- assumptions -------------------------------------------------------------------------


def _compat_doc() -> dict:
    """TRANSITIONAL: the old kernel_assumptions layout mapped onto data/assumptions.yaml
    (this module is being folded into lib.perf.step)."""
    doc = load_yaml("assumptions.yaml")
    ds, an, misc = doc["decode_step"], doc["anchors"], doc["misc"]
    us = lambda e: {"value": e["value"]}  # noqa: E731
    return {
        "efficiency": {"hbm_streaming": ds["gemv_bandwidth_efficiency"],
                       "attention_kv_read": ds["attention_kv_bandwidth_efficiency"],
                       "matmul_flops": ds["matmul_flops_efficiency"],
                       "sustained_clock_under_power_cap": ds["sustained_clock_under_power_cap"]},
        "overhead_us": {"kernel_fixed": us(ds["kernel_fixed_us"]), "launch_gap": us(ds["launch_gap_us"]),
                        "eager_cpu_per_launch": us(ds["eager_launch_us"]),
                        "allreduce_nccl": {"value": doc["collectives"]["nvlink"]["ring_ll"]["base_us"]
                                           + 14 * doc["collectives"]["nvlink"]["ring_ll"]["per_step_us"]},
                        "host_step": {"value": ds["sampling_us"]["value"] + ds["scheduler_us"]["value"]},
                        "host_sync": {"value": 0.0}},
        "counts": {"sampling_kernels": ds["sampling_kernels"]},
        "memory": {"static_allocation_utilization": an["static_allocation_utilization"],
                   "l2_to_hbm_bandwidth": misc["l2_to_hbm_bandwidth"],
                   "activation_and_graph_reserve_gb": misc["activation_and_graph_reserve_gb"]},
    }


def assumption(section: str, key: str):
    """One value from data/assumptions.yaml (``assumption('overhead_us', 'launch_gap')``)."""
    doc = _compat_doc()
    if section not in doc or section == "sources":
        raise ValueError(
            f"section must be one of {[k for k in doc if k != 'sources']}, got {section!r}"
        )
    if key not in doc[section]:
        raise ValueError(f"{section} has no {key!r}; valid: {sorted(doc[section])}")
    return doc[section][key]["value"]


@dataclass(frozen=True)
class Overheads:
    """What a real step adds to the roofline (SI units; fractions in (0, 1]).

    ``cpu_launch_s=None`` means the step is replayed as a CUDA graph (launch cost folded into
    ``host_step_s``); a number means eager launches at that host cost each.
    """

    hbm_efficiency: float
    attention_efficiency: float
    flops_efficiency: float
    kernel_fixed_s: float
    launch_gap_s: float
    allreduce_latency_s: float
    host_step_s: float
    host_sync_s: float
    sampling_kernels: int
    fusion: str = "partial"
    cpu_launch_s: float | None = None

    def __post_init__(self):
        for name in ("hbm_efficiency", "attention_efficiency", "flops_efficiency"):
            fraction(name, getattr(self, name), allow_zero=False)
        for name in (
            "kernel_fixed_s",
            "launch_gap_s",
            "allreduce_latency_s",
            "host_step_s",
            "host_sync_s",
        ):
            real(name, getattr(self, name), 0, unit="seconds")
        if self.cpu_launch_s is not None and not self.cpu_launch_s >= 0:
            raise ValueError(
                f"cpu_launch_s must be None (CUDA graphs) or >= 0 s, got {self.cpu_launch_s}"
            )
        object.__setattr__(
            self, "sampling_kernels", integer("sampling_kernels", self.sampling_kernels, 1)
        )
        if self.fusion not in FUSION_LEVELS:
            raise ValueError(f"fusion must be one of {FUSION_LEVELS}, got {self.fusion!r}")


def default_overheads(**overrides) -> Overheads:
    """Overheads from data/assumptions.yaml (NCCL all-reduce, CUDA graphs, vLLM-like
    partial fusion); keyword arguments replace single fields."""
    base = Overheads(
        hbm_efficiency=assumption("efficiency", "hbm_streaming"),
        attention_efficiency=assumption("efficiency", "attention_kv_read"),
        flops_efficiency=assumption("efficiency", "matmul_flops"),
        kernel_fixed_s=assumption("overhead_us", "kernel_fixed") * US,
        launch_gap_s=assumption("overhead_us", "launch_gap") * US,
        allreduce_latency_s=assumption("overhead_us", "allreduce_nccl") * US,
        host_step_s=assumption("overhead_us", "host_step") * US,
        host_sync_s=assumption("overhead_us", "host_sync") * US,
        sampling_kernels=int(assumption("counts", "sampling_kernels")),
    )
    unknown = set(overrides) - set(Overheads.__dataclass_fields__)
    if unknown:
        raise ValueError(
            f"unknown overhead field(s) {sorted(unknown)}; valid: "
            f"{sorted(Overheads.__dataclass_fields__)}"
        )
    return replace(base, **overrides)


# ---- the trace ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceEvent:
    """One kernel on the GPU stream: what a profiler row shows, plus its share of the floor."""

    name: str
    category: str  # gemm | attention | elementwise | nccl | sampling
    start_s: float
    duration_s: float
    floor_s: float = 0.0  # weight bytes / datasheet bandwidth (GEMMs only)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Trace:
    """One decode step on one TP rank: the host phase [0, host_end_s) then the kernels."""

    events: tuple[TraceEvent, ...]
    host_end_s: float
    step_s: float
    meta: dict = field(default_factory=dict, compare=False)


_ORDER = {
    "none": (
        "rmsnorm",
        "qkv_proj",
        "rotary",
        "kv_cache_write",
        "attention",
        "o_proj",
        "AR",
        "residual_add",
        "rmsnorm",
        "gate_up_proj",
        "activation",
        "down_proj",
        "AR",
        "residual_add",
    ),
    "partial": (
        "fused_add_norm",
        "qkv_proj",
        "rotary_kv_write",
        "attention",
        "o_proj",
        "AR",
        "fused_add_norm",
        "gate_up_proj",
        "activation",
        "down_proj",
        "AR",
    ),
    "full": ("qkv_proj", "attention", "o_proj", "AR", "gate_up_proj", "down_proj", "AR"),
}


def _kernel_time(
    k: KernelCost, launches: int, chip: GPU, dtype: str, ov: Overheads, extra_bytes: float = 0.0
) -> float:
    eff = ov.attention_efficiency if k.category == "attention" else ov.hbm_efficiency
    mem = (k.bytes / launches + extra_bytes) / (eff * chip.memory_bandwidth)
    comp = k.flops / launches / (ov.flops_efficiency * chip.peak_flops(dtype))
    return ov.kernel_fixed_s + max(mem, comp)


def _allreduce_s(m: Model, chip: GPU, tp: int, batch: int, ov: Overheads) -> float:
    """One all-reduce of the step's activations (batch x hidden x 2 B) over the NVLink ring, s."""
    return collectives.all_reduce_s(batch * m.hidden_size * 2.0, tp, chip)


def _logits_gather_s(m: Model, chip: GPU, tp: int, batch: int, ov: Overheads) -> float:
    """The vocabulary-parallel LM head's all-gather of FP32 logits:
    latency + (tp - 1) / tp x batch x V x 4 B / link bandwidth, seconds."""
    return collectives.collective("all_gather", batch * m.vocab_size * 4.0, tp, chip).time_s


def _step_kernel_list(
    m: Model,
    chip: GPU,
    tp: int,
    batch: int,
    context: int,
    weight_dtype: str,
    kv_dtype: str,
    compute_dtype: str,
    ov: Overheads,
) -> list[tuple[str, str, float, float]]:
    """(name, category, duration, floor) for every launch of the step, in execution order."""
    table = decode_step_kernels(
        m, chip, batch, context, tp, weight_dtype, kv_dtype, "bf16", compute_dtype, ov.fusion
    )
    by = {k.name: k for k in table}
    L, bw = m.num_layers, chip.memory_bandwidth
    fused_extra = 0.0
    if ov.fusion == "full":  # bytes that ride along in the QKV prologue/epilogue
        fused_extra = by["fused_into_neighbours"].bytes / L
    norm_key = next((n for n in by if n.endswith("norm")), None)

    def present(name: str) -> bool:
        return (
            name == "AR"
            or name in ("rmsnorm", "fused_add_norm")
            or name in by
            or (name == "rotary_kv_write" and "kv_cache_write" in by)
        )

    def launch(name: str) -> tuple[str, str, float, float]:
        if name == "AR":
            return ("nccl_all_reduce", "nccl", _allreduce_s(m, chip, tp, batch, ov), 0.0)
        key = norm_key if name in ("rmsnorm", "fused_add_norm") else name
        if key == "rotary_kv_write" and key not in by:  # learned positions: no rotary
            key = "kv_cache_write"
        k = by[key]
        extra = fused_extra if (name == "qkv_proj" and ov.fusion == "full") else 0.0
        dur = _kernel_time(k, k.launches, chip, compute_dtype, ov, extra)
        cat = {"weight_gemm": "gemm"}.get(k.category, k.category)
        floor = k.weight_bytes / k.launches / bw if cat == "gemm" else 0.0
        return (key, cat, dur, floor)

    seq = [launch("embedding")]
    per_layer = [launch(n) for n in _ORDER[ov.fusion] if (tp > 1 or n != "AR") and present(n)]
    seq += per_layer * L
    if ov.fusion != "full":
        seq.append(launch("rmsnorm"))  # the final norm (the (2L+1)-th launch)
    seq.append(launch("lm_head"))
    if tp > 1:  # vocabulary-parallel LM head: gather the logits
        seq.append(("nccl_all_gather", "nccl", _logits_gather_s(m, chip, tp, batch, ov), 0.0))
    s = by["sampling"]
    per = _kernel_time(s, ov.sampling_kernels, chip, compute_dtype, ov)
    seq += [("sampling", "sampling", per, 0.0)] * ov.sampling_kernels
    return seq


def decode_trace(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    batch: int = 1,
    context: int = 4096,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    overheads: Overheads | None = None,
) -> Trace:
    """One decode step on one TP rank as a single-stream timeline.

    The step opens with the host phase (``host_step_s`` of CPU work plus ``host_sync_s`` for
    the previous token's D2H copy; the GPU idles). Each kernel then lasts
    ``kernel_fixed_s + max(bytes / (eff W), FLOPs / (eff P))``; an all-reduce lasts
    ``latency + 2 (tp - 1) / tp x message / link bandwidth``. CUDA graphs
    (``cpu_launch_s=None``): consecutive kernels are ``launch_gap_s`` apart. Eager: the CPU
    issues kernel i at ``host_end + i x cpu_launch_s`` and the GPU starts it at
    ``max(previous end + launch_gap_s, issue time)``, so gaps open whenever kernels are
    shorter than the launch cost.
    """
    m, g = model(mdl), gpu(chip)
    ov = overheads or default_overheads()
    if tp > 1 and not g.scaleup_bandwidth:
        raise ValueError(f"{g.name} has no NVLink-class link; pick tp=1 or another GPU")
    seq = _step_kernel_list(m, g, tp, batch, context, weight_dtype, kv_dtype, compute_dtype, ov)
    host_end = ov.host_step_s + ov.host_sync_s
    events, prev_end, cpu_t = [], host_end, host_end
    for i, (name, cat, dur, floor) in enumerate(seq):
        if ov.cpu_launch_s is None:
            start = prev_end + (ov.launch_gap_s if i else 0.0)
        else:
            cpu_t += ov.cpu_launch_s
            start = max(prev_end + (ov.launch_gap_s if i else 0.0), cpu_t)
        events.append(TraceEvent(name, cat, start, dur, floor))
        prev_end = start + dur
    meta = {
        "model": m.key,
        "gpu": g.key,
        "tp": tp,
        "batch": batch,
        "context": context,
        "weight_dtype": weight_dtype,
        "kv_dtype": kv_dtype,
        "fusion": ov.fusion,
        "cuda_graphs": ov.cpu_launch_s is None,
    }
    return Trace(tuple(events), host_end, prev_end, meta)


def attribute_trace(trace: Trace) -> dict[str, float]:
    """Sort a trace into the floor and the six suspect buckets, seconds; they sum to the step.

    floor: sum over GEMMs of weight bytes / datasheet bandwidth; gemv_below_roof: GEMM
    duration minus that; nccl, tiny_kernels (elementwise), attention_kv, sampling_host
    (sampling kernels + the host phase at the step edge): durations; launch_gaps: idle time
    between consecutive kernels.
    """
    if not trace.events:
        raise ValueError("trace has no events")
    out = dict.fromkeys(("floor",) + BUCKETS, 0.0)
    out["sampling_host"] = trace.host_end_s
    prev_end = trace.host_end_s  # in eager mode the first launch can also leave the GPU idle
    for e in trace.events:
        out["launch_gaps"] += e.start_s - prev_end
        prev_end = e.end_s
        if e.category == "gemm":
            out["floor"] += e.floor_s
            out["gemv_below_roof"] += e.duration_s - e.floor_s
        elif e.category == "nccl":
            out["nccl"] += e.duration_s
        elif e.category == "elementwise":
            out["tiny_kernels"] += e.duration_s
        elif e.category == "attention":
            out["attention_kv"] += e.duration_s
        elif e.category == "sampling":
            out["sampling_host"] += e.duration_s
        else:
            raise ValueError(f"unknown event category {e.category!r}")
    return out


def gap_buckets_closed_form(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    batch: int = 1,
    context: int = 4096,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    overheads: Overheads | None = None,
) -> dict[str, float]:
    """The same buckets as :func:`attribute_trace`, priced by formula (CUDA-graph mode only).

    launch_gaps = (kernels - 1) x gap; nccl = (2L + gather) x (latency + ring bytes / link);
    each compute kernel = launches x (fixed + max(bytes / eff W, FLOPs / eff P)); GEMV excess
    = that minus weight bytes / W; sampling_host = host phase + sampling kernels.
    """
    m, g = model(mdl), gpu(chip)
    ov = overheads or default_overheads()
    if ov.cpu_launch_s is not None:
        raise ValueError(
            "the closed form covers CUDA-graph replay (cpu_launch_s=None); "
            "eager gaps depend on the launch queue: use decode_trace"
        )
    table = decode_step_kernels(
        m, g, batch, context, tp, weight_dtype, kv_dtype, "bf16", compute_dtype, ov.fusion
    )
    out = dict.fromkeys(("floor",) + BUCKETS, 0.0)
    n_kernels = 0
    L = m.num_layers
    for k in table:
        if k.launches == 0:
            continue
        extra = 0.0
        if ov.fusion == "full" and k.name == "qkv_proj":
            extra = next(x.bytes for x in table if x.name == "fused_into_neighbours") / L
        if k.category == "sampling":
            t = ov.sampling_kernels * _kernel_time(k, ov.sampling_kernels, g, compute_dtype, ov)
            out["sampling_host"] += t
            n_kernels += ov.sampling_kernels
            continue
        t = k.launches * _kernel_time(k, k.launches, g, compute_dtype, ov, extra)
        n_kernels += k.launches
        if k.category == "weight_gemm":
            floor = k.weight_bytes / g.memory_bandwidth
            out["floor"] += floor
            out["gemv_below_roof"] += t - floor
        elif k.category == "attention":
            out["attention_kv"] += t
        else:
            out["tiny_kernels"] += t
    if tp > 1:
        out["nccl"] = 2 * L * _allreduce_s(m, g, tp, batch, ov) + _logits_gather_s(m, g, tp, batch, ov)
        n_kernels += 2 * L + 1
    out["launch_gaps"] = (n_kernels - 1) * ov.launch_gap_s
    out["sampling_host"] += ov.host_step_s + ov.host_sync_s
    return out


def weight_floor_s(
    mdl: str | Model, chip: str | GPU, tp: int = 1, weight_dtype: str = "bf16"
) -> float:
    """GEMM weight bytes one rank reads per step / datasheet bandwidth, seconds.

    This is the floor the trace attribution uses (the sum of the trace's ``floor_s``): matmul
    weights only (every layer's four GEMMs and the LM head), each sharded as its kernel is. It
    differs from :func:`lib.perf.roofline.weight_bytes_read_per_step` / tp / bandwidth on purpose:
    the norm weights and the lookup rows are read by non-GEMM kernels (the tiny-kernel bucket),
    and past the KV-head count the K and V projections are replicated, not split.
    """
    m, g = model(mdl), gpu(chip)
    table = decode_step_kernels(m, g, 1, 1, tp, weight_dtype)
    return sum(k.weight_bytes for k in table if k.category == "weight_gemm") / g.memory_bandwidth


def trace_figure(trace: Trace, layers: int = 2, buckets: dict[str, float] | None = None):
    """Two panels: the first ``layers`` layers of the trace as a Gantt strip (µs, coloured by
    kernel category, white = idle), and the step's buckets as one stacked bar (ms). Returns a
    :class:`lib.book.svgplot.Figure`."""
    from lib.book.svgplot import Figure

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    colors = {
        "gemm": ("#4c72b0", "GEMV"),
        "attention": ("#dd8452", "attention"),
        "elementwise": ("#55a868", "elementwise"),
        "nccl": ("#c44e52", "NCCL"),
        "sampling": ("#8172b3", "sampling"),
    }
    fig = Figure(figsize=(7.0, 4.5))
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    qkv = [i for i, e in enumerate(trace.events) if e.name == "qkv_proj"]
    stop = qkv[layers] if len(qkv) > layers else len(trace.events)
    shown = trace.events[:stop]
    t0 = trace.host_end_s
    for cat, (color, label) in colors.items():
        spans = [((e.start_s - t0) * 1e6, e.duration_s * 1e6) for e in shown if e.category == cat]
        if spans:
            ax1.broken_barh(
                spans, (0, 1), facecolors=color, edgecolor="white", linewidth=0.3, label=label
            )
    ax1.set_yticks([])
    ax1.set_xlabel("µs from the first kernel (white = idle)", fontsize=8)
    ax1.set_title(f"the first {layers} layer(s) of the GPU stream", fontsize=9)
    ax1.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    b = buckets or attribute_trace(trace)
    left = 0.0
    bucket_colors = {
        "floor": "#4c72b0",
        "gemv_below_roof": "#9bb1d6",
        "nccl": "#c44e52",
        "tiny_kernels": "#55a868",
        "attention_kv": "#dd8452",
        "sampling_host": "#8172b3",
        "launch_gaps": "#cccccc",
    }
    for key in ("floor",) + BUCKETS:
        v = b[key] * 1e3
        ax2.barh(
            [0],
            [v],
            left=left,
            color=bucket_colors[key],
            label="floor" if key == "floor" else BUCKET_LABEL[key],
        )
        left += v
    ax2.set_yticks([])
    ax2.set_xlabel("ms per decode step", fontsize=8)
    ax2.set_title("the whole step, by suspect", fontsize=9)
    ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.subplots_adjust(hspace=1.5, bottom=0.2, top=0.93)
    return fig


# ---- where the roofline breaks: the plan and its corrections ------------------------------


def roofline_plan(
    mdl: str | Model,
    chip: str | GPU,
    tp: int,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> dict[str, float]:
    """The twenty-line estimate for a decode replica, per step and per second.

    step = (weights / tp + batch x context x KV bytes/token x shard) / W (or compute, if
    larger); tokens/s = batch / step; plus the per-GPU memory it needs.
    """
    from lib.perf import roofline as rf

    m, g = model(mdl), gpu(chip)
    step = rf.decode_step(m, g, tp, batch, context, weight_dtype, kv_dtype)
    kv = batch * context * m.kv_bytes_per_token(kv_dtype) * rf.kv_shard_fraction(m, tp)
    return {
        "step_s": step.time_s,
        "tokens_per_s": batch / step.time_s,
        "weights_per_gpu": m.weight_bytes(weight_dtype) / tp,
        "kv_per_gpu": kv,
        "memory_s": step.memory_s,
        "compute_s": step.compute_s,
    }


def prefill_tokens_per_step(batch: int, prompt_len: int, output_len: int) -> float:
    """Prompt tokens a continuous-batching server must prefill per decode step, on average.

    In steady state ``batch`` sequences each finish after ``output_len`` steps, so
    batch / output_len new requests arrive per step, each with ``prompt_len`` tokens:
    batch x prompt_len / output_len.
    """
    if batch < 1 or prompt_len < 0 or output_len < 1:
        raise ValueError(
            f"need batch >= 1, prompt_len >= 0, output_len >= 1; got {batch}, {prompt_len}, {output_len}"
        )
    return batch * prompt_len / output_len


def plan_waterfall(
    mdl: str | Model,
    chip: str | GPU,
    tp: int,
    batch: int,
    context: int,
    prompt_len: int,
    output_len: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    overheads: Overheads | None = None,
    clock_fraction: float = 1.0,
) -> list[tuple[str, float]]:
    """What each break adds to one decode step of the plan, seconds, in order.

    roofline: the plan's step; then the trace's buckets beyond it (achieved bandwidth on the
    GEMVs and on attention, NCCL latency, tiny kernels, launch gaps, sampling and host), then
    the prompt tokens continuous batching mixes into each step (prefill FLOPs / (achieved
    FLOP rate x clock_fraction), weights already read by the decode step), then the extra time
    of the compute-bound prefill under a sustained clock below the benchmark's.
    """
    from lib.perf import roofline as rf

    m, g = model(mdl), gpu(chip)
    ov = overheads or default_overheads()
    fraction("clock_fraction", clock_fraction, allow_zero=False)
    plan = roofline_plan(m, g, tp, batch, context, weight_dtype, kv_dtype)
    b = attribute_trace(
        decode_trace(m, g, tp, batch, context, weight_dtype, kv_dtype, overheads=ov)
    )
    # the plan's step holds the weight read and the KV read at datasheet bandwidth (or the
    # compute time, if larger); each row below is what the trace adds beyond that
    kv_peak = (
        batch
        * context
        * m.kv_bytes_per_token(kv_dtype)
        * rf.kv_shard_fraction(m, tp)
        / g.memory_bandwidth
    )
    rows = [
        ("roofline plan", plan["step_s"]),
        (
            "GEMVs below the roof (achieved BW, fixed cost)",
            b["floor"] + b["gemv_below_roof"] - (plan["step_s"] - kv_peak),
        ),
        ("attention below the roof", b["attention_kv"] - kv_peak),
        ("all-reduce latency", b["nccl"]),
        ("tiny kernels", b["tiny_kernels"]),
        ("launch gaps", b["launch_gaps"]),
        ("sampling + host", b["sampling_host"]),
    ]
    # chunked prefill: the step's GEMMs now multiply batch + chunk rows; they stay at the
    # (achieved) weight-read time until the FLOPs catch up, then grow with the chunk
    chunk = prefill_tokens_per_step(batch, prompt_len, output_len)
    weights_eff = b["floor"] / ov.hbm_efficiency
    step = dict(m=m, g=g, tp=tp, batch=batch, prompt_len=max(prompt_len, 1),
                weights_eff_s=weights_eff, weight_dtype=weight_dtype, ov=ov)
    before = _mixed_step_gemm_s(chunk_tokens=0, **step)
    after = _mixed_step_gemm_s(chunk_tokens=chunk, **step)
    throttled = _mixed_step_gemm_s(chunk_tokens=chunk, clock_fraction=clock_fraction, **step)
    rows.append(("prefill mixed into each step", after - before))
    rows.append(("clock throttling (compute-bound part)", throttled - after))
    return rows


def _mixed_step_gemm_s(
    m: Model,
    g: GPU,
    tp: int,
    batch: int,
    chunk_tokens: float,
    prompt_len: int,
    weights_eff_s: float,
    weight_dtype: str,
    ov: Overheads,
    clock_fraction: float = 1.0,
) -> float:
    """GEMM time of a step carrying ``batch`` decode tokens and ``chunk_tokens`` of a
    ``prompt_len``-token prompt, on one of ``tp`` GPUs, seconds: max(achieved weight read,
    (decode + chunk) FLOPs / (flops_efficiency x peak x clock_fraction)), with decode FLOPs =
    batch x 2N / tp and chunk FLOPs = chunk x prefill_flops(P) / P / tp; the FP8 peak when the
    weights are FP8 and the chip has FP8 tensor cores."""
    peak = g.peak_flops("fp8" if weight_dtype == "fp8" and "fp8" in g.dtypes else "bf16")
    rate = ov.flops_efficiency * peak
    flops = batch * m.weight_flops_per_token() / tp
    if chunk_tokens:
        flops += chunk_tokens * m.prefill_flops(prompt_len) / prompt_len / tp
    return max(weights_eff_s, flops / (rate * clock_fraction))


def prefill_chunk_spike(
    mdl: str | Model,
    chip: str | GPU,
    tp: int,
    batch: int,
    chunk_tokens: int,
    prompt_len: int,
    weight_dtype: str = "bf16",
    overheads: Overheads | None = None,
) -> float:
    """Seconds one step grows by when a ``chunk_tokens`` slice of a prompt joins ``batch``
    decoding sequences: max(weight time, (decode + chunk) FLOPs / achieved rate) minus
    max(weight time, decode FLOPs / achieved rate)."""
    m, g = model(mdl), gpu(chip)
    ov = overheads or default_overheads()
    if chunk_tokens < 0 or prompt_len < 1:
        raise ValueError(
            f"need chunk_tokens >= 0 and prompt_len >= 1, got {chunk_tokens}, {prompt_len}"
        )
    step = dict(m=m, g=g, tp=tp, batch=batch, prompt_len=prompt_len,
                weights_eff_s=weight_floor_s(m, g, tp, weight_dtype) / ov.hbm_efficiency,
                weight_dtype=weight_dtype, ov=ov)
    return _mixed_step_gemm_s(chunk_tokens=chunk_tokens, **step) - _mixed_step_gemm_s(chunk_tokens=0, **step)


def expert_load_imbalance(
    num_experts: int, experts_per_token: int, tokens: int, trials: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Tokens routed to the busiest expert vs the mean, under uniform top-k routing (Monte Carlo).

    Each token picks k distinct experts uniformly (rejection sampling when k <= E / 4, else the
    k smallest of E uniforms); per trial count tokens per expert. Returns
    mean load (tokens x k / E), the expected maximum, and their ratio: with expert
    parallelism the step waits for the busiest expert's GPU.
    """
    import numpy as np

    if num_experts < 1 or not 1 <= experts_per_token <= num_experts:
        raise ValueError(
            f"need 1 <= experts_per_token <= num_experts, got {experts_per_token}, {num_experts}"
        )
    if tokens < 1 or trials < 1:
        raise ValueError(f"tokens and trials must be >= 1, got {tokens}, {trials}")
    rng = np.random.default_rng(seed)
    k, e = experts_per_token, num_experts
    if k == e:
        picks = np.broadcast_to(np.arange(e), (trials, tokens, e))
    elif 4 * k <= e:
        # sparse top-k (e.g. 8 of 256): draw k with replacement and redraw any token whose draw
        # repeats an expert; accepted draws are uniform over distinct k-tuples, so uniform subsets
        picks = rng.integers(0, e, (trials * tokens, k))
        while True:
            srt = np.sort(picks, axis=1)
            bad = np.nonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))[0]
            if bad.size == 0:
                break
            picks[bad] = rng.integers(0, e, (bad.size, k))
    else:  # dense top-k (e.g. 2 of 8): the k smallest of E uniforms is a uniform k-subset
        picks = np.argpartition(rng.random((trials, tokens, e)), k, axis=2)[:, :, :k]
    rows = np.repeat(np.arange(trials), tokens * experts_per_token)
    flat = rows * num_experts + np.asarray(picks).reshape(-1)
    counts = np.bincount(flat, minlength=trials * num_experts).reshape(trials, num_experts)
    mean = tokens * experts_per_token / num_experts
    mx = float(counts.max(axis=1).mean())
    return {"mean": mean, "max": mx, "ratio": mx / mean}


def l2_resident_fraction(kernel_bytes: float, chip: str | GPU) -> float:
    """Fraction of a kernel's working set that fits in L2 (1.0 when it all fits).

    A microbenchmark that replays one kernel on the same buffers then reads from L2, not HBM.
    """
    g = gpu(chip)
    if not kernel_bytes > 0:
        raise ValueError(f"kernel_bytes must be > 0, got {kernel_bytes}")
    return min(1.0, g.l2_bytes / kernel_bytes)
