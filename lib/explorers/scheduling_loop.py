"""Explorers for the scheduler-loop coding questions (I088): what the token budget costs in
TPOT on the book's step model (:func:`lib.scheduling.cost.step_cost`), the loop's decisions.

Views call lib only; the figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.units import fmt_int, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen2.5-72b")
GPUS = ("h100-sxm", "h200", "mi300x", "l4", "a100-sxm")
TPS = (1, 2, 4, 8)


def budget_curve(model: str, gpu: str, tp: int, decodes: int, context: int, budgets) -> dict:
    """Step time of ``decodes`` running decodes (``context`` cached tokens each) alone, and with the
    rest of each token budget B filled by one prefill chunk of B - decodes tokens at position 0:
    ``step_cost(dep).step_s(D, D context, [(B - D, 0)])``, seconds. Every decode waits the whole
    step for its token, so the difference is what the budget adds to the TPOT of that step."""
    from lib.perf.deployment import Deployment
    from lib.scheduling.cost import step_cost

    dep = Deployment(model, gpu, tp=tp)
    cost = step_cost(dep)
    if decodes > cost.max_running:
        raise ValueError(f"decodes must be at most the replica's max_running={cost.max_running}, got {decodes}")
    dep.mdl.check_context(context + 1)
    alone = cost.step_s(decodes, decodes * context)
    mixed = []
    for b in budgets:
        if b < decodes:
            raise ValueError(f"token budget {b} must be >= decodes={decodes}: every running decode needs one token")
        mixed.append(cost.step_s(decodes, decodes * context, [(b - decodes, 0)]) if b > decodes else alone)
    return {"dep": dep, "alone_s": alone, "mixed_s": mixed}


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.mixed, = ax.plot([], [], lw=2, color="C0", label="step with the budget filled by prefill")
    a.alone, = ax.plot([], [], lw=1.2, ls="--", color="grey", label="decodes alone")
    a.mark, = ax.plot([], [], "o", color="C3", ms=7, label="chosen budget")
    ax.set_xlabel("token budget per step (tokens)")
    ax.set_ylabel("step time = TPOT of that step (ms)")
    figures.log_scale(ax, "x", base=2)
    ax.grid(True)
    return a


def _draw(a, budgets, mixed_ms, alone_ms, budget, at_ms) -> None:
    a.mixed.set_data(budgets, mixed_ms)
    a.alone.set_data([budgets[0], budgets[-1]], [alone_ms, alone_ms])
    a.mark.set_data([budget], [at_ms])
    a.ax.set_xlim(budgets[0], budgets[-1])
    a.ax.set_ylim(0, 1.08 * max(max(mixed_ms), at_ms))
    figures.legend(a.ax, [a.mixed, a.alone, a.mark], loc="upper left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "scheduling.budget_tpot",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice(TPS, label="tensor parallel"),
    decodes=IntRange(1, 256, log=True, label="running decodes"),
    context=IntRange(128, 32768, log=True, label="context per decode (tokens)"),
    budget=IntRange(256, 16384, log=True, label="token budget"),
)
def budget_tpot(model: str, gpu: str, tp: int, decodes: int, context: int, budget: int) -> View:
    """I088: the TPOT a step pays when the scheduler fills its token budget with prefill."""
    lo = max(256, decodes)
    budgets = sorted({lo, *(1 << k for k in range(8, 15) if (1 << k) > lo), max(budget, decodes)})
    r = budget_curve(model, gpu, tp, decodes, context, budgets)
    mixed_ms = [1e3 * s for s in r["mixed_s"]]
    at = r["mixed_s"][budgets.index(max(budget, decodes))]
    fig = _FIGURE(budgets, mixed_ms, 1e3 * r["alone_s"], max(budget, decodes), 1e3 * at)
    rows = [("decode step alone", fmt_time(r["alone_s"])),
            (f"step with a {max(budget, decodes):,}-token budget", f"{fmt_time(at)} ({sig(at / r['alone_s'])}x)"),
            ("TPOT added by the budget", fmt_time(at - r["alone_s"])),
            ("prefill tokens per step", f"{max(budget, decodes) - decodes:,}")]
    note = ("The blue curve is what every running decode waits for its next token while a prompt is being "
            "prefilled in its step; the dashed line is the step without prefill. Where the curve leaves the line is "
            "where the budget starts costing TPOT.")
    caption = (f"The step every running decode waits for, with the token budget filled by prefill (blue), against the "
               f"decodes alone (dashed). At a budget of {fmt_int(max(budget, decodes))} (red dot) the step takes "
               f"{fmt_time(at)}, {sig(at / r['alone_s'])}x the decodes alone.")
    return View(f"Token budget vs TPOT on {r['dep'].label}: {decodes} decodes at {context:,} tokens",
                rows, fig, note=note, caption=caption, values={"alone_s": r["alone_s"], "step_s": at})
