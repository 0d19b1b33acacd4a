"""lib.judgment.safety (N080): weight access paths, and the three ways to stop a deployment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import safety


def test_weight_exposure_counts_nodes_copies_and_principals():
    e = safety.weight_exposure(624, 32, 8, 4, 40, 12)
    assert (e.serving_nodes, e.eval_nodes) == (78, 4)
    assert e.hosts == 82 and e.places == 86 and e.principals == 52
    assert safety.weight_exposure(9, 0, 8, 1, 0, 0).serving_nodes == 2  # a partial node still holds weights
    with pytest.raises(ValueError):
        safety.weight_exposure(8, 0, 0, 1, 0, 0)


def test_drain_is_max_output_times_tpot():
    assert safety.drain_s(8192, 0.05) == pytest.approx(409.6)
    for bad in ((0, 0.05), (100, 0.0)):
        with pytest.raises(ValueError):
            safety.drain_s(*bad)


@settings(max_examples=50, deadline=None)
@given(rate=st.floats(0.1, 1e4), out=st.integers(1, 4096), cap=st.integers(1, 32768), tpot=st.floats(1e-3, 0.5),
       detect=st.floats(0, 3600), flag=st.floats(0, 60), orch=st.floats(0, 300), restart=st.floats(0, 1000))
def test_stop_paths_properties(rate, out, cap, tpot, detect, flag, orch, restart):
    abort, drain, zero = safety.stop_paths(rate, out, cap, tpot, detect, flag, orch, restart)
    assert abort.total_s == pytest.approx(detect + flag + tpot)
    assert drain.total_s == pytest.approx(detect + flag + cap * tpot)
    assert zero.total_s == pytest.approx(detect + orch + cap * tpot)
    assert abort.total_s <= drain.total_s + 1e-9  # aborting never stops later than draining
    assert abort.resume_s == drain.resume_s == flag and zero.resume_s == restart
    assert abort.tokens_after_decision <= drain.tokens_after_decision + 1e-6 or out == 1
    # Little's law: tokens streamed during the flag push are the fleet's output rate times the push
    assert abort.tokens_after_decision == pytest.approx(rate * out * flag + rate * out * tpot)


def test_stop_paths_refuse_bad_inputs():
    with pytest.raises(ValueError):
        safety.stop_paths(0.0, 10, 100, 0.05, 1, 1, 1, 1)
    with pytest.raises(ValueError):
        safety.stop_paths(1.0, 10, 100, 0.05, -1, 1, 1, 1)


def test_shrinking_drain_closed_form_vs_brute_force():
    """E[T] = (M / B) sum step_s(b) against seeded drains stepped one finish at a time; the bound holds,
    and at batch 1 the drain is the bound."""
    import numpy as np

    from lib.perf.deployment import deployment
    from lib.perf.throughput import step_s

    dep = deployment("llama-3.1-8b", "h100-sxm", tp=1)
    one = safety.shrinking_drain_s(dep, 1, 1000, 2000)
    assert one.expected_s == pytest.approx(one.bound_s)
    batch, cap, ctx = 64, 4096, 2000
    d = safety.shrinking_drain_s(dep, batch, cap, ctx)
    assert d.expected_s < d.bound_s == pytest.approx(cap * step_s(dep, batch, ctx))
    steps = np.array([step_s(dep, b, ctx) for b in range(batch, 0, -1)])
    rem = np.sort(np.random.default_rng(0).integers(1, cap + 1, (2000, batch - 1)), axis=1)
    rem = np.concatenate([np.zeros((2000, 1)), rem, np.full((2000, 1), cap)], axis=1)
    assert float((np.diff(rem, axis=1) @ steps).mean()) == pytest.approx(d.expected_s, rel=0.01)
    for bad in ((0, 100, 10), (4, 0, 10), (4, 100, 0)):
        with pytest.raises(ValueError):
            safety.shrinking_drain_s(dep, *bad)
