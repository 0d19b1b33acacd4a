"""lib.sre.stream_audit: the reference against hand-computed streams and the simulator's truth, the
grader against every draft, coalescing, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import stream_audit as sa


def _rec():
    return sa.Recording(0.0, (sa.Event(0.035, 0, 0.030), sa.Event(0.215, 3), sa.Event(0.240, 2), sa.Event(0.300, 1),
                              sa.Event(0.301, 0)))


def test_hand_computed_stream():
    a = sa.audit(_rec())
    assert a.launch_delay_s == pytest.approx(0.030)
    assert a.ttft_s == pytest.approx(0.185)  # the role chunk at 35 ms is not the first token
    assert a.client_ttft_s == pytest.approx(0.215)
    assert a.tokens == 6 and a.token_events == 3 and a.tokens_per_event == (3, 2, 1)
    assert a.gaps_s == pytest.approx((0.025, 0.060))
    assert a.max_gap_s == pytest.approx(0.060)
    assert a.rate_tok_s == pytest.approx(3 / 0.085)  # 2 + 1 tokens after the first event over 85 ms
    assert a.engine_s == pytest.approx(0.270)


def test_reference_passes_and_every_draft_is_caught():
    assert sa.check(sa.variant("reference")).passed
    for name in sa.VARIANTS:
        report = sa.check(sa.variant(name))
        assert report.status == "failed", name
    assert sa.check(sa.Skeleton).status == "not implemented"


class _OnePass:
    """A correct auditor written apart from the reference: one pass over the events, a dict result."""

    def audit(self, rec):
        arrival, first, last, prev, n_first, total, gaps, sizes = None, None, None, None, 0, 0, [], []
        for e in rec.events:
            if e.arrival_s is not None:
                arrival = e.arrival_s
            if not e.tokens:
                continue
            if first is None:
                first, n_first = e.t_s, e.tokens
            else:
                gaps.append(e.t_s - prev)
            prev = last = e.t_s
            sizes.append(e.tokens)
            total += e.tokens
        span = last - first
        return {"launch_delay_s": arrival - rec.created_s, "ttft_s": first - arrival,
                "client_ttft_s": first - rec.created_s, "tokens": total, "token_events": len(sizes), "gaps_s": gaps,
                "tokens_per_event": sizes, "max_gap_s": max(gaps, default=math.nan),
                "rate_tok_s": (total - n_first) / span if span > 0 else math.nan, "engine_s": last - arrival}


class _StampIsMetadata(_OnePass):
    """Wrong: the event that carries the server's stamp is taken for the role chunk and its tokens skipped."""

    def audit(self, rec):
        kept = tuple(sa.Event(e.t_s, 0, e.arrival_s) if e.arrival_s is not None else e for e in rec.events)
        return super().audit(sa.Recording(rec.created_s, kept))


class _MergeSameInstant(_OnePass):
    """Wrong: events received at the same instant are merged (a dict keyed by receive time)."""

    def audit(self, rec):
        by_t = {}
        for e in rec.events:
            n, a = by_t.get(e.t_s, (0, None))
            by_t[e.t_s] = (n + e.tokens, a if e.arrival_s is None else e.arrival_s)
        return super().audit(sa.Recording(rec.created_s, tuple(sa.Event(t, n, a) for t, (n, a) in by_t.items())))


def test_grader_passes_an_independent_correct_auditor_and_catches_defects_the_drafts_lack():
    assert sa.check(_OnePass).passed
    # both passed the first eight cases: no case stamped the arrival on a token event or read two events at once
    for wrong in (_StampIsMetadata, _MergeSameInstant):
        assert sa.check(wrong).status == "failed", wrong.__name__


def test_grader_accepts_a_dict_returning_candidate():
    class AsDict:
        def audit(self, rec):
            return sa.audit(rec).__dict__

    assert sa.check(AsDict).passed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.2), st.integers(0, 5)), min_size=1, max_size=20), st.floats(0, 0.1))
def test_tokens_and_rate_properties(rows, launch):
    """Oracle-free invariants: tokens add up, gaps sum to the token span, client TTFT = launch + TTFT."""
    t, events = 0.1 + launch, [sa.Event(0.1 + launch, 0, 0.1 + launch)]
    for dt, n in rows:
        t += dt
        events.append(sa.Event(t, n))
    if not any(n for _, n in rows):
        with pytest.raises(ValueError, match="no event carries a token"):
            sa.audit(sa.Recording(0.1, tuple(events)))
        return
    a = sa.audit(sa.Recording(0.1, tuple(events)))
    assert a.tokens == sum(n for _, n in rows)
    assert a.token_events == sum(1 for _, n in rows if n)
    assert sum(a.gaps_s) == pytest.approx(a.engine_s - a.ttft_s, abs=1e-12)
    assert a.client_ttft_s == pytest.approx(a.launch_delay_s + a.ttft_s)
    if a.engine_s > a.ttft_s:
        assert a.rate_tok_s == pytest.approx((a.tokens - a.tokens_per_event[0]) / (a.engine_s - a.ttft_s))


def test_coalesce():
    times, counts = sa.coalesce([0.001, 0.004, 0.010, 0.011, 0.031], 0.01)
    assert times == pytest.approx([0.01, 0.02, 0.04])  # a token made on a tick leaves on it
    assert counts.tolist() == [3, 1, 1]
    t0, c0 = sa.coalesce([0.1, 0.2], 0.0)
    assert t0.tolist() == [0.1, 0.2] and c0.tolist() == [1, 1]
    with pytest.raises(ValueError, match="non-decreasing"):
        sa.coalesce([0.2, 0.1], 0.01)
    with pytest.raises(ValueError, match="flush_s"):
        sa.coalesce([0.1], -1.0)


def test_validation():
    with pytest.raises(ValueError, match="receive order"):
        sa.Recording(0.0, (sa.Event(0.2, 1, 0.1), sa.Event(0.1, 1)))
    with pytest.raises(ValueError, match="tokens"):
        sa.Event(0.1, -1)
    with pytest.raises(ValueError, match="arrival_s"):
        sa.audit(sa.Recording(0.0, (sa.Event(0.1, 1),)))
    with pytest.raises(ValueError, match="Recording"):
        sa.audit("not a recording")
    with pytest.raises(ValueError, match="variant"):
        sa.variant("nope")


@pytest.fixture(scope="module")
def dep():
    from lib.perf.deployment import deployment

    return deployment("llama-3.1-8b", "h100-sxm")


def test_simulated_streams_against_the_simulator(dep):
    """The audit recovers the simulator's truth: launch delays exactly; with no coalescing, TTFT = the
    engine's + the network and the gaps = the engine's inter-token gaps; with coalescing, the TTFT lags by
    at most one tick and every token is delivered."""
    sim0 = sa.simulated_recordings(dep, n_requests=30, flush_s=0.0, net_s=0.004, seed=1)
    a0 = [sa.audit(r) for r in sim0.recordings]
    assert np.allclose([a.launch_delay_s for a in a0], sim0.launch_delay_s, atol=1e-12)
    assert np.allclose([a.ttft_s for a in a0], [r.ttft_s + 0.004 for r in sim0.result.requests], atol=1e-12)
    gaps = np.sort(np.concatenate([a.gaps_s for a in a0 if a.gaps_s]))
    assert np.allclose(gaps, np.sort(sim0.result.inter_token_gaps()), atol=1e-12)
    sim = sa.simulated_recordings(dep, n_requests=30, flush_s=0.03, net_s=0.004, seed=1)
    for a, r in zip((sa.audit(x) for x in sim.recordings), sim.result.requests, strict=True):
        assert a.tokens == r.output_len
        assert -1e-9 <= a.ttft_s - r.ttft_s - 0.004 <= 0.03 + 1e-9
    # spreading always shrinks or keeps every gap, and hides the stall whenever events hold several tokens
    sp = sa.spread_gaps(sim.recordings)
    ev = np.concatenate([sa.audit(x).gaps_s for x in sim.recordings])
    assert sp.size > ev.size and np.percentile(sp, 99) < np.percentile(ev, 99)


def test_launch_delay_distribution(dep):
    """The seeded launch delay is lognormal with the asked median (Monte Carlo, 400 draws)."""
    sim = sa.simulated_recordings(dep, n_requests=400, rate=50.0, prompt=64, output=4, launch_median_s=0.02,
                                  launch_sigma=0.8, flush_s=0.0, seed=2)
    logs = np.log(sim.launch_delay_s)
    assert abs(np.median(sim.launch_delay_s) / 0.02 - 1) < 0.15
    assert abs(np.std(logs) - 0.8) < 0.1
    assert not math.isnan(float(np.mean(logs)))


def test_requests_the_engine_rejects_close_empty():
    """llama-2-70b's 4K window rejects the longest prompts: their streams hold no token event and the
    audit refuses them with a message instead of the simulator raising."""
    from lib.explorers.sre_stream import recordings

    sim = recordings("llama-2-70b", "a100-sxm", 33.0, 1.5)
    rejected = [i for i, r in enumerate(sim.result.requests) if r.status != "finished"]
    assert rejected
    rec = sim.recordings[rejected[0]]
    assert all(e.tokens == 0 for e in rec.events)
    with pytest.raises(ValueError, match="no event carries a token"):
        sa.audit(rec)
