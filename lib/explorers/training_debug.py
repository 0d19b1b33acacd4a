"""Explorers for debugging a training run: the loss that stops moving (N016).

Calls lib only: :func:`lib.training.diagnosis.simulate` (a small deterministic data-parallel run
in fp16 with one injected fault), :func:`~lib.training.diagnosis.diagnose` (the ordered checks)
and :func:`~lib.training.diagnosis.distinct_fraction`. One persistent figure, updated in place.
"""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.training import diagnosis as dg
from lib.units import fmt_int, sig

FAULT_LABELS = {
    "healthy": "no fault",
    "lr_zero": "LR stuck at 0 after a resume",
    "data_repeat": "loader repeats one batch",
    "scale_collapse": "fp16 loss-scale collapse",
    "dead_rank": "one rank sends zero gradients",
    "step_stuck": "step counter frozen after a resume",
}
TELL = {  # the metric that tells each fault apart, as (label, function of the run)
    "healthy": "global grad norm",
    "lr_zero": "learning rate",
    "data_repeat": "distinct fraction of the last 10 steps' samples",
    "scale_collapse": "log2 of the loss scale",
    "dead_rank": "smallest rank's grad norm / median rank's",
    "step_stuck": "logged step counter",
}
FP32_FLOOR_LOG2 = -150.0  # below fp32's smallest subnormal 2^-149 the scale is 0


def tell_metric(fault: str, m: dg.RunMetrics) -> np.ndarray:
    """The per-step series that separates ``fault`` from a healthy run (``TELL`` names it)."""
    if fault == "healthy":
        return np.where(np.isfinite(m.grad_norm), m.grad_norm, np.nan)
    if fault == "lr_zero":
        return np.asarray(m.lr)
    if fault == "data_repeat":
        return dg.distinct_fraction(m, 10)
    if fault == "scale_collapse":
        with np.errstate(divide="ignore"):
            return np.maximum(np.log2(m.loss_scale), FP32_FLOOR_LOG2)
    if fault == "dead_rank":
        r = np.where(np.isfinite(m.rank_grad_norm), m.rank_grad_norm, np.nan)
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # a step where every rank overflowed has no ratio
            med = np.nanmedian(r, axis=1)
            return np.nanmin(r, axis=1) / np.where(med > 0, med, np.nan)
    if fault == "step_stuck":
        return np.asarray(m.step)
    raise ValueError(f"fault must be one of {', '.join(dg.FAULTS)}, got {fault!r}")


@functools.lru_cache(maxsize=64)
def runs(fault: str, ranks: int, fault_step: int, growth_interval: int, seed: int) -> dict:
    """The healthy run and the faulty one with the same seed, ranks and scaler, with the diagnosis of each."""
    if fault not in dg.FAULTS:
        raise ValueError(f"fault must be one of {', '.join(dg.FAULTS)}, got {fault!r}")
    pair = dg.simulate_faults(dg.RunConfig(ranks=ranks, fault_step=fault_step, growth_interval=growth_interval,
                                           seed=seed), ("healthy", fault) if fault != "healthy" else ("healthy",))
    healthy, faulty = pair["healthy"], pair[fault]  # in lockstep: one loop for both
    return {"healthy": healthy, "faulty": faulty, "diag": dg.diagnose(faulty), "diag_healthy": dg.diagnose(healthy),
            "tell_healthy": tell_metric(fault, healthy), "tell_faulty": tell_metric(fault, faulty)}


def _build(fig) -> SimpleNamespace:
    ax1, ax2 = fig.subplots(1, 2)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.h_held = ax1.plot([], [], color="0.3", lw=1.5, label="healthy, held-out")[0]
    a.f_train = ax1.plot([], [], color="C3", lw=0.8, alpha=0.6, label="faulty, training batch")[0]
    a.f_held = ax1.plot([], [], color="C3", lw=1.8, label="faulty, held-out")[0]
    a.onset1 = ax1.axvline(0, color="C1", ls=":", lw=1)
    a.floor = ax1.axhline(0, color="C2", ls="--", lw=0.8, label="best possible")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss")
    ax1.grid(True)
    a.t_h = ax2.plot([], [], color="0.3", lw=1.5, label="healthy")[0]
    a.t_f = ax2.plot([], [], color="C3", lw=1.5, label="faulty")[0]
    a.onset2 = ax2.axvline(0, color="C1", ls=":", lw=1)
    ax2.set_xlabel("optimizer step")
    ax2.grid(True)
    for ax in (ax1, ax2):
        ax.locator_params(nbins=4)  # few tick labels: text is most of a redraw's cost
    ax1.legend(handles=[a.h_held, a.f_train, a.f_held, a.floor], fontsize=6, loc="upper right")
    ax2.legend(handles=[a.t_h, a.t_f], fontsize=6, loc="upper left")
    return a


def _draw(a, d, fault, fault_step) -> None:
    h, f = d["healthy"], d["faulty"]
    x = np.arange(len(h.loss))
    a.h_held.set_data(x, h.heldout)
    a.f_train.set_data(x, f.loss)
    a.f_held.set_data(x, f.heldout)
    for line in (a.onset1, a.onset2):
        line.set_xdata([fault_step, fault_step])
        line.set_visible(fault != "healthy")
    a.floor.set_ydata([h.heldout_floor, h.heldout_floor])
    a.ax1.set_xlim(0, len(x))
    top = max(float(np.max(h.heldout)), float(np.max(f.heldout)))
    a.ax1.set_ylim(0, top * 1.05)
    a.t_h.set_data(x, d["tell_healthy"])
    a.t_f.set_data(x, d["tell_faulty"])
    ys = np.concatenate([d["tell_healthy"], d["tell_faulty"]])
    ys = ys[np.isfinite(ys)]
    lo, hi = (float(ys.min()), float(ys.max())) if ys.size else (0.0, 1.0)
    pad = 0.08 * (hi - lo or abs(hi) or 1.0)
    a.ax2.set_ylim(lo - pad, hi + pad)
    a.ax2.set_xlim(0, len(x))
    a.ax2.set_ylabel(TELL[fault], fontsize=7)


_FIGURE = figures.LiveFigure(7.0, 3.0, _build, _draw)


@explorer(
    "training.loss_plateau",
    fault=Choice(dg.FAULTS, label="injected fault"),
    ranks=IntRange(2, 8, label="data-parallel ranks"),
    fault_step=IntRange(20, 150, label="fault starts at step"),
    growth_interval=IntRange(10, 200, label="scaler growth interval (steps)"),
    seed=IntRange(0, 99),
)
def loss_plateau(fault: str, ranks: int, fault_step: int, growth_interval: int, seed: int) -> View:
    """N016: a run with one injected fault against the healthy run, and the ordered checks' verdict."""
    d = runs(fault, ranks, fault_step, growth_interval, seed)
    diag, f, h = d["diag"], d["faulty"], d["healthy"]
    named = diag.fault
    rows = [("injected", FAULT_LABELS[fault]),
            ("named by the checks", f"{FAULT_LABELS[named]}" + (f" (check: {diag.first})" if diag.first else ""))]
    for check in dg.CHECKS:
        rows.append((f"{check}: reading over the last 50 steps",
                     f"{sig(diag.readings[check]) if np.isfinite(diag.readings[check]) else 'inf'}"
                     + ("  <- fires" if diag.fired[check] else "")))
    rows.append(("held-out loss at the end, faulty / healthy", f"{sig(f.heldout[-1])} / {sig(h.heldout[-1])}"))
    rows.append(("skipped steps, faulty / healthy", f"{fmt_int(int(f.skipped.sum()))} / {fmt_int(int(h.skipped.sum()))}"))
    right = "the checks name it" if named == fault else f"the checks name {FAULT_LABELS[named]} instead"
    if fault == "healthy":
        caption = (f"Left: the held-out loss (dark) ends at {sig(h.heldout[-1])} "
                   f"against a best possible {sig(h.heldout_floor)}. Right: the global grad norm. No check fires.")
    else:
        moved = f.heldout[-1] - f.heldout[min(fault_step, len(f.heldout) - 1)]
        trend = "rises" if moved > 1e-3 else ("keeps falling" if moved < -1e-3 else "stops moving")
        caption = (f"From step {fault_step} (dotted) the faulty run's held-out loss {trend} (red, {sig(f.heldout[-1])} "
                   f"at the end against the healthy {sig(h.heldout[-1])}; thin red: its training-batch loss); right, "
                   f"the metric that tells this fault apart, {TELL[fault]}, leaves the healthy run's curve: {right}.")
    return View("A loss that stops moving: one injected fault", rows, _FIGURE(d, fault, fault_step), caption=caption,
                values={"named_right": float(named == fault), "heldout_end": float(f.heldout[-1])})
