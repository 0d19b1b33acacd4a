"""Explorers for the prefill-against-decode scheduling questions (I022, I025, N024).

* ``scheduling.head_of_line``: short requests queued behind one long prompt (or one long output)
  under four scheduling policies; the per-step timeline of prefill and decode tokens, and what
  the long request costs each short one in TTFT.
* ``scheduling.prefill_damage``: one long prompt hitting a steady stream under chunked prefill;
  the inter-token gap over time, the tokens of each step and the queue it locks out.
* ``scheduling.chunk_budget``: the long prompt's prefill time and the worst decode gap against
  the token budget, with the window that a TTFT and a TPOT target leave.

Every simulation runs on :mod:`lib.scheduling` with the step costs of the book's step models.
A replica's step-cost table takes 0.05-0.2 s to build, so the explorers offer a few named
replicas (:data:`REPLICAS`) and build all of their tables on the first update; later updates
only simulate and draw.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf.deployment import Deployment
from lib.scheduling import Policy, step_cost
from lib.scheduling import long_prefill as lp
from lib.units import fmt_int, fmt_time, sig

#: The replicas these explorers offer: label -> (model, GPU, tensor-parallel degree), BF16.
REPLICAS = {
    "llama-3.1-70b on 8x h100-sxm": ("llama-3.1-70b", "h100-sxm", 8),
    "llama-3.1-8b on 1x l40s": ("llama-3.1-8b", "l40s", 1),
    "qwen2.5-72b on 4x mi300x": ("qwen2.5-72b", "mi300x", 4),
    "mixtral-8x7b on 2x h200": ("mixtral-8x7b", "h200", 2),
}
#: The largest decode batch the step tables cover (the scenarios here run far fewer sequences).
MAX_BATCH = 256


def deployment_of(label: str) -> Deployment:
    """The :class:`~lib.perf.deployment.Deployment` of one of :data:`REPLICAS`."""
    if label not in REPLICAS:
        raise ValueError(f"replica must be one of {', '.join(REPLICAS)}; got {label!r}")
    model, gpu, tp = REPLICAS[label]
    return Deployment(model, gpu, tp=tp)


def replica_cost(label: str):
    """The replica's step costs (:func:`lib.scheduling.step_cost`, tables up to :data:`MAX_BATCH`)."""
    return step_cost(deployment_of(label), max_batch=MAX_BATCH)


_WARM: dict = {}


def _cost(label: str):
    """The replica's step costs; the first call builds every replica's table (kept here)."""
    if not _WARM:
        for name in REPLICAS:
            _WARM[name] = replica_cost(name)
    return _WARM[label]


def _check_window(label: str, tokens: int, what: str) -> None:
    window = deployment_of(label).mdl.max_position_embeddings
    if tokens > window:
        raise ValueError(f"{what} ({tokens:,} tokens) exceeds {REPLICAS[label][0]}'s {window:,}-token "
                         "context window: shorten it or pick another replica")


# ---- I022: head-of-line blocking ---------------------------------------------------------------

#: The scheduling policies of the head-of-line question, by the name the page uses.
HOL_POLICIES = (
    "whole prompts, FCFS",
    "chunked, FCFS",
    "chunked, shortest prompt first",
    "chunked, cap per long prompt",
)


def hol_policy(name: str, token_budget: int, cap: int, window: int) -> Policy:
    """The :class:`~lib.scheduling.Policy` behind each of :data:`HOL_POLICIES`.

    Whole prompts: no chunking, a step prefills whole prompts before any decode (vLLM V0), with a
    budget of the model's window (V0's default ``max_num_batched_tokens``); chunked: decode-first
    steps of ``token_budget`` tokens, FCFS, shortest prompt first, or FCFS with each prompt's
    chunk capped at ``cap`` (vLLM's ``long_prefill_token_threshold``)."""
    if name == "whole prompts, FCFS":
        return Policy(chunked_prefill=False, step_mix="prefill_first", token_budget=window)
    if name == "chunked, FCFS":
        return Policy(token_budget=token_budget)
    if name == "chunked, shortest prompt first":
        return Policy(token_budget=token_budget, order="spf")
    if name == "chunked, cap per long prompt":
        return Policy(token_budget=token_budget, long_prefill_cap=cap)
    raise ValueError(f"policy must be one of {', '.join(HOL_POLICIES)}; got {name!r}")


@explorer(
    "scheduling.head_of_line",
    replica=Choice(tuple(REPLICAS), label="replica"),
    long_prompt=IntRange(1024, 131072, label="long request's prompt tokens"),
    long_output=IntRange(1, 32768, label="long request's output tokens"),
    short_prompt=IntRange(16, 4096, label="short prompt tokens"),
    n_short=IntRange(1, 32, label="short requests"),
    policy=Choice(HOL_POLICIES, label="policy"),
    token_budget=IntRange(512, 65536, log=True, label="token budget per step (chunked)"),
    cap=IntRange(256, 32768, log=True, label="cap per long prompt"),
    lead_s=FloatRange(0.0, 1.0, 0.005, label="long request's head start (s)"),
)
def head_of_line(replica: str, long_prompt: int, long_output: int, short_prompt: int, n_short: int,
                 policy: str, token_budget: int, cap: int, lead_s: float) -> View:
    """I022: what one long request costs the short ones queued behind it, per policy."""
    cost = _cost(replica)
    _check_window(replica, long_prompt + long_output, "the long request")
    _check_window(replica, short_prompt + 1, "a short request")
    window = deployment_of(replica).mdl.max_position_embeddings
    hol = lp.head_of_line(cost, hol_policy(policy, token_budget, cap, window), long_prompt, long_output,
                          short_prompt, 64, n_short, lead_s, first_tokens_only=True)
    extra = hol.extra_ttft_s
    res = hol.with_long
    tl = res.timeline
    long_tokens = np.array([sum(n for r, n, _ in ch if r == hol.long_rid) for ch in tl.chunks], dtype=float)
    first_short = np.array([res.requests[r].first_token_s for r in hol.short_rids])
    alone = hol.ttft_alone_s + lead_s
    last, shown = float(first_short.max()), int(np.searchsorted(tl.start_s, 1.15 * max(first_short.max(), alone.max())))
    edges, (decode, short, longp) = _merged(tl.start_s[:shown + 1], tl.end_s[:shown + 1],
                                            tl.decode_tokens[:shown + 1], (tl.prefill_tokens - long_tokens)[:shown + 1],
                                            long_tokens[:shown + 1])
    fig = _HOL_FIGURE(edges, decode, short, longp, last, float(alone.max()))
    rows = [
        ("long request's prefill alone", fmt_time(lp.prefill_steps(cost, long_prompt, long_prompt).ttft_s)),
        ("short TTFT without it (mean)", fmt_time(hol.ttft_alone_s.mean())),
        ("short TTFT with it (mean)", fmt_time(hol.ttft_s.mean())),
        ("extra TTFT per short request (min / mean / max)",
         f"{fmt_time(extra.min())} / {fmt_time(extra.mean())} / {fmt_time(extra.max())}"),
        ("short requests losing more than 1 s", f"{int((extra > 1.0).sum())} of {n_short}"),
        ("long request's TTFT", fmt_time(hol.long_ttft_s)),
        ("engine steps until every short has its first token", str(int(np.sum(tl.start_s < first_short.max())))),
    ]
    caption = (f"Tokens in each engine step, stacked: decodes, short prompts' prefill, the long request's prefill. The "
               f"last short request gets its first token at {fmt_time(last)} (red) against {fmt_time(float(alone.max()))} "
               f"without the long request (grey): {fmt_time(float(extra.mean()))} more TTFT per short request on average.")
    return View(f"{n_short} short requests behind a {long_prompt:,}-token prompt / {long_output:,}-token output "
                f"({policy}, {replica})", rows, fig, caption=caption,
                note="Stacked per engine step: decode tokens, short prompts' prefill, the long request's prefill. "
                     "The red line is when the last short request got its first token; grey, when it would "
                     "have without the long request.",
                values={"extra_mean_s": float(extra.mean()), "extra_min_s": float(extra.min()),
                        "long_ttft_s": hol.long_ttft_s})


#: Most steps a timeline draws; more are merged in consecutive groups (time-weighted mean tokens).
MAX_DRAWN_STEPS = 400


def _merged(start, end, *series):
    """(edges, series) of a per-step timeline, consecutive steps merged into at most
    :data:`MAX_DRAWN_STEPS` groups (each group's value: its steps' duration-weighted mean)."""
    n = len(start)
    dur = end - start
    if n <= MAX_DRAWN_STEPS:
        return np.append(start, end[-1]), [np.asarray(x, dtype=float) for x in series]
    cuts = np.linspace(0, n, MAX_DRAWN_STEPS + 1).astype(int)
    w = np.add.reduceat(dur, cuts[:-1])
    return (np.append(start[cuts[:-1]], end[-1]),
            [np.add.reduceat(np.asarray(x, dtype=float) * dur, cuts[:-1]) / w for x in series])


def _thinned(t, y):
    """At most :data:`MAX_DRAWN_STEPS` points of a per-step series: consecutive steps grouped,
    each group drawn as its longest step (so no peak disappears)."""
    if len(t) <= MAX_DRAWN_STEPS:
        return t, y
    cuts = np.linspace(0, len(t), MAX_DRAWN_STEPS + 1).astype(int)[:-1]
    i = cuts + np.array([int(np.argmax(y[a:b])) for a, b in zip(cuts, np.append(cuts[1:], len(t)), strict=True)])
    return t[i], y[i]


def _hol_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.decode = ax.stairs([0.0], [0.0, 1.0], fill=True, color="C0", alpha=0.8, label="decode tokens")
    a.short = ax.stairs([0.0], [0.0, 1.0], fill=True, color="C2", alpha=0.8, label="short prompts' prefill")
    a.long = ax.stairs([0.0], [0.0, 1.0], fill=True, color="C1", alpha=0.8, label="long request's prefill")
    a.last = ax.axvline(0.0, color="red", lw=1.2)
    a.alone = ax.axvline(0.0, color="grey", ls="--", lw=1.2)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tokens in the step")
    return a


def _hol_draw(a, edges, decode, short, long, last_s, alone_s) -> None:
    a.decode.set_data(decode, edges, baseline=0.0)
    a.short.set_data(decode + short, edges, baseline=decode)
    a.long.set_data(decode + short + long, edges, baseline=decode + short)
    a.last.set_xdata([last_s, last_s])
    a.last.set_label(f"last short's first token, {sig(last_s)} s")
    a.alone.set_xdata([alone_s, alone_s])
    a.alone.set_label(f"same without the long request, {sig(alone_s)} s")
    a.ax.set_xlim(0.0, max(1.15 * last_s, 1.15 * alone_s, 1e-3))
    a.ax.set_ylim(0.0, 1.3 * float(np.max(decode + short + long)) + 1.0)
    figures.legend(a.ax, [a.decode, a.short, a.long, a.last, a.alone], fontsize=7, loc="upper right")


_HOL_FIGURE = figures.LiveFigure(6.0, 3.0, _hol_build, _hol_draw)


# ---- I025: what one long prompt does to a steady stream -------------------------------------------


@explorer(
    "scheduling.prefill_damage",
    replica=Choice(tuple(REPLICAS), label="replica"),
    long_prompt=IntRange(8192, 131072, label="long prompt tokens"),
    token_budget=IntRange(512, 32768, log=True, label="token budget per step"),
    cap=IntRange(0, 32768, label="cap per request and step (0: none)"),
    rate=FloatRange(0.5, 4.0, 0.5, label="background requests per second"),
    bg_prompt=IntRange(128, 2048, label="background prompt tokens"),
    bg_output=IntRange(32, 256, label="background output tokens"),
)
def prefill_damage(replica: str, long_prompt: int, token_budget: int, cap: int, rate: float, bg_prompt: int,
                   bg_output: int) -> View:
    """I025: the inter-token gap, the lock-out and the after-effect of one long chunked prefill."""
    cost = _cost(replica)
    _check_window(replica, long_prompt + 16, "the long prompt")
    policy = Policy(token_budget=token_budget, long_prefill_cap=cap or None)
    warmup = bg_output * cost.step_s(1, bg_prompt) + 1.0  # the stream reaches its steady state
    res, rid = lp.long_prompt_run(cost, policy, long_prompt, 16, bg_prompt, bg_output, rate, warmup, 4.0)
    d = lp.prefill_damage(res, rid, before_s=min(warmup, 5.0))
    tl = res.timeline
    dec = tl.decode_tokens > 0
    edges, (decode, prefill, waiting) = _merged(tl.start_s, tl.end_s, tl.decode_tokens, tl.prefill_tokens,
                                                tl.waiting)
    t_gap, gap = _thinned(tl.end_s[dec], tl.duration_s[dec])
    fig = _DAMAGE_FIGURE(t_gap, gap, d.baseline_gap_s, d.start_s, d.end_s, edges, decode, prefill,
                         waiting * bg_prompt, bg_prompt)
    queued = int(tl.waiting[np.searchsorted(tl.start_s, d.start_s)])
    rows = [
        ("requests waiting when it starts", f"{queued}" + (" (the stream alone overloads the replica)"
                                                          if queued > 2 * rate else "")),
        ("gap before (mean inter-token)", fmt_time(d.baseline_gap_s)),
        ("first / last step of the long prompt", f"{fmt_time(d.first_step_s)} / {fmt_time(d.last_step_s)}"),
        ("longest gap during it", f"{fmt_time(d.peak_gap_s)} ({sig(d.peak_gap_s / d.baseline_gap_s)}x)"),
        ("its prefill, first step to first token", fmt_time(d.prefill_s)),
        ("arrivals during it / started only after it", f"{d.arrivals} / {d.locked_out}"),
        ("longest wait of those arrivals (lock-out)", fmt_time(d.lockout_s)),
        ("gap after it, until back within 10%", "back at once" if not d.recovery_s
         else f"{fmt_time(d.after_gap_s)} for {fmt_time(d.recovery_s)}"),
    ]
    caption = (f"Top: each step's duration, the gap every running decode waits for its next token, peaks at "
               f"{fmt_time(d.peak_gap_s)} ({sig(d.peak_gap_s / d.baseline_gap_s)}x the gap before) during the long "
               f"prompt's prefill (shaded). Bottom: what each step carries and the prompt tokens queued behind it (red); "
               f"{d.locked_out} of the {d.arrivals} arrivals during it start only after it.")
    return View(f"One {long_prompt:,}-token prompt into {sig(rate)} requests/s of {bg_prompt:,} + {bg_output:,} "
                f"tokens ({replica}, budget {token_budget:,}{f', cap {cap:,}' if cap else ''})", rows, fig,
                caption=caption,
                note="Top: every step's duration is the gap each running decode waits for its next token; the "
                     "shaded span is the long prompt's prefill. Bottom: what each step carried, and the prompt "
                     "tokens queued behind the prefill (the red line), which drain only after it.",
                values={"peak_gap_s": d.peak_gap_s, "lockout_s": d.lockout_s, "baseline_gap_s": d.baseline_gap_s,
                        "prefill_s": d.prefill_s})


def _damage_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Rectangle

    fig.subplots_adjust(hspace=0.08, bottom=0.12)
    top = fig.add_subplot(2, 1, 1)
    bottom = fig.add_subplot(2, 1, 2, sharex=top)
    figures.log_scale(top, "y")
    a = SimpleNamespace(top=top, bottom=bottom)
    a.span = Rectangle((0.0, 0.0), 1.0, 1.0, transform=top.get_xaxis_transform(), color="C1", alpha=0.15, lw=0,
                       label="long prompt's prefill")
    top.add_patch(a.span)
    a.gap, = top.plot([], [], "-", lw=0.8, color="C0", label="inter-token gap (step duration)")
    a.base = top.axhline(1.0, color="grey", ls="--", lw=1)
    top.set_ylabel("gap (s)")
    top.tick_params(labelbottom=False)
    a.decode = bottom.stairs([0.0], [0.0, 1.0], fill=True, color="C0", alpha=0.7, label="decode tokens per step")
    a.prefill = bottom.stairs([0.0], [0.0, 1.0], fill=True, color="C1", alpha=0.7, label="prefill tokens per step")
    a.queue, = bottom.plot([], [], color="C3", lw=1.2)
    bottom.set_ylabel("tokens")
    bottom.set_xlabel("time (s)")
    return a


def _damage_draw(a, t, gaps, baseline, start, end, edges, decode, prefill, queued, bg_prompt) -> None:
    a.span.set_x(start)
    a.span.set_width(end - start)
    a.gap.set_data(t, gaps)
    a.base.set_ydata([baseline, baseline])
    a.base.set_label(f"mean gap before, {fmt_time(baseline)}")
    a.top.set_ylim(0.5 * float(min(gaps.min(), baseline)), 2.0 * float(gaps.max()))
    a.decode.set_data(decode, edges, baseline=0.0)
    a.prefill.set_data(decode + prefill, edges, baseline=decode)
    a.queue.set_data(np.repeat(edges, 2)[1:-1], np.repeat(queued, 2))
    a.queue.set_label(f"prompt tokens waiting ({bg_prompt:,} per queued request)")
    a.bottom.set_ylim(0.0, 1.3 * float(max(np.max(decode + prefill), np.max(queued))) + 1.0)
    a.top.set_xlim(float(edges[0]), float(edges[-1]))
    figures.legend(a.top, [a.gap, a.base, a.span], fontsize=7, loc="upper left")
    figures.legend(a.bottom, [a.decode, a.prefill, a.queue], fontsize=7, loc="upper left")


_DAMAGE_FIGURE = figures.LiveFigure(6.0, 4.2, _damage_build, _damage_draw)


# ---- N024: the budget as a trade between two targets --------------------------------------------------


@explorer(
    "scheduling.chunk_budget",
    replica=Choice(tuple(REPLICAS), label="replica"),
    prompt_len=IntRange(1024, 131072, label="long prompt tokens"),
    decode_seqs=IntRange(1, 256, label="running decodes"),
    context=IntRange(0, 32768, label="cached tokens per decode"),
    ttft_target_s=FloatRange(0.1, 120.0, 0.1, label="TTFT target for the prompt (s)"),
    tpot_target_s=FloatRange(0.005, 2.0, 0.005, label="TPOT target: longest gap (s)"),
    token_budget=IntRange(256, 65536, log=True, label="configured token budget"),
)
def chunk_budget(replica: str, prompt_len: int, decode_seqs: int, context: int, ttft_target_s: float,
                 tpot_target_s: float, token_budget: int) -> View:
    """N024: the long prompt's prefill time and the worst decode gap against the token budget."""
    cost = _cost(replica)
    _check_window(replica, prompt_len, "the prompt")
    _check_window(replica, context + 1, "a running decode's context")
    if token_budget <= decode_seqs:
        raise ValueError(f"token_budget ({token_budget}) must exceed the running decodes ({decode_seqs}): "
                         "each takes one token of every step")
    ctx = decode_seqs * context
    w = lp.budget_window(cost, prompt_len, decode_seqs, ctx, ttft_target_s, tpot_target_s)
    here = lp.prefill_steps(cost, prompt_len, token_budget, decode_seqs, ctx)
    fig = _BUDGET_FIGURE(w.budgets, w.ttft_s, w.max_gap_s, ttft_target_s, tpot_target_s,
                         w.min_budget_for_ttft, w.max_budget_for_gap, w.feasible, token_budget, here)
    lo, hi = w.min_budget_for_ttft, w.max_budget_for_gap
    rows = [
        ("decode step without the prompt", fmt_time(here.decode_step_s)),
        ("smallest budget meeting the TTFT target", "none" if lo is None else f"{lo:,}"),
        ("largest budget meeting the TPOT target", "none" if hi is None else f"{hi:,}"),
        ("window", f"{lo:,} to {hi:,} tokens per step" if w.feasible else "empty: no budget meets both"),
        ("at the configured budget: prompt's TTFT", fmt_time(here.ttft_s)),
        ("at the configured budget: longest gap", f"{fmt_time(here.max_gap_s)} ({sig(here.slowdown)}x a decode step)"),
        ("candidates scanned", f"{len(w.budgets)} (chunks in steps of {w.granularity} tokens)"),
    ]
    span = (f"the budgets that meet both targets (green) run from {fmt_int(lo)} to {fmt_int(hi)} tokens" if w.feasible
            else "no budget meets both targets")
    caption = (f"As the token budget grows the prompt's prefill time (blue) falls and the longest decode gap (red) grows; "
               f"{span}. The configured {fmt_int(token_budget)} (black) gives a TTFT of {fmt_time(here.ttft_s)} and a "
               f"longest gap of {fmt_time(here.max_gap_s)}.")
    return View(f"A {prompt_len:,}-token prompt among {decode_seqs} decodes ({replica})", rows, fig, caption=caption,
                note="The prompt's prefill time falls and the longest decode gap grows as the budget grows; "
                     "the green span holds the budgets that meet both targets (empty when the curves cross "
                     "the wrong way round).",
                values={"low": float("nan") if lo is None else lo, "high": float("nan") if hi is None else hi,
                        "ttft_s": here.ttft_s, "max_gap_s": here.max_gap_s})


def _budget_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Rectangle

    fig.subplots_adjust(right=0.86)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.window = Rectangle((1.0, 0.0), 1.0, 1.0, transform=ax.get_xaxis_transform(), color="C2", alpha=0.15, lw=0)
    ax.add_patch(a.window)
    a.ttft, = ax.plot([], [], color="C0", label="prompt's prefill time (TTFT)")
    a.gap, = ax.plot([], [], color="C3", label="longest decode gap")
    a.ttft_target = ax.axhline(1.0, color="C0", ls="--", lw=1)
    a.gap_target = ax.axhline(1.0, color="C3", ls="--", lw=1)
    a.here = ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("token budget per step")
    ax.set_ylabel("seconds")
    return a


def _budget_draw(a, budgets, ttft, gaps, ttft_target, gap_target, lo, hi, feasible, budget, here) -> None:
    a.ttft.set_data(budgets, ttft)
    a.gap.set_data(budgets, gaps)
    a.ttft_target.set_ydata([ttft_target, ttft_target])
    a.ttft_target.set_label(f"TTFT target {fmt_time(ttft_target)}")
    a.gap_target.set_ydata([gap_target, gap_target])
    a.gap_target.set_label(f"TPOT target {fmt_time(gap_target)}")
    a.window.set_visible(feasible)
    if feasible:
        a.window.set_x(lo)
        a.window.set_width(max(hi - lo, 1))
    a.window.set_label(f"both met: {lo:,} to {hi:,}" if feasible else "")
    a.here.set_xdata([budget, budget])
    a.here.set_label(f"configured {budget:,}: {fmt_time(here.ttft_s)}, gap {fmt_time(here.max_gap_s)}")
    ys = np.concatenate([ttft, gaps, [ttft_target, gap_target]])
    a.ax.set_ylim(0.5 * float(ys.min()), 2.0 * float(ys.max()))
    a.ax.set_xlim(float(budgets[0]), float(budgets[-1]) * 1.05)
    figures.legend(a.ax, [a.ttft, a.gap, a.ttft_target, a.gap_target, a.window, a.here], fontsize=7,
                   loc="upper center", ncol=2)


_BUDGET_FIGURE = figures.LiveFigure(6.0, 3.4, _budget_build, _budget_draw)


# ---- I026: the TPOT target caps the chunk, the chunk caps the prefill rate, the rate caps the backlog ------


@explorer(
    "scheduling.ttft_tpot_coupling",
    replica=Choice(tuple(REPLICAS), label="replica"),
    decode_seqs=IntRange(1, 256, label="running decodes"),
    context=IntRange(0, 32768, label="cached tokens per decode"),
    ttft_target_s=FloatRange(0.1, 30.0, 0.1, label="TTFT target (s)"),
    tpot_target_s=FloatRange(0.005, 1.0, 0.005, label="TPOT target: longest gap (s)"),
    rate=FloatRange(0.1, 50.0, 0.1, label="offered requests per second"),
    mean_prompt=IntRange(16, 32768, label="mean prompt tokens"),
)
def ttft_tpot_coupling(replica: str, decode_seqs: int, context: int, ttft_target_s: float, tpot_target_s: float,
                       rate: float, mean_prompt: int) -> View:
    """I026: the prefill throughput a TPOT target leaves, and the backlog a TTFT target can absorb."""
    cost = _cost(replica)
    _check_window(replica, context + 1, "a running decode's context")
    ctx = decode_seqs * context
    gaps = np.geomspace(0.005, 1.0, 40)
    mus = []
    for gap in gaps:
        c = lp.chunk_cap(cost, decode_seqs, ctx, float(gap), max_chunk=1 << 17)
        mus.append(c / cost.step_s(decode_seqs, ctx, [(c, 0)]) if c else 0.0)
    c = lp.chunk_cap(cost, decode_seqs, ctx, tpot_target_s, max_chunk=1 << 17)
    mu = c / cost.step_s(decode_seqs, ctx, [(c, 0)]) if c else 0.0
    offered = rate * mean_prompt
    fig = _COUPLING_FIGURE(gaps, np.array(mus), tpot_target_s, mu, offered)
    w_max = mu * ttft_target_s
    rows = [
        ("decode step without prefill", fmt_time(cost.step_s(decode_seqs, ctx))),
        ("largest chunk within the TPOT target", f"{c:,} tokens" if c else "none: the decodes alone exceed it"),
        ("prefill throughput mu", f"{sig(mu)} tokens/s"),
        ("backlog the TTFT target absorbs (mu x TTFT)", f"{sig(w_max)} tokens = {sig(w_max / mean_prompt)} mean prompts"),
        ("offered prompt tokens", f"{sig(offered)} tokens/s ({sig(offered / mu) if mu else 'inf'} x mu)"),
        ("verdict", "sustainable: a queue forms only in bursts" if offered < mu else
         "overloaded: the backlog grows without bound; admission must reject"),
    ]
    fits = ("the offered load fits under it" if offered < mu else
            "the offered load exceeds it and the backlog grows without bound")
    caption = (f"The prefill throughput each TPOT target leaves (blue) against the prompt tokens offered (red, dashed). "
               f"At a target of {fmt_time(tpot_target_s)} (dot) it is {sig(mu)} tokens/s against {sig(offered)} offered: "
               f"{fits}.")
    return View(f"{replica}: {decode_seqs} decodes, TTFT {fmt_time(ttft_target_s)}, TPOT {fmt_time(tpot_target_s)}",
                rows, fig, caption=caption,
                note="The curve is the prefill throughput each TPOT target leaves (the largest chunk that keeps a "
                     "step within it, over that step); where it sits below the offered prompt tokens, no admission "
                     "rule can keep the TTFT target for everyone.",
                values={"chunk": c, "mu": mu, "w_max": w_max, "offered": offered})


def _coupling_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.mu, = ax.plot([], [], color="C0", label="prefill throughput mu")
    a.offered = ax.axhline(1.0, color="C3", ls="--", lw=1)
    a.here, = ax.plot([], [], "o", color="black")
    ax.set_xlabel("TPOT target: longest gap (s)")
    ax.set_ylabel("prompt tokens per second")
    return a


def _coupling_draw(a, gaps, mus, gap, mu, offered) -> None:
    keep = mus > 0
    a.mu.set_data(gaps[keep], mus[keep])
    a.offered.set_ydata([offered, offered])
    a.offered.set_label(f"offered: {sig(offered)} tokens/s")
    a.here.set_data([gap], [max(mu, 1.0)])
    a.here.set_label(f"this target: {sig(mu)} tokens/s")
    ys = np.concatenate([mus[keep], [offered, max(mu, 1.0)]])
    a.ax.set_xlim(float(gaps[0]), float(gaps[-1]))
    a.ax.set_ylim(0.5 * float(ys.min()), 3.0 * float(ys.max()))
    figures.legend(a.ax, [a.mu, a.offered, a.here], fontsize=7, loc="upper left")


_COUPLING_FIGURE = figures.LiveFigure(6.0, 3.0, _coupling_build, _coupling_draw)
