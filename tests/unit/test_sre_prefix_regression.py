"""I076: the prefix-boundary check, the replayed counters and the diagnosis of a TTFT regression."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache.chained_hash import chain_hashes
from lib.sre import prefix_regression as pr


def test_reference_passes_and_every_draft_is_caught():
    assert pr.check(pr.variant("reference")).passed
    for name in pr.VARIANTS:
        report = pr.check(pr.variant(name))
        assert report.status == "failed", name
    assert pr.check(pr.skeleton).status == "not implemented"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=60), st.integers(1, 8))
def test_boundary_against_the_prefix_cache_oracle(a, b, block):
    got = pr.prefix_boundary(a, b, block)
    assert (got.first_diff, got.first_changed_block, got.reusable_tokens) == pr._oracle(a, b, block)
    assert got.reusable_tokens <= max(got.first_diff, 0) or got.reusable_tokens % block == 0
    assert got.reusable_tokens <= len(b)
    # the changed block's chained hash differs, every earlier one agrees
    ha, hb = chain_hashes(a, block), chain_hashes(b, block)
    assert ha[: got.first_changed_block] == hb[: got.first_changed_block]


def test_corpus_template_breaks_the_prefix_early():
    static = pr.chat_corpus("static", 2, 2, 200, 20, 50, seed=3)
    stamped = pr.chat_corpus("timestamp", 2, 2, 200, 20, 50, seed=3)
    # the static prompts of one deployment share the whole system prompt
    assert pr.prefix_boundary(static[0].prompt, static[1].prompt, 16).first_diff > 200
    bd = pr.prefix_boundary(stamped[0].prompt, stamped[1].prompt, 16)
    assert bd.first_diff < 60 and bd.reusable_tokens <= 48
    with pytest.raises(ValueError, match="template"):
        pr.chat_corpus("jinja", 1, 1, 10, 1, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_scenario_alone_is_named(seed):
    for scenario, want in (("none", None), ("template", "template"), ("routing", "routing")):
        d = pr.diagnose(pr.evidence(scenario, seed=seed))
        assert d.named == want, (scenario, d)


def test_routing_regression_keeps_the_system_prompt_and_about_one_in_n_of_the_history():
    for n in (2, 4, 8, 16):
        ev = pr.evidence("routing", replicas=n, seed=5)
        d = pr.diagnose(ev)
        sys_blocks = ev.system_tokens // 16 * 16
        # each replica misses the system prompt at most once: every other request hits at least all of it
        cold = sum(h < sys_blocks for h in ev.counters_after.per_request_hit)
        assert cold <= n
        # the history part falls to about 1/N (more: older turns on the same replica still hit)
        cb, ca = ev.counters_before, ev.counters_after
        hist_b = sum(max(h - sys_blocks, 0) for h in cb.per_request_hit) / sum(cb.per_request_prompt)
        hist_a = sum(max(h - sys_blocks, 0) for h in ca.per_request_hit) / sum(ca.per_request_prompt)
        assert 0.6 / n < hist_a / hist_b < 2.5 / n, (n, hist_a / hist_b)
        assert d.named == "routing"


def test_one_replica_cannot_have_a_routing_regression():
    assert pr.diagnose(pr.evidence("routing", replicas=1)).named is None


def test_validation():
    with pytest.raises(ValueError, match="scenario"):
        pr.evidence("gremlins")
    with pytest.raises(ValueError, match="routing"):
        pr.replay([], 2, "nearest")
    with pytest.raises(ValueError, match="variant"):
        pr.variant("nope")


def test_grader_passes_correct_rewrites_and_fails_a_short_window():
    def by_prefix(cached, new, block_size):  # no hashes: whole blocks inside the common prefix
        n = min(len(cached), len(new))
        fd = next((i for i in range(n) if cached[i] != new[i]), n)
        return fd, fd // block_size, fd // block_size * block_size

    def windowed(cached, new, block_size):  # compares only the first 128 tokens
        n = min(len(cached), len(new), 128)
        fd = next((i for i in range(n) if cached[i] != new[i]), n)
        return fd, fd // block_size, fd // block_size * block_size

    assert pr.check(by_prefix).status == "passed"
    assert pr.check(windowed).status == "failed"


def test_shared_windows_give_the_same_evidence_as_a_fresh_replay():
    from lib.decoding.tokenizer import WordTokenizer

    for sc in pr.SCENARIOS:
        ev = pr.evidence(sc, replicas=2, conversations=4, turns=3, system_words=80, seed=3)
        tok = WordTokenizer()
        kw = dict(turns=3, system_words=80, user_words=50, reply_words=250, tokenizer=tok)
        before = pr.chat_corpus("static", 4, seed=3, **kw)
        after = pr.chat_corpus("timestamp" if sc == "template" else "static", 4, seed=4,
                               start_s=before[-1].time_s + 60, first_conversation=4, **kw)
        c_b, caches = pr.replay(before, 2, "sticky", 16, seed=3)
        c_a, _ = pr.replay(after, 2, "random" if sc == "routing" else "sticky", 16, seed=4, caches=caches)
        assert [r.prompt for r in ev.after] == [r.prompt for r in after]
        assert ev.counters_after.per_request_hit == c_a.per_request_hit
        assert ev.counters_before.per_request_hit == c_b.per_request_hit


def test_hit_rate_se():
    c = pr.Counters(np.zeros(1), np.zeros(1), (0, 100, 0, 100), (100, 100, 100, 100))
    assert pr.hit_rate_se(c) == pytest.approx(0.5 / 2)
    assert pr.hit_rate_se(pr.Counters(np.zeros(1), np.zeros(1), (5,), (10,))) == 0.0
