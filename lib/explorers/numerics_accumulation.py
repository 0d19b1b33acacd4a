"""Explorers for running sums held in bf16 (I033 bf16-running-sum).

Views call :mod:`lib.numerics.accumulation` only (the seeded attention readout with one op's state
in bf16, its error against the all-fp32 pass, the fixes). One persistent matplotlib figure,
updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.numerics import accumulation as acc
from lib.units import fmt_int, sig

DEPLOYED = {"kv_cache": "bf16", "output": "bf16"}  # the legitimate bf16 ops of the deployed pass


@functools.lru_cache(maxsize=64)
def _errors(bug: str, fix: str, context: int, score_std: float, seed: int) -> SimpleNamespace:
    p = acc.pooling_problem(context, score_std=score_std, seed=seed)
    ref = acc.pooled_outputs(p)
    dep = DEPLOYED | {bug: "bf16"}
    return SimpleNamespace(bug=acc.relative_error(acc.pooled_outputs(p, dep), ref),
                           fix=acc.relative_error(acc.pooled_outputs(p, dep | {bug: fix}), ref))


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bug = ax.plot([1.0, 2.0], [1e-3, 1e-3], color="C3", lw=1.4, label="state in bf16")[0]
    a.fix = ax.plot([1.0, 2.0], [1e-3, 1e-3], color="C0", lw=1.4, label="fixed")[0]
    a.stall = ax.axvline(256, color="0.4", ls=":", lw=1.2, label="256 tokens")
    figures.log_scale(ax, "both")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("relative error vs all-fp32 pass")
    ax.grid(True)
    return a


def _draw(a, ls, bug, fix, bug_label, fix_label) -> None:
    a.bug.set_data(ls, bug)
    a.fix.set_data(ls, fix)
    a.bug.set_label(bug_label)
    a.fix.set_label(fix_label)
    a.ax.set_xlim(ls[0], ls[-1])
    lo = max(min(float(np.min(bug)), float(np.min(fix))), 1e-6)
    a.ax.set_ylim(lo / 2, max(float(np.max(bug)), float(np.max(fix))) * 2)
    figures.legend(a.ax, [a.bug, a.fix, a.stall], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.running_sum",
    buggy_op=Choice(acc.STATE_OPS, label="state held in bf16"),
    fix=Choice(("fp32", "kahan_bf16"), label="fix"),
    context=Choice((1024, 2048, 4096, 8192), label="context (tokens)"),
    score_std=FloatRange(0.5, 4.0, 0.1, label="score std"),
    seed=IntRange(0, 1000, label="seed"),
)
def running_sum_error(buggy_op: str, fix: str, context: int, score_std: float, seed: int) -> View:
    """I033: the readout's error against the all-fp32 pass as the context grows, with ``buggy_op``'s
    running state in bf16 and then fixed (fp32 state or Kahan-compensated bf16)."""
    e = _errors(buggy_op, fix, context, round(score_std, 3), seed)
    idx = np.unique(np.round(np.logspace(np.log10(16), np.log10(context), 120)).astype(int)) - 1
    ls = idx + 1
    floor = float(np.median(e.fix[idx]))
    above = np.flatnonzero(e.bug > 10 * max(floor, 1e-7))
    first = int(above[0]) + 1 if above.size else None
    rows = [("state in bf16", buggy_op),
            ("error at 128 tokens", sig(float(e.bug[min(127, context - 1)]))),
            (f"error at {fmt_int(context)} tokens", sig(float(e.bug[-1]))),
            ("first length 10x over the fixed floor", fmt_int(first) if first else "never in this context"),
            (f"fixed ({fix}) at {fmt_int(context)} tokens", sig(float(e.fix[-1])))]
    caption = (f"Relative error of the readout against the all-fp32 pass (log-log) with the {buggy_op} state in "
               f"bf16 (red) and fixed with {fix} (blue): {sig(float(e.bug[-1]))} against {sig(float(e.fix[-1]))} at "
               f"{fmt_int(context)} tokens.")
    fig = _FIGURE(ls, e.bug[idx], e.fix[idx], f"{buggy_op} in bf16", f"{buggy_op} in {fix}")
    return View(f"Running {buggy_op} in bf16", rows, fig, caption=caption,
                note="the error grows with the context" if e.bug[-1] > 2 * e.bug[min(127, context - 1)] else
                "the error stops growing",
                values={"bug_long": float(e.bug[-1]), "fix_long": float(e.fix[-1])})
