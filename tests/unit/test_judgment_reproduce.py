"""lib.judgment.reproduce: the claim filter and gpt-fast's published decode table against the book's model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import reproduce
from lib.perf import datasheet


def test_published_table_is_gpt_fast_readme():
    """gpt-fast README 'Benchmarks' (8x A100-80GB at 330 W, batch 1)."""
    assert reproduce.published_decode() == {("llama-2-7b", 1): 104.9, ("llama-2-7b", 2): 168.84,
                                            ("llama-2-7b", 4): 254.02, ("llama-2-7b", 8): 328.43,
                                            ("llama-2-70b", 8): 62.5}


def test_model_reproduces_the_published_rows_within_15_percent():
    """Oracle: the published measurements themselves. The decode model was not fitted to them."""
    for r in reproduce.gpt_fast_table():
        assert abs(r.gap) < 0.15, (r.model, r.tp, r.modelled, r.published)
        assert r.modelled < r.floor_measured < r.floor_datasheet  # each level adds costs, never removes them


def test_levels_multiply_out():
    r = reproduce.reproduce_decode("llama-2-7b", "a100-sxm", 1, 104.9)
    assert r.explained_by_bandwidth * r.explained_by_step * r.modelled == pytest.approx(r.floor_datasheet)
    assert r.explained_by_bandwidth == pytest.approx(2039 / 1700, rel=0.01)  # the README's measured 1,700 GB/s


def test_worst_gap_is_the_largest_log_ratio():
    rows = reproduce.gpt_fast_table()
    w = reproduce.worst_gap(rows)
    assert all(abs(math.log(w.modelled / w.published)) >= abs(math.log(r.modelled / r.published)) for r in rows)


@pytest.mark.parametrize("kwargs", [{"published_tokens_per_s": 0.0}, {"published_tokens_per_s": 100.0, "streaming_fraction": 1.5},
                                    {"published_tokens_per_s": math.nan}])
def test_reproduce_refuses_bad_inputs(kwargs):
    with pytest.raises(ValueError):
        reproduce.reproduce_decode("llama-2-7b", "a100-sxm", 1, **kwargs)


@settings(max_examples=20, deadline=None)
@given(st.floats(1.0, 100000.0), st.sampled_from(["h100-sxm", "b200", "a100-sxm"]), st.sampled_from([1, 2, 4, 8]))
def test_claim_check_passes_exactly_under_the_ceiling(claim, chip, n):
    cc = reproduce.claim_check(claim, "llama-3.1-70b", chip, n)
    ceiling = datasheet.per_user_decode_ceiling("llama-3.1-70b", chip, n_gpus=n)
    assert cc.ceiling_tokens_per_s == pytest.approx(ceiling)
    assert cc.passes == (claim <= ceiling)
    assert all("aggregate" not in name for name in cc.lifting)


def test_claim_check_names_the_conditions_that_lift_it():
    cc = reproduce.claim_check(1000.0, "llama-3.1-70b", "h100-sxm", 8)
    assert not cc.passes and any("speculative" in s for s in cc.lifting)
    with pytest.raises(ValueError):
        reproduce.claim_check(-1.0, "llama-3.1-70b", "h100-sxm", 8)
