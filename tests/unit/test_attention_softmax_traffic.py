"""Naive attention's traffic by softmax kernel (I028): the counts against a run that counts every
score access, Algorithm 0 against naive_traffic's defaults, and the ordering of the three kernels."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import online_softmax as osm
from lib.attention import softmax_traffic as sft
from lib.attention import traffic as tr
from lib.registry.dtypes import bytes_per_element


def counted_score_accesses(n_q, n_k, softmax, seed=0):
    """Run an unfused attention over an (n_q, n_k) score matrix row by row, counting each access:
    QK^T writes every score, the softmax kernel's own passes (counted by running them), PV reads P."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((n_q, n_k))
    accesses = s.size  # QK^T writes S
    for row in s:
        if softmax == "three_pass":
            _, io = osm.safe_softmax(row)
        elif softmax == "online":
            _, io = osm.online_softmax(row)
        else:  # the row is loaded once and written once
            io = osm.SoftmaxIO("row_on_chip", 1, row.size, row.size)
        accesses += io.reads + io.writes
    return accesses + s.size  # PV reads P


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 64), st.sampled_from(sft.SOFTMAX_KERNELS),
       st.sampled_from(["fp16", "bf16", "fp32"]), st.sampled_from(["fp16", "fp32"]))
def test_bytes_equal_a_run_that_counts_every_score_access(n_q, n_k, d, softmax, dtype, score_dtype):
    t = sft.naive_traffic_by_softmax(n_q, d, softmax, dtype, n_k=n_k, score_dtype=score_dtype)
    b, bs = bytes_per_element(dtype), bytes_per_element(score_dtype)
    assert t.score_bytes == counted_score_accesses(n_q, n_k, softmax) * bs
    assert t.total_bytes == t.score_bytes + (2 * n_q * d + 2 * n_k * d) * b  # Q, K, V read; O written


def test_algorithm0_is_naive_traffic_default_and_the_per_element_counts():
    assert sft.score_accesses_per_element("three_pass") == (4, 2)
    assert sft.score_accesses_per_element("online") == (3, 2)
    assert sft.score_accesses_per_element("row_on_chip") == (2, 2)
    assert sft.naive_traffic_by_softmax(8192, 128, "row_on_chip") == tr.naive_traffic(8192, 128)
    # 8K x 8K FP16: 134,217,728 B per pass over the score matrix; three-pass makes 6 of them
    assert sft.naive_traffic_by_softmax(8192, 128).score_bytes == 6 * 134_217_728


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 256))
def test_each_softmax_kernel_saves_one_pass_over_the_scores(n, d):
    three, online, chip = (sft.naive_traffic_by_softmax(n, d, k).total_bytes for k in sft.SOFTMAX_KERNELS)
    one_pass = tr.score_matrix_bytes(n)
    assert three - online == one_pass == online - chip
    assert chip > tr.compulsory_traffic(n, d).total_bytes - n * 4  # any unfused kernel moves more than the floor's Q, K, V, O


def test_bad_inputs():
    with pytest.raises(ValueError, match="softmax must be"):
        sft.naive_traffic_by_softmax(4, 4, "fused_attention")
    with pytest.raises(ValueError, match="n_q"):
        sft.naive_traffic_by_softmax(0, 4)
