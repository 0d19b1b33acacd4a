"""lib.sre.dashboard: the eight panels, and the two Little's-law cross-checks on a simulated incident:
they hold when every metric is built right and each catches its broken metric."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lib.scheduling import SLO
from lib.sre import dashboard as db
from lib.sre.slo import burn_rate


@pytest.fixture(scope="module")
def run():
    return db.incident_run(phase_s=30.0, seed=1)


def test_eight_panels_each_with_an_action():
    assert len(db.PANELS) == 8 and len({p.key for p in db.PANELS}) == 8
    assert db.PANELS[0].key == "burn" and all(p.action and p.question for p in db.PANELS)


def test_checks_hold_when_built_right(run):
    cc = db.cross_checks(run)
    assert cc["in_flight_ok"] and cc["tokens_ok"]
    lc = run.littles_law()
    assert cc["L_implied"] == pytest.approx(lc.arrival_rate * lc.mean_sojourn_s)


def test_each_broken_metric_is_caught(run):
    nq = db.cross_checks(run, latency_from_schedule=True, tolerance=0.02)
    share = np.mean([r.queue_s for r in run.requests]) / np.mean([r.sojourn_s for r in run.requests])
    assert nq["in_flight_error"] == pytest.approx(share, rel=1e-9)
    assert (not nq["in_flight_ok"]) == (share > 0.02) and nq["tokens_ok"]
    # without the queue, lambda W is the running count (Little's law for the running set)
    assert nq["L_implied"] == pytest.approx(nq["running"], rel=0.03)
    dbl = db.cross_checks(run, token_count_factor=2.0)
    assert not dbl["tokens_ok"] and dbl["in_flight_ok"]
    ok = db.cross_checks(run)
    assert dbl["tokens_error"] == pytest.approx(2 * ok["tokens_panel"] / ok["tokens_implied"] - 1, rel=1e-9)


def test_panel_values_against_records(run):
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    v = db.panel_values(run, 30.0, 60.0, slo, 0.99)
    recs = [r for r in run.requests if 30.0 <= r.arrival_s < 60.0]
    assert v["arrivals_per_s"] == pytest.approx(len(recs) / 30.0)
    bad = sum(not slo.met(r) for r in recs) / len(recs)
    assert v["burn"] == pytest.approx(burn_rate(bad, 0.99))
    assert v["ttft_p99"] >= v["ttft_p50"] > 0 and 0 <= v["kv_used"] <= 1
    assert not math.isnan(v["step_p99"])


def test_validation(run):
    with pytest.raises(ValueError, match="t1"):
        db.panel_values(run, 10.0, 5.0, SLO(), 0.99)
    with pytest.raises(ValueError, match="tolerance"):
        db.cross_checks(run, tolerance=0.0)


@pytest.mark.parametrize("broken", ["none", "latency without the queue", "tokens counted twice"])
def test_explorer_windows_are_the_masked_definition(run, broken):
    """The explorer's per-window series (index ranges) equals the definition written with masks over every
    step, request and token of each window, exactly."""
    from lib.explorers.sre_dashboard import window_series

    w = 3.0
    s = window_series.__wrapped__(run, broken, w)
    tl, recs = run.timeline, run.requests
    arr = np.array([r.arrival_s for r in recs])
    soj = np.array([r.sojourn_s - (r.queue_s if broken == "latency without the queue" else 0.0) for r in recs])
    tpot = np.array([r.tpot_s if r.output_len > 1 else np.nan for r in recs])
    times, _ = run._tokens()
    want = {k: [] for k in ("t", "L", "lw", "tok", "impl")}
    edges = np.arange(0.0, float(tl.start_s[-1] + tl.duration_s[-1]) + w, w)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        st, inr = (tl.start_s >= a) & (tl.start_s < b), (arr >= a) & (arr < b)
        if st.any() and inr.any():
            d = tl.duration_s[st]
            want["t"].append((a + b) / 2)
            want["L"].append(float(((tl.waiting[st] + tl.running[st]) * d).sum() / d.sum()))
            want["lw"].append(inr.sum() / w * float(soj[inr].mean()))
            want["tok"].append((2.0 if broken == "tokens counted twice" else 1.0) * ((times >= a) & (times < b)).sum() / w)
            want["impl"].append(float((tl.running[st] * d).sum() / d.sum()) / float(np.nanmean(tpot[inr])))
    assert len(want["t"]) > 5
    for k, v in want.items():
        assert np.array_equal(getattr(s, k), np.asarray(v)), k
