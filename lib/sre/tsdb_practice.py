"""Practice mode for the time-series store (N076): write the store, graded against brute force.

The candidate writes a class with the interface of :class:`Skeleton`. A case is a program of
operations ``("append", series, t, value)``, ``("seal",)``, ``("query", series, start, end)`` and
``("compact", cutoff)``, run on a fresh store built as ``factory(max_samples, max_span, tolerance)``
(the first operation of every case is ``("config", max_samples, max_span, tolerance)``). The
oracle is a list of every accepted sample, scanned in full for each query. After every operation
the grader checks:

* ``append`` accepts exactly the samples the out-of-order rule accepts;
* a query returns exactly the brute-force window (half-open ``[start, end)``, ``t >= horizon``),
  and opens exactly the sealed segments whose reported ``[min_t, max_t]`` meets the window (no
  pruning is wrong; pruning too little is not pruning);
* sealed segments are immutable: a segment, once reported, keeps its bounds and bytes until
  compaction deletes it;
* an explicit seal leaves every live sample inside a sealed segment's bounds, and no segment spans
  ``max_span + tolerance`` or more (the head is sealed on its time bound);
* compaction deletes every segment with ``max_t < cutoff``, keeps every other one unchanged (a
  straddling segment whole), and rewrites 0 bytes.

The defective drafts (:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .tsdb import TimeSeriesStore, brute_force_window, segments_touched

__all__ = ["QUESTION", "VARIANTS", "Oracle", "Skeleton", "cases", "check", "random_ops", "run", "variant"]

QUESTION = "Time-series store with sealed segments (N076)"


class Skeleton:
    """A metrics store: an open head sealed into immutable segments, a sparse index, window queries
    that prune segments by their time bounds, and TTL compaction that deletes whole files."""

    def __init__(self, max_samples: int, max_span: int, tolerance: int):
        """Seal the head when it holds ``max_samples`` samples, or before adding a sample whose time is
        ``max_span`` or more after the head's first sample. Accept a sample if its time is at least
        ``newest accepted time - tolerance`` and at least the retention horizon."""
        raise NotImplementedError

    def append(self, series: str, t: int, value: float) -> bool:
        """Store one sample (times are unique per series); return False, storing nothing, if refused."""
        raise NotImplementedError

    def seal(self) -> None:
        """Seal the head now (nothing if it is empty)."""
        raise NotImplementedError

    def query(self, series: str, start: int, end: int) -> list[tuple[int, float]]:
        """``series``' samples with start <= t < end and t >= horizon, sorted by t. Set
        ``self.last_query_segments`` to the number of sealed segments this query opened."""
        raise NotImplementedError

    def segments(self) -> list[tuple[int, int, int]]:
        """(min_t, max_t, bytes) of every sealed segment still stored, oldest first."""
        raise NotImplementedError

    def compact(self, cutoff: int) -> tuple[int, int]:
        """Drop whole sealed segments whose every sample is older than ``cutoff``; the horizon becomes
        ``cutoff``. Return (segments dropped, bytes rewritten)."""
        raise NotImplementedError


_DRAFTS = {
    "inclusive window end": (
        "the window is read as [start, end]: a sample exactly at end comes back, and a segment starting at end "
        "is opened",
        {"query": [("if seg.max_t < start or seg.min_t >= end:", "if seg.max_t < start or seg.min_t > end:"),
                   ("i, j = bisect.bisect_left(ts, start), bisect.bisect_left(ts, end)",
                    "i, j = bisect.bisect_left(ts, start), bisect.bisect_right(ts, end)")],
         "_scan": [("i, j = bisect.bisect_left(times, start), bisect.bisect_left(times, end)",
                    "i, j = bisect.bisect_left(times, start), bisect.bisect_right(times, end)")]}),
    "pruning by segment start only": (
        "a segment is opened only if it starts inside the window, as if segments ended where the window "
        "begins: the segment that starts before the window and runs into it is skipped",
        {"query": [("if seg.max_t < start or seg.min_t >= end:", "if seg.min_t < start or seg.min_t >= end:")]}),
    "TTL rewrites the straddling segment": (
        "compaction rewrites the segment that straddles the cutoff without its expired samples: correct "
        "answers, but bytes rewritten and a sealed segment changed",
        {"compact": [("keep.append(seg)",
                      "if seg.min_t < cutoff:\n"
                      "    seg = self._rewrite(seg, cutoff)\n"
                      "keep.append(seg)")]}),
    "TTL drops the straddling segment": (
        "compaction drops every segment that starts before the cutoff: the straddling segment's samples "
        "inside the retention are lost",
        {"compact": [("if seg.max_t < cutoff:", "if seg.min_t < cutoff:")]}),
    "late sample appended unsorted": (
        "the head appends each sample at the end instead of in time order: a late sample breaks the sorted "
        "run the bisect relies on, and it is lost from queries",
        {"append": [("i = bisect.bisect_right(ts, t)", "i = len(ts)")]}),
}
VARIANTS = tuple(_DRAFTS)


class _RewritingStore(TimeSeriesStore):
    """The reference plus the rewrite helper one draft calls (re-encodes a segment from cutoff on)."""

    def _rewrite(self, seg, cutoff):
        from .tsdb import SAMPLE_BYTES, Segment
        keep = {}
        for series in seg.offsets:
            pos, count = seg.offsets[series]
            keep[series] = [s for s in self._scan(seg, series, cutoff, seg.max_t + 1)]
        data, offsets, pos = b"", {}, 0
        import struct
        for series, samples in keep.items():
            if samples:
                data += b"".join(struct.pack("<qd", t, v) for t, v in samples)
                offsets[series] = (pos, len(samples))
                pos += len(samples) * SAMPLE_BYTES
        lo = min(s[0][0] for s in keep.values() if s)
        self.bytes_rewritten += len(data)
        self.files[seg.seg_id] = data
        return Segment(seg.seg_id, lo, seg.max_t, len(data), offsets)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return TimeSeriesStore
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    base = _RewritingStore if "rewrites" in name else TimeSeriesStore
    return edited_class(base, "Draft", f"Draft: {doc}.", **methods)


class Oracle:
    """The brute force: the accepted samples in a list, the out-of-order rule, the horizon."""

    def __init__(self, tolerance: int):
        self.tolerance, self.samples, self.newest, self.horizon = tolerance, [], None, None

    def append(self, series, t, value) -> bool:
        if (self.newest is not None and t < self.newest - self.tolerance) or \
                (self.horizon is not None and t < self.horizon):
            return False
        self.samples.append((series, t, value))
        self.newest = t if self.newest is None else max(self.newest, t)
        return True

    def query(self, series, start, end) -> list:
        return brute_force_window(self.samples, series, start, end, self.horizon)

    def compact(self, cutoff) -> None:
        self.horizon = cutoff if self.horizon is None else max(self.horizon, cutoff)


def _segments(store) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s) for s in store.segments()]


def run(factory: Callable, ops: Sequence) -> None:
    """Run ``ops`` on ``factory(max_samples, max_span, tolerance)`` and on the oracle; raise
    AssertionError at the first difference (module docstring)."""
    ops = list(ops)
    if not ops or ops[0][0] != "config":
        ops = [("config", 4, 100, 10)] + ops
    _, max_samples, max_span, tolerance = ops[0]
    store, oracle = factory(max_samples, max_span, tolerance), Oracle(tolerance)
    seen: list[tuple[int, int, int]] = []
    for op in ops[1:]:
        kind = op[0]
        if kind == "append":
            got, want = store.append(*op[1:]), oracle.append(*op[1:])
            if bool(got) != want:
                raise AssertionError(f"{op}: returned {got!r}, expected {want} (newest accepted "
                                     f"{oracle.newest}, tolerance {tolerance}, horizon {oracle.horizon})")
        elif kind == "seal":
            store.seal()
        elif kind == "query":
            got = [(int(t), float(v)) for t, v in store.query(*op[1:])]
            want = oracle.query(*op[1:])
            if got != want:
                extra = sorted(set(got) - set(want))
                missing = sorted(set(want) - set(got))
                raise AssertionError(f"{op}: returned {got}, expected {want}"
                                     + (f"; extra {extra}" if extra else "") + (f"; missing {missing}" if missing else ""))
            segs = _segments(store)
            need = segments_touched([(lo, hi) for lo, hi, _ in segs], max(op[2], oracle.horizon or op[2]), op[3])
            if store.last_query_segments != need:
                raise AssertionError(f"{op}: opened {store.last_query_segments} sealed segments; the index "
                                     f"{[(lo, hi) for lo, hi, _ in segs]} says exactly {need} meet the window")
        elif kind == "compact":
            before = _segments(store)
            dropped, rewritten = store.compact(op[1])
            oracle.compact(op[1])
            after = _segments(store)
            if rewritten != 0:
                raise AssertionError(f"{op}: compaction rewrote {rewritten} bytes; TTL must delete whole files only")
            want_keep = [s for s in before if s[1] >= op[1]]
            if after != want_keep:
                raise AssertionError(f"{op}: segments {[(lo, hi) for lo, hi, _ in before]} became "
                                     f"{[(lo, hi) for lo, hi, _ in after]}; expected exactly those with max_t >= "
                                     f"{op[1]}, unchanged: {[(lo, hi) for lo, hi, _ in want_keep]}")
            if dropped != len(before) - len(want_keep):
                raise AssertionError(f"{op}: reported {dropped} dropped, {len(before) - len(want_keep)} were")
        else:
            raise ValueError(f"unknown operation {op!r}")
        segs = _segments(store)
        if kind == "seal":  # an explicit seal leaves nothing in the head: every live sample is in a segment
            for series, t, _ in oracle.samples:
                if (oracle.horizon is None or t >= oracle.horizon) and not any(lo <= t <= hi for lo, hi, _ in segs):
                    raise AssertionError(f"after {op}: sample ({series!r}, {t}) is in no sealed segment "
                                         f"{[(lo, hi) for lo, hi, _ in segs]}; seal() must write the whole head")
        for lo, hi, _ in segs:  # the span bound: sealed before a sample max_span after the head's first
            if hi - lo >= max_span + tolerance:
                raise AssertionError(f"after {op}: segment ({lo}, {hi}) spans {hi - lo}; with max_span {max_span} "
                                     f"(and late samples up to {tolerance} early) the head must be sealed sooner")
        for old in seen:  # immutability: a reported segment stays as it was until compaction deletes it
            if old not in segs and not (oracle.horizon is not None and old[1] < oracle.horizon):
                raise AssertionError(f"after {op}: sealed segment {old} changed or vanished; sealed segments "
                                     f"are immutable (now {segs})")
        seen = segs


def random_ops(seed: int, n: int = 60, series: int = 2, max_samples: int = 5, max_span: int = 20,
               tolerance: int = 6) -> tuple:
    """A random program: mostly in-order samples with some late ones, queries of every kind (empty,
    on boundaries, wide), seals and compactions."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = [("config", max_samples, max_span, tolerance)]
    t, used = 0, set()
    for _ in range(n):
        r = rng.random()
        if r < 0.6:
            t += int(rng.integers(1, 4))
            late = int(rng.integers(0, tolerance + 4)) if rng.random() < 0.25 else 0
            s = f"s{int(rng.integers(series))}"
            tt = t - late
            if (s, tt) not in used:
                used.add((s, tt))
                ops.append(("append", s, tt, float(rng.integers(100))))
        elif r < 0.85:
            a = int(rng.integers(-5, t + 5))
            b = a + int(rng.integers(0, 30))
            ops.append(("query", f"s{int(rng.integers(series))}", a, b))
        elif r < 0.93:
            ops.append(("seal",))
        else:
            ops.append(("compact", int(rng.integers(0, max(1, t)))))
    return tuple(ops)


def _appends(series, times, first_value=0.0) -> tuple:
    return tuple(("append", series, t, first_value + t) for t in times)


def cases() -> list[Case]:
    """Hand-made cases (each shows one classic defect), then random programs."""
    c = ("config", 3, 100, 5)
    return [
        Case("one segment, a window inside it", (c, *_appends("a", [1, 2, 3]), ("query", "a", 2, 3))),
        Case("empty window and a window before the data", (c, *_appends("a", [10, 11, 12]), ("seal",),
                                                          ("query", "a", 11, 11), ("query", "a", 0, 10))),
        Case("window ending on a segment boundary", (c, *_appends("a", [0, 1, 2, 3, 4, 5]), ("seal",),
                                                     ("query", "a", 0, 3), ("query", "a", 3, 6))),
        Case("window starting inside a segment", (c, *_appends("a", [0, 10, 20, 30, 40, 50]), ("seal",),
                                                  ("query", "a", 15, 45))),
        Case("late sample within tolerance", (c, *_appends("a", [0, 1, 2, 10, 11]), ("append", "a", 7, -1.0),
                                              ("query", "a", 0, 20), ("seal",), ("query", "a", 5, 9))),
        Case("late sample beyond tolerance refused", (c, *_appends("a", [0, 10]), ("append", "a", 4, -1.0),
                                                      ("query", "a", 0, 20))),
        Case("late sample beyond tolerance, after a seal", (c, *_appends("a", [0, 10]), ("seal",),
                                                           ("append", "a", 4, -1.0), ("query", "a", 0, 20))),
        Case("TTL cutoff inside the open head", (c, *_appends("a", [0, 1, 2, 3, 4]), ("compact", 4),
                                                 ("query", "a", 0, 10))),
        Case("TTL keeps the straddling segment whole", (c, *_appends("a", [0, 1, 2, 3, 4, 5, 6, 7, 8]), ("seal",),
                                                        ("compact", 4), ("query", "a", 0, 10))),
        Case("two series in one segment", (c, ("append", "a", 1, 1.0), ("append", "b", 2, 2.0),
                                           ("append", "a", 3, 3.0), ("append", "b", 4, 4.0),
                                           ("query", "b", 0, 10), ("query", "a", 2, 4))),
        *[Case(f"random program {k}", random_ops(k)) for k in range(12)],
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {op}" for op in ops)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first
    failing program, shrunk (a program shrunk past its config line runs with (4, 100, 10))."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
