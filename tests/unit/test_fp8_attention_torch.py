"""The FP8 KV-cache page's attention errors against torch (I012).

torch's ``float8_e4m3fn`` cast of K / s and V / s (saturating, as the page's kernels) and float64 torch
attention give the output error that ``lib.numerics.fp8``'s sweep reports: at the page's default experiment
(a 131,072-token synthetic head, a static scale calibrated on its first 2,048 keys, a headroom scale, and
vLLM's calculate_kv_scales scale), and on smaller random draws. The notebook checks the same two headline
numbers with a float64 numpy attention; torch stays out of its kernel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import fp8

torch = pytest.importorskip("torch")

# the parameters cell of chapters/02-kv-cache/fp8-kv-cache-scales.ipynb
DEFAULT = dict(head_dim=128, num_outlier_channels=4, outlier_scale=2.0, tail_dof=4.0, num_queries=16,
               query_outlier_weight=1.0, seed=0)
CALIB_TOKENS, CONTEXTS = 2048, [2048, 8192, 32768, 131072]
VLLM_K_RANGE, VLLM_V_RANGE = 200.0, 100.0  # vllm/envs.py K_SCALE_CONSTANT, V_SCALE_CONSTANT


def torch_output_error(q, k, v, k_scale: float, v_scale: float) -> float:
    """Mean over queries of ||o_fp8 - o|| / ||o||: K / s and V / s cast to float8_e4m3fn by torch, float64 attention."""
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    kq = (kt / torch.tensor(k_scale, dtype=torch.float32)).to(torch.float8_e4m3fn).double() * k_scale
    vq = (vt / torch.tensor(v_scale, dtype=torch.float32)).to(torch.float8_e4m3fn).double() * v_scale

    def attend(k_, v_):
        return torch.softmax(qt.double() @ k_.double().T / math.sqrt(qt.shape[1]), dim=1) @ v_.double()

    exact, approx = attend(kt, vt), attend(kq, vq)
    return float((torch.linalg.norm(approx - exact, dim=1) / torch.linalg.norm(exact, dim=1)).mean())


def test_the_pages_headline_errors_match_torch():
    q, k, v = fp8.synthetic_head(max(CONTEXTS), **DEFAULT)
    ladder = fp8.context_ladder(CALIB_TOKENS, CONTEXTS)
    static = (float(fp8.amax_scale(k[:CALIB_TOKENS]).item()), float(fp8.amax_scale(v[:CALIB_TOKENS]).item()))
    headroom = (float(fp8.amax_scale(k).item()), float(fp8.amax_scale(v).item()))
    vllm = (static[0] * fp8.E4M3_MAX / VLLM_K_RANGE, static[1] * fp8.E4M3_MAX / VLLM_V_RANGE)
    sweep = fp8.fp8_attention_sweep(q, k, v, ladder, {"static": static, "headroom": headroom})
    n = ladder[-1]
    assert sweep["static"][-1].output_rel_error == pytest.approx(torch_output_error(q, k[:n], v[:n], *static), rel=2e-3)
    assert sweep["headroom"][-1].output_rel_error == pytest.approx(torch_output_error(q, k[:n], v[:n], *headroom), rel=2e-3)
    c = ladder[0]  # the calibration length, where the static scale clips nothing
    assert sweep["static"][0].output_rel_error == pytest.approx(torch_output_error(q, k[:c], v[:c], *static), rel=2e-3)
    # the page prices vLLM's scale at the longest context only, through the per-context path
    row = fp8.fp8_attention_error(q, k, v, n, *vllm)
    assert row.output_rel_error == pytest.approx(torch_output_error(q, k[:n], v[:n], *vllm), rel=2e-3)
    # and the page's story holds on this draw: the static scale's error at 128K is several times the headroom one
    assert sweep["static"][-1].output_rel_error > 3 * sweep["headroom"][-1].output_rel_error


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), outliers=st.integers(0, 8), outlier_scale=st.floats(1.0, 16.0),
       tail_dof=st.floats(2.5, 30.0), log2_margin=st.floats(-3.0, 6.0))
def test_sweep_and_single_context_errors_match_torch(seed, outliers, outlier_scale, tail_dof, log2_margin):
    q, k, v = fp8.synthetic_head(4096, 32, outliers, outlier_scale, tail_dof, 4, 1.0, seed=seed)
    scale = (float(fp8.amax_scale(k[:512]).item()) * 2.0**log2_margin, float(fp8.amax_scale(v[:512]).item()))
    rows = fp8.fp8_attention_sweep(q, k, v, [512, 4096], {"s": scale})["s"]
    for row in rows:
        want = torch_output_error(q, k[: row.context], v[: row.context], *scale)
        assert row.output_rel_error == pytest.approx(want, rel=1e-3, abs=1e-9)
    assert fp8.fp8_attention_error(q, k, v, 4096, *scale) == rows[-1]
