"""Practice mode for the softmax kernel (N098): a skeleton, a grader for any row softmax, the classic drafts.

The candidate writes ``row_softmax(x)``: x is a 2-D numpy array (rows, n_cols) of float32 or
float16, -inf entries are masked (probability 0), a row whose entries are all -inf returns zeros
(the book's convention; ``torch.softmax`` returns NaN there), and the result is float32
probabilities computed with float32 accumulation whatever the input dtype. It may be written as
one program's numpy semantics (a loop over rows, each row padded to BLOCK lanes as the Triton
kernel does; :func:`reference_row_softmax`) or as any function over rows. :func:`check` grades it
through :func:`lib.book.practice.grade` against the float64 oracle
:func:`lib.attention.naive.softmax_rows` on the same inputs, with a relative tolerance of
``RTOL`` plus ``ATOL``: float32 accumulation lands within about 1e-6 of it, float16 accumulation
about 5e-4 away.

A case is a program (shrunk by dropping operations, never the config):

- ``("config", rows, n_cols, dtype, scale, seed)``: first; x = scale x standard normals from
  ``np.random.default_rng(seed)``, stored in ``dtype`` ("float32" or "float16");
- ``("shift", row, value)``: add ``value`` to row ``row % rows`` (the softmax does not change; exp
  of the raw values overflows past 88.7, or underflows to 0 / 0 for a large negative shift);
- ``("mask", row, keep, seed)``: entries of that row become -inf with probability 1 - keep;
- ``("mask_row", row)``: every entry of that row becomes -inf;
- ``("flat", row)``: every entry of that row becomes 0 (a uniform row: its sum is n_cols, which
  overflows float16 past 65,504).

``VARIANTS`` are edits of :func:`reference_row_softmax` (:mod:`lib.book.drafts`), one classic
mistake each; the tests hold the grader to failing every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer
from lib.kernels.rowwise import block_size

__all__ = ["QUESTION", "VARIANTS", "case_input", "cases", "check", "describe", "reference_row_softmax", "run",
           "skeleton", "variant"]

QUESTION = "row softmax kernel (N098)"
DEFAULT_CONFIG = ("config", 8, 64, "float32", 1.0, 0)
DTYPES = ("float32", "float16")
RTOL = 2e-5  # relative, against float64 on the same inputs
ATOL = 1e-9  # absolute floor for probabilities that round to (almost) nothing


def skeleton(x: np.ndarray) -> np.ndarray:
    """Softmax of each row of ``x`` (rows, n_cols), float32 or float16; -inf entries weigh 0; a row
    of only -inf returns zeros. Return float32 probabilities, accumulated in float32."""
    raise NotImplementedError


def reference_row_softmax(x):
    """One program per row, as the Triton kernel runs it, in numpy: BLOCK lanes (the next power of
    two >= n_cols) with the lanes past the row loaded as -inf, fp32 arithmetic, one write per row."""
    x = np.asarray(x)
    rows, n_cols = x.shape
    block = block_size(n_cols)
    out = np.empty((rows, n_cols), np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # the drafts overflow; this never does
        for row in range(rows):  # one program per row
            lanes = np.full(block, -np.inf, np.float32)  # fp32 lanes; those past the row hold -inf
            lanes[:n_cols] = x[row]  # the one read
            m = lanes.max()
            m = np.float32(0) if m == -np.inf else m  # an all -inf row: exp(-inf - 0) = 0, not NaN
            num = np.exp(lanes - m)  # every exponent <= 0: nothing overflows
            den = num.sum()
            out[row] = (num / (den if den > 0 else np.float32(1)))[:n_cols]  # the one write
    return out


# ---- the classic drafts: the reference with one mistake -------------------------------------------

_DRAFTS = {
    "no_max_subtraction": (
        "exp(x) without subtracting the row max: exp overflows to inf past 88.7 (inf / inf = NaN), and a row of "
        "large negative values underflows to 0 / 0",
        [("m = lanes.max()\nm = np.float32(0) if m == -np.inf else m  # an all -inf row: exp(-inf - 0) = 0, not NaN",
          "m = np.float32(0)")]),
    "half_accumulation": (
        "the arithmetic kept in the input dtype: float16 rounds every exponential to 11 bits, and a row's sum "
        "overflows float16 past 65,504",
        [("lanes = np.full(block, -np.inf, np.float32)  # fp32 lanes; those past the row hold -inf",
          "lanes = np.full(block, -np.inf, x.dtype)")]),
    "mask_with_zero": (
        "the lanes past the row loaded as 0 instead of -inf: each adds exp(0 - max) to the sum when n_cols is not a "
        "power of two",
        [("lanes = np.full(block, -np.inf, np.float32)  # fp32 lanes; those past the row hold -inf",
          "lanes = np.full(block, 0.0, np.float32)")]),
    "unshifted_denominator": (
        "the numerator shifted by the max but the denominator not: every probability off by exp(max)",
        [("den = num.sum()", "den = np.exp(lanes).sum()")]),
    "no_masked_row_guard": (
        "no guard for a row of only -inf: its max is -inf and -inf - (-inf) = NaN",
        [("m = np.float32(0) if m == -np.inf else m  # an all -inf row: exp(-inf - 0) = 0, not NaN", "")]),
}
VARIANTS = tuple(_DRAFTS)
"""Defective drafts the grader must fail (tests hold it to that)."""


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft with one classic mistake (one of ``VARIANTS``)."""
    if name == "reference":
        return reference_row_softmax
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return edited(reference_row_softmax, _DRAFTS[name][1], name=name)


# ---- the grader --------------------------------------------------------------------------------------


def _config(ops: Sequence) -> tuple:
    ops = list(ops)
    return ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG


def case_input(ops: Sequence) -> np.ndarray:
    """The input x of a case program (module docstring), exactly as the grader passes it."""
    _, rows, n_cols, dtype, scale, seed = _config(ops)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n_cols)) * scale
    for op in ops:
        if op[0] == "config":
            continue
        r = op[1] % rows
        if op[0] == "shift":
            x[r] += op[2]
        elif op[0] == "mask":
            x[r, np.random.default_rng(op[3]).random(n_cols) >= op[2]] = -np.inf
        elif op[0] == "mask_row":
            x[r] = -np.inf
        elif op[0] == "flat":
            x[r] = 0.0
        else:
            raise ValueError(f"unknown operation {op!r}")
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _oracle(x: np.ndarray) -> np.ndarray:
    from lib.attention.naive import softmax_rows

    return softmax_rows(x.astype(np.float64))[0]


def _bad(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ~(np.abs(got - want) <= ATOL + RTOL * np.abs(want))


def _matching_mistake(x: np.ndarray, got: np.ndarray) -> str:
    for name, (text, _) in _DRAFTS.items():
        try:
            want = np.asarray(variant(name)(x.copy()), np.float64)
        except Exception:  # noqa: BLE001 - a draft that raises cannot be the match
            continue
        if want.shape == got.shape and ((np.isnan(want) & np.isnan(got)) | ~_bad(got, want)).all():
            return f" It matches {text}."
    return ""


def run(impl: Callable, ops: Sequence) -> None:
    """Call ``impl(x)`` on the case's input and compare with the float64 oracle; AssertionError naming
    the first row that differs and why."""
    x = case_input(ops)
    want = _oracle(x)
    result = impl(x.copy())
    try:
        got = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"row_softmax must return an array, got {type(result).__name__}") from None
    if got.shape != want.shape:
        raise AssertionError(f"row_softmax returned shape {got.shape}, expected {want.shape} (rows, n_cols)")
    if np.asarray(result).dtype == np.float16:
        raise AssertionError("row_softmax returned float16: return float32 probabilities (accumulated in float32)")
    bad = _bad(got, want)
    if not bad.any():
        return
    r = int(np.argwhere(bad)[0][0])
    finite = x[r][np.isfinite(x[r])]
    where = f"row {r} ({x.shape[1]} columns, {x.dtype}"
    where += f", max {float(finite.max()):.4g})" if finite.size else ", every entry -inf)"
    row = got[r]
    if not finite.size:
        what = f"{where} must be all zeros, got {np.round(row[:3], 4).tolist()}"
        if np.isnan(row).any():
            what += "; NaN because its max is -inf and -inf - (-inf) = NaN"
    elif not np.isfinite(row).all():
        what = f"{where} has non-finite probabilities {np.round(row[:3], 4).tolist()}"
    else:
        err = np.abs(got[r] - want[r])
        c = int(np.argmax(err / (ATOL + RTOL * np.abs(want[r]))))
        what = (f"{where}: column {c} is {got[r, c]:.7g}, expected {want[r, c]:.7g} (relative error "
                f"{err[c] / max(abs(want[r, c]), 1e-300):.2g}, tolerance {RTOL:g}); the row sums to {row.sum():.7g}")
    raise AssertionError(what + "." + _matching_mistake(x, got))


def _random_program(rng: np.random.Generator, t: int) -> tuple:
    rows = int(rng.integers(1, 6))
    n_cols = int(rng.choice([int(rng.integers(1, 300)), 2 ** int(rng.integers(0, 10))]))
    cfg = ("config", rows, n_cols, str(rng.choice(["float32", "float32", "float16"])),
           float(rng.choice([1.0, 3.0, 30.0])), 30_000 + t)
    ops: list[tuple] = []
    for _ in range(int(rng.integers(0, 4))):
        kind = str(rng.choice(["shift", "mask", "mask_row", "flat"]))
        row = int(rng.integers(0, rows))
        if kind == "shift":
            ops.append(("shift", row, float(rng.choice([-1000.0, 200.0, 1000.0]))))
        elif kind == "mask":
            ops.append(("mask", row, float(rng.choice([0.2, 0.7])), 700 + t))
        else:
            ops.append((kind, row))
    return (cfg, *ops)


def cases(num_random: int = 16, seed: int = 0) -> list[Case]:
    """The graded programs: scripted cases (a power of two and not, one column, huge positive and
    negative values, -inf entries, an all -inf row, float16 inputs, a float16 row whose sum passes
    65,504), then ``num_random`` seeded random programs."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("8 rows of 64 columns (a power of two), float32", (DEFAULT_CONFIG,)),
        Case("100 columns: not a power of two, 28 masked lanes", (("config", 4, 100, "float32", 1.0, 1),)),
        Case("one column", (("config", 3, 1, "float32", 1.0, 2),)),
        Case("a row shifted by +1000 (exp overflows past 88.7 without the max)",
             (("config", 3, 50, "float32", 1.0, 3), ("shift", 1, 1000.0))),
        Case("a row shifted by -1000 (every exp underflows to 0 without the max)",
             (("config", 3, 50, "float32", 1.0, 4), ("shift", 2, -1000.0))),
        Case("-inf entries (masked keys), 300 columns", (("config", 3, 300, "float32", 3.0, 5), ("mask", 0, 0.7, 9))),
        Case("a row whose entries are all -inf", (("config", 3, 40, "float32", 1.0, 6), ("mask_row", 1))),
        Case("float16 inputs, 1000 columns (accumulate in float32)", (("config", 4, 1000, "float16", 3.0, 7),)),
        Case("float16, a uniform row of 70,000 (its sum passes float16's 65,504)",
             (("config", 1, 70_000, "float16", 1.0, 8), ("flat", 0))),
        Case("float16 with -inf entries, 3000 columns", (("config", 2, 3000, "float16", 2.0, 10), ("mask", 1, 0.2, 11))),
    ]
    return scripted + [Case(f"random program {t}", _random_program(rng, t)) for t in range(num_random)]


def describe(ops: Sequence) -> str:
    """The (shrunk) program: the input and each change to it, then the call."""
    _, rows, n_cols, dtype, scale, seed = _config(ops)
    lines = [f"  x = case_input(ops): {rows} rows x {n_cols} columns of {scale:g} x standard normals "
             f"(np.random.default_rng({seed})), stored as {dtype}"]
    text = {"shift": lambda op: f"row {op[1] % rows} += {op[2]:g}",
            "mask": lambda op: f"row {op[1] % rows}: entries set to -inf with probability {1 - op[2]:g} (seed {op[3]})",
            "mask_row": lambda op: f"row {op[1] % rows}: every entry -inf",
            "flat": lambda op: f"row {op[1] % rows}: every entry 0 (uniform)"}
    lines += [f"  {text[op[0]](op)}" for op in ops if op[0] != "config"]
    lines.append("  p = row_softmax(x)")
    return "\n".join(lines)


def check(candidate: Callable, num_random: int = 16, seed: int = 0) -> PracticeReport:
    """Grade any function ``candidate(x) -> probabilities`` against the float64 oracle."""
    if not callable(candidate):
        raise ValueError(f"check() takes a function row_softmax(x), got {candidate!r}")
    return grade(QUESTION, lambda: candidate, cases(num_random, seed), run, describe)
