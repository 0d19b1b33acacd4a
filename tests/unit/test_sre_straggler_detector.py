"""lib.sre.straggler_detector: the threshold from a false-positive budget (checked by Monte Carlo), the
detector on the collector's clock (against find_stragglers and the injected truth), the strict boundary,
and the practice grader (reference passes, every draft caught)."""

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import straggler_detector as sd
from lib.sre import straggler_practice as sp
from lib.training.stragglers import find_stragglers, robust_z


def test_comparisons_and_threshold_closed_form():
    assert sd.comparisons_per_day(1024, 1.0, 10) == pytest.approx(1024 * 8640)
    z = sd.z_threshold(1.0, 1024, 1.0, 10)
    assert 1 - NormalDist().cdf(z) == pytest.approx(1 / (1024 * 8640), rel=1e-6)
    assert sd.false_positives_per_day(z, 1024, 1.0, 10) == pytest.approx(1.0, rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(fp=st.floats(0.01, 100), n=st.integers(1, 100_000), step=st.floats(0.1, 60), w=st.integers(1, 1000))
def test_threshold_and_false_positives_are_inverses(fp, n, step, w):
    if fp >= sd.comparisons_per_day(n, step, w):
        with pytest.raises(ValueError, match="fp_per_day"):
            sd.z_threshold(fp, n, step, w)
        return
    z = sd.z_threshold(fp, n, step, w)
    if z > 0:
        assert sd.false_positives_per_day(z, n, step, w) == pytest.approx(fp, rel=1e-6)


def test_threshold_rises_with_ranks():
    zs = [sd.z_threshold(1.0, n, 1.0, 10) for n in (8, 64, 1024, 16384)]
    assert zs == sorted(zs)


def test_monte_carlo_false_positive_rate_many_ranks():
    """At a budget where Monte Carlo can count (alpha = 1e-3), healthy robust z-scores of 1,024 ranks exceed the
    normal threshold at about the budgeted rate: 2,000 windows x 1,024 ranks = 2.05M comparisons, 2,048 expected
    (sd 45, 2%); the MAD's and the median's own noise add about 9% (a bigger run gives 1.09x)."""
    z = NormalDist().inv_cdf(1 - 1e-3)
    rate = sd.robust_z_exceedance(1024, z, trials=2000, seed=1)
    assert 1.0e-3 < rate < 1.2e-3


def test_a_delay_as_large_as_the_jitter_fattens_the_tail_like_the_pipeline():
    """Network delay |N(0, d)| with d equal to the compute jitter's sd: a single step's time is skewed, and
    the detector on simulated reports exceeds the normal threshold about twice as often as budgeted; the
    statistic-only Monte Carlo with the same delay ratio predicts the same."""
    z = NormalDist().inv_cdf(1 - 1e-3)
    pred = sd.robust_z_exceedance(1024, z, trials=1000, seed=3, delay_ratio=1.0, steps=1)
    hits = sum(len(sd.Detector().detect(sd.simulate_reports(1024, 1, 0.1, 5e-4, delay_jitter_s=5e-5, seed=k), z))
               for k in range(300))
    assert 1.8e-3 < pred < 2.6e-3
    assert hits / (300 * 1024) == pytest.approx(pred, rel=0.15)
    assert sd.robust_z_exceedance(1024, z, trials=50, seed=1, delay_ratio=0.0, steps=10) == \
        sd.robust_z_exceedance(1024, z, trials=50, seed=1)  # no delay: a window mean is normal, one draw
    with pytest.raises(ValueError, match="delay_ratio"):
        sd.robust_z_exceedance(1024, z, delay_ratio=-1.0)


def test_few_ranks_have_heavier_tails():
    z = NormalDist().inv_cdf(1 - 1e-3)
    assert sd.robust_z_exceedance(8, z, trials=20000, seed=2) > 3e-3


def test_detect_matches_find_stragglers_on_receive_times():
    r = sd.simulate_reports(128, 10, 1.0, 0.002, slow={5: 1.02, 77: 1.01}, skew_s=5e-3, delay_jitter_s=50e-6, seed=3)
    z = 6.0
    assert sd.Detector().detect(r, z) == find_stragglers(r["received_s"], z_threshold=z) == [5, 77]


def test_sender_clock_is_blind_or_wrong_under_skew():
    r = sd.simulate_reports(1024, 10, 1.0, 0.002, slow={100: 1.01}, skew_s=5e-3, delay_jitter_s=50e-6, seed=4)
    z = sd.z_threshold(1.0, 1024, 1.0, 10)
    assert sd.Detector().detect(r, z) == [100]
    assert sd.Detector().detect({"received_s": r["sent_s"]}, z) != [100]


def test_boundary_is_strict():
    t = np.array([-1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 4 * 1.4826])
    assert robust_z(t)[-1] == 4.0
    assert sd.Detector().detect({"received_s": t}, 4.0) == []
    assert sd.Detector().detect({"received_s": t}, np.nextafter(4.0, 0)) == [7]


def test_simulate_reports_offsets_per_host():
    r = sd.simulate_reports(16, 3, 1.0, 0.0, skew_s=1e-3, gpus_per_host=8, seed=0)
    off = r["offset_s"]
    assert len(set(off[:8])) == 1 and len(set(off[8:])) == 1 and off[0] != off[8]
    assert np.allclose(r["sent_s"] - r["compute_s"], off)
    assert np.allclose(r["received_s"], r["compute_s"])


def test_inputs_refused():
    with pytest.raises(ValueError, match="n_ranks"):
        sd.comparisons_per_day(0, 1.0, 1)
    with pytest.raises(ValueError, match="window"):
        sd.z_threshold(1.0, 8, 1.0, 0)
    with pytest.raises(ValueError, match="fp_per_day"):
        sd.z_threshold(0.0, 8, 1.0, 1)


def test_practice_grader_passes_reference_and_catches_every_draft():
    assert sp.check(sp.variant("reference")).passed
    for name in sp.VARIANTS:
        assert sp.check(sp.variant(name)).status == "failed", name
    assert sp.check(sp.Skeleton).status == "not implemented"


def test_sd_z_is_bounded():
    """The reason the mean/SD draft is blind on few ranks: with the population SD, max z = sqrt(n - 1)
    (Samuelson's inequality), reached by one outlier."""
    n = 8
    t = np.zeros(n)
    t[-1] = 1.0
    z = (t - t.mean()) / t.std()
    assert z[-1] == pytest.approx(math.sqrt(n - 1))


def test_practice_grader_checks_the_slowest_first_order():
    """A detector that returns the right ranks in rank order (not slowest first) is caught."""
    ref = sp.variant("reference")

    class RankOrder(ref):
        def detect(self, reports, threshold):
            return sorted(super().detect(reports, threshold))

    report = sp.check(RankOrder)
    assert report.status == "failed" and "two stragglers" in str(report)
