"""Explorers for the roofline questions on FLOPs per token, the prefill/decode crossover, the
prefill floor, decode batching against the KV cache, and decode-attention intensity
(I002, I004, I006, N002, N023, N039)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import attention_intensity as ai
from lib.perf import prefill as pf
from lib.perf import roofline as rf
from lib.perf import tp_scaling as tps
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.registry.dtypes import bytes_per_element
from lib.units import MS, fmt_count, fmt_flops, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())
WEIGHT_DTYPES = ("bf16", "fp8", "int4")
MATMUL_DTYPES = ("bf16", "fp8")
KV_DTYPES = ("bf16", "fp8")


def _tokens(x: float) -> str:
    return "none (never)" if not math.isfinite(x) else f"{sig(x)} tokens"


def _weights_read(m, batches, dtype: str) -> np.ndarray:
    """Weight bytes one pass reads for each token count (MoE aware; dense: a constant)."""
    if not m.is_moe:
        return np.full(len(batches), m.params_total * bytes_per_element(dtype))
    return np.array([rf.weight_bytes_read_per_step(m, int(b), dtype) for b in batches])


def _deployment(m, g, tp: int, dtype: str, kv_dtype: str = "bf16", prompt_len: int = 0) -> Deployment:
    """The replica, refused (ValueError naming the limit) when the memory budget cannot hold its
    weights, or one request of ``prompt_len`` tokens (:func:`lib.perf.tp_scaling.require_serves`)."""
    dep = Deployment(m.key, g.key, tp=tp, weight_dtype=dtype, compute_dtype=dtype, kv_dtype=kv_dtype)
    return tps.require_serves(dep, 1, prompt_len)


@explorer(
    "roofline.flops_per_token",
    model=Choice(MODELS),
    context=IntRange(0, 262144, label="context tokens"),
)
def flops_per_token(model: str, context: int) -> View:
    """I002: the 2N rule rebuilt from the config, and the context where attention catches up."""
    m = models.model(model)
    inv = pf.weight_inventory(m)
    lookup = sum(r.params_stored for r in inv if r.kind == "lookup")
    elementwise = sum(r.params_stored for r in inv if r.kind == "elementwise")
    two_n, attn = m.weight_flops_per_token(), m.attention_flops_per_token(context)
    breakeven = m.attention_breakeven_context()
    hi = int(max(2.2 * breakeven, 1.3 * context, 1024))
    c = np.linspace(0, hi, 120)
    a = m.attention_flops_per_token(1) * c
    fig = _FLOPS_FIGURE(c, two_n, a, breakeven, context)
    rows = [
        ("stored parameters", fmt_count(m.params_total)),
        ("active parameters", fmt_count(m.params_active)),
        ("lookup tables (no FLOPs)", fmt_count(lookup)),
        ("norms and biases (elementwise)", fmt_count(elementwise)),
        ("matmul parameters N", fmt_count(m.matmul_params_active)),
        ("2 x stored params", f"{sig(2 * m.params_total / 1e9)} GFLOP"),
        ("2N (matmul)", f"{sig(two_n / 1e9)} GFLOP"),
        ("attention at this context", f"{sig(attn / 1e9)} GFLOP"),
        ("attention share", fmt_pct(attn / (two_n + attn))),
        ("breakeven context (one token)", f"{sig(breakeven)} tokens"),
        ("breakeven window, Kaplan form", f"{sig(2 * breakeven)} tokens"),
    ]
    caption = (f"Per token, the weights cost a flat {sig(two_n / 1e9)} GFLOP (2N, the lower band) and attention adds a "
               f"band that grows with the context; the two are equal at the dashed breakeven, {sig(breakeven)} tokens. "
               f"At this context of {fmt_int(context)} (red) attention is {fmt_pct(attn / (two_n + attn))} of the total.")
    return View(
        f"{m.key}: FLOPs per token at context {context}",
        rows,
        fig,
        caption=caption,
        values={"two_n": two_n, "attention": attn, "breakeven": breakeven},
    )


@explorer(
    "roofline.crossover_coincidence",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    compute_dtype=Choice(MATMUL_DTYPES, label="matmuls"),
)
def crossover_coincidence(model: str, gpu: str, weight_dtype: str, compute_dtype: str) -> View:
    """I006: tokens per pass where weight read = matmul time, against the chip's ridge point."""
    m, g = models.model(model), hardware.gpu(gpu)
    ridge = g.ridge_point(compute_dtype)
    cross = pf.weight_read_crossover_tokens(m, g, weight_dtype, compute_dtype)
    names, crosses, ridges = [], [], []
    for key in GPUS:
        chip = hardware.gpu(key)
        if compute_dtype in chip.dtypes:
            names.append(key)
            crosses.append(pf.weight_read_crossover_tokens(m, chip, weight_dtype, compute_dtype))
            ridges.append(chip.ridge_point(compute_dtype))
    fig = _COINCIDENCE_FIGURE(names, ridges, crosses, compute_dtype)
    rows = [
        ("ridge point", f"{sig(ridge)} FLOP/byte"),
        ("crossover", f"{sig(cross)} tokens per pass"),
        ("crossover / ridge", sig(cross / ridge)),
        ("bytes per weight / 2 FLOPs", sig(bytes_per_element(weight_dtype) / 2)),
        ("stored / matmul params", sig(m.params_total / m.matmul_params_active, 4)),
    ]
    caption = (f"For each chip, the left bar is its ridge and the right bar the tokens per pass at which reading "
               f"{m.key}'s weights takes as long as its matmuls. The two differ by the same factor on every chip, "
               f"{sig(cross / ridge)} here: bytes per weight over 2 FLOPs, times stored over matmul parameters.")
    return View(
        f"{m.key} on {g.key}: {weight_dtype} weights, {compute_dtype} matmuls",
        rows,
        fig,
        caption=caption,
        values={"ridge": ridge, "crossover": cross},
    )


@explorer(
    "roofline.pass_bottleneck",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    dtype=Choice(MATMUL_DTYPES, label="weights and matmuls"),
    tokens=IntRange(1, 131072, label="tokens in the pass"),
)
def pass_bottleneck(model: str, gpu: str, tp: int, dtype: str, tokens: int) -> View:
    """N023: one forward pass reads every weight; does the read or the matmul bind at T tokens?"""
    m, g = models.model(model), hardware.gpu(gpu)
    rf.decode_step(m, g, tp, 1, 0, dtype, dtype, dtype)  # validates tp and dtypes
    _deployment(m, g, tp, dtype)
    read_s = rf.weight_bytes_read_per_step(m, tokens, dtype) / tp / g.memory_bandwidth
    matmul_s = m.weight_flops_per_token() * tokens / tp / g.peak_flops(dtype)
    cross = pf.weight_read_crossover_tokens(m, g, dtype, dtype)
    t = np.unique(np.geomspace(1, max(4 * tokens, 8 * cross, 16), 40).astype(int))
    reads = _weights_read(m, t, dtype) / tp / g.memory_bandwidth / MS
    matmul = m.weight_flops_per_token() * t / tp / g.peak_flops(dtype) / MS
    fig = _PASS_FIGURE(t, reads, matmul, cross, tokens)
    step = max(read_s, matmul_s)
    rows = [
        ("weight read", fmt_time(read_s)),
        ("matmul at peak", fmt_time(matmul_s)),
        ("bound", "weight read (memory)" if read_s > matmul_s else "matmul (compute)"),
        ("binding / other", f"{sig(max(read_s, matmul_s) / min(read_s, matmul_s))}x"),
        ("time per token in the pass", fmt_time(step / tokens)),
        ("crossover", f"{sig(cross)} tokens"),
    ]
    flat = "grows only as a pass touches more experts" if m.is_moe else "is flat"
    caption = (f"The weight read {flat} while the matmul time rises with the tokens; they cross at the dashed line, "
               f"{sig(cross)} tokens. This pass of {fmt_int(tokens)} (red) is bound by the "
               f"{'weight read' if read_s > matmul_s else 'matmul'}, "
               f"{sig(max(read_s, matmul_s) / min(read_s, matmul_s))}x the other.")
    return View(
        f"{m.key} on {tp}x {g.key} ({dtype}), {tokens} tokens per pass",
        rows,
        fig,
        caption=caption,
        values={"read_s": read_s, "matmul_s": matmul_s, "crossover": cross},
    )


@explorer(
    "roofline.prefill_floor",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 64, log=True, label="GPUs in the replica (TP)"),
    dtype=Choice(MATMUL_DTYPES, label="weights and matmuls"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    prompt_len=IntRange(1, 131072, label="prompt tokens"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="achieved fraction of peak"),
    include_attention=Choice((True, False), label="count attention FLOPs"),
)
def prefill_floor(
    model: str,
    gpu: str,
    n_gpus: int,
    dtype: str,
    kv_dtype: str,
    prompt_len: int,
    mfu: float,
    include_attention: bool,
) -> View:
    """N039: prefill time = FLOPs / effective replica FLOP/s plus the TP all-reduces, and the TTFT."""
    m, g = models.model(model), hardware.gpu(gpu)
    est = pf.prefill_estimate(m, g, prompt_len, n_gpus, mfu, dtype, dtype, kv_dtype, include_attention)
    dep = _deployment(m, g, n_gpus, dtype, kv_dtype, prompt_len)
    full = pf.prefill_time(dep, prompt_len, mfu=mfu)  # THE prefill time (attention always counted)
    comm = full.allreduce_s
    lengths = np.geomspace(16, max(2 * prompt_len, 1024), 60)
    per_key = m.attention_flops_per_token(1) if include_attention else 0.0
    flops = m.weight_flops_per_token() * lengths + per_key * lengths * (lengths + 1) / 2
    peak = n_gpus * g.peak_flops(dtype)
    fig = _PREFILL_FIGURE(lengths, flops / peak, mfu, est.memory_s, prompt_len, est.time_s)
    rows = [
        ("FLOPs", f"{sig(est.flops / 1e15)} PFLOP"),
        ("of which attention", fmt_pct(est.flops_attention / est.flops)),
        ("effective replica FLOP/s", fmt_flops(est.replica_flops_per_s)),
        ("compute time", fmt_time(est.compute_s)),
        ("weight-read floor", fmt_time(est.memory_s)),
        ("prefill floor (no communication)", f"{fmt_time(est.time_s)} ({est.bound}-bound)"),
        ("TP all-reduces (grow with the tokens)", fmt_time(comm)),
        ("prefill time = TTFT, queueing excluded", fmt_time(pf.ttft_s(full))),
    ]
    caption = (f"A prefill takes the longer of its compute (solid: at {fmt_pct(mfu)} of peak; dashed: at peak) and the "
               f"weight-read floor (grey). The red dot, this {fmt_int(prompt_len)}-token prompt, is {est.bound}-bound at "
               f"{fmt_time(est.time_s)}, before the TP all-reduces.")
    return View(
        f"{m.key}, {prompt_len}-token prompt on {n_gpus}x {g.key} ({dtype}, KV {kv_dtype})",
        rows,
        fig,
        caption=caption,
        values={"prefill_s": full.time_s, "floor_s": est.time_s, "comm_s": comm},
    )


@explorer(
    "roofline.decode_batch_ceiling",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    context=IntRange(1, 131072, label="context tokens per sequence"),
    memory_utilization=FloatRange(0.5, 1.0, 0.01, label="usable HBM fraction"),
)
def decode_batch_ceiling(
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    context: int,
    memory_utilization: float,
) -> View:
    """N002: decode intensity ~ batch, the ridge batch, and the batch the KV cache allows."""
    m, g = models.model(model), hardware.gpu(gpu)
    ridge = g.ridge_point("bf16")
    dep = Deployment(m.key, g.key, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     memory_utilization=memory_utilization)
    b_max = dep.budget.max_concurrency(context)  # the memory budget, with its fraction
    ridge_batch = pf.weight_read_crossover_tokens(m, g, weight_dtype, "bf16")
    step_ridge = pf.decode_ridge_batch(m, g, context, tp, weight_dtype, kv_dtype)
    limit = pf.decode_intensity_limit(m, context, tp, kv_dtype)
    hi = int(max(4 * ridge_batch, 2 * b_max, 16))
    b = np.unique(np.geomspace(1, hi, 40).astype(int))
    w = _weights_read(m, b, weight_dtype) / tp
    kv_seq = context * m.kv_bytes_per_token(kv_dtype) * rf.kv_shard_fraction(m, tp)
    fig = _CEILING_FIGURE(b, b * m.weight_flops_per_token() / tp / w,
                          b * m.flops_per_token(context) / tp / (w + b * kv_seq), context, ridge, b_max)
    at_cap = (
        pf.decode_intensity(m, int(b_max), context, tp, weight_dtype, kv_dtype) if b_max >= 1 else 0.0
    )
    rows = [
        ("ridge (BF16)", f"{sig(ridge)} FLOP/byte"),
        ("batch where weight GEMMs reach it", sig(ridge_batch)),
        ("KV-capacity batch ceiling", sig(b_max)),
        ("ceiling vs ridge batch", "above" if b_max >= ridge_batch else "below"),
        ("whole-step intensity at ceiling", f"{sig(at_cap) if at_cap else '-'} FLOP/byte"),
        ("whole-step limit (infinite batch)", f"{sig(limit)} FLOP/byte"),
        (
            "batch where whole step reaches ridge",
            "none" if not math.isfinite(step_ridge) else sig(step_ridge),
        ),
    ]
    step_end = (f"reaches the ridge at batch {sig(step_ridge)}" if math.isfinite(step_ridge) else
                f"levels off at {sig(limit)} FLOP/byte, below the ridge at any batch")
    kv = (f"The KV cache stops the batch at {sig(b_max)} (red), {'above' if b_max >= ridge_batch else 'below'} the "
          "GEMMs' ridge batch." if b_max >= 1 else "Not one sequence of this context fits in the KV cache.")
    caption = (f"Weight-GEMM intensity grows with the batch and meets the dashed ridge at batch {sig(ridge_batch)}; "
               f"the whole step, whose KV reads grow with the batch too, {step_end}. {kv}")
    return View(
        f"{m.key} on {tp}x {g.key}, context {context}",
        rows,
        fig,
        caption=caption,
        values={"b_max": b_max, "ridge_batch": ridge_batch, "limit": limit},
    )


@explorer(
    "roofline.attention_intensity",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    query_tokens=IntRange(1, 16, label="query tokens per sequence (MTP / speculation)"),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    absorbed=Choice((True, False), label="MLA absorbed"),
    context=IntRange(1, 131072, label="context tokens"),
)
def attention_intensity(
    model: str, gpu: str, kv_dtype: str, query_tokens: int, tp: int, absorbed: bool, context: int
) -> View:
    """I004: decode-attention intensity from the head-count ratio, for MHA, GQA and MLA."""
    m, g = models.model(model), hardware.gpu(gpu)
    geo = ai.attention_geometry(m, tp, absorbed)
    limit = ai.decode_attention_intensity(m, None, query_tokens, kv_dtype, "bf16", tp, absorbed)
    exact = ai.decode_attention_intensity(m, context, query_tokens, kv_dtype, "bf16", tp, absorbed)
    at_256 = ai.decode_attention_flops_bytes(
        m, context, 256, query_tokens, kv_dtype, "bf16", tp, absorbed
    )
    ridge = g.ridge_point("bf16")
    fig = rf.plot_roofline(g, "bf16", {"attention": exact, "weight GEMMs, batch 64": 64.0})
    rows = [
        ("query heads per cached unit", sig(geo.heads_per_unit)),
        ("cached elements per token per unit", str(geo.cache_elements_per_unit)),
        ("intensity, long-context limit", f"{sig(limit)} FLOP/byte"),
        ("intensity at this context", f"{sig(exact)} FLOP/byte"),
        ("same at batch 256", f"{sig(at_256[0] / at_256[1])} FLOP/byte"),
        ("ridge (BF16 matmuls)", f"{sig(ridge)} FLOP/byte"),
        ("intensity / ridge", sig(exact / ridge)),
        ("bound", "compute" if exact >= ridge else "memory"),
    ]
    side = (f"memory-bound, {sig(ridge / exact)}x left of the dashed ridge" if exact < ridge else
            "compute-bound, right of the dashed ridge")
    caption = (f"Decode attention sits at {sig(exact)} FLOP/byte at any batch, since each sequence reads its own KV "
               f"cache: {side}. A weight GEMM at batch 64 is drawn beside it for comparison.")
    return View(
        f"{m.key} decode attention on {g.key} (tp={tp}, KV {kv_dtype})",
        rows,
        fig,
        caption=caption,
        values={"limit": limit, "exact": exact, "ridge": ridge},
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _flops_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.weights = ax.fill_between([0.0, 1.0], 0.0, 0.0, alpha=0.7, color="C0", label="2N (weights)", lw=0)
    a.attention = ax.fill_between([0.0, 1.0], 0.0, 0.0, alpha=0.7, color="C1", label="attention", lw=0)
    a.breakeven = ax.axvline(0.0, color="black", ls="--", lw=1)
    a.context = ax.axvline(0.0, color="red", lw=1)
    ax.set_xlabel("context (thousand tokens)")
    ax.set_ylabel("GFLOP per token")
    return a


def _flops_draw(a: SimpleNamespace, c, two_n: float, attention, breakeven: float, context: int) -> None:
    x, base = c / 1e3, np.full_like(c, two_n / 1e9)
    a.weights.set_data(x, 0.0, base)
    a.attention.set_data(x, base, base + attention / 1e9)
    a.breakeven.set_xdata([breakeven / 1e3] * 2)
    a.breakeven.set_label(f"breakeven {sig(breakeven)}")
    a.context.set_xdata([context / 1e3] * 2)
    a.context.set_label(f"context {context}")
    a.ax.set_xlim(0.0, x[-1])
    a.ax.set_ylim(0.0, 1.05 * float(np.max(base + attention / 1e9)))
    figures.legend(a.ax, [a.weights, a.attention, a.breakeven, a.context], fontsize=7, loc="upper left")


_FLOPS_FIGURE = figures.LiveFigure(6.0, 3.0, _flops_build, _flops_draw)


def _coincidence_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(bottom=0.25)
    ax = fig.add_subplot()
    x = np.arange(len(GPUS))  # a bar pair per GPU; GPUs without the matmul dtype are hidden
    a = SimpleNamespace(ax=ax)
    a.ridges = ax.bar(x - 0.2, np.zeros(len(GPUS)), 0.4)
    a.crosses = ax.bar(x + 0.2, np.zeros(len(GPUS)), 0.4, label="crossover (tokens per pass)")
    return a


def _coincidence_draw(a: SimpleNamespace, names: list[str], ridges, crosses, compute_dtype: str) -> None:
    for bars, heights in ((a.ridges, ridges), (a.crosses, crosses)):
        for i, bar in enumerate(bars):
            bar.set_visible(i < len(names))
            bar.set_height(heights[i] if i < len(names) else 0.0)
    a.ridges.set_label(f"ridge, {compute_dtype} (FLOP/byte)")
    a.ax.set_xticks(np.arange(len(names)), names, rotation=30, fontsize=7)
    a.ax.set_xlim(-0.6, len(names) - 0.4)
    a.ax.set_ylim(0, 1.3 * max(*ridges, *crosses))  # room for the legend above the bars
    figures.legend(a.ax, [a.ridges, a.crosses], fontsize=7, loc="upper left", ncol=2)


_COINCIDENCE_FIGURE = figures.LiveFigure(6.0, 2.8, _coincidence_build, _coincidence_draw)


def _pass_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.read, = ax.plot([], [], label="weight read")
    a.matmul, = ax.plot([], [], label="matmul at peak")
    a.cross = ax.axvline(1.0, color="grey", ls="--", lw=1)
    a.tokens = ax.axvline(1.0, color="red", lw=1)
    ax.set_xlabel("tokens in one forward pass")
    ax.set_ylabel("ms per pass (per GPU)")
    return a


def _pass_draw(a: SimpleNamespace, t, reads, matmul, cross: float, tokens: int) -> None:
    a.read.set_data(t, reads)
    a.matmul.set_data(t, matmul)
    a.cross.set_xdata([cross, cross])
    a.cross.set_label(f"crossover {sig(cross)}")
    a.tokens.set_xdata([tokens, tokens])
    a.tokens.set_label(f"this pass: {tokens}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.read, a.matmul, a.cross, a.tokens], fontsize=7)


_PASS_FIGURE = figures.LiveFigure(6.0, 3.0, _pass_build, _pass_draw)


def _prefill_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.peak, = ax.plot([], [], "--", color="C0", label="compute at 100% of peak")
    a.achieved, = ax.plot([], [], "-", color="C1")
    a.floor = ax.axhline(1.0, color="grey", lw=1, label="weight-read floor")
    a.point, = ax.plot([], [], "o", color="red", label="this prompt (prefill floor)")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("seconds")
    return a


def _prefill_draw(a: SimpleNamespace, lengths, at_peak_s, mfu: float, floor_s: float, prompt_len: int,
                  time_s: float) -> None:
    a.peak.set_data(lengths, at_peak_s)
    a.achieved.set_data(lengths, at_peak_s / mfu)
    a.achieved.set_label(f"compute at {fmt_pct(mfu)} of peak")
    a.floor.set_ydata([floor_s, floor_s])
    a.point.set_data([prompt_len], [time_s])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.peak, a.achieved, a.floor, a.point], fontsize=7)


_PREFILL_FIGURE = figures.LiveFigure(6.0, 3.0, _prefill_build, _prefill_draw)


def _ceiling_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.gemms, = ax.plot([], [], label="weight GEMMs only")
    a.step, = ax.plot([], [])
    a.ridge = ax.axhline(1.0, color="grey", ls="--", lw=1)
    a.kv = ax.axvline(1.0, color="red", lw=1)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("FLOP/byte")
    return a


def _ceiling_draw(a: SimpleNamespace, b, gemms, step, context: int, ridge: float, b_max: float) -> None:
    a.gemms.set_data(b, gemms)
    a.step.set_data(b, step)
    a.step.set_label(f"whole step, KV at {context} tokens")
    a.ridge.set_ydata([ridge, ridge])
    a.ridge.set_label(f"ridge {sig(ridge)}")
    a.kv.set_xdata([b_max, b_max])
    a.kv.set_label(f"KV capacity {sig(b_max)}")
    a.kv.set_visible(b_max >= 1)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.gemms, a.step, a.ridge, a.kv], fontsize=7)


_CEILING_FIGURE = figures.LiveFigure(6.0, 3.0, _ceiling_build, _ceiling_draw)
