"""SDPA from scratch (W01): the whiteboard reference matches torch's SDPA (fully masked rows, GQA,
float16 inputs), the practice grader passes it and any correct candidate, fails every defective
variant for its own reason with a shrunk case, and reports a skeleton as not implemented.

Tolerances: the reference in FP32 vs torch in float64 on the same inputs, atol = rtol = 1e-5
(standard-normal inputs, as in test_attention_naive.py); the grader's own band is
1e-4 + 1e-6 x the largest |score| (lib.attention.sdpa_practice)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv
from lib.attention import sdpa_practice as sp


def sdpa64(q, k, v, mask=None):
    t = [torch.from_numpy(np.ascontiguousarray(x)).double() for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True).numpy()


@st.composite
def programs(draw):
    """Random case programs in the grader's own format (so case_inputs is exercised too)."""
    hkv, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    n_q, n_k = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    cfg = ("config", draw(st.integers(1, 2)), hkv * group, hkv, n_q, n_k, draw(st.sampled_from([4, 8, 16])),
           draw(st.sampled_from(sp.DTYPES)), draw(st.sampled_from([0.5, 1.0, 3.0])), draw(st.integers(0, 2**32 - 1)))
    part = st.one_of(st.tuples(st.just("causal"), st.integers(-n_q, n_k)),
                     st.tuples(st.just("padding"), st.tuples(st.integers(0, n_k), st.integers(0, n_k))),
                     st.tuples(st.just("random"), st.sampled_from([0.1, 0.5, 0.9]), st.integers(0, 999)),
                     st.tuples(st.just("no_keys"), st.integers(0, 20)))
    return (cfg, *draw(st.lists(part, max_size=3)))


@settings(max_examples=60, deadline=None)
@given(programs())
def test_reference_matches_torch_sdpa_and_the_lib_oracle(ops):
    q, k, v, mask = sp.case_inputs(ops)
    got = sp.reference_sdpa(q, k, v, mask)
    assert got.dtype == np.float32  # FP32 accumulation for float16 and float32 inputs alike
    np.testing.assert_allclose(got, sdpa64(q, k, v, mask), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, nv.naive_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)
    if mask is not None:  # rows with no allowed key: exactly 0, as torch's SDPA
        empty = ~np.broadcast_to(mask, got.shape[:3] + (k.shape[2],)).any(-1)
        assert (got[empty] == 0).all()
    sp.run(sp.reference_sdpa, ops)  # and the grader accepts it on every such program


def test_reference_at_huge_scores_and_float64_inputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 3, 8)) * 1000
    k, v = rng.standard_normal((1, 1, 5, 8)), rng.standard_normal((1, 1, 5, 8))
    out = sp.reference_sdpa(q, k, v)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, sdpa64(q, k, v), atol=1e-12)


def test_reference_passes_and_the_skeleton_is_not_implemented():
    report = sp.check(sp.variant("reference"))
    assert report.passed and report.cases_total == len(sp.cases()), report
    assert sp.check(sp.skeleton).status == "not implemented"


EXPECTED_CASE = {
    "no_masked_row_guard": "a query row with no key",
    "finfo_min_fill": "a query row with no key",
    "no_max_subtraction": "scores in the thousands",
    "input_dtype_accumulation": "float16 inputs (accumulate in float32)",
    "no_scale": "no mask",
    "scale_by_d": "no mask",
    "interleaved_gqa": "GQA",
    "softmax_over_queries": "no mask",
    "mask_inverted": "causal, square",
    "zero_after_softmax": "causal, square",
}


@pytest.mark.parametrize("name", sp.VARIANTS)
def test_every_defective_variant_fails_on_its_case_and_is_named(name):
    report = sp.check(sp.variant(name))
    assert report.status == "failed", f"{name} passed the grader"
    first = report.failure.splitlines()[0]
    assert EXPECTED_CASE[name] in first and "shrunk to" in first, (name, first)
    assert sp._MISTAKE_TEXT[name] in report.failure, report.failure


@pytest.mark.parametrize("name", ["no_masked_row_guard", "finfo_min_fill", "no_max_subtraction", "interleaved_gqa"])
def test_each_targeted_variant_fails_only_where_its_mistake_matters(name):
    """The variant is correct elsewhere: it fails on its own case and passes a plain one, so the
    grader's verdict points at the mistake, not at unrelated damage."""
    plain = (("config", 1, 2, 2, 4, 6, 8, "float32", 1.0, 0), ("causal", 2))
    sp.run(sp.variant(name), plain)
    with pytest.raises(AssertionError):
        sp.run(sp.variant(name), next(c.ops for c in sp.cases() if EXPECTED_CASE[name] in c.name))


def test_float16_accumulation_error_is_past_the_tolerance_and_fp32_is_not():
    ops = next(c.ops for c in sp.cases() if c.name.startswith("float16 inputs (accumulate"))
    q, k, v, mask = sp.case_inputs(ops)
    want = nv.naive_attention(q, k, v, mask, acc_dtype=np.float64)
    err16 = np.abs(sp.variant("input_dtype_accumulation")(q, k, v, mask) - want).max()
    err32 = np.abs(sp.reference_sdpa(q, k, v, mask) - want).max()
    assert err32 < 1e-6 < 2 * sp.TOLERANCE < err16 < 1e-2  # FP16 rounding, eps = 2^-10


def test_a_candidate_written_from_the_interface_passes_and_torch_itself_passes():
    def mine(q, k, v, mask=None):  # loops over heads, float64 throughout
        out = np.zeros(q.shape, np.float64)
        g = q.shape[1] // k.shape[1]
        allowed = np.ones(q.shape[:3] + (k.shape[2],), bool) if mask is None else np.broadcast_to(
            mask, q.shape[:3] + (k.shape[2],))
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                s = q[b, h].astype(np.float64) @ k[b, h // g].T.astype(np.float64) / math.sqrt(q.shape[-1])
                s = np.where(allowed[b, h], s, -np.inf)
                for i in range(q.shape[2]):
                    if allowed[b, h, i].any():
                        p = np.exp(s[i] - s[i].max())
                        out[b, h, i] = p @ v[b, h // g] / p.sum()
        return out

    assert sp.check(mine).passed

    def with_torch(q, k, v, mask=None):
        t = [torch.from_numpy(x).float() for x in (q, k, v)]
        m = None if mask is None else torch.from_numpy(mask)
        return F.scaled_dot_product_attention(*t, attn_mask=m, enable_gqa=True).numpy()

    assert sp.check(with_torch).passed


def test_case_inputs_shapes_and_mask_layouts():
    q, k, v, mask = sp.case_inputs((("config", 2, 4, 2, 3, 5, 8, "float16", 2.0, 1), ("causal", 2)))
    assert q.shape == (2, 4, 3, 8) and k.shape == v.shape == (2, 2, 5, 8) and q.dtype == np.float16
    assert mask.shape == (3, 5) and mask.tolist() == nv.causal_mask(3, 5, 2).tolist()
    _, _, _, mask = sp.case_inputs((("config", 2, 4, 2, 3, 5, 8, "float32", 1.0, 1), ("padding", (5, 2)), ("no_keys", 4)))
    assert mask.shape == (2, 1, 3, 5) and not mask[:, 0, 1].any() and mask[1, 0, 0].tolist() == [True, True] + [False] * 3
    assert sp.case_inputs((("config", 1, 1, 1, 2, 2, 4, "float32", 1.0, 0),))[3] is None
    assert "case_inputs" in sp.describe(sp.cases()[0].ops)


def test_grader_inputs():
    with pytest.raises(ValueError, match="variant"):
        sp.variant("typo")
    with pytest.raises(ValueError, match="sdpa"):
        sp.check(3)
    with pytest.raises(ValueError, match="dtype"):
        sp.case_inputs((("config", 1, 1, 1, 2, 2, 4, "int8", 1.0, 0),))
    report = sp.check(lambda q, k, v, mask=None: np.zeros((1, 1)))
    assert report.status == "failed" and "shape" in report.failure
