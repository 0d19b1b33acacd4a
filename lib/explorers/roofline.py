"""Explorers for the roofline section."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import collectives
from lib.perf import roofline as rf
from lib.perf import tp_scaling as tps
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.perf.step import decode_step, step_assumptions
from lib.registry import hardware, models
from lib.registry.dtypes import BYTES_PER_ELEMENT
from lib.units import MS, fmt_int, fmt_pct, fmt_time, sig

WEIGHT_DTYPES = ("bf16", "fp8", "int4")


def _floor_build(fig):
    fig.subplots_adjust(bottom=0.45)
    return tps.build_step_stack(fig.add_subplot(), rows=1)


def _floor_draw(art, steps: dict) -> None:
    tps.draw_step_stack(art, steps, legend_kw={"fontsize": 7, "ncol": 3, "loc": "upper center",
                                               "bbox_to_anchor": (0.5, -0.35)})


_FLOOR_FIGURE = figures.LiveFigure(6.0, 2.6, _floor_build, _floor_draw)


def _crossover_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.compute, = ax.plot([], [], label="matmul time (at this MFU)")
    a.memory, = ax.plot([], [], label="weight + KV read time")
    a.crossover = ax.axvline(1.0, color="grey", ls="--", lw=1, label="crossover (peak FLOPs)")
    a.prompt = ax.axvline(1.0, color="red", lw=1)
    ax.set_xlabel("prompt tokens in one forward pass")
    ax.set_ylabel("ms")
    return a


def _crossover_draw(a: SimpleNamespace, lengths, compute, memory, crossover: float, prompt_len: int) -> None:
    a.compute.set_data(lengths, compute)
    a.memory.set_data(lengths, memory)
    a.crossover.set_xdata([crossover, crossover])
    a.prompt.set_xdata([prompt_len, prompt_len])
    a.prompt.set_label(f"prompt {prompt_len}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.compute, a.memory, a.crossover, a.prompt], fontsize=7)


_CROSSOVER_FIGURE = figures.LiveFigure(6.0, 3.0, _crossover_build, _crossover_draw)
COMPUTE_DTYPES = ("bf16", "fp8")


@explorer(
    "roofline.decode_floor",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    batch=IntRange(1, 1024, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    bandwidth_efficiency=FloatRange(0.3, 1.0, 0.05, label="achieved HBM fraction"),
    cuda_graphs=Choice((True, False), label="CUDA graphs"),
    allreduce_algorithm=Choice(collectives.ALGORITHMS, label="all-reduce"),
)
def decode_floor(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, batch: int,
                 context: int, bandwidth_efficiency: float, cuda_graphs: bool,
                 allreduce_algorithm: str) -> View:
    """I001: the weight-read floor of one decode step and what stacks on top of it
    (lib.perf.step.decode_step: the one step model; collectives from lib.perf.collectives)."""
    dep = Deployment(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, cuda_graphs=cuda_graphs)
    if context > 0 and batch > dep.budget.max_sequences(context):
        raise ValueError(f"{model} on {tp}x {gpu} holds {sig(dep.budget.max_concurrency(context))} sequences of "
                         f"{context} tokens in its KV cache; batch {batch} does not fit: raise tp, shrink "
                         f"batch/context or quantize")
    assume = step_assumptions(gemv_efficiency=bandwidth_efficiency, kv_efficiency=bandwidth_efficiency,
                              allreduce_algorithm=allreduce_algorithm)
    step = decode_step(dep, batch, context, assume)
    parts = {k: v for k, v in step.buckets.items() if v > 0}
    total = step.total_s
    fig = _FLOOR_FIGURE({f"TP{tp}": step})
    rows = [(k.replace("_", " "), fmt_time(v)) for k, v in parts.items()]
    rows += [("step total", fmt_time(total)), ("floor / total", fmt_pct(step.floor_s / total)),
             ("tokens/s per sequence", sig(1 / total))]
    floor_parts = ("its leftmost segment is the read floor (weights" if step.buckets["kv_cache"] <= 0 else
                   "its two leftmost segments are the read floor (weights and KV cache")
    caption = (f"The bar is one decode step of {fmt_time(total)}: {floor_parts} at datasheet bandwidth, "
               f"{fmt_pct(step.floor_s / total)} of the step); everything to the right is what a real server adds.")
    return View(f"{dep.label}, batch {batch}, context {context}", rows, fig, caption=caption,
                values={**step.buckets, "floor": step.floor_s, "total": total})


@explorer(
    "roofline.ridge_point",
    gpu=Choice(tuple(hardware.gpu_names())),
    dtype=Choice(("bf16", "fp16", "fp8", "tf32", "fp32")),
    m=IntRange(1, 65536, log=True, label="GEMM M (tokens)"),
    m_prefill=IntRange(1, 131072, log=True, label="prefill M (tokens)"),
    n=IntRange(1, 65536, log=True, label="GEMM N"),
    k=IntRange(1, 65536, log=True, label="GEMM K"),
)
def ridge_point(gpu: str, dtype: str, m: int, m_prefill: int, n: int, k: int) -> View:
    """N001: a chip's ridge point and where a GEMM of a given shape lands against it, at M tokens
    and at the prefill's M, beside an elementwise add (1 FLOP per 6 bytes)."""
    g = hardware.gpu(gpu)
    storage = dtype if dtype in BYTES_PER_ELEMENT else "bf16"
    ridge = g.ridge_point(dtype)
    t = rf.roofline_time(*rf.gemm_flops_bytes(m, n, k, storage), g, dtype)
    tp = rf.roofline_time(*rf.gemm_flops_bytes(m_prefill, n, k, storage), g, dtype)
    add = 1 / 6
    fig = rf.plot_roofline(g, dtype, {f"GEMM {m}x{n}x{k}": t.intensity,
                                      f"prefill GEMM, M = {m_prefill}": tp.intensity,
                                      "elementwise add": add})
    rows = [("ridge point", f"{sig(ridge)} FLOP/byte"), ("GEMM intensity", f"{sig(t.intensity)} FLOP/byte"),
            ("bound", t.bound), ("time bound", fmt_time(t.time_s)),
            ("attainable", f"{fmt_pct(rf.attainable_flops(t.intensity, g, dtype) / g.peak_flops(dtype))} of peak"),
            (f"prefill GEMM intensity (M = {m_prefill})", f"{sig(tp.intensity)} FLOP/byte"),
            ("prefill bound, time", f"{tp.bound}, {fmt_time(tp.time_s)}")]

    caption = (f"Left of the dashed ridge ({sig(ridge)} FLOP/byte) a dot sits on the sloped bandwidth roof and its "
               f"time is its bytes; right of it, on the flat compute roof. The GEMM at M = {fmt_int(m)} ({sig(t.intensity)} "
               f"FLOP/byte) is {t.bound}-bound, at M = {fmt_int(m_prefill)} ({sig(tp.intensity)}) {tp.bound}-bound, and the "
               f"add ({sig(add)}) memory-bound at any size.")
    return View(f"{g.key} {dtype}", rows, fig, caption=caption,
                values={"ridge": ridge, "intensity": t.intensity, "intensity_prefill": tp.intensity})


@explorer(
    "roofline.prefill_crossover",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    dtype=Choice(COMPUTE_DTYPES, label="weights and matmuls"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    prompt_len=IntRange(1, 131072, label="prompt tokens"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="achieved fraction of peak FLOPs"),
)
def prefill_crossover(model: str, gpu: str, tp: int, dtype: str, kv_dtype: str, prompt_len: int,
                      mfu: float) -> View:
    """I003: where prefill turns compute-bound, and the TTFT of a prompt."""
    m, g = models.model(model), hardware.gpu(gpu)
    dep = tps.require_serves(Deployment(m.key, g.key, tp=tp, weight_dtype=dtype, compute_dtype=dtype,
                                        kv_dtype=kv_dtype), 1, prompt_len)
    crossover = rf.prefill_crossover_tokens(m, g, dtype, dtype)  # weight read vs matmuls: no KV term
    lengths = np.unique(np.geomspace(1, max(4 * crossover, 2 * prompt_len), 60).astype(int))
    steps = [rf.prefill(m, g, int(p), tp, 1, dtype, dtype, kv_dtype) for p in lengths]
    compute = [s.compute_s / mfu / MS for s in steps]
    memory = [s.memory_s / MS for s in steps]
    fig = _CROSSOVER_FIGURE(lengths, compute, memory, crossover, prompt_len)
    step = rf.prefill(m, g, prompt_len, tp, 1, dtype, dtype, kv_dtype)
    floor = max(step.compute_s / mfu, step.memory_s)
    full = prefill_time(dep, prompt_len, mfu=mfu)  # THE prefill time: the floor plus the TP all-reduces
    rows = [("crossover (peak FLOPs)", f"{sig(crossover)} tokens"),
            ("crossover at this MFU (datasheet bandwidth)", f"{sig(crossover * mfu)} tokens"),
            ("prefill bound", "compute" if step.compute_s / mfu >= step.memory_s else "memory"),
            ("prefill floor (no communication)", fmt_time(floor)),
            ("TP all-reduces (grow with the prompt)", fmt_time(full.allreduce_s)),
            ("TTFT = prefill time, queueing excluded", fmt_time(full.time_s))]
    caption = (f"The rising line (matmuls at this MFU) crosses the nearly flat one (weight and KV reads) near "
               f"{sig(crossover * mfu)} tokens; the dashed line is the crossover at peak FLOP/s, {sig(crossover)}. "
               f"The red line is this {fmt_int(prompt_len)}-token prompt: its prefill is {rows[2][1]}-bound.")
    return View(f"{m.key} on {tp}x {g.key} ({dtype}, KV {kv_dtype})", rows, fig, caption=caption,
                values={"crossover": crossover, "floor": floor, "ttft": full.time_s})

