"""Stop strings on a token stream: hold back exactly what could still become a stop (I093, I061).

A stop string is matched on text, but text arrives as tokens: a stop such as ``"\\nUser:"`` can
come as three tokens, and a character such as the euro sign as two (:mod:`lib.fleet.detokenizer`).
The client must never see a byte of the stop, nor a replacement character, and should see every
other character as soon as nothing can take it back. :class:`StopStringStreamer` does that:

1. bytes to text incrementally with :class:`~lib.fleet.detokenizer.IncrementalDetokenizer`
   (only complete characters reach the matcher);
2. append the new text to ``pending`` (the text not sent yet) and look for a complete stop in it
   (:func:`first_stop`); a stop cannot start in text already sent, because that text was sent only
   when no suffix of it could begin a stop;
3. no stop: send all of ``pending`` except its longest suffix that is a proper prefix of some stop
   string (:func:`holdback`), which is exactly the text that could still become a stop;
4. a stop: send the text before it, never the stop, and report ``stopped`` (the engine cancels the
   request); at the end of the output without a stop, :meth:`StopStringStreamer.finish` releases the
   held text.

Which stop wins when several match: the one that is complete first while reading left to right (the
smallest end index), and among those ending at the same character the longest; the output is the
text before it. The rule does not depend on where the token boundaries fall, which is what lets the
whole-output :func:`reference_output` serve as the oracle for every split.
"""

from __future__ import annotations

from collections.abc import Sequence

from .detokenizer import IncrementalDetokenizer

__all__ = ["StopStringStreamer", "complete_text", "first_stop", "holdback", "reference_output", "trace", "validate_stops"]


def validate_stops(stops: Sequence[str]) -> tuple[str, ...]:
    """``stops`` as a tuple of non-empty strings (ValueError otherwise)."""
    if isinstance(stops, str) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stops must be a sequence of non-empty strings, got {stops!r}")
    return tuple(stops)


def holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string (0 if none):
    the characters that must not be sent yet."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Start index of the stop that completes first in ``text`` (smallest end; the longest among those
    ending together), or None when no stop occurs."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if len(s) <= end and text.startswith(s, end - len(s))]
        if hits:
            return end - max(map(len, hits))
    return None


def reference_output(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The oracle on the whole output at once: (the text the client must receive, whether a stop matched)."""
    cut = first_stop(text, validate_stops(stops))
    return (text, False) if cut is None else (text[:cut], True)


def complete_text(data: bytes) -> str:
    """``data`` (a prefix of valid UTF-8) decoded up to its last complete character."""
    for k in range(4):
        try:
            return data[:len(data) - k].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise ValueError("data must be a prefix of valid UTF-8 (more than 3 trailing bytes do not decode)")


class StopStringStreamer:
    """Tokens in, client text out, with stop strings (module docstring). ``vocab[id]`` is a token's bytes."""

    def __init__(self, vocab: Sequence[bytes], stops: Sequence[str]):
        self.vocab = vocab
        self.stops = validate_stops(stops)
        self.detok = IncrementalDetokenizer(vocab)
        self.pending = ""  # decoded text not sent yet
        self.stopped = False

    def push(self, token_id: int) -> str:
        """One generated token; return the text the client may receive now ('' once stopped)."""
        if self.stopped:
            return ""
        new = self.detok.push(token_id)
        self.pending += new
        cut = first_stop(self.pending, self.stops)
        if cut is not None:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        keep = holdback(self.pending, self.stops)
        out = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out

    def finish(self) -> str:
        """The output ended without a stop token: release the held text (still cut at a stop)."""
        if self.stopped:
            return ""
        tail = self.pending + self.detok.finish()
        cut = first_stop(tail, self.stops)
        self.pending, self.stopped = "", cut is not None
        return tail if cut is None else tail[:cut]


def trace(text: str, stops: Sequence[str] = (), tokenizer=None) -> dict:
    """``text`` generated token by token (the toy byte-level tokenizer) and streamed three ways: each
    token decoded alone, the offset-window decoder, and the window plus stop-string holdback. Per token:
    the token's bytes, the characters each way has sent so far, the replacement characters the naive
    way has sent, and the characters held back for a possible stop. Also the final texts and the token
    index at which the stop matched (None: no stop)."""
    from .detokenizer import decode_each, encode_text, stream

    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"text must be encodable as UTF-8 (no lone surrogates): {err.reason}") from None
    stops = validate_stops(stops) if stops else ()
    from .detokenizer import byte_tokenizer

    tok = tokenizer or byte_tokenizer()
    vocab = [t.encode("latin-1") for t in tok.vocab]
    ids = encode_text(text, tok)
    pieces = [vocab[i] for i in ids]
    naive = decode_each(pieces)
    deltas, tail = stream(ids, vocab)
    s = StopStringStreamer(vocab, stops) if stops else None
    sent_stop, held, stop_at, out = [], [], None, ""
    window_sent, n = [], 0
    for k, i in enumerate(ids):
        n += len(deltas[k])
        window_sent.append(n)
        if s is not None:
            out += s.push(i)
            if s.stopped and stop_at is None:
                stop_at = k
            held.append(len(s.pending))
        else:
            out += deltas[k]
            held.append(0)
        sent_stop.append(len(out))
    final_stop = out + (s.finish() if s is not None else tail)
    naive_sent, m, bad = [], 0, []
    for p in naive:
        m += len(p)
        naive_sent.append(m)
        bad.append(p.count("\ufffd"))
    return {"pieces": pieces, "naive_sent": naive_sent, "window_sent": window_sent, "stop_sent": sent_stop,
            "held": held, "replacements": bad, "naive_text": "".join(naive), "window_text": "".join(deltas) + tail,
            "stop_text": final_stop, "stop_at": stop_at, "n_chars": len(text)}
