"""Input validation shared by lib: one home for the generic type and range checks.

Each validator takes the input's ``name`` (as the caller calls it) and its ``value``, returns
the cleaned value as a plain python ``int`` / ``float`` (or an int64 array), and raises
``ValueError("<name> must be <what is allowed>, got <value!r>")`` otherwise. Python and numpy
numbers are accepted alike; ``bool`` never counts as a number. Checks that depend on the
domain (``tp`` must divide the KV heads, a length must fit the cache) stay in their modules.
Numpy scalars are recognised through the ``numbers`` ABCs it registers them with, so importing
this module does not import numpy.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["fraction", "integer", "integer_array", "real"]


def _fail(name: str, allowed: str, value: object, unit: str) -> ValueError:
    return ValueError(f"{name} must be {allowed}{' ' + unit if unit else ''}, got {value!r}")


def integer(name: str, value: object, low: int, high: int | None = None, *, unit: str = "") -> int:
    """An integer with ``low <= value`` (and ``value <= high`` when given), as a python int.

    Accepts python and numpy integers; rejects bool, floats (even 4.0) and everything else.
    ``unit`` is appended to the allowed range in the message (``"tokens"``).
    """
    if not (
        (type(value) is int or (isinstance(value, Integral) and not isinstance(value, bool)))
        and low <= value
        and (high is None or value <= high)
    ):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise _fail(name, allowed, value, unit)
    return int(value)


def real(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    unit: str = "",
) -> float:
    """A finite real number within optional bounds, as a python float.

    Bounds are inclusive unless ``low_open`` / ``high_open`` (``low=0, low_open=True``: > 0).
    Accepts python and numpy integers and floats; rejects bool, NaN, +-inf and non-numbers.
    ``unit`` is appended to the allowed range in the message (``"seconds"``).
    """
    x = math.nan
    if type(value) in (float, int) or (isinstance(value, Real) and not isinstance(value, bool)):
        try:
            x = float(value)
        except OverflowError:  # a python int beyond the float range
            pass
    if (
        math.isfinite(x)
        and (low is None or (x > low if low_open else x >= low))
        and (high is None or (x < high if high_open else x <= high))
    ):
        return x
    if low is not None and high is not None:
        allowed = f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    else:
        allowed = "a finite number"
        if low is not None:
            allowed += f" {'>' if low_open else '>='} {low}"
        if high is not None:
            allowed += f" {'<' if high_open else '<='} {high}"
    raise _fail(name, allowed, value, unit)


def fraction(name: str, value: object, *, allow_zero: bool = True) -> float:
    """A number in [0, 1] (in (0, 1] when ``allow_zero`` is False), as a python float."""
    return real(name, value, 0, 1, low_open=not allow_zero)


def integer_array(name: str, values: object, low: int = 0):
    """Integers ``>= low`` (a scalar or any-shaped array of them), as an int64 array.

    Accepts python and numpy integers and integer arrays; rejects bool and float dtypes.
    """
    import numpy as np

    arr = np.asarray(values)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers >= {low}, got an array of dtype {arr.dtype}")
    if arr.size and arr.min() < low:
        raise ValueError(f"{name} must be integers >= {low}, got {arr.min().item()!r}")
    return arr.astype(np.int64)
