"""Explorers for the drafters: prompt lookup on a code rename and on open chat (I049).

Each view calls lib only: :mod:`lib.decoding.drafters` (the n-gram proposer, the trace of a
greedy generation, its price through :func:`lib.decoding.speculative.speculative_step`).
Figures are matplotlib, one persistent figure per explorer updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_ratio, sig

#: Replicas the prompt-lookup explorer prices on (label -> Deployment fields).
DEPLOYMENTS = {
    "llama-3.1-8b bf16 on 1x h100-sxm": dict(model="llama-3.1-8b", gpu="h100-sxm"),
    "llama-3.1-70b bf16 on 4x h100-sxm (TP4)": dict(model="llama-3.1-70b", gpu="h100-sxm", tp=4),
    "llama-3.1-70b fp8 on 2x h200 (TP2)": dict(model="llama-3.1-70b", gpu="h200", tp=2, weight_dtype="fp8",
                                               kv_dtype="fp8"),
}
REQUESTS = ("code rename", "open chat")


@functools.cache
def preset_deployment(label: str):
    """The :class:`~lib.perf.deployment.Deployment` behind one of :data:`DEPLOYMENTS`' labels."""
    from lib.perf.deployment import Deployment

    if label not in DEPLOYMENTS:
        raise ValueError(f"deployment must be one of {', '.join(DEPLOYMENTS)}; got {label!r}")
    return Deployment(**DEPLOYMENTS[label])


@functools.cache
def request_tokens(request: str, tokenizer: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt ids, reply ids) of the notebook's two requests under the toy tokenizer."""
    from lib.decoding import drafters
    from lib.decoding.tokenizer import WordTokenizer

    if request not in REQUESTS:
        raise ValueError(f"request must be one of {', '.join(REQUESTS)}; got {request!r}")
    tok = WordTokenizer(tokenizer)
    prompt, reply = drafters.rename_request() if request == "code rename" else (drafters.CHAT_PROMPT,
                                                                                 drafters.CHAT_REPLY)
    return tuple(tok.encode(prompt)), tuple(tok.encode(reply))


@functools.cache
def _trace(request: str, tokenizer: str, k: int, min_n: int, max_n: int):
    from lib.decoding.drafters import lookup_trace

    p, o = request_tokens(request, tokenizer)
    return lookup_trace(p, o, k, min_n, max_n)


@functools.cache
def _cost(label: str, request: str, tokenizer: str, k: int, min_n: int, max_n: int, batch: int):
    from lib.decoding.drafters import lookup_cost

    p, o = request_tokens(request, tokenizer)
    return lookup_cost(preset_deployment(label), _trace(request, tokenizer, k, min_n, max_n), batch,
                       len(p) + len(o) // 2)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.drafted, = ax.plot([], [], drawstyle="steps-mid", color="0.6", lw=1.5, label="drafted")
    a.accepted, = ax.plot([], [], drawstyle="steps-mid", color="C0", lw=2, label="accepted")
    a.emitted, = ax.plot([], [], "o", color="C1", ms=3, label="emitted (accepted + 1)")
    ax.set_xlabel("verification step")
    ax.set_ylabel("tokens")
    ax.grid(True)
    return a


def _draw(a: SimpleNamespace, drafted, accepted, emitted, k) -> None:
    xs = list(range(1, len(drafted) + 1))
    a.drafted.set_data(xs, drafted)
    a.accepted.set_data(xs, accepted)
    a.emitted.set_data(xs, emitted)
    a.ax.set_xlim(0.5, max(len(xs), 2) + 0.5)
    a.ax.set_ylim(-0.2, k + 1.4)
    figures.legend(a.ax, [a.drafted, a.accepted, a.emitted], loc="upper right", fontsize=7, ncol=3)


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "decoding.prompt_lookup",
    request=Choice(REQUESTS, label="request"),
    tokenizer=Choice(("words", "chars"), label="toy tokenizer"),
    draft_tokens=IntRange(1, 8, label="draft tokens k"),
    min_n=IntRange(1, 4, label="prompt_lookup_min"),
    max_n=IntRange(1, 6, label="prompt_lookup_max"),
    deployment=Choice(tuple(DEPLOYMENTS), label="replica"),
    batch=IntRange(1, 512, log=True, label="batch (copies of the request)"),
)
def prompt_lookup(request: str, tokenizer: str, draft_tokens: int, min_n: int, max_n: int, deployment: str,
                  batch: int) -> View:
    """I049: prompt lookup replayed step by step on one request, and its price at a batch."""
    if max_n < min_n:
        raise ValueError(f"prompt_lookup_max must be >= prompt_lookup_min ({min_n}); got {max_n}")
    t = _trace(request, tokenizer, draft_tokens, min_n, max_n)
    cost = _cost(deployment, request, tokenizer, draft_tokens, min_n, max_n, batch)
    fig = _FIGURE([len(s.draft) for s in t.steps], [s.accepted for s in t.steps], [len(s.emitted) for s in t.steps],
                  draft_tokens)
    verdict = ("pays" if cost.speedup > 1.005 else "slows the replica down" if cost.speedup < 0.995
               else "changes nothing")
    rows = [("output tokens / verification steps", f"{t.output_tokens} / {t.n_steps}"),
            ("tokens per step", sig(t.tokens_per_step)),
            ("drafted / accepted tokens", f"{t.drafted} / {t.accepted}"),
            ("acceptance (accepted / drafted)", fmt_pct(t.acceptance)),
            ("steps that drafted (and widened the verify pass)", fmt_pct(t.proposal_rate)),
            (f"speedup at batch {batch}", fmt_ratio(cost.speedup)),
            ("widest verify pass over a plain step", fmt_ratio(cost.verify_overhead))]
    caption = (f"{request}: {t.n_steps} steps for {t.output_tokens} tokens ({sig(t.tokens_per_step)} per step); "
               f"{fmt_pct(t.acceptance)} of drafted tokens accepted; at batch {batch} prompt lookup {verdict} "
               f"({fmt_ratio(cost.speedup)}).")
    return View(f"Prompt lookup, n-grams {min_n}-{max_n}, k = {draft_tokens}, on {deployment}", rows, fig,
                caption=caption, note="Grey: tokens drafted at each step; blue: how many the target accepted; "
                                      "a blue step at zero under a grey one is a wasted draft.",
                values={"tokens_per_step": t.tokens_per_step, "acceptance": t.acceptance, "speedup": cost.speedup})


# ---- I048: the EAGLE head against a draft model ------------------------------------------------------

EAGLE_BATCHES = (1, 8, 64, 256)


@functools.cache
def _target(gpu: str, tp: int, weight_dtype: str):
    from lib.perf.deployment import Deployment

    return Deployment("llama-3.1-70b", gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=weight_dtype)


@functools.cache
def _drafters(gpu: str, tp: int, weight_dtype: str, draft_model: str):
    """(the EAGLE head, the draft model) on the target's GPUs; drafts run back to back on the GPU,
    with no host phase per drafted token."""
    from lib.decoding.drafters import eagle_head_drafter
    from lib.decoding.speculative import model_drafter
    from lib.perf.deployment import Deployment
    from lib.perf.step import step_assumptions

    quiet = step_assumptions(sampling_s=0.0, scheduler_s=0.0)
    target = _target(gpu, tp, weight_dtype)
    draft = Deployment(draft_model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=weight_dtype)
    return eagle_head_drafter(target, assume=quiet), model_drafter(draft, quiet)


@functools.cache
def _spec_times(gpu: str, tp: int, weight_dtype: str, draft_model: str, k: int, batch: int, context: int):
    """(head step, draft-model step) at acceptance 0: the times do not depend on the acceptance."""
    from lib.decoding.speculative import speculative_step

    target = _target(gpu, tp, weight_dtype)
    return tuple(speculative_step(target, d, k, 0.0, batch, context)
                 for d in _drafters(gpu, tp, weight_dtype, draft_model))


def _spec(gpu: str, tp: int, weight_dtype: str, draft_model: str, which: int, k: int, a: float, batch: int,
          context: int):
    import dataclasses

    from lib.decoding.speculative import speculative_tokens_per_step

    step = _spec_times(gpu, tp, weight_dtype, draft_model, k, batch, context)[which]
    return dataclasses.replace(step, acceptance=a, tokens_per_step=speculative_tokens_per_step(a, k))


def _eagle_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.head, = ax.plot([], [], "o-", color="C0", lw=2, label="EAGLE head")
    a.draft, = ax.plot([], [], "s--", color="C1", lw=1.5, label="draft model, same acceptance")
    a.one = ax.axhline(1.0, color="0.5", lw=1, ls=":")
    figures.log_scale(ax, "x", base=2)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("speedup over plain decoding")
    ax.grid(True)
    return a


def _eagle_draw(a: SimpleNamespace, batches, head, draft, draft_label) -> None:
    a.head.set_data(batches, head)
    a.draft.set_data(batches, draft)
    a.draft.set_label(f"{draft_label}, same acceptance")
    a.ax.set_xlim(batches[0] / 1.5, batches[-1] * 1.5)
    a.ax.set_ylim(0, max(max(head), max(draft), 1.0) * 1.15)
    figures.legend(a.ax, [a.head, a.draft], loc="upper right", fontsize=7)


_EAGLE_FIGURE = figures.LiveFigure(6.0, 2.8, _eagle_build, _eagle_draw)


@explorer(
    "decoding.eagle_head",
    gpu=Choice(("h100-sxm", "h200", "b200"), label="GPU"),
    tp=Choice((2, 4, 8), label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights and KV"),
    draft_model=Choice(("llama-3.1-8b", "llama-3.2-3b", "llama-3.2-1b"), label="draft model"),
    draft_tokens=IntRange(1, 8, label="draft tokens k"),
    head_length=FloatRange(1.0, 8.0, step=0.05, label="head's mean acceptance length at k = 7"),
    context=IntRange(128, 32768, log=True, label="context (tokens)"),
)
def eagle_head(gpu: str, tp: int, weight_dtype: str, draft_model: str, draft_tokens: int, head_length: float,
               context: int) -> View:
    """I048: the EAGLE head and a draft model on Llama 3.3 70B (Llama 3.1 70B's architecture),
    priced per drafted token and as a speedup across batch sizes at the head's acceptance."""
    from lib.decoding.counters import acceptance_from_length

    a = round(acceptance_from_length(head_length, 7), 6)
    head = [_spec(gpu, tp, weight_dtype, draft_model, 0, draft_tokens, a, b, context) for b in EAGLE_BATCHES]
    draft = [_spec(gpu, tp, weight_dtype, draft_model, 1, draft_tokens, a, b, context) for b in EAGLE_BATCHES]
    fig = _EAGLE_FIGURE(list(EAGLE_BATCHES), [s.speedup for s in head], [s.speedup for s in draft], draft_model)
    h1, d1 = head[0], draft[0]
    c_head = h1.draft_s / draft_tokens / h1.plain_step_s
    c_draft = d1.draft_s / draft_tokens / d1.plain_step_s
    best = max(range(len(EAGLE_BATCHES)), key=lambda i: head[i].speedup - draft[i].speedup)
    rows = [("per-token acceptance from the head's length", sig(a)),
            ("draft cost per token / target step (batch 1)", f"head {sig(c_head)}, {draft_model} {sig(c_draft)}"),
            ("speedup at batch 1", f"head {fmt_ratio(h1.speedup)}, {draft_model} {fmt_ratio(d1.speedup)}"),
            (f"speedup at batch {EAGLE_BATCHES[-1]}",
             f"head {fmt_ratio(head[-1].speedup)}, {draft_model} {fmt_ratio(draft[-1].speedup)}")]
    caption = (f"At the same acceptance ({sig(a)} per token) the EAGLE head beats {draft_model} at every batch shown, "
               f"by the most at batch {EAGLE_BATCHES[best]} ({fmt_ratio(head[best].speedup)} against "
               f"{fmt_ratio(draft[best].speedup)}): a drafted token costs {sig(c_head)} of a target step against "
               f"{sig(c_draft)}." if all(h.speedup >= d.speedup for h, d in zip(head, draft, strict=True)) else
               f"At the same acceptance ({sig(a)} per token) the two drafters cross: a drafted token costs "
               f"{sig(c_head)} of a target step for the head against {sig(c_draft)} for {draft_model}.")
    return View(f"EAGLE head vs {draft_model} on llama-3.1-70b {weight_dtype}, {tp}x {gpu}, k = {draft_tokens}", rows,
                fig, caption=caption, note="Speculation stops paying where a curve falls below the dotted line.",
                values={"c_head": c_head, "c_draft": c_draft, "head_speedup_1": h1.speedup,
                        "draft_speedup_1": d1.speedup})


# ---- I050: acceptance from counter snapshots ------------------------------------------------------------


def _counters_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.drafted, = ax.plot([], [], drawstyle="steps-post", color="0.6", lw=1.5, label="num_draft_tokens")
    a.accepted, = ax.plot([], [], drawstyle="steps-post", color="C0", lw=2, label="num_accepted_tokens")
    a.clean, = ax.plot([], [], "o", color="C2", ms=5, label="window kept")
    a.caught, = ax.plot([], [], "x", color="C3", ms=7, mew=2, label="reset: a counter fell")
    a.hidden, = ax.plot([], [], "D", color="C1", ms=6, label="reset: only the start time shows it")
    a.restarts = [ax.axvline(0, color="C3", lw=1, ls=":") for _ in range(2)]
    ax.set_xlabel("time (engine steps)")
    ax.set_ylabel("counter value")
    ax.grid(True)
    return a


def _counters_draw(a: SimpleNamespace, times, drafted, accepted, marks, restarts, xmax, ymax) -> None:
    a.drafted.set_data(times, drafted)
    a.accepted.set_data(times, accepted)
    for artist, kind in ((a.clean, "clean"), (a.caught, "caught"), (a.hidden, "hidden")):
        pts = [(t, y) for t, y, m in marks if m == kind]
        artist.set_data([p[0] for p in pts], [p[1] for p in pts])
        artist.set_visible(bool(pts))
    for line, r in zip(a.restarts, list(restarts) + [None, None], strict=False):
        line.set_visible(r is not None)
        if r is not None:
            line.set_xdata([r, r])
    a.ax.set_xlim(0, xmax)
    a.ax.set_ylim(0, ymax * 1.08)
    figures.legend(a.ax, [a.drafted, a.accepted, a.clean, a.caught, a.hidden], loc="upper left", fontsize=7)


_COUNTERS_FIGURE = figures.LiveFigure(6.0, 3.0, _counters_build, _counters_draw)


COUNTER_STEPS = 600  # engine steps of the simulated scrape (I050)
COUNTER_BATCH = 8  # requests running at once


@functools.cache
def counter_stream(draft_tokens: int, acceptance: float, acceptance_after: float, mean_output_tokens: int,
                   scrape_every: int, restarts: tuple, seed: int = 0):
    """The I050 engine (:func:`lib.decoding.counters.simulate_counters`): ``COUNTER_STEPS`` steps of
    ``COUNTER_BATCH`` requests, acceptance ``acceptance`` until the first restart and
    ``acceptance_after`` from then on (a redeploy)."""
    from lib.decoding.counters import simulate_counters

    return simulate_counters(steps=COUNTER_STEPS, batch=COUNTER_BATCH, draft_tokens=draft_tokens,
                             acceptance_rate=(acceptance,) + (acceptance_after,) * len(restarts),
                             mean_output_tokens=mean_output_tokens, scrape_every=scrape_every, restarts=restarts,
                             seed=seed)


@explorer(
    "decoding.acceptance_counters",
    draft_tokens=IntRange(1, 8, label="draft tokens k"),
    acceptance=FloatRange(0.0, 0.95, step=0.05, label="per-token acceptance, first process"),
    acceptance_after=FloatRange(0.0, 0.95, step=0.05, label="per-token acceptance after a restart"),
    mean_output_tokens=IntRange(2, 512, log=True, label="mean output tokens"),
    scrape_every=IntRange(10, 200, label="scrape interval (steps)"),
    first_restart=IntRange(0, 599, label="first restart at step (0: none)"),
    second_restart=IntRange(0, 599, label="second restart at step (0: none)"),
    seed=IntRange(0, 999, label="seed"),
)
def acceptance_counters(draft_tokens: int, acceptance: float, acceptance_after: float, mean_output_tokens: int,
                        scrape_every: int, first_restart: int, second_restart: int, seed: int) -> View:
    """I050: a simulated engine's spec-decode counters, the windows a scrape makes of them, which
    are rejected, and the acceptance each way of summing them gives."""
    from lib.decoding import counters as c

    restarts = tuple(sorted({r for r in (first_restart, second_restart) if r}))
    stream = counter_stream(draft_tokens, round(acceptance, 4), round(acceptance_after, 4), mean_output_tokens,
                            scrape_every, restarts, seed)
    snaps = stream.snapshots
    full, drop_only = c.windows(snaps), c.windows(snaps, check_start_time=False)
    marks = [(snaps[0].time_s, snaps[0].num_accepted_tokens, "clean")]
    for w_full, w_drop, s in zip(full, drop_only, snaps[1:], strict=True):
        kind = "clean" if w_full.clean else ("hidden" if w_drop.clean else "caught")
        marks.append((s.time_s, s.num_accepted_tokens, kind))
    truth = c._expected(stream, list(range(len(snaps))))
    ref, drop, naive = (c.summarize(snaps), c.acceptance(drop_only), c.variant("no reset check")(snaps))
    steps = [(c.request_steps(w, draft_tokens), t) for w, t in zip(full, stream.truth, strict=True) if w.clean]
    naive_steps = sum(s.naive for s, _ in steps)
    true_steps = sum(t["num_drafts"] for _, t in steps)
    hidden = sum(m == "hidden" for *_, m in marks)
    fig = _COUNTERS_FIGURE([s.time_s for s in snaps], [s.num_draft_tokens for s in snaps],
                           [s.num_accepted_tokens for s in snaps], marks, restarts, COUNTER_STEPS,
                           max(s.num_draft_tokens for s in snaps))

    def rate(x):
        return "no clean window" if x != x else fmt_pct(x)

    rows = [("acceptance, engine's truth (clean windows)", rate(truth["acceptance_rate"])),
            ("acceptance, start time and drops checked", rate(ref["acceptance_rate"])),
            ("acceptance, drops checked only", rate(drop.acceptance_rate)),
            ("acceptance, every window summed", rate(naive["acceptance_rate"])),
            ("mean acceptance length (reference)", "n/a" if ref["mean_acceptance_length"] != ref["mean_acceptance_length"]
             else sig(ref["mean_acceptance_length"])),
            ("request-steps: naive / true", f"{naive_steps:,} / {true_steps:,}")]
    caption = (f"{sum(m == 'caught' for *_, m in marks)} window(s) rejected because a counter fell, {hidden} whose "
               f"restart only the start time reveals; the reference's acceptance is "
               f"{rate(ref['acceptance_rate'])} against {rate(truth['acceptance_rate'])} true.")
    return View(f"Spec-decode counters, k = {draft_tokens}, scraped every {scrape_every} steps", rows, fig,
                caption=caption, note="Each marker is a scrape, at the end of the window it closes.",
                values={"truth": truth["acceptance_rate"], "reference": ref["acceptance_rate"],
                        "drop_only": drop.acceptance_rate, "hidden": hidden})
