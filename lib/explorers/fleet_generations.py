"""Explorers for fleets of two GPU generations (I074 capacity-unit-across-generations).

Views call :mod:`lib.fleet.capacity_units` (a replica's requests/s within the SLO, routing by capacity or by
GPU count, the TTFT quantile of each pool). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_time, sig

MODELS = ("llama-3.1-70b", "llama-3.1-8b", "qwen2.5-72b", "mixtral-8x7b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")


@functools.lru_cache(maxsize=256)
def _unit(model: str, gpu: str, tp: int, prompt_len: int, output_len: int, tpot_s: float, ttft_s: float):
    from lib.fleet.capacity_units import replica_capacity
    from lib.perf.deployment import deployment

    return replica_capacity(deployment(model, gpu, tp=tp), prompt_len, output_len, tpot_s, ttft_s)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    x = np.arange(2)
    a.by_cap = ax.bar(x - 0.2, [0.5, 0.5], width=0.38, color="C0", label="routed by capacity at the SLO")
    a.by_gpu = ax.bar(x + 0.2, [0.5, 0.5], width=0.38, color="C3", label="routed by GPU count")
    a.limit = ax.axhline(1.0, color="0.2", ls=":", lw=1.2, label="the pool's capacity within the SLO")
    ax.set_xticks(x)
    ax.set_xticklabels(["", ""])
    ax.set_ylabel("load / capacity within the SLO")
    ax.grid(True, axis="y")
    return a


def _draw(a, names, cap_loads, gpu_loads) -> None:
    for bar, v in zip(a.by_cap, cap_loads, strict=True):
        bar.set_height(v)
    for bar, v in zip(a.by_gpu, gpu_loads, strict=True):
        bar.set_height(v)
    a.ax.set_xticklabels(names)
    a.ax.set_ylim(0, max(1.2, 1.1 * max(*cap_loads, *gpu_loads)))
    figures.legend(a.ax, [a.by_cap, a.by_gpu, a.limit], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


def _q(pool_load) -> float:
    """The pool's TTFT p99 on a shorter sample path than the notebook's (20,000 arrivals: a few % noisier, 5x faster)."""
    from lib.fleet.capacity_units import ttft_quantile_s

    u = pool_load.pool.unit
    return ttft_quantile_s(u.cost.prefill_s, pool_load.per_replica, u.ttft_q, n=20_000)


@explorer(
    "fleet.capacity_units",
    model=Choice(MODELS),
    old_gpu=Choice(GPUS, label="older generation"),
    new_gpu=Choice(GPUS, label="newer generation"),
    old_tp=IntRange(1, 8, log=True, label="older TP"),
    new_tp=IntRange(1, 8, log=True, label="newer TP"),
    old_replicas=IntRange(1, 200, label="older replicas"),
    new_replicas=IntRange(1, 200, label="newer replicas"),
    prompt_len=Choice((500, 1000, 2000, 3000, 4000, 8000, 16000), label="prompt tokens"),
    output_len=Choice((100, 200, 400, 800, 1600), label="reply tokens"),
    tpot_ms=Choice((25.0, 40.0, 50.0, 75.0, 100.0), label="TPOT target (ms)"),
    ttft_s=Choice((0.5, 1.0, 2.0, 5.0), label="TTFT p99 target (s)"),
    load=FloatRange(0.3, 1.2, 0.05, label="demand / fleet capacity"),
)
def capacity_units(model: str, old_gpu: str, new_gpu: str, old_tp: int, new_tp: int, old_replicas: int,
                   new_replicas: int, prompt_len: int, output_len: int, tpot_ms: float, ttft_s: float,
                   load: float) -> View:
    """I074: each generation's replica in requests/s within the SLO, and each pool's load against it when the
    router splits traffic by capacity or by GPU count."""
    from lib.fleet.capacity_units import Pool, route, weights_by_capacity, weights_by_gpus

    if old_gpu == new_gpu and old_tp == new_tp:
        raise ValueError("pick two different replicas (another GPU or another TP): one generation has one unit")
    units = [_unit(model, g, tp, prompt_len, output_len, tpot_ms / 1e3, ttft_s)
             for g, tp in ((old_gpu, old_tp), (new_gpu, new_tp))]
    pools = [Pool(f"{old_gpu} TP{old_tp}", units[0], old_replicas), Pool(f"{new_gpu} TP{new_tp}", units[1], new_replicas)]
    rate = load * sum(p.capacity for p in pools)
    by_cap = route(rate, pools, weights_by_capacity(pools))
    by_gpu = route(rate, pools, weights_by_gpus(pools))
    rows = [(f"{p.name}: one replica", f"{sig(p.unit.rate)} req/s ({sig(p.unit.rate_per_gpu)} per GPU), "
                                       f"${sig(p.unit.usd_per_request_s_hour)} per req/s-hour; {p.unit.binding} binds")
            for p in pools]
    rows.append(("demand", f"{sig(rate)} req/s ({fmt_pct(load)} of {sig(sum(p.capacity for p in pools))})"))
    for c, g in zip(by_cap, by_gpu, strict=True):
        rows.append((f"{c.pool.name}: load by capacity / by GPUs",
                     f"{fmt_pct(c.load)} / {fmt_pct(g.load)}; TTFT p99 {fmt_time(_q(c))} / {fmt_time(_q(g))}"))
    broken = [g.pool.name for g in by_gpu if not g.within_slo]
    caption = (f"Each pool's load against its capacity within the SLO (dotted line) when the router splits "
               f"{sig(rate)} requests/s by capacity (blue bars equal) or by GPU count; "
               + (f"by GPU count {', '.join(broken)} goes over." if broken else "here neither routing breaks a pool."))
    fig = _FIGURE([p.name for p in pools], [c.load for c in by_cap], [g.load for g in by_gpu])
    return View(f"Capacity units: {pools[0].name} and {pools[1].name}", rows, fig, caption=caption,
                note="GPU-count routing breaks the SLO" if broken else "both routings hold",
                values={"old_rate": units[0].rate, "new_rate": units[1].rate, "broken": len(broken)})


def _build_fp8(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.2, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    x = np.arange(3)
    a.bars = ax.bar(x, [0.01, 0.01, 0.01], width=0.6, color=["C0", "C1", "C3"])
    a.indep = ax.axhline(0.01, color="0.2", ls=":", lw=1.2, label="if the two errors were independent")
    ax.set_xticks(x)
    ax.set_xticklabels(["per-tensor vs exact", "MX blocks vs exact", "per-tensor vs MX"])
    ax.set_ylabel("relative error of the logits")
    ax.grid(True, axis="y")
    return a


def _draw_fp8(a, errs, indep) -> None:
    for bar, v in zip(a.bars, errs, strict=True):
        bar.set_height(v)
    a.indep.set_ydata([indep, indep])
    a.ax.set_ylim(0, 1.25 * max(*errs, indep))
    figures.legend(a.ax, [a.indep], fontsize=7, loc="upper left")


_FP8 = figures.LiveFigure(6.0, 3.0, _build_fp8, _draw_fp8)


@explorer(
    "fleet.fp8_formats",
    outlier_scale=FloatRange(1.0, 3000.0, 1.0, label="outlier channels x"),
    outlier_channels=IntRange(0, 32, label="outlier channels"),
    block=Choice((16, 32, 64, 128), label="MX block"),
    rounding=Choice(("ceil", "floor"), label="MX scale rounding"),
    seed=IntRange(0, 1000, label="seed"),
)
def fp8_formats(outlier_scale: float, outlier_channels: int, block: int, rounding: str, seed: int) -> View:
    """I060: one output projection in FP8 with a per-tensor scale (Hopper) and with MX block scales (Blackwell):
    each against the exact logits, and the two against each other."""
    from lib.fleet.capacity_units import fp8_format_disagreement

    r = fp8_format_disagreement(vocab=512, hidden=256, rows=128, block=block, outlier_channels=outlier_channels,
                                outlier_scale=outlier_scale, rounding=rounding, seed=seed)
    indep = float(np.hypot(r.err_per_tensor, r.err_mx))
    rows = [("logit error, per-tensor / MX", f"{fmt_pct(r.err_per_tensor)} / {fmt_pct(r.err_mx)}"),
            ("the two formats apart", f"{fmt_pct(r.err_between)} (independent errors: {fmt_pct(indep)})"),
            ("greedy token differs: per-tensor vs MX", fmt_pct(r.flips_between)),
            ("greedy token vs exact: per-tensor / MX", f"{fmt_pct(r.flips_per_tensor)} / {fmt_pct(r.flips_mx)}"),
            ("weights the MX scales clip", fmt_pct(r.clipped_mx))]
    caption = (f"Relative logit error of a 512 x 256 projection in E4M3 with one per-tensor scale and with {block}-element "
               f"MX blocks ({rounding} scales), and the two against each other; the dotted line is what independent errors "
               f"would give ({fmt_pct(indep)}).")
    fig = _FP8([r.err_per_tensor, r.err_mx, r.err_between], indep)
    return View("FP8 formats across generations", rows, fig, caption=caption,
                note=f"formats disagree on {fmt_pct(r.flips_between)} of greedy tokens",
                values={"between": r.err_between, "flips": r.flips_between})
