"""lib.fleet.rag: encoder FLOPs against BERT-large's published size, the fan-out quantile against Monte Carlo,
index sharding, the latency budget and the cache's effect on the answer tier."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import rag
from lib.fleet.sizing_chain import serving_deployment
from lib.registry.hardware import gpu


def test_encoder_shape_is_bert_large():
    # BERT-large: 340M parameters (Devlin et al. 2019); matmuls 12 L d^2 plus ~32M of embeddings
    total = rag.encoder_matmul_params() + (30522 + 512 + 2) * 1024
    assert total == pytest.approx(340e6, rel=0.03)
    assert rag.encoder_flops_per_token(1) == pytest.approx(2 * 12 * 24 * 1024**2 + 4 * 24 * 1024)


def test_encoder_fleet_arithmetic():
    f = rag.encoder_fleet("reranker", 1e6, 320, "h100-sxm", mfu=0.5, utilization=0.5)
    want = 1e6 * rag.encoder_flops_per_token(320) / (gpu("h100-sxm").peak_flops("bf16") * 0.5) / 0.5
    assert f.gpus_exact == pytest.approx(want) and f.gpus == math.ceil(want)
    assert rag.encoder_fleet("embedder", 0.0, 32, "l4").gpus == 0


def test_encoder_pass_weight_read_floor():
    one = rag.encoder_pass_s(1, 1, "h100-sxm")
    assert one == pytest.approx(2 * rag.encoder_matmul_params() / gpu("h100-sxm").memory_bandwidth)
    assert rag.encoder_pass_s(100_000, 320, "h100-sxm") > one


@pytest.mark.parametrize("shards,q", [(1, 0.99), (8, 0.99), (32, 0.95), (4, 0.999)])
def test_fanout_against_monte_carlo(shards, q):
    sigma = math.log(0.02 / 0.005) / 2.3263478740408408
    draws = np.random.default_rng(1).lognormal(math.log(0.005), sigma, (400_000, shards)).max(axis=1)
    assert rag.fanout_quantile_s(shards, q, 0.005, 0.02) == pytest.approx(np.quantile(draws, q), rel=0.03)


def test_fanout_one_shard_is_its_quantile():
    assert rag.fanout_quantile_s(1, 0.99, 0.005, 0.02) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="p99_s"):
        rag.fanout_quantile_s(2, 0.99, 0.02, 0.01)


def test_index_fleet():
    ix = rag.index_fleet(3000, 1e9, 1000, shard_bytes=128e9, qps_per_replica=1000, utilization=0.7)
    assert ix.shards == 8 and ix.replicas_per_shard == math.ceil(3000 / 1000 / 0.7) and ix.hosts == 8 * 5


@pytest.fixture(scope="module")
def dep():
    return serving_deployment("llama-3.1-70b", "b200", 1, "fp8")


def _fleet(dep, **kw):
    args = dict(rate=10000.0, hit_rate=0.7, query_tokens=32, candidates=50, pair_tokens=320, prompt_len=2000,
                cached_len=500, output_len=200, tpot_target_s=0.05, ttft_budget_s=1.0, n_vectors=1e9,
                bytes_per_vector=1000.0, encoder_gpu="h100-sxm") | kw
    return rag.rag_fleet(dep, **args)


def test_budget_and_miss_scaling(dep):
    f = _fleet(dep)
    assert f.llm_ttft_s == pytest.approx(1.0 - sum(s for _, s in f.stages))
    assert f.llm.rate == pytest.approx(3000) and f.pairs_per_s == pytest.approx(150_000)
    assert f.embedder.tokens_per_s == pytest.approx(320_000)  # every query is embedded, hit or miss
    with pytest.raises(ValueError, match="budget"):
        _fleet(dep, ttft_budget_s=0.03)


def test_hit_rate_for_nodes(dep):
    f = _fleet(dep, hit_rate=0.0)
    n0 = f.llm_nodes
    h = rag.hit_rate_for_nodes(f, round(0.3 * n0))
    assert f.llm.at_rate(10000 * (1 - h)).nodes <= round(0.3 * n0) < f.llm.at_rate(10000 * (1 - h + 2e-4)).nodes
    assert rag.hit_rate_for_nodes(f, n0) == 0.0


@settings(max_examples=15, deadline=None)
@given(st.floats(0.0, 0.9), st.floats(0.01, 0.05))
def test_more_hits_never_more_nodes(dep, h, dh):
    a, b = _fleet(dep, hit_rate=h), _fleet(dep, hit_rate=h + dh)
    assert b.llm_nodes <= a.llm_nodes and b.reranker.gpus <= a.reranker.gpus and b.index.hosts <= a.index.hosts
