"""lib.perf.prefill: weight inventory, Kaplan's FLOP count, prefill floor / TTFT, crossover and the
KV cache's ceilings on decode batching."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import memory
from lib.perf import prefill as pf
from lib.perf import roofline as rf
from lib.perf.deployment import Deployment
from lib.registry import assumptions
from lib.registry.models import model, model_names

H100_PEAK, H100_BW = 989e12, 3.35e12  # data/hardware.yaml: NVIDIA H100 SXM datasheet (dense BF16)

# ---- inventory ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", model_names())
def test_inventory_sums_to_reference_count(key):
    # data/models.yaml params_from_config: counted independently from config.json by the reference
    assert (
        sum(r.params_stored for r in pf.weight_inventory(key))
        == model(key).published["params_from_config"]
    )


def test_llama_70b_matmul_params_by_hand():
    # config: d 8192, 80 layers, 64 q / 8 kv heads of 128, FFN 28672, vocab 128256, untied head
    d, n_l, ffn, vocab = 8192, 80, 28672, 128256
    per_layer = d * d + 2 * d * 1024 + d * d + 3 * d * ffn
    expected = n_l * per_layer + vocab * d
    assert pf.matmul_params_from_inventory("llama-3.1-70b") == expected == 69_501_714_432
    assert model("llama-3.1-70b").matmul_params_active == expected


@pytest.mark.parametrize("key", model_names())
def test_inventory_matmuls_vs_lib_models(key):
    # lib.registry.models counts in-layer biases and MLA latent norms / router bias with the matmul params;
    # the inventory files them as elementwise. The two agree once those are added back.
    inv = pf.weight_inventory(key)
    in_layer_elementwise = sum(
        r.params_active for r in inv if r.kind == "elementwise" and not r.name.startswith("norms")
    )
    assert (
        pf.matmul_params_from_inventory(key) + in_layer_elementwise
        == model(key).matmul_params_active
    )


def test_inventory_kinds_and_flops():
    inv = {r.name: r for r in pf.weight_inventory("llama-3.1-70b")}
    assert inv["token embedding"].flops_per_token == 0
    assert inv["token embedding"].params_active == 0
    assert inv["lm_head"].flops_per_token == 2 * 128256 * 8192
    tied = {r.name: r for r in pf.weight_inventory("gpt3-175b")}
    head = tied["lm_head (tied to embedding)"]
    assert head.params_stored == 0 and head.params_active == 50257 * 12288


# ---- Kaplan et al. 2020 -------------------------------------------------------------------


def test_kaplan_context_criterion_gpt3():
    # Kaplan et al. 2020 sec. 2.1: the context term matters once n_ctx approaches 12 d_model
    # (for N = 12 n_layer d_model^2). GPT-3 175B: 12 x 12288 = 147,456 tokens (1% for biases).
    m = model("gpt3-175b")
    n_kaplan = pf.kaplan_forward_flops_per_token(m, 0) / 2
    breakeven = n_kaplan / (m.num_layers * m.num_attention_heads * m.head_dim)
    assert breakeven == pytest.approx(12 * 12288, rel=0.01)


@given(
    p=st.integers(1, 300_000), key=st.sampled_from(["llama-3.1-70b", "llama-3.1-8b", "qwen2.5-72b"])
)
def test_kaplan_equals_causal_average_of_lib(p, key):
    # Kaplan's 2 n_layer n_ctx d_attn is the per-token average over a causal window: lib's
    # prefill_flops(P) / P = 2 N_matmul + a (P + 1) / 2 = Kaplan(P) + 2 x head + a / 2.
    m = model(key)
    a = m.attention_flops_per_token(1)
    head = m.vocab_size * m.hidden_size
    assert m.prefill_flops(p) / p == pytest.approx(
        pf.kaplan_forward_flops_per_token(m, p) + 2 * head + a / 2, rel=1e-12
    )


# ---- prefill floor and TTFT ---------------------------------------------------------------


def test_prefill_floor_70b_node_by_hand():
    # 2 x 69.50e9 x 8192 / (8 x 989e12 x 0.6) = 0.2399 s
    est = pf.prefill_estimate("llama-3.1-70b", "h100-sxm", 8192, 8, 0.6, include_attention=False)
    assert est.time_s == pytest.approx(2 * 69_501_714_432 * 8192 / (8 * H100_PEAK * 0.6), rel=1e-12)
    assert est.time_s == pytest.approx(0.24, abs=0.001)
    assert est.bound == "compute"


@pytest.mark.parametrize("key", ["llama-3.1-70b", "mixtral-8x7b", "llama-3.1-8b"])
def test_prefill_estimate_agrees_with_roofline_prefill(key):
    # second method: lib.perf.roofline.prefill (peak FLOPs, attention included)
    est = pf.prefill_estimate(key, "h100-sxm", 3000, 8, 0.5)
    ref = rf.prefill(key, "h100-sxm", 3000, tp=8)
    assert est.compute_s * 0.5 == pytest.approx(ref.compute_s, rel=1e-12)
    assert est.memory_s == pytest.approx(ref.memory_s, rel=1e-12)
    # and with weights and cache in different dtypes (FP8 weights, BF16 KV)
    est = pf.prefill_estimate(key, "h100-sxm", 3000, 8, 0.5, "fp8", "fp8", "bf16")
    ref = rf.prefill(key, "h100-sxm", 3000, tp=8, weight_dtype="fp8", compute_dtype="fp8", kv_dtype="bf16")
    assert est.memory_s == pytest.approx(ref.memory_s, rel=1e-12)


@given(t=st.floats(0.001, 100.0), mfu=st.floats(0.1, 1.0), att=st.booleans())
def test_prompt_len_for_time_inverts_the_floor(t, mfu, att):
    p = pf.prompt_len_for_time("llama-3.1-70b", "h100-sxm", t, 8, mfu, include_attention=att)
    m = model("llama-3.1-70b")
    a = m.attention_flops_per_token(1) if att else 0.0
    flops = m.weight_flops_per_token() * p + a * p * (p + 1) / 2
    assert flops / (8 * H100_PEAK * mfu) == pytest.approx(t, rel=1e-9)


@given(p=st.integers(1, 200_000), t=st.floats(0.01, 10.0))
def test_mfu_for_time_inverts_the_floor(p, t):
    needed = pf.mfu_for_time("llama-3.1-8b", "h100-sxm", p, t, 1)
    if 0 < needed <= 1:
        est = pf.prefill_estimate("llama-3.1-8b", "h100-sxm", p, 1, needed)
        assert est.compute_s == pytest.approx(t, rel=1e-9)


def test_allreduce_by_hand_and_edge_cases():
    # 2 x 80 layers x (ring latency at 8 GPUs + 2 x 7/8 x (8192 x 8192 x 2 bytes) / (450e9 x bus efficiency))
    got = pf.prefill_allreduce_s("llama-3.1-70b", "h100-sxm", 8192, 8)
    eff = assumptions.value("collectives.nvlink.bus_efficiency")
    by_hand = 160 * (15.0e-6 + 2 * 7 / 8 * 8192 * 8192 * 2 / (450e9 * eff))
    assert got == pytest.approx(by_hand, rel=1e-9)
    assert pf.prefill_allreduce_s("llama-3.1-70b", "h100-sxm", 8192, 1) == 0.0
    # PCIe boards are priced over PCIe, not refused
    assert pf.prefill_allreduce_s("llama-3.1-8b", "l4", 1024, 2) > 0


def test_prefill_time_charges_tp_traffic_once_and_it_grows_with_tokens():
    # Finding (issue 9): TP prefill ignored its all-reduce (TTFT ~ 1/TP); prefill-floor added it on top
    # of an MFU that already included communication. Now: MFU compute-only, comm charged once.
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    for p in (2048, 32768):
        t = pf.prefill_time(dep, p)
        est = pf.prefill_estimate("llama-3.1-70b", "h100-sxm", p, 8, pf.default_mfu())
        assert t.time_s == pytest.approx(est.time_s + t.allreduce_s, rel=1e-12)
        assert t.allreduce_s == pytest.approx(pf.prefill_allreduce_s("llama-3.1-70b", "h100-sxm", p, 8), rel=1e-12)
        assert pf.ttft_s(t) == t.time_s  # no second all-reduce on top
    short, long = pf.prefill_time(dep, 2048), pf.prefill_time(dep, 32768)
    assert 0.015 < short.allreduce_s < 0.035  # issue 9: about 20-28 ms at 2k tokens
    assert 0.3 < long.allreduce_s < 0.5  # and ~400 ms at 32k
    # TTFT does not scale as 1/TP: TP8 is more than 1/8 of TP1 (same compute-only MFU)
    one = pf.prefill_time(Deployment("llama-3.1-70b", "h200", tp=1, weight_dtype="fp8"), 8192)
    eight = pf.prefill_time(Deployment("llama-3.1-70b", "h200", tp=8, weight_dtype="fp8"), 8192)
    assert eight.time_s > one.time_s / 8 * 1.2


def test_ttft_is_the_sum():
    t = pf.prefill_time(Deployment("llama-3.1-70b", "h100-sxm", tp=8), 4096)
    assert pf.ttft_s(t) == t.time_s
    assert pf.ttft_s(t, 0.1, 0.023) == pytest.approx(t.time_s + 0.123, rel=1e-12)
    with pytest.raises(ValueError, match="queue_s"):
        pf.ttft_s(t, queue_s=-1)
    with pytest.raises(ValueError, match="all-reduce"):  # a TP estimate without its traffic is refused
        pf.ttft_s(pf.prefill_estimate("llama-3.1-70b", "h100-sxm", 4096, 8, 0.6))
    one = pf.prefill_estimate("llama-3.1-8b", "h100-sxm", 4096, 1, 0.6)
    assert pf.ttft_s(one, overhead_s=0.01) == pytest.approx(one.time_s + 0.01)


# ---- crossover ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["llama-3.1-70b", "llama-3.1-8b", "gpt3-175b"])
@pytest.mark.parametrize("chip", ["h100-sxm", "a100-sxm", "b200", "mi300x"])
def test_dense_crossover_is_the_ridge(key, chip):
    # 2 N T / P = 2 (S + k d T) / W  =>  T* = R S / (N - R k d), S the parameters streamed
    # (all but the lookup tables; a tied head whole), k d the lookup-row parameters per token
    m = model(key)
    from lib.registry.hardware import gpu

    g = gpu(chip)
    r, d = g.ridge_point("bf16"), m.hidden_size
    tied = m.vocab_size * d if m.tie_word_embeddings else 0
    s = m.params_total - m.params_embedding + tied
    k = 2 if m.position_embedding == "learned" else 1
    got = pf.weight_read_crossover_tokens(m, g)
    assert got == pytest.approx(rf.prefill_crossover_tokens(m, g), rel=1e-12)
    assert got == pytest.approx(r * s / (m.matmul_params_active - r * k * d), rel=1e-12)
    # every streamed byte but the norms is a matmul weight: the crossover is the ridge
    assert got == pytest.approx(r, rel=3e-4)


def test_fp8_both_keeps_crossover_int4_weights_quarter_it():
    bf = pf.weight_read_crossover_tokens("llama-3.1-70b", "h100-sxm")
    assert pf.weight_read_crossover_tokens(
        "llama-3.1-70b", "h100-sxm", "fp8", "fp8"
    ) == pytest.approx(bf * 1979 / (2 * 989), rel=1e-4)  # H100 FP8 dense peak 1979 = 2.001 x 989
    assert pf.weight_read_crossover_tokens(
        "llama-3.1-70b", "h100-sxm", "int4", "bf16"
    ) == pytest.approx(bf / 4, rel=1e-4)  # not exact: the lookup rows per token scale with b too


@pytest.mark.parametrize("key", ["mixtral-8x7b", "mixtral-8x22b", "deepseek-v3"])
def test_moe_crossover_bisection_matches_all_experts_closed_form(key):
    # at ~1,000-5,000 tokens every expert is touched, so the MoE-aware bisection must agree
    # with the all-weights closed form in lib.perf.roofline
    assert pf.weight_read_crossover_tokens(key, "h100-sxm") == pytest.approx(
        rf.prefill_crossover_tokens(key, "h100-sxm"), rel=1e-6
    )


# ---- decode: KV capacity and bandwidth ceilings ----------------------------------------------


def test_decode_capacity_is_the_memory_budget():
    """The decode ceiling the prefill explorers show is the one capacity function's."""
    from lib.perf.deployment import Deployment
    from lib.perf.memory import memory_budget

    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    assert dep.budget.max_concurrency(4096) == memory_budget("llama-3.1-70b", "h100-sxm", 8).max_concurrency(4096)


@given(
    batch=st.integers(1, 2048),
    context=st.integers(0, 65536),
    tp=st.sampled_from([1, 2, 8]),
    key=st.sampled_from(["llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"]),
)
def test_decode_intensity_equals_roofline_decode_step(batch, context, tp, key):
    ours = pf.decode_intensity(key, batch, context, tp)
    assert ours == pytest.approx(
        rf.decode_step(key, "h100-sxm", tp, batch, context).intensity, rel=1e-12
    )


def test_weight_gemm_intensity_is_about_batch():
    # 2 N_matmul B / (2 (N_total - V d + B d)) = B x 0.99998 for Llama 3.1 70B in BF16:
    # the step streams every parameter but the 128,256 x 8,192 embedding table, and B rows of it
    for b in (1, 64, 300):
        streamed = 70_553_706_496 - 128_256 * 8_192 + b * 8_192
        assert pf.decode_intensity("llama-3.1-70b", b) == pytest.approx(
            b * 69_501_714_432 / streamed, rel=1e-12
        )


@given(context=st.integers(1, 131072))
def test_intensity_limit_is_approached_from_below(context):
    limit = pf.decode_intensity_limit("llama-3.1-70b", context, 8)
    big = pf.decode_intensity("llama-3.1-70b", 10**9, context, 8)
    assert big < limit
    assert big == pytest.approx(limit, rel=1e-3)


@given(context=st.integers(0, 5000), tp=st.sampled_from([1, 2, 4, 8]))
def test_ridge_batch_balances_the_step(context, tp):
    key = "llama-3.1-70b"
    b = pf.decode_ridge_batch(key, "h100-sxm", context, tp)
    c_max = pf.max_context_for_ridge(key, "h100-sxm", tp)
    assert math.isfinite(b) == (context < c_max)
    if math.isfinite(b):
        step = rf.decode_step(key, "h100-sxm", tp, 1, context)
        kv = step.memory_s - rf.weight_bytes_read_per_step(key, 1) / tp / H100_BW
        w = rf.weight_bytes_read_per_step(key, b) / tp / H100_BW  # grows by one row per sequence
        assert b * step.compute_s == pytest.approx(w + b * kv, rel=1e-9)


def test_ridge_batch_without_kv_is_the_crossover():
    assert pf.decode_ridge_batch("llama-3.1-70b", "h100-sxm", 0, 8) == pytest.approx(
        rf.prefill_crossover_tokens("llama-3.1-70b", "h100-sxm"), rel=1e-12
    )


def test_moe_ridge_batch_balances_step():
    b = pf.decode_ridge_batch("mixtral-8x7b", "h100-sxm", 0, 1)
    lo, hi = (
        rf.decode_step("mixtral-8x7b", "h100-sxm", 1, math.floor(b)),
        rf.decode_step("mixtral-8x7b", "h100-sxm", 1, math.ceil(b) + 1),
    )
    assert lo.compute_s <= lo.memory_s * 1.001 and hi.compute_s >= hi.memory_s


def test_max_context_for_ridge_70b():
    # 2N / (R k - a) with R = 989/3.35, k = 327,680 B, a = 4 x 80 x 8192 FLOP per key
    m = model("llama-3.1-70b")
    expected = m.weight_flops_per_token() / (989 / 3.35 * 327_680 - 4 * 80 * 8192)
    assert pf.max_context_for_ridge(m, "h100-sxm", 8) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: pf.prefill_estimate("llama-3.1-70b", "h100-sxm", 0), "prompt_len"),
        (lambda: pf.prefill_estimate("llama-3.1-70b", "h100-sxm", 10, mfu=0), "mfu"),
        (lambda: pf.prefill_estimate("llama-3.1-70b", "h100-sxm", 10, n_gpus=3), "tp"),
        (lambda: pf.prefill_estimate("llama-3.1-70b", "a100-sxm", 10, compute_dtype="fp8"), "fp8"),
        (lambda: pf.prompt_len_for_time("llama-3.1-70b", "h100-sxm", 0), "target_s"),
        (lambda: pf.decode_intensity("llama-3.1-70b", 0), "batch"),
        (lambda: pf.decode_ridge_batch("llama-3.1-70b", "h100-sxm", -1), "context"),
        (lambda: pf.kaplan_forward_flops_per_token("llama-3.1-70b", -5), "n_ctx"),
    ],
)
def test_bad_inputs_raise_valueerror(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_assumptions_load():
    a = pf.assumptions()
    assert "gpu_memory_utilization" not in a  # one home: data/assumptions.yaml (serving_memory)
    assert memory.fact("gpu_memory_utilization") == 0.9  # vLLM default
    assert 0 < a["prefill_mfu"] <= 1


@pytest.mark.parametrize("key", ["llama-3.1-70b", "llama-3.1-8b", "llama-3.1-405b", "qwen2.5-72b"])
def test_crossover_balances_the_two_times(key):
    # second method: at T* the matmul time equals the time to read the bytes the pass reads
    got = pf.weight_read_crossover_tokens(key, "h100-sxm")
    m = model(key)
    assert m.weight_flops_per_token() * got / 989e12 == pytest.approx(
        rf.weight_bytes_read_per_step(m, got) / 3.35e12, rel=1e-9
    )
