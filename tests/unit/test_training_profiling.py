"""lib.training.profiling: the synthetic measurement equals the step model when nothing is wrong;
the gap attribution finds each injected cause alone (against the oracle: the step with only that
cause, which reads no counter), keeps a straggler off the network's account, leaves what no
counter sees in the residual, and (property) names every cause that owns a large share of a gap."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import profiling as pr
from lib.training.step import TrainingLayout, training_step

LAYOUTS = [
    TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, pp=4, dp=8, micro_batches=16),
    TrainingLayout("llama-3.1-8b", "h100-sxm", tp=1, pp=1, dp=64, micro_batches=4),
    TrainingLayout("llama-3.1-405b", "h100-sxm", tp=8, pp=16, dp=16, micro_batches=32),
    TrainingLayout("qwen2.5-72b", "h200", tp=4, pp=2, dp=16, micro_batches=8, zero_stage=0),
]
SINGLE = {
    "dataloader": pr.Causes(loader_s=0.4),
    "tensor cores": pr.Causes(gemm_slowdown=1.2),
    "HBM": pr.Causes(hbm_slowdown=2.0),
    "collectives": pr.Causes(network_slowdown=1.6),
    "one machine": pr.Causes(straggler_slowdown=1.25, straggler_rank=8, straggler_gpus=8),
}


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda x: x.label)
def test_no_cause_measures_the_model(lay):
    pred = training_step(lay)
    m = pr.measure_step(lay)
    assert math.isclose(m.step_s, pred.step_s, rel_tol=1e-12)
    att = pr.attribute_gap(pred, m)
    assert all(abs(v) < 1e-9 for v in att.parts.values()) and abs(att.residual_s) < 1e-9
    assert att.slow_ranks == () and att.found() == ()
    assert math.isclose(float(np.median(m.tensor_active)), pred.assume.gemm_efficiency, rel_tol=1e-9)
    assert math.isclose(float(np.median(m.hbm_active)), pr.memory_bound_efficiency(), rel_tol=1e-9)


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda x: x.label)
@pytest.mark.parametrize("suspect", list(SINGLE))
def test_each_injected_cause_is_found(lay, suspect):
    causes = SINGLE[suspect]
    pred = training_step(lay)
    att = pr.attribute_gap(pred, pr.measure_step(lay, causes))
    truth = pr.cause_costs(lay, causes)[suspect]
    if truth < 1e-6 * pred.step_s:  # a cause with no cost on this layout (no exposed communication)
        assert abs(att.gap_s) < 1e-9
        return
    assert att.top == suspect, att.parts
    assert att.found(0.1) == (suspect,), att.parts
    # the counters, re-run through the step model, give the cause's true cost; the others nothing
    assert math.isclose(att.parts[suspect], truth, rel_tol=1e-6), (att.parts, truth)
    for other, v in att.parts.items():
        if other != suspect:
            assert abs(v) <= 1e-6 * att.gap_s, (other, v, att.gap_s)
    assert abs(att.residual_s) < 1e-9


def test_a_straggler_is_not_blamed_on_the_network():
    """Every healthy rank waits for the slow one inside its collectives: their NCCL time grows by
    the straggler's excess, and the attribution hands that to the spread, not the network."""
    lay = LAYOUTS[0]
    pred = training_step(lay)
    m = pr.measure_step(lay, pr.Causes(straggler_slowdown=1.3, straggler_rank=100, straggler_gpus=1))
    att = pr.attribute_gap(pred, m)
    assert float(np.median(m.comm_s)) > pr.exposed_comm_s(pred) + 0.2 * float(np.median(m.busy_s))
    assert abs(att.parts["collectives"]) < 1e-9 and att.slow_ranks == (100,) and att.slow_nodes == (12,)
    assert float(m.comm_s[100]) < float(np.median(m.comm_s))  # the slow rank itself waits least


def test_one_slow_node_is_one_machine():
    lay = LAYOUTS[2]
    att = pr.attribute_gap(training_step(lay), pr.measure_step(lay, pr.Causes(
        straggler_slowdown=1.1, straggler_rank=40, straggler_gpus=8, jitter=0.004, seed=3)))
    assert att.slow_ranks == tuple(range(40, 48)) and att.slow_nodes == (5,)


def test_host_gaps_stay_in_the_residual():
    lay = LAYOUTS[0]
    att = pr.attribute_gap(training_step(lay), pr.measure_step(lay, pr.Causes(host_gap_s=0.25)))
    assert math.isclose(att.residual_s, 0.25, rel_tol=1e-9) and att.found() == ()
    assert all(abs(v) < 1e-9 for v in att.parts.values())


def test_jitter_alone_flags_no_rank_but_costs_the_max():
    lay = LAYOUTS[2]
    pred = training_step(lay)
    m = pr.measure_step(lay, pr.Causes(jitter=0.005, seed=11))
    att = pr.attribute_gap(pred, m)
    assert att.slow_ranks == ()
    busy = m.busy_s
    # the job runs at its slowest rank: the step grows by about (max - median) of every micro-batch's
    # kernels plus the bubble's share of it, (pp - 1) / m more
    k = 1 + (lay.pp - 1) / lay.micro_batches
    assert att.parts["one machine"] > 0 and math.isclose(
        att.parts["one machine"], (busy.max() - np.median(busy)) * k, rel_tol=0.03)
    # and the jitter is deterministic
    assert pr.measure_step(lay, pr.Causes(jitter=0.005, seed=11)).step_s == m.step_s


@settings(max_examples=60, deadline=None)
@given(lay=st.sampled_from(LAYOUTS), loader=st.sampled_from([0.0, 0.1, 0.5]), g=st.floats(1.0, 1.4),
       h=st.floats(1.0, 2.5), net=st.floats(1.0, 2.0), s=st.floats(1.0, 1.4), seed=st.integers(0, 50))
def test_every_cause_with_a_large_share_is_found(lay, loader, g, h, net, s, seed):
    causes = pr.Causes(loader_s=loader, gemm_slowdown=g, hbm_slowdown=h, network_slowdown=net, straggler_slowdown=s,
                       straggler_rank=3, jitter=0.002, seed=seed)
    pred = training_step(lay)
    att = pr.attribute_gap(pred, pr.measure_step(lay, causes))
    assert math.isclose(sum(att.parts.values()) + att.residual_s, att.gap_s, rel_tol=1e-9, abs_tol=1e-12)
    truth = pr.cause_costs(lay, causes)
    total = sum(truth[k] for k in pr.SUSPECTS)
    found = att.found(0.1)
    for k in pr.SUSPECTS:
        if truth[k] >= 0.25 * total and total > 0.02 * pred.step_s:
            assert k in found, (k, truth, att.parts)
    assert math.isclose(att.parts["dataloader"], loader, abs_tol=1e-12)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="gemm_slowdown"):
        pr.Causes(gemm_slowdown=0.9)
    with pytest.raises(ValueError, match="loader_s"):
        pr.Causes(loader_s=-1)
    with pytest.raises(ValueError, match="straggler ranks"):
        pr.measure_step(LAYOUTS[1], pr.Causes(straggler_slowdown=1.2, straggler_rank=63, straggler_gpus=2))
    with pytest.raises(ValueError, match="suspect"):
        pr.Causes().only("cosmic rays")
    with pytest.raises(ValueError, match="TrainingLayout"):
        pr.measure_step("llama-3.1-70b")


def test_step_gap_explorer_reports_the_attribution():
    from lib.book import widgets

    v = widgets.render("training.step_gap", model="llama-3.1-70b", gpu="h100-sxm", tp=8, pp=4, dp=8,
                       micro_batches=16, loader_s=0.3, host_gap_s=0.0, gemm_slowdown=1.0, hbm_slowdown=1.0,
                       network_slowdown=1.0, straggler_slowdown=1.0, jitter=0.0)
    assert math.isclose(v.values["dataloader"], 0.3) and math.isclose(v.values["gap_s"], 0.3)
    bad = widgets.render("training.step_gap", model="llama-3.1-405b", gpu="h100-sxm", tp=1, pp=1, dp=1,
                         micro_batches=1, loader_s=0.0, host_gap_s=0.0, gemm_slowdown=1.0, hbm_slowdown=1.0,
                         network_slowdown=1.0, straggler_slowdown=1.0, jitter=0.0)
    assert isinstance(bad, widgets.ErrorView) and "per GPU" in bad.message


# ---- the timeline (N007) --------------------------------------------------------------------------

TIMELINE = {
    "data loader stall": ("dataloader", pr.Causes(loader_s=0.3)),
    "host-bound launches": ("host gaps", pr.Causes(host_gap_s=0.25)),
    "gradient reduction exposed": ("no grad overlap", pr.Causes(grad_overlap=False)),
    "slow optimizer": ("optimizer", pr.Causes(optimizer_slowdown=6.0)),
}
TL_LAYOUTS = [
    TrainingLayout("llama-3.1-8b", "h100-sxm", tp=1, pp=1, dp=8, micro_batches=4),
    LAYOUTS[0],
    TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, pp=8, dp=4, micro_batches=3),  # fewer micro-batches than stages
    LAYOUTS[3],
]


def _lanes_do_not_overlap(trace):
    for lane in pr.LANES:
        spans = sorted((e.start_s, e.end_s) for e in trace.lane(lane))
        for (a0, a1), (b0, b1) in zip(spans, spans[1:], strict=False):
            assert a1 <= b0 + 1e-12, (lane, (a0, a1), (b0, b1))
        assert all(a1 >= a0 for a0, a1 in spans)


@pytest.mark.parametrize("lay", TL_LAYOUTS, ids=lambda x: x.label)
def test_the_trace_is_the_measured_step(lay):
    for causes in (pr.Causes(), pr.Causes(loader_s=0.1, host_gap_s=0.05, grad_overlap=False, network_slowdown=1.5,
                                          optimizer_slowdown=3.0, gemm_slowdown=1.1)):
        tr = pr.step_trace(lay, causes)
        assert math.isclose(tr.step_s, pr.measure_step(lay, causes).step_s, rel_tol=1e-12)
        assert max(e.end_s for e in tr.events) <= tr.step_s + 1e-12 and min(e.start_s for e in tr.events) >= 0
        _lanes_do_not_overlap(tr)
        kinds = [e.kind for e in tr.events]
        assert kinds.count("forward") == kinds.count("backward") == lay.micro_batches


@pytest.mark.parametrize("lay", TL_LAYOUTS, ids=lambda x: x.label)
def test_no_cause_reads_as_the_model(lay):
    pred = training_step(lay)
    rd = pr.read_timeline(pr.step_trace(lay), pred)
    assert rd.found() == () and math.isclose(rd.step_s, pred.step_s, rel_tol=1e-12)
    assert math.isclose(rd.mfu, pred.mfu, rel_tol=1e-12)
    # the idle the model expects: the pipeline bubble (with its sends) and the exposed DP reduction
    assert math.isclose(rd.idle_by["pp"], pred.bubble_s + pred.p2p_exposed_s, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(rd.idle_by["dp"], pred.dp_exposed_s, rel_tol=1e-9, abs_tol=1e-12)
    assert rd.idle_by["nothing"] < 1e-9


@pytest.mark.parametrize("lay", TL_LAYOUTS, ids=lambda x: x.label)
@pytest.mark.parametrize("cause", list(TIMELINE))
def test_each_timeline_cause_is_found_and_priced(lay, cause):
    key, causes = TIMELINE[cause]
    pred = training_step(lay)
    rd = pr.read_timeline(pr.step_trace(lay, causes), pred)
    truth = pr.cause_costs(lay, causes)[key]
    if truth <= 1e-3 * pred.step_s:  # e.g. no DP reduction to expose on one replica
        assert rd.found() == ()
        return
    assert rd.found() == (cause,), rd.worth
    assert math.isclose(rd.worth[cause], truth, rel_tol=1e-6), (rd.worth, truth)


@settings(max_examples=40, deadline=None)
@given(lay=st.sampled_from(TL_LAYOUTS), loader=st.floats(0, 1), gaps=st.floats(0, 1), overlap=st.booleans(),
       opt=st.floats(1, 10))
def test_timeline_worths_match_the_oracle(lay, loader, gaps, overlap, opt):
    """The four causes do not interact: each reading equals that cause's cost alone."""
    causes = pr.Causes(loader_s=loader, host_gap_s=gaps, grad_overlap=overlap, optimizer_slowdown=opt)
    rd = pr.read_timeline(pr.step_trace(lay, causes), training_step(lay))
    truth = pr.cause_costs(lay, causes)
    for cause, (key, _) in TIMELINE.items():
        assert math.isclose(rd.worth[cause], truth[key], rel_tol=1e-6, abs_tol=1e-9), (cause, rd.worth, truth)
    assert math.isclose(sum(rd.worth.values()), rd.step_s - training_step(lay).step_s, rel_tol=1e-6, abs_tol=1e-9)


def test_timeline_refuses_bad_input():
    with pytest.raises(ValueError, match="StepTrace"):
        pr.read_timeline("trace", training_step(LAYOUTS[0]))
    with pytest.raises(ValueError, match="lane"):
        pr.step_trace(LAYOUTS[1]).lane("disk")
    with pytest.raises(ValueError, match="grad_overlap"):
        pr.Causes(grad_overlap="yes")


def test_step_timeline_explorer():
    from lib.book import widgets

    v = widgets.render("training.step_timeline", model="llama-3.1-8b", gpu="h100-sxm", tp=1, pp=1, dp=8,
                       micro_batches=4, loader_s=0.2, host_gap_s=0.0, grad_overlap=True, optimizer_slowdown=1.0)
    assert math.isclose(v.values["data loader stall"], 0.2) and v.values["slow optimizer"] == 0


def test_gap_analysis_refuses_a_slow_median_rank():
    from lib.explorers.training_profile import gap_analysis
    with pytest.raises(ValueError, match="median rank"):
        gap_analysis("llama-3.1-8b", "mi300x", 1, 1, 1, 1, 0.0, 0.0, 1.0, 1.0, 1.0, 1.3, 0.0)
    r = gap_analysis("llama-3.1-8b", "mi300x", 1, 1, 1, 1, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0)  # no straggler: fine
    assert r.layout.n_gpus == 1


def test_attribution_of_no_cause_is_exactly_zero():
    """Float rounding of the differences must not show as a cost (e.g. -3e-10 s on the network)."""
    from lib.explorers.training_profile import gap_analysis
    r = gap_analysis("llama-3.1-70b", "h100-sxm", 8, 4, 8, 16, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    assert all(v == 0.0 for v in r.attribution.parts.values())
    assert r.attribution.residual_s == 0.0


def test_timeline_worth_of_no_cause_is_exactly_zero():
    """The optimizer's span minus the model's must not show a rounding residue (4.86e-11 us) as a cost."""
    from lib.training.step import TrainingLayout, training_step
    lay = TrainingLayout("llama-3.1-8b", "mi300x", tp=1, pp=1, dp=1, seq_len=8192, micro_batch=1, micro_batches=1,
                         zero_stage=1)
    pred = training_step(lay)
    reading = pr.read_timeline(pr.step_trace(lay, pr.Causes(loader_s=0.15, host_gap_s=0.2)), pred)
    assert reading.worth["data loader stall"] > 0
    assert all(reading.worth[k] == 0.0 for k in ("gradient reduction exposed", "slow optimizer"))
