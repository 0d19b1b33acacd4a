"""lib.numerics.pools: one layer through each pool's FP8 format, errors and disagreements."""

from __future__ import annotations

import numpy as np
import pytest

from lib.numerics import pools
from lib.numerics.fp8 import block_fake_quantize, fake_quantize, mx_block_scale


def _layer(**kw):
    args = dict(rows=64, d_in=256, d_out=256, outlier_channels=4, outlier_scale=30.0, tie_gap=1.0, seed=0)
    args.update(kw)
    return pools.synthetic_layer(**args)


def test_synthetic_layer_shapes_and_outliers():
    x, w = _layer()
    assert x.shape == (64, 256) and w.shape == (256, 256)
    col = np.abs(x).max(axis=0)
    assert np.sum(col > 10 * np.median(col)) == 4
    with pytest.raises(ValueError):
        pools.synthetic_layer(rows=4, d_in=8, d_out=8, outlier_channels=9)


def test_formats_errors_are_fp8_sized_and_bf16_is_closer():
    x, w = _layer()
    c = pools.compare_formats(x, w, list(pools.FORMATS))
    for f in ("block-fp32", "block-e8m0", "mxfp8", "per-tensor"):
        assert 0.01 < c.error[f] < 0.08
    assert c.error["bf16"] < 0.25 * c.error["block-fp32"]
    assert set(c.between) == {(a, b) for i, a in enumerate(pools.FORMATS) for b in list(pools.FORMATS)[i + 1:]}


def test_power_of_two_scales_make_block_size_irrelevant_for_e4m3():
    """128-blocks with E8M0 scales and MXFP8 round every normal value the same way."""
    x, w = _layer()
    c = pools.compare_formats(x, w, ["block-e8m0", "mxfp8", "block-fp32"])
    assert c.between[("block-e8m0", "mxfp8")] < 1e-4
    assert c.flips_between[("block-e8m0", "mxfp8")] == 0
    assert c.between[("block-e8m0", "block-fp32")] > 0.01


def test_mxfp8_matches_an_independent_mx_implementation():
    x, w = _layer()
    xm = fake_quantize(x.reshape(64, -1, 32), mx_block_scale(x, 32, "ceil")).reshape(x.shape)
    wm = fake_quantize(w.reshape(256, -1, 32), mx_block_scale(w, 32, "ceil")).reshape(w.shape)
    assert np.array_equal(pools.format_logits(x, w, "mxfp8"), xm @ wm.T)


def test_w_hat_and_bad_inputs():
    x, w = _layer()
    conv = block_fake_quantize(pools.quantize_weights(w, "block-fp32"), (1, 32), "e8m0")
    y = pools.format_logits(x, w, "mxfp8", w_hat=conv)
    assert y.shape == (64, 256)
    with pytest.raises(ValueError, match="format"):
        pools.format_logits(x, w, "nvfp4")
    with pytest.raises(ValueError, match="d_in"):
        pools.format_logits(x[:, :128], w, "bf16")
