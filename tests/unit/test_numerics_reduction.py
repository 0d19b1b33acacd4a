"""lib.numerics.formats.bf16_round against torch, and lib.numerics.reduction: two reduction orders differ in
the last bits, and the greedy token flips only at near-ties."""

import numpy as np
import pytest

from lib.numerics import reduction as R
from lib.numerics.formats import bf16_round


def test_bf16_round_against_torch_and_ties_to_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -3.14159, 1e-3, 65504.0], np.float32)
    want = np.array([1.0, 1.0, 1.015625], np.float32)  # 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 ties up to 1 + 2^-6
    assert bf16_round(x[:3]).tolist() == want.tolist()
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    y = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-5, 5, 10_000)).astype(np.float32)
    y = np.concatenate([x, y])
    assert (bf16_round(y) == torch.from_numpy(y).to(torch.bfloat16).float().numpy()).all()


def test_argmax_flips_happen_only_at_near_ties():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((200, 64)).astype(np.float32)
    w = rng.standard_normal((64, 50)).astype(np.float32)
    r = R.argmax_flips(h, w, 4, output_bf16=False)
    assert r["differ_share"] > 0.5  # the orders differ in the last bits almost everywhere
    logits = h.astype(np.float64) @ w.astype(np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert (top2[r["flips"], 1] - top2[r["flips"], 0] < 1e-4).all()


def test_near_tie_problem_pairs_twin_tokens():
    x, w1, w2 = R.near_tie_problem(50, 16, 8, 1e-3, 4.0, 0)
    logits = (x @ w1).astype(np.float64) @ w2.astype(np.float64)
    twin_gap = np.abs(logits[:, 1::2] - logits[:, 0::2])
    assert twin_gap.max() < 0.01 and x.dtype == np.float32


def test_a_split_outside_the_inner_dimension_is_refused():
    with pytest.raises(ValueError, match="split"):
        R.argmax_flips(np.ones((2, 4)), np.ones((4, 3)), 9)
