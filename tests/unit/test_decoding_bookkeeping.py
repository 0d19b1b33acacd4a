"""lib.decoding.bookkeeping: the speculative step's token and KV bookkeeping. Property tests: the
invariants hold after every step of random programs, and the output equals plain greedy decoding of the
target whatever the drafter; the four traced cases by hand; the grader against its drafts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import bookkeeping as bk
from lib.decoding import verify_practice as vp


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.integers(1, 40), st.floats(0.0, 1.0),
       st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_invariants_hold_and_output_is_plain_greedy(seed, prompt_len, max_tokens, match, lengths):
    target = vp.toy_target(seed, eos_share=0.08)
    drafter = vp.toy_drafter(target, seed, match)
    prompt = tuple(range(1, prompt_len + 1))
    first = target(prompt)
    trace = bk.run_program(target, drafter, prompt, first, max_tokens, vp.BOOK_EOS, lengths)
    state = bk.start(prompt_len, first, max_tokens, vp.BOOK_EOS)
    for tr in trace:
        assert bk.violations(state, tr.state, tr.accepted) == []
        state = tr.state
    assert state.output == bk.greedy_reference(target, prompt, first, max_tokens, vp.BOOK_EOS)
    assert state.finished in ("eos", "length")



def test_rejection_full_acceptance_eos_and_cap_by_hand():
    s = bk.start(10, 5, 100, 0)  # L = 11, target KV 10
    r = bk.advance(s, (1, 2, 3, 4), (1, 9, 7, 7, 7))  # one accepted, correction 9
    assert r.output[1:] == (1, 9) and r.target_kv == 12 and r.rolled_back == 3 and r.draft_kv == 12
    f = bk.advance(s, (1, 2, 3), (1, 2, 3, 8))  # all accepted + bonus
    assert f.output[1:] == (1, 2, 3, 8) and f.target_kv == 14 == f.seq_len - 1 and f.rolled_back == 0
    assert f.draft_kv == 13  # the drafter never fed its last draft: it catches up on two tokens next step
    e = bk.advance(s, (1, 0, 3), (1, 0, 3, 8))  # EOS inside the accepted run
    assert e.output[1:] == (1, 0) and e.finished == "eos" and e.accepted == 3 and e.emitted == 3
    assert e.target_kv == 13 == e.seq_len and e.rolled_back == 1  # every token of a finished sequence has KV
    c = bk.advance(bk.start(10, 5, 3, 0), (1, 2, 3), (1, 2, 3, 8))  # cap of 3 output tokens
    assert c.output == (5, 1, 2) and c.finished == "length" and c.emitted == 3 and c.accepted == 3
    nd = bk.advance(s, (), (6,))  # no drafts: a plain decode step
    assert nd.output[1:] == (6,) and nd.target_computed == 1 and nd.draft_kv == 10


def test_bad_steps_are_refused():
    s = bk.start(4, 0, 10, 0)
    assert s.finished == "eos"
    with pytest.raises(ValueError, match="finished"):
        bk.advance(s, (1,), (1, 2))
    with pytest.raises(ValueError, match="k \\+ 1"):
        bk.advance(bk.start(4, 3, 10, 0), (1, 2), (1, 2))


def test_grader_passes_the_reference_and_fails_every_draft():
    assert vp.check_bookkeeping(vp.bookkeeping_variant("reference")).passed
    for name in vp.BOOKKEEPING_VARIANTS:
        assert vp.check_bookkeeping(vp.bookkeeping_variant(name)).status == "failed", name
    assert vp.check_bookkeeping(vp.bookkeeping_skeleton).status == "not implemented"


def test_max_steps_stops_without_cutting_a_step():
    """A run limited by max_steps ends on an uncut step: every step emits accepted + 1 tokens, and it is
    the prefix of the same run without a limit."""
    target = vp.toy_target(3, eos_share=0.0)
    drafter = vp.toy_drafter(target, 3, 0.8)
    prompt = (1, 2, 3)
    short = bk.run_program(target, drafter, prompt, target(prompt), 10**6, vp.BOOK_EOS, [4], max_steps=12)
    assert len(short) == 12 and not short[-1].state.finished
    assert short[-1].state.emitted - 1 == sum(tr.accepted + 1 for tr in short)
    full = bk.run_program(target, drafter, prompt, target(prompt), 200, vp.BOOK_EOS, [4])  # 12 steps emit <= 60
    assert [(tr.state.output, tr.accepted) for tr in full[:12]] == [(tr.state.output, tr.accepted) for tr in short]
    with pytest.raises(ValueError, match="max_steps"):
        bk.run_program(target, drafter, prompt, target(prompt), 60, vp.BOOK_EOS, [4], max_steps=0)
