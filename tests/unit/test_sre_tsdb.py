"""lib.sre.tsdb (N076): the store against brute force, pruning, TTL, the grader and its drafts."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import tsdb
from lib.sre import tsdb_practice as tp

H = 3600


def _week_store():
    s = tsdb.TimeSeriesStore(10**9, 2 * H, 300)
    for t in range(0, 8 * 24 * H + H, 60):
        for k in range(2):
            assert s.append(f"s{k}", t, float(t))
    return s


def test_ttl_drops_whole_files_and_keeps_the_straddler():
    s = _week_store()
    assert len(s.index) == 96
    before = s.stored_bytes
    dropped, rewritten = s.compact(25 * H)
    assert (dropped, rewritten) == (12, 0)
    assert s.bytes_rewritten == 0
    assert s.segments()[0][:2] == (24 * H, 26 * H - 60)  # the straddling segment, whole
    assert before - s.stored_bytes == s.bytes_deleted == 12 * 120 * 2 * tsdb.SAMPLE_BYTES
    # samples behind the horizon are stored but not returned
    assert s.query("s0", 0, 26 * H) == [(t, float(t)) for t in range(25 * H, 26 * H, 60)]


def test_pruning_opens_only_the_segments_the_window_meets():
    s = _week_store()
    s.compact(25 * H)
    out = s.query("s0", 165 * H + 1800, 166 * H + 1800)
    assert s.last_query_segments == 2 and len(s.index) == 84
    assert out == [(t, float(t)) for t in range(165 * H + 1800, 166 * H + 1800, 60)]
    s.query("s0", 164 * H, 166 * H)  # exactly one segment, on its boundaries
    assert s.last_query_segments == 1
    s.query("s0", 100 * H, 100 * H)
    assert s.last_query_segments == 0


def test_bytes_read_is_one_series_run_per_opened_segment():
    s = _week_store()
    s.bytes_read = 0
    s.query("s1", 10 * H, 12 * H)
    assert s.bytes_read == 120 * tsdb.SAMPLE_BYTES


def test_late_sample_lands_in_head_and_index_keeps_true_bounds():
    s = tsdb.TimeSeriesStore(100, 10, 5)
    for t in range(0, 12):
        s.append("a", t, 1.0)
    assert s.segments() == [(0, 9, 160)]  # sealed when t = 10 arrived, 10 s after the head's first sample
    s.seal()
    assert s.append("b", 8, 2.0)  # 3 s late: its segment (0, 9) is sealed, so it goes to the head
    s.seal()
    assert s.segments()[-1][:2] == (8, 8)  # overlaps (0, 9): the index keeps true bounds
    assert s.query("b", 8, 9) == [(8, 2.0)]
    assert s.last_query_segments == 2


def test_out_of_order_rule():
    s = tsdb.TimeSeriesStore(100, 1000, 5)
    assert s.append("a", 10, 1.0)
    assert s.append("b", 5, 1.0)       # exactly tolerance late: accepted
    assert not s.append("c", 4, 1.0)   # one second more: refused
    assert s.query("b", 0, 100) == [(5, 1.0)]


def test_expected_segments_touched_matches_random_windows():
    span, n = 7200, 84
    bounds = [(k * span, (k + 1) * span - 1) for k in range(n)]
    rng = random.Random(1)
    for w in (600, 3600, 7200, 5 * 7200 + 100):
        got = [tsdb.segments_touched(bounds, a, a + w) for a in (rng.randrange(0, (n - 10) * span) for _ in range(4000))]
        assert sum(got) / len(got) == pytest.approx(tsdb.expected_segments_touched(w, span, n), rel=0.03)
    assert tsdb.expected_segments_touched(0, span, n) == 0
    assert tsdb.expected_segments_touched(10**9, span, n) == n


def test_validation():
    with pytest.raises(ValueError, match="max_samples"):
        tsdb.TimeSeriesStore(0, 10, 0)
    with pytest.raises(ValueError, match="span_s"):
        tsdb.expected_segments_touched(10, 0, 3)


def test_grader_passes_reference_and_catches_every_draft():
    assert tp.check(tp.variant("reference")).passed
    for name in tp.VARIANTS:
        assert tp.check(tp.variant(name)).status == "failed", name
    assert tp.check(tp.Skeleton).status == "not implemented"
    with pytest.raises(ValueError, match="variant"):
        tp.variant("nope")


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), max_samples=st.integers(1, 8), max_span=st.integers(1, 40),
       tolerance=st.integers(0, 10))
def test_property_reference_equals_brute_force(seed, max_samples, max_span, tolerance):
    tp.run(tsdb.TimeSeriesStore, tp.random_ops(seed, 80, 3, max_samples, max_span, tolerance))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_property_segments_never_overlap_the_rule(seed):
    """Every sealed segment respects the size bound."""
    ops = tp.random_ops(seed, 120, 2, 4, 15, 5)
    s = tsdb.TimeSeriesStore(4, 15, 5)
    for op in ops[1:]:
        if op[0] == "append":
            s.append(*op[1:])
        elif op[0] == "seal":
            s.seal()
    assert all(nb <= 4 * tsdb.SAMPLE_BYTES for _, _, nb in s.segments())


def test_grader_catches_stores_the_drafts_do_not_cover():
    """Three more wrong stores: one that never seals (a brute-force list passes every query), one whose
    out-of-order rule restarts at each seal, one whose horizon filters sealed segments only."""
    ref = tp.variant("reference")

    class NeverSeals(tp.Oracle):
        def __init__(self, max_samples, max_span, tolerance):
            super().__init__(tolerance)
            self.last_query_segments = 0

        def seal(self):
            pass

        def segments(self):
            return []

        def compact(self, cutoff):
            super().compact(cutoff)
            return 0, 0

    class HeadNewest(ref):
        def append(self, series, t, value):
            if not self.head_count:
                self.newest = None  # forgets the newest sample at each seal
            return super().append(series, t, value)

    class HorizonSealedOnly(ref):
        def query(self, series, start, end):
            got = super().query(series, start, end)
            if self.horizon is None:
                return got
            ts, vs = self.head.get(series, ([], []))
            return sorted(got + [(t, v) for t, v in zip(ts, vs, strict=True) if start <= t < min(end, self.horizon)])

    for wrong, case in ((NeverSeals, "empty window"), (HeadNewest, "after a seal"),
                        (HorizonSealedOnly, "open head")):
        report = tp.check(wrong)
        assert report.status == "failed" and case in str(report), (wrong.__name__, str(report))
