"""Explorers for the GEMM mainloop questions of the CUDA-kernels section: what TMA and wgmma take off the
threads (I039, ``cuda_kernels.tma_wgmma``) and what Blackwell's tensor memory and CTA pair give back (I040,
``cuda_kernels.hopper_blackwell``). Both call :mod:`lib.kernels.gemm_mainloop` and :mod:`lib.kernels.gemm_tiles`
and keep one persistent figure each, updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import gemm_mainloop as gm
from lib.kernels import gemm_tiles as gt
from lib.kernels.gemm_waves import TILE_SHAPES, parse_tile
from lib.registry import assumptions
from lib.units import KiB, fmt_bytes, fmt_int, fmt_pct, fmt_ratio, sig

ASYNC_GPUS = gm.async_gpus()
"""GPUs with TMA and an asynchronous MMA (compute capability 9.0 and 10.0)."""
HOPPER_GPUS = tuple(k for k in ASYNC_GPUS if gm.mma_unit(k).mma == "wgmma")
BLACKWELL_GPUS = tuple(k for k in ASYNC_GPUS if gm.mma_unit(k).mma == "tcgen05")
PAIR_TILES = tuple(t for t in TILE_SHAPES if parse_tile(t)[0] <= 128)
"""Hopper tiles whose rows a CTA pair can double (a pair's MMA is at most 256 rows)."""
JOBS = ("copies", "address arithmetic", "operand staging (ldmatrix)", "tensor-core instructions", "barriers and waits")
JOB_COLORS = ("#4c72b0", "#8fb0d9", "#dd8452", "#55a868", "#bbbbbb")
MAX_PATHS = 4
STAGE_AXIS = np.arange(1, 9)

# ---- I039: instructions per K tile, by job, for each copy x MMA combination ------------------------------


def _tw_build(fig) -> SimpleNamespace:
    from matplotlib.ticker import MaxNLocator

    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    fig.subplots_adjust(left=0.2, right=0.98, bottom=0.34, top=0.88, wspace=0.35)
    a = SimpleNamespace(ax1=ax1, ax2=ax2, bars=[], totals=[])
    y = np.arange(MAX_PATHS)[::-1]
    for job, color in zip(JOBS, JOB_COLORS, strict=True):
        a.bars.append(ax1.barh(y, np.zeros(MAX_PATHS), height=0.6, color=color, label=job))
    a.totals = [ax1.text(0, yy, "", va="center", fontsize=7) for yy in y]
    ax1.set_yticks(y)
    ax1.set_yticklabels([""] * MAX_PATHS, fontsize=8)
    ax1.set_xlabel("warp instructions per K tile per SM")
    ax1.grid(True, axis="x")
    a.util, = ax2.plot([], [], marker="o", color="#4c72b0", lw=1.5, label="tensor-core busy (pipeline model)")
    a.here, = ax2.plot([], [], "o", color="#d62728", ms=8)
    a.fit = ax2.axvline(1, color="#555555", ls="--", lw=1, label="stages that fit in shared memory")
    ax2.set_xlabel("stages in the ring")
    ax2.set_ylabel("fraction of the compute roof")
    ax2.set_xlim(0.5, STAGE_AXIS[-1] + 0.5)
    ax2.set_ylim(0, 1.08)
    ax2.set_xticks([1, 2, 4, 6, 8])
    ax2.set_yticks([0, 0.5, 1])
    ax2.grid(True)
    ax1.xaxis.set_major_locator(MaxNLocator(4))
    figures.legend(ax1, a.bars, loc="upper center", bbox_to_anchor=(0.55, -0.2), ncol=3, fontsize=6.5, frameon=False)
    figures.legend(ax2, [a.util, a.fit], loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=6.5, frameon=False)
    return a


def _tw_draw(a, names: list[str], parts: np.ndarray, util: np.ndarray, here: tuple[int, float], fit: int,
             title: str) -> None:
    left = np.zeros(MAX_PATHS)
    for j, bars in enumerate(a.bars):
        for i, bar in enumerate(bars):
            w = parts[i, j] if i < len(names) else 0.0
            bar.set_x(left[i])
            bar.set_width(w)
        left += np.array([parts[i, j] if i < len(names) else 0.0 for i in range(MAX_PATHS)])
    top = max(left.max(), 1.0)
    for i, t in enumerate(a.totals):
        t.set_text(fmt_int(left[i]) if i < len(names) else "")
        t.set_position((left[i] + 0.01 * top, MAX_PATHS - 1 - i))
    a.ax1.set_yticklabels([names[i] if i < len(names) else "" for i in range(MAX_PATHS)])
    a.ax1.set_xlim(0, top * 1.18)
    a.util.set_data(STAGE_AXIS, util)
    a.here.set_data([here[0]], [here[1]])
    a.fit.set_xdata([min(fit, STAGE_AXIS[-1] + 0.4)] * 2)
    a.ax1.set_title(title, fontsize=8)


_TW_FIGURE = figures.LiveFigure(7.2, 3.6, _tw_build, _tw_draw)


@explorer(
    "cuda_kernels.tma_wgmma",
    gpu=Choice(ASYNC_GPUS),
    tile=Choice(TILE_SHAPES, label="output tile (tile_m x tile_n)"),
    bk=Choice((32, 64, 128), label="K tile (bk)"),
    consumer_warpgroups=Choice((1, 2), label="consumer warpgroups"),
    stages=IntRange(1, 8, label="pipeline stages"),
)
def tma_wgmma_view(gpu: str, tile: str, bk: int, consumer_warpgroups: int, stages: int) -> View:
    """I039: the warp instructions one K tile costs for each copy x MMA combination, by job, and how many ring
    stages keep the tensor cores busy."""
    tm, tn = parse_tile(tile)
    paths = gm.mainloop_paths(gpu, tm, tn, bk, consumer_warpgroups)
    names = list(paths)
    parts = np.array([[v for v in p.by_job().values()] for p in paths.values()])
    plan = gt.tile_plan(gpu, tm, tn, "bf16", bk, stages, 4 * consumer_warpgroups)
    util = np.array([plan.compute_s / gt.pipeline_step_s(plan.compute_s, plan.load_s, plan.latency_s, int(s))
                     for s in STAGE_AXIS])
    fit = plan.max_stages
    base, best = paths[names[0]], paths[names[-1]]
    fig = _TW_FIGURE(names, parts, util, (stages, util[stages - 1]), fit,
                     f"{gpu}: {tile} tile, bk {bk}, {4 * consumer_warpgroups} MMA warps")
    rows = [(f"{n} (warp instructions per K tile)", fmt_int(p.total)) for n, p in paths.items()]
    rows += [("copies per loading thread: cp.async / TMA", f"{sig(base.copies_per_loader_thread)} (each with "
              f"{sig(base.address / base.copies)} address instructions) / {fmt_int(best.copies)} from one thread"),
             ("per warp: ldmatrix + mma.sync", f"{sig(base.staging_per_warp)} + {sig(base.mma_per_issuer)}"),
             (f"{best.mma} per issuer", sig(best.mma_per_issuer)),
             ("all of it against the chip's own path", fmt_ratio(base.total / best.total)),
             ("operand bytes staged per K tile", fmt_bytes(best.operand_bytes, "KiB")),
             ("stages to hide the L2 latency / that fit", f"{plan.stages_needed} / {fit}"),
             ("tensor cores busy at this ring", fmt_pct(util[stages - 1]))]
    caption = ("Left: the warp instructions each combination spends on one K tile, by job; the big bars are the "
               "per-thread copies with their address arithmetic (what TMA removes) and the per-warp ldmatrix and "
               "mma.sync (what the asynchronous MMA removes). Right: the share of the compute roof a ring of that "
               "many stages sustains against the L2 latency, the red point this ring; the dashed line is the most "
               "stages that fit.")
    return View(f"Mainloop instructions: {tile} on {gpu}", rows, fig,
                f"bf16; {sig(assumptions.value('kernels_mainloop.address_ops_per_copy'))} integer instructions per "
                "16-byte copy (kernels_mainloop.address_ops_per_copy); pipeline at kernels_gemm.l2_latency_ns.",
                values={"base_total": base.total, "best_total": best.total, "stages_needed": float(plan.stages_needed),
                        "max_stages": float(fit), "utilization": float(util[stages - 1])},
                caption=caption)


# ---- I040: the accumulator's home and the shared-memory port, Hopper against Blackwell --------------------


def _stacked_axis(ax, colors: tuple[str, str], labels: tuple[str, str], limit_color: str, limit_label: str,
                  ylabel: str) -> SimpleNamespace:
    """Three stacked bars (lower, upper) against a dashed limit line, with its legend under the axis."""
    from matplotlib.ticker import MaxNLocator

    x = np.arange(3)
    s = SimpleNamespace(ax=ax)
    s.lower = ax.bar(x, np.zeros(3), width=0.6, color=colors[0], label=labels[0])
    s.upper = ax.bar(x, np.zeros(3), width=0.6, color=colors[1], label=labels[1])
    s.limit = ax.axhline(0.0, color=limit_color, ls="--", lw=1, label=limit_label)
    ax.set_xticks(x)
    ax.set_xticklabels(["", "", ""], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y")
    ax.yaxis.set_major_locator(MaxNLocator(4))
    figures.legend(ax, [s.lower, s.upper, s.limit], loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=6.5,
                   frameon=False)
    return s


def _draw_stacked(s, labels: list[str], lower: list[float], upper: list[float], limit: float) -> None:
    for i, (lo, up) in enumerate(zip(lower, upper, strict=True)):
        s.lower[i].set_height(lo)
        s.upper[i].set_y(lo)
        s.upper[i].set_height(up)
    s.limit.set_ydata([limit] * 2)
    s.ax.set_xticklabels(labels)
    s.ax.set_ylim(0, max(limit, max(lo + up for lo, up in zip(lower, upper, strict=True))) * 1.15)


def _hb_build(fig) -> SimpleNamespace:
    ax1, ax2 = fig.subplots(1, 2)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.38, top=0.86, wspace=0.4)
    acc = _stacked_axis(ax1, ("#dd8452", "#55a868"), ("accumulator in registers", "accumulator in tensor memory"),
                        "#555555", "register file (and tensor memory): 256 KiB", "KiB per SM")
    smem = _stacked_axis(ax2, ("#4c72b0", "#8fb0d9"), ("MMA operand reads", "TMA writes"), "#d62728",
                         "shared memory: 128 B per clock", "bytes per clock per SM at peak")
    return SimpleNamespace(acc=acc, smem=smem)


def _hb_draw(a, labels: list[str], acc_kib: list[tuple[float, float]], rf_kib: float, reads: list[float],
             fills: list[float], port: float, title: str) -> None:
    _draw_stacked(a.acc, labels, [r for r, _ in acc_kib], [t for _, t in acc_kib], rf_kib)
    _draw_stacked(a.smem, labels, reads, fills, port)
    a.acc.ax.set_title(title, fontsize=8)


_HB_FIGURE = figures.LiveFigure(7.2, 3.6, _hb_build, _hb_draw)


@explorer(
    "cuda_kernels.hopper_blackwell",
    hopper=Choice(HOPPER_GPUS),
    blackwell=Choice(BLACKWELL_GPUS),
    tile=Choice(PAIR_TILES, label="Hopper tile (tile_m x tile_n)"),
    dtype=Choice(("bf16", "fp8"), label="operand dtype"),
)
def hopper_blackwell_view(hopper: str, blackwell: str, tile: str, dtype: str) -> View:
    """I040: where the accumulator lives and how many shared-memory bytes per clock each mainloop needs, for a
    Hopper tile, the same tile on one Blackwell SM, and the CTA pair that doubles its rows."""
    cfg = gm.generation_configs(hopper, blackwell, *parse_tile(tile), dtype)
    labels = [f"{n}\n{c.tile_m}x{c.tile_n}" for n, c in cfg.items()]
    acc = [((c.acc.bytes if c.acc.home == "registers" else 0.0) / KiB,
            (c.acc.bytes if c.acc.home == "tensor memory" else 0.0) / KiB) for c in cfg.values()]
    reads = [c.port.reads_per_clock for c in cfg.values()]
    fills = [c.port.fill_per_clock for c in cfg.values()]
    port = cfg["Hopper"].port.port_bytes_per_clock
    rf = cfg["Hopper"].acc.register_file_bytes / KiB
    fig = _HB_FIGURE(labels, acc, rf, reads, fills, port, f"{tile} on {hopper} against {blackwell}, {dtype}")
    h, one, pair = cfg.values()
    rows = [(f"{n}: accumulator", f"{fmt_bytes(c.acc.bytes, 'KiB')} in {c.acc.home} ({fmt_pct(c.acc.share)} of it)")
            for n, c in cfg.items()]
    rows += [(f"{n}: shared memory per clock", f"{sig(c.port.reads_per_clock)} B reads + {sig(c.port.fill_per_clock)} B "
              f"TMA writes of {c.port.port_bytes_per_clock} ({fmt_pct(c.port.total_share)})") for n, c in cfg.items()]
    rows += [(f"{n}: stage / stages that fit", f"{fmt_bytes(c.stage_bytes, 'KiB')} / {c.stages}") for n, c in cfg.items()]
    rows += [("registers given back by tensor memory", fmt_bytes(one.acc.registers_freed_bytes, "KiB")),
             ("stage bytes the pair saves per SM", fmt_bytes(one.stage_bytes - pair.stage_bytes, "KiB"))]
    caption = ("Left: the accumulator's bytes per SM, orange in the register file (dashed: its 256 KiB), green in "
               "tensor memory. Right: the shared-memory bytes each SM must move per clock to keep its tensor cores "
               "at peak, operand reads plus TMA writes, against the 128 bytes its banks serve.")
    return View(f"Hopper to Blackwell: {tile}, {dtype}", rows, fig,
                "Reads: each MMA instruction reads its A and B slices once (kernels_mainloop.operand_reads_per_"
                "instruction); one CTA per SM; bk is one 128-byte swizzle row.",
                values={"hopper_share": h.port.total_share, "one_sm_share": one.port.total_share,
                        "pair_share": pair.port.total_share, "freed_bytes": one.acc.registers_freed_bytes},
                caption=caption)


__all__ = ["ASYNC_GPUS", "BLACKWELL_GPUS", "HOPPER_GPUS", "JOBS", "PAIR_TILES", "hopper_blackwell_view",
           "tma_wgmma_view"]
