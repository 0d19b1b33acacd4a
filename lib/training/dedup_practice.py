"""Practice mode for near-duplicate detection (N045): write LSH candidate generation.

The candidate writes ``candidates(signatures, bands, rows)``: ``signatures`` a (documents x hashes)
integer array of MinHash signatures, and returns the set of pairs (i, j), i < j, that agree on all
``rows`` entries of at least one of the ``bands`` bands (band j is columns j r .. (j + 1) r - 1;
columns past bands x rows are ignored). The oracle is brute force: every pair, every band, entry by
entry. A case is a list of documents ``("doc", bands, rows, values)`` (all of a case share bands and
rows), so a failure shrinks to the two or three documents that show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade

from .dedup import lsh_candidates

__all__ = ["QUESTION", "VARIANTS", "brute_force_pairs", "cases", "check", "run", "skeleton", "variant"]

QUESTION = "LSH candidate pairs (N045)"


def skeleton(signatures, bands, rows):
    """signatures (D, K) integers, K >= bands x rows. Return the set of pairs (i, j), i < j, whose
    signatures agree on every row of at least one band (band j = columns j*rows .. (j+1)*rows - 1)."""
    raise NotImplementedError


_DRAFTS = {
    "bucket key without the band index": (
        "buckets keyed by the band's values only: band 0 of one document and band 1 of another collide",
        [("buckets[(j, row.tobytes())].append(doc)", "buckets[row.tobytes()].append(doc)"),
         ("buckets: dict[tuple, list[int]] = defaultdict(list)", ""),
         ("for j in range(bands):", "buckets: dict = defaultdict(list)\nfor j in range(bands):"),
         ("for docs in buckets.values():\n    pairs.update(itertools.combinations(docs, 2))", ""),
         ("return pairs", "for docs in buckets.values():\n    pairs.update(itertools.combinations(docs, 2))\n"
                          "return pairs")]),
    "overlapping bands": (
        "band j taken as columns j .. j + r - 1 (a stride of one): the bands overlap and the last columns are never "
        "looked at",
        [("block = sig[:, j * rows:(j + 1) * rows]", "block = sig[:, j:j + rows]")]),
    "whole signature as one band": (
        "a pair only when every band agrees (AND instead of OR): the S-curve collapses to s^(b r)",
        [("block = sig[:, j * rows:(j + 1) * rows]", "block = sig[:, :bands * rows]")]),
    "last band skipped": (
        "an off-by-one over the bands: the last band is never bucketed",
        [("for j in range(bands):", "for j in range(bands - 1):")]),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft (one of ``VARIANTS``), with the candidate's interface."""
    if name == "reference":
        return lsh_candidates
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return edited(lsh_candidates, _DRAFTS[name][1], name=name)


def brute_force_pairs(signatures, bands: int, rows: int) -> set[tuple[int, int]]:
    """The oracle: every pair of documents, every band, compared entry by entry (an all-pairs equality
    table per band, no hashing or bucketing)."""
    sig = np.asarray(signatures)
    n = len(sig)
    hit = np.zeros((n, n), dtype=bool)
    for b in range(bands):
        block = sig[:, b * rows:(b + 1) * rows]
        hit |= (block[:, None, :] == block[None, :, :]).all(axis=2)
    i, j = np.nonzero(np.triu(hit, k=1))
    return {(int(a), int(c)) for a, c in zip(i, j, strict=True)}


def run(impl: Callable, ops: Sequence) -> None:
    """Build the signatures from the documents of ``ops`` and compare ``impl``'s pairs with brute force."""
    if not ops:
        return
    bands, rows = ops[0][1], ops[0][2]
    sig = np.array([op[3] for op in ops], dtype=np.uint64)
    got = impl(sig.copy(), bands, rows)
    try:
        got = {tuple(int(x) for x in p) for p in got}
    except TypeError as err:
        raise AssertionError(f"return a set of (i, j) pairs; got {type(got).__name__}") from err
    bad = [p for p in got if len(p) != 2 or not p[0] < p[1]]
    if bad:
        raise AssertionError(f"pairs must be (i, j) with i < j; got {sorted(bad)[:3]}")
    want = brute_force_pairs(sig, bands, rows)
    extra, missing = sorted(got - want), sorted(want - got)
    if extra or missing:
        parts = ([f"returned {extra[:4]}, which share no band"] if extra else []) + \
                ([f"missed {missing[:4]}, which share a band"] if missing else [])
        raise AssertionError(f"with {bands} bands of {rows} rows: " + "; ".join(parts))


def _doc(bands: int, rows: int, values) -> tuple:
    return ("doc", bands, rows, tuple(int(v) for v in values))


def _random_docs(n: int, bands: int, rows: int, width: int, alphabet: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple(_doc(bands, rows, rng.integers(0, alphabet, width)) for _ in range(n))


def cases() -> list[Case]:
    """Edge cases first (each shows one classic defect), then random signatures with many collisions."""
    return [
        Case("identical documents", (_doc(2, 2, [1, 2, 3, 4]), _doc(2, 2, [1, 2, 3, 4]))),
        Case("one band matches, the other does not", (_doc(2, 2, [1, 2, 3, 4]), _doc(2, 2, [1, 2, 9, 9]))),
        Case("only the last band matches", (_doc(3, 2, [1, 2, 3, 4, 5, 6]), _doc(3, 2, [7, 8, 9, 9, 5, 6]))),
        Case("band 0 of one equals band 1 of another", (_doc(2, 2, [1, 2, 3, 4]), _doc(2, 2, [5, 6, 1, 2]))),
        Case("a band straddling the boundary is not a band", (_doc(2, 2, [1, 2, 3, 4]), _doc(2, 2, [9, 2, 3, 8]))),
        Case("columns past bands x rows are ignored", (_doc(1, 2, [1, 2, 3]), _doc(1, 2, [1, 2, 4]),
                                                       _doc(1, 2, [5, 6, 3]))),
        Case("three in one bucket", (_doc(2, 3, [1, 1, 1, 2, 2, 2]), _doc(2, 3, [1, 1, 1, 3, 3, 3]),
                                     _doc(2, 3, [1, 1, 1, 4, 4, 4]))),
        Case("random, 4 bands of 2", _random_docs(12, 4, 2, 8, 3, 1)),
        Case("random, 3 bands of 3, extra columns", _random_docs(10, 3, 3, 11, 2, 2)),
    ]


def describe(ops: Sequence) -> str:
    if not ops:
        return "  (no documents)"
    b, r = ops[0][1], ops[0][2]
    return f"  {b} bands of {r} rows\n" + "\n".join(f"  doc {i}: {list(op[3])}" for i, op in enumerate(ops))


def check(candidate: Callable) -> PracticeReport:
    """Grade any ``candidates(signatures, bands, rows)``; the report shows the first failing set of
    documents, shrunk."""
    return grade(QUESTION, lambda: candidate, cases(), run, describe)
