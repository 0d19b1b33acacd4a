"""Explorers for the FlashAttention algorithm questions: the softmax IO count (I028), the tiled
recurrence and its causal tile map (I029), and the backward's recomputation (I031)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.attention import softmax_traffic as sft
from lib.attention import traffic as tr
from lib.attention.online_softmax import softmax_io
from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.perf.roofline import roofline_time
from lib.registry import hardware, models
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

GPUS = tuple(hardware.gpu_names())
HEAD_DIMS = (64, 80, 96, 128, 192, 256)
IO_DTYPES = ("fp16", "bf16")
SCORE_DTYPES = ("fp16", "bf16", "fp32")
FA2_TILE = 128  # query and key tile of FlashAttention-2's forward at head_dim 128 (lib.attention.traffic)
IO_LENGTHS = np.unique(np.geomspace(256, 131072, 28).astype(int))

# ---- I028: the softmax IO count, and what it means for one head -------------------------------

_IO_SERIES = (("three_pass", "unfused, 3-pass softmax: 6 N²"),
              ("online", "unfused, online softmax: 5 N²"),
              ("row_on_chip", "unfused, row on chip: 4 N²"),
              ("tiled", "fused, textbook K/V re-reads"),
              ("floor", "fused, Q K V O once"))


def softmax_head_bytes(n: int, head_dim: int, dtype: str, score_dtype: str) -> dict[str, float]:
    """HBM bytes of one head's attention (N queries x N keys) for each kernel of the I028 figure."""
    out = {k: sft.naive_traffic_by_softmax(n, head_dim, k, dtype, score_dtype=score_dtype).total_bytes
           for k in sft.SOFTMAX_KERNELS}
    out["tiled"] = tr.tiled_hbm_bytes(n, head_dim, FA2_TILE, FA2_TILE, dtype)
    out["floor"] = tr.compulsory_traffic(n, head_dim, dtype).total_bytes
    return out


def _io_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax, lines={})
    styles = {"three_pass": "-", "online": "-", "row_on_chip": "-", "tiled": "--", "floor": ":"}
    for key, label in _IO_SERIES:
        a.lines[key], = ax.plot([], [], styles[key], lw=1.4, label=label)
    a.now = ax.axvline(1.0, color="grey", lw=1)
    ax.set_xlabel("sequence length N (queries = keys)")
    ax.set_ylabel("HBM bytes per head")
    return a


def _io_draw(a: SimpleNamespace, lengths, series: dict, n: int) -> None:
    for key, line in a.lines.items():
        line.set_data(lengths, series[key])
    a.now.set_xdata([n, n])
    a.now.set_label(f"N = {n:,}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [*a.lines.values(), a.now], fontsize=6.5, loc="upper left")


_IO_FIGURE = figures.LiveFigure(6.0, 3.4, _io_build, _io_draw)


@explorer(
    "flashattention.softmax_io",
    seq_len=IntRange(16, 131072, log=True, label="sequence length N"),
    head_dim=Choice(HEAD_DIMS, label="head dim d"),
    dtype=Choice(IO_DTYPES, label="Q, K, V, O dtype"),
    score_dtype=Choice(SCORE_DTYPES, label="S and P dtype (unfused)"),
    gpu=Choice(GPUS),
)
def softmax_io_view(seq_len: int, head_dim: int, dtype: str, score_dtype: str, gpu: str) -> View:
    """I028: per-row score accesses of the three softmax methods, and one head's HBM bytes and
    roofline time for unfused attention (each softmax kernel) against the fused kernel."""
    per_len = [softmax_head_bytes(int(n), head_dim, dtype, score_dtype) for n in IO_LENGTHS]
    series = {k: [b[k] for b in per_len] for k, _ in _IO_SERIES}
    here = softmax_head_bytes(seq_len, head_dim, dtype, score_dtype)
    flops = tr.attention_flops(seq_len, head_dim)
    times = {k: roofline_time(flops, b, gpu, "bf16") for k, b in here.items()}
    three, online, fused = (softmax_io(seq_len, m) for m in ("three_pass", "online", "fused_attention"))
    rows = [("score accesses per row: three-pass", f"{three.total:,} ({three.reads:,} reads, {three.writes:,} writes)"),
            ("score accesses per row: online", f"{online.total:,} ({online.reads:,} reads, {online.writes:,} writes)"),
            ("score accesses per row: fused (on chip)", f"{fused.reads:,} reads of registers, {fused.writes} writes")]
    for key, label in _IO_SERIES:
        t = times[key]
        rows.append((label, f"{fmt_bytes(here[key])}, {fmt_time(t.time_s)} ({t.bound}-bound)"))
    rows.append(("speed-up of fused over three-pass", f"{sig(times['three_pass'].time_s / times['tiled'].time_s, 2)}x "
                 f"(textbook) to {sig(times['three_pass'].time_s / times['floor'].time_s, 2)}x (floor)"))
    fig = _IO_FIGURE(IO_LENGTHS, series, seq_len)
    note = ("The three unfused lines are parallel (each is N² times a count of passes) and the fused lines "
            "grow more slowly: the gap at the grey line is the traffic FlashAttention removes. Times are "
            f"roofline bounds on {gpu} (BF16 tensor-core peak, datasheet HBM bandwidth).")
    caption = (f"HBM bytes of one head against N: the three unfused lines differ only in how many times the N x N scores "
               f"cross HBM, and the fused ones (dashed, dotted) never write them. At N = {fmt_int(seq_len)} (grey) the "
               f"fused kernel is {sig(times['three_pass'].time_s / times['tiled'].time_s, 2)}x to "
               f"{sig(times['three_pass'].time_s / times['floor'].time_s, 2)}x faster than the three-pass one.")
    return View(f"One head, N = {seq_len:,}, d = {head_dim}, {dtype} (scores {score_dtype}), {gpu}", rows, fig, note,
                caption=caption,
                values={**here, **{f"{k}_s": t.time_s for k, t in times.items()}})


# ---- I029: the tile map of a causal (or sliding-window) mask ------------------------------------

TILE_SIZES = (16, 32, 64, 128, 256)
MAX_TILES_DRAWN = 128  # tiles per axis the heatmap draws (and lib classifies within the update budget)
_TILE_COLOURS = ("#f2f2f2", "#f28e2b", "#4e79a7")  # SKIP, PARTIAL, FULL
_TILE_NAMES = ("skipped (no allowed key)", "partial (mask applied)", "full (no mask)")


def _tiles_build(fig) -> SimpleNamespace:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.62, bottom=0.14, top=0.93)
    a = SimpleNamespace(ax=ax)
    a.image = ax.imshow(np.zeros((1, 1)), cmap=ListedColormap(_TILE_COLOURS), vmin=-0.5, vmax=2.5,
                        interpolation="nearest", aspect="auto")
    a.patches = [Patch(facecolor=c, edgecolor="#888", label=n) for c, n in zip(_TILE_COLOURS, _TILE_NAMES, strict=True)]
    ax.set_xlabel("key tile j")
    ax.set_ylabel("query tile i")
    return a


def _tiles_draw(a: SimpleNamespace, tiles: np.ndarray, counts: dict) -> None:
    rows, cols = tiles.shape
    a.image.set_data(tiles)
    a.image.set_extent((-0.5, cols - 0.5, rows - 0.5, -0.5))
    a.ax.set_xlim(-0.5, cols - 0.5)
    a.ax.set_ylim(rows - 0.5, -0.5)
    for patch, key, name in zip(a.patches, ("skip", "partial", "full"), _TILE_NAMES, strict=True):
        patch.set_label(f"{name}: {counts[key]:,}")
    a.ax.legend(handles=a.patches, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


_TILES_FIGURE = figures.LiveFigure(6.0, 3.2, _tiles_build, _tiles_draw)


@explorer(
    "flashattention.tile_map",
    seq_len=IntRange(16, 32768, log=True, label="sequence length N"),
    block_q=Choice(TILE_SIZES, label="query tile Br"),
    block_k=Choice(TILE_SIZES, label="key tile Bc"),
    window=IntRange(0, 32768, label="sliding window (0 = none)"),
)
def tile_map_view(seq_len: int, block_q: int, block_k: int, window: int) -> View:
    """I029: which (query tile, key tile) pairs a causal or sliding-window mask lets the kernel skip,
    which need the mask and which run unmasked (lib.attention.tiled.causal_tile_map)."""
    rows, cols = -(-seq_len // block_q), -(-seq_len // block_k)
    if max(rows, cols) > MAX_TILES_DRAWN:
        raise ValueError(f"N = {seq_len:,} makes {rows} x {cols} tiles; the map draws at most {MAX_TILES_DRAWN} "
                         "per axis: raise the tile sizes or shorten N")
    from lib.attention.tiled import causal_tile_map, tile_counts

    tiles = causal_tile_map(seq_len, seq_len, block_q, block_k, window=window or None)
    c = tile_counts(tiles)
    rows_out = [("tiles", f"{rows} x {cols} = {c['total']:,}"),
                ("skipped", f"{c['skip']:,} ({c['skip'] / c['total']:.1%})"),
                ("computed with the mask (partial)", f"{c['partial']:,}"),
                ("computed without the mask (full)", f"{c['full']:,}"),
                ("work done vs dense", f"{c['computed'] / c['total']:.1%} of the tiles")]
    fig = _TILES_FIGURE(tiles, c)
    mask = f"sliding window {window:,}" if window else "causal"
    note = ("Each cell is one Br x Bc tile. Grey tiles are never loaded; orange ones straddle the mask's edge "
            "and are the only ones that pay for masking (and can hold a row with no allowed key, the NaN case); "
            "blue ones run unmasked.")
    caption = (f"Each cell is one Br x Bc tile of the {mask} mask: {c['skip']:,} of {c['total']:,} are skipped (grey), "
               f"{c['partial']:,} pay for masking (orange) and {c['full']:,} run unmasked (blue), so the kernel does "
               f"{fmt_pct(c['computed'] / c['total'])} of the dense work.")
    return View(f"{mask} mask, N = {seq_len:,}, Br = {block_q}, Bc = {block_k}", rows_out, fig, note, caption=caption,
                values={k: float(v) for k, v in c.items()})


# ---- I031: what the backward keeps: the probabilities, or one log-sum-exp per row ---------------

BWD_LENGTHS = np.unique(np.geomspace(512, 1048576, 24).astype(int))
P_DTYPES = ("bf16", "fp16", "fp32", "fp8")


def _bwd_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.probs, = ax.plot([], [], "-", color="#e15759", lw=1.5, label="probabilities P kept (standard)")
    a.lse, = ax.plot([], [], "-", color="#4e79a7", lw=1.5, label="log-sum-exp kept (FlashAttention)")
    a.hbm = ax.axhline(1.0, color="black", ls="--", lw=1)
    a.now = ax.axvline(1.0, color="grey", lw=1)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes kept for backward, one layer")
    return a


def _bwd_draw(a: SimpleNamespace, lengths, probs, lse, hbm: float, gpu_name: str, n: int) -> None:
    a.probs.set_data(lengths, probs)
    a.lse.set_data(lengths, lse)
    a.hbm.set_ydata([hbm, hbm])
    a.hbm.set_label(f"{gpu_name} memory")
    a.now.set_xdata([n, n])
    a.now.set_label(f"N = {n:,}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.probs, a.lse, a.hbm, a.now], fontsize=7, loc="upper left")


_BWD_FIGURE = figures.LiveFigure(6.0, 3.2, _bwd_build, _bwd_draw)


@explorer(
    "flashattention.backward_memory",
    model=Choice(tuple(models.model_names())),
    seq_len=IntRange(512, 1048576, log=True, label="sequence length N"),
    batch=IntRange(1, 64, log=True),
    dtype=Choice(P_DTYPES, label="P stored as"),
    stored_matrices=IntRange(1, 2, label="N x N matrices kept per head (2: P and a dropout mask)"),
    gpu=Choice(GPUS),
)
def backward_memory_view(model: str, seq_len: int, batch: int, dtype: str, stored_matrices: int, gpu: str) -> View:
    """I031: activation bytes one layer keeps for the attention backward, with the probability matrix
    (lib.attention.backward.probabilities_bytes) against one FP32 log-sum-exp per row, and the FLOPs
    recomputation adds (lib.attention.backward.backward_flops)."""
    from lib.attention import backward as bw

    m, g = models.model(model), hardware.gpu(gpu)
    heads = m.num_attention_heads  # P is per query head, whatever the KV heads
    probs = [stored_matrices * bw.probabilities_bytes(batch, heads, int(n), dtype=dtype) for n in BWD_LENGTHS]
    kept_by_flash = [p - bw.backward_memory_saved_bytes(batch, heads, int(n), dtype, stored_matrices=stored_matrices)
                     for p, n in zip(probs, BWD_LENGTHS, strict=True)]  # one FP32 log-sum-exp per row
    p_layer = stored_matrices * bw.probabilities_bytes(batch, heads, seq_len, dtype=dtype)
    saved = bw.backward_memory_saved_bytes(batch, heads, seq_len, dtype, stored_matrices=stored_matrices)
    if m.is_mla:  # backward_flops counts d_qk = d_v; MLA's differ (192 vs 128)
        extra_model, recompute_row = 0.0, "not counted here (MLA: d_qk differs from d_v)"
    else:
        extra = (bw.backward_flops(seq_len, m.head_dim, causal=True)
                 - bw.backward_flops(seq_len, m.head_dim, causal=True, recompute=False))
        extra_model = extra * heads * m.num_layers * batch
        recompute_row = (f"{sig(extra_model / 1e12)} TFLOP = "
                         f"{sig(100 * extra_model / (m.prefill_flops(seq_len) * batch))}% of a forward pass")
    fig = _BWD_FIGURE(BWD_LENGTHS, probs, kept_by_flash, g.memory_bytes, g.name, seq_len)
    rows = [("query heads x layers", f"{heads} x {m.num_layers}"),
            ("P kept, one layer", f"{fmt_bytes(p_layer)} = {fmt_bytes(p_layer, 'GiB')}"),
            ("P kept, all layers", f"{fmt_bytes(p_layer * m.num_layers)} = {fmt_bytes(p_layer * m.num_layers, 'GiB')}"),
            ("log-sum-exp kept, one layer", fmt_bytes(p_layer - saved, "MB")),
            ("saved per layer", fmt_bytes(saved)),
            ("all layers' P vs this GPU's memory", f"{sig(p_layer * m.num_layers / g.memory_bytes)}x"),
            ("recompute adds (one more QK^T per head)", recompute_row)]
    note = ("The red line (one layer's kept probabilities) grows as N², the blue one as N; the dashed line is "
            "the GPU's whole memory. A causal mask does not shrink the red line: the standard backward keeps the "
            "full N x N matrix, zeros included.")
    caption = (f"Bytes one layer keeps for the backward: the probabilities grow as N² (red), one log-sum-exp per row as N "
               f"(blue), against the {g.name}'s memory (dashed). At N = {fmt_int(seq_len)} (grey) the probabilities take "
               f"{fmt_bytes(p_layer)} per layer, {sig(p_layer * m.num_layers / g.memory_bytes)}x the GPU's memory over "
               f"all {m.num_layers} layers.")
    return View(f"{model}, N = {seq_len:,}, batch {batch}, P in {dtype}", rows, fig, note, caption=caption,
                values={"p_layer": p_layer, "saved": saved, "extra_flops": extra_model})
