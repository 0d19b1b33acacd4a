"""lib.explorers.training_fleet: the failure cost of a job and the fleet plan that uses it."""
import math

import pytest

from lib.explorers.training_fleet import failure_cost, fleet_plan
from lib.training import reliability


def test_failure_cost_matches_llama3_scale():
    # Llama 3 (arXiv:2407.21783): >90% effective training time on 16,384 GPUs; a 70B job of that size loses ~10%
    f = failure_cost("llama-3.1-70b", 16384)
    assert math.isclose(f.mtbf_s / 3600, 54 * 24 / 419, rel_tol=1e-9)
    assert 0.05 < f.goodput.lost < 0.12


def test_failure_cost_grows_with_the_fleet_and_agrees_with_monte_carlo():
    small, big = failure_cost("llama-3.1-8b", 64), failure_cost("llama-3.1-8b", 8192)
    assert small.goodput.lost < big.goodput.lost
    f = big
    sim = 1 - reliability.simulate_goodput(f.interval_s, f.write_s, f.mtbf_s, f.restart_s, work_s=50 * f.mtbf_s, seed=3,
                                           runs=4)
    assert math.isclose(f.goodput.lost, sim, rel_tol=0.2, abs_tol=0.003)


def test_fleet_plan_uses_failure_cost_at_its_fleet():
    p = fleet_plan("llama-3.1-70b", 15.0, "h100-sxm", 30.0, 0.4)
    assert math.isclose(p.parts["failures"], failure_cost("llama-3.1-70b", p.n).goodput.lost, rel_tol=1e-12)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_failure_cost_refuses_bad_counts(n):
    with pytest.raises(ValueError, match="n_gpus"):
        failure_cost("llama-3.1-8b", n)


def test_mfu_breakdown_refuses_a_step_faster_than_the_hardware():
    from lib.explorers.training_fleet import mfu_breakdown

    args = ("llama-3.1-405b", "h100-sxm", 8, 16, 64, 8192, 32, 4, "none")
    ok = mfu_breakdown(*args, 12.5)
    assert 0.4 < ok.mfu < 0.45  # Llama 3 Table 4: 430 TFLOP/s per GPU, 43% MFU
    floor = 12.5 * ok.hfu  # the step at which the GPUs would run at exactly their dense peak
    assert mfu_breakdown(*args, floor * 1.001).hfu <= 1
    with pytest.raises(ValueError, match="faster than the hardware"):
        mfu_breakdown(*args, floor * 0.999)
    with pytest.raises(ValueError, match="faster than the hardware"):  # recompute counts: HFU = 4/3 MFU
        mfu_breakdown(*args[:-1], "full", floor * 4 / 3 * 0.999)
