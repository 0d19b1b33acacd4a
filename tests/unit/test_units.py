"""lib.units: explicit GB vs GiB, significant digits, time units."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib import units


def test_gb_and_gib_are_distinct():
    assert units.GB == 1e9 and units.GiB == 2**30
    assert units.fmt_bytes(80e9, "GB") == "80.0 GB"
    assert units.fmt_bytes(80e9, "GiB") == "74.5 GiB"


@pytest.mark.parametrize(("x", "text"), [(295.2238, "295"), (0.05123, "0.0512"), (9.996, "10.0"),
                                         (1_234_567, "1,230,000"), (0, "0"), (-3.14159, "-3.14"),
                                         (5.2e-8, "5.20e-8"), (-4.4e-4, "-4.40e-4"), (0.001, "0.00100")])
def test_sig(x, text):
    assert units.sig(x) == text


@pytest.mark.parametrize(("s", "text"), [(0.005263, "5.26 ms"), (0.24, "240 ms"), (3.2e-5, "32.0 µs"),
                                         (1.5, "1.50 s")])
def test_fmt_time_picks_unit(s, text):
    assert units.fmt_time(s) == text


def test_formatters():
    assert units.fmt_count(70.55e9) == "70.5B" or units.fmt_count(70.55e9) == "70.6B"
    assert units.fmt_pct(0.6131) == "61.3%"
    assert units.fmt_bandwidth(3.35e12) == "3.35 TB/s"
    assert units.fmt_bandwidth(450e9) == "450 GB/s"
    assert units.fmt_flops(989e12) == "989 TFLOP/s"


def test_bad_unit_and_nonfinite_raise():
    with pytest.raises(ValueError, match="unit must be one of"):
        units.fmt_bytes(1, "gb")
    with pytest.raises(ValueError, match="finite"):
        units.sig(float("nan"))


@given(st.integers(-2**50, 2**50))
def test_fmt_int_matches_python_grouping_and_float_rounding(n):
    assert units.fmt_int(n) == f"{n:,}"
    assert units.fmt_int(float(n)) == f"{n:,}"
    assert units.fmt_int(n + 0.25) == f"{n:,}"  # 0.25 is exact in binary at this size


def test_unit_formatters_and_the_glue_default():
    assert units.fmt_ratio(3.14159) == "3.14x"
    assert units.fmt_ratio(3.14159, 2) == "3.1x"
    assert units.fmt_unit(1234.5, "tokens/s") == "1,230 tokens/s"
    assert units.fmt_auto(8192) == "8,192"
    assert units.fmt_auto(0.5) == "0.5"
    assert units.fmt_auto(True) == "True"
    assert units.fmt_auto("b200") == "b200"
    with pytest.raises(ValueError, match="bool"):
        units.fmt_int(True)
