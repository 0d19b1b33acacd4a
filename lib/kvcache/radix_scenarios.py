"""Radix-tree prefix cache tools (I090): a text rendering of the tree, scripted operation
scenarios and their replay, an oracle check (match lengths and evictions predicted by
:class:`lib.kvcache.radix_practice.RadixModel`,
slot provenance and accounting, pins) and two defective caches that the check catches.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lib.inputs import integer
from lib.kvcache import (
    OutOfSlots,
    RadixCache,
    branching_agent_trace,
    multi_turn_chat_trace,
)
from lib.kvcache.prefix_hits import longest_common_prefix
from lib.kvcache.radix import RadixNode
from lib.registry.data import unknown_name

# ---- radix tree: rendering, scenarios, oracle, defects ----------------------------------------


def _ranges(slots: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    if not slots:
        return "-"
    parts, start, prev = [], slots[0], slots[0]
    for s in list(slots[1:]) + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ",".join(parts)


def _edge_label(tokens: Sequence[int], max_tokens: int) -> str:
    shown = " ".join(map(str, tokens[:max_tokens]))
    more = len(tokens) - max_tokens
    return f"[{shown}{f' …+{more}' if more > 0 else ''}]"


def render_radix_tree(cache: RadixCache, *, max_tokens_shown: int = 8) -> list[str]:
    """The tree as text, one line per node (children in token order):

    ``├─ [1 2 3] slots 0-2 · lock 1 · t=3``: edge tokens, their KV slots, lock count (pinned by
    running requests) and last access time (the LRU clock).
    """
    if not isinstance(cache, RadixCache):
        raise ValueError(f"cache must be a RadixCache, got {type(cache).__name__}")
    max_tokens_shown = integer("max_tokens_shown", max_tokens_shown, 1)
    lines = [
        f"root ({cache.num_cached_tokens} cached, {cache.num_free_slots} free of {cache.num_slots})"
    ]

    def walk(node: RadixNode, prefix: str) -> None:
        kids = [node.children[k] for k in sorted(node.children)]
        for i, child in enumerate(kids):
            last = i == len(kids) - 1
            lock = f" · lock {child.lock_count}" if child.lock_count else ""
            lines.append(
                f"{prefix}{'└─ ' if last else '├─ '}{_edge_label(child.tokens, max_tokens_shown)}"
                f" slots {_ranges(child.slots)}{lock} · t={child.last_access}"
            )
            walk(child, prefix + ("   " if last else "│  "))

    walk(cache.root, "")
    return lines


@dataclass(frozen=True)
class RadixOp:
    """One scripted operation: insert/match ``tokens``, lock/unlock the node step ``ref`` returned,
    or evict ``count`` tokens."""

    kind: str
    tokens: tuple[int, ...] = ()
    ref: int = 0
    count: int = 0

    def describe(self) -> str:
        if self.kind in ("insert", "match"):
            return f"{self.kind} {_edge_label(self.tokens, 12)}"
        if self.kind in ("lock", "unlock"):
            return f"{self.kind} the node step {self.ref} returned"
        return f"evict {self.count} tokens"


def parse_radix_program(text: str) -> list[RadixOp]:
    """Operations typed as text, separated by ";" or new lines:
    ``insert 1 2 3``, ``match 1 2`` (tokens: integers, spaces or commas), ``lock 1`` /
    ``unlock 1`` (the node that step 1 returned; steps count from 1), ``evict 4`` (tokens).

    Raises ValueError naming the first operation it cannot read.
    """
    ops = []
    for item in (part.strip() for part in str(text).replace("\n", ";").split(";")):
        if not item:
            continue
        kind, _, rest = item.partition(" ")
        fields = rest.replace(",", " ").split()
        if not fields or not all(f.lstrip("-").isdigit() for f in fields):
            kind = ""
        if kind in ("insert", "match") and all(int(f) >= 0 for f in fields):
            ops.append(RadixOp(kind, tuple(int(f) for f in fields)))
        elif kind in ("lock", "unlock", "evict") and len(fields) == 1 and int(fields[0]) >= 1:
            ops.append(RadixOp(kind, ref=int(fields[0])) if kind != "evict" else RadixOp(kind, count=int(fields[0])))
        else:
            raise ValueError(f"cannot read {item!r}: write insert 1 2 3, match 1 2, lock 1, unlock 1 or evict 4 "
                             "(tokens >= 0; a lock names the step, from 1, whose node it pins)")
    if not ops:
        raise ValueError("the program is empty: type operations such as insert 1 2 3; lock 1")
    return ops


def _radix_scenarios() -> dict[str, tuple[str, list[RadixOp]]]:
    ins = lambda *t: RadixOp("insert", tuple(t))  # noqa: E731
    match = lambda *t: RadixOp("match", tuple(t))  # noqa: E731
    chat = multi_turn_chat_trace(
        3, 3, system_prompt_tokens=4, user_tokens=2, reply_tokens=2, vocab_size=10, seed=0
    )
    agent = branching_agent_trace(
        10, system_prompt_tokens=4, step_tokens=3, max_depth=3, vocab_size=10, seed=1
    )
    return {
        "edge_split": (
            "inserts that diverge inside an edge split it; a match that ends inside one splits too",
            [
                ins(1, 2, 3, 4, 5, 6),
                ins(1, 2, 3, 7, 8),
                match(1, 2, 9),
                ins(1, 2, 3, 4, 5, 6, 10, 11),
                ins(4, 4),
                match(1, 2, 3, 4, 5, 6, 10, 11, 12),
            ],
        ),
        "pin_and_evict": (
            "a running request pins its path; eviction skips it until it is unlocked",
            [
                ins(1, 2, 3, 4, 5),
                RadixOp("lock", ref=1),
                ins(1, 2, 3, 8, 9),
                ins(6, 6, 6, 6),
                ins(7, 7, 7, 7),
                RadixOp("unlock", ref=1),
                RadixOp("evict", count=5),
            ],
        ),
        "evict_cascade": (
            "leaves go first, LRU order; a parent whose last child left becomes a leaf in turn",
            [
                ins(1, 2, 3, 4),
                ins(1, 2, 3, 5),
                ins(1, 2, 6),
                ins(9, 9),
                match(9, 9),
                RadixOp("evict", count=1),
                RadixOp("evict", count=2),
                RadixOp("evict", count=3),
            ],
        ),
        "chat": (
            "a 3-conversation, 3-turn chat trace (4-token system prompt)",
            [RadixOp("insert", r) for r in chat],
        ),
        "agent": (
            "a branching agent trace: each request extends an earlier one",
            [RadixOp("insert", r) for r in agent],
        ),
    }


RADIX_SCENARIOS = tuple(_radix_scenarios())


def radix_scenario(name: str) -> tuple[str, list[RadixOp]]:
    """(description, operations) of a scripted scenario; names in ``RADIX_SCENARIOS``."""
    scenarios = _radix_scenarios()
    if name not in scenarios:
        raise unknown_name("radix scenario", name, list(scenarios))
    return scenarios[name]


@dataclass(frozen=True)
class RadixStep:
    """State after one operation (step 0 = the empty cache)."""

    index: int
    op: str
    result: str
    tree: tuple[str, ...]
    num_cached: int
    num_free: int
    num_pinned: int
    slot_state: tuple[str, ...]  # per slot: 'free', 'cached' or 'pinned'


def _slot_state(cache: RadixCache) -> tuple[str, ...]:
    state = ["free"] * cache.num_slots
    for node in cache.nodes():
        for s in node.slots:
            state[s] = "pinned" if node.lock_count else "cached"
    return tuple(state)


def replay_radix(
    ops: Sequence[RadixOp], num_slots: int, upto: int | None = None
) -> list[RadixStep]:
    """Run ``ops`` on a fresh ``RadixCache(num_slots)``; the state after each (steps 0..upto).

    Failures (OutOfSlots, unlocking an unlocked node) are reported in the step's result, not
    raised, so a reader can see them.
    """
    n = integer("num_slots", num_slots, 1)
    upto = len(ops) if upto is None else min(integer("upto", upto, 0), len(ops))
    cache = RadixCache(n)
    returned: dict[int, RadixNode] = {}

    def snap(i: int, op: str, result: str) -> RadixStep:
        return RadixStep(
            i,
            op,
            result,
            tuple(render_radix_tree(cache)),
            cache.num_cached_tokens,
            cache.num_free_slots,
            cache.num_pinned_tokens,
            _slot_state(cache),
        )

    steps = [snap(0, "start", "empty cache")]
    for i, op in enumerate(ops[:upto], start=1):
        try:
            if op.kind == "insert":
                hit = cache.match_prefix(op.tokens).num_tokens
                m = cache.insert(op.tokens)
                returned[i] = m.node
                result = f"reused {hit} tokens, new slots {_ranges(m.slots[hit:])}"
            elif op.kind == "match":
                m = cache.match_prefix(op.tokens)
                returned[i] = m.node
                result = f"matched {m.num_tokens} tokens, slots {_ranges(m.slots)}"
            elif op.kind in ("lock", "unlock"):
                if op.ref not in returned:
                    raise ValueError(f"step {op.ref} returned no node")
                getattr(cache, op.kind)(returned[op.ref])
                result = f"{op.kind}ed; pinned tokens now {cache.num_pinned_tokens}"
            elif op.kind == "evict":
                freed = cache.evict(op.count)
                result = f"freed {freed} tokens"
            else:
                raise ValueError(f"unknown operation {op.kind!r}")
        except ValueError as err:
            result = f"{type(err).__name__}: {err}"
        steps.append(snap(i, op.describe(), result))
    return steps


class DefectiveRadixCache(RadixCache):
    """RadixCache with one classic bug, for the oracle to catch.

    * ``split_keeps_slots``: an edge split gives the new upper node the first slots but forgets
      to cut them from the lower node, so two nodes own them and both free them (a double free).
    * ``evict_ignores_pins``: eviction takes any leaf, locked or not, so a running request's
      KV slots go back to the pool and are handed to the next insert.
    """

    DEFECTS = ("split_keeps_slots", "evict_ignores_pins")

    def __init__(self, num_slots: int, defect: str) -> None:
        if defect not in self.DEFECTS:
            raise ValueError(f"defect must be one of {', '.join(self.DEFECTS)}, got {defect!r}")
        super().__init__(num_slots)
        self.defect = defect

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        if self.defect != "split_keeps_slots":
            return super()._split(child, at)
        upper = self._new_node(child.tokens[:at], child.slots[:at], parent=child.parent)
        upper.lock_count, upper.last_access = child.lock_count, child.last_access
        child.parent.children[child.tokens[0]] = upper
        child.tokens, child.parent = child.tokens[at:], upper  # BUG: child.slots not cut
        upper.children[child.tokens[0]] = child
        return upper

    def evict(self, num_tokens: int) -> int:
        if self.defect != "evict_ignores_pins":
            return super().evict(num_tokens)
        num_tokens = integer("num_tokens", num_tokens, 0)
        heap = [
            (n.last_access, n.node_id, n) for n in self.nodes() if not n.children
        ]  # BUG: no lock check
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            self._free_slots.extend(reversed(leaf.slots))
            self._num_cached_tokens -= len(leaf.tokens)
            freed += len(leaf.tokens)
            leaf.evicted, leaf.parent = True, None
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed


class PrefixIds:
    """Exact ids for token prefixes: id(t_0..t_i) = table[(id(t_0..t_{i-1}), t_i)].

    Equal ids <=> equal prefixes (a dict keyed by the actual values, so no collisions), at O(1)
    per token instead of comparing whole prefixes. ``unit`` > 1 interns whole blocks.
    """

    def __init__(self) -> None:
        self._table: dict[tuple[int, tuple[int, ...] | int], int] = {}

    def of(self, tokens: Sequence[int], unit: int = 1) -> list[int]:
        """Id of every prefix ending at a unit boundary (and of the whole sequence)."""
        out, parent = [], -1
        for start in range(0, len(tokens), unit):
            piece = tokens[start] if unit == 1 else tuple(tokens[start : start + unit])
            parent = self._table.setdefault((parent, piece), len(self._table))
            out.append(parent)
        return out


@dataclass(frozen=True)
class OracleReport:
    """Outcome of :func:`radix_oracle_check`."""

    requests: int
    checks: int
    hit_tokens: int
    prompt_tokens: int
    evicted_tokens: int
    violations: tuple[str, ...]
    skipped: int = 0  # requests that did not fit beside the pinned ones (OutOfSlots)

    @property
    def ok(self) -> bool:
        return not self.violations


def radix_oracle_check(
    requests: Sequence[Sequence[int]],
    num_slots: int | None = None,
    *,
    running: int = 4,
    cache_factory: Callable[[int], RadixCache] = RadixCache,
    max_violations: int = 5,
) -> OracleReport:
    """Replay ``requests`` with up to ``running`` of them pinned at a time; check every step.

    The expected behaviour comes from :class:`lib.kvcache.radix_practice.RadixModel`, a model that
    predicts from the token sequences alone (never from the cache under test) which tokens an LRU
    leaf-evicting cache still holds: each match length must equal the model's, and each insert must
    evict exactly the tokens the model evicts (or raise OutOfSlots exactly when the model does).
    With ``num_slots`` None (no eviction) the match must also equal the longest common prefix with
    every earlier request (brute force). Every matched slot must still hold the token prefix it was
    filled with (slot provenance, tracked here from what ``insert`` returned). After each insert:
    no slot free twice, free + cached = pool, no running request's slot free or handed to another
    sequence, the tree's edge lengths sum to the cached count. Stops after ``max_violations``.
    """
    from lib.kvcache.radix_practice import RadixModel

    reqs = [tuple(r) for r in requests]
    if not reqs or any(not r for r in reqs):
        raise ValueError("requests must be non-empty token sequences")
    run = integer("running", running, 1)
    limit = integer("max_violations", max_violations, 1)
    unbounded = num_slots is None
    slots = sum(len(r) for r in reqs) if unbounded else integer("num_slots", num_slots, 1)
    cache = cache_factory(slots)
    model = RadixModel(slots)
    owner: dict[int, int] = {}  # slot -> id of the token prefix its KV was filled with
    prefix_ids = PrefixIds()
    live: deque[tuple[int, list[int], RadixNode, tuple[int, ...], tuple]] = deque()
    violations: list[str] = []
    checks = hits = prompt = evicted = skipped = 0

    def fail(msg: str) -> bool:
        violations.append(msg)
        return len(violations) >= limit

    for k, r in enumerate(reqs):
        try:
            expected = model.walk(r)
            m = cache.match_prefix(r)
            checks += 1
            if m.num_tokens != expected:
                if fail(
                    f"request {k}: matched {m.num_tokens} tokens; the tokens an LRU leaf-evicting cache still "
                    f"holds give {expected}"
                ):
                    break
            if unbounded:
                best = max((longest_common_prefix(r, s) for s in reqs[:k]), default=0)
                checks += 1
                if m.num_tokens != best and fail(
                    f"request {k}: matched {m.num_tokens} tokens, LCP with earlier requests is {best}"
                ):
                    break
            ids = prefix_ids.of(r)
            bad = [i for i, s in enumerate(m.slots) if i >= len(r) or owner.get(s) != ids[i]]
            checks += 1
            if bad and fail(
                f"request {k}: {len(bad)} matched slot(s) hold KV of another prefix"
                f" (first at position {bad[0]})"
            ):
                break
            before, model_before = cache.num_cached_tokens, model.num_cached
            try:
                model.insert(r)
                model_oos = False
            except OutOfSlots:
                model_oos = True
            try:
                ins = cache.insert(r)
            except OutOfSlots:
                skipped += 1  # every unpinned token is gone and this request still does not fit
                checks += 1
                if not model_oos and fail(f"request {k}: OutOfSlots, but evicting unpinned LRU leaves makes room"):
                    break
                continue
            checks += 1
            if model_oos:  # the cache made room the model says pins forbid: the states part here
                fail(f"request {k}: inserted although every unpinned leaf is gone and it does not fit"
                     " (it evicted pinned tokens)")
                break
            hit = min(m.num_tokens, len(r))
            evicted_now = before + (len(r) - hit) - cache.num_cached_tokens
            model_evicted = model_before + (len(r) - expected) - model.num_cached
            checks += 1
            if evicted_now != model_evicted and fail(
                f"request {k}: the insert evicted {evicted_now} tokens; LRU leaf eviction evicts {model_evicted}"
            ):
                break
            evicted += evicted_now
            hits += hit
            prompt += len(r)
            for i in range(hit, len(r)):
                if i < len(ins.slots):
                    owner[ins.slots[i]] = ids[i]
            cache.lock(ins.node)
            handle = model.handle(r)
            model.lock(handle)
            live.append((k, ids, ins.node, tuple(ins.slots), handle))
            free = cache.free_slots()
            free_set = set(free)
            checks += 5
            msgs = []
            if len(free_set) != len(free):
                msgs.append(f"after request {k}: a slot is in the free pool twice (double free)")
            if len(free_set) + cache.num_cached_tokens != slots:
                msgs.append(
                    f"after request {k}: free ({len(free_set)}) + cached"
                    f" ({cache.num_cached_tokens}) != pool ({slots})"
                )
            for rk, rids, _, rslots, _ in live:
                if free_set & set(rslots):
                    msgs.append(
                        f"after request {k}: running request {rk} has KV slots in the free pool"
                    )
                    break
                if any(owner.get(s) != rids[i] for i, s in enumerate(rslots)):
                    msgs.append(
                        f"after request {k}: running request {rk}'s KV slots were handed to another"
                        " sequence (evicted while pinned)"
                    )
                    break
            if sum(len(n.tokens) for n in cache.nodes()) != cache.num_cached_tokens:
                msgs.append(f"after request {k}: edge lengths do not sum to the cached count")
            if any(fail(msg) for msg in msgs):
                break
            if len(live) > run:
                _, _, node, _, old = live.popleft()
                model.unlock(old)
                cache.unlock(node)
        except ValueError as err:  # e.g. unlocking a node a defective eviction removed
            if fail(f"request {k}: {type(err).__name__}: {err}"):
                break
    return OracleReport(len(reqs), checks, hits, prompt, evicted, tuple(violations), skipped)


@dataclass(frozen=True)
class EvictionAtStep:
    """What one step of a scripted scenario evicted (:func:`eviction_at`)."""

    needed: int  # free slots the step was short of (0: it fit without evicting)
    freed: int  # tokens evicted
    evicted: tuple[tuple[int, ...], ...]  # evicted edges, in eviction (LRU) order
    skipped_pinned: tuple[tuple[int, ...], ...]  # pinned leaves older than the first evicted one
    failed: str  # the error the step raised ('' if none)


def eviction_at(ops: Sequence[RadixOp], num_slots: int, step: int) -> EvictionAtStep:
    """Replay ``ops[:step]`` on ``RadixCache(num_slots)`` and report what step ``step`` evicted:
    the edges that left (oldest first), the pinned leaves eviction had to skip, the shortfall."""
    n = integer("num_slots", num_slots, 1)
    step = integer("step", step, 1, len(ops))
    cache = RadixCache(n)
    returned: dict[int, RadixNode] = {}
    before: dict[int, RadixNode] = {}
    needed, failed = 0, ""
    for i, op in enumerate(ops[:step], start=1):
        if i == step:
            before = {node.node_id: node for node in cache.nodes()}
            snapshot = {nid: (node.tokens, node.last_access, node.lock_count, bool(node.children))
                        for nid, node in before.items()}
            if op.kind == "insert":
                hit = cache.match_prefix(op.tokens).num_tokens
                needed = max(0, len(op.tokens) - hit - cache.num_free_slots)
            elif op.kind == "evict":
                needed = op.count
        try:
            if op.kind in ("insert", "match"):
                returned[i] = (cache.insert if op.kind == "insert" else cache.match_prefix)(op.tokens).node
            elif op.kind in ("lock", "unlock"):
                getattr(cache, op.kind)(returned[op.ref])
            else:
                cache.evict(op.count)
        except (OutOfSlots, ValueError, KeyError) as err:
            if i == step:
                failed = f"{type(err).__name__}: {err}"
            else:
                raise ValueError(f"step {i} of the scenario failed before step {step}: {err}") from err
    alive = {node.node_id for node in cache.nodes()}
    gone = sorted((snapshot[nid] for nid in before if nid not in alive), key=lambda s: s[1])
    first = gone[0][1] if gone else None
    skipped = tuple(s[0] for s in sorted(snapshot.values(), key=lambda s: s[1])
                    if not s[3] and s[2] and (first is None or s[1] < first))
    return EvictionAtStep(needed, sum(len(s[0]) for s in gone), tuple(s[0] for s in gone), skipped, failed)
