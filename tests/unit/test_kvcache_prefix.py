"""lib.kvcache.recompute_fetch, prefix_hits, radix_scenarios, block_hash: recompute vs fetch, storage tiers, hit-rate accounting, radix tools, block tools.

Expected values come from a second method (explicit sums, brute force, hand arithmetic on
published configs) with the tolerance stated beside each.
"""

import math
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import (
    PrefixBlockCache,
    RadixCache,
    branching_agent_trace,
    hash_block,
    multi_turn_chat_trace,
)
from lib.kvcache import block_hash as bh
from lib.kvcache import prefix_hits as ph
from lib.kvcache import radix_scenarios as rs
from lib.kvcache import recompute_fetch as rf
from lib.registry import hardware, models

M70, H100 = "llama-3.1-70b", "h100-sxm"
# Llama 3.1 70B KV bytes per token in BF16: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes
# (arXiv:2407.21783 Table 3 for layers/KV heads; head_dim = 8192 / 64).
KV70 = 2 * 80 * 8 * 128 * 2


# ---- FLOPs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "llama-2-7b"])
def test_recompute_flops_is_the_sum_over_positions(name):
    m = models.model(name)
    p = 777
    explicit = sum(m.flops_per_token(i) for i in range(1, p + 1))  # token i attends to i keys
    assert math.isclose(rf.recompute_flops(m, p), explicit, rel_tol=1e-12)
    assert rf.recompute_flops(m, 0) == 0.0
    assert math.isclose(rf.recompute_flops_per_token(m, p), explicit / p, rel_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 3000), frac=st.floats(0, 1))
def test_cached_prefix_flops_identity(length, frac):
    # prefill(L) - prefill with h cached = prefill(h): causal attention never looks forward.
    h = int(frac * length)
    m = models.model(M70)
    with_cache = rf.prefill_flops_with_cached_prefix(m, length, h)
    assert math.isclose(
        m.prefill_flops(length) - with_cache, rf.recompute_flops(m, h), rel_tol=1e-9, abs_tol=1.0
    )


def test_cached_prefix_flops_explicit_sum_and_validation():
    m = models.model("llama-3.1-8b")
    explicit = sum(m.flops_per_token(i) for i in range(301, 501))
    assert math.isclose(rf.prefill_flops_with_cached_prefix(m, 500, 300), explicit, rel_tol=1e-12)
    assert rf.prefill_flops_with_cached_prefix(m, 500, 500) == 0
    with pytest.raises(ValueError, match="cached_len"):
        rf.prefill_flops_with_cached_prefix(m, 10, 11)


def test_flops_per_kv_byte_uses_the_published_kv_size():
    m = models.model(M70)
    assert m.kv_bytes_per_token() == KV70 == 327_680
    assert math.isclose(rf.flops_per_kv_byte(m, 1), m.flops_per_token(1) / KV70, rel_tol=1e-12)
    # FP8 KV halves the bytes, doubles the ratio.
    assert math.isclose(
        rf.flops_per_kv_byte(m, 100, "fp8"), 2 * rf.flops_per_kv_byte(m, 100), rel_tol=1e-12
    )


# ---- tiers --------------------------------------------------------------------------------------


def test_storage_tiers_read_links_from_hardware_yaml():
    h100 = hardware.gpu(H100)
    host = rf.storage_tier("host_dram", H100)
    assert host.peak_bandwidth == 63.0e9  # PCIe Gen5 x16 per direction (hardware.yaml)
    assert math.isclose(
        host.bandwidth, 55e9, rel_tol=0.001
    )  # measured ~55 GB/s H2D (ml-engineering)
    assert rf.storage_tier("host_dram", "a100-sxm").peak_bandwidth == 31.5e9  # Gen4 x16
    assert rf.storage_tier("host_dram", "gb200").peak_bandwidth == 450e9  # NVLink-C2C to Grace
    assert rf.storage_tier("nvlink_peer", H100).peak_bandwidth == h100.scaleup_bandwidth == 450e9
    assert rf.storage_tier("rdma_remote", H100).peak_bandwidth == 50e9  # 400 Gb/s NIC
    # PM1743 13 GB/s datasheet sequential read x 0.7 achieved (data/assumptions.yaml (storage))
    assert rf.storage_tier("local_nvme", H100).bandwidth == pytest.approx(13e9 * 0.7, rel=1e-12)
    assert rf.storage_tier("network_storage", H100).latency_s == 2e-3
    assert [t.key for t in rf.available_tiers("l4")] == [
        "host_dram",
        "local_nvme",
        "network_storage",
    ]
    with pytest.raises(ValueError, match="NVLink"):
        rf.storage_tier("nvlink_peer", "l4")
    with pytest.raises(ValueError, match="unknown storage tier"):
        rf.storage_tier("floppy", H100)


def test_fetch_time_by_hand():
    tier = rf.storage_tier("host_dram", H100)
    # TP8: each GPU holds 1 of 8 KV heads and fetches 8192 x 327,680 / 8 bytes over its own link.
    expected = 20e-6 + 8192 * KV70 / 8 / (63e9 * 0.873)  # 20 us fixed cost (data/assumptions.yaml (storage))
    assert math.isclose(rf.fetch_time_s(M70, 8192, tier, tp=8), expected, rel_tol=1e-12)
    # MLA's single latent is replicated on every rank: TP does not shrink the bytes per GPU.
    ds = models.model("deepseek-v3")
    assert math.isclose(
        rf.fetch_time_s(ds, 1000, tier, tp=8) - tier.latency_s,
        1000 * ds.kv_bytes_per_token() / tier.bandwidth,
        rel_tol=1e-12,
    )
    assert rf.fetch_time_s(M70, 0, tier) == 0.0
    with pytest.raises(ValueError, match="StorageTier"):
        rf.fetch_time_s(M70, 10, "host_dram")


# ---- time and break-even --------------------------------------------------------------------------














# ---- hit-rate accounting ----------------------------------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(ph.WORKLOADS))
def test_radix_hits_equal_brute_force_with_unbounded_cache(seed, kind):
    trace = ph.workload_trace(
        kind,
        num_requests=24,
        system_prompt_tokens=20,
        turn_tokens=6,
        num_turns=3,
        vocab_size=5,
        seed=seed,
    )
    sim = ph.simulate_radix_hits(trace)
    assert list(sim.hit_tokens) == ph.brute_force_hits(trace)
    assert sim.evicted_tokens == 0
    # every distinct prefix once: the number of distinct (prefix) tuples
    assert sim.unique_tokens == len({r[: i + 1] for r in trace for i in range(len(r))})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chat_closed_form_matches_simulation(seed):
    c, t, s, u, r = 7, 5, 40, 6, 10
    trace = multi_turn_chat_trace(
        c, t, system_prompt_tokens=s, user_tokens=u, reply_tokens=r, vocab_size=2**40, seed=seed
    )
    sim = ph.simulate_radix_hits(trace)
    closed = ph.chat_prefix_accounting(c, t, s, u, r)
    assert sum(sim.hit_tokens) == closed.hit_tokens
    assert sim.total_tokens == closed.prompt_tokens
    assert sim.unique_tokens == closed.unique_tokens


def test_shared_prompt_closed_form_and_scale():
    trace = ph.workload_trace(
        "shared_prompt", num_requests=30, system_prompt_tokens=50, turn_tokens=10, vocab_size=2**40
    )
    sim = ph.simulate_radix_hits(trace)
    assert math.isclose(sim.hit_rate, ph.shared_prompt_hit_rate(30, 50, 10), rel_tol=1e-12)
    assert math.isclose(ph.shared_prompt_hit_rate(1000, 2000, 500), 999 * 2000 / (1000 * 2500))
    scaled = ph.simulate_radix_hits(trace, token_scale=16)
    assert scaled.hit_rate == sim.hit_rate and scaled.total_tokens == 16 * sim.total_tokens


def test_unrelated_trace_barely_hits():
    trace = ph.unrelated_trace(50, 100, vocab_size=128_000, seed=1)
    assert len(trace) == 50 and all(len(r) == 100 for r in trace)
    assert ph.simulate_radix_hits(trace).hit_rate < 0.001


def test_bounded_cache_evicts_and_hits_less():
    trace = ph.workload_trace(
        "multi_turn_chat",
        num_requests=40,
        system_prompt_tokens=30,
        turn_tokens=8,
        num_turns=4,
        vocab_size=2**30,
    )
    free = ph.simulate_radix_hits(trace)
    tight = ph.simulate_radix_hits(trace, free.unique_tokens // 3)
    assert tight.evicted_tokens > 0 and tight.hit_rate < free.hit_rate
    assert tight.cached_tokens_peak <= free.unique_tokens // 3


def test_prefill_savings_caps_full_hits_and_validates():
    m = models.model("llama-3.1-8b")
    sav = ph.prefill_savings(m, [100, 100], [0, 100])
    assert (
        sav.tokens_without == 200 and sav.tokens_with == 101
    )  # the full hit still runs its last token
    assert math.isclose(sav.flops_saved, m.prefill_flops(99), rel_tol=1e-12)
    with pytest.raises(ValueError, match="cannot exceed"):
        ph.prefill_savings(m, [10], [11])
    with pytest.raises(ValueError, match="differ"):
        ph.prefill_savings(m, [10], [])


def test_longest_common_prefix():
    assert ph.longest_common_prefix((1, 2, 3), (1, 2, 4)) == 2
    assert ph.longest_common_prefix((1, 2), (1, 2, 3)) == 2
    assert ph.longest_common_prefix((), (1,)) == 0
    assert ph.longest_common_prefix((5,), (6,)) == 0


def test_workload_trace_validation():
    with pytest.raises(ValueError, match="kind"):
        ph.workload_trace("batch", num_requests=1, system_prompt_tokens=1, turn_tokens=1)
    agent = ph.workload_trace(
        "branching_agent", num_requests=10, system_prompt_tokens=5, turn_tokens=3, num_turns=2
    )
    assert all((len(r) - 5) % 3 == 0 for r in agent)


# ---- radix tools --------------------------------------------------------------------------------


def test_render_radix_tree_exact_text():
    cache = RadixCache(10)
    cache.insert([1, 2, 3])
    node = cache.insert([1, 2, 4, 5]).node
    cache.lock(node)
    assert rs.render_radix_tree(cache) == [
        "root (5 cached, 5 free of 10)",
        "└─ [1 2] slots 0-1 · lock 1 · t=2",  # the split's upper half, touched by insert 2
        "   ├─ [3] slots 2 · t=1",  # the lower half keeps insert 1's access time
        "   └─ [4 5] slots 3-4 · lock 1 · t=2",
    ]


def test_scenarios_replay():
    _, ops = rs.radix_scenario("pin_and_evict")
    steps = rs.replay_radix(ops, 12)
    assert len(steps) == len(ops) + 1
    after_pressure = steps[5]  # insert [7 7 7 7] under pressure: the pinned path survives
    assert after_pressure.num_pinned == 5
    assert any("[1 2 3]" in line for line in after_pressure.tree)
    assert steps[-1].num_cached == 4  # after unlock, evict(5) removes the old path leaf-first
    _, ops = rs.radix_scenario("edge_split")
    assert "matched 2 tokens" in rs.replay_radix(ops, 24)[3].result
    tiny = rs.replay_radix(rs.radix_scenario("chat")[1], 4)
    assert any("OutOfSlots" in s.result for s in tiny)
    assert len(rs.replay_radix(ops, 24, upto=2)) == 3
    with pytest.raises(ValueError, match="unknown radix scenario"):
        rs.radix_scenario("nope")


def _traces():
    chat = multi_turn_chat_trace(
        6, 4, system_prompt_tokens=16, user_tokens=4, reply_tokens=8, vocab_size=8, seed=3
    )
    agent = branching_agent_trace(
        40, system_prompt_tokens=16, step_tokens=6, max_depth=5, vocab_size=8, seed=3
    )
    return chat, agent


@pytest.mark.parametrize("slots", [None, 200, 90])
def test_oracle_passes_the_reference_cache(slots):
    for trace in _traces():
        report = rs.radix_oracle_check(trace, slots, running=4)
        assert report.ok, report.violations
        assert report.checks >= 4 * (len(trace) - report.skipped) > 0


def test_oracle_catches_both_defects():
    chat, _ = _traces()
    split = rs.radix_oracle_check(
        chat, 200, cache_factory=partial(rs.DefectiveRadixCache, defect="split_keeps_slots")
    )
    assert not split.ok and "LRU leaf-evicting cache still holds" in split.violations[0]
    pins = rs.radix_oracle_check(
        chat, 90, cache_factory=partial(rs.DefectiveRadixCache, defect="evict_ignores_pins")
    )
    assert not pins.ok and "evicted pinned tokens" in pins.violations[0]


def test_split_defect_double_frees():
    cache = rs.DefectiveRadixCache(5, "split_keeps_slots")
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5])  # splits [1 2 3 4] at 2; the lower half keeps slots 0-3
    cache.evict(10)
    free = cache.free_slots()
    assert len(free) > len(set(free))  # slots 0 and 1 freed twice
    reference = RadixCache(5)
    reference.insert([1, 2, 3, 4])
    reference.insert([1, 2, 5])
    reference.evict(10)
    assert sorted(reference.free_slots()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="defect"):
        rs.DefectiveRadixCache(5, "typo")


# ---- block tools ----------------------------------------------------------------------------------


def test_hashes():
    weak = bh.truncated_hash(8)
    assert all(0 <= weak(None, (i,)) < 256 for i in range(100))
    assert weak(7, (1, 2)) == hash_block(7, (1, 2)) & 0xFF
    assert bh.unchained_hash(1, (5, 6)) == bh.unchained_hash(2, (5, 6)) == hash_block(None, (5, 6))
    with pytest.raises(ValueError, match="bits"):
        bh.truncated_hash(65)
    block = tuple(range(16))
    other = bh.find_colliding_block(weak, block, parent_hash=3, seed=1)
    assert other != block and weak(3, other) == weak(3, block)
    with pytest.raises(ValueError, match="no colliding block"):
        bh.find_colliding_block(hash_block, block, max_tries=2000)


@pytest.mark.parametrize(("n", "bits"), [(300, 16), (1000, 20), (50, 10)])
def test_birthday_bound_against_the_exact_product(n, bits):
    space = 2**bits
    exact = 1 - math.prod(1 - i / space for i in range(n))
    assert math.isclose(bh.birthday_collision_probability(n, bits), exact, rel_tol=0.02)
    assert bh.birthday_collision_probability(1, 8) == 0.0


def _doc_requests():
    # Same document block after two different system prompts (RAG): block 3 has equal tokens.
    sys_a, sys_c, doc = list(range(0, 48)), list(range(100, 148)), list(range(500, 516))
    return [sys_a + doc, sys_c + doc, sys_a + doc]


@pytest.mark.parametrize(
    ("hash_fn", "verify", "wrong"),
    [(hash_block, False, 0), (bh.unchained_hash, False, 1), (bh.unchained_hash, True, 0)],
)
def test_provenance_oracle_on_the_unchained_hash(hash_fn, verify, wrong):
    run = bh.run_block_cache(
        _doc_requests(), num_blocks=16, block_size=16, hash_fn=hash_fn, verify_on_hit=verify
    )
    assert run.wrong_kv_requests == wrong
    assert run.payload_mismatches == 0  # the tokens match; only the context they saw differs


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 1000),
    bits=st.integers(3, 10),
    order=st.sampled_from(["tail_first", "head_first"]),
)
def test_verified_cache_never_hands_wrong_kv(seed, bits, order):
    from lib.kvcache import shared_prefix_workload

    work = shared_prefix_workload([5, 3, 4], 60, 4, suffix_blocks=2, seed=seed)
    run = bh.run_block_cache(
        work.requests,
        num_blocks=30,
        block_size=4,
        hash_fn=bh.truncated_hash(bits),
        verify_on_hit=True,
        eviction_order=order,
        running=2,
    )
    assert run.wrong_kv_requests == 0 and run.payload_mismatches == 0


def test_unverified_weak_hash_hands_wrong_kv():
    from lib.kvcache import shared_prefix_workload

    work = shared_prefix_workload([5, 3, 4], 80, 4, suffix_blocks=2, seed=0)
    run = bh.run_block_cache(
        work.requests,
        num_blocks=30,
        block_size=4,
        hash_fn=bh.truncated_hash(6),
        verify_on_hit=False,
    )
    assert run.wrong_kv_requests > 0
    assert run.payload_mismatches <= run.wrong_kv_requests
    assert run.first_violation.startswith("request")


def test_provenance_oracle_validation():
    with pytest.raises(ValueError, match="PrefixBlockCache"):
        bh.KVProvenanceOracle(RadixCache(4))
    with pytest.raises(ValueError, match="verify_on_hit"):
        bh.run_block_cache([[1]], num_blocks=4, block_size=1, verify_on_hit="yes")
    oracle = bh.KVProvenanceOracle(PrefixBlockCache(8, 2))
    oracle.allocate("a", [1, 2, 3])
    assert oracle.payload_matches("a")
    oracle.free("a")




# ---- explorers ----------------------------------------------------------------------------------


