"""lib.decoding.sampling_practice: the reference sampler passes its grader and matches the exact
distribution; every draft with one classic defect is caught."""

import numpy as np
import pytest

from lib.decoding import sampling as s
from lib.decoding import sampling_practice as sp


class _Capture:
    """A stand-in rng whose choice() returns the distribution it was asked to draw from."""

    def choice(self, n, size, p):
        return np.asarray(p)


def test_reference_sampler_passes_and_computes_the_exact_distribution():
    assert sp.check_sampler(sp.reference_sample, num_random=12).passed
    rng = np.random.default_rng(3)
    for _ in range(50):
        z = (rng.standard_normal(int(rng.integers(2, 300))) * 3).astype(np.float32)
        t, k, p = float(rng.choice([0.3, 0.8, 1.0, 1.7])), int(rng.choice([0, 3, 20])), float(rng.choice([1.0, 0.9, 0.5]))
        got = sp.reference_sample(z, t, k, p, 1, _Capture())
        want = s.sampling_probs(z, t, k, p, order=sp.SAMPLER_ORDER)
        assert np.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("name", sp.SAMPLER_VARIANTS)
def test_every_sampler_draft_is_caught(name):
    report = sp.check_sampler(sp.sampler_variant(name))
    assert report.status == "failed", name


def test_the_skeleton_reports_not_implemented():
    assert sp.check_sampler(sp.skeleton_sample).status == "not implemented"


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="variant"):
        sp.sampler_variant("nope")


# ---- I087: top-p at its edges -------------------------------------------------------------------------------


def test_reference_top_p_passes_and_matches_the_oracle_on_tied_rows():
    assert sp.check_top_p(sp.reference_top_p_keep, num_random=40, seed=1).passed
    rng = np.random.default_rng(5)
    for _ in range(300):
        z = (rng.integers(-4, 5, int(rng.integers(1, 30))) / 2).astype(np.float32)
        p, t = float(rng.choice([0.1, 0.37, 0.5, 0.8, 0.99, 1.0])), float(rng.choice([0.0, 0.3, 1.0, 2.5]))
        want, margin = sp.top_p_oracle(z, p, t)
        got = sp.reference_top_p_keep(z, p, t)
        free = np.abs(margin) <= sp.EDGE_TOL
        assert ((got == want) | free).all()
        perm = rng.permutation(z.size)
        back = np.empty(z.size, bool)
        back[perm] = sp.reference_top_p_keep(z[perm], p, t)
        assert (back == got).all()


@pytest.mark.parametrize("name", sp.TOP_P_VARIANTS)
def test_every_top_p_draft_is_caught(name):
    assert sp.check_top_p(sp.top_p_variant(name)).status == "failed", name


def test_top_p_skeleton_and_bad_variant():
    assert sp.check_top_p(sp.skeleton_top_p_keep).status == "not implemented"
    with pytest.raises(ValueError, match="variant"):
        sp.top_p_variant("nope")


def test_a_grader_that_only_checks_order_catches_the_stable_sort():
    """The permutation check alone (no oracle) exposes the tie split: the kept token moves with the order."""
    draft = sp.top_p_variant("stable sort splits a tie group")
    z = np.array([2.0, 1.0, 1.0, 1.0, 0.0], np.float32)
    sets = set()
    for perm in [np.arange(5), np.arange(5)[::-1], np.array([0, 2, 3, 1, 4])]:
        back = np.empty(5, bool)
        back[perm] = draft(z[perm], 0.5, 1.0)
        sets.add(tuple(np.flatnonzero(back)))
    assert len(sets) == 3
