"""Practice mode for the FP8 KV-cache question (I012): grade any E4M3 KV quantizer against torch.

The candidate implements four methods (see :class:`FP8KVQuantizer`): E4M3 rounding, amax scales
per tensor or per head, quantize to E4M3 codes with saturation, and dequantize. :func:`check`
grades any factory that builds such an object (a class, a lambda; never a subclass of the
reference) through :func:`lib.book.practice.grade`. Every expected value comes from the oracle,
``torch.float8_e4m3fn`` casting (saturating on the CPU build), or from the definition of an amax
scale computed here with numpy; nothing is read back from the candidate.

Each graded case is a list of small operations of one kind, so a failure shrinks to the one or
two values that break it:

- ``("round", x)``: ``round_e4m3`` of x must be torch's float8_e4m3fn value of x;
- ``("scale", per_head, head, value)``: the element ``value`` sits in head ``head`` of a
  (heads, tokens, 1) cache (a head with a non-zero value also holds an anchor of 448 * 2^head,
  so heads differ in size); ``scales(kv, per_head)`` must be amax / 448 over the tensor or each
  head (1 for an all-zero head), shaped (1, 1, 1) or (heads, 1, 1);
- ``("quantize", log2_scale, value)``: ``quantize(x, s)`` with s = 2^log2_scale must give
  torch's E4M3 code (uint8 bit pattern) of x / s: values past 448 s saturate to +-448;
- ``("dequantize", code, log2_scale)``: ``dequantize(code, s)`` must be torch's decoded value
  times s (NaN for the two NaN codes).

torch is imported only when a grade runs (``import lib`` stays light).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from lib.book.practice import Case, PracticeReport, grade
from lib.numerics import fp8

QUESTION = "FP8 E4M3 KV quantizer (I012)"


class FP8KVQuantizer(Protocol):
    """The interface a candidate implements (any object with these four methods)."""

    def round_e4m3(self, x: np.ndarray) -> np.ndarray:
        """Nearest E4M3 value of each element (float64 out): ties to even, subnormals, +-448 beyond."""

    def scales(self, kv: np.ndarray, per_head: bool) -> np.ndarray:
        """amax / 448 of kv (heads, tokens, dim): shape (1, 1, 1), or (heads, 1, 1) when per_head."""

    def quantize(self, kv: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """uint8 E4M3 codes of kv / scale, saturating at +-448."""

    def dequantize(self, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """decode(codes) * scale, float64."""


class Reference:
    """The book's implementation (lib.numerics.fp8) behind the practice interface."""

    def round_e4m3(self, x):
        return fp8.e4m3_round(np.asarray(x, dtype=np.float64))

    def scales(self, kv, per_head):
        return fp8.amax_scale(kv, axis=(1, 2) if per_head else None)

    def quantize(self, kv, scale):
        return fp8.quantize(kv, scale)

    def dequantize(self, codes, scale):
        return fp8.dequantize(codes, scale)


# ---- the oracle --------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def torch_round(x) -> np.ndarray:
    """torch.float8_e4m3fn value of each float32 element (float64 out): the oracle for rounding."""
    t = _torch()
    return t.from_numpy(np.asarray(x, dtype=np.float32).copy()).to(t.float8_e4m3fn).to(t.float64).numpy()


def torch_encode(x) -> np.ndarray:
    """torch.float8_e4m3fn bit pattern of each float32 element (uint8)."""
    t = _torch()
    return t.from_numpy(np.asarray(x, dtype=np.float32).copy()).to(t.float8_e4m3fn).view(t.uint8).numpy()


def torch_decode(codes) -> np.ndarray:
    """Value of each uint8 code read as torch.float8_e4m3fn (float64 out)."""
    t = _torch()
    return t.from_numpy(np.asarray(codes, dtype=np.uint8).copy()).view(t.float8_e4m3fn).to(t.float64).numpy()


# ---- the graded cases ----------------------------------------------------------------------


def _values(kind_ops: Sequence, index: int) -> np.ndarray:
    return np.array([op[index] for op in kind_ops], dtype=np.float32)


def _run_round(impl, ops) -> None:
    x = _values(ops, 1)
    got = np.asarray(impl.round_e4m3(x.astype(np.float64)), dtype=np.float64).reshape(-1)
    if got.shape != x.shape:
        raise AssertionError(f"round_e4m3 returned {got.size} values for {x.size} inputs")
    want = torch_round(x)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(f"round_e4m3({float(x[i])!r}) = {float(got[i])!r}; torch.float8_e4m3fn gives {float(want[i])!r}")


def _cache(ops) -> np.ndarray:
    """(heads, tokens, 1): each head's values from the ops, plus an anchor 448 * 2^head in a head
    that holds any non-zero value (heads with only zeros, or none, stay all zero: scale 1)."""
    heads = 1 + max((op[2] for op in ops), default=0)
    cols = []
    for h in range(heads):
        vals = [op[3] for op in ops if op[2] == h]
        cols.append(([fp8.E4M3_MAX * 2.0**h] if any(vals) else []) + vals)  # an all-zero head stays all zero
    width = max(map(len, cols))
    kv = np.zeros((heads, width, 1), dtype=np.float32)
    for h, col in enumerate(cols):
        kv[h, : len(col), 0] = col
    return kv


def _run_scale(impl, ops) -> None:
    if not ops:
        return
    for per_head in (False, True):
        part = [op for op in ops if op[1] == per_head]
        if not part:
            continue
        kv = _cache(part)
        amax = np.abs(kv.astype(np.float64)).max(axis=(1, 2) if per_head else None, keepdims=True)
        want = np.where(amax > 0, amax / fp8.E4M3_MAX, 1.0)
        got = np.asarray(impl.scales(kv.copy(), per_head), dtype=np.float64)
        label = "per head" if per_head else "per tensor"
        if got.shape != want.shape:
            raise AssertionError(f"scales({label}) has shape {got.shape}; expected {want.shape} for a cache of shape {kv.shape}")
        if not np.allclose(got, want, rtol=1e-6, atol=0):
            raise AssertionError(f"scales({label}) of heads with amax {amax.ravel().tolist()} = {got.ravel().tolist()}; "
                                 f"expected amax / 448 = {want.ravel().tolist()}")


def _run_quantize(impl, ops) -> None:
    if not ops:
        return
    for log2s in sorted({op[1] for op in ops}):
        x = np.array([op[2] for op in ops if op[1] == log2s], dtype=np.float32).reshape(1, -1, 1)
        s = np.full((1, 1, 1), 2.0**log2s, dtype=np.float32)
        got = np.asarray(impl.quantize(x.copy(), s))
        want = torch_encode(x / s)  # exact: s is a power of two
        if got.shape != want.shape or got.dtype != np.uint8:
            raise AssertionError(f"quantize returned {got.dtype} of shape {got.shape}; expected uint8 of shape {want.shape}")
        bad = got != want
        if bad.any():
            i = int(np.argmax(bad.ravel()))
            raise AssertionError(f"quantize({float(x.ravel()[i])!r}, scale 2^{log2s}) = 0x{int(got.ravel()[i]):02X}; "
                                 f"torch.float8_e4m3fn gives 0x{int(want.ravel()[i]):02X} "
                                 f"({float(torch_decode(want.ravel()[i:i + 1])[0])!r} x scale)")


def _run_dequantize(impl, ops) -> None:
    if not ops:
        return
    for log2s in sorted({op[2] for op in ops}):
        codes = np.array([op[1] for op in ops if op[2] == log2s], dtype=np.uint8)
        s = np.float32(2.0**log2s)
        got = np.asarray(impl.dequantize(codes.copy(), np.full(1, s)), dtype=np.float64).reshape(-1)
        want = torch_decode(codes) * float(s)
        bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
        if got.shape != want.shape or bad.any():
            i = int(np.argmax(bad)) if got.shape == want.shape else 0
            raise AssertionError(f"dequantize(0x{int(codes[i]):02X}, scale 2^{log2s}) = "
                                 f"{float(got[i]) if got.shape == want.shape else got!r}; expected {float(want[i])!r}")


_RUNNERS = {"round": _run_round, "scale": _run_scale, "quantize": _run_quantize, "dequantize": _run_dequantize}


def run(impl, ops) -> None:
    """Run one case (ops all of one kind) on ``impl``; AssertionError names what is wrong."""
    if ops:
        _RUNNERS[ops[0][0]](impl, list(ops))


def cases(seed: int = 0, random_values: int = 2000) -> list[Case]:
    """The graded programs: every code, every tie, random values, saturation, scales, codes."""
    rng = np.random.default_rng(seed)
    pos = fp8.e4m3_values()
    every = np.concatenate([pos, -pos[1:]])
    ties = (pos[1:] + pos[:-1]) / 2
    rand = (rng.standard_normal(random_values) * 10.0 ** rng.uniform(-4, 3, random_values)).astype(np.float32)
    beyond = np.array([448.0, 455.0, 463.99, 464.0, 464.01, 479.0, 480.0, 1e4, 3e38, -449.0, -464.0, -1e6], dtype=np.float32)
    heads = [("scale", per_head, int(h), float(v)) for per_head in (False, True)
             for h, v in zip(rng.integers(0, 4, 24), rng.standard_normal(24) * 300, strict=True)]
    zero_head = [("scale", True, 5, 0.0), ("scale", False, 5, 0.0)]  # head 4 and head 5: all zeros
    quant = [("quantize", int(k), float(v)) for k in (-3, 0, 2)
             for v in (rng.standard_normal(40) * 2.0**k * 10.0 ** rng.uniform(-3, 2.7, 40)).astype(np.float32)]
    sat = [("quantize", -2, float(v)) for v in (100.0, 112.0, 113.0, 120.0, 1e3, -200.0)]
    deq = [("dequantize", int(c), int(k)) for k in (-4, 0, 3) for c in range(256)]
    return [
        Case("round: every E4M3 value maps to itself", tuple(("round", float(v)) for v in every)),
        Case("round: exact midpoints go to the even neighbour", tuple(("round", float(v)) for s in (1, -1) for v in s * ties)),
        Case("round: random values from subnormal to saturation", tuple(("round", float(v)) for v in rand)),
        Case("round: beyond 448 saturates", tuple(("round", float(v)) for v in beyond)),
        Case("scales: amax / 448 per tensor and per head", tuple(heads + zero_head)),
        Case("quantize: codes of x / scale", tuple(quant)),
        Case("quantize: a scale too small saturates at +-448", tuple(sat)),
        Case("dequantize: every code times the scale", tuple(deq)),
    ]


def describe(ops) -> str:
    """The operations of a (shrunk) case, one a line."""
    lines = []
    for op in ops:
        if op[0] == "round":
            lines.append(f"  round_e4m3({op[1]!r})")
        elif op[0] == "scale":
            lines.append(f"  a cache whose head {op[2]} holds {op[3]!r} (every head h also holds 448 x 2^h), "
                         f"scales(per_head={op[1]})")
        elif op[0] == "quantize":
            lines.append(f"  quantize({op[2]!r}, scale=2^{op[1]})")
        else:
            lines.append(f"  dequantize(0x{op[1]:02X}, scale=2^{op[2]})")
    return "\n".join(lines)


def check(factory: Callable, seed: int = 0) -> PracticeReport:
    """Grade any implementation of :class:`FP8KVQuantizer` (a class or a factory) against torch."""
    return grade(QUESTION, factory, cases(seed), run, describe)
