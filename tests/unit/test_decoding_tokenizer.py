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
