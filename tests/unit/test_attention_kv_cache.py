"""Attention with a KV cache (I086): chunks at the end of a longer cache equal full recomputation
(and torch's SDPA over the whole sequence); the practice grader passes the reference, fails every
defective variant with a shrunk case, and reports a skeleton as not implemented.
Tolerance: FP32 accumulation vs float64 recomputation, atol = rtol = 1e-5."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import kv_cache as kc
from lib.attention import kv_cache_practice as kp


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.sampled_from([1, 2, 4]), st.integers(4, 16),
       st.lists(st.integers(1, 12), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_chunks_equal_full_recomputation_and_torch(batch, hkv, group, d, chunks, seed):
    rng = np.random.default_rng(seed)
    total = sum(chunks)
    q_all = rng.standard_normal((batch, hkv * group, total, d)).astype(np.float32)
    k_all = rng.standard_normal((batch, hkv, total, d)).astype(np.float32)
    v_all = rng.standard_normal((batch, hkv, total, d)).astype(np.float32)
    cache = kc.KVCache(batch, hkv, d, capacity=total + rng.integers(0, 5))
    full = F.scaled_dot_product_attention(*(torch.from_numpy(x).double() for x in (q_all, k_all, v_all)),
                                          is_causal=True, enable_gqa=True).numpy()
    start = 0
    for n in chunks:
        sl = slice(start, start + n)
        out = kc.attend_with_cache(cache, q_all[:, :, sl], k_all[:, :, sl], v_all[:, :, sl])
        np.testing.assert_allclose(out, full[:, :, sl], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out, kc.full_recompute(q_all[:, :, :start + n], k_all[:, :, :start + n],
                                                          v_all[:, :, :start + n], n), rtol=1e-5, atol=1e-5)
        start += n
        assert cache.length == start
    np.testing.assert_array_equal(cache.keys(), k_all)  # every key landed in its slot
    np.testing.assert_array_equal(cache.values(), v_all)


def test_append_writes_the_right_slots_and_refuses_overflow():
    cache = kc.KVCache(1, 1, 2, capacity=5)
    assert cache.append(np.ones((1, 1, 3, 2)), np.ones((1, 1, 3, 2))) == range(0, 3)
    assert cache.append(np.full((1, 1, 2, 2), 2.0), np.zeros((1, 1, 2, 2))) == range(3, 5)
    assert cache.k[0, 0, :, 0].tolist() == [1, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="does not fit"):
        cache.append(np.ones((1, 1, 1, 2)), np.ones((1, 1, 1, 2)))
    assert cache.length == 5
    with pytest.raises(ValueError, match="k_new and v_new"):
        kc.KVCache(1, 2, 2, 4).append(np.ones((1, 1, 1, 2)), np.ones((1, 1, 1, 2)))


def test_reference_passes_the_grader():
    report = kp.check(kp.variant("reference"))
    assert report.passed, report


@pytest.mark.parametrize("name", kp.VARIANTS)
def test_every_defective_variant_fails_with_a_shrunk_case(name):
    report = kp.check(kp.variant(name))
    assert report.status == "failed", f"{name} passed the grader"
    assert "shrunk to" in report.failure


@pytest.mark.parametrize("name, words", [("interleaved_gqa", "h % n_kv_heads"), ("top_left_causal", "top-left"),
                                         ("overwrites_slot_zero", "slot 0")])
def test_the_grader_names_the_mistake(name, words):
    assert words in kp.check(kp.variant(name)).failure


def test_skeleton_is_not_implemented_and_a_candidate_by_lambda_is_graded():
    assert kp.check(kp.Skeleton).status == "not implemented"

    class Mine:  # an independent implementation written from the interface
        def __init__(self, batch, n_q_heads, n_kv_heads, head_dim, capacity):
            self.g = n_q_heads // n_kv_heads
            self.k = np.zeros((batch, n_kv_heads, capacity, head_dim))
            self.v = np.zeros_like(self.k)
            self.length = 0

        def forward(self, q, k, v):
            n = q.shape[2]
            if self.length + n > self.k.shape[2]:
                raise ValueError("full")
            self.k[:, :, self.length:self.length + n], self.v[:, :, self.length:self.length + n] = k, v
            self.length += n
            keys = np.repeat(self.k[:, :, :self.length], self.g, 1)
            vals = np.repeat(self.v[:, :, :self.length], self.g, 1)
            s = q @ keys.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
            pos = self.length - n + np.arange(n)
            s = np.where(np.arange(self.length)[None, :] <= pos[:, None], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            return (p / p.sum(-1, keepdims=True)) @ vals

    assert kp.check(lambda *cfg: Mine(*cfg), num_random=8).passed


def test_grader_inputs():
    with pytest.raises(ValueError, match="variant"):
        kp.variant("typo")
    with pytest.raises(ValueError, match="factory"):
        kp.check(3)
    assert "factory(batch=1" in kp.describe(kp.cases(0)[0].ops)
