"""Tiled forward (I029): equals naive attention and torch's SDPA over random shapes, masks, GQA groups
and block sizes that do and do not divide the sequence; the LSE equals torch.logsumexp; the tile
map; the -inf - (-inf) NaN reproduced and fixed; the loop's counted HBM elements equal the model.

Tolerances: FP32 accumulation vs torch in float64 on the same (FP32 / FP16- / BF16-rounded)
inputs, atol = rtol = 1e-5 (measured worst 1.4e-6); float64 accumulation vs naive float64, 1e-12.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv
from lib.attention import tiled as tl
from lib.attention import traffic as tr

TOL = 1e-5


def sdpa64(q, k, v, mask=None):
    t = [torch.from_numpy(np.ascontiguousarray(x)).double() for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True).numpy()


@st.composite
def problems(draw):
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    nq, nk, d = draw(st.integers(1, 70)), draw(st.integers(1, 70)), draw(st.integers(4, 32))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((b, hkv * group, nq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, nk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, nk, d)).astype(np.float32)
    kind = draw(st.sampled_from(["none", "causal", "window", "padding", "random", "random_sparse"]))
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = nv.causal_mask(nq, nk, draw(st.integers(-nq, nk)))
    elif kind == "window":
        mask = nv.sliding_window_mask(nq, nk, draw(st.integers(1, 8)), draw(st.integers(0, nk)))
    elif kind == "padding":
        mask = nv.padding_mask(rng.integers(0, nk + 1, b), nk, left=draw(st.booleans()))
    else:
        mask = rng.random((b, 1, nq, nk)) < (0.7 if kind == "random" else 0.05)
    blocks = (draw(st.integers(2, 24)), draw(st.integers(2, 24)))
    return q, k, v, mask, blocks


@settings(max_examples=45, deadline=None)
@given(problems(), st.sampled_from(["fp32", "fp16", "bf16"]))
def test_tiled_matches_naive_and_torch(problem, dtype):
    q, k, v, mask, (br, bc) = problem
    q, k, v = (nv.round_to_dtype(x, dtype) for x in (q, k, v))
    r = tl.tiled_attention(q, k, v, mask, block_q=br, block_k=bc)
    np.testing.assert_allclose(r.out, sdpa64(q, k, v, mask), rtol=TOL, atol=TOL)
    want, want_lse = nv.naive_attention(q, k, v, mask, return_lse=True)
    np.testing.assert_allclose(r.out, want, rtol=TOL, atol=TOL)
    np.testing.assert_array_equal(np.isneginf(r.lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(r.lse[fin], want_lse[fin], rtol=TOL, atol=TOL)


@settings(max_examples=30, deadline=None)
@given(problems())
def test_float64_tiled_equals_naive_and_lse_is_torch_logsumexp(problem):
    q, k, v, mask, (br, bc) = problem
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    r = tl.tiled_attention(q, k, v, mask, block_q=br, block_k=bc, acc_dtype=np.float64, skip_masked_tiles=False)
    np.testing.assert_allclose(r.out, nv.naive_attention(q, k, v, mask, acc_dtype=np.float64), atol=1e-12)
    group = q.shape[1] // k.shape[1]
    s = torch.from_numpy(q) @ torch.from_numpy(np.repeat(k, group, 1)).transpose(-1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~torch.from_numpy(np.broadcast_to(mask, s.shape).copy()), -torch.inf)
    want = torch.logsumexp(s, -1).numpy()
    np.testing.assert_array_equal(np.isneginf(r.lse), np.isneginf(want))
    np.testing.assert_allclose(r.lse[np.isfinite(want)], want[np.isfinite(want)], atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 24), st.integers(1, 24), st.integers(0, 70),
       st.one_of(st.none(), st.integers(1, 10)))
def test_causal_tile_map_closed_form_equals_the_mask(nq, nk, br, bc, offset, window):
    mask = nv.causal_mask(nq, nk, offset) if window is None else nv.sliding_window_mask(nq, nk, window, offset)
    got = tl.causal_tile_map(nq, nk, br, bc, offset, window)
    np.testing.assert_array_equal(got, tl.tile_map(mask, br, bc))
    c = tl.tile_counts(got)
    assert c["total"] == -(-nq // br) * -(-nk // bc) == c["skip"] + c["computed"]


def test_square_causal_skips_the_upper_triangle_of_tiles():
    c = tl.tile_counts(tl.causal_tile_map(64, 64, 16, 16))
    assert c == {"skip": 6, "partial": 4, "full": 6, "computed": 10, "total": 16}  # Tr(Tr-1)/2 = 6 skipped


def test_nan_edge_case_reproduced_and_fixed():
    """A sliding window: rows 5..7 see no key of the first key tile, which rows 3..4's block... the
    tile is PARTIAL for the block, so it is computed; for rows whose max is still -inf it gives
    exp(-inf - (-inf)) = NaN, which survives the later tile that holds their keys."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 4)).astype(np.float32) for _ in range(3))
    window = nv.sliding_window_mask(8, 8, 2)
    raw = tl.tiled_attention(q, k, v, window, block_q=4, block_k=4, guard_masked_rows=False)
    nan_rows = np.isnan(raw.out[0, 0]).any(axis=1)
    assert nan_rows.tolist() == [False] * 5 + [True] * 3  # every row HAS keys; rows 5..7 are NaN anyway
    assert window[5:].any(axis=1).all()
    fixed = tl.tiled_attention(q, k, v, window, block_q=4, block_k=4)
    np.testing.assert_allclose(fixed.out, nv.naive_attention(q, k, v, window), atol=TOL)
    np.testing.assert_allclose(fixed.out, sdpa64(q, k, v, window), atol=TOL)


def test_left_padding_tile_without_skipping_poisons_every_row():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)).astype(np.float32) for _ in range(3))
    pad = nv.padding_mask([3], 8, left=True)  # keys 0..4 are padding; the first 4-key tile is all padding
    raw = tl.tiled_attention(q, k, v, pad, block_q=4, block_k=4, guard_masked_rows=False, skip_masked_tiles=False)
    assert np.isnan(raw.out).all()
    skipping = tl.tiled_attention(q, k, v, pad, block_q=4, block_k=4, guard_masked_rows=False)
    assert skipping.tiles[:, 0].tolist() == [tl.SKIP, tl.SKIP] and np.isfinite(skipping.out).all()
    guarded = tl.tiled_attention(q, k, v, pad, block_q=4, block_k=4, skip_masked_tiles=False)
    np.testing.assert_allclose(guarded.out, sdpa64(q, k, v, pad), atol=TOL)


def test_fully_masked_rows_give_zero_and_minus_inf_lse():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)).astype(np.float32) for _ in range(3))
    mask = nv.causal_mask(6, 6, -2)  # bottom-aligned with more queries than keys: rows 0, 1 see nothing
    r = tl.tiled_attention(q, k, v, mask, block_q=3, block_k=2)
    assert (r.out[0, 0, :2] == 0).all() and np.isneginf(r.lse[0, 0, :2]).all()
    np.testing.assert_allclose(r.out, sdpa64(q, k, v, mask), atol=TOL)
    assert np.isnan(tl.tiled_attention(q, k, v, mask, block_q=3, block_k=2, guard_masked_rows=False).out[0, 0, :2]).all()


def test_history_records_the_running_max_and_sum():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 5, 4)) for _ in range(3))
    r = tl.tiled_attention(q, k, v, causal=True, block_q=5, block_k=2, acc_dtype=np.float64, record=True)
    s = (q[0, 0] @ k[0, 0].T) / 2
    s[~nv.causal_mask(5, 5)] = -np.inf
    for j, stop in enumerate([2, 4, 5], start=1):
        np.testing.assert_allclose(r.m_history[j, 0, 0], s[:, :stop].max(axis=1))
        np.testing.assert_allclose(r.l_history[j, 0, 0], np.exp(s[:, :stop] - s[:, :stop].max(axis=1, keepdims=True)).sum(1))
    np.testing.assert_allclose(r.lse[0, 0], r.m_history[-1, 0, 0] + np.log(r.l_history[-1, 0, 0]))


def test_rescale_diagonal():
    d = tl.rescale_diagonal([1.0, -np.inf, 0.0], [2.0, -np.inf, 0.0])
    np.testing.assert_allclose(d, np.diag([np.exp(-1), 0.0, 1.0]))
    assert np.isnan(tl.rescale_diagonal([-np.inf], [-np.inf], guard_masked_rows=False)).any()
    with pytest.raises(ValueError, match="m_new must be >="):
        tl.rescale_diagonal([2.0], [1.0])


@pytest.mark.parametrize("n, d, br, bc", [(8, 4, 4, 4), (10, 3, 4, 3), (7, 2, 7, 1)])
def test_counted_io_equals_the_fa2_model(n, d, br, bc):
    """Loop's counted HBM elements equal lib.attention.traffic's FA2 count (hand count: Q once,
    K and V once per query block, O and LSE once); with the causal map, the causal model."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, n, d)) for _ in range(3))
    r = tl.tiled_attention(q, k, v, block_q=br, block_k=bc)
    tr_blocks = -(-n // br)
    assert r.elements_read == n * d + 2 * tr_blocks * n * d
    assert r.elements_written == n * d + n
    model = tr.tiled_traffic(n, d, br, bc, "fp32", stats_dtype="fp32")
    assert r.elements_read * 4 == model.read_bytes and r.elements_written * 4 == model.write_bytes
    rc = tl.tiled_attention(q, k, v, causal=True, block_q=br, block_k=bc)
    causal_model = tr.tiled_traffic(n, d, br, bc, "fp32", causal=True)
    assert rc.elements_read * 4 == causal_model.read_bytes


def test_bad_inputs():
    x = np.zeros((1, 1, 4, 4))
    with pytest.raises(ValueError, match="block_q"):
        tl.tiled_attention(x, x, x, block_q=0)
    with pytest.raises(ValueError, match="allowed must be a boolean"):
        tl.tile_map(np.zeros((4, 4)), 2, 2)
    with pytest.raises(ValueError, match="block"):
        tl.block_ranges(4, 0)
    with pytest.raises(ValueError, match="window"):
        tl.causal_tile_map(4, 4, 2, 2, window=0)
