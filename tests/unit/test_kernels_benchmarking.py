"""lib.kernels.benchmarking (N008): the measurement model of a timed kernel, its mistakes and statistics."""

from __future__ import annotations

import importlib.util
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from lib.kernels import benchmarking as bm
from lib.kernels import l2
from lib.perf.step import step_assumptions
from lib.registry import assumptions
from lib.registry.hardware import gpu

A = bm.bench_assumptions()
BIG = bm.KernelSpec("h100-sxm", 256e6)
SMALL = bm.KernelSpec("h100-sxm", 1e6)
HOT = bm.KernelSpec("h100-sxm", 0.5 * gpu("h100-sxm").l2_bytes)
COMPUTE = bm.KernelSpec("h100-sxm", 64e6, 64e6 * 1000)


def test_assumptions_come_from_the_step_model_and_the_yaml():
    s = step_assumptions()
    assert (A.launch_s, A.kernel_fixed_s, A.launch_gap_s, A.hbm_efficiency, A.matmul_efficiency) == (
        s.eager_launch_s, s.kernel_fixed_s, s.launch_gap_s, s.gemv_efficiency, s.matmul_efficiency)
    assert A.sustained_clock == assumptions.value("decode_step.sustained_clock_under_power_cap")
    assert A.event_resolution_s == pytest.approx(0.5e-6)
    assert bm.bench_assumptions(noise_sigma=0.1).noise_sigma == 0.1
    with pytest.raises(ValueError, match="unknown benchmark assumption"):
        bm.bench_assumptions(nope=1)


def test_true_time_is_the_per_kernel_roofline():
    g = gpu("h100-sxm")
    assert bm.true_time_s(BIG, A) == pytest.approx(A.kernel_fixed_s + BIG.bytes / (g.memory_bandwidth * A.hbm_efficiency))
    comp = COMPUTE.flops / (g.peak_flops("bf16") * A.matmul_efficiency * A.sustained_clock)
    assert bm.true_time_s(COMPUTE, A) == pytest.approx(A.kernel_fixed_s + comp)
    hot = bm.device_time_s(HOT, A, hot=True, clock=1.0)
    assert hot == pytest.approx(A.kernel_fixed_s + HOT.bytes / l2.l2_read_bandwidth("h100-sxm"))
    assert bm.device_time_s(BIG, A, hot=True, clock=1.0) == bm.true_time_s(BIG, A)  # does not fit: HBM anyway


def test_timers_in_closed_form():
    p = bm.RIGHT
    t = bm.true_time_s(SMALL, A)
    assert bm.expected_repetition_s(SMALL, bm.Protocol(timer="host_nosync"), A) == A.launch_s
    assert bm.expected_repetition_s(SMALL, bm.Protocol(timer="host_sync"), A) == pytest.approx(A.launch_s + t + A.sync_s)
    assert bm.expected_repetition_s(SMALL, p, A) == pytest.approx(t)
    hot = bm.device_time_s(SMALL, A, hot=True, clock=A.sustained_clock)
    assert bm.expected_repetition_s(SMALL, bm.Protocol(timer="events_batch"), A) == pytest.approx(hot + A.launch_gap_s)


@pytest.mark.parametrize("spec", [BIG, SMALL, HOT, COMPUTE], ids=["big", "small", "hot", "compute"])
def test_simulated_mistakes_match_their_closed_forms(spec):
    t = bm.true_time_s(spec, A)
    af = bm.artifact_factors(spec, A)
    quant = A.event_resolution_s / t  # events round each repetition to their resolution
    cases = {"no_sync": 1 / af["no_sync"], "host_timer": 1 / af["host_timer"], "no_flush": 1 / af["cache_hot"],
             "unlocked_clock": 1 / af["boost_clock"]}
    for mistake, want in cases.items():
        got = bm.measure(spec, bm.with_mistake(bm.RIGHT, mistake), A, seed=3).factor
        tol = 0.02 + (quant if mistake in ("no_flush", "unlocked_clock") else 0)
        assert got == pytest.approx(want, rel=tol, abs=quant), mistake


def test_the_claim_goes_both_ways():
    assert bm.artifact_factors(BIG, A)["no_sync"] > 2  # a big kernel looks fast
    assert bm.artifact_factors(SMALL, A)["no_sync"] < 0.5  # a small one looks slow
    assert bm.artifact_factors(SMALL, A)["host_timer"] < 0.5
    assert bm.artifact_factors(HOT, A)["cache_hot"] > 2
    assert bm.artifact_factors(BIG, A)["cache_hot"] == 1
    assert bm.artifact_factors(BIG, A)["boost_clock"] == pytest.approx(1, abs=1e-3)  # memory-bound: no clock effect
    assert bm.artifact_factors(COMPUTE, A)["boost_clock"] > 1.1
    assert bm.different_work_factor(BIG, bm.KernelSpec("h100-sxm", 128e6), A) == pytest.approx(2, rel=0.05)


def test_right_protocol_reports_the_truth_to_the_timer_resolution():
    for spec in (BIG, HOT, COMPUTE):
        m = bm.measure(spec, bm.RIGHT, A, seed=1)
        assert m.factor == pytest.approx(1, abs=0.01 + A.event_resolution_s / m.true_s)


def test_statistics_order_and_the_drifting_minimum():
    d = bm.statistic_demo(BIG, A, 100, seed=0)
    assert d["mean_first_5"] > d["mean"] > d["median"] > d["min"]
    assert d["median"] == pytest.approx(1, abs=0.01) and d["median_after_first"] == pytest.approx(1, abs=0.01)
    assert bm.expected_min_factor(0.02, 1000) < bm.expected_min_factor(0.02, 100) < bm.expected_min_factor(0.02, 10) < 1
    quiet = bm.bench_assumptions(outlier_probability=0.0)
    for reps in (10, 100, 1000):
        mins = [bm.measure(BIG, bm.Protocol(repetitions=reps), quiet, seed=s).min_s / bm.true_time_s(BIG, quiet)
                for s in range(60)]
        assert np.mean(mins) == pytest.approx(bm.expected_min_factor(quiet.noise_sigma, reps), abs=0.004)


def test_median_standard_error():
    quiet = bm.bench_assumptions(outlier_probability=0.0, event_resolution_s=0.0)
    meds = [bm.measure(BIG, bm.Protocol(repetitions=100), quiet, seed=s).median_s for s in range(300)]
    rel = np.std(meds) / bm.true_time_s(BIG, quiet)
    assert rel == pytest.approx(1.2533 * quiet.noise_sigma / math.sqrt(100), rel=0.2)


def test_outliers_move_the_mean_not_the_median():
    noisy = bm.bench_assumptions(outlier_probability=0.2, outlier_extra=3.0)
    m = bm.measure(BIG, bm.Protocol(repetitions=1000, statistic="mean"), noisy, seed=2)
    assert m.factor > 1.4 and m.median_s / m.true_s < 1.1


def test_protocol_mistakes_and_validation():
    assert bm.RIGHT.mistakes() == []
    assert bm.with_mistake(bm.RIGHT, "no_sync").mistakes() == ["a host timer with no synchronize"]
    with pytest.raises(ValueError, match="timer"):
        bm.Protocol(timer="stopwatch")
    with pytest.raises(ValueError, match="statistic"):
        bm.Protocol(statistic="mode")
    with pytest.raises(ValueError, match="repetitions"):
        bm.Protocol(repetitions=0)
    with pytest.raises(ValueError, match="mistake"):
        bm.with_mistake(bm.RIGHT, "typo")
    with pytest.raises(ValueError, match="bytes"):
        bm.KernelSpec("h100-sxm", 0)
    with pytest.raises(ValueError):
        bm.KernelSpec("no-such-gpu", 1e6)


def test_the_yaml_facts_about_do_bench_are_the_installed_tritons():
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        pytest.skip("triton not installed")
    root = Path(spec.origin).parent
    driver = (root / "backends" / "nvidia" / "driver.py").read_text()
    testing = (root / "testing.py").read_text()
    mib = int(re.search(r"cache_size = (\d+) \* 1024 \* 1024", driver).group(1))
    assert mib == assumptions.value("kernels_benchmarking.do_bench_flush_mib")
    assert bm.do_bench_flush_bytes() == mib * 2**20
    sig = re.search(r"def do_bench\(fn, warmup=(\d+), rep=(\d+), [^)]*return_mode=\"(\w+)\"\)", testing)
    assert sig and sig.groups() == (str(assumptions.value("kernels_benchmarking.do_bench_warmup_ms")), "100", "mean")


def test_a_real_asynchronous_launch_is_timed_as_the_launch():
    """The no-synchronize artifact on a CPU: submitting work to a pool returns before the work is done,
    like a kernel launch; timing the submit alone measures the launch, not the work."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        t0 = time.perf_counter()
        fut = pool.submit(time.sleep, 0.05)
        launch = time.perf_counter() - t0
        fut.result()
        synced = time.perf_counter() - t0
    assert synced >= 0.05 and launch < synced / 5
