"""Cluster quotas (N046, N066): pooling, water-filling, the three policies, fair share and preemption."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import quotas as q


def test_pooling_closed_form_against_normal_monte_carlo():
    means, cvs = [200, 150, 100, 30, 20], [0.6] * 5
    p = q.pooling(means, cvs, 1.645)
    rng = np.random.default_rng(0)
    mu = np.array(means, float)
    draws = mu + mu * 0.6 * rng.standard_normal((200_000, 5))
    mc = q.empirical_pooling(draws, 0.95)
    assert p.static == pytest.approx(mc.static, rel=0.01) and p.pooled == pytest.approx(mc.pooled, rel=0.01)
    assert 0.45 < p.static_utilization < 0.55  # "static quotas waste half the fleet"


@settings(max_examples=80, deadline=None)
@given(st.floats(0, 100), st.lists(st.floats(0, 50), min_size=1, max_size=6),
       st.lists(st.floats(0.1, 5), min_size=6, max_size=6))
def test_water_fill_is_weighted_max_min(cap, want, w):
    want = np.array(want)
    w = np.array(w[: len(want)])
    a = q.water_fill(cap, want, w)
    assert np.all(a <= want + 1e-9) and np.all(a >= -1e-12)
    assert a.sum() == pytest.approx(min(cap, want.sum()), abs=1e-6)
    # max-min: a team short of its want is at the top level; nobody at a higher level per weight
    short = a < want - 1e-7
    if short.any():
        level = (a / w)[short].max()
        assert np.all((a / w)[short] >= level - 1e-6)
        assert np.all((a / w) <= level + 1e-6)


def test_policies_on_a_month():
    g = np.array([400, 300, 200, 74, 50.0])
    s = q.demand_series(g * np.array([1.6, 1.6, 1.2, 0.6, 0.6]), [0.6] * 5, 24 * 28, 0)
    runs = {p: q.run_policy(s, 1024, g, p, shares=g, half_life_h=168) for p in q.POLICIES}
    assert np.all(runs["four_layer"].guarantee_met == 1) and np.all(runs["static"].guarantee_met == 1)
    assert runs["free"].guarantee_met.min() < 0.8
    assert runs["four_layer"].utilization > runs["static"].utilization
    assert np.all(runs["four_layer"].alloc.sum(axis=1) <= 1024 + 1e-6)
    assert runs["static"].preemptions == 0 and runs["four_layer"].preemptions > 0


def test_fair_share_and_decay():
    assert q.fair_share_factor([1, 1], [1, 1]).tolist() == [0.5, 0.5]
    assert q.fair_share_factor([40, 60], [20, 80])[0] == pytest.approx(2 ** -2)
    assert q.decayed_usage([8.0, 0, 0, 0, 0, 0, 0, 1.0], 7.0) == pytest.approx(1 + 8 * 0.5)
    with pytest.raises(ValueError, match="shares"):
        q.fair_share_factor([1], [0])


def test_preemption_cost_uses_young():
    from lib.training.reliability import job_mtbf_s, young_interval_s

    tau, lost = q.preemption_cost_s(64, 60, 300)
    assert tau == pytest.approx(young_interval_s(60, job_mtbf_s(64)))
    assert lost == pytest.approx(tau / 2 + 300)
    tau2, _ = q.preemption_cost_s(64, 60, 300, preemptions_per_day=4)
    assert tau2 < tau


def test_bad_inputs():
    with pytest.raises(ValueError, match="policy"):
        q.allocate(10, np.ones(2), np.ones(2), "nope")
    with pytest.raises(ValueError, match="equal-length"):
        q.pooling([1, 2], [0.5], 1.0)


def _tree(demands, team_g=(256, 192, 64)):
    names = ["a", "b", "c", "d", "e"]
    split = [(0, [0, 1]), (1, [2, 3]), (2, [4])]
    return {"name": "root", "guarantee": sum(team_g), "children": [
        {"name": f"t{k}", "guarantee": team_g[k], "children": [
            {"name": names[i], "guarantee": team_g[k] / len(ix), "demand": demands[i]} for i in ix]} for k, ix in split]}


def test_tree_borrows_inside_the_team_first():
    alloc = q.tree_allocate(_tree([300, 20, 200, 150, 8]), 512)
    assert alloc == pytest.approx({"a": 268, "b": 20, "c": 108, "d": 108, "e": 8})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=5, max_size=5))
def test_tree_meets_guarantees_and_conserves(demands):
    alloc = q.tree_allocate(_tree(demands), 512)
    assert sum(alloc.values()) <= 512 + 1e-6
    assert sum(alloc.values()) == pytest.approx(min(512, sum(demands)), abs=1e-6)
    g = {"a": 128, "b": 128, "c": 96, "d": 96, "e": 64}
    for k, d in zip("abcde", demands, strict=True):
        assert alloc[k] >= min(d, g[k]) - 1e-6 and alloc[k] <= d + 1e-6


def test_recovery_days():
    assert q.recovery_days(0.5, 0.25, 7) == pytest.approx(7 * np.log2(3))
    assert q.recovery_days(0.1, 0.25, 7) == 0
