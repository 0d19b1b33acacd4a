"""lib.kvcache.paged_waste, block_sharing, allocator_grading: waste bound, sharing counts and the grader, each against a second method.

Second methods: the real BlockAllocator (blocks a sequence takes, blocks in use after a replay,
copy events), the chained-hash PrefixBlockCache (prefix hit granularity), brute-force enumeration
(uniform residues, powers of two) and Monte Carlo against an exact pmf.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import (
    BlockAllocator,
    DefectiveAllocator,
    NaiveCowAllocator,
    Op,
    PrefixBlockCache,
    content_oracle,
    first_violation,
    ownership_oracle,
)
from lib.kvcache import allocator_grading as ag
from lib.kvcache import block_sharing as bs
from lib.kvcache import paged_waste as pw
from lib.registry import models

# --------------------------------------------------------------------------- waste


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 200), st.integers(1, 32))
def test_blocks_and_waste_match_the_allocator(tokens, block_size):
    # Second method: the real allocator's block table for a sequence of that length.
    alloc = BlockAllocator(tokens // block_size + 2, block_size)
    table = alloc.allocate(0, [1] * tokens)
    assert pw.blocks_for_tokens(tokens, block_size) == len(table)
    waste = pw.paged_waste_tokens(tokens, block_size)
    assert waste == len(table) * block_size - tokens
    assert 0 <= waste <= pw.paged_waste_bound_tokens(block_size)


def test_waste_bound_is_reached_and_arrays_work():
    # vLLM paper (Kwon et al., SOSP 2023, Sec. 4.2): waste only in a sequence's last block.
    assert pw.paged_waste_tokens(17, 16) == 15 == pw.paged_waste_bound_tokens(16)
    assert pw.paged_waste_tokens(16, 16) == 0
    assert list(pw.paged_waste_tokens(np.array([1, 16, 33]), 16)) == [15, 0, 15]
    assert list(pw.blocks_for_tokens(np.array([0, 1, 16, 17]), 16)) == [0, 1, 1, 2]


@pytest.mark.parametrize("block_size", [1, 2, 16, 64])
def test_uniform_residue_is_exact_for_lengths_uniform_over_whole_blocks(block_size):
    # Brute force: lengths uniform on 1..4B have residues uniform on 0..B-1.
    lengths = np.arange(1, 4 * block_size + 1)
    probs = np.full(lengths.size, 1 / lengths.size)
    exact = pw.expected_waste_from_pmf(lengths, probs, block_size)
    assert math.isclose(exact, pw.uniform_residue_waste_tokens(block_size), abs_tol=1e-12)
    assert exact == pytest.approx(np.mean([(-x) % block_size for x in lengths]), abs=1e-12)


def test_contiguous_and_pow2_reservations():
    assert pw.contiguous_waste_tokens(900, 8192) == 7292
    with pytest.raises(ValueError, match="must not exceed"):
        pw.contiguous_waste_tokens(9000, 8192)
    lengths = np.arange(1, 3000)
    brute = [1 if x <= 1 else 1 << int(x - 1).bit_length() for x in lengths]
    assert list(pw.pow2_reserved_tokens(lengths)) == brute
    assert pw.pow2_reserved_tokens(1024) == 1024 and pw.pow2_reserved_tokens(1025) == 2048


def test_lognormal_pmf_matches_the_sampler():
    lengths, probs = pw.lognormal_length_pmf(600, 0.9, 8192)
    assert lengths[0] == 1 and lengths[-1] == 8192
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-12) and probs.min() >= 0
    sample = pw.sample_lognormal_lengths(40_000, 600, 0.9, 8192, seed=3)
    mean_exact = float(np.dot(lengths, probs))
    stderr = sample.std(ddof=1) / math.sqrt(sample.size)
    assert abs(sample.mean() - mean_exact) <= 5 * stderr
    # CDF at a few points: binomial standard error
    cdf = np.cumsum(probs)
    for x in (100, 600, 2000, 8191):
        p = cdf[x - 1]
        assert abs((sample <= x).mean() - p) <= 5 * math.sqrt(p * (1 - p) / sample.size) + 1e-9
    # median of LogNormal(ln 600, s) is 600: P(L <= 600) = 1/2 exactly
    assert math.isclose(cdf[599], 0.5, abs_tol=1e-12)


@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_expected_waste_from_pmf_matches_monte_carlo(block_size):
    lengths, probs = pw.lognormal_length_pmf(300, 1.2, 4096)
    exact = pw.expected_waste_from_pmf(lengths, probs, block_size)
    sample = pw.paged_waste_tokens(
        pw.sample_lognormal_lengths(30_000, 300, 1.2, 4096, 1), block_size
    )
    stderr = max(sample.std(ddof=1), 0.5) / math.sqrt(sample.size)
    assert abs(sample.mean() - exact) <= 5 * stderr
    with pytest.raises(ValueError, match="sum to 1"):
        pw.expected_waste_from_pmf(lengths, probs * 2, block_size)


def test_waste_summary_by_hand():
    s = pw.waste_summary(np.array([1, 16, 17, 100]), 16, 128)
    assert s.used == 134
    assert s.paged == 16 + 16 + 32 + 112
    assert s.contiguous_max == 4 * 128
    assert s.contiguous_pow2 == 1 + 16 + 32 + 128
    assert s.paged_max_waste == 15
    assert s.utilization("paged") == pytest.approx(134 / 176)
    assert s.mean_waste_tokens("paged") == pytest.approx((176 - 134) / 4)
    assert s.mean_waste_tokens("contiguous_max") == pytest.approx((512 - 134) / 4)
    with pytest.raises(ValueError, match="scheme must be"):
        s.utilization("buddy")
    with pytest.raises(ValueError, match="<= max_tokens"):
        pw.waste_summary([200], 16, 128)


def test_budget_and_tp():
    from lib.perf import memory

    # 8B in BF16 on one H100 SXM: the engine's KV pool, lib.perf.memory's one formula...
    budget = pw.kv_budget_bytes("llama-3.1-8b", "h100-sxm", 1)
    assert budget == memory.memory_budget("llama-3.1-8b", "h100-sxm", 1).kv_cache_bytes
    # ...under 0.9 x the 79.19 GiB the driver reports (vLLM startup logs) less 8.03e9 x 2 bytes of
    # weights (Llama 3.1 8B HF card) by what vLLM subtracts besides: activations, sampler, graphs.
    upper = 0.9 * 79.19 * 2**30 - 8.03e9 * 2
    assert 1e9 < upper - budget < 5e9, f"{(upper - budget) / 1e9:.2f} GB of overheads"
    # 70B: every GPU holds 1/tp of each token up to tp = 8 KV heads; past that the heads are
    # replicated, so 16 GPUs hold only 8 pools' worth of distinct tokens.
    for tp, holders in ((4, 4), (8, 8), (16, 8)):
        pool = memory.memory_budget("llama-3.1-70b", "h100-sxm", tp).kv_cache_bytes
        assert pw.kv_budget_bytes("llama-3.1-70b", "h100-sxm", tp) == pytest.approx(holders * pool, rel=1e-12)
    with pytest.raises(ValueError, match="no room for a KV cache"):
        pw.kv_budget_bytes("llama-3.1-70b", "h100-sxm", 1)
    assert pw.smallest_tp("llama-3.1-8b", "h100-sxm") == 1
    assert pw.smallest_tp("llama-3.1-70b", "h100-sxm") == 4  # 141 GB / 4 <= 40 GB
    with pytest.raises(ValueError, match="does not fit"):
        pw.smallest_tp("llama-3.1-405b", "l4", max_tp=8)


def test_block_geometry():
    # Llama 3.1 70B: head_dim 128, BF16 -> 16 x 128 x 2 = 4096 bytes per head per block.
    assert pw.block_run_bytes("llama-3.1-70b", "bf16", 16) == 4096
    # DeepSeek-V3 MLA: latent 512 + rope 64 per token.
    assert pw.block_run_bytes("deepseek-v3", "bf16", 64) == 64 * 576 * 2
    assert pw.block_table_entries(131072, 16) == 8192
    assert pw.block_table_entries(100, 16) == 7


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 100), st.integers(1, 16))
def test_prefix_hit_tokens_match_the_chained_hash_cache(prefix, block_size):
    # Second method: a block-granular prefix cache finds only the shared prefix's full blocks.
    cache = PrefixBlockCache(2 * (prefix // block_size + 2), block_size)
    cache.allocate("first", list(range(prefix)) + [10_000] * block_size)
    probe = list(range(prefix)) + [20_000] * block_size
    assert cache.match_prefix(probe) == pw.prefix_hit_tokens(prefix, block_size)


def test_block_size_tradeoff_rows():
    lengths = pw.sample_lognormal_lengths(5000, 600, 0.9, 8192, seed=0)
    pmf = pw.lognormal_length_pmf(600, 0.9, 8192)
    rows = pw.block_size_tradeoff("llama-3.1-8b", "bf16", [1, 16, 256], lengths, 8192, 1500, pmf)
    one, sixteen, big = rows
    assert one.waste_sim_tokens == 0 and one.utilization == 1.0 and one.table_entries == 8192
    assert sixteen.waste_bound_tokens == 15 and sixteen.waste_closed_tokens == 7.5
    assert sixteen.prefix_lost_tokens == 1500 % 16
    assert sixteen.block_bytes == 16 * 131072  # 8B: 32 layers x 8 KV heads x 128 x 2 x 2 bytes
    assert abs(sixteen.waste_exact_tokens - 7.5) < 0.1
    assert big.waste_mean_bytes > sixteen.waste_mean_bytes
    assert big.lookups_per_token < sixteen.lookups_per_token


# --------------------------------------------------------------------------- sharing


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 80), st.integers(0, 40), st.integers(1, 6), st.integers(1, 16))
def test_parallel_sampling_closed_form_matches_the_allocator(prompt, output, n, block_size):
    count = bs.parallel_sampling_blocks(prompt, output, n, block_size)
    replay = bs.replay_parallel_sampling(prompt, output, n, block_size)
    _, shared, unshared = bs.parallel_sampling_curve(prompt, output, n, block_size)
    assert replay.contents_ok
    assert list(shared) == list(replay.used_blocks)
    assert count.blocks_shared == replay.final_blocks
    assert count.copies == replay.copies
    # unshared: n independent allocators
    solo = bs.replay_parallel_sampling(prompt, output, 1, block_size)
    assert count.blocks_unshared == n * solo.final_blocks == unshared[-1]


def test_parallel_sampling_examples():
    # aligned prompt: no copy at all; misaligned by 8 tokens: n - 1 copies
    assert bs.parallel_sampling_blocks(1024, 200, 8, 16).copies == 0
    c = bs.parallel_sampling_blocks(1000, 200, 8, 16)
    assert (c.blocks_shared, c.blocks_unshared, c.copies) == (166, 600, 7)
    # a prompt shorter than a block shares nothing once the samples write
    assert bs.parallel_sampling_blocks(5, 3, 3, 16).saving == 0.0
    assert bs.time_averaged_saving([1, 2], [2, 4]) == pytest.approx(0.5)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 60), st.integers(0, 20), st.integers(0, 20), st.integers(1, 5), st.integers(1, 8)
)
def test_shared_prefix_closed_form_matches_the_allocator(prefix, own, output, n, block_size):
    count = bs.shared_prefix_blocks(prefix, own, output, n, block_size)
    replay = bs.replay_shared_prefix(prefix, own, output, n, block_size)
    assert replay.contents_ok
    assert (count.blocks_shared, count.copies) == (replay.final_blocks, replay.copies)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40), st.integers(1, 6), st.integers(1, 30), st.integers(1, 8), st.integers(0, 99)
)
def test_beam_search_closed_form_matches_the_allocator(prompt, width, steps, block_size, seed):
    parents = bs.beam_search_parents(width, steps, seed)
    counts = bs.beam_search_blocks(prompt, parents, block_size, at_steps=range(steps + 1))
    replay = bs.replay_beam_search(prompt, parents, block_size)
    assert replay.contents_ok
    assert [c.blocks_shared for c in counts] == list(replay.used_blocks)
    assert counts[-1].copies == replay.copies
    assert all(c.blocks_shared <= max(c.blocks_unshared, 1) for c in counts)


def test_beam_search_with_one_beam_is_one_sequence():
    parents = bs.beam_search_parents(1, 50, seed=0)
    [count] = bs.beam_search_blocks(30, parents, 16)
    assert count.blocks_shared == count.blocks_unshared == pw.blocks_for_tokens(80, 16)
    assert count.copies == 0
    with pytest.raises(ValueError, match="row 0"):
        bs.beam_search_blocks(30, np.ones((3, 2), dtype=int), 16)


def test_misaligned_prompt_cost_matches_copy_events():
    per_token = models.model("llama-3.1-70b").kv_bytes_per_token("bf16")
    cost = bs.misaligned_prompt_cost(1000, 8, 16, per_token)
    replay = bs.replay_parallel_sampling(1000, 1, 8, 16)
    assert cost["copies"] == replay.copies == 7
    assert cost["copy_bytes"] == 7 * 16 * per_token
    assert cost["duplicated_tokens"] == 7 * 8
    assert bs.misaligned_prompt_cost(1024, 8, 16, per_token)["copies"] == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: bs.parallel_sampling_blocks(0, 1, 1, 16),
        lambda: bs.parallel_sampling_blocks(10, -1, 1, 16),
        lambda: bs.shared_prefix_blocks(10, 0, 0, 0, 16),
        lambda: pw.blocks_for_tokens(10, 0),
        lambda: pw.blocks_for_tokens(1.5, 16),
        lambda: pw.paged_waste_tokens(True, 16),
        lambda: pw.sample_lognormal_lengths(10, 0.5, 1.0, 100),
        lambda: pw.lognormal_length_pmf(100, math.nan, 100),
        lambda: bs.beam_search_parents(0, 5),
        lambda: bs.time_averaged_saving([1], [1, 2]),
    ],
)
def test_inputs_are_validated(call):
    with pytest.raises(ValueError):
        call()


# --------------------------------------------------------------------------- grader


def test_grader_passes_the_reference_allocator_and_is_deterministic():
    report = ag.grade_allocator(lambda: BlockAllocator(8, 4), num_programs=80, seed=1)
    assert report.passed, report.table()
    assert all(report.checks[k] > 0 for k in ag.INVARIANTS)  # every invariant was exercised
    again = ag.grade_allocator(lambda: BlockAllocator(8, 4), num_programs=80, seed=1)
    assert (again.checks, again.ops_run) == (report.checks, report.ops_run)


@pytest.mark.parametrize(
    "factory, expected",
    [
        (lambda: NaiveCowAllocator(8, 4, "write_in_place"), {"copy_before_shared_write"}),
        (lambda: NaiveCowAllocator(8, 4, "forget_decref"), {"refcount_matches"}),
        (
            lambda: DefectiveAllocator(8, 4, leak_on_failed_allocation=True),
            {"free_or_owned", "conservation", "all_or_nothing"},
        ),
        (
            lambda: DefectiveAllocator(8, 4, alias_copied_payload=True),
            {"copy_before_shared_write", "reads_what_it_wrote"},
        ),
    ],
    ids=["write-in-place", "forget-decref", "leak", "alias"],
)
def test_grader_names_exactly_the_broken_invariants(factory, expected):
    report = ag.grade_allocator(factory, num_programs=150, seed=0)
    assert set(report.failing) == expected, report.table()
    for key in expected:
        program, message = report.first_failure[key]
        assert program and message


def test_grader_agrees_with_the_oracles_on_a_failing_program():
    # The first program the grader flags for the leak also fails lib.kvcache's ownership oracle
    # and passes its content oracle (independent checks of the same state).
    factory = lambda: DefectiveAllocator(8, 4, leak_on_failed_allocation=True)  # noqa: E731
    report = ag.grade_allocator(factory, num_programs=20, seed=0)
    program, _ = report.first_failure["conservation"]
    assert program[-1].kind == "allocate"
    alloc, shadow = factory(), {}
    for op in program:
        try:
            op.apply(alloc, shadow)
        except ValueError:  # a double-free attempt the grader made on purpose
            pass
    assert ownership_oracle(alloc, shadow) and not content_oracle(alloc, shadow)


def test_grader_validates():
    with pytest.raises(ValueError, match="factory must return"):
        ag.grade_allocator(lambda: object())
    with pytest.raises(ValueError, match="num_programs"):
        ag.grade_allocator(lambda: BlockAllocator(2, 2), num_programs=0)


@pytest.mark.parametrize(
    "flags, caught_by",
    [
        ({"leak_on_failed_allocation": True}, "ownership"),
        ({"alias_copied_payload": True}, "content"),
        ({}, None),
    ],
    ids=["leak", "alias", "fixed"],
)
def test_each_oracle_catches_exactly_one_defect(flags, caught_by):
    factory = lambda: DefectiveAllocator(4, 4, **flags)  # noqa: E731
    counts = {
        name: ag.oracle_failures(factory, oracle, num_programs=150, seed=2)
        for name, oracle in (("ownership", ownership_oracle), ("content", content_oracle))
    }
    for name, (failing, first) in counts.items():
        if name == caught_by:
            assert failing > 0 and first
            # second method: lib.kvcache.first_violation replays the program to the same verdict
            oracle = ownership_oracle if name == "ownership" else content_oracle
            assert first_violation(factory(), first, oracle)[0] == len(first) - 1
        else:
            assert (failing, first) == (0, None)


def test_admission_trace_keeps_the_pool_whole_only_without_the_leak():
    lengths = pw.sample_lognormal_lengths(300, 200, 0.8, 1024, seed=0)
    usable, rejected = ag.admission_trace(lambda: BlockAllocator(64, 16), lengths)
    assert (usable == 64).all() and rejected == 0  # every request fits an empty 1024-token pool
    leaky, _ = ag.admission_trace(
        lambda: DefectiveAllocator(64, 16, leak_on_failed_allocation=True), lengths
    )
    assert (np.diff(leaky) <= 0).all() and leaky[-1] < 64  # leaked blocks never come back
    with pytest.raises(ValueError, match="factory must return"):
        ag.admission_trace(lambda: None, [1])


def test_parse_op_round_trips_printed_ops():
    ops = [
        Op("allocate", 0, (0, 1, 2)),
        Op("allocate", 3, ()),
        Op("fork", 0, 1),
        Op("append", 1, 3),
        Op("free", 0),
    ]
    assert [ag.parse_op(str(op)) for op in ops] == ops
    with pytest.raises(ValueError, match="op must look like"):
        ag.parse_op("resize(seq=0)")


def test_random_program_is_seeded_and_valid():
    import random

    def draw(seed):
        rng = random.Random(seed)
        return [ag.random_program(rng, [0, 1], [2], 3, max_prompt_tokens=8) for _ in range(50)]

    assert draw(5) == draw(5) and draw(5) != draw(6)
    ops = draw(5)
    assert {op.kind for op in ops} == {"allocate", "fork", "append", "free"}
    assert all(len(op.arg) <= 8 for op in ops if op.kind == "allocate")
    assert all(op.seq in (0, 1) for op in ops if op.kind in ("fork", "append"))
    rng = random.Random(0)
    assert ag.random_program(rng, [], [], 7, max_prompt_tokens=4).kind == "allocate"
