"""lib.sre.allocation (N049): the fleet's gap, the classifier, and the policies against closed forms."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import allocation as al

MIX = {"training": 256, "loader_bound": 256, "placeholder": 224, "notebook": 192}


def _jobs(mix, notebook_gpus=2):
    jobs = []
    for kind, g in mix.items():
        if kind == "notebook":
            jobs += [al.Job("research", kind, notebook_gpus) for _ in range(g // notebook_gpus)]
        else:
            jobs.append(al.Job(kind, kind, g))
    return jobs


def test_simulated_gap_matches_the_closed_form():
    tel = al.fleet_telemetry(_jobs(MIX), 1440, seed=3)
    got = al.fleet_gap(tel, 1024)
    want = al.expected_gap(MIX, 1024)
    assert got["allocated"] == pytest.approx(want["allocated"])
    assert 100 * got["gap"] == pytest.approx(want["gap_pts"], abs=0.6)


@pytest.mark.parametrize("kind", al.KINDS)
def test_each_cause_injected_alone_is_named(kind):
    rng = np.random.default_rng(7)
    for _ in range(5):
        assert al.classify(al.job_series(kind, 1440, rng, warmup=1440)) == al.CAUSES[kind]


def test_loader_bound_reads_its_tensor_active():
    s = al.job_series("loader_bound", 1440, np.random.default_rng(0), al.Profile(loader_tensor=0.2))
    assert np.mean(s["tensor_active"]) == pytest.approx(0.2, abs=0.005)


@pytest.mark.parametrize("idle_min", [0, 10, 30, 120])
def test_reclaim_minutes_matches_the_markov_closed_form(idle_min):
    rng = np.random.default_rng(11)
    p = al.Profile()
    fr = [al.reclaim_minutes(s["sm_active"], idle_min, history=s["history"]) / 2880
          for s in (al.job_series("notebook", 2880, rng, p, warmup=2880) for _ in range(400))]
    assert np.mean(fr) == pytest.approx(al.expected_reclaim_fraction(p.notebook_active, p.session_min, idle_min),
                                        abs=0.012)


def test_reclaim_minutes_by_hand():
    sm = [0.0] * 5 + [0.5] + [0.0] * 3
    assert al.reclaim_minutes(sm, 2) == 3 + 1      # minutes 2,3,4 of the first run, minute 2 of the second
    assert al.reclaim_minutes(sm, 0) == 8
    assert al.reclaim_minutes([0.0] * 3, 2, history=[True, False, False]) == 3  # the run began before


def test_policies_never_recover_more_than_the_gap():
    tel = al.fleet_telemetry(_jobs(MIX), 1440, seed=1)
    gap = 100 * al.fleet_gap(tel, 1024)["gap"]
    rows = al.policy_points(tel, 1024)
    assert sum(r["in_turn"] for r in rows) <= gap + 1e-9
    assert all(r["in_turn"] <= r["alone"] + 1e-9 for r in rows)
    want = al.expected_gap(MIX, 1024)["recovered_pts"]
    for r in rows[:3]:
        assert r["in_turn"] == pytest.approx(want[r["policy"]], abs=0.6)


@settings(max_examples=25, deadline=None)
@given(order=st.permutations(al.POLICIES), seed=st.integers(0, 100))
def test_property_in_turn_sums_bounded_and_alone_is_order_free(order, seed):
    tel = al.fleet_telemetry(_jobs({"training": 8, "loader_bound": 8, "placeholder": 8, "notebook": 8}), 240, seed)
    gap = 100 * al.fleet_gap(tel, 40)["gap"]
    rows = al.policy_points(tel, 40, order=order)
    base = {r["policy"]: r["alone"] for r in al.policy_points(tel, 40)}
    assert sum(r["in_turn"] for r in rows) <= gap + 1e-9
    assert {r["policy"]: r["alone"] for r in rows} == pytest.approx(base)


def test_tenant_table_names_the_causes():
    tel = al.fleet_telemetry(_jobs(MIX), 720, seed=0)
    causes = {r["tenant"]: r["cause"] for r in al.tenant_table(tel, 1024)}
    assert causes == {"training": al.CAUSES["training"], "loader_bound": al.CAUSES["loader_bound"],
                      "placeholder": al.CAUSES["placeholder"], "research": al.CAUSES["notebook"]}


def test_profile_from_assumptions_and_validation():
    p = al.Profile.from_assumptions()
    assert (p.sm_busy, p.tensor_busy) == (al.Profile().sm_busy, al.Profile().tensor_busy)
    with pytest.raises(ValueError, match="loader_tensor"):
        al.Profile(loader_tensor=0.6)
    with pytest.raises(ValueError, match="kind"):
        al.Job("t", "gaming", 1)
    with pytest.raises(ValueError, match="fleet_gpus"):
        al.expected_gap({"training": 10}, 5)
    with pytest.raises(ValueError, match="order"):
        al.policy_points(al.fleet_telemetry(_jobs({"training": 1}), 10), 1, order=("magic",))
