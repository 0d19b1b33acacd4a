"""lib.numerics.fp8: E4M3 emulation against torch.float8_e4m3fn (the oracle), properties of the rounding,
scaled quantization, the rounding/clipping split and the synthetic attention experiment."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import fp8

finite_f32 = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
in_range = st.floats(min_value=-448.0, max_value=448.0, allow_nan=False, allow_subnormal=True)


def _torch():
    return pytest.importorskip("torch")


# ---- the torch oracle ---------------------------------------------------------------------


def test_decode_all_256_codes_match_torch():
    torch = _torch()
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    mine = fp8.e4m3_decode(codes)
    assert np.array_equal(np.isnan(mine), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(mine[ok], ref[ok])
    assert np.array_equal(np.signbit(mine[ok]), np.signbit(ref[ok]))  # -0 at code 0x80


def test_encode_all_256_codes_match_torch():
    torch = _torch()
    values = fp8.e4m3_decode(np.arange(256))
    finite = np.isfinite(values)
    ref = (
        torch.from_numpy(values[finite].astype(np.float32))
        .to(torch.float8_e4m3fn)
        .view(torch.uint8)
        .numpy()
    )
    assert np.array_equal(fp8.e4m3_encode(values[finite]), ref)
    assert np.array_equal(fp8.e4m3_encode(values[finite]), np.arange(256)[finite])


def test_random_float32_match_torch_codes_and_values():
    torch = _torch()
    rng = np.random.default_rng(2024)
    n = 200_000
    x = rng.standard_normal(n) * 10.0 ** rng.uniform(
        -6, 4, n
    )  # 1e-6 .. 1e4: subnormal .. saturation
    specials = [
        0.0,
        -0.0,
        448.0,
        -448.0,
        464.0,
        465.0,
        480.0,
        1e30,
        -1e30,
        np.inf,
        -np.inf,
        2.0**-10,
        3 * 2.0**-11,
    ]
    x = np.concatenate([x, specials]).astype(np.float32)
    t = torch.from_numpy(x).to(torch.float8_e4m3fn)
    assert np.array_equal(fp8.e4m3_encode(x), t.view(torch.uint8).numpy())
    assert np.array_equal(fp8.e4m3_round(x), t.float().numpy())  # float32 fast path
    assert np.array_equal(
        fp8.e4m3_round(x.astype(np.float64)), t.float().numpy().astype(np.float64)
    )


def test_exact_ties_round_to_even_like_torch():
    torch = _torch()
    v = fp8.e4m3_values()
    mids = np.concatenate(
        [(v[1:] + v[:-1]) / 2, -(v[1:] + v[:-1]) / 2]
    )  # exact midpoints in float32
    ref = torch.from_numpy(mids.astype(np.float32)).to(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(fp8.e4m3_round(mids.astype(np.float32)), ref)
    # ties go to the code with an even mantissa
    assert np.all(fp8.e4m3_encode(mids) % 2 == 0)


# ---- the format ---------------------------------------------------------------------------


def test_published_format_constants():
    # Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433, Table 1 (E4M3):
    # max normal 448 = 1.75 * 2^8, min normal 2^-6, min subnormal 2^-9, exponent bias 7, NaN S.1111.111
    v = fp8.e4m3_values()
    assert v[-1] == 448.0 == fp8.E4M3_MAX
    assert v[1] == 2.0**-9 == fp8.E4M3_MIN_SUBNORMAL
    assert v[8] == 2.0**-6 == fp8.E4M3_MIN_NORMAL  # 0 and 7 subnormals come first
    assert len(v) == 127  # 0 + 7 subnormals + 15 binades x 8 - 1 (NaN)
    assert math.isnan(fp8.e4m3_decode(0x7F)) and math.isnan(fp8.e4m3_decode(0xFF))
    assert fp8.e4m3_decode(0x7E) == 448.0 and fp8.e4m3_decode(0x08) == 2.0**-6


def test_overflow_modes():
    assert np.array_equal(
        fp8.e4m3_round([464.0, 465.0, np.inf, -1e9]), [448.0, 448.0, 448.0, -448.0]
    )
    r = fp8.e4m3_round([464.0, 465.0, np.inf, -1e9, np.nan], overflow="nan")
    assert r[0] == 448.0 and np.all(np.isnan(r[1:]))  # 464 is the tie that rounds down to 448
    assert fp8.e4m3_encode(np.nan) == fp8.E4M3_NAN_CODE
    with pytest.raises(ValueError, match="overflow"):
        fp8.e4m3_round(1.0, overflow="clip")


def test_ulp_by_hand():
    assert fp8.e4m3_ulp(1.0) == 0.125 and fp8.e4m3_ulp(1.99) == 0.125
    assert fp8.e4m3_ulp(300.0) == 32.0 and fp8.e4m3_ulp(2.0**-8) == 2.0**-9


def test_scalar_and_shape_preserved():
    assert fp8.e4m3_round(5.3) == 5.5 and np.ndim(fp8.e4m3_round(5.3)) == 0
    x = np.ones((3, 4, 5), dtype=np.float32)
    assert fp8.e4m3_round(x).shape == (3, 4, 5) and fp8.e4m3_round(x).dtype == np.float32


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="real numbers"):
        fp8.e4m3_round(np.array(["a"]))
    with pytest.raises(ValueError, match="0..255"):
        fp8.e4m3_decode([256])
    with pytest.raises(ValueError, match="0..255"):
        fp8.e4m3_decode([1.5])
    with pytest.raises(ValueError, match="scale"):
        fp8.fake_quantize([1.0], 0.0)
    with pytest.raises(ValueError, match="scale"):
        fp8.quantize([1.0], -1.0)


# ---- properties ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(a=finite_f32, b=finite_f32)
def test_rounding_is_monotone(a, b):
    lo, hi = min(a, b), max(a, b)
    assert fp8.e4m3_round(lo) <= fp8.e4m3_round(hi)


@settings(max_examples=300, deadline=None)
@given(x=finite_f32)
def test_rounding_is_idempotent_and_odd(x):
    r = fp8.e4m3_round(x)
    assert fp8.e4m3_round(r) == r
    assert fp8.e4m3_round(-x) == -r


@settings(max_examples=400, deadline=None)
@given(x=in_range)
def test_error_at_most_half_ulp_in_range(x):
    r = float(fp8.e4m3_round(x))
    assert abs(r - x) <= float(fp8.e4m3_ulp(x)) / 2
    if abs(x) >= fp8.E4M3_MIN_NORMAL:
        assert abs(r - x) <= fp8.E4M3_MAX_RELATIVE_ROUNDING * abs(x) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(x=finite_f32)
def test_encode_decode_round_trip(x):
    assert fp8.e4m3_decode(fp8.e4m3_encode(x)) == fp8.e4m3_round(x)


@settings(max_examples=200, deadline=None)
@given(
    x=st.floats(min_value=-1e4, max_value=1e4, allow_nan=False),
    k=st.integers(min_value=-3, max_value=3),
)
def test_power_of_two_scale_is_exact_in_the_normal_range(x, k):
    # E4M3 rounding commutes with scaling by 2^k while the value stays normal and unclipped:
    # the relative grid is the same in every binade (why the scale barely matters for rounding)
    y = x * 2.0**k
    if fp8.E4M3_MIN_NORMAL <= abs(x) <= 448 and fp8.E4M3_MIN_NORMAL <= abs(y) <= 448:
        assert fp8.e4m3_round(y) == fp8.e4m3_round(x) * 2.0**k


@settings(max_examples=300, deadline=None)
@given(
    x=st.floats(allow_nan=True, allow_infinity=True, width=64),
    mode=st.sampled_from(["saturate", "nan"]),
)
def test_bit_trick_equals_brute_force_search(x, mode):
    # second method: the nearest of the 127 values by search, ties to the even code
    a, b = fp8.e4m3_round(x, mode), fp8.e4m3_round_reference(x, mode)
    assert (math.isnan(a) and math.isnan(b)) or a == b


def test_brute_force_reference_on_every_tie_and_value():
    v = fp8.e4m3_values()
    mids = np.concatenate([(v[1:] + v[:-1]) / 2, v, [456.0, 464.0, 464.5, 1e9]])
    for mode in ("saturate", "nan"):
        a, b = fp8.e4m3_round(mids, mode), fp8.e4m3_round_reference(mids, mode)
        assert np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(
            a[~np.isnan(a)], b[~np.isnan(b)]
        )


# ---- scaled quantization --------------------------------------------------------------------


def test_quantize_dequantize_equals_fake_quantize():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 8)) * 30
    s = fp8.amax_scale(x, axis=0)  # per-channel (per-column) scales
    assert s.shape == (1, 8)
    assert np.array_equal(fp8.dequantize(fp8.quantize(x, s), s), fake := fp8.fake_quantize(x, s))
    assert np.max(np.abs(fake)) <= np.max(np.abs(x)) * (1 + 1e-12)


def test_amax_scale_cases():
    x = np.zeros((2, 3, 4))
    x[1, 2, 3] = -896.0
    assert np.array_equal(fp8.amax_scale(x), [[[2.0]]])
    per_head = fp8.amax_scale(x, axis=(1, 2))
    assert per_head.ravel().tolist() == [1.0, 2.0]  # the all-zero head gets 1
    assert fp8.amax_scale(x, margin=2.0).item() == 4.0
    with pytest.raises(ValueError, match="margin"):
        fp8.amax_scale(x, margin=0)
    with pytest.raises(ValueError, match="finite"):
        fp8.amax_scale([np.inf])


def test_error_decomposition_adds_up_and_counts_clipping():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(10_000)
    s = float(np.max(np.abs(x))) / 448 / 4  # a quarter of the amax scale: the top values clip
    d = fp8.error_decomposition(x, s)
    direct = float(np.sum((fp8.fake_quantize(x, s) - x) ** 2))
    assert math.isclose(d.total_sse, direct, rel_tol=1e-12)
    assert d.clipped == int(np.sum(np.abs(x) > 448 * s)) > 0
    assert fp8.error_decomposition(x, fp8.amax_scale(x)).clipped == 0
    assert fp8.error_decomposition(x, s, "int8").clipped == int(np.sum(np.abs(x) > 127 * s))
    with pytest.raises(ValueError, match="fmt"):
        fp8.error_decomposition(x, s, "e5m2")
    with pytest.raises(ValueError, match="zeros"):
        fp8.error_decomposition(np.zeros(4), 1.0)


def test_rounding_floor_matches_measured_rounding():
    # second method: the closed-form expected rounding noise (uniform error in each binade)
    # against the measured error of log-uniform data quantized with its amax scale
    rng = np.random.default_rng(5)
    x = 2.0 ** rng.uniform(-4, 6, 200_000) * rng.choice([-1, 1], 200_000)
    s = float(fp8.amax_scale(x).item())
    measured = fp8.error_decomposition(x, s).rounding_rel
    assert math.isclose(measured, fp8.relative_rounding_floor(x, s), rel_tol=0.03)
    # a power-of-two change of scale leaves the floor unchanged
    assert math.isclose(
        fp8.relative_rounding_floor(x, s * 8), fp8.relative_rounding_floor(x, s), rel_tol=1e-12
    )


def test_error_vs_scale_shapes_fp8_flat_int8_not():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(20_000)
    f = 2.0 ** np.arange(0, 6)
    e = fp8.error_vs_scale(x, f)
    assert np.all(e["clipped_fraction"] == 0)  # f >= 1: nothing clips
    assert e["total_rel"].max() / e["total_rel"].min() < 1.3  # FP8: flat over 5 binades
    i = fp8.error_vs_scale(x, f, "int8")
    assert i["total_rel"][-1] / i["total_rel"][0] > 100  # INT8: error grows as s^2 (32^2)
    clip = fp8.error_vs_scale(x, [0.125, 0.25, 0.5, 1.0])["clipped_fraction"]
    assert np.all(np.diff(clip) <= 0)
    with pytest.raises(ValueError, match="scale_factors"):
        fp8.error_vs_scale(x, [0.0])


# ---- synthetic attention ------------------------------------------------------------------


def test_synthetic_head_is_seeded_and_shaped():
    q, k, v = fp8.synthetic_head(100, 16, 2, 4.0, 3.0, 3, 1.0, seed=9)
    q2, k2, _ = fp8.synthetic_head(100, 16, 2, 4.0, 3.0, 3, 1.0, seed=9)
    assert q.shape == (3, 16) and k.shape == (100, 16) and v.shape == (100, 16)
    assert k.dtype == np.float32 and np.array_equal(k, k2) and np.array_equal(q, q2)
    assert np.all(q[:, :2] >= 0)
    with pytest.raises(ValueError, match="num_outlier_channels"):
        fp8.synthetic_head(10, 4, 5)
    with pytest.raises(ValueError, match="num_tokens"):
        fp8.synthetic_head(0)


def test_attention_matches_torch_sdpa():
    torch = _torch()
    q, k, v = fp8.synthetic_head(500, 32, 2, 4.0, 4.0, 4, 1.0, seed=11)
    o, p = fp8.attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q.astype(np.float64))[None],
        torch.from_numpy(k.astype(np.float64))[None],
        torch.from_numpy(v.astype(np.float64))[None],
    )[0].numpy()
    assert np.allclose(o, ref, rtol=1e-5, atol=1e-6)
    assert np.allclose(p.sum(axis=1), 1.0)


def test_attention_error_static_vs_dynamic_and_sweep_agree():
    q, k, v = fp8.synthetic_head(4096, 32, 2, 2.0, 4.0, 4, 1.0, seed=13)
    ks, vs = float(fp8.amax_scale(k[:512]).item()), float(fp8.amax_scale(v[:512]).item())
    single = fp8.fp8_attention_error(q, k, v, 4096, ks, vs)
    sweep = fp8.fp8_attention_sweep(q, k, v, [512, 4096], {"static": (ks, vs)})["static"]
    assert sweep[1] == single
    assert sweep[0].clipped_tokens == 0 and sweep[0].clipped_mass == 0  # the calibration prefix
    lim = 448 * (1 + 1e-6)
    brute = int(np.sum(np.any(np.abs(k) > lim * ks, axis=1) | np.any(np.abs(v) > lim * vs, axis=1)))
    assert single.clipped_tokens == brute
    dyn = fp8.fp8_attention_error(q, k, v, 4096)
    assert dyn.clipped_tokens == 0 and dyn.output_rel_error < 0.2
    with pytest.raises(ValueError, match="context"):
        fp8.fp8_attention_error(q, k, v, 5000)


@settings(max_examples=25, deadline=None)
@given(exp=st.integers(-20, 20), mant=st.floats(1.0, 1.999), rounding=st.sampled_from(fp8.MX_ROUNDING))
def test_mx_scale_is_a_power_of_two_that_puts_the_block_max_in_range(exp, mant, rounding):
    x = np.full((1, 32), 0.1 * 2.0 ** exp)
    x[0, 5] = mant * 2.0 ** exp
    s = fp8.mx_block_scale(x, 32, rounding)[0, 0, 0]
    assert math.log2(s) == int(math.log2(s))
    top = mant * 2.0 ** exp / s
    if rounding == "ceil":
        assert 224 < top <= 448 * (1 + 1e-12)  # the smallest power of two that clips nothing
    else:
        assert 256 <= top < 512  # OCP: floor(log2 amax) - emax, may exceed 448 and saturate


# ---- block_scale / block_fake_quantize (general block scales, FP32 or E8M0) ------------------------------------


def test_block_scale_fp32_maps_each_tile_amax_to_448():
    x = np.random.default_rng(0).standard_normal((4, 256))
    s = fp8.block_scale(x, (1, 128), "fp32")
    assert s.shape == (4, 1, 2, 1)
    tiles = x.reshape(4, 1, 2, 128)
    assert np.allclose(np.abs(tiles).max(axis=(1, 3), keepdims=True) / s, 448.0)
    xh = fp8.block_fake_quantize(x, (1, 128))
    assert np.allclose(np.abs(xh).reshape(4, 2, 128).max(axis=2), np.abs(x).reshape(4, 2, 128).max(axis=2))


def test_block_e8m0_1x32_is_mx_ceil():
    """Oracle: with (1, 32) blocks and power-of-two scales the general quantizer is mx_block_scale(ceil)."""
    x = np.random.default_rng(1).standard_normal((8, 128)) * np.r_[[50.0] * 3, [1.0] * 125]
    a = fp8.block_fake_quantize(x, (1, 32), "e8m0")
    b = fp8.fake_quantize(x.reshape(8, 4, 32), fp8.mx_block_scale(x, 32, "ceil")).reshape(8, 128)
    assert np.array_equal(a, b)
    # the OCP floor rounding too (saturating the block's largest element at 448), and 128-tiles repeated over 4
    # MX sub-blocks are a valid MX tensor: the same values as 32-element blocks carrying the tile's scale
    fl = fp8.block_fake_quantize(x, (1, 32), "e8m0", "floor")
    assert np.array_equal(fl, fp8.fake_quantize(x.reshape(8, 4, 32), fp8.mx_block_scale(x, 32, "floor")).reshape(8, 128))
    s128 = np.repeat(fp8.block_scale(x, (1, 128), "e8m0").reshape(8, 1), 4, axis=1)[..., None]
    assert np.array_equal(fp8.fake_quantize(x.reshape(8, 4, 32), s128).reshape(8, 128), fp8.block_fake_quantize(x, (1, 128), "e8m0"))
    with pytest.raises(ValueError, match="rounding"):
        fp8.block_scale(x, (1, 32), "e8m0", "nearest")


def test_block_2d_weight_blocks_and_errors():
    w = np.random.default_rng(2).standard_normal((256, 128))
    s = fp8.block_scale(w, (128, 128), "fp32")
    assert s.shape == (2, 1, 1, 1)
    assert np.isclose(float(s[0, 0, 0, 0]), np.abs(w[:128]).max() / 448)
    assert np.array_equal(fp8.block_scale(np.zeros((2, 128))), np.ones((2, 1, 1, 1)))
    with pytest.raises(ValueError, match="multiple"):
        fp8.block_scale(w, (100, 128))
    with pytest.raises(ValueError, match="scale_format"):
        fp8.block_scale(w, (128, 128), "e4m3")
    with pytest.raises(ValueError, match="2-D"):
        fp8.block_scale(np.ones(128))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(-20, 20), st.sampled_from(["fp32", "e8m0"]))
def test_block_quantize_properties(seed, log2_mult, fmt):
    """Nothing clips (|x_hat| <= 448 s of its tile; FP32 scales keep each tile's amax exactly), the relative
    rounding error of normal values is at most 2^-4, and power-of-two scales commute with multiplying x by a
    power of two."""
    x = np.random.default_rng(seed).standard_normal((2, 64)) * 2.0 ** log2_mult
    xh = fp8.block_fake_quantize(x, (1, 32), fmt)
    s = fp8.block_scale(x, (1, 32), fmt).reshape(2, 2, 1)
    assert np.all(np.abs(xh).reshape(2, 2, 32) <= 448 * s * (1 + 1e-12))
    if fmt == "fp32":
        amax = np.abs(x).reshape(2, 2, 32).max(axis=2)
        assert np.allclose(np.abs(xh).reshape(2, 2, 32).max(axis=2), amax, rtol=1e-12)
    normal = np.abs(x).reshape(2, 2, 32) >= fp8.E4M3_MIN_NORMAL * s
    err = np.abs(xh - x).reshape(2, 2, 32)
    assert np.all(err[normal] <= 2.0**-4 * np.abs(x).reshape(2, 2, 32)[normal] * (1 + 1e-9))
    if fmt == "e8m0":
        assert np.array_equal(fp8.block_fake_quantize(4.0 * x, (1, 32), fmt), 4.0 * xh)
