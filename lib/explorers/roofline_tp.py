"""Explorers for the tensor-parallel decode step (N042), the FFN cost model (W06) and MBU (I005, I103)."""

from __future__ import annotations

import math

from lib.book.svgplot import subplots
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import ffn as ffn_lib
from lib.perf import mbu as mbu_lib
from lib.perf import tpdecode as tpd
from lib.registry import hardware, models
from lib.units import MS, US, fmt_bytes, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())


def _stack(level: str, allreduce: str, cuda_graphs: str = "yes") -> tpd.StepAssumptions:
    stack = tpd.assumptions(level).replace(allreduce_algorithm=allreduce)
    if cuda_graphs == "no":
        stack = stack.replace(launch_gap_s=tpd.eager_launch_gap_s())
    return stack


def _check_fits(m, g, tp: int, weight_dtype: str, kv_bytes_total: float) -> None:
    per_gpu = m.weight_bytes(weight_dtype) / tp + kv_bytes_total * tpd.kv_read_fraction(m, tp)
    if per_gpu > g.memory_bytes:
        raise ValueError(
            f"{m.key} in {weight_dtype} with this KV cache needs {fmt_bytes(per_gpu)} per GPU; "
            f"{g.key} has {fmt_bytes(g.memory_bytes)}: raise tp, shrink batch/context or quantize"
        )


@explorer(
    "roofline.tp_decode_step",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    allreduce=Choice(tpd.ALLREDUCE_ALGORITHMS, label="all-reduce"),
    level=Choice(tpd.LEVELS, label="assumptions"),
    cuda_graphs=Choice(("yes", "no"), label="CUDA graphs"),
)
def tp_decode_step(
    model: str,
    gpu: str,
    tp: int,
    batch: int,
    context: int,
    weight_dtype: str,
    allreduce: str,
    level: str,
    cuda_graphs: str,
) -> View:
    """N042: one decode step at TP1 and TP n, bucket by bucket, and the speedup curve."""
    m, g = models.model(model), hardware.gpu(gpu)
    stack = _stack(level, allreduce, cuda_graphs)
    step = tpd.decode_step(m, g, tp, batch, context, weight_dtype, stack=stack)
    one = tpd.decode_step(m, g, 1, batch, context, weight_dtype, stack=stack, strict=False)
    top = max(8, tp)
    degrees = [n for n in range(1, top + 1) if n <= 8 or tpd.tp_divides(m, n)]
    curve = tpd.speedup_curve(
        m, g, degrees, batch, context, weight_dtype, stack=stack, reference=one
    )
    fig, (ax0, ax1) = subplots(9.0, 3.4, 2)
    tpd.plot_step_stack({"TP1": one, f"TP{tp}": step}, ax=ax0)
    tpd.plot_speedup(curve, ax=ax1)
    fig.subplots_adjust(left=0.08, right=0.98, wspace=0.3, bottom=0.42)
    fits = (
        m.weight_bytes(weight_dtype) / tp
        + batch * context * m.kv_bytes_per_token("bf16") * tpd.kv_read_fraction(m, tp)
        <= g.memory_bytes
    )
    rows = [
        ("floor (bytes / peak bandwidth)", fmt_time(step.floor_s)),
        ("step total", fmt_time(step.total_s)),
        (
            "all-reduces",
            f"{step.n_allreduces} x {sig(stack.allreduce_alpha_s(tp) / US)} µs = {fmt_time(step.allreduce_s)}",
        ),
        ("kernels per step", f"{step.n_kernels} (tax {fmt_time(step.kernel_overhead_s)})"),
        ("does not shrink with TP", fmt_time(step.fixed_s)),
        ("MBU", fmt_pct(step.mbu)),
        ("TP1 step (same GPU)", fmt_time(one.total_s)),
        (f"speedup TP{tp} / TP1", f"{sig(one.total_s / step.total_s)}x (ideal {tp}x)"),
    ]
    note = "" if fits else f"TP{tp} does not fit {g.key} memory with this KV cache: hypothetical."
    if m.weight_bytes(weight_dtype) > g.memory_bytes:
        note += f" TP1 does not fit one {g.key}: the TP1 bar is hypothetical."
    return View(
        f"{m.key} decode on {tp}x {g.key}, batch {batch}, context {context}",
        rows,
        fig,
        note.strip(),
        values={
            "total": step.total_s,
            "floor": step.floor_s,
            "tp1": one.total_s,
            "speedup": one.total_s / step.total_s,
            **step.buckets,
        },
    )


@explorer(
    "roofline.ffn_cost",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tokens=IntRange(1, 65536, log=True, label="tokens T"),
    tp=IntRange(1, 64, log=True, label="tensor parallel n"),
    link=Choice(ffn_lib.LINKS),
    kind=Choice(("native", "swiglu", "gelu"), label="FFN form"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights and matmuls"),
    fused=Choice(("fused", "unfused"), label="activation kernels"),
)
def ffn_cost(
    model: str, gpu: str, tokens: int, tp: int, link: str, kind: str, weight_dtype: str, fused: str
) -> View:
    """W06: the three costs of one FFN layer and the regime map over tokens and TP degree."""
    shape = ffn_lib.ffn_shape(model, None if kind == "native" else kind)
    kw = {"weight_dtype": weight_dtype, "compute_dtype": weight_dtype, "fused": fused == "fused"}
    cost = ffn_lib.ffn_cost(shape, gpu, tokens, tp, link, **kw)
    fig, (ax,) = subplots(6.4, 3.4)
    ffn_lib.plot_regime_map(shape, gpu, link, point=(tokens, tp), ax=ax, **kw)
    t_ch = ffn_lib.compute_hbm_boundary_tokens(
        shape, gpu, tp, weight_dtype, "bf16", weight_dtype, fused == "fused"
    )
    rows = [
        ("FFN", f"{shape.kind}, d = {shape.d_model}, f = {shape.d_ff}, {shape.matrices} matrices"),
        ("compute", fmt_time(cost.compute_s)),
        ("HBM (weights + activations)", fmt_time(cost.hbm_s)),
        (
            "all-reduce latency + bandwidth",
            f"{fmt_time(cost.comm_latency_s)} + {fmt_time(cost.comm_bandwidth_s)}"
            + (f" over {cost.link}" if tp > 1 else ""),
        ),
        ("binds", cost.bound),
        ("layer time, comm not overlapped", fmt_time(cost.serial_s)),
        ("compute = HBM at T", "never" if math.isinf(t_ch) else f"{sig(t_ch)} tokens"),
    ]
    return View(
        f"FFN of {model} on {tp}x {gpu}, T = {tokens}",
        rows,
        fig,
        values={
            "compute": cost.compute_s,
            "hbm": cost.hbm_s,
            "comm": cost.comm_s,
            "serial": cost.serial_s,
            "t_compute_hbm": t_ch,
        },
    )


@explorer(
    "roofline.mbu_diagnosis",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    measured_mbu=FloatRange(0.05, 1.0, 0.01, label="measured MBU"),
    allreduce=Choice(tpd.ALLREDUCE_ALGORITHMS, label="all-reduce"),
    level=Choice(tpd.LEVELS, label="assumptions"),
)
def mbu_diagnosis(
    model: str,
    gpu: str,
    tp: int,
    batch: int,
    context: int,
    measured_mbu: float,
    allreduce: str,
    level: str,
) -> View:
    """I005: the floor from bytes, the measured step it implies, and the gap split into owned buckets."""
    m, g = models.model(model), hardware.gpu(gpu)
    _check_fits(m, g, tp, "bf16", batch * context * m.kv_bytes_per_token("bf16"))
    step = tpd.decode_step(m, g, tp, batch, context, stack=_stack(level, allreduce))
    d = mbu_lib.diagnose(step, measured_mbu)
    fig = mbu_lib.plot_diagnosis(d)
    rows = [
        ("floor (bytes / peak)", fmt_time(d.floor_s)),
        ("measured step", fmt_time(d.measured_s)),
        ("modelled MBU", fmt_pct(step.mbu)),
    ]
    rows += [
        (
            mbu_lib.BUCKET_INFO[k][0],
            f"{fmt_time(v)} ({sig(100 * v / d.measured_s)} pts) → {mbu_lib.BUCKET_INFO[k][2]}",
        )
        for k, v in d.buckets.items()
        if v > 0
    ]
    rows.append(
        ("unexplained residual", f"{fmt_time(d.residual_s)} ({sig(d.points()['residual'])} pts)")
    )
    note = (
        "The priors explain more than the gap: this server beats them; measure and lower them."
        if d.residual_s < 0
        else ""
    )
    return View(
        f"{m.key} on {tp}x {g.key}: MBU {fmt_pct(measured_mbu)} split",
        rows,
        fig,
        note,
        values={
            "floor": d.floor_s,
            "measured": d.measured_s,
            "residual": d.residual_s,
            **d.buckets,
        },
    )


@explorer(
    "roofline.mbu_pitfalls",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    step_ms=FloatRange(1.0, 500.0, 0.5, label="measured step (ms)"),
    busy_fraction=FloatRange(0.05, 1.0, 0.05, label="share of time decoding"),
    wrong_gpu=Choice(GPUS, label="peak mistakenly used"),
)
def mbu_pitfalls(
    model: str,
    gpu: str,
    tp: int,
    batch: int,
    context: int,
    weight_dtype: str,
    kv_dtype: str,
    step_ms: float,
    busy_fraction: float,
    wrong_gpu: str,
) -> View:
    """I103: the true MBU of a server and what each wrong definition reports."""
    m, g = models.model(model), hardware.gpu(gpu)
    _check_fits(m, g, tp, weight_dtype, batch * context * m.kv_bytes_per_token(kv_dtype))
    s = mbu_lib.Scenario(
        m.key, g.key, tp, batch, context, weight_dtype, kv_dtype, step_ms * MS, busy_fraction
    )
    if s.mbu > 1:
        raise ValueError(
            f"a {step_ms} ms step would beat the {fmt_time(s.floor_s)} floor (MBU > 100%): "
            "raise the measured step time"
        )
    pits = [p for p in mbu_lib.pitfalls(s, wrong_gpu) if p.key != "throughput_time"]
    fig, (ax,) = subplots(6.4, 3.2)
    ax.barh(
        range(len(pits)),
        [p.error_points for p in pits],
        color=["#d62728" if p.error_points > 0 else "#1f77b4" for p in pits],
    )
    ax.set_yticks(range(len(pits)), [p.label for p in pits], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=1)
    ax.set_xlabel("reported - true MBU (percentage points)")
    fig.subplots_adjust(left=0.42)
    rows = [("true MBU", fmt_pct(s.mbu)), ("floor", fmt_time(s.floor_s))]
    rows += [(p.label, f"{fmt_pct(p.reported)} ({p.error_points:+.1f} pts)") for p in pits]
    return View(
        f"MBU of {m.key} on {tp}x {g.key}, batch {batch}, context {context}",
        rows,
        fig,
        values={"true": s.mbu, **{p.key: p.reported for p in pits}},
    )
