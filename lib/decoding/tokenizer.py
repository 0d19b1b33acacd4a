"""A deterministic toy tokenizer: a Llama-3-sized vocabulary built in code, and longest-match encoding.

No network and no downloaded vocabulary: :func:`toy_vocabulary` builds ``size`` distinct token
strings from a seeded generator, in the proportions a byte-level BPE vocabulary has (the 256
single bytes, JSON punctuation runs such as ``","`` and ``":"``, the numbers 0-999 as Llama 3
splits digits into groups of at most three, and pseudo-words with and without a leading space and
a capital, a few of them glued to a quote). Every token is a ``str`` whose characters are bytes
(code points below 256), so a grammar automaton can step on ``ord(c)``.

:class:`ToyTokenizer` encodes by greedy longest match (maximal munch) over that vocabulary; its
output is what this book calls the *canonical* tokenization of a text (a real BPE applies merges
in rank order instead, which usually but not always agrees with longest match; the toy only needs
a fixed rule that the model is assumed to have been trained on).

:class:`WordTokenizer` is the other toy: ids given to words (GPT-2's pre-tokenizer split) or
characters in order of first appearance, for pages that follow token sequences (prompt lookup),
not a vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from lib.inputs import integer

__all__ = ["JSON_PUNCTUATION", "SCHEMA_WORDS", "ToyTokenizer", "WordTokenizer", "toy_tokenizer", "toy_vocabulary"]

#: Runs of JSON punctuation a byte-level BPE learns as single tokens (compact and spaced forms).
JSON_PUNCTUATION = (
    '{"', '"}', '":', '":"', '","', '",', '"},', '"}}', '}}', '},', '},{', '":{', '":{"', '":[', '["', '"]', '"],',
    '":"",', '", "', '": "', '": ', '", ', ', "', '{ "', ' }', '{}', '[]', '[{', '}]', '":-', '":[{"', '"},{"',
    '":true', '":false', '":null', ': ', ', ', '{\n', '\n', '\n  ', '  ', '    ', '"\n', ' "', '="', '")', '");', "\\n",
    '\\"', '\\\\', '":0', '":1', '":"#', '",\n', '"\n}',
)

#: Words a JSON tool-call output uses; placed first so they are single tokens.
SCHEMA_WORDS = (
    "name", "age", "member", "city", "unit", "days", "arguments", "get", "weather", "get_weather", "celsius",
    "fahrenheit", "true", "false", "null", "type", "id", "value", "Paris", "London", "Tokyo", "New", "York", "Berlin",
    "Alice", "Bob", "Smith", "tool", "call", "query", "location", "forecast", "temperature",
)

_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "z",
           "bl", "br", "ch", "cr", "dr", "fr", "gr", "pr", "sh", "st", "th", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ea", "ou", "y")
_CODAS = ("", "", "", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "x")


@lru_cache(maxsize=6)
def toy_vocabulary(size: int = 128_256, seed: int = 0) -> tuple[str, ...]:
    """``size`` distinct token strings, deterministic in (size, seed).

    Order: the 256 single bytes, :data:`JSON_PUNCTUATION`, "0".."999", :data:`SCHEMA_WORDS` (four
    variants each: word, " word", Word, " Word"), then seeded pseudo-words (1 to 4 syllables) in the same
    four variants; one word in 50 also comes glued to a quote (``"word``, ``word"``, ``word",``,
    ``word":``), the quote-carrying tokens a real vocabulary learns from JSON and code. Tokens are at most
    16 characters. Raises ValueError for size < 2,000 (too small to hold the fixed parts).
    """
    size = integer("size", size, 2_000, 1_000_000, unit="tokens")
    seed = integer("seed", seed, 0)
    out: dict[str, None] = {}
    for b in range(256):
        out[chr(b)] = None
    for t in JSON_PUNCTUATION:
        out[t] = None
    for n in range(1000):
        out[str(n)] = None

    def add_word(w: str, glue_quote: bool) -> None:
        for v in (w, " " + w, w[:1].upper() + w[1:], " " + w[:1].upper() + w[1:]):
            if len(out) < size and len(v) <= 16:
                out[v] = None
        if glue_quote:
            for v in ('"' + w, w + '"', w + '",', w + '":'):
                if len(out) < size:
                    out[v] = None

    for w in SCHEMA_WORDS:
        add_word(w, True)
    rng = np.random.default_rng(seed)
    syllables = np.array([o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS], dtype=object)
    i = 0
    while len(out) < size:
        n = size // 2  # draw in bulk; duplicates are skipped
        ks = 1 + rng.choice(4, size=n, p=[0.25, 0.50, 0.22, 0.03])
        draws = rng.integers(0, len(syllables), size=(n, 4))
        # the words of the batch, built by numpy on Python strings: syllables 1..k of each draw
        words = syllables[draws[:, 0]]
        for j in range(1, 4):
            more = ks > j
            words[more] += syllables[draws[more, j]]
        for w in words.tolist():
            if len(out) >= size:
                break
            if len(w) > 15 or w in out:
                continue
            if len(out) + 8 <= size:  # room for every variant (a pseudo-word has at most 15 characters)
                cap = w[:1].upper() + w[1:]
                out[w] = out[" " + w] = out[cap] = out[" " + cap] = None
                if i % 50 == 0:
                    out['"' + w] = out[w + '"'] = out[w + '",'] = out[w + '":'] = None
            else:
                add_word(w, i % 50 == 0)
            i += 1
    return tuple(out)


class ToyTokenizer:
    """Greedy longest-match tokenizer over a vocabulary (see the module doc)."""

    def __init__(self, vocab: tuple[str, ...]):
        ids = dict(zip(vocab, range(len(vocab)), strict=True))
        if len(ids) != len(vocab):
            raise ValueError("vocab must hold distinct strings")
        missing = [chr(b) for b in range(256) if chr(b) not in ids]
        if missing:
            raise ValueError(f"vocab must contain all 256 single bytes (every text must be encodable); missing {len(missing)}")
        self.vocab = vocab
        self.ids = ids
        self.max_len = max(map(len, vocab))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` by longest match from the left (the canonical tokenization)."""
        if any(ord(c) > 255 for c in text):
            raise ValueError("text must be bytes-as-characters (code points < 256): encode it as UTF-8 and decode latin-1")
        out, i, n = [], 0, len(text)
        while i < n:
            for L in range(min(self.max_len, n - i), 0, -1):
                t = self.ids.get(text[i:i + L])
                if t is not None:
                    out.append(t)
                    i += L
                    break
        return out

    def decode(self, ids) -> str:
        """The text of a list of token ids."""
        return "".join(self.vocab[i] for i in ids)

    def pieces(self, ids) -> list[str]:
        """The token strings of a list of ids."""
        return [self.vocab[i] for i in ids]


@lru_cache(maxsize=6)
def toy_tokenizer(size: int = 128_256, seed: int = 0) -> ToyTokenizer:
    """The :class:`ToyTokenizer` over :func:`toy_vocabulary` (size, seed), cached."""
    return ToyTokenizer(toy_vocabulary(size, seed))


# ---- a word tokenizer (prompt lookup) -----------------------------------------------------------

_WORDS = re.compile(r" ?\w+| ?[^\w\s]+|\s+(?!\S)|\s+")  # GPT-2's split, without its contractions


class WordTokenizer:
    """Text <-> token ids. ``mode="words"``: a word with its leading space, a run of punctuation,
    or whitespace (GPT-2's pre-tokenizer split); ``mode="chars"``: one token per character. Ids are
    given in order of first appearance, so the same texts always get the same ids; ``decode``
    inverts ``encode`` exactly."""

    def __init__(self, mode: str = "words"):
        if mode not in ("words", "chars"):
            raise ValueError(f"mode must be 'words' or 'chars'; got {mode!r}")
        self.mode = mode
        self.vocab: dict[str, int] = {}
        self.pieces: list[str] = []

    def split(self, text: str) -> list[str]:
        """The pieces of ``text`` (their concatenation is ``text``)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__}")
        return list(text) if self.mode == "chars" else _WORDS.findall(text)

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in self.split(text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return "".join(self.pieces[i] for i in ids)
        except (IndexError, TypeError):
            raise ValueError(f"ids must be token ids below {len(self.pieces)}") from None
