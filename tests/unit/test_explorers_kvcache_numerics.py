"""The FP8-scale explorer (lib.explorers.kvcache_numerics, I012) shows what lib.numerics.fp8 computes, and
moving only the scale slider reuses the tensor's sweeps instead of recomputing them."""

from __future__ import annotations

import numpy as np
import pytest

from lib.book import widgets
from lib.explorers import kvcache_numerics as kn
from lib.numerics import fp8

INPUTS = dict(outlier_scale=2.0, tail_dof=4.0, num_outlier_channels=4, seed=0)


def test_view_numbers_are_lib_numbers():
    view = widgets.render("kvcache.fp8_scale", scale_log2=-2.0, **INPUTS)
    assert isinstance(view, widgets.View)
    _, k, _ = fp8.synthetic_head(256, 64, 4, 2.0, 4.0, 1, 1.0, 0)
    chosen = fp8.error_vs_scale(k, [0.25], "e4m3")
    e = fp8.error_vs_scale(k, 2.0**kn.SCALE_LOG2, "e4m3")
    assert view.values["rounding_rel"] == chosen["rounding_rel"][0]
    assert view.values["clipping_rel"] == chosen["clipping_rel"][0] > 0  # a scale 4x too small clips
    assert view.values["best_log2"] == kn.SCALE_LOG2[int(np.argmin(e["total_rel"]))]
    assert view.values["floor"] == fp8.relative_rounding_floor(k, float(fp8.amax_scale(k).item()))


def test_moving_the_scale_reuses_the_sweeps_and_changes_only_the_chosen_scale():
    kn._fp8_tensor_sweeps.cache_clear()
    first = kn.fp8_scale(scale_log2=0.0, **INPUTS)
    hits = kn._fp8_tensor_sweeps.cache_info().hits
    moved = kn.fp8_scale(scale_log2=3.0, **INPUTS)
    assert kn._fp8_tensor_sweeps.cache_info().hits == hits + 1
    assert moved.values["best_log2"] == first.values["best_log2"] and moved.values["floor"] == first.values["floor"]
    assert moved.values["rounding_rel"] != first.values["rounding_rel"]
    kn._fp8_tensor_sweeps.cache_clear()  # a fresh computation gives the same view
    again = kn.fp8_scale(scale_log2=3.0, **INPUTS)
    assert again.rows == moved.rows and again.values == moved.values


def test_the_shared_sweeps_cannot_be_modified():
    k, e, i, _ = kn._fp8_tensor_sweeps(2.0, 4.0, 4, 0)
    for a in (k, e["total_rel"], i["total_rel"]):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0


def test_the_figure_is_built_once_and_its_legend_names_every_series():
    kn._FP8_FIGURE.reset()
    builds = kn._FP8_FIGURE.builds
    for x in (-4.0, 0.0, 6.5):
        view = kn.fp8_scale(scale_log2=x, **INPUTS)
        assert "<svg" in view.svg()
    assert kn._FP8_FIGURE.builds == builds + 1
    labels = [t.get_text() for t in view.figure.axes[0].get_legend().get_texts()]
    assert labels == ["E4M3 rounding", "E4M3 clipping", "E4M3 total", "INT8 total", "chosen scale"]
