"""Prompt lookup (the n-gram proposer, the trace of a greedy generation, its cost) and the EAGLE
head's cost as a Drafter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import drafters as d
from lib.decoding.drafters import (
    lookup_cost,
    lookup_trace,
    prompt_lookup_match,
    prompt_lookup_propose,
)
from lib.decoding.speculative import free_drafter, speculative_step
from lib.decoding.tokenizer import WordTokenizer
from lib.perf.deployment import deployment

# ---- an independent proposer: the suffix-match length at every earlier end position -------------


def _oracle_propose(tokens, k, min_n, max_n):
    """For every end e < len(tokens): m(e) = how many tokens before e agree with the sequence's end
    (capped at max_n). Take the largest m >= min_n, then the smallest e with it."""
    size = len(tokens)
    best = None
    for e in range(1, size):
        m = 0
        while m < max_n and m < e and tokens[e - 1 - m] == tokens[size - 1 - m]:
            m += 1
        if m >= min_n and (best is None or m > best[0]):
            best = (m, e)
    return [] if best is None else list(tokens[best[1]:best[1] + k])


def _vllm_docstring_example():
    # vLLM NgramProposer.propose docstring: [1,2,3,4,2,3], min 2, max 3, k 4 -> [4,2,3]
    return prompt_lookup_propose([1, 2, 3, 4, 2, 3], 4, 2, 3)


def test_vllm_example():
    assert _vllm_docstring_example() == [4, 2, 3]
    assert prompt_lookup_match([1, 2, 3, 4, 2, 3], 2, 3) == (2, 3)


def test_longest_then_earliest():
    seq = [7, 1, 2, 9, 5, 2, 8, 1, 2]  # suffix [1, 2]: the 2-gram matches at 1..2; the 1-gram [2] earlier too
    assert prompt_lookup_match(seq, 1, 3) == (2, 3)
    assert prompt_lookup_propose(seq, 2, 1, 3) == [9, 5]
    assert prompt_lookup_match(seq, 1, 1) == (1, 3)  # [2] first occurs at index 2
    assert prompt_lookup_propose(seq, 3, 3, 3) == []  # [8, 1, 2] never occurred before


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(0, 6), st.integers(1, 4), st.integers(0, 3))
def test_matches_the_oracle(tokens, k, min_n, extra):
    max_n = min_n + extra
    assert prompt_lookup_propose(tokens, k, min_n, max_n) == _oracle_propose(tokens, k, min_n, max_n)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=30), st.integers(1, 3), st.integers(0, 2))
def test_a_match_is_a_real_earlier_occurrence(tokens, min_n, extra):
    found = prompt_lookup_match(tokens, min_n, min_n + extra)
    if found is None:
        return
    n, end = found
    assert min_n <= n <= min_n + extra and end < len(tokens)
    assert tokens[end - n:end] == tokens[len(tokens) - n:]
    if n < min_n + extra:  # no longer n-gram had an earlier occurrence
        m = n + 1
        assert all(tokens[s:s + m] != tokens[len(tokens) - m:] for s in range(0, len(tokens) - m)) or m > len(tokens) - 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.lists(st.integers(0, 5), min_size=1, max_size=40),
       st.integers(0, 6), st.integers(1, 3), st.integers(0, 2))
def test_trace_replays_the_output(prompt, output, k, min_n, extra):
    t = lookup_trace(prompt, output, k, min_n, min_n + extra)
    assert [x for s in t.steps for x in s.emitted] == output  # lossless: the output is the target's
    for s in t.steps:
        assert len(s.draft) <= k and 0 <= s.accepted <= len(s.draft)
        assert list(s.draft[:s.accepted]) == output[s.position:s.position + s.accepted]
        assert len(s.emitted) == min(s.accepted + 1, len(output) - s.position)
        if s.accepted < len(s.draft) and s.position + s.accepted < len(output):
            assert s.draft[s.accepted] != output[s.position + s.accepted]  # the first rejection is a real mismatch
        seq = prompt + output[:s.position]
        assert list(s.draft) == _oracle_propose(seq, k, min_n, min_n + extra)
    assert t.output_tokens == t.accepted + t.n_steps - sum(
        1 for s in t.steps if s.position + s.accepted + 1 > len(output))  # the last step may lose its bonus
    assert 0 <= t.acceptance <= 1 and 1 <= t.tokens_per_step <= k + 1


def test_no_drafts_is_plain_decoding():
    t = lookup_trace([1, 2, 3], [4, 5, 6, 7], 0)
    assert t.n_steps == 4 and t.drafted == 0 and t.tokens_per_step == 1


def test_copy_task_accepts_everything_after_the_first_match():
    prompt = list(range(10, 40))
    t = lookup_trace(prompt + [99], prompt, 4, 1, 1)
    # first step: [99] has no earlier occurrence; then each step copies k tokens and adds one
    assert t.steps[0].draft == () and all(s.accepted == len(s.draft) for s in t.steps[1:-1])
    assert t.tokens_per_step > 4


def test_tokenizer_round_trips_and_is_deterministic():
    text = d.rename_request()[0] + d.CHAT_REPLY
    for mode in ("words", "chars"):
        tok = WordTokenizer(mode)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert WordTokenizer(mode).encode(text) == ids
    assert WordTokenizer("words").split("  x = a(b)\n") == [" ", " x", " =", " a", "(", "b", ")", "\n"]


def test_rename_request():
    prompt, reply = d.rename_request("total", "acc")
    assert "total" not in reply and reply.count("acc") == d.FUNCTION.count("total")
    assert "rename" in prompt.lower() and d.FUNCTION in prompt
    for bad in (("total", "total"), ("nope", "x"), ("total", "1x")):
        with pytest.raises(ValueError):
            d.rename_request(*bad)


def test_the_worked_example_numbers():
    tok = WordTokenizer("words")
    prompt, reply = d.rename_request()
    p, o = tok.encode(prompt), tok.encode(reply)
    cp, co = tok.encode(d.CHAT_PROMPT), tok.encode(d.CHAT_REPLY)
    code = {s: lookup_trace(p, o, 4, *s) for s in ((1, 1), (3, 3), (1, 3))}
    assert code[(1, 3)].tokens_per_step > code[(1, 1)].tokens_per_step > code[(3, 3)].tokens_per_step > 2
    chat = lookup_trace(cp, co, 4, 1, 3)
    assert chat.acceptance < 0.05 and chat.tokens_per_step < 1.05 and chat.proposal_rate > 0.2
    assert lookup_trace(cp, co, 4, 3, 3).drafted == 0


def test_cost_matches_speculative_step():
    dep = deployment("llama-3.1-8b", "h100-sxm")
    t = lookup_trace([1, 2, 3, 4, 5, 1, 2], [3, 4, 5, 9, 9], 3, 1, 2)
    c = lookup_cost(dep, t, batch=4, context=100)
    want = sum(speculative_step(dep, free_drafter(), len(s.draft), 0.0, 4, 100).step_s for s in t.steps)
    assert c.spec_s == pytest.approx(want)
    assert c.plain_s == pytest.approx(5 * speculative_step(dep, free_drafter(), 0, 0.0, 4, 100).plain_step_s)
    none = lookup_cost(dep, lookup_trace([1], [2, 3], 0), batch=4, context=100)
    assert none.speedup == pytest.approx(1.0)


@pytest.mark.parametrize("call", [
    lambda: prompt_lookup_propose([1, 2], -1),
    lambda: prompt_lookup_match([1, 2], 0, 2),
    lambda: prompt_lookup_match([1, 2], 3, 2),
    lambda: lookup_trace([1], [], 2),
    lambda: WordTokenizer("bytes"),
    lambda: WordTokenizer().decode([5]),
    lambda: lookup_cost(deployment("llama-3.1-8b", "h100-sxm"), "trace"),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


# ---- the EAGLE head ------------------------------------------------------------------------------


def test_eagle_head_params_match_the_published_70b_head():
    # SafeAILab/EAGLE README: the LLaMA2-Chat 70B head (same layer shape as Llama 3.1 70B) has 0.99B parameters
    assert d.eagle_head_params("llama-3.1-70b") == pytest.approx(0.99e9, rel=0.01)
    # by hand: q, o 8192^2; k, v 8192 x 1024; MLP 3 x 8192 x 28672; two norms; fc 2 x 8192^2
    by_hand = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192 + 2 * 8192**2
    assert d.eagle_head_params("llama-3.1-70b") == pytest.approx(by_hand, rel=1e-4)
    assert d.eagle_head_params("llama-3.1-70b", fc_inputs=3) - d.eagle_head_params("llama-3.1-70b") == \
        pytest.approx(8192**2, rel=1e-3)


def test_eagle_head_model_is_one_layer_of_the_target():
    from lib.registry.models import model

    t, h = model("llama-3.1-70b"), d.eagle_head_model("llama-3.1-70b")
    assert h.num_layers == 1 and h.hidden_size == t.hidden_size and h.vocab_size == t.vocab_size
    assert h.kv_bytes_per_token("bf16") * t.num_layers == t.kv_bytes_per_token("bf16")
    with pytest.raises(ValueError):
        d.eagle_head_model("mixtral-8x7b")


def test_eagle_head_drafter_prices_one_layer_with_the_step_model():
    from lib.decoding.speculative import model_drafter
    from lib.perf.step import decode_step

    target = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    head = d.eagle_head_drafter(target)
    assert head.kind == "head" and "EAGLE head" in head.name
    step = d.eagle_head_step(target, 8, 1024)
    assert head.token_s(8, 1024) == pytest.approx(step.total_s)
    # its weight floor is the head's matmul parameters plus the LM head, over the bandwidth
    h = d.eagle_head_model("llama-3.1-70b")
    floor = (d.eagle_head_params("llama-3.1-70b") + h.params_lm_head) * 2 / 4 / target.chip.memory_bandwidth
    assert step.buckets["weights"] == pytest.approx(floor, rel=0.01)
    plain = decode_step(target, 8, 1024).total_s
    eight_b = model_drafter(deployment("llama-3.1-8b", "h100-sxm", tp=4)).token_s(8, 1024)
    assert head.token_s(8, 1024) < eight_b < plain
    assert head.token_s(64, 1024) > head.token_s(1, 1024)  # its own KV and activations grow with the batch


def test_matching_acceptance_inverts_the_throughput():
    from lib.decoding.speculative import model_drafter, speculative_step

    target = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    draft = model_drafter(deployment("llama-3.1-8b", "h100-sxm", tp=4))
    goal = speculative_step(target, draft, 4, 0.7, 1, 512).tokens_per_s
    assert d.matching_acceptance(target, draft, 4, goal, 1, 512) == pytest.approx(0.7, abs=1e-6)
    assert d.matching_acceptance(target, draft, 4, 1e12, 1, 512) == float("inf")
    assert d.matching_acceptance(target, draft, 4, 1e-3, 1, 512) == 0.0
