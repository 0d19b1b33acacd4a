"""lib.numerics.determinism: one row alone vs inside a batch, a greedy toy decode alone vs batched,
and the step-by-step comparison (torch on the CPU; skipped without torch)."""

import numpy as np
import pytest

from lib.numerics import determinism as D

torch = pytest.importorskip("torch")


def test_row_measurement_counts_differing_bits_like_a_direct_comparison():
    m = D.row_alone_vs_batch(512, 64, [2, 8], "fp32", seed=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 512, generator=g)
    w = torch.randn(512, 64, generator=g) / 512**0.5
    with D.one_thread():  # the measurement's own setting: one thread, as the BLAS path may depend on it
        alone = (x[:1] @ w).numpy()
        rows = {b: (x[:b] @ w)[:1].numpy() for b in m.batches}
    for b, d in zip(m.batches, m.differing, strict=True):
        assert d == int(np.sum(rows[b].view(np.uint32) != alone.view(np.uint32)))
    exact = x[:1].double() @ w.double()
    assert np.abs(alone - exact.numpy()).max() < 512 * 2**-24 * float((x[:1].abs() @ w.abs()).max())  # within fp32 rounding
    assert m.invariant == (not any(m.differing))


def test_toy_greedy_is_deterministic_for_one_shape_and_rows_are_independent_in_exact_arithmetic():
    a = D.toy_greedy.__wrapped__(1, 30, 32, 64, 2.0, 0)
    b = D.toy_greedy.__wrapped__(1, 30, 32, 64, 2.0, 0)
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0])
    c = D.toy_greedy(4, 30, 32, 64, 2.0, 0)
    # the batched run is the same model: its row-0 logits agree with the alone run to float32 rounding at step 0
    assert np.allclose(a[1][0], c[1][0], rtol=1e-5, atol=1e-5)
    assert c[0].flags.writeable is False and c[1].flags.writeable is False  # cached results are read-only


def test_first_divergence_finds_bits_and_tokens():
    la = np.zeros((5, 3), np.float32)
    lb = la.copy()
    lb[2, 1] = np.nextafter(np.float32(0), np.float32(1))  # one bit at step 2
    ta = np.array([0, 0, 0, 1, 1])
    tb = np.array([0, 0, 0, 2, 2])
    d = D.first_divergence(ta, la, tb, lb)
    assert (d.first_bits, d.first_token, d.steps) == (2, 3, 5)
    same = D.first_divergence(ta, la, ta, la)
    assert same.first_bits is None and same.first_token is None and same.max_diff_before_flip == 0.0
    with pytest.raises(ValueError, match="same steps"):
        D.first_divergence(ta, la, ta[:3], la[:3])


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with D.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="dtype"):
        D.row_alone_vs_batch(8, 8, [2], "fp8")
    with pytest.raises(ValueError, match="batch"):
        D.row_alone_vs_batch(8, 8, [1])
    with pytest.raises(ValueError, match="gain"):
        D.toy_greedy(1, 5, 8, 8, 0.0, 0)
