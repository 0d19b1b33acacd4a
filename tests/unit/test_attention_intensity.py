"""lib.perf.attention_intensity: decode-attention FLOPs, bytes and intensity for MHA, GQA and MLA."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import attention_intensity as ai
from lib.registry.models import model

# ---- closed forms and published values -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "kv_dtype", "expected"),
    [
        ("llama-2-7b", "bf16", 1.0),  # MHA: one query head per KV head, 2 FLOPs per 2 bytes
        ("llama-3.1-70b", "bf16", 8.0),  # GQA-8 (64 query / 8 KV heads)
        ("llama-3.1-8b", "bf16", 4.0),  # GQA-4 (32 / 8)
        ("llama-3.1-70b", "fp8", 16.0),  # 1-byte cache doubles it
        ("llama-2-7b", "fp8", 2.0),
    ],
)
def test_gqa_limit_is_group_size_times_two_over_bytes(key, kv_dtype, expected):
    # closed form 2 g / b: g = H / H_kv, b bytes per cached element
    assert ai.decode_attention_intensity(key, kv_dtype=kv_dtype) == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("s_q", [1, 2, 4])
def test_absorbed_mla_matches_flashmla_published_formula(s_q):
    # deepseek-ai/FlashMLA docs/20250422-new-kernel-deep-dive.md: ratio = h_q s_q (d_k + d_v) / d_k
    # with h_q = 128, d_k = 576 (latent 512 + RoPE 64), d_v = 512, BF16 cache.
    published = 128 * s_q * (576 + 512) / 576
    got = ai.decode_attention_intensity("deepseek-v3", query_tokens=s_q)
    assert got == pytest.approx(published, rel=1e-12)
    # ... and the write-up's shorthand "about 2 h_q s_q" is within 6% of the exact value
    assert got == pytest.approx(2 * 128 * s_q, rel=0.06)


def test_flashmla_compute_bound_threshold():
    # FlashMLA deep-dive: compute-bound when h_q s_q >= 1/2 * 865 / 3.35 = 129 (they round to 128)
    # with the throttled 865 TFLOPS. Our exact intensity at h_q = 128, s_q = 1 is 242 FLOP/byte,
    # 94% of that throttled ridge (258) and 82% of the datasheet ridge (295).
    i = ai.decode_attention_intensity("deepseek-v3")
    assert i / (865 / 3.35) == pytest.approx(0.936, abs=0.002)
    assert i / (989 / 3.35) == pytest.approx(0.819, abs=0.002)


def test_fp8_mla_cache_doubles_intensity():
    assert ai.decode_attention_intensity("deepseek-v3", kv_dtype="fp8") == pytest.approx(
        2 * ai.decode_attention_intensity("deepseek-v3"), rel=1e-12
    )


def test_materialized_mla_is_mha_like():
    # expanding the latent to per-head K (192) and V (128) in HBM: each head reads its own K,V
    assert ai.decode_attention_intensity("deepseek-v3", absorbed=False) == pytest.approx(
        1.0, rel=1e-12
    )


def test_absorbed_flops_factor():
    # (576 + 512) / (192 + 128) = 3.4 (DeepSeek-V3 config dims)
    assert ai.absorbed_extra_flops_factor("deepseek-v3") == pytest.approx(3.4, rel=1e-12)
    with pytest.raises(ValueError, match="MLA"):
        ai.absorbed_extra_flops_factor("llama-3.1-70b")


def test_query_tokens_for_ridge():
    # H100 BF16 ridge 989/3.35 = 295.2; one MLA query gives 241.8 -> 1.22 query tokens
    assert ai.query_tokens_for_ridge("deepseek-v3", "h100-sxm") == pytest.approx(
        (989 / 3.35) / (128 * 1088 / 576), rel=1e-9
    )
    # GQA-8: about 37 query tokens per sequence would be needed
    assert ai.query_tokens_for_ridge("llama-3.1-70b", "h100-sxm") == pytest.approx(
        989 / 3.35 / 8, rel=1e-9
    )


# ---- second methods: lib.registry.models and brute force ------------------------------------------


@pytest.mark.parametrize(
    "key", ["llama-3.1-70b", "llama-2-7b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b"]
)
def test_cache_bytes_equal_models_kv_bytes(key):
    # bytes read per context token (batch 1, tp 1, no query traffic) = lib.registry.models KV bytes per token
    f1, b1 = ai.decode_attention_flops_bytes(key, 1001)
    f0, b0 = ai.decode_attention_flops_bytes(key, 1000)
    assert b1 - b0 == pytest.approx(model(key).kv_bytes_per_token("bf16"), rel=1e-12)


@pytest.mark.parametrize("key", ["llama-3.1-70b", "llama-2-7b", "qwen2.5-72b"])
def test_gqa_flops_equal_models_attention_flops(key):
    assert ai.decode_attention_flops_bytes(key, 4096)[0] == pytest.approx(
        model(key).attention_flops_per_token(4096), rel=1e-12
    )


def test_materialized_mla_flops_equal_models_attention_flops():
    # lib.registry.models counts MLA attention unabsorbed (d_qk 192, d_v 128)
    assert ai.decode_attention_flops_bytes("deepseek-v3", 4096, absorbed=False)[0] == pytest.approx(
        model("deepseek-v3").attention_flops_per_token(4096), rel=1e-12
    )


def test_brute_force_gqa_layer_counts():
    # One layer of Llama 3.1 70B, 64 heads in 8 groups, context 37: count matmul FLOPs from shapes
    m, c = model("llama-3.1-70b"), 37
    g, d = m.num_attention_heads // m.num_kv_heads, m.head_dim
    q = np.zeros((m.num_kv_heads, g, d))
    k = np.zeros((m.num_kv_heads, c, d))
    v = np.zeros((m.num_kv_heads, c, d))
    scores = np.einsum("hgd,hcd->hgc", q, k)
    flops = 2 * q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2]  # QK^T
    flops += 2 * scores.shape[0] * scores.shape[1] * scores.shape[2] * v.shape[2]  # PV
    nbytes = 2 * (k.size + v.size + q.size + q.size)  # read K, V, Q; write O (BF16)
    f, b = ai.decode_attention_flops_bytes(m, c)
    assert f == pytest.approx(flops * m.num_layers, rel=1e-12)
    assert b == pytest.approx(nbytes * m.num_layers, rel=1e-12)


# ---- invariants -----------------------------------------------------------------------------


@given(
    batch=st.integers(1, 4096),
    context=st.integers(1, 200_000),
    key=st.sampled_from(["llama-3.1-70b", "llama-2-7b", "deepseek-v3", "mixtral-8x22b"]),
    q=st.integers(1, 8),
)
def test_batch_never_changes_attention_intensity(batch, context, key, q):
    f1, b1 = ai.decode_attention_flops_bytes(key, context, 1, q)
    fb, bb = ai.decode_attention_flops_bytes(key, context, batch, q)
    assert fb == pytest.approx(batch * f1, rel=1e-12)
    assert fb / bb == pytest.approx(f1 / b1, rel=1e-12)


@given(
    context=st.integers(1, 10_000_000),
    key=st.sampled_from(["llama-3.1-70b", "deepseek-v3", "llama-2-7b"]),
    kv=st.sampled_from(["bf16", "fp8"]),
)
def test_exact_intensity_below_and_tends_to_limit(context, key, kv):
    exact = ai.decode_attention_intensity(key, context, kv_dtype=kv)
    limit = ai.decode_attention_intensity(key, None, kv_dtype=kv)
    assert exact < limit
    if context >= 5_000_000:
        assert exact == pytest.approx(limit, rel=1e-3)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gqa_intensity_unchanged_while_tp_within_kv_heads(tp):
    assert ai.decode_attention_intensity("llama-3.1-70b", tp=tp) == pytest.approx(8.0, rel=1e-12)


def test_tp_past_kv_heads_and_mla_tp_lower_intensity():
    # past 8 KV heads each GPU keeps a replicated KV head for fewer query heads
    assert ai.decode_attention_intensity("llama-3.1-70b", tp=16) == pytest.approx(4.0, rel=1e-12)
    assert ai.decode_attention_intensity("llama-3.1-70b", tp=64) == pytest.approx(1.0, rel=1e-12)
    # MLA's one latent is replicated: TP8 leaves 16 heads per latent read
    assert ai.decode_attention_intensity("deepseek-v3", tp=8) == pytest.approx(
        241.777 / 8, rel=1e-4
    )


def test_decode_attention_time_is_memory_bound_for_gqa():
    t = ai.decode_attention_time("llama-3.1-70b", "h100-sxm", 4096, batch=64, tp=8)
    assert t.bound == "memory"
    assert t.memory_s == pytest.approx(t.bytes / 3.35e12, rel=1e-12)


# ---- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"context": -1}, "context"),
        ({"context": 1.5}, "context"),
        ({"context": 10, "batch": 0}, "batch"),
        ({"context": 10, "query_tokens": 0}, "query_tokens"),
        ({"context": 10, "tp": 3}, "tp"),
        ({"context": 10, "tp": 0}, "tp"),
        ({"context": 10, "kv_dtype": "fp6"}, "dtype"),
    ],
)
def test_bad_inputs_raise_valueerror(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ai.decode_attention_flops_bytes("llama-3.1-70b", **kwargs)


def test_geometry_fields():
    geo = ai.attention_geometry("deepseek-v3")
    assert (geo.query_heads, geo.kv_units, geo.cache_elements_per_unit, geo.d_qk, geo.d_v) == (
        128,
        1,
        576,
        576,
        512,
    )
    assert geo.heads_per_unit == 128 and geo.cache_elements_per_token == 576
    assert math.isclose(ai.attention_geometry("llama-3.1-70b", tp=2).heads_per_unit, 8)
