"""lib.sre.hangs: the simulated flight-recorder dumps, the analysis that names cause and rank, the triage
times, the threaded reproducer (every wait has a timeout) and the counters of a hang."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import hangs as h
from lib.sre import hangs_practice as hp


@pytest.mark.parametrize("cause", list(h.CAUSES) + ["link", "none"])
@pytest.mark.parametrize("n,bad", [(3, 0), (8, 7), (64, 17)])
def test_analysis_names_each_injected_cause_and_rank(cause, n, bad):
    sim = h.simulate_hang(n, cause, bad, hang_step=3, seed=n)
    f = h.find_missing_rank(sim.dumps)
    assert (f.cause, f.rank) == (cause, sim.rank)
    assert f.seq == sim.hang_seq


@settings(max_examples=60, deadline=None)
@given(cause=st.sampled_from(list(h.CAUSES)), n=st.integers(3, 40), bad=st.integers(0, 39),
       hang_step=st.integers(0, 6), buckets=st.integers(2, 6), buf=st.integers(3, 60), seed=st.integers(0, 50))
def test_analysis_property_any_ring_buffer(cause, n, bad, hang_step, buckets, buf, seed):
    """Whatever the ring buffer keeps (>= 3 entries: the divergence point and one more), the analysis names
    the injected rank; the oracle is the simulator's truth."""
    bad = bad % n
    sim = h.simulate_hang(n, cause, bad, hang_step=hang_step, buckets=buckets, buffer_entries=buf, seed=seed)
    f = h.find_missing_rank(sim.dumps)
    assert (f.cause, f.rank) == (cause, bad)


def test_dump_states_follow_sequence_order():
    sim = h.simulate_hang(4, "stuck", 2, hang_step=2, buckets=3, seed=0)
    for d in sim.dumps:
        states = [e.state for e in d.entries]
        # completed, then at most one started, then scheduled: never out of order
        order = [h.STATES.index(s) for s in states]
        assert order == sorted(order, reverse=True)
        assert states.count("started") <= 1
    assert sim.dumps[2].entries[-1].seq == sim.hang_seq - 1
    assert all(d.entries[-1].seq > sim.hang_seq for i, d in enumerate(sim.dumps) if i != 2)


def test_ring_buffer_keeps_the_last_entries():
    sim = h.simulate_hang(3, "none", 0, hang_step=10, buffer_entries=5)
    for d, issued in zip(sim.dumps, sim.issued, strict=True):
        assert [e.seq for e in d.entries] == list(range(issued - 5, issued))


def test_inputs_refused():
    with pytest.raises(ValueError, match="cause"):
        h.simulate_hang(4, "gremlins")
    with pytest.raises(ValueError, match="bad_rank"):
        h.simulate_hang(4, "dead", 4)
    with pytest.raises(ValueError, match="dumps"):
        h.find_missing_rank([None])
    with pytest.raises(ValueError, match="method"):
        h.triage_time_s("guess", 8)
    with pytest.raises(ValueError, match="assume"):
        h.triage_time_s("flight recorder", 8, assume={"nope": 1})
    with pytest.raises(ValueError, match="timeout_s"):
        h.ThreadGroup(2, timeout_s=5)


def test_triage_times_formulas():
    a = {"fr_buffer_entries": 100, "fr_entry_bytes": 1000, "fr_parse_entries_per_s": 1e4, "dump_collect_gb_s": 1.0,
         "pyspy_dump_s": 1.0, "ssh_fanout": 4, "ssh_round_s": 2.0, "stack_group_read_s": 60, "progress_alert_s": 100,
         "checkpoint_interval_min": 20}
    # 64 ranks on 8 hosts: 2 rounds of (2 s + 8 x 1 s)
    assert h.triage_time_s("flight recorder", 64, timeout_s=300, assume=a) == pytest.approx(300 + 6400 * 1000 / 1e9 + 0.64)
    assert h.triage_time_s("py-spy, grouped", 64, assume=a) == pytest.approx(100 + 2 * 10 + 3 * 60)
    assert h.triage_time_s("py-spy, one by one", 64, assume=a) == pytest.approx(100 + 20 + 64 * 60)
    # more ranks never take less time, by any method
    for m, (n1, n2) in itertools.product(h.TRIAGE_METHODS, [(8, 64), (64, 4096)]):
        assert h.triage_time_s(m, n1) <= h.triage_time_s(m, n2)


def test_reproducer_hangs_exactly_at_the_logging_step_and_fix_runs_clean():
    bad = h.run_training(4, 25, 10, fixed=False, timeout_s=0.3)
    assert bad.hung and bad.error.startswith("rank 0: collective 10") and "sizes [1, 4]" in bad.error
    assert bad.finished == (9, 10, 10, 10)  # rank 0 is in its logging all-reduce at step 10
    assert bad.wall_s < 3
    good = h.run_training(4, 25, 10, fixed=True, timeout_s=0.3)
    assert not good.hung and good.finished == (25,) * 4
    assert [s for s, _ in good.printed] == [10, 20]


def test_thread_group_times_out_when_a_rank_never_comes():
    import threading

    g = h.ThreadGroup(3, timeout_s=0.2)
    errs = []

    def go(r):
        try:
            g.all_reduce(r, [1.0])
        except h.CollectiveTimeout as e:
            errs.append(str(e))

    ts = [threading.Thread(target=go, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=2)
    assert len(errs) == 2 and "2 of 3 ranks arrived" in " ".join(errs)


def test_thread_group_sums():
    import threading

    g = h.ThreadGroup(3, timeout_s=1.0)
    out = {}
    ts = [threading.Thread(target=lambda r=r: out.__setitem__(r, g.all_reduce(r, [r, 1.0]))) for r in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=2)
    assert all(v == [3.0, 3.0] for v in out.values())


def test_hang_counters_read_busy_but_idle():
    c = h.hang_counters("h100-sxm", 16)
    assert c["utilization"] == 1.0 and c["tensor_active"] == 0.0
    assert c["sm_active"] == pytest.approx(16 / 132)
    assert c["power_fraction"] < 0.2


def test_practice_grader_passes_reference_and_catches_every_draft():
    assert hp.check(hp.variant("reference")).passed
    for name in hp.VARIANTS:
        assert hp.check(hp.variant(name)).status == "failed", name
    assert hp.check(hp.skeleton).status == "not implemented"


def test_analysis_names_a_lone_rank_ahead_as_conditional():
    # the logging step is the last step: the others finish and issue nothing more, rank 0 is alone in an extra
    # all-reduce; most ranks "behind" means the rank that entered G is the odd one (not a stuck majority)
    bad = h.run_training(6, 10, 10, fixed=False, timeout_s=0.1)
    f = h.find_missing_rank(h.group_dumps(bad.entered))
    assert bad.hung and (f.cause, f.rank) == ("conditional", 0)
    # the mirror image, one rank behind while the rest wait in G, stays a stuck rank
    for n in (3, 4, 9):
        sim = h.simulate_hang(n, "stuck", n - 1)
        assert (h.find_missing_rank(sim.dumps).cause, h.find_missing_rank(sim.dumps).rank) == ("stuck", n - 1)
