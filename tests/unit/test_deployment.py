"""The Deployment record: validated once, with messages that name the input and what is allowed."""

import pytest

from lib.perf import memory
from lib.perf.deployment import Deployment, deployment, tp_shards


def test_defaults_resolved_from_data():
    d = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    assert d.memory_utilization == memory.default_memory_utilization()
    assert d.block_size == memory.fact("block_size")
    assert (d.max_num_batched_tokens, d.max_num_seqs) == memory.default_batch_limits("h100-sxm")
    assert Deployment("deepseek-v3", "h200", tp=8, weight_dtype="fp8").block_size == memory.fact(
        "mla_block_size_flashmla")
    assert d.n_gpus == 8 and d.label == "llama-3.1-70b bf16 on 8x h100-sxm (TP8)"


def test_budget_is_the_memory_budget():
    d = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    b = memory.memory_budget("llama-3.1-70b", "h100-sxm", 8)
    assert d.budget.num_blocks == b.num_blocks
    assert d.replace(kv_dtype="fp8").budget.num_blocks == pytest.approx(2 * b.num_blocks, rel=0.01)


@pytest.mark.parametrize("fields, match", [
    (dict(model="llama-9"), "model must be one of"),
    (dict(gpu="h900"), "gpu must be one of"),
    (dict(tp=3), "tp=3 cannot shard"),
    (dict(tp=0), "tp"),
    (dict(pp=100), "pp=100 cannot exceed"),
    (dict(ep=2), "expert parallelism is not modelled"),
    (dict(tp=12, model="gpt3-175b"), "tp=12 spans nodes of 8"),
    (dict(gpu="l40s", tp=16), "no network"),
    (dict(model="llama-3.1-8b", tp=1, compute_dtype="fp8"), "quantize the weights too"),
    (dict(memory_utilization=1.0), "run out of memory at peak"),
    (dict(kv_dtype="fp6"), "kv_dtype must be one of"),
    (dict(gpu="a100-sxm", compute_dtype="fp8"), "compute_dtype"),
    (dict(tp=1), "no room for a KV cache"),
    (dict(memory_utilization=1.5), "memory_utilization"),
    (dict(cuda_graphs="yes"), "cuda_graphs"),
])
def test_bad_fields_are_named(fields, match):
    base = dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8) | fields
    with pytest.raises(ValueError, match=match):
        Deployment(**base)


def test_replace_validates_and_names_unknown_fields():
    d = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    with pytest.raises(ValueError, match="tp=6"):
        d.replace(tp=6)
    with pytest.raises(ValueError, match="unknown Deployment field"):
        d.replace(batch=4)


def test_tp_rule_matches_vllm():
    assert tp_shards("llama-3.1-70b", 16)  # 16 divides 64 heads, multiple of 8 KV heads
    assert not tp_shards("llama-3.1-70b", 3)
    assert tp_shards("deepseek-v3", 8)
