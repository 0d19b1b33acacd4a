"""Explorers for the decode step over TP degree (I001, N042), the FFN cost model (W06) and MBU (I005, I103)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import collectives
from lib.perf import ffn as ffn_lib
from lib.perf import mbu as mbu_lib
from lib.perf import tp_scaling as tps
from lib.perf.deployment import Deployment
from lib.perf.step import LEVELS, decode_step, step_assumptions
from lib.registry import hardware, models
from lib.units import MS, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())


def _deployment(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, batch: int,
                context: int, cuda_graphs: bool = True) -> Deployment:
    """The validated replica, refused when the batch's KV cache does not fit its memory budget or
    the context passes the model's window (:func:`lib.perf.tp_scaling.require_serves`)."""
    dep = Deployment(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     cuda_graphs=cuda_graphs)
    return tps.require_serves(dep, batch, context)


@explorer(
    "roofline.tp_decode_step",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    allreduce=Choice(collectives.ALGORITHMS, label="all-reduce"),
    level=Choice(LEVELS, label="assumptions"),
    cuda_graphs=Choice(("yes", "no"), label="CUDA graphs"),
)
def tp_decode_step(
    model: str,
    gpu: str,
    tp: int,
    batch: int,
    context: int,
    weight_dtype: str,
    kv_dtype: str,
    allreduce: str,
    level: str,
    cuda_graphs: str,
) -> View:
    """I001, N042: one decode step (lib.perf.step) at TP1 and TP n, bucket by bucket, and the
    speedup curve over TP degree."""
    dep = _deployment(model, gpu, tp, weight_dtype, kv_dtype, batch, context, cuda_graphs == "yes")
    assume = step_assumptions(level, allreduce_algorithm=allreduce)
    step = decode_step(dep, batch, context, assume)
    one, one_reason = tps.step_at(dep, 1, batch, context, assume)
    degrees = tps.candidate_degrees(dep, max(8, tp))
    curve = tps.speedup_curve(dep, degrees, batch, context, assume, reference=one)
    one_label = "TP1" + (" (hypothetical)" if one_reason else "")
    fig = _TP_FIGURE({one_label: one, f"TP{tp}": step}, curve)
    rows = [
        ("floor (bytes / datasheet bandwidth)", fmt_time(step.floor_s)),
        ("step total", fmt_time(step.total_s)),
        ("collectives", f"{step.n_collectives} calls = {fmt_time(step.collective_s)}"),
        ("kernels per step", f"{step.n_kernels} (fixed time + gaps {fmt_time(step.kernel_overhead_s)})"),
        ("host (sampling + scheduler)", fmt_time(step.host_s)),
        ("does not shrink with TP", fmt_time(step.fixed_s)),
        ("MBU", fmt_pct(step.mbu)),
        (one_label + " step (same GPU)", fmt_time(one.total_s)),
        (f"speedup TP{tp} / TP1", f"{sig(one.total_s / step.total_s)}x (ideal {tp}x)"),
    ]
    note = f"TP1 cannot be deployed ({one_reason}): its bar is hypothetical." if one_reason else ""
    bars = f"at TP1 and TP{tp}" if tp > 1 else "at TP1"
    caption = (f"Left: the decode step {bars}, bucket by bucket; the weight read divides by the TP degree, but "
               f"{fmt_time(step.fixed_s)} of the TP{tp} step does not shrink with it. Right: the modelled speedup "
               f"against the ideal n x" + (f"; at TP{tp} it is {sig(one.total_s / step.total_s)}x." if tp > 1 else "."))
    return View(
        f"{dep.label}, batch {batch}, context {context}",
        rows,
        fig,
        note,
        caption=caption,
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
    fig = _FFN_FIGURE(ffn_lib.regime_map(shape, gpu, link, **kw), point=(tokens, tp))
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
    caption = (f"Each cell is a token count T and TP degree n, coloured by the cost that binds one FFN layer there; a "
               f"black tick marks where compute overtakes HBM on its row. The star, T = {fmt_int(tokens)} at n = {tp}, "
               f"is bound by {cost.bound}.")
    return View(
        f"FFN of {model} on {tp}x {gpu}, T = {tokens}",
        rows,
        fig,
        caption=caption,
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
    allreduce=Choice(collectives.ALGORITHMS, label="all-reduce"),
    level=Choice(LEVELS, label="assumptions"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
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
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> View:
    """I005: the floor from bytes, the measured step it implies, and the gap split into owned buckets."""
    dep = _deployment(model, gpu, tp, weight_dtype, kv_dtype, batch, context)
    step = decode_step(dep, batch, context, step_assumptions(level, allreduce_algorithm=allreduce))
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
    priced = {k: v for k, v in d.buckets.items() if v > 0}
    top = (f"; the largest priced cause is {mbu_lib.BUCKET_INFO[max(priced, key=priced.get)][0]}"
           if priced else "")
    rest = (f"the unexplained residual is {fmt_time(d.residual_s)}" if d.residual_s >= 0 else
            f"the priced causes overshoot it by {fmt_time(-d.residual_s)} (hatched)")
    caption = (f"The bar splits the measured step ({fmt_time(d.measured_s)}, dashed) into the floor "
               f"({fmt_time(d.floor_s)}, bytes at peak bandwidth), the priced causes and what is left: "
               f"{rest}{top}.")
    return View(
        f"{dep.label}: MBU {fmt_pct(measured_mbu)} split",
        rows,
        fig,
        note,
        caption=caption,
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
    _deployment(model, gpu, tp, weight_dtype, kv_dtype, batch, context)
    s = mbu_lib.Scenario(
        model, gpu, tp, batch, context, weight_dtype, kv_dtype, step_ms * MS, busy_fraction
    )
    if s.mbu > 1:
        raise ValueError(
            f"a {step_ms} ms step would beat the {fmt_time(s.floor_s)} floor (MBU > 100%): "
            "raise the measured step time"
        )
    pits = [p for p in mbu_lib.pitfalls(s, wrong_gpu) if p.key != "throughput_time"]
    fig = _PITFALLS_FIGURE(pits, layout=(len(pits),))
    rows = [("true MBU", fmt_pct(s.mbu)), ("floor", fmt_time(s.floor_s))]
    rows += [(p.label, f"{fmt_pct(p.reported)} ({p.error_points:+.1f} pts)") for p in pits]
    worst = max(pits, key=lambda p: abs(p.error_points))
    caption = (f"Each bar is how far one wrong definition of MBU lands from the true {fmt_pct(s.mbu)}, in percentage "
               f"points: right of the zero line it overstates, left of it it understates. The worst here is "
               f"'{worst.label}', {worst.error_points:+.1f} points.")
    return View(
        f"MBU of {s.deployment.label}, batch {batch}, context {context}",
        rows,
        fig,
        caption=caption,
        values={"true": s.mbu, **{p.key: p.reported for p in pits}},
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _tp_build(fig) -> tuple[dict, dict]:
    fig.subplots_adjust(right=0.98, wspace=0.3, bottom=0.42)  # left: set by draw_step_stack
    ax0, ax1 = fig.subplots(1, 2)
    return tps.build_step_stack(ax0, rows=2), tps.build_speedup(ax1)


def _tp_draw(art: tuple[dict, dict], steps: dict, curve: list) -> None:
    tps.draw_step_stack(art[0], steps)
    tps.draw_speedup(art[1], curve)


_TP_FIGURE = figures.LiveFigure(9.0, 3.4, _tp_build, _tp_draw)


def _ffn_build(fig) -> dict:
    fig.subplots_adjust(bottom=0.3)
    return ffn_lib.build_regime_map(fig.add_subplot())


_FFN_FIGURE = figures.LiveFigure(6.4, 3.4, _ffn_build, ffn_lib.draw_regime_map)


def _pitfalls_build(fig, n: int) -> SimpleNamespace:
    from matplotlib.patches import Patch

    fig.subplots_adjust(left=0.42)
    ax = fig.add_subplot()
    bars = ax.barh(range(n), np.zeros(n))
    ax.invert_yaxis()
    zero = ax.axvline(0, color="black", lw=1, label="true MBU (no error)")
    ax.set_xlabel("reported - true MBU (percentage points)")
    kinds = [Patch(color="#d62728", label="overstates"), Patch(color="#1f77b4", label="understates")]
    return SimpleNamespace(ax=ax, bars=bars, zero=zero, kinds=kinds)


def _pitfalls_draw(a: SimpleNamespace, pits: list) -> None:
    for bar, p in zip(a.bars, pits, strict=True):
        bar.set_width(p.error_points)
        bar.set_color("#d62728" if p.error_points > 0 else "#1f77b4")
    a.ax.set_yticks(range(len(pits)), [p.label for p in pits], fontsize=8)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [*a.kinds, a.zero], fontsize=7, loc="best")


_PITFALLS_FIGURE = figures.LiveFigure(6.4, 3.2, _pitfalls_build, _pitfalls_draw)
