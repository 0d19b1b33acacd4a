"""A consistent hash ring with virtual nodes, the brute-force owner oracle, and the load and movement
statistics of N072 (consistent-hash-ring).

* :func:`hash64`: the ring's one hash, 64-bit keyed BLAKE2b of the key's text (the ``seed`` is the
  BLAKE2b key, so a seed is a different, independent hash function).
* :class:`HashRing`: replica ``r`` owns ``vnodes`` points ``hash64(f"{r}#{i}", seed)``; a key is owned
  by the first point clockwise at or after ``hash64(key, seed)``, wrapping past ``2**64 - 1`` to the
  smallest point. Lookup is a bisection over the sorted points: ``O(log(n v))``.
* :func:`brute_force_owner`: the oracle, the point at the smallest clockwise distance
  ``(p - h) mod 2**64`` found by scanning every point (no sorting, no bisection).
* :func:`arc_shares`: the exact fraction of the hash space each replica owns (the arcs ending at its
  points); :func:`key_counts`: keys counted per replica by hashing each one (the measurement).
* :func:`imbalance`: max/min (the brief's "n-fold") and max/mean (what capacity planning pays) of a load.
* :func:`moved_keys`: keys whose owner differs between two rings, counted key by key.
* :func:`seed_study`: the imbalance and the joining replica's share over many seeds (the hash's spread).
* :func:`dirichlet_shares`: the closed-form model. ``N = n v`` uniform points cut the circle into
  spacings that are Dirichlet(1, ..., 1); a replica owns ``v`` of them, so the replica shares are
  Dirichlet(v, ..., v) (normalized Gamma(v) draws), and a joining replica's share is Beta(v, n v) with
  mean ``1 / (n + 1)``. With ``v = 1`` the smallest spacing has density ``~ n(n-1)`` near 0, so
  ``E[max / min]`` is infinite: a one-point ring's "n-fold" figure is a draw from a heavy tail.

Units: shares are fractions of the hash space; counts are keys.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer

__all__ = ["RING", "HashRing", "SeedStudy", "arc_shares", "brute_force_owner", "dirichlet_shares", "hash64", "hash_many",
           "imbalance", "key_counts", "moved_keys", "seed_study"]

RING = 2 ** 64  # the hash space: points and keys are integers in [0, RING)


def hash64(key: object, seed: int = 0) -> int:
    """64-bit hash of ``str(key)``: BLAKE2b (digest 8 bytes) keyed with ``seed`` (a non-negative integer
    below 2**64), read little-endian. Deterministic across runs and machines (unlike Python's ``hash``)."""
    s = integer("seed", seed, 0, RING - 1)
    return _hash_with(s.to_bytes(8, "little"), key)


def hash_many(keys: Iterable[object], seed: int = 0) -> np.ndarray:
    """:func:`hash64` of each key, as a uint64 array (one validation of the seed for all)."""
    sb = integer("seed", seed, 0, RING - 1).to_bytes(8, "little")
    return np.array([_hash_with(sb, k) for k in keys], dtype=np.uint64)


def _hash_with(seed_bytes: bytes, key: object) -> int:
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8, key=seed_bytes).digest(), "little")


class HashRing:
    """Consistent hash ring with ``vnodes`` points per replica (module doc)."""

    def __init__(self, vnodes: int = 1, seed: int = 0):
        self.vnodes = integer("vnodes", vnodes, 1, 100_000, unit="points per replica")
        self.seed = integer("seed", seed, 0, RING - 1)
        self._hashes: list[int] = []  # sorted point hashes
        self._owners: list[str] = []  # replica of each point, aligned with _hashes
        self._replicas: set[str] = set()

    def point_label(self, name: str, i: int) -> str:
        """The text hashed for replica ``name``'s ``i``-th point."""
        return f"{name}#{i}"

    def add(self, name: str) -> None:
        """Place ``name``'s ``vnodes`` points; ValueError if it is already on the ring."""
        name = str(name)
        if name in self._replicas:
            raise ValueError(f"replica {name!r} is already on the ring")
        self._replicas.add(name)
        new = [(hash64(self.point_label(name, i), self.seed), name) for i in range(self.vnodes)]
        if len(new) == 1:
            j = bisect.bisect_left(self._hashes, new[0][0])
            self._hashes.insert(j, new[0][0])
            self._owners.insert(j, name)
            return
        merged = sorted([*zip(self._hashes, self._owners, strict=True), *new])
        self._hashes = [h for h, _ in merged]
        self._owners = [o for _, o in merged]

    def remove(self, name: str) -> None:
        """Take every point of ``name`` off the ring; ValueError if it is not on it."""
        name = str(name)
        if name not in self._replicas:
            raise ValueError(f"replica {name!r} is not on the ring (replicas: {sorted(self._replicas)})")
        self._replicas.discard(name)
        keep = [(h, o) for h, o in zip(self._hashes, self._owners, strict=True) if o != name]
        self._hashes = [h for h, _ in keep]
        self._owners = [o for _, o in keep]

    def lookup(self, key: object) -> str:
        """The replica owning ``key``: the first point at or after ``hash64(key)``, wrapping around."""
        if not self._hashes:
            raise ValueError("the ring is empty: add a replica before looking a key up")
        j = bisect.bisect_left(self._hashes, hash64(key, self.seed))
        return self._owners[j % len(self._hashes)]

    def lookup_many(self, keys: Iterable[object]) -> list[str]:
        """:meth:`lookup` of each key (one vectorized bisection)."""
        if not self._hashes:
            raise ValueError("the ring is empty: add a replica before looking a key up")
        return self.owners_of_hashes(hash_many(keys, self.seed))

    def owners_of_hashes(self, key_hashes) -> list[str]:
        """The owners of keys already hashed with this ring's seed (a uint64 array of ``hash64`` values):
        one vectorized bisection, so many rings can share one hashing pass."""
        if not self._hashes:
            raise ValueError("the ring is empty: add a replica before looking a key up")
        hs = np.asarray(key_hashes, dtype=np.uint64)
        idx = np.searchsorted(np.array(self._hashes, dtype=np.uint64), hs, side="left") % len(self._hashes)
        return [self._owners[i] for i in idx]

    @property
    def replicas(self) -> list[str]:
        """Replica names on the ring, sorted."""
        return sorted(self._replicas)

    @property
    def points(self) -> list[tuple[int, str]]:
        """(hash, replica) of every point, sorted by hash."""
        return list(zip(self._hashes, self._owners, strict=True))

    def __len__(self) -> int:
        return len(self._hashes)


def brute_force_owner(points: Sequence[tuple[int, str]], key_hash: int) -> str:
    """Oracle: the replica of the point at the smallest clockwise distance ``(p - h) mod 2**64`` from
    ``key_hash`` (distance 0: the point itself owns it), by scanning every point."""
    if not points:
        raise ValueError("no points: the ring is empty")
    best = min(points, key=lambda p: ((p[0] - key_hash) % RING, p[0]))
    return best[1]


def arc_shares(ring: HashRing) -> dict[str, float]:
    """Exact fraction of the hash space each replica owns: the arc from the previous point (exclusive)
    to each of its points (inclusive), summed; they add up to 1."""
    if not len(ring):
        raise ValueError("the ring is empty")
    if len(ring) == 1:
        return {ring.replicas[0]: 1.0}
    h = np.array(ring._hashes, dtype=np.uint64)
    arcs = h - np.roll(h, 1)  # uint64 arithmetic wraps modulo 2**64: the first arc crosses zero
    names = ring.replicas
    idx = {r: i for i, r in enumerate(names)}
    owner = np.fromiter((idx[o] for o in ring._owners), dtype=np.int64, count=len(ring))
    tot = np.bincount(owner, weights=arcs.astype(np.float64), minlength=len(names))
    return {r: float(tot[i] / RING) for i, r in enumerate(names)}


def key_counts(ring: HashRing, keys: Iterable[object]) -> dict[str, int]:
    """Keys per replica, each key hashed and looked up (replicas owning none count 0)."""
    c = Counter(ring.lookup_many(keys))
    return {r: c.get(r, 0) for r in ring.replicas}


@dataclass(frozen=True)
class Imbalance:
    """max/min and max/mean of a load vector (``max_over_min`` is inf when a replica has none)."""

    max_over_min: float
    max_over_mean: float


def imbalance(loads: Iterable[float]) -> Imbalance:
    """The two imbalance figures of ``loads`` (counts or shares, at least one positive)."""
    a = np.asarray(list(loads), dtype=float)
    if a.size == 0 or a.max() <= 0 or (a < 0).any():
        raise ValueError("loads must be non-negative with at least one positive")
    lo = a.min()
    return Imbalance(float(a.max() / lo) if lo > 0 else float("inf"), float(a.max() / a.mean()))


def moved_keys(before: HashRing, after: HashRing, keys: Sequence[object]) -> int:
    """Keys whose owner differs between ``before`` and ``after``, counted key by key."""
    return sum(a != b for a, b in zip(before.lookup_many(keys), after.lookup_many(keys), strict=True))


@dataclass(frozen=True)
class SeedStudy:
    """Per seed: max/min and max/mean of the exact arc shares of ``n`` replicas, and the share of the
    hash space a joining replica takes (= the fraction of keys that move, in the key-count limit)."""

    n: int
    vnodes: int
    max_over_min: np.ndarray
    max_over_mean: np.ndarray
    joining_share: np.ndarray

    def percentile_of(self, which: str, value: float) -> float:
        """Fraction of seeds whose ``which`` (max_over_min, max_over_mean, joining_share) is <= ``value``."""
        arr = getattr(self, which)
        return float(np.mean(arr <= value))


def seed_study(n: int, vnodes: int, seeds: Iterable[int]) -> SeedStudy:
    """Build an ``n``-replica ring (replicas ``r0..r{n-1}``) per seed, then add ``r{n}``: the exact arc
    statistics per seed (:class:`SeedStudy`)."""
    n = integer("n", n, 2, 1000, unit="replicas")
    v = integer("vnodes", vnodes, 1, 100_000, unit="points per replica")
    owner = np.repeat(np.arange(n + 1), v)
    mm, ma, js = [], [], []
    for s in seeds:
        ring = HashRing(v, s)  # the ring's own point labels and hash; arcs as in arc_shares, vectorized
        sb = ring.seed.to_bytes(8, "little")
        h = np.array([_hash_with(sb, ring.point_label(f"r{r}", i)) for r in range(n + 1) for i in range(v)],
                     dtype=np.uint64)
        shares = []
        for m in (n, n + 1):
            order = np.argsort(h[:m * v], kind="stable")
            hs = h[:m * v][order]
            arcs = (hs - np.roll(hs, 1)).astype(np.float64)
            shares.append(np.bincount(owner[:m * v][order], weights=arcs, minlength=m) / RING)
        im = imbalance(shares[0])
        mm.append(im.max_over_min)
        ma.append(im.max_over_mean)
        js.append(float(shares[1][n]))
    if not mm:
        raise ValueError("seeds must name at least one seed")
    return SeedStudy(n, v, np.array(mm), np.array(ma), np.array(js))


def dirichlet_shares(n: int, vnodes: int, draws: int, seed: int = 0) -> np.ndarray:
    """``draws`` x ``n`` replica shares from the closed-form model Dirichlet(v, ..., v) (module doc):
    independent Gamma(v) draws, each row normalized to 1."""
    n = integer("n", n, 1, 10_000, unit="replicas")
    v = integer("vnodes", vnodes, 1, 100_000, unit="points per replica")
    d = integer("draws", draws, 1, 10_000_000)
    g = np.random.default_rng(seed).gamma(v, size=(d, n))
    return g / g.sum(axis=1, keepdims=True)
