"""lib.fleet.hash_ring (N072): the ring against brute force, consistency on add/remove, the closed-form
share model, and the practice grader with its drafts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import hash_ring as hr
from lib.fleet import hash_ring_practice as hp


def _ring(n, v, seed=0):
    ring = hr.HashRing(v, seed)
    for r in range(n):
        ring.add(f"r{r}")
    return ring


def test_hash64_is_deterministic_and_seeded():
    assert hr.hash64("abc", 0) == hr.hash64("abc", 0)
    assert hr.hash64("abc", 0) != hr.hash64("abc", 1)
    assert 0 <= hr.hash64(12345, 7) < hr.RING
    with pytest.raises(ValueError, match="seed"):
        hr.hash64("x", -1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), v=st.integers(1, 5), seed=st.integers(0, 10_000),
       keys=st.lists(st.text(max_size=6), min_size=1, max_size=20))
def test_lookup_matches_brute_force(n, v, seed, keys):
    ring = _ring(n, v, seed)
    pts = ring.points
    for k in keys:
        assert ring.lookup(k) == hr.brute_force_owner(pts, hr.hash64(k, seed))
    assert ring.lookup_many(keys) == [ring.lookup(k) for k in keys]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), v=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_add_moves_keys_only_to_the_new_replica_and_remove_restores(n, v, seed):
    keys = [f"k{i}" for i in range(300)]
    ring = _ring(n, v, seed)
    before = ring.lookup_many(keys)
    ring.add("new")
    after = ring.lookup_many(keys)
    assert all(a == b or a == "new" for b, a in zip(before, after, strict=True))
    ring.remove("new")
    assert ring.lookup_many(keys) == before


def test_arc_shares_sum_to_one_and_match_key_counts():
    ring = _ring(8, 20, 3)
    shares = hr.arc_shares(ring)
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-12)
    keys = range(50_000)
    counts = hr.key_counts(ring, keys)
    for r, s in shares.items():  # binomial: within 5 standard deviations
        assert abs(counts[r] - s * 50_000) < 5 * math.sqrt(50_000 * s * (1 - s)) + 1
    assert hr.arc_shares(_ring(1, 1)) == {"r0": 1.0}


def test_moved_keys_equals_the_joining_arc():
    keys = range(40_000)
    a, b = _ring(8, 50, 1), _ring(8, 50, 1)
    b.add("r8")
    moved = hr.moved_keys(a, b, keys)
    assert hr.key_counts(b, keys)["r8"] == moved
    share = hr.arc_shares(b)["r8"]
    assert abs(moved / 40_000 - share) < 5 * math.sqrt(share * (1 - share) / 40_000)


def test_imbalance_and_refusals():
    im = hr.imbalance([1, 2, 3])
    assert (im.max_over_min, im.max_over_mean) == (3.0, 1.5)
    assert hr.imbalance([0, 1]).max_over_min == math.inf
    with pytest.raises(ValueError):
        hr.imbalance([])
    with pytest.raises(ValueError, match="empty"):
        hr.HashRing().lookup("x")
    ring = _ring(2, 1)
    with pytest.raises(ValueError, match="already"):
        ring.add("r0")
    with pytest.raises(ValueError, match="not on the ring"):
        ring.remove("zz")
    with pytest.raises(ValueError, match="vnodes"):
        hr.HashRing(0)


def test_one_point_max_share_matches_the_harmonic_closed_form():
    # n uniform points on a circle: E[largest spacing] = H_n / n, E[smallest] = 1 / n^2
    st_ = hr.seed_study(8, 1, range(2000))
    h8 = sum(1 / k for k in range(1, 9))
    assert abs(st_.max_over_mean.mean() - h8) < 0.06


def test_virtual_node_shares_match_the_dirichlet_model():
    ring_study = hr.seed_study(8, 40, range(150))
    d = hr.dirichlet_shares(8, 40, 20_000, seed=1)
    model = np.median(d.max(axis=1) / d.mean(axis=1))
    assert abs(np.median(ring_study.max_over_mean) - model) < 0.03
    assert abs(ring_study.joining_share.mean() - 1 / 9) < 0.004


def test_grader_passes_the_reference_and_catches_every_draft():
    assert hp.check(hp.variant("reference")).passed
    for name in hp.VARIANTS:
        assert hp.check(hp.variant(name)).status == "failed", name
    with pytest.raises(ValueError):
        hp.variant("nope")


def test_seed_study_agrees_with_the_ring_object():
    st_ = hr.seed_study(5, 7, [3, 4])
    for k, s in enumerate([3, 4]):
        ring = _ring(5, 7, s)
        im = hr.imbalance(hr.arc_shares(ring).values())
        assert math.isclose(st_.max_over_min[k], im.max_over_min, rel_tol=1e-9)
        ring.add("r5")
        assert math.isclose(st_.joining_share[k], hr.arc_shares(ring)["r5"], rel_tol=1e-9)
