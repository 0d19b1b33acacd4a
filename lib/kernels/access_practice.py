"""Practice mode for the warp access-pattern analyzer (N095): a skeleton, a grader for any analyzer, the
classic drafts.

The candidate writes ``analyze(addresses, width, mask) -> (pattern, sectors)`` for one warp-level
memory instruction: ``addresses`` is a list of 32 byte addresses (ints >= 0, one per lane), ``width``
the bytes each lane accesses (1, 2, 4, 8 or 16), ``mask`` a list of 32 bools (True: the lane is
active). ``pattern`` is the address-delta test of :func:`lib.kernels.access.access_pattern` (one of
``"idle"``, ``"broadcast"``, ``"contiguous"``, ``"misaligned"``, ``"strided"``, ``"gather"``) and
``sectors`` the number of distinct 32-byte sectors the active lanes' bytes touch
(:func:`lib.kernels.access.warp_access`). Those two lib functions are the grader's oracle;
:func:`reference_analyze` is a plain-Python answer written the way a candidate would, and the drafts
are edits of it (:mod:`lib.book.drafts`).

A case is a program of instructions ``("inst", width, addresses, mask)`` (tuples of 32), run in order
through the candidate; the grader shrinks a failing program to the fewest instructions that still
fail (usually one) and says which classic mistake the wrong answer matches, if any. Scripted cases
cover contiguous, strided and column walks, misalignment (off a sector, off a line only), inactive
lanes (a tail warp, a gappy mask, junk addresses in inactive lanes, no active lane), mixed widths
(1 to 16 bytes in one program, a 16-byte range straddling a sector), broadcast, reversed lanes and
gathers; then seeded random programs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer
from lib.kernels import access as ac

__all__ = ["QUESTION", "VARIANTS", "cases", "check", "describe", "expected", "instruction", "reference_analyze", "run",
           "skeleton", "trace", "variant"]

QUESTION = "warp access-pattern analyzer (N095)"
_G = ac.granules("h100-sxm")
SECTOR_BYTES = _G.sector_bytes  # the same on every NVIDIA GPU of data/hardware.yaml
WARP = _G.warp_size


def skeleton(addresses: list[int], width: int, mask: list[bool]) -> tuple[str, int]:
    """One warp instruction: 32 lane byte addresses, the bytes per lane (1, 2, 4, 8 or 16), and which lanes
    are active. Return (pattern, sectors): the pattern by the address-delta test over the active lanes in
    lane order ('idle', 'broadcast', 'contiguous', 'misaligned', 'strided' or 'gather'), and the distinct
    32-byte sectors the active lanes' bytes [address, address + width) fall in."""
    raise NotImplementedError


def reference_analyze(addresses, width, mask):
    """The reference, in plain Python: sectors from each lane's first and last byte, the pattern from the
    step between the first two active lanes, checked against every active lane."""
    S = SECTOR_BYTES
    lanes = [lane for lane in range(len(addresses)) if mask[lane]]
    if not lanes:
        return "idle", 0
    sectors = set()
    for lane in lanes:
        first, last = addresses[lane] // S, (addresses[lane] + width - 1) // S
        sectors.update(range(first, last + 1))
    base = addresses[lanes[0]]
    if all(addresses[lane] == base for lane in lanes):
        return "broadcast", len(sectors)
    l0, l1 = lanes[0], lanes[1]
    step, gap = addresses[l1] - addresses[l0], l1 - l0
    if step % gap == 0 and all(addresses[lane] == base + step // gap * (lane - l0) for lane in lanes):
        s = step // gap
        if abs(s) == width:
            lane0 = base - s * l0  # where lane 0 would read
            low = min(lane0, lane0 + s * (len(addresses) - 1))
            return ("contiguous" if low % S == 0 else "misaligned"), len(sectors)
        return "strided", len(sectors)
    return "gather", len(sectors)


# ---- the classic drafts: the reference with one mistake ---------------------------------------------------

_DRAFTS = {
    "lanes_not_sectors": (
        "one sector per active lane: the lanes that share a sector are counted once each",
        [("sectors.update(range(first, last + 1))", "sectors.add(lane)")]),
    "no_straddle": (
        "only the sector of each lane's first byte: a range that crosses a sector boundary also costs the next one",
        [("first, last = addresses[lane] // S, (addresses[lane] + width - 1) // S", "first = last = addresses[lane] // S")]),
    "lines_not_sectors": (
        "128-byte lines counted instead of 32-byte sectors (the rule before compute capability 6.0)",
        [("first, last = addresses[lane] // S, (addresses[lane] + width - 1) // S",
          "first, last = addresses[lane] // (4 * S), (addresses[lane] + width - 1) // (4 * S)")]),
    "ignores_mask": (
        "the mask ignored: inactive lanes are counted and their (arbitrary) addresses break the pattern",
        [("lanes = [lane for lane in range(len(addresses)) if mask[lane]]", "lanes = list(range(len(addresses)))")]),
    "line_alignment": (
        "alignment judged against the 128-byte line: a warp that starts on a sector but not a line is not misaligned",
        [('return ("contiguous" if low % S == 0 else "misaligned"), len(sectors)',
          'return ("contiguous" if low % (4 * S) == 0 else "misaligned"), len(sectors)')]),
    "gap_not_scaled": (
        "the step between the first two active lanes taken as the per-lane stride, even when inactive lanes lie "
        "between them",
        [("step, gap = addresses[l1] - addresses[l0], l1 - l0", "step, gap = addresses[l1] - addresses[l0], 1")]),
    "elements_not_bytes": (
        "the stride compared in elements (1) rather than bytes (the width): contiguous accesses come out strided",
        [("if abs(s) == width:", "if abs(s) == 1:")]),
    "no_broadcast": (
        "no broadcast case: lanes on one address are a stride of 0 (and one active lane has no second lane)",
        [('if all(addresses[lane] == base for lane in lanes):\nreturn "broadcast", len(sectors)', "")]),
}
VARIANTS = tuple(_DRAFTS)
"""Defective drafts the grader must fail (tests hold it to that)."""


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft with one classic mistake (one of ``VARIANTS``)."""
    if name == "reference":
        return reference_analyze
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return edited(reference_analyze, _DRAFTS[name][1], name=name)


# ---- instructions and the oracle ------------------------------------------------------------------------


def instruction(addresses, width: int, mask=None) -> tuple:
    """An operation of a case program: ("inst", width, 32 addresses, 32 mask bits), validated."""
    a, m = ac._lanes(addresses, mask, _G)
    return ("inst", ac._width(width), tuple(int(x) for x in a), tuple(bool(x) for x in m))


def expected(op: tuple) -> tuple[str, int]:
    """What lib.kernels.access says of one instruction: (pattern, sectors)."""
    _, width, addresses, mask = op
    a, m = np.array(addresses, np.int64), np.array(mask, bool)
    return ac.access_pattern(a, width, m, _G).kind, ac.warp_access(a, width, m, _G).n_sectors


def _matching_mistake(op: tuple, got) -> str:
    _, width, addresses, mask = op
    for name, (text, _) in _DRAFTS.items():
        try:
            if variant(name)(list(addresses), width, list(mask)) == got:
                return f" It matches a classic mistake: {text}."
        except Exception:  # noqa: BLE001 - a draft that raises cannot be the match
            continue
    return ""


def _summary(op: tuple) -> str:
    _, width, addresses, mask = op
    lanes = [lane for lane in range(WARP) if mask[lane]]
    if not lanes:
        return f"width {width} B, no active lane"
    active = "all 32 lanes active" if len(lanes) == WARP else f"active lanes {_ranges(lanes)}"
    shown = [addresses[lane] for lane in lanes]
    text = ", ".join(f"{x:,}" for x in shown[:8]) + (f", ... ({len(shown)} in all)" if len(shown) > 8 else "")
    return f"width {width} B, {active}, their addresses {text}"


def _ranges(lanes: list[int]) -> str:
    out, start = [], lanes[0]
    for prev, cur in zip(lanes, [*lanes[1:], None], strict=True):
        if cur != prev + 1:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(out)


def run(impl: Callable, ops: Sequence) -> None:
    """Call ``impl(addresses, width, mask)`` on each instruction (plain lists) and compare with lib's
    (pattern, sectors); AssertionError naming the instruction, the right answer and the mistake it matches."""
    for i, op in enumerate(ops):
        if op[0] != "inst":
            raise ValueError(f"unknown operation {op!r}")
        want = expected(op)
        got = impl(list(op[2]), op[1], list(op[3]))
        if not (isinstance(got, tuple | list) and len(got) == 2):
            raise AssertionError(f"analyze must return (pattern, sectors), got {got!r}")
        pattern, sectors = got
        if pattern not in ac.PATTERNS:
            raise AssertionError(f"instruction {i}: pattern {pattern!r} is not one of {', '.join(ac.PATTERNS)}")
        if isinstance(sectors, bool) or not isinstance(sectors, int | np.integer):
            raise AssertionError(f"instruction {i}: sectors must be an int, got {sectors!r}")
        if (pattern, int(sectors)) != want:
            raise AssertionError(f"instruction {i}: expected {want!r}, got {(pattern, int(sectors))!r}."
                                 + _matching_mistake(op, (pattern, int(sectors))))


def describe(ops: Sequence) -> str:
    """The (shrunk) program, one instruction per line."""
    return "\n".join(f"  analyze(...) on instruction {i}: {_summary(op)}" for i, op in enumerate(ops))


# ---- the cases -------------------------------------------------------------------------------------------


def _scripted() -> list[Case]:
    lane = np.arange(WARP)
    all_on = np.ones(WARP, bool)
    gappy = lane % 3 == 0
    junk = np.where(gappy, ac.contiguous(4, 0, _G), 7_777_777)
    one_off = ac.contiguous(4, 0, _G).copy()
    one_off[17] += 4
    col, col_m = ac.matrix_walk(4096, 4096, 4, "column", chip=_G)
    straddle = np.zeros(WARP, np.int64)
    straddle[0] = 24

    def c(name, *insts):
        return Case(name, tuple(instruction(*x) for x in insts))

    return [
        c("contiguous 4-byte loads", (ac.contiguous(4, 0, _G), 4)),
        c("strides of 2 and 32 elements", (ac.strided(2, 4, 0, _G), 4), (ac.strided(32, 4, 0, _G), 4)),
        c("the column walk of a 4096 x 4096 fp32 matrix", (col, 4, col_m)),
        c("misaligned by 4 bytes, then by a whole sector (32 bytes: still contiguous)",
          (ac.misaligned(4, 4, _G), 4), (ac.misaligned(32, 4, _G), 4)),
        c("aligned to a sector but not to a 128-byte line", (ac.misaligned(64, 8, _G), 8)),
        c("a tail warp: only the first 5 lanes active", (ac.contiguous(4, 0, _G), 4, ac.lane_mask(5, _G))),
        c("every third lane active (the stride is per lane, not per active lane)", (ac.contiguous(4, 0, _G), 4, gappy)),
        c("inactive lanes holding junk addresses", (junk, 4, gappy)),
        c("no active lane at all", (ac.contiguous(4, 0, _G), 4, np.zeros(WARP, bool))),
        c("mixed widths: 1, 2, 8 and 16-byte contiguous loads", (ac.contiguous(1, 0, _G), 1), (ac.contiguous(2, 0, _G), 2),
          (ac.contiguous(8, 0, _G), 8), (ac.contiguous(16, 0, _G), 16)),
        c("mixed widths: 16-byte loads a half sector off, and one 16-byte range straddling a sector",
          (ac.contiguous(16, 16, _G), 16), (straddle, 16, ac.lane_mask(1, _G))),
        c("a stride narrower than the width (overlapping ranges)", (lane * 2, 4)),
        c("every lane on one address, and a single active lane", (np.full(WARP, 4096, np.int64), 4),
          (ac.contiguous(4, 256, _G), 4, lane == 9)),
        c("reversed lanes: lane 31 reads the first element", (ac.contiguous(4, 0, _G)[::-1].copy(), 4, all_on)),
        c("a random gather, and a contiguous warp with one lane off", (ac.random_gather(1 << 20, 4, 5, _G), 4),
          (one_off, 4)),
    ]


def _random_instruction(rng: np.random.Generator) -> tuple:
    width = int(rng.choice(ac.WIDTHS))
    kind = str(rng.choice(["contiguous", "strided", "reversed", "gather", "broadcast", "column"]))
    base = int(rng.choice([0, width * int(rng.integers(0, 64)), int(rng.integers(0, 4096))]))
    if kind == "contiguous":
        a = ac.contiguous(width, base, _G)
    elif kind == "strided":
        a = ac.strided(int(rng.integers(0, 40)), width, base, _G)
    elif kind == "reversed":
        a = ac.contiguous(width, base, _G)[::-1].copy()
    elif kind == "gather":
        a = ac.random_gather(int(rng.integers(1, 1 << 16)), width, int(rng.integers(0, 1 << 30)), _G) + base
    elif kind == "broadcast":
        a = np.full(WARP, base, np.int64)
    else:
        a, _ = ac.matrix_walk(64, int(rng.integers(1, 300)), width, "column", chip=_G)
        a = a + base
    mask_kind = str(rng.choice(["all", "all", "tail", "random", "one"]))
    if mask_kind == "all":
        mask = np.ones(WARP, bool)
    elif mask_kind == "tail":
        mask = ac.lane_mask(int(rng.integers(0, WARP + 1)), _G)
    elif mask_kind == "random":
        mask = rng.random(WARP) < float(rng.choice([0.3, 0.8]))
    else:
        mask = np.arange(WARP) == int(rng.integers(0, WARP))
    a = np.where(mask, a, rng.integers(0, 1 << 20, WARP)) if rng.random() < 0.3 else a  # junk in inactive lanes
    return instruction(a, width, mask)


def trace(n_instructions: int, seed: int = 0) -> list[tuple]:
    """A synthetic trace of ``n_instructions`` warp instructions drawn like the grader's random programs (contiguous,
    strided, reversed, gathers, broadcasts and column walks; 1- to 16-byte widths; full, tail, random and
    single-lane masks; junk addresses in some inactive lanes), seeded."""
    n = integer("n_instructions", n_instructions, 1, unit="instructions")
    rng = np.random.default_rng(integer("seed", seed, 0) + 1_000_003)
    return [_random_instruction(rng) for _ in range(n)]


def cases(num_random: int = 20, seed: int = 0) -> list[Case]:
    """The scripted cases, then ``num_random`` seeded random programs of 4-8 instructions of mixed widths."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    randoms = [Case(f"random program {t}", tuple(_random_instruction(rng) for _ in range(int(rng.integers(4, 9)))))
               for t in range(num_random)]
    return _scripted() + randoms


def check(candidate: Callable, num_random: int = 20, seed: int = 0) -> PracticeReport:
    """Grade any function ``candidate(addresses, width, mask) -> (pattern, sectors)`` against lib.kernels.access."""
    if not callable(candidate):
        raise ValueError(f"check() takes a function analyze(addresses, width, mask), got {candidate!r}")
    return grade(QUESTION, lambda: candidate, cases(num_random, seed), run, describe)
