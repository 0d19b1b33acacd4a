"""lib.kernels.compile_stages (N005): the block's operations against a real Dynamo/AOTAutograd trace, Inductor's
kernel plan against the H200 profile, the call model's period against max(host, GPU), and the recompile model
against real Dynamo (a recording backend on the CPU)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import compile_stages as cs
from lib.perf.step import step_assumptions
from lib.registry import assumptions
from lib.registry.measured import measured

VIEWS = {"permute", "t", "transpose", "view", "alias", "detach", "expand"}


@pytest.fixture(scope="module")
def demo():
    return cs.trace_demo()


def test_the_recorded_trace_is_the_trace_the_installed_torch_gives(demo):
    """The page reads data/recorded-trace-demo.json at its defaults; a torch upgrade that changes the trace
    fails here (regenerate with record_trace_demo())."""
    import dataclasses

    recorded = cs.recorded_trace_demo()
    assert recorded is not None, "data/recorded-trace-demo.json is missing or from another torch: run record_trace_demo()"
    fresh = dataclasses.replace(demo, seconds=0.0)
    assert recorded == fresh, "the recorded trace is stale: run lib.kernels.compile_stages.record_trace_demo()"
    assert cs.trace_or_record() == recorded  # the defaults read the record
    assert cs.trace_or_record(live=True).dynamo_ops == recorded.dynamo_ops  # live=True traces again


def test_tracing_first_leaves_the_triton_kernels_runnable():
    """Importing Dynamo imports triton; if that came before lib.kernels.triton_env chose the interpreter, every
    interpreted kernel of the book failed afterwards ("Cannot call @triton.jit'd outside of the scope of a
    kernel"). A fresh process, as a notebook or a test worker that traces first would be."""
    import subprocess
    import sys

    code = ("from lib.kernels.compile_stages import trace_demo; trace_demo(d=8, f=16, batch=2, sweep=2); import torch; "
            "from lib.kernels import rowwise; y = rowwise.softmax(torch.rand(2, 8)); "
            "assert torch.allclose(y.sum(-1), torch.ones(2)), y")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- the block against the real trace --------------------------------------------------------------------------


def test_block_ops_are_the_aten_graph_dynamo_and_aot_capture(demo):
    """Independent oracle: torch's own trace of the same block (CPU, torch 2.13) lists the same aten ops."""
    block = cs.mlp_block(demo.d, demo.f, demo.batch, demo.dtype)
    traced = [t for t in demo.inference_ops if t not in VIEWS]
    assert traced == [op.target for op in block.compute_ops]
    assert [t for t in demo.forward_ops if t not in VIEWS] == traced  # the training forward computes the same


def test_dynamo_captures_one_graph_and_the_item_check_breaks_it_in_two(demo):
    assert (demo.dynamo_graphs, demo.dynamo_breaks) == (1, 0)
    assert (demo.break_graphs, demo.break_breaks) == (2, 1)
    # the same reason the H200 run (torch 2.11) reported
    assert demo.break_reason == measured("compile_stages.inductor_graph_break.break_reasons")[0]
    assert cs.mlp_block(64, 224, 8, graph_break=True).graphs == 2
    guarded = {name for name, kind in demo.guards if kind == "TENSOR_MATCH"}
    assert {"L['x']", "L['w1']", "L['w3']", "L['w2']", "L['g']"} <= guarded


def test_closure_weights_are_not_static_and_parameters_are(demo):
    """What CUDA-graph trees would copy: none of the closure weights is a static input; the four parameters
    (graph inputs 1-4, after x) are."""
    assert demo.closure_static == ()
    assert demo.parameter_static == (1, 2, 3, 4)


def test_the_forward_keeps_tensors_for_a_backward_that_runs_the_matmuls_again(demo):
    assert demo.saved_tensors > 0
    assert demo.backward_ops.count("mm") == 6  # two per projection: the input's gradient and the weight's


def test_recompile_model_matches_real_dynamo_on_the_sweep(demo):
    for mode, got in (("false", demo.compiles_false), ("auto", demo.compiles_auto)):
        want = tuple(int(e == "compile") for e in cs.compile_events(demo.sweep, mode))
        assert got == want, mode


@settings(max_examples=6, deadline=None)
@given(shapes=st.lists(st.integers(1, 6), min_size=1, max_size=9), mode=st.sampled_from(cs.DYNAMIC),
       limit=st.integers(1, 4))
def test_recompile_model_against_real_dynamo(shapes, mode, limit):
    """Oracle: a counting backend under torch.compile, the same shapes in the same order, the same limit."""
    import logging

    import torch
    import torch._dynamo as dynamo

    compiled = [0]

    def backend(gm, example_inputs):
        compiled[0] += 1
        return gm.forward

    def fn(x):
        return x * 2.0 + 1.0

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    dynamo.reset()
    with dynamo.config.patch(recompile_limit=limit):
        f = torch.compile(fn, backend=backend, dynamic={"false": False, "auto": None, "true": True}[mode])
        got = []
        for n in shapes:
            before = compiled[0]
            f(torch.ones(n, 3))
            got.append(compiled[0] - before)
    dynamo.reset()
    want = [int(e == "compile") for e in cs.compile_events(shapes, mode, limit)]
    assert got == want


def test_compile_events_limit_and_fallback():
    ev = cs.compile_events(range(1, 13), "false")
    assert ev.count("compile") == cs.recompile_limit() == assumptions.value("compile_stages.recompile_limit") == 8
    assert ev[8:] == ("eager",) * 4
    assert cs.compile_events([3, 3, 3], "false") == ("compile", "hit", "hit")
    assert cs.compile_events([4, 8, 2, 1, 12], "auto") == ("compile", "compile", "hit", "compile", "hit")
    assert cs.compile_events([4, 8, 2, 1, 12], "true") == ("compile", "hit", "hit", "compile", "hit")
    with pytest.raises(ValueError, match="dynamic must be one of"):
        cs.compile_events([1], "maybe")


def test_recompile_limit_matches_the_h200_run_and_this_torch():
    import torch._dynamo.config as config

    assert measured("compile_stages.recompile_limit") == cs.recompile_limit() == config.recompile_limit


# ---- Inductor's kernels against the H200 profile ----------------------------------------------------------------


def _triton_names(case: str) -> list[str]:
    return [n.rsplit("_", 1)[0] for n, _ in measured(f"compile_stages_probe.{case}.gpu_events_us") if n.startswith("triton")]


def test_inductor_kernel_names_match_the_h200_profile():
    """Anchor: the Triton kernels Inductor generated on the H200 (torch 2.11), names without their index."""
    plain = [k.name for k in cs.inductor_kernels(cs.mlp_block(4096, 14336, 8)) if k.kind == "triton"]
    assert plain == _triton_names("inductor_module")
    broken = [k.name for k in cs.inductor_kernels(cs.mlp_block(4096, 14336, 8, graph_break=True)) if k.kind == "triton"]
    assert broken == _triton_names("graph_break")


def test_kernel_counts_match_the_h200_run_plus_cublas_split_k():
    """The profiler counted 15 (eager), 6 (Inductor) and 8 (graph break) kernels; cuBLAS ran the down
    projection split-K, one GEMM and one reduce kernel, which the model counts as one call."""
    split_k = sum("splitKreduce" in n for n, _ in measured("compile_stages_probe.inductor_module.gpu_events_us"))
    assert split_k == 1
    block, broken = cs.mlp_block(4096, 14336, 8), cs.mlp_block(4096, 14336, 8, graph_break=True)
    count = lambda ks: sum(k.is_kernel for k in ks)  # noqa: E731
    assert count(cs.eager_kernels(block)) + split_k == measured("compile_stages.eager.kernels_per_call")
    assert count(cs.inductor_kernels(block)) + split_k == measured("compile_stages.module_inductor.kernels_per_call")
    assert count(cs.inductor_kernels(broken)) + split_k == measured("compile_stages.inductor_graph_break.kernels_per_call")


@settings(max_examples=40, deadline=None)
@given(d=st.integers(1, 512), f=st.integers(1, 2048), batch=st.integers(1, 64), dtype=st.sampled_from(cs.DTYPES),
       brk=st.booleans())
def test_inductor_plan_covers_every_op_once_and_moves_fewer_bytes(d, f, batch, dtype, brk):
    block = cs.mlp_block(d, f, batch, dtype, brk)
    eager, fused = cs.eager_kernels(block), cs.inductor_kernels(block)
    covered = [n for k in fused if k.kind != "copy" for n in k.ops]
    assert sorted(covered) == sorted(op.name for op in block.ops)
    assert sum(k.is_kernel for k in fused) < sum(k.is_kernel for k in eager)
    assert sum(k.bytes for k in fused) <= sum(k.bytes for k in eager)
    assert sum(k.flops for k in fused) == sum(k.flops for k in eager) == block.matmul_flops
    # the weights are read once by both
    assert sum(k.read_bytes for k in fused if k.kind == "cublas") >= block.weight_bytes - block.tensor("g").bytes


def test_weight_bytes_and_model_shapes():
    block = cs.block_for_model("llama-3.1-8b", 8)
    assert (block.d, block.f) == (4096, 14336)  # meta-llama/Llama-3.1-8B config.json
    assert block.weight_bytes == (3 * 4096 * 14336 + 4096) * 2
    with pytest.raises(ValueError, match="mixture of experts"):
        cs.block_for_model("mixtral-8x7b", 8)
    assert len(cs.mlp_block(8, 8, 1, "fp32").compute_ops) == len(cs.mlp_block(8, 8, 1, "bf16").compute_ops) - 2


# ---- the call model ------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(durations=st.lists(st.floats(1e-7, 1e-4), min_size=1, max_size=12), launch=st.floats(1e-7, 5e-5),
       gap=st.floats(0, 2e-6), entry=st.floats(0, 5e-5), graph=st.booleans())
def test_period_is_max_of_host_and_gpu_without_a_sync(durations, launch, gap, entry, graph):
    a = step_assumptions(eager_launch_s=launch, launch_gap_s=gap)
    seg = cs.Segment(entry, graph=tuple(durations)) if graph else cs.Segment(entry, eager=tuple(durations))
    host = entry + seg.launches * launch
    gpu = sum(durations) + len(durations) * gap
    assert math.isclose(cs.call_period_s([seg], a, calls=12), max(host, gpu), rel_tol=1e-9, abs_tol=1e-15)


@settings(max_examples=40, deadline=None)
@given(first=st.lists(st.floats(1e-7, 1e-4), min_size=1, max_size=4),
       second=st.lists(st.floats(1e-7, 1e-4), min_size=1, max_size=8), launch=st.floats(1e-7, 5e-5),
       sync=st.floats(0, 3e-5))
def test_a_sync_makes_host_and_gpu_take_turns(first, second, launch, sync):
    a = step_assumptions(eager_launch_s=launch, launch_gap_s=0.0)
    segs = [cs.Segment(0.0, eager=tuple(first), sync_after=True), cs.Segment(0.0, eager=tuple(second))]
    host = (len(first) + len(second)) * launch + sync
    gpu = sum(first) + sum(second)
    period = cs.call_period_s(segs, a, sync, calls=12)
    assert max(host, gpu) * (1 - 1e-9) <= period <= host + gpu + 1e-12
    free = [cs.Segment(0.0, eager=tuple(first)), cs.Segment(0.0, eager=tuple(second))]
    assert period >= cs.call_period_s(free, a, 0.0, calls=12) - 1e-12  # a sync never makes a call faster


def test_stages_on_the_measured_setup():
    c = cs.compile_stages("llama-3.1-8b", 8, "h200", "bf16", "h200-measured")
    assert c["reduce_overhead"].period_s < c["eager"].period_s
    assert c["eager"].bound == "host" and c["reduce_overhead"].bound == "GPU"
    closure = cs.compile_stages("llama-3.1-8b", 8, "h200", "bf16", "h200-measured", "closure")
    extra = closure["reduce_overhead"].period_s - c["reduce_overhead"].period_s
    copy_time = 2 * c.block.weight_bytes / (c.cal.assume.gemv_efficiency * 4.8e12)
    assert math.isclose(extra, copy_time, rel_tol=0.02)
    broken = cs.compile_stages("llama-3.1-8b", 8, "h200", "bf16", "book", graph_break=True)
    assert "eager_graph" not in broken.stages and broken["inductor"].bound == "sync"


def test_calibrations_and_their_refusals():
    book = cs.calibration("book", "a100-sxm")
    assert book.entry_s == assumptions.value("compile_stages.compiled_call_us") * 1e-6
    h200 = cs.calibration("h200-measured", "h200")
    assert h200.assume.eager_launch_s == measured("launch_overhead.torch_eager_add_s")
    assert 0.6 < h200.assume.gemv_efficiency < 0.9
    with pytest.raises(ValueError, match="choose calibration 'book'"):
        cs.calibration("h200-measured", "h100-sxm")
    with pytest.raises(ValueError, match="calibration must be one of"):
        cs.calibration("fast", "h200")
    block = cs.mlp_block(64, 64, 2, graph_break=True)
    with pytest.raises(ValueError, match="cannot capture"):
        cs.stage_cost(block, "eager_graph", "h200", book)


def test_measured_call_times_and_recompile_seconds():
    assert len(cs.measured_call_s("reduce_overhead", "closure")) == 5
    assert cs.measured_call_s("eager", "parameters", graph_break=True) == ()
    assert 0.5 < cs.measured_recompile_s() < 2.0
    assert cs.is_measured_setup("llama-3.1-8b", 8, "h200", "bf16")
    assert not cs.is_measured_setup("llama-3.1-8b", 16, "h200", "bf16")


# ---- the explorer ----------------------------------------------------------------------------------------------------


def test_explorer_view_shows_the_measurement_only_on_the_measured_setup():
    from lib.book import widgets

    here = widgets.render("cuda_kernels.compile_stages", gpu="h200", model="llama-3.1-8b", batch=8, dtype="bf16",
                          calibration="h200-measured", weights="closure", graph_break="none")
    assert any("H200 measured" in v for _, v in here.rows)
    other = widgets.render("cuda_kernels.compile_stages", gpu="h100-sxm", model="llama-3.1-8b", batch=8, dtype="bf16",
                           calibration="book", weights="parameters", graph_break=".item() check")
    assert not any("H200 measured" in v for _, v in other.rows)
    assert other.values["eager_s"] > other.values["reduce_overhead_s"] > other.values["floor_s"]
    refused = widgets.render("cuda_kernels.compile_stages", gpu="h100-sxm", model="llama-3.1-8b", batch=8,
                             dtype="bf16", calibration="h200-measured", weights="closure", graph_break="none")
    assert isinstance(refused, widgets.ErrorView) and "choose calibration 'book'" in refused.message
