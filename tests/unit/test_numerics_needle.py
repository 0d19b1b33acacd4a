"""lib.numerics.needle: the needle-vs-maximum retrieval model, closed form against simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import fp8, needle


def test_gaussian_max_median_matches_simulation():
    rng = np.random.default_rng(0)
    for n in (16, 1024, 8192):
        sim = np.median(rng.standard_normal((2000, n)).max(axis=1))
        assert sim == pytest.approx(needle.gaussian_max_median(n), rel=0.02)
    assert needle.sqrt_2_ln(1e12) / needle.gaussian_max_median(1e12) == pytest.approx(1.0, abs=0.08)


def test_retrieval_probability_closed_form_and_noise():
    assert needle.retrieval_probability(4.0, 1000) == pytest.approx((0.5 * (1 + math.erf(4 / math.sqrt(2)))) ** 1000, rel=1e-9)
    rng = np.random.default_rng(1)
    mu, tau, n = 3.5, 0.4, 500
    trials = 20000
    d = rng.standard_normal((trials, n)) * math.sqrt(1 + tau**2)
    needle_l = mu + tau * rng.standard_normal(trials)
    sim = np.mean(needle_l > d.max(axis=1))
    assert sim == pytest.approx(needle.retrieval_probability(mu, n, tau), abs=0.012)


def test_critical_context_is_the_half_point():
    n = needle.critical_context(4.2, 0.1)
    assert needle.retrieval_probability(4.2, n, 0.1) == pytest.approx(0.5, abs=1e-6)
    assert needle.critical_context(12.0) == math.inf


@settings(max_examples=40, deadline=None)
@given(st.floats(2.0, 7.0), st.floats(0.0, 0.8), st.floats(10, 1e6))
def test_probability_monotone(mu, tau, n):
    p = needle.retrieval_probability(mu, n, tau)
    assert 0 <= p <= 1
    assert needle.retrieval_probability(mu, 2 * n, tau) <= p + 1e-12
    assert needle.retrieval_probability(mu + 0.5, n, tau) >= p - 1e-12


def test_needles_have_the_margin_and_retrieval_matches_closed_form():
    q, k, _ = fp8.synthetic_head(16384, 64, 0, 1.0, 4.0, 256, 1.0, seed=2)
    nd = needle.needle_keys(q, 8, 4.0)
    sigma = np.linalg.norm(q.astype(float), axis=1) / math.sqrt(64)
    margins = np.einsum("rd,rd->r", q.astype(float), nd.astype(float)) / math.sqrt(64) / sigma
    assert np.allclose(margins, 4.0, rtol=1e-5)
    r = needle.retrieval_rates(q, k, nd, [1024, 16384])
    for c, s in zip(r.contexts, r.success, strict=True):
        assert s == pytest.approx(needle.retrieval_probability(4.0, c), abs=0.09)
    per_query = needle.retrieved(q, k, nd, 16384)
    assert per_query.mean() == pytest.approx(r.success[-1])


def test_window_drops_early_needles():
    q, k, _ = fp8.synthetic_head(8192, 64, 0, 1.0, 4.0, 64, 1.0, seed=3)
    nd = needle.needle_keys(q, 8, 8.0)
    depths = np.linspace(0, 0.99, 64)
    ok = needle.retrieved(q, k, nd, 8192, depths, window=4096)
    assert np.array_equal(ok, (8192 - depths * 8192) <= 4096)
    with pytest.raises(ValueError):
        needle.retrieval_rates(q, k, nd, [8192, 4096])


def test_clipped_margins_match_the_quantized_needle_and_the_half_loss_channel_count():
    q, K, _ = fp8.synthetic_head(8192, 64, 0, 1.0, 4.0, 64, 1.0, seed=3)
    scale = float(fp8.amax_scale(K[:1024]).item())
    clip = fp8.E4M3_MAX * scale
    sigma = np.linalg.norm(q.astype(np.float64), axis=1) / math.sqrt(64)
    for ch in (2, 8, 32):
        nd = fp8.fake_quantize(needle.needle_keys(q, ch, 6.0), scale).astype(np.float64)
        measured = np.einsum("rd,rd->r", q.astype(np.float64), nd) / math.sqrt(64) / sigma
        assert np.median(needle.clipped_margins(q, ch, 6.0, clip)) == pytest.approx(np.median(measured), abs=0.1)
    assert np.all(needle.clipped_margins(q, 64, 6.0, 1e9) == 6.0)  # nothing clips: the margin is kept
    c = needle.channels_to_lose_half(q, 6.0, clip, 8192)
    bar = needle.gaussian_max_median(8192)
    assert 1 <= c < 64
    assert np.median(needle.clipped_margins(q, c, 6.0, clip)) < bar <= np.median(needle.clipped_margins(q, c + 1, 6.0, clip))
    assert needle.channels_to_lose_half(q, 6.0, 1e9, 8192) == 0
