"""Explorers for the measurement questions of the CUDA-kernels section: the decode step's timeline
rows (I038, :func:`lib.perf.gaps.timeline_rows`) and L2 persistence for the KV cache (I041,
:mod:`lib.kernels.l2`). Each view calls lib only; the figures are persistent matplotlib figures
updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import l2
from lib.perf import gaps, memory
from lib.perf import step as st
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import MS, US, fmt_bytes, fmt_pct, fmt_ratio, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())

# ---- I038: the step as three timeline rows -----------------------------------------------------

ROW_Y = {"cpu": 2, "gpu": 1, "comm": 0}
KIND_STYLE = {  # kind -> (row, colour, legend label)
    "sync": ("cpu", "#bbbbbb", "CPU: waiting on the token sync"),
    "scheduler": ("cpu", "#8c564b", "CPU: scheduler"),
    "launch": ("cpu", "#17becf", "CPU: cudaLaunchKernel calls"),
    "gemm": ("gpu", "#4c72b0", "GEMV"),
    "attention": ("gpu", "#dd8452", "attention"),
    "elementwise": ("gpu", "#55a868", "tiny kernels"),
    "sampling": ("gpu", "#8172b3", "sampling kernels"),
    "collective": ("comm", "#c44e52", "NCCL all-reduce / all-gather"),
    "memcpy": ("comm", "#e377c2", "D2H copy of tokens + sync"),
}


def _timeline_build(fig) -> SimpleNamespace:
    from matplotlib.collections import PolyCollection

    fig.subplots_adjust(left=0.2, right=0.98, bottom=0.36, top=0.86)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, polys={})
    for kind, (_row, color, label) in KIND_STYLE.items():
        pc = PolyCollection([], facecolors=color, edgecolors="white", linewidths=0.3, label=label)
        ax.add_collection(pc)
        a.polys[kind] = pc
    a.graph, = ax.plot([], [], marker="v", ls="", color="#17becf", ms=8, label="CPU: one cudaGraphLaunch")
    ax.set_yticks([ROW_Y[r] + 0.4 for r in gaps.TIMELINE_ROWS])
    ax.set_yticklabels([gaps.TIMELINE_ROW_LABEL[r].replace(" / ", " /\n", 1) for r in gaps.TIMELINE_ROWS], fontsize=8)
    ax.set_ylim(-0.2, 3.0)
    ax.set_xlabel("µs from the start of the step (white = idle)")
    return a


def _timeline_draw(a: SimpleNamespace, rows: dict, t_end: float, title: str) -> None:
    verts = {k: [] for k in KIND_STYLE}
    graph_x = []
    for row, spans in rows.items():
        y0 = ROW_Y[row] + 0.05
        y1 = y0 + 0.7
        for s in spans:
            if s.start_s > t_end:
                continue
            x0, x1 = s.start_s / US, min(s.end_s, t_end) / US
            if s.kind == "launch" and s.duration_s == 0:
                graph_x.append(x0)
                continue
            verts[s.kind].append([(x0, y0), (x0, y1), (x1, y1), (x1, y0)])
    for kind, pc in a.polys.items():
        pc.set_verts(verts[kind])
        pc.set_visible(bool(verts[kind]))
    a.graph.set_data(graph_x, [ROW_Y["cpu"] + 0.4] * len(graph_x))
    a.graph.set_visible(bool(graph_x))
    a.ax.set_xlim(0, t_end / US * 1.01)
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [*a.polys.values(), a.graph], fontsize=7, ncol=3, loc="upper center",
                   bbox_to_anchor=(0.4, -0.24), frameon=False)


_TIMELINE_FIGURE = figures.LiveFigure(7.0, 3.4, _timeline_build, _timeline_draw)


def window_end_s(trace: gaps.Trace, layers: int) -> float:
    """Seconds from the step's start to the end of its first ``layers`` layers (the last kernel
    before the (layers + 1)-th QKV projection), or the step's end if it has fewer."""
    qkv = [i for i, e in enumerate(trace.events) if e.name == "qkv_proj"]
    if len(qkv) > layers:
        return trace.events[qkv[layers] - 1].end_s
    return trace.step_s


def fits_or_refuse(dep: Deployment, batch: int, context: int) -> None:
    """ValueError unless the engine's KV pool holds ``batch`` sequences of ``context`` tokens."""
    room = dep.budget.max_concurrency(max(context, 1))
    if batch > room:
        raise ValueError(f"{dep.label}: the KV pool holds {sig(room)} sequences of {context:,} tokens, not "
                         f"{batch}: raise tp, shrink batch or context")


@explorer(
    "cuda_kernels.step_timeline",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True, label="batch (sequences)"),
    context=IntRange(1, 131072, log=True, label="context tokens"),
    cuda_graphs=Choice((True, False), label="CUDA graphs"),
    layers=IntRange(1, 2, label="layers shown"),
)
def step_timeline(model: str, gpu: str, tp: int, batch: int, context: int, cuda_graphs: bool,
                  layers: int) -> View:
    """I038: one decode step (lib.perf.step) as the CPU, GPU-kernel and NCCL/memcpy rows of a
    profiler, the first layers drawn, and the whole step's ledger: floor + each row = the step."""
    dep = Deployment(model, gpu, tp=tp, cuda_graphs=cuda_graphs)
    fits_or_refuse(dep, batch, context)
    a = st.step_assumptions()
    tl = gaps.timeline_rows(dep, batch, context, a)
    other = st.decode_step(dep.replace(cuda_graphs=not cuda_graphs), batch, context, a)
    t_end = window_end_s(tl.trace, layers)
    title = (f"{dep.label}, batch {batch}, {context:,} tokens, CUDA graphs {'on' if cuda_graphs else 'off'}\n"
             f"step {fmt_time(tl.step_s)}: {fmt_pct(tl.achieved_fraction)} of peak bandwidth")
    fig = _TIMELINE_FIGURE(tl.rows, t_end, title)
    rows = [("step (lib.perf.step)", fmt_time(tl.step_s)),
            ("achieved bandwidth: bytes / step / W", fmt_pct(tl.achieved_fraction)),
            ("GEMVs + attention alone: bytes / their time / W", fmt_pct(tl.big_kernel_fraction()))]
    for key, row, label in gaps.TIMELINE_LEDGER:
        where = "" if row is None else f"[{gaps.TIMELINE_ROW_LABEL[row]}] "
        rows.append((where + label, fmt_time(tl.ledger[key], "ms")))
    rows.append(("kernels per step", f"{len(tl.trace.events):,}"))
    rows.append((f"same step with CUDA graphs {'off' if cuda_graphs else 'on'}", fmt_time(other.total_s)))
    caption = ("The top row is the CPU (token sync, scheduler, then the launch calls), the middle row the GPU's "
               "kernels and the bottom row the collectives and the token copy: every white stretch of the middle "
               "row that no other row fills is time the GPU moves no bytes.")
    return View(f"Decode step timeline: {dep.label}", rows, fig,
                "The drawing shows the step's start and its first layers; the table covers the whole step.",
                values={**{k: v / MS for k, v in tl.ledger.items()}, "step_ms": tl.step_s / MS,
                        "achieved": tl.achieved_fraction, "other_ms": other.total_s / MS},
                caption=caption)


# ---- I041: L2 persistence for the KV cache -----------------------------------------------------

NVIDIA_GPUS = tuple(k for k in GPUS if hardware.gpu(k).vendor == "NVIDIA" and hardware.gpu(k).compute_capability)
SIZE_LABELS = ("persisting carve-out", "whole L2", "shared prefix KV, one layer", "shared prefix KV, all layers",
               "one sequence's KV", "the step's KV reads", "the step's weight reads")
SAVING_LABELS = ("pin the step's KV", "pin the shared prefix\n(upper bound)", "shared-prefix (cascade)\nattention")


def l2_sizes(dep: Deployment, batch: int, context: int, prefix_tokens: int) -> dict:
    """The byte counts I041 compares with the carve-out, on one GPU of ``dep`` (bytes), and the three
    savings (seconds per step): pinning the streamed KV, pinning the shared prefix (the better of
    :func:`lib.kernels.l2.prefix_pinning`'s two plans), and the cascade kernel."""
    if prefix_tokens > context:
        raise ValueError(f"prefix_tokens ({prefix_tokens:,}) must be at most the context ({context:,} tokens)")
    fits_or_refuse(dep, batch, context)
    step = st.decode_step(dep, batch, context)
    sp = l2.shared_prefix(dep, batch, prefix_tokens)
    pin_prefix, how = l2.prefix_pinning(dep, batch, prefix_tokens)
    pin_kv = l2.pinning(step.kv_bytes_per_gpu, 1, dep.chip)
    return {
        "carveout": l2.persisting_max_bytes(dep.chip), "l2": dep.chip.l2_bytes,
        "prefix_layer": sp.prefix_bytes_per_layer, "prefix": sp.prefix_bytes,
        "sequence_kv": memory.kv_bytes_per_sequence(dep.mdl, context, dep.kv_dtype) * st.kv_read_fraction(dep),
        "step_kv": step.kv_bytes_per_gpu, "step_weights": step.weight_bytes_per_gpu,
        "pin_kv_s": pin_kv.saving_s, "pin_prefix_s": pin_prefix.saving_s, "pin_how": how,
        "cascade_s": l2.cascade_saving_s(dep, batch, prefix_tokens), "step_s": step.total_s,
        "pin_prefix": pin_prefix, "shared": sp,
    }


def _l2_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.27, right=0.97, bottom=0.25, top=0.88, wspace=0.9)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    y = np.arange(len(SIZE_LABELS))[::-1]
    colors = ["#c44e52", "#dd8452"] + ["#4c72b0"] * (len(SIZE_LABELS) - 2)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.sizes = ax1.barh(y, np.ones(len(SIZE_LABELS)), color=colors)
    a.sizes[0].set_label("L2 set-aside for persisting lines")
    a.sizes[1].set_label("the whole L2")
    a.sizes[2].set_label("bytes the step reads")
    a.carve = ax1.axvline(1.0, color="#c44e52", lw=1, ls="--")
    ax1.set_yticks(y)
    ax1.set_yticklabels(SIZE_LABELS, fontsize=7)
    figures.log_scale(ax1, "x")
    ax1.set_xlabel("bytes on one GPU", fontsize=8)
    y2 = np.arange(len(SAVING_LABELS))[::-1]
    a.savings = ax2.barh(y2, np.zeros(len(SAVING_LABELS)), color=["#bbbbbb", "#dd8452", "#55a868"])
    ax2.set_yticks(y2)
    ax2.set_yticklabels(SAVING_LABELS, fontsize=7)
    ax2.set_xlabel("ms saved per decode step", fontsize=8)
    return a


def _l2_draw(a: SimpleNamespace, sizes: dict, title: str) -> None:
    keys = ("carveout", "l2", "prefix_layer", "prefix", "sequence_kv", "step_kv", "step_weights")
    for bar, k in zip(a.sizes, keys, strict=True):
        bar.set_width(sizes[k])
    a.carve.set_xdata([sizes["carveout"]] * 2)
    a.ax1.set_xlim(min(sizes[k] for k in keys) / 3, max(sizes[k] for k in keys) * 3)
    vals = [sizes["pin_kv_s"] / MS, sizes["pin_prefix_s"] / MS, sizes["cascade_s"] / MS]
    for bar, v in zip(a.savings, vals, strict=True):
        bar.set_width(v)
    a.ax2.set_xlim(0, max(max(vals) * 1.15, 1e-3))
    a.ax1.figure.suptitle(title, fontsize=8)
    figures.legend(a.ax1, list(a.sizes[:3]), fontsize=6.5, loc="upper center", bbox_to_anchor=(0.3, -0.2), ncol=3,
                   frameon=False)


_L2_FIGURE = figures.LiveFigure(7.2, 3.3, _l2_build, _l2_draw)


@explorer(
    "cuda_kernels.l2_persistence",
    model=Choice(MODELS),
    gpu=Choice(NVIDIA_GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True, label="batch (sequences)"),
    context=IntRange(1, 131072, log=True, label="context tokens"),
    prefix_tokens=IntRange(1, 131072, log=True, label="shared prefix tokens"),
)
def l2_persistence(model: str, gpu: str, tp: int, batch: int, context: int, prefix_tokens: int) -> View:
    """I041: what the persisting L2 carve-out holds against what one decode step reads, and what
    pinning saves against a shared-prefix (cascade) attention kernel."""
    dep = Deployment(model, gpu, tp=tp)
    z = l2_sizes(dep, batch, context, prefix_tokens)
    title = (f"{dep.label}, batch {batch}, {context:,} tokens, {prefix_tokens:,} shared: "
             f"step {fmt_time(z['step_s'])}")
    fig = _L2_FIGURE(z, title)
    c = z["carveout"]
    rows = [("persisting carve-out (largest)", fmt_bytes(c, "MB")),
            ("the step's weight + KV reads / carve-out", fmt_ratio((z["step_weights"] + z["step_kv"]) / c)),
            ("one sequence's KV / carve-out", fmt_ratio(z["sequence_kv"] / c)),
            ("shared prefix KV, one layer", fmt_bytes(z["prefix_layer"], "MB")),
            ("shared prefix KV, all layers", fmt_bytes(z["prefix"], "MB")),
            ("pinning the step's KV saves", fmt_time(z["pin_kv_s"])),
            (f"pinning the prefix ({z['pin_how']}) saves at most", fmt_time(z["pin_prefix_s"])),
            ("cascade attention saves", fmt_time(z["cascade_s"])),
            ("cascade saving / step", fmt_pct(z["cascade_s"] / z["step_s"]))]
    caption = ("Left, on a log scale: the dashed red line is the L2 set-aside; only a bar that ends left of it can be "
               "pinned whole. Right: what each choice saves per step; pinning the streamed KV is a sliver, and the "
               "cascade kernel beats pinning the shared prefix.")
    return View(f"L2 persistence: {dep.label}", rows, fig,
                "Pinning's saving is an upper bound: it assumes an unpinned L2 would have evicted the prefix between "
                "readers.",
                values={k: v for k, v in z.items() if isinstance(v, float)}, caption=caption)


__all__ = ["KIND_STYLE", "NVIDIA_GPUS", "fits_or_refuse", "l2_persistence", "l2_sizes", "step_timeline",
           "window_end_s"]
