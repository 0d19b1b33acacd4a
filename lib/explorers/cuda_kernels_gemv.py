"""Explorer for the decode GEMV's bytes in flight (I035) in the CUDA-kernels section.

``cuda_kernels.gemv_bytes_in_flight`` calls :func:`lib.kernels.latency_hiding.gemv` and
:func:`~lib.kernels.latency_hiding.gemv_places` for one weight GEMM of a model
(:func:`lib.kernels.gemm_waves.projection_nk`): the bytes in flight per SM against Little's law,
the bandwidth they draw, and which of the three places bites. One persistent figure, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.explorers.cuda_kernels_occupancy import GEMM_MODELS, NVIDIA_GPUS
from lib.kernels import gemm_waves as gw
from lib.kernels import latency_hiding as lh
from lib.units import KiB, fmt_bandwidth, fmt_bytes, fmt_pct, fmt_ratio, fmt_time, sig

BYTES_AXIS = np.geomspace(256, 256 * KiB, 200)
"""Bytes in flight per SM the figure's model curve spans: 256 B to 256 KiB."""
PLACES = ("rows", "batch", "loads", "time")
BITES = {"rows": 1.05, "batch": 1.05, "loads": 1.05, "time": 1.25}
"""A place bites when fixing it would make the kernel this much faster (the fixed cost: a fifth of the time)."""


def measured_curve(gpu: str) -> tuple[np.ndarray, np.ndarray]:
    """(bytes in flight per SM, read bandwidth) of the streaming-read measurement on ``gpu``
    (data/measured-<gpu>.yaml, ``bytes_in_flight.rows``); two empty arrays where none was measured."""
    from lib.registry.measured import measured, measured_gpus

    if gpu not in measured_gpus():
        return np.array([]), np.array([])
    rows = measured("bytes_in_flight.rows", gpu)
    return (np.array([r["bytes_in_flight_per_sm"] for r in rows], float),
            np.array([r["read_GBps"] for r in rows], float) * 1e9)


def place_costs(kernel: lh.Gemv) -> dict[str, float]:
    """How much slower each place makes this kernel (1.0: it costs nothing): ``rows``, ``batch``,
    ``loads`` from :func:`lib.kernels.latency_hiding.gemv_places`; ``time``: the kernel against its
    memory-or-compute time alone (the fixed cost's share)."""
    fixes = lh.gemv_places(kernel)
    costs = {name: fixes[name][1] for name in ("rows", "batch", "loads")}
    costs["time"] = kernel.time_s / (kernel.time_s - kernel.fixed_s)
    return costs


def places_phrase(kernel: lh.Gemv) -> str:
    """One sentence: which of the three places bite this kernel, the costliest first."""
    costs = place_costs(kernel)
    fixes = lh.gemv_places(kernel)
    said = {
        "rows": lambda c: (f"too few rows: {kernel.grid_blocks:,} blocks for {kernel.slots:,} slots "
                           f"({sig(kernel.warps_per_sm)} warps with work per SM); "
                           f"{fixes['rows'][0].threads_per_row} threads per row would be {fmt_ratio(c)} faster"),
        "batch": lambda c: (f"the batch: {kernel.batch} sequences cost {fmt_ratio(c)} against batch 1 "
                            f"({kernel.occupancy.blocks_per_sm} block{'s' if kernel.occupancy.blocks_per_sm != 1 else ''} "
                            f"per SM, {' and '.join(kernel.occupancy.binding)} binding"
                            + (f", and its {kernel.bound} take longer than the memory)" if kernel.bound in ("x reads", "FMA")
                               else ")")),
        "loads": lambda c: (f"too few bytes per thread ({kernel.loads_in_flight} x {kernel.bytes_per_load} B in "
                            f"flight): 16-byte loads, 4 in flight, would be {fmt_ratio(c)} faster"),
        "time": lambda c: (f"a short kernel: the fixed {fmt_time(kernel.fixed_s)} is "
                           f"{fmt_pct(kernel.fixed_s / kernel.time_s)} of its {fmt_time(kernel.time_s)}"),
    }
    biting = sorted((p for p in PLACES if costs[p] >= BITES[p]), key=lambda p: -costs[p])
    if not biting:
        return "None bites: the kernel keeps enough bytes in flight and streams long enough to hide its fixed cost."
    return "Bites: " + "; ".join(said[p](costs[p]) for p in biting) + "."


# ---- the figure ---------------------------------------------------------------------------------------------


def _build(fig) -> SimpleNamespace:
    from matplotlib.ticker import NullLocator

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.3, top=0.9)
    a = SimpleNamespace(ax=ax)
    a.model, = ax.plot([], [], color="#1f77b4", lw=1.8, label="Little's law: min(plateau, SMs x B / L)")
    a.need = ax.axvline(1.0, color="#7f7f7f", ls="--", lw=1.1, label="bytes needed per SM")
    a.measured, = ax.plot([], [], "s", color="#2ca02c", ms=4, label="H200 measured (streaming read)")
    a.here, = ax.plot([], [], "o", color="#d62728", ms=8, label="this GEMV")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes in flight per SM")
    ax.set_ylabel("HBM read bandwidth (TB/s)")
    ax.set_xlim(BYTES_AXIS[0], BYTES_AXIS[-1])
    ticks = [256, 1024, 4096, 16384, 65536, 262144]
    ax.set_xticks(ticks)
    ax.set_xticklabels(["256 B", "1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB"])
    ax.xaxis.set_minor_locator(NullLocator())  # minor ticks of a log axis cost a third of every redraw
    ax.grid(True)
    return a


def _draw(a, model_tbs: np.ndarray, need: float, measured: tuple[np.ndarray, np.ndarray], here: tuple[float, float],
          top: float, title: str) -> None:
    a.model.set_data(BYTES_AXIS, model_tbs)
    a.need.set_xdata([need, need])
    a.measured.set_data(*measured)
    a.measured.set_visible(measured[0].size > 0)
    a.here.set_data([here[0]], [here[1]])
    a.ax.set_ylim(0, top * 1.12)
    a.ax.set_title(title, fontsize=8)
    shown = [a.model, a.need, a.here] + ([a.measured] if measured[0].size else [])
    figures.legend(a.ax, shown, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, fontsize=7, frameon=False)


_FIGURE = figures.LiveFigure(6.2, 3.8, _build, _draw)


@explorer(
    "cuda_kernels.gemv_bytes_in_flight",
    model=Choice(GEMM_MODELS),
    projection=Choice(gw.PROJECTIONS, label="weight GEMM"),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    gpu=Choice(NVIDIA_GPUS),
    batch=IntRange(1, 64, log=True, label="batch (sequences)"),
    threads_per_row=Choice(lh.GEMV_THREADS_PER_ROW, label="threads per row"),
    bytes_per_load=Choice(lh.LOAD_WIDTHS, label="bytes per load"),
    unroll=IntRange(1, 16, label="loads in flight per thread"),
)
def gemv_view(model: str, projection: str, tp: int, gpu: str, batch: int, threads_per_row: int, bytes_per_load: int,
              unroll: int) -> View:
    """I035: one decode GEMV's bytes in flight per SM against what Little's law asks, the bandwidth
    and time that follow, and which of the three places (rows and batch, bytes per thread, a short
    kernel) costs it."""
    n, k = gw.projection_nk(model, projection, tp)
    g = lh.gemv(gpu, n, k, batch, threads_per_row, bytes_per_load, unroll)
    costs = place_costs(g)
    curve = lh.littles_law_bandwidth(BYTES_AXIS, g.sms, g.latency_s, g.plateau)
    meas = measured_curve(gpu)
    top = max(g.plateau, float(meas[1].max()) if meas[1].size else 0.0)
    fig = _FIGURE(curve / 1e12, g.bytes_needed, (meas[0], meas[1] / 1e12),
                  (min(max(g.bytes_in_flight, BYTES_AXIS[0]), BYTES_AXIS[-1]), g.streaming_bandwidth / 1e12),
                  top / 1e12,
                  f"{model} {projection} at TP {tp}: W {n:,} x {k:,}, batch {batch}, on {gpu}")
    occ = g.occupancy
    rows = [("GEMV (N x K), weights", f"{n:,} x {k:,}, {fmt_bytes(g.weight_bytes, 'MiB')}"),
            ("blocks / resident slots", f"{g.grid_blocks:,} / {g.slots:,} ({g.rows_per_block} rows per block, "
                                        f"{g.waves} wave{'s' if g.waves != 1 else ''})"),
            ("registers, shared memory per block", f"{g.registers_per_thread}, {fmt_bytes(g.smem_per_block_bytes, 'KiB')}"),
            ("blocks per SM (binds)", f"{occ.blocks_per_sm} ({' and '.join(occ.binding)})"),
            ("warps with work per SM", sig(g.warps_per_sm)),
            ("loads per thread (in its row) / in flight", f"{g.loads_per_thread:,} / {g.loads_in_flight} x "
                                                         f"{g.bytes_per_load} B"),
            ("bytes in flight per SM", fmt_bytes(g.bytes_in_flight, "KB")),
            ("needed (plateau / SMs x L)", fmt_bytes(g.bytes_needed, "KB")),
            ("streaming bandwidth", f"{fmt_bandwidth(g.streaming_bandwidth)} of {fmt_bandwidth(g.plateau)}"),
            ("memory / x reads / FMA", f"{fmt_time(g.memory_s)} / "
                                       + (f"{fmt_time(g.x_read_s)} ({g.x_read_wavefronts}-way)" if g.x_read_s is not None
                                          else "not priced (no SM clock in data/hardware.yaml)")
                                       + f" / {fmt_time(g.fma_s)}"),
            ("kernel time (fixed + the slowest)", f"{fmt_time(g.time_s)} ({g.bound}-bound)"),
            ("1. rows: fix gains", fmt_ratio(costs["rows"])),
            ("1. batch: costs vs batch 1", fmt_ratio(costs["batch"])),
            ("2. bytes per thread: fix gains", fmt_ratio(costs["loads"])),
            ("3. fixed cost share", fmt_pct(g.fixed_s / g.time_s))]
    caption = (f"The blue line is the bandwidth Little's law gives for each number of bytes in flight per SM "
               f"(at {sig(g.latency_s * 1e9)} ns); the dashed line is the {fmt_bytes(g.bytes_needed, 'KB')} that "
               f"reach the plateau; the red point, this GEMV, sits at {fmt_bytes(g.bytes_in_flight, 'KB')}"
               + (" with the H200's measured streaming read in green." if meas[0].size else "."))
    return View(f"Decode GEMV: {model} {projection}, batch {batch}, on {gpu}", rows, fig, places_phrase(g),
                values={"bytes_in_flight": g.bytes_in_flight, "bytes_needed": g.bytes_needed,
                        "bandwidth": g.streaming_bandwidth, "time_s": g.time_s, "memory_s": g.memory_s,
                        "warps_per_sm": g.warps_per_sm, **{f"cost_{p}": costs[p] for p in PLACES}},
                caption=caption)


__all__ = ["BITES", "BYTES_AXIS", "PLACES", "gemv_view", "measured_curve", "place_costs", "places_phrase"]
