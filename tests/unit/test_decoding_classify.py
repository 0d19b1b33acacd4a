"""lib.decoding.classify: group log-sum-exp against torch and probability space, Platt scaling against a
brute-force grid, ECE by hand, and the synthetic set's known truth."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lib.decoding import classify as c

rows = arrays(np.float64, st.integers(4, 30), elements=st.floats(-30, 30))


@given(rows, st.floats(-500, 500))
def test_score_is_the_probability_space_ratio_and_shift_invariant(z, shift):
    yes, no = [0, 2], [1, 3]
    p = np.exp(z - z.max())
    p /= p.sum()
    want = math.log(p[yes].sum()) - math.log(p[no].sum())
    assert c.binary_label_score(z, yes, no) == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert c.binary_label_score(z + shift, yes, no) == pytest.approx(want, rel=1e-9, abs=1e-7)
    assert c.label_mass(z, yes, no) == pytest.approx(p[yes + no].sum(), rel=1e-9)


def test_torch_oracle_logsumexp_and_sigmoid():
    torch = pytest.importorskip("torch")
    z = np.random.default_rng(0).standard_normal((5, 40)) * 8
    lp = c.label_log_probs(z, {"yes": [3, 7, 9], "no": [0, 1]})
    t = torch.tensor(z).log_softmax(-1)
    assert np.allclose(lp["yes"], torch.logsumexp(t[:, [3, 7, 9]], -1).numpy(), atol=1e-12)
    s = lp["yes"] - lp["no"]
    assert np.allclose(c.sigmoid(s), torch.sigmoid(torch.tensor(s)).numpy(), atol=1e-15)
    assert c.sigmoid(np.array([-1000.0, 1000.0])).tolist() == [0.0, 1.0]


def test_platt_fit_is_the_log_loss_minimum_on_a_grid():
    d = c.synthetic_yes_no(600, 3)
    s = c.binary_label_score(d.logits, d.yes_ids, d.no_ids)
    fit = c.fit_platt(s, d.labels, l2=0.0)
    a_grid, b_grid = np.linspace(0.2, 1.0, 81), np.linspace(-1.0, 0.5, 76)
    losses = [[c.log_loss(c.sigmoid(a * s + b), d.labels) for b in b_grid] for a in a_grid]
    i, j = np.unravel_index(np.argmin(losses), (81, 76))
    assert abs(fit.a - a_grid[i]) < 0.01 and abs(fit.b - b_grid[j]) < 0.02
    assert c.log_loss(fit(s), d.labels) <= np.min(losses) + 1e-9


def test_platt_recovers_the_generating_miscalibration():
    d = c.synthetic_yes_no(40_000, 1, slope=2.5, bias=1.0)
    s = c.binary_label_score(d.logits, d.yes_ids, d.no_ids)
    fit = c.fit_platt(s, d.labels)
    assert fit.a == pytest.approx(1 / 2.5, rel=0.05) and fit.b == pytest.approx(-1.0 / 2.5, abs=0.05)
    assert c.expected_calibration_error(fit(s), d.labels) < 0.02 < c.expected_calibration_error(c.sigmoid(s), d.labels)


def test_ece_by_hand():
    p = np.array([0.05, 0.15, 0.95, 0.95])
    y = np.array([0, 1, 1, 0])
    # bins: [0,.1): 0.05 vs 0; [.1,.2): 0.15 vs 1; [.9,1]: 0.95 vs 0.5
    assert c.expected_calibration_error(p, y) == pytest.approx((0.05 + 0.85 + 2 * 0.45) / 4)
    assert [r[2] for r in c.reliability_table(p, y)] == [1, 1, 2]


def test_inputs_refused_with_a_message():
    with pytest.raises(ValueError, match="both"):
        c.label_log_probs(np.zeros(5), {"yes": [1], "no": [1]})
    with pytest.raises(ValueError, match="token ids"):
        c.binary_label_score(np.zeros(5), [9], [0])
    with pytest.raises(ValueError, match="0 or 1"):
        c.fit_platt([0.1, 0.2], [0, 2])
