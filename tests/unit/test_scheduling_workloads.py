"""Workloads: length distributions against their stated moments, seeded arrivals, mixes, traces."""

import math

import numpy as np
import pytest

from lib.scheduling import (
    Bimodal,
    Constant,
    Empirical,
    Geometric,
    LogNormal,
    Request,
    Uniform,
    Workload,
    mix,
    trace,
)


@pytest.mark.parametrize(
    "dist",
    [Constant(7), Uniform(1, 100), Uniform(5, 5), Geometric(300), Bimodal(50, Geometric(2000), 0.2),
     Empirical((1, 10, 100, 1000))],
    ids=repr,
)
def test_sample_moments_match_the_exact_ones(dist):
    x = dist.sample(np.random.default_rng(0), 400_000).astype(float)
    assert x.min() >= 1
    # 5 standard errors of the sample mean and second moment
    se1 = x.std() / math.sqrt(len(x))
    se2 = (x * x).std() / math.sqrt(len(x))
    assert abs(x.mean() - dist.mean) <= 5 * se1 + 1e-12
    assert abs((x * x).mean() - dist.second_moment) <= 5 * se2 + 1e-9


def test_lognormal_moments_are_the_continuous_ones():
    d = LogNormal(200, 0.5)
    x = d.sample(np.random.default_rng(1), 400_000).astype(float)
    assert np.median(x) == pytest.approx(200, abs=1)
    assert x.mean() == pytest.approx(d.mean, rel=0.01)  # rounding moves it a little
    assert LogNormal(200, 2.0, cap=1000).sample(np.random.default_rng(2), 10_000).max() == 1000


def test_geometric_is_the_integer_exponential():
    g = Geometric(1000)
    # E[S^2] of an exponential of the same mean is 2 m^2: relative difference p / 2
    assert g.second_moment / (2 * 1000**2) == pytest.approx(1 - 0.5 / 1000)


def test_generate_is_seeded():
    w = Workload(prompt=LogNormal(500, 1.0), output=Geometric(100), rate=5.0, n_requests=200)
    assert w.generate(3) == w.generate(3)
    assert w.generate(3) != w.generate(4)
    reqs = w.generate(3)
    assert [r.rid for r in reqs] == list(range(200))
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
    assert gaps.mean() == pytest.approx(0.2, rel=0.2)


def test_arrival_processes():
    uni = Workload(rate=4.0, n_requests=5, arrival="uniform").generate()
    assert [r.arrival_s for r in uni] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    burst = Workload(n_requests=5, arrival="burst", rate=None, start_s=2.0).generate()
    assert {r.arrival_s for r in burst} == {2.0}
    spike = Workload(rate_schedule=((60, 5.0), (60, 20.0), (120, 5.0)), n_requests=None)
    t = np.array([r.arrival_s for r in spike.generate(0)])
    counts = [((t >= a) & (t < b)).sum() for a, b in ((0, 60), (60, 120), (120, 240))]
    for n, want in zip(counts, (300, 1200, 600), strict=True):
        assert abs(n - want) <= 5 * math.sqrt(want)  # Poisson counts
    capped = Workload(output=Geometric(500), max_tokens=64, n_requests=500).generate(0)
    assert max(r.output_len for r in capped) == 64 and all(r.max_tokens == 64 for r in capped)


def test_mix_and_trace():
    a = Workload(prompt=100, output=10, rate=2.0, n_requests=50, priority=0)
    b = Workload(prompt=4000, output=500, rate=1.0, n_requests=20, priority=1)
    both = mix([a, b], seed=1)
    assert [r.rid for r in both] == list(range(70))
    assert sorted(r.arrival_s for r in both) == [r.arrival_s for r in both]
    assert sum(r.priority for r in both) == 20
    # adding b does not change a's draws
    alone = mix([a], seed=1)
    assert [r.arrival_s for r in both if r.priority == 0] == [r.arrival_s for r in alone]
    t = trace([(1.0, 10, 2), {"arrival_s": 0.5, "prompt_len": 3, "output_len": 1, "priority": 1}])
    assert [(r.rid, r.arrival_s, r.prompt_len, r.priority) for r in t] == [(0, 0.5, 3, 1), (1, 1.0, 10, 0)]


def test_validation_messages():
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 10"):
        Request(0, 0.0, 5, 10, max_tokens=9)
    with pytest.raises(ValueError, match="prompt_len must be an integer >= 1"):
        Request(0, 0.0, 0, 10)
    with pytest.raises(ValueError, match="arrival must be one of poisson, uniform, burst"):
        Workload(arrival="gamma")
    with pytest.raises(ValueError, match="rate must be a finite number > 0"):
        Workload(rate=0.0)
    with pytest.raises(ValueError, match="n_requests is required"):
        Workload(n_requests=None)
    with pytest.raises(ValueError, match="prompt must be a positive int or a length distribution"):
        Workload(prompt=2.5)
    with pytest.raises(ValueError, match="high must be an integer >= 5"):
        Uniform(5, 4)
    with pytest.raises(ValueError, match="values must hold at least one length"):
        Empirical(())
    with pytest.raises(ValueError, match="workloads must be a non-empty sequence of Workload"):
        mix([])
    with pytest.raises(ValueError, match="unknown Workload field"):
        Workload().replace(speed=1)
