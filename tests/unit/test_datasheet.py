"""lib.perf.datasheet: generation ratios, regimes, headline checks, bytes per FLOP and shoreline."""

import math

import numpy as np
import pytest

from lib.perf import datasheet as ds
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.registry.models import model


def test_bytes_per_flop_is_the_inverse_published_ridge():
    # scaling-book gpus.md: H100 SXM ridge 990e12 / 3.35e12 = 295; B200 2250e12 / 8e12 = 281
    assert math.isclose(1 / ds.bytes_per_flop("h100-sxm"), 295, rel_tol=0.005)
    assert math.isclose(1 / ds.bytes_per_flop("b200"), 281, rel_tol=0.005)


def test_spec_ratios_from_datasheets():
    r = ds.spec_ratios("a100-sxm", "h100-sxm")
    assert math.isclose(r["flops"], 989 / 312) and math.isclose(r["bandwidth"], 3.35 / 2.039)
    assert math.isclose(r["bytes_per_flop"], r["bandwidth"] / r["flops"])
    assert ds.spec_ratios("h100-sxm", "h200")["flops"] == 1.0
    assert math.isclose(ds.spec_ratios("h100-sxm", "h200")["capacity"], 141 / 80)


def test_gpus_to_fit():
    # 70B BF16 = 141.1 GB; the memory budget on driver-visible memory (0.9 of it, less activations,
    # graphs and non-torch memory) must leave a KV cache: four A100 (two leave 72.0 GB against 73.4 GB of
    # weights and measured overheads per GPU), two H100/H200, one B200
    assert [ds.gpus_to_fit("llama-3.1-70b", g) for g in ds.GENERATIONS] == [4, 2, 2, 1]
    for g in ds.GENERATIONS:
        n = ds.gpus_to_fit("llama-3.1-70b", g)
        assert Deployment("llama-3.1-70b", g, tp=n).budget.kv_cache_bytes > 0
    assert ds.gpus_to_fit("llama-3.1-70b", "h200", "fp8") == 1
    with pytest.raises(ValueError, match="does not fit"):
        ds.gpus_to_fit("llama-3.1-405b", "l4", max_gpus=4)


def test_gpus_for_batch_matches_kv_ceiling():
    n = ds.gpus_for_batch("llama-3.1-70b", "h100-sxm", 64, 4096)
    assert tput.kv_batch_ceiling(Deployment("llama-3.1-70b", "h100-sxm", tp=n), 4096) >= 64
    assert tput.kv_batch_ceiling(Deployment("llama-3.1-70b", "h100-sxm", tp=n // 2), 4096) < 64


def test_regimes_reduce_to_spec_ratios_in_their_limits():
    # long prompt on one GPU (no all-reduce): prefill compute-bound, speedup = FLOP ratio; tiny context:
    # batch-1 decode gains at most the bandwidth ratio (fixed per-step costs dilute it)
    old = ds.regime_row("llama-3.1-8b", "h100-sxm", 1, 1, 8192)
    new = ds.regime_row("llama-3.1-8b", "b200", 1, 1, 8192)
    s = ds.regime_speedups(old, new)
    ratios = ds.spec_ratios("h100-sxm", "b200")
    assert math.isclose(s["compute"], ratios["flops"], rel_tol=1e-6)
    assert 1 < s["bandwidth"] <= ratios["bandwidth"]
    assert s["capacity"] > 0


def test_capacity_speedup_second_method():
    # capacity tokens/s = B_max / t(B_max) from the budget and the step model directly
    row = ds.regime_row("llama-3.1-70b", "h200", 2, 4096, 1024)
    dep = Deployment("llama-3.1-70b", "h200", tp=2)
    b = dep.budget.max_concurrency(4096)
    assert row.capacity_batch == b
    assert math.isclose(row.capacity_tokens_per_s, b / tput.step_s_at(dep, b, 4096), rel_tol=1e-12)
    old = ds.regime_row("llama-3.1-70b", "h100-sxm", 2, 4096, 1024)
    assert (
        ds.regime_speedups(old, row)["capacity"] > ds.spec_ratios("h100-sxm", "h200")["bandwidth"]
    )


def test_regression_capacity_speedup_is_not_an_edge_artifact():
    # issue 9: 70B FP8 on one H100 held "1" sequence (datasheet GB x 0.9 - weights), so one more
    # sequence on the H200 read as a 27x speedup. The count now keeps its fraction (memory budget on
    # driver-visible memory), and the speedup moves smoothly with the memory utilization.
    rows = [ds.regime_row("llama-3.1-70b", g, 1, 4096, 4096, "fp8", memory_utilization=u)
            for u in (0.90, 0.905) for g in ("h100-sxm", "h200")]
    assert rows[0].capacity_batch != int(rows[0].capacity_batch)
    s1 = ds.regime_speedups(rows[0], rows[1])["capacity"]
    s2 = ds.regime_speedups(rows[2], rows[3])["capacity"]
    assert s2 < s1 and abs(s2 / s1 - 1) < 0.5  # continuous: a little more room, a little less speedup


def test_per_user_ceiling():
    # 3.35 TB/s / ((70.6e9 - 128,256 x 8,192 + 8,192) x 2 B) = 24.1 tokens/s: the one division,
    # with the embedding table read one row per step (128,256 x 8,192 = 1.05e9 not streamed)
    x = ds.per_user_decode_ceiling("llama-3.1-70b", "h100-sxm")
    streamed = model("llama-3.1-70b").params_total - 128_256 * 8_192 + 8_192
    assert math.isclose(x, 3.35e12 / (streamed * 2), rel_tol=1e-12)
    assert math.isclose(x, 3.35e12 / ((70.6e9 - 1.05e9) * 2), rel_tol=0.01)
    assert ds.per_user_decode_ceiling("llama-3.1-70b", "h100-sxm", context=8192) < x
    assert math.isclose(
        ds.per_user_decode_ceiling("llama-3.1-70b", "h100-sxm", tokens_per_weight_read=3), 3 * x
    )


def test_per_user_ceiling_moe_reads_active_experts():
    # Mixtral at batch 1 reads its 12.9B active parameters (Mistral AI), not all 46.7B, less the
    # 32,000 x 4,096 embedding table (0.13B) of which it reads one row
    x = ds.per_user_decode_ceiling("mixtral-8x7b", "h200")
    assert math.isclose(x, 4.8e12 / ((12.9e9 - 32_000 * 4_096) * 2), rel_tol=0.01)


def test_batch_for_aggregate_on_the_step_model():
    b = ds.batch_for_aggregate(2000, "llama-3.1-70b", "h100-sxm", 8, 2048)
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    assert math.isclose(b / tput.step_s_at(dep, b, 2048), 2000, rel_tol=1e-9)
    assert tput.tokens_per_s(dep, math.floor(b), 2048) < 2000 <= tput.tokens_per_s(dep, math.ceil(b), 2048)
    assert math.isinf(ds.batch_for_aggregate(1e9, "llama-3.1-70b", "h100-sxm", 8, 2048))


def test_headline_scenarios():
    rows = ds.headline_scenarios(300, "llama-3.1-70b", "h100-sxm", 1, 2048)
    first = rows[0]
    assert not first.fits  # 141 GB of BF16 weights on one 80 GB GPU
    assert math.isclose(
        first.tokens_per_s, ds.per_user_decode_ceiling("llama-3.1-70b", "h100-sxm", 1, "bf16", 2048)
    )
    names = [r.name for r in rows if r.meets(300)]
    assert "llama-3.1-8b FP8 (a smaller model)" in names
    # issue 9: the aggregate rows' KV counts are the memory budget's, with the fraction
    fp8 = next(r for r in rows if r.name.endswith("FP8, aggregate over a batch"))
    held = Deployment("llama-3.1-70b", "h100-sxm", weight_dtype="fp8").budget.max_concurrency(2048)
    assert f"KV holds {held:.2f}" in fp8.note
    with pytest.raises(ValueError, match="claim"):
        ds.headline_scenarios(0, "llama-3.1-70b", "h100-sxm")


def test_workload_bytes_per_flop():
    m = model("llama-3.1-70b")
    # batch 1, no context, BF16: 2 bytes for every parameter but the 128,256 x 8,192 embedding
    # table (looked up: one row of 8,192 per token) over 2 N_matmul FLOPs ~ 1 byte per FLOP
    streamed, row = m.params_total - 128_256 * 8_192, 8_192
    x = ds.decode_bytes_per_flop(m, 1, 0)
    assert math.isclose(x, 2 * (streamed + row) / m.weight_flops_per_token(), rel_tol=1e-12)
    assert 0.99 < x < 1.01
    batch = np.array([1, 2, 4])
    arr = ds.decode_bytes_per_flop(m, batch, 0)
    assert np.allclose(arr, 2 * (streamed / batch + row) / m.weight_flops_per_token(), rtol=1e-12)
    # GQA: 64 query heads share 8 KV heads, so MHA would cache 8x the bytes
    assert ds.kv_bytes_per_token_mha(m) == 8 * m.kv_bytes_per_token()
    with pytest.raises(ValueError, match="batch"):
        ds.decode_bytes_per_flop(m, 0, 0)


def test_regression_speculation_credits_the_kv_read_too():
    # issue 9: a verify pass reads each sequence's KV once for all its positions, so tau tokens per
    # pass divide the KV term as well as the weight term (not the weights only)
    m = model("llama-3.1-70b")
    tau = 3.0
    with_spec = ds.decode_bytes_per_flop(m, 64, 4096, "fp8", "fp8", tau)
    w = ds.weight_bytes_streamed(m, "fp8")
    row = ds.lookup_bytes_read(m, 1, "fp8")
    by_hand = (w / (64 * tau) + row + 4096 * m.kv_bytes_per_token("fp8") / tau) / m.flops_per_token(4096)
    assert math.isclose(with_spec, by_hand, rel_tol=1e-12)


def test_regression_fp8_demand_against_fp8_supply():
    # issue 9: FP8 demand was divided by BF16 supply. The matmul dtype of FP8 weights is FP8 where the
    # chip has it (H100: 1,979 dense FP8 TFLOP/s, NVIDIA datasheet), so the like-for-like gap stays put
    assert ds.matmul_dtype("fp8", "h100-sxm") == "fp8" and ds.matmul_dtype("fp8", "a100-sxm") == "bf16"
    assert ds.matmul_dtype("int4", "h100-sxm") == "bf16"
    m = model("llama-3.1-70b")
    g16 = ds.decode_bytes_per_flop(m, 64, 4096) / ds.bytes_per_flop("h100-sxm", "bf16")
    g8 = ds.decode_bytes_per_flop(m, 64, 4096, "fp8", "fp8") / ds.bytes_per_flop("h100-sxm", "fp8")
    assert abs(g8 / g16 - 1) < 0.01


def test_hbm_and_shoreline():
    # JEDEC HBM3: 6.4 Gb/s x 1024 pins / 8 = 819.2 GB/s per stack
    assert math.isclose(ds.hbm_stack_bandwidth(6.4), 819.2e9)
    # H100: 3.35 TB/s over 5 stacks x 1024 bits = 5.23 Gb/s per pin
    assert math.isclose(ds.implied_pin_rate_gbps("h100-sxm"), 3.35e12 * 8 / 5120 / 1e9)
    assert ds.stacks_on_shoreline(33, 11, 2) == 6
    assert math.isclose(ds.shoreline_bandwidth_per_die(6.4), 6 * 819.2e9)
    with pytest.raises(ValueError, match="stack count"):
        ds.implied_pin_rate_gbps("l4")
