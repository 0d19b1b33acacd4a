"""Explorer for the batch-wide activation scale as a cross-user leak (I043 batch-scale-leakage).

Views call :mod:`lib.numerics.scales` only: the other users' logit change when one user's row carries an
outlier, per-tensor against per-row scales, and the reduction-order drift of the same batch. One persistent
matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.numerics import scales
from lib.numerics.fp8 import amax_scale, fake_quantize
from lib.numerics.reduction import near_tie_problem
from lib.units import fmt_int, fmt_pct, sig

USERS, D, VOCAB = 64, 128, 512  # the explorer's batch: small enough to redraw within 100 ms
FLOOR = 1e-9  # a zero change is drawn at this floor of the log axis
FACTORS = np.geomspace(1.5, 5000.0, 25)


@functools.lru_cache(maxsize=16)
def _problem(tie_gap: float, seed: int):
    x, _, w = near_tie_problem(USERS, D, VOCAB, tie_gap, seed=seed)
    return x, fake_quantize(w, amax_scale(w))


@functools.lru_cache(maxsize=64)
def _curve(tie_gap: float, seed: int) -> np.ndarray:
    x, wq = _problem(tie_gap, seed)
    return scales.leak_curve(x, wq, 0, FACTORS, "per-tensor")


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.leak = ax.plot([1.0], [1.0], color="C3", lw=1.6, label="per-tensor scale: other users' change")[0]
    a.drift = ax.axhline(1e-7, color="C0", ls="--", lw=1.3, label="reduction order (split-K), per-row scales")
    a.here = ax.plot([1.0], [1.0], "o", color="C3", ms=6, label="this outlier")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("outlier in one user's row / batch amax before it")
    ax.set_ylabel("relative change of the others' logits")
    ax.set_xlim(FACTORS[0], FACTORS[-1])
    ax.set_ylim(FLOOR / 2, 0.5)
    ax.grid(True)
    return a


def _draw(a, curve, drift, factor, here) -> None:
    a.leak.set_data(FACTORS, np.maximum(curve, FLOOR))
    a.drift.set_ydata([max(drift, FLOOR)] * 2)
    a.here.set_data([factor], [max(here, FLOOR)])
    figures.legend(a.ax, [a.leak, a.drift, a.here], fontsize=7, loc="center right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.scales",
    outlier=FloatRange(1.5, 5000.0, 0.5, label="outlier / batch amax"),
    split=IntRange(2, 16, label="split-K partial sums"),
    tie_gap=FloatRange(0.0, 1.0, 0.01, label="near-tie gap (logit std)"),
    seed=IntRange(0, 1000, label="seed"),
)
def scale_leak(outlier: float, split: int, tie_gap: float, seed: int) -> View:
    """I043: how much one user's outlier moves the other users' logits through a per-tensor dynamic scale,
    against the drift a change of reduction order causes, on a batch of 64 users (d 128, vocab 512)."""
    x, wq = _problem(float(tie_gap), int(seed))
    leak, _, _ = scales.batch_scale_leak(x, wq, 0, outlier, "per-tensor")
    iso, _, _ = scales.batch_scale_leak(x, wq, 0, outlier, "per-row")
    drift = scales.reduction_drift(x, wq, "per-row", split, rows=slice(1, None))
    curve = _curve(float(tie_gap), int(seed))
    ratio = leak.rel_change / drift.rel_change if drift.rel_change > 0 else float("inf")
    rows = [("other users", fmt_int(leak.users)),
            ("per-tensor: relative change", sig(leak.rel_change)),
            ("per-tensor: users whose logits moved", fmt_pct(leak.changed_share)),
            ("per-tensor: greedy tokens flipped", f"{leak.flips} ({fmt_pct(leak.flip_share)})"),
            ("per-row scales: change", "none (bitwise identical)" if iso.rel_change == 0 else sig(iso.rel_change)),
            (f"reduction order, split {split}: relative change", sig(drift.rel_change)),
            ("reduction order: users whose logits moved", fmt_pct(drift.changed_share)),
            ("reduction order: greedy tokens flipped", f"{drift.flips}"),
            ("leak / drift", sig(ratio) if np.isfinite(ratio) else "drift is zero")]
    caption = (f"The other users' relative logit change against the size of one user's outlier (log-log): "
               f"{sig(outlier)} x the batch amax moves them by {sig(leak.rel_change)}, "
               f"{sig(ratio) if np.isfinite(ratio) else 'infinitely many'} times the reduction-order drift "
               f"({sig(drift.rel_change)}); the dips are powers of two, where the grid only shifts by an exponent.")
    fig = _FIGURE(curve, drift.rel_change, float(outlier), leak.rel_change)
    return View(f"Shared scale leak at {sig(outlier)} x amax", rows, fig, caption=caption,
                note="per-row scales isolate the users; the drift needs batch-invariant kernels",
                values={"leak": leak.rel_change, "drift": drift.rel_change, "flips": leak.flips,
                        "isolated": iso.rel_change})
