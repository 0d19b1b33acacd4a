"""Streaming detokenization over a byte-level vocabulary: the offset-window decoder (I061).

A byte-level BPE vocabulary (GPT-2, Llama 3) has tokens that are byte strings, and merges inside
multi-byte UTF-8 characters are common, so one character can arrive split over several tokens:
the euro sign (3 bytes, ``E2 82 AC``) as ``E2 82`` + ``AC``, an emoji (4 bytes) as two pairs.
Decoding each token on its own turns every fragment into U+FFFD replacement characters.

:func:`byte_tokenizer` builds the vocabulary this book uses for it: the toy Llama-3-style
vocabulary of :mod:`lib.decoding.tokenizer` (all 256 single bytes plus words; its tokens are
bytes-as-characters) and :data:`UTF8_PIECES`, a few byte pairs that split common multi-byte
characters the way real byte-level merges do. Encoding is its longest match (deterministic).

:class:`IncrementalDetokenizer` is the offset-window decoder of Hugging Face's
text-generation-inference and vLLM. It keeps two offsets into the token list, ``prefix_offset``
and ``read_offset``; after each new token it decodes the window ``ids[prefix_offset:]`` and the
already-emitted part ``ids[prefix_offset:read_offset]``::

    new = decode(ids[prefix:]);  old = decode(ids[prefix:read])
    if len(new) > len(old) and not new.endswith(U+FFFD):  emit new[len(old):]; prefix, read = read, len(ids)
    else:                                                 emit nothing (hold the bytes)

Decoding uses UTF-8 with ``errors="replace"``: an incomplete character at the end of the window
decodes to U+FFFD, which is what "hold" detects. :meth:`IncrementalDetokenizer.finish` emits what
is still held when the output ends (a truncated character there stays U+FFFD, as in the full
decode). The oracle is :func:`decode_all` of the whole output at once: the concatenation of every
emitted delta equals it, for any split of the bytes into tokens. Work: each step decodes the
window only (a few tokens), where re-decoding the whole output each step costs ``n(n+1)/2`` token
decodes over ``n`` tokens; ``tokens_decoded`` counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from lib.inputs import integer

__all__ = ["REPLACEMENT", "UTF8_PIECES", "IncrementalDetokenizer", "byte_tokenizer", "decode_all", "decode_each",
           "encode_text", "full_redecode_work", "stream", "token_bytes"]

REPLACEMENT = "\ufffd"

#: Byte pieces (as latin-1 strings) a byte-level BPE merges inside multi-byte UTF-8 characters:
#: the euro sign's first two bytes, the first three bytes of the emoji U+1F600-U+1F63F (tiktoken's
#: cl100k vocabulary splits an emoji such as U+1F600 the same way, 3 bytes + 1), the emoji block's
#: lead pair, the lead pair of CJK ideographs in U+4E00-U+4FFF, and " " + the euro's lead pair (a
#: piece that starts with a whole character and ends inside the next one).
UTF8_PIECES = ("\xe2\x82", "\xf0\x9f\x98", "\xf0\x9f", "\xe4\xb8", " \xe2\x82")


@lru_cache(maxsize=4)
def byte_tokenizer(size: int = 4096, seed: int = 0):
    """The toy byte-level tokenizer: :func:`lib.decoding.tokenizer.toy_vocabulary` (``size``, ``seed``)
    plus :data:`UTF8_PIECES` (ids after the toy ones). Cached."""
    from lib.decoding.tokenizer import ToyTokenizer, toy_vocabulary

    size = integer("size", size, 2_000, 200_000, unit="tokens")
    base = toy_vocabulary(size, integer("seed", seed, 0))
    return ToyTokenizer(base + tuple(p for p in UTF8_PIECES if p not in set(base)))


def encode_text(text: str, tokenizer=None) -> list[int]:
    """Token ids of ``text`` (any Unicode): its UTF-8 bytes, longest match over the byte vocabulary."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    tok = tokenizer or byte_tokenizer()
    return tok.encode(text.encode("utf-8").decode("latin-1"))


def token_bytes(ids: Sequence[int], tokenizer=None) -> bytes:
    """The bytes of a list of token ids."""
    tok = tokenizer or byte_tokenizer()
    return tok.decode(ids).encode("latin-1")


def decode_all(pieces: Sequence[bytes]) -> str:
    """The oracle: the whole output's bytes decoded at once (UTF-8, invalid bytes -> U+FFFD)."""
    return b"".join(pieces).decode("utf-8", errors="replace")


def decode_each(pieces: Sequence[bytes]) -> list[str]:
    """The defect: each token's bytes decoded on its own (what a naive streamer sends)."""
    return [p.decode("utf-8", errors="replace") for p in pieces]


class IncrementalDetokenizer:
    """The offset-window streaming decoder (module docstring). ``vocab[id]`` is a token's bytes."""

    def __init__(self, vocab: Sequence[bytes]):
        self.vocab = vocab
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.tokens_decoded = 0  # tokens passed to the decoder, for the cost comparison

    def _decode(self, ids: Sequence[int]) -> str:
        self.tokens_decoded += len(ids)
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ('' while a character is still incomplete)."""
        self.ids.append(token_id)
        old = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new = self._decode(self.ids[self.prefix_offset:])
        if len(new) > len(old) and not new.endswith(REPLACEMENT):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new[len(old):]
        return ""

    def finish(self) -> str:
        """The output has ended: return whatever is still held (an unfinished character as U+FFFD)."""
        old = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new[len(old):]


def stream(ids: Sequence[int], vocab: Sequence[bytes], detokenizer=IncrementalDetokenizer) -> tuple[list[str], str]:
    """Feed ``ids`` one at a time: (the delta each push returned, what finish returned)."""
    d = detokenizer(vocab)
    deltas = [d.push(i) for i in ids]
    return deltas, d.finish()


def full_redecode_work(n_tokens: int) -> int:
    """Token decodes when every step re-decodes the whole output so far: n(n+1)/2."""
    n = integer("n_tokens", n_tokens, 0)
    return n * (n + 1) // 2
