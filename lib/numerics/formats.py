"""Floating-point formats as numbers: the largest finite value of each dtype the book uses, and
the score past which exp() overflows in it (the reason softmax subtracts the row max)."""

from __future__ import annotations

import math
import struct

import numpy as np

from .fp8 import E4M3_MAX

__all__ = ["bf16_round", "bf16_round_scalar", "bf16_ulp", "exp_overflow_score", "largest_finite"]

_BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))  # 0 11111110 1111111: (2 - 2^-7) 2^127
_LARGEST = {"fp8": E4M3_MAX, "fp16": float(np.finfo(np.float16).max), "bf16": _BF16_MAX,
            "fp32": float(np.finfo(np.float32).max), "fp64": float(np.finfo(np.float64).max)}


def largest_finite(dtype: str) -> float:
    """The largest finite value of ``dtype``: fp8 (E4M3) 448, fp16 65504, bf16 (2 - 2^-7) 2^127
    ~ 3.39e38, fp32 (2 - 2^-23) 2^127 ~ 3.40e38, fp64 ~ 1.80e308."""
    if dtype not in _LARGEST:
        raise ValueError(f"dtype must be one of {', '.join(_LARGEST)}, got {dtype!r}")
    return _LARGEST[dtype]


def exp_overflow_score(dtype: str) -> float:
    """The score past which exp(s) is +inf in ``dtype``: ln(largest finite value).
    fp16: ln 65504 = 11.09; bf16 and fp32: 88.72; fp64: 709.8. Subtracting the row max keeps
    every exponent <= 0, so no score overflows."""
    return math.log(largest_finite(dtype))


def bf16_round(x) -> np.ndarray:
    """Round float32 values to bfloat16 (round to nearest, ties to even; returned as float32): keep
    the top 16 bits of the IEEE pattern after adding 0x7FFF plus the lowest kept bit."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))  # (a scalar comes back with shape (1,))
    b = a.reshape(-1).view(np.uint32)
    r = b >> 16  # in uint32, in place: the sum wraps modulo 2^32 before the mask, as it must
    r &= 1
    r += 0x7FFF
    r += b
    r &= 0xFFFF0000
    return r.view(np.float32).reshape(a.shape)


_F32, _U32 = struct.Struct("<f"), struct.Struct("<I")


def bf16_round_scalar(x: float) -> float:
    """:func:`bf16_round` of one Python float (rounded to float32 first, then to bfloat16 by the same bit
    operation), returned as a Python float: no numpy call per value, for loops that round once per step.
    OverflowError past float32's range."""
    b = _U32.unpack(_F32.pack(x))[0]
    return _F32.unpack(_U32.pack((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000))[0]


def bf16_ulp(y) -> np.ndarray:
    """Spacing of the bfloat16 grid at |y| (8 significant bits): 2^(floor(log2|y|) - 7); 2^-133 at zero."""
    a = np.abs(np.asarray(y, dtype=np.float64))
    _, e = np.frexp(np.where(a > 0, a, 2.0**-126))
    return np.ldexp(1.0, e - 1 - 7)
