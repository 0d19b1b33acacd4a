"""Acceptance from counter snapshots: windows, reset rejection, the EOS correction of request-step
counts, the inverse of Leviathan's eq. 1, and the practice grader (property tests on synthetic
counter streams with restarts)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import counters as c
from lib.decoding.counters import (
    Snapshot,
    acceptance,
    acceptance_from_length,
    request_steps,
    simulate_counters,
    window,
)
from lib.decoding.speculative import speculative_tokens_per_step


def _snap(t, drafts, tokens, accepted, per=(), gen=0, fin=0, running=0, start=0.0):
    return Snapshot(t, drafts, tokens, accepted, per, gen, fin, running, start)


def test_a_window_is_the_difference_of_two_snapshots():
    w = window(_snap(0, 10, 40, 20, (9, 7, 4), 50, 2, 4), _snap(30, 110, 440, 260, (90, 80, 60, 30), 480, 9, 5))
    assert w.clean and (w.num_drafts, w.num_draft_tokens, w.num_accepted_tokens) == (100, 400, 240)
    assert w.accepted_per_pos == (81, 73, 56, 30) and w.generation_tokens == 430
    assert w.finished_requests == 7 and w.admitted_requests == 8  # 7 finished + one more running


def test_resets_are_rejected_by_a_drop_or_by_the_start_time():
    a = _snap(0, 100, 400, 200, (90, 60, 30, 20), 500, 10)
    dropped = _snap(30, 20, 80, 50, (18, 15, 10, 7), 120, 2, start=25.0)
    assert not window(a, dropped).clean and "restarted" in window(a, dropped).reason
    assert not window(a, dropped, check_start_time=False).clean  # a drop shows without the start time
    regrown = _snap(30, 150, 600, 420, (140, 120, 100, 60), 900, 12, start=25.0)  # every counter grew past
    assert window(a, regrown, check_start_time=False).clean  # a drop-only check misses it
    assert not window(a, regrown).clean
    per_pos_only = _snap(30, 200, 800, 400, (95, 59, 130, 116), 1000, 20)  # one position went down
    assert "accepted_per_pos" in window(a, per_pos_only).reason


def test_acceptance_is_a_ratio_of_sums():
    w1 = window(_snap(0, 0, 0, 0), _snap(10, 10, 40, 36, (10, 10, 9, 7)))
    w2 = window(_snap(10, 10, 40, 36, (10, 10, 9, 7)), _snap(20, 110, 440, 136, (10 + 60, 10 + 30, 9 + 10, 7)))
    acc = acceptance([w1, w2])
    assert acc.acceptance_rate == pytest.approx(136 / 440)
    assert acc.mean_acceptance_length == pytest.approx(1 + 136 / 110)
    assert acc.per_position == pytest.approx((70 / 110, 40 / 110, 19 / 110, 7 / 110))
    assert acc.draft_tokens_per_draft == 4
    assert sum(acc.per_position) == pytest.approx(acc.mean_acceptance_length - 1)
    empty = acceptance([])
    assert math.isnan(empty.acceptance_rate) and empty.per_position == ()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.floats(0.0, 0.97), st.integers(2, 40),
       st.lists(st.integers(1, 399), max_size=3), st.integers(5, 80))
def test_clean_windows_match_the_engine_and_every_restart_is_caught(seed, k, a, mean_len, restarts, every):
    stream = simulate_counters(steps=400, batch=6, draft_tokens=k, acceptance_rate=a, mean_output_tokens=mean_len,
                               scrape_every=every, restarts=restarts, seed=seed)
    wins = c.windows(stream.snapshots)
    assert len(wins) == len(stream.truth)
    for w, truth in zip(wins, stream.truth, strict=True):
        assert w.clean == (truth is not None)  # exactly the windows with a restart are rejected
        if truth is None:
            continue
        assert (w.num_drafts, w.num_draft_tokens, w.num_accepted_tokens, w.generation_tokens,
                w.finished_requests) == (truth["num_drafts"], truth["num_draft_tokens"],
                                         truth["num_accepted_tokens"], truth["generation_tokens"],
                                         truth["finished_requests"])
        assert list(w.accepted_per_pos) == truth["accepted_per_pos"]
        assert w.admitted_requests == truth["first_tokens"]
        steps = request_steps(w, k)
        assert steps.low <= truth["num_drafts"] <= steps.high  # the EOS correction brackets the truth
        assert steps.naive == truth["num_drafts"] - truth["dropped"]  # naive misses exactly the dropped tokens
        assert steps.counted == truth["num_drafts"]
    acc = acceptance(wins)
    clean = [t for t in stream.truth if t is not None]
    drafted = sum(t["num_draft_tokens"] for t in clean)
    if drafted:
        assert acc.acceptance_rate == pytest.approx(sum(t["num_accepted_tokens"] for t in clean) / drafted)


def test_a_hidden_restart_biases_a_drop_only_check():
    stream = c._stream("a redeploy whose counters regrow before the next scrape")
    full, drop_only = c.windows(stream.snapshots), c.windows(stream.snapshots, check_start_time=False)
    assert sum(not w.clean for w in drop_only) < sum(not w.clean for w in full)
    truth = c._expected(stream, list(range(len(stream.snapshots))))
    assert acceptance(full).acceptance_rate == pytest.approx(truth["acceptance_rate"])
    assert abs(acceptance(drop_only).acceptance_rate - truth["acceptance_rate"]) > 0.005


def test_acceptance_per_token_matches_leviathan():
    # Monte Carlo of the engine: with i.i.d. acceptance the clean windows' mean acceptance length is eq. 1's
    stream = simulate_counters(steps=3000, batch=16, draft_tokens=4, acceptance_rate=0.7, mean_output_tokens=10**6,
                               scrape_every=500, seed=11)
    acc = acceptance(c.windows(stream.snapshots))
    assert acc.mean_acceptance_length == pytest.approx(speculative_tokens_per_step(0.7, 4), rel=0.01)
    for j, rate in enumerate(acc.per_position):  # position j is accepted with probability a^(j+1)
        assert rate == pytest.approx(0.7 ** (j + 1), rel=0.03)
    assert acceptance_from_length(acc.mean_acceptance_length, 4) == pytest.approx(0.7, abs=0.01)


@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_acceptance_from_length_inverts_eq_1(a, k):
    assert acceptance_from_length(speculative_tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)


@pytest.mark.parametrize("k", [1, 4, 7, 12])
def test_acceptance_from_length_ends_are_exact(k):
    # length 1: no draft is ever kept; length k + 1: every draft is; the forward formula must give them back exactly
    assert acceptance_from_length(1.0, k) == 0.0
    assert acceptance_from_length(k + 1.0, k) == 1.0
    assert speculative_tokens_per_step(acceptance_from_length(k + 1.0, k), k) == k + 1


def test_the_grader_passes_the_reference_and_catches_every_draft():
    assert c.check(c.summarize).passed
    for name in c.VARIANTS:
        report = c.check(c.variant(name))
        assert report.status == "failed", name


@pytest.mark.parametrize("call", [
    lambda: window(_snap(10, 0, 0, 0), _snap(5, 0, 0, 0)),
    lambda: window("a", "b"),
    lambda: request_steps(window(_snap(0, 5, 5, 5), _snap(1, 1, 1, 1)), 4),
    lambda: acceptance_from_length(6.0, 4),
    lambda: acceptance_from_length(0.5, 4),
    lambda: simulate_counters(acceptance_rate=()),
    lambda: simulate_counters(acceptance_rate=1.5),
    lambda: c.windows([_snap(0, 0, 0, 0)]),
    lambda: _snap(0, -1, 0, 0),
    lambda: c.variant("nope"),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
