"""Explorers for fleet capacity over time: autoscaling on a traffic ramp (W03 routing-and-autoscaling).

Views call :mod:`lib.fleet.autoscaling` (fluid fleet simulation, warm spares) and
:mod:`lib.fleet.capacity` (request cost, replica start). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import autoscaling as asc
from lib.fleet import capacity, diurnal
from lib.units import fmt_duration, fmt_int, sig


@functools.lru_cache(maxsize=16)
def _fleet_facts(model: str, gpu: str, tp: int, prompt_len: int, output_len: int, tpot_s: float):
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    cost = capacity.request_cost(dep, prompt_len, output_len, tpot_s)
    return dep, cost, capacity.replica_start_s(dep).total_s


def autoscale_run(base_rate: float, peak_rate: float, ramp_min: float, policy: str, spares: int,
                  max_replicas: int = 200, model: str = "llama-3.1-70b", gpu: str = "h100-sxm", tp: int = 4,
                  prompt_len: int = 2000, output_len: int = 300, tpot_s: float = 0.05) -> SimpleNamespace:
    """A 30-minute window: ``base_rate`` for 5 minutes, a ramp to ``peak_rate`` over ``ramp_min`` minutes,
    then flat, on a fleet sized for the base at the planned utilization."""
    dep, cost, start = _fleet_facts(model, gpu, tp, prompt_len, output_len, tpot_s)
    u = capacity.default_utilization()
    rates = asc.ramp(1800.0, base_rate, peak_rate, 300.0, ramp_min * 60.0)
    n0 = min(max_replicas, capacity.fleet_for_load(base_rate, cost, u).replicas)
    request_s = cost.prefill_s + cost.output_len * cost.decode_step_s
    run = asc.simulate(rates, cost.replica_s, start, policy=policy, replicas0=n0, utilization=u, request_s=request_s,
                       spares=spares, max_replicas=max_replicas, gpus_per_replica=dep.gpus_per_replica)
    need = asc.spares_for_ramp(max(0.0, peak_rate - base_rate), ramp_min * 60.0, start, cost.replica_s, u)
    return SimpleNamespace(run=run, start_s=start, cost=cost, need=need, u=u)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    a = SimpleNamespace(ax=ax, ax2=ax2)
    a.demand = ax.plot([0], [0], color="0.3", lw=1.5, label="replicas the load needs")[0]
    a.ready = ax.plot([0], [0], color="C0", lw=1.8, label="ready replicas")[0]
    a.wait = ax2.plot([0], [0], color="C3", lw=1.2, ls="--", label="queue wait (right)")[0]
    ax.set_xlabel("minutes")
    ax.set_ylabel("replicas")
    ax2.set_ylabel("queue wait (s)")
    ax.grid(True)
    return a


def _draw(a, t_min, demand, ready, wait) -> None:
    a.demand.set_data(t_min, demand)
    a.ready.set_data(t_min, ready)
    a.wait.set_data(t_min, wait)
    a.ax.set_xlim(0, t_min[-1])
    a.ax.set_ylim(0, max(demand.max(), ready.max()) * 1.15 + 1)
    a.ax2.set_ylim(0, max(wait.max(), 1.0) * 1.15)
    figures.legend(a.ax, [a.demand, a.ready, a.wait], fontsize=7, loc="upper left")


_FIG = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "fleet.autoscale",
    base_rate=FloatRange(1.0, 200.0, 1.0, label="base load (requests/s)"),
    peak_rate=FloatRange(1.0, 400.0, 1.0, label="peak load (requests/s)"),
    ramp_min=FloatRange(0.0, 20.0, 0.5, label="ramp (minutes)"),
    policy=Choice(("queue", "gpu_util", "fixed"), label="autoscaler signal"),
    spares=IntRange(0, 40, label="warm spares"),
)
def autoscale(base_rate: float, peak_rate: float, ramp_min: float, policy: str, spares: int) -> View:
    """W03: a Llama-3.1-70B TP4 H100 fleet scaling through a traffic ramp on the queue, on GPU utilization
    or not at all, with warm spares."""
    s = autoscale_run(base_rate, peak_rate, ramp_min, policy, spares)
    r = s.run
    demand = r.rate * s.cost.replica_s / s.u
    rows = [("replica start (cold)", fmt_duration(s.start_s)),
            ("spares the ramp needs", fmt_int(s.need)),
            ("seconds with queue wait over 1 s", fmt_duration(r.slo_violation_s(1.0))),
            ("longest wait", fmt_duration(r.max_wait_s)),
            ("GPU-hours held (30 min)", sig(r.gpu_hours))]
    caption = (f"Replicas the load needs at {sig(100 * s.u)}% busy (grey) and ready replicas (blue) through a ramp "
               f"from {sig(base_rate)} to {sig(peak_rate)} requests/s, with the queue wait (red, right axis): the "
               f"{policy} autoscaler with {spares} warm spare(s) leaves {fmt_duration(r.slo_violation_s(1.0))} with waits "
               f"over 1 s and holds {sig(r.gpu_hours)} GPU-hours.")
    fig = _FIG(r.t / 60.0, demand, r.ready, r.wait_s)
    return View(f"Autoscaling on {policy}: {sig(base_rate)} -> {sig(peak_rate)} requests/s", rows, fig, caption=caption,
                values={"violation_s": r.slo_violation_s(1.0), "gpu_hours": r.gpu_hours})


# ---- N048 shared training and inference pool -----------------------------------------------------------

_DESIGNS = (("dedicated", "dedicated split", "C0", "-"), ("shared", "fully shared (reactive)", "C3", "--"),
            ("floor_borrow", "floor + borrow", "C2", "-"))


@functools.lru_cache(maxsize=32)
def pool_day(trough: float, peak: float, surge: float, surge_min: float, train_gpus: int, gang_gpus: int,
             model: str = "llama-3.1-70b", gpu: str = "h100-sxm", tp: int = 4, prompt_len: int = 2000,
             output_len: int = 300, tpot_s: float = 0.05, train_model: str = "llama-3.1-70b",
             teardown_s: float = 30.0) -> SimpleNamespace:
    """One day on a pool holding the dedicated serving fleet (peak + buffer) and ``train_gpus`` of training,
    under the three designs; a surge of ``surge`` requests/s over ``surge_min`` minutes at 10:00 is not in
    the forecast."""
    import math

    from lib.fleet import shared_pool as sp
    from lib.kvcache.recompute_fetch import storage_tier
    from lib.registry import assumptions
    from lib.training import reliability as rel
    from lib.training.checkpoint import checkpoint_bytes

    dep, cost, start = _fleet_facts(model, gpu, tp, prompt_len, output_len, tpot_s)
    u = capacity.default_utilization()
    forecast = sp.diurnal_rate(trough, peak)
    rates = sp.with_surge(forecast, surge, 10.0, surge_min * 60.0)
    save = rel.checkpoint_transfer_s(checkpoint_bytes(train_model), gang_gpus, storage_tier("network_storage", gpu).bandwidth,
                                     assumptions.value("training.checkpoint_storage_tbps") * 1e12)
    restart = 60.0 * (assumptions.value("training.restart_reschedule_minutes") +
                      assumptions.value("training.restart_init_minutes"))
    rec = sp.reclaim_s(save, teardown_s, start)
    buf = sp.buffer_for(diurnal.steepest_climb((trough + peak) / 2, peak / trough), surge, surge_min * 60.0, rec, cost.replica_s, u)
    n_ded = math.ceil(peak * cost.replica_s / u - 1e-9) + buf
    pool = n_ded * dep.gpus_per_replica + train_gpus
    floor = math.ceil(trough * cost.replica_s / u - 1e-9) + buf
    runs = {d: sp.simulate_day(rates, cost.replica_s, dep.gpus_per_replica, pool, gang_gpus, design=d, utilization=u,
                               reclaim=rec, save_s=save, restart_s=restart, buffer=buf if d == "floor_borrow" else 0,
                               floor=n_ded if d == "dedicated" else floor, forecast=forecast)
            for d, *_ in _DESIGNS}
    return SimpleNamespace(runs=runs, rates=rates, need=np.ceil(rates * cost.replica_s / u - 1e-9), reclaim_s=rec,
                           save_s=save, restart_s=restart, buffer=buf, n_ded=n_ded, pool=pool, floor=floor, u=u,
                           cost=cost, dep=dep, start_s=start)


def _build_pool(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, lines={})
    a.need = ax.plot([0], [0], color="0.3", lw=1.2, label="replicas the load needs")[0]
    for d, label, color, ls in _DESIGNS:
        a.lines[d] = ax.plot([0], [0], color=color, ls=ls, lw=1.6, label=f"serving holds: {label}")[0]
    ax.set_xlabel("hour of the day")
    ax.set_ylabel("serving replicas")
    ax.set_xlim(0, 24)
    ax.grid(True)
    return a


def _draw_pool(a, hours, need, held) -> None:
    a.need.set_data(hours, need)
    for d, y in held.items():
        a.lines[d].set_data(hours, y)
    top = max(float(need.max()), *(float(y.max()) for y in held.values()))
    a.ax.set_ylim(0, top * 1.2 + 1)
    figures.legend(a.ax, [a.need, *a.lines.values()], fontsize=7, loc="upper left")


_POOL = figures.LiveFigure(6.0, 3.0, _build_pool, _draw_pool)


@explorer(
    "fleet.shared_pool",
    trough=FloatRange(1.0, 200.0, 1.0, label="overnight load (requests/s)"),
    peak=FloatRange(1.0, 400.0, 1.0, label="daily peak (requests/s)"),
    surge=FloatRange(0.0, 200.0, 1.0, label="unforecast surge (requests/s)"),
    surge_min=FloatRange(0.0, 30.0, 0.5, label="surge ramp (minutes)"),
    train_gpus=IntRange(0, 4096, label="dedicated training GPUs"),
    gang_gpus=IntRange(8, 512, label="training gang (GPUs)"),
)
def shared_pool(trough: float, peak: float, surge: float, surge_min: float, train_gpus: int, gang_gpus: int) -> View:
    """N048: a day of serving and training on one pool (Llama-3.1-70B TP4 H100 serving, a 70B training job):
    dedicated split, fully shared, floor plus borrow."""
    if peak < trough:
        raise ValueError(f"the daily peak ({peak}) must be at least the overnight load ({trough})")
    if peak > 100 * trough:
        raise ValueError(f"the daily peak ({peak}) may be at most 100 times the overnight load ({trough}), the range "
                         "of the daily-curve model")
    s = pool_day(trough, peak, surge, surge_min, train_gpus, gang_gpus)
    rows = [("reclaim: checkpoint + teardown + replica start", fmt_duration(s.reclaim_s)),
            ("buffer held ahead of need", f"{fmt_int(s.buffer)} replicas")]
    for d, label, *_ in _DESIGNS:
        r = s.runs[d]
        rows.append((label, f"pool {sig(100 * r.utilization)}% useful, training {sig(r.train_useful_gpu_h)} GPU-h/day, "
                            f"serving overloaded {fmt_duration(r.short_s)}"))
    caption = (f"Serving replicas held through the day under each design against the replicas the load needs (grey); "
               f"a reclaim takes {fmt_duration(s.reclaim_s)}, so the fully shared pool is overloaded for "
               f"{fmt_duration(s.runs['shared'].short_s)} by the unforecast surge at 10:00 while floor plus borrow "
               f"is overloaded for {fmt_duration(s.runs['floor_borrow'].short_s)}.")
    hours = np.arange(s.rates.size) * s.runs["dedicated"].dt / 3600.0
    fig = _POOL(hours, s.need, {d: s.runs[d].held for d, *_ in _DESIGNS})
    return View(f"Shared pool: {sig(trough)} -> {sig(peak)} requests/s, {fmt_int(train_gpus)} training GPUs", rows, fig,
                caption=caption, values={d: s.runs[d].utilization for d, *_ in _DESIGNS})
