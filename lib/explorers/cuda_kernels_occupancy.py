"""Explorers for occupancy (N100) and wave quantization (I037) in the CUDA-kernels section.

``cuda_kernels.occupancy`` calls :func:`lib.kernels.sm.occupancy` and
:mod:`lib.kernels.latency_hiding`; ``cuda_kernels.wave_quantization`` calls
:mod:`lib.kernels.gemm_waves`. Each keeps one persistent figure updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import gemm_waves as gw
from lib.kernels import latency_hiding as lh
from lib.kernels.sm import occupancy, register_cap, sm_limits
from lib.registry import hardware, models
from lib.units import KiB, fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

NVIDIA_GPUS = tuple(k for k in hardware.gpu_names() if hardware.gpu(k).compute_capability is not None)
"""GPUs whose per-SM limits data/hardware.yaml has (the occupancy arithmetic is NVIDIA's)."""
ALL_GPUS = tuple(hardware.gpu_names())
GEMM_MODELS = tuple(k for k in models.model_names() if not (models.model(k).is_moe or models.model(k).is_mla))
"""Models whose per-layer weight GEMMs lib.perf.decode_kernels.gemm_shapes lists (dense GQA/MHA)."""

# ---- N100: occupancy against registers per thread ---------------------------------------------

REGISTER_AXIS = np.arange(1, 256)


def occupancy_by_registers(gpu: str, threads: int, smem_bytes: int) -> np.ndarray:
    """Theoretical occupancy for every register count 1..255 (the staircase), same launch otherwise."""
    lim = sm_limits(gpu)
    return np.array([occupancy(lim, threads, int(r), smem_bytes).occupancy for r in REGISTER_AXIS])


def _occ_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.9)
    a = SimpleNamespace(ax=ax)
    a.stairs, = ax.step([], [], where="post", color="#1f77b4", lw=1.8, label="theoretical occupancy")
    a.bw, = ax.step([], [], where="post", color="#ff7f0e", lw=1.4, ls="--",
                    label="share of HBM bandwidth (Little's law)")
    a.here, = ax.plot([], [], "o", color="#d62728", ms=7, label="this kernel")
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("fraction")
    ax.set_xlim(0, 256)
    ax.set_ylim(0, 1.08)
    ax.set_xticks([0, 32, 64, 96, 128, 160, 192, 224, 255])
    ax.grid(True)
    return a


def _occ_draw(a, occ: np.ndarray, bw: np.ndarray, here: tuple[int, float], bw_label: str, title: str) -> None:
    a.stairs.set_data(REGISTER_AXIS, occ)
    a.bw.set_data(REGISTER_AXIS, bw)
    a.bw.set_label(bw_label)
    a.here.set_data([here[0]], [here[1]])
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [a.stairs, a.bw, a.here], loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                   fontsize=7, frameon=False)


_OCC_FIGURE = figures.LiveFigure(6.2, 3.6, _occ_build, _occ_draw)


def limiter_rows(occ) -> list[tuple[str, str]]:
    """Nsight Compute's 'Block Limit' rows: the blocks each resource allows, the binding ones marked."""
    names = {"registers": "Block Limit Registers", "shared memory": "Block Limit Shared Mem",
             "warps": "Block Limit Warps", "blocks": "Block Limit SM"}
    binding = set(occ.binding)
    return [(names[k], f"{v:,} block{'s' if v != 1 else ''}" + ("  <- binds" if k in binding else ""))
            for k, v in occ.blocks_by.items()]


@explorer(
    "cuda_kernels.occupancy",
    gpu=Choice(NVIDIA_GPUS),
    threads=IntRange(32, 1024, log=True, label="threads per block"),
    registers=IntRange(16, 255, label="registers per thread"),
    smem_kib=IntRange(0, 227, label="shared memory per block (KiB)"),
    loads_in_flight=IntRange(1, 16, label="independent loads in flight per thread"),
    bytes_per_load=Choice(lh.LOAD_WIDTHS, label="bytes per load"),
)
def occupancy_view(gpu: str, threads: int, registers: int, smem_kib: int, loads_in_flight: int,
                   bytes_per_load: int) -> View:
    """N100: resident blocks and warps per SM, the limit that binds, and whether the warps keep
    enough bytes in flight for the HBM bandwidth (Little's law)."""
    smem = smem_kib * int(KiB)
    loop = lh.streaming_loop(gpu, threads, registers, smem, loads_in_flight, bytes_per_load)
    occ = loop.occupancy
    lim = sm_limits(gpu)
    if occ.blocks_per_sm == 0:  # only the registers can refuse a block here (sm.occupancy checks the rest)
        most = register_cap(gpu, threads, 1, smem)
        raise ValueError(f"{threads} threads x {registers} registers do not fit one block on a {gpu} SM (its "
                         f"{lim.registers_per_sm:,} registers): the launch fails; at {threads} threads per block use "
                         f"at most {most} registers per thread")
    stairs = occupancy_by_registers(gpu, threads, smem)
    per_warp = lim.warp_size * loads_in_flight * bytes_per_load
    bw = np.minimum(1.0, stairs * lim.max_warps_per_sm * per_warp / loop.bytes_needed)
    fig = _OCC_FIGURE(stairs, bw, (registers, occ.occupancy),
                      f"share of HBM bandwidth at {loads_in_flight} x {bytes_per_load} B in flight per thread",
                      f"{gpu}: {threads} threads, {smem_kib} KiB shared memory per block")
    rows = [("warps per block", fmt_int(occ.warps_per_block)),
            ("registers per warp (allocated)", f"{occ.registers_per_warp:,} (of {lim.registers_per_sm:,} per SM)"),
            *limiter_rows(occ),
            ("resident blocks / warps per SM", f"{occ.blocks_per_sm:,} / {occ.warps_per_sm:,} of {lim.max_warps_per_sm}"),
            ("theoretical occupancy", fmt_pct(occ.occupancy)),
            ("bytes in flight per SM", fmt_bytes(loop.bytes_in_flight, "KB")),
            ("needed (Little's law)", fmt_bytes(loop.bytes_needed, "KB")),
            ("share of HBM bandwidth", fmt_pct(loop.bandwidth_fraction))]
    caption = ("The blue staircase is occupancy as the register count grows (each step is one resident block fewer); "
               "the dashed orange line is the share of the memory bandwidth those warps can draw with this many "
               "bytes in flight per thread: where it sits at 1, more occupancy buys nothing.")
    return View(f"Occupancy: {threads} x {registers} registers on {gpu}", rows, fig,
                f"Loaded memory latency {sig(lh.dram_latency_s() * 1e9)} ns (kernels_gemm.dram_latency_ns).",
                values={"blocks": float(occ.blocks_per_sm), "warps": float(occ.warps_per_sm),
                        "occupancy": occ.occupancy, "bandwidth_fraction": loop.bandwidth_fraction,
                        "bytes_in_flight": loop.bytes_in_flight, "bytes_needed": loop.bytes_needed},
                caption=caption)


# ---- I037: wave quantization against the tokens of a prefill batch -----------------------------


def _wave_build(fig) -> SimpleNamespace:
    ax1, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.22, top=0.92, hspace=0.12)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.quant, = ax1.step([], [], where="post", color="#1f77b4", lw=1.6, label="wave-quantized time")
    a.ideal, = ax1.plot([], [], color="black", lw=1.0, ls="--", label="ideal: FLOPs / (peak x efficiency)")
    a.here, = ax1.plot([], [], "o", color="#d62728", ms=6, label="this batch")
    a.eff, = ax2.step([], [], where="post", color="#2ca02c", lw=1.3, label="ideal / quantized")
    a.here2, = ax2.plot([], [], "o", color="#d62728", ms=5)
    ax1.set_ylabel("GEMM time (µs)")
    ax2.set_ylabel("efficiency")
    ax2.set_xlabel("tokens in the prefill batch (M)")
    ax2.set_ylim(0, 1.05)
    ax1.grid(True)
    ax2.grid(True)
    return a


def _wave_draw(a, ms: np.ndarray, quant_us: np.ndarray, ideal_us: np.ndarray, here: tuple[int, float, float],
               title: str) -> None:
    a.quant.set_data(ms, quant_us)
    a.ideal.set_data(ms, ideal_us)
    a.eff.set_data(ms, ideal_us / quant_us)
    a.here.set_data([here[0]], [here[1]])
    a.here2.set_data([here[0]], [here[2]])
    a.ax1.set_xlim(0, ms[-1])
    a.ax1.set_ylim(0, quant_us.max() * 1.08)
    a.ax1.set_title(title, fontsize=8)
    figures.legend(a.ax2, [a.quant, a.ideal, a.eff, a.here], loc="upper center", bbox_to_anchor=(0.5, -0.42),
                   ncol=2, fontsize=7, frameon=False)


_WAVE_FIGURE = figures.LiveFigure(6.4, 4.4, _wave_build, _wave_draw)


def tokens_axis(tokens: int, per_wave: int) -> np.ndarray:
    """The M values the figure draws: 1 .. max(2 x tokens, 3 waves of rows), at most 32,768, about
    1,000 points (every token while that is few enough)."""
    top = min(32768, max(2 * tokens, 3 * per_wave, 512))
    step = max(1, top // 1000)
    return np.arange(1, top + 1, step)


@explorer(
    "cuda_kernels.wave_quantization",
    model=Choice(GEMM_MODELS),
    projection=Choice(gw.PROJECTIONS, label="weight GEMM"),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    tokens=IntRange(1, 32768, label="tokens in the batch (M)"),
    tile=Choice(gw.TILE_SHAPES, label="output tile (tile_m x tile_n)"),
    gpu=Choice(ALL_GPUS),
    dtype=Choice(("bf16", "fp8"), label="matmul dtype"),
)
def wave_quantization_view(model: str, projection: str, tp: int, tokens: int, tile: str, gpu: str,
                           dtype: str) -> View:
    """I037: tiles, waves and the microseconds the partial wave wastes for one weight GEMM of a
    prefill batch, and what each fix (tile shape, split-K, token budget) gets back."""
    n, k = gw.projection_nk(model, projection, tp)
    w = gw.gemm_waves(tokens, n, k, gpu, tile, dtype)
    shapes = gw.tile_shapes(tokens, n, k, gpu, dtype)
    best = min(shapes.values(), key=lambda x: x.time_s)
    split = gw.split_leftover(tokens, n, k, gpu, tile, dtype)
    per_wave = gw.token_budget(n, gpu, tile, 1)
    grow = gw.token_budget(n, gpu, tile, w.waves)
    shrink = gw.token_budget(n, gpu, tile, w.waves - 1) if w.waves > 1 else 0
    ms = tokens_axis(tokens, max(per_wave, w.tile_m))
    quant, ideal = gw.time_vs_tokens(n, k, gpu, tile, dtype, ms)
    fig = _WAVE_FIGURE(ms, quant * 1e6, ideal * 1e6, (tokens, w.time_s * 1e6, w.ideal_s / w.time_s),
                       f"{model} {projection} at TP {tp} (N = {n:,}, K = {k:,}), {tile} tiles on {gpu} "
                       f"({w.slots} SMs)")
    rows = [("GEMM (M x N x K)", f"{tokens:,} x {n:,} x {k:,}"),
            ("tiles", f"{w.rows:,} x {w.cols:,} = {w.tiles:,} on {w.slots:,} SMs ({sig(w.tiles / w.slots)} waves of work)"),
            ("waves", f"{w.waves:,} (last one holds {w.last_wave_tiles:,} tiles)"),
            ("wave efficiency", fmt_pct(w.wave_efficiency)),
            ("one tile / one wave", fmt_time(w.tile_s)),
            ("wave-quantized time", f"{fmt_time(w.time_s)} ({w.bound}-bound)"),
            ("ideal time", fmt_time(w.ideal_s)),
            ("wasted", f"{fmt_time(w.waste_s)} ({fmt_pct(w.waste_s / w.time_s)} of the GEMM)"),
            ("fix 1, best tile shape", f"{best.tile}: {fmt_time(best.time_s)}"),
            ("fix 2, split-K the leftover", f"{split.splits} pieces per tile: {fmt_time(split.time_s)}"
                                            + (f" (fixup {fmt_time(split.fixup_s)})" if split.splits > 1 else "")),
            ("fix 3, tokens that fill the waves",
             f"{grow:,} tokens in {w.waves} wave{'s' if w.waves > 1 else ''}"
             + (f", or {shrink:,} in {w.waves - 1}" if shrink else ""))]
    caption = ("Top: the GEMM's time climbs in steps, one step per extra wave of tiles, while the ideal grows "
               "smoothly; bottom: their ratio is a saw-tooth that drops each time a new, nearly empty wave starts.")
    return View(f"Wave quantization: {model} {projection}, M = {tokens:,}", rows, fig,
                f"One CTA per SM; efficiency {fmt_pct(w.efficiency)} of the dense {dtype} peak for {tile} tiles "
                "(decode_step.matmul_flops_efficiency x kernels_gemm.tile_efficiency).",
                values={"tiles": float(w.tiles), "waves": float(w.waves), "time_s": w.time_s, "ideal_s": w.ideal_s,
                        "waste_s": w.waste_s, "best_tile_s": best.time_s, "split_s": split.time_s,
                        "grow_tokens": float(grow)},
                caption=caption)


__all__ = ["ALL_GPUS", "GEMM_MODELS", "NVIDIA_GPUS", "limiter_rows", "occupancy_by_registers", "occupancy_view",
           "tokens_axis", "wave_quantization_view"]
