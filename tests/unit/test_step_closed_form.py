"""The decode step prices each distinct kernel once and places the launches in closed form
(:func:`lib.perf.step.launch_starts`); the oracle here walks every launch one by one with
:func:`lib.perf.step.kernel_start`, as a profiler would see them, and must agree on every bucket,
byte count and event."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import deployment
from lib.perf.step import (
    BUCKETS,
    decode_step,
    kernel_start,
    kernel_time_s,
    step_assumptions,
    step_kernels,
)


def walk(dep, batch, context, a, q):
    """Launch by launch: (buckets, weight bytes, KV bytes, events)."""
    bw, peak = dep.chip.memory_bandwidth, dep.chip.peak_flops(dep.compute_dtype) * a.matmul_efficiency
    b = dict.fromkeys(BUCKETS, 0.0)
    b["sampling"], b["scheduler"] = a.sampling_s, a.scheduler_s
    prev_end = cpu = a.sampling_s + a.scheduler_s
    w = kv = 0.0
    events = [("host", "host", 0.0, prev_end)]
    for i, k in enumerate(step_kernels(dep, batch, context, a, q)):
        if k.category == "collective":
            dur = k.collective_latency_s + k.collective_bandwidth_s
            b["allreduce_latency"] += k.collective_latency_s
            b["allreduce_bandwidth"] += k.collective_bandwidth_s
        else:
            eff = a.kv_efficiency if k.category == "attention" else a.gemv_efficiency
            mem = (k.weight_bytes + k.kv_bytes + k.other_bytes) / (bw * eff)
            comp = k.flops / peak
            dur = kernel_time_s(a.kernel_fixed_s, mem, comp)
            b["weights"] += k.weight_bytes / bw
            b["kv_cache"] += k.kv_bytes / bw
            short = mem - (k.weight_bytes + k.kv_bytes) / bw
            b["kv_bandwidth_shortfall" if k.category == "attention" else "weight_bandwidth_shortfall"] += short
            b["compute_excess"] += max(0.0, comp - mem)
            b["kernel_fixed"] += a.kernel_fixed_s
            w += k.weight_bytes
            kv += k.kv_bytes
        start, cpu = kernel_start(prev_end, cpu, i == 0, dep.cuda_graphs, a)
        b["launch_gaps"] += start - prev_end
        events.append((k.name, k.category, start, dur))
        prev_end = start + dur
    return b, w, kv, events


CASES = [
    ("llama-3.1-70b", "h100-sxm", 8, 1), ("llama-3.1-8b", "a100-sxm", 1, 1), ("mixtral-8x7b", "mi300x", 2, 1),
    ("deepseek-v3", "h200", 8, 2), ("llama-3.1-405b", "b200", 8, 2), ("llama-3.2-1b", "l40s", 1, 1),
]


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), graphs=st.booleans(), batch=st.integers(1, 256),
       context=st.integers(0, 8192), q=st.integers(1, 8), eager_us=st.floats(0.0, 40.0))
def test_closed_form_matches_the_launch_walk(case, graphs, batch, context, q, eager_us):
    name, chip, tp, pp = case
    dep = deployment(name, chip, tp=tp, pp=pp, cuda_graphs=graphs)
    a = step_assumptions(eager_launch_s=eager_us * 1e-6)
    s = decode_step(dep, batch, context, assume=a, timeline=True, query_tokens=q)
    b, w, kv, events = walk(dep, batch, context, a, q)
    for k in BUCKETS:
        assert s.buckets[k] == pytest.approx(b[k], rel=1e-9, abs=1e-15), k
    assert s.weight_bytes_per_gpu * pp == pytest.approx(w, rel=1e-12)
    assert s.kv_bytes_per_gpu * pp == pytest.approx(kv, rel=1e-12)
    assert len(s.events) == len(events)
    for got, want in zip(s.events, events, strict=True):
        assert got[:2] == want[:2]
        assert got[2] == pytest.approx(want[2], rel=1e-9, abs=1e-15)
        assert got[3] == pytest.approx(want[3], rel=1e-12)
    assert math.isclose(s.total_s, events[-1][2] + events[-1][3], rel_tol=1e-9)

