"""Explorer for safety in infrastructure (N080 safety-in-infrastructure).

The view calls :mod:`lib.judgment.safety` (:func:`~lib.judgment.safety.stop_paths`) on the TPOT of
:func:`lib.fleet.capacity.request_cost` and the restart of :func:`lib.fleet.capacity.replica_start_s`:
how long each way of stopping a deployment takes, stage by stage. One persistent figure.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.judgment import safety
from lib.units import fmt_count, fmt_duration, sig

STAGES = (("detect_s", "detection", "C7"), ("propagate_s", "propagation", "C1"), ("drain_s", "drain", "C3"))
NAMES = ("kill switch, abort", "kill switch, drain", "scale to zero")


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.25, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, bars={})
    ys = [2, 1, 0]
    for key, label, color in STAGES:
        a.bars[key] = ax.barh(ys, [1, 1, 1], left=[0, 0, 0], color=color, label=label, height=0.6)
    ax.set_yticks(ys)
    ax.set_yticklabels(NAMES, fontsize=8)
    ax.set_xlabel("minutes from the behaviour starting to the last token served")
    ax.grid(True, axis="x")
    return a


def _draw(a, paths) -> None:
    left = [0.0] * 3
    for key, _, _ in STAGES:
        widths = [getattr(p, key) / 60.0 for p in paths]
        for rect, x, w in zip(a.bars[key].patches, left, widths, strict=True):
            rect.set_x(x)
            rect.set_width(w)
        left = [x + w for x, w in zip(left, widths, strict=True)]
    a.ax.set_xlim(0, max(left) * 1.05)
    figures.legend(a.ax, [a.bars[k] for k, _, _ in STAGES], fontsize=7, loc="lower right")


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "behavioral.safety_stop",
    model=Choice(("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200", "a100-sxm"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    max_output=IntRange(256, 32768, log=True, label="max output tokens"),
    detect_min=FloatRange(0.5, 120.0, 0.5, label="detection (minutes)"),
    flag_push_s=FloatRange(1.0, 120.0, 1.0, label="flag reaches routers (s)"),
    orchestrator_s=FloatRange(5.0, 300.0, 5.0, label="scale-down reaches pods (s)"),
)
def safety_stop(model: str, gpu: str, tp: int, max_output: int, detect_min: float, flag_push_s: float,
                orchestrator_s: float) -> View:
    """N080: detection + propagation + drain for a router kill switch and for scaling to zero."""
    from lib.fleet.capacity import replica_start_s, request_cost
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    cost = request_cost(dep, 2000, 400, 0.05)
    restart = replica_start_s(dep).total_s
    paths = safety.stop_paths(10.0, 400, max_output, cost.tpot_s, detect_min * 60.0, flag_push_s, orchestrator_s,
                              restart)
    rows = [("deployment", dep.label), ("TPOT at its batch", f"{sig(cost.tpot_s * 1e3)} ms"),
            ("drain: max output x TPOT", fmt_duration(paths[1].drain_s))]
    rows += [(f"{name}: stop / undo", f"{fmt_duration(p.total_s)} / {fmt_duration(p.resume_s)}")
             for name, p in zip(NAMES, paths, strict=True)]
    rows.append(("tokens after the decision (10 req/s), abort vs drain",
                 f"{fmt_count(paths[0].tokens_after_decision)} vs {fmt_count(paths[1].tokens_after_decision)}"))
    fastest = min(paths, key=lambda p: p.total_s)
    caption = (f"Stop time by stage for {dep.label} with answers of up to {max_output:,} tokens: the kill switch that "
               f"aborts in-flight streams stops in {fmt_duration(paths[0].total_s)}, letting them finish takes "
               f"{fmt_duration(paths[1].total_s)}, and scaling to zero {fmt_duration(paths[2].total_s)} plus "
               f"{fmt_duration(restart)} to come back.")
    return View(f"Stopping {model}", rows, _FIGURE(paths), caption=caption, note=f"fastest: {fastest.name}",
                values={"abort_s": paths[0].total_s, "drain_s": paths[1].drain_s})
