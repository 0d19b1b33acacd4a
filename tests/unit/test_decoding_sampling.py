"""lib.decoding.sampling: the temperature softmax against a direct float64 formula, its greedy limit,
and logits that would overflow a naive exp."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lib.decoding.sampling import softmax

rows = arrays(np.float64, st.integers(1, 40), elements=st.floats(-30, 30))


@given(rows, st.floats(0.05, 5.0))
def test_softmax_matches_the_definition(z, t):
    want = [math.exp(x / t) for x in z]
    s = sum(want)
    assert np.allclose(softmax(z, t), [w / s for w in want], rtol=1e-9, atol=1e-300)


def test_large_logits_do_not_overflow_and_masked_tokens_get_zero():
    p = softmax([1000.0, 999.0, -np.inf])
    assert np.isfinite(p).all() and p[2] == 0 and p[0] == pytest.approx(1 / (1 + math.exp(-1)))


def test_temperature_zero_is_greedy_with_ties_to_the_lowest_id():
    assert softmax([1.0, 3.0, 3.0, 2.0], 0).tolist() == [0, 1, 0, 0]
    assert softmax([[1.0, 2.0], [5.0, 4.0]], 0).tolist() == [[0, 1], [1, 0]]


def test_bad_inputs_named():
    with pytest.raises(ValueError, match="temperature"):
        softmax([1.0], -1)
    with pytest.raises(ValueError, match="NaN"):
        softmax([1.0, float("nan")])
    with pytest.raises(ValueError, match="unmasked"):
        softmax([-np.inf, -np.inf])
