"""lib.perf.energy: joules per token, the power model's bounds and the wall-power factors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf import energy
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.perf.step import decode_step
from lib.registry.hardware import gpu


def test_joules_per_token_is_power_over_throughput():
    assert energy.joules_per_token(700.0, 350.0) == 2.0
    out = energy.joules_per_token([700.0, 700.0], [7.0, 700.0])
    assert np.allclose(out, [100.0, 1.0])
    with pytest.raises(ValueError, match="tokens_per_s"):
        energy.joules_per_token(700.0, 0.0)
    with pytest.raises(ValueError, match="power_w"):
        energy.joules_per_token(-1.0, 1.0)


@given(st.sampled_from(["a100-sxm", "h100-sxm", "h200", "b200"]), st.floats(0, 1), st.floats(0, 1))
def test_board_power_between_floor_and_tdp(chip, load, floor):
    p = energy.board_power_w(chip, load, floor)
    tdp = gpu(chip).tdp_w
    assert floor * tdp - 1e-9 <= p <= tdp + 1e-9


def test_tdp_from_datasheet():
    # NVIDIA H100 SXM "up to 700W"; the power model saturates exactly there
    assert energy.board_power_w("h100-sxm", 1.0) == 700.0
    assert math.isclose(
        energy.board_power_w("h100-sxm", 0.0),
        700.0 * energy.assumed("gpu_power.decode_floor_fraction_of_tdp"),
    )


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(["llama-3.1-8b", "llama-3.1-70b"]),
    st.integers(1, 2048),
    st.integers(1, 16384),
    st.floats(0.1, 1.0),
)
def test_decode_energy_brackets(mdl, batch, context, floor):
    # J/token sits between (batch-1 power) / X and TDP / X: the numerator can only move inside that band
    dep = Deployment(mdl, "h100-sxm", tp=8)
    r = energy.decode_energy(dep, context, batch, floor)
    x = tput.tokens_per_s(dep, batch, context)
    assert math.isclose(r["tokens_per_s"], x, rel_tol=1e-12)
    assert math.isclose(r["j_per_token"] * r["tokens_per_s"], r["power_w"], rel_tol=1e-12)
    assert 8 * 700 * floor / x * (1 - 1e-9) <= r["j_per_token"] <= 8 * 700 / x * (1 + 1e-9)


def test_decode_energy_second_method_energy_per_step():
    # energy of one step (P x the modelled step's timeline) spread over its B tokens equals P / X
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    for b in (1, 16, 128):
        r = energy.decode_energy(dep, 4096, b)
        step = decode_step(dep, b, 4096, timeline=True)
        t_end = max(start + dur for _, _, start, dur in step.events)
        assert math.isclose(r["power_w"] * t_end / b, r["j_per_token"], rel_tol=1e-9)
    arr = energy.decode_energy(dep, 4096, np.array([1, 16, 128]))
    assert arr["j_per_token"].shape == (3,)
    # load runs 0 at batch 1 towards 1 at the ceiling
    assert energy.decode_load(dep, 4096, 1) == 0.0
    assert 0 < energy.decode_load(dep, 4096, 256) < 1
    with pytest.raises(ValueError, match="batch"):
        energy.decode_energy(dep, 4096, 0)


def test_regression_decode_energy_uses_the_overlapped_step():
    # issue 9: J/token inherited the no-overlap line (GEMM FLOPs added to the weight read); it is now
    # the modelled step's, whose batch-1 step is at least its weight-read floor (published 5.19 ms:
    # (70.6e9 - 128,256 x 8,192) x 2 B / (8 x 3.35 TB/s)) and never below the roofline bound.
    from lib.perf import roofline

    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    r = energy.decode_energy(dep, 4096, 128)
    bound = roofline.decode_step("llama-3.1-70b", "h100-sxm", 8, 128, 4096)
    assert r["tokens_per_s"] <= 128 / bound.time_s
    assert decode_step(dep, 1, 4096)["weights"] == pytest.approx((70.6e9 - 128_256 * 8_192) * 2 / (8 * 3.35e12), rel=0.005)


def test_wall_factor_and_units():
    # DGX H100 ~10.2 kW max (NVIDIA datasheet) over 8 x 700 W, times PUE
    assert math.isclose(energy.wall_factor(), 10_200 / 5_600 * energy.assumed("server.pue"))
    assert energy.wall_factor(1.0, 1.0) == 1.0
    with pytest.raises(ValueError, match="pue"):
        energy.wall_factor(1.5, 0.9)
    assert math.isclose(energy.kwh_per_million_tokens(3.6), 1.0)  # 3.6 MJ = 1 kWh


def test_hbm_power():
    # 3.35 TB/s x 8 bit x 4 pJ/bit = 107.2 W
    assert math.isclose(energy.hbm_power_w(3.35e12, 4.0), 107.2)
    assert math.isclose(energy.weight_read_energy_j(1e9, 4.0), 0.032)
    with pytest.raises(ValueError, match="power has no 'nope'"):
        energy.assumed("nope.x")


def test_resolve_takes_the_data_value_for_none():
    assert energy.resolve("server.pue") == energy.assumed("server.pue")
    assert energy.resolve("server.pue", 1.2) == 1.2
