"""Unit constants and every piece of number formatting in the book.

Inside lib everything is SI (bytes, seconds, FLOP, FLOP/s, watts). Convert only for display,
here. Decimal and binary byte units are both available and always explicit:
GB = 1e9 bytes, GiB = 2**30 bytes. Never mix them silently.
"""

from __future__ import annotations

import math

from lib.inputs import real

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
US, MS = 1e-6, 1e-3
TFLOPS, PFLOPS = 1e12, 1e15

_BYTE_UNITS = {"B": 1.0, "KB": KB, "MB": MB, "GB": GB, "TB": TB,
               "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}


def sig(x: float, digits: int = 3) -> str:
    """Format ``x`` with ``digits`` significant digits and thousands separators (``1,234``, ``0.0512``);
    below 0.001 in scientific notation (``5.2e-8``), where a run of zeros would hide the magnitude."""
    x = real("value", x)
    if x == 0:
        return "0"
    rounded = float(f"{x:.{digits}g}")
    if abs(rounded) < 1e-3:
        mantissa, exponent = f"{rounded:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(rounded))), 0)
    return f"{rounded:,.{decimals}f}"


def fmt_bytes(n_bytes: float, unit: str = "GB", digits: int = 3) -> str:
    """Bytes in an explicit unit: ``fmt_bytes(141e9) -> '141 GB'``; ``unit`` in B, KB..TB, KiB..TiB."""
    if unit not in _BYTE_UNITS:
        raise ValueError(f"unit must be one of {sorted(_BYTE_UNITS)}, got {unit!r}")
    return f"{sig(n_bytes / _BYTE_UNITS[unit], digits)} {unit}"


def fmt_time(seconds: float, unit: str | None = None, digits: int = 3) -> str:
    """Seconds shown in s, ms or µs (picked from the magnitude unless ``unit`` is given)."""
    seconds = real("seconds", seconds)
    scales = {"s": 1.0, "ms": MS, "us": US}
    if unit is None:
        unit = "s" if abs(seconds) >= 1 else "ms" if abs(seconds) >= 1e-3 else "us"
    if unit not in scales:
        raise ValueError(f"unit must be one of {sorted(scales)}, got {unit!r}")
    label = "µs" if unit == "us" else unit
    return f"{sig(seconds / scales[unit], digits)} {label}"


def fmt_flops(flop_per_s: float, digits: int = 3) -> str:
    """A FLOP/s rate in TFLOP/s (``989e12 -> '989 TFLOP/s'``)."""
    return f"{sig(flop_per_s / TFLOPS, digits)} TFLOP/s"


def fmt_bandwidth(bytes_per_s: float, digits: int = 3) -> str:
    """A byte rate in TB/s at or above 1 TB/s, else GB/s (decimal units)."""
    if abs(bytes_per_s) >= TB:
        return f"{sig(bytes_per_s / TB, digits)} TB/s"
    return f"{sig(bytes_per_s / GB, digits)} GB/s"


def fmt_count(n: float, digits: int = 3) -> str:
    """A large count with a suffix: ``70.6e9 -> '70.6B'``, ``1.3e6 -> '1.3M'``."""
    n = real("count", n)
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{sig(n / scale, digits)}{suffix}"
    return sig(n, digits)


def fmt_sci(x: float, digits: int = 3) -> str:
    """Scientific notation with ``digits`` significant digits: ``6.35e24`` (the FLOP of a run)."""
    mantissa, exponent = f"{real('value', x):.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def fmt_pct(fraction: float, digits: int = 3) -> str:
    """A fraction as a percentage: ``0.613 -> '61.3%'``."""
    return f"{sig(100 * fraction, digits)}%"


def fmt_int(n: float) -> str:
    """A whole number with thousands separators: ``8192 -> '8,192'`` (a float is rounded half to even)."""
    if isinstance(n, bool):
        raise ValueError(f"fmt_int takes a number, got the bool {n!r}")
    if isinstance(n, int):
        return f"{n:,}"
    return f"{real('value', n):,.0f}"


def fmt_ratio(x: float, digits: int = 3) -> str:
    """A ratio or speed-up: ``3.14159 -> '3.14x'``."""
    return f"{sig(x, digits)}x"


def fmt_unit(x: float, unit: str, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits followed by a unit: ``fmt_unit(1234.5, 'tokens/s') -> '1,230 tokens/s'``."""
    return f"{sig(x, digits)} {unit}"


def fmt_duration(seconds: float, digits: int = 3) -> str:
    """A span of time in the unit a person would say: s below 2 minutes, then min, h, days
    (``518.4 -> '8.64 min'``, ``129600 -> '36 h'``); ``inf`` is ``'never'``."""
    seconds = float(seconds)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"seconds must be a non-negative duration (inf for never), got {seconds!r}")
    if math.isinf(seconds):
        return "never"
    for limit, scale, unit in ((120.0, 1.0, "s"), (7200.0, 60.0, "min"), (172800.0, 3600.0, "h")):
        if seconds < limit:
            return f"{sig(seconds / scale, digits)} {unit}"
    return f"{sig(seconds / 86400.0, digits)} days"


def fmt_auto(value) -> str:
    """The default text of a glued value: an int with thousands separators (``8,192``); anything
    else (a float, a str, a bool) as ``str``. Floats deserve a chosen precision: pass ``sig`` or a
    unit formatter."""
    if isinstance(value, int) and not isinstance(value, bool):
        return fmt_int(value)
    return str(value)
