"""Explorers for capacity over time and place: a day of demand against a fixed or autoscaled fleet
(N040 diurnal-capacity).

Views call :mod:`lib.fleet.capacity` (request cost, fleet size, replica start, GPU-hour price) and
:mod:`lib.fleet.diurnal` (the day's curve, the autoscaler replay, the day's dollars). One persistent
matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import diurnal
from lib.units import fmt_duration, fmt_int, fmt_pct, sig


def fmt_usd(x: float) -> str:
    """Dollars for a table cell."""
    return f"${sig(x)}"


@functools.lru_cache(maxsize=64)
def _cost(model: str, gpu: str, tp: int, prompt_len: int, output_len: int, tpot_ms: float):
    from lib.fleet.capacity import replica_start_s, request_cost
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    return request_cost(dep, prompt_len, output_len, tpot_ms * 1e-3), replica_start_s(dep)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.need = ax.plot([0.0], [0.0], color="C0", lw=1.6, label="replicas the load needs at the planned utilization")[0]
    a.paid = ax.plot([0.0], [0.0], color="C2", lw=1.4, drawstyle="steps-post", label="autoscaled, paid")[0]
    a.ready = ax.plot([0.0], [0.0], color="C1", lw=1.0, ls="--", drawstyle="steps-post", label="autoscaled, serving")[0]
    a.fixed = ax.axhline(1.0, color="C3", lw=1.4, label="fixed fleet (peak)")
    ax.set_xlabel("hour of the day")
    ax.set_ylabel("replicas")
    ax.set_xlim(0, 24)
    ax.set_xticks(range(0, 25, 3))
    ax.grid(True)
    return a


def _draw(a, hours, need, paid, ready, fixed) -> None:
    a.need.set_data(hours, need)
    a.paid.set_data(hours, paid)
    a.ready.set_data(hours, ready)
    a.fixed.set_ydata([fixed, fixed])
    a.ax.set_ylim(0, 1.15 * max(fixed, float(np.max(need)), float(np.max(paid))))
    figures.legend(a.ax, [a.need, a.paid, a.ready, a.fixed], fontsize=7, loc="lower left")


_FIGURE = figures.LiveFigure(6.0, 3.3, _build, _draw)


def _models() -> tuple[str, ...]:
    from lib.registry.models import model_names

    return tuple(model_names())


@explorer(
    "fleet.diurnal",
    model=Choice(_models(), label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200", "a100-sxm", "mi300x", "l40s"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    prompt_len=IntRange(16, 32768, label="prompt tokens"),
    output_len=IntRange(16, 4096, label="output tokens"),
    tpot_ms=FloatRange(10.0, 200.0, 1.0, label="TPOT target (ms)"),
    mean_rate=FloatRange(0.1, 1000.0, 0.1, label="mean requests/s"),
    peak_to_trough=FloatRange(1.0, 10.0, 0.1, label="peak / trough"),
    cooldown_min=FloatRange(0.0, 120.0, 1.0, label="scale-down cooldown (min)"),
    burst_factor=FloatRange(1.0, 3.0, 0.05, label="30-min burst at 9:00 (x demand)"),
    predictive=Choice((True, False), label="scale ahead by the start time"),
)
def diurnal_view(model: str, gpu: str, tp: int, prompt_len: int, output_len: int, tpot_ms: float, mean_rate: float,
                 peak_to_trough: float, cooldown_min: float, burst_factor: float, predictive: bool) -> View:
    """N040: a cosine day against the fixed peak fleet and an autoscaler that waits for replicas to start."""
    from lib.fleet.capacity import gpu_hour_usd
    from lib.registry import assumptions

    cost, start = _cost(model, gpu, tp, prompt_len, output_len, tpot_ms)
    fixed = diurnal.fixed_fleet(cost, mean_rate, peak_to_trough)
    if fixed.replicas > 20000:
        raise ValueError(f"{fmt_int(fixed.replicas)} replicas at the peak: lower the rate (the explorer stops at 20,000)")
    lead = start.total_s + 60.0 if predictive else 0.0
    auto = diurnal.autoscale_day(cost, mean_rate, peak_to_trough, start.total_s, lead_s=lead,
                                 cooldown_s=cooldown_min * 60.0, burst_hour=9.0, burst_s=1800.0,
                                 burst_factor=burst_factor)
    floor = diurnal.fluid_replica_hours(cost, mean_rate)
    price = gpu_hour_usd(cost.dep.chip) * cost.dep.gpus_per_replica
    costs = diurnal.day_costs(fixed, auto, price, assumptions.value("fleet.reserved_discount"))
    rows = [("fixed fleet for the peak", f"{fmt_int(fixed.replicas)} replicas ({fmt_int(fixed.gpus)} GPUs)"),
            ("its day-long busy fraction", fmt_pct(fixed.busy_fraction)),
            ("replica start", fmt_duration(start.total_s)),
            ("replica-hours: fixed / autoscaled / floor",
             f"{sig(fixed.paid_replica_h)} / {sig(auto.paid_replica_h)} / {sig(floor)}"),
            ("minutes over plan / overloaded", f"{sig(auto.over_plan_min)} / {sig(auto.overload_min)}"),
            ("fixed, reserved", fmt_usd(costs.fixed_reserved) + " a day"),
            ("autoscaled, on demand", fmt_usd(costs.auto_on_demand) + " a day"),
            (f"{costs.base_replicas} reserved + on demand", fmt_usd(costs.hybrid) + " a day")]
    caption = (f"Replicas over a day with peak {sig(peak_to_trough)}x the trough: the fixed fleet of {fmt_int(fixed.replicas)} "
               f"is {fmt_pct(fixed.busy_fraction)} busy on average; the autoscaler pays {sig(auto.paid_replica_h)} "
               f"replica-hours against {sig(fixed.paid_replica_h)}, and the 9:00 burst leaves it "
               f"{sig(auto.overload_min)} minutes overloaded.")
    hours = auto.t_s / 3600.0
    fig = _FIGURE(hours, auto.need, auto.paid, auto.ready, fixed.replicas)
    return View(f"A day of {sig(mean_rate)} requests/s on average", rows, fig, caption=caption,
                note=f"cheapest: {costs.cheapest}",
                values={"fixed": fixed.replicas, "auto_h": auto.paid_replica_h, "overload_min": auto.overload_min})


# ---- I070 regional-failover-capacity: the smallest fleet that survives one region's loss ----------------


def _build_fail(fig) -> SimpleNamespace:
    from lib.fleet.regions import REGIONS

    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    x = np.arange(len(REGIONS))
    a.base = ax.bar(x, np.ones(len(x)), color="C0", label="own load at the planned utilization")
    a.spare = ax.bar(x, np.ones(len(x)), bottom=np.ones(len(x)), color="C1", label="spare for a neighbour's loss")
    ax.set_xticks(x, REGIONS)
    ax.set_ylabel("replicas")
    ax.grid(True, axis="y")
    return a


def _draw_fail(a, base, spare) -> None:
    for b, s, nb, ns in zip(a.base, a.spare, base, spare, strict=True):
        b.set_height(nb)
        s.set_y(nb)
        s.set_height(ns)
    a.ax.set_ylim(0, 1.15 * max(1.0, max(nb + ns for nb, ns in zip(base, spare, strict=True))))
    figures.legend(a.ax, [a.base, a.spare], fontsize=7, loc="upper right")


_FAIL_FIGURE = figures.LiveFigure(6.0, 3.0, _build_fail, _draw_fail)


@explorer(
    "fleet.failover",
    us_east=FloatRange(0.0, 50.0, 0.5, label="us-east requests/s"),
    us_west=FloatRange(0.0, 50.0, 0.5, label="us-west requests/s"),
    eu_west=FloatRange(0.0, 50.0, 0.5, label="eu-west requests/s"),
    ap_northeast=FloatRange(0.0, 50.0, 0.5, label="ap-northeast requests/s"),
    eu_central=FloatRange(0.0, 50.0, 0.5, label="eu-central requests/s"),
    per_replica_rate=FloatRange(0.2, 20.0, 0.1, label="requests/s one busy replica completes"),
    max_rtt_ms=FloatRange(50.0, 250.0, 5.0, label="failover latency budget (ms RTT)"),
    failover_util=FloatRange(0.7, 1.0, 0.01, label="utilization allowed during a failover"),
    outage_min=FloatRange(0.5, 60.0, 0.5, label="minutes until spare could start (detect + start)"),
)
def failover_view(us_east: float, us_west: float, eu_west: float, ap_northeast: float, eu_central: float,
                  per_replica_rate: float, max_rtt_ms: float, failover_util: float, outage_min: float) -> View:
    """I070: the smallest per-region fleet that survives any one region's loss within a latency budget,
    and what each loss would cost in error budget with no spare."""
    from lib.fleet import regions
    from lib.fleet.capacity import default_utilization

    rates = {"us-east": us_east, "us-west": us_west, "eu-west": eu_west, "ap-northeast": ap_northeast,
             "eu-central": eu_central}
    live = [r for r in regions.REGIONS if rates[r] > 0]
    if len(live) < 2:
        raise ValueError("give at least two regions some load: a single region has nothing to fail over to")
    if failover_util < default_utilization():
        raise ValueError(f"the failover utilization must be at least the planned {default_utilization():.2f}")
    ls = [rates[r] for r in live]
    nbrs = regions.neighbors(live, max_rtt_ms)
    stranded = [r for r, nb in zip(live, nbrs, strict=True) if not nb]
    if stranded:
        raise ValueError(f"{', '.join(stranded)}: no region within {max_rtt_ms:g} ms to fail over to; raise the budget")
    plan = regions.n_minus_one(ls, nbrs, per_replica_rate, failover_util)
    bare = [regions.shortfall(ls, plan.base, nbrs, j, per_replica_rate, failover_util) for j in range(len(live))]
    worst = int(np.argmax(bare))
    budget = regions.failover_budget(bare[worst], sum(ls), outage_min * 60.0, 0.999)
    base = [0] * len(regions.REGIONS)
    spare = [0] * len(regions.REGIONS)
    for name, b, s in zip(live, plan.base, plan.spare, strict=True):
        base[regions.REGIONS.index(name)], spare[regions.REGIONS.index(name)] = b, s
    rows = [("regions and their failover neighbours",
             "; ".join(f"{n}: {', '.join(live[i] for i in nb) or 'none'}" for n, nb in zip(live, nbrs, strict=True))),
            ("replicas without spare", fmt_int(sum(plan.base))),
            ("smallest N-1 fleet", f"{fmt_int(plan.total)} (+{fmt_pct(plan.overhead)})"),
            ("spare by region", ", ".join(f"{n} {s}" for n, s in zip(live, plan.spare, strict=True))),
            ("worst loss with no spare", f"{live[worst]}: {sig(bare[worst])} requests/s unserved"),
            ("99.9% monthly budget it spends", fmt_pct(budget))]
    caption = (f"Replicas per region (own load, and spare for a neighbour's loss within {sig(max_rtt_ms)} ms): "
               f"{fmt_int(plan.total)} replicas survive any single region's loss, {fmt_pct(plan.overhead)} over the "
               f"{fmt_int(sum(plan.base))} the loads need.")
    fig = _FAIL_FIGURE(base, spare)
    return View("Capacity for the loss of one region", rows, fig, caption=caption,
                note=f"spare: {fmt_int(sum(plan.spare))} replicas",
                values={"total": plan.total, "base": sum(plan.base), "budget": budget})


# ---- N062 multi-region-serving: the retry stampede after a region drops ---------------------------------


def _build_stampede(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.now = ax.plot([0.0], [0.0], color="C3", lw=1.2, drawstyle="steps-post", label="immediate retries")[0]
    a.jit = ax.plot([0.0], [0.0], color="C0", lw=1.4, drawstyle="steps-post", label="retries with jittered backoff")[0]
    a.cap = ax.axhline(1.0, color="0.3", ls=":", lw=1.2, label="survivors' spare capacity")
    figures.log_scale(ax, "y")
    ax.set_xlabel("seconds after routing flips to the survivors")
    ax.set_ylabel("requests/s arriving at the survivors")
    ax.grid(True)
    return a


def _draw_stampede(a, t, now, jit, cap) -> None:
    a.now.set_data(t, np.maximum(now, 0.1))
    a.jit.set_data(t, np.maximum(jit, 0.1))
    a.cap.set_ydata([cap, cap])
    a.ax.set_xlim(0, t[-1] + 1)
    a.ax.set_ylim(0.5 * max(0.2, min(cap, float(np.min(jit[jit > 0])) if np.any(jit > 0) else cap)),
                  2.0 * max(cap, float(np.max(now)), float(np.max(jit))))
    figures.legend(a.ax, [a.now, a.jit, a.cap], fontsize=7, loc="upper right")


_STAMPEDE_FIGURE = figures.LiveFigure(6.0, 3.2, _build_stampede, _draw_stampede)


@explorer(
    "fleet.stampede",
    lost_rate=FloatRange(0.5, 500.0, 0.5, label="lost region's requests/s"),
    request_s=FloatRange(1.0, 120.0, 1.0, label="mean request duration (s)"),
    detect_s=FloatRange(0.0, 300.0, 5.0, label="seconds until routing flips"),
    spread_s=FloatRange(1.0, 120.0, 1.0, label="retry jitter window (s)"),
    spare_rate=FloatRange(0.5, 1000.0, 0.5, label="survivors' spare capacity (requests/s)"),
    seed=IntRange(0, 1000, label="seed"),
)
def stampede_view(lost_rate: float, request_s: float, detect_s: float, spread_s: float, spare_rate: float,
                  seed: int) -> View:
    """N062: arrivals at the survivors in the minute after routing flips to them, ``detect_s`` after a region drops:
    the clients retrying then (the requests open at the drop and every one that failed until the flip), immediate
    retries against retries spread over a jitter window, against the survivors' spare capacity."""
    from lib.fleet import regions
    from lib.scheduling.queueing import littles_law

    in_flight = littles_law(arrival_rate=lost_rate, W=request_s)
    if in_flight > 1e6:
        raise ValueError(f"{in_flight:.3g} requests in flight is beyond the explorer's simulation (1e6)")
    retrying = in_flight + lost_rate * detect_s
    if retrying > 1e6:
        raise ValueError(f"{retrying:.3g} clients retrying at the flip is beyond the explorer's simulation (1e6)")
    now = regions.retry_arrivals(retrying, lost_rate, 1.0, 60.0, seed)
    jit = regions.retry_arrivals(retrying, lost_rate, spread_s, 60.0, seed + 1)
    t = np.arange(now.size, dtype=float)
    over_now = float(np.maximum(0.0, now - spare_rate).sum())
    over_jit = float(np.maximum(0.0, jit - spare_rate).sum())
    rows = [("requests in flight when it drops", fmt_int(in_flight)),
            ("clients retrying when routing flips", fmt_int(retrying)),
            ("peak, immediate retries", f"{sig(now.max())} requests/s"),
            (f"peak, jitter over {sig(spread_s)} s", f"{sig(jit.max())} requests/s"),
            ("closed form with jitter", f"{sig(regions.retry_peak_rate(retrying, lost_rate, spread_s))} requests/s"),
            ("requests above spare: immediate / jittered", f"{fmt_int(over_now)} / {fmt_int(over_jit)}")]
    caption = (f"Arrivals at the survivors after routing flips, {sig(detect_s)} s after a region carrying {sig(lost_rate)} "
               f"requests/s dropped with {fmt_int(in_flight)} requests open, so {fmt_int(retrying)} clients are retrying "
               f"(log y): immediate retries peak at {sig(now.max())} requests/s, "
               f"jitter over {sig(spread_s)} s at {sig(jit.max())}, against {sig(spare_rate)} of spare capacity.")
    fig = _STAMPEDE_FIGURE(t, now, jit, spare_rate)
    return View("The retry stampede", rows, fig, caption=caption,
                note="jitter fits the spare" if jit.max() <= spare_rate else "shed or queue the excess",
                values={"in_flight": in_flight, "retrying": retrying, "peak_now": float(now.max()), "peak_jit": float(jit.max())})
