"""Explorers for evaluating a quantized model against its reference (I042 quantization-evaluation,
N035 deployment-evals).

Views call :mod:`lib.numerics.evals` (paired McNemar sizes and minimum detectable differences) and
:mod:`lib.sre.canary` (the two-sample size behind the unpaired comparison). One persistent figure.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.numerics import evals
from lib.sre import canary
from lib.units import fmt_int, fmt_pct, sig


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.paired = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="paired (McNemar), same items")[0]
    a.unpaired = ax.plot([1.0], [1.0], color="C1", lw=1.8, ls="--", label="unpaired, two item samples")[0]
    a.have = ax.axhline(1000, color="0.3", ls=":", lw=1.2, label="items in the benchmark")
    a.drop = ax.axvline(1.0, color="C3", lw=1.0, label="the drop in question")
    figures.log_scale(ax, "y")
    ax.set_xlabel("accuracy drop to catch (points)")
    ax.set_ylabel("items needed")
    ax.grid(True)
    return a


def _draw(a, x, paired, unpaired, items, drop_pts) -> None:
    a.paired.set_data(x, paired)
    a.unpaired.set_data(x, unpaired)
    a.have.set_ydata([items, items])
    a.drop.set_xdata([drop_pts, drop_pts])
    finite = np.concatenate([paired[np.isfinite(paired)], unpaired[np.isfinite(unpaired)], [items]])
    a.ax.set_xlim(x[0], x[-1])
    a.ax.set_ylim(max(1.0, finite.min() / 2), finite.max() * 2)
    figures.legend(a.ax, [a.paired, a.unpaired, a.have, a.drop], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.evals",
    items=IntRange(50, 50000, label="items in the benchmark"),
    accuracy_pct=FloatRange(5.0, 99.0, 0.5, label="reference accuracy (%)"),
    drop_pts=FloatRange(0.1, 20.0, 0.1, label="accuracy drop (points)"),
    discordance_pct=FloatRange(0.2, 60.0, 0.1, label="items the two disagree on (%)"),
    alpha=Choice((0.01, 0.05, 0.1), label="false-alarm rate (two-sided)"),
    power=Choice((0.8, 0.9, 0.95), label="power"),
)
def eval_power(items: int, accuracy_pct: float, drop_pts: float, discordance_pct: float, alpha: float,
               power: float) -> View:
    """I042: the items a paired and an unpaired comparison need to catch an accuracy drop, the minimum
    detectable drop at this benchmark's size, and the power the benchmark has for this drop."""
    p, drop, psi = accuracy_pct / 100.0, drop_pts / 100.0, discordance_pct / 100.0
    if not drop < p:
        raise ValueError(f"the drop ({sig(drop_pts)} points) must be below the reference accuracy ({sig(accuracy_pct)}%)")
    evals.cell_probabilities(p, p - drop, psi)  # refuses a discordance the accuracies cannot have
    se_pair = evals.paired_difference_se((psi + drop) / 2, (psi - drop) / 2, items)
    se_unpair = evals.unpaired_difference_se(p, p - drop, items)
    pw_pair = evals.mcnemar_power(items, psi, drop, alpha)
    mdd_pair = evals.min_detectable_difference_paired(items, psi, alpha, power)
    mdd_unpair = evals.min_detectable_difference_unpaired(items, p, alpha, power)
    n_pair = evals.items_needed_paired(psi, drop, alpha, power)
    n_unpair = canary.requests_needed(1 - p, 1 - p + drop, alpha / 2, power, two_sample=True)
    hi = min(20.0, 100 * p * 0.999, max(3 * drop_pts, 2.0))
    x = np.linspace(min(0.1, drop_pts), hi, 60)
    paired = np.array([evals.items_needed_paired(psi, d / 100, alpha, power) if d / 100 <= psi else math.nan for d in x])
    unpaired = np.array([canary.requests_needed(1 - p, 1 - p + d / 100, alpha / 2, power, two_sample=True) for d in x])
    rows = [("one score's standard error", f"{sig(100 * evals.score_standard_error(p, items), 2)} points"),
            ("SE of the difference, unpaired", f"{sig(100 * se_unpair, 2)} points"),
            ("SE of the difference, paired", f"{sig(100 * se_pair, 2)} points"),
            ("the drop in standard errors (paired)", sig(drop / se_pair, 2)),
            ("paired test's power for this drop", fmt_pct(pw_pair)),
            ("smallest drop caught, paired", f"{sig(100 * mdd_pair, 2)} points"),
            ("smallest drop caught, unpaired", f"{sig(100 * mdd_unpair, 2)} points"),
            ("items needed, paired / unpaired", f"{fmt_int(n_pair)} / {fmt_int(n_unpair)}")]
    caption = (f"Items needed to catch a drop (x) at {fmt_pct(power)} power, α = {alpha:g}: the paired test on the same items "
               f"(solid; the two models disagree on {fmt_pct(psi)} of them) against two independent samples (dashed). "
               f"The benchmark's {fmt_int(items)} items (dotted) catch a paired drop of {sig(100 * mdd_pair, 2)} points.")
    fig = _FIGURE(x, paired, unpaired, float(items), drop_pts)
    return View(f"A {sig(drop_pts)}-point drop on {fmt_int(items)} items", rows, fig, caption=caption,
                note="the benchmark can see this drop" if pw_pair >= power else "too few items to call this drop reliably",
                values={"se_pair": se_pair, "se_unpair": se_unpair, "power": pw_pair, "mdd_pair": mdd_pair,
                        "mdd_unpair": mdd_unpair, "n_pair": n_pair, "n_unpair": n_unpair})


_EXACT_SLICE = 300  # slices up to this many items use the exact McNemar power (enumeration, ~1 ms each)


def _build_slices(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.pooled = ax.plot([1.0], [0.5], color="C1", lw=1.8, ls="--", label="the pooled average (all traffic)")[0]
    a.slice = ax.plot([1.0], [0.5], color="C0", lw=1.8, label="the broken slice alone (its share of the items)")[0]
    a.have = ax.axvline(1000, color="0.3", ls=":", lw=1.2, label="items in the eval")
    a.target = ax.axhline(0.8, color="0.6", ls="-", lw=0.8)
    figures.log_scale(ax, "x")
    ax.set_xlabel("items in the evaluation (sampled in proportion to traffic)")
    ax.set_ylabel("probability the regression is caught")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw_slices(a, ns, pooled, sliced, items, power) -> None:
    a.pooled.set_data(ns, pooled)
    a.slice.set_data(ns, sliced)
    a.have.set_xdata([items, items])
    a.target.set_ydata([power, power])
    a.ax.set_xlim(ns[0], ns[-1])
    figures.legend(a.ax, [a.pooled, a.slice, a.have], fontsize=7, loc="lower right")


_SLICES_FIGURE = figures.LiveFigure(6.0, 3.2, _build_slices, _draw_slices)


@explorer(
    "numerics.slices",
    items=IntRange(100, 50000, label="items in the eval"),
    share_pct=FloatRange(0.5, 50.0, 0.5, label="broken slice's share of traffic (%)"),
    slice_acc_pct=FloatRange(10.0, 99.0, 0.5, label="reference accuracy on it (%)"),
    drop_pts=FloatRange(1.0, 90.0, 0.5, label="drop on that slice (points)"),
    floor_pct=FloatRange(0.5, 20.0, 0.1, label="reference vs its own rerun: items that differ (%)"),
    alpha=Choice((0.01, 0.05, 0.1), label="false-alarm rate per test"),
    slices=IntRange(1, 20, label="slices tested (Bonferroni)"),
)
def slice_power(items: int, share_pct: float, slice_acc_pct: float, drop_pts: float, floor_pct: float, alpha: float,
                slices: int) -> View:
    """N035: a regression confined to one slice, seen by the pooled paired test over all traffic and by
    the paired test on the slice alone (at alpha / slices), as the evaluation grows."""
    s, p, d, f = share_pct / 100.0, slice_acc_pct / 100.0, drop_pts / 100.0, floor_pct / 100.0
    if not d < p:
        raise ValueError(f"the drop ({sig(drop_pts)} points) must be below the slice's accuracy ({sig(slice_acc_pct)}%)")
    psi_b = d + f
    evals.cell_probabilities(p, p - d, psi_b)  # refuses a table that cannot exist
    pooled_d, pooled_psi = s * d, (1 - s) * f + s * psi_b
    a_slice = alpha / slices
    ns = np.logspace(2, math.log10(max(50000, items)), 60)
    pw_pool = np.array([evals.mcnemar_power(int(n), pooled_psi, pooled_d, alpha) for n in ns])

    def slice_pw(n: int) -> float:  # a small slice: the exact test (the normal approximation is far off at a few items)
        return evals.mcnemar_exact_power(n, psi_b, d, a_slice) if n <= _EXACT_SLICE else evals.mcnemar_power(n, psi_b, d, a_slice)

    pw_slice = np.array([slice_pw(max(1, int(n * s))) for n in ns])
    n_slice = max(1, int(items * s))
    here_pool = evals.mcnemar_power(items, pooled_psi, pooled_d, alpha)
    here_slice = slice_pw(n_slice)
    need_slice = evals.items_needed_paired(psi_b, d, a_slice, 0.8)
    if need_slice <= _EXACT_SLICE:  # a small slice: the exact test's count, as the page states it
        need_slice = float(evals.items_needed_paired_exact(psi_b, d, a_slice, 0.8))
    need_pool = evals.items_needed_paired(pooled_psi, pooled_d, alpha, 0.8)
    rows = [("the average moves by", f"{sig(100 * pooled_d, 2)} points"),
            ("the slice moves by", f"{sig(drop_pts, 3)} points"),
            ("items of the slice in the eval", fmt_int(n_slice)),
            ("pooled test catches it", fmt_pct(here_pool)),
            ("slice test catches it", fmt_pct(here_slice)),
            ("slice items needed (80%)", fmt_int(math.ceil(need_slice))),
            ("total items for the pooled test (80%)", fmt_int(math.ceil(need_pool)))]
    caption = (f"Probability of catching a {sig(drop_pts, 3)}-point drop confined to a {fmt_pct(s)} slice, against the items "
               f"in a traffic-proportional eval (log x): the slice's own paired test (solid, α = {sig(a_slice, 2)}) against "
               f"the pooled average (dashed), which moves only {sig(100 * pooled_d, 2)} points.")
    fig = _SLICES_FIGURE(ns, pw_pool, pw_slice, float(items), 0.8)
    return View(f"A {fmt_pct(s)} slice losing {sig(drop_pts, 3)} points", rows, fig, caption=caption,
                note="the slice test sees it" if here_slice >= 0.8 else "too few items in the slice",
                values={"pooled_power": here_pool, "slice_power": here_slice, "need_slice": need_slice,
                        "need_pool": need_pool})
