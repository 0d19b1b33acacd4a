"""lib.attention.context_parallel: capacity in groups, prefill over context-parallel groups, the ring's cost."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention.context_parallel import groups_to_hold, ring_prefill
from lib.perf import memory
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.registry.models import model


def test_one_group_is_the_books_prefill_time():
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    for ctx in (4096, 131072, 2**20):
        assert ring_prefill(dep.mdl, dep.chip, ctx, 1, 8).ttft_s == pytest.approx(prefill_time(dep, ctx).time_s,
                                                                                   rel=1e-12)


def test_groups_to_hold_is_the_smallest_that_fits():
    m = model("llama-3.1-70b")
    mha = dataclasses.replace(m, key="llama-3.1-70b-mha", num_kv_heads=m.num_attention_heads)
    for mdl in (m, mha):
        budget = memory.memory_budget(mdl, "h100-sxm", 8)
        for ctx in (1000, 2**17, 2**20, 3 * 2**20):
            c = groups_to_hold(budget, ctx)
            assert c * budget.token_capacity >= ctx > (c - 1) * budget.token_capacity  # brute-force definition
    # 1M tokens of Llama 3.1 70B (320 GiB of KV) fit one 8-GPU node; as MHA (2.5 TiB) they need 8 nodes
    assert groups_to_hold(memory.memory_budget(m, "h100-sxm", 8), 2**20) == 1
    assert groups_to_hold(memory.memory_budget(mha, "h100-sxm", 8), 2**20) == 8


@settings(max_examples=40, deadline=None)
@given(cp=st.sampled_from([1, 2, 4, 8, 16]), tp=st.sampled_from([1, 2, 4, 8]),
       ctx=st.integers(2**12, 2**21), kv=st.sampled_from(["bf16", "fp8"]))
def test_split_conserves_work_and_bytes(cp, tp, ctx, kv):
    m = model("llama-3.1-70b")
    one = ring_prefill(m, "h100-sxm", ctx, 1, tp, kv_dtype=kv)
    r = ring_prefill(m, "h100-sxm", ctx, cp, tp, kv_dtype=kv)
    assert r.compute_s * cp == pytest.approx(one.compute_s, rel=1e-12)  # FLOPs split evenly
    assert r.weight_read_s == one.weight_read_s  # every group reads its whole TP shard
    # the K/V a GPU passes per layer and hop: its share of the request's cache, one chunk of cp
    per_gpu_layer = memory.kv_bytes_per_sequence(m, math.ceil(ctx / cp) * cp, kv) / m.num_layers
    assert r.chunk_bytes * cp == pytest.approx(per_gpu_layer * memory.kv_placement(m, tp, kv).bytes_per_token_per_gpu
                                               / m.kv_bytes_per_token(kv), rel=1e-9)
    # hop compute over all GPUs, layers and the cp blocks (local + cp - 1 received) = all attention
    rate = 989e12 * 0.6
    attention = (m.prefill_flops(ctx) - ctx * m.weight_flops_per_token()) / rate
    assert r.hop_compute_s * cp * tp * m.num_layers * cp == pytest.approx(attention, rel=1e-9)
    assert r.exposed_ring_s >= 0 and (r.exposed_ring_s == 0) == (r.ring_hidden or cp == 1)


def test_a_slow_ring_is_exposed_and_a_fast_one_hidden():
    # short context over the network: the sends outlast the little attention each hop overlaps
    slow = ring_prefill("llama-3.1-70b", "h100-sxm", 8192, 8, 8)
    assert slow.fabric == "network" and not slow.ring_hidden and slow.exposed_ring_s > 0
    fast = ring_prefill("llama-3.1-70b", "h100-sxm", 2**20, 8, 8)
    assert fast.ring_hidden and fast.exposed_ring_s == 0
    inside = ring_prefill("llama-3.1-70b", "h100-sxm", 2**20, 2, 4)
    assert inside.fabric == "NVLink"  # 2 groups of 4 stay inside one 8-GPU node


def test_meta_context_parallel_million_token_prefill():
    # Yang et al., 'Context Parallelism for Scalable Million-Token Inference' (arXiv:2411.01783):
    # Llama 3 405B, 1M-token prefill in 77 s on 16 nodes x 8 H100 (CP16 x TP8) at 63% FLOPS utilization.
    r = ring_prefill("llama-3.1-405b", "h100-sxm", 2**20, 16, 8, mfu=0.63)
    assert r.ring_hidden
    assert r.ttft_s == pytest.approx(77, rel=0.15)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cp": 0}, "cp"),
    ({"tp": 3}, "tp=3 must divide"),
    ({"context": 4, "cp": 8}, "at least one token each"),
    ({"mfu": 1.5}, "mfu"),
])
def test_bad_inputs_are_refused(kwargs, match):
    args = {"mdl": "llama-3.1-70b", "chip": "h100-sxm", "context": 2**20, "cp": 2, "tp": 8} | kwargs
    with pytest.raises(ValueError, match=match):
        ring_prefill(**args)
