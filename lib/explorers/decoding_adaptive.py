"""Explorers for adaptive speculation (I054, I080).

* ``decoding.adaptive_draft_length``: time per token against the draft length for a code class, a
  chat class and their mix, with each class's best k, the mix's best fixed k, what per-class k
  buys a request running alone and what it costs inside a padded batch.
* ``decoding.speculation_tail``: the acceptance below which speculating k tokens is slower than
  plain decoding, against the batch; where a request of a given acceptance stands.

Step times come from :mod:`lib.decoding.adaptive`'s step table (the book's step model through
:func:`lib.decoding.speculative.speculative_step`); the few replicas offered here build their
tables on first use (about 0.3 s each) and keep them.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.decoding import adaptive as ad
from lib.decoding.speculative import model_drafter, speculative_tokens_per_step
from lib.perf.deployment import deployment
from lib.units import fmt_pct, fmt_time

#: Target replicas: label -> (model, GPU, tensor-parallel degree), BF16.
TARGETS = {
    "llama-3.1-70b on 8x h100-sxm": ("llama-3.1-70b", "h100-sxm", 8),
    "llama-3.1-70b on 4x h100-sxm": ("llama-3.1-70b", "h100-sxm", 4),
    "llama-3.1-70b on 8x h200": ("llama-3.1-70b", "h200", 8),
    "llama-3.1-70b on 4x h200": ("llama-3.1-70b", "h200", 4),
}
#: Draft models (on the target's GPUs, at the tensor-parallel degree ``draft_tp``).
DRAFTERS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b")
DRAFT_TPS = (1, 2, 4, 8)


def target_label(model: str, gpu: str, tp: int) -> str:
    """The :data:`TARGETS` label of a replica (ValueError when it is not offered)."""
    label = f"{model} on {tp}x {gpu}"
    if label not in TARGETS:
        raise ValueError(f"the explorer offers {', '.join(TARGETS)}; got {label!r}")
    return label
CONTEXT = 1024

_TABLES: dict = {}


def table_of(target: str, drafter: str, draft_tp: int, context: int = CONTEXT) -> ad.StepTable:
    """The step table of one of :data:`TARGETS` with one of :data:`DRAFTERS` at ``draft_tp``
    (at most the target's TP: the drafter runs on the target's GPUs); cached here."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}; got {drafter!r}")
    model, gpu, tp = TARGETS[target]
    if draft_tp not in DRAFT_TPS or draft_tp > tp:
        raise ValueError(f"draft_tp must be one of {DRAFT_TPS} and at most the target's TP ({tp}); got {draft_tp!r}")
    key = (target, drafter, draft_tp, context)
    if key not in _TABLES:
        tgt = deployment(model, gpu, tp=tp)
        drf = model_drafter(deployment(drafter, gpu, tp=draft_tp))
        _TABLES[key] = ad.step_table(tgt, drf, context)
    return _TABLES[key]


# ---- I054 ----------------------------------------------------------------------------------------


def _k_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.code, = ax.plot([0], [0], "o-", color="C0", ms=3, label="code")
    a.chat, = ax.plot([0], [0], "o-", color="C1", ms=3, label="chat")
    a.mix, = ax.plot([0], [0], "-", color="k", lw=2, label="the mix")
    a.best, = ax.plot([0], [0], "*", color="red", ms=11, ls="none", label="best k")
    a.plain = ax.axhline(1.0, color="grey", ls="--", lw=1, label="plain decoding")
    ax.set_xlabel("draft length k")
    ax.set_ylabel("time per token (ms)")
    ax.grid(True)
    return a


def _k_draw(a, ks, code, chat, mix, best_x, best_y, plain) -> None:
    a.code.set_data(ks, code)
    a.chat.set_data(ks, chat)
    a.mix.set_data(ks, mix)
    a.best.set_data(best_x, best_y)
    a.plain.set_ydata([plain, plain])
    a.ax.set_xlim(-0.3, ks[-1] + 0.3)
    top = max(float(np.max(chat)), plain) * 1.08
    a.ax.set_ylim(0.0, top)
    figures.legend(a.ax, [a.code, a.chat, a.mix, a.best, a.plain], fontsize=7, loc="lower right")


_K_FIGURE = figures.LiveFigure(6.0, 3.0, _k_build, _k_draw)


@explorer(
    "decoding.adaptive_draft_length",
    target=Choice(tuple(TARGETS), label="target replica"),
    drafter=Choice(DRAFTERS, label="drafter"),
    draft_tp=Choice(DRAFT_TPS, label="drafter's TP degree"),
    code_acceptance=FloatRange(0.5, 0.98, 0.01, label="code acceptance per token"),
    chat_acceptance=FloatRange(0.2, 0.9, 0.01, label="chat acceptance per token"),
    code_share=FloatRange(0.0, 1.0, 0.05, label="share of code requests"),
    batch=IntRange(1, 128, log=True, label="batch (sequences per step)"),
)
def adaptive_draft_length(target: str, drafter: str, draft_tp: int, code_acceptance: float, chat_acceptance: float,
                          code_share: float, batch: int) -> View:
    """I054: each class's best k, the mix's best fixed k, per-class k alone and in a padded batch."""
    tab = table_of(target, drafter, draft_tp)
    m = ad.mix_draft_lengths(tab, (code_acceptance, chat_acceptance), code_share, batch, max_draft_tokens=10)
    ms = 1e3
    kc, kh = m.best_k
    best_x = [kc, kh, m.fixed_k]
    best_y = [m.per_token_s[0, kc] * ms, m.per_token_s[1, kh] * ms, m.mix_per_token_s[m.fixed_k] * ms]
    fig = _K_FIGURE(m.ks, m.per_token_s[0] * ms, m.per_token_s[1] * ms, m.mix_per_token_s * ms, best_x, best_y,
                    m.plain_s * ms)
    speed = m.plain_s / m.mix_per_token_s[m.fixed_k]
    rows = [
        ("drafter / target step at batch 1", f"{tab.draft_round_s[0] / tab.plain_s[0]:.3f}"),
        ("best k: code / chat", f"{kc} / {kh}"),
        ("best fixed k for the mix", f"{m.fixed_k} ({speed:.2f}x plain at batch {batch})"),
        ("per-class k, requests alone (batch 1)", f"{fmt_pct(m.per_class_gain)} faster than the best fixed k"),
        (f"per-class k in a padded batch of {batch}",
         f"{fmt_pct(m.padded_per_class_gain)} against the best fixed k" if batch > 1 else "(batch 1: no padding)"),
        ("plain step", fmt_time(m.plain_s)),
    ]
    caption = (f"Time per token against the draft length at batch {batch}: code is fastest at k = {kc}, chat at "
               f"k = {kh}, and the mix at k = {m.fixed_k}; the mix's curve is flat near its minimum, which is why "
               f"giving each class its own k saves only {fmt_pct(m.per_class_gain)} for requests running alone.")
    return View(f"Draft length for code and chat ({target}, {drafter} at TP {draft_tp})", rows, fig, caption=caption,
                note="Expected values from eq. 1 and the step model; the notebook's simulation adds per-request "
                     "spread, the running estimate and per-step stopping.",
                values={"code_k": kc, "chat_k": kh, "fixed_k": m.fixed_k, "per_class_gain": m.per_class_gain,
                        "padded_gain": m.padded_per_class_gain})


# ---- I080 ----------------------------------------------------------------------------------------


def _tail_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve, = ax.plot([1], [0], "o-", color="C3", ms=3, label="break-even acceptance")
    a.request = ax.axhline(0.5, color="C0", lw=1.5, label="this request")
    a.cross = ax.axvline(1.0, color="grey", ls="--", lw=1, label="slower from here")
    figures.log_scale(ax, "x", 2)
    ax.set_xlabel("batch (sequences per step)")
    ax.set_ylabel("acceptance per token")
    ax.set_ylim(0.0, 1.0)
    ax.grid(True)
    return a


def _tail_draw(a, batches, breakeven, acceptance, cross, k) -> None:
    shown = np.where(np.isfinite(breakeven), breakeven, 1.0)
    a.curve.set_data(batches, shown)
    a.curve.set_label(f"break-even acceptance, k = {k} (slower below it)")
    a.request.set_ydata([acceptance, acceptance])
    a.request.set_label(f"this request, a = {acceptance:.2f}")
    a.cross.set_visible(cross is not None)
    if cross is not None:
        a.cross.set_xdata([cross, cross])
    a.ax.set_xlim(batches[0], batches[-1])
    figures.legend(a.ax, [a.curve, a.request, a.cross], fontsize=7, loc="upper left")


_TAIL_FIGURE = figures.LiveFigure(6.0, 3.0, _tail_build, _tail_draw)


@explorer(
    "decoding.speculation_tail",
    target=Choice(tuple(TARGETS), label="target replica"),
    drafter=Choice(DRAFTERS, label="drafter"),
    draft_tp=Choice(DRAFT_TPS, label="drafter's TP degree"),
    draft_tokens=IntRange(1, 10, label="draft length k"),
    acceptance=FloatRange(0.05, 0.99, 0.01, label="the request's acceptance per token"),
)
def speculation_tail(target: str, drafter: str, draft_tp: int, draft_tokens: int, acceptance: float) -> View:
    """I080: the acceptance below which k drafted tokens make a token slower than plain decoding,
    against the batch, and where one request stands."""
    tab = table_of(target, drafter, draft_tp)
    batches = tab.batches
    key = ("breakeven", target, drafter, draft_tp, draft_tokens)
    if key not in _TABLES:
        _TABLES[key] = np.array([ad.breakeven_acceptance(tab, float(b), draft_tokens) for b in batches])
    be = _TABLES[key]
    slower = [float(b) for b, x in zip(batches, be, strict=True) if acceptance < x]
    cross = slower[0] if slower else None
    e = float(speculative_tokens_per_step(acceptance, draft_tokens))

    def ratio(b):
        return tab.plain(b) / (tab.step_s(b, draft_tokens) / e)

    fig = _TAIL_FIGURE(batches, be, acceptance, cross, draft_tokens)
    rows = [(f"break-even acceptance at batch {int(b)}", "never pays" if not np.isfinite(x) else f"{x:.3f}")
            for b, x in zip(batches, be, strict=True) if int(b) in (1, 32, 128)]
    rows += [
        ("this request's speedup at batch 1", f"{ratio(1.0):.2f}x"),
        ("this request's speedup at batch 128", f"{ratio(128.0):.2f}x"),
        ("slower than plain decoding from batch", f"{int(cross)}" if cross is not None else "never (up to 256)"),
    ]
    where = (f"a request with acceptance {acceptance:.2f} is slower than plain decoding from batch {int(cross)} on"
             if cross is not None else f"a request with acceptance {acceptance:.2f} gains at every batch up to 256")
    caption = (f"The acceptance a request needs for {draft_tokens} drafted tokens to pay rises with the batch, because "
               f"the verification pass and the drafts stop being free as the batch nears the compute ridge: {where}.")
    return View(f"When speculation slows a request down ({target}, {drafter} at TP {draft_tp}, k = {draft_tokens})",
                rows, fig, caption=caption,
                values={"breakeven_1": float(be[0]), "cross": float(cross) if cross is not None else math.inf})
