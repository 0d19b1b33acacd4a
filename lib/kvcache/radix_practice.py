"""Practice mode for the radix prefix cache (I090, N027): a predictive model and two graders.

:class:`RadixModel` predicts, without a tree, without slots and without looking at the cache it
checks, what an LRU leaf-evicting radix cache must do. Its state is the set of cached token
*positions* (each one a prefix of some cached sequence, so the set is prefix-closed), and per
position the tick of its last use and how many locks pin it. The node boundaries of the tree are
exactly the positions where some lookup or insert ended (``marks``): a walk that ends inside an
edge splits it there, an insert ends its new leaf at the sequence's end, and nothing ever merges.
A leaf is a marked position with no cached extension; its edge runs back to the previous mark.
Eviction removes the unpinned leaf edge used least recently, repeatedly, until enough tokens are
free (a parent whose last child went becomes a leaf in turn), so the model predicts which tokens
go, how many ``evict`` frees, when ``insert`` raises ``OutOfSlots``, and how long every match is.

:func:`check_radix_cache` grades any implementation of the I090 interface (a factory taking the
pool size) on scripted and seeded random programs: match lengths and freed counts against the
model, every returned slot against the token prefix it was filled with (provenance, tracked by the
grader from what ``insert`` returned), free-slot counts, and refusals (unlock without a lock of
one's own, a handle whose node was evicted). :func:`check_hit_counter` grades the simpler N027
interface (``serve(tokens) -> hit tokens``) against brute force (unbounded) and the model
(bounded). Both print the first failing case shrunk (:func:`lib.book.practice.grade`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .prefix_hits import longest_common_prefix
from .radix import OutOfSlots, RadixCache
from .radix_scenarios import RadixOp, radix_scenario

__all__ = [
    "RADIX_VARIANTS",
    "HIT_COUNTER_VARIANTS",
    "RadixHitCounter",
    "RadixModel",
    "check_hit_counter",
    "check_radix_cache",
    "hit_counter_cases",
    "radix_cases",
    "radix_variant",
    "hit_counter_variant",
]


class RadixModel:
    """What an LRU leaf-evicting radix cache over ``num_slots`` token slots must do (see module).

    Operations mirror :class:`lib.kvcache.RadixCache`: :meth:`walk` (a lookup: returns the
    matched length), :meth:`insert` (returns the reused length, or raises ``OutOfSlots``),
    :meth:`lock` / :meth:`unlock` of the position a handle ends at, :meth:`evict`.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = integer("num_slots", num_slots, 1)
        self.tick: dict[tuple[int, ...], int] = {}  # cached position -> last use
        self.locks: dict[tuple[int, ...], int] = {}  # cached position -> locks pinning it
        self.children: dict[tuple[int, ...], int] = {}  # cached position -> cached extensions
        self.marks: set[tuple[int, ...]] = set()  # node ends
        self.own: dict[tuple[int, ...], int] = {}  # lock() calls on exactly this node end
        self.born: dict[tuple[int, ...], int] = {}  # cached position -> serial of the insert that cached it
        self.clock = 0
        self._serial = 0

    @property
    def num_cached(self) -> int:
        return len(self.tick)

    @property
    def num_free(self) -> int:
        return self.num_slots - len(self.tick)

    def cached(self, prefix: Sequence[int]) -> bool:
        return tuple(prefix) in self.tick

    def walk(self, tokens: Sequence[int]) -> int:
        """A lookup: the longest cached prefix; every position on it is used now; it ends a node."""
        tokens = tuple(tokens)
        self.clock += 1
        m = 0
        while m < len(tokens) and tokens[: m + 1] in self.tick:
            m += 1
            self.tick[tokens[:m]] = self.clock
        if m:
            self.marks.add(tokens[:m])
        return m

    def insert(self, tokens: Sequence[int]) -> int:
        """Cache ``tokens``; evict (never the matched prefix) if short. Returns the reused length."""
        tokens = tuple(tokens)
        m = self.walk(tokens)
        need = len(tokens) - m
        if need == 0:
            return m
        if need > self.num_free:
            keep = tokens[:m]
            if m:
                self._pin(keep, +1)
            self.evict(need - self.num_free)
            if m:
                self._pin(keep, -1)
            if need > self.num_free:
                raise OutOfSlots(f"need {need} free slots, only {self.num_free} after evicting every unpinned leaf")
        self._serial += 1
        for k in range(m + 1, len(tokens) + 1):
            p = tokens[:k]
            self.born[p] = self._serial
            self.tick[p] = self.clock
            self.locks[p] = 0
            self.children[p] = 0
            if k > 1:
                self.children[p[:-1]] += 1
        self.marks.add(tokens)
        return m

    def handle(self, end: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """What a node handle ending at ``end`` stands for now: (end, serial of the tokens it holds)."""
        return end, self.born.get(end, 0)

    def _alive(self, handle: tuple[tuple[int, ...], int]) -> tuple[int, ...]:
        end, serial = handle
        if self.born.get(end) != serial:
            raise ValueError("the node is gone")
        return end

    def lock(self, handle: tuple[tuple[int, ...], int]) -> None:
        """Pin the path to a handle's node (ValueError if its node was evicted since)."""
        end = self._alive(handle)
        self.own[end] = self.own.get(end, 0) + 1
        self._pin(end, +1)

    def unlock(self, handle: tuple[tuple[int, ...], int]) -> None:
        """Undo one lock() of this very node (ValueError if it holds none, or was evicted)."""
        end = self._alive(handle)
        if not self.own.get(end):
            raise ValueError("no lock of its own")
        self.own[end] -= 1
        self._pin(end, -1)

    def _pin(self, end: tuple[int, ...], delta: int) -> None:
        for k in range(1, len(end) + 1):
            self.locks[end[:k]] += delta

    def _leaf_edge(self, end: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The positions of the leaf edge ending at ``end``: back to the previous node end."""
        edge = [end]
        k = len(end) - 1
        while k > 0 and end[:k] not in self.marks:
            edge.append(end[:k])
            k -= 1
        return edge

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` by removing unpinned leaf edges, least recently used first."""
        want = integer("num_tokens", num_tokens, 0)
        freed = 0
        while freed < want:
            leaves = [p for p in self.marks if p in self.tick and self.children[p] == 0 and self.locks[p] == 0]
            if not leaves:
                break
            victim = min(leaves, key=lambda p: (self.tick[p], len(p), p))
            for p in self._leaf_edge(victim):
                del self.tick[p], self.locks[p], self.children[p], self.born[p]
                self.marks.discard(p)
                self.own.pop(p, None)
                freed += 1
                if len(p) > 1:
                    self.children[p[:-1]] -= 1
        return freed


# ---- grading an implementation of the I090 interface ----------------------------------------


def _slots_and_node(result) -> tuple[tuple[int, ...], object]:
    """(slots, node) from a PrefixMatch-like object or a (slots, node) pair."""
    if hasattr(result, "slots") and hasattr(result, "node"):
        return tuple(result.slots), result.node
    try:
        slots, node = result
    except (TypeError, ValueError):
        raise AssertionError(f"match_prefix/insert must return (slots, node) or an object with .slots and .node, "
                             f"got {result!r}") from None
    return tuple(slots), node


def _is_out_of_slots(err: Exception) -> bool:
    return isinstance(err, OutOfSlots) or type(err).__name__ == "OutOfSlots"


def _describe_radix(ops: Sequence) -> str:
    lines, step = [], 0
    for op in ops:
        if op.kind == "pool":
            lines.append(f"  cache = factory(num_slots={op.count})")
        else:
            step += 1
            lines.append(f"  step {step}: {op.describe()}")
    return "\n".join(lines)


DEFAULT_POOL = 12


def run_radix_program(factory: Callable[[int], object], ops: Sequence[RadixOp]) -> None:
    """Replay ``ops`` on ``factory(num_slots)`` beside a :class:`RadixModel`; raise AssertionError
    at the first difference (a leading ``RadixOp("pool", count=n)`` sets the pool size)."""
    ops = list(ops)
    num_slots = ops[0].count if ops and ops[0].kind == "pool" else DEFAULT_POOL
    cache, model = factory(num_slots), RadixModel(num_slots)
    owner: dict[int, tuple[tuple[int, ...], int]] = {}  # slot -> (token prefix its KV was filled with, serial)
    handles: dict[int, tuple[object, tuple[int, ...]]] = {}  # step -> (node, prefix it ends at)

    def check_slots(step: int, tokens: tuple[int, ...], slots: tuple[int, ...], upto: int, what: str) -> None:
        if len(set(slots)) != len(slots):
            raise AssertionError(f"step {step}: {what} returned the same slot twice: {list(slots)}")
        for i, s in enumerate(slots[:upto]):
            if owner.get(s, ((), 0))[0] != tokens[: i + 1]:
                raise AssertionError(
                    f"step {step}: {what} returned slot {s} for position {i}, but that slot holds the KV of "
                    + (f"{list(owner[s][0])}" if s in owner else "nothing cached")
                    + f", not of {list(tokens[: i + 1])}")

    def check_free(step: int) -> None:
        got = getattr(cache, "num_free_slots", None)
        got = got() if callable(got) else got
        if got is not None and got != model.num_free:
            raise AssertionError(f"after step {step}: num_free_slots is {got}; the tokens still cached leave "
                                 f"{model.num_free} of {num_slots} free")

    for step, op in enumerate((op for op in ops if op.kind != "pool"), 1):
        if op.kind == "match":
            m = model.walk(op.tokens)
            slots, node = _slots_and_node(cache.match_prefix(list(op.tokens)))
            if len(slots) != m:
                raise AssertionError(f"step {step}: match_prefix matched {len(slots)} tokens; the cached tokens "
                                     f"give a longest prefix of {m}")
            check_slots(step, op.tokens, slots, m, "match_prefix")
            handles[step] = (node, model.handle(op.tokens[:m]))
        elif op.kind == "insert":
            try:
                m = model.insert(op.tokens)
                expect_oos = None
            except OutOfSlots as err:
                expect_oos = err
            try:
                result = cache.insert(list(op.tokens))
            except Exception as err:  # noqa: BLE001 - the candidate's refusal is judged here
                if expect_oos is not None and _is_out_of_slots(err):
                    check_free(step)
                    continue
                if expect_oos is None and _is_out_of_slots(err):
                    raise AssertionError(f"step {step}: insert raised OutOfSlots, but evicting unpinned LRU leaves "
                                         f"frees enough room ({model.num_free + len(op.tokens) - m} free before "
                                         "the insert)") from None
                raise
            if expect_oos is not None:
                raise AssertionError(f"step {step}: insert succeeded, but even after evicting every unpinned leaf "
                                     f"only {model.num_free} slots are free for {len(op.tokens)} tokens "
                                     "(it should raise OutOfSlots)")
            slots, node = _slots_and_node(result)
            if len(slots) != len(op.tokens):
                raise AssertionError(f"step {step}: insert returned {len(slots)} slots for {len(op.tokens)} tokens")
            check_slots(step, op.tokens, slots, m, "insert (reused part)")
            for i in range(m, len(op.tokens)):
                s = slots[i]
                if not (isinstance(s, int) and 0 <= s < num_slots):
                    raise AssertionError(f"step {step}: slot {s!r} is outside the pool 0..{num_slots - 1}")
                if s in owner and model.handle(owner[s][0]) == owner[s]:
                    raise AssertionError(
                        f"step {step}: insert handed out slot {s} for a new token, but it still holds the cached "
                        f"KV of {list(owner[s][0])} (never evicted): two prefixes now share one slot")
            for i in range(m, len(op.tokens)):
                owner[slots[i]] = model.handle(op.tokens[: i + 1])
            handles[step] = (node, model.handle(op.tokens))
        elif op.kind in ("lock", "unlock"):
            if op.ref not in handles:
                continue  # the step it names returned nothing (out of slots, or not a lookup)
            node, end = handles[op.ref]
            if not end[0]:
                continue  # the root (an empty match): nothing to pin
            try:
                getattr(model, op.kind)(end)
                expected = None
            except ValueError as err:
                expected = err
            try:
                getattr(cache, op.kind)(node)
            except ValueError as err:
                if expected is None:
                    raise AssertionError(f"step {step}: {op.kind} refused ({err}), but that node is cached and "
                                         + ("may be locked" if op.kind == "lock" else "holds a lock of its own")
                                         ) from None
                check_free(step)
                continue
            if expected is not None:
                raise AssertionError(f"step {step}: {op.kind} was accepted, but "
                                     + ("the node was evicted" if str(expected) == "the node is gone" else
                                        "that node holds no lock() of its own (only locked descendants pin it): "
                                        "lock counts now go wrong and tokens stay pinned forever")
                                     + " (it should raise ValueError)")
        elif op.kind == "evict":
            want = model.evict(op.count)
            got = cache.evict(op.count)
            if got != want:
                raise AssertionError(f"step {step}: evict({op.count}) freed {got} tokens; removing unpinned leaves "
                                     f"least recently used first frees {want}")
        else:
            raise ValueError(f"unknown operation {op.kind!r}")
        check_free(step)


def _random_radix_program(rng: random.Random, num_ops: int, vocab: int) -> list[RadixOp]:
    ops: list[RadixOp] = []
    inserted: list[int] = []
    locked: list[int] = []
    for step in range(1, num_ops + 1):
        r = rng.random()
        if r < 0.45 or not inserted:
            length = rng.randint(1, 6)
            base = ops[rng.choice(inserted) - 1].tokens if inserted and rng.random() < 0.6 else ()
            cut = rng.randint(0, len(base))
            tokens = base[:cut] + tuple(rng.randrange(vocab) for _ in range(length))
            ops.append(RadixOp("insert", tokens))
            inserted.append(step)
        elif r < 0.6:
            base = ops[rng.choice(inserted) - 1].tokens
            tokens = base[: rng.randint(1, len(base))] + tuple(rng.randrange(vocab) for _ in range(rng.randint(0, 2)))
            ops.append(RadixOp("match", tokens))
        elif r < 0.75:
            ref = rng.choice(inserted)
            ops.append(RadixOp("lock", ref=ref))
            locked.append(ref)
        elif r < 0.88 and locked:
            ops.append(RadixOp("unlock", ref=locked.pop(rng.randrange(len(locked)))))
        elif r < 0.92:
            ops.append(RadixOp("unlock", ref=rng.choice(inserted)))  # maybe not locked: must be refused
        else:
            ops.append(RadixOp("evict", count=rng.randint(1, 6)))
    return ops


def radix_cases(num_random: int = 120, *, seed: int = 0) -> list[Case]:
    """The scripted scenarios (pools of 12 and 24), the extra-unlock regression, and
    ``num_random`` seeded random programs (vocabulary of 3-4 tokens, pools of 6-16 slots)."""
    n = integer("num_random", num_random, 0)
    pool = lambda k: RadixOp("pool", count=k)  # noqa: E731
    cases = []
    for name in ("edge_split", "pin_and_evict", "evict_cascade", "chat", "agent"):
        for slots in (12, 24):
            cases.append(Case(f"scenario {name}, {slots} slots", (pool(slots), *radix_scenario(name)[1])))
    cases.append(Case("unlock twice under a locked descendant", (
        pool(12), RadixOp("insert", (1, 2)), RadixOp("lock", ref=1), RadixOp("insert", (1, 2, 3)),
        RadixOp("lock", ref=3), RadixOp("unlock", ref=1), RadixOp("unlock", ref=1))))
    rng = random.Random(seed)
    for k in range(n):
        ops = _random_radix_program(rng, rng.randint(8, 30), rng.choice((3, 4)))
        cases.append(Case(f"random program {k}", (pool(rng.randint(6, 16)), *ops)))
    return cases


def check_radix_cache(factory: Callable[[int], object], *, num_random: int = 120, seed: int = 0) -> PracticeReport:
    """Grade any radix cache: ``factory(num_slots)`` builds one with ``match_prefix``, ``insert``
    (each returning ``(slots, node)`` or an object with ``.slots`` and ``.node``), ``lock(node)``,
    ``unlock(node)``, ``evict(num_tokens) -> freed`` and ``num_free_slots``; raises ``OutOfSlots``
    (lib.kvcache.radix) when an insert cannot fit. The first failing case is shown shrunk."""
    return grade("radix prefix cache", lambda: factory, radix_cases(num_random, seed=seed), run_radix_program,
                 describe=_describe_radix)


# ---- defective variants (for the tests: each must fail the grader) ----------------------------


def radix_variant(name: str) -> Callable[[int], RadixCache]:
    """A factory for the reference (``"reference"``) or a cache with one classic defect (``RADIX_VARIANTS``)."""
    from .radix_scenarios import DefectiveRadixCache

    if name == "reference":
        return RadixCache
    if name in DefectiveRadixCache.DEFECTS:
        return lambda n: DefectiveRadixCache(n, name)
    if name not in _EXTRA:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(RADIX_VARIANTS)}, got {name!r}")
    return lambda n: _EXTRA[name](n)


class _SplitDropsLock(RadixCache):
    def _split(self, child, at):
        upper = super()._split(child, at)
        upper.lock_count = 0  # the shared half forgets the running request's pin
        return upper


class _NoCascade(RadixCache):
    def evict(self, num_tokens):
        freed = 0
        leaves = sorted((n for n in self.nodes() if not n.children and n.lock_count == 0),
                        key=lambda n: (n.last_access, n.node_id))
        for leaf in leaves:  # a parent that becomes a leaf is not considered in this call
            if freed >= num_tokens:
                break
            del leaf.parent.children[leaf.tokens[0]]
            self._free_slots.extend(reversed(leaf.slots))
            self._num_cached_tokens -= len(leaf.tokens)
            freed += len(leaf.tokens)
            leaf.evicted, leaf.parent = True, None
        return freed


class _LookupDoesNotTouch(RadixCache):
    def match_prefix(self, tokens):
        saved = {n: n.last_access for n in self.nodes()}
        result = super().match_prefix(tokens)
        for n in self.nodes():
            if n in saved:
                n.last_access = saved[n]
        return result


class _UnlockAnyLocked(RadixCache):
    def unlock(self, node):
        path = self._path_to_root(node)
        if node is not self.root and node.lock_count == 0:
            raise ValueError("not locked")
        node.own_locks = max(0, node.own_locks - 1)
        for p in path:
            p.lock_count -= 1


class _MostRecentFirst(RadixCache):
    def evict(self, num_tokens):
        for n in self.nodes():
            n.last_access = -n.last_access
        try:
            return super().evict(num_tokens)
        finally:
            for n in self.nodes():
                n.last_access = -n.last_access


_EXTRA = {"split_drops_lock": _SplitDropsLock, "eviction_no_cascade": _NoCascade,
          "lookup_does_not_touch": _LookupDoesNotTouch, "unlock_any_locked": _UnlockAnyLocked,
          "evicts_most_recent": _MostRecentFirst}
RADIX_VARIANTS = ("split_keeps_slots", "evict_ignores_pins", *_EXTRA)


# ---- N027: a hit counter (serve a request, report its hit) -------------------------------------


class RadixHitCounter:
    """Reference for the N027 interface: ``serve(tokens)`` returns the tokens found cached, then
    caches the rest (``capacity`` tokens; None = unbounded), evicting LRU leaves when full."""

    def __init__(self, capacity: int | None) -> None:
        self._unbounded = capacity is None
        self._cache = RadixCache(64 if capacity is None else capacity)

    def serve(self, tokens: Sequence[int]) -> int:
        cache = self._cache
        hit = cache.match_prefix(tokens).num_tokens
        if self._unbounded and len(tokens) > cache.num_free_slots:  # grow the pool instead of evicting
            extra = range(cache.num_slots, cache.num_slots + len(tokens))
            cache._free_slots[:0] = reversed(extra)
            cache._num_slots += len(extra)
        cache.insert(tokens)
        return hit


def _describe_serve(ops: Sequence) -> str:
    lines = []
    for op in ops:
        if op[0] == "capacity":
            lines.append(f"  cache = factory(capacity={op[1]})")
        else:
            lines.append(f"  serve({list(op[1])})")
    return "\n".join(lines)


def run_serve_program(factory: Callable, ops: Sequence) -> None:
    """Serve each request; hits must equal brute force (unbounded) or the :class:`RadixModel` (bounded)."""
    ops = list(ops)
    capacity = ops[0][1] if ops and ops[0][0] == "capacity" else None
    cache = factory(capacity)
    model = RadixModel(capacity) if capacity is not None else None
    seen: list[tuple[int, ...]] = []
    for k, op in enumerate(ops, 1):
        if op[0] != "serve":
            continue
        tokens = tuple(op[1])
        if model is None:
            want = max((longest_common_prefix(tokens, s) for s in seen), default=0)
            why = "the longest common prefix with any earlier request"
        else:
            want = model.walk(tokens)
            model.insert(tokens)
            why = f"what a {capacity}-token cache still holds after evicting LRU leaves"
        got = cache.serve(list(tokens))
        if got != want:
            raise AssertionError(f"request {k}: serve returned {got} hit tokens; {why} gives {want}")
        seen.append(tokens)


def hit_counter_cases(num_random: int = 60, *, seed: int = 0) -> list[Case]:
    """Seeded chat and agent traces and random prompts (vocabulary 3-5), unbounded and bounded."""
    from .workloads import branching_agent_trace, multi_turn_chat_trace

    rng = random.Random(seed)
    cases = []
    for k in range(integer("num_random", num_random, 0)):
        kind = k % 3
        if kind == 0:
            trace = multi_turn_chat_trace(rng.randint(2, 4), rng.randint(2, 4), system_prompt_tokens=rng.randint(0, 4),
                                          user_tokens=2, reply_tokens=2, vocab_size=rng.randint(3, 5), seed=k)
        elif kind == 1:
            trace = branching_agent_trace(rng.randint(4, 12), system_prompt_tokens=rng.randint(0, 4), step_tokens=3,
                                          max_depth=3, vocab_size=rng.randint(3, 5), seed=k)
        else:
            trace = [tuple(rng.randrange(3) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(3, 12))]
        trace = [t for t in trace if t]
        longest = max(len(t) for t in trace)
        capacity = None if k % 2 == 0 else rng.randint(longest, longest + 12)
        cases.append(Case(f"trace {k} ({'unbounded' if capacity is None else f'{capacity} tokens'})",
                          (("capacity", capacity), *(("serve", t) for t in trace))))
    return cases


def check_hit_counter(factory: Callable, *, num_random: int = 60, seed: int = 0) -> PracticeReport:
    """Grade any ``factory(capacity)`` whose ``serve(tokens)`` returns the request's hit tokens."""
    return grade("prefix-cache hit counter", lambda: factory, hit_counter_cases(num_random, seed=seed),
                 run_serve_program, describe=_describe_serve)


class _ExactPromptCache(RadixHitCounter):
    def __init__(self, capacity):
        self._seen = set()

    def serve(self, tokens):
        tokens = tuple(tokens)
        hit = len(tokens) if tokens in self._seen else 0
        self._seen.add(tokens)
        return hit


class _TokenLru(RadixHitCounter):
    """A trie with one node per token and LRU over single tokens: evicts inside edges."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.tick: dict[tuple, int] = {}
        self.clock = 0

    def serve(self, tokens):
        tokens = tuple(tokens)
        self.clock += 1
        hit = 0
        while hit < len(tokens) and tokens[: hit + 1] in self.tick:
            hit += 1
        for k in range(1, len(tokens) + 1):
            self.tick[tokens[:k]] = self.clock
        if self.capacity is not None:
            while len(self.tick) > self.capacity:
                leaves = [p for p in self.tick if not any(q[:-1] == p for q in self.tick if len(q) == len(p) + 1)]
                del self.tick[min(leaves, key=lambda p: (self.tick[p], -len(p)))]
        return hit


class _HitsWholeRequestOnce(RadixHitCounter):
    def serve(self, tokens):
        hit = super().serve(tokens)
        return hit if hit < len(tokens) else hit - 1  # caps a full hit at L - 1 (an engine detail, not the hit)


def hit_counter_variant(name: str) -> Callable:
    """A factory for the reference (``"reference"``) or a defective counter (``HIT_COUNTER_VARIANTS``)."""
    table = {"reference": RadixHitCounter, "exact_prompt_only": _ExactPromptCache, "token_lru": _TokenLru,
             "caps_full_hits": _HitsWholeRequestOnce}
    if name not in table:
        raise ValueError(f"variant must be one of {', '.join(table)}, got {name!r}")
    return table[name]


HIT_COUNTER_VARIANTS = ("exact_prompt_only", "token_lru", "caps_full_hits")
