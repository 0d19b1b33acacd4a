"""Practice mode for the vector add (N093): the candidate writes the launch's index logic, the grader
runs it on a simulated device memory.

The candidate writes two functions, the lines every elementwise kernel starts with:

- ``grid(n, block) -> int``: how many programs (CUDA: thread blocks) to launch for ``n`` elements
  when each program handles ``block`` of them;
- ``program(pid, block, n) -> (offsets, mask)``: the element indices program ``pid`` handles (an
  integer numpy array of length ``block``) and which of them exist (a bool array of the same length).

:func:`check` grades them through :func:`lib.book.practice.grade`. Each case is a program of
launches ``("launch", n, block)``; a launch lays x, y and out out back to back in one simulated
allocation, followed by a neighbouring tensor (what the caching allocator puts next to out), calls
``grid`` and then ``program`` for every pid, and executes the kernel body for the lanes whose mask
is on: ``out[offsets] = x[offsets] + y[offsets]``. The launch passes when every element of out is
written exactly once with x + y, nothing outside out is written, and no program is idle (a grid
larger than ceil(n / block)). An address outside the allocation is an illegal memory access.
Shrinking drops launches, so the report shows the one launch that fails.

The reference is :func:`lib.kernels.elementwise.grid_size` and
:func:`lib.kernels.elementwise.program_offsets` (what the Triton kernel computes); ``VARIANTS`` are
edits of them (:mod:`lib.book.drafts`), one classic mistake each, and the tests hold the grader to
failing every one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from numbers import Integral

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer
from lib.kernels.elementwise import grid_size, program_offsets

__all__ = ["BLOCKS", "QUESTION", "VARIANTS", "cases", "check", "describe", "reference", "run", "simulate_launch",
           "skeleton_grid", "skeleton_program", "variant"]

QUESTION = "vector add: the grid, the index and the mask (N093)"
BLOCKS = (8, 32, 64, 128, 256, 1024)
"""Block sizes the random cases draw (powers of two, as Triton's tl.arange needs)."""


def skeleton_grid(n: int, block: int) -> int:
    """How many programs to launch so that each of the ``n`` elements belongs to one program of
    ``block`` elements."""
    raise NotImplementedError


def skeleton_program(pid: int, block: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, mask) of program ``pid``: the ``block`` element indices it handles (integers) and
    which of them are real elements of the n (bools)."""
    raise NotImplementedError


def reference() -> tuple[Callable, Callable]:
    """The reference pair (grid, program): :func:`lib.kernels.elementwise.grid_size` and
    :func:`lib.kernels.elementwise.program_offsets`."""
    return grid_size, program_offsets


# ---- the classic drafts: the reference with one mistake -------------------------------------------

_DRAFTS = {
    "no_mask": (
        "no bounds mask: every lane of the last program loads and stores, so when n is not a multiple of the "
        "block the lanes past n write into whatever follows out",
        "program", [("mask = offsets < n  # lanes past the end exist only in the last program",
                     "mask = np.ones(block, dtype=bool)  # every lane stores")]),
    "mask_off_by_one": (
        "the mask offsets <= n: lane n is treated as an element and writes one past the end of out",
        "program", [("mask = offsets < n  # lanes past the end exist only in the last program",
                     "mask = offsets <= n")]),
    "grid_floor": (
        "grid = n // block: the tail of n mod block elements has no program and is never written (and n < block "
        "launches nothing)",
        "grid", [("return (n + block - 1) // block  # ceil: the last program covers the tail", "return n // block")]),
    "grid_over_launch": (
        "grid = n // block + 1: one program too many whenever n is a multiple of the block (it has nothing to do)",
        "grid", [("return (n + block - 1) // block  # ceil: the last program covers the tail",
                  "return n // block + 1")]),
    "wrong_stride": (
        "offsets = pid + lane (CUDA: blockIdx.x + threadIdx.x) instead of pid x block + lane: programs overlap, "
        "elements are written several times and the end of the vector never",
        "program", [("offsets = pid * block + np.arange(block, dtype=np.int64)  # the global index of each lane",
                     "offsets = pid + np.arange(block, dtype=np.int64)")]),
}
VARIANTS = tuple(_DRAFTS)
"""Defective drafts the grader must fail (tests hold it to that)."""


def variant(name: str) -> tuple[Callable, Callable]:
    """The (grid, program) pair of the reference (``"reference"``) or of a draft with one classic
    mistake (one of ``VARIANTS``)."""
    if name == "reference":
        return reference()
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    _, which, edits = _DRAFTS[name]
    g, p = reference()
    if which == "grid":
        return edited(g, edits, name=name), p
    return g, edited(p, edits, name=name)


# ---- the simulated launch --------------------------------------------------------------------------


def _ranges(idx: np.ndarray) -> str:
    """Sorted indices as 'a..b' runs: [3, 4, 5, 9] -> '3..5, 9' (at most three runs shown)."""
    idx = np.unique(idx)
    runs, start = [], idx[0]
    for a, b in zip(idx[:-1], idx[1:], strict=True):
        if b != a + 1:
            runs.append((start, a))
            start = b
    runs.append((start, idx[-1]))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:3])
    return text + (f" and {len(runs) - 3} more runs" if len(runs) > 3 else "")


def _as_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise AssertionError(f"{what} must return an integer, got {value!r}")
    return int(value)


def simulate_launch(grid_fn: Callable, program_fn: Callable, n: int, block: int, seed: int = 0) -> None:
    """One launch of the add over ``n`` elements in programs of ``block`` (module docstring).
    Raises AssertionError naming the first broken property: an illegal address, a write past out,
    an element never written or written twice, an idle program, a malformed return value."""
    n, block = integer("n", n, 1, unit="elements"), integer("block", block, 1, unit="elements")
    rng = np.random.default_rng(seed)
    guard = block  # a tensor before x and one after out, as an allocator lays them out
    heap = np.empty(guard + 3 * n + guard)
    base_x, base_y, base_out, base_next = guard, guard + n, guard + 2 * n, guard + 3 * n
    heap[:guard] = -1000.0 * np.arange(1, guard + 1)
    heap[base_x:base_y] = rng.standard_normal(n)
    heap[base_y:base_out] = rng.standard_normal(n)
    heap[base_out:base_next] = np.nan  # unwritten
    heap[base_next:] = 1000.0 * np.arange(1, guard + 1)  # the neighbouring tensor's values
    before = heap.copy()
    want = heap[base_x:base_y] + heap[base_y:base_out]

    grid = _as_int(grid_fn(n, block), f"grid(n={n}, block={block})")
    if grid < 0:
        raise AssertionError(f"grid(n={n}, block={block}) returned {grid}: a launch needs a grid >= 0")
    writes = np.zeros(heap.size, np.int64)
    idle = []
    for pid in range(grid):
        got = program_fn(pid, block, n)
        call = f"program(pid={pid}, block={block}, n={n})"
        if not (isinstance(got, tuple | list) and len(got) == 2):
            raise AssertionError(f"{call} must return (offsets, mask), got {type(got).__name__}")
        offsets, mask = np.asarray(got[0]), np.asarray(got[1])
        if offsets.shape != (block,) or not np.issubdtype(offsets.dtype, np.integer):
            raise AssertionError(f"{call}: offsets must be {block} integers, got shape {offsets.shape} of "
                                 f"{offsets.dtype}")
        if mask.shape != (block,) or mask.dtype != bool:
            raise AssertionError(f"{call}: mask must be {block} bools, got shape {mask.shape} of {mask.dtype}")
        lanes = offsets[mask].astype(np.int64)
        if lanes.size == 0:
            idle.append(pid)
            continue
        for name, base in (("x", base_x), ("y", base_y), ("out", base_out)):
            addr = base + lanes
            bad = (addr < 0) | (addr >= heap.size)
            if bad.any():
                raise AssertionError(f"{call} touches {name}[{_ranges(lanes[bad])}], outside every allocation "
                                     f"(n = {n}): an illegal memory access, the kernel faults")
        heap[base_out + lanes] = heap[base_x + lanes] + heap[base_y + lanes]  # the kernel body
        np.add.at(writes, base_out + lanes, 1)
        past = lanes[(lanes >= n) | (lanes < 0)]
        if past.size:
            where = base_next + np.clip(past - n, 0, guard - 1)
            k = min(4, past.size)
            raise AssertionError(
                f"program {pid} writes out[{_ranges(past)}]: {past.size} element(s) outside out (n = {n}, "
                f"{n % block} element(s) in the last block of {block}), into the neighbouring allocation: its "
                f"values {before[where[:k]].round(3).tolist()} became {heap[where[:k]].round(3).tolist()}")
    count = writes[base_out:base_next]
    missing = np.flatnonzero(count == 0)
    if missing.size:
        raise AssertionError(f"out[{_ranges(missing)}] never written: {missing.size} of {n} elements "
                             f"({grid} program(s) of {block} lanes launched)")
    twice = np.flatnonzero(count > 1)
    if twice.size:
        raise AssertionError(f"out[{_ranges(twice)}] written more than once ({int(count.max())} times at most): "
                             "programs overlap; program p must start at p x block")
    if not np.array_equal(heap[base_out:base_next], want):
        bad = np.flatnonzero(heap[base_out:base_next] != want)
        raise AssertionError(f"out[{_ranges(bad)}] is not x + y")
    if idle:
        raise AssertionError(f"program(s) {_ranges(np.array(idle))} of the grid of {grid} hold no element: "
                             f"ceil(n / block) = {-(-n // block)} programs cover n = {n}; the extra ones are "
                             "launched for nothing")


def run(impl: tuple[Callable, Callable], ops: Sequence) -> None:
    """Every launch of the case on a fresh simulated memory (:func:`simulate_launch`); the message
    names the launch and, when the behaviour matches a classic draft, the mistake."""
    grid_fn, program_fn = impl
    for op in ops:
        if op[0] != "launch":
            raise ValueError(f"unknown operation {op!r}")
        _, n, block = op
        try:
            simulate_launch(grid_fn, program_fn, n, block)
        except AssertionError as err:
            raise AssertionError(f"n = {n}, block = {block}: {str(err).rstrip('.')}."
                                     f"{_matching_mistake(impl, n, block, str(err))}") from None


@functools.cache
def _draft(name: str) -> tuple[Callable, Callable]:
    return variant(name)


def _matching_mistake(impl, n: int, block: int, message: str) -> str:
    for name, (text, _, _) in _DRAFTS.items():
        try:
            simulate_launch(*_draft(name), n, block)
        except AssertionError as err:
            if str(err) == message:
                return f" It matches the classic mistake: {text}."
        except Exception:  # noqa: BLE001 - a draft that raises otherwise is not the match
            continue
    return ""


def _random_program(rng: np.random.Generator, t: int) -> tuple:
    launches = []
    for _ in range(int(rng.integers(1, 4))):
        block = int(rng.choice(BLOCKS))
        kind = int(rng.integers(0, 3))
        if kind == 0:  # a multiple of the block
            n = block * int(rng.integers(1, 6))
        elif kind == 1:  # anything
            n = int(rng.integers(1, 5 * block + 1))
        else:  # just past a multiple
            n = block * int(rng.integers(0, 5)) + int(rng.integers(1, 3))
        launches.append(("launch", n, block))
    return tuple(launches)


def cases(num_random: int = 12, seed: int = 0) -> list[Case]:
    """The graded programs: scripted launches (n a multiple of the block and not, smaller than one
    block, one element, one past a block, a large block, every size from 1 to 40), then
    ``num_random`` seeded random programs of one to three launches."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("n a multiple of the block: 1,024 elements, block 256", (("launch", 1024, 256),)),
        Case("n not a multiple: 1,000 elements, block 256 (24 lanes past the end)", (("launch", 1000, 256),)),
        Case("n smaller than one block: 5 elements, block 256", (("launch", 5, 256),)),
        Case("one element", (("launch", 1, 32),)),
        Case("one past a block: 257 elements, block 256", (("launch", 257, 256),)),
        Case("a large block: 3,000 elements, block 1,024", (("launch", 3000, 1024),)),
        Case("every size from 1 to 40, block 8", tuple(("launch", n, 8) for n in range(1, 41))),
    ]
    return scripted + [Case(f"random program {t}", _random_program(rng, t)) for t in range(num_random)]


def describe(ops: Sequence) -> str:
    """The (shrunk) program: each launch as the grader runs it."""
    lines = []
    for _, n, block in ops:
        lines.append(f"  launch n = {n}, block = {block}: g = grid({n}, {block}); for pid in range(g): "
                     f"offsets, mask = program(pid, {block}, {n}); out[offsets[mask]] = x[offsets[mask]] + "
                     "y[offsets[mask]]")
    return "\n".join(lines)


def check(grid_fn: Callable, program_fn: Callable, num_random: int = 12, seed: int = 0) -> PracticeReport:
    """Grade any pair ``grid(n, block)`` and ``program(pid, block, n) -> (offsets, mask)`` on the
    simulated launches of :func:`cases`."""
    if not callable(grid_fn) or not callable(program_fn):
        raise ValueError(f"check() takes two functions, grid(n, block) and program(pid, block, n); got "
                         f"{grid_fn!r} and {program_fn!r}")
    pair = (grid_fn, program_fn)
    return grade(QUESTION, lambda: pair, cases(num_random, seed), run, describe)
