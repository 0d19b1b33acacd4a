"""Explorers for profiling a training step (N015, N007): the gap between the step model and a
synthetic measurement, split by suspect (:mod:`lib.training.profiling`).

Views call lib only; each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_ratio, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "llama-3.1-405b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")


def fitted_layout(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, seq_len: int = 8192):
    """The layout, refused (ValueError) when its training state and activations do not fit the GPU."""
    from lib.training.step import TrainingLayout, training_memory
    from lib.units import fmt_bytes

    lay = TrainingLayout(model, gpu, tp=tp, pp=pp, dp=dp, seq_len=seq_len, micro_batch=1,
                         micro_batches=micro_batches, zero_stage=1)
    mem = training_memory(lay)
    if mem["headroom"] < 0:
        raise ValueError(f"{lay.label} needs {fmt_bytes(mem['total'], 'GB')} per GPU with ZeRO-1, more than the "
                         f"{fmt_bytes(mem['capacity'], 'GB')} visible: raise tp, pp or dp")
    return lay


def gap_analysis(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, loader_s: float,
                 host_gap_s: float, gemm_slowdown: float, hbm_slowdown: float, network_slowdown: float,
                 straggler_slowdown: float, jitter: float, seed: int = 0, straggler_rank: int | None = None,
                 straggler_gpus: int = 1):
    """Model, synthetic measurement, attribution and the oracle's per-cause costs for one setup.
    The slow GPUs default to the first of the node two-thirds of the way through the job."""
    from lib.training import profiling as pr
    from lib.training.step import training_step

    lay = fitted_layout(model, gpu, tp, pp, dp, micro_batches)
    n = lay.n_gpus
    if straggler_slowdown > 1 and 2 * straggler_gpus >= n:
        raise ValueError(f"{straggler_gpus} slow GPU(s) of {n}: the counters are read on the median rank, which must be "
                         "a healthy one; use more GPUs (tp x pp x dp) or fewer slow ones")
    rank = ((2 * n) // 3) // lay.node * lay.node if straggler_rank is None else straggler_rank
    rank = min(rank, n - straggler_gpus)
    causes = pr.Causes(loader_s=loader_s, host_gap_s=host_gap_s, gemm_slowdown=gemm_slowdown,
                       hbm_slowdown=hbm_slowdown, network_slowdown=network_slowdown,
                       straggler_slowdown=straggler_slowdown, straggler_rank=max(0, rank),
                       straggler_gpus=min(straggler_gpus, n), jitter=jitter, seed=seed)
    pred = training_step(lay)
    meas = pr.measure_step(lay, causes)
    att = pr.attribute_gap(pred, meas)
    truth = pr.cause_costs(lay, causes)
    return SimpleNamespace(layout=lay, causes=causes, predicted=pred, measured=meas, attribution=att, truth=truth)


def node_ratio(meas, node: int) -> np.ndarray:
    """Per node: its slowest GPU's kernel time over the job's median (the spread, node by node)."""
    busy = meas.busy_s
    pad = (-len(busy)) % node
    per = np.concatenate([busy, np.full(pad, np.nan)]).reshape(-1, node)
    return np.nanmax(per, axis=1) / float(np.median(busy))


_LABELS = ("dataloader", "tensor cores", "HBM", "collectives", "one machine", "residual")


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.17, top=0.96, wspace=0.55)
    ax1 = fig.add_subplot(1, 2, 1)
    (line,) = ax1.plot([0, 1], [1, 1], color="C0", lw=1.0, drawstyle="steps-mid")
    cut = ax1.axhline(1.01, color="C3", ls=":", lw=1.0)
    ax1.set_xlabel("node")
    ax1.set_ylabel("slowest GPU / job median")
    ax1.grid(True)
    ax2 = fig.add_subplot(1, 2, 2)
    y = np.arange(len(_LABELS))
    bars = ax2.barh(y, np.zeros(len(y)), color="C0")
    (marks,) = ax2.plot(np.zeros(len(y)), y, "|", color="k", ms=10, mew=2)
    ax2.set_yticks(y, _LABELS, fontsize=7)
    ax2.invert_yaxis()
    ax2.axvline(0, color="k", lw=0.6)
    ax2.set_xlabel("seconds of step time")
    ax2.grid(True, axis="x")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):  # few tick labels: text layout is most of a redraw
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.yaxis.set_major_locator(MaxNLocator(4)) if ax is ax1 else None
    return SimpleNamespace(ax1=ax1, line=line, cut=cut, ax2=ax2, bars=bars, marks=marks)


def _draw(a, ratio, cut, parts, truth) -> None:
    width = -(-len(ratio) // 128)  # nodes per point: at most 128 points, each its group's slowest node
    pad = (-len(ratio)) % width
    shown = np.nanmax(np.concatenate([ratio, np.full(pad, np.nan)]).reshape(-1, width), axis=1)
    x = np.arange(len(shown)) * width + (width - 1) / 2
    a.line.set_data(x, shown)
    a.cut.set_ydata([cut, cut])
    a.ax1.set_xlim(-0.5, max(len(ratio) - 0.5, 0.5))
    hi = max(float(np.nanmax(ratio)), cut)
    a.ax1.set_ylim(min(0.99, float(np.nanmin(ratio))), hi + 0.1 * (hi - 0.99) + 0.005)
    for bar, v in zip(a.bars, parts, strict=True):
        bar.set_width(v)
        bar.set_color("C3" if v == max(parts) and v > 0 else "C0")
    a.marks.set_data(truth, np.arange(len(truth)))
    lo = min(0.0, *parts, *truth)
    top = max(1e-3, *parts, *truth)
    a.ax2.set_xlim(lo - 0.05 * (top - lo), top * 1.08)


_FIGURE = figures.LiveFigure(7.0, 2.9, _build, _draw)


@explorer(
    "training.step_gap",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    pp=IntRange(1, 16, label="pipeline stages"),
    dp=IntRange(1, 128, label="data parallel", log=True),
    micro_batches=IntRange(1, 64, label="micro-batches per step", log=True),
    loader_s=FloatRange(0.0, 2.0, 0.01, label="loader wait (s)"),
    host_gap_s=FloatRange(0.0, 2.0, 0.01, label="host gaps (s)"),
    gemm_slowdown=FloatRange(1.0, 2.0, 0.01, label="GEMM slow-down"),
    hbm_slowdown=FloatRange(1.0, 3.0, 0.01, label="memory-bound slow-down"),
    network_slowdown=FloatRange(1.0, 3.0, 0.01, label="collective slow-down"),
    straggler_slowdown=FloatRange(1.0, 2.0, 0.01, label="one GPU's slow-down"),
    jitter=FloatRange(0.0, 0.03, 0.001, label="per-rank jitter (sd)"),
)
def step_gap(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, loader_s: float,
             host_gap_s: float, gemm_slowdown: float, hbm_slowdown: float, network_slowdown: float,
             straggler_slowdown: float, jitter: float) -> View:
    """N015: the modelled step, a synthetic measured one, and the gap split by suspect."""
    return gap_view(gap_analysis(model, gpu, tp, pp, dp, micro_batches, loader_s, host_gap_s, gemm_slowdown,
                                 hbm_slowdown, network_slowdown, straggler_slowdown, jitter))


def gap_view(r) -> View:
    """The view of one :func:`gap_analysis` result (the page passes its own seed and slow GPUs)."""
    att, meas, pred = r.attribution, r.measured, r.predicted
    parts = [att.parts[k] for k in _LABELS[:-1]] + [att.residual_s]
    truth = [r.truth[k] for k in _LABELS[:-1]] + [r.truth["host gaps"]]
    ratio = node_ratio(meas, r.layout.node)
    cut = att.flag_ratio
    rows = [("modelled step", f"{fmt_time(pred.step_s)} (MFU {fmt_pct(pred.mfu)})"),
            ("measured step", f"{fmt_time(meas.step_s)} (MFU {fmt_pct(meas.mfu)})"),
            ("gap to explain", fmt_time(att.gap_s))]
    for k in _LABELS[:-1]:
        metric, want, got = att.metrics[k]
        rows.append((k, f"{fmt_time(att.parts[k])} ({metric}: {sig(got)} vs {sig(want)} modelled)"))
    rows.append(("residual (no counter sees it)", fmt_time(att.residual_s)))
    nodes = att.slow_nodes
    rows.append(("slow ranks", "none flagged" if not att.slow_ranks else
                 f"{len(att.slow_ranks)} on node(s) {', '.join(str(x) for x in nodes[:4])}"
                 + (" and more" if len(nodes) > 4 else "")))
    if att.gap_s > 0:
        lead = att.top if att.parts[att.top] >= att.residual_s else "residual"
        share = (att.parts[att.top] if lead != "residual" else att.residual_s) / att.gap_s
        story = f"the largest share is {lead} ({fmt_pct(share)} of the gap)"
    else:
        story = "no gap: the measurement equals the model"
    caption = (f"Left: each node's slowest GPU's kernel time over the job median, against the flag line "
               f"at {fmt_ratio(cut)} (red, dotted); right: the {fmt_time(max(att.gap_s, 0.0))} gap split by suspect "
               f"(bars, the largest red) against each cause's cost injected alone (black ticks): {story}.")
    title = f"{r.layout.label}: modelled {fmt_time(pred.step_s)}, measured {fmt_time(meas.step_s)}"
    fig = _FIGURE(ratio, cut, parts, truth)
    return View(title, rows, fig, caption=caption,
                values={"gap_s": att.gap_s, "residual_s": att.residual_s, **att.parts})


# ---- N007: one step's timeline ------------------------------------------------------------------

_KIND_STYLE = {  # kind -> (lane row, colour, legend label)
    "dataloader": (2, "C1", "next(data_iter)"), "python": (2, "C4", "host-bound Python"),
    "forward": (1, "C0", "forward kernels"), "backward": (1, "C9", "backward kernels"),
    "tp": (1, "C8", "TP collectives (exposed)"), "optimizer": (1, "C5", "optimizer"),
    "pp": (0, "C7", "pipeline wait (bubble)"), "dp": (0, "C2", "DP gradient reduction"),
}
_IDLE_ROW = 0.55  # the thin strip under the compute lane that marks GPU idle


def timeline_analysis(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, loader_s: float,
                      host_gap_s: float, grad_overlap: bool, optimizer_slowdown: float):
    """The model's step, the synthetic trace with the four timeline causes, and its reading."""
    from lib.training import profiling as pr
    from lib.training.step import training_step

    lay = fitted_layout(model, gpu, tp, pp, dp, micro_batches)
    causes = pr.Causes(loader_s=loader_s, host_gap_s=host_gap_s, grad_overlap=grad_overlap,
                       optimizer_slowdown=optimizer_slowdown)
    pred = training_step(lay)
    trace = pr.step_trace(lay, causes)
    reading = pr.read_timeline(trace, pred)
    truth = pr.cause_costs(lay, causes)
    return SimpleNamespace(layout=lay, causes=causes, predicted=pred, trace=trace, reading=reading, truth=truth)


def _build_timeline(fig) -> SimpleNamespace:
    from matplotlib.collections import PolyCollection
    from matplotlib.ticker import MaxNLocator

    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.2, top=0.96)
    ax = fig.add_subplot()
    coll = ax.add_collection(PolyCollection([], edgecolors="none", linewidths=0))  # one collection: one draw call
    ax.set_yticks([0.4, 1.4, 2.4], ["GPU comm", "GPU compute", "host"])
    ax.set_ylim(-0.1, 2.9)
    ax.set_xlabel("time in the step (s)")
    ax.grid(True, axis="x")
    ax.xaxis.set_major_locator(MaxNLocator(5))  # few labels: text layout is most of a redraw
    return SimpleNamespace(ax=ax, coll=coll)


def _rect(x0: float, x1: float, y0: float, h: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x0, y0 + h), (x1, y0 + h), (x1, y0)]


def _draw_timeline(a, events, idle, step_s) -> None:
    verts, colours = [], []
    tiny = step_s / 2000  # under a third of a pixel: not drawn
    events = [e for e in events if e[2] - e[1] > tiny]
    idle = [(x0, x1) for x0, x1 in idle if x1 - x0 > tiny]
    for kind, x0, x1 in events:
        row, colour, _ = _KIND_STYLE[kind]
        verts.append(_rect(x0, x1, row, 0.8))
        colours.append(colour)
    for x0, x1 in idle:
        verts.append(_rect(x0, x1, 1 - 0.12, 0.1))
        colours.append("C3")
    a.coll.set_verts(verts)
    a.coll.set_facecolors(colours)
    a.ax.set_xlim(0, step_s * 1.01)


_TIMELINE = figures.LiveFigure(7.0, 2.2, _build_timeline, _draw_timeline)
KEY = ("host: orange next(data_iter), purple host-bound Python; compute: blue forwards, cyan backwards, olive exposed "
       "TP collectives, brown optimizer, red strip GPU idle; comm: grey pipeline wait, green DP gradient reduction")


@explorer(
    "training.step_timeline",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    pp=IntRange(1, 16, label="pipeline stages"),
    dp=IntRange(1, 128, label="data parallel", log=True),
    micro_batches=IntRange(1, 16, label="micro-batches per step", log=True),  # a readable (and fast) trace
    loader_s=FloatRange(0.0, 2.0, 0.01, label="loader wait (s)"),
    host_gap_s=FloatRange(0.0, 2.0, 0.01, label="host-bound gaps (s)"),
    grad_overlap=Choice((True, False), label="gradient reduction overlapped"),
    optimizer_slowdown=FloatRange(1.0, 10.0, 0.1, label="optimizer slow-down"),
)
def step_timeline(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, loader_s: float,
                  host_gap_s: float, grad_overlap: bool, optimizer_slowdown: float) -> View:
    """N007: one step's trace (host, compute stream, comm stream) and its reading in a fixed order."""
    from lib.training import profiling as pr

    r = timeline_analysis(model, gpu, tp, pp, dp, micro_batches, loader_s, host_gap_s, grad_overlap,
                          optimizer_slowdown)
    rd, pred, tr = r.reading, r.predicted, r.trace
    rows = [("modelled step", f"{fmt_time(pred.step_s)} (MFU {fmt_pct(pred.mfu)})"),
            ("traced step", f"{fmt_time(rd.step_s)} (MFU {fmt_pct(rd.mfu)}): {fmt_time(rd.unaccounted_s)} "
                            "is not model math at peak"),
            ("1. GPU idle", fmt_time(rd.gpu_idle_s)),
            ("2. host in the gaps", f"data loader {fmt_time(rd.idle_by['dataloader'])}, Python "
                                    f"{fmt_time(rd.idle_by['python'])}; pipeline wait {fmt_time(rd.idle_by['pp'])}"),
            ("3. DP reduction", f"{fmt_time(rd.dp_s)}, {fmt_time(rd.dp_overlapped_s)} under the backward, "
                                f"{fmt_time(rd.dp_exposed_s)} exposed"),
            ("4. optimizer", f"{fmt_time(rd.optimizer_s)} (fused Adam: {fmt_time(pred.optimizer_s)})")]
    rows += [(k, f"worth {fmt_time(rd.worth[k])}") for k in pr.TIMELINE_CAUSES]
    found = rd.found()
    story = (f"the largest cause is {found[0]} ({fmt_time(rd.worth[found[0]])})" if found else
             "no cause: the trace is the model's step")
    caption = (f"One step of {r.layout.label} on pipeline stage 0 ({KEY}): {fmt_time(rd.gpu_idle_s)} of GPU idle in a "
               f"{fmt_time(rd.step_s)} step, and {story}.")
    events = [(e.kind, e.start_s, e.end_s) for e in tr.events]
    busy = sorted((e.start_s, e.end_s) for e in tr.lane("GPU compute"))
    idle, t = [], 0.0
    for s0, s1 in busy:
        if s0 > t:
            idle.append((t, s0))
        t = max(t, s1)
    if tr.step_s > t:
        idle.append((t, tr.step_s))
    title = f"{r.layout.label}: traced step {fmt_time(rd.step_s)}, modelled {fmt_time(pred.step_s)}"
    fig = _TIMELINE(events, idle, tr.step_s)
    return View(title, rows, fig, caption=caption, values={"step_s": rd.step_s, **rd.worth})
