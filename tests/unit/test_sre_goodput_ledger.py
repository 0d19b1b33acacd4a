"""lib.sre.goodput_ledger: the event log tiles the wall time, every second lands in exactly one
category, and the ledger's goodput agrees with lib.training.reliability's closed form and its
independent renewal-process Monte Carlo for the same failure and checkpoint parameters."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import goodput_ledger as gl
from lib.training import reliability as rel

M = rel.job_mtbf_s(16384)
BASE = gl.RunSpec(work_steps=20_000, step_s=8.8, interval_steps=68, checkpoint_s=2.84, mtbf_s=M,
                  detect_s=300.0, reschedule_s=180.0, reload_s=123.0, n_gpus=16384)
FULL = replace(BASE, startup_s=900.0, stall_prob=0.002, stall_mean_s=20.0, straggler_episodes_per_day=2.0,
               straggler_slowdown=1.25, straggler_episode_s=7200.0, eval_every=12, eval_s=180.0,
               maintenance_per_day=47 / 54, maintenance_s=600.0, queue_s=3600.0)


def _tiles(log):
    t = 0.0
    for iv in log.intervals:
        assert iv.start_s == pytest.approx(t, abs=1e-6)
        assert iv.end_s >= iv.start_s
        t = iv.end_s
    return t


def test_ledger_sums_to_wall_time_and_tiles():
    log = gl.simulate_run(FULL, seed=3)
    lg = gl.ledger(log)
    assert _tiles(log) == pytest.approx(log.wall_s)
    assert sum(lg.seconds.values()) == pytest.approx(lg.wall_s, rel=1e-12)
    assert sum(lg.items.values()) == pytest.approx(lg.wall_s, rel=1e-12)
    assert all(v >= -1e-9 for v in lg.seconds.values())
    # the kept steps are exactly the work
    kept = sum(iv.steps for iv in log.intervals if iv.kind == "compute" and iv.kept)
    assert kept == FULL.work_steps
    assert lg.seconds[gl.GOODPUT] == pytest.approx(FULL.work_steps * FULL.step_s)
    assert log.checkpoints == math.ceil(FULL.work_steps / FULL.interval_steps)
    assert log.steps_executed >= kept


def test_every_second_in_exactly_one_category():
    log = gl.simulate_run(FULL, seed=5)
    rng = np.random.default_rng(0)
    ts = rng.uniform(0, log.wall_s, 4000)
    hits = {}
    for t in ts:
        inside = [iv for iv in log.intervals if iv.start_s <= t < iv.end_s]
        assert len(inside) == 1  # brute force: one interval holds each second
        c = gl.category_at(log, float(t))
        assert c in (gl.GOODPUT,) + gl.CATEGORIES
        hits[c] = hits.get(c, 0) + 1
    lg = gl.ledger(log)
    # the sampled shares match the ledger's (goodput + slow steps share the kept compute)
    share = (hits.get(gl.GOODPUT, 0)) / len(ts)
    want = lg.fraction(gl.GOODPUT) + lg.fraction("slow steps")
    assert share == pytest.approx(want, abs=4 * math.sqrt(want * (1 - want) / len(ts)))


def test_overlap_or_gap_is_refused():
    log = gl.simulate_run(BASE, seed=1)
    ivs = list(log.intervals)
    ivs[2] = replace(ivs[2], start_s=ivs[2].start_s + 5.0)
    with pytest.raises(ValueError, match="does not start"):
        gl.ledger(replace(log, intervals=tuple(ivs)))


def test_agrees_with_closed_form_and_simulate_goodput():
    seeds = range(60)
    gs = np.array([gl.ledger(gl.simulate_run(BASE, seed=s)).goodput for s in seeds])
    se = gs.std(ddof=1) / math.sqrt(len(gs))
    tau = BASE.interval_s
    mc = rel.simulate_goodput(tau, BASE.checkpoint_s, M, BASE.restart_s, work_s=BASE.work_steps * BASE.step_s,
                              seed=11, runs=400)
    assert gs.mean() == pytest.approx(mc, abs=4 * se + 0.002)
    closed = rel.goodput(tau, BASE.checkpoint_s, M, BASE.restart_s)
    assert gs.mean() == pytest.approx(closed.goodput, abs=0.01)


def test_category_fractions_match_the_closed_form_terms():
    runs = [gl.ledger(gl.simulate_run(replace(BASE, work_steps=60_000), seed=s)) for s in range(30)]
    closed = rel.goodput(BASE.interval_s, BASE.checkpoint_s, M, BASE.restart_s)
    ck = np.mean([r.fraction("checkpoint stalls") for r in runs])
    fl = np.mean([r.fraction("failure losses") for r in runs])
    good = np.mean([r.goodput for r in runs])
    restart = np.mean([r.items[("failure losses", "detection")] + r.items[("failure losses", "rescheduling")]
                       + r.items[("failure losses", "relaunch and reload")] for r in runs]) / np.mean([r.wall_s for r in runs])
    # C / tau is per unit of useful work (one write per kept segment): per unit of wall it is C / tau x goodput
    assert ck == pytest.approx(closed.checkpoint * good, rel=0.02)
    # failures arrive per unit of *running* time (none during a restart): (tau / 2 + R) / M x (1 - restart share)
    assert fl == pytest.approx((closed.rewound + closed.restart) * (1 - restart), rel=0.08)


def test_slow_steps_match_their_expectation():
    spec = replace(BASE, mtbf_s=1e12, stall_prob=0.01, stall_mean_s=30.0, work_steps=200_000)
    lg = gl.ledger(gl.simulate_run(spec, seed=2))
    # exact expectation: each kept step waits p x mean on average
    want = spec.work_steps * spec.stall_prob * spec.stall_mean_s
    got = lg.items[("slow steps", "data stalls")]
    sd = math.sqrt(spec.work_steps * spec.stall_prob * 2 * spec.stall_mean_s ** 2)  # E[X^2] of the exponential
    assert got == pytest.approx(want, abs=5 * sd)
    assert lg.seconds["failure losses"] == 0.0


def test_straggler_episodes_expectation():
    spec = replace(BASE, mtbf_s=1e12, work_steps=400_000, straggler_episodes_per_day=3.0, straggler_slowdown=1.5,
                   straggler_episode_s=3600.0)
    lg = gl.ledger(gl.simulate_run(spec, seed=4))
    p = 3.0 * spec.step_s / 86400
    mean_len = 3600.0 / spec.step_s
    busy = 1 - (1 - p) ** mean_len  # chance a step lies in an episode (stationary, geometric lengths)
    want = busy * 0.5 * spec.step_s * spec.work_steps
    assert lg.items[("slow steps", "straggler episodes")] == pytest.approx(want, rel=0.25)


def test_definitions_order():
    d = gl.goodput_definitions(gl.simulate_run(FULL, seed=7))
    assert d["calendar"] < d["held"] < d["running"]
    assert d["held"] <= d["executed"]


def test_double_count_is_the_excess_inside_rewound_work():
    lg = gl.ledger(gl.simulate_run(FULL, seed=9))
    assert lg.double_counted_s >= 0
    assert lg.double_counted_s <= lg.items[("failure losses", "rewound work")]


def test_validation():
    with pytest.raises(ValueError, match="work_steps"):
        replace(BASE, work_steps=0)
    with pytest.raises(ValueError, match="half the MTBF"):
        replace(BASE, interval_steps=100_000)
    with pytest.raises(ValueError, match="straggler_slowdown"):
        replace(BASE, straggler_slowdown=0.5)
    with pytest.raises(ValueError, match="spec"):
        gl.simulate_run("run")
    with pytest.raises(ValueError, match="category"):
        gl.ledger(gl.simulate_run(BASE, seed=0)).fraction("lunch")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), interval=st.integers(5, 200), stall=st.floats(0, 0.05),
       evals=st.integers(0, 5), maint=st.floats(0, 5))
def test_property_partition(seed, interval, stall, evals, maint):
    spec = replace(FULL, work_steps=3000, interval_steps=interval, stall_prob=stall, eval_every=evals,
                   maintenance_per_day=maint, mtbf_s=20_000.0)
    log = gl.simulate_run(spec, seed=seed)
    lg = gl.ledger(log)
    assert sum(lg.seconds.values()) == pytest.approx(log.wall_s, rel=1e-12)
    assert lg.seconds[gl.GOODPUT] == pytest.approx(spec.work_steps * spec.step_s)
    assert 0 < lg.goodput <= 1
    assert gl.simulate_run(spec, seed=seed) == log  # deterministic


def test_detection_rates_match_the_gaussian_closed_form():
    """The straggler detector on simulated ranks (lib.training.stragglers) against Phi(((f-1) sqrt(k)/cv - z)/f)
    and n (1 - Phi(z)) (explorer helpers of N050)."""
    from lib.sre.straggler_detector import detection_probability, detection_rates

    for z, k in ((4.0, 1), (6.0, 1), (6.0, 2)):
        d = detection_rates(1024, 0.01, 1.05, z, k, trials=600, seed=7)
        p, fp = detection_probability(1024, 0.01, 1.05, z, k)
        assert d.detect == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / 600) + 0.02)
        assert d.fp_per_eval == pytest.approx(fp, abs=5 * math.sqrt(fp / 600) + 0.3 * fp + 0.005)


def test_tiny_event_rates_do_not_hang():
    spec = replace(FULL, work_steps=2000, stall_prob=1e-300, straggler_episodes_per_day=1e-300)
    lg = gl.ledger(gl.simulate_run(spec, seed=0))
    assert lg.seconds["slow steps"] == pytest.approx(0.0, abs=1e-9)
