"""One preemption priced both ways (lib.scheduling.preemption) and the I016 explorer built on it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache.recompute_fetch import fetch_time_s, recompute_time_s, storage_tier
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.scheduling import LinearCost, Policy, step_cost, trace
from lib.scheduling.preemption import preemption_price, swap_recompute_crossover

DEP = Deployment("llama-3.1-8b", "h100-sxm")
DEP70 = Deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_prices_are_the_owning_functions():
    p = preemption_price(DEP, 6144, 64)
    assert p.recompute_s == recompute_time_s(DEP, 6144) == prefill_time(DEP, 6144).time_s
    assert p.recompute_riding_s == pytest.approx(prefill_time(DEP, 6144 + 64).time_s - prefill_time(DEP, 64).time_s)
    tier = storage_tier("host_dram", DEP.chip)
    assert p.swap_out_s == p.swap_in_s == fetch_time_s(DEP.mdl, 6144, tier)
    assert p.swap_round_trip_s == 2 * p.swap_out_s
    # the simulator charges the same swap price
    assert step_cost(DEP).swap_s(6144) == pytest.approx(p.swap_out_s, rel=1e-12)


def test_kv_bytes_by_hand_and_tp_shard():
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB per token
    p = preemption_price(DEP, 6144)
    assert p.kv_bytes == 6144 * 32 * 8 * 128 * 2 * 2 == p.kv_bytes_per_gpu
    q = preemption_price(DEP70, 6144)  # 8 KV heads over 4 ranks: each copies a quarter
    assert q.kv_bytes_per_gpu == pytest.approx(q.kv_bytes / 4)
    assert preemption_price(DEP70.replace(kv_dtype="fp8"), 6144).kv_bytes == pytest.approx(q.kv_bytes / 2)


def test_a_6k_victim_swaps_cheaper_on_pcie_gen5():
    # 0.805 GB at 55 GB/s is ~15 ms each way; the 8B's 6K prefill is ~1e14 FLOP at 0.6 x 989 TFLOP/s
    p = preemption_price(DEP, 6144)
    assert 0.010 < p.swap_out_s < 0.020
    assert 0.12 < p.recompute_s < 0.25
    assert p.recompute_s / p.swap_round_trip_s > 3


def test_riding_recompute_is_nearly_free_for_a_short_victim():
    p = preemption_price(DEP, 32, 64)  # 96 tokens: the pass is memory-bound either way
    assert p.recompute_riding_s < 0.05 * p.recompute_s


def test_crossover_is_where_the_comparison_flips():
    for dep, d in ((DEP, 64), (DEP, 256), (Deployment("llama-3.1-8b", "l4"), 8)):
        v = swap_recompute_crossover(dep, d)
        assert 1 < v < 10_000
        below, at = preemption_price(dep, v - 1, d), preemption_price(dep, v, d)
        assert below.swap_round_trip_s >= below.recompute_riding_s
        assert at.swap_round_trip_s < at.recompute_riding_s


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60_000), st.sampled_from([0, 16, 256]))
def test_crossover_splits_lengths(v, d):
    cross = swap_recompute_crossover(DEP, d, high=65_536)
    p = preemption_price(DEP, v, d)
    swap_wins = p.swap_round_trip_s < p.recompute_riding_s
    assert swap_wins == (v >= cross)


def test_alone_crossover_and_never():
    assert swap_recompute_crossover(DEP, 0, riding=False) == 1  # the weight read alone outlasts a tiny copy
    assert swap_recompute_crossover(DEP, 64, high=50) == 51  # nothing up to 50 tokens


def test_validation():
    with pytest.raises(ValueError, match="victim_tokens"):
        preemption_price(DEP, 0)
    with pytest.raises(ValueError, match="decodes"):
        preemption_price(DEP, 10, -1)
    with pytest.raises(ValueError):
        preemption_price("not a deployment", 10)


def test_engine_swap_time_is_the_price_of_the_victims_blocks():
    # a tiny pool: the second request is swapped; the timeline charges out + in at the cost's swap_s
    cost = LinearCost(per_seq_s=0.01, per_prefill_token_s=1e-4, swap_s_per_token=1e-5, max_running=4, token_budget=256)
    from lib.scheduling import simulate

    res = simulate(trace([(0.0, 32, 40), (0.0, 32, 40)]), Policy(preemption="swap"), cost, kv_blocks=8, block_size=16)
    victim = res.requests[1]
    assert victim.swaps >= 1
    assert res.timeline.swap_s.sum() > 0


def test_explorer_view_matches_lib():
    from lib.explorers.scheduling_memory import preemption_cost

    view = preemption_cost("llama-3.1-8b", "h100-sxm", 1, "bf16", 6144, 64)
    p = preemption_price(DEP, 6144, 64)
    assert view.values["recompute"] == p.recompute_s
    assert view.values["round_trip"] == p.swap_round_trip_s
    assert view.values["crossover"] == swap_recompute_crossover(DEP, 64, high=131072)
    assert dict(view.rows)["cheaper for this victim"] == "swap"
    with pytest.raises(ValueError, match="context window"):
        preemption_cost("llama-2-7b", "h100-sxm", 1, "bf16", 8192, 64)
