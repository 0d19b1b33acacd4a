"""lib.inputs: the shared validators (types accepted, bounds, messages, plain python results)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.inputs import fraction, integer, integer_array, real

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
NOT_NUMBERS = [None, "3", [3], (3,), {"x": 3}, np.array([3]), complex(1, 0)]


# ---- integer ------------------------------------------------------------------------------


def test_integer_returns_a_python_int_within_inclusive_bounds():
    assert integer("tp", 1, 1) == 1
    assert integer("tp", 8, 1, 8) == 8
    assert type(integer("tp", np.int64(4), 1)) is int


@pytest.mark.parametrize(
    "bad", [True, False, np.bool_(True), 2.0, np.float64(2), 1.5, *NOT_NUMBERS]
)
def test_integer_rejects_bool_floats_and_non_numbers(bad):
    with pytest.raises(ValueError, match=r"^tp must be an integer >= 0, got "):
        integer("tp", bad, 0)


def test_integer_messages_name_the_input_the_range_and_the_value():
    with pytest.raises(ValueError, match=r"^tp must be an integer >= 1, got 0$"):
        integer("tp", 0, 1)
    with pytest.raises(ValueError, match=r"^block must be an integer in \[0, 3\], got 4$"):
        integer("block", 4, 0, 3)
    with pytest.raises(ValueError, match=r"^context must be an integer >= 0 tokens, got -1$"):
        integer("context", -1, 0, unit="tokens")


@given(dtype=st.sampled_from(INT_DTYPES), data=st.data())
def test_integer_accepts_every_numpy_integer_dtype(dtype, data):
    info = np.iinfo(dtype)
    v = data.draw(st.integers(int(info.min), int(info.max)))
    out = integer("n", dtype(v), int(info.min))
    assert type(out) is int and out == v


@given(v=st.integers(-(2**70), 2**70), low=st.integers(-100, 100), span=st.integers(0, 100))
def test_integer_accepts_exactly_the_closed_interval(v, low, span):
    high = low + span
    if low <= v <= high:
        assert integer("n", v, low, high) == v
    else:
        with pytest.raises(ValueError, match=rf"n must be an integer in \[{low}, {high}\]"):
            integer("n", v, low, high)


@given(v=st.floats(allow_nan=True, allow_infinity=True))
def test_integer_rejects_every_float(v):
    with pytest.raises(ValueError, match="n must be an integer"):
        integer("n", v, -(2**80))


# ---- real ---------------------------------------------------------------------------------


def test_real_returns_a_python_float():
    for v in (3, 3.0, np.int32(3), np.float32(3), np.uint8(3), Fraction(3)):
        out = real("x", v)
        assert type(out) is float and out == 3.0


@pytest.mark.parametrize(
    "bad", [True, np.bool_(False), math.nan, math.inf, -math.inf, 10**400, *NOT_NUMBERS]
)
def test_real_rejects_bool_non_finite_and_non_numbers(bad):
    with pytest.raises(ValueError, match=r"^x must be a finite number, got "):
        real("x", bad)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_real_rejects_numpy_nan_and_inf(dtype):
    for bad in (dtype("nan"), dtype("inf"), dtype("-inf")):
        with pytest.raises(ValueError, match="x must be"):
            real("x", bad, 0)


def test_real_bounds_are_closed_unless_marked_open():
    assert real("x", 0, 0) == 0.0
    assert real("x", 1, 0, 1) == 1.0
    with pytest.raises(ValueError, match=r"^x must be a finite number > 0, got 0$"):
        real("x", 0, 0, low_open=True)
    ceiling = r"^x must be a number in \(0, 1\) \(of the ceiling\), got 1$"
    with pytest.raises(ValueError, match=ceiling):
        real("x", 1, 0, 1, low_open=True, high_open=True, unit="(of the ceiling)")
    with pytest.raises(ValueError, match=r"^x must be a finite number <= 2, got 3$"):
        real("x", 3, high=2)
    with pytest.raises(ValueError, match=r"^x must be a finite number >= 0 seconds, got -1\.0$"):
        real("x", -1.0, 0, unit="seconds")


@given(
    v=st.floats(allow_nan=True, allow_infinity=True),
    low=st.floats(-1e6, 1e6),
    span=st.floats(0, 1e6),
    low_open=st.booleans(),
    high_open=st.booleans(),
)
def test_real_accepts_exactly_the_finite_numbers_in_its_interval(v, low, span, low_open, high_open):
    high = low + span
    inside = (
        math.isfinite(v)
        and (v > low if low_open else v >= low)
        and (v < high if high_open else v <= high)
    )
    if inside:
        assert real("x", v, low, high, low_open=low_open, high_open=high_open) == v
    else:
        with pytest.raises(ValueError, match="x must be a number in"):
            real("x", v, low, high, low_open=low_open, high_open=high_open)


@given(dtype=st.sampled_from(FLOAT_DTYPES + INT_DTYPES), v=st.integers(0, 100))
def test_real_accepts_every_numpy_number_dtype(dtype, v):
    out = real("x", dtype(v), 0)
    assert type(out) is float and out == v


# ---- fraction -----------------------------------------------------------------------------


def test_fraction_includes_zero_unless_told_not_to():
    assert fraction("f", 0) == 0.0 and fraction("f", 1) == 1.0
    assert fraction("f", np.float32(0.5), allow_zero=False) == 0.5
    with pytest.raises(ValueError, match=r"^mfu must be a number in \(0, 1\], got 0$"):
        fraction("mfu", 0, allow_zero=False)
    with pytest.raises(ValueError, match=r"^acceptance must be a number in \[0, 1\], got 1\.5$"):
        fraction("acceptance", 1.5)


@given(v=st.floats(allow_nan=True, allow_infinity=True), allow_zero=st.booleans())
def test_fraction_accepts_exactly_its_interval(v, allow_zero):
    ok = math.isfinite(v) and (0 <= v if allow_zero else 0 < v) and v <= 1
    if ok:
        assert fraction("f", v, allow_zero=allow_zero) == v
    else:
        with pytest.raises(ValueError, match="f must be a number in"):
            fraction("f", v, allow_zero=allow_zero)


# ---- integer_array ------------------------------------------------------------------------


def test_integer_array_returns_int64_of_any_shape():
    out = integer_array("lengths", [[1, 2], [3, 4]], 1)
    assert out.dtype == np.int64 and out.shape == (2, 2)
    assert integer_array("n", np.uint8(7)).shape == ()
    assert integer_array("n", np.array([], dtype=np.int32)).size == 0


@pytest.mark.parametrize("bad", [[1.0, 2.0], [True, False], ["1"], 2.5])
def test_integer_array_rejects_non_integer_dtypes(bad):
    with pytest.raises(ValueError, match=r"^n must be integers >= 0, got an array of dtype "):
        integer_array("n", bad)


def test_integer_array_names_the_smallest_offending_value():
    with pytest.raises(ValueError, match=r"^lengths must be integers >= 1, got -2$"):
        integer_array("lengths", np.array([3, -2, 0], dtype=np.int16), 1)


@given(dtype=st.sampled_from(INT_DTYPES), values=st.lists(st.integers(0, 127), max_size=20))
def test_integer_array_accepts_every_numpy_integer_dtype(dtype, values):
    out = integer_array("n", np.array(values, dtype=dtype))
    assert out.dtype == np.int64 and out.tolist() == values


# ---- regressions: callers that pass values out of numpy arrays -----------------------------


def test_memory_accepts_numpy_integer_tp():
    from lib.perf import memory

    for tp in (np.int64(4), np.int32(4), np.uint8(4)):
        assert memory.weight_bytes_per_gpu("llama-3.1-70b", tp) == memory.weight_bytes_per_gpu(
            "llama-3.1-70b", 4
        )
        assert memory.kv_placement("llama-3.1-70b", tp) == memory.kv_placement("llama-3.1-70b", 4)
        assert memory.memory_budget(
            "llama-3.1-70b", "h100-sxm", tp
        ).kv_cache_bytes == pytest.approx(
            memory.memory_budget("llama-3.1-70b", "h100-sxm", 4).kv_cache_bytes, rel=1e-12
        )
    with pytest.raises(ValueError, match=r"tp must be an integer >= 1, got np\.int64\(0\)"):
        memory.kv_placement("llama-3.1-70b", np.int64(0))
    with pytest.raises(ValueError, match="tp must be an integer >= 1, got True"):
        memory.kv_placement("llama-3.1-70b", True)


def test_roofline_and_throughput_accept_numpy_integer_tp():
    from lib.perf import roofline, throughput

    assert roofline.kv_shard_fraction("llama-3.1-70b", np.int64(16)) == 1 / 8
    assert roofline.decode_step("llama-3.1-70b", "h100-sxm", np.int64(8), 4, 1024) == (
        roofline.decode_step("llama-3.1-70b", "h100-sxm", 8, 4, 1024)
    )
    from lib.perf.deployment import Deployment

    dep = Deployment("llama-3.1-8b", "h100-sxm", tp=np.int64(2))
    assert throughput.step_s(dep, np.int64(4), np.int64(1)) == throughput.step_s(
        Deployment("llama-3.1-8b", "h100-sxm", tp=2), 4, 1)


def _calls():
    from lib.perf import attention_intensity, decode_kernels, mbu, prefill, roofline, step
    from lib.perf.deployment import Deployment

    m70, h100 = "llama-3.1-70b", "h100-sxm"
    return [
        # roofline.decode_step takes a fractional batch (bisection) and checks only its range
        (roofline.decode_step, (m70, h100), {"tp": 8}),
        (step.decode_step, (Deployment(m70, h100, tp=8),), {"batch": 64, "context": 8192}),
        (decode_kernels.decode_step_kernels, (m70, h100), {"batch": 64, "context": 8192, "tp": 8}),
        (mbu.step_bytes, (m70,), {"batch": 64, "context": 8192, "tp": 8}),
        (prefill.prefill_estimate, (m70, h100), {"prompt_len": 8192, "n_gpus": 8}),
        (attention_intensity.decode_attention_flops_bytes, (m70,), {"context": 8192, "batch": 64}),
    ]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # fixed-width numpy overflow would warn
@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.int64])
def test_numpy_integer_arguments_give_the_python_int_result(dtype):
    for func, args, kwargs in _calls():
        expected = func(*args, **kwargs)
        numpy_kwargs = {k: dtype(v) for k, v in kwargs.items()}
        assert func(*args, **numpy_kwargs) == expected, func.__qualname__
