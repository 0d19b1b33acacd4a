"""lib.registry.models: parameter counts, FLOPs and KV bytes against published values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.registry.models import model, model_names

REQUIRED = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-7b", "llama-2-70b",
            "mixtral-8x7b", "deepseek-v3", "qwen2.5-72b", "gpt3-175b"]


def test_registry_has_the_required_models():
    assert set(REQUIRED) <= set(model_names())


@pytest.mark.parametrize(
    ("key", "published", "rel_tol"),
    [
        ("llama-3.1-8b", 8.03e9, 0.001),  # HF model page: 8.03B
        ("llama-3.1-70b", 70.6e9, 0.001),  # HF model page: ~70.6B
        ("llama-3.1-405b", 405e9, 0.005),  # Llama 3 paper: 405B
        ("llama-2-7b", 6.74e9, 0.001),  # Llama 2: 6.74B
        ("llama-2-70b", 68.98e9, 0.001),  # 68.98B
        ("mixtral-8x7b", 46.7e9, 0.001),  # Mistral blog: 46.7B total
        ("deepseek-v3", 671e9, 0.001),  # DeepSeek-V3 report: 671B total (MTP module excluded)
        ("qwen2.5-72b", 72.7e9, 0.001),  # Qwen2.5 model card: 72.7B
        ("gpt3-175b", 174.6e9, 0.001),  # GPT-3 Table D.1 / Megatron 2021 Table 2: 174.6B
    ],
)
def test_total_params_match_published(key, published, rel_tol):
    assert math.isclose(model(key).params_total, published, rel_tol=rel_tol)


@pytest.mark.parametrize("key", ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-7b",
                                 "llama-2-70b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
                                 "qwen2.5-72b", "gpt3-175b"])
def test_total_params_equal_the_reference_count_exactly(key):
    # shared/reference/models.yaml params_from_config: counted independently from config.json
    assert model(key).params_total == model(key).published["params_from_config"]


@pytest.mark.parametrize(
    ("key", "active", "rel_tol"),
    [("mixtral-8x7b", 12.9e9, 0.004),  # Mistral blog: 12.9B active per token (rounded: +-0.05B)
     ("mixtral-8x22b", 39e9, 0.01),  # Mistral docs: about 39B active
     ("deepseek-v3", 37e9, 0.02)],  # DeepSeek-V3 report: 37B activated
)
def test_moe_active_params_match_published(key, active, rel_tol):
    assert math.isclose(model(key).params_active, active, rel_tol=rel_tol)


@pytest.mark.parametrize(
    ("key", "kv_bytes"),
    [("llama-3.1-70b", 327_680),  # 2 x 80 layers x 8 KV heads x 128 x 2 B
     ("llama-3.1-8b", 131_072),
     ("llama-2-7b", 524_288),  # MHA: NVIDIA "Mastering LLM Techniques" ~2 GB at 4k tokens
     ("deepseek-v3", 70_272),  # MLA: (512 + 64) x 61 x 2 B
     ("gpt3-175b", 4_718_592)],
)
def test_kv_bytes_per_token_bf16(key, kv_bytes):
    assert model(key).kv_bytes_per_token("bf16") == kv_bytes


def test_llama2_70b_kv_matches_databricks_example():
    # Databricks "LLM Inference Performance Engineering" Table 3: 0.312 GiB for 1,024 tokens, fp16.
    gib = model("llama-2-70b").kv_bytes_per_token("fp16") * 1024 / 2**30
    assert math.isclose(gib, 0.3125, rel_tol=1e-9)


def test_fp8_kv_halves_bf16():
    m = model("llama-3.1-70b")
    assert m.kv_bytes_per_token("fp8") * 2 == m.kv_bytes_per_token("bf16")


def test_embedding_and_non_embedding_partition_the_total():
    m = model("llama-3.1-70b")
    assert m.params_embedding == 128256 * 8192
    assert m.params_embedding + m.params_non_embedding == m.params_total


def test_weight_flops_per_token_is_two_per_matmul_param():
    m = model("llama-3.1-70b")
    # matmul params exclude the embedding lookup and the norm weights, include the LM head
    assert m.matmul_params_active == m.params_total - m.params_embedding - m.params_norm
    assert m.weight_flops_per_token() == 2 * m.matmul_params_active


def test_attention_term_matches_kaplan():
    # Kaplan et al. 2020 Table 1: context-dependent forward FLOPs ~ 2 n_layer n_ctx d_attn per token
    # averaged over a causal sequence; for one token attending to n_ctx keys QK and AV cost 4x that/2.
    m = model("gpt3-175b")
    ctx = 2048
    assert m.attention_flops_per_token(ctx) == 4 * m.num_layers * ctx * m.hidden_size


def test_prefill_flops_equal_sum_over_positions():
    m = model("llama-3.1-8b")
    p = 37
    brute = sum(m.weight_flops_per_token() + m.attention_flops_per_token(i) for i in range(1, p + 1))
    assert math.isclose(m.prefill_flops(p), brute, rel_tol=1e-12)


@given(st.sampled_from(REQUIRED), st.integers(0, 1_000_000))
def test_flops_grow_with_context(key, ctx):
    m = model(key)
    assert m.flops_per_token(ctx + 1) > m.flops_per_token(ctx) >= m.weight_flops_per_token()


def test_moe_active_below_total_and_dense_equal():
    assert model("mixtral-8x7b").params_active < model("mixtral-8x7b").params_total
    assert model("llama-3.1-8b").params_active == model("llama-3.1-8b").params_total


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: .*llama-3.1-70b"):
        model("llama-70b")


def test_bad_inputs_raise_valueerror():
    with pytest.raises(ValueError, match="context"):
        model("llama-3.1-8b").attention_flops_per_token(-1)
    with pytest.raises(ValueError, match="dtype"):
        model("llama-3.1-8b").kv_bytes_per_token("fp12")


COUNTS = ("params_embedding", "params_lm_head", "params_total", "params_active",
          "params_non_embedding", "params_norm", "matmul_params_active")


@pytest.mark.parametrize("key", model_names())
def test_parameter_counts_are_cached_and_unchanged(key):
    # Cached once per Model: the second read is the stored int, equal to a fresh count from
    # the per-layer methods (the uncached formula), and a changed copy recounts.
    from dataclasses import replace

    m = model(key)
    for name in COUNTS:
        first = getattr(m, name)
        assert name in vars(m) and getattr(m, name) is first and isinstance(first, int)
    fresh = sum(m._layer_params(i, False) for i in range(m.num_layers))
    assert m.params_total == m.params_embedding + fresh + m._norm_params() + m.params_lm_head
    smaller = replace(m, num_layers=m.num_layers - 1)
    assert m.params_total - smaller.params_total == m._layer_params(m.num_layers - 1, False)
    assert smaller == replace(m, num_layers=m.num_layers - 1)  # equality ignores the cache


def test_check_context_names_the_window():
    m = model("llama-2-7b")  # a 4,096-token window
    assert m.check_context(0) == 0 and m.check_context(4096) == 4096
    with pytest.raises(ValueError, match="PROMPT must be at most llama-2-7b's 4,096-token window, got 4,097"):
        m.check_context(4097, "PROMPT")
    with pytest.raises(ValueError, match="context must be an integer"):
        m.check_context(-1)
