"""The FlashAttention algorithm explorers (I028, I029, I031) show lib's numbers: each view's values
equal the lib functions they call, and the inputs they cannot draw are refused with a message."""

import pytest

from lib.attention import backward as bw
from lib.attention import softmax_traffic as sft
from lib.attention import tiled as tl
from lib.attention import traffic as tr
from lib.book import widgets
from lib.perf.roofline import roofline_time
from lib.registry import models


@pytest.mark.parametrize("n, d, dtype, score_dtype, gpu", [(8192, 128, "fp16", "fp16", "h100-sxm"),
                                                          (512, 256, "bf16", "fp32", "l4")])
def test_softmax_io_view_shows_the_traffic_model(n, d, dtype, score_dtype, gpu):
    view = widgets.render("flashattention.softmax_io", seq_len=n, head_dim=d, dtype=dtype, score_dtype=score_dtype, gpu=gpu)
    assert isinstance(view, widgets.View)
    three = sft.naive_traffic_by_softmax(n, d, "three_pass", dtype, score_dtype=score_dtype).total_bytes
    assert view.values["three_pass"] == three
    assert view.values["floor"] == tr.compulsory_traffic(n, d, dtype).total_bytes
    assert view.values["three_pass_s"] == roofline_time(tr.attention_flops(n, d), three, gpu, "bf16").time_s
    assert view.values["three_pass"] > view.values["online"] > view.values["row_on_chip"] > view.values["floor"]


def test_tile_map_view_counts_the_causal_map_and_refuses_huge_maps():
    view = widgets.render("flashattention.tile_map", seq_len=8192, block_q=128, block_k=128, window=0)
    assert view.values == {k: float(v) for k, v in tl.tile_counts(tl.causal_tile_map(8192, 8192, 128, 128)).items()}
    assert view.values["skip"] == 64 * 63 / 2  # T(T-1)/2 tiles above the diagonal
    windowed = widgets.render("flashattention.tile_map", seq_len=4096, block_q=64, block_k=32, window=1000)
    assert windowed.values["computed"] == tl.tile_counts(tl.causal_tile_map(4096, 4096, 64, 32, window=1000))["computed"]
    refused = widgets.render("flashattention.tile_map", seq_len=32768, block_q=16, block_k=16, window=0)
    assert isinstance(refused, widgets.ErrorView) and "at most 128" in refused.message


def test_backward_memory_view_shows_the_probabilities_and_the_recompute_price():
    view = widgets.render("flashattention.backward_memory", model="llama-3.1-8b", seq_len=8192, batch=1, dtype="bf16",
                          stored_matrices=1, gpu="h100-sxm")
    assert view.values["p_layer"] == bw.probabilities_bytes(1, 32, 8192) == 4 * 2**30
    assert view.values["saved"] == bw.backward_memory_saved_bytes(1, 32, 8192)
    m = models.model("llama-3.1-8b")
    half_forward_attention = m.num_layers * m.num_attention_heads * tr.attention_flops(8192, 128, causal=True) / 2
    assert view.values["extra_flops"] == pytest.approx(half_forward_attention, rel=1e-12)
    mla = widgets.render("flashattention.backward_memory", model="deepseek-v3", seq_len=4096, batch=1, dtype="bf16",
                         stored_matrices=1, gpu="h200")
    assert isinstance(mla, widgets.View) and mla.values["extra_flops"] == 0.0  # not counted for MLA, and said so
