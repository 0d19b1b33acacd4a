"""lib.fleet.simulated_capacity: a replica's saturated rate in the simulator, and the bounds it puts on the capacity model."""

import dataclasses

import pytest

from lib.fleet import simulated_capacity as sc
from lib.fleet.capacity import request_cost
from lib.perf.deployment import deployment


@pytest.fixture(scope="module")
def dep8b():
    return deployment("llama-3.1-8b", "h100-sxm")


@pytest.fixture(scope="module")
def cost(dep8b):
    return request_cost(dep8b, 1000, 200, batch=64)


def test_saturated_rate_between_the_model_and_decoding_alone(cost):
    """The simulator shares weight reads between prompt chunks and decodes: it completes about 1 / replica_s or
    more (never 8% less), and never more than decoding alone at the batch, 1 / decode_s."""
    for s in range(3):
        rate = sc.saturated_rate(cost, seed=s)
        assert (1 - sc.SIM_BELOW_MODEL) / cost.replica_s <= rate <= (1 + sc.WINDOW_NOISE) / cost.decode_s


def test_bounds_hold_for_the_model_and_fail_for_a_wrong_one(cost):
    """A model that charges 15% fewer replica-seconds, or twice the decode step, falls outside the bounds."""
    b = sc.simulated_bounds(cost, seed=1)
    assert b.cold_rate == b.short_rate  # nothing cached: one run
    assert b.holds(cost)
    optimistic = dataclasses.replace(cost, prefill_s=cost.prefill_s - 0.15 * cost.replica_s)
    assert not b.holds(optimistic)
    slow_decode = dataclasses.replace(cost, decode_step_s=2 * cost.decode_step_s)
    assert not b.holds(slow_decode)


def test_a_cached_prefix_brackets_the_warm_request(dep8b):
    """With half the prompt cached, the uncached tokens alone run faster than the whole prompt."""
    warm = request_cost(dep8b, 2000, 200, batch=64, cached_len=1000)
    b = sc.simulated_bounds(warm, 1000, seed=0)
    assert b.short_rate > b.cold_rate
    assert b.holds(warm)


def test_mixture_of_experts_within_the_bounds():
    """Mixtral with short prompts: the simulator runs far above 1 / replica_s, still below decoding alone."""
    c = request_cost(deployment("mixtral-8x7b", "h100-sxm", tp=2), 200, 300, 0.05)
    b = sc.simulated_bounds(c, seed=0)
    assert b.holds(c)
    assert b.cold_rate > 1.4 * c.max_rate


def test_bad_inputs(cost):
    with pytest.raises(ValueError, match="RequestCost"):
        sc.saturated_rate(1.0)
    with pytest.raises(ValueError, match="cached_len"):
        sc.simulated_bounds(cost, cost.prompt_len)
    with pytest.raises(ValueError, match="RequestCost"):
        sc.simulated_bounds(cost).holds(1.0)
