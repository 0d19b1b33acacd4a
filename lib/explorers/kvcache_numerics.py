"""Explorers for the KV-cache numerics and tiering questions: FP8 (E4M3) scales (I012) and
tiering KV across HBM, host DRAM and NVMe SSD, with SSD wear-out (I018)."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.kvcache import recompute_fetch as rf
from lib.kvcache import tiering as kt
from lib.numerics import fp8
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import GB, TB, fmt_bandwidth, fmt_bytes, fmt_count, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())
KV_DTYPES = ("bf16", "fp8")
COMPUTE_DTYPES = ("bf16", "fp8")
SCALE_LOG2 = np.arange(-8.0, 14.01, 0.5)  # scale = 2^x * amax / limit


def _t(x: float) -> str:
    return "never" if math.isinf(x) else fmt_time(x)


@explorer(
    "kvcache.fp8_scale",
    outlier_scale=FloatRange(1.0, 64.0, 0.5, label="outlier channel scale"),
    tail_dof=FloatRange(2.5, 30.0, 0.5, label="outlier tail (Student-t dof)"),
    num_outlier_channels=IntRange(0, 16, label="outlier channels of 64"),
    scale_log2=FloatRange(-8.0, 14.0, 0.25, label="log2(scale / amax scale)"),
    seed=IntRange(0, 1000),
)
def fp8_scale(
    outlier_scale: float, tail_dof: float, num_outlier_channels: int, scale_log2: float, seed: int
) -> View:
    """I012: rounding vs clipping error of a K-like tensor as the per-tensor scale moves."""
    k, e, i, floor = _fp8_tensor_sweeps(outlier_scale, tail_dof, num_outlier_channels, seed)
    chosen = fp8.error_vs_scale(k, [2.0**scale_log2], "e4m3")
    best = int(np.argmin(e["total_rel"]))
    near = SCALE_LOG2[e["total_rel"] <= 1.25 * e["total_rel"][best]]
    fig = _FP8_FIGURE(e, i, scale_log2, floor)
    rows = [
        ("amax of the tensor", sig(float(np.max(np.abs(k))))),
        ("chosen scale", f"2^{sig(scale_log2)} x amax/448 = {sig(float(chosen['scale'][0]))}"),
        ("clipped elements", fmt_pct(float(chosen["clipped_fraction"][0]))),
        ("rounding error (rel. power)", sig(float(chosen["rounding_rel"][0]))),
        ("clipping error (rel. power)", sig(float(chosen["clipping_rel"][0]))),
        ("E4M3 rounding floor (closed form)", sig(floor)),
        (
            "E4M3 within 25% of its best",
            f"2^{sig(float(near.min()))} .. 2^{sig(float(near.max()))} x amax/448",
        ),
        (
            "best INT8 scale on the grid",
            f"2^{sig(float(SCALE_LOG2[int(np.argmin(i['total_rel']))]))} x amax/127",
        ),
    ]
    caption = (f"Moving right (a larger scale) clips fewer outliers, while E4M3 rounding stays flat until small values "
               f"fall into the subnormals; the black total is lowest at 2^{sig(float(SCALE_LOG2[best]))} x the amax "
               f"scale, and the dashed line is INT8's. At the chosen scale (red) rounding costs {sig(float(chosen['rounding_rel'][0]))} and clipping "
               f"{sig(float(chosen['clipping_rel'][0]))} of the signal power.")
    return View(
        "E4M3 error of a K-like tensor vs its scale",
        rows,
        fig,
        caption=caption,
        values={
            "rounding_rel": float(chosen["rounding_rel"][0]),
            "clipping_rel": float(chosen["clipping_rel"][0]),
            "best_log2": float(SCALE_LOG2[best]),
            "floor": floor,
        },
    )


@functools.lru_cache(maxsize=8)
def _fp8_tensor_sweeps(outlier_scale: float, tail_dof: float, num_outlier_channels: int, seed: int):
    """The K-like tensor of the explorer, its E4M3 and INT8 error over the scale grid, and its
    rounding floor: everything but the chosen scale, so moving that slider recomputes one scale.
    The arrays are read-only (they are shared by every view of these inputs)."""
    _, k, _ = fp8.synthetic_head(
        256, 64, num_outlier_channels, outlier_scale, tail_dof, 1, 1.0, seed
    )
    factors = 2.0**SCALE_LOG2
    e = fp8.error_vs_scale(k, factors, "e4m3")
    i = fp8.error_vs_scale(k, factors, "int8")
    floor = fp8.relative_rounding_floor(k, float(fp8.amax_scale(k).item()))
    for a in (k, *e.values(), *i.values()):
        a.setflags(write=False)
    return k, e, i, floor


@explorer(
    "kvcache.tiering",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 8, log=True, label="GPUs per replica (TP)"),
    prefix_tokens=IntRange(1, 1048576, label="prefix tokens"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    compute_dtype=Choice(COMPUTE_DTYPES, label="prefill matmuls"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="prefill MFU"),
    ssd_drives=IntRange(1, 16, label="SSD drives per 8-GPU node"),
    ssd_read_efficiency=FloatRange(0.1, 1.0, 0.05, label="SSD achieved / datasheet read"),
    pcie_gbps=FloatRange(10.0, 450.0, 1.0, label="host->GPU GB/s per GPU"),
)
def tiering(
    model: str,
    gpu: str,
    n_gpus: int,
    prefix_tokens: int,
    kv_dtype: str,
    compute_dtype: str,
    mfu: float,
    ssd_drives: int,
    ssd_read_efficiency: float,
    pcie_gbps: float,
) -> View:
    """I018: per tier, the time to bring a prefix back against recomputing it."""
    m, g = models.model(model), hardware.gpu(gpu)
    if compute_dtype not in g.dtypes:
        raise ValueError(
            f"{g.name} has no {compute_dtype} tensor cores; pick one of {', '.join(g.dtypes)}"
        )
    node = kt.default_node(
        ssd_drives=ssd_drives,
        ssd_read_efficiency=ssd_read_efficiency,
        pcie_h2d_bandwidth=pcie_gbps * GB,
    )
    dep = Deployment(m, g, tp=n_gpus, kv_dtype=kv_dtype, compute_dtype=compute_dtype)
    window = m.max_position_embeddings
    asked, prefix_tokens = prefix_tokens, min(prefix_tokens, window)  # no prefix past the context window
    rows_t = kt.tier_costs(dep, prefix_tokens, node, mfu)
    lengths = np.unique(np.geomspace(16, min(max(4 * prefix_tokens, 1 << 17), window), 48).astype(int))
    rec = [rf.recompute_time_s(dep, int(p), mfu=mfu) for p in lengths]
    fetch = {f"fetch from {t.name}": [kt.fetch_time_s(m, int(p), t.bandwidth, kv_dtype, t.latency_s) for p in lengths]
             for t in rows_t[1:]}
    fig = _TIERING_FIGURE(lengths, rec, fetch, prefix_tokens, layout=(len(fetch),))
    rows = [
        (
            "prefix tokens",
            f"{prefix_tokens:,}"
            + (f" (clamped from {asked:,} to {m.key}'s context window)" if asked > window else ""),
        ),
        ("KV per token", fmt_bytes(m.kv_bytes_per_token(kv_dtype), "KB")),
        ("recompute FLOPs per KV byte", sig(kt.recompute_intensity(m, prefix_tokens, kv_dtype))),
        (
            "break-even tier bandwidth W*",
            fmt_bandwidth(
                kt.breakeven_bandwidth(m, g, prefix_tokens, n_gpus, kv_dtype, compute_dtype, mfu)
            ),
        ),
        ("recompute the prefix", fmt_time(rows_t[0].recompute_s)),
    ]
    values = {"recompute_s": rows_t[0].recompute_s}
    for t in rows_t:
        label = t.name
        if t.fetch_s == 0:
            rows.append((f"{label}: holds", f"{fmt_count(t.capacity_tokens)} tokens, resident"))
            continue
        p_star = kt.breakeven_prefix_tokens(
            m, g, t.bandwidth, t.latency_s, n_gpus, kv_dtype, compute_dtype, mfu
        )
        rows.append(
            (
                f"{label}: holds / reads at",
                f"{fmt_count(t.capacity_tokens)} tokens / {fmt_bandwidth(t.bandwidth)}",
            )
        )
        rows.append(
            (
                f"{label}: fetch, x faster than recompute",
                f"{fmt_time(t.fetch_s)}, x{sig(t.speedup)}",
            )
        )
        rows.append(
            (
                f"{label}: recompute wins below",
                "never"
                if p_star == 0
                else ("always" if math.isinf(p_star) else f"{sig(p_star)} tokens"),
            )
        )
        values[f"{label}_fetch_s"] = t.fetch_s
    options = {"recomputing": rows_t[0].recompute_s, **{f"fetching from {t.name}": t.fetch_s for t in rows_t[1:]}}
    fastest = min(options, key=options.get)
    caption = (f"Recomputing (black) grows at least linearly with the prefix, each fetch with its bytes plus a latency; "
               f"wherever a tier's line is below the black one, fetching from it wins. For this prefix of "
               f"{fmt_int(prefix_tokens)} tokens (red) {fastest} is fastest, {fmt_time(options[fastest])}.")
    return View(
        f"{m.key} on {n_gpus}x {g.key}: a {prefix_tokens}-token prefix", rows, fig, caption=caption, values=values
    )


@explorer(
    "kvcache.ssd_wear",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 8, log=True, label="GPUs per replica (TP)"),
    prompt_tokens=IntRange(1, 262144, label="prompt tokens"),
    prefill_share=FloatRange(0.05, 1.0, 0.05, label="share of FLOPs on prefill"),
    spill_fraction=FloatRange(0.05, 1.0, 0.05, label="share of new KV written to SSD"),
    ssd_drives=IntRange(1, 16, label="SSD drives per node"),
    capacity_tb=Choice((1.92, 3.84, 7.68, 15.36), label="drive capacity (TB)"),
    dwpd=Choice((1.0, 3.0), label="rated DWPD (5 years)"),
)
def ssd_wear(
    model: str,
    gpu: str,
    n_gpus: int,
    prompt_tokens: int,
    prefill_share: float,
    spill_fraction: float,
    ssd_drives: int,
    capacity_tb: float,
    dwpd: float,
) -> View:
    """I018: how long the node's SSD tier lasts under the KV a busy server spills to it."""
    m, g = models.model(model), hardware.gpu(gpu)
    node = kt.default_node(
        ssd_drives=ssd_drives, ssd_capacity_bytes=capacity_tb * TB, ssd_dwpd=dwpd
    )
    if node.gpus_per_node % n_gpus:
        raise ValueError(f"n_gpus={n_gpus} must divide the node's {node.gpus_per_node} GPUs")
    if m.num_attention_heads % n_gpus:
        raise ValueError(
            f"n_gpus={n_gpus} must divide the {m.num_attention_heads} attention heads of {m.key}"
        )
    out = kt.workload_defaults()["output_tokens_per_prompt_token"]
    dep = Deployment(m, g, tp=n_gpus)
    asked, prompt_tokens = prompt_tokens, min(prompt_tokens, m.max_position_embeddings)
    per_replica = kt.kv_write_rate(dep, prompt_tokens, None, prefill_share, out, spill_fraction)
    rate = per_replica * node.gpus_per_node / n_gpus
    wear = kt.ssd_wear(rate, node)
    spills = np.linspace(0.05, 1.0, 40)
    days = [kt.ssd_wear(rate / spill_fraction * s, node).lifetime_days for s in spills]
    fig = _WEAR_FIGURE(spills, days, spill_fraction)
    rows = [
        (
            "prompt tokens",
            f"{prompt_tokens:,}"
            + (f" (clamped from {asked:,} to {m.key}'s context window)" if asked > prompt_tokens else ""),
        ),
        ("KV written, whole node", fmt_bandwidth(rate)),
        ("drives absorb at most", fmt_bandwidth(node.ssd_drives * node.ssd_write_bandwidth)),
        ("drive writes per day", sig(wear.drive_writes_per_day)),
        ("rated endurance, all drives", fmt_bytes(wear.endurance_bytes, "TB")),
        ("days to rated endurance", sig(wear.lifetime_days)),
        (
            "days at the drives' full write rate",
            f"{sig(wear.line_rate_lifetime_s / 86400)} (at the {sig(kt.fact_range('ssd', 'capacity_tb')[1])} TB"
            " model's write speed, the only one on file: a lower bound for smaller drives)",
        ),
        ("drives saturated", "yes: the tier must drop writes" if wear.saturated else "no"),
    ]
    days_left = wear.lifetime_days
    span = "under a week" if days_left < 7 else ("under a year" if days_left < 365 else "over a year")
    caption = (f"The days until the drives reach their rated endurance fall as more of the new KV goes to SSD; at this "
               f"share ({fmt_pct(spill_fraction)}, red) they last {sig(days_left)} days, {span}"
               + ("; the writes also exceed what the drives can absorb." if wear.saturated else "."))
    return View(
        f"SSD wear: {m.key} on {g.key}, {ssd_drives} x {capacity_tb} TB",
        rows,
        fig,
        caption=caption,
        values={"write_rate": rate, "lifetime_days": wear.lifetime_days},
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _fp8_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax, "y")
    a = SimpleNamespace(ax=ax)
    a.rounding, = ax.plot([], [], label="E4M3 rounding")
    a.clipping, = ax.plot([], [], label="E4M3 clipping")
    a.total, = ax.plot([], [], "k", lw=2, label="E4M3 total")
    a.int8, = ax.plot([], [], "k--", lw=1, label="INT8 total")
    a.chosen = ax.axvline(0.0, color="red", lw=1, label="chosen scale")
    ax.set_xlim(SCALE_LOG2[0] - 0.5, SCALE_LOG2[-1] + 0.5)
    ax.set_xlabel("log2(scale / (amax / max code))   0 = amax scale")
    ax.set_ylabel("error power / signal power")
    # the five series are always drawn under the same labels: the legend is made once
    figures.legend(ax, [a.rounding, a.clipping, a.total, a.int8, a.chosen], fontsize=7, ncol=2)
    return a


def _fp8_draw(a: SimpleNamespace, e: dict, i: dict, scale_log2: float, floor: float) -> None:
    a.rounding.set_data(SCALE_LOG2, np.maximum(e["rounding_rel"], 1e-12))
    a.clipping.set_data(SCALE_LOG2, np.maximum(e["clipping_rel"], 1e-12))
    a.total.set_data(SCALE_LOG2, e["total_rel"])
    a.int8.set_data(SCALE_LOG2, i["total_rel"])
    a.chosen.set_xdata([scale_log2, scale_log2])
    a.ax.set_ylim(floor / 10, 2.0)


_FP8_FIGURE = figures.LiveFigure(6.0, 3.0, _fp8_build, _fp8_draw)


def _tiering_build(fig, tiers: int) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.recompute, = ax.plot([], [], "k", lw=2, label="recompute (prefill)")
    a.fetch = [ax.plot([], [])[0] for _ in range(tiers)]
    a.prefix = ax.axvline(1.0, color="red", lw=1, label="this prefix")
    ax.set_xlabel("prefix tokens")
    ax.set_ylabel("seconds")
    return a


def _tiering_draw(a: SimpleNamespace, lengths, recompute, fetch: dict, prefix_tokens: int) -> None:
    a.recompute.set_data(lengths, recompute)
    for line, (label, ys) in zip(a.fetch, fetch.items(), strict=True):
        line.set_data(lengths, ys)
        line.set_label(label)
    a.prefix.set_xdata([prefix_tokens, prefix_tokens])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.recompute, *a.fetch, a.prefix], fontsize=7)


_TIERING_FIGURE = figures.LiveFigure(6.0, 3.0, _tiering_build, _tiering_draw)


def _wear_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax, "y")
    a = SimpleNamespace(ax=ax)
    a.days, = ax.plot([], [], "k", label="days to rated endurance")
    a.week = ax.axhline(7, color="grey", ls=":", lw=1, label="one week")
    a.year = ax.axhline(365, color="grey", ls="--", lw=1, label="one year")
    a.spill = ax.axvline(0.0, color="red", lw=1, label="this share")
    ax.set_xlabel("share of new KV written to the SSD tier")
    ax.set_ylabel("days to rated endurance")
    return a


def _wear_draw(a: SimpleNamespace, spills, days, spill_fraction: float) -> None:
    a.days.set_data(spills, days)
    a.spill.set_xdata([spill_fraction, spill_fraction])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.days, a.week, a.year, a.spill], fontsize=7)


_WEAR_FIGURE = figures.LiveFigure(6.0, 3.0, _wear_build, _wear_draw)
