"""Split-KV decode attention (I094): split equals unsplit (and torch's SDPA) for any split layout,
empty splits included; the unguarded merge reproduces the NaN; the occupancy arithmetic; the
practice grader. Tolerance: FP32 accumulation vs torch float64, atol = rtol = 1e-5; float64
accumulation vs unsplit float64, 1e-12."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv
from lib.attention import split_kv as sk
from lib.attention import split_kv_practice as sp
from lib.registry.hardware import gpu


def sdpa64(q, k, v, mask=None):
    t = [torch.from_numpy(np.ascontiguousarray(x)).double() for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True).numpy()


@st.composite
def decode_problems(draw):
    b, hkv, group = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    n, d, nq = draw(st.integers(0, 70)), draw(st.integers(4, 32)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((b, hkv * group, nq, d)).astype(np.float32) * draw(st.sampled_from([1.0, 1.0, 20.0]))
    k = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, n, d)).astype(np.float32)
    lengths = draw(st.one_of(st.none(), st.lists(st.integers(0, n), min_size=b, max_size=b)))
    return q, k, v, lengths


@settings(max_examples=40, deadline=None)
@given(decode_problems(), st.integers(1, 80))
def test_split_equals_unsplit_for_flash_decoding_chunks(problem, splits):
    q, k, v, lengths = problem
    mask = None if lengths is None else nv.padding_mask(lengths, k.shape[2])
    r = sk.split_kv_attention(q, k, v, splits, kv_lengths=lengths)
    assert len(r.ranges) == splits
    want, want_lse = nv.naive_attention(q, k, v, mask, return_lse=True)
    np.testing.assert_allclose(r.out, want, rtol=1e-5, atol=1e-5)
    if k.shape[2]:
        np.testing.assert_allclose(r.out, sdpa64(q, k, v, mask), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isneginf(r.lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(r.lse[fin], want_lse[fin], rtol=1e-5, atol=1e-5)
    assert np.isfinite(r.out).all()


@settings(max_examples=40, deadline=None)
@given(decode_problems(), st.lists(st.integers(0, 12), min_size=1, max_size=10))
def test_any_split_layout_with_empty_splits_equals_unsplit(problem, sizes):
    q, k, v, _ = problem
    n = sum(sizes)
    rng = np.random.default_rng(n)
    k = rng.standard_normal(k.shape[:2] + (n, k.shape[3]))
    v = rng.standard_normal(k.shape)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    ranges = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
    r = sk.split_kv_attention(q.astype(np.float64), k, v, ranges=ranges, acc_dtype=np.float64)
    np.testing.assert_allclose(r.out, nv.naive_attention(q, k, v, acc_dtype=np.float64), atol=1e-12)
    assert (r.empty_splits[:, 0] == (np.array(sizes) == 0)).all()


def test_empty_split_example_and_the_unguarded_nan():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 1, 8)), rng.standard_normal((1, 2, 5, 8)), rng.standard_normal((1, 2, 5, 8))
    assert sk.split_ranges(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]  # ceil(5 / 4) = 2: the last split is empty
    r = sk.split_kv_attention(q, k, v, 4, acc_dtype=np.float64)
    assert np.isneginf(r.partial_lse[3]).all() and (r.partial_out[3] == 0).all()
    np.testing.assert_allclose(r.out, sdpa64(q, k, v), atol=1e-12)
    raw = sk.split_kv_attention(q, k, v, 4, guard_empty_splits=False)
    assert np.isnan(raw.partial_out[3]).all()  # 0 / 0 in the empty split
    assert np.isnan(raw.out).all()  # ... and 0 x NaN in the merge
    none = sk.split_kv_attention(q, k[:, :, :0], v[:, :, :0], 3)
    assert (none.out == 0).all() and np.isneginf(none.lse).all()
    assert np.isnan(sk.merge_partials([np.zeros(2)], [np.array(-np.inf)], guard_empty_splits=False)[0]).all()


def test_merge_is_exact_at_huge_scores():
    q = np.full((1, 1, 1, 4), 300.0)  # scores ~ 1e5: exp overflows without the max
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((1, 1, 9, 4)), rng.standard_normal((1, 1, 9, 4))
    r = sk.split_kv_attention(q, k, v, 3, acc_dtype=np.float64)
    np.testing.assert_allclose(r.out, nv.naive_attention(q, k, v, acc_dtype=np.float64), atol=1e-12)


def test_occupancy_at_batch_one():
    h100 = gpu("h100-sxm")
    occ = sk.decode_occupancy(1, 8, gpu="h100-sxm")
    assert occ.thread_blocks == 8 and occ.sm_count == h100.compute_units and occ.waves == 1
    assert occ.sm_busy_fraction == pytest.approx(8 / h100.compute_units)
    # ceil(132 / 8) = 17 splits overshoots one wave by 4 blocks: a second, nearly empty wave
    assert sk.decode_occupancy(1, 8, 17, sm_count=132).sm_busy_fraction == pytest.approx(136 / 264)
    assert sk.decode_occupancy(1, 8, 16, sm_count=132).sm_busy_fraction == pytest.approx(128 / 132)
    assert sk.decode_occupancy(3, 8, 8, sm_count=132) == sk.DecodeOccupancy(192, 132, 1, 2, 192 / 264)


def test_flash_attention_split_heuristic():
    # the worked example in flash-attn's comment: 48 blocks on 108 slots, 2 splits 0.89, 3 splits 0.67
    assert sk.wave_efficiency(96, 108) == pytest.approx(0.889, abs=1e-3)
    assert sk.wave_efficiency(144, 108) == pytest.approx(2 / 3)
    assert sk.flash_num_splits(48, 108, 64) == 2
    assert sk.flash_num_splits(90, 108, 64) == 1  # already 80% full: no split
    s = sk.decode_num_splits(1, 8, 8192, 128, sm_count=132)  # 2 blocks per SM, 64 key blocks of 128
    assert s == 32 and sk.wave_efficiency(8 * s, 264) > 0.95
    assert sk.decode_num_splits(64, 8, 8192, sm_count=132) == 1
    for blocks, slots, key_blocks in [(1, 264, 64), (8, 264, 5), (7, 100, 1000), (3, 17, 2)]:
        s = sk.flash_num_splits(blocks, slots, key_blocks)  # brute force of the rule
        ok = [t for t in range(1, min(128, slots, key_blocks) + 1)
              if t == 1 or -(-key_blocks // t) != -(-key_blocks // (t - 1))]
        best = max(sk.wave_efficiency(blocks * t, slots) for t in ok)
        assert s == min(t for t in ok if sk.wave_efficiency(blocks * t, slots) >= 0.85 * best)


def test_reference_passes_and_every_variant_fails_for_its_reason():
    assert sp.check(sp.Reference).passed
    assert sp.check(sp.Skeleton).status == "not implemented"
    expected_case = {"no_max_lse": "scores in the thousands", "merge_without_max": "scores in the thousands",
                     "empty_split_nan": "a split with no keys", "empty_lse_zero": "a split with no keys"}
    for name in sp.VARIANTS:
        report = sp.check(sp.variant(name))
        assert report.status == "failed", name
        assert expected_case.get(name, "") in report.failure.splitlines()[0], (name, report.failure)


def test_bad_inputs():
    x = np.zeros((1, 1, 1, 4))
    k = np.zeros((1, 1, 5, 4))
    with pytest.raises(ValueError, match="ranges"):
        sk.split_kv_attention(x, k, k, ranges=[(0, 2), (3, 5)])
    with pytest.raises(ValueError, match="kv_lengths"):
        sk.split_kv_attention(x, k, k, 2, kv_lengths=[6])
    with pytest.raises(ValueError, match="num_splits"):
        sk.split_ranges(5, 0)
    with pytest.raises(ValueError, match="sm_count"):
        sk.decode_occupancy(1, 8)
    with pytest.raises(ValueError, match="outs and lses"):
        sk.merge_partials([], [])
    with pytest.raises(ValueError, match="key_mask"):
        sk.partial_attention(x, k, k, np.ones(5, bool))
    with pytest.raises(ValueError, match="variant"):
        sp.variant("typo")
