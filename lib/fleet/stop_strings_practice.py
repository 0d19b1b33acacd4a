"""Practice mode for stop strings on a token stream (I093): graded against the whole-output reference.

The candidate writes a class with the interface of :class:`Skeleton`: built with a byte vocabulary
and the stop strings, fed token ids with ``push`` (which returns the text the client may receive
now), ended with ``finish``; ``stopped`` says whether a stop matched. A case is ``("stops", (...))``
followed by token byte strings (valid UTF-8 once joined, cut anywhere). After every push the grader
checks, with ``ready`` = every complete character received so far, whenever the tokens so far end on
a character boundary (in between, a token's text may wait for the character it starts, never more):

* if a stop is complete in ``ready`` (:func:`lib.fleet.stop_strings.first_stop`): the client has
  exactly the text before it, ``stopped`` is true, and later pushes return '';
* otherwise the client has exactly ``ready`` minus its longest suffix that is a proper prefix of a
  stop (:func:`~lib.fleet.stop_strings.holdback`): never a character of a stop, never a
  replacement character, and nothing held that could not become a stop;

and after ``finish`` that the client has :func:`~lib.fleet.stop_strings.reference_output` of the
whole output. The defective drafts (:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .detokenizer import decode_all
from .stop_strings import StopStringStreamer, complete_text, first_stop, holdback, reference_output

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "random_case", "run", "variant"]

QUESTION = "Stop strings on a token stream (I093)"
DEFAULT_STOPS = ("###",)


class Skeleton:
    """Stream a generation to the client, ending it at the first stop string, which is never sent."""

    def __init__(self, vocab: Sequence[bytes], stops: Sequence[str]):
        """``vocab[token_id]`` is the token's bytes (a token may hold part of a UTF-8 character);
        ``stops`` are non-empty strings. Set ``self.stopped = False``."""
        raise NotImplementedError

    def push(self, token_id: int) -> str:
        """One generated token; return the text the client may receive now. When a stop string completes,
        return the text before it, set ``self.stopped = True``, and return '' for any later push."""
        raise NotImplementedError

    def finish(self) -> str:
        """The output ended (length limit or end-of-sequence token): return the text still held."""
        raise NotImplementedError


_DRAFTS = {
    "naive first draft": (
        "each token decoded alone and sent at once, the stop searched in all the text so far: the client already "
        "has the first characters of the stop (and replacement characters for a split euro sign) when it matches",
        {"push": [("new = self.detok.push(token_id)", 'new = self.vocab[token_id].decode("utf-8", errors="replace")'),
                  ("cut = first_stop(self.pending, self.stops)",
                   "self.text = getattr(self, 'text', '') + new\n"
                   "cut = first_stop(self.text, self.stops)\n"
                   "if cut is not None:\n"
                   "    cut = max(0, cut - (len(self.text) - len(self.pending)))"),
                  ("keep = holdback(self.pending, self.stops)", "keep = 0")]}),
    "no holdback": (
        "everything decoded is sent at once and the stop is searched afterwards: the client has already "
        "received the first characters of the stop when it completes",
        {"push": [("keep = holdback(self.pending, self.stops)", "keep = 0")]}),
    "fixed holdback": (
        "always holds back the longest stop's length minus one characters: the right final text, but text that "
        "can no longer become a stop waits for nothing",
        {"push": [("keep = holdback(self.pending, self.stops)",
                   "keep = min(len(self.pending), max(map(len, self.stops)) - 1)")]}),
    "searches only the new text": (
        "the stop is searched in the newest token's text only, so a stop split over tokens is never found",
        {"push": [("cut = first_stop(self.pending, self.stops)",
                   "cut = first_stop(new, self.stops)\n"
                   "if cut is not None:\n"
                   "    cut += len(self.pending) - len(new)")]}),
    "each token decoded alone": (
        "each token's bytes are decoded on their own: a euro sign split over two tokens becomes replacement "
        "characters, and a stop that contains it never matches",
        {"push": [("new = self.detok.push(token_id)", 'new = self.vocab[token_id].decode("utf-8", errors="replace")')]}),
    "held text dropped at the end": (
        "finish forgets the held text: an output that ends in a partial stop loses it",
        {"finish": [("tail = self.pending + self.detok.finish()", "tail = self.detok.finish()")]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return StopStringStreamer
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(StopStringStreamer, "Draft", f"Draft: {doc}.", **methods)


def run(factory: Callable, ops: Sequence) -> None:
    """Stream a case through ``factory(vocab, stops)``; raise AssertionError at the first difference."""
    ops = list(ops)
    stops = tuple(ops.pop(0)[1]) if ops and ops[0][0] == "stops" else DEFAULT_STOPS
    pieces = [bytes(p) for p in ops]
    try:
        b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError:
        return  # cases are valid UTF-8 once joined; a shrink that cuts a character is not a case
    vocab = sorted(set(pieces))
    index = {p: i for i, p in enumerate(vocab)}
    s = factory(vocab, stops)
    sent, stopped_at = "", None
    for k, p in enumerate(pieces):
        got = s.push(index[p])
        if not isinstance(got, str):
            raise AssertionError(f"push returned {got!r}, expected a str")
        sent += got
        so_far = b"".join(pieces[:k + 1])
        ready = complete_text(so_far)
        boundary = len(ready.encode()) == len(so_far)  # the tokens so far end on a character boundary
        cut = first_stop(ready, stops)
        where = f"after token {k} ({p!r}), stops {stops}"
        if not boundary:  # a token ending inside a character may wait for it whole: no more than `want`
            want = ready[:cut] if cut is not None else ready[:len(ready) - holdback(ready, stops)]
            if not want.startswith(sent):
                raise AssertionError(f"{where}: the complete text is {ready!r}; the client may have at most "
                                     f"{want!r}, it has {sent!r}")
        elif cut is not None:
            if sent != ready[:cut] or not getattr(s, "stopped", False):
                raise AssertionError(f"{where}: the text is {ready!r} and a stop is complete; the client must have "
                                     f"exactly {ready[:cut]!r} and stopped=True, it has {sent!r} "
                                     f"(stopped={getattr(s, 'stopped', None)!r})")
            stopped_at = k if stopped_at is None else stopped_at
        else:
            want = ready[:len(ready) - holdback(ready, stops)]
            if sent != want:
                raise AssertionError(f"{where}: the text is {ready!r}; the client must have exactly {want!r} (held "
                                     f"back: {ready[len(want):]!r}, the longest suffix that can still become a stop), "
                                     f"it has {sent!r}")
            if getattr(s, "stopped", False):
                raise AssertionError(f"{where}: stopped=True but no stop string is complete in {ready!r}")
    sent += s.finish()
    want, _ = reference_output(decode_all(pieces), stops)
    if sent != want:
        raise AssertionError(f"after finish (stops {stops}) the client has {sent!r}; the whole-output reference is "
                             f"{want!r}")


_STOP_SETS = (("###",), ("</s>", "\nUser:"), ("€ END",), ("abcd", "bc"), ("aab",), ("😀😀", "x"))
_FRAGMENTS = ("a", "b", "c", "d", "#", "##", " ", "€", "😀", "</", "s>", "\nUs", "er:", "E", "ND", "é", "x", "日")


def random_case(seed: int, n_fragments: int = 10) -> tuple:
    """A random case: one stop set, text made of fragments that often spell parts of the stops, cut into
    tokens of 1 to 4 bytes at random points (inside characters too)."""
    rng = np.random.default_rng(seed)
    stops = _STOP_SETS[int(rng.integers(len(_STOP_SETS)))]
    parts = list(_FRAGMENTS) + [s[:int(rng.integers(1, len(s) + 1))] for s in stops]
    data = "".join(parts[int(i)] for i in rng.integers(0, len(parts), n_fragments)).encode()
    out, i = [], 0
    while i < len(data):
        n = int(rng.integers(1, 5))
        out.append(data[i:i + n])
        i += n
    return (("stops", stops), *out)


def cases() -> list[Case]:
    """Hand-made cases (each a classic failure), then random cases."""
    euro = "€".encode()
    return [
        Case("no stop at all", (("stops", ("###",)), b"plain ", b"text")),
        Case("stop split over three tokens", (("stops", ("###",)), b"done", b"#", b"#", b"#", b"tail")),
        Case("euro split over two tokens, then a stop", (("stops", ("###",)), b"5 " + euro[:2], euro[2:],
                                                         b"##", b"#", b"more")),
        Case("a partial stop that never completes", (("stops", ("###",)), b"a#", b"#b")),
        Case("a stop that contains the euro sign", (("stops", ("€ END",)), b"cost " + euro[:2], euro[2:], b" E",
                                                    b"ND", b" junk")),
        Case("stops that overlap", (("stops", ("abcd", "bc")), b"a", b"bcd")),
        Case("a stop that overlaps itself", (("stops", ("aab",)), b"a", b"a", b"a", b"b")),
        Case("output ends inside a partial stop", (("stops", ("###",)), b"done#", b"#")),
        Case("stop at the very start", (("stops", ("</s>",)), b"</", b"s>", b"x")),
        *[Case(f"random case {k}", random_case(k)) for k in range(14)],
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {op!r}" for op in ops)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first failing
    case, shrunk (a case shrunk past its stops line runs with ('###',))."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
