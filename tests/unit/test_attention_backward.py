"""Tiled backward with recomputation (I031) against torch autograd through SDPA.

Tolerances: float64 accumulation vs torch float64 autograd, atol = rtol = 1e-9; FP32 accumulation
(inputs rounded to FP32, FP16 or BF16) vs torch float64 autograd on the same inputs,
atol = rtol = 3e-5 (gradients sum O(N) terms; measured worst |err| / (1 + |ref|) = 3.1e-6 over
200 random cases up to seq 40, d 32).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import backward as bw
from lib.attention import naive as nv
from lib.attention import tiled as tl


def torch_grads(q, k, v, d_out, mask):
    t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    if m is not None and m.dtype != torch.bool:
        m = m.double()
    out = F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True)
    out.backward(torch.from_numpy(d_out).double())
    return out.detach().numpy(), [x.grad.numpy() for x in t]


@st.composite
def problems(draw):
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    nq, nk, d = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(4, 32))
    dv = draw(st.sampled_from([d, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((b, hkv * group, nq, d))
    k = rng.standard_normal((b, hkv, nk, d))
    v = rng.standard_normal((b, hkv, nk, dv))
    d_out = rng.standard_normal((b, hkv * group, nq, dv))
    kind = draw(st.sampled_from(["none", "causal", "padding", "random", "random_sparse", "additive"]))
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = nv.causal_mask(nq, nk, draw(st.integers(-nq, nk)))
    elif kind == "padding":
        mask = nv.padding_mask(rng.integers(0, nk + 1, b), nk, left=draw(st.booleans()))
    elif kind == "additive":
        mask = np.where(rng.random((b, 1, nq, nk)) < 0.8, rng.standard_normal((b, 1, nq, nk)), -np.inf)
    else:
        mask = rng.random((b, 1, nq, nk)) < (0.7 if kind == "random" else 0.05)
    return q, k, v, d_out, mask, (draw(st.integers(2, 16)), draw(st.integers(2, 16)))


@settings(max_examples=30, deadline=None)
@given(problems())
def test_tiled_and_naive_backward_match_autograd_in_float64(problem):
    q, k, v, d_out, mask, (br, bc) = problem
    out, want = torch_grads(q, k, v, d_out, mask)
    fwd = tl.tiled_attention(q, k, v, mask, block_q=br, block_k=bc, acc_dtype=np.float64)
    np.testing.assert_allclose(fwd.out, out, atol=1e-12)
    tiled = bw.tiled_attention_backward(q, k, v, fwd.out, fwd.lse, d_out, mask, block_q=br, block_k=bc,
                                        acc_dtype=np.float64)
    naive = bw.naive_attention_backward(q, k, v, d_out, mask, acc_dtype=np.float64)
    for grads in (tiled, naive):
        for got, ref in zip((grads.dq, grads.dk, grads.dv), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)
    # the identity that removes the N x N pass: rowsum(P o dP) = rowsum(dO o O)
    np.testing.assert_allclose(tiled.delta, naive.delta, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(problems(), st.sampled_from(["fp32", "fp16", "bf16"]))
def test_fp32_accumulation_backward(problem, dtype):
    q, k, v, d_out, mask, (br, bc) = problem
    q, k, v, d_out = (nv.round_to_dtype(x, dtype) for x in (q, k, v, d_out))
    _, want = torch_grads(q, k, v, d_out, mask)
    fwd = tl.tiled_attention(q, k, v, mask, block_q=br, block_k=bc)
    grads = bw.tiled_attention_backward(q, k, v, fwd.out, fwd.lse, d_out, mask, block_q=br, block_k=bc)
    assert grads.dq.dtype == np.float32
    for got, ref in zip((grads.dq, grads.dk, grads.dv), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=3e-5, atol=3e-5)


def test_fully_masked_rows_have_zero_gradients_like_torch():
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 2, 5, 4)) for _ in range(4))
    mask = np.ones((5, 5), bool)
    mask[1] = False
    mask[:, 3] = False  # key 3 is seen by nobody
    fwd = tl.tiled_attention(q, k, v, mask, block_q=2, block_k=2, acc_dtype=np.float64)
    grads = bw.tiled_attention_backward(q, k, v, fwd.out, fwd.lse, g, mask, block_q=2, block_k=2,
                                        acc_dtype=np.float64)
    assert (grads.dq[:, :, 1] == 0).all() and (grads.dk[:, :, 3] == 0).all() and (grads.dv[:, :, 3] == 0).all()
    _, want = torch_grads(q, k, v, g, mask)
    assert (want[0][:, :, 1] == 0).all()
    np.testing.assert_allclose(grads.dq, want[0], atol=1e-12)


def test_memory_saved_and_flops():
    # batch 1, 64 heads, 8K tokens, BF16: 64 x 8192^2 x 2 B of probabilities per layer, minus 64 x 8192 x 4 B of LSE
    assert bw.probabilities_bytes(1, 64, 8192) == 64 * 8192**2 * 2 == 8_589_934_592
    assert bw.backward_memory_saved_bytes(1, 64, 8192) == 8_589_934_592 - 64 * 8192 * 4
    assert bw.backward_memory_saved_bytes(2, 8, 100, "fp32", stored_matrices=2) == 2 * 8 * (2 * 100**2 * 4 - 100 * 4)
    assert bw.backward_flops(10, 8) == 2.5 * 2 * 100 * 16  # 2.5 x the forward's 4 N^2 d
    assert bw.backward_flops(10, 8, recompute=False) == 2 * 2 * 100 * 16
    assert bw.backward_flops(4, 2, causal=True) == 2 * 10 * 10


def test_bad_inputs():
    x = np.zeros((1, 1, 3, 4))
    with pytest.raises(ValueError, match="d_out"):
        bw.naive_attention_backward(x, x, x, np.zeros((1, 1, 3, 5)))
    with pytest.raises(ValueError, match="lse"):
        bw.tiled_attention_backward(x, x, x, x, np.zeros((1, 1, 2)), x)
    with pytest.raises(ValueError, match="lse must not"):
        bw.tiled_attention_backward(x, x, x, x, np.full((1, 1, 3), np.nan), x)
    with pytest.raises(ValueError, match="heads"):
        bw.probabilities_bytes(1, 0, 8)
    with pytest.raises(ValueError, match="dtype"):
        bw.probabilities_bytes(1, 1, 8, dtype="f16")
