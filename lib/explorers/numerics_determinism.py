"""Explorers for greedy nondeterminism measured on this machine (I077 greedy-nondeterminism).

Views call :mod:`lib.numerics.determinism` only (a seeded recurrent toy LM decoded greedily with the
request alone and inside a batch, with torch on this CPU). One persistent matplotlib figure,
updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.numerics import determinism
from lib.units import fmt_int, sig

D_MODEL, VOCAB = 128, 512  # the toy's width and vocabulary


@functools.lru_cache(maxsize=64)
def _run(batch: int, steps: int, gain: float, seed: int):
    return determinism.toy_greedy(batch, steps, D_MODEL, VOCAB, gain, seed)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.diff = ax.plot([0, 1], [1e-7, 1e-7], color="C0", lw=1.4, label="largest logit difference")[0]
    a.flip = ax.axvline(0, color="C3", ls="--", lw=1.2, label="first different token")
    figures.log_scale(ax, "y")
    ax.set_xlabel("decode step")
    ax.set_ylabel("|logit alone - logit in batch|")
    ax.grid(True)
    return a


def _draw(a, steps, diff, flip) -> None:
    a.diff.set_data(steps, diff)
    a.flip.set_xdata([flip if flip is not None else steps[-1], flip if flip is not None else steps[-1]])
    a.flip.set_visible(flip is not None)
    a.ax.set_xlim(steps[0], steps[-1])
    a.ax.set_ylim(1e-9, max(float(np.max(diff)) * 3, 1e-6))
    figures.legend(a.ax, [a.diff, a.flip], fontsize=7, loc="lower right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.greedy_divergence",
    batch=IntRange(2, 64, label="batch the request lands in"),
    gain=FloatRange(1.5, 4.0, 0.1, label="toy recurrence gain"),
    steps=IntRange(20, 300, label="decode steps"),
    seed=IntRange(0, 1000, label="seed"),
)
def greedy_divergence(batch: int, gain: float, steps: int, seed: int) -> View:
    """I077: the same request decoded greedily alone and in a batch, on this machine's CPU (torch, fp32):
    the largest logit difference at each step and the first step whose token differs."""
    g = round(gain, 3)
    ta, la = _run(1, steps, g, seed)
    tb, lb = _run(batch, steps, g, seed)
    dv = determinism.first_divergence(ta, la, tb, lb)
    diff = np.maximum(np.abs(la.astype(np.float64) - lb).max(axis=1), 1e-9)
    rows = [("first step with different bits", fmt_int(dv.first_bits) if dv.first_bits is not None else "none"),
            ("first step with a different token", fmt_int(dv.first_token) if dv.first_token is not None else
             f"none in {fmt_int(steps)} steps"),
            ("largest logit difference before it", sig(dv.max_diff_before_flip)),
            ("tokens equal", f"{fmt_int(int(np.sum(ta == tb)))} of {fmt_int(steps)}")]
    caption = ("Largest logit difference between the request decoded alone and in a batch of "
               f"{batch} at each step (log y; 1e-9 stands for zero), measured with torch on this CPU; "
               + (f"the dashed line is the first different token, step {dv.first_token}." if dv.first_token is not None
                  else "no token differs in these steps."))
    fig = _FIGURE(np.arange(steps), diff, dv.first_token)
    return View(f"Greedy alone vs in a batch of {batch}", rows, fig, caption=caption,
                note="the bits differ" if dv.first_bits is not None else "bitwise equal on this machine",
                values={"first_token": -1 if dv.first_token is None else dv.first_token})
