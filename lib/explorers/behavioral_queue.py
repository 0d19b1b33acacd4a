"""Explorers for the research-platform behavioral pages: a shared pool's queue made visible and the
smaller run that fits today (N079 saying-no-to-researchers).

Views call :mod:`lib.judgment.research_queue` (FIFO starts, the free-GPU profile, the pilot) and
:func:`lib.fleet.capacity.gpu_hour_usd` only. One persistent matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.judgment import research_queue as rq
from lib.units import fmt_duration, fmt_int, fmt_pct, sig

TEAMS = ("vision", "language", "speech", "robotics")


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.free = ax.step([0.0, 1.0], [0.0, 0.0], where="post", color="C0", lw=1.8, label="GPUs free (queue placed)")[0]
    a.need = ax.axhline(1.0, color="C3", ls="--", lw=1.2, label="the request's GPUs")
    a.start = ax.axvline(1.0, color="C3", lw=1.2, label="full request starts (FIFO)")
    a.pilot = ax.plot([0.0, 1.0], [1.0, 1.0], color="C2", lw=5, solid_capstyle="butt", label="pilot run")[0]
    ax.set_xlabel("hours from now")
    ax.set_ylabel("GPUs")
    ax.grid(True)
    return a


def _draw(a, times_h, free, need, start_h, pilot_h, pilot_gpus, fits, horizon_h, cluster) -> None:
    a.free.set_data(np.append(times_h, horizon_h), np.append(free, free[-1]))
    a.need.set_ydata([need, need])
    a.start.set_xdata([start_h, start_h])
    a.pilot.set_data([0.0, min(pilot_h, horizon_h)], [pilot_gpus, pilot_gpus])
    a.pilot.set_visible(pilot_gpus > 0)
    a.pilot.set_label("pilot run (fits the slot)" if fits else "pilot run (does not fit: would delay the queue)")
    a.pilot.set_color("C2" if fits else "C1")
    a.ax.set_xlim(0, horizon_h)
    a.ax.set_ylim(0, cluster * 1.05)
    figures.legend(a.ax, [a.free, a.need, a.start, a.pilot], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


def queue_options(cluster_gpus: int, req_gpus: int, req_hours: float, n_queued: int, mean_job_h: float,
                  pilot_share: float, seed: int, owner: str = TEAMS[-1]) -> SimpleNamespace:
    """The visible queue and the full request's FIFO start, the idle-slot pilot, for one seeded pool."""
    if req_gpus > cluster_gpus:
        raise ValueError(f"the request ({req_gpus} GPUs) is larger than the pool ({cluster_gpus} GPUs)")
    snap = rq.pool_snapshot(cluster_gpus, TEAMS, n_queued, mean_job_h * 3600.0, seed)
    req = rq.Job(owner, int(req_gpus), float(req_hours) * 3600.0)
    starts = rq.fifo_starts(cluster_gpus, snap.running, snap.queued + (req,))
    pilot = rq.pilot_run(req, snap, pilot_share)
    times, free = rq.free_profile(snap)
    return SimpleNamespace(snap=snap, req=req, starts=starts[:-1], start=float(starts[-1]), pilot=pilot,
                           times=times, free=free, ahead_gpu_s=rq.gpu_s(snap.queued))


@explorer(
    "behavioral.research_queue",
    cluster_gpus=Choice((128, 256, 512, 1024), label="GPUs in the pool"),
    req_gpus=Choice((8, 16, 32, 64, 128), label="GPUs the researcher asks for"),
    req_hours=FloatRange(1.0, 168.0, 1.0, label="hours the run takes"),
    n_queued=IntRange(0, 40, label="jobs already queued"),
    mean_job_h=FloatRange(1.0, 72.0, 1.0, label="mean job length (hours)"),
    pilot_share=FloatRange(0.001, 0.2, 0.001, label="pilot: share of the run's steps"),
    seed=IntRange(0, 1000, label="seed of the pool"),
)
def research_queue(cluster_gpus: int, req_gpus: int, req_hours: float, n_queued: int, mean_job_h: float,
                   pilot_share: float, seed: int) -> View:
    """N079: when the full request would start in the FIFO queue, and the pilot that fits an idle slot now."""
    o = queue_options(cluster_gpus, req_gpus, req_hours, n_queued, mean_job_h, pilot_share, seed)
    p = o.pilot
    horizon = max(o.start + o.req.duration_s, float(o.times[-1]), 3600.0) / 3600.0
    rows = [("running / queued jobs", f"{len(o.snap.running)} holding {fmt_int(o.snap.busy_gpus)} GPUs / "
                                      f"{len(o.snap.queued)} asking {fmt_int(o.ahead_gpu_s / 3600)} GPU-hours"),
            ("full request starts in", fmt_duration(o.start)),
            ("and finishes in", fmt_duration(o.start + o.req.duration_s)),
            ("pilot", f"{fmt_pct(pilot_share)} of the steps on {p.gpus} GPUs: {fmt_duration(p.duration_s)}"
                      if p.gpus else "no GPUs idle now"),
            ("idle slot for those GPUs", (fmt_duration(p.window_s) if p.window_s < float("inf") else "open-ended (nothing queued)")
                                          if p.gpus else "none"),
            ("pilot starts now", "yes: it ends before anyone needs the GPUs" if p.fits else
             f"no: the slot holds at most {fmt_pct(p.max_share)} of the run")]
    caption = (f"GPUs free over the next {sig(horizon)} hours once the queue is placed (blue); the {req_gpus}-GPU "
               f"request starts at {sig(o.start / 3600)} h (red line); the pilot (bar) "
               + ("runs now in the idle slot." if p.fits else "does not fit any idle slot."))
    fig = _FIGURE(o.times / 3600.0, o.free, req_gpus, o.start / 3600.0, p.duration_s / 3600.0, p.gpus, p.fits,
                  horizon, cluster_gpus)
    return View(f"The visible queue: {req_gpus} GPUs for {sig(req_hours)} h", rows, fig, caption=caption,
                values={"start_s": o.start, "pilot_fits": float(p.fits), "pilot_s": p.duration_s})


def lane_inputs(cluster_gpus: int, small_gpus: int, small_min: float, large_gpus: int, large_h: float,
                lane_gpus: int) -> tuple[float, float, float]:
    """(small job's service, large job's mean service, lane share) in the fluid view: a job's GPU-seconds
    over the pool's GPUs, and the lane's GPUs over the pool's (N089)."""
    if large_gpus > cluster_gpus:
        raise ValueError(f"a large job ({large_gpus} GPUs) must fit the pool ({cluster_gpus} GPUs)")
    if lane_gpus < small_gpus:
        raise ValueError(f"the fast lane ({lane_gpus} GPUs) cannot run a small job of {small_gpus} GPUs at all")
    if lane_gpus > cluster_gpus - large_gpus:
        raise ValueError(f"a lane of {lane_gpus} GPUs leaves {cluster_gpus - lane_gpus}, too few for a large job of "
                         f"{large_gpus}")
    return (small_gpus * small_min * 60.0 / cluster_gpus, large_gpus * large_h * 3600.0 / cluster_gpus,
            lane_gpus / cluster_gpus)


def _build_lane(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.shared = ax.axhline(1.0, color="C3", ls="--", lw=1.2, label="small jobs, one FIFO queue")
    a.small = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="small jobs, in the fast lane")[0]
    a.large = ax.plot([1.0], [1.0], color="C1", lw=1.4, label="large jobs, rest of the pool")[0]
    a.dot = ax.plot([1.0], [1.0], "o", color="C0", ms=6, label="this lane")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("GPUs reserved for the fast lane")
    ax.set_ylabel("mean wait (hours)")
    ax.grid(True)
    return a


def _draw_lane(a, xs, small, large, shared, x, y) -> None:
    a.small.set_data(xs, small)
    a.large.set_data(xs, large)
    a.shared.set_ydata([shared, shared])
    a.dot.set_data([x], [y])
    finite = [v for v in list(small) + list(large) + [shared, y] if np.isfinite(v) and v > 0]
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(min(finite) / 2, max(finite) * 2)
    figures.legend(a.ax, [a.shared, a.small, a.large, a.dot], fontsize=7, loc="lower right")


_LANE = figures.LiveFigure(6.0, 3.2, _build_lane, _draw_lane)


@explorer(
    "behavioral.fast_lane",
    cluster_gpus=Choice((128, 256, 512, 1024), label="GPUs in the pool"),
    small_share=FloatRange(0.05, 0.99, 0.01, label="share of jobs that are small"),
    small_gpus=Choice((1, 2, 4, 8, 16), label="GPUs of a small job"),
    small_min=FloatRange(1.0, 240.0, 1.0, label="minutes a small job runs"),
    large_gpus=Choice((16, 32, 64, 128), label="GPUs of a large job"),
    large_h=FloatRange(1.0, 168.0, 1.0, label="mean hours a large job runs"),
    large_scv=FloatRange(0.0, 20.0, 0.5, label="large jobs' squared coefficient of variation"),
    utilization=FloatRange(0.3, 0.95, 0.01, label="pool utilization"),
    lane_gpus=Choice((1, 2, 4, 8, 16, 32, 64), label="GPUs reserved for small jobs"),
)
def fast_lane(cluster_gpus: int, small_share: float, small_gpus: int, small_min: float, large_gpus: int,
              large_h: float, large_scv: float, utilization: float, lane_gpus: int) -> View:
    """N089: small jobs' mean wait in one FIFO queue against a reserved fast lane (M/G/1, Pollaczek-Khinchine)."""
    a, b, f = lane_inputs(cluster_gpus, small_gpus, small_min, large_gpus, large_h, lane_gpus)
    w = rq.fast_lane_waits(small_share, a, b, large_scv, utilization, f)
    xs = np.unique(np.geomspace(small_gpus, max(small_gpus, cluster_gpus - large_gpus), 40).round())
    curves = [rq.fast_lane_waits(small_share, a, b, large_scv, utilization, x / cluster_gpus) for x in xs]
    small = np.array([c["lane_small"] for c in curves]) / 3600.0
    large = np.array([c["lane_large"] for c in curves]) / 3600.0
    run = small_min * 60.0
    ttfr_fifo, ttfr_lane = w["shared"] + run, w["lane_small"] + a / f
    rows = [("small jobs' share of GPU-hours", fmt_pct(small_share * a / (small_share * a + (1 - small_share) * b))),
            ("small job: mean wait, one FIFO queue", fmt_duration(w["shared"])),
            ("small job: mean wait, fast lane", fmt_duration(w["lane_small"]) if np.isfinite(w["lane_small"]) else
             f"overloaded (lane {fmt_pct(w['rho_lane'])} busy)"),
            ("time to first result, FIFO / lane", f"{fmt_duration(ttfr_fifo)} / {fmt_duration(ttfr_lane)}"),
            ("large job: mean wait, FIFO / rest of pool", f"{fmt_duration(w['shared'])} / " +
             (fmt_duration(w["lane_large"]) if np.isfinite(w["lane_large"]) else "overloaded"))]
    y = w["lane_small"] / 3600.0
    caption = (f"Mean wait against the GPUs reserved for small jobs (log axes): small jobs wait {fmt_duration(w['shared'])} "
               f"in one FIFO queue (dashed) and {fmt_duration(w['lane_small'])} in a {lane_gpus}-GPU lane (dot); the "
               "orange curve is what the large jobs pay.")
    fig = _LANE(xs, small, large, w["shared"] / 3600.0, lane_gpus, y if np.isfinite(y) else w["shared"] / 3600.0)
    return View(f"A fast lane for small jobs: {lane_gpus} of {cluster_gpus} GPUs", rows, fig, caption=caption,
                values={"shared_s": w["shared"], "lane_small_s": w["lane_small"], "lane_large_s": w["lane_large"]})


def _build_review(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.verdict = ax.plot([0.01, 1.0], [0.01, 0.01], color="C0", lw=1.8, label="with the stage's own verdict")[0]
    a.blind = ax.plot([0.01, 1.0], [0.01, 0.01], color="C3", ls="--", lw=1.4, label="service alerts only")[0]
    a.left = ax.axhline(0.5, color="0.4", ls=":", lw=1.2, label="budget left this window")
    a.dot = ax.plot([0.01], [0.01], "o", color="C0", ms=6, label="first stage")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("share of traffic on the new version")
    ax.set_ylabel("budget spent if it regressed")
    ax.grid(True)
    return a


def _draw_review(a, xs, with_v, blind, left, x, y) -> None:
    a.verdict.set_data(xs, with_v)
    a.blind.set_data(xs, blind)
    a.left.set_ydata([left, left])
    a.dot.set_data([x], [y])
    vals = [v for v in list(with_v) + list(blind) + [left] if v > 0]
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(min(vals) / 2, max(vals) * 2)
    figures.legend(a.ax, [a.verdict, a.blind, a.left, a.dot], fontsize=7, loc="upper left")


_REVIEW = figures.LiveFigure(6.0, 3.2, _build_review, _draw_review)


@functools.lru_cache(maxsize=256)
def _verdict_requests(p0: float, p1: float, alpha: float, power: float) -> tuple[float, str]:
    # the exact search costs ~0.1 s at 3,000 requests and grows with n: beyond that the explorer shows the
    # normal approximation (labelled; the page's own number uses the exact test up to 1,000,000)
    return rq.verdict_requests(p0, p1, alpha, power, exact_limit=3_000, bisect_limit=0)


def review_stage(share: float, p0: float, p1: float, target: float, qps: float, rollback_s: float,
                 min_stage_s: float, alpha: float = 0.05, power: float = 0.8) -> SimpleNamespace:
    """One canary stage of N083: the requests its verdict needs (:func:`lib.judgment.research_queue.verdict_requests`),
    how long it runs (:func:`lib.sre.canary.rollout_plan`: the longer of collecting them and the
    minimum stage), and the blast radius if the change regressed, with and without that verdict."""
    from lib.sre import canary

    n, method = _verdict_requests(p0, p1, alpha, power)
    stage = canary.rollout_plan([share], n, qps, min_stage_s)[0] if share < 1 else None
    verdict = stage.duration_s if stage else math.inf
    return SimpleNamespace(n=n, method=method, stage=stage, with_verdict=rq.blast_radius(share, p0, p1, target, qps, rollback_s, verdict),
                           blind=rq.blast_radius(share, p0, p1, target, qps, rollback_s))


@explorer(
    "behavioral.review_line",
    target=Choice((0.99, 0.995, 0.999, 0.9995, 0.9999), label="SLO target"),
    qps=FloatRange(1.0, 10000.0, 1.0, label="requests per second"),
    p0_pct=FloatRange(0.001, 0.5, 0.001, label="baseline bad rate (%)"),
    ratio=FloatRange(1.5, 50.0, 0.5, label="regressed / baseline"),
    share_pct=FloatRange(0.1, 50.0, 0.1, label="first stage share (%)"),
    min_stage_h=FloatRange(0.0, 24.0, 0.5, label="minimum stage length (hours)"),
    rollback_min=FloatRange(1.0, 240.0, 1.0, label="rollback (minutes)"),
    budget_left=FloatRange(0.05, 1.0, 0.05, label="budget left this window"),
)
def review_line(target: float, qps: float, p0_pct: float, ratio: float, share_pct: float, min_stage_h: float,
                rollback_min: float, budget_left: float) -> View:
    """N083: what the review protects (a full ship's blast radius) and the smallest stage that can go today."""
    p0 = p0_pct / 100.0
    p1 = min(0.999, ratio * p0)
    if p0 >= 1 - target:
        raise ValueError(f"a baseline bad rate of {fmt_pct(p0)} already spends the whole budget of a {target:g} SLO: "
                         "lower it or the target")
    share = share_pct / 100.0
    st = review_stage(share, p0, p1, target, qps, rollback_min * 60.0, min_stage_h * 3600.0)
    full = rq.blast_radius(1.0, p0, p1, target, qps, rollback_min * 60.0)
    xs = np.geomspace(0.001, 1.0, 40)
    stages = [review_stage(x, p0, p1, target, qps, rollback_min * 60.0, min_stage_h * 3600.0) if x < 1 else None
              for x in xs]
    with_v = np.array([s.with_verdict.budget if s else full.budget for s in stages])
    blind = np.array([s.blind.budget if s else full.budget for s in stages])
    rows = [("regression", f"{fmt_pct(p0)} -> {fmt_pct(p1)} bad"),
            ("full ship, if it regressed", f"{fmt_pct(full.budget)} of the budget; caught by {full.by}"),
            ("requests per verdict", f"{fmt_int(st.n)} ({st.method})"),
            (f"a {fmt_pct(share)} stage runs", fmt_duration(st.stage.duration_s)),
            ("and spends, if it regressed", f"{fmt_pct(st.with_verdict.budget)} of the budget"),
            ("without its own verdict", f"{fmt_pct(st.blind.budget)} (caught by {st.blind.by})")]
    caption = (f"Budget a regression spends against the share of traffic on the new version (log axes): a full ship costs "
               f"{fmt_pct(full.budget)}; a {fmt_pct(share)} stage with its own verdict costs "
               f"{fmt_pct(st.with_verdict.budget)}, without one {fmt_pct(st.blind.budget)}.")
    fig = _REVIEW(xs, np.maximum(with_v, 1e-9), np.maximum(blind, 1e-9), budget_left, share,
                  max(st.with_verdict.budget, 1e-9))
    return View(f"Holding the review line: {fmt_pct(p0)} -> {fmt_pct(p1)}", rows, fig, caption=caption,
                values={"full": full.budget, "stage": st.with_verdict.budget, "stage_s": st.stage.duration_s})
