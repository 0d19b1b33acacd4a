"""lib.numerics.formats: largest finite values (oracle: torch.finfo) and the exp overflow edge."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lib.numerics.formats import bf16_round, bf16_round_scalar, exp_overflow_score, largest_finite


def test_largest_finite_matches_torch():
    for name, dt in (("fp8", torch.float8_e4m3fn), ("fp16", torch.float16), ("bf16", torch.bfloat16),
                     ("fp32", torch.float32), ("fp64", torch.float64)):
        assert largest_finite(name) == float(torch.finfo(dt).max), name
    assert largest_finite("bf16") == pytest.approx(3.3895313892515355e38)
    with pytest.raises(ValueError, match="dtype"):
        largest_finite("int8")


def test_exp_overflows_just_past_the_edge():
    assert exp_overflow_score("fp16") == pytest.approx(math.log(65504))
    for name, dt in (("fp16", np.float16), ("fp32", np.float32)):
        edge = exp_overflow_score(name)
        with np.errstate(over="ignore"):
            assert np.isfinite(np.exp(dt(edge * (1 - 1e-3)))) and np.isinf(np.exp(dt(edge * (1 + 1e-3))))


def test_bf16_round_scalar_and_array_agree_bit_for_bit():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-30, 30, 20_000)).astype(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1.00390625, 1.01171875, 3.3895314e38, 1e-45])])
    scalar = np.array([bf16_round_scalar(float(v)) for v in x], np.float32)
    assert (scalar.view(np.uint32) == bf16_round(x).view(np.uint32)).all()
    assert bf16_round(1.5).shape == (1,)  # a scalar comes back as one element, as it always did
