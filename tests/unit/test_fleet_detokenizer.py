"""The offset-window streaming detokenizer (lib.fleet.detokenizer) and its practice grader."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import detokenizer as dt
from lib.fleet import detokenizer_practice as dp


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points[:-1], points[1:], strict=True) if b > a]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20), st.lists(st.integers(0, 200), max_size=30))
def test_stream_equals_whole_decode_for_any_split(text, cuts):
    pieces = _split(text.encode(), cuts)
    vocab = sorted(set(pieces))
    deltas, tail = dt.stream([vocab.index(p) for p in pieces], vocab)
    assert "".join(deltas) + tail == text == dt.decode_all(pieces)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=24), st.lists(st.integers(0, 100), max_size=20))
def test_stream_equals_whole_decode_on_invalid_bytes(data, cuts):
    pieces = _split(data, cuts)
    vocab = sorted(set(pieces))
    deltas, tail = dt.stream([vocab.index(p) for p in pieces], vocab)
    assert "".join(deltas) + tail == dt.decode_all(pieces)
    sent = ""
    for d in deltas:  # every emitted prefix is final
        sent += d
        assert dt.decode_all(pieces).startswith(sent)


def test_emoji_and_euro_split_by_the_byte_vocabulary():
    tok = dt.byte_tokenizer()
    vocab = [t.encode("latin-1") for t in tok.vocab]
    grin = [vocab[i] for i in dt.encode_text("😀", tok)]
    euro = [vocab[i] for i in dt.encode_text("€", tok)]
    assert grin == [b"\xf0\x9f\x98", b"\x80"] and euro == [b"\xe2\x82", b"\xac"]
    assert dt.decode_each(grin) == ["\ufffd", "\ufffd"]  # the defect: two replacement characters
    assert dt.stream(dt.encode_text("a😀€", tok), vocab)[0] == ["a", "", "😀", "", "€"]
    assert dt.token_bytes(dt.encode_text("a😀€", tok), tok) == "a😀€".encode()


def test_window_work_is_linear_and_full_redecode_quadratic():
    tok = dt.byte_tokenizer()
    vocab = [t.encode("latin-1") for t in tok.vocab]
    ids = dt.encode_text("word " * 200, tok)
    d = dt.IncrementalDetokenizer(vocab)
    for i in ids:
        d.push(i)
    assert d.tokens_decoded <= 3 * len(ids)
    assert dt.full_redecode_work(len(ids)) == sum(range(1, len(ids) + 1))


def test_bad_inputs():
    with pytest.raises(ValueError, match="text"):
        dt.encode_text(b"x")
    with pytest.raises(ValueError, match="n_tokens"):
        dt.full_redecode_work(-1)
    with pytest.raises(ValueError, match="size"):
        dt.byte_tokenizer(10)


def test_grader_passes_reference_and_fails_every_draft():
    assert dp.check(dp.variant("reference")).passed
    for name in dp.VARIANTS:
        assert dp.check(dp.variant(name)).status == "failed", name
    assert dp.check(dp.Skeleton).status == "not implemented"
    with pytest.raises(ValueError, match="variant"):
        dp.variant("nope")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=16), st.lists(st.integers(0, 100), max_size=12))
def test_grader_accepts_the_reference_on_any_bytes(data, cuts):
    dp.run(dt.IncrementalDetokenizer, _split(data, cuts))  # raises on any difference


def test_grader_catches_a_decoder_that_stalls_after_a_stray_byte():
    class StrictPrefix:  # emits the longest strictly decodable prefix: one invalid byte holds the rest of the reply
        def __init__(self, vocab):
            self.vocab, self.buf = vocab, b""

        def push(self, token_id):
            self.buf += self.vocab[token_id]
            for cut in range(len(self.buf), -1, -1):
                try:
                    text = self.buf[:cut].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                self.buf = self.buf[cut:]
                return text
            return ""

        def finish(self):
            text, self.buf = self.buf.decode("utf-8", errors="replace"), b""
            return text

    report = dp.check(StrictPrefix)
    assert report.status == "failed" and "held longer than needed" in str(report)
