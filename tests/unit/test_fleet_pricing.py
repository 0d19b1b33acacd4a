"""lib.fleet.pricing: the prompt's share of the bill, prefix-cache hits, list prices and the tornado of assumptions."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity as c
from lib.fleet import pricing as p
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time


@pytest.fixture(scope="module")
def dep70():
    return deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_breakeven_prompt_is_the_first_to_reach_the_share(dep70):
    star = p.prompt_len_for_share(dep70, 400, 2 / 3, 0.05)
    assert star is not None
    assert c.request_cost(dep70, star, 400, 0.05).prefill_share >= 2 / 3
    assert c.request_cost(dep70, star - 1, 400, 0.05).prefill_share < 2 / 3


def test_breakeven_prompt_against_a_brute_force_scan(dep70):
    """Oracle: scan every prompt length up to the answer at a short reply (a few hundred request_cost calls)."""
    star = p.prompt_len_for_share(dep70, 50, 0.6, 0.05)
    scan = next(n for n in range(1, 5000) if c.request_cost(dep70, n, 50, 0.05).prefill_share >= 0.6)
    assert star == scan


def test_long_replies_never_reach_two_thirds_on_a_kv_bound_replica(dep70):
    """A long prompt shrinks the KV-bound batch, so each reply token grows dearer as fast as the prompt."""
    assert p.prompt_len_for_share(dep70, 1000, 2 / 3, 0.05) is None


def test_cached_prefix_is_the_warm_prefill_of_request_cost(dep70):
    """A hit fraction becomes request_cost's cached_len (THE warm prefill, capacity.prefill_s)."""
    assert p.cached_len(3000, 0.5) == 1500
    assert p.cached_len(3000, 0.0) == 0
    assert p.cached_len(10, 0.99) == 9  # the last prompt token is always computed
    with pytest.raises(ValueError, match="cached_fraction"):
        p.cached_len(3000, 1.0)
    cold = p.list_price(dep70, 3000, 400, 0.05, margin=0.5)
    warm = p.list_price(dep70, 3000, 400, 0.05, margin=0.5, cached_fraction=0.5)
    half = c.request_cost(dep70, 3000, 400, 0.05, cached_len=1500)
    assert warm.input_usd_per_m == pytest.approx(c.usd_per_million_tokens(half).input_usd_per_m / 0.5)
    assert warm.output_usd_per_m == pytest.approx(cold.output_usd_per_m)  # the decode does not change
    # the suffix attends over the prefix: it costs more than a fresh prompt of the suffix's length
    assert half.prefill_s > prefill_time(dep70, 1500).time_s


def test_short_suffix_still_pays_the_weight_read():
    """70B TP8, P = 200 with 150 cached: the 50 new tokens still read every weight once (the old
    prefill_time(P) - prefill_time(h) gave about 1.3 ms; the weight read alone is several ms)."""
    from lib.perf.memory import weight_bytes_per_gpu

    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    warm = c.request_cost(dep, 200, 100, batch=8, cached_len=p.cached_len(200, 0.75)).prefill_s
    read = weight_bytes_per_gpu(dep.mdl, 8) / dep.chip.memory_bandwidth
    assert warm >= read
    assert warm > 2 * (prefill_time(dep, 200).time_s - prefill_time(dep, 150).time_s)


@settings(max_examples=15, deadline=None)
@given(h1=st.floats(0, 0.95), h2=st.floats(0, 0.95))
def test_more_cache_hits_never_cost_more(dep70, h1, h2):
    lo, hi = sorted((h1, h2))
    at = {h: p.list_price(dep70, 3000, 400, 0.05, margin=0.5, cached_fraction=h).input_usd_per_m for h in (lo, hi)}
    assert at[hi] <= at[lo] * (1 + 1e-12)


def test_list_price_is_cost_over_one_minus_margin(dep70):
    lp = p.list_price(dep70, 3000, 400, 0.05, margin=0.6)
    cost = c.usd_per_million_tokens(c.request_cost(dep70, 3000, 400, 0.05))
    assert lp.input_usd_per_m == pytest.approx(cost.input_usd_per_m / 0.4)
    assert lp.output_usd_per_m == pytest.approx(cost.output_usd_per_m / 0.4)
    # blended over the mix is the request's dollars over its tokens
    assert lp.blended_usd_per_m == pytest.approx(cost.usd_per_request / 0.4 / 3400 * 1e6)
    with pytest.raises(ValueError, match="margin"):
        p.list_price(dep70, 3000, 400, 0.05, margin=1.0)


def test_tornado_moves_one_input_at_a_time_and_ranks_by_swing(dep70):
    base = {"prompt_len": 3000, "output_len": 400, "tpot_target_s": 0.05, "margin": 0.5}
    ranges = {"usd_per_gpu_hour": (1.5, 3.5), "utilization": (0.5, 0.85), "mfu": (0.4, 0.75), "margin": (0.3, 0.7)}
    bars = p.tornado(dep70, base, ranges)
    swings = [b.swing() for b in bars]
    assert swings == sorted(swings, reverse=True)
    price = next(b for b in bars if b.name == "usd_per_gpu_hour")
    # every dollar is proportional to the GPU-hour price
    assert price.at_high.blended_usd_per_m / price.at_low.blended_usd_per_m == pytest.approx(3.5 / 1.5)
    mfu = next(b for b in bars if b.name == "mfu")
    assert mfu.swing("output") == 0  # the prefill's MFU does not touch the decode
    with pytest.raises(ValueError, match="unknown tornado input"):
        p.tornado(dep70, base, {"nonsense": (1, 2)})
    with pytest.raises(ValueError, match="which"):
        p.tornado(dep70, base, ranges, which="total")


def test_refusals(dep70):
    with pytest.raises(ValueError, match="share"):
        p.prompt_len_for_share(dep70, 400, 1.0, 0.05)
    with pytest.raises(ValueError, match="output_len"):
        p.prompt_len_for_share(dep70, 0, 0.5, 0.05)
    with pytest.raises(ValueError, match="prompt_len"):
        p.cached_len(0, 0.5)
    assert math.isfinite(p.list_price(dep70, 100, 100, 0.05, margin=0.0).blended_usd_per_m)


def test_assumption_ranges_come_from_the_assumptions_file():
    from lib.registry import assumptions

    r = p.assumption_ranges("h100-sxm", 0.05, 400)
    f_lo, f_hi = assumptions.value_range("fleet.gpu_hour_price_factor")
    assert r["usd_per_gpu_hour"] == pytest.approx((c.gpu_hour_usd("h100-sxm") * f_lo, c.gpu_hour_usd("h100-sxm") * f_hi))
    assert r["utilization"] == assumptions.value_range("fleet.utilization_ceiling")
    assert r["tpot_target_s"] == pytest.approx((0.025, 0.1))
    assert r["output_len"] == (200, 800)
    assert set(r) <= set(p.TORNADO_INPUTS)
    with pytest.raises(ValueError, match="tpot_factor"):
        p.assumption_ranges("h100-sxm", 0.05, 400, tpot_factor=1.0)
