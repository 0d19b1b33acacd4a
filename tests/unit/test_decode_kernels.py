"""lib.perf.decode_kernels: the per-kernel decode table against second methods (the model's own FLOP
and parameter counts, hand counts of bytes, bisection) and published configs."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.book import widgets
from lib.perf import decode_kernels as dk
from lib.perf import roofline as rf
from lib.registry.models import model

DENSE = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-2-7b",
    "llama-2-70b",
    "qwen2.5-72b",
    "gpt3-175b",
)
COMPUTE = ("weight_gemm", "attention")


def _valid_tps(m):
    return [
        t
        for t in (1, 2, 4, 8)
        if m.num_attention_heads % t == 0 and t <= m.num_kv_heads and m.num_kv_heads % t == 0
    ]


@given(
    st.sampled_from(DENSE),
    st.integers(1, 256),
    st.integers(1, 131072),
    st.sampled_from(dk.FUSION_LEVELS),
    st.data(),
)
def test_matmul_and_attention_flops_sum_to_the_models_flops_per_token(
    key, batch, context, fusion, data
):
    # Second method: Model.flops_per_token = 2 x matmul params + attention term, counted from
    # the config by lib.registry.models, independent of the kernel-by-kernel shapes.
    m = model(key)
    tp = data.draw(st.sampled_from(_valid_tps(m)))
    table = dk.decode_step_kernels(m, "h100-sxm", batch, context, tp, fusion=fusion)
    flops = sum(k.flops for k in table if k.category in COMPUTE)
    assert math.isclose(flops * tp, batch * m.flops_per_token(context), rel_tol=1e-12)


@given(st.sampled_from(DENSE), st.integers(1, 256), st.integers(1, 65536))
def test_weight_bytes_are_the_parameters_minus_untouched_embedding_rows(key, batch, context):
    # At tp = 1 in BF16 a step touches every parameter once except the lookup tables, of
    # which it reads one row per sequence (two with learned positions); a tied LM head reads
    # the whole shared matrix.
    m = model(key)
    table = dk.decode_step_kernels(m, "h100-sxm", batch, context)
    rows = 2 if m.position_embedding == "learned" else 1
    tied = m.vocab_size * m.hidden_size if m.tie_word_embeddings else 0
    expected = 2.0 * (m.params_total - m.params_embedding + tied + rows * batch * m.hidden_size)
    assert math.isclose(sum(k.weight_bytes for k in table), expected, rel_tol=1e-12)
    # and the kernel table agrees with lib.perf.roofline's whole-step count
    assert math.isclose(expected, rf.weight_bytes_read_per_step(m, batch), rel_tol=1e-12)


def test_bytes_by_hand_for_llama_3_1_8b():
    # Independent count, Llama 3.1 8B (published config: d 4096, 32 layers, 32 heads, 8 KV heads,
    # head 128, FFN 14336, vocab 128256; KV 131,072 B/token in BF16, data/models.yaml).
    B, ctx, L, d, i, V = 8, 4096, 32, 4096, 14336, 128256
    q, kv = 32 * 128, 8 * 128
    m = model("llama-3.1-8b")
    weights = 2.0 * (8_030_261_248 - V * d + B * d)
    kv_bytes = B * ctx * 131_072 + B * 131_072  # read the cache, write the new token
    per_layer_act = (
        2
        * B
        * (
            2 * 2 * d  # two RMSNorms: read x, write y
            + 2 * (q + kv)  # rotary: read and write q, k
            + 2 * kv  # KV write reads k, v
            + 2 * q  # attention reads q, writes o
            + 2 * 3 * d  # two residual adds: read 2, write 1
            + 3 * i  # SiLU x up: read 2i, write i
            + (d + q + 2 * kv)
            + (q + d)
            + (d + 2 * i)
            + (i + d)  # GEMM inputs and outputs
        )
    )
    per_step_act = 2 * B * d + 2 * 2 * B * d + 2 * B * d + 4 * B * V + 4 * B * V + 8 * B
    #              embedding out, final norm, LM head in, logits out (FP32), sampling in, ids out
    expected = weights + kv_bytes + L * per_layer_act + per_step_act
    table = dk.decode_step_kernels(m, "h100-sxm", B, ctx, fusion="none")
    totals = dk.step_totals(table)
    assert math.isclose(totals["bytes"], expected, rel_tol=1e-12)
    assert math.isclose(totals["kv_bytes"], kv_bytes, rel_tol=1e-12)
    assert math.isclose(totals["weight_bytes"], weights, rel_tol=1e-12)


@given(st.sampled_from(DENSE), st.integers(1, 64), st.integers(1, 32768))
def test_fusion_moves_only_activation_bytes_and_launches(key, batch, context):
    m = model(key)
    t = {
        f: dk.step_totals(dk.decode_step_kernels(m, "h100-sxm", batch, context, fusion=f))
        for f in dk.FUSION_LEVELS
    }
    for f in ("partial", "full"):
        assert math.isclose(t[f]["weight_bytes"], t["none"]["weight_bytes"], rel_tol=1e-12)
        assert math.isclose(t[f]["kv_bytes"], t["none"]["kv_bytes"], rel_tol=1e-12)
    assert (
        t["none"]["activation_bytes"]
        > t["partial"]["activation_bytes"]
        > t["full"]["activation_bytes"]
    )
    for f in (
        dk.FUSION_LEVELS
    ):  # launches = layers x kernels per layer + embedding, final norm, head, sampling
        per_step = 3 if f == "full" else 4
        assert t[f]["launches"] == m.num_layers * dk.kernels_per_layer(f, m) + per_step


@given(
    st.integers(1, 4096), st.sampled_from([(4096, 6144), (8192, 1280), (3584, 8192), (8192, 16032)])
)
def test_gemm_intensity_is_just_below_batch_in_bf16(batch, shape):
    k, n = shape
    i = dk.gemm_intensity(k, n, batch)
    assert i < batch
    assert math.isclose(
        i, batch / (1 + batch * (1 / k + 1 / n)), rel_tol=1e-12
    )  # B / (1 + B (1/K + 1/N))


@given(st.sampled_from(DENSE), st.integers(1, 512), st.integers(1, 512), st.integers(16, 65536))
def test_attention_intensity_does_not_move_with_batch(key, b1, b2, context):
    k1 = {k.name: k for k in dk.decode_step_kernels(key, "h100-sxm", b1, context)}["attention"]
    k2 = {k.name: k for k in dk.decode_step_kernels(key, "h100-sxm", b2, context)}["attention"]
    assert math.isclose(k1.intensity, k2.intensity, rel_tol=1e-12)
    assert math.isclose(k1.intensity, dk.attention_decode_intensity(key, context), rel_tol=1e-12)


@pytest.mark.parametrize(
    "key,group",
    [
        ("llama-3.1-8b", 4),
        ("llama-3.1-70b", 8),
        ("llama-2-7b", 1),
        ("llama-3.1-405b", 16),
        ("qwen2.5-72b", 8),
    ],
)
def test_attention_intensity_tends_to_the_gqa_group_in_bf16(key, group):
    # Published configs: query heads / KV heads = 32/8, 64/8, 32/32, 128/8, 64/8.
    assert math.isclose(dk.attention_decode_intensity(key, 10**7), group, rel_tol=1e-5)
    assert math.isclose(
        dk.attention_decode_intensity(key, 10**7, kv_dtype="fp8"), 2 * group, rel_tol=1e-5
    )


def test_mla_absorbed_intensity_by_hand():
    # DeepSeek-V3 config: 128 heads, kv_lora_rank 512, qk_rope_head_dim 64 (ds_v3_repo). Per key
    # per layer: scores 2 x 128 x 576, values 2 x 128 x 512 FLOPs; the latent is 576 BF16 values.
    ctx = 4096
    flops = (2 * 128 * 576 + 2 * 128 * 512) * ctx
    nbytes = 576 * 2 * ctx + 2 * 128 * (576 + 512)
    assert math.isclose(
        dk.attention_decode_intensity("deepseek-v3", ctx), flops / nbytes, rel_tol=1e-12
    )
    assert dk.attention_decode_intensity("deepseek-v3", ctx, absorbed=False) < 1.01


def test_crossover_closed_form_against_bisection_on_the_table():
    m, ctx, tp = model("llama-3.1-70b"), 4096, 8
    att = dk.attention_decode_intensity(m, ctx)
    for name, (k, n, _bias) in dk.gemm_shapes(m, tp).items():
        out = dk.LOGIT_BYTES if name == "lm_head" else None  # FP32 logits
        b_star = dk.gemm_attention_crossover_batch(k, n, att, out_bytes=out)
        lo, hi = 1.0, 1000.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if dk.gemm_intensity(k, n, mid, out_bytes=out) < att else (lo, mid)
        assert math.isclose(b_star, lo, rel_tol=1e-9), name


def test_ranking_flips_between_batch_8_and_9_for_llama_3_1_70b():
    # 64 query heads / 8 KV heads (Llama 3 paper, Table 3): attention sits at ~8 FLOP/byte.
    def order(batch):
        t = {
            k.name: k.intensity
            for k in dk.decode_step_kernels("llama-3.1-70b", "h100-sxm", batch, 4096, 8)
        }
        return t

    at8, at9 = order(8), order(9)
    gemms = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
    assert all(at8["attention"] > at8[g] for g in gemms)
    assert all(at9["attention"] < at9[g] for g in gemms)


def test_time_crossover_against_linear_search():
    for gemm in ("o_proj", "down_proj"):
        found = dk.time_crossover_batch("llama-3.1-70b", "h100-sxm", gemm, 4096, 8)
        first = next(
            b
            for b in range(1, 200)
            if (
                t := {
                    k.name: k.roofline_s
                    for k in dk.decode_step_kernels("llama-3.1-70b", "h100-sxm", b, 4096, 8)
                }
            )["attention"]
            >= t[gemm]
        )
        assert found == first


def test_kernel_table_shares_sum_to_one():
    rows = dk.kernel_table(dk.decode_step_kernels("llama-3.1-8b", "h100-sxm", 4, 1024))
    assert math.isclose(sum(r["share"] for r in rows), 1.0, rel_tol=1e-12)
    assert {r["fix"] for r in rows if r["category"] == "elementwise"} == {"fusion"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mdl": "mixtral-8x7b"}, "MoE"),
        ({"mdl": "deepseek-v3"}, "MLA"),
        ({"batch": 0}, "batch"),
        ({"context": 0}, "context"),
        ({"fusion": "max"}, "fusion"),
        ({"tp": 3}, "tp"),
        ({"weight_dtype": "fp6"}, "dtype"),
        ({"chip": "a100-sxm", "compute_dtype": "fp8"}, "fp8"),
    ],
)
def test_invalid_inputs_raise_clear_errors(kwargs, match):
    args = {"mdl": "llama-3.1-8b", "chip": "h100-sxm", **kwargs}
    with pytest.raises(ValueError, match=match):
        dk.decode_step_kernels(**args)


def test_crossover_unreachable_raises():
    with pytest.raises(ValueError, match="never reaches"):
        dk.gemm_attention_crossover_batch(4, 4, 100.0)


def test_kernel_ranking_explorer_returns_a_view_or_a_value_error(fuzz_explorer):
    fuzz_explorer("roofline.kernel_ranking", n=60)
    view = widgets.render(
        "roofline.kernel_ranking",
        model="llama-3.1-70b",
        gpu="h100-sxm",
        tp=8,
        weight_dtype="bf16",
        kv_dtype="bf16",
        batch=8,
        context=4096,
    )
    assert 8.0 <= view.values["crossover_min"] <= view.values["crossover_max"] < 8.1


@pytest.mark.parametrize(
    "key,tp", [("llama-3.1-405b", 16), ("llama-3.1-70b", 8), ("llama-2-7b", 4)]
)
def test_per_gpu_attention_intensity_matches_the_table(key, tp):
    # Past the KV-head count each rank keeps one replicated KV head: 405B at TP16 has 8 query
    # heads per KV head per GPU instead of 16.
    table = {k.name: k for k in dk.decode_step_kernels(key, "h100-sxm", 3, 2048, tp)}
    assert math.isclose(
        table["attention"].intensity, dk.attention_decode_intensity(key, 2048, tp=tp), rel_tol=1e-12
    )


def test_table_is_an_inventory_not_a_step_time():
    # issue 9: the table's per-kernel roofline is a bound, named so; the step time is lib.perf.step.
    from lib.perf import step
    from lib.perf.deployment import Deployment

    table = dk.decode_step_kernels("llama-3.1-70b", "h100-sxm", 1, 4096, 8)
    assert not hasattr(table[0], "time_s")
    totals = dk.step_totals(table)
    assert "time_s" not in totals and "time_s" not in dk.kernel_table(table)[0]
    s = step.decode_step(Deployment("llama-3.1-70b", "h100-sxm", tp=8), 1, 4096)
    assert totals["roofline_s"] < s.total_s
    # second method on the inventory: the GEMM weight bytes equal the step model's (lib.perf.step)
    gemm_w = sum(k.weight_bytes for k in table if k.category == "weight_gemm")
    assert math.isclose(gemm_w, s.weight_bytes_per_gpu, rel_tol=1e-9)
