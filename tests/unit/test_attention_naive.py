"""Naive attention (W01) against torch's scaled_dot_product_attention.

Tolerances (inputs are standard normals; outputs are convex combinations of V rows):
- FP32 accumulation vs torch in float64 on the SAME inputs (FP32, or FP16/BF16-rounded):
  atol = rtol = 1e-5 (measured worst 1.4e-6 over 300 random cases up to seq 70, d 32).
- vs torch run natively in the low-precision dtype (its output rounded to that dtype):
  |ours - torch| <= c x max|V| with c = 1e-5 (fp32), 2e-3 (fp16, about 2 eps_fp16 = 2 x 2^-10),
  1.6e-2 (bf16, about 2 eps_bf16 = 2 x 2^-7); measured worst 4.6e-7, 3.9e-4, 3.8e-3.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv

FP32_TOL = 1e-5
LOW_PRECISION_TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sdpa(q, k, v, mask=None, dtype=torch.float64, **kw):
    """torch's SDPA on numpy inputs (GQA by enable_gqa), returned as float64 numpy."""
    t = [torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    if m is not None and m.dtype != torch.bool:
        m = m.to(dtype)
    return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True, **kw).double().numpy()


@st.composite
def problems(draw):
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    nq, nk, d = draw(st.integers(1, 70)), draw(st.integers(1, 70)), draw(st.integers(4, 32))
    dv = draw(st.sampled_from([d, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((b, hkv * group, nq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, nk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, nk, dv)).astype(np.float32)
    kind = draw(st.sampled_from(["none", "causal", "padding", "random", "random_sparse"]))
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = nv.causal_mask(nq, nk, draw(st.integers(-nq, nk)))[None, None]
    elif kind == "padding":
        mask = nv.padding_mask(rng.integers(0, nk + 1, b), nk, left=draw(st.booleans()))
    else:  # random booleans; the sparse kind leaves many rows with no key at all
        mask = rng.random((b, 1, nq, nk)) < (0.7 if kind == "random" else 0.05)
    return q, k, v, mask


@settings(max_examples=50, deadline=None)
@given(problems(), st.sampled_from(["fp32", "fp16", "bf16"]))
def test_matches_torch_sdpa(problem, dtype):
    q, k, v, mask = problem
    q, k, v = (nv.round_to_dtype(x, dtype) for x in (q, k, v))
    ours = nv.naive_attention(q, k, v, mask)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, sdpa(q, k, v, mask), rtol=FP32_TOL, atol=FP32_TOL)
    low = sdpa(q, k, v, mask, dtype=TORCH_DTYPE[dtype])
    assert np.abs(ours - low).max() <= LOW_PRECISION_TOL[dtype] * max(np.abs(v).max(), 1e-30)


@settings(max_examples=30, deadline=None)
@given(problems())
def test_float16_numpy_inputs_and_float64_accumulation(problem):
    q, k, v, mask = problem
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    want = sdpa(q16, k16, v16, mask)
    np.testing.assert_allclose(nv.naive_attention(q16, k16, v16, mask), want, rtol=FP32_TOL, atol=FP32_TOL)
    np.testing.assert_allclose(nv.naive_attention(q16, k16, v16, mask, acc_dtype=np.float64), want, rtol=1e-12, atol=1e-12)


def test_causal_flag_is_torch_is_causal_and_offset_is_bottom_right():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 8)) for n in (3, 7, 7))
    np.testing.assert_allclose(nv.naive_attention(q, k, v, causal=True, acc_dtype=np.float64),
                               sdpa(q, k, v, is_causal=True), atol=1e-12)
    bottom = nv.naive_attention(q, k, v, causal=True, query_offset=4, acc_dtype=np.float64)
    np.testing.assert_allclose(bottom, sdpa(q, k, v, nv.causal_mask(3, 7, 4)), atol=1e-12)
    assert np.abs(bottom - sdpa(q, k, v, is_causal=True)).max() > 0.01  # the two alignments differ


def test_additive_mask_matches_torch_float_mask():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 2, n, 8)) for n in (5, 6, 6))
    add = rng.standard_normal((2, 1, 5, 6))
    add[0, 0, 1, :] = -np.inf  # a fully masked row through the additive path
    add[1, 0, :, 2] = -np.inf
    ours = nv.naive_attention(q, k, v, add, acc_dtype=np.float64)
    np.testing.assert_allclose(ours, sdpa(q, k, v, add), atol=1e-12)
    assert (ours[0, :, 1] == 0).all()


def test_fully_masked_row_returns_zeros_like_torch_sdpa_while_softmax_gives_nan():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    mask = np.ones((4, 4), bool)
    mask[2] = False
    out, lse = nv.naive_attention(q, k, v, mask, return_lse=True)
    assert (out[:, :, 2] == 0).all() and np.isneginf(lse[:, :, 2]).all()
    assert np.isfinite(out).all()
    # torch's SDPA (CPU build, math and flash backends) returns zeros for that row ...
    assert (sdpa(q, k, v, mask)[:, :, 2] == 0).all()
    # ... while torch.softmax of an all -inf row is NaN, and so is the unguarded reference
    assert torch.isnan(torch.softmax(torch.full((4,), -torch.inf), -1)).all()
    raw = nv.naive_attention(q, k, v, mask, guard_masked_rows=False)
    assert np.isnan(raw[:, :, 2]).all() and np.isfinite(np.delete(raw, 2, axis=2)).all()


def test_finite_large_negative_mask_averages_instead_of_masking():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 2, 4)).astype(np.float32) for _ in range(3))
    add = np.zeros((2, 2), np.float32)
    add[0] = np.finfo(np.float32).min  # "masked" with finfo.min: the row still attends, uniformly
    out = nv.naive_attention(q, k, v, add)
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0].mean(axis=0), rtol=1e-6)


def test_max_subtraction_prevents_overflow():
    q = np.full((1, 1, 1, 4), 8.0, np.float32)
    k = np.full((1, 1, 3, 4), 8.0, np.float32)  # scores 8 * 8 * 4 / 2 = 128
    v = np.random.default_rng(4).standard_normal((1, 1, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(nv.naive_attention(q, k, v), v.mean(axis=2, keepdims=True), rtol=1e-6)
    assert np.isnan(nv.naive_attention(q, k, v, subtract_max=False)).all()  # exp(128) = inf in FP32; inf / inf
    small = q / 4  # scores 8: fine in FP32 even without max subtraction, but exp(12) overflows FP16
    assert np.isfinite(nv.naive_attention(small, k, v, subtract_max=False)).all()
    q16 = np.full((1, 1, 1, 4), 2.0, np.float32)  # scores 2 * 8 * 4 / 2 = 32 > 11.09
    assert np.isnan(nv.naive_attention(q16, k, v, acc_dtype=np.float16, subtract_max=False)).all()
    assert np.isfinite(nv.naive_attention(q16, k, v, acc_dtype=np.float16)).all()


def test_unscaled_scores_saturate():
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((1, 1, 64, 128)), rng.standard_normal((1, 1, 64, 128))
    p_scaled = nv.attention_probabilities(q, k, acc_dtype=np.float64)
    p_raw = nv.attention_probabilities(q, k, scale=1.0, acc_dtype=np.float64)
    assert p_raw.max(axis=-1).mean() > 0.7 > 0.3 > p_scaled.max(axis=-1).mean()
    np.testing.assert_allclose(p_scaled.sum(-1), 1, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=50))
def test_round_to_bf16_and_fp16_match_torch(values):
    x = np.array(values, np.float32)
    t = torch.from_numpy(x.copy())
    for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        got, want = nv.round_to_dtype(x, name), t.to(dt).float().numpy()
        assert ((got == want) | (np.isnan(got) & np.isnan(want))).all(), name


def test_masks_and_gqa_mapping():
    assert nv.causal_mask(2, 4, 2).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert nv.causal_mask(3, 2, -1).tolist() == [[False, False], [True, False], [True, True]]
    assert nv.sliding_window_mask(3, 3, 2).tolist() == [[True, False, False], [True, True, False], [False, True, True]]
    assert nv.padding_mask([1, 3], 3)[:, 0, 0].tolist() == [[True, False, False], [True, True, True]]
    assert nv.padding_mask([1], 3, left=True)[0, 0, 0].tolist() == [False, False, True]
    assert [nv.kv_head_of(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((1, 4, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    out = nv.naive_attention(q, k, v, acc_dtype=np.float64)
    for h in range(4):
        kh = nv.kv_head_of(h, 4, 2)
        one = nv.naive_attention(q[:, h:h + 1], k[:, kh:kh + 1], v[:, kh:kh + 1], acc_dtype=np.float64)
        np.testing.assert_allclose(out[:, h:h + 1], one, atol=1e-12)


def test_lse_matches_torch_logsumexp():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((1, 2, 6, 8)), rng.standard_normal((1, 2, 9, 8)), rng.standard_normal((1, 2, 9, 8))
    mask = rng.random((6, 9)) < 0.6
    _, lse = nv.naive_attention(q, k, v, mask, acc_dtype=np.float64, return_lse=True)
    s = torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2) / np.sqrt(8)
    want = torch.logsumexp(s.masked_fill(~torch.from_numpy(mask), -torch.inf), -1).numpy()
    np.testing.assert_allclose(lse, want, atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda a: nv.naive_attention(a[0], a[1][:, :, :, :3], a[2]), "head_dim"),
    (lambda a: nv.naive_attention(a[0][:, :3], a[1], a[2]), "multiple of the kv heads"),
    (lambda a: nv.naive_attention(a[0][0], a[1], a[2]), "q must have 4 dimensions"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2][:, :, :2]), "k and v"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], np.ones((2, 2), bool)), "mask of shape"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], np.full((4, 5), np.inf)), "NaN or \\+inf"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], np.ones((4, 5), np.int64)), "mask must be boolean"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], acc_dtype=np.int32), "acc_dtype"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], query_offset=1), "query_offset only applies"),
    (lambda a: nv.naive_attention(a[0], a[1], a[2], scale=0), "scale"),
    (lambda a: nv.naive_attention(a[0].astype(int), a[1], a[2]), "q must be a floating-point"),
    (lambda a: nv.round_to_dtype(a[0], "fp8"), "dtype must be one of"),
    (lambda a: nv.kv_head_of(4, 4, 2), "query_head"),
    (lambda a: nv.padding_mask([6], 5), "kv_lengths"),
])
def test_bad_inputs_raise_value_error_naming_the_input(call, match):
    rng = np.random.default_rng(8)
    args = (rng.standard_normal((1, 4, 4, 8)), rng.standard_normal((1, 2, 5, 8)), rng.standard_normal((1, 2, 5, 8)))
    with pytest.raises(ValueError, match=match):
        call(args)
