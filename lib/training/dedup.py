"""Deduplication of a text corpus: exact duplicates by a hash and a group-by, near-duplicates by
MinHash signatures and LSH banding, and the arithmetic that sizes both.

* Shingles: word n-grams of the normalized text (lower case, runs of letters and digits), each
  hashed to 64 bits with BLAKE2b (deterministic across processes, unlike Python's ``hash``).
* MinHash (Broder 1997): k hash functions h_i(x) = mix64(x XOR s_i) (SplitMix64's finalizer, a
  seeded bijection of 64-bit integers); the signature is the minimum of each h_i over the document's
  shingles.
  Two documents agree on one signature entry with probability (about) their Jaccard similarity.
* LSH banding: the k = b x r entries are split into b bands of r rows; two documents become a
  candidate pair when any band agrees entirely, with probability 1 - (1 - s^r)^b (the S-curve;
  threshold about (1/b)^(1/r)). Buckets are keyed by (band index, band values).
* Clustering: candidate pairs whose estimated (or exact) similarity passes a threshold are joined
  with union-find; each cluster keeps its first document.

On a cluster the bucket step is a shuffle: one (band key, document id) record per band per
document moves to the worker that owns the key (:func:`lib.training.data_pipeline.minhash_shuffle_bytes`).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from lib.inputs import fraction, integer

__all__ = [
    "MinHasher", "UnionFind", "candidate_probability", "estimate_jaccard", "exact_duplicates",
    "jaccard", "lsh_buckets", "lsh_candidates", "lsh_threshold", "near_duplicates", "normalize", "shingles",
    "signature_bytes", "toy_corpus",
]

_WORD = re.compile(r"[a-z0-9]+")


def normalize(text: str) -> str:
    """Lower case, words of letters and digits joined by single spaces (punctuation and spacing dropped)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return " ".join(_WORD.findall(text.lower()))


def _h64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")


def shingles(text: str, n: int = 5) -> frozenset[int]:
    """64-bit hashes of the word n-grams of ``normalize(text)``; a text of fewer than n words is one
    shingle (the whole text); an empty text has none."""
    n = integer("n", n, 1, unit="words")
    words = normalize(text).split()
    if not words:
        return frozenset()
    if len(words) <= n:
        return frozenset({_h64(" ".join(words))})
    return frozenset(_h64(" ".join(words[i:i + n])) for i in range(len(words) - n + 1))


def jaccard(a: Iterable, b: Iterable) -> float:
    """Exact Jaccard similarity |A & B| / |A | B| (1.0 for two empty sets)."""
    a, b = set(a), set(b)
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


class MinHasher:
    """``num_hashes`` hash functions h_i(x) = mix64(x XOR s_i) with 64-bit seeds s_i drawn from ``seed``
    (mix64: the SplitMix64 finalizer, a bijection on 64-bit integers with full avalanche, so each h_i
    orders the shingles like an independent random permutation); :meth:`signature` maps a set of 64-bit
    shingle hashes to the vector of their minima (uint64)."""

    def __init__(self, num_hashes: int, seed: int = 0):
        self.num_hashes = integer("num_hashes", num_hashes, 1)
        self.seed = integer("seed", seed, 0)
        rng = np.random.default_rng(self.seed)
        self.salts = rng.integers(0, np.iinfo(np.uint64).max, size=self.num_hashes, dtype=np.uint64,
                                  endpoint=True)
        self.empty = np.full(self.num_hashes, np.iinfo(np.uint64).max, dtype=np.uint64)  # no shingle

    def signature(self, shingle_hashes: Iterable[int]) -> np.ndarray:
        """min over shingles x of mix64(x XOR s_i), one entry per hash function (all-ones when empty)."""
        xs = np.fromiter((int(x) for x in shingle_hashes), dtype=np.uint64)
        if xs.size == 0:
            return self.empty.copy()
        return _mix64(np.bitwise_xor.outer(xs, self.salts)).min(axis=0)

    def signatures(self, texts: Sequence[str], n: int = 5) -> np.ndarray:
        """Signatures of ``texts`` (one row each), from their word n-gram shingles."""
        if len(texts) == 0:
            return np.empty((0, self.num_hashes), dtype=np.uint64)
        return np.stack([self.signature(shingles(t, n)) for t in texts])


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of signature entries that agree: the MinHash estimate of the Jaccard similarity."""
    sig_a, sig_b = np.asarray(sig_a), np.asarray(sig_b)
    if sig_a.shape != sig_b.shape or sig_a.ndim != 1 or sig_a.size == 0:
        raise ValueError(f"signatures must be two 1-D arrays of one length, got {sig_a.shape} and {sig_b.shape}")
    return float(np.mean(sig_a == sig_b))


def candidate_probability(s, rows: int, bands: int):
    """P(two documents of similarity s share at least one of ``bands`` bands of ``rows`` rows):
    1 - (1 - s^r)^b. ``s`` may be a number or an array of numbers in [0, 1]."""
    r, b = integer("rows", rows, 1), integer("bands", bands, 1)
    arr = np.asarray(s, dtype=float)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise ValueError(f"similarity must be in [0, 1], got {s!r}")
    out = -np.expm1(b * np.log1p(-arr**r)) if np.all(arr < 1) else 1 - (1 - arr**r) ** b
    return float(out) if np.ndim(s) == 0 else out


def lsh_threshold(rows: int, bands: int) -> float:
    """The similarity where the S-curve turns, about (1/b)^(1/r)."""
    r, b = integer("rows", rows, 1), integer("bands", bands, 1)
    return (1.0 / b) ** (1.0 / r)


def _check_bands(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    sig = np.asarray(signatures)
    b, r = integer("bands", bands, 1), integer("rows", rows, 1)
    if sig.ndim != 2:
        raise ValueError(f"signatures must be a 2-D array (documents x hashes), got shape {sig.shape}")
    if sig.shape[1] < b * r:
        raise ValueError(f"bands x rows = {b * r} exceeds the {sig.shape[1]} hashes per signature")
    return sig


def lsh_buckets(signatures: np.ndarray, bands: int, rows: int) -> dict[tuple, list[int]]:
    """Group documents by (band index, band values): band j is columns j r .. (j + 1) r - 1."""
    sig = _check_bands(signatures, bands, rows)
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for j in range(bands):
        block = sig[:, j * rows:(j + 1) * rows]
        for doc, row in enumerate(block):
            buckets[(j, row.tobytes())].append(doc)
    return buckets


def lsh_candidates(signatures: np.ndarray, bands: int, rows: int) -> set[tuple[int, int]]:
    """Pairs (i, j), i < j, that agree on every row of at least one band: documents are bucketed by
    (band index, the band's r values), band j being columns j r .. (j + 1) r - 1, and every two
    documents of a bucket are a pair."""
    sig = _check_bands(signatures, bands, rows)
    pairs: set[tuple[int, int]] = set()
    for j in range(bands):
        buckets: dict[tuple, list[int]] = defaultdict(list)
        block = sig[:, j * rows:(j + 1) * rows]
        for doc, row in enumerate(block):
            buckets[(j, row.tobytes())].append(doc)
        for docs in buckets.values():
            pairs.update(itertools.combinations(docs, 2))
    return pairs


class UnionFind:
    """Disjoint sets over 0 .. n - 1 with path halving and union by size."""

    def __init__(self, n: int):
        self.parent = list(range(integer("n", n, 0)))
        self.size = [1] * len(self.parent)

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]

    def groups(self) -> list[list[int]]:
        """The sets, each sorted, ordered by their smallest member."""
        out: dict[int, list[int]] = defaultdict(list)
        for x in range(len(self.parent)):
            out[self.find(x)].append(x)
        return sorted(out.values(), key=lambda g: g[0])


def near_duplicates(texts: Sequence[str], bands: int = 14, rows: int = 8, threshold: float = 0.7, n: int = 5,
                    seed: int = 0, verify: str = "estimate") -> dict:
    """Near-duplicate clusters of ``texts``: MinHash signatures (bands x rows hashes), LSH candidates,
    kept when the similarity (``verify="estimate"``: signature agreement; ``"exact"``: Jaccard of the
    shingle sets) is at least ``threshold``, joined by union-find. Returns ``{"keep": indices of the
    first document of each cluster, "clusters": clusters of 2+, "candidates": n candidate pairs,
    "verified": n pairs kept}``."""
    t = fraction("threshold", threshold)
    if verify not in ("estimate", "exact"):
        raise ValueError(f"verify must be 'estimate' or 'exact', got {verify!r}")
    mh = MinHasher(integer("bands", bands, 1) * integer("rows", rows, 1), seed)
    sh = [shingles(x, n) for x in texts]
    sig = np.stack([mh.signature(s) for s in sh]) if sh else np.empty((0, mh.num_hashes), dtype=np.uint64)
    cands = lsh_candidates(sig, bands, rows)
    uf = UnionFind(len(texts))
    verified = 0
    for i, j in sorted(cands):
        sim = estimate_jaccard(sig[i], sig[j]) if verify == "estimate" else jaccard(sh[i], sh[j])
        if sim >= t:
            uf.union(i, j)
            verified += 1
    groups = uf.groups()
    return {"keep": [g[0] for g in groups], "clusters": [g for g in groups if len(g) > 1],
            "candidates": len(cands), "verified": verified}


def exact_duplicates(texts: Sequence[str], normalized: bool = True) -> dict:
    """Exact duplicates by a SHA-256 of each text (of ``normalize(text)`` when ``normalized``) and a
    group-by: ``{"keep": first index of each distinct text, "groups": index lists of 2+}``."""
    seen: dict[bytes, list[int]] = {}
    for i, x in enumerate(texts):
        key = hashlib.sha256((normalize(x) if normalized else x).encode("utf-8")).digest()
        seen.setdefault(key, []).append(i)
    groups = sorted(seen.values(), key=lambda g: g[0])
    return {"keep": [g[0] for g in groups], "groups": [g for g in groups if len(g) > 1]}


def signature_bytes(docs: float, hashes: int, bytes_per_hash: int = 8) -> float:
    """Bytes of the signatures of ``docs`` documents: docs x hashes x bytes_per_hash."""
    if not docs >= 0:
        raise ValueError(f"docs must be >= 0, got {docs!r}")
    return float(docs) * integer("hashes", hashes, 1) * integer("bytes_per_hash", bytes_per_hash, 1)


def toy_corpus(n_docs: int, words_per_doc: int = 120, near_dup_fraction: float = 0.3, edit_fraction: float = 0.05,
               exact_dup_fraction: float = 0.1, seed: int = 0) -> dict:
    """A seeded synthetic corpus with planted duplicates: ``n_docs`` texts of random words (a 2,000-word
    vocabulary); a ``near_dup_fraction`` of them are copies of an earlier document with
    ``edit_fraction`` of the words replaced, an ``exact_dup_fraction`` exact copies (with other spacing
    and case). Returns ``{"texts", "near": [(original, copy)], "exact": [(original, copy)]}``."""
    n = integer("n_docs", n_docs, 1)
    w = integer("words_per_doc", words_per_doc, 1)
    nd, ed, xd = (fraction(k, v) for k, v in (("near_dup_fraction", near_dup_fraction),
                                               ("edit_fraction", edit_fraction),
                                               ("exact_dup_fraction", exact_dup_fraction)))
    rng = np.random.default_rng(integer("seed", seed, 0))
    vocab = [f"w{i}" for i in range(2000)]
    texts: list[str] = []
    near, exact = [], []
    for i in range(n):
        u = rng.random()
        if i > 0 and u < nd:
            src = int(rng.integers(0, i))
            words = texts[src].lower().split()
            for k in np.flatnonzero(rng.random(len(words)) < ed):
                words[k] = vocab[int(rng.integers(len(vocab)))]
            texts.append(" ".join(words))
            near.append((src, i))
        elif i > 0 and u < nd + xd:
            src = int(rng.integers(0, i))
            texts.append("  " + texts[src].upper().replace(" ", "   "))
            exact.append((src, i))
        else:
            texts.append(" ".join(vocab[int(k)] for k in rng.integers(0, len(vocab), w)))
    return {"texts": texts, "near": near, "exact": exact}
