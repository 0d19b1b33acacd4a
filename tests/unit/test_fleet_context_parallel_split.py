"""lib.fleet.context_parallel_split: causal pairs per rank against a brute-force mask count, and the split prefill."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention.context_parallel import ring_prefill
from lib.fleet import context_parallel_split as cs


def _brute(t, cp, scheme):
    """Oracle: an explicit causal mask, summed over the rows each rank owns (O(T^2))."""
    mask = np.tril(np.ones((t, t), dtype=np.int64))
    own = cs.owners(t, cp, scheme)
    return [int(mask[own == r].sum()) for r in range(cp)]


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 8), extra=st.integers(0, 60), scheme=st.sampled_from(cs.SCHEMES))
def test_pairs_match_the_mask(cp, extra, scheme):
    t = 2 * cp + extra
    assert cs.pairs_per_rank(t, cp, scheme) == _brute(t, cp, scheme)
    assert sum(cs.pairs_per_rank(t, cp, scheme)) == t * (t + 1) // 2


def test_owners_partition_the_tokens():
    for scheme in cs.SCHEMES:
        own = cs.owners(1000, 4, scheme)
        counts = np.bincount(own, minlength=4)
        assert counts.sum() == 1000 and counts.max() - counts.min() <= 2


def test_contiguous_imbalance_closed_form():
    # c = T / cp: rank i has c^2 i + c (c + 1) / 2 pairs; max / mean -> (2 cp - 1) / cp for long prompts
    for cp in (2, 4, 8):
        assert cs.imbalance(2**20, cp, "contiguous") == pytest.approx((2 * cp - 1) / cp, rel=1e-4)
        assert cs.imbalance(2**20, cp, "zigzag") == pytest.approx(1.0, abs=1e-12)
        assert cs.imbalance(2**20, cp, "striped") == pytest.approx(1.0, abs=1e-4)


def test_split_prefill_stretches_only_attention():
    bal = cs.split_prefill("llama-3.1-70b", "h100-sxm", 131072, 4, 8, "zigzag")
    naive = cs.split_prefill("llama-3.1-70b", "h100-sxm", 131072, 4, 8, "contiguous")
    ring = ring_prefill("llama-3.1-70b", "h100-sxm", 131072, 4, 8)
    assert bal.ttft_s == pytest.approx(ring.ttft_s, rel=1e-12)
    w, a = naive.weight_flops, naive.attention_flops
    assert naive.compute_s == pytest.approx(ring.compute_s * (w + a * 1.75) / (w + a), rel=1e-3)
    assert naive.ttft_s > bal.ttft_s


def test_shortest_hidden_context_is_a_boundary():
    t = cs.shortest_hidden_context("llama-3.1-70b", "h100-sxm", 4, 8)
    assert ring_prefill("llama-3.1-70b", "h100-sxm", t, 4, 8).ring_hidden
    assert not ring_prefill("llama-3.1-70b", "h100-sxm", t - 1, 4, 8).ring_hidden


def test_bad_inputs():
    with pytest.raises(ValueError, match="scheme"):
        cs.pairs_per_rank(100, 4, "random")
    with pytest.raises(ValueError, match="runs"):
        cs.pairs_per_rank(7, 4, "zigzag")
    with pytest.raises(ValueError, match="cp"):
        cs.shortest_hidden_context("llama-3.1-70b", "h100-sxm", 1, 8)
