"""lib.decoding.tokenizer: the toy vocabulary is deterministic and complete; encoding is longest match."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding.tokenizer import (
    JSON_PUNCTUATION,
    SCHEMA_WORDS,
    ToyTokenizer,
    toy_tokenizer,
    toy_vocabulary,
)


def test_vocabulary_is_deterministic_distinct_and_sized():
    v = toy_vocabulary(5_000, 3)
    assert v == toy_vocabulary(5_000, 3)
    assert len(v) == len(set(v)) == 5_000
    assert v != toy_vocabulary(5_000, 4)
    assert all(chr(b) in v for b in range(256))
    assert all(t in v for t in JSON_PUNCTUATION)
    assert all(w in v for w in SCHEMA_WORDS)
    assert max(map(len, v)) <= 16


def _reference_vocabulary(size, seed):
    """Oracle: the vocabulary's rule written as a plain loop, one word and one variant at a time."""
    import numpy as np

    from lib.decoding import tokenizer as T

    out = {}
    for t in [chr(b) for b in range(256)] + list(JSON_PUNCTUATION) + [str(n) for n in range(1000)]:
        out[t] = None

    def add(w, glue):
        for v in (w, " " + w, w[:1].upper() + w[1:], " " + w[:1].upper() + w[1:]):
            if len(out) < size and len(v) <= 16:
                out[v] = None
        for v in ('"' + w, w + '"', w + '",', w + '":') if glue else ():
            if len(out) < size:
                out[v] = None

    for w in SCHEMA_WORDS:
        add(w, True)
    rng = np.random.default_rng(seed)
    syl = [o + v + c for o in T._ONSETS for v in T._VOWELS for c in T._CODAS]
    i = 0
    while len(out) < size:
        n = size // 2
        ks = (1 + rng.choice(4, size=n, p=[0.25, 0.50, 0.22, 0.03])).tolist()
        draws = rng.integers(0, len(syl), size=(n, 4)).tolist()
        for k, d in zip(ks, draws, strict=True):
            if len(out) >= size:
                break
            w = "".join(syl[x] for x in d[:k])
            if len(w) > 15 or w in out:
                continue
            add(w, i % 50 == 0)
            i += 1
    return tuple(out)


@pytest.mark.parametrize(("size", "seed"), [(2_000, 0), (2_003, 5), (5_000, 3), (32_000, 0), (50_257, 1)])
def test_vocabulary_is_the_reference_rule(size, seed):
    assert toy_vocabulary(size, seed) == _reference_vocabulary(size, seed)

def test_llama3_sized_vocabulary():
    v = toy_vocabulary()
    assert len(v) == 128_256 == len(set(v))
    assert 6.0 < sum(map(len, v)) / len(v) < 10.0  # bytes per token, BPE-like


@pytest.mark.parametrize("size", [0, 1999, "x", 10**7])
def test_vocabulary_refuses_bad_sizes(size):
    with pytest.raises(ValueError, match="size"):
        toy_vocabulary(size)


def test_tokenizer_refuses_incomplete_vocab():
    with pytest.raises(ValueError, match="256 single bytes"):
        ToyTokenizer(("a", "b"))
    with pytest.raises(ValueError, match="distinct"):
        ToyTokenizer(tuple(chr(b) for b in range(256)) + ("a",))


def test_encode_refuses_wide_characters():
    with pytest.raises(ValueError, match="code points"):
        toy_tokenizer(5_000).encode("é€")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=60))
def test_round_trip_and_longest_match(text):
    tok = toy_tokenizer(5_000)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    i = 0
    for t in ids:  # each token is the longest vocabulary entry that starts at its position (oracle: brute force)
        piece = tok.vocab[t]
        longest = max(L for L in range(1, len(text) - i + 1) if text[i:i + L] in tok.ids)
        assert len(piece) == longest
        i += len(piece)


def test_json_pieces_merge():
    tok = toy_tokenizer(5_000)
    assert tok.pieces(tok.encode('{"name":"x"}'))[0] == '{"'
    assert '","' in tok.pieces(tok.encode('"a","b"'))
