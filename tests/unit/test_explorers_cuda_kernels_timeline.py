"""The decode step as three timeline rows (lib.perf.gaps.timeline_rows, I038) and the explorers of
lib.explorers.cuda_kernels_timeline. The rows are a view of lib.perf.step: their ledger regroups the
step's own buckets (internal consistency), the idle time is checked by an interval union, and each
GEMV's own bandwidth fraction against its closed form from the shape."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lib.book import widgets
from lib.explorers import cuda_kernels_timeline as ckt
from lib.perf import gaps
from lib.perf import step as stp
from lib.perf.deployment import Deployment

DENSE = ("llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "qwen2.5-72b")


def _dep(key, gpu, tp, graphs):
    try:
        return Deployment(key, gpu, tp=tp, cuda_graphs=graphs)
    except ValueError:  # weights that do not fit, or heads tp cannot shard
        return None


def _union(spans):
    covered, reach = 0.0, -1.0
    for a0, a1 in sorted((s.start_s, s.end_s) for s in spans):
        if a1 > reach:
            covered += a1 - max(a0, reach)
            reach = a1
    return covered


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(DENSE), st.sampled_from(["h100-sxm", "h200", "b200", "mi300x"]), st.sampled_from([1, 2, 4, 8]),
       st.integers(1, 64), st.integers(0, 16384), st.booleans())
def test_ledger_regroups_the_step(key, gpu, tp, batch, context, graphs):
    dep = _dep(key, gpu, tp, graphs)
    assume(dep is not None)
    context = min(context, dep.mdl.max_position_embeddings)
    tl = gaps.timeline_rows(dep, batch, context)
    s = stp.decode_step(dep, batch, context)
    led = tl.ledger
    assert list(led) == [k for k, _, _ in gaps.TIMELINE_LEDGER]
    assert math.isclose(sum(led.values()), s.total_s, rel_tol=1e-12)
    assert math.isclose(led["floor"], s["weights"] + s["kv_cache"], rel_tol=1e-12)
    assert math.isclose(led["dependency_gaps"] + led["launch_bound"], s["launch_gaps"], rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(led["collectives"], s.collective_s, rel_tol=1e-12, abs_tol=1e-18)
    fixed = stp.step_assumptions().kernel_fixed_s
    n_big = sum(e.category in ("gemm", "attention") for e in tl.trace.events)
    n_small = sum(e.category in ("elementwise", "sampling") for e in tl.trace.events)
    assert math.isclose(led["big_fixed"], n_big * fixed, rel_tol=1e-9)
    assert led["tiny_kernels"] >= n_small * fixed * (1 - 1e-12)
    assert all(v >= 0 for v in led.values()), led
    if graphs:
        assert led["launch_bound"] == 0.0
    assert math.isclose(sum(tl.row_total_s(r) for r in gaps.TIMELINE_ROWS) + led["floor"], s.total_s, rel_tol=1e-12)
    # the achieved fraction is the floor over the step; at TP 1 that is the step's MBU
    assert math.isclose(tl.achieved_fraction, led["floor"] / s.total_s, rel_tol=1e-12)
    if tp == 1:
        assert math.isclose(tl.achieved_fraction, s.mbu, rel_tol=1e-9)
    # independent: idle GPU by an interval union of the GPU and NCCL rows = the ledger's idle items
    kernels = [sp for sp in tl.rows["gpu"] + tl.rows["comm"] if sp.kind != "memcpy"]
    idle = led["dependency_gaps"] + led["launch_bound"] + led["scheduler"] + led["token_sync"]
    assert math.isclose(s.total_s - _union(kernels), idle, rel_tol=1e-9, abs_tol=1e-12)
    # the kernels never overlap on one stream
    assert math.isclose(_union(kernels), sum(sp.duration_s for sp in kernels), rel_tol=1e-12)


def test_cpu_row_launches():
    dep = Deployment("llama-3.1-8b", "h100-sxm", tp=1, cuda_graphs=False)
    eager = gaps.timeline_rows(dep, 1, 1024)
    graph = gaps.timeline_rows(dep.replace(cuda_graphs=True), 1, 1024)
    launches = [s for s in eager.rows["cpu"] if s.kind == "launch"]
    assert len(launches) == len(eager.trace.events)
    a = stp.step_assumptions()
    # kernel i cannot start before its launch call has returned (the step model's issue times)
    for s, e in zip(launches, eager.trace.events, strict=True):
        assert e.start_s >= s.end_s - 1e-15
        assert math.isclose(s.duration_s, a.eager_launch_s)
    g_launch = [s for s in graph.rows["cpu"] if s.kind == "launch"]
    assert len(g_launch) == 1 and g_launch[0].duration_s == 0.0
    assert graph.step_s < eager.step_s
    assert eager.ledger["launch_bound"] > 0
    assert math.isclose(eager.step_s - graph.step_s, eager.ledger["launch_bound"] - graph.ledger["launch_bound"]
                        + eager.ledger["dependency_gaps"] - graph.ledger["dependency_gaps"], rel_tol=1e-9)


def test_gemv_fraction_closed_form():
    # gate/up of Llama 3.1 70B at TP 2 on H200: bytes / (fixed + bytes / (eta W)) / W, written out
    dep = Deployment("llama-3.1-70b", "h200", tp=2)
    tl = gaps.timeline_rows(dep, 8, 4096)
    a = stp.step_assumptions()
    i = next(i for i, e in enumerate(tl.trace.events) if e.name == "gate_up_proj")
    b = 2 * 8192 * 28672 * 2 / 2
    W = 4.8e12
    assert math.isclose(tl.event_bytes[i], b, rel_tol=1e-12)
    assert math.isclose(tl.kernel_fraction(i), (b / W) / (a.kernel_fixed_s + b / (a.gemv_efficiency * W)), rel_tol=1e-9)
    assert tl.achieved_fraction < tl.big_kernel_fraction() < a.gemv_efficiency


def test_launch_rates():
    dep = Deployment("llama-3.1-70b", "h200", tp=4, cuda_graphs=False)
    tl = gaps.timeline_rows(dep, 1, 1024)
    r = gaps.launch_rates(tl)
    assert r["cpu_issue"] == pytest.approx(1 / stp.step_assumptions().eager_launch_s)
    assert r["kernels"] == len(tl.trace.events)
    assert 0 < r["short_kernels"] < r["kernels"]
    # a GPU that would retire kernels faster than the CPU issues them shows launch-bound gaps
    assert r["gpu_consume"] > r["cpu_issue"] and tl.ledger["launch_bound"] > 0


def test_row_total_refuses_unknown_row():
    tl = gaps.timeline_rows(Deployment("llama-3.1-8b", "h100-sxm"), 1, 16)
    with pytest.raises(ValueError, match="row must be one of"):
        tl.row_total_s("nccl")


def test_step_timeline_view():
    v = widgets.render("cuda_kernels.step_timeline", model="llama-3.1-70b", gpu="h200", tp=2, batch=8, context=4096,
                       cuda_graphs=True, layers=2)
    assert isinstance(v, widgets.View), v
    s = stp.decode_step(Deployment("llama-3.1-70b", "h200", tp=2), 8, 4096)
    assert v.values["step_ms"] == pytest.approx(s.total_s * 1e3, rel=1e-12)
    assert v.values["other_ms"] > v.values["step_ms"]  # eager is slower
    assert v.caption and "<svg" in v.svg()
    builds = ckt._TIMELINE_FIGURE.builds
    v2 = widgets.render("cuda_kernels.step_timeline", model="llama-3.1-8b", gpu="h100-sxm", tp=1, batch=1, context=512,
                        cuda_graphs=False, layers=1)
    v2.svg()
    assert ckt._TIMELINE_FIGURE.builds == builds  # the one live figure is updated, not rebuilt


def test_step_timeline_refuses_a_batch_the_pool_cannot_hold():
    v = widgets.render("cuda_kernels.step_timeline", model="llama-3.1-70b", gpu="h200", tp=2, batch=256,
                       context=131072, cuda_graphs=True, layers=1)
    assert isinstance(v, widgets.ErrorView) and "KV pool holds" in v.message


def test_window_covers_the_layers():
    tl = gaps.timeline_rows(Deployment("llama-3.1-8b", "h100-sxm"), 1, 256)
    one, two = ckt.window_end_s(tl.trace, 1), ckt.window_end_s(tl.trace, 2)
    assert tl.trace.host_end_s < one < two < tl.step_s
    assert ckt.window_end_s(tl.trace, 10_000) == tl.step_s
