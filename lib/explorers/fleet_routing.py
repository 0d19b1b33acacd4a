"""Explorers for fleet routing: the consistent hash ring (N072 consistent-hash-ring).

Views call :mod:`lib.fleet.hash_ring` (ring, exact arc shares, the Dirichlet closed form). One
persistent matplotlib figure per view, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.fleet import hash_ring as hr
from lib.units import fmt_duration, fmt_pct, fmt_ratio


@functools.lru_cache(maxsize=64)
def _model_ratios(n: int, vnodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted max/min and max/mean of the Dirichlet(v) model, 4,000 draws (seeded)."""
    d = hr.dirichlet_shares(n, vnodes, 4000, seed=12345)
    return np.sort(d.max(axis=1) / d.min(axis=1)), np.sort(d.max(axis=1) * n)


def ring_summary(replicas: int, vnodes: int, seed: int) -> SimpleNamespace:
    """The ring of ``replicas`` (``r0..``) at ``vnodes`` and ``seed``: sorted shares x n before and after
    ``r{n}`` joins, the imbalance, the joining share, and where this seed sits in the closed-form model."""
    ring = hr.HashRing(vnodes, seed)
    for r in range(replicas):
        ring.add(f"r{r}")
    before = hr.arc_shares(ring)
    im = hr.imbalance(before.values())
    ring.add(f"r{replicas}")
    after = hr.arc_shares(ring)
    mm, ma = _model_ratios(replicas, vnodes)
    return SimpleNamespace(
        before=np.sort(np.array(list(before.values())))[::-1] * replicas,
        after=np.sort(np.array(list(after.values())))[::-1] * (replicas + 1),
        max_over_min=im.max_over_min, max_over_mean=im.max_over_mean, joining=after[f"r{replicas}"],
        model_median_mm=float(np.median(mm)), model_median_ma=float(np.median(ma)),
        pct_mm=float(np.searchsorted(mm, im.max_over_min, side="right") / mm.size))


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.before = ax.plot([1], [1], "o-", color="C0", ms=3, lw=1.5, label="before the join")[0]
    a.after = ax.plot([1], [1], "s--", color="C1", ms=3, lw=1.2, label="after one replica joins")[0]
    a.fair = ax.axhline(1.0, color="0.4", ls=":", lw=1.2, label="fair share")
    figures.log_scale(ax, "y")
    ax.set_xlabel("replica, most loaded first")
    ax.set_ylabel("share of keys / fair share")
    ax.grid(True)
    return a


def _draw(a, before, after) -> None:
    a.before.set_data(np.arange(1, before.size + 1), before)
    a.after.set_data(np.arange(1, after.size + 1), after)
    a.ax.set_xlim(0.5, after.size + 0.5)
    lo = max(min(before.min(), after.min()), 1e-4)
    hi = max(before.max(), after.max())
    a.ax.set_ylim(lo / 1.3, hi * 1.3)
    figures.legend(a.ax, [a.before, a.after, a.fair], fontsize=7, loc="lower left")


_RING = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "fleet.hash_ring",
    replicas=IntRange(2, 32, label="replicas"),
    vnodes=IntRange(1, 400, label="virtual nodes per replica"),
    seed=IntRange(0, 999, label="hash seed"),
)
def hash_ring(replicas: int, vnodes: int, seed: int) -> View:
    """N072: each replica's share of the hash space on a consistent ring, and what one joining replica takes."""
    s = ring_summary(replicas, vnodes, seed)
    ideal = 1 / (replicas + 1)
    rows = [("max / min load", fmt_ratio(s.max_over_min)),
            ("max / mean load", fmt_ratio(s.max_over_mean)),
            ("closed-form median, max / min", fmt_ratio(s.model_median_mm)),
            ("this seed's percentile (max / min)", fmt_pct(s.pct_mm)),
            ("keys moved when one replica joins", fmt_pct(s.joining)),
            ("ideal", fmt_pct(ideal))]
    caption = (f"Share of the hash space per replica over its fair share (log y), {replicas} replicas with {vnodes} "
               f"point(s) each: the most loaded holds {fmt_ratio(s.max_over_mean)} its share and {fmt_ratio(s.max_over_min)} "
               f"the least loaded's; the joining replica takes {fmt_pct(s.joining)} of the keys against an ideal "
               f"{fmt_pct(ideal)}.")
    fig = _RING(s.before, s.after)
    return View(f"Hash ring: {replicas} replicas x {vnodes} virtual nodes, seed {seed}", rows, fig, caption=caption,
                values={"max_over_min": s.max_over_min, "max_over_mean": s.max_over_mean, "joining": s.joining})


# ---- N030 cache-aware routing: least-loaded, affinity and the two-term score --------------------------

_ROUTE_POLICIES = (("least_loaded", "least-loaded", "C0", "-"), ("affinity", "affinity (hash ring)", "C3", "--"),
                   ("score", "two-term score", "C2", "-"), ("spill", "affinity + spill", "C1", ":"))


@functools.lru_cache(maxsize=64)
def routing_summary(replicas: int, utilization: float, turns: float, system_len: int, cache_share: float,
                    cache_weight: float, seed: int, model: str = "llama-3.1-70b", gpu: str = "h100-sxm", tp: int = 4,
                    duration_s: float = 90.0) -> dict:
    """Each policy's result on one chat trace (150-token messages, 300-token answers, 15 s think time,
    20 tenants), sized so the fleet would be ``utilization`` busy with no hits."""
    from lib.fleet import routing as rt
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    fleet = rt.chat_fleet(dep, replicas, utilization, turns=turns, system_len=system_len, user_len=150,
                          output_len=300, think_s=15.0, tenants=20, cache_share=cache_share, duration_s=duration_s,
                          seed=seed)
    return {p: rt.route(fleet, p, cache_weight=cache_weight, seed=seed) for p, *_ in _ROUTE_POLICIES}


def _build_routes(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, lines={})
    for p, label, color, ls in _ROUTE_POLICIES:
        a.lines[p] = ax.plot([1e-3], [0.5], color=color, ls=ls, lw=1.6, label=label)[0]
    figures.log_scale(ax, "x")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of requests at or below")
    ax.set_ylim(0, 1.01)
    ax.grid(True)
    return a


def _draw_routes(a, curves, lo, hi) -> None:
    for p, (x, y) in curves.items():
        a.lines[p].set_data(x, y)
    a.ax.set_xlim(lo, hi)
    figures.legend(a.ax, list(a.lines.values()), fontsize=7, loc="lower right")


_ROUTES = figures.LiveFigure(6.0, 3.0, _build_routes, _draw_routes)


@explorer(
    "fleet.cache_routing",
    replicas=IntRange(2, 16, label="replicas"),
    utilization=FloatRange(0.2, 0.95, 0.05, label="load with no hits (busy share)"),
    turns=FloatRange(1.0, 20.0, 0.5, label="mean turns per conversation"),
    system_len=IntRange(0, 8000, label="system prompt (tokens)"),
    cache_share=FloatRange(0.02, 1.0, 0.02, label="KV pool kept for prefixes"),
    cache_weight=FloatRange(0.0, 8.0, 0.25, label="score weight k on the prefill term"),
    seed=IntRange(0, 999, label="seed"),
)
def cache_routing(replicas: int, utilization: float, turns: float, system_len: int, cache_share: float,
                  cache_weight: float, seed: int) -> View:
    """N030: TTFT and prefix hits of least-loaded, affinity, the two-term score and affinity with spill
    on one chat fleet of llama-3.1-70b replicas (TP4 on H100)."""
    res = routing_summary(replicas, round(utilization, 4), turns, system_len, round(cache_share, 4),
                          round(cache_weight, 4), seed)
    curves, lo, hi = {}, math.inf, 0.0
    for p, r in res.items():
        x = np.sort(r.ttft_s[r.measured])
        x = np.maximum(x, 1e-3)
        idx = np.unique(np.linspace(0, x.size - 1, min(x.size, 200)).astype(int))
        curves[p] = (x[idx], (idx + 1) / x.size)
        lo, hi = min(lo, x[0]), max(hi, x[-1])
    rows = [(label, f"hits {fmt_pct(res[p].hit_rate)}, p99 TTFT {fmt_duration(res[p].ttft_quantile_s(0.99))}, "
                    f"busiest {fmt_pct(res[p].utilization.max())}") for p, label, *_ in _ROUTE_POLICIES]
    best = min(res, key=lambda p: res[p].ttft_quantile_s(0.99))
    label = dict((p, lab) for p, lab, *_ in _ROUTE_POLICIES)
    caption = (f"TTFT distribution per routing policy (log x), {replicas} replicas: least-loaded hits "
               f"{fmt_pct(res['least_loaded'].hit_rate)} of prompt tokens, affinity {fmt_pct(res['affinity'].hit_rate)}, "
               f"the score {fmt_pct(res['score'].hit_rate)}; the lowest p99 is {label[best]}'s.")
    fig = _ROUTES(curves, lo / 1.3, hi * 1.3)
    return View(f"Cache-aware routing: {replicas} replicas at {fmt_pct(utilization)} no-hit load", rows, fig,
                caption=caption, values={f"{p}_p99": r.ttft_quantile_s(0.99) for p, r in res.items()})


# ---- I067 prefix-affinity spill: the threshold sweep ------------------------------------------------

SPILL_MULTIPLES = (0.0, 0.5, 1.0, 4.0)


@functools.lru_cache(maxsize=64)
def spill_sweep(replicas: int, utilization: float, tenants: int, shared_len: int, hot_share: float,
                cache_share: float, seed: int, model: str = "llama-3.1-70b", gpu: str = "h100-sxm", tp: int = 4,
                user_len: int = 500, output_len: int = 300, duration_s: float = 24.0) -> SimpleNamespace:
    """One-shot requests behind per-tenant shared prompts, tenant 0 taking ``hot_share`` of them: the
    least-loaded, affinity and derived-threshold spill routers, and spill at fixed thresholds of
    :data:`SPILL_MULTIPLES` x the saved prefill of a full prefix hit."""
    from lib.fleet import routing as rt
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    fleet = rt.chat_fleet(dep, replicas, utilization, turns=1.0, system_len=shared_len, user_len=user_len,
                          output_len=output_len, think_s=1.0, tenants=tenants, hot_share=hot_share,
                          cache_share=cache_share, duration_s=duration_s, seed=seed)
    saved = rt.spill_threshold_s(fleet.table, shared_len + user_len, shared_len)
    base = {p: rt.route(fleet, p, affinity_key="tenant", seed=seed) for p in ("least_loaded", "affinity", "spill")}
    fixed = {m: rt.route(fleet, "spill", affinity_key="tenant", spill_threshold=m * saved, seed=seed)
             for m in SPILL_MULTIPLES}
    return SimpleNamespace(fleet=fleet, saved_s=saved, base=base, fixed=fixed)


def _build_spill(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve = ax.plot([1], [1], "o-", color="C0", ms=4, lw=1.6, label="spill at a fixed threshold")[0]
    a.derived = ax.axhline(1, color="C2", lw=1.4, label="spill at each request's saved prefill")
    a.least = ax.axhline(1, color="0.4", ls=":", lw=1.2, label="least-loaded")
    a.aff = ax.axhline(1, color="C3", ls="--", lw=1.2, label="affinity, no spill")
    figures.log_scale(ax, "y")
    ax.set_xlabel("threshold / prefill a full hit saves")
    ax.set_ylabel("p99 TTFT (s)")
    ax.grid(True)
    return a


def _draw_spill(a, xs, ys, derived, least, aff) -> None:
    a.curve.set_data(xs, ys)
    for line, y in ((a.derived, derived), (a.least, least), (a.aff, aff)):
        line.set_ydata([y, y])
    vals = [*ys, derived, least, aff]
    a.ax.set_xlim(-0.5, max(xs) + 0.5)
    a.ax.set_ylim(min(vals) / 1.5, max(vals) * 1.5)
    figures.legend(a.ax, [a.curve, a.derived, a.least, a.aff], fontsize=7, loc="upper left")


_SPILL = figures.LiveFigure(6.0, 3.0, _build_spill, _draw_spill)


@explorer(
    "fleet.prefix_spill",
    replicas=IntRange(2, 16, label="replicas"),
    utilization=FloatRange(0.2, 0.95, 0.05, label="load with no hits (busy share)"),
    tenants=IntRange(2, 2000, label="customers (shared prompts)"),
    shared_len=IntRange(100, 16000, label="shared prompt (tokens)"),
    hot_share=FloatRange(0.0, 0.9, 0.01, label="traffic share of the popular customer"),
    cache_share=FloatRange(0.02, 1.0, 0.02, label="KV pool kept for prefixes"),
    seed=IntRange(0, 999, label="seed"),
)
def prefix_spill(replicas: int, utilization: float, tenants: int, shared_len: int, hot_share: float,
                 cache_share: float, seed: int) -> View:
    """I067: p99 TTFT against the spill threshold when one customer's prompt gets popular (llama-3.1-70b,
    TP4 on H100; 500-token questions, 300-token answers)."""
    if hot_share * tenants < 1:
        raise ValueError(f"the popular customer's share ({hot_share:.3g}) must be at least 1 / customers "
                         f"({1 / tenants:.3g}): at least as popular as each of the others")
    s = spill_sweep(replicas, round(utilization, 4), tenants, shared_len, round(hot_share, 4), round(cache_share, 4), seed)
    xs = np.array(SPILL_MULTIPLES)
    ys = np.array([s.fixed[m].ttft_quantile_s(0.99) for m in SPILL_MULTIPLES])
    b = s.base
    rows = [("prefill a full hit saves (the threshold)", fmt_duration(s.saved_s)),
            *[(lab, f"p99 {fmt_duration(b[p].ttft_quantile_s(0.99))}, hits {fmt_pct(b[p].hit_rate)}, busiest "
                    f"{fmt_pct(b[p].utilization.max())}")
              for p, lab in (("least_loaded", "least-loaded"), ("affinity", "affinity"),
                             ("spill", "affinity + derived spill"))]]
    caption = (f"p99 TTFT against a fixed spill threshold in multiples of the {fmt_duration(s.saved_s)} a full hit "
               f"saves (log y): affinity without spill reaches {fmt_duration(b['affinity'].ttft_quantile_s(0.99))} "
               f"with the popular customer at {fmt_pct(hot_share)} of traffic; spilling at each request's own saved "
               f"prefill gives {fmt_duration(b['spill'].ttft_quantile_s(0.99))}.")
    fig = _SPILL(xs, ys, b["spill"].ttft_quantile_s(0.99), b["least_loaded"].ttft_quantile_s(0.99),
                 b["affinity"].ttft_quantile_s(0.99))
    return View(f"Prefix-affinity spill: {replicas} replicas, popular customer at {fmt_pct(hot_share)}", rows, fig,
                caption=caption, values={"saved_s": s.saved_s, "spill_p99": b["spill"].ttft_quantile_s(0.99)})
