"""Practice mode for the streaming detokenizer (I061): write it, graded against the whole-output decode.

The candidate writes a class with the interface of :class:`Skeleton`: built with a vocabulary
(``vocab[id]`` is a token's bytes), fed token ids one by one with ``push``, ended with ``finish``.
A case is a sequence of token byte strings (the grader builds the vocabulary from them). After
every push the grader checks:

* the text emitted so far is a prefix of the oracle, the whole output decoded at once
  (:func:`lib.fleet.detokenizer.decode_all`): nothing is emitted that a later token could change,
  so no replacement character for a character that is merely incomplete;
* whenever the tokens so far end with a complete, valid character, the text emitted so far is all of
  it, invalid bytes before it included (nothing held longer than needed: a stray byte cannot stall the
  stream). When they end in U+FFFD it may be held a step (it could be an unfinished character); for
  valid UTF-8 only that trailing U+FFFD may wait. Between boundaries a token's whole text may wait for
  the character it starts to complete;

and after ``finish`` that the emitted text equals the oracle. The defective drafts
(:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .detokenizer import REPLACEMENT, IncrementalDetokenizer, decode_all

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "random_pieces", "run", "variant"]

QUESTION = "Streaming detokenizer (I061)"


class Skeleton:
    """Token ids in, text out, one token at a time, never a replacement character for a split one."""

    def __init__(self, vocab: Sequence[bytes]):
        """``vocab[token_id]`` is the token's bytes (a byte-level vocabulary: a token may hold part of
        a UTF-8 character)."""
        raise NotImplementedError

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it makes final ('' if it only adds part of a character)."""
        raise NotImplementedError

    def finish(self) -> str:
        """The output ended: return the text still held (an incomplete last character as U+FFFD)."""
        raise NotImplementedError


_WINDOW = ("old = self._decode(self.ids[self.prefix_offset:self.read_offset])\n"
           "new = self._decode(self.ids[self.prefix_offset:])\n"
           "if len(new) > len(old) and not new.endswith(REPLACEMENT):")
_DRAFTS = {
    "each token decoded alone": (
        "every token's bytes are decoded on their own and sent: a character split over tokens arrives as "
        "replacement characters",
        {"push": [(_WINDOW, "old, new = '', self._decode(self.ids[-1:])\nif True:")]}),
    "no hold on an incomplete character": (
        "the window is decoded but a trailing replacement character is sent anyway, so the next token's text "
        "no longer extends what was sent",
        {"push": [("if len(new) > len(old) and not new.endswith(REPLACEMENT):", "if len(new) > len(old):")]}),
    "held text lost at the end": (
        "finish returns nothing: an output that ends inside a held window loses its last characters",
        {"finish": [("return new[len(old):]", 'return ""')]}),
    "invalid bytes ignored": (
        "the decoder drops invalid bytes (errors='ignore') instead of replacing them, so the stream and the "
        "whole-output decode disagree on a model's stray byte",
        {"_decode": [('return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")',
                      'return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="ignore")')]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return IncrementalDetokenizer
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(IncrementalDetokenizer, "Draft", f"Draft: {doc}.", **methods)


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def run(factory: Callable, pieces: Sequence[bytes]) -> None:
    """Stream ``pieces`` through ``factory(vocab)``; raise AssertionError at the first difference."""
    pieces = [bytes(p) for p in pieces]
    vocab = sorted(set(pieces))
    index = {p: i for i, p in enumerate(vocab)}
    want = decode_all(pieces)
    d = factory(vocab)
    sent = ""
    for k, p in enumerate(pieces):
        got = d.push(index[p])
        if not isinstance(got, str):
            raise AssertionError(f"push returned {got!r}, expected a str")
        sent += got
        if not want.startswith(sent):
            raise AssertionError(f"after token {k} ({p!r}) the client has {sent!r}, which is not a prefix of the "
                                 f"whole-output decode {want!r}")
        so_far = b"".join(pieces[:k + 1])
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        ready = dec.decode(so_far)  # what is final so far (an incomplete sequence waits)
        if dec.getstate()[0] == b"":  # the tokens so far end on a character boundary (or after invalid bytes)
            if ready.endswith(REPLACEMENT):  # held one step while it may be unfinished: only a real U+FFFD is checked
                ok = not _valid_utf8(so_far) or len(sent) >= len(ready.rstrip(REPLACEMENT))
            else:  # the last character is complete and valid: everything must be out
                ok = sent == ready
            if not ok:
                raise AssertionError(f"after token {k} ({p!r}) the client has {sent!r}; every complete character "
                                     f"received is {ready!r}: text held longer than needed")
    sent += d.finish()
    if sent != want:
        raise AssertionError(f"after finish the client has {sent!r}, the whole-output decode is {want!r}")


_ALPHABET = ("a", "b", " ", "é", "€", "😀", "🎉", "日", "本", "\n", "x")


def random_pieces(seed: int, n_chars: int = 12, invalid: bool = False) -> tuple[bytes, ...]:
    """A random text's UTF-8 bytes cut at random points into pieces of 1 to 4 bytes (stray invalid bytes
    or a truncated last character when ``invalid``)."""
    rng = np.random.default_rng(seed)
    data = "".join(_ALPHABET[int(i)] for i in rng.integers(0, len(_ALPHABET), n_chars)).encode("utf-8")
    if invalid:
        at = int(rng.integers(0, len(data) + 1))
        data = data[:at] + bytes([int(rng.choice([0x80, 0xBF, 0xFF, 0xE2]))]) + data[at:]
        if rng.random() < 0.5:
            data += "€".encode()[:2]
    out, i = [], 0
    while i < len(data):
        n = int(rng.integers(1, 5))
        out.append(data[i:i + n])
        i += n
    return tuple(out)


def cases() -> list[Case]:
    """Hand-made cases (each a classic failure), then random splits of random text."""
    euro, grin = "€".encode(), "😀".encode()
    return [
        Case("ASCII, one character per token", (b"He", b"llo", b" world")),
        Case("emoji split 3 + 1", (b"hi ", grin[:3], grin[3:], b"!")),
        Case("euro sign split 2 + 1", (b"5 ", euro[:2], euro[2:], b" each")),
        Case("a token that ends inside the next character", (b"cost", b" " + euro[:2], euro[2:])),
        Case("CJK, one byte per token", tuple(bytes([b]) for b in "日本".encode())),
        Case("output ends mid-character", (b"ok ", euro[:2])),
        Case("a stray invalid byte", (b"a", b"\x80", b"b")),
        Case("a real replacement character", ("\ufffd".encode(), b"x")),
        *[Case(f"random split {k}", random_pieces(k)) for k in range(10)],
        *[Case(f"random split with invalid bytes {k}", random_pieces(100 + k, invalid=True)) for k in range(6)],
    ]


def describe(pieces: Sequence[bytes]) -> str:
    return "  tokens (bytes): " + ", ".join(repr(bytes(p)) for p in pieces)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first failing
    token sequence, shrunk."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
