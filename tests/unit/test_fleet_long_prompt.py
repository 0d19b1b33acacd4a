"""lib.fleet.long_prompt: one pool against two pools for long prompts, and the sessions kept warm."""

from __future__ import annotations

import pytest

from lib.fleet import long_prompt as lp
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time


@pytest.fixture(scope="module")
def dep():
    return deployment("llama-3.1-70b", "h100-sxm", tp=8)


def test_two_pools_arithmetic(dep):
    tp = lp.two_pools(dep, dep, 20.0, 32768, 1024, 500, 0.95, 0.05, 2.0, 5.0, utilization=0.7)
    assert tp.cold_rate == pytest.approx(1.0) and tp.warm_rate == pytest.approx(19.0)
    assert tp.cold_prefill_s == prefill_time(dep, 32768).time_s
    assert tp.cold_by_busy == pytest.approx(tp.cold_service_s / 0.7)
    assert tp.cold_replicas == max(1, int(-(-max(tp.cold_by_busy, tp.cold_by_ttft) // 1)))
    per_req = 0.95 * tp.warm_cost.prefill_s + tp.warm_cost.decode_s
    assert tp.warm_by_busy == pytest.approx(20.0 * per_req / 0.7)
    assert tp.gpus == 8 * (tp.cold_replicas + tp.warm_replicas)
    assert tp.transfer_bytes_per_s == pytest.approx(1.0 * 32768 * dep.mdl.kv_bytes_per_token("bf16"))
    assert tp.transfer.exposed_s(tp.cold_prefill_s) < tp.transfer.time_s  # the layer-wise send hides behind the prefill


def test_all_warm_needs_no_cold_pool(dep):
    tp = lp.two_pools(dep, dep, 20.0, 32768, 1024, 500, 1.0, 0.05, 2.0, 5.0)
    assert tp.cold_replicas == 0 and tp.cold_by_ttft == 0.0


def test_one_pool_per_class_targets(dep):
    """A warm target far above both prefills leaves the pool free to run busy; a warm target just above the warm
    prefill, with cold prefills in the same queue, forces it nearly idle."""
    loose = lp.one_pool(dep, 20.0, 32768, 1024, 500, 0.95, 0.05, 60.0, 60.0, samples=5000)
    tight = lp.one_pool(dep, 20.0, 32768, 1024, 500, 0.95, 0.05, 0.2, 5.0, samples=5000)
    assert loose.rho_ttft > 0.8 and tight.rho_ttft < loose.rho_ttft
    assert tight.mean_prefill_s == pytest.approx(0.95 * tight.warm_cost.prefill_s + 0.05 * tight.cold_prefill_s)


def test_one_pool_matches_the_exact_queue_when_all_warm(dep):
    from lib.fleet.sizing_chain import ttft_utilization

    op = lp.one_pool(dep, 20.0, 32768, 1024, 500, 1.0, 0.05, 0.3, 5.0, samples=20_000)
    assert op.rho_ttft == pytest.approx(ttft_utilization(op.warm_cost.prefill_s, 0.3, 0.99), abs=0.03)


def test_resident_prefixes(dep):
    r = lp.resident_prefixes(dep, 15, 20.0, 60.0, 32768)
    assert r.sessions == pytest.approx(1200)
    assert r.needed_bytes == pytest.approx(1200 * 32768 * dep.mdl.kv_bytes_per_token("bf16"))
    assert r.hbm_pool_bytes == pytest.approx(15 * dep.budget.token_capacity * dep.mdl.kv_bytes_per_token("bf16"))
    assert r.host_bytes == pytest.approx(15 * 2.0e12)  # one 8-GPU node per TP8 replica, 2 TB each
    assert 0 < r.host_fetch_s < prefill_time(dep, 32768).time_s


@pytest.mark.parametrize("w", [0.5, 0.9, 1.0])
def test_at_share_matches_a_fresh_sizing(dep, w):
    base = lp.two_pools(dep, dep, 20.0, 32768, 1024, 500, 0.95, 0.05, 2.0, 5.0)
    fresh = lp.two_pools(dep, dep, 20.0, 32768, 1024, 500, w, 0.05, 2.0, 5.0)
    moved = base.at_share(w)
    assert (moved.cold_replicas, moved.warm_replicas, moved.gpus) == (fresh.cold_replicas, fresh.warm_replicas, fresh.gpus)
