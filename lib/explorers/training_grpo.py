"""Explorers for GRPO (W09): how the loss's aggregation weighs the tokens of short and long answers.

Calls lib only: :func:`lib.training.grpo.token_push` (advantages x token weights on the first,
on-policy inner step). One persistent figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import IntRange, View, explorer
from lib.training import grpo
from lib.units import fmt_int, sig

LABELS = {"sequence": "per-answer mean (GRPO)", "token": "per-token mean (DAPO)", "constant": "constant (Dr. GRPO)"}


@functools.lru_cache(maxsize=128)
def pushes(group_size: int, correct: int, shortest: int, longest: int) -> dict:
    """Per-token push A_i w_i of every answer under each aggregation, scaled by the group's token count
    (so the per-token mean shows the advantage itself)."""
    rewards, lengths = grpo.length_spread_group(group_size, correct, shortest, longest)
    total = float(lengths.sum())
    out = {"rewards": rewards, "lengths": lengths}
    for agg in grpo.AGGREGATIONS:
        out[agg] = grpo.token_push(rewards, lengths, group_size, agg)[0] * total
    return out


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, lines={})
    for k, agg in enumerate(grpo.AGGREGATIONS):
        a.lines[agg, 1] = ax.plot([], [], "o-", color=f"C{k}", label=f"{LABELS[agg]}, right")[0]
        a.lines[agg, 0] = ax.plot([], [], "s--", color=f"C{k}", mfc="none", label=f"{LABELS[agg]}, wrong")[0]
    ax.axhline(0.0, color="0.5", lw=0.8)
    figures.log_scale(ax, "x", base=2)
    ax.set_xlabel("answer length (tokens)")
    ax.set_ylabel("push per token (x group tokens)")
    ax.grid(True)
    ax.legend(handles=list(a.lines.values()), fontsize=6, loc="upper right")
    return a


def _draw(a, data) -> None:
    lengths, rewards = data["lengths"], data["rewards"]
    ys = []
    for agg in grpo.AGGREGATIONS:
        for cls in (1, 0):
            sel = rewards == cls
            a.lines[agg, cls].set_data(lengths[sel], data[agg][sel])
            a.lines[agg, cls].set_visible(bool(sel.any()))
            ys.extend(data[agg][sel])
    lo, hi = min(ys + [0.0]), max(ys + [0.0])
    pad = 0.08 * (hi - lo or 1.0)
    a.ax.set_ylim(lo - pad, hi + pad)
    a.ax.set_xlim(lengths.min() / 1.3, lengths.max() * 1.3)


_FIGURE = figures.LiveFigure(6.0, 3.4, _build, _draw)


@explorer(
    "training.grpo_length_bias",
    group_size=IntRange(2, 16, label="answers per prompt G"),
    correct=IntRange(0, 16, label="right answers"),
    shortest=IntRange(1, 1024, log=True, label="shortest answer (tokens)"),
    longest=IntRange(1, 8192, log=True, label="longest answer (tokens)"),
)
def grpo_length_bias(group_size: int, correct: int, shortest: int, longest: int) -> View:
    """W09: per-token push of each answer under the three aggregations of GRPO's loss."""
    d = pushes(group_size, correct, shortest, longest)
    lengths, rewards = d["lengths"], d["rewards"]
    rows = [("answers (right / wrong)", f"{fmt_int(correct)} / {fmt_int(group_size - correct)}"),
            ("lengths", f"{fmt_int(lengths.min())} to {fmt_int(lengths.max())} tokens")]
    wrong = rewards == 0
    if 0 < correct < group_size:
        w_short, w_long = d["sequence"][wrong][0], d["sequence"][wrong][-1]
        ratio = w_short / w_long
        rows.append(("per-answer mean: short vs long wrong answer, penalty per token", f"{sig(ratio)}x"))
        verdict = (f"under the per-answer mean the shortest wrong answer's tokens are pushed down {sig(ratio)} times "
                   f"harder than the longest wrong answer's, while the per-token and constant normalisers weigh every "
                   f"token of the group alike")
    else:
        ratio = 1.0
        verdict = ("every answer scored the same, so every advantage is 0 and no aggregation pushes any token: the "
                   "group teaches nothing")
    for agg in grpo.AGGREGATIONS:
        rows.append((f"{LABELS[agg]}: push per token, right / wrong",
                     " / ".join(sig(float(np.mean(d[agg][rewards == c]))) if (rewards == c).any() else "-"
                                for c in (1, 0))))
    fig = _FIGURE(d)
    caption = (f"Each marker is one answer of a group of {group_size}, at its length; the height is how hard one step "
               f"pushes each of its tokens up (right answers) or down (wrong ones): {verdict}.")
    return View("GRPO: push per token by answer length", rows, fig, caption=caption,
                values={"short_over_long_wrong": float(ratio)})
