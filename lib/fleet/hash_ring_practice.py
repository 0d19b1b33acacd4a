"""Practice mode for the consistent hash ring (N072): write the ring, graded against brute force.

The candidate writes a class with :class:`Skeleton`'s interface and the ring's placement rule:
replica ``r``'s ``i``-th point sits at ``hash64(f"{r}#{i}", seed)`` and a key at ``hash64(key, seed)``
(:func:`lib.fleet.hash_ring.hash64`); a key belongs to the first point at or after its hash,
wrapping around. A case is a program of ``("add", name)``, ``("remove", name)`` and
``("lookup", key)`` run on ``factory(vnodes, seed)`` (the first operation is ``("config", vnodes,
seed)``). After every operation the grader checks:

* ``lookup`` equals the brute-force owner (every point scanned for the smallest clockwise distance);
* adding a replica already on the ring, removing one not on it, and a lookup on an empty ring raise
  ``ValueError``;
* consistency, checked on a fixed key set: an ``add`` moves keys only to the new replica, a
  ``remove`` moves only the removed replica's keys.

The defective drafts (:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .hash_ring import HashRing, brute_force_owner, hash64

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "random_ops", "run", "variant"]

QUESTION = "Consistent hash ring with virtual nodes (N072)"
_PROBE = tuple(f"k{i}" for i in range(64))  # keys whose owners the consistency check follows


class Skeleton:
    """A consistent hash ring: ``vnodes`` points per replica at ``hash64(f"{name}#{i}", seed)``."""

    def __init__(self, vnodes: int, seed: int):
        """An empty ring; every replica will get ``vnodes`` points, hashed with ``seed``."""
        raise NotImplementedError

    def add(self, name: str) -> None:
        """Place the replica's points; ValueError if ``name`` is already on the ring."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        """Take all the replica's points off; ValueError if ``name`` is not on the ring."""
        raise NotImplementedError

    def lookup(self, key: str) -> str:
        """The replica of the first point at or after ``hash64(key, seed)``, wrapping around;
        ValueError on an empty ring."""
        raise NotImplementedError


_DRAFTS = {
    "no wrap-around": (
        "a key hashing past the last point goes to the last point instead of wrapping to the first",
        {"lookup": [("return self._owners[j % len(self._hashes)]",
                     "return self._owners[min(j, len(self._hashes) - 1)]")]}),
    "strictly after the key": (
        "bisect_right: a key that hashes exactly onto a point goes to the next point",
        {"lookup": [("j = bisect.bisect_left(self._hashes, hash64(key, self.seed))",
                     "j = bisect.bisect_right(self._hashes, hash64(key, self.seed))")]}),
    "remove takes one point": (
        "remove deletes the replica's first point only: its other virtual nodes keep receiving keys",
        {"remove": [("keep = [(h, o) for h, o in zip(self._hashes, self._owners, strict=True) if o != name]",
                     "j = self._owners.index(name)\n"
                     "keep = [p for k, p in enumerate(zip(self._hashes, self._owners, strict=True)) if k != j]")]}),
    "virtual nodes ignored": (
        "one point per replica whatever vnodes says: the 47-fold ring",
        {"add": [("new = [(hash64(self.point_label(name, i), self.seed), name) for i in range(self.vnodes)]",
                  "new = [(hash64(self.point_label(name, i), self.seed), name) for i in range(1)]")]}),
    "modulo hashing": (
        "hash(key) mod n over the sorted replicas: balanced, but adding one replica moves most keys",
        {"lookup": [("j = bisect.bisect_left(self._hashes, hash64(key, self.seed))\n"
                     "return self._owners[j % len(self._hashes)]",
                     "return self.replicas[hash64(key, self.seed) % len(self.replicas)]")]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return HashRing
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(HashRing, "Draft", f"Draft: {doc}.", **methods)


def _points(names, vnodes, seed):
    return [(hash64(f"{r}#{i}", seed), r) for r in names for i in range(vnodes)]


def _raises(fn, *args) -> bool:
    try:
        fn(*args)
    except ValueError:
        return True
    return False


def run(factory: Callable, ops: Sequence) -> None:
    """Run ``ops`` on ``factory(vnodes, seed)`` and on the oracle; raise AssertionError at the first
    difference (module docstring)."""
    ops = list(ops)
    if not ops or ops[0][0] != "config":
        ops = [("config", 2, 0)] + ops
    _, vnodes, seed = ops[0]
    ring, names = factory(vnodes, seed), []
    for op in ops[1:]:
        kind, arg = op
        before = None
        if names:
            before = {k: ring.lookup(k) for k in _PROBE}
        if kind == "add":
            if arg in names:
                if not _raises(ring.add, arg):
                    raise AssertionError(f"{op}: {arg!r} is already on the ring; add must raise ValueError")
                continue
            ring.add(arg)
            names.append(arg)
        elif kind == "remove":
            if arg not in names:
                if not _raises(ring.remove, arg):
                    raise AssertionError(f"{op}: {arg!r} is not on the ring; remove must raise ValueError")
                continue
            ring.remove(arg)
            names.remove(arg)
        elif kind == "lookup":
            if not names:
                if not _raises(ring.lookup, arg):
                    raise AssertionError(f"{op}: the ring is empty; lookup must raise ValueError")
                continue
            got = ring.lookup(arg)
            want = brute_force_owner(_points(names, vnodes, seed), hash64(arg, seed))
            if got != want:
                raise AssertionError(f"{op}: returned {got!r}; the first point at or after hash64({arg!r}) = "
                                     f"{hash64(arg, seed)} belongs to {want!r} (replicas {names}, vnodes {vnodes})")
            continue
        else:
            raise ValueError(f"unknown operation {op!r}")
        if before is not None and names:
            after = {k: ring.lookup(k) for k in _PROBE}
            for k in _PROBE:
                if before[k] == after[k]:
                    continue
                if kind == "add" and after[k] != arg:
                    raise AssertionError(f"{op}: key {k!r} moved from {before[k]!r} to {after[k]!r}; adding a "
                                         f"replica may move keys only to it")
                if kind == "remove" and before[k] != arg:
                    raise AssertionError(f"{op}: key {k!r} moved from {before[k]!r} to {after[k]!r}; removing "
                                         f"{arg!r} may move only its own keys")


def random_ops(seed: int, n: int = 30, replicas: int = 5) -> tuple:
    """A random program of adds, removes and lookups (some repeated or invalid on purpose)."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = [("config", int(rng.integers(1, 6)), int(rng.integers(0, 1000)))]
    for _ in range(n):
        r = rng.random()
        name = f"r{int(rng.integers(replicas))}"
        if r < 0.3:
            ops.append(("add", name))
        elif r < 0.4:
            ops.append(("remove", name))
        else:
            ops.append(("lookup", f"key{int(rng.integers(10_000))}"))
    return tuple(ops)


def _past_last_point(vnodes: int, seed: int, names) -> str:
    """A key whose hash is above every point of ``names`` (it must wrap to the first point)."""
    top = max(h for h, _ in _points(names, vnodes, seed))
    return next(f"wrap{i}" for i in range(100_000) if hash64(f"wrap{i}", seed) > top)


def cases() -> list[Case]:
    """Hand-made cases (each shows one classic defect), then random programs."""
    three = [("add", "a"), ("add", "b"), ("add", "c")]
    return [
        Case("empty ring lookup refused", (("config", 1, 0), ("lookup", "x"))),
        Case("one replica owns everything", (("config", 1, 0), ("add", "a"), ("lookup", "x"), ("lookup", "y"))),
        Case("a key past the last point wraps to the first",
             (("config", 1, 3), *three, ("lookup", _past_last_point(1, 3, "abc")))),
        Case("a key hashing exactly onto a point belongs to it",
             (("config", 2, 1), *three, ("lookup", "b#1"), ("lookup", "c#0"))),
        Case("every virtual node counts", (("config", 4, 7), *three,
                                           *[("lookup", f"k{i}") for i in range(20)])),
        Case("remove takes all of a replica's points", (("config", 3, 5), *three, ("remove", "b"),
                                                        *[("lookup", f"k{i}") for i in range(20)])),
        Case("adding a replica moves keys only to it", (("config", 2, 11), *three, ("add", "d"))),
        Case("duplicate add and unknown remove refused", (("config", 1, 0), ("add", "a"), ("add", "a"),
                                                          ("remove", "z"))),
        *[Case(f"random program {k}", random_ops(k)) for k in range(10)],
    ]


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first
    failing program, shrunk (a program shrunk past its config line runs with (2, 0))."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops))
