"""Fleet routing with prefix caches: least-loaded, affinity, the two-term score and affinity with a spill
threshold (N030 cache-aware-routing, I067 prefix-affinity-spill, W03 routing-and-autoscaling).

The model, in the fleet core's units (:mod:`lib.fleet.capacity`):

* **A replica is a work-conserving server of replica-seconds.** A request costs it the prefill of the
  tokens it does not hold plus the request's decode share ``O t(B, c) / B``
  (:attr:`lib.fleet.capacity.RequestCost.decode_s`), served first come first served. The queue wait
  is the backlog of replica-seconds ahead of it; TTFT = wait + uncached prefill. Real engines batch
  prefill into decode steps, so absolute waits are pessimistic; the comparison between policies is
  what the pages use, and with random routing each replica is an M/G/1 queue (the simulator is
  checked against Pollaczek-Khinchine, :func:`lib.scheduling.queueing.mg1_mean_wait_s`).
* **Prefill with a cached prefix** (:class:`PrefillTable`): a prompt of ``L`` tokens with ``h`` cached
  costs :func:`lib.fleet.capacity.prefill_s` ``(dep, L, h)``, the book's one warm prefill: the chunk of
  ``L - h`` new tokens at position ``h`` (:func:`lib.kvcache.long_context.prefill_chunk_step_s`:
  max(compute incl. the new tokens' attention to the cached ones, weight read) + the TP all-reduces),
  equal to :func:`lib.perf.prefill.prefill_time` when ``h = 0``. The simulation prices it millions of
  times, so it reads the same terms off the scheduling step table
  (:func:`lib.scheduling.cost.step_cost`: a step of that one chunk and no decodes, less the host time;
  within the table's 1e-3, tested against ``prefill_s``). A hit saves ``prefill_s(L, 0) - prefill_s(L, h)``.
* **Each replica's prefix cache is an LRU of prefixes** (:class:`PrefixLRU`), not the token-level
  :class:`lib.kvcache.radix.RadixCache`: in a chat trace every prefix is a tenant's system prompt
  followed by one conversation's history, so the radix tree is one shared node per tenant with one
  path per conversation, and an LRU of (tenant prefix, conversation suffix) entries gives the same
  hits at a fraction of the cost of walking tokens (checked against the radix cache on a trace with
  no eviction). Capacity is a share of the replica's KV pool in tokens.
* **Policies** (:func:`route_trace`): ``random``; ``least_loaded`` (smallest backlog); ``affinity``
  (a consistent hash ring, :class:`lib.fleet.hash_ring.HashRing`, of the conversation or the tenant);
  ``score`` (smallest ``backlog + k x prefill of what the replica lacks``, the two-term score; ``k``
  = 1 makes it the estimated TTFT); ``spill`` (the affinity home unless its backlog exceeds the
  least-loaded replica's by more than a threshold, by default the prefill the home's hit saves).

SI units: seconds, tokens, requests per second.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import integer, real

__all__ = ["POLICIES", "ChatFleet", "PrefillTable", "PrefixLRU", "RouteResult", "Turn", "chat_fleet", "chat_trace", "prefill_table", "route",
           "radix_hits", "route_trace", "spill_threshold_s"]

POLICIES = ("random", "least_loaded", "affinity", "score", "spill")


@dataclass(frozen=True)
class Turn:
    """One request of a chat trace: arrival ``t`` (s), conversation, tenant, turn number (0 = first),
    ``prompt_len`` = the tenant's ``shared_len`` system prompt + the history + the new user message."""

    t: float
    conv: int
    tenant: int
    turn: int
    prompt_len: int
    output_len: int
    shared_len: int


def chat_trace(session_rate: float, duration_s: float, *, turns: float, system_len: int, user_len: int,
               output_len: int, think_s: float, tenants: int = 1, zipf: float = 0.0, hot_share: float | None = None,
               seed: int = 0) -> list[Turn]:
    """Conversations starting as a Poisson process of ``session_rate`` per second over ``duration_s``;
    each has a geometric number of turns with mean ``turns``, separated by exponential think times of
    mean ``think_s`` (the answer's own time ignored); sessions start from ``4 turns think_s`` before 0 so
    the request rate is stationary, ``session_rate x turns``, from the first second; turn ``k`` sends ``system_len + k (user_len
    + output_len) + user_len`` tokens. Tenants are drawn with probability proportional to
    ``rank^-zipf`` (0: uniform), or, with ``hot_share``, tenant 0 with that probability and the others
    uniformly (one customer's prompt gone popular). Requests after ``duration_s`` are dropped; the list is sorted by time."""
    lam = real("session_rate", session_rate, 0, low_open=True, unit="sessions/s")
    dur = real("duration_s", duration_s, 0, low_open=True, unit="s")
    mean_turns = real("turns", turns, 1, 1000)
    s_len = integer("system_len", system_len, 0, unit="tokens")
    u_len = integer("user_len", user_len, 1, unit="tokens")
    o_len = integer("output_len", output_len, 1, unit="tokens")
    think = real("think_s", think_s, 0, unit="s")
    k = integer("tenants", tenants, 1, 100_000)
    z = real("zipf", zipf, 0, 5)
    rng = np.random.default_rng(seed)
    lead = 4 * mean_turns * think  # sessions already under way at t = 0, so the request rate is stationary
    n_sessions = int(rng.poisson(lam * (dur + lead)))
    starts = np.sort(rng.uniform(-lead, dur, n_sessions))
    weights = np.arange(1, k + 1, dtype=float) ** -z
    if hot_share is not None:
        hot = real("hot_share", hot_share, 0, 1)
        if k == 1:
            raise ValueError("hot_share needs at least two tenants")
        weights = np.r_[hot, np.full(k - 1, (1 - hot) / (k - 1))]
    tenant_of = rng.choice(k, size=n_sessions, p=weights / weights.sum())
    n_turns = rng.geometric(1 / mean_turns, size=n_sessions)
    out: list[Turn] = []
    for c in range(n_sessions):
        t = starts[c]
        for j in range(int(n_turns[c])):
            if j:
                t += rng.exponential(think) if think > 0 else 0.0
            if t >= dur:
                break
            if t < 0:
                continue
            out.append(Turn(float(t), c, int(tenant_of[c]), j, s_len + j * (u_len + o_len) + u_len, o_len, s_len))
    out.sort(key=lambda r: (r.t, r.conv))
    return out


class PrefillTable:
    """The warm prefill of one deployment (module doc): :func:`lib.fleet.capacity.prefill_s` read off the
    scheduling step table (:func:`lib.scheduling.cost.step_cost`), a prefill of ``n`` tokens at position
    ``h`` being one step of the chunk ``(n, h)`` and no decodes, less the step's host time. Prompts
    longer than ``max_tokens`` are refused."""

    def __init__(self, dep, max_tokens: int):
        from lib.perf.deployment import require
        from lib.scheduling.cost import step_cost

        self.dep = dep = require(dep)
        self.max_tokens = integer("max_tokens", max_tokens, 2, unit="tokens")
        cost = step_cost(dep)
        self._pass, self._host = cost.pass_s, cost.host_s
        self._memo: dict = {}  # (tokens, position) -> seconds: a trace repeats the same few prompt shapes

    def _chunk_s(self, n: int, position: int) -> float:
        key = (n, position)
        got = self._memo.get(key)
        if got is None:
            if n > self.max_tokens:
                raise ValueError(f"{n} tokens is beyond this table's {self.max_tokens}: build it with a larger "
                                 "max_tokens")
            # a step of one chunk and no decodes: StepCost.step_s(0, 0, [(n, position)]) = pass_s(0, ...)
            if len(self._memo) > 1_000_000:
                self._memo.clear()
            got = self._memo[key] = self._pass(0, ((n, position),)) - self._host
        return got

    def full_s(self, n: float) -> float:
        """The cold prefill of ``n`` tokens, ``prefill_s(dep, n)`` = ``prefill_time`` (0 for n <= 0)."""
        if n <= 0:
            return 0.0
        return self._chunk_s(int(n), 0)

    def with_hit_s(self, prompt_len: int, cached: int) -> float:
        """Prefill of a ``prompt_len`` prompt with ``cached`` tokens held: ``prefill_s(dep, L, h)``."""
        h = min(cached, prompt_len - 1)  # the last prompt token is always computed (it yields the first output)
        if h <= 0:
            return self.full_s(prompt_len)
        if prompt_len > self.max_tokens:
            raise ValueError(f"{prompt_len} tokens is beyond this table's {self.max_tokens}: build it with a larger "
                             "max_tokens")
        return self._chunk_s(prompt_len - h, h)

    def saved_s(self, prompt_len: int, cached: int) -> float:
        """Prefill seconds a hit of ``cached`` tokens saves: full_s(L) - with_hit_s(L, h)."""
        return self.full_s(prompt_len) - self.with_hit_s(prompt_len, cached)


@functools.lru_cache(maxsize=32)
def prefill_table(dep, max_tokens: int) -> PrefillTable:
    """A cached :class:`PrefillTable` (deployments are immutable)."""
    return PrefillTable(dep, max_tokens)


def spill_threshold_s(table: PrefillTable, prompt_len: int, cached: int) -> float:
    """The spill threshold: leave the affinity home when its queue is longer than the least-loaded
    replica's by more than the prefill its hit saves, ``T(L) - T_hit(L, h)``. Going home costs
    ``W_home + T_hit``; going to a replica without the prefix costs ``W_j + T(L)``; home wins while
    ``W_home - W_j < T(L) - T_hit``."""
    return table.saved_s(prompt_len, cached)


class PrefixLRU:
    """One replica's prefix cache: tenant system prompts and conversation histories (beyond the system
    prompt), least recently used first out, at most ``capacity`` tokens (module doc)."""

    def __init__(self, capacity: int):
        self.capacity = integer("capacity", capacity, 0, unit="tokens")
        self.entries: OrderedDict = OrderedDict()
        self.tokens = 0

    def hit(self, r: Turn) -> int:
        """Tokens of ``r``'s prompt held: the tenant prompt, plus the conversation's history if held too."""
        shared = self.entries.get(("t", r.tenant), 0) if r.shared_len else 0
        if r.shared_len and not shared:
            return 0
        own = self.entries.get(("c", r.conv), 0)
        return min(shared + own, r.prompt_len)

    def _put(self, key, tokens: int) -> None:
        old = self.entries.pop(key, 0)
        self.tokens -= old
        if tokens > self.capacity:
            return
        self.entries[key] = tokens
        self.tokens += tokens
        while self.tokens > self.capacity:
            _, t = self.entries.popitem(last=False)
            self.tokens -= t

    def serve(self, r: Turn) -> None:
        """After ``r`` ran here its prompt and answer are cached: the history entry, then the tenant
        entry (touched last, so a tenant prompt outlives its conversations as in a radix tree)."""
        self._put(("c", r.conv), r.prompt_len + r.output_len - r.shared_len)
        if r.shared_len:
            self._put(("t", r.tenant), r.shared_len)


@dataclass
class RouteResult:
    """Per request (in trace order): replica, wait, TTFT, cached and prompt tokens, spilled; per
    replica: busy replica-seconds. ``measured``: requests at or after the warm-up."""

    policy: str
    replica: np.ndarray
    wait_s: np.ndarray
    ttft_s: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    spilled: np.ndarray
    busy_s: np.ndarray
    duration_s: float
    measured: np.ndarray
    info: dict = field(default_factory=dict)

    def _m(self, a):
        return a[self.measured]

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens, measured requests."""
        return float(self._m(self.cached).sum() / self._m(self.prompt).sum())

    def ttft_quantile_s(self, q: float) -> float:
        return float(np.quantile(self._m(self.ttft_s), q))

    @property
    def ttft_mean_s(self) -> float:
        return float(self._m(self.ttft_s).mean())

    @property
    def wait_mean_s(self) -> float:
        return float(self._m(self.wait_s).mean())

    @property
    def utilization(self) -> np.ndarray:
        """Busy replica-seconds / duration, per replica."""
        return self.busy_s / self.duration_s

    @property
    def spill_share(self) -> float:
        return float(self._m(self.spilled).mean())


@functools.lru_cache(maxsize=8)
def _homes(ids: tuple, replicas: int, vnodes: int, seed: int) -> np.ndarray:
    """The affinity home of each key in ``ids``: its owner on a :class:`lib.fleet.hash_ring.HashRing` of
    replicas "0".."replicas-1" (``vnodes`` points each, ``seed``), as replica indices (read-only; cached,
    since every policy and threshold routed over one trace asks for the same homes)."""
    from lib.fleet.hash_ring import HashRing, hash_many

    ring = HashRing(vnodes, seed)
    for i in range(replicas):
        ring.add(str(i))
    home = np.array([int(x) for x in ring.owners_of_hashes(hash_many(ids, seed))], dtype=np.int64)
    home.flags.writeable = False
    return home


def route_trace(trace: list[Turn], n_replicas: int, policy: str, *, table: PrefillTable, decode_s: float,
                cache_tokens: int, affinity_key: str = "conversation", vnodes: int = 150, cache_weight: float = 1.0,
                spill_threshold: float | None = None, seed: int = 0, warmup_s: float = 0.0) -> RouteResult:
    """Route ``trace`` over ``n_replicas`` with ``policy`` (module doc) and serve each replica FIFO.

    ``decode_s``: each request's decode replica-seconds; ``cache_tokens``: each replica's prefix cache;
    ``affinity_key``: ``"conversation"`` or ``"tenant"`` (affinity and spill); ``cache_weight``: the
    score's ``k``; ``spill_threshold``: seconds, None for the derived per-request threshold
    (:func:`spill_threshold_s`)."""
    n = integer("n_replicas", n_replicas, 1, 1024, unit="replicas")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if affinity_key not in ("conversation", "tenant"):
        raise ValueError(f"affinity_key must be 'conversation' or 'tenant', got {affinity_key!r}")
    dec = real("decode_s", decode_s, 0, unit="s")
    k = real("cache_weight", cache_weight, 0)
    thr = None if spill_threshold is None else real("spill_threshold", spill_threshold, 0, unit="s")
    if not trace:
        raise ValueError("the trace is empty: raise the session rate or the duration")
    rng = np.random.default_rng(seed)
    caches = [PrefixLRU(cache_tokens) for _ in range(n)]
    m = len(trace)
    rep = np.zeros(m, dtype=np.int64)
    wait = np.zeros(m)
    ttft = np.zeros(m)
    cached = np.zeros(m)
    prompt = np.array([r.prompt_len for r in trace], dtype=float)
    spilled = np.zeros(m, dtype=bool)
    home = None
    if policy in ("affinity", "spill"):
        ids = tuple(r.conv if affinity_key == "conversation" else f"tenant{r.tenant}" for r in trace)
        home = _homes(ids, n, vnodes, seed)
    free_at = [0.0] * n
    busy_l = [0.0] * n

    def argmin_from(values, start):  # smallest value; ties go to the first at or after ``start`` (rotating)
        rotated = values[start:] + values[:start]
        return (start + rotated.index(min(rotated))) % n

    for idx, r in enumerate(trace):
        backlog = [f - r.t if f > r.t else 0.0 for f in free_at] if policy != "affinity" else None
        start_at = idx % n
        if policy == "random":
            j = int(rng.integers(n))
        elif policy == "least_loaded":
            j = argmin_from(backlog, start_at)
        elif policy == "affinity":
            j = int(home[idx])
        elif policy == "score":
            j = argmin_from([backlog[i] + k * table.with_hit_s(r.prompt_len, caches[i].hit(r)) for i in range(n)],
                            start_at)
        else:  # spill
            h = int(home[idx])
            least = argmin_from(backlog, start_at)
            hit_home = caches[h].hit(r)
            limit = spill_threshold_s(table, r.prompt_len, hit_home) if thr is None else thr
            j = least if backlog[h] - backlog[least] > limit else h
            spilled[idx] = j != h
        hit = hit_home if policy == "spill" and j == h else caches[j].hit(r)  # hit() only reads the cache
        pre_s = table.with_hit_s(r.prompt_len, hit)
        begin = free_at[j] if free_at[j] > r.t else r.t
        wait[idx] = begin - r.t
        ttft[idx] = wait[idx] + pre_s
        free_at[j] = begin + pre_s + dec
        busy_l[j] += pre_s + dec
        cached[idx] = min(hit, r.prompt_len - 1)
        rep[idx] = j
        caches[j].serve(r)
    busy = np.array(busy_l)
    end = max(trace[-1].t, 1e-9)
    measured = np.array([r.t >= warmup_s for r in trace])
    if not measured.any():
        raise ValueError("no request arrives after the warm-up: shorten warmup_s or lengthen the trace")
    return RouteResult(policy, rep, wait, ttft, cached, prompt, spilled, busy, end, measured)


def radix_hits(trace: list[Turn], replicas: np.ndarray, n_replicas: int, token_slots: int | None = None) -> np.ndarray:
    """Oracle for :class:`PrefixLRU`: the cached tokens each request finds when every replica keeps a
    token-level :class:`lib.kvcache.radix.RadixCache` (no eviction: ``token_slots``, None for every token of the
    trace, must hold it)
    and requests go where ``replicas`` says. Token ids: the tenant's system prompt, then the
    conversation's own tokens (distinct per conversation)."""
    from lib.kvcache.radix import RadixCache

    slots = token_slots or sum(r.prompt_len + r.output_len for r in trace) + 1
    caches = [RadixCache(slots) for _ in range(n_replicas)]
    out = np.zeros(len(trace))
    for i, r in enumerate(trace):
        sys_ids = [10**9 + r.tenant * 10**5 + p for p in range(r.shared_len)]
        own = [r.conv * 10**6 + p for p in range(r.prompt_len + r.output_len - r.shared_len)]
        prompt = sys_ids + own[: r.prompt_len - r.shared_len]
        c = caches[int(replicas[i])]
        out[i] = min(c.match_prefix(prompt).num_tokens, r.prompt_len - 1)
        c.insert(sys_ids + own)
    return out


@dataclass(frozen=True)
class ChatFleet:
    """A chat workload sized for a fleet: the trace, the prefill table, each request's decode
    replica-seconds, each replica's prefix-cache tokens, the request rate and the no-hit request cost."""

    trace: list
    table: PrefillTable
    decode_s: float
    cache_tokens: int
    rate: float
    cost: object
    n_replicas: int
    duration_s: float


def chat_fleet(dep, n_replicas: int, utilization: float, *, turns: float, system_len: int, user_len: int,
               output_len: int, think_s: float, tenants: int, zipf: float = 0.0, hot_share: float | None = None,
               cache_share: float = 0.5,
               tpot_s: float = 0.05, duration_s: float = 240.0, seed: int = 0) -> ChatFleet:
    """Size a :func:`chat_trace` so that, with no prefix hits, the fleet's replicas are busy
    ``utilization`` of the time: request rate = u n / replica_s of the mean request
    (:func:`lib.fleet.capacity.request_cost` at the mean prompt ``system_len + (turns - 1)(user_len +
    output_len) + user_len``; a geometric conversation's mean turn index is turns - 1). Each replica's
    prefix cache holds ``cache_share`` of its KV pool (``dep.budget.token_capacity``)."""
    from lib.fleet.capacity import request_cost

    n = integer("n_replicas", n_replicas, 1, 1024, unit="replicas")
    u = real("utilization", utilization, 0, 1, low_open=True)
    share = real("cache_share", cache_share, 0, 1)
    mean_prompt = system_len + round((turns - 1) * (user_len + output_len)) + user_len
    cost = request_cost(dep, mean_prompt, output_len, tpot_s)
    rate = u * n / cost.replica_s
    trace = chat_trace(rate / turns, duration_s, turns=turns, system_len=system_len, user_len=user_len,
                       output_len=output_len, think_s=think_s, tenants=tenants, zipf=zipf, hot_share=hot_share, seed=seed)
    if not trace:
        raise ValueError("the trace is empty: raise the utilization or the duration")
    top = max(r.prompt_len for r in trace)
    dep.mdl.check_context(top + output_len, "the longest conversation (prompt + output)")
    table = prefill_table(dep, dep.mdl.max_position_embeddings)
    return ChatFleet(trace, table, cost.decode_s, int(dep.budget.token_capacity * share), rate, cost, n,
                     float(duration_s))


def route(fleet: ChatFleet, policy: str, **kw) -> RouteResult:
    """:func:`route_trace` of ``fleet``'s trace (warm-up: the first quarter of the duration)."""
    kw.setdefault("warmup_s", fleet.duration_s / 4)
    return route_trace(fleet.trace, fleet.n_replicas, policy, table=fleet.table, decode_s=fleet.decode_s,
                       cache_tokens=fleet.cache_tokens, **kw)
