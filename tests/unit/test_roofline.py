"""lib.perf.roofline, lib.perf.collectives and lib.perf.moe: closed forms against published values and second methods."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import collectives as comms
from lib.perf import moe, roofline
from lib.registry.hardware import gpu, gpu_names
from lib.registry.models import model


def test_decode_floor_70b_tp8_matches_published_params():
    # (70.6B parameters (HF card) - 128,256 x 8,192 embedding rows not read) x 2 B
    # / (8 x 3.35 TB/s, NVIDIA H100 SXM) = 5.19 ms
    t = roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=8).memory_s
    assert math.isclose(t, (70.6e9 - 128_256 * 8_192) * 2 / (8 * 3.35e12), rel_tol=0.005)


def test_weight_bytes_read_by_hand_llama_3_1_8b():
    # Llama 3.1 8B config (d 4096, 32 layers, 32 heads, 8 KV heads, head 128, FFN 14336,
    # vocab 128256, untied head), counted here without lib.registry.models:
    d, L, ffn, V = 4096, 32, 14336, 128_256
    attn = d * 4096 + 2 * d * 1024 + 4096 * d  # q, k, v, o
    mlp = 3 * d * ffn  # gate, up, down
    layers = L * (attn + mlp + 2 * d)  # + two RMSNorm weights
    total = V * d + layers + d + V * d  # embedding + layers + final norm + LM head
    assert total == 8_030_261_248  # the published count (HF config), so the pieces are right
    # a batch-8 step streams all of it but the embedding table, of which it reads 8 rows
    expected = (total - V * d + 8 * d) * 2  # the table is 6.5% of 2 x params
    assert expected == 15_009_914_880
    assert roofline.weight_bytes_read_per_step("llama-3.1-8b", 8) == expected
    # a pass of more tokens than the vocabulary reads each row at most once
    assert roofline.weight_bytes_read_per_step("llama-3.1-8b", 10**6) == total * 2


def test_tied_embedding_is_read_once_for_the_head():
    # GPT-3 175B: tied head (12,288 x 50,257), learned positions (2,048 x 12,288). The shared
    # matrix is streamed whole by the head; the position table is read one row per token.
    m = model("gpt3-175b")
    d, V, P = 12_288, 50_257, 2_048
    assert m.params_lm_head == 0 and m.params_embedding == (V + P) * d
    one = roofline.weight_bytes_read_per_step(m, 1)
    assert one == (m.params_total - P * d + 2 * d) * 2  # all but the positions, + 2 rows
    assert roofline.weight_bytes_streamed(m) == (m.params_total - P * d) * 2
    assert roofline.lookup_rows_read(m, 10) == 20  # 10 token rows + 10 position rows
    assert roofline.lookup_rows_read(m, 10**5) == V + P  # no table is read past its size


def test_decode_is_memory_bound_and_prefill_compute_bound():
    assert roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=8).bound == "memory"
    assert roofline.prefill("llama-3.1-70b", "h100-sxm", 4096, tp=8).bound == "compute"


def test_prefill_sizes_the_kv_write_with_the_cache_dtype():
    # Llama 3.1 70B, TP8, 4,096-token prompt: the cache holds 327,680 B/token in BF16 (2 x 80 layers
    # x 8 KV heads x 128 x 2 B), 163,840 in FP8, and each of the 8 ranks writes its 1/8.
    def nbytes(weight_dtype, kv_dtype):
        return roofline.prefill("llama-3.1-70b", "h100-sxm", 4096, tp=8, weight_dtype=weight_dtype,
                                compute_dtype="fp8", kv_dtype=kv_dtype).bytes

    assert nbytes("fp8", "bf16") - nbytes("fp8", "fp8") == pytest.approx(4096 * (327_680 - 163_840) / 8, rel=1e-12)
    # the weights no longer decide the cache's size: FP8 weights with a BF16 cache write BF16 KV
    weights_fp8 = roofline.weight_bytes_read_per_step("llama-3.1-70b", 4096, "fp8") / 8
    assert nbytes("fp8", "bf16") == pytest.approx(weights_fp8 + 4096 * 327_680 / 8, rel=1e-12)
    assert nbytes("bf16", "fp8") - nbytes("fp8", "fp8") == pytest.approx(weights_fp8, rel=1e-12)


def test_roofline_time_is_the_max_of_two_terms():
    t = roofline.roofline_time(989e12, 3.35e12, "h100-sxm", "bf16")
    assert math.isclose(t.compute_s, 1.0) and math.isclose(t.memory_s, 1.0)
    assert t.time_s == max(t.compute_s, t.memory_s)


@given(st.sampled_from(gpu_names()), st.floats(0.01, 1e5))
def test_attainable_never_exceeds_either_roof(key, intensity):
    g = gpu(key)
    perf = roofline.attainable_flops(intensity, g, "bf16")
    assert perf <= g.peak_flops("bf16") * (1 + 1e-12)
    assert perf <= intensity * g.memory_bandwidth * (1 + 1e-12)


@given(st.integers(1, 4096), st.integers(1, 8192), st.integers(1, 8192))
def test_gemm_bytes_by_brute_force(m, n, k):
    flops, nbytes = roofline.gemm_flops_bytes(m, n, k, "bf16")
    assert flops == 2 * m * n * k
    assert nbytes == 2 * (m * k + k * n + m * n)


def test_gemm_crossover_m_against_bisection():
    n, k = 28672, 8192
    m_star = roofline.gemm_crossover_m(n, k, "h100-sxm", "bf16")
    lo, hi = 1.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        f, b = 2 * mid * n * k, 2 * (mid * k + k * n + mid * n)
        lo, hi = (mid, hi) if f / 989e12 < b / 3.35e12 else (lo, mid)
    assert math.isclose(m_star, lo, rel_tol=1e-6)


def test_gemm_crossover_unreachable_raises():
    with pytest.raises(ValueError, match="never reaches"):
        roofline.gemm_crossover_m(16, 16, "h100-sxm")


def test_prefill_crossover_is_about_the_ridge_for_bf16():
    t = roofline.prefill_crossover_tokens("llama-3.1-70b", "h100-sxm")
    assert math.isclose(t, 295, rel_tol=0.03)  # scaling-book ridge 295 x N_total / N_matmul


def test_kv_shard_fraction_replicates_past_kv_heads():
    assert roofline.kv_shard_fraction("llama-3.1-70b", 8) == 1 / 8
    assert roofline.kv_shard_fraction("llama-3.1-70b", 16) == 1 / 8  # 8 KV heads replicated twice
    assert roofline.kv_shard_fraction("deepseek-v3", 8) == 1.0  # MLA latent on every rank


def test_tp_must_divide_heads():
    with pytest.raises(ValueError, match="must divide the 64 attention heads"):
        roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=3)


def test_decode_floor_explorer_weight_bucket_is_the_floor_and_allreduce_from_collectives():
    # lib.explorers.roofline.decode_floor is a view of lib.perf.step.decode_step (the one step model):
    # its weight bucket is the roofline weight floor and its all-reduce buckets are 160 calls priced
    # by lib.perf.collectives (no second collective formula).
    from lib.explorers.roofline import decode_floor

    v = decode_floor("llama-3.1-70b", "h100-sxm", 8, "bf16", "bf16", 1, 1, 1.0, True, "ring")
    floor = roofline.decode_step("llama-3.1-70b", "h100-sxm", 8).memory_s
    assert v.values["weights"] == pytest.approx(floor, rel=0.02)
    one = comms.collective("all_reduce", 8192 * 2, 8, "h100-sxm")
    # 160 all-reduces of one token's activations (plus the step's small logits collective)
    assert 160 * one.latency_s <= v.values["allreduce_latency"] <= 161 * one.latency_s
    assert v.values["allreduce_bandwidth"] >= 160 * one.bandwidth_s
    assert v.values["total"] == pytest.approx(sum(v.values[k] for k in v.values if k not in ("floor", "total")))


def test_decode_floor_explorer_prices_pcie_boards_instead_of_refusing():
    # L4 has no scale-up link: the all-reduce now goes over PCIe (lib.perf.collectives), not a ValueError.
    from lib.explorers.roofline import decode_floor

    v = decode_floor("llama-3.1-8b", "l4", 2, "bf16", "bf16", 1, 1024, 0.85, True, "ring")
    assert v.values["allreduce_latency"] > 0
    assert comms.collective("all_reduce", 4096 * 2, 2, "l4").fabric == "PCIe"


@pytest.mark.parametrize(("e", "k", "b"), [(8, 2, 1), (8, 2, 4), (8, 2, 16), (256, 8, 32), (64, 6, 8)])
def test_expected_experts_closed_form_matches_monte_carlo(e, k, b):
    sim = moe.simulate_experts_touched(e, k, b, trials=4000, seed=1)
    closed = moe.expected_experts_touched(e, k, b)
    stderr = sim.std(ddof=1) / math.sqrt(len(sim)) + 1e-9
    assert abs(sim.mean() - closed) < 5 * stderr + 1e-9


def test_expected_experts_edges():
    assert moe.expected_experts_touched(8, 2, 1) == 2
    assert moe.expected_experts_touched(8, 2, 0) == 0
    assert moe.expected_experts_touched(8, 8, 3) == 8
    with pytest.raises(ValueError, match="experts_per_token"):
        moe.expected_experts_touched(8, 9, 1)


def test_moe_weight_read_grows_with_batch_to_the_total():
    m = model("mixtral-8x7b")
    table = m.vocab_size * m.hidden_size  # looked up one row per token, never streamed
    one = roofline.weight_bytes_read_per_step(m, 1)
    assert math.isclose(one, (m.params_active - table + m.hidden_size) * 2, rel_tol=1e-9)
    big = roofline.weight_bytes_read_per_step(m, 10_000)
    assert math.isclose(big, (m.params_total - table + 10_000 * m.hidden_size) * 2, rel_tol=1e-6)


DENSE_KEYS = ["llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "qwen2.5-72b", "gpt3-175b"]


@given(st.sampled_from(DENSE_KEYS + ["mixtral-8x7b", "deepseek-v3"]), st.integers(1, 60),
       st.integers(1, 20), st.integers(1, 100_000))
def test_weight_bytes_grow_by_one_layer_per_layer(key, layers, extra, batch):
    # Each added layer adds its parameters once, whatever the batch (dense layers; MoE layers add
    # their shared part plus the experts the batch touches: the same amount per MoE layer).
    from dataclasses import replace

    m = model(key)
    layers = max(layers, m.first_dense_layers + 1)
    small, big = replace(m, num_layers=layers), replace(m, num_layers=layers + extra)
    per_layer = roofline.weight_bytes_read_per_step(replace(m, num_layers=layers + 1), batch) - (
        roofline.weight_bytes_read_per_step(small, batch)
    )
    grown = roofline.weight_bytes_read_per_step(big, batch) - roofline.weight_bytes_read_per_step(small, batch)
    assert per_layer > 0
    assert math.isclose(grown, extra * per_layer, rel_tol=1e-9)
    if not m.is_moe:  # dense: a layer is read whole, 2 bytes per parameter
        assert per_layer == 2 * m._layer_params(layers, active=False)


@given(st.sampled_from(DENSE_KEYS), st.integers(1, 200_000))
def test_tied_and_untied_heads_read_the_same_bytes(key, batch):
    # Tying stores the V x d matrix once instead of twice, but the head streams it whole either
    # way and the lookup reads the same rows: the bytes read per step do not change.
    from dataclasses import replace

    m = model(key)
    tied, untied = replace(m, tie_word_embeddings=True), replace(m, tie_word_embeddings=False)
    table = m.vocab_size * m.hidden_size
    assert untied.weight_bytes() - tied.weight_bytes() == 2 * table
    read_tied = roofline.weight_bytes_read_per_step(tied, batch)
    assert read_tied == roofline.weight_bytes_read_per_step(untied, batch)
    # and the step reads fewer bytes than are stored (untied) or at most the rows more (tied)
    rows = roofline.lookup_rows_read(m, batch)
    assert read_tied <= untied.weight_bytes()
    assert read_tied <= tied.weight_bytes() + 2 * rows * m.hidden_size
    # monotone in the batch: one more token never reads fewer bytes
    assert roofline.weight_bytes_read_per_step(untied, batch + 1) >= read_tied


@pytest.mark.parametrize("positions", [100, 2048])
def test_crossover_past_a_lookup_table_size_still_balances_the_two_times(positions):
    # GPT-3 with a short learned-position table: past P tokens its rows stop growing, so the
    # closed form solves the next linear segment. Second method: the two times are equal at T*.
    from dataclasses import replace

    m = replace(model("gpt3-175b"), max_position_embeddings=positions)
    g = gpu("h100-sxm")
    t = roofline.prefill_crossover_tokens(m, g)
    assert (t > positions) == (positions == 100)
    matmul_s = m.weight_flops_per_token() * t / g.peak_flops("bf16")
    read_s = roofline.weight_bytes_read_per_step(m, t) / g.memory_bandwidth
    assert matmul_s == pytest.approx(read_s, rel=1e-12)
