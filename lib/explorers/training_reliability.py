"""Explorers for failures, checkpoints and stragglers (N017 checkpoint interval, N021 restart loss,
N063 checkpoint storage, N018 straggler tax).

Views call lib only: :mod:`lib.training.reliability` (failure rate, Young / Daly, lost fractions),
:mod:`lib.training.checkpoint` (checkpoint bytes), the storage tiers of
:mod:`lib.kvcache.recompute_fetch` (per-GPU bandwidth to network storage and to host memory).
Each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.units import fmt_bytes, fmt_pct, fmt_time, sig

MODES = ("one writer", "sharded", "asynchronous")
NODE_GPUS = 8  # GPUs that share one node's front-end (storage) NIC


@functools.lru_cache(maxsize=256)
def checkpoint_modes(model: str, gpu: str, n_gpus: int, storage_tbps: float, restart_s: float,
                     mtbf_s: float | None = None) -> SimpleNamespace:
    """The three ways to write a checkpoint of ``model`` from ``n_gpus`` ``gpu``s, each with its
    blocking time, background drain, optimum interval and lost fraction at it.

    * one writer: rank 0 gathers the state and writes it through its node's storage NIC
      (``NODE_GPUS`` x the per-GPU share of the ``network_storage`` tier);
    * sharded: every rank writes its own 1/n slice through its share, the store capped at
      ``storage_tbps``; the job blocks until the write ends;
    * asynchronous: every rank copies its slice to host memory (the ``host_dram`` tier) and the
      job goes on while the sharded write drains in the background.
    ``mtbf_s`` defaults to :func:`lib.training.reliability.job_mtbf_s` at Llama 3's rate.
    """
    from lib.kvcache.recompute_fetch import storage_tier
    from lib.training import reliability as rel
    from lib.training.checkpoint import checkpoint_bytes

    total = checkpoint_bytes(model)
    m = rel.job_mtbf_s(n_gpus) if mtbf_s is None else mtbf_s
    share = storage_tier("network_storage", gpu).bandwidth
    host = storage_tier("host_dram", gpu).bandwidth
    cap = storage_tbps * 1e12
    one = rel.checkpoint_transfer_s(total, 1, NODE_GPUS * share, cap)
    sharded = rel.checkpoint_transfer_s(total, n_gpus, share, cap)
    snapshot = rel.checkpoint_transfer_s(total / n_gpus, 1, host)
    out = {}
    for mode, block, drain in (("one writer", one, 0.0), ("sharded", sharded, 0.0),
                               ("asynchronous", snapshot, sharded)):
        tau = rel.async_interval_s(block, drain, m) if drain else rel.young_interval_s(block, m)
        out[mode] = SimpleNamespace(blocking_s=block, drain_s=drain, interval_s=tau,
                                    lost=rel.async_lost_fraction(tau, block, drain, m, restart_s))
    return SimpleNamespace(total_bytes=total, mtbf_s=m, share=share, host=host, cap=cap, modes=out,
                           storage_binds=n_gpus * share > cap)


def loss_curve(plan: SimpleNamespace, mode: str, restart_s: float, taus: np.ndarray) -> np.ndarray:
    """Lost fraction of ``mode`` at each interval (NaN below an asynchronous write's drain)."""
    from lib.training import reliability as rel

    w = plan.modes[mode]
    return np.array([rel.async_lost_fraction(t, w.blocking_s, w.drain_s, plan.mtbf_s, restart_s)
                     if t >= w.drain_s else math.nan for t in taus])


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, lines={}, dots={})
    for k, mode in enumerate(MODES):
        a.lines[mode] = ax.plot([1.0], [1.0], color=f"C{k}", lw=1.8, label=mode)[0]
        a.dots[mode] = ax.plot([1.0], [1.0], "o", color=f"C{k}", ms=5)[0]
    a.floor = ax.axhline(1.0, color="0.4", ls=":", lw=1.2, label="restarts alone (R / M)")
    figures.log_scale(ax, "both")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("fraction of wall time lost")
    ax.grid(True)
    return a


def _draw(a, taus_min, curves, optima, floor) -> None:
    ys = []
    for mode in MODES:
        a.lines[mode].set_data(taus_min, curves[mode])
        a.dots[mode].set_data([optima[mode][0]], [optima[mode][1]])
        ys += [v for v in curves[mode] if math.isfinite(v)]
    a.floor.set_ydata([floor, floor])
    a.floor.set_visible(floor > 0)
    lo = min(ys + ([floor] if floor > 0 else []))
    a.ax.set_ylim(max(lo / 1.5, 1e-5), 1.2)
    a.ax.set_xlim(taus_min[0], taus_min[-1])
    figures.legend(a.ax, list(a.lines.values()) + [a.floor], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "training.checkpoint_interval",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    n_gpus=IntRange(8, 131072, log=True, label="GPUs in the job"),
    storage_tbps=FloatRange(0.1, 50.0, 0.1, label="storage write bandwidth (TB/s)"),
    restart_min=FloatRange(0.0, 120.0, 0.5, label="restart (minutes)"),
)
def checkpoint_interval(model: str, gpu: str, n_gpus: int, storage_tbps: float, restart_min: float) -> View:
    """N017: the lost fraction against the checkpoint interval for three ways to write it."""
    r = restart_min * 60.0
    plan = checkpoint_modes(model, gpu, n_gpus, storage_tbps, r)
    m = plan.mtbf_s
    taus = np.logspace(math.log10(5.0), math.log10(max(4 * m, 3600.0)), 60)
    curves = {mode: loss_curve(plan, mode, r, taus) for mode in MODES}
    optima = {mode: (w.interval_s / 60.0, w.lost) for mode, w in plan.modes.items()}
    rows = [("checkpoint", f"{fmt_bytes(plan.total_bytes, 'TB')} (14 bytes per parameter)"),
            ("job MTBF", f"{sig(m / 3600)} h")]
    for mode, w in plan.modes.items():
        block = fmt_time(w.blocking_s) + (f" (drains in {fmt_time(w.drain_s)})" if w.drain_s else "")
        rows.append((f"{mode}: blocks", block))
        rows.append((f"{mode}: best interval, lost", f"{sig(w.interval_s / 60)} min, {fmt_pct(w.lost)}"))
    one, sh, asy = (plan.modes[k] for k in MODES)
    caption = (f"Lost fraction of wall time against the interval (log-log), dots at each optimum: one writer "
               f"loses {fmt_pct(one.lost)}, a sharded write {fmt_pct(sh.lost)}, an asynchronous one {fmt_pct(asy.lost)}; "
               f"restarts alone cost {fmt_pct(r / m)} (dotted).")
    fig = _FIGURE(taus / 60.0, curves, optima, r / m)
    return View(f"Checkpoint interval: {model} on {n_gpus:,} x {gpu}", rows, fig, caption=caption,
                note="storage cap binds the sharded write" if plan.storage_binds else
                "the GPUs' storage NICs bind the sharded write",
                values={"mtbf_s": m, **{f"lost_{k.replace(' ', '_')}": w.lost for k, w in plan.modes.items()}})


# ---- N021: the restart taken apart ------------------------------------------------------------------------------------

CAUSES = ("detection", "rescheduling", "reload", "rewound", "checkpoint")
SCENARIOS = ("as run", "in-memory checkpoint", "every lever")


@functools.lru_cache(maxsize=256)
def restart_scenarios(model: str, gpu: str, n_gpus: int, storage_tbps: float, detect_min: float,
                      reschedule_min: float, init_min: float, peers: int = 1) -> dict:
    """The lost fraction by cause (:func:`lib.training.reliability.restart_loss_breakdown`) in three
    scenarios, each at its own optimum interval:

    * ``as run``: a sharded, blocking write to storage (Young's interval), the restart reads it back
      from storage;
    * ``in-memory checkpoint``: each GPU snapshots its slice to host memory (blocking) and copies it
      to ``peers`` other nodes' memory over RDMA (the drain); the restart reads the slice from a peer;
    * ``every lever``: the in-memory checkpoint plus detection, rescheduling and relaunch at the low
      ends of their assumed ranges (``training.restart_*``), or the given times where lower.
    Each value: SimpleNamespace(parts, lost, interval_s, blocking_s, drain_s, reload_s, restart_s)."""
    from lib.kvcache.recompute_fetch import storage_tier
    from lib.registry import assumptions
    from lib.training import reliability as rel
    from lib.training.checkpoint import checkpoint_bytes

    total = checkpoint_bytes(model)
    m = rel.job_mtbf_s(n_gpus)
    share = storage_tier("network_storage", gpu).bandwidth
    host = storage_tier("host_dram", gpu).bandwidth
    rdma = storage_tier("rdma_remote", gpu).bandwidth
    slice_b = total / n_gpus
    sharded = rel.checkpoint_transfer_s(total, n_gpus, share, storage_tbps * 1e12)
    snap = rel.checkpoint_transfer_s(slice_b, 1, host)
    to_peers = rel.checkpoint_transfer_s(peers * slice_b, 1, rdma)
    from_peer = rel.checkpoint_transfer_s(slice_b, 1, rdma)
    lows = {k: assumptions.value_range(f"training.restart_{k}_minutes")[0] * 60 for k in ("detect", "reschedule", "init")}
    out = {}
    for name, block, drain, read, det, sched, init in (
            ("as run", sharded, 0.0, sharded, detect_min * 60, reschedule_min * 60, init_min * 60),
            ("in-memory checkpoint", snap, to_peers, from_peer, detect_min * 60, reschedule_min * 60, init_min * 60),
            ("every lever", snap, to_peers, from_peer, min(lows["detect"], detect_min * 60),
             min(lows["reschedule"], reschedule_min * 60), min(lows["init"], init_min * 60))):
        tau = rel.async_interval_s(block, drain, m) if drain else rel.young_interval_s(block, m)
        parts = rel.restart_loss_breakdown(m, tau, det, sched, init + read, blocking_s=block, drain_s=drain)
        out[name] = SimpleNamespace(parts=parts, lost=sum(parts.values()), interval_s=tau, blocking_s=block,
                                    drain_s=drain, reload_s=init + read, read_s=read,
                                    restart_s=det + sched + init + read, detect_s=det, reschedule_s=sched)
    return {"mtbf_s": m, "slice_bytes": slice_b, "total_bytes": total, "scenarios": out}


def _build_bars(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.25, right=0.97, bottom=0.2, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, bars={})
    for k, cause in enumerate(CAUSES):
        a.bars[cause] = ax.barh(range(len(SCENARIOS)), [0.0] * len(SCENARIOS), color=f"C{k}", label=cause)
    ax.set_yticks(range(len(SCENARIOS)), SCENARIOS, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("fraction of wall time lost (%)")
    ax.grid(True, axis="x")
    return a


def _draw_bars(a, table) -> None:
    left = [0.0] * len(SCENARIOS)
    for cause in CAUSES:
        widths = [100 * table[s][cause] for s in SCENARIOS]
        for i, (bar, w) in enumerate(zip(a.bars[cause], widths, strict=True)):
            bar.set_x(left[i])
            bar.set_width(w)
        left = [x + w for x, w in zip(left, widths, strict=True)]
    a.ax.set_xlim(0, max(left) * 1.05 or 1.0)
    figures.legend(a.ax, list(a.bars.values()), fontsize=7, loc="lower right")


_BARS = figures.LiveFigure(6.0, 2.6, _build_bars, _draw_bars)


@explorer(
    "training.restart_loss",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    n_gpus=IntRange(8, 131072, log=True, label="GPUs in the job"),
    storage_tbps=FloatRange(0.1, 50.0, 0.1, label="storage bandwidth (TB/s)"),
    detect_min=FloatRange(0.0, 60.0, 0.5, label="detection (minutes)"),
    reschedule_min=FloatRange(0.0, 60.0, 0.5, label="rescheduling (minutes)"),
    init_min=FloatRange(0.0, 30.0, 0.5, label="relaunch before the read (minutes)"),
)
def restart_loss(model: str, gpu: str, n_gpus: int, storage_tbps: float, detect_min: float,
                 reschedule_min: float, init_min: float) -> View:
    """N021: the lost fraction by cause, as run, with in-memory checkpoints, and with every lever pulled."""
    d = restart_scenarios(model, gpu, n_gpus, storage_tbps, detect_min, reschedule_min, init_min)
    sc = d["scenarios"]
    rows = [("failures a day", sig(86400 / d["mtbf_s"]))]
    for name in SCENARIOS:
        s = sc[name]
        rows.append((name, f"{fmt_pct(s.lost)} lost; interval {fmt_time(s.interval_s) if s.interval_s < 120 else sig(s.interval_s / 60) + ' min'}"
                           f", restart {sig(s.restart_s / 60)} min"))
    base, best = sc["as run"], sc["every lever"]
    top = max(CAUSES, key=lambda c: base.parts[c])
    caption = (f"Lost fraction by cause: as run {fmt_pct(base.lost)} (largest: {top}), with in-memory checkpoints "
               f"{fmt_pct(sc['in-memory checkpoint'].lost)}, with every lever {fmt_pct(best.lost)}, the residual that "
               "only fewer failures remove.")
    fig = _BARS({s: sc[s].parts for s in SCENARIOS})
    return View(f"Restart loss: {model} on {n_gpus:,} x {gpu}", rows, fig, caption=caption,
                values={f"lost_{s.replace(' ', '_').replace('-', '_')}": sc[s].lost for s in SCENARIOS})


def _build_pareto(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.88, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    a = SimpleNamespace(ax=ax, ax2=ax2)
    a.tau = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="best interval (left)")[0]
    a.loss = ax2.plot([1.0], [1.0], color="C3", lw=1.8, ls="--", label="checkpoint + rewind loss (right)")[0]
    a.pts = ax.plot([1.0], [1.0], "o", color="C0", ms=5)[0]
    a.pts2 = ax2.plot([1.0], [1.0], "o", color="C3", ms=5)[0]
    a.labels = [ax.text(0, 0, "", fontsize=7) for _ in range(4)]
    for axis in (ax, ax2):
        figures.log_scale(axis, "both")
    ax.set_xlabel("time the job blocks per checkpoint (s)")
    ax.set_ylabel("best interval (minutes)")
    ax2.set_ylabel("lost fraction")
    ax.grid(True)
    return a


def _draw_pareto(a, cs, taus_min, losses, marks) -> None:
    a.tau.set_data(cs, taus_min)
    a.loss.set_data(cs, losses)
    a.pts.set_data([m[1] for m in marks], [m[2] for m in marks])
    a.pts2.set_data([m[1] for m in marks], [m[3] for m in marks])
    for i, t in enumerate(a.labels):  # every label set on every call: unused ones emptied
        if i < len(marks):
            name, c, tau, _ = marks[i]
            t.set_position((c, tau * 1.3))
            t.set_text(name)
        else:
            t.set_text("")
    a.ax.set_xlim(cs[0], cs[-1])
    a.ax.set_ylim(min(taus_min) / 2, max(taus_min) * 3)
    a.ax2.set_ylim(min(losses) / 2, max(losses) * 3)
    figures.legend(a.ax, [a.tau, a.loss], fontsize=7, loc="upper left")


_PARETO = figures.LiveFigure(6.0, 3.2, _build_pareto, _draw_pareto)


def pareto_figure(mtbf_s: float, marks: list[tuple[str, float]]):
    """Young's optimum interval and the checkpoint-plus-rewind loss at it, sqrt(2 C / M), against
    the blocking time C (log-log: both slope 1/2), with named writes marked. Returns (Drawing, caption)."""
    from lib.training import reliability as rel

    lo = min(c for _, c in marks) / 3
    hi = max(c for _, c in marks) * 3
    cs = np.logspace(math.log10(lo), math.log10(hi), 40)
    taus = np.array([rel.young_interval_s(c, mtbf_s) for c in cs])
    losses = np.array([rel.lost_fraction(t, c, mtbf_s) for t, c in zip(taus, cs, strict=True)])
    pts = [(name, c, rel.young_interval_s(c, mtbf_s) / 60, rel.lost_fraction(rel.young_interval_s(c, mtbf_s), c, mtbf_s))
           for name, c in marks]
    caption = ("Young's best interval (solid) and the loss at it (dashed) against the blocking time, both "
               "slope one half on log-log axes: " + "; ".join(f"{n} {fmt_pct(loss)} every {sig(t)} min"
                                                            for n, _, t, loss in pts) + ".")
    return _PARETO(cs, taus / 60, losses, pts), caption


# ---- N063: checkpoint storage ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def storage_numbers(model: str, n_gpus: int, interval_min: float, burst_s: float, run_days: float,
                    keep_last: int, keep_every: int) -> SimpleNamespace:
    """The burst plan (:func:`lib.training.checkpoint.storage_plan`), the node's NVMe drives the fast
    tier needs (``lib.kvcache.tiering.default_node``'s drives and write rate), and retention over a
    run of ``run_days`` (:func:`lib.training.checkpoint.retained_count`)."""
    from lib.kvcache.tiering import default_node
    from lib.training import checkpoint as ck

    plan = ck.storage_plan(ck.checkpoint_bytes(model), n_gpus, interval_min * 60.0, burst_s)
    node = default_node()
    saves = int(run_days * 86400 // plan.interval_s)
    kept = ck.retained_count(saves, keep_last, keep_every)
    return SimpleNamespace(
        plan=plan, node=node, drives=ck.drives_for(plan.node_burst_bandwidth, node.ssd_write_bandwidth),
        nvme_write_s=plan.bytes_per_node / (node.ssd_drives * node.ssd_write_bandwidth),
        saves=saves, kept=kept, all_bytes=saves * plan.checkpoint_bytes, kept_bytes=kept * plan.checkpoint_bytes,
        fast_bytes_per_node=(keep_last + 1) * plan.bytes_per_node,
        fast_capacity_per_node=node.ssd_drives * node.ssd_capacity_bytes)


def _build_timeline(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.burst = ax.plot([1.0], [1.0], color="C3", lw=1.6, label="GPUs to the fast tier")[0]
    a.drain = ax.plot([1.0], [1.0], color="C0", lw=1.6, label="fast tier to durable storage")[0]
    a.avg = ax.axhline(1.0, color="0.4", ls=":", lw=1.2, label="average")
    figures.log_scale(ax, "y")
    ax.set_xlabel("time (minutes)")
    ax.set_ylabel("write rate (GB/s)")
    ax.grid(True)
    return a


def _draw_timeline(a, t_b, y_b, t_d, y_d, avg, top) -> None:
    a.burst.set_data(t_b, y_b)
    a.drain.set_data(t_d, y_d)
    a.avg.set_ydata([avg, avg])
    a.ax.set_xlim(0, t_b[-1])
    a.ax.set_ylim(avg / 10, top * 3)
    figures.legend(a.ax, [a.burst, a.drain, a.avg], fontsize=7, loc="upper right")


_TIMELINE = figures.LiveFigure(6.0, 3.0, _build_timeline, _draw_timeline)


def _steps(starts, width, height, end, floor):
    """x, y of a rate that is ``height`` for ``width`` from each start, ``floor`` otherwise."""
    xs, ys = [0.0], [floor]
    for s in starts:
        xs += [s, s, s + width, s + width]
        ys += [floor, height, height, floor]
    xs.append(end)
    ys.append(floor)
    return xs, ys


@explorer(
    "training.checkpoint_storage",
    model=Choice(tuple(models.model_names())),
    n_gpus=IntRange(8, 131072, log=True, label="GPUs in the job"),
    interval_min=FloatRange(1.0, 240.0, 1.0, label="checkpoint interval (minutes)"),
    burst_s=FloatRange(1.0, 600.0, 1.0, label="write must land within (s)"),
    run_days=FloatRange(1.0, 180.0, 1.0, label="run length (days)"),
    keep_last=IntRange(1, 20, label="keep the last"),
    keep_every=IntRange(1, 1000, label="and every k-th"),
)
def checkpoint_storage(model: str, n_gpus: int, interval_min: float, burst_s: float, run_days: float,
                       keep_last: int, keep_every: int) -> View:
    """N063: the burst that sizes the fast tier, the drain that sizes durable storage, retention."""
    s = storage_numbers(model, n_gpus, interval_min, burst_s, run_days, keep_last, keep_every)
    p = s.plan
    gb = 1e9
    rows = [("checkpoint", f"{fmt_bytes(p.checkpoint_bytes, 'TB')}, {fmt_bytes(p.bytes_per_gpu, 'GB')} per GPU"),
            ("burst (fast tier)", f"{sig(p.burst_bandwidth / gb)} GB/s for {sig(burst_s)} s"),
            ("average", f"{sig(p.average_bandwidth / gb)} GB/s ({sig(p.peak_to_average)}x below the burst)"),
            ("per node", f"{fmt_bytes(p.bytes_per_node, 'GB')} at {sig(p.node_burst_bandwidth / gb)} GB/s: "
                         f"{s.drives} NVMe drive(s) of {s.node.ssd_drives}"),
            ("drain (durable tier)", f"{sig(p.drain_bandwidth / gb)} GB/s"),
            ("checkpoints over the run", f"{s.saves:,} ({fmt_bytes(s.all_bytes, 'TB')})"),
            ("kept", f"{s.kept:,} ({fmt_bytes(s.kept_bytes, 'TB')})"),
            ("fast tier per node", f"{fmt_bytes(s.fast_bytes_per_node, 'GB')} of {fmt_bytes(s.fast_capacity_per_node, 'TB')}")]
    iv = p.interval_s / 60
    t_b, y_b = _steps([0.0, iv], burst_s / 60, p.burst_bandwidth / gb, 2 * iv, p.average_bandwidth / gb / 100)
    t_d, y_d = _steps([burst_s / 60, iv + burst_s / 60], iv - burst_s / 60, p.drain_bandwidth / gb, 2 * iv,
                      p.average_bandwidth / gb / 100)
    caption = (f"Write rate over two intervals (log scale): the GPUs burst {sig(p.burst_bandwidth / gb)} GB/s into the "
               f"fast tier for {sig(burst_s)} s; the durable tier drains at {sig(p.drain_bandwidth / gb)} GB/s, "
               f"{sig(p.burst_bandwidth / p.drain_bandwidth)}x less, close to the {sig(p.average_bandwidth / gb)} GB/s average.")
    fig = _TIMELINE(t_b, y_b, t_d, y_d, p.average_bandwidth / gb, p.burst_bandwidth / gb)
    return View(f"Checkpoint storage: {model} on {n_gpus:,} GPUs every {sig(iv)} min", rows, fig, caption=caption,
                values={"burst_bandwidth": p.burst_bandwidth, "drain_bandwidth": p.drain_bandwidth, "kept": s.kept})


# ---- N018: the straggler tax ------------------------------------------------------------------------------------------

STRAGGLER_ROWS = ("healthy, no jitter", "jitter only", "clocks throttled", "slow link", "host stalls")


@functools.lru_cache(maxsize=256)
def straggler_table(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, interleave: int,
                    cv: float, clock_fraction: float, nic_fraction: float, host_stall_ms: float) -> SimpleNamespace:
    """The step of the layout (:func:`lib.training.step.training_step`) and the expected step time,
    over n = tp x pp x dp ranks with jitter ``cv``, healthy and with one rank slowed by each cause
    (:func:`lib.training.stragglers.straggler_step_s` for its step, then
    :func:`lib.training.stragglers.expected_slowest` for the maximum over the ranks)."""
    from lib.training import stragglers as sg
    from lib.training.step import TrainingLayout, training_step

    lay = TrainingLayout(model, gpu, tp=tp, pp=pp, dp=dp, micro_batches=micro_batches, interleave=interleave)
    n = lay.n_gpus
    if n < 2:
        raise ValueError(f"tp x pp x dp must be at least 2 GPUs: a straggler taxes the other ranks, and "
                         f"{lay.label} has none (got tp={tp}, pp={pp}, dp={dp})")
    st = training_step(lay)
    base = st.step_s
    slow = {"clocks throttled": sg.straggler_step_s(st, 1.0 / clock_fraction),
            "slow link": sg.straggler_step_s(st, 1.0, 1.0 / nic_fraction),
            "host stalls": sg.straggler_step_s(st, host_stall_s=host_stall_ms / 1e3)}
    expected = {"healthy, no jitter": base, "jitter only": base * sg.expected_slowest(n, cv)}
    for k, v in slow.items():
        expected[k] = base * sg.expected_slowest(n, cv, v / base)
    tax = {k: v / base - 1 for k, v in expected.items()}
    return SimpleNamespace(layout=lay, step=st, n=n, slow=slow, expected=expected, tax=tax,
                           idle={k: n * (1 - base / v) for k, v in expected.items()})


def _build_strag(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.25, right=0.97, bottom=0.18, top=0.95)
    ax = fig.add_subplot()
    bars = ax.barh(range(len(STRAGGLER_ROWS)), [1.0] * len(STRAGGLER_ROWS), color="C0")
    ax.set_yticks(range(len(STRAGGLER_ROWS)), STRAGGLER_ROWS, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("expected step time (s)")
    ax.grid(True, axis="x")
    texts = [ax.text(0, i, "", va="center", fontsize=7) for i in range(len(STRAGGLER_ROWS))]
    return SimpleNamespace(ax=ax, bars=bars, texts=texts)


def _draw_strag(a, values, taxes) -> None:
    top = max(values)
    for i, (bar, v, t, txt) in enumerate(zip(a.bars, values, taxes, a.texts, strict=True)):
        bar.set_width(v)
        bar.set_color("C0" if i < 2 else "C3")
        txt.set_position((v + 0.01 * top, i))
        txt.set_text(f"+{fmt_pct(t)}" if i else "")
    a.ax.set_xlim(0, top * 1.2)


_STRAG = figures.LiveFigure(6.0, 2.6, _build_strag, _draw_strag)


@explorer(
    "training.straggler_tax",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    pp=Choice((1, 2, 4, 8, 16), label="pipeline stages"),
    dp=IntRange(1, 1024, log=True, label="data parallel"),
    micro_batches=IntRange(1, 64, label="micro-batches per step"),
    interleave=Choice((1, 2, 4), label="interleaved stages"),
    cv=FloatRange(0.0, 0.05, 0.001, label="per-rank jitter (CV)"),
    clock_fraction=FloatRange(0.3, 1.0, 0.01, label="throttled clock (fraction)"),
    nic_fraction=FloatRange(0.1, 1.0, 0.01, label="slow link (fraction of its rate)"),
    host_stall_ms=FloatRange(0.0, 2000.0, 10.0, label="host stall per step (ms)"),
)
def straggler_tax(model: str, gpu: str, tp: int, pp: int, dp: int, micro_batches: int, interleave: int, cv: float,
                  clock_fraction: float, nic_fraction: float, host_stall_ms: float) -> View:
    """N018: the expected step time of a synchronous job, healthy and with one slow rank by cause."""
    t = straggler_table(model, gpu, tp, pp, dp, micro_batches, interleave, cv, clock_fraction, nic_fraction,
                        host_stall_ms)
    rows = [("layout", t.layout.label), ("step, MFU", f"{fmt_time(t.step.step_s)}, {fmt_pct(t.step.mfu)}")]
    for k in STRAGGLER_ROWS[1:]:
        rows.append((k, f"{fmt_time(t.expected[k])} (+{fmt_pct(t.tax[k])}, {sig(t.idle[k])} GPUs' worth idle)"))
    worst = max(STRAGGLER_ROWS[2:], key=lambda k: t.tax[k])
    caption = (f"Expected step time on {t.n:,} GPUs: jitter alone adds {fmt_pct(t.tax['jitter only'])}; one slow rank "
               f"adds up to {fmt_pct(t.tax[worst])} ({worst}), the whole job waiting for it.")
    fig = _STRAG([t.expected[k] for k in STRAGGLER_ROWS], [t.tax[k] for k in STRAGGLER_ROWS])
    return View(f"Straggler tax: {t.layout.label}", rows, fig, caption=caption,
                values={f"tax_{k.replace(' ', '_').replace(',', '')}": v for k, v in t.tax.items()})
