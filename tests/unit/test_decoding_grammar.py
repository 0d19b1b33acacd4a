"""lib.decoding.grammar: the schema automaton against a JSON oracle, masks against brute force, XGrammar's split
against the naive mask, work counts against explicit walks and an explicit trie."""

import json
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import grammar as g
from lib.decoding.tokenizer import toy_tokenizer

TOK = toy_tokenizer(3_000)
TABLE = g.token_table(TOK.vocab)


def _valid(obj, schema) -> bool:
    """Oracle: obj (from json.loads) matches the fixed schema (keys in order, types)."""
    if isinstance(schema, dict):
        return isinstance(obj, dict) and list(obj) == list(schema) and all(_valid(obj[k], s) for k, s in schema.items())
    if schema == "string":
        return isinstance(obj, str)
    if schema == "integer":
        return isinstance(obj, int) and not isinstance(obj, bool)
    if schema == "boolean":
        return isinstance(obj, bool)
    if schema[0] == "enum":
        return obj in schema[1]
    return obj == schema[1]


def _oracle_accepts(text: str, schema) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    compact = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return _valid(obj, schema) and compact == text


def _values(schema):
    if isinstance(schema, dict):
        keys = list(schema)
        return st.tuples(*(_values(v) for v in schema.values())).map(lambda vals: dict(zip(keys, vals, strict=True)))
    if schema == "string":
        return st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
    if schema == "integer":
        return st.integers(-10**6, 10**6)
    if schema == "boolean":
        return st.booleans()
    if schema[0] == "enum":
        return st.sampled_from(schema[1])
    return st.just(schema[1])


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
def test_example_document_is_accepted(name):
    doc = g.example_document(g.SCHEMAS[name])
    assert g.schema_dfa(name).accepts(doc) and _oracle_accepts(doc, g.SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_dfa_accepts_exactly_the_valid_compact_documents(name, data):
    schema = g.SCHEMAS[name]
    obj = data.draw(_values(schema))
    text = json.dumps(obj, separators=(",", ":"))
    dfa = g.schema_dfa(name)
    assert dfa.accepts(text)
    # corrupt it: delete, insert or replace one character; the DFA agrees with the oracle
    i = data.draw(st.integers(0, len(text) - 1))
    ch = data.draw(st.sampled_from(list('{}[]",:0123456789-abcdefgilnrstuy\\ ')))
    for bad in (text[:i] + text[i + 1:], text[:i] + ch + text[i:], text[:i] + ch + text[i + 1:]):
        assert dfa.accepts(bad) == _oracle_accepts(bad, schema), bad


def test_compile_refuses_bad_schemas():
    with pytest.raises(ValueError, match="type must be"):
        g.compile_schema({"a": "float"})
    with pytest.raises(ValueError, match="non-empty dict"):
        g.compile_schema({})
    with pytest.raises(ValueError, match="options must be non-empty"):
        g.compile_schema({"a": ("enum", ())})
    assert g.compile_schema({"a": ("enum", ("ab", "abc"))}).accepts('{"a":"abc"}')  # quoted: no prefix clash
    with pytest.raises(ValueError, match="keys"):
        g.compile_schema({'a"b': "string"})
    with pytest.raises(ValueError, match="schema must be one of"):
        g.schema_dfa("nope")


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
def test_naive_mask_and_work_against_brute_force(name):
    dfa = g.schema_dfa(name)
    for q in range(dfa.states):
        mask = g.naive_mask(dfa, TABLE, q)
        work = g.mask_work(dfa, TABLE, q)
        looked, allowed = 0, []
        for t in TOK.vocab:
            s, used = dfa.walk(q, t)
            looked += used + (s < 0)
            allowed.append(s >= 0)
        assert (mask == np.array(allowed)).all()
        assert work.transitions == looked and work.allowed == sum(allowed)
        # trie oracle: distinct prefixes looked at = nodes of an explicit trie visited
        prefixes = set()
        for t in TOK.vocab:
            s, used = dfa.walk(q, t)
            for L in range(1, used + (s < 0) + 1):
                prefixes.add(t[:L])
        assert work.trie_transitions == len(prefixes)


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
@pytest.mark.parametrize("expand", [True, False])
def test_precompiled_mask_equals_naive(name, expand):
    dfa = g.schema_dfa(name)
    for q in range(dfa.states):
        cl = g.classify_tokens(dfa, TABLE, q, expand=expand)
        assert not (cl.accepted & cl.rejected).any() and not (cl.accepted & cl.dependent).any()
        assert (cl.accepted | cl.rejected | cl.dependent).all()
        mask, tokenwise, trie = g.precompiled_mask(dfa, TABLE, cl)
        assert (mask == g.naive_mask(dfa, TABLE, q)).all()
        assert trie <= tokenwise
        assert (cl.accepted <= mask).all() and not (cl.rejected & mask).any()


def _rule_local_walk(dfa, q, t, expand):
    """Oracle: (end, consumed, left) of one token walked from q by plain Python, stopping at the rule's boundary."""
    s, home = q, dfa.rule[q]
    for i, ch in enumerate(t):
        nq = int(dfa.table[s, ord(ch)])
        if nq >= 0 and dfa.rule[nq] != home:
            return -1, i, True
        if nq < 0:
            return -1, i, bool(not expand and dfa.rule_end[s])
        s = nq
    return s, len(t), False


def _distinct_prefixes(dfa, q, tokens) -> int:
    """Oracle: trie nodes a walk of ``tokens`` from q visits (every prefix looked at, once)."""
    seen = set()
    for t in tokens:
        s, used = dfa.walk(q, t)
        seen.update(t[:L] for L in range(1, used + (s < 0) + 1))
    return len(seen)


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
@pytest.mark.parametrize("expand", [True, False])
def test_classes_and_runtime_counts_against_python_walks(name, expand):
    dfa = g.schema_dfa(name)
    for q in range(dfa.states):
        oracle = [_rule_local_walk(dfa, q, t, expand) for t in TOK.vocab]
        end, consumed, left = g.walk_tokens(dfa, TABLE, q, rule_local=True, expand=expand)
        assert [(int(a), int(b), bool(c)) for a, b, c in zip(end, consumed, left, strict=True)] == oracle
        cl = g.classify_tokens(dfa, TABLE, q, expand=expand)
        assert (cl.dependent == np.array([x[2] for x in oracle])).all()
        assert (cl.accepted == np.array([x[0] >= 0 for x in oracle])).all()
        dep = [t for t, x in zip(TOK.vocab, oracle, strict=True) if x[2]]
        walks = [dfa.walk(q, t) for t in dep]
        _, tokenwise, trie = g.precompiled_mask(dfa, TABLE, cl)
        assert tokenwise == sum(used + (s < 0) for s, used in walks)
        assert trie == _distinct_prefixes(dfa, q, dep)


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
def test_schema_costs_columns_are_the_per_state_functions(name):
    c = g.schema_costs(name, 3_000)
    for q in range(c.states):
        w = g.mask_work(c.dfa, TABLE, q)
        assert (c.transitions[q], c.trie[q], c.allowed[q]) == (w.transitions, w.trie_transitions, w.allowed)
        cl = g.classify_tokens(c.dfa, TABLE, q)
        assert c.dependent[q] == cl.n_dependent
        assert c.dependent_unexpanded[q] == g.classify_tokens(c.dfa, TABLE, q, expand=False).n_dependent
        assert (c.runtime[q], c.runtime_trie[q]) == g.precompiled_mask(c.dfa, TABLE, cl)[1:]


def test_document_steps_follow_the_trace():
    c = g.schema_costs("tool_call", 3_000)
    d = g.document_steps("tool_call", 3_000)
    assert json.loads(json.dumps(d)) == d  # plain JSON values, what the derived store keeps
    assert "".join(d["pieces"]) == c.document == d["document"] and len(d["pieces"]) == len(c.tokens)
    assert d["trace"] == list(c.trace) and d["states"] == c.dfa.states
    for k in ("transitions", "trie", "runtime_trie"):
        assert d[k] == [int(getattr(c, k)[q]) for q in c.trace]
    w = d["worst_state"]
    assert d["worst_transitions"] == max(c.transitions) == c.transitions[w]
    assert (d["worst_dependent"], d["worst_runtime_trie"]) == (c.dependent[w], c.runtime_trie[w])


def test_token_table_order_and_prefixes_against_python():
    # NULs inside tokens, a token that is a prefix of others, a duplicate, bytes above 127, unsorted input
    tokens = ("zz", "a\0", "ab", "a", "a\0\0", "\0", "a\0b", "\xff\xfe", "zz", "b" * 20, "\0\0", "\x7f")
    t = g.token_table(tokens)
    assert t.order.tolist() == sorted(range(len(tokens)), key=tokens.__getitem__)
    s = [tokens[i] for i in t.order]
    common = [0] + [len(os.path.commonprefix([a, b])) for a, b in zip(s, s[1:], strict=False)]
    assert t.lcp.tolist() == common
    assert [bytes(r[:n]).decode("latin-1") for r, n in zip(t.bytes_, t.lengths, strict=True)] == list(tokens)
    firsts = [x[0] for x in s]
    assert all(firsts[t.first_start[b]:t.first_start[b + 1]] == [chr(b)] * firsts.count(chr(b)) for b in range(256))
    with pytest.raises(ValueError, match="code point"):
        g.token_table(("a", "\u0100"))
    with pytest.raises(ValueError, match="non-empty"):
        g.token_table(("a", ""))

def test_expansion_only_shrinks_the_dependent_set():
    dfa = g.schema_dfa("person")
    for q in range(dfa.states):
        a = g.classify_tokens(dfa, TABLE, q).dependent
        b = g.classify_tokens(dfa, TABLE, q, expand=False).dependent
        assert (a <= b).all()
    end = next(q for q in range(dfa.states) if dfa.rule_end[q])
    assert g.classify_tokens(dfa, TABLE, end, expand=False).n_dependent > 10 * g.classify_tokens(dfa, TABLE, end).n_dependent


def test_string_state_dependents_are_the_quote_tokens():
    c = g.schema_costs("person", 3_000)
    body = re.compile(r'^(?:[^"\\\x00-\x1f\x7f]|\\["\\/bfnrt])*"')
    assert c.rule[c.worst_state].endswith("string")
    assert c.dependent[c.worst_state] == sum(1 for t in TOK.vocab if body.match(t))


def test_state_trace_and_forced_runs():
    dfa = g.schema_dfa("person")
    ids = TOK.encode('{"name":"Bo","age":-12,"member":false}')
    trace = g.state_trace(dfa, TABLE, ids)
    assert trace[0] == 0 and len(trace) == len(ids)
    with pytest.raises(ValueError, match="not allowed"):
        g.state_trace(dfa, TABLE, TOK.encode('{"x'))
    runs = dict(g.forced_runs(dfa))
    assert runs[0] == '{"name":"'
    assert ',"age":' in runs.values()


def test_bitmask_size_and_packing():
    assert g.bitmask_bytes(128_256) == 16_032  # XGrammar: int32[ceil(V / 32)]
    assert g.bitmask_bytes(32_000) == 4_000
    assert g.bitmask_bytes(33, word_bits=8) == 5
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError, match="vocab_size"):
            g.bitmask_bytes(bad)
    with pytest.raises(ValueError, match="word_bits"):
        g.bitmask_bytes(100, word_bits=12)
    rng = np.random.default_rng(0)
    m = rng.random(1000) < 0.3
    words = g.pack_bitmask(m)
    assert words.dtype == np.int32 and words.size == 32
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:1000].astype(bool)
    assert (bits == m).all()
    assert all(bool(words[t // 32] >> (t % 32) & 1) == m[t] for t in range(1000))


def test_mask_time():
    assert g.mask_time_s(1_000_000, 128_256, 10, 10) == pytest.approx(1e-2 + 16_032 / 1e10)
    assert g.mask_time_s(0, 128_256) > 0
    with pytest.raises(ValueError, match="transitions"):
        g.mask_time_s(-1, 100)
    with pytest.raises(ValueError, match="transition_ns"):
        g.mask_time_s(1, 100, 0)


def test_schema_costs_consistent():
    c = g.schema_costs("tool_call", 3_000)
    assert c.states == c.dfa.states and len(c.trace) == len(c.tokens)
    assert (c.trie <= c.transitions).all() and (c.runtime_trie <= c.runtime).all()
    assert (c.dependent <= c.dependent_unexpanded).all()
    assert (c.transitions >= c.vocab_size).all()  # every token is looked at once


def test_explorer_values():
    from lib.book.widgets import render

    v = render("decoding.grammar_mask", schema="person", model="llama-2-7b", transition_ns=10.0)
    assert v.values["worst_naive_s"] > 50 * v.values["worst_pre_s"]


# ---- I062: the mask against the forward pass ------------------------------------------------------------------


def _simulate(forward_s, host_s, jobs, threads, overlap, copy_s):
    """Oracle: a heap of thread-free times takes the mask jobs; sampling waits for the forward and the masks."""
    import heapq

    free = [host_s] * threads
    heapq.heapify(free)
    for job in jobs:
        heapq.heappush(free, heapq.heappop(free) + job)
    done = max(free)
    return max(host_s + forward_s, done) + copy_s if overlap else done + copy_s + forward_s


@settings(max_examples=200, deadline=None)
@given(fwd=st.floats(1e-4, 5e-2), host=st.floats(0, 1e-3), m=st.floats(0, 1e-3), b=st.integers(1, 64),
       threads=st.sampled_from([1, 2, 4, 8]), positions=st.integers(1, 5))
def test_masked_step_against_event_simulation(fwd, host, m, b, threads, positions):
    copy = g.masked_step(fwd, host, m, b, "serial", positions=positions).copy_s
    for placement in g.PLACEMENTS:
        t = threads if placement == "pool" else 1
        r = g.masked_step(fwd, host, m, b, placement, t, positions, efficiency=1.0)
        sim = _simulate(fwd, host, [positions * m] * b, t, placement != "serial", copy)
        # the closed form spreads the work evenly; the simulation rounds to whole requests per thread
        assert r.step_s <= sim + 1e-15
        assert sim - r.step_s <= positions * m + 1e-15
        assert r.step_s >= host + fwd and r.exposed_s >= r.copy_s - 1e-15
    assert g.masked_step(fwd, host, m, b, "serial").step_s >= g.masked_step(fwd, host, m, b, "scheduler").step_s - 1e-15


def test_masked_step_validates():
    with pytest.raises(ValueError, match="placement"):
        g.masked_step(1e-3, 0, 1e-6, 4, "gpu")
    with pytest.raises(ValueError, match="threads must be 1"):
        g.masked_step(1e-3, 0, 1e-6, 4, "scheduler", threads=4)
    with pytest.raises(ValueError, match="batch"):
        g.masked_step(1e-3, 0, 1e-6, 0)
    with pytest.raises(ValueError, match="efficiency"):
        g.masked_step(1e-3, 0, 1e-6, 4, "pool", 2, efficiency=0)


def test_largest_hidden_batch_is_the_boundary():
    from lib.perf.deployment import deployment
    from lib.perf.step import decode_step
    from lib.perf.throughput import kv_batch_ceiling

    dep = deployment("llama-3.1-8b", "h100-sxm")
    top = int(kv_batch_ceiling(dep, 1024))
    for m in (1e-6, 5e-5, 2e-4, 2e-3, 1.0):
        b = g.largest_hidden_batch(dep, 1024, m)

        def fits(n, m=m):
            s = decode_step(dep, n, 1024)
            return n * m <= s.total_s - s.host_s

        if b == 0:
            assert not fits(1)
        else:
            assert fits(b)
            assert b == top or not fits(b + 1)


def test_masked_speculative_step():
    from lib.decoding.speculative import model_drafter, speculative_step
    from lib.perf.deployment import deployment

    dep, dd = deployment("llama-3.1-8b", "h100-sxm"), deployment("llama-3.2-1b", "h100-sxm")
    r = g.masked_speculative_step(dep, dd, 3, 0.7, 32, 1024, 0.0)
    plain = speculative_step(dep, model_drafter(dd), 3, 0.7, 32, 1024)
    assert r.plain_s == pytest.approx(plain.step_s)
    assert len(r.draft) == 3 and r.verify.mask_s == 0
    assert r.exposed_s == pytest.approx(sum(d.copy_s for d in r.draft) + r.verify.copy_s)
    big = g.masked_speculative_step(dep, dd, 3, 0.7, 32, 1024, 1e-3)
    free = g.masked_speculative_step(dep, dd, 3, 0.7, 32, 1024, 1e-3, constrain_drafts=False)
    assert big.verify.mask_s == pytest.approx(4 * 32 * 1e-3)
    assert big.step_s > free.step_s > free.plain_s


def test_overlap_explorer():
    from lib.book.widgets import render

    v = render("decoding.mask_overlap", model="llama-3.2-1b", gpu="h100-sxm", schema="person", mask="naive", threads=4)
    assert v.values["serial_256"] > 0.1  # 256 naive masks on one thread: far beyond a 1B forward


# ---- I052: jump-forward and the canonical tokenization ---------------------------------------------------------


def test_forced_text():
    dfa = g.schema_dfa("tool_call")
    assert g.forced_text(dfa, 0) == '{"name":"get_weather","arguments":{"city":"'
    body = g.schema_costs("tool_call", 3_000).worst_state
    assert g.forced_text(dfa, body) == ""
    with pytest.raises(ValueError, match="state"):
        g.forced_text(dfa, dfa.states)


@pytest.mark.parametrize("name", sorted(g.SCHEMAS))
def test_jump_forward_spells_the_document_and_healing_restores_the_canonical_split(name):
    tok = toy_tokenizer()
    dfa = g.schema_dfa(name)
    doc = g.example_document(g.SCHEMAS[name])
    plain = g.jump_forward(dfa, tok, doc)
    healed = g.jump_forward(dfa, tok, doc, heal=True)
    canonical = tok.encode(doc)
    for r in (plain, healed):
        assert tok.decode([t for t, _ in r.pieces]) == doc
        assert r.model_steps == sum(not f for _, f in r.pieces) <= len(canonical)
        assert r.forced_tokens == sum(f for _, f in r.pieces)
    assert [t for t, _ in healed.pieces] == canonical and healed.off_canonical == 0
    assert plain.model_steps <= healed.model_steps


def test_off_canonical_count_by_spans():
    tok = toy_tokenizer()
    dfa = g.schema_dfa("tool_call")
    r = g.jump_forward(dfa, tok, g.example_document(g.SCHEMAS["tool_call"]))

    def spans(ids):
        out, a = [], 0
        for t in ids:
            out.append((a, a + len(tok.vocab[t])))
            a += len(tok.vocab[t])
        return out

    canon = set(spans(tok.encode(g.example_document(g.SCHEMAS["tool_call"]))))
    assert r.off_canonical == sum(s not in canon for s in spans([t for t, _ in r.pieces])) > 0


def test_jump_forward_refuses_invalid_documents():
    with pytest.raises(ValueError, match="accepted"):
        g.jump_forward(g.schema_dfa("person"), toy_tokenizer(3_000), '{"name":1}')


def test_production_explorer():
    from lib.book.widgets import render

    v = render("decoding.structured_output", schema="tool_call", model="llama-3.1-8b", gpu="h100-sxm", batch=64)
    assert v.values["off_canonical"] > 0 and 0.01 < v.values["compile_s"] < 1.0


def test_rule_phrase_names_every_rule_and_refuses_junk():
    for name in g.SCHEMAS:
        for r in g.schema_dfa(name).rules:
            assert g.rule_phrase(r)
    assert g.rule_phrase("city: string") == "inside the city string"
    assert g.rule_phrase("unit: enum") == "inside the unit enum"
    # the worst state is the string's body when the schema has a string, and not otherwise
    assert "string" in g.rule_phrase(g.schema_costs("tool_call").rule[g.schema_costs("tool_call").worst_state])
    assert "string" not in g.rule_phrase(g.schema_costs("enum_only").rule[g.schema_costs("enum_only").worst_state])
    for bad in ("", "city", "city: float", None):
        with pytest.raises(ValueError):
            g.rule_phrase(bad)
