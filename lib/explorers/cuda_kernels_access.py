"""Explorers for a warp's memory accesses in the CUDA-kernels section: coalescing into 32-byte sectors
(N094, ``cuda_kernels.coalescing``) and shared-memory bank conflicts (N096,
``cuda_kernels.bank_conflicts``). Both call :mod:`lib.kernels.access` only; each keeps one
persistent figure of the 32 lanes (lanes to sectors, lanes to banks) updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import access as ac
from lib.perf.roofline import roofline_time
from lib.registry import hardware
from lib.units import GB, fmt_pct, fmt_ratio, fmt_time

NVIDIA_GPUS = tuple(k for k in hardware.gpu_names() if hardware.gpu(k).compute_capability is not None)
"""GPUs whose memory granules data/hardware.yaml has (per compute capability)."""
GLOBAL_PATTERNS = ("strided", "random gather")
STREAM_BYTES = 1 * GB  # the useful bytes of the bandwidth-bound kernel the coalescing view prices


def global_trace(pattern: str, stride: int, offset: int, width: int, active_lanes: int, gpu: str = "h100-sxm"):
    """(addresses, mask) of the coalescing explorer's warp: ``strided``: lane l at offset + l x stride x
    width (stride 1: contiguous, 0: broadcast, the row pitch of a matrix: its column walk);
    ``random gather``: random elements of a 1 GiB array (seed = stride), shifted by offset."""
    g = ac.granules(gpu)
    if pattern == "strided":
        a = ac.strided(stride, width, offset, g)
    elif pattern == "random gather":
        a = ac.random_gather(2**30 // width, width, stride, g) + offset
    else:
        raise ValueError(f"pattern must be one of {', '.join(GLOBAL_PATTERNS)}, got {pattern!r}")
    return a, ac.lane_mask(active_lanes, g)


# ---- N094: lanes to sectors ------------------------------------------------------------------------------


def _bar_segments(values) -> tuple[np.ndarray, np.ndarray]:
    """x, y of horizontal bars 0..values[i] at height i as one polyline (NaN between bars): one artist
    draws them all, far cheaper than a bar container."""
    n = len(values)
    x = np.full(3 * n, np.nan)
    y = np.full(3 * n, np.nan)
    x[0::3], x[1::3] = 0.0, values
    y[0::3] = y[1::3] = np.arange(n)
    return x, y


def _two_panels(fig, ylabel: str, bar_label: str, bar_color: str, bar_xlabel: str) -> SimpleNamespace:
    from matplotlib.ticker import MaxNLocator

    ax, bx = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1.2]})
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.9, wspace=0.06)
    a = SimpleNamespace(ax=ax, bx=bx)
    a.bars, = bx.plot([], [], "-", color=bar_color, lw=4, solid_capstyle="butt", label=bar_label)
    ax.set_xlabel("lane")
    ax.set_ylabel(ylabel)
    ax.set_xlim(-1, 32)
    ax.set_xticks([0, 8, 16, 24, 31])
    ax.yaxis.set_major_locator(MaxNLocator(8, integer=True))
    bx.set_xlabel(bar_xlabel)
    bx.xaxis.set_major_locator(MaxNLocator(3, integer=True))
    ax.grid(True)
    return a


def _sector_build(fig) -> SimpleNamespace:
    a = _two_panels(fig, "sector touched (numbered in address order)", "bytes asked for, of 32", "#2ca02c",
                    "bytes used")
    a.first, = a.ax.plot([], [], "o", color="#1f77b4", ms=5, label="sector of a lane's first byte")
    a.second, = a.ax.plot([], [], "s", color="#d62728", ms=5, mfc="none", label="second sector (range straddles)")
    a.idle, = a.ax.plot([], [], "x", color="grey", ms=5, label="inactive lane")
    a.bx.set_xlim(0, 33)
    return a


def _sector_draw(a, lanes, first_rank, second_lanes, second_rank, idle_lanes, used, title) -> None:
    n = len(used)
    a.first.set_data(lanes, first_rank)
    a.second.set_data(second_lanes, second_rank)
    a.second.set_visible(len(second_lanes) > 0)
    a.idle.set_data(idle_lanes, np.full(len(idle_lanes), -0.8))
    a.idle.set_visible(len(idle_lanes) > 0)
    a.bars.set_data(*_bar_segments(used))
    a.ax.set_ylim(max(n, 4) - 0.4, -1.4)  # sector 0 at the top
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [a.first, a.second, a.idle, a.bars], loc="upper center", bbox_to_anchor=(0.62, -0.16),
                   ncol=2, fontsize=7, frameon=False)


_SECTOR_FIGURE = figures.LiveFigure(6.2, 4.0, _sector_build, _sector_draw)


def sector_figure(w: ac.WarpAccess, title: str):
    """The lanes-to-sectors drawing of one warp access (the explorer's and the notebook's figure)."""
    rank = {int(s): i for i, s in enumerate(w.sectors)}
    lanes = np.flatnonzero(w.active)
    first_rank = [rank[int(w.first_sector[lane])] for lane in lanes]
    straddle = lanes[w.last_sector[lanes] != w.first_sector[lanes]]
    second_rank = [rank[int(w.last_sector[lane])] for lane in straddle]
    return _SECTOR_FIGURE(lanes, first_rank, straddle, second_rank, np.flatnonzero(~w.active),
                          w.sector_used_bytes.tolist(), title)


SECTOR_CAPTION = ("Each dot is a lane placed on the 32-byte sector its bytes fall in (a hollow square: the second "
                  "sector of a range that straddles a boundary); the green bars show how many of each sector's "
                  "32 bytes the warp asked for. A coalesced warp stacks its lanes on a few full bars; a strided one "
                  "gives each lane its own nearly empty sector.")


@explorer(
    "cuda_kernels.coalescing",
    gpu=Choice(NVIDIA_GPUS),
    pattern=Choice(GLOBAL_PATTERNS, label="pattern"),
    stride=IntRange(0, 64, label="stride (elements; the seed for a gather)"),
    offset=IntRange(0, 127, label="offset from a 128-byte line (bytes)"),
    width=Choice(ac.WIDTHS, label="bytes per lane"),
    active_lanes=IntRange(1, 32, label="active lanes"),
)
def coalescing_view(gpu: str, pattern: str, stride: int, offset: int, width: int, active_lanes: int) -> View:
    """N094: the sectors one warp instruction costs, its efficiency, and what that does to a
    bandwidth-bound kernel that moves 1 GB of useful bytes this way."""
    a, mask = global_trace(pattern, stride, offset, width, active_lanes, gpu)
    w = ac.warp_access(a, width, mask, gpu)
    kind = ac.access_pattern(a, width, mask, gpu)
    ideal_t = roofline_time(0, STREAM_BYTES, gpu).memory_s
    this_t = roofline_time(0, STREAM_BYTES / w.efficiency, gpu).memory_s
    rows = [("pattern (address-delta test)", str(kind)),
            ("sectors per request", f"{w.n_sectors} (ideal {w.ideal_sectors}; {w.excess_sectors} excess)"),
            ("128-byte lines", f"{w.n_lines}"),
            ("bytes asked for / moved", f"{w.requested_bytes:,} / {w.moved_bytes:,}"),
            ("efficiency", fmt_pct(w.efficiency)),
            ("1 GB of useful bytes this way", f"{fmt_time(this_t)} vs {fmt_time(ideal_t)} coalesced "
                                               f"({fmt_ratio(this_t / ideal_t)}), if no sector is reused from cache")]
    fig = sector_figure(w, f"{gpu}: {active_lanes} lanes x {width} B, {kind}, offset {offset} B")
    return View(f"Coalescing: {w.n_sectors} sectors, {fmt_pct(w.efficiency)} efficient", rows, fig,
                "Nsight Compute: sectors / requests = l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum / "
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum.",
                values={"sectors": float(w.n_sectors), "efficiency": w.efficiency, "lines": float(w.n_lines),
                        "requested": float(w.requested_bytes), "time_ratio": this_t / ideal_t},
                caption=SECTOR_CAPTION)


# ---- N096: lanes to banks --------------------------------------------------------------------------------


def _bank_build(fig) -> SimpleNamespace:
    a = _two_panels(fig, "shared-memory bank", "distinct words the bank serves (worst phase)", "#d62728", "words")
    a.lanes, = a.ax.plot([], [], "o", color="#1f77b4", ms=5, label="bank of a lane's (first) word")
    a.idle, = a.ax.plot([], [], "x", color="grey", ms=5, label="inactive lane")
    a.ax.set_ylim(32, -1.6)
    return a


def _bank_draw(a, lanes, banks, idle_lanes, words, title) -> None:
    a.lanes.set_data(lanes, banks)
    a.idle.set_data(idle_lanes, np.full(len(idle_lanes), -1.0))
    a.idle.set_visible(len(idle_lanes) > 0)
    a.bars.set_data(*_bar_segments(words))
    a.bx.set_xlim(0, max(2, max(words)) * 1.08)
    a.ax.set_title(title, fontsize=8)
    figures.legend(a.ax, [a.lanes, a.idle, a.bars], loc="upper center", bbox_to_anchor=(0.62, -0.16),
                   ncol=2, fontsize=7, frameon=False)


_BANK_FIGURE = figures.LiveFigure(6.2, 4.2, _bank_build, _bank_draw)


def bank_figure(s: ac.SharedAccess, title: str):
    """The lanes-to-banks drawing of one shared-memory access (the explorer's and the notebook's figure)."""
    lanes = np.flatnonzero(s.active)
    return _BANK_FIGURE(lanes, s.banks[lanes], np.flatnonzero(~s.active), s.bank_words.max(axis=0).tolist(), title)


BANK_CAPTION = ("Each dot is a lane placed on the bank of the word it reads; the red bars count the distinct words "
                "each bank must serve, one per wavefront, so the longest bar is the access's cost. A column walk "
                "down an unpadded 32-wide tile piles every lane on one bank; one column of padding spreads them "
                "over all 32.")


@explorer(
    "cuda_kernels.bank_conflicts",
    gpu=Choice(NVIDIA_GPUS),
    tile_cols=IntRange(1, 128, label="tile width (elements per row)"),
    pad=IntRange(0, 8, label="padding (elements per row)"),
    walk=Choice(("column", "row"), label="the warp reads a"),
    width=Choice(ac.WIDTHS, label="bytes per element"),
    active_lanes=IntRange(1, 32, label="active lanes"),
)
def bank_conflicts_view(gpu: str, tile_cols: int, pad: int, walk: str, width: int, active_lanes: int) -> View:
    """N096: the banks a warp's reads of a row-major shared-memory tile hit, and the wavefronts they cost."""
    g = ac.granules(gpu)
    a, inside = ac.tile_walk(tile_cols, pad, walk, 0, width, chip=g)
    s = ac.shared_access(a, width, inside & ac.lane_mask(active_lanes, g), g)
    pitch = (tile_cols + pad) * width
    rows = [("row pitch", f"{tile_cols + pad} elements = {pitch:,} B ({pitch // g.bank_width_bytes if pitch % g.bank_width_bytes == 0 else pitch / g.bank_width_bytes:g} words)"),
            ("lanes per phase", f"{s.lanes_per_phase} ({s.phases} phase{'s' if s.phases > 1 else ''})"),
            ("banks hit", f"{len(set(s.banks[s.active].tolist()))} of {g.banks}"),
            ("worst bank", f"{s.way}-way"),
            ("wavefronts", f"{s.wavefronts} (minimum {s.ideal_wavefronts})"),
            ("bank conflicts (Nsight, per instruction)", f"{s.conflicts}"),
            ("padding costs", f"{32 * pad * width:,} B for a 32-row tile")]
    fig = bank_figure(s, f"{gpu}: tile[32][{tile_cols} + {pad}] of {width}-byte elements, a {walk} walk")
    return View(f"Bank conflicts: {s.wavefronts} wavefront{'s' if s.wavefronts != 1 else ''}", rows, fig,
                "Nsight Compute: l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum (wavefronts above the "
                "minimum) and l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum.",
                values={"wavefronts": float(s.wavefronts), "conflicts": float(s.conflicts), "way": float(s.way)},
                caption=BANK_CAPTION)


__all__ = ["BANK_CAPTION", "GLOBAL_PATTERNS", "NVIDIA_GPUS", "SECTOR_CAPTION", "bank_conflicts_view", "bank_figure",
           "coalescing_view", "global_trace", "sector_figure"]
