"""Explorers for the GEMM tile's shape (I036) and the steps of a hand-written SGEMM (N099).

``cuda_kernels.gemm_tile_shape`` draws every tile of 64-256 x 64-256 on an L2 roofline
(:func:`lib.kernels.gemm_tiles.tile_plan`); ``cuda_kernels.tiled_gemm`` draws each SGEMM step's
modelled ceiling beside the H200 measurement (:func:`lib.kernels.gemm_tiles.sgemm_step`). Each keeps
one persistent figure updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import gemm_tiles as gt
from lib.registry import hardware
from lib.units import fmt_bytes, fmt_flops, fmt_int, fmt_pct, sig

ALL_GPUS = tuple(hardware.gpu_names())
TILE_DTYPES = ("bf16", "fp16", "fp8", "tf32")
SIDES = (64, 128, 256)
GRID = tuple((m, n) for m in SIDES for n in SIDES)
"""The tiles the I036 figure places: every tile_m x tile_n of 64, 128 and 256."""
_VERDICT_STYLE = {"runs": ("o", "#1f77b4", "full"), "spills": ("X", "#d62728", "full"),
                  "does not launch": ("o", "#7f7f7f", "none")}


def _measured_triton(gpu: str, dtype: str) -> list[tuple[float, float, str]]:
    """(intensity, TFLOP/s, label) of the Triton rows measured on this GPU in bf16; [] elsewhere."""
    from lib.registry.measured import measured_gpus

    if dtype != "bf16" or gpu not in measured_gpus():
        return []
    return [(p.intensity, r["TFLOPs"], f"{r['tile']}/{r['warps']}w/{r['stages']}s")
            for r, p in gt.triton_comparison(gpu)]


# ---- I036: the tile on an L2 roofline --------------------------------------------------------------


def _tile_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.91)
    figures.log_scale(ax, "x", base=2)
    a = SimpleNamespace(ax=ax)
    a.l2, = ax.plot([], [], color="#ff7f0e", lw=1.4, label="L2 roof: intensity x L2 bandwidth")
    a.roof, = ax.plot([], [], color="black", lw=1.2, label="compute roof: efficiency x dense peak")
    a.peak, = ax.plot([], [], color="black", lw=0.8, ls=":")
    a.points = {v: ax.plot([], [], ls="none", marker=m, color=c, fillstyle=f, ms=6, label=f"model: {v}")[0]
                for v, (m, c, f) in _VERDICT_STYLE.items()}
    a.labels = [ax.text(0, 0, "", fontsize=6.5, ha="left", va="bottom") for _ in GRID]
    a.here, = ax.plot([], [], ls="none", marker="o", ms=12, mfc="none", mec="#d62728", mew=1.6)
    a.meas, = ax.plot([], [], ls="none", marker="+", color="black", ms=8, mew=1.3,
                      label="measured: Triton on one H200 (bf16 only)")
    ax.set_xlabel("operand intensity of the tile (FLOP per byte loaded)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True)
    # built once: the entries never change (a legend rebuilt on every update costs half the redraw)
    ax.legend(handles=[a.l2, a.roof, *a.points.values(), a.meas], loc="upper center", bbox_to_anchor=(0.5, -0.15),
              ncol=3, fontsize=6.5, frameon=False)
    return a


def _tile_draw(a, xs, l2, roof, peak, points, here, measured, title) -> None:
    a.l2.set_data(xs, np.minimum(l2, peak * 1.15))
    a.roof.set_data(xs, np.full_like(xs, roof))
    a.peak.set_data(xs, np.full_like(xs, peak))
    for verdict, line in a.points.items():
        sel = [(x, y) for x, y, v, _lab in points if v == verdict]
        line.set_data([x for x, _ in sel], [y for _, y in sel])
    for text, (x, y, _v, lab) in zip(a.labels, points, strict=True):
        text.set_position((x * 1.03, y))
        text.set_text(lab)
    a.here.set_data([here[0]], [here[1]])
    a.meas.set_data([m[0] for m in measured], [m[1] for m in measured])
    a.meas.set_visible(bool(measured))
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(0, peak * 1.15)
    a.ax.set_title(title, fontsize=8)


_TILE_FIGURE = figures.LiveFigure(6.6, 4.2, _tile_build, _tile_draw)


def tile_rows(p: gt.TilePlan) -> list[tuple[str, str]]:
    """The table of one tile plan: each constraint and its verdict."""
    ridge = gt.l2_ridge_point(p.gpu, p.dtype, p.efficiency)
    return [
        ("operand intensity", f"{sig(p.intensity)} FLOP/B (L2 ridge at eta x peak: {sig(ridge)})"),
        ("L2 roof / compute roof", f"{fmt_flops(p.l2_roof_flops)} / {fmt_flops(p.compute_roof_flops)}"),
        ("bk (128-byte swizzle row)", f"{p.bk} ({p.dtype}, {sig(p.element_bytes)} B per element)"),
        ("shared memory", f"{p.stages} stages x {fmt_bytes(p.bytes_per_step, 'KiB')} = {fmt_bytes(p.smem_bytes, 'KiB')} "
                          f"of {fmt_bytes(p.max_smem_per_block, 'KiB')} per block (at most {p.max_stages} stages)"),
        ("stages that hide the L2 latency", fmt_int(p.stages_needed)),
        ("accumulator", f"{p.accumulator_registers_per_cta:,} registers = {fmt_pct(p.accumulator_share_of_sm)} of the "
                        f"SM's; {p.accumulator_per_thread} per thread over {p.threads}"),
        ("registers per thread", f"{p.registers_needed} needed (+{p.overhead_registers} besides the accumulator), "
                                 + (f"limit {p.register_limit}" if p.fits_smem else "no limit: the block does not launch")),
        ("verdict", p.verdict + (f" ({p.spilled_registers} registers per thread)" if p.spilled_registers else "")),
        ("modelled rate", f"{fmt_flops(p.flops)} ({p.bound}-bound), {p.ctas_per_sm} CTA(s) per SM resident"),
    ]


@explorer(
    "cuda_kernels.gemm_tile_shape",
    gpu=Choice(ALL_GPUS),
    dtype=Choice(TILE_DTYPES, label="operand dtype"),
    tile_m=Choice(SIDES, label="tile_m"),
    tile_n=Choice(SIDES, label="tile_n"),
    stages=IntRange(1, 8, label="pipeline stages"),
    warps=Choice((4, 8, 16), label="warps per CTA"),
)
def gemm_tile_shape_view(gpu: str, dtype: str, tile_m: int, tile_n: int, stages: int, warps: int) -> View:
    """I036: one tile's reuse, swizzle row, register and shared-memory budgets, pipeline and verdict, and
    every 64-256 tile of the same dtype, stages and warps on the L2 roofline."""
    p = gt.tile_plan(gpu, tile_m, tile_n, dtype, stages=stages, warps=warps)
    plans = {(m, n): (p if (m, n) == (tile_m, tile_n) else gt.tile_plan(gpu, m, n, dtype, stages=stages, warps=warps))
             for m, n in GRID}
    points = [(q.intensity * (1 + 0.012 * (m > n) - 0.012 * (m < n)), q.flops / 1e12, q.verdict, f"{m}x{n}")
              for (m, n), q in plans.items()]
    xs = np.geomspace(16, 256, 60)
    measured = _measured_triton(p.gpu, dtype)
    fig = _TILE_FIGURE(xs, xs * p.l2_bandwidth / 1e12, p.compute_roof_flops / 1e12, p.peak_flops / 1e12, points,
                       (p.intensity, p.flops / 1e12), measured,
                       f"{gpu}, {dtype}: bk {p.bk}, {stages} stages, {warps} warps; L2 {sig(p.l2_bandwidth / 1e12)} TB/s "
                       f"(red ring: {tile_m}x{tile_n}; dotted: dense peak)")
    verdicts = [q.verdict for q in plans.values()]
    l2_bound = sum(q.bound == "L2 bandwidth" and q.verdict == "runs" for q in plans.values())
    caption = (f"Tiles left of the knee ride the orange L2 roof ({l2_bound} of the {len(GRID)} here), the others reach "
               f"the compute roof or fall below it for latency; {verdicts.count('spills')} spill (red crosses) and "
               f"{verdicts.count('does not launch')} do not fit the shared memory (hollow). Black plus signs are the "
               "H200's measured Triton kernels, where they apply.")
    return View(f"GEMM tile {tile_m}x{tile_n}x{p.bk} on {gpu} ({dtype})", tile_rows(p), fig,
                f"Compute roof at eta = {fmt_pct(p.efficiency)} (decode_step.matmul_flops_efficiency); "
                f"L2 latency {sig(p.latency_s * 1e9)} ns (kernels_gemm.l2_latency_ns); one CTA per SM.",
                values={"intensity": p.intensity, "flops": p.flops, "smem_bytes": p.smem_bytes,
                        "accumulator_per_thread": float(p.accumulator_per_thread),
                        "spilled": float(p.spilled_registers), "stages_needed": float(p.stages_needed)},
                caption=caption)


# ---- N099: the SGEMM steps -------------------------------------------------------------------------

STEP_LABELS = ("naive rows", "naive cols", "smem 32x32", "reg 8x8", "+ float4", "cuBLAS fp32", "tensor cores")
_MEASURED_KEYS = ("naive_rows", "naive_cols", "smem", "reg2d", "reg2d_vec", "cublas_fp32", "cublas_bf16")


def _steps_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.91)
    figures.log_scale(ax, "y", base=10)
    x = np.arange(len(STEP_LABELS))
    a = SimpleNamespace(ax=ax, x=x)
    a.bars = ax.bar(x, np.ones(len(x)), width=0.6, color="#aec7e8", label="model: the tightest ceiling")
    a.meas, = ax.plot([], [], ls="none", marker="D", color="#d62728", ms=6, label="measured on one H200")
    a.fp32, = ax.plot([], [], color="black", lw=0.9, ls="--", label="FP32 FMA peak")
    ax.legend(handles=[a.bars, a.meas, a.fp32], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=7,
              frameon=False)  # built once: the entries never change
    a.texts = [ax.text(i, 1, "", ha="center", va="bottom", fontsize=6.5) for i in x]
    ax.set_xticks(x)
    ax.set_xticklabels(STEP_LABELS, fontsize=7, rotation=20)
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, axis="y")
    return a


def _steps_draw(a, model, measured, fp32_peak, bound_labels, title) -> None:
    for bar, h in zip(a.bars, model, strict=True):
        bar.set_height(h if h else 1e-9)
        bar.set_visible(bool(h))
    xs = [i for i, m in enumerate(measured) if m]
    a.meas.set_data(xs, [measured[i] for i in xs])
    a.meas.set_visible(bool(xs))
    a.fp32.set_data([-0.5, len(model) - 0.5], [fp32_peak, fp32_peak])
    for text, i, h, lab in zip(a.texts, a.x, model, bound_labels, strict=True):
        text.set_position((i, h if h else 1))
        text.set_text(lab)
    top = max([h for h in model if h] + [m for m in measured if m])
    low = min([h for h in model if h] + [m for m in measured if m])
    a.ax.set_ylim(low / 2, top * 3)
    a.ax.set_xlim(-0.6, len(model) - 0.4)
    a.ax.set_title(title, fontsize=8)


_STEPS_FIGURE = figures.LiveFigure(6.6, 4.0, _steps_build, _steps_draw)


@explorer(
    "cuda_kernels.tiled_gemm",
    gpu=Choice(ALL_GPUS),
    tc_dtype=Choice(("bf16", "fp16", "fp8", "tf32"), label="tensor-core dtype"),
    tc_tile_n=Choice((128, 256), label="tensor-core tile_n (tile_m 128)"),
)
def tiled_gemm_view(gpu: str, tc_dtype: str, tc_tile_n: int) -> View:
    """N099: bytes per FMA from L2 and from shared memory for each step of the hand-written SGEMM, the
    FP32 rate each allows, the tensor-core endpoint (a 128 x tc_tile_n tile), and the H200 measurements."""
    from lib.registry.measured import measured

    steps = gt.sgemm_steps(gpu)
    tc = gt.tile_plan(gpu, 128, tc_tile_n, tc_dtype, stages=4, warps=8)
    on_h200 = steps["reg2d"].gpu == "h200"
    meas = [float(measured(f"sgemm_steps.{k}.TFLOPs")) if on_h200 else 0.0 for k in _MEASURED_KEYS]
    if not (on_h200 and tc_dtype == "bf16"):
        meas[-1] = 0.0
    model = [s.ceiling / 1e12 for s in steps.values()] + [0.0, tc.flops / 1e12]
    labels = [s.bound.replace(" bandwidth", "") for s in steps.values()] + ["", tc.bound.replace(" bandwidth", "")]
    fig = _STEPS_FIGURE(model, meas, steps["reg2d"].fp32_peak / 1e12, labels,
                        f"fp32 SGEMM steps on {gpu}; tensor cores: 128x{tc_tile_n}x{tc.bk} {tc_dtype}")
    rows = []
    for s in steps.values():
        smem = f", shared {sig(s.smem_bytes_per_fma)} B" if s.smem_bytes_per_fma else ""
        rows.append((s.kernel.title, f"L2 {sig(s.l2_bytes_per_fma)} B/FMA{smem} -> {fmt_flops(s.ceiling)} "
                                     f"({s.bound})"))
    rows.append((f"tensor cores, {tc_dtype} 128x{tc_tile_n}",
                 f"L2 {sig(2 * tc.element_bytes * (128 + tc_tile_n) / (128 * tc_tile_n))} B/FMA -> "
                 f"{fmt_flops(tc.flops)} ({tc.bound}-bound)"))
    if on_h200:
        rows.append(("measured (H200): best hand kernel / cuBLAS fp32",
                     f"{sig(meas[4])} / {sig(meas[5])} TFLOP/s"))
    caption = ("Each bar is the lowest of the ceilings a step's traffic allows (its label names it); red diamonds "
               "are the H200 measurements where they exist. Each step moves the binding resource, until the tensor "
               "cores leave FP32 behind.")
    return View(f"Tiled SGEMM steps on {gpu}", rows, fig,
                "Bytes per FMA counted from the kernels' own index math (tools/device/kernels.cu).",
                values={k: s.ceiling for k, s in steps.items()} | {"tensor_cores": tc.flops},
                caption=caption)


__all__ = ["ALL_GPUS", "GRID", "STEP_LABELS", "gemm_tile_shape_view", "tile_rows", "tiled_gemm_view"]
