"""lib.training.plan: the searches a run plan makes over the training step and memory models."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import plan
from lib.training.step import TrainingLayout, training_memory


def _llama3_128k(**kw) -> TrainingLayout:
    base = dict(tp=8, pp=16, dp=128, cp=1, seq_len=131072, micro_batches=16)
    base.update(kw)
    return TrainingLayout("llama-3.1-405b", "h100-sxm", **base)


def test_llama3_128k_stage_needs_cp16():
    # The Llama 3 Herd of Models, Table 4: 405B at 131,072 tokens ran TP8 CP16 PP16 DP8 on 16,384 H100s.
    lay = plan.min_context_parallel(_llama3_128k())
    assert (lay.cp, lay.dp, lay.n_gpus) == (16, 8, 16384)


def test_candidates_are_powers_of_two_dividing_sequence_and_replicas():
    assert plan.context_parallel_candidates(_llama3_128k(dp=24)) == [1, 2, 4, 8]
    assert plan.context_parallel_candidates(_llama3_128k(dp=24), fixed_replicas=False)[-1] == 131072


def test_refuses_when_nothing_fits_and_names_the_shortfall():
    with pytest.raises(ValueError, match="no context-parallel degree up to 4 fits"):
        plan.min_context_parallel(_llama3_128k(), max_cp=4)
    with pytest.raises(ValueError, match="layout must be a TrainingLayout"):
        plan.context_parallel_candidates("llama-3.1-405b")


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]),
       gpu=st.sampled_from(["h100-sxm", "h200", "a100-sxm"]),
       seq=st.sampled_from([16384, 32768, 65536, 131072]), pp=st.sampled_from([1, 2, 4, 8]),
       m=st.integers(1, 32), recompute=st.sampled_from(["none", "selective", "full"]))
def test_min_context_parallel_is_the_first_fitting_degree_by_brute_force(model, gpu, seq, pp, m, recompute):
    base = TrainingLayout(model, gpu, tp=8, pp=pp, dp=64, cp=1, seq_len=seq, micro_batches=m, recompute=recompute)
    fits = [cp for cp in plan.context_parallel_candidates(base)
            if training_memory(base.replace(cp=cp, dp=64 // cp))["headroom"] >= 0]
    if not fits:
        with pytest.raises(ValueError):
            plan.min_context_parallel(base)
        return
    lay = plan.min_context_parallel(base)
    assert lay.cp == fits[0] and lay.dp * lay.cp == 64 and lay.n_gpus == base.n_gpus


# ---- router imbalance under expert parallelism (N068) ----------------------------------------

def test_rank_loads_sum_to_k_and_bracket_the_expert_ratio():
    from lib.perf.moe_cost import hottest_expert_load_ratio, zipf_inclusion_probabilities

    pi = zipf_inclusion_probabilities(64, 8, 0.7)
    for ep in (1, 2, 4, 8, 16, 32, 64):
        for placement in plan.EP_PLACEMENTS:
            assert plan.ep_rank_loads(pi, ep, placement).sum() == pytest.approx(8.0)
        # popular experts together are never better than dealt round-robin
        assert plan.ep_rank_load_ratio(pi, ep) >= plan.ep_rank_load_ratio(pi, ep, "round_robin") - 1e-12
    assert plan.ep_rank_load_ratio(pi, 1) == pytest.approx(1.0)
    assert plan.ep_rank_load_ratio(pi, 64) == pytest.approx(hottest_expert_load_ratio(pi))
    assert plan.ep_rank_load_ratio(zipf_inclusion_probabilities(64, 8, 0.0), 8) == pytest.approx(1.0)


def test_rank_loads_match_a_router_monte_carlo():
    import numpy as np

    from lib.perf.moe_cost import simulate_routing, zipf_inclusion_probabilities

    pi = zipf_inclusion_probabilities(32, 4, 0.8)
    load = simulate_routing(pi, 2000, trials=40, seed=3)["load"].sum(axis=0)
    for placement in plan.EP_PLACEMENTS:
        want = plan.ep_rank_loads(pi, 4, placement) * 2000 * 40
        order = np.arange(32).reshape(4, -1) if placement == "contiguous" else np.arange(32).reshape(-1, 4).T
        got = load[order].sum(axis=1)
        assert np.max(np.abs(got - want) / np.sqrt(want)) < 5


def test_rank_loads_refuse_bad_inputs():
    from lib.perf.moe_cost import zipf_inclusion_probabilities

    pi = zipf_inclusion_probabilities(12, 2, 0.5)
    with pytest.raises(ValueError, match="ep=5 must divide"):
        plan.ep_rank_loads(pi, 5)
    with pytest.raises(ValueError, match="placement must be one of"):
        plan.ep_rank_loads(pi, 4, "random")


@pytest.mark.parametrize(("e", "k", "n"), [(8, 2, 2), (12, 3, 4), (16, 4, 8), (10, 1, 5)])
def test_expected_nodes_touched_by_enumeration(e, k, n):
    from itertools import combinations

    per = e // n
    subsets = list(combinations(range(e), k))
    brute = sum(len({x // per for x in s}) for s in subsets) / len(subsets)
    assert plan.expected_nodes_touched(e, k, n) == pytest.approx(brute, rel=1e-12)
    with pytest.raises(ValueError):
        plan.expected_nodes_touched(e, e + 1, n)


def test_imbalance_seconds_are_linear_in_the_excess_and_zero_when_balanced():
    from lib.explorers.training_scale import moe_1t
    from lib.training.step import training_step

    lay = TrainingLayout(moe_1t(384), "h100-sxm", tp=1, pp=16, dp=128, ep=8, seq_len=4096, micro_batches=32,
                         zero_stage=2)
    st_ = training_step(lay)
    assert plan.expert_imbalance_s(st_, 1.0) == 0.0
    a, b = plan.expert_imbalance_s(st_, 1.5), plan.expert_imbalance_s(st_, 2.0)
    assert b == pytest.approx(2 * a) and 0 < a < st_.step_s
    share = plan.routed_expert_flops_share(lay.mdl, 4096)
    assert 0 < share < 1
    with pytest.raises(ValueError, match="dense"):
        plan.routed_expert_flops_share("llama-3.1-8b", 4096)
    with pytest.raises(ValueError):
        plan.expert_imbalance_s(st_, 0.5)


# ---- the layout search and the run's calendar (N022) -----------------------------------------

def test_best_fitting_layout_is_the_best_fitting_variant_by_brute_force():
    from lib.training.step import training_step

    base = TrainingLayout("llama-3.1-405b", "h100-sxm", tp=8, pp=16, dp=128, seq_len=8192, micro_batches=16)
    best = plan.best_fitting_layout(base, interleaves=(1, 2, 4, 7))
    assert training_memory(best)["headroom"] >= 0
    for v in (1, 2, 4, 7):
        for rc in ("none", "selective", "full"):
            lay = base.replace(interleave=v, recompute=rc)
            if training_memory(lay)["headroom"] >= 0:
                assert training_step(lay).mfu <= training_step(best).mfu + 1e-12
    with pytest.raises(ValueError, match="fits"):
        plan.best_fitting_layout(TrainingLayout("llama-3.1-405b", "h100-sxm", tp=8, pp=1, dp=1, seq_len=8192))


def test_run_schedule_reproduces_the_fleet_equation_and_llama3_counts():
    from lib.training import flops, reliability

    c = flops.six_n_d(405.85e9, 10e12)
    s = plan.run_schedule(c, 16384, "h100-sxm", 0.41, checkpoint_s=3.0, restart_s=900.0)
    assert s.compute_s == pytest.approx(c / (16384 * 989.4e12 * 0.41), rel=2e-3)
    # Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs
    assert s.interruptions_compute_only == pytest.approx(419 * s.compute_s / (54 * 86400), rel=1e-9)
    assert s.interval_s == pytest.approx(reliability.young_interval_s(3.0, s.mtbf_s))
    assert s.wall_s == pytest.approx(s.compute_s / s.goodput)
    assert s.interruptions == pytest.approx(s.wall_s / s.mtbf_s)
    assert s.checkpoints == pytest.approx(s.compute_s / s.interval_s)
    fixed = plan.run_schedule(c, 16384, "h100-sxm", 0.41, 3.0, 900.0, interval_s=3600.0)
    assert fixed.goodput < s.goodput  # Young's interval is the optimum of the same loss


def test_run_schedule_goodput_agrees_with_a_monte_carlo_when_restarts_are_short():
    from lib.training import reliability

    s = plan.run_schedule(1e24, 4096, "h100-sxm", 0.4, checkpoint_s=20.0, restart_s=60.0)
    mc = reliability.simulate_goodput(s.interval_s, s.checkpoint_s, s.mtbf_s, s.restart_s, seed=1, runs=40)
    assert s.goodput == pytest.approx(mc, abs=0.01)


def test_run_schedule_refuses_a_run_that_never_finishes():
    with pytest.raises(ValueError, match="never finishes"):
        plan.run_schedule(1e25, 32768, "h100-sxm", 0.4, checkpoint_s=600.0, restart_s=20000.0)
