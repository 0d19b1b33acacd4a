"""Explorers for reduction order and batch invariance (N032 batch-invariance, I077 greedy-nondeterminism).

Views call :mod:`lib.numerics.reduction` only (the split-K a tiled GEMM picks at each batch size,
what one fixed configuration costs, the chance a completion diverges). One persistent matplotlib
figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.kernels.gemm_waves import PROJECTIONS, projection_nk
from lib.numerics import reduction
from lib.units import fmt_int, fmt_pct, fmt_ratio, sig

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b")
GPUS = ("a100-sxm", "h100-sxm", "h200", "b200")


@functools.lru_cache(maxsize=128)
def invariance_cost(model: str, chip: str, tp: int, projection: str) -> reduction.BatchInvariantCost:
    """:func:`lib.numerics.reduction.batch_invariant_cost` of one projection over :data:`BATCHES`."""
    n, k = projection_nk(model, projection, tp)
    return reduction.batch_invariant_cost(n, k, chip, BATCHES)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.17, top=0.9, wspace=0.3)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.ratio = ax1.plot([1, 2], [1, 1], "o-", color="C3", ms=3, lw=1.4, label="fixed config / best")[0]
    a.split = ax1.plot([1, 2], [1, 1], "s--", color="C0", ms=3, lw=1.0, label="split-K the best picks")[0]
    figures.log_scale(ax1, "x", 2)
    ax1.set_xlabel("batch (rows of the GEMM)")
    ax1.set_ylabel("time ratio / split-K pieces")
    ax1.grid(True)
    a.div = ax2.plot([1, 2], [0, 0], color="C2", lw=1.6)[0]
    a.mark = ax2.plot([1], [0], "o", color="C3", ms=6)[0]
    figures.log_scale(ax2, "x")
    ax2.set_xlabel("completion length (tokens)")
    ax2.set_ylabel("P(two runs differ)")
    ax2.set_ylim(0, 1.02)
    ax2.grid(True)
    return a


def _draw(a, batches, ratio, splits, ns, div, tokens, p_at) -> None:
    a.ratio.set_data(batches, ratio)
    a.split.set_data(batches, splits)
    a.ax1.set_xlim(batches[0] / 1.3, batches[-1] * 1.3)
    a.ax1.set_ylim(0, max(float(np.max(ratio)), float(np.max(splits))) * 1.15)
    figures.legend(a.ax1, [a.ratio, a.split], fontsize=7, loc="upper right")
    a.div.set_data(ns, div)
    a.mark.set_data([tokens], [p_at])
    a.ax2.set_xlim(ns[0], ns[-1])


_FIGURE = figures.LiveFigure(7.0, 3.0, _build, _draw)


@explorer(
    "numerics.batch_invariance",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    projection=Choice(PROJECTIONS, label="GEMM"),
    log10_p=FloatRange(-7.0, -1.0, 0.25, label="log10 per-token flip chance"),
    tokens=IntRange(10, 100_000, label="completion tokens"),
)
def batch_invariance(model: str, gpu: str, tp: int, projection: str, log10_p: float, tokens: int) -> View:
    """N032: the split-K the fastest kernel picks at each batch size, what one fixed (batch-invariant)
    configuration costs there, and the chance a completion diverges at a per-token flip chance."""
    c = invariance_cost(model, gpu, tp, projection)
    ratio = c.ratio
    splits = np.array([x.splits for x in c.best], dtype=float)
    p = 10.0 ** log10_p
    ns = np.logspace(1, 5, 80)
    div = reduction.divergence_probability(p, ns)
    p_at = reduction.divergence_probability(p, tokens)
    worst = int(np.argmax(ratio))
    rows = [("GEMM", f"{projection} of {model} at TP {tp} on {gpu}"),
            ("reduction orders over batches 1-4096", fmt_int(c.orders)),
            ("batch-invariant tile (no split-K)", c.tile),
            ("worst slowdown", f"{fmt_ratio(float(ratio[worst]))} at batch {fmt_int(c.batches[worst])}"),
            ("slowdown at batch 4096", fmt_ratio(float(ratio[-1]))),
            (f"P(differ) over {fmt_int(tokens)} tokens", fmt_pct(p_at))]
    caption = (f"Left: the fixed configuration's time over the best kernel's at each batch (red) and the best "
               f"kernel's split-K (blue), {c.orders} distinct reduction orders in all; right: the chance two runs of a "
               f"completion differ at a per-token flip chance of {sig(p)}, {fmt_pct(p_at)} at {fmt_int(tokens)} tokens.")
    fig = _FIGURE(np.array(c.batches, float), ratio, splits, ns, div, tokens, p_at)
    return View(f"Batch invariance: {projection}, {model}, TP {tp}, {gpu}", rows, fig, caption=caption,
                note="the batch changes the reduction order" if c.orders > 1 else "one reduction order at every batch",
                values={"orders": c.orders, "worst_ratio": float(ratio[worst]), "p_at": p_at})
