"""Explorers for the elementwise kernels of the CUDA-kernels section: the vector add against its host
copies (N093) and a chain of elementwise ops, unfused and fused (N097). Each view calls
:mod:`lib.kernels.elementwise` only (no triton, no torch); the figures are persistent matplotlib
figures updated in place."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import elementwise as ew
from lib.registry import hardware
from lib.registry.dtypes import bytes_per_element
from lib.units import fmt_bandwidth, fmt_bytes, fmt_int, fmt_pct, fmt_ratio, fmt_time, sig


def _unit(n_bytes: float) -> str:
    """The byte unit a table row shows a size in: GB, MB or KB, whichever keeps it from 1 up."""
    return "GB" if n_bytes >= 1e9 else "MB" if n_bytes >= 1e6 else "KB"


def _on_pcie(key: str) -> bool:
    try:
        ew.host_link_bandwidth(key)
    except ValueError:
        return False
    return True


PCIE_GPUS = tuple(k for k in hardware.gpu_names()
                  if hardware.gpu(k).compute_capability is not None and _on_pcie(k))
"""NVIDIA GPUs (per-SM limits in data/hardware.yaml) whose host link is PCIe x16."""
ALL_GPUS = tuple(hardware.gpu_names())

# ---- N093: the vector add against its host copies --------------------------------------------------

VECTOR_N = 2 ** np.arange(10, 35)  # 1,024 .. 1.7e10 elements


def _vector_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.33, top=0.92)
    figures.log_scale(ax, "both")
    a = SimpleNamespace(ax=ax)
    a.add, = ax.plot([], [], "-", color="#1f77b4", lw=1.8, label="the add on the GPU (3 n b bytes over HBM)")
    a.copies, = ax.plot([], [], "-", color="#d62728", lw=1.8, label="copies x, y in and out back, one after another")
    a.overlap, = ax.plot([], [], "--", color="#d62728", lw=1.2, label="copies overlapped (the link's two directions)")
    a.here, = ax.plot([], [], "o", color="black", ms=6, label="this n")
    a.here_copy, = ax.plot([], [], "o", color="black", ms=6)
    a.ratio = ax.text(0.02, 0.95, "", transform=ax.transAxes, fontsize=8, va="top")
    ax.set_xlabel("elements n")
    ax.set_ylabel("seconds")
    ax.set_xlim(VECTOR_N[0] / 1.5, VECTOR_N[-1] * 1.5)
    ax.grid(True)
    return a


def _vector_draw(a, add_s, copies_s, overlap_s, here: tuple, ratio_text: str, title: str) -> None:
    a.add.set_data(VECTOR_N, add_s)
    a.copies.set_data(VECTOR_N, copies_s)
    a.overlap.set_data(VECTOR_N, overlap_s)
    a.here.set_data([here[0]], [here[1]])
    a.here_copy.set_data([here[0]], [here[2]])
    a.ratio.set_text(ratio_text)
    a.ax.set_ylim(min(add_s.min(), overlap_s.min()) / 2, copies_s.max() * 2)
    a.ax.set_title(title)
    figures.legend(a.ax, [a.add, a.copies, a.overlap, a.here], loc="upper center", bbox_to_anchor=(0.5, -0.17),
                   ncol=1, fontsize=7, frameon=False)


_VECTOR_FIGURE = figures.LiveFigure(6.2, 4.4, _vector_build, _vector_draw)


@functools.lru_cache(maxsize=64)
def vector_curves(gpu: str, dtype: str, threads: int, registers: int, memory: str) -> tuple[np.ndarray, ...]:
    """(add, copies one after another, copies overlapped) seconds for every n of :data:`VECTOR_N`."""
    curves = [ew.vector_add_cost(int(x), gpu, dtype, memory, threads, registers) for x in VECTOR_N]
    return (np.array([c.kernel.time_s for c in curves]), np.array([c.copies_s for c in curves]),
            np.array([c.overlapped_copies_s for c in curves]))


@explorer(
    "cuda_kernels.vector_add",
    gpu=Choice(PCIE_GPUS),
    n=IntRange(1, 2**34, log=True, label="elements n"),
    dtype=Choice(ew.DTYPES, label="dtype"),
    threads=IntRange(32, 1024, log=True, label="threads per block"),
    registers=IntRange(1, 255, label="registers per thread"),
    memory=Choice(ew.HOST_MEMORY, label="host memory"),
)
def vector_add_view(gpu: str, n: int, dtype: str, threads: int, registers: int, memory: str) -> View:
    """N093: the launch of an n-element vector add (grid, resident blocks, waves), its HBM time, and
    the host copies of its inputs and output, against n."""
    v = ew.vector_add_cost(n, gpu, dtype, memory, threads, registers)
    add_s, copies_s, overlap_s = vector_curves(gpu, dtype, threads, registers, memory)
    fig = _VECTOR_FIGURE(add_s, copies_s, overlap_s, (n, v.kernel.time_s, v.copies_s),
                         f"copies / add = {fmt_ratio(v.ratio)} at this n; {fmt_ratio(v.peak_ratio)} at the datasheet "
                         "rates", f"vector add of {dtype} on {gpu}, {memory} host memory")
    cfg = v.launch
    rows = [
        ("grid", f"{fmt_int(cfg.grid)} blocks of {cfg.threads_per_block} threads "
                 f"({fmt_int(cfg.masked_lanes)} lanes masked in the last)"),
        ("resident per SM", f"{cfg.blocks_per_sm} blocks ({' and '.join(cfg.binding)} bind)"),
        ("waves", f"{fmt_int(cfg.waves)} of {fmt_int(cfg.slots)} blocks ({sig(cfg.wave_count, 4)}; "
                  f"{fmt_pct(cfg.wave_efficiency)} of the slots busy)"),
        ("HBM bytes (2 reads + 1 write)", fmt_bytes(v.bytes, _unit(v.bytes))),
        ("the add", f"{fmt_time(v.kernel.time_s)} ({fmt_time(v.kernel.floor_s)} at the datasheet "
                    f"{fmt_bandwidth(v.kernel.bandwidth)})"),
        ("host link (one direction)", f"{fmt_bandwidth(v.link_bandwidth)} achieved of {fmt_bandwidth(v.link_peak)}"),
        ("copies in (x, y)", f"{fmt_bytes(v.h2d_bytes, _unit(v.h2d_bytes))} in {fmt_time(v.h2d_s)}"),
        ("copy out (out)", f"{fmt_bytes(v.d2h_bytes, _unit(v.d2h_bytes))} in {fmt_time(v.d2h_s)}"),
        ("copies / add", f"{fmt_ratio(v.ratio)} (overlapped copies: {fmt_ratio(v.overlapped_copies_s / v.kernel.time_s)})"),
    ]
    caption = ("Both lines grow with n at the same slope because the add and the copies move the same 3 n b "
               "bytes: the gap between them is the HBM-to-PCIe bandwidth ratio, and only at small n, where the "
               "add's fixed launch cost flattens its line, does the ratio shrink.")
    return View(f"Vector add: {fmt_int(n)} {dtype} elements on {gpu}", rows, fig,
                "Times: the add at the decode step's fixed cost + bytes / (HBM x streaming efficiency); copies at "
                "PCIe x16 per direction x the pinned efficiency (x the pageable fraction).",
                values={"grid": float(cfg.grid), "waves": float(cfg.waves), "add_s": v.kernel.time_s,
                        "copies_s": v.copies_s, "ratio": v.ratio, "peak_ratio": v.peak_ratio, "bytes": v.bytes},
                caption=caption)


# ---- N097: a chain of elementwise ops, unfused and fused -------------------------------------------

FUSION_N = 2 ** np.arange(8, 33)  # 256 .. 4.3e9 elements


def _fusion_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.34, top=0.92)
    figures.log_scale(ax, "both")
    a = SimpleNamespace(ax=ax)
    a.unfused, = ax.plot([], [], "-", color="#d62728", lw=1.8, label="unfused")
    a.fused, = ax.plot([], [], "-", color="#1f77b4", lw=1.8, label="fused: one kernel")
    a.unfused_mem, = ax.plot([], [], ":", color="#d62728", lw=1.2, label="unfused, bytes alone")
    a.fused_mem, = ax.plot([], [], ":", color="#1f77b4", lw=1.2, label="fused, bytes alone")
    a.cross = ax.axvline(1.0, color="grey", lw=1, ls="--", label="crossover")
    a.here, = ax.plot([], [], "o", color="black", ms=6, label="this size")
    a.here_fused, = ax.plot([], [], "o", color="black", ms=6)
    ax.set_xlabel("elements in the tensor")
    ax.set_ylabel("seconds")
    ax.set_xlim(FUSION_N[0] / 1.5, FUSION_N[-1] * 1.5)
    ax.grid(True)
    return a


def _fusion_draw(a, unfused, fused, unfused_mem, fused_mem, cross: float, labels: dict, here: tuple,
                 title: str) -> None:
    a.unfused.set_data(FUSION_N, unfused)
    a.fused.set_data(FUSION_N, fused)
    a.unfused_mem.set_data(FUSION_N, unfused_mem)
    a.fused_mem.set_data(FUSION_N, fused_mem)
    for key, text in labels.items():
        getattr(a, key).set_label(text)
    a.cross.set_xdata([cross, cross])
    a.here.set_data([here[0]], [here[1]])
    a.here_fused.set_data([here[0]], [here[2]])
    a.ax.set_ylim(fused.min() / 3, unfused.max() * 2)
    a.ax.set_title(title)
    figures.legend(a.ax, [a.unfused, a.fused, a.unfused_mem, a.fused_mem, a.cross, a.here], loc="upper center",
                   bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=7, frameon=False)


_FUSION_FIGURE = figures.LiveFigure(6.2, 4.4, _fusion_build, _fusion_draw)


@functools.lru_cache(maxsize=64)
def fusion_curves(gpu: str, ops: int, dtype: str, launch: str) -> dict[str, np.ndarray]:
    """Unfused and fused times, and their memory times alone, for every size of :data:`FUSION_N`."""
    costs = [ew.chain_cost(int(x), ops, gpu, dtype, launch) for x in FUSION_N]
    return {"unfused": np.array([c.unfused_s for c in costs]), "fused": np.array([c.fused_s for c in costs]),
            "unfused_mem": np.array([c.memory_unfused_s for c in costs]),
            "fused_mem": np.array([c.fused.memory_s for c in costs])}


@explorer(
    "cuda_kernels.fusion",
    gpu=Choice(ALL_GPUS),
    n=IntRange(1, 2**32, log=True, label="elements in the tensor"),
    ops=IntRange(1, 16, label="elementwise ops in the chain"),
    dtype=Choice(ew.DTYPES, label="dtype"),
    launch=Choice(ew.LAUNCH_MODES, label="launch"),
)
def fusion_view(gpu: str, n: int, ops: int, dtype: str, launch: str) -> View:
    """N097: a chain of ``ops`` elementwise ops over ``n`` elements, one kernel per op against one
    fused kernel: bytes, launches and modelled time, against the tensor size."""
    c = ew.chain_cost(n, ops, gpu, dtype, launch)
    cross = ew.launch_crossover_elements(gpu, dtype, launch)
    curves = fusion_curves(gpu, ops, dtype, launch)
    labels = {"unfused": f"unfused: {ops} kernels, {2 * ops} passes", "fused": "fused: 1 kernel, 2 passes",
              "cross": f"crossover: {fmt_bytes(cross * bytes_per_element(dtype), 'MB')} tensor"}
    fig = _FUSION_FIGURE(curves["unfused"], curves["fused"], curves["unfused_mem"], curves["fused_mem"], cross, labels,
                         (n, c.unfused_s, c.fused_s), f"{ops} elementwise ops on {dtype}, {gpu}, {launch.replace('_', ' ')}")
    regime = ("launch-bound" if n < cross / 3 else "bandwidth-bound" if n > 3 * cross else "near the crossover")
    rows = [
        ("tensor", f"{fmt_int(n)} elements, {fmt_bytes(c.fused.bytes / 2, _unit(c.fused.bytes / 2))}"),
        ("unfused", f"{ops} kernels, {2 * ops} passes: {fmt_bytes(c.bytes_unfused, _unit(c.bytes_unfused))} in "
                    f"{fmt_time(c.unfused_s)}"),
        ("fused", f"1 kernel, 2 passes: {fmt_bytes(c.bytes_fused, _unit(c.bytes_fused))} in {fmt_time(c.fused_s)}"),
        ("speed-up", f"{fmt_ratio(c.speedup)} (saves {fmt_time(c.saved_s)})"),
        ("unfused time not spent on bytes", fmt_pct(c.overhead_share_unfused)),
        ("per-kernel overhead", fmt_time(ew.per_kernel_overhead_s(launch))),
        ("crossover", f"{fmt_int(round(cross))} elements; this size is {regime}"),
    ]
    caption = ("Left of the dashed crossover both times are flat: each kernel costs its launch overhead, so the "
               "fused kernel wins by the launch count; right of it the times grow with the bytes and the fused "
               "kernel wins by the passes it saves (the dotted lines are the bytes alone).")
    return View(f"Fusion: {ops} elementwise ops over {fmt_int(n)} {dtype} elements on {gpu}", rows, fig,
                f"Times: per kernel, fixed cost + max(bytes / (bandwidth x streaming efficiency), FP32 math); kernels "
                f"in sequence with {'a launch gap (CUDA graph)' if launch == 'cuda_graph' else 'the CPU issuing each (eager)'}.",
                values={"unfused_s": c.unfused_s, "fused_s": c.fused_s, "speedup": c.speedup, "crossover": cross,
                        "bytes_unfused": c.bytes_unfused, "bytes_fused": c.bytes_fused},
                caption=caption)


__all__ = ["ALL_GPUS", "FUSION_N", "PCIE_GPUS", "VECTOR_N", "fusion_curves", "fusion_view", "vector_add_view",
           "vector_curves"]
