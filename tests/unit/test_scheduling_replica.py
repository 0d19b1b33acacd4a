"""One replica's operating point (lib.scheduling.replica): the batch limits against the functions
that own each ceiling, and the steady-state run against conservation, Little's law and the plain
simulation it relabels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lib.perf import throughput
from lib.perf.deployment import Deployment
from lib.scheduling import SLO, LinearCost, LogNormal, Policy, Workload, simulate, step_cost
from lib.scheduling.replica import BatchLimits, batch_limits, steady_run

D70 = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
# a cheap analytic replica: 8 ms per step, 0.05 ms per running sequence, 20 us per prompt token
COST = LinearCost(fixed_s=0.008, per_seq_s=5e-5, per_prefill_token_s=2e-5, kv_blocks=1 << 14, block_size=16,
                  max_running=256, token_budget=4096)


def test_the_tpot_ceiling_is_the_step_models_and_binds_for_the_70b():
    lim = batch_limits(D70, 1700, 0.04)
    assert lim.by_tpot == pytest.approx(throughput.batch_for_step_time(D70, 1700, 0.04), rel=1e-12)
    assert lim.by_kv == pytest.approx(D70.budget.max_concurrency(1700), rel=1e-12)
    assert lim.by_engine == D70.max_num_seqs
    assert lim.limit == int(min(lim.by_tpot, lim.by_kv, lim.by_engine))
    assert lim.binding == "the TPOT target"
    assert lim.step_at_limit_s <= 0.04 < throughput.step_s(D70, lim.limit + 1, 1700)


def test_the_kv_pool_binds_at_long_context_and_max_num_seqs_when_set_low():
    long = batch_limits(D70, 30_000, 0.2)
    assert long.binding == "the KV pool" and long.limit == int(long.by_kv)
    small = batch_limits(D70.replace(max_num_seqs=32), 1000, 0.05)
    assert small.binding == "max_num_seqs" and small.limit == 32


@pytest.mark.parametrize("model, gpu, tp, context, target", [
    ("llama-3.1-70b", "h100-sxm", 8, 1700, 0.04),
    ("llama-3.1-70b", "h100-sxm", 8, 30_000, 0.2),
    ("qwen2.5-72b", "mi300x", 4, 3000, 0.05),
    ("mixtral-8x7b", "h200", 2, 2500, 0.03),
    ("llama-3.1-8b", "l40s", 1, 4000, 0.06),
    ("llama-3.1-70b", "h100-sxm", 8, 1000, 0.005),
    ("llama-3.1-8b", "h100-sxm", 1, 500, 0.15),
])
def test_the_decode_table_gives_the_step_models_ceiling(model, gpu, tp, context, target):
    """Read off the replica's tabulated decode step, the ceilings agree with the step model's (0.2%)."""
    dep = Deployment(model, gpu, tp=tp)
    exact, fast = batch_limits(dep, context, target), batch_limits(dep, context, target, cost=step_cost(dep))
    if exact.by_tpot > step_cost(dep).max_batch:  # past the table: the target does not bind
        assert fast.by_tpot == math.inf and fast.binding != "the TPOT target"
    else:
        assert fast.by_tpot == pytest.approx(exact.by_tpot, rel=2e-3, abs=1e-9)
    assert (fast.by_kv, fast.by_engine) == (exact.by_kv, exact.by_engine)
    assert abs(fast.limit - exact.limit) <= 1
    assert fast.step_at_limit_s == pytest.approx(exact.step_at_limit_s, rel=2e-3, nan_ok=True)
    with pytest.raises(ValueError, match="cost must be the StepCost of dep"):
        batch_limits(dep, context, target, cost=step_cost(D70.replace(kv_dtype="fp8")))


def test_a_target_below_one_sequences_step_allows_no_batch():
    lim = batch_limits(D70, 1000, 0.005)
    assert lim.by_tpot == 0.0 and lim.limit == 0 and lim.binding == "the TPOT target"
    assert math.isnan(lim.step_at_limit_s)


@pytest.mark.parametrize("kwargs, match", [
    (dict(context=0), "context"),
    (dict(context=10**7), "context"),
    (dict(tpot_target_s=0.0), "tpot_target_s"),
])
def test_batch_limits_refuses_bad_inputs(kwargs, match):
    args = dict(context=1000, tpot_target_s=0.04) | kwargs
    with pytest.raises(ValueError, match=match):
        batch_limits(D70, **args)


def test_batch_limits_fields():
    lim = BatchLimits(1000, 0.04, 12.7, 30.2, 1024, 0.039)
    assert (lim.limit, lim.binding) == (12, "the TPOT target")


PROMPT, OUTPUT = LogNormal(256, 0.6, cap=2048), LogNormal(128, 0.6, cap=512)


def _run(rate, **kw):
    args = dict(n_measured=400, n_warmup=400, n_cooldown=300, max_tokens=512, seed=1) | kw
    return steady_run(COST, PROMPT, OUTPUT, rate, **args)


def test_the_labels_do_not_change_the_schedule():
    """The warm-up, measured and cool-down classes are one Poisson stream scheduled as if unlabelled."""
    run = _run(20.0, n_measured=100, n_warmup=50, n_cooldown=50)
    plain = simulate(Workload(prompt=PROMPT, output=OUTPUT, rate=20.0, n_requests=200, max_tokens=512), Policy(),
                     COST, seed=1)
    for a, b in zip(run.result.requests, plain.requests, strict=True):
        assert (a.arrival_s, a.prompt_len, a.output_len) == (b.arrival_s, b.prompt_len, b.output_len)
        assert a.first_token_s == b.first_token_s and a.finish_s == b.finish_s
    assert [r.priority for r in run.result.requests] == [1] * 50 + [0] * 100 + [2] * 50
    assert run.metrics.n_requests == 100


def test_steady_state_conservation_and_littles_law():
    """Stable and warmed up: the window's tokens per second equal what the measured requests ask for
    per second of arrivals, and the window's running batch is lambda x (time from first scheduled to finish)."""
    run = _run(20.0)
    measured = [r for r in run.result.requests if r.priority == 0]
    asked = sum(r.output_len for r in measured) / (run.window[1] - run.window[0])
    assert run.tokens_per_s == pytest.approx(asked, rel=0.08)
    resident = np.mean([r.finish_s - r.first_scheduled_s for r in measured])
    assert run.mean_running == pytest.approx(20.0 * resident, rel=0.15)
    assert run.metrics.unfinished == 0 and run.metrics.finished == 400


def test_a_cold_run_is_not_a_steady_one():
    """Without a warm-up the window starts on an empty engine: its running batch is smaller."""
    warm, cold = _run(25.0), _run(25.0, n_warmup=0, n_cooldown=0)
    assert cold.mean_running < warm.mean_running


def test_goodput_is_the_share_within_the_slo():
    loose = _run(20.0, slo=SLO())
    assert loose.goodput_tokens_per_s == pytest.approx(loose.tokens_per_s)
    tight = _run(20.0, slo=SLO(tpot_s=1e-4))
    assert tight.goodput_tokens_per_s == 0.0 and tight.metrics.slo_attainment == 0.0
    slo = SLO(tpot_s=float(loose.metrics.tpot.p50))
    mid = _run(20.0, slo=slo)
    assert 0 < mid.goodput_tokens_per_s < loose.tokens_per_s
    measured = [r for r in mid.result.requests if r.priority == 0 and r.status == "finished"]
    share = sum(r.output_len for r in measured if slo.met(r)) / sum(r.output_len for r in measured)
    assert mid.goodput_tokens_per_s == pytest.approx(mid.tokens_per_s * share, rel=1e-12)


def test_coarse_blocks_keep_the_tokens_and_max_steps_stops_the_run():
    run = _run(20.0, block_size=64)
    assert run.result.counters["block_size"] == 64
    assert run.result.counters["kv_blocks"] == COST.kv_blocks * 16 // 64
    steps = len(run.result.timeline)
    short = _run(20.0, max_steps=steps // 2)
    assert len(short.result.timeline) == steps // 2 and not short.result.complete
    assert short.window[1] <= short.result.end_s
    with pytest.raises(ValueError, match="max_steps"):
        _run(20.0, max_steps=10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rate=0.0), "rate"),
    (dict(n_measured=1), "n_measured"),
    (dict(n_warmup=-1), "n_warmup"),
    (dict(policy=Policy(use_priority=True)), "priorities"),
    (dict(policy="fcfs"), "policy"),
    (dict(block_size=0), "block_size"),
])
def test_steady_run_refuses_bad_inputs(kwargs, match):
    args = dict(rate=10.0, n_measured=20, n_warmup=5, n_cooldown=5) | kwargs
    with pytest.raises(ValueError, match=match):
        steady_run(COST, PROMPT, OUTPUT, args.pop("rate"), **args)
