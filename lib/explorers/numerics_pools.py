"""Explorer for FP8 formats across GPU generations (I044 fp8-formats-across-generations).

Views call :mod:`lib.numerics.pools` only: a synthetic projection with outlier activation channels run through
Hopper's block-scaled FP8 (FP32 scales), the same blocks with power-of-two scales, Blackwell's MXFP8 and a
per-tensor fallback. One persistent matplotlib figure (grouped bars), updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.numerics import pools
from lib.units import fmt_pct, sig

ROWS, D_IN, D_OUT = 128, 256, 512  # the explorer's layer: small enough to redraw within 100 ms
SHOWN = ("block-fp32", "block-e8m0", "mxfp8", "per-tensor")
REFERENCE = "block-fp32"


@functools.lru_cache(maxsize=64)
def comparison(outlier_scale: float, outlier_channels: int, tie_gap: float, seed: int):
    x, w = pools.synthetic_layer(ROWS, D_IN, D_OUT, outlier_channels, outlier_scale, tie_gap, seed)
    return pools.compare_formats(x, w, SHOWN)


def _flips_vs_reference(c, f: str) -> float:
    return 0.0 if f == REFERENCE else c.flips_between[(REFERENCE, f)]


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    pos = np.arange(len(SHOWN))
    a.err = ax.bar(pos - 0.2, np.ones(len(SHOWN)), 0.4, color="C0", label="error vs exact logits")
    a.flip = ax.bar(pos + 0.2, np.ones(len(SHOWN)), 0.4, color="C3", label="greedy flips vs block-fp32 (Hopper)")
    ax.set_xticks(pos, SHOWN)
    ax.set_ylabel("relative error / share of rows")
    ax.grid(True, axis="y")
    return a


def _draw(a, errs, flips) -> None:
    for bar, v in zip(a.err, errs, strict=True):
        bar.set_height(v)
    for bar, v in zip(a.flip, flips, strict=True):
        bar.set_height(v)
    a.ax.set_ylim(0, max(max(errs), max(flips), 0.01) * 1.15)
    figures.legend(a.ax, [a.err, a.flip], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.pools",
    outlier_scale=FloatRange(1.0, 300.0, 1.0, label="outlier channels x"),
    outlier_channels=IntRange(0, 16, label="outlier channels"),
    tie_gap=FloatRange(0.05, 2.0, 0.05, label="near-tie gap"),
    seed=IntRange(0, 1000, label="seed"),
)
def fp8_pools(outlier_scale: float, outlier_channels: int, tie_gap: float, seed: int) -> View:
    """I044: the same layer through each pool's FP8 format: error against the exact logits and greedy tokens that
    differ from the Hopper pool's (block-scaled, FP32 scales)."""
    c = comparison(float(outlier_scale), int(outlier_channels), float(tie_gap), int(seed))
    errs = [c.error[f] for f in SHOWN]
    flips = [_flips_vs_reference(c, f) for f in SHOWN]
    rows = [(f"{f}: error / flips vs Hopper", f"{sig(c.error[f])} / {fmt_pct(_flips_vs_reference(c, f))}") for f in SHOWN]
    rows.append(("block-e8m0 vs mxfp8 (distance)", sig(c.between[("block-e8m0", "mxfp8")])))
    caption = (f"Each format's relative logit error (blue) and the share of rows whose greedy token differs from the "
               f"Hopper pool's block-fp32 (red): MXFP8 is {sig(c.error['mxfp8'])} off the exact logits and flips "
               f"{fmt_pct(c.flips_between[(REFERENCE, 'mxfp8')])} of the rows against Hopper, while the same 128-blocks "
               f"with power-of-two scales sit {sig(c.between[('block-e8m0', 'mxfp8')])} from MXFP8.")
    fig = _FIGURE(errs, flips)
    return View(f"FP8 formats, outliers {sig(outlier_scale)}x", rows, fig, caption=caption,
                note="the scale's mantissa, not the block size, separates the pools",
                values={"err_fp32": c.error["block-fp32"], "err_mx": c.error["mxfp8"],
                        "flips_between": c.flips_between[(REFERENCE, "mxfp8")]})
