"""The KV a batch class may hold under an interactive TPOT target (lib.scheduling.kv_share), checked
against the step models evaluated directly and against the simulator."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.perf.step import decode_step
from lib.scheduling import SLO, Geometric, LinearCost, Policy, Workload, mix, simulate, step_cost
from lib.scheduling.kv_share import DirectStepCost, batch_kv_budget, mean_step_parts

DEP = Deployment("llama-3.1-8b", "h100-sxm")
COST = step_cost(DEP)
LOADS = dict(interactive_rate=6.0, interactive_prompt=700, interactive_output=250, batch_prompt=6000, batch_output=600)


def test_mean_step_parts_are_the_step_model():
    parts = mean_step_parts(COST, 10, interactive_decodes=20, interactive_prompt=700, interactive_output=250,
                            batch_prompt=6000, batch_output=600)
    c_i, c_b = 20 * (700 + 125), 6000 + 300
    assert parts["base"] == pytest.approx(COST.decode_s(30, c_i))
    assert parts["base"] + parts["read"] == pytest.approx(COST.decode_s(30, c_i + 10 * c_b))
    assert parts["prefill"] == pytest.approx(20 * COST.chunk_compute_s(700, 0) / 250 + 10 * COST.chunk_compute_s(6000, 0) / 600)
    assert parts["total"] == pytest.approx(parts["base"] + parts["read"] + parts["prefill"])
    # and the table is the decode step itself at the mean context
    assert parts["base"] + parts["read"] == pytest.approx(decode_step(DEP, 30, round((c_i + 10 * c_b) / 30)).total_s, rel=2e-3)


def test_budget_is_the_largest_n_inside_the_target():
    b = batch_kv_budget(COST, 0.020, **LOADS)
    assert b.interactive_decodes == math.ceil(6.0 * 250 * 0.020)
    loads = dict(interactive_decodes=b.interactive_decodes, interactive_prompt=700, interactive_output=250,
                 batch_prompt=6000, batch_output=600)
    assert b.batch_decodes > 0
    assert mean_step_parts(COST, b.batch_decodes, **loads)["total"] <= 0.020 < \
        mean_step_parts(COST, b.batch_decodes + 1, **loads)["total"]
    assert b.cap_tokens == b.batch_decodes * (6000 + 300)  # greedy footprint: P + O / 2
    assert b.share == pytest.approx(b.cap_tokens / (COST.kv_blocks * COST.block_size))


@settings(max_examples=20, deadline=None)
@given(st.floats(0.005, 0.08), st.floats(0.5, 20.0))
def test_budget_grows_with_the_target_and_shrinks_with_the_interactive_rate(t, rate):
    lo = batch_kv_budget(COST, t, **{**LOADS, "interactive_rate": rate})
    hi = batch_kv_budget(COST, t * 1.5, **{**LOADS, "interactive_rate": rate})
    busier = batch_kv_budget(COST, t, **{**LOADS, "interactive_rate": rate * 2})
    assert hi.batch_decodes >= lo.batch_decodes >= busier.batch_decodes
    if lo.batch_decodes:
        assert lo.step_at_cap_s <= t


def test_reservation_footprint_and_floor():
    b = batch_kv_budget(COST, 0.020, **LOADS, batch_footprint=6000 + 2047)
    assert b.footprint_tokens == 8047 and b.cap_tokens == b.batch_decodes * 8047
    floor = batch_kv_budget(COST, 0.004, **LOADS)  # below the weight read: nothing fits
    assert floor.batch_decodes == 0 and floor.share == 0 and floor.step_without_batch_s > 0.004


def test_direct_models_agree_with_the_table():
    for t in (0.012, 0.02, 0.03):
        table, direct = batch_kv_budget(COST, t, **LOADS), batch_kv_budget(DirectStepCost(DEP), t, **LOADS)
        assert abs(table.batch_decodes - direct.batch_decodes) <= 1


def test_validation():
    with pytest.raises(ValueError, match="tpot_s"):
        batch_kv_budget(COST, 0, **LOADS)
    with pytest.raises(ValueError, match="max_running"):
        batch_kv_budget(LinearCost(per_seq_s=1e-3, max_running=4, token_budget=64), 1.0, **LOADS)
    with pytest.raises(ValueError, match="batch_prompt"):
        batch_kv_budget(COST, 0.02, **{**LOADS, "batch_prompt": 0})
    with pytest.raises(ValueError):
        mean_step_parts(COST, -1, interactive_decodes=1, interactive_prompt=1, interactive_output=1, batch_prompt=1,
                        batch_output=1)


def test_simulator_meets_the_median_target_at_the_derived_cap_and_not_without_it():
    t = 0.020
    chat = Workload(prompt=700, output=Geometric(250), rate=None, n_requests=None, rate_schedule=((30.0, 6.0),),
                    priority=0, max_tokens=1024)
    docs = Workload(prompt=6000, output=Geometric(600), rate=None, n_requests=None, rate_schedule=((30.0, 3.0),),
                    priority=1, max_tokens=2048)
    reqs = mix([chat, docs], seed=1)
    b = batch_kv_budget(COST, t, **LOADS, batch_footprint=6000 + 2047)

    def tpot50(policy):
        res = simulate(reqs, policy, COST)
        return np.median([r.tpot_s for r in res.requests if r.priority == 0 and r.arrival_s > 7.5
                          and r.output_len > 1]), res

    capped, res = tpot50(Policy(admission="reserve", use_priority=True, kv_share_cap={1: b.share}))
    free, _ = tpot50(Policy(admission="reserve", use_priority=True))
    assert capped <= t * 1.1 < free
    assert res.counters["class_blocks_peak"][1] <= res.counters["class_blocks_cap"][1]
    assert res.metrics(slo=SLO(tpot_s=t), priority=0).slo_attainment > 0.5


def test_explorer_view_matches_lib():
    from lib.explorers.scheduling_memory import batch_kv_share

    view = batch_kv_share("llama-3.1-8b", "h100-sxm", 1, 20.0, 6.0, 700, 250, 6000, 600, 2048 - 600)
    b = batch_kv_budget(DirectStepCost(DEP), 0.020, **LOADS, batch_footprint=6000 + 2047)
    assert view.values["batch_decodes"] == b.batch_decodes
    assert view.values["share"] == pytest.approx(b.share)
    tighter = batch_kv_share("llama-3.1-8b", "h100-sxm", 1, 20.0, 6.0, 700, 250, 6000, 600, 0)
    assert tighter.values["batch_decodes"] >= view.values["batch_decodes"]  # a smaller reservation fits more
