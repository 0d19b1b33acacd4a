"""lib.training.posttrain: the rollout length distribution against its closed form; the slot
schedule against its bounds; generation time against a step-by-step sum of the decode step (the
oracle: no grid, no interpolation); the weight sync against bytes over the NIC; the RL step's
bookkeeping; DPO's FLOPs against a hand count and its memory against the state model."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import deployment
from lib.perf.throughput import kv_batch_ceiling, step_s_at
from lib.registry.hardware import gpu
from lib.registry.models import model
from lib.training import posttrain as pt


def test_response_lengths_follow_the_capped_exponential():
    x = pt.response_lengths(20000, 4096, 16384)
    assert x.min() >= 1 and x.max() <= 16384 and np.all(np.diff(x) >= 0)
    # E[min(X, c)] for an exponential of mean m: m (1 - exp(-c / m)); the ceiling adds about half a token
    want = 4096 * (1 - math.exp(-16384 / 4096)) + 0.5
    assert x.mean() == pytest.approx(want, rel=0.01)
    assert np.array_equal(x, pt.response_lengths(20000, 4096, 16384))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=60), st.integers(1, 16))
def test_slot_loads_are_a_valid_schedule(lengths, slots):
    loads = pt._slot_loads(np.array(lengths), slots)
    assert loads.sum() == sum(lengths)
    lower = max(max(lengths), sum(lengths) / slots)  # no schedule beats this
    assert lower <= loads.max() <= 4 / 3 * lower + 1e-9  # Graham's LPT bound


def _brute_generation(dep, prompt_len, lengths, prompts):
    """Every decode step summed one by one (no grid, no interpolation), plus the same prefill."""
    from lib.perf.prefill import prefill_time

    ctx = 64 * max(1, round((prompt_len + float(np.mean(lengths)) / 2) / 64))
    slots = int(min(math.floor(kv_batch_ceiling(dep, prompt_len + int(max(lengths)))), len(lengths)))
    loads = np.sort(pt._slot_loads(np.array(lengths), slots))
    total = 0.0
    for t in range(int(loads[-1])):
        b = slots - int(np.searchsorted(loads, t + 0.5, side="right"))
        total += step_s_at(dep, float(max(b, 1)), ctx)
    return total + prefill_time(dep, prompt_len, prompts).time_s


@pytest.mark.parametrize("n, mean, cap", [(1, 300, 1000), (24, 200, 800), (200, 400, 1600)])
def test_generation_matches_a_step_by_step_sum(n, mean, cap):
    dep = deployment("llama-3.1-8b", "h100-sxm", tp=1)
    lengths = pt.response_lengths(n, mean, cap)
    got, mean_batch, slots = pt.generation_s(dep, 256, lengths, prompts=n)
    want = _brute_generation(dep, 256, lengths, n)
    assert got == pytest.approx(want, rel=0.02)
    assert 1 <= mean_batch <= slots <= n


def test_weight_sync_is_the_shard_over_the_nic():
    m, chip = model("llama-3.1-70b"), gpu("h100-sxm")
    assert m.weight_bytes("bf16") / 1e9 == pytest.approx(141.1, rel=1e-3)  # the 141 GB of a 70B in BF16
    t = pt.weight_sync_s(m, chip, 8, 8)
    shard = m.weight_bytes("bf16") / 8
    assert shard / chip.scaleout_bandwidth <= t <= 1.5 * shard / chip.scaleout_bandwidth
    assert pt.weight_sync_s(m, chip, 4, 8) > 1.9 * t  # twice the shard per GPU


def test_rl_step_bookkeeping():
    s = pt.rl_step("llama-3.1-70b", "h100-sxm", 8, 8, 8, 4, 2, 64, 8, 512, 1024, 4096)
    assert s.actor_gpus == 64 and s.learner_gpus == 64
    # idle: a brute-force walk over one on-policy step in 1 ms ticks
    dt = 1e-3
    t = np.arange(0, s.step_s, dt)
    actor_busy = (t < s.generation_s).sum() * dt * s.actor_gpus
    learner_busy = (t >= s.generation_s + s.sync_s).sum() * dt * s.learner_gpus
    idle = 1 - (actor_busy + learner_busy) / ((s.actor_gpus + s.learner_gpus) * s.step_s)
    assert s.idle_fraction == pytest.approx(idle, abs=1e-3)
    assert s.async_step_s <= s.step_s
    assert s.balanced_ratio == pytest.approx(s.actor_gpu_s_per_token * s.tokens_generated
                                             / (s.learner_gpu_s_per_token * s.tokens_trained))
    # more actor replicas shorten generation
    s2 = pt.rl_step("llama-3.1-70b", "h100-sxm", 8, 16, 8, 4, 2, 64, 8, 512, 1024, 4096)
    assert s2.generation_s < s.generation_s


def test_rl_step_refuses():
    with pytest.raises(ValueError, match="learner"):
        pt.rl_step("llama-3.1-70b", "h100-sxm", 8, 1, 1, 1, 1, 16, 1, 512, 1024, 4096)
    with pytest.raises(ValueError, match="rollouts"):
        pt.rl_step("llama-3.1-8b", "h100-sxm", 1, 64, 1, 1, 8, 16, 2, 512, 1024, 4096)
    with pytest.raises(ValueError, match="lengths"):
        pt.generation_s(deployment("llama-3.1-8b", "h100-sxm"), 128, np.array([]))


# ---- DPO --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mdl", ["llama-3.1-8b", "llama-3.1-70b"])
def test_dpo_flops_by_hand(mdl):
    m = model(mdl)
    c = pt.dpo_cost(mdl, "h100-sxm", 512, 1024, tp=8, pp=1, dp=8)
    seq = 1536
    hand = 6 * m.matmul_params_active + 12 * m.num_layers * seq * m.num_attention_heads * m.head_dim
    assert c.policy_flops == pytest.approx(2 * seq * hand, rel=1e-12)
    assert c.reference_flops == pytest.approx(c.policy_flops / 3, rel=1e-12)
    assert c.reference_share == pytest.approx(0.25)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_dpo_reference_memory_is_a_weight_shard(zero):
    m = model("llama-3.1-70b")
    c = pt.dpo_cost("llama-3.1-70b", "h200", 512, 1024, tp=8, pp=2, dp=4, zero_stage=zero)
    shard = m.weight_bytes("bf16") / 16 / (4 if zero == 3 else 1)
    assert c.reference_bytes == pytest.approx(shard, rel=0.01)  # embedding / LM head split aside
    assert c.memory_in_loop - c.memory_precomputed == pytest.approx(c.reference_bytes)


def test_dpo_reference_time_is_a_forward_share():
    c = pt.dpo_cost("llama-3.1-70b", "h100-sxm", 512, 1024, tp=8, pp=1, dp=8)
    # a forward is a third of the compute: the reference costs less than half the policy step and more than a tenth
    assert 0.1 * c.policy_step_s < c.reference_step_s < 0.5 * c.policy_step_s
    assert c.epoch_s(10_000) > c.epoch_s(10_000, reference_in_loop=False)
    assert c.epoch_s(c.pairs_per_step + 1) == pytest.approx(2 * c.step_in_loop_s)


def test_reference_precompute_is_prefill_passes():
    from lib.perf.prefill import prefill_time

    one = prefill_time(deployment("llama-3.1-8b", "h100-sxm", tp=1), 2048, 16).time_s
    assert pt.reference_precompute_s("llama-3.1-8b", "h100-sxm", 8, 2048, tp=1, batch=16) == pytest.approx(one)
    assert pt.reference_precompute_s("llama-3.1-8b", "h100-sxm", 800, 2048, tp=1, batch=16, replicas=4) \
        == pytest.approx(25 * one)


def test_dpo_refuses():
    with pytest.raises(ValueError, match="prompt_len"):
        pt.dpo_cost("llama-3.1-8b", "h100-sxm", 0, 1024)
    with pytest.raises(ValueError, match="pairs"):
        pt.reference_precompute_s("llama-3.1-8b", "h100-sxm", 0, 1024)
