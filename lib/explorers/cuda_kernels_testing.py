"""Explorers for the testing and measurement questions of the CUDA-kernels section: the bug that grows
with the tile count (N009, :mod:`lib.kernels.tiled_gemm`) and kernel benchmarking (N008,
:mod:`lib.kernels.benchmarking`). Each view calls lib only; the figures are persistent matplotlib
figures updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.kernels import benchmarking as bm
from lib.kernels import tiled_gemm as tg
from lib.registry import hardware
from lib.units import US, fmt_ratio, fmt_time, sig

# ---- N009: error against the number of K tiles ---------------------------------------------------

TILE_BUG_CONFIG = dict(tile_m=32, tile_n=16, warps=4)
"""The explorer's kernel: small output tiles so a 40 x 40 problem spans a 2 x 3 tile grid."""
TILE_BUG_SHAPE = (40, 40)  # (M, N) of the swept problem


def _tile_bug_build(fig) -> SimpleNamespace:
    from matplotlib.collections import PolyCollection

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.3, top=0.9)
    figures.log_scale(ax, "x", base=2)
    figures.log_scale(ax, "y", base=10)
    a = SimpleNamespace(ax=ax)
    a.band = PolyCollection([], facecolors="#d62728", alpha=0.2, edgecolors="none", label="defect: min to max over launches")
    ax.add_collection(a.band)
    a.correct, = ax.plot([], [], "o-", color="black", lw=1.4, ms=3, label="correct kernel (fp32 accumulator)")
    a.defect, = ax.plot([], [], "s-", color="#d62728", lw=1.6, ms=3, label="defect (median launch)")
    a.closed, = ax.plot([], [], "--", color="#1f77b4", lw=1.2, label="correct x sqrt((n + 1) / 2)")
    ax.set_xlabel("K tiles n (K = n x tile_k)")
    ax.set_ylabel("relative error ||C - C*|| / ||C*||")
    ax.grid(True)
    return a


def _tile_bug_draw(a, n: np.ndarray, correct: np.ndarray, errors: np.ndarray, label: str, title: str) -> None:
    lo, hi, med = errors.min(axis=0), errors.max(axis=0), np.median(errors, axis=0)
    a.correct.set_data(n, correct)
    a.defect.set_data(n, med)
    a.defect.set_label(f"{label} (median launch)")
    a.band.set_verts([np.column_stack([np.r_[n, n[::-1]], np.r_[lo, hi[::-1]]])] if errors.shape[0] > 1 else [])
    a.band.set_visible(errors.shape[0] > 1 and bool((hi > lo).any()))
    a.closed.set_data(n, correct * np.sqrt((n + 1) / 2))
    a.closed.set_visible(label == "low_precision_acc")
    a.ax.set_xlim(n[0] / 1.3, n[-1] * 1.3)
    top = max(float(hi.max()), float(correct.max())) * 2.5
    a.ax.set_ylim(float(min(correct.min(), lo.min())) / 2.5, top)
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [a.correct, a.defect, a.band, a.closed], loc="upper center", bbox_to_anchor=(0.5, -0.16),
                   ncol=2, fontsize=7, frameon=False)


_TILE_BUG_FIGURE = figures.LiveFigure(6.2, 3.8, _tile_bug_build, _tile_bug_draw)


@explorer(
    "cuda_kernels.tile_bug",
    defect=Choice(tg.DEFECTS),
    dtype=Choice(tg.STORAGE_DTYPES, label="storage dtype"),
    tile_k=IntRange(16, 64, log=True, label="tile_k"),
    max_k_tiles=IntRange(2, 64, log=True, label="largest K-tile count"),
    runs=IntRange(1, 6, label="launches (seeded runs)"),
    late_fraction=FloatRange(0.0, 0.5, step=0.005, label="late warps (missing barrier)"),
)
def tile_bug(defect: str, dtype: str, tile_k: int, max_k_tiles: int, runs: int, late_fraction: float) -> View:
    """N009: the relative error of a defective tiled GEMM and of the correct one against the number of K
    tiles, launch by launch, on a 40 x 40 output (a 2 x 3 grid of 32 x 16 tiles), and the signature
    the sweep shows (:func:`lib.kernels.tiled_gemm.signature`)."""
    config = tg.TileConfig(tile_k=tile_k, late_fraction=late_fraction, **TILE_BUG_CONFIG)
    counts = [2**i for i in range(int(np.log2(max_k_tiles)) + 1)]
    m, n = TILE_BUG_SHAPE
    sw = tg.sweep_k_tiles(defect, counts, m=m, n=n, dtype=dtype, config=config, runs=runs)
    key = tg.signature(sw)
    x = np.asarray(counts, float)
    fig = _TILE_BUG_FIGURE(x, sw.correct, sw.errors, defect,
                           f"{tg.DEFECT_TITLES[defect]} ({tg.CANDIDATE[defect]}), {dtype}, tile_k {tile_k}")
    med = np.median(sw.errors, axis=0)
    rows = [("at 1 K tile: defect / correct", fmt_ratio(med[0] / sw.correct[0])),
            ("at 2 K tiles: defect / correct", fmt_ratio(med[1] / sw.correct[1])),
            (f"at {counts[-1]} K tiles: defect / correct", fmt_ratio(med[-1] / sw.correct[-1])),
            (f"at {counts[-1]} K tiles: relative error (correct, defect)", f"{sig(sw.correct[-1], 2)}, {sig(med[-1], 2)}")]
    if len(counts) >= 3:
        rows.append(("growth exponent of the error (n >= 4)" if counts[-1] >= 8 else "growth exponent (n >= 2)",
                     sig(sw.growth_exponent(4 if counts[-1] >= 8 else 2), 2)))
    rows.append(("largest launch-to-launch spread (max / min)", fmt_ratio(float(sw.spread().max()))))
    rows.append(("signature", key))
    note = tg.SIGNATURES[key]
    if defect == "k_tail":
        note += ": every K here is a tile multiple, so the dropped partial tile is empty; only a K with a remainder shows it."
    elif defect == "missing_barrier" and late_fraction == 0:
        note += ": with no late warps the race never fires."
    elif runs == 1 and tg.CANDIDATE[defect] == "race":
        note += ": a single launch cannot tell a race from a precision bug; launch it again."
    elif defect == "grid_map":
        note += f" ({tg.grid_map_unwritten(*config.grid(m, n))} of {np.prod(config.grid(m, n))} output tiles never written)."
    caption = ("The black line is the correct kernel, its error set by the one rounding at the store; the red line and "
               "band are the defect over the seeded launches: a step at 2 K tiles is an offset bug, a slope is a "
               "precision bug, a band is a race.")
    return View(f"Tile-count bug: {defect}", rows, fig, note,
                values={"ratio_1": float(med[0] / sw.correct[0]), "ratio_2": float(med[1] / sw.correct[1]),
                        "ratio_max": float(med[-1] / sw.correct[-1]), "spread": float(sw.spread().max())},
                caption=caption)


# ---- N008: a kernel's timing distribution and what the script reports -------------------------------

BENCH_GPUS = tuple(k for k in hardware.gpu_names()
                   if hardware.gpu(k).vendor == "NVIDIA" and hardware.gpu(k).compute_capability)
"""GPUs with an L2 model (lib.kernels.l2) and CUDA events."""
_MARKS = (("true", "true time (production)", "black", "-"), ("reported", "reported by the script", "#d62728", "--"),
          ("median", "median of the repetitions", "#1f77b4", ":"), ("mean", "mean", "#ff7f0e", ":"),
          ("min", "minimum", "#2ca02c", ":"))


def _bench_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.34, top=0.9)
    figures.log_scale(ax, "x", base=10)
    a = SimpleNamespace(ax=ax, marks={})
    a.hist = ax.stairs([0.0], [1.0, 2.0], fill=True, color="#bbbbbb", label="repetitions (count per bin)")
    for key, label, color, style in _MARKS:
        a.marks[key] = ax.axvline(1.0, color=color, ls=style, lw=1.6, label=label)
    ax.set_xlabel("time per repetition (µs, log scale)")
    ax.set_ylabel("repetitions")
    return a


def _bench_draw(a, counts: np.ndarray, edges: np.ndarray, marks: dict, title: str) -> None:
    a.hist.set_data(counts, edges)
    for key, x in marks.items():
        a.marks[key].set_xdata([x, x])
    lo = min(edges[0], *marks.values()) / 1.3
    hi = max(edges[-1], *marks.values()) * 1.3
    a.ax.set_xlim(lo, hi)
    a.ax.set_ylim(0, max(1.0, float(counts.max())) * 1.15)
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [a.hist, *a.marks.values()], loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2,
                   fontsize=7, frameon=False)


_BENCH_FIGURE = figures.LiveFigure(6.4, 3.9, _bench_build, _bench_draw)


@explorer(
    "cuda_kernels.benchmarking",
    gpu=Choice(BENCH_GPUS),
    kernel_bytes=IntRange(4096, 2**34, log=True, label="kernel bytes (HBM reads + writes)"),
    intensity=IntRange(0, 4000, label="FLOP per byte"),
    repetitions=IntRange(5, 2000, label="repetitions"),
    warmup=Choice((True, False), label="warm-up before timing"),
    timer=Choice(bm.TIMERS, label="timer"),
    flush_l2=Choice((True, False), label="flush L2 between repetitions"),
    locked_clock=Choice((True, False), label="clocks locked at the sustained rate"),
    statistic=Choice(bm.STATISTICS, label="statistic reported"),
)
def benchmarking(gpu: str, kernel_bytes: int, intensity: int, repetitions: int, warmup: bool, timer: str,
                 flush_l2: bool, locked_clock: bool, statistic: str) -> View:
    """N008: a kernel of ``kernel_bytes`` and ``intensity`` FLOP/byte timed ``repetitions`` times with the
    chosen protocol (lib.kernels.benchmarking): the simulated distribution of the repetitions, what the
    script reports and how far that is from the true time, and each mistake's factor alone."""
    spec = bm.KernelSpec(gpu, float(kernel_bytes), float(kernel_bytes) * intensity)
    p = bm.Protocol(repetitions=repetitions, warmup=warmup, timer=timer, flush_l2=flush_l2,
                    locked_clock=locked_clock, statistic=statistic)
    a = bm.bench_assumptions()
    m = bm.measure(spec, p, a, seed=0)
    s = m.samples / US
    lo, hi = float(s.min()), float(s.max())
    if hi <= lo * 1.1:
        lo, hi = lo / 1.05, hi * 1.05
    counts, edges = np.histogram(s, bins=np.geomspace(lo, hi, 41))
    marks = {"true": m.true_s / US, "reported": m.reported_s / US, "median": m.median_s / US, "mean": m.mean_s / US,
             "min": m.min_s / US}
    f = m.factor
    verdict = ("right within 5%" if abs(f - 1) <= 0.05 else
               f"{fmt_ratio(f)} too slow" if f > 1 else f"{fmt_ratio(1 / f)} too fast (a fake speedup)")
    fig = _BENCH_FIGURE(counts.astype(float), edges, marks,
                        f"{hardware.gpu(gpu).name}: {fmt_time(m.true_s)} kernel, {repetitions} repetitions, "
                        f"{statistic} reported: {verdict}")
    made = p.mistakes()
    rows = [("true time (HBM inputs, sustained clock, no compile)", fmt_time(m.true_s)),
            (f"reported ({statistic})", fmt_time(m.reported_s)),
            ("reported / true", f"{sig(f, 3)}: {verdict}"),
            ("median and IQR of the repetitions", f"{fmt_time(m.median_s)} ± {fmt_time(m.iqr_s / 2)}"),
            ("mean, minimum", f"{fmt_time(m.mean_s)}, {fmt_time(m.min_s)}"),
            ("working set fits in L2", "yes" if bm.fits_in_l2(spec) else "no"),
            ("mistakes made", ", ".join(made) if made else "none")]
    for name in bm.MISTAKES:
        alone = bm.measure(spec, bm.with_mistake(bm.RIGHT, name), a, seed=0)
        rows.append((f"this mistake alone: {name}", sig(alone.factor, 3)))
    caption = ("The grey bars are the simulated repetitions; the black line is the time production sees and the red "
               "dashed line what the script reports: the gap between them is the error. A lone bar far right is the "
               "first call's compile; a cluster left of black is a cache-hot or unsynchronized timing.")
    return View(f"Benchmarking: {fmt_time(m.true_s)} kernel", rows, fig,
                "Simulated with seed 0; jitter, outliers, launch and compile costs from data/assumptions.yaml.",
                values={"factor": f, "true_us": m.true_s / US, "reported_us": m.reported_s / US}, caption=caption)
