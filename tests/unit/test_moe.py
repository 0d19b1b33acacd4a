"""lib.perf.moe: the closed form for distinct experts per decode step against its Monte Carlo."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf import moe


@pytest.mark.parametrize(
    ("e", "k", "b"), [(8, 2, 1), (8, 2, 3), (8, 2, 8), (8, 2, 32), (256, 8, 16), (256, 8, 128)]
)
def test_closed_form_matches_monte_carlo(e, k, b):
    # Mixtral (8 experts, top-2) and DeepSeek-V3 (256 routed, top-8) shapes.
    sim = moe.simulate_experts_touched(e, k, b, trials=3000, seed=7)
    closed = moe.expected_experts_touched(e, k, b)
    stderr = sim.std(ddof=1) / math.sqrt(len(sim))
    assert abs(sim.mean() - closed) <= 5 * stderr + 1e-9, (
        f"E={e} k={k} B={b}: MC {sim.mean()} vs {closed}"
    )


@settings(max_examples=40)
@given(st.integers(1, 32), st.data())
def test_closed_form_matches_monte_carlo_property(e, data):
    k = data.draw(st.integers(1, e))
    b = data.draw(st.integers(1, 40))
    sim = moe.simulate_experts_touched(e, k, b, trials=1500, seed=3)
    closed = moe.expected_experts_touched(e, k, b)
    # a rare event (all B tokens miss one expert) can leave the sample with no variance: floor
    # the standard error at that of a count with standard deviation 0.5
    stderr = max(sim.std(ddof=1), 0.5) / math.sqrt(len(sim))
    assert abs(sim.mean() - closed) <= 5 * stderr
    assert sim.min() >= k and sim.max() <= min(e, k * b)  # every trial is a valid count


@given(st.integers(1, 512), st.data())
def test_closed_form_bounds_and_monotone(e, data):
    k = data.draw(st.integers(1, e))
    b = data.draw(st.integers(1, 10_000))
    now, nxt = moe.expected_experts_touched(e, k, b), moe.expected_experts_touched(e, k, b + 1)
    assert (
        k - 1e-9 <= now <= min(e, k * b) + 1e-9
    )  # at least one token's experts, at most all / B k
    assert nxt >= now - 1e-9


def test_known_values():
    # Mixtral 8x7B: 8 (1 - (3/4)^4) = 8 x 175/256 = 5.46875 experts for 4 tokens.
    assert math.isclose(moe.expected_experts_touched(8, 2, 4), 8 * 175 / 256, rel_tol=1e-12)
    assert moe.expected_experts_touched(8, 2, 0) == 0
    with pytest.raises(ValueError, match="batch"):
        moe.expected_experts_touched(8, 2, -1)
