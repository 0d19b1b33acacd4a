"""The FlashAttention coding explorers (lib/explorers/flashattention_code.py): their numbers against
lib.attention and closed forms, and their figures reused across updates."""

import math

import numpy as np
import pytest

from lib.attention import naive as nv
from lib.attention import split_kv as sk
from lib.attention.traffic import visible_pairs
from lib.book import widgets
from lib.explorers import flashattention_code as fc
from lib.registry import models


def _view(name, **kw):
    view = widgets.render(name, **kw)
    assert isinstance(view, widgets.View), view
    view.svg()
    return view


SDPA = dict(mask="left padding n_k/4 + causal", n_q=16, n_k=16, head_dim=64, score_scale=1.0, input_dtype="fp16",
            acc_dtype="fp32", guard=True, subtract_max=True)


def test_sdpa_guard_turns_the_empty_rows_into_nan_and_back():
    guarded = _view("flashattention.sdpa_numerics", **SDPA)
    raw = _view("flashattention.sdpa_numerics", **{**SDPA, "guard": False})
    empty = int((~fc.sdpa_mask(SDPA["mask"], 16, 16).any(axis=1)).sum())
    assert empty == 16 // 4
    assert guarded.values["no_key_rows"] == raw.values["no_key_rows"] == empty
    assert guarded.values["nan_rows"] == 0 and raw.values["nan_rows"] == empty
    assert dict(guarded.rows)["those rows return"] == "0" and dict(raw.rows)["those rows return"] == "NaN"
    assert guarded.values["error"] < 1e-5


def test_sdpa_overflow_without_the_max_and_fp16_error():
    big = {**SDPA, "mask": "none", "score_scale": 100.0}
    assert _view("flashattention.sdpa_numerics", **{**big, "subtract_max": False}).values["nan_rows"] == 16
    assert _view("flashattention.sdpa_numerics", **big).values["nan_rows"] == 0
    e32 = _view("flashattention.sdpa_numerics", **{**SDPA, "mask": "none"}).values["error"]
    e16 = _view("flashattention.sdpa_numerics", **{**SDPA, "mask": "none", "acc_dtype": "fp16"}).values["error"]
    assert e16 > 100 * e32


@pytest.mark.parametrize("kind", fc.SDPA_MASKS)
def test_sdpa_masks_have_the_documented_shape(kind):
    m = fc.sdpa_mask(kind, 12, 16)
    assert m is None if kind == "none" else m.shape == (12, 16)
    if kind == "causal, offset -n_q/4":
        assert (~m.any(axis=1)).sum() == 3
    with pytest.raises(ValueError, match="n_k >= n_q"):
        fc.sdpa_mask("causal chunk at the end of the keys", 8, 4)


@pytest.mark.parametrize("convention", fc.KV_MASKS)
def test_kv_cache_mask_counts_against_closed_forms(convention):
    cached, chunk = 10, 5
    v = _view("flashattention.kv_cache_mask", cached=cached, chunk=chunk, convention=convention)
    must = visible_pairs(chunk, cached + chunk, causal=True, query_offset=cached)
    assert v.values["must"] == must
    used = fc.chunk_mask(convention, cached, chunk)
    assert v.values["allowed"] == used.sum() == must - v.values["missing"] + v.values["leaked"]
    expected = {fc.KV_MASKS[0]: (0, 0), fc.KV_MASKS[1]: (0, must - visible_pairs(chunk, cached + chunk, causal=True)),
                fc.KV_MASKS[2]: (chunk * (chunk - 1) // 2, 0), fc.KV_MASKS[3]: (0, chunk)}[convention]
    assert (v.values["leaked"], v.values["missing"]) == expected
    assert (v.values["error"] < 1e-12) == (convention == fc.KV_MASKS[0])


def test_kv_cache_mask_conventions_agree_with_nothing_cached():
    right = _view("flashattention.kv_cache_mask", cached=0, chunk=6, convention=fc.KV_MASKS[1])
    assert right.values["missing"] == right.values["leaked"] == 0 and right.values["error"] < 1e-12


def test_split_kv_occupancy_against_lib_and_the_registry():
    v = _view("flashattention.split_kv_occupancy", model="llama-3.1-70b", gpu="h100-sxm", tp=1, batch=1,
              context=8192, num_splits=17)
    assert v.values["heads"] == 8 and v.values["sms"] == 132
    assert v.values["busy_unsplit"] == pytest.approx(8 / 132)
    assert v.values["busy"] == pytest.approx(136 / 264) and v.values["waves"] == 2
    assert v.values["picked"] == sk.decode_num_splits(1, 8, 8192, 128, gpu="h100-sxm")
    tp8 = _view("flashattention.split_kv_occupancy", model="llama-3.1-70b", gpu="h100-sxm", tp=8, batch=1,
                context=8192, num_splits=1)
    assert tp8.values["heads"] == 1 and tp8.values["busy_unsplit"] == pytest.approx(1 / 132)
    mha = models.model("llama-2-7b").kv_heads_per_rank(4)
    assert mha == 8
    assert models.model("llama-3.1-405b").kv_heads_per_rank(16) == 1  # replicated past the KV-head count
    assert "deepseek-v3" not in fc.GQA_MODELS


def test_split_kv_refusals_are_messages():
    bad_tp = widgets.render("flashattention.split_kv_occupancy", model="llama-3.1-70b", gpu="h100-sxm", tp=3,
                            batch=1, context=8192, num_splits=1)
    assert isinstance(bad_tp, widgets.ErrorView) and "tp=3" in bad_tp.message
    long = widgets.render("flashattention.split_kv_occupancy", model="llama-2-7b", gpu="l4", tp=1, batch=1,
                          context=8192, num_splits=1)
    assert isinstance(long, widgets.ErrorView) and "window" in long.message


def test_figures_are_reused_across_updates():
    for fig, name, kw in [(fc._HEAT_FIGURE, "flashattention.sdpa_numerics", SDPA),
                          (fc._PAIRS_FIGURE, "flashattention.kv_cache_mask",
                           dict(cached=4, chunk=3, convention=fc.KV_MASKS[0]))]:
        _view(name, **kw)
        before = fig.builds
        _view(name, **kw)
        assert fig.builds == before


def test_sdpa_heatmap_matches_lib_probabilities():
    view = _view("flashattention.sdpa_numerics", **{**SDPA, "input_dtype": "fp32"})
    image = fc._HEAT_FIGURE._art.image.get_array()
    assert image.shape[:2] == (16, 16)
    mask = fc.sdpa_mask(SDPA["mask"], 16, 16)
    assert math.isclose(view.values["no_key_rows"], float((~mask.any(axis=1)).sum()))
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 16, 64))
    k = rng.standard_normal((1, 1, 16, 64))
    p = nv.attention_probabilities(q, k, mask, acc_dtype=np.float64)[0, 0]
    assert view.values["saturation"] == pytest.approx(p[mask.any(axis=1)].max(axis=1).mean(), rel=1e-5)
