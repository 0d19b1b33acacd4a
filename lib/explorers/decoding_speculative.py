"""Explorers for speculation's economics (I045, N025, I055): the speedup against the batch on the
book's step model (:func:`lib.decoding.speculative.speculative_step`, the verification pass at
``query_tokens = k + 1``), the batch where the verification pass stops being free (the ridge in
tokens) and where speculation stops paying (the speedup crosses 1), and the draft length an
engine would ship per batch bucket. Views call lib only; one persistent figure per explorer.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_int, fmt_pct, fmt_ratio, fmt_time, sig

TARGETS = ("llama-3.1-70b", "llama-3.1-8b", "llama-3.1-405b")
DRAFTS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")
TPS = (1, 2, 4, 8)
SETUP_DOMAINS = dict(  # the deployment, drafter and acceptance both explorers start from
    target=Choice(TARGETS, label="target"),
    draft=Choice(DRAFTS, label="draft model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice(TPS, label="tensor parallel (both)"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    acceptance=FloatRange(0.0, 1.0, 0.05, label="acceptance rate"),
)
GRID = tuple(1 << i for i in range(11))  # batches 1 .. 1,024 on the curve
MAX_BATCH = 4096  # the curve's break-even search stops here
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # the draft-length table's batch buckets


@functools.lru_cache(maxsize=64)
def deployments(target: str, draft: str, gpu: str, tp: int, weight_dtype: str = "bf16"):
    """(target, draft) :class:`~lib.perf.deployment.Deployment` on ``tp`` x ``gpu``: the draft runs on
    the target's GPUs at the same TP (vLLM's default for a draft model), same dtypes. Refuses a draft
    that is not smaller than the target or has another vocabulary (its tokens could not be verified)."""
    from lib.perf.datasheet import matmul_dtype
    from lib.perf.deployment import Deployment
    from lib.registry import models

    t, d = models.model(target), models.model(draft)
    if d.vocab_size != t.vocab_size:
        raise ValueError(f"draft {draft} has a {d.vocab_size:,}-token vocabulary, the target {target} "
                         f"{t.vocab_size:,}: a draft must share the target's tokenizer")
    if d.params_total >= t.params_total:
        raise ValueError(f"draft {draft} is not smaller than the target {target}: pick a smaller draft")
    cdt = matmul_dtype(weight_dtype, gpu)
    kw = dict(tp=tp, weight_dtype=weight_dtype, kv_dtype=weight_dtype if weight_dtype == "fp8" else "bf16",
              compute_dtype=cdt)
    return Deployment(target, gpu, **kw), Deployment(draft, gpu, **kw)


def speculation_curve(target: str, draft: str, gpu: str, tp: int, acceptance: float, draft_tokens: int,
                      context: int, weight_dtype: str = "bf16", batches=GRID, max_batch: int = MAX_BATCH) -> SimpleNamespace:
    """Speedup of speculation against the batch on the step model, and the closed form beside it.

    ``steps``: :func:`~lib.decoding.speculative.speculative_step` at each batch; ``closed``: the
    all-weights closed form E / (max(1, B (k + 1) / T*) / max(1, B / T*) + k c) (verification pass over
    plain step, each the larger of its weight read and its FLOPs) with c = one draft forward over one
    plain target step at batch 1; ``ridge``: the batch whose verification pass turns compute-bound
    (:func:`~lib.decoding.speculative.verify_ridge_batch`); ``break_even`` (step model) and
    ``estimate`` (closed form): where the speedup crosses 1 (searched up to ``max_batch``); ``kv_ceiling``: sequences of
    ``context + k`` tokens the target's KV pool holds."""
    from lib.decoding import speculative as sp

    dep, ddep = deployments(target, draft, gpu, tp, weight_dtype)
    drafter = sp.model_drafter(ddep)
    k = draft_tokens
    steps = [sp.speculative_step(dep, drafter, k, acceptance, b, context) for b in batches]
    one = sp.speculative_step(dep, drafter, k, acceptance, 1, context)
    c = drafter.token_s(1, context) / one.plain_step_s
    t_star = sp.verify_free_tokens(dep)
    e = sp.speculative_tokens_per_step(acceptance, k)
    closed = [e / (max(1.0, b * (k + 1) / t_star) / max(1.0, b / t_star) + k * c) for b in batches]
    return SimpleNamespace(
        dep=dep, draft=ddep, drafter=drafter, batches=list(batches), steps=steps, closed=closed, c=c,
        tokens_per_step=e, t_star=t_star, ridge=sp.verify_ridge_batch(dep, k, context),
        break_even=sp.break_even_batch(dep, drafter, k, acceptance, context, max_batch=max_batch),
        estimate=sp.break_even_batch_estimate(acceptance, k, c, t_star),
        kv_ceiling=dep.budget.max_concurrency(context + k),
    )


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.model, = ax.plot([], [], lw=2, color="C0", label="step model")
    a.closed, = ax.plot([], [], lw=1.2, ls="--", color="grey", label="closed form (weights only)")
    a.one = ax.axhline(1.0, color="black", lw=0.8)
    a.ridge = ax.axvline(1, color="C2", ls=":", lw=1.5, label="verify pass turns compute-bound")
    a.even = ax.axvline(1, color="C3", ls="-.", lw=1.5, label="speedup = 1 (step model)")
    a.kv = ax.axvline(1, color="C7", ls="--", lw=1, label="KV pool full")
    a.mark, = ax.plot([], [], "o", color="C3", ms=7, label="chosen batch")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("speedup (tokens/s with / without)")
    figures.log_scale(ax, "x", base=2)
    ax.grid(True)
    return a


def _draw(a, batches, up, closed, ridge, even, kv, batch, at) -> None:
    a.model.set_data(batches, up)
    a.closed.set_data(batches, closed)
    lo, hi = batches[0], batches[-1]
    for line, x in ((a.ridge, ridge), (a.even, even), (a.kv, kv)):
        shown = math.isfinite(x) and lo <= x <= hi
        line.set_visible(shown)
        if shown:
            line.set_xdata([x, x])
    a.mark.set_data([batch], [at])
    a.ax.set_xlim(lo, hi)
    a.ax.set_ylim(0, 1.1 * max(max(up), max(closed), at, 1.2))
    figures.legend(a.ax, [a.model, a.closed, a.ridge, a.even, a.kv, a.mark], loc="lower left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.4, _build, _draw)


def _int(x: float) -> str:
    return "none" if math.isinf(x) else fmt_int(x)


def break_even_phrase(break_even: float, max_batch: int = MAX_BATCH) -> str:
    """A break-even batch (:func:`~lib.decoding.speculative.break_even_batch`) in words: 1.0 means
    speculation does not pay even at batch 1, inf that it still pays at ``max_batch``."""
    if math.isinf(break_even):
        return f"no batch up to {max_batch:,}: it keeps paying"
    if break_even <= 1.0:
        return "no batch: it does not pay even at batch 1"
    return f"about {sig(break_even)} sequences"


@explorer(
    "decoding.speculation_batch",
    **SETUP_DOMAINS,
    draft_tokens=IntRange(1, 8, label="drafted tokens k"),
    context=IntRange(0, 32768, label="context (tokens)"),
    batch=IntRange(1, 1024, log=True, label="batch (sequences)"),
)
def speculation_batch(target: str, draft: str, gpu: str, tp: int, weight_dtype: str, acceptance: float,
                      draft_tokens: int, context: int, batch: int) -> View:
    """I045, N025: speculation's speedup against the batch; where it stops being free and stops paying."""
    from lib.decoding import speculative as sp

    r = speculation_curve(target, draft, gpu, tp, acceptance, draft_tokens, context, weight_dtype,
                          tuple(sorted({*GRID, batch})), max_batch=GRID[-1])
    s = sp.speculative_step(r.dep, r.drafter, draft_tokens, acceptance, batch, context)
    fig = _FIGURE(r.batches, [x.speedup for x in r.steps], r.closed, r.ridge, r.break_even, r.kv_ceiling,
                  batch, s.speedup)
    rows = [("tokens per verify step E", sig(r.tokens_per_step)),
            ("draft cost c (batch 1)", sig(r.c)),
            ("verify pass free below", f"batch {_int(r.ridge)} ({sig(r.t_star)} tokens / {draft_tokens + 1})"),
            ("speedup = 1 at (step model)", break_even_phrase(r.break_even, GRID[-1])),
            ("speedup = 1 at (closed form)", f"about {sig(r.estimate)} sequences" if r.estimate > 0 else "no batch pays"),
            ("KV pool holds", f"{sig(r.kv_ceiling)} sequences"),
            (f"at batch {fmt_int(batch)}", f"{fmt_ratio(s.speedup)}: verify {fmt_time(s.verify_s)} "
                                          f"({fmt_ratio(s.verify_overhead)} a plain step), drafts {fmt_time(s.draft_s)}")]
    if r.break_even <= 1.0 and r.steps[0].speedup <= 1:
        where = "speculation does not pay at any batch here"
    elif math.isinf(r.break_even) or r.break_even > r.batches[-1]:
        where = "speculation still pays at every batch shown"
    else:
        where = f"the speedup falls to 1 at about {sig(r.break_even)} sequences"
    caption = (f"Speculation's speedup (blue) against the batch: flat while the verification pass of "
               f"{draft_tokens + 1} tokens per sequence rides on the weight read, falling once batch x "
               f"{draft_tokens + 1} passes the ridge of {sig(r.t_star)} tokens (green, batch {_int(r.ridge)}); "
               f"{where}. At batch {fmt_int(batch)} (red dot) it is {fmt_ratio(s.speedup)}.")
    return View(f"{draft} drafting {draft_tokens} for {r.dep.label}, acceptance {fmt_pct(acceptance)}, "
                f"{context:,} tokens of context", rows, fig, caption=caption,
                values={"speedup": s.speedup, "ridge": r.ridge, "break_even": r.break_even})


# ---- I055: the draft length an engine ships per batch bucket --------------------------------------

TABLE_BUCKETS = (1, 8, 64, 512)  # the explorer's buckets (the notebook tabulates every power of two)


def peak_batch(dep, context: int, draft_tokens: int = 0) -> int:
    """The busiest batch a replica runs at ``context``: the engine's ``max_num_seqs``, or fewer when
    the KV pool holds fewer sequences of ``context + draft_tokens`` tokens (whole sequences)."""
    return max(1, min(dep.max_num_seqs, math.floor(dep.budget.max_concurrency(context + draft_tokens))))


def draft_table(target: str, draft: str, gpu: str, tp: int, acceptance: float, context: int,
                max_draft_tokens: int, weight_dtype: str = "bf16", buckets=TABLE_BUCKETS) -> SimpleNamespace:
    """The draft length per batch bucket (:func:`~lib.decoding.speculative.draft_length_table`) at
    ``context``, the buckets the KV pool can hold, and the same buckets with k left at its batch-1
    value (``fixed``): what an engine ships against what it does if left alone."""
    from lib.decoding import speculative as sp

    dep, ddep = deployments(target, draft, gpu, tp, weight_dtype)
    drafter = sp.model_drafter(ddep)
    peak = peak_batch(dep, context, max_draft_tokens)
    edges = [b for b in buckets if b <= peak] or [1]
    if edges[-1] < peak:
        edges.append(peak)
    rows = sp.draft_length_table(dep, drafter, acceptance, edges, context, max_draft_tokens)
    k_low = rows[0].draft_tokens
    fixed = [sp.speculative_step(dep, drafter, k_low, acceptance, b, context) for b in edges]
    return SimpleNamespace(dep=dep, draft=ddep, drafter=drafter, edges=edges, rows=rows, fixed=fixed, k_low=k_low,
                           peak=peak)


def _table_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.s_table, = ax.plot([], [], "o-", color="C2", lw=2, label="speedup with the table (label: its k)")
    a.s_fixed, = ax.plot([], [], "s:", color="C3", label="speedup with k left at its batch-1 value")
    a.one = ax.axhline(1.0, color="black", lw=0.8)
    a.labels = [ax.text(1, 1, "", fontsize=8, ha="center", va="bottom", color="C2") for _ in range(len(TABLE_BUCKETS) + 1)]
    ax.set_xlabel("batch bucket (sequences)")
    ax.set_ylabel("speedup (tokens/s with / without)")
    figures.log_scale(ax, "x", base=2)
    ax.grid(True)
    return a


def _table_draw(a, edges, ks, s_table, s_fixed) -> None:
    a.s_table.set_data(edges, s_table)
    a.s_fixed.set_data(edges, s_fixed)
    top = 1.15 * max(max(s_table), max(s_fixed), 1.2)
    for i, t in enumerate(a.labels):
        shown = i < len(edges)
        t.set_visible(shown)
        if shown:
            t.set_position((edges[i], s_table[i] + 0.03 * top))
            t.set_text(f"k={ks[i]}")
    a.ax.set_xlim(1 / 1.4, max(edges[-1], 2) * 1.4)
    a.ax.set_ylim(0, top)
    figures.legend(a.ax, [a.s_table, a.s_fixed], loc="lower left", fontsize=7)


_TABLE_FIGURE = figures.LiveFigure(6.0, 3.4, _table_build, _table_draw)


@explorer(
    "decoding.draft_length_table",
    **SETUP_DOMAINS,
    context=IntRange(0, 32768, label="context (tokens)"),
    max_draft_tokens=IntRange(1, 8, label="longest draft"),
)
def draft_length_table_view(target: str, draft: str, gpu: str, tp: int, weight_dtype: str, acceptance: float,
                            context: int, max_draft_tokens: int) -> View:
    """I055: the draft length per batch bucket, against k left at its low-load value, and how context moves it."""
    r = draft_table(target, draft, gpu, tp, acceptance, context, max_draft_tokens, weight_dtype)
    ks = [x.draft_tokens for x in r.rows]
    fig = _TABLE_FIGURE(r.edges, ks, [x.speedup for x in r.rows], [x.speedup for x in r.fixed])
    rows = [(f"batch <= {fmt_int(b)}", f"k = {x.draft_tokens}: {fmt_ratio(x.speedup)} (k = {r.k_low} left alone: "
                                       f"{fmt_ratio(f.speedup)})") for b, x, f in zip(r.edges, r.rows, r.fixed, strict=True)]
    rows.append(("peak batch (max_num_seqs or KV pool)", f"{fmt_int(r.peak)} sequences"))
    off = next((b for b, k in zip(r.edges, ks, strict=True) if k == 0), None)
    caption = (f"Speedup per batch bucket at {context:,} tokens of context with the best draft length of each bucket "
               f"(green, labelled with its k) against k = {r.k_low} left alone (red): "
               + (f"speculation is switched off from batch {fmt_int(off)}" if off else
                  "speculation still pays at the peak batch")
               + f"; left alone it gives {fmt_ratio(r.fixed[-1].speedup)} at the peak batch of {fmt_int(r.peak)}.")
    return View(f"Draft length by batch: {draft} for {r.dep.label}, acceptance {fmt_pct(acceptance)}, "
                f"{context:,} tokens", rows, fig, caption=caption,
                values={"k_low": float(r.k_low), "peak_fixed": r.fixed[-1].speedup})
