"""Practice mode for the tile-count bug (N009): write the pre-ship test; the grader runs it on kernels.

The candidate writes a class with one method, ``test(self, kernel)``: ``kernel(a, b, run=0)``
returns C = A B for a (M, K) and b (K, N) as a float32 array holding values of ``kernel.dtype``
(``run`` numbers the launch), and ``kernel.tile_m``, ``kernel.tile_n``, ``kernel.tile_k`` and
``kernel.dtype`` say what the kernel was built for. The method raises ``AssertionError`` when it
finds the kernel wrong and returns quietly when it passes it. It may use
:func:`lib.kernels.tiled_gemm.oracle`, :func:`~lib.kernels.tiled_gemm.tolerance` and
:func:`lib.attention.naive.round_to_dtype`.

The grader (:func:`check`) runs the test on a correct kernel, which it must pass, and on one
kernel per defect of :data:`lib.kernels.tiled_gemm.DEFECTS`, each of which it must fail; first
with the default tile shape in bf16, then on a second tile shape in fp16 (a test that hardcodes
the tile sizes shows there). A kernel the test passes wrongly, or the correct kernel it rejects,
is reported with the defect's description. The kernels are opaque: only the call and the four
attributes are exposed.

:class:`Reference` is the test of the notebook (many tiles, no dimension a tile multiple, a
non-square tile grid, the derived bound against float64, three launches compared bitwise);
``VARIANTS`` are edits of it that each drop one ingredient, and the grader fails every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.attention.naive import round_to_dtype
from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.kernels import tiled_gemm as tg

__all__ = ["QUESTION", "KERNELS", "CONFIGS", "Reference", "VARIANTS", "variant", "cases", "run", "describe", "check"]

QUESTION = "pre-ship test of a tiled GEMM kernel (N009)"
KERNELS = ("correct", *tg.DEFECTS)
CONFIGS = {"bf16, tiles 64x32x32": ("bf16", tg.TileConfig()),
           "fp16, tiles 32x64x16": ("fp16", tg.TileConfig(tile_m=32, tile_n=64, tile_k=16))}


class OpaqueKernel:
    """What the candidate's test sees: the call and the attributes a tester may know."""

    def __init__(self, kernel: tg.GemmKernel):
        self._kernel = kernel
        self.dtype, self.tile_m, self.tile_n, self.tile_k = kernel.dtype, kernel.tile_m, kernel.tile_n, kernel.tile_k

    def __call__(self, a, b, run: int = 0) -> np.ndarray:
        return self._kernel(a, b, run=run)

    def __repr__(self) -> str:
        return f"<GEMM kernel, {self.dtype}, tiles {self.tile_m}x{self.tile_n}x{self.tile_k}>"


class Reference:
    """The pre-ship test: shapes over many tiles, none a tile multiple, on a non-square tile grid;
    random data against float64 within the derived per-element bound; three launches bitwise."""

    def test(self, kernel):
        tm, tn, tk, dtype = kernel.tile_m, kernel.tile_n, kernel.tile_k, kernel.dtype
        shapes = [
            (2 * tm + tm // 2 + 1, 4 * tn + tn // 2 + 3, 12 * tk + tk // 2 + 1),  # 3 x 5 tiles, 13 K tiles
            (tm // 4 + 1, 7 * tn + 5, 20 * tk + 3),  # decode-like: 1 x 8 tiles, 21 K tiles
        ]
        for m, n, k in shapes:
            rng = np.random.default_rng(m * 1_000_003 + n * 1009 + k)
            a = round_to_dtype(rng.standard_normal((m, k)), dtype)
            b = round_to_dtype(rng.standard_normal((k, n)), dtype)
            exact = tg.oracle(a, b)
            first = kernel(a, b, run=0)
            ok = np.abs(first - exact) <= tg.tolerance(a, b, dtype, tk, exact)  # NaN compares False: it fails
            assert ok.all(), f"(M, N, K) = {(m, n, k)}: {int((~ok).sum())} elements outside the bound"
            for r in (1, 2):
                again = kernel(a, b, run=r)
                assert np.array_equal(again.view(np.uint32), first.view(np.uint32)), \
                    f"(M, N, K) = {(m, n, k)}: launch {r} differs bitwise from launch 0"


_SHAPES = """shapes = [
    (2 * tm + tm // 2 + 1, 4 * tn + tn // 2 + 3, 12 * tk + tk // 2 + 1),  # 3 x 5 tiles, 13 K tiles
    (tm // 4 + 1, 7 * tn + 5, 20 * tk + 3),  # decode-like: 1 x 8 tiles, 21 K tiles
]"""
_BOUND = "ok = np.abs(first - exact) <= tg.tolerance(a, b, dtype, tk, exact)  # NaN compares False: it fails"
_INPUTS = """a = round_to_dtype(rng.standard_normal((m, k)), dtype)
b = round_to_dtype(rng.standard_normal((k, n)), dtype)
exact = tg.oracle(a, b)"""

_DRAFTS = {
    "one_tile": (
        "the shipped unit test: one problem that fits in one tile",
        [(_SHAPES, "shapes = [(tm, tn, tk)]")]),
    "tile_multiples": (
        "many tiles, but every dimension a multiple of its tile",
        [(_SHAPES, """shapes = [
    (3 * tm, 5 * tn, 13 * tk),
    (tm, 8 * tn, 21 * tk),
]""")]),
    "square_grid": (
        "many tiles and remainders, but a square tile grid (as many row tiles as column tiles)",
        [(_SHAPES, "shapes = [(2 * tm + tm // 2 + 1, 2 * tn + tn // 2 + 3, 12 * tk + tk // 2 + 1)]")]),
    "normwise_tolerance": (
        "a norm-wise check at 1% (||C - C*|| / ||C*|| < 0.01) instead of the per-element bound",
        [(_BOUND, "ok = np.array(tg.relative_error(first, exact) < 1e-2)")]),
    "unrounded_oracle": (
        "the float64 oracle computed on the inputs before they were rounded to the storage dtype",
        [(_INPUTS, """a = rng.standard_normal((m, k))
b = rng.standard_normal((k, n))
exact = tg.oracle(a, b)""")]),
}
VARIANTS = tuple(_DRAFTS)
"""Weakened tests the grader must fail (tests hold it to that)."""


def variant(name: str) -> type:
    """The reference test (``"reference"``) or a draft that drops one ingredient (``VARIANTS``)."""
    if name == "reference":
        return Reference
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, edits = _DRAFTS[name]
    return edited_class(Reference, f"Draft_{name}", doc, test=edits)


def cases() -> list[Case]:
    """One case per (configuration, kernel): the correct kernel first, then each defect."""
    return [Case(f"{label}: {'correct kernel' if k == 'correct' else tg.DEFECT_TITLES[k]}", (("kernel", label, k),))
            for label in CONFIGS for k in KERNELS]


def run(impl, ops: Sequence) -> None:
    """Run ``impl.test`` on each kernel of ``ops``; AssertionError when its verdict is wrong."""
    for _, label, name in ops:
        dtype, config = CONFIGS[label]
        kernel = OpaqueKernel(tg.make_kernel(None if name == "correct" else name, dtype, config))
        try:
            impl.test(kernel)
        except AssertionError as err:
            if name == "correct":
                raise AssertionError(f"your test rejects the correct kernel ({label}): {err}") from None
            continue
        if name != "correct":
            raise AssertionError(
                f"your test passes the kernel with a defect ({label}): {tg.DEFECT_TITLES[name]} "
                f"({tg.CANDIDATE[name]} candidate). Shipped, it would be wrong in production.")


def describe(ops: Sequence) -> str:
    return "\n".join(f"  MyTest().test(kernel)  # {label}, {'correct kernel' if name == 'correct' else name}"
                     for _, label, name in ops)


def check(factory: Callable) -> PracticeReport:
    """Grade a test class (anything whose instances have ``test(kernel)``) on every kernel."""
    return grade(QUESTION, factory, cases(), run, describe)
