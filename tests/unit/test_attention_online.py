"""Online softmax (I028): the recurrence against torch.softmax / logsumexp, and the counted reads
against the hand count (3N safe, 2N online, N fused). Tolerance: FP32 accumulation vs torch in
float64, atol = rtol = 1e-5; float64 accumulation, 1e-12."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv
from lib.attention import online_softmax as osm

scores = st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=70)


def masked(values, drop):
    x = np.array(values, np.float32)
    x[np.array(drop[: x.size] + [False] * (x.size - len(drop)))[: x.size]] = -np.inf
    return x


@settings(max_examples=80, deadline=None)
@given(scores, st.lists(st.booleans(), max_size=70), st.integers(1, 16))
def test_three_ways_agree_with_torch(values, drop, block):
    x = masked(values, drop)
    want = torch.softmax(torch.from_numpy(x).double(), -1).numpy()
    p3, io3 = osm.safe_softmax(x)
    p2, io2 = osm.online_softmax(x, block_size=block)
    if np.isneginf(x).all():  # torch gives NaN; the book's guard gives zeros
        assert np.isnan(want).all() and (p3 == 0).all() and (p2 == 0).all()
    else:
        np.testing.assert_allclose(p3, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(p2, want, rtol=1e-5, atol=1e-5)
    n = x.size
    assert (io3.reads, io3.writes) == (3 * n, n) == (osm.softmax_io(n, "three_pass").reads, osm.softmax_io(n, "three_pass").writes)
    assert (io2.reads, io2.writes) == (2 * n, n) == (osm.softmax_io(n, "online").reads, osm.softmax_io(n, "online").writes)


@settings(max_examples=80, deadline=None)
@given(scores, st.lists(st.booleans(), max_size=70), st.integers(1, 16))
def test_trace_is_the_recurrence(values, drop, block):
    x = masked(values, drop).astype(np.float64)
    t = osm.online_softmax_trace(x, block, acc_dtype=np.float64)
    assert t.reads == x.size and t.ends[-1] == x.size and len(t.m) == -(-x.size // block) + 1
    assert (t.m[1:] >= t.m[:-1]).all()  # a running max never decreases
    assert ((t.rescale >= 0) & (t.rescale <= 1)).all()
    for step in range(1, len(t.m)):  # each (m, l) is the max and sum over the prefix seen so far
        prefix = x[: t.ends[step]]
        assert t.m[step] == prefix.max()
        if np.isfinite(t.m[step]):
            np.testing.assert_allclose(t.l[step], np.exp(prefix - t.m[step]).sum(), rtol=1e-12)
        else:
            assert t.l[step] == 0
    want = torch.logsumexp(torch.from_numpy(x), -1).item()
    assert t.lse == want or abs(t.lse - want) < 1e-12


def test_unguarded_trace_turns_nan_while_the_max_is_minus_inf():
    x = np.array([-np.inf, -np.inf, 1.0, 2.0])
    assert np.isnan(osm.online_softmax_trace(x, 1, guard_masked_rows=False).l[1:]).all()
    t = osm.online_softmax_trace(x, 1)
    assert t.l[1] == t.l[2] == 0 and t.l[3] == 1 and np.isfinite(t.lse)
    assert np.isnan(osm.online_softmax_trace(x, 2, guard_masked_rows=False).l[1:]).all()  # a block of -inf too


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70), st.integers(4, 32), st.integers(1, 20), st.integers(0, 2**32 - 1), st.booleans())
def test_one_query_attention_in_one_pass_matches_naive(n, d, block, seed, use_mask):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal(d), rng.standard_normal((n, d)), rng.standard_normal((n, 6))
    mask = rng.random(n) < 0.5 if use_mask else None
    out, lse, trace = osm.online_attention_one_query(q, k, v, mask, block_size=block, acc_dtype=np.float64)
    want, want_lse = nv.naive_attention(q[None, None, None], k[None, None], v[None, None],
                                        None if mask is None else mask[None, None, None],
                                        acc_dtype=np.float64, return_lse=True)
    np.testing.assert_allclose(out, want[0, 0, 0], atol=1e-12)
    assert lse == want_lse[0, 0, 0] or abs(lse - want_lse[0, 0, 0]) < 1e-12
    assert trace.reads == n == osm.softmax_io(n, "fused_attention").reads  # each score read once, none written


def test_io_hand_count_for_a_small_case():
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    assert osm.safe_softmax(x)[1] == osm.SoftmaxIO("three_pass", 3, 15, 5)
    assert osm.online_softmax(x)[1] == osm.SoftmaxIO("online", 2, 10, 5)
    assert osm.softmax_io(5, "fused_attention") == osm.SoftmaxIO("fused_attention", 1, 5, 0)
    t = osm.online_softmax_trace(x, 2, acc_dtype=np.float64)  # blocks [3, 1], [4, 1], [5]
    assert t.m.tolist() == [-np.inf, 3.0, 4.0, 5.0]
    np.testing.assert_allclose(t.l[1:], [1 + np.exp(-2), (1 + np.exp(-2)) * np.exp(-1) + 1 + np.exp(-3),
                                         ((1 + np.exp(-2)) * np.exp(-1) + 1 + np.exp(-3)) * np.exp(-1) + 1])
    np.testing.assert_allclose(t.rescale, [1, 0, np.exp(-1), np.exp(-1)])


def test_bad_inputs():
    with pytest.raises(ValueError, match="method"):
        osm.softmax_io(4, "two_pass")
    with pytest.raises(ValueError, match="block_size"):
        osm.online_softmax_trace([1.0], 0)
    with pytest.raises(ValueError, match=r"\+inf"):
        osm.safe_softmax([np.inf, 1.0])
    with pytest.raises(ValueError, match="x must"):
        osm.online_softmax([[1.0]])
    with pytest.raises(ValueError, match="mask"):
        osm.online_attention_one_query(np.ones(4), np.ones((3, 4)), np.ones((3, 2)), np.ones(2, bool))
