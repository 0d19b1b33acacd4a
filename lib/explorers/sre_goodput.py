"""Explorers for goodput accounting (N054) and training observability (N050).

:func:`goodput_run` assembles one run from lib: the step from :func:`lib.training.step.training_step`
on :func:`lib.training.layout.fleet_layout`, the sharded checkpoint write from
:func:`lib.explorers.training_reliability.checkpoint_modes`, the failure rate from
:func:`lib.training.reliability.job_mtbf_s`, restart parts and the other losses from
``data/assumptions.yaml`` (``training.restart_*``, ``sre.*``); the ledger is
:mod:`lib.sre.goodput_ledger`'s. One persistent figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.sre import straggler_detector as sd
from lib.units import fmt_int, fmt_pct, sig

BATCH_TOKENS = 16e6  # Llama 3 405B's global batch in its main pre-training stage (16M tokens)
SEQ_LEN = 8192  # the pre-training sequence (fleet_layout's default)
# What a multi-node pre-training run can use: models whose window holds the sequence, GPUs with a network figure.
TRAINING_MODELS = tuple(m for m in models.model_names() if models.model(m).max_position_embeddings >= SEQ_LEN)
TRAINING_GPUS = tuple(g for g in hardware.gpu_names() if hardware.gpu(g).scaleout_bandwidth)
EVAL_EVERY_H = 2.0  # an inline evaluation every two hours of progress
TIMELINE_H = 24.0  # hours of the run the timeline shows


@functools.lru_cache(maxsize=64)
def _fleet(model: str, gpu: str, n_gpus: int):
    """(layout, step, sharded checkpoint write) of ``model`` on ``n_gpus`` ``gpu``s."""
    from lib.explorers.training_reliability import checkpoint_modes
    from lib.registry import assumptions as a
    from lib.training.layout import fleet_layout
    from lib.training.step import training_step

    lay = fleet_layout(model, gpu, n_gpus, BATCH_TOKENS)
    write = checkpoint_modes(model, gpu, n_gpus, float(a.value("training.checkpoint_storage_tbps")), 0.0).modes["sharded"]
    return lay, training_step(lay), write


@functools.lru_cache(maxsize=64)
def goodput_run(model: str, gpu: str, n_gpus: int, work_days: float, checkpoint_min: float, detect_min: float,
                stragglers_per_day: float, eval_min: float, seed: int = 0, queue_h: float = 0.0) -> SimpleNamespace:
    """One simulated run of ``model`` on ``n_gpus`` ``gpu``s whose final model needs ``work_days`` of
    healthy steps, checkpointed (sharded, blocking) every ``checkpoint_min`` minutes of progress,
    failures detected in ``detect_min``, ``stragglers_per_day`` straggler episodes a day of running per
    16,384 GPUs (``training.llama3_gpus``; scaled with the job's size: more nodes, more slow ones),
    an inline evaluation of ``eval_min`` every two hours. Returns SimpleNamespace(spec, log, ledger,
    layout, step, mtbf_s, write)."""
    from lib.registry import assumptions as a
    from lib.sre import goodput_ledger as gl
    from lib.training import reliability as rel

    lay, step, write = _fleet(model, gpu, n_gpus)
    m = rel.job_mtbf_s(n_gpus)
    interval_steps = max(1, round(checkpoint_min * 60.0 / step.step_s))
    init_s = a.value("training.restart_init_minutes") * 60.0
    spec = gl.RunSpec(
        work_steps=max(1, round(work_days * 86400.0 / step.step_s)), step_s=step.step_s,
        interval_steps=interval_steps, checkpoint_s=write.blocking_s, mtbf_s=m,
        detect_s=detect_min * 60.0, reschedule_s=a.value("training.restart_reschedule_minutes") * 60.0,
        reload_s=init_s + write.blocking_s, startup_s=a.value("sre.job_startup_minutes") * 60.0,
        stall_prob=a.value("sre.data_stall_step_fraction"), stall_mean_s=a.value("sre.data_stall_mean_s"),
        straggler_episodes_per_day=stragglers_per_day * n_gpus / a.value("training.llama3_gpus"),
        straggler_slowdown=a.value("sre.straggler_slowdown"),
        straggler_episode_s=a.value("sre.straggler_episode_hours") * 3600.0,
        eval_every=max(1, round(EVAL_EVERY_H * 60.0 / max(checkpoint_min, 1e-9))) if eval_min > 0 else 0,
        eval_s=eval_min * 60.0,
        maintenance_per_day=(a.value("training.llama3_interruptions_total")
                             - a.value("training.llama3_interruptions_unexpected")) / a.value("training.llama3_interruption_days"),
        maintenance_s=a.value("sre.maintenance_minutes") * 60.0, queue_s=queue_h * 3600.0, n_gpus=n_gpus)
    log = gl.simulate_run(spec, seed)
    return SimpleNamespace(spec=spec, log=log, ledger=gl.ledger(log), layout=lay, step=step, mtbf_s=m, write=write)


def _build(fig) -> SimpleNamespace:
    from matplotlib.collections import PolyCollection

    from lib.sre.goodput_ledger import CATEGORIES, GOODPUT

    fig.subplots_adjust(left=0.36, right=0.97, bottom=0.2, top=0.95)
    ax = fig.add_subplot()
    names = (GOODPUT,) + CATEGORIES
    a = SimpleNamespace(ax=ax, names=names, polys={})
    for k, name in enumerate(names):
        pc = PolyCollection([], facecolors=f"C{k}", edgecolors="none")
        ax.add_collection(pc)
        a.polys[name] = pc
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel("hours since the allocation")
    return a


def _draw(a, boxes, hours, shares) -> None:
    for k, name in enumerate(a.names):
        a.polys[name].set_verts([[(s, k - 0.4), (e, k - 0.4), (e, k + 0.4), (s, k + 0.4)] for s, e in boxes.get(name, [])])
    a.ax.set_xlim(0, hours)
    a.ax.set_yticks(range(len(a.names)), [f"{n} ({fmt_pct(shares[n])})" for n in a.names], fontsize=7)


_FIGURE = figures.LiveFigure(6.4, 2.6, _build, _draw)


def timeline_boxes(log, hours: float) -> dict:
    """Per category, the (start, end) hours of the log's intervals that begin within ``hours``
    (a kept compute segment shows as goodput)."""
    from lib.sre.goodput_ledger import category_at

    out: dict = {}
    eps = hours / 1000.0  # stretches narrower than a thousandth of the window merge into their neighbours
    for iv in log.intervals:
        if iv.start_s >= hours * 3600.0:
            break
        if iv.length_s <= 0:
            continue
        cat = category_at(log, iv.start_s)
        s, e = iv.start_s / 3600.0, min(iv.end_s, hours * 3600.0) / 3600.0
        boxes = out.setdefault(cat, [])
        if boxes and s - boxes[-1][1] <= eps:
            boxes[-1] = (boxes[-1][0], e)
        elif e - s > eps / 10 or not boxes:
            boxes.append((s, e))
    return out


@explorer(
    "sre.goodput_ledger",
    model=Choice(TRAINING_MODELS),
    gpu=Choice(TRAINING_GPUS),
    n_gpus=IntRange(256, 65536, log=True, label="GPUs held"),
    work_days=FloatRange(1.0, 14.0, 1.0, label="days of healthy steps the final model needs"),
    checkpoint_min=FloatRange(5.0, 120.0, 1.0, label="checkpoint every (minutes of progress)"),
    detect_min=FloatRange(0.5, 30.0, 0.5, label="failure detection (minutes)"),
    stragglers_per_day=FloatRange(0.0, 5.0, 0.1, label="straggler episodes a day per 16,384 GPUs"),
    eval_min=FloatRange(0.0, 30.0, 0.5, label="inline evaluation every 2 h (minutes)"),
)
def goodput_ledger_view(model: str, gpu: str, n_gpus: int, work_days: float, checkpoint_min: float, detect_min: float,
                        stragglers_per_day: float, eval_min: float) -> View:
    """N054: the first day of the run, every stretch in its category, and the five categories ranked."""
    from lib.sre.goodput_ledger import CATEGORIES, GOODPUT, OWNERS

    r = goodput_run(model, gpu, n_gpus, work_days, checkpoint_min, detect_min, stragglers_per_day, eval_min)
    lg = r.ledger
    ranked = lg.ranked()
    rows = [("goodput", f"{fmt_pct(lg.goodput)} of {sig(lg.wall_s / 86400)} days held"),
            ("step, job MTBF", f"{sig(r.step.step_s)} s, {sig(r.mtbf_s / 3600)} h")]
    for c, f in ranked:
        rows.append((c, f"{fmt_pct(f)}, {fmt_int(lg.gpu_hours(c))} GPU-hours"))
    rows.append(("owner of the largest", OWNERS[ranked[0][0]]))
    hours = min(TIMELINE_H, lg.wall_s / 3600.0)
    shares = {c: lg.fraction(c) for c in (GOODPUT,) + CATEGORIES}
    fig = _FIGURE(timeline_boxes(r.log, hours), hours, shares)
    caption = (f"The first {sig(hours)} hours of the run, each stretch in its one category (the share of the whole run "
               f"beside each name; slow steps hide inside the kept stretches and a checkpoint write lasts "
               f"{sig(r.spec.checkpoint_s)} s, too thin to see): {ranked[0][0]} is the largest loss at "
               f"{fmt_pct(ranked[0][1])}; goodput {fmt_pct(lg.goodput)}.")
    return View(f"Goodput ledger: {model} on {n_gpus:,} x {gpu}", rows, fig, caption=caption,
                values={"goodput": lg.goodput, **{c: f for c, f in ranked}})


# ---- N050: finding one slow rank among a thousand --------------------------------------------------------------------


def _build_z(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.hist = ax.stairs([1.0], [0.0, 1.0], fill=True, color="C0", alpha=0.6, label="ranks per z bin")
    a.slow = ax.axvline(0.0, color="C3", lw=2.0, label="the slow rank")
    a.thr = ax.axvline(6.0, color="0.3", ls="--", lw=1.2, label="threshold")
    figures.log_scale(ax, "y")
    ax.set_xlabel("robust z-score of one evaluation")
    ax.set_ylabel("ranks")
    ax.grid(True)
    return a


def _draw_z(a, z, slow_rank, thr) -> None:
    import numpy as np

    lo = float(min(z.min(), -thr)) - 0.5
    hi = float(max(z.max(), thr)) + 0.5
    counts, edges = np.histogram(z, bins=60, range=(lo, hi))
    a.hist.set_data(np.maximum(counts, 0.5), edges)  # empty bins drawn at 0.5 on the log axis (below 1)
    a.slow.set_xdata([z[slow_rank], z[slow_rank]])
    a.thr.set_xdata([thr, thr])
    a.ax.set_xlim(lo, hi)
    a.ax.set_ylim(0.5, max(2.0, counts.max() * 2.0))
    figures.legend(a.ax, [a.hist, a.slow, a.thr], fontsize=7, loc="upper left")


_ZFIG = figures.LiveFigure(6.0, 2.8, _build_z, _draw_z)


@explorer(
    "sre.straggler_detection",
    n_ranks=IntRange(16, 4096, log=True, label="ranks"),
    cv=FloatRange(0.002, 0.05, 0.001, label="per-rank jitter (coefficient of variation)"),
    slowdown=FloatRange(1.0, 1.5, 0.005, label="the slow rank's factor"),
    z_threshold=FloatRange(2.0, 10.0, 0.5, label="alert threshold (robust z)"),
    steps_avg=IntRange(1, 32, label="steps averaged per evaluation"),
)
def straggler_detection(n_ranks: int, cv: float, slowdown: float, z_threshold: float, steps_avg: int) -> View:
    """N050: one evaluation's robust z-scores with the slow rank marked, and the detection and
    false-alarm rates at the threshold (Monte Carlo and closed form)."""
    d = sd.detection_rates(n_ranks, cv, slowdown, z_threshold, steps_avg,
                           trials=max(10, min(40, 200_000 // (n_ranks * steps_avg))))
    pd, fp = sd.detection_probability(n_ranks, cv, slowdown, z_threshold, steps_avg)
    rows = [("detected (Monte Carlo)", fmt_pct(d.detect)), ("detected (closed form)", fmt_pct(pd)),
            ("healthy ranks flagged per evaluation (MC)", sig(d.fp_per_eval)),
            ("healthy ranks flagged per evaluation (closed form)", sig(fp))]
    fig = _ZFIG(d.z, d.slow_rank, z_threshold)
    caption = (f"Histogram of the robust z-scores of {fmt_int(n_ranks)} ranks in one evaluation (log counts), the slow "
               f"rank's score in red: at z > {sig(z_threshold)} the closed form finds it in {fmt_pct(pd)} of evaluations "
               f"({fmt_pct(d.detect)} of {d.trials} simulated ones); {sig(d.fp_per_eval)} healthy ranks are flagged per "
               f"simulated evaluation against {sig(fp)} by the closed form, which takes the median and MAD as exact "
               f"and so undercounts false alarms in small groups.")
    return View(f"Straggler detection: {n_ranks:,} ranks, {sig(slowdown)}x slow", rows, fig, caption=caption,
                values={"detect": d.detect, "fp_per_eval": d.fp_per_eval, "detect_closed": pd, "fp_closed": fp})
