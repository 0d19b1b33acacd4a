"""lib.perf.memory: the serving memory budget, its components, KV placement and long-context helpers.

Expected values come from a published figure (source beside it) or an independent second
method (hand arithmetic from the config, brute-force allocation, summing chunks), each with an
explicit tolerance.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import BlockAllocator, OutOfBlocks
from lib.kvcache import long_context as lc
from lib.perf import memory as mem
from lib.perf import prefill
from lib.registry import models
from lib.units import GiB, MiB

L70 = "llama-3.1-70b"


# ---- facts ------------------------------------------------------------------------------------


def test_engine_defaults_match_vllm_source():
    # vllm/config/cache.py @ c1d86421: gpu_memory_utilization default 0.9;
    # vllm/platforms/cuda.py: block_size 16; engine/arg_utils.py get_batch_defaults: 8192 / 1024.
    assert mem.fact("gpu_memory_utilization") == 0.9
    assert mem.fact("gpu_memory_utilization_recent") == 0.92
    assert mem.fact("block_size") == 16
    assert mem.fact("max_num_batched_tokens") == 8192
    assert mem.fact("max_num_seqs") == 1024
    # the same get_batch_defaults: below 70 GiB (or on A100) 2048 tokens / 256 sequences
    assert mem.fact("max_num_batched_tokens_small_gpu") == 2048
    assert mem.fact("max_num_seqs_small_gpu") == 256
    assert mem.fact("large_gpu_memory_gib") == 70
    assert mem.memory_budget("llama-3.1-8b", "a100-sxm").max_num_batched_tokens == 2048
    # NCCL docs: NCCL_BUFFSIZE default 4194304; init.cc: LL128 = 120*640*8*8, LL = 8*512*8*16.
    assert mem.fact("nccl_buffsize_bytes") == 4 * MiB
    assert mem.fact("nccl_ll128_buffsize_bytes") == 120 * 640 * 8 * 8
    assert mem.fact("nccl_ll_buffsize_bytes") == 8 * 512 * 8 * 16


def test_fact_errors_and_sources():
    with pytest.raises(ValueError, match="unknown serving-memory fact"):
        mem.fact("no_such_fact")
    assert mem.fact_source("fragmentation_fraction").startswith("assumption:")
    assert "10702" in mem.fact_source("non_torch_tp8_gib")
    assert mem.fact_range("non_torch_tp8_gib") == (5.21, 5.68)
    assert mem.fact_range("block_size") == (16, 16)


# ---- components -------------------------------------------------------------------------------


def test_visible_memory():
    # vLLM logs: H100 80GB reports 79.19 GiB, H200 139.72 GiB; others fall back to the datasheet.
    assert mem.visible_memory_bytes("h100-sxm") == pytest.approx(79.19 * GiB, rel=1e-12)
    assert mem.visible_memory_bytes("h200") == pytest.approx(139.72 * GiB, rel=1e-12)
    assert mem.visible_memory_bytes("a100-sxm") == 80e9
    assert "datasheet" in mem.visible_memory_source("a100-sxm")
    assert "vLLM logs" in mem.visible_memory_source("h100-sxm")


@pytest.mark.parametrize("key", [k for k in models.model_names() if not models.model(k).is_mla])
def test_kv_formula_matches_model_and_published(key):
    # Second method: the four-number formula against Model.kv_bytes_per_token and the value
    # recorded in data/models.yaml from the config (kv_bytes_per_token_bf16).
    m = models.model(key)
    f = mem.kv_bytes_per_token_formula(m.num_layers, m.num_kv_heads, m.head_dim, 2)
    assert f == m.kv_bytes_per_token("bf16")
    assert f == m.published["kv_bytes_per_token_bf16"]


def test_query_heads_mistake_is_the_group_size():
    m = models.model(L70)
    wrong = mem.kv_bytes_per_token_formula(m.num_layers, m.num_attention_heads, m.head_dim, 2)
    assert wrong / m.kv_bytes_per_token() == 8.0  # 64 query heads / 8 KV heads


def test_kv_per_sequence_128k_is_40_gib():
    # 320 KiB per token x 128 Ki tokens = 40 GiB = 42.95 GB exactly.
    assert mem.kv_bytes_per_sequence(L70, 131072) == 40 * GiB
    assert mem.kv_bytes_per_sequence(L70, 131072, "fp8") == 20 * GiB


def test_weight_bytes_per_gpu():
    m = models.model(L70)
    assert mem.weight_bytes_per_gpu(L70, 8) == pytest.approx(m.weight_bytes() / 8, rel=1e-12)
    assert mem.weight_bytes_per_gpu(L70, 8, pp=2) == pytest.approx(m.weight_bytes() / 16, rel=1e-12)
    # DP attention replicates the attention weights: A b + (W - A) b / tp.
    attn = m.attention_params_per_layer() * m.num_layers * 2
    want = attn + (m.weight_bytes() - attn) / 8
    assert mem.weight_bytes_per_gpu(L70, 8, dp_attention=True) == pytest.approx(want, rel=1e-12)
    assert mem.weight_bytes_per_gpu(L70, 8, dp_attention=True) > mem.weight_bytes_per_gpu(L70, 8)


def test_activation_peak_hand_computed():
    # Llama 3.1 70B, TP8, 8192 tokens, BF16: the FFN is the widest point:
    # 2 B x 8192 x (2 x 8192 + 3 x 28672 / 8) = 444,596,224 bytes.
    assert mem.activation_peak_bytes(L70, 8192, 8) == 2 * 8192 * (2 * 8192 + 3 * 28672 / 8)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 100_000), tp=st.sampled_from([1, 2, 4, 8]))
def test_activation_linear_in_tokens_and_falls_with_tp(tokens, tp):
    a1 = mem.activation_peak_bytes(L70, tokens, tp)
    assert mem.activation_peak_bytes(L70, 2 * tokens, tp) == pytest.approx(2 * a1, rel=1e-12)
    if tp > 1:
        assert a1 < mem.activation_peak_bytes(L70, tokens, tp // 2)


def test_logits_and_sampler():
    assert mem.logits_bytes(L70, 1024) == 1024 * 128256 * 4
    assert mem.sampler_bytes(L70, 1024) == 1024 * 128256 * 8
    assert mem.sampler_bytes(L70, 1024, 20) == 1024 * 128256 * 20
    with pytest.raises(ValueError, match="bytes_per_entry"):
        mem.sampler_bytes(L70, 1, 0)


def test_cuda_graph_bytes():
    pool = mem.activation_peak_bytes(L70, 512, 8)
    assert mem.cuda_graph_bytes(L70, 8) == pool + 51 * 20 * MiB
    assert mem.cuda_graph_bytes(L70, 8, capture_sizes=1, bytes_per_capture=0) == pool


def test_nccl_buffers():
    per = 4194304 + 4915200 + 524288
    assert mem.nccl_buffer_bytes("h100-sxm", 1) == 0
    assert mem.nccl_buffer_bytes("h100-sxm", 2) == 16 * 2 * per  # NVLS only above 2 ranks
    assert mem.nccl_buffer_bytes("h100-sxm", 8) == 16 * 2 * per + 301989888  # issue #9699 log line
    assert mem.nccl_buffer_bytes("a100-sxm", 8) == 16 * 2 * per  # no NVLink SHARP on A100
    assert mem.nccl_buffer_bytes("a100-sxm", 8, nvls=True) > mem.nccl_buffer_bytes("a100-sxm", 8)


def test_non_torch_interpolation():
    assert mem.non_torch_bytes(1) == pytest.approx(0.16 * GiB, rel=1e-12)
    assert mem.non_torch_bytes(8) == pytest.approx(5.45 * GiB, rel=1e-12)
    assert mem.non_torch_bytes(16) == mem.non_torch_bytes(8)
    vals = [mem.non_torch_bytes(t) for t in range(1, 9)]
    assert vals == sorted(vals)


def test_fragmentation():
    assert mem.fragmentation_bytes(1e9) == pytest.approx(0.15e9, rel=1e-12)
    assert mem.fragmentation_bytes(1e9, 0.0) == 0
    with pytest.raises(ValueError, match="fragmentation_fraction"):
        mem.fragmentation_bytes(1e9, 1.5)


# ---- placement ----------------------------------------------------------------------------------


def test_placement_gqa_past_kv_heads():
    p8, p16 = mem.kv_placement(L70, 8), mem.kv_placement(L70, 16)
    assert p8.copies == 1 and p8.wasted_fraction == 0
    assert p16.copies == 2 and p16.wasted_fraction == 0.5
    # Doubling TP past the KV heads leaves the KV bytes per GPU exactly where they were.
    assert p16.bytes_per_token_per_gpu == p8.bytes_per_token_per_gpu == 327680 / 8
    p16d = mem.kv_placement(L70, 16, dcp=2)
    assert p16d.copies == 1 and p16d.bytes_per_token_per_gpu == 327680 / 16
    with pytest.raises(ValueError, match="dcp=3 must divide"):
        mem.kv_placement(L70, 16, dcp=3)


def test_placement_mla_replicated_on_every_rank():
    p = mem.kv_placement("deepseek-v3", 8)
    assert p.bytes_per_token_per_gpu == 70272  # models.yaml kv_bytes_per_token_bf16
    assert p.copies == 8
    assert mem.max_dcp("deepseek-v3", 8) == 8
    assert mem.kv_placement("deepseek-v3", 8, dcp=8).copies == 1
    dp = mem.kv_placement("deepseek-v3", 8, dp_attention=True)
    assert dp.copies == 1 and dp.gpus_per_token == 1
    with pytest.raises(ValueError, match="dcp must be 1"):
        mem.kv_placement("deepseek-v3", 8, dcp=2, dp_attention=True)


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(
        ["llama-3.1-70b", "llama-3.1-8b", "deepseek-v3", "llama-2-7b", "qwen2.5-72b"]
    ),
    tp=st.sampled_from([1, 2, 4, 8, 16, 32]),
    pp=st.sampled_from([1, 2, 4]),
)
def test_placement_conserves_bytes(key, tp, pp):
    # Invariant: bytes on the GPUs holding a token = copies x one copy (pipeline stages evenly split).
    m = models.model(key)
    if m.num_attention_heads % tp or m.num_layers % pp:
        return
    for dcp in [d for d in range(1, mem.max_dcp(m, tp) + 1) if mem.max_dcp(m, tp) % d == 0]:
        p = mem.kv_placement(m, tp, pp=pp, dcp=dcp)
        assert p.bytes_per_token_per_gpu * p.gpus_per_token == pytest.approx(
            p.bytes_per_token * p.copies
        )
        assert p.copies >= 1


# ---- budget -----------------------------------------------------------------------------------


def test_budget_reproduces_vllm_issue_10702():
    # vllm-project/vllm issue #10702: 8x H200, Llama 70B TP8, utilization 0.95,
    # peak_torch 16.53 GiB (weights + activations), non_torch 5.68 GiB -> kv_cache_size 110.52 GiB.
    b = mem.memory_budget(
        L70,
        "h200",
        8,
        gpu_memory_utilization=0.95,
        cuda_graphs=False,
        activation_bytes_override=0.10 * GiB,
        sampler_bytes_per_entry=1e-12,
        attention_workspace_bytes=0,
        non_torch_bytes_override=5.68 * GiB,
    )
    assert b.kv_cache_bytes / GiB == pytest.approx(110.52, abs=0.02)


def test_budget_arithmetic_and_views():
    b = mem.memory_budget(L70, "h100-sxm", 8)
    assert b.kv_cache_bytes == pytest.approx(b.requested_bytes - b.subtracted_bytes)
    assert b.requested_bytes == pytest.approx(0.9 * 79.19 * GiB)
    assert b.engine_view["cuda_context"] == mem.HEADROOM
    assert b.engine_view["cuda_graphs"] == mem.ESTIMATED
    assert b.peak_bytes == pytest.approx(sum(b.components.values()) + b.kv_cache_bytes)
    assert b.num_blocks == int(b.kv_cache_bytes // (16 * 327680 / 8))
    old = mem.memory_budget(L70, "h100-sxm", 8, engine_counts_cuda_graphs=False)
    assert old.kv_cache_bytes == pytest.approx(b.kv_cache_bytes + b.components["cuda_graphs"])
    assert old.headroom_margin_bytes == pytest.approx(
        b.headroom_margin_bytes - b.components["cuda_graphs"]
    )
    naive = mem.naive_kv_bytes(L70, "h100-sxm", 8)
    assert naive > b.kv_cache_bytes
    assert mem.memory_budget("deepseek-v3", "h200", 8, "fp8").block_size == 64


def test_naive_kv_bytes_by_hand():
    # The naive one-line answer, shown by kv-capacity-memory-budget: 70B TP8 on H100 SXM (80 GB
    # datasheet) - 141.1 GB / 8 of weights (70,553,706,496 params x 2 B, HF config).
    free = 80e9 - 70_553_706_496 * 2 / 8
    assert mem.naive_kv_bytes(L70, "h100-sxm", 8) == pytest.approx(free, rel=1e-12)
    assert mem.naive_kv_bytes(L70, "h100-sxm", 1) < 0  # the weights alone exceed one card
    with pytest.raises(ValueError, match="tp"):
        mem.naive_kv_bytes(L70, "h100-sxm", 3)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["llama-3.1-8b", L70, "qwen2.5-72b", "deepseek-v3", "mixtral-8x7b"]),
    st.sampled_from(["h100-sxm", "h200", "b200", "mi300x"]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 200_000),
)
def test_capacity_is_one_function(key, chip, tp, context):
    # Deployment.budget, lib.perf.throughput's batch ceiling and memory_budget are one computation;
    # whole sequences sit within one of the fractional concurrency (issue 9: one capacity function).
    from lib.perf import throughput as tput
    from lib.perf.deployment import Deployment

    try:
        dep = Deployment(key, chip, tp=tp)
    except ValueError:
        return
    b = mem.memory_budget(key, chip, tp)
    assert dep.budget.num_blocks == b.num_blocks
    assert tput.kv_batch_ceiling(dep, context) == pytest.approx(b.max_concurrency(context), rel=1e-12)
    seqs = b.max_sequences(context)
    assert seqs <= b.max_concurrency(context)
    if seqs < b.max_num_seqs:
        assert seqs + 1 > b.num_blocks / b.blocks_per_sequence(context)


def test_budget_pool_by_hand_and_against_the_naive_answer():
    # The KV pool = utilization x driver-visible memory - what the engine subtracts (second method:
    # the components summed here); the naive datasheet answer overstates it.
    b = mem.memory_budget(L70, "h100-sxm", 8)
    subtracted = sum(v for k, v in b.components.items() if b.engine_view[k] != mem.HEADROOM)
    assert b.kv_cache_bytes == pytest.approx(0.9 * mem.visible_memory_bytes("h100-sxm") - subtracted, rel=1e-12)
    assert mem.naive_kv_bytes(L70, "h100-sxm", 8) > b.kv_cache_bytes
    # issue 9: 76,561 blocks of 16 tokens on the replica, not the 82,949 of datasheet x 0.9 - weights
    assert b.num_blocks == 76_561


def test_max_sequences_against_brute_force_allocation():
    # Second method: fill lib.kvcache.BlockAllocator with sequences until it runs out.
    b = mem.memory_budget("llama-3.1-8b", "l4", 1, max_num_seqs=10_000)
    context = 3000
    alloc = BlockAllocator(b.num_blocks, b.block_size)
    n = 0
    while True:
        try:
            alloc.allocate(n, [0] * context)
        except OutOfBlocks:
            break
        n += 1
    assert n == b.max_sequences(context) > 0
    assert b.max_concurrency(context) == pytest.approx(b.token_capacity / context)


def test_max_sequences_capped_by_max_num_seqs():
    b = mem.memory_budget(L70, "h100-sxm", 8)
    assert b.max_sequences(16) == 1024


def test_budget_errors():
    with pytest.raises(ValueError, match="no room for a KV cache"):
        mem.memory_budget("llama-3.1-405b", "h100-sxm", 8)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        mem.memory_budget(L70, "h100-sxm", 8, gpu_memory_utilization=1.2)
    with pytest.raises(ValueError, match="tp=3"):
        mem.memory_budget(L70, "h100-sxm", 3)


def test_deployment_layouts():
    one = mem.fleet(L70, "h100-sxm", 8, 8)
    two = mem.fleet(L70, "h100-sxm", 16, 8)
    tp16 = mem.fleet(L70, "h100-sxm", 16, 16)
    assert two.replicas == 2 and two.tokens_total == 2 * one.tokens_total
    assert tp16.wasted_bytes_per_gpu == pytest.approx(tp16.budget.kv_cache_bytes / 2)
    assert tp16.tokens_total < two.tokens_total  # the duplicated copy costs capacity
    dpa = mem.fleet("deepseek-v3", "h200", 8, 8, dp_attention=True, weight_dtype="fp8")
    assert dpa.tokens_per_replica == 8 * dpa.tokens_per_gpu
    with pytest.raises(ValueError, match="must divide n_gpus"):
        mem.fleet(L70, "h100-sxm", 12, 8)


def test_gpu_hour_cost():
    assert mem.gpu_hour_cost(4) == 10.0
    assert mem.gpu_hour_cost(2, 3.0) == 6.0


# ---- long context -----------------------------------------------------------------------------


@pytest.mark.parametrize("prompt,chunk", [(131072, 8192), (10000, 3000), (4096, 4096)])
def test_chunk_steps_sum_to_the_prefill(prompt, chunk):
    # Second method: the chunks of one prompt add up to lib.perf.prefill's whole-prompt compute time.
    total, pos = 0.0, 0
    while pos < prompt:
        c = min(chunk, prompt - pos)
        total += lc.prefill_chunk_compute_s(L70, "h100-sxm", c, pos, 8, 0.6)
        pos += c
    est = prefill.prefill_estimate(L70, "h100-sxm", prompt, 8, 0.6)
    assert total == pytest.approx(est.compute_s, rel=1e-9)


def test_chunk_step_is_the_prefill_time_of_one_chunk():
    # A first chunk (position 0, no other work) is prefill_time of that many tokens, all-reduce included.
    from lib.perf.deployment import Deployment

    dep = Deployment(L70, "h100-sxm", tp=8)
    for c in (64, 2048, 8192):
        assert lc.prefill_chunk_step_s(dep, c, 0) == pytest.approx(prefill.prefill_time(dep, c).time_s, rel=1e-9)
    # later chunks cost more (attention over the cached positions), by the compute difference
    late = lc.prefill_chunk_step_s(dep, 8192, 100_000)
    assert late > lc.prefill_chunk_step_s(dep, 8192, 0)


def test_chunk_cost_doubles_at_the_attention_crossover():
    m = models.model(L70)
    p = m.attention_breakeven_context()
    t0 = lc.prefill_chunk_compute_s(L70, "h100-sxm", 1, 0, 8)
    tp = lc.prefill_chunk_compute_s(L70, "h100-sxm", 1, p, 8)
    assert tp / t0 == pytest.approx(2.0, rel=1e-4)


def test_break_contexts():
    b = mem.memory_budget(L70, "h100-sxm", 8)
    cap = lc.capacity_break_context(b, 64)
    assert b.max_sequences(cap) >= 64 > b.max_sequences(cap + b.block_size)
    s = lc.scheduler_break_context(b)
    assert lc.admission_share(b, s) <= 0.1 < lc.admission_share(b, s + b.block_size)
    with pytest.raises(ValueError, match="do not fit"):
        lc.capacity_break_context(b, 10**9)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_validation_messages(bad):
    with pytest.raises(ValueError):
        mem.kv_bytes_per_sequence(L70, bad)
    with pytest.raises(ValueError):
        mem.activation_peak_bytes(L70, bad)


def test_budget_positive_everywhere():
    for key in ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b"):
        for chip in ("h100-sxm", "h200", "b200"):
            b = mem.memory_budget(key, chip, 8)
            assert b.kv_cache_bytes > 0 and b.num_blocks > 0
            assert all(v >= 0 and math.isfinite(v) for v in b.components.values())


def test_capped_long_prefill():
    # Cap = budget: the sum of the plain chunk steps (second method: lib.perf.prefill.prefill_time of
    # each chunk's compute plus its all-reduce); compute alone is lib.perf.prefill's whole-prompt compute.
    from lib.perf.deployment import Deployment

    dep = Deployment(L70, "h100-sxm", tp=8)
    est = prefill.prefill_estimate(L70, "h100-sxm", 131072, 8, 0.6)
    full = lc.capped_long_prefill_s(dep, 131072, 8192, 8192, 0.6)
    chunks = sum(lc.prefill_chunk_step_s(dep, 8192, p, 0, 0.6) for p in range(0, 131072, 8192))
    assert full == pytest.approx(chunks, rel=1e-12)
    assert full > est.compute_s  # the TP all-reduces come on top of the compute
    capped = lc.capped_long_prefill_s(dep, 131072, 2048, 8192, 0.6)
    assert capped > 2 * full  # every step also carries 6,144 tokens of other requests
    with pytest.raises(ValueError, match="cannot exceed"):
        lc.capped_long_prefill_s(dep, 1000, 4096, 2048)


def test_ttft_break_context_is_where_prefill_time_crosses_the_slo():
    # Brute force at the boundary on lib.perf.prefill.prefill_time; the compute-only closed form
    # (quadratic in P) bounds it from above because the TP all-reduces add time (issue 9: TTFT is
    # not 1/TP).
    from lib.perf.deployment import Deployment

    dep = Deployment(L70, "h100-sxm", tp=8)
    p = lc.ttft_break_context(dep, 2.0)
    assert prefill.prefill_time(dep, p).time_s <= 2.0 < prefill.prefill_time(dep, p + 1).time_s
    bound = prefill.prompt_len_for_time(L70, "h100-sxm", 2.0, 8, prefill.default_mfu())
    assert p < bound
    assert lc.ttft_break_context(dep, 1e-9) == 0
