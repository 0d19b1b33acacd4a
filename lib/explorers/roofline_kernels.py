"""Explorers for the per-kernel decode questions: kernel ranking (I008), the batch-1 gap (I007)
and where the roofline breaks (I009)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import collectives, gaps
from lib.perf import decode_kernels as dk
from lib.perf import step as st
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import US, fmt_bytes, fmt_pct, fmt_time, sig

DENSE_MODELS = tuple(
    k for k in models.model_names() if not models.model(k).is_moe and not models.model(k).is_mla
)
GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


def _compute_dtype(chip, weight_dtype: str) -> str:
    return "fp8" if weight_dtype == "fp8" and "fp8" in chip.dtypes else "bf16"


def _concurrency(dep: Deployment, context: int) -> float:
    """Sequences of ``context`` tokens the engine's KV pool holds (Deployment.budget, fractional)."""
    return dep.budget.max_concurrency(max(context, 1))


def _check_fits(dep: Deployment, batch: int, context: int) -> None:
    room = _concurrency(dep, context)
    if batch > room:
        raise ValueError(
            f"{dep.label}: the KV pool holds {sig(room)} sequences of {context:,} tokens, not "
            f"{batch}: raise tp, shrink batch/context or quantize"
        )


@explorer(
    "roofline.kernel_ranking",
    model=Choice(DENSE_MODELS),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 16, log=True, label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    batch=IntRange(1, 512, label="batch (sequences)"),
    context=IntRange(1, 131072, label="context tokens"),
)
def kernel_ranking(
    model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, batch: int, context: int
) -> View:
    """I008: each kernel's intensity against batch; where attention drops below the GEMMs."""
    m, g = models.model(model), hardware.gpu(gpu)
    cdt = _compute_dtype(g, weight_dtype)
    table = dk.decode_step_kernels(m, g, batch, context, tp, weight_dtype, kv_dtype, "bf16", cdt)
    att = dk.attention_decode_intensity(m, context, kv_dtype, tp=tp)
    shapes = dk.gemm_shapes(m, tp)
    cross = {}
    for name in GEMMS:
        k, n, _ = shapes[name]
        try:
            cross[name] = dk.gemm_attention_crossover_batch(
                k, n, att, weight_dtype, out_bytes=dk.LOGIT_BYTES if name == "lm_head" else None
            )
        except ValueError:
            cross[name] = float("inf")
    batches = np.geomspace(1, 512, 60)
    curves = {}
    for name in GEMMS:
        k, n, bias = shapes[name]
        out = dk.LOGIT_BYTES if name == "lm_head" else None
        curves[name] = dk.gemm_intensity(k, n, batches, weight_dtype, "bf16", bias, out)
    fig = _RANKING_FIGURE(batches, curves, att, g.ridge_point(cdt), batch)
    by = {r.name: r for r in table}
    gemm_t = sum(by[n].roofline_s for n in GEMMS)
    elem_t = sum(r.roofline_s for r in table if r.category in ("elementwise", "sampling"))
    try:
        room = _concurrency(Deployment(m, g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                       compute_dtype=cdt), context)
    except ValueError:  # the weights alone leave no KV pool
        room = 0.0
    fits = batch <= room
    rows = [
        ("attention intensity (any batch)", f"{sig(att)} FLOP/B"),
        (
            "GEMM intensity at this batch",
            f"{sig(min(by[n].intensity for n in GEMMS))}"
            f"-{sig(max(by[n].intensity for n in GEMMS))} FLOP/B",
        ),
        ("ranking flips at batch", f"{sig(min(cross.values()))}-{sig(max(cross.values()))}"),
        ("weight GEMMs (roofline)", fmt_time(gemm_t)),
        ("attention (roofline)", fmt_time(by["attention"].roofline_s)),
        ("elementwise + sampling (roofline)", fmt_time(elem_t)),
        ("KV pool holds (sequences)", f"{sig(room)}: {'fits' if fits else 'does not fit (roofline only)'}"),
    ]
    finite = [c for c in cross.values() if np.isfinite(c)]
    if not finite:
        flip = "no GEMM passes it at any batch"
    elif max(finite) <= 1:
        flip = "every GEMM is above it from batch 1"
    elif sig(min(finite)) == sig(max(finite)):
        flip = f"the GEMMs pass it at batch {sig(min(finite))}"
    else:
        flip = f"the GEMMs pass it between batch {sig(min(finite))} and {sig(max(finite))}"
    caption = (f"Each GEMM's intensity rises with the batch, which shares one weight read; attention (black, "
               f"{sig(att)} FLOP/B) stays flat because each sequence reads its own KV cache, and {flip}. Below the "
               f"dashed ridge ({sig(g.ridge_point(cdt))}) a kernel is memory-bound.")
    return View(
        f"{m.key} on {tp}x {g.key}, batch {batch}, context {context}",
        rows,
        fig,
        caption=caption,
        values={
            "attention_intensity": att,
            "crossover_min": min(cross.values()),
            "crossover_max": max(cross.values()),
            "gemm_s": gemm_t,
            "attention_s": by["attention"].roofline_s,
            "elementwise_s": elem_t,
        },
    )


ALLREDUCE = collectives.ALGORITHMS


@explorer(
    "roofline.batch1_gap",
    model=Choice(DENSE_MODELS),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 16, log=True, label="tensor parallel"),
    context=IntRange(1, 131072, label="context tokens"),
    cuda_graphs=Choice((True, False), label="CUDA graphs"),
    allreduce=Choice(ALLREDUCE, label="all-reduce algorithm"),
    gemv_efficiency=FloatRange(0.3, 1.0, 0.01, label="achieved HBM fraction (GEMVs)"),
    scheduler_us=FloatRange(0.0, 5000.0, 10.0, label="scheduler time per step (µs)"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
)
def batch1_gap(
    model: str,
    gpu: str,
    tp: int,
    context: int,
    cuda_graphs: bool,
    allreduce: str,
    gemv_efficiency: float,
    scheduler_us: float,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> View:
    """I007: one batch-1 decode step (lib.perf.step) as a trace, sorted into suspects."""
    dep = Deployment(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, cuda_graphs=cuda_graphs)
    _check_fits(dep, 1, context)
    a = st.step_assumptions(gemv_efficiency=gemv_efficiency, scheduler_s=scheduler_us * US,
                            allreduce_algorithm=allreduce)
    trace, b = gaps.suspects(dep, 1, context, a)
    floor = gaps.roofline_plan(dep, 1, 0)["memory_s"]
    fig = _GAP_FIGURE(b, floor)
    rows = [
        ("roofline floor (weights read / tp / W)", fmt_time(floor)),
        ("matmul-weight floor (what the GEMVs read)", fmt_time(b["floor"])),
    ]
    for key in sorted(gaps.BUCKETS, key=lambda k: -b[k]):
        rows.append((gaps.BUCKET_LABEL[key], fmt_time(b[key])))
    rows += [
        ("modelled step (lib.perf.step)", fmt_time(trace.step_s)),
        ("step / floor", f"{sig(trace.step_s / floor)}x"),
    ]
    top = max(gaps.BUCKETS, key=lambda k: b[k])
    caption = (f"The bar is the modelled batch-1 step, {fmt_time(trace.step_s)}, {sig(trace.step_s / floor)}x the black "
               f"line (the weights read at datasheet bandwidth); each segment after the floor is one suspect, and the "
               f"largest here is {gaps.BUCKET_LABEL[top]}: {fmt_time(b[top])}.")
    return View(
        f"{dep.label}, batch 1, context {context}",
        rows,
        fig,
        caption=caption,
        values={**b, "step": trace.step_s, "floor_params": floor},
    )


@explorer(
    "roofline.where_it_breaks",
    model=Choice(DENSE_MODELS),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 16, log=True, label="tensor parallel"),
    batch=IntRange(1, 512, label="decode batch"),
    prompt_len=IntRange(1, 65536, label="prompt tokens"),
    output_len=IntRange(1, 8192, label="output tokens"),
    allreduce=Choice(ALLREDUCE, label="all-reduce algorithm"),
    clock_fraction=FloatRange(0.5, 1.0, 0.01, label="sustained clock fraction"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
)
def where_it_breaks(
    model: str,
    gpu: str,
    tp: int,
    batch: int,
    prompt_len: int,
    output_len: int,
    allreduce: str,
    clock_fraction: float,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> View:
    """I009: the twenty-line plan and what each break adds to its decode step."""
    dep = Deployment(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    context = prompt_len + output_len // 2
    _check_fits(dep, batch, context)
    a = st.step_assumptions(allreduce_algorithm=allreduce)
    rows_w = gaps.plan_waterfall(dep, batch, context, prompt_len, output_len, a, clock_fraction)
    plan = rows_w[0][1]
    total = sum(v for _, v in rows_w)
    fig = _WATERFALL_FIGURE(rows_w, layout=(len(rows_w),))
    rows = [(label, fmt_time(v)) for label, v in rows_w]
    plan_d = gaps.roofline_plan(dep, batch, context)
    rows += [
        ("realistic step", fmt_time(total)),
        ("plan tokens/s per replica", sig(batch / plan)),
        ("realistic tokens/s per replica", sig(batch / total)),
        ("plan / realistic", f"{sig(total / plan)}x"),
        (
            "prompt tokens per step",
            sig(gaps.prefill_tokens_per_step(batch, prompt_len, output_len)),
        ),
        ("KV in use per GPU", fmt_bytes(plan_d["kv_per_gpu"])),
        ("KV pool holds (sequences)", sig(_concurrency(dep, context))),
        ("share lost to the breaks", fmt_pct(1 - plan / total)),
    ]
    label, worst = max(rows_w[1:], key=lambda r: r[1])
    caption = (f"The blue bar is the roofline plan's step, {fmt_time(plan)}; each red bar starts where the one above "
               f"ends and adds one break, to {fmt_time(total)} ({sig(total / plan)}x the plan). The largest is "
               f"'{label}', {fmt_time(worst)}.")
    return View(
        f"{dep.label}, batch {batch}, {prompt_len}+{output_len} tokens",
        rows,
        fig,
        caption=caption,
        values={"plan_s": plan, "total_s": total},
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _ranking_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(bottom=0.16)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.gemms = [ax.plot([], [], lw=1.2, label=name)[0] for name in GEMMS]
    a.attention = ax.axhline(1.0, color="black", lw=2)
    a.ridge = ax.axhline(1.0, color="grey", ls="--", lw=1)
    a.batch = ax.axvline(1.0, color="red", lw=1, label="this batch")
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("FLOP / byte")
    return a


def _ranking_draw(a: SimpleNamespace, batches, curves: dict, att: float, ridge: float, batch: int) -> None:
    for line, name in zip(a.gemms, GEMMS, strict=True):
        line.set_data(batches, curves[name])
    a.attention.set_ydata([att, att])
    a.attention.set_label(f"attention ({sig(att)})")
    a.ridge.set_ydata([ridge, ridge])
    a.ridge.set_label(f"ridge {sig(ridge)}")
    a.batch.set_xdata([batch, batch])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [*a.gemms, a.attention, a.ridge, a.batch], fontsize=7, ncol=2)


_RANKING_FIGURE = figures.LiveFigure(6.0, 3.0, _ranking_build, _ranking_draw)


def _gap_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(bottom=0.5)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, keys=("floor",) + gaps.BUCKETS)
    a.bars = [ax.barh([0], [0.0])[0] for _ in a.keys]
    for bar, key in zip(a.bars, a.keys, strict=True):
        bar.set_label("floor" if key == "floor" else gaps.BUCKET_LABEL[key])
    a.floor = ax.axvline(0.0, color="black", lw=1, label="weights read / tp / W")
    ax.set_yticks([])
    ax.set_xlabel("ms per decode step (black line: weights read / tp / W)")
    return a


def _gap_draw(a: SimpleNamespace, buckets: dict, floor: float) -> None:
    left = 0.0
    for bar, key in zip(a.bars, a.keys, strict=True):
        bar.set_x(left)
        bar.set_width(buckets[key] * 1e3)
        left += buckets[key] * 1e3
    a.floor.set_xdata([floor * 1e3] * 2)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [*a.bars, a.floor], fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45))


_GAP_FIGURE = figures.LiveFigure(6.4, 2.4, _gap_build, _gap_draw)


def _waterfall_build(fig, n: int) -> SimpleNamespace:
    fig.subplots_adjust(left=0.42, bottom=0.16)
    ax = fig.add_subplot()
    bars = ax.barh(np.arange(n)[::-1], np.zeros(n), color=["#4c72b0"] + ["#c44e52"] * (n - 1))
    bars[0].set_label("the roofline plan")
    bars[1].set_label("what each break adds")
    ax.set_xlabel("ms per decode step")
    return SimpleNamespace(ax=ax, bars=bars)


def _waterfall_draw(a: SimpleNamespace, rows_w: list) -> None:
    left = 0.0
    for i, (bar, (_label, v)) in enumerate(zip(a.bars, rows_w, strict=True)):
        bar.set_x(left * 1e3 if i else 0.0)
        bar.set_width(v * 1e3)
        left += v
    a.ax.set_yticks(range(len(rows_w)), [label for label, _ in rows_w][::-1], fontsize=7)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, a.bars.patches[:2], fontsize=7, loc="upper right")


_WATERFALL_FIGURE = figures.LiveFigure(6.4, 3.2, _waterfall_build, _waterfall_draw)
