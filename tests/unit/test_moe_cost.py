"""lib.perf.moe_cost: MoE step cost vs batch, dense yardsticks, compute-bound batch, skewed routing."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import moe, moe_cost
from lib.registry.models import model


def test_batch_one_reads_the_published_active_params():
    # Mistral: 12.9B active of 46.7B; DeepSeek-V3 paper: 37B activated of 671B. Both counts
    # include the embedding table (Mixtral 32,000 x 4,096 = 0.13B), which a step reads one row of.
    table = 32_000 * 4_096
    one = moe_cost.moe_step_cost("mixtral-8x7b", "h200", 1)
    assert math.isclose(one.weight_bytes, (12.9e9 - table) * 2, rel_tol=0.01)
    big = moe_cost.moe_step_cost("mixtral-8x7b", "h200", 4096)
    assert math.isclose(big.weight_bytes, (46.7e9 - table) * 2, rel_tol=0.01)
    # DeepSeek-V3 FP8: 37.55e9 active (config) - 129,280 x 7,168 = 36.6 GB, 1% under the rounded 37B
    ds = moe_cost.moe_step_cost("deepseek-v3", "h200", 1, "fp8", "fp8", tp=8)
    assert math.isclose(ds.weight_bytes, 37e9, rel_tol=0.03)


def test_yardsticks_and_vectorized_curves_agree_with_the_roofline():
    y = moe_cost.dense_yardsticks("mixtral-8x7b")
    m = model("mixtral-8x7b")
    # the parameters a step streams: stored minus the embedding table
    assert (
        y["same_active"]["params"] == m.params_active - m.vocab_size * m.hidden_size
        and y["same_total"]["params"] == m.params_total - m.vocab_size * m.hidden_size
    )
    batches = np.array([1, 3, 16, 200, 5000])
    curves = moe_cost.per_token_time_curves("mixtral-8x7b", "h100-sxm", batches)
    for i, b in enumerate(batches):
        costs = moe_cost.compare_with_dense("mixtral-8x7b", "h100-sxm", int(b))
        for name, cost in costs.items():
            assert math.isclose(curves[name][i], cost.time_per_token_s, rel_tol=1e-9), (name, b)


def test_compute_bound_batch_root_and_ordering():
    b = moe_cost.compute_bound_batch("mixtral-8x7b", "h100-sxm")
    below = moe_cost.moe_step_cost("mixtral-8x7b", "h100-sxm", math.floor(b))
    above = moe_cost.moe_step_cost("mixtral-8x7b", "h100-sxm", math.ceil(b) + 1)
    assert below.bound == "memory" and above.bound == "compute"
    # a dense model as big as the MoE turns compute-bound far earlier (closed form: ridge x b/2 x N/N_matmul)
    dense = moe_cost.dense_compute_bound_batch(
        **moe_cost.dense_yardsticks("mixtral-8x7b")["same_total"], chip="h100-sxm"
    )
    assert dense < b
    with pytest.raises(ValueError, match="dense model"):
        moe_cost.compute_bound_batch("llama-3.1-8b", "h100-sxm")


def test_tokens_per_expert():
    assert moe_cost.tokens_per_expert(8, 2, 1) == 1.0
    assert math.isclose(moe_cost.tokens_per_expert(8, 2, 10_000), 10_000 * 2 / 8, rel_tol=1e-9)


@given(st.integers(1, 300), st.data(), st.floats(0, 3))
def test_zipf_inclusion_probabilities_are_valid(e, data, skew):
    k = data.draw(st.integers(1, e))
    pi = moe_cost.zipf_inclusion_probabilities(e, k, skew)
    assert math.isclose(pi.sum(), k, rel_tol=1e-9) and np.all(pi <= 1 + 1e-12) and np.all(pi > 0)
    assert np.all(np.diff(pi) <= 1e-12)  # most popular first


@given(st.integers(1, 256), st.data())
def test_nonuniform_closed_form_reduces_to_lib_moe(e, data):
    k = data.draw(st.integers(1, e))
    b = data.draw(st.integers(0, 5000))
    pi = moe_cost.zipf_inclusion_probabilities(e, k, 0.0)
    assert math.isclose(
        moe_cost.expected_experts_touched_nonuniform(pi, b),
        moe.expected_experts_touched(e, k, b),
        rel_tol=1e-9,
        abs_tol=1e-9,
    )


@pytest.mark.parametrize(
    ("e", "k", "skew", "b"), [(8, 2, 0.0, 4), (8, 2, 1.0, 8), (64, 6, 1.2, 16), (256, 8, 0.8, 32)]
)
def test_skewed_closed_form_against_monte_carlo(e, k, skew, b):
    pi = moe_cost.zipf_inclusion_probabilities(e, k, skew)
    sim = moe_cost.simulate_routing(pi, b, trials=1500, seed=11)
    closed = moe_cost.expected_experts_touched_nonuniform(pi, b)
    stderr = max(sim["distinct"].std(ddof=1), 0.5) / math.sqrt(1500)
    assert abs(sim["distinct"].mean() - closed) <= 5 * stderr


def test_sampler_picks_k_distinct_with_the_given_marginals():
    pi = moe_cost.zipf_inclusion_probabilities(8, 2, 1.0)
    sim = moe_cost.simulate_routing(pi, 1, trials=20000, seed=2)
    assert np.all(sim["distinct"] == 2)  # one token: exactly k distinct experts
    freq = sim["load"].mean(axis=0)  # each expert's inclusion frequency against its target pi_e
    assert np.all(np.abs(freq - pi) <= 5 * np.sqrt(pi * (1 - pi) / 20000) + 1e-12)
    big = moe_cost.simulate_routing(pi, 200, trials=200, seed=3)
    # mean load per expert = B pi_e, so the hottest expert's mean load is at least B max(pi)
    assert big["max_load"].mean() >= 200 * pi.max() * 0.98


def test_hottest_expert_ratio():
    assert math.isclose(
        moe_cost.hottest_expert_load_ratio(moe_cost.zipf_inclusion_probabilities(8, 2, 0)), 1.0
    )
    pi = moe_cost.zipf_inclusion_probabilities(8, 2, 1.0)
    assert math.isclose(moe_cost.hottest_expert_load_ratio(pi), pi[0] * 8 / 2)
    with pytest.raises(ValueError, match="sum to an integer"):
        moe_cost.expected_experts_touched_nonuniform([0.5, 0.3], 4)
    with pytest.raises(ValueError, match="too large"):
        moe_cost.simulate_routing(
            moe_cost.zipf_inclusion_probabilities(256, 8, 0), 4096, trials=100
        )


@given(st.integers(2, 512), st.data(), st.floats(0.01, 0.999))
def test_expert_coverage_batch_inverts_the_closed_form(e, data, q):
    k = data.draw(st.integers(1, e - 1))
    b = moe_cost.batch_for_expert_coverage(e, k, q)
    assert math.isclose(moe.expected_experts_touched(e, k, b), q * e, rel_tol=1e-9)


def test_expert_coverage_edges():
    # Mixtral: 99% of the 8 experts after ln(0.01) / ln(0.75) = 16.0 tokens
    assert math.isclose(
        moe_cost.batch_for_expert_coverage(8, 2, 0.99), math.log(0.01) / math.log(0.75)
    )
    assert moe_cost.batch_for_expert_coverage(8, 8, 0.5) == 1.0
    assert math.isinf(moe_cost.batch_for_expert_coverage(8, 2, 1.0))
