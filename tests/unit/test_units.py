"""lib.units: explicit GB vs GiB, significant digits, time units."""

import pytest

from lib import units


def test_gb_and_gib_are_distinct():
    assert units.GB == 1e9 and units.GiB == 2**30
    assert units.fmt_bytes(80e9, "GB") == "80.0 GB"
    assert units.fmt_bytes(80e9, "GiB") == "74.5 GiB"


@pytest.mark.parametrize(("x", "text"), [(295.2238, "295"), (0.05123, "0.0512"), (9.996, "10.0"),
                                         (1_234_567, "1,230,000"), (0, "0"), (-3.14159, "-3.14")])
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
