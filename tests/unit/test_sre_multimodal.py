"""I083: image-token arithmetic, the vision encoder's peak and the phase that runs out of memory."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.memory import activation_peak_bytes, memory_budget
from lib.sre import multimodal as mm

T = mm.vision_tower()


def test_tower_facts():
    assert T.factor == 28 and T.decoder == "qwen2.5-72b"
    assert T.max_pixels == 16384 * 28 * 28 and T.card_max_pixels == 1280 * 28 * 28


def test_known_resizes():
    # 4K UHD: round(2160/28) = 77, round(3840/28) = 137 (banker's rounding as in transformers)
    assert mm.smart_resize(2160, 3840, T) == (77 * 28, 137 * 28)
    assert mm.image_tokens(2160, 3840, T) == 77 * 137
    assert mm.image_tokens(224, 224, T) == 64
    # the card's max_pixels caps the token count at 1280
    assert mm.image_tokens(2160, 3840, T, max_pixels=T.card_max_pixels) <= 1280
    # tiny images scale up to min_pixels (56 x 56 = 4 tokens)
    assert mm.image_tokens(10, 10, T) == 4


@settings(max_examples=200, deadline=None)
@given(st.integers(28, 8000), st.integers(28, 8000), st.sampled_from([T.card_max_pixels, 4014080, T.max_pixels]))
def test_resize_properties(h, w, cap):
    if max(h, w) / min(h, w) > 200:
        return
    rh, rw = mm.smart_resize(h, w, T, max_pixels=cap)
    assert rh % 28 == 0 and rw % 28 == 0
    assert rh * rw <= cap
    assert rh * rw >= T.min_pixels or rh * rw >= 28 * 28
    # the aspect ratio survives within one 28-px step on the shorter side
    assert abs(rh / rw - h / w) <= 28 / min(rh, rw) * max(1, h / w) + 1e-9
    # tokens are monotone in the cap
    assert mm.image_tokens(h, w, T, cap) <= mm.image_tokens(h, w, T, T.max_pixels)


def test_tower_params_by_module_list():
    h, i, o = 1280, 3456, 8192  # Qwen2.5-VL-72B config.json vision_config
    shapes = [(3 * 2 * 14 * 14, h, False)]  # Conv3d patch embedding, no bias
    for _ in range(32):
        shapes += [(h, 3 * h, True), (h, h, True), (h, i, True), (h, i, True), (i, h, True)]
    shapes += [(4 * h, 4 * h, True), (4 * h, o, True)]
    norms = 32 * 2 * h + h
    brute = sum(a * b + (b if bias else 0) for a, b, bias in shapes) + norms
    assert mm.tower_params(T) == brute
    assert 0.6e9 < brute < 0.8e9  # Qwen2.5-VL's ViT is about 0.67B plus the merger


def test_encoder_peak_formula_and_scaling():
    one = mm.encoder_activation_peak_bytes(T, 1000, 1, tp=1)
    assert one == 2 * 1000 * (2 * 1280 + max(4 * 1280, 3 * 3456))
    assert mm.encoder_activation_peak_bytes(T, 1000, 8) == pytest.approx(8 * one)
    eager = mm.encoder_activation_peak_bytes(T, 1000, 2, tp=4, flash=False)
    flash = mm.encoder_activation_peak_bytes(T, 1000, 2, tp=4)
    assert eager - flash == pytest.approx(4 * 2000**2 * 4 + 2000**2)
    with pytest.raises(ValueError, match="heads"):
        mm.encoder_activation_peak_bytes(T, 10, 1, tp=3)


def test_phase_peaks_pick_the_encode_phase():
    b = memory_budget("qwen2.5-72b", "h100-sxm", tp=4, gpu_memory_utilization=0.95)
    tok = mm.image_tokens(2160, 3840, T)
    p = mm.phase_peaks(b, T, tok, 8)
    assert p.oom_phase == "encode"
    assert p.prefill == pytest.approx(activation_peak_bytes("qwen2.5-72b", b.max_num_batched_tokens, 4)
                                      + mm.embedding_bytes(8 * tok, T))
    assert p.allowance == pytest.approx(b.components["activations"] + b.headroom_margin_bytes)
    small = mm.phase_peaks(b, T, mm.image_tokens(2160, 3840, T, T.card_max_pixels), 8)
    assert small.oom_phase is None


def test_largest_fitting_against_a_scan():
    for limit in (0, 1, 7, 50, 99):
        got = mm.largest_fitting(lambda n, lim=limit: n <= lim, 1, 100)
        want = max([n for n in range(1, 101) if n <= limit], default=0)
        assert got == want


def test_embedding_and_pixels():
    assert mm.embedding_bytes(10, T) == 10 * 8192 * 2
    assert mm.pixel_bytes(4, T) == 4 * 3 * 2 * 14 * 14 * 2
    assert math.isclose(mm.image_patches(10, T), 40)


def test_validation():
    with pytest.raises(ValueError, match="vision tower"):
        mm.vision_tower("nope")
    with pytest.raises(ValueError, match="height"):
        mm.smart_resize(0, 10, T)
    with pytest.raises(ValueError, match="aspect"):
        mm.smart_resize(10, 5000, T)
