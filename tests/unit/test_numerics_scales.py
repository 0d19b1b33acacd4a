"""lib.numerics.scales: per-tensor dynamic scales leak across users, per-row and static scales do not,
and reduction order drifts by float32 amounts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import scales
from lib.numerics.formats import bf16_ulp
from lib.numerics.fp8 import amax_scale, fake_quantize
from lib.numerics.reduction import near_tie_problem


def _problem(users=32, d=64, vocab=128, seed=0):
    x, _, w = near_tie_problem(users, d, vocab, 0.05, seed=seed)
    return x, w, fake_quantize(w, amax_scale(w))


def test_activation_scale_modes():
    x, _, _ = _problem()
    assert scales.activation_scale(x, "per-tensor").shape == (1, 1)
    assert scales.activation_scale(x, "per-row").shape == (x.shape[0], 1)
    assert float(scales.activation_scale(x, "static", 0.5)) == 0.5
    with pytest.raises(ValueError, match="mode"):
        scales.activation_scale(x, "per-block")
    with pytest.raises(ValueError, match="static_scale"):
        scales.activation_scale(x, "static")


def test_with_outlier_sets_the_new_amax():
    x, _, _ = _problem()
    xo = scales.with_outlier(x, 3, 20.0, channels=2)
    assert np.max(np.abs(xo)) == pytest.approx(20 * np.max(np.abs(x)), rel=1e-6)
    assert np.array_equal(np.delete(xo, 3, axis=0), np.delete(x, 3, axis=0))
    with pytest.raises(ValueError, match="row"):
        scales.with_outlier(x, x.shape[0], 2.0)


def test_per_tensor_leaks_per_row_and_static_do_not():
    x, _, wq = _problem()
    leak = scales.batch_scale_leak(x, wq, 0, 20.0, "per-tensor")[0]
    assert leak.rel_change > 0.01 and leak.changed_share == 1.0
    for mode, s in (("per-row", None), ("static", 0.05)):
        e = scales.batch_scale_leak(x, wq, 0, 20.0, mode, s)[0]
        assert e.rel_change == 0 and e.flips == 0 and e.changed_share == 0


def test_power_of_two_scale_change_only_touches_subnormals():
    x, _, wq = _problem()
    assert scales.batch_scale_leak(x, wq, 0, 2.0, "per-tensor")[0].rel_change < 1e-5
    assert scales.batch_scale_leak(x, wq, 0, 2.5, "per-tensor")[0].rel_change > 1e-2


def test_reduction_drift_is_float32_sized():
    x, _, wq = _problem()
    d = scales.reduction_drift(x, wq, "per-row", 4)
    assert 0 < d.rel_change < 1e-5
    assert d.max_ulps <= 1


def test_logit_change_counts_flips_and_ulps():
    y = np.array([[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]], np.float32)
    z = y.copy()
    z[0, 0] = 2.5  # row 0's argmax moves from column 1 to column 0
    e = scales.logit_change(y, z)
    assert e.flips == 1 and e.changed_share == 0.5 and e.users == 2
    assert e.max_ulps == pytest.approx(1.5 / 2**-6)  # bf16 ulp at the top logit 2.0 is 2^-6
    with pytest.raises(ValueError):
        scales.logit_change(y, z[:1])


def test_bf16_ulp():
    assert bf16_ulp(1.0) == 2.0**-7
    assert bf16_ulp(3.0) == 2.0**-6
    assert bf16_ulp(-0.25) == 2.0**-9


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(1.01, 500.0), st.integers(0, 7))
def test_per_row_isolation_property(seed, factor, row):
    """Oracle: with per-row scales, each user's logits equal those of the user quantized alone."""
    x, _, wq = _problem(users=8, d=32, vocab=16, seed=seed)
    xo = scales.with_outlier(x, row, factor)
    batch = scales.quantized_logits(xo, wq, "per-row")
    for i in range(8):
        assert np.array_equal(batch[i], scales.quantized_logits(xo[i : i + 1], wq, "per-row")[0])


def test_relative_logit_error_and_owner_share():
    x, w, wq = _problem()
    assert 0.005 < scales.relative_logit_error(x, w, wq, "per-row") < 0.1
    a = np.random.default_rng(0).random((20_000, 8))
    assert scales.scale_owner_share(a) == pytest.approx(1 - 1 / 8, abs=0.01)


def test_leak_curve_matches_batch_scale_leak():
    """Oracle: the batched sweep gives each point's batch_scale_leak rel_change (float64 GEMM order aside)."""
    x, _, w = near_tie_problem(16, 64, 128, 0.05, seed=4)
    wq = fake_quantize(w, amax_scale(w))
    factors = [1.5, 2.0, 3.3, 40.0]
    curve = scales.leak_curve(x, wq, 0, factors)
    ref = [scales.batch_scale_leak(x, wq, 0, f, "per-tensor")[0].rel_change for f in factors]
    assert np.allclose(curve, ref, rtol=1e-7, atol=1e-12)
    assert curve[1] < 1e-3 * curve[0]  # a power of two hides the leak
    with pytest.raises(ValueError, match="factors"):
        scales.leak_curve(x, wq, 0, [])
