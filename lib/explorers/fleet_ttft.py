"""Explorers for time to first token across the serving path (I066, N064): the parts each clock
includes (:mod:`lib.fleet.ttft`) and the TTFT budget against the prompt length.

Views call lib only; the figures are persistent matplotlib figures updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.domain import Choice
from lib.book.widgets import FloatRange, IntRange, View, explorer

_PART_LABELS = {"connect_s": "TCP + TLS handshakes", "upload_s": "request upload", "gateway_s": "gateway",
                "routing_s": "routing", "queue_s": "engine queue", "step_wait_s": "running step",
                "prefill_s": "prefill", "downlink_s": "first token back"}
_COLORS = ("C7", "C8", "C4", "C5", "C3", "C1", "C0", "C9")
_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b", "mixtral-8x7b")
_GPUS = ("h100-sxm", "h200", "a100-sxm", "b200", "mi300x", "l40s")


def _deployment(model: str, gpu: str, tp: int):
    from lib.perf.deployment import deployment

    return deployment(model, gpu, tp=tp)


def clock_parts(model: str, gpu: str, tp: int, prompt: int, rtt_ms: float, warm: bool):
    """The TTFT parts (:func:`lib.fleet.ttft.ttft_parts`) of an idle replica: no queue, half a batch-1 step."""
    from lib.fleet.ttft import ttft_parts
    from lib.perf.step import decode_step

    dep = _deployment(model, gpu, tp)
    dep.mdl.check_context(prompt)
    return ttft_parts(dep, prompt, rtt_s=rtt_ms / 1000, warm=warm,
                      step_wait_s=decode_step(dep, 1, prompt).total_s / 2)


def _build(fig) -> SimpleNamespace:
    from lib.fleet.ttft import CLOCKS

    fig.subplots_adjust(left=0.25, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, bars=[])
    for r in range(len(CLOCKS)):
        row = ax.barh([r] * len(_PART_LABELS), [0] * len(_PART_LABELS), color=_COLORS, height=0.6)
        a.bars.append(row)
    ax.set_yticks(range(len(CLOCKS)), [c[1] for c in CLOCKS])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    ax.grid(True, axis="x")
    return a


def _draw(a, parts) -> None:
    from lib.fleet.ttft import CLOCKS

    names = [n for n, _ in parts.parts()]
    values = [v * 1000 for _, v in parts.parts()]
    for r, (_, _, first, last) in enumerate(CLOCKS):
        i0, i1 = names.index(first), names.index(last)
        left = 0.0
        for k, bar in enumerate(a.bars[r]):
            inside = i0 <= k <= i1
            bar.set_x(left)
            bar.set_width(values[k] if inside else 0)
            bar.set_visible(inside and values[k] > 0)
            if inside:
                left += values[k]
            bar.set_label(_PART_LABELS[names[k]] if r == len(CLOCKS) - 1 else "_")
    a.ax.set_xlim(0, sum(values) * 1.05)
    figures.legend(a.ax, list(a.bars[-1]), loc="lower right", fontsize=6, ncol=2)


_FIGURE = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "fleet.ttft_clocks",
    model=Choice(_MODELS, label="model"),
    gpu=Choice(_GPUS, label="GPU"),
    tp=IntRange(1, 8, label="tensor parallel"),
    prompt=IntRange(1, 128_000, label="prompt (tokens)"),
    rtt_ms=FloatRange(0.0, 300.0, 1.0, label="client round trip (ms)"),
    warm=Choice((True, False), label="kept-alive connection"),
)
def ttft_clocks(model: str, gpu: str, tp: int, prompt: int, rtt_ms: float, warm: bool) -> View:
    """I066: the four TTFT clocks of one request on an idle replica, part by part."""
    from lib.units import fmt_time, sig

    p = clock_parts(model, gpu, tp, prompt, rtt_ms, warm)
    fig = _FIGURE(p)
    ratio = p.client_s / p.engine_prefill_s
    rows = [("engine, from scheduling", fmt_time(p.engine_prefill_s)), ("engine, from arrival", fmt_time(p.engine_s)),
            ("gateway", fmt_time(p.gateway_clock_s)), ("client", fmt_time(p.client_s)),
            ("client / engine (scheduling)", f"{sig(ratio)}x")]
    caption = (f"One request, {prompt:,} prompt tokens, {'warm' if warm else 'new'} connection at {rtt_ms:g} ms round "
               f"trip: the engine's own clock shows {fmt_time(p.engine_prefill_s)}, the client's {fmt_time(p.client_s)} "
               f"({sig(ratio)}x). Each row is one clock; the bars it spans are the parts it includes.")
    return View("Which TTFT does each box measure?", rows, fig, caption=caption,
                values={"client_s": p.client_s, "engine_prefill_s": p.engine_prefill_s, "ratio": ratio})


# ---- N064: the TTFT budget against the prompt length ----------------------------------------------

def _build_budget(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.fixed, = ax.plot([], [], lw=1.2, ls="--", color="C7", label="network + gateway + routing + running step")
    a.total, = ax.plot([], [], lw=2, color="C0", label="... + prefill (idle replica)")
    a.budget, = ax.plot([], [], lw=1, ls=":", color="C3", label="budget")
    a.mark, = ax.plot([], [], "o", color="C3", ms=6, label="longest prompt that fits")
    ax.set_xlabel("prompt (tokens)")
    ax.set_ylabel("TTFT (ms)")
    figures.log_scale(ax, "x")
    ax.grid(True)
    return a


def _draw_budget(a, lens, fixed_ms, totals_ms, budget_ms, p_max, at_max_ms) -> None:
    a.fixed.set_data([lens[0], lens[-1]], [fixed_ms, fixed_ms])
    a.total.set_data(lens, totals_ms)
    a.budget.set_data([lens[0], lens[-1]], [budget_ms, budget_ms])
    if p_max > 0:
        a.mark.set_data([p_max], [at_max_ms])
        a.mark.set_visible(True)
    else:
        a.mark.set_data([], [])
        a.mark.set_visible(False)
    a.ax.set_xlim(lens[0], lens[-1])
    a.ax.set_ylim(0, min(max(totals_ms), 4 * budget_ms) * 1.05)
    figures.legend(a.ax, [a.fixed, a.total, a.budget, a.mark], loc="upper left", fontsize=7)


_FIGURE_BUDGET = figures.LiveFigure(6.0, 3.0, _build_budget, _draw_budget)


def budget_numbers(model: str, gpu: str, tp: int, budget_ms: float, rtt_ms: float, batch: int = 64,
                   context: int = 2048) -> dict:
    """The fixed TTFT parts of a warm request at the p99 (a whole running step of ``batch`` sequences at
    ``context`` tokens), the longest prompt whose prefill fits the rest
    (:func:`lib.fleet.ttft.prompt_len_for_budget`)."""
    from lib.fleet.ttft import prompt_len_for_budget, ttft_parts
    from lib.perf.step import decode_step

    dep = _deployment(model, gpu, tp)
    step = decode_step(dep, batch, context).total_s
    base = ttft_parts(dep, 1, rtt_s=rtt_ms / 1000, step_wait_s=step, prefill_s=0.0)
    per_token = base.upload_s - rtt_ms / 2000  # the upload of one token's bytes
    fixed = base.client_s - per_token  # all but the prompt's upload bytes
    p_max = prompt_len_for_budget(dep, budget_ms / 1000, fixed, per_token_s=per_token)
    return {"dep": dep, "step_s": step, "fixed_s": fixed, "p_max": p_max}


@explorer(
    "fleet.ttft_budget",
    model=Choice(_MODELS, label="model"),
    gpu=Choice(_GPUS, label="GPU"),
    tp=IntRange(1, 8, label="tensor parallel"),
    budget_ms=FloatRange(10.0, 5000.0, 10.0, label="TTFT budget (ms)"),
    rtt_ms=FloatRange(0.0, 300.0, 1.0, label="client round trip (ms)"),
)
def ttft_budget(model: str, gpu: str, tp: int, budget_ms: float, rtt_ms: float) -> View:
    """N064: TTFT of an idle replica against the prompt length, and the longest prompt the budget allows."""
    return budget_view(model, gpu, tp, budget_ms, rtt_ms)


def budget_view(model: str, gpu: str, tp: int, budget_ms: float, rtt_ms: float, batch: int = 64,
                context: int = 2048) -> View:
    """:func:`ttft_budget` with the running step's ``batch`` and ``context`` chosen (the page passes its own)."""
    from lib.fleet.ttft import ttft_parts
    from lib.units import fmt_time

    r = budget_numbers(model, gpu, tp, budget_ms, rtt_ms, batch, context)
    dep = r["dep"]
    top = dep.mdl.max_position_embeddings
    lens = sorted({max(1, int(16 * (top / 16) ** (k / 39))) for k in range(40)})
    totals = [ttft_parts(dep, n, rtt_s=rtt_ms / 1000, step_wait_s=r["step_s"]).client_s * 1000 for n in lens]
    p = r["p_max"]
    at_max = ttft_parts(dep, p, rtt_s=rtt_ms / 1000, step_wait_s=r["step_s"]).client_s * 1000 if p else 0.0
    fig = _FIGURE_BUDGET(lens, r["fixed_s"] * 1000, totals, budget_ms, p, at_max)
    rows = [("fixed parts (network, gateway, routing, a running step)", fmt_time(r["fixed_s"])),
            ("left for upload + queue + prefill", fmt_time(max(0.0, budget_ms / 1000 - r["fixed_s"]))),
            ("longest prompt, idle replica", f"{p:,} tokens" if p else "none fits")]
    caption = (f"With a {budget_ms:g} ms budget and {fmt_time(r['fixed_s'])} of fixed parts, an idle replica fits "
               + (f"prompts up to {p:,} tokens (red dot); any queueing shortens that." if p else
                  "no prompt at all: the fixed parts and a one-token prefill already exceed the budget."))
    return View("What a TTFT budget leaves for the prompt", rows, fig, caption=caption,
                values={"fixed_s": r["fixed_s"], "p_max": p})
