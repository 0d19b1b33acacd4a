"""A metrics store built on the two facts of metrics (N076): samples arrive in time order, and
queries ask for a time window.

* Samples ``(series, t, value)`` (``t`` an integer, seconds) go to an open **head** segment, kept
  sorted per series. The head is **sealed** (written once as an immutable byte string, never
  edited) when it holds ``max_samples`` samples or when a sample arrives ``max_span`` or more after
  the head's first sample. A sealed segment's bytes are each series' samples, sorted by time,
  packed as 16 bytes (int64 time, float64 value).
* A **sparse index** keeps, per sealed segment, its min and max time and, per series, the byte
  offset and count of its run. A window query ``[start, end)`` opens only the segments whose
  ``[min_t, max_t]`` meets the window (**pruning**), reads only the queried series' byte run of
  each, and bisects it. Segments may overlap in time (an out-of-order sample lands in the head
  after the segment it belongs to was sealed); the index holds true bounds, so pruning stays exact.
* **Out of order**: a sample is accepted if ``t >= newest - tolerance`` (``newest`` the largest
  time accepted so far) and ``t >= horizon``; otherwise it is refused (``append`` returns False).
  Timestamps are unique per series (the caller's guarantee).
* **TTL compaction** ``compact(cutoff)`` deletes every sealed segment whose ``max_t < cutoff`` as
  a whole file and touches nothing else: bytes rewritten are 0, and a segment straddling the
  cutoff is kept whole. The **horizon** becomes ``cutoff``: queries return only ``t >= horizon``.

Byte accounting: ``bytes_written`` (sealing), ``bytes_rewritten`` (compaction: stays 0),
``bytes_deleted``, ``bytes_read`` (queries). Helpers: the segments a window meets, closed form and
by brute force (:func:`segments_touched`, :func:`expected_segments_touched`).

The practice grader for the question is :mod:`lib.sre.tsdb_practice`.
"""

from __future__ import annotations

import bisect
import math
import struct
from dataclasses import dataclass, field

from lib.inputs import integer, real

__all__ = ["SAMPLE_BYTES", "Segment", "TimeSeriesStore", "brute_force_window", "expected_segments_touched",
           "segments_touched"]

SAMPLE_BYTES = 16  # int64 time + float64 value
_PACK = struct.Struct("<qd")


@dataclass(frozen=True)
class Segment:
    """One sealed segment's index entry: id, time bounds (inclusive), bytes, and per series the
    (byte offset, sample count) of its run in the segment's file."""

    seg_id: int
    min_t: int
    max_t: int
    nbytes: int
    offsets: dict = field(hash=False, compare=False)

    def meets(self, start: int, end: int) -> bool:
        """Whether the half-open window ``[start, end)`` meets ``[min_t, max_t]``."""
        return start < end and self.max_t >= start and self.min_t < end


class TimeSeriesStore:
    """Sealed immutable segments + an open head + a sparse index (module docstring).

    ``max_samples``: samples that seal the head; ``max_span``: seconds after the head's first
    sample at which an arriving sample seals it first; ``tolerance``: how late (seconds behind
    the newest accepted time) a sample may arrive and still be accepted.
    """

    def __init__(self, max_samples: int = 1000, max_span: int = 7200, tolerance: int = 0):
        self.max_samples = integer("max_samples", max_samples, 1)
        self.max_span = integer("max_span", max_span, 1, unit="seconds")
        self.tolerance = integer("tolerance", tolerance, 0, unit="seconds")
        self.files: dict[int, bytes] = {}  # the "disk": segment id -> its immutable bytes
        self.index: list[Segment] = []
        self.head: dict[str, tuple[list[int], list[float]]] = {}
        self.head_count = 0
        self.head_first: int | None = None
        self.newest: int | None = None
        self.horizon: int | None = None
        self.next_id = 0
        self.bytes_written = self.bytes_rewritten = self.bytes_deleted = self.bytes_read = 0
        self.last_query_segments = 0

    # ---- writes --------------------------------------------------------------------------

    def append(self, series: str, t: int, value: float) -> bool:
        """Add one sample; False (and nothing stored) if it is too late or behind the horizon."""
        if self.newest is not None and t < self.newest - self.tolerance:
            return False
        if self.horizon is not None and t < self.horizon:
            return False
        if self.head_count and (self.head_count >= self.max_samples or t >= self.head_first + self.max_span):
            self.seal()
        if not self.head_count:
            self.head_first = t
        ts, vs = self.head.setdefault(series, ([], []))
        i = bisect.bisect_right(ts, t)
        ts.insert(i, t)
        vs.insert(i, value)
        self.head_count += 1
        self.newest = t if self.newest is None else max(self.newest, t)
        return True

    def seal(self) -> Segment | None:
        """Write the head as an immutable segment and index it (None if the head is empty)."""
        if not self.head_count:
            return None
        chunks, offsets, pos = [], {}, 0
        lo, hi = math.inf, -math.inf
        for series in sorted(self.head):
            ts, vs = self.head[series]
            chunks.append(b"".join(_PACK.pack(t, v) for t, v in zip(ts, vs, strict=True)))
            offsets[series] = (pos, len(ts))
            pos += len(ts) * SAMPLE_BYTES
            lo, hi = min(lo, ts[0]), max(hi, ts[-1])
        data = b"".join(chunks)
        seg = Segment(self.next_id, int(lo), int(hi), len(data), offsets)
        self.files[seg.seg_id] = data
        self.index.append(seg)
        self.next_id += 1
        self.bytes_written += len(data)
        self.head, self.head_count, self.head_first = {}, 0, None
        return seg

    def compact(self, cutoff: int) -> tuple[int, int]:
        """TTL: delete every sealed segment entirely older than ``cutoff`` (``max_t < cutoff``), whole;
        the horizon becomes ``cutoff``. Returns (segments dropped, bytes rewritten)."""
        dropped = 0
        keep = []
        for seg in self.index:
            if seg.max_t < cutoff:
                self.bytes_deleted += len(self.files.pop(seg.seg_id))
                dropped += 1
            else:
                keep.append(seg)
        self.index = keep
        self.horizon = cutoff if self.horizon is None else max(self.horizon, cutoff)
        return dropped, self.bytes_rewritten

    # ---- reads ---------------------------------------------------------------------------

    def query(self, series: str, start: int, end: int) -> list[tuple[int, float]]:
        """The samples of ``series`` with ``start <= t < end`` (and ``t >= horizon``), sorted by time.
        Opens only the sealed segments whose time bounds meet the window (``last_query_segments``)."""
        if self.horizon is not None:
            start = max(start, self.horizon)
        out: list[tuple[int, float]] = []
        opened = 0
        if start >= end:  # an empty window opens nothing
            self.last_query_segments = 0
            return out
        for seg in self.index:
            if seg.max_t < start or seg.min_t >= end:
                continue
            opened += 1
            if series in seg.offsets:
                out.extend(self._scan(seg, series, start, end))
        ts, vs = self.head.get(series, ([], []))
        i, j = bisect.bisect_left(ts, start), bisect.bisect_left(ts, end)
        out.extend(zip(ts[i:j], vs[i:j], strict=True))
        self.last_query_segments = opened
        out.sort(key=lambda s: s[0])
        return out

    def _scan(self, seg: Segment, series: str, start: int, end: int) -> list[tuple[int, float]]:
        """Read ``series``' run of ``seg`` (byte accounting) and keep the samples in the window."""
        pos, count = seg.offsets[series]
        raw = self.files[seg.seg_id][pos:pos + count * SAMPLE_BYTES]
        self.bytes_read += len(raw)
        samples = [_PACK.unpack_from(raw, k * SAMPLE_BYTES) for k in range(count)]
        times = [s[0] for s in samples]
        i, j = bisect.bisect_left(times, start), bisect.bisect_left(times, end)
        return samples[i:j]

    def segments(self) -> list[tuple[int, int, int]]:
        """(min_t, max_t, bytes) of each sealed segment still stored, oldest first."""
        return [(s.min_t, s.max_t, s.nbytes) for s in self.index]

    @property
    def stored_bytes(self) -> int:
        """Bytes of the sealed segments on disk."""
        return sum(len(b) for b in self.files.values())


def brute_force_window(samples, series: str, start: int, end: int, horizon: int | None = None) -> list:
    """The oracle: every accepted ``(series, t, value)`` scanned, the window ``[start, end)`` kept
    (and ``t >= horizon``), sorted by time."""
    lo = start if horizon is None else max(start, horizon)
    return sorted(((t, v) for s, t, v in samples if s == series and lo <= t < end), key=lambda x: x[0])


def segments_touched(bounds, start: int, end: int) -> int:
    """How many of the segments ``bounds`` ((min_t, max_t) pairs, inclusive) the window
    ``[start, end)`` meets: a count over the list (no index)."""
    return sum(1 for lo, hi in bounds if start < end and hi >= start and lo < end)


def expected_segments_touched(window_s: float, span_s: float, n_segments: int) -> float:
    """Segments of span ``span_s`` (back to back, ``n_segments`` of them) that a window of length
    ``window_s`` placed uniformly at random meets on average: ``min(n, window/span + 1)``.

    A window of length W over tiles of length S meets floor(W/S) + 1 or + 2 tiles; averaged over
    its offset that is W/S + 1 (each tile boundary inside the window adds one, and the expected
    number of boundaries inside is W/S). Capped at the ``n_segments`` that exist.
    """
    w = real("window_s", window_s, 0, unit="seconds")
    s = real("span_s", span_s, 0, low_open=True, unit="seconds")
    n = integer("n_segments", n_segments, 1)
    if w == 0:
        return 0.0
    return min(float(n), w / s + 1)
