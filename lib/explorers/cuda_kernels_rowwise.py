"""Explorers for the row-wise kernels of the CUDA-kernels section: the softmax kernel (N098) and the
normalization kernel review (N006). Each view calls :mod:`lib.kernels.rowwise` only (no triton, no
torch); the figures are persistent matplotlib figures updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import rowwise as rw
from lib.registry import hardware, models
from lib.units import TB, US, fmt_bandwidth, fmt_bytes, fmt_int, fmt_pct, fmt_time

NVIDIA_GPUS = tuple(k for k in hardware.gpu_names() if hardware.gpu(k).compute_capability is not None)
"""GPUs whose per-SM limits data/hardware.yaml has (the register arithmetic is NVIDIA's)."""

# ---- N098: the softmax kernel against a copy ------------------------------------------------------

SOFTMAX_COLS = 2 ** np.arange(7, 19)  # 128 .. 262,144 columns
_LINES = (("copy", "copy (1 read + 1 write)", "black", "-"),
          ("row_in_registers", "softmax, row in registers (1 read + 1 write)", "#1f77b4", "-"),
          ("online_two_pass", "softmax, online two-pass (2 reads + 1 write)", "#ff7f0e", "-"),
          ("three_pass", "softmax, three passes (3 reads + 1 write)", "#d62728", "-"))


def _softmax_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.36, top=0.92)
    figures.log_scale(ax, "x", base=2)
    a = SimpleNamespace(ax=ax, lines={})
    for key, label, color, style in _LINES:
        a.lines[key], = ax.plot([], [], style, color=color, lw=1.6, label=label)
    a.done, = ax.plot([], [], ":", color="black", lw=1.2, label="done: 90% of copy speed")
    a.peak = ax.axhline(1.0, color="grey", lw=1, ls="--", label="datasheet bandwidth")
    a.limit = ax.axvline(1.0, color="#1f77b4", lw=1, ls="--", label="widest row in registers")
    a.here, = ax.plot([], [], "o", color="#1f77b4", ms=6, label="this shape")
    ax.set_xlabel("columns per row (n_cols)")
    ax.set_ylabel("model bandwidth: 2 x matrix bytes / time (TB/s)")
    ax.set_xlim(SOFTMAX_COLS[0] / 1.2, SOFTMAX_COLS[-1] * 1.2)
    ax.grid(True)
    return a


def _softmax_draw(a, curves: dict, done: np.ndarray, peak: float, widest: int, here: tuple, title: str) -> None:
    for key, y in curves.items():
        a.lines[key].set_data(SOFTMAX_COLS, y)
    a.done.set_data(SOFTMAX_COLS, done)
    a.done.set_label(f"done: {rw.done_fraction_of_copy():.0%} of copy speed")
    a.peak.set_ydata([peak, peak])
    a.limit.set_xdata([widest, widest])
    a.limit.set_label(f"widest row in registers ({widest:,})")
    a.here.set_data([here[0]], [here[1]])
    a.here.set_color(here[2])
    a.ax.set_ylim(0, peak * 1.12)
    a.ax.set_title(title)
    figures.legend(a.ax, [*a.lines.values(), a.done, a.peak, a.limit, a.here], loc="upper center",
                   bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7, frameon=False)


_SOFTMAX_FIGURE = figures.LiveFigure(6.2, 4.2, _softmax_build, _softmax_draw)


def softmax_designs(rows: int, n_cols: int, gpu: str, dtype: str) -> dict:
    """{design or "copy": RowKernelCost} for one shape: the copy and every softmax design."""
    out = {"copy": rw.copy_cost(rows, n_cols, gpu, dtype)}
    out.update({d: rw.row_kernel_cost(rows, n_cols, gpu, dtype, d) for d in rw.SOFTMAX_DESIGNS})
    return out


@explorer(
    "cuda_kernels.softmax",
    gpu=Choice(NVIDIA_GPUS),
    dtype=Choice(rw.ROW_DTYPES, label="dtype"),
    rows=IntRange(1, 65536, log=True, label="rows"),
    cols=IntRange(2, 262144, log=True, label="columns per row"),
    num_warps=IntRange(1, 32, log=True, label="num_warps (for the register limit)"),
)
def softmax_view(gpu: str, dtype: str, rows: int, cols: int, num_warps: int) -> View:
    """N098: bytes and modelled time of a softmax over rows x cols against a copy of the same matrix,
    for each way the kernel can be written, and the widest row one program holds in registers."""
    fit = rw.row_fit(gpu, cols)  # the launch the published rule picks
    widest = rw.widest_row_in_registers(gpu, num_warps)
    costs = softmax_designs(rows, cols, gpu, dtype)
    curves = {}
    for key in costs:
        ys = []
        for c in SOFTMAX_COLS:
            cost = rw.copy_cost(rows, int(c), gpu, dtype) if key == "copy" else rw.row_kernel_cost(
                rows, int(c), gpu, dtype, key)
            fits = key != "row_in_registers" or int(c) <= rw.row_fit(gpu, int(c)).widest_row
            ys.append(cost.effective_bandwidth / TB if fits else np.nan)
        curves[key] = np.array(ys)
    done = curves["copy"] * rw.done_fraction_of_copy()
    g = hardware.gpu(gpu)
    best = "row_in_registers" if fit.fits else "online_two_pass"
    here = (cols, costs[best].effective_bandwidth / TB, "#1f77b4" if fit.fits else "#ff7f0e")
    fig = _SOFTMAX_FIGURE(curves, done, g.memory_bandwidth / TB, widest, here,
                          f"softmax of {rows:,} x n_cols {dtype} on {gpu}")
    copy = costs["copy"]
    rows_out = [
        ("BLOCK (next power of two)", f"{fit.block:,} lanes ({fmt_pct(fit.idle_lane_fraction)} masked)"),
        ("launch (published rule)", f"{rows:,} programs x {fit.num_warps} warps"),
        ("registers per thread", f"{fit.registers_needed} needed of {fit.register_cap} "
                                 f"({'fits' if fit.fits else 'spills'})"),
        (f"widest row at {num_warps} warps", f"{widest:,} elements"),
        ("bytes (read + write)", fmt_bytes(copy.bytes, "MB")),
        ("copy", f"{fmt_time(copy.time_s)} ({fmt_bandwidth(copy.effective_bandwidth)})"),
    ]
    for d in rw.SOFTMAX_DESIGNS:
        c = costs[d]
        note = "" if d != "row_in_registers" or fit.fits else " (spills: not modelled)"
        rows_out.append((d.replace("_", " "), f"{fmt_time(c.time_s)}, {fmt_pct(copy.time_s / c.time_s)} of copy "
                                              f"speed{note}"))
    rows_out.append(("done below", fmt_time(copy.time_s / rw.done_fraction_of_copy())))
    exp = costs["row_in_registers"].exp_s
    rows_out.append(("exp time / memory time", "no SFU rate in data" if exp is None else
                     fmt_pct(exp / costs["row_in_registers"].memory_s)))
    caption = ("Each line is the bandwidth a benchmark would report (the matrix's read + write bytes over the "
               "modelled time) as rows widen: small matrices are launch-bound, large ones reach the streaming "
               "bandwidth, and the row-in-registers kernel tracks the copy until its row no longer fits "
               "(dashed blue line).")
    return View(f"Softmax kernel: {rows:,} x {cols:,} {dtype} on {gpu}", rows_out, fig,
                "Times: fixed per-kernel cost + max(memory, FP32 math, exp); memory at the decode step's streaming "
                "efficiency of the datasheet bandwidth.",
                values={"block": float(fit.block), "fits": float(fit.fits), "widest": float(widest),
                        "copy_s": copy.time_s, "row_s": costs["row_in_registers"].time_s,
                        "online_s": costs["online_two_pass"].time_s, "bytes": copy.bytes,
                        "fraction_online": copy.time_s / costs["online_two_pass"].time_s},
                caption=caption)





# ---- N006: the normalization kernel review ---------------------------------------------------------

REVIEW_LABELS = ("under review", "fp32 sums", "writes dtype", "row in regs", "fused add", "one pass", "vector loads")
_SEGMENTS = (("residual add", "#ff7f0e"), ("norm", "#1f77b4"), ("cast", "#d62728"))


def _norm_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.3, top=0.9)
    a = SimpleNamespace(ax=ax, bars={}, labels=[])
    x = np.arange(len(REVIEW_LABELS))
    bottom = np.zeros(len(x))
    for name, color in _SEGMENTS:
        a.bars[name] = ax.bar(x, np.zeros(len(x)), 0.7, bottom=bottom, color=color, label=f"{name} kernel")
    a.ceiling = ax.axhline(1.0, color="black", lw=1.2, ls="--", label="ceiling: a copy of the bytes it must move")
    a.labels = [ax.text(i, 0, "", ha="center", va="bottom", fontsize=7) for i in x]
    ax.set_xticks(x)
    ax.set_xticklabels(REVIEW_LABELS, rotation=20, fontsize=7.5)
    ax.set_ylabel("modelled time (µs)")
    ax.set_xlim(-0.6, len(x) - 0.4)
    return a


def _norm_draw(a, parts: dict, totals: np.ndarray, ceiling_us: float, title: str) -> None:
    bottom = np.zeros(len(totals))
    for name, _ in _SEGMENTS:
        for rect, h, b0 in zip(a.bars[name], parts[name], bottom, strict=True):
            rect.set_height(h)
            rect.set_y(b0)
        bottom = bottom + parts[name]
    for text, t in zip(a.labels, totals, strict=True):
        text.set_position((text.get_position()[0], t))
        text.set_text(f"{ceiling_us / t:.0%}")
    a.ceiling.set_ydata([ceiling_us, ceiling_us])
    a.ax.set_ylim(0, totals.max() * 1.15)
    a.ax.set_title(title)
    figures.legend(a.ax, [*a.bars.values(), a.ceiling], loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2,
                   fontsize=7, frameon=False)


_NORM_FIGURE = figures.LiveFigure(6.2, 3.9, _norm_build, _norm_draw)


def change_worth(change: str, before: rw.NormPipeline, after: rw.NormPipeline) -> str:
    """What one review change is worth, in words and numbers: bytes and time saved, or, for the changes
    the bandwidth model does not price, the count they change (reductions per row, load instructions)."""
    saved_b, saved_t = before.bytes - after.bytes, before.time_s - after.time_s
    if saved_b > 0 or saved_t > 1e-12:
        launches = before.launches - after.launches
        return (f"-{fmt_bytes(saved_b, 'MB')} and -{fmt_time(saved_t)}"
                + (f" ({launches} launch{'es' if launches > 1 else ''} fewer)" if launches else ""))
    if change == "fp32_accumulation":
        return ("nothing here: fp32 inputs already sum in fp32" if before.dtype == "fp32" else
                "no bytes, no time: the correctness fix")
    if change == "output_dtype":
        return "nothing here: the output dtype is already fp32"
    if change == "one_pass_statistics":
        if before.block_reductions > after.block_reductions:
            return (f"no bytes with the row in registers; {before.block_reductions - after.block_reductions} block "
                    "reduction (a barrier) fewer per row")
        return "nothing: RMSNorm has a single statistic"
    if change == "vectorized_loads":
        return (f"no bytes; {fmt_int(before.load_instructions_per_row)} -> {fmt_int(after.load_instructions_per_row)} "
                "warp load instructions per row")
    return "nothing here"


def _segment(kernel_name: str) -> str:
    return "cast" if kernel_name.startswith("cast") else kernel_name


@explorer(
    "cuda_kernels.normalization",
    model=Choice(tuple(models.model_names())),
    tokens=IntRange(1, 65536, log=True, label="tokens (rows)"),
    dtype=Choice(rw.ROW_DTYPES, label="dtype"),
    gpu=Choice(NVIDIA_GPUS),
)
def normalization_view(model: str, tokens: int, dtype: str, gpu: str) -> View:
    """N006: bytes, launches and modelled time of a residual add + normalization (the model's RMSNorm
    or LayerNorm over its hidden size) as the kernel under review and after each of the review's six
    changes in turn, against a copy of the bytes the operation must move."""
    m = models.model(model)
    stages = rw.norm_review(tokens, m.hidden_size, gpu, dtype, m.norm)
    ceiling = rw.norm_ceiling(tokens, m.hidden_size, gpu, dtype)
    parts = {name: np.zeros(len(stages)) for name, _ in _SEGMENTS}
    for i, st in enumerate(stages):
        for k in st.kernels:
            parts[_segment(k.name)][i] += k.time_s / US
    totals = np.array([st.time_s / US for st in stages])
    fig = _NORM_FIGURE(parts, totals, ceiling.time_s / US,
                       f"{model} ({m.norm}, hidden {m.hidden_size:,}): {tokens:,} tokens, {dtype}, {gpu}")
    rows = [("ceiling (copy of x, residual in; h, y out)",
             f"{fmt_bytes(ceiling.bytes, 'MB')} in {fmt_time(ceiling.time_s)}")]
    prev = stages[0]
    rows.append(("kernel under review", f"{fmt_bytes(prev.bytes, 'MB')}, {prev.launches} launches, "
                                        f"{fmt_time(prev.time_s)} ({fmt_pct(ceiling.time_s / prev.time_s)} of copy speed)"))
    for change, st in zip(rw.REVIEW_CHANGES, stages[1:], strict=True):
        rows.append((change.replace("_", " "), change_worth(change, prev, st)))
        prev = st
    rows.append(("reviewed kernel", f"{fmt_time(stages[-1].time_s)} ({fmt_pct(ceiling.time_s / stages[-1].time_s)} "
                                    "of copy speed)"))
    caption = ("Each bar is the modelled time of the operation after the changes to its left, split by kernel; the "
               "percentage over it is the speed against the dashed copy of the bytes the operation must move. At "
               "prefill sizes bytes dominate; at a few tokens the launches do.")
    return View(f"Normalization review: {model}, {tokens:,} tokens", rows, fig,
                "Times: per kernel, fixed cost + bytes / (bandwidth x streaming efficiency), kernels in sequence.",
                values={"naive_s": stages[0].time_s, "reviewed_s": stages[-1].time_s, "ceiling_s": ceiling.time_s,
                        "naive_bytes": stages[0].bytes, "reviewed_bytes": stages[-1].bytes,
                        "launches": float(stages[0].launches)},
                caption=caption)


__all__ = ["NVIDIA_GPUS", "REVIEW_LABELS", "SOFTMAX_COLS", "change_worth", "normalization_view", "softmax_designs", "softmax_view"]
