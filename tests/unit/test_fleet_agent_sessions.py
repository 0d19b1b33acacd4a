"""N065 agent-session-platform: KV across a tool call, the session replay, the warm pool, lost work."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import agent_sessions as ag
from lib.kvcache.recompute_fetch import compare_recompute_fetch
from lib.perf.deployment import deployment

DEP = deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_kv_across_tool_uses_the_one_recompute_fetch_home():
    x = ag.kv_across_tool(DEP, 42000, 700, 60.0)
    ref = compare_recompute_fetch(DEP, 42000, "host_dram", suffix_len=700)
    assert x.recompute_s == pytest.approx(ref.recompute_s) and x.fetch_s == pytest.approx(ref.fetch_s)
    assert x.pool_share == pytest.approx(42000 / DEP.budget.token_capacity)
    assert x.hold_replica_s == pytest.approx(x.pool_share * 60.0)
    assert x.cheapest == "offload to host DRAM"


def test_breakeven_is_where_hold_meets_recompute():
    t = ag.hold_breakeven_tool_s(DEP, 42000, 700)
    assert ag.kv_across_tool(DEP, 42000, 700, t).hold_replica_s == pytest.approx(
        ag.kv_across_tool(DEP, 42000, 700, t).recompute_s)


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(1, 30), new=st.integers(0, 2000), out=st.integers(1, 400), tool=st.floats(0.5, 300))
def test_session_replay_matches_closed_sums(steps, new, out, tool):
    shape = ag.SessionShape(steps, 1000, new, out, tool)
    costs = ag.session_kv_costs(DEP, shape)
    assert ag.simulate_session(DEP, shape, "hold")["replica_s"] == pytest.approx(costs["hold_replica_s"], rel=1e-9,
                                                                                   abs=1e-12)
    assert ag.simulate_session(DEP, shape, "recompute")["replica_s"] == pytest.approx(costs["recompute_replica_s"],
                                                                                        rel=1e-9, abs=1e-12)
    assert ag.simulate_session(DEP, shape, "offload")["added_s"] == pytest.approx(costs["offload_added_s"], rel=1e-9,
                                                                                    abs=1e-12)
    assert ag.simulate_session(DEP, shape, "hold")["final_context"] == shape.context_at(steps - 1)


def test_warm_pool_is_the_poisson_quantile():
    rng = np.random.default_rng(1)
    counts = rng.poisson(10.0, 200000)
    pool = ag.warm_pool(2.0, 5.0, 0.999)["pool"]
    assert np.mean(counts <= pool) >= 0.999 and np.mean(counts <= pool - 1) < 0.999
    assert ag.warm_pool(1000.0, 120.0)["pool"] == pytest.approx(120000 + 3.09 * math.sqrt(120000), abs=5)


def test_lost_work_and_state_machine():
    assert ag.lost_work_s(60.0, 100, True) == 30.0 and ag.lost_work_s(60.0, 100, False) == 3000.0
    for a, bs in ag.TRANSITIONS.items():
        assert all(b in ag.STATES for b in bs)
        if a not in ("done", "failed"):
            assert "failed" in bs
    with pytest.raises(ValueError, match="exceeds"):
        ag.kv_across_tool(deployment("llama-3.1-8b", "l4", tp=1), 120000, 0, 1.0)
