"""Per-tenant token limits at an LLM gateway: two buckets per tenant per model, reserve-then-settle
for output tokens, a distributed counter, and what the limits cost the fleet (N061 token-rate-limiting).

* :class:`TenantModelLimiter`: an input-token bucket (ITPM: the prompt is counted exactly at
  admission) and an output-token bucket (OTPM: the output is unknown until the stream ends), both
  :class:`lib.fleet.token_bucket.TokenBucket`. Admission takes from both or from neither.
  :meth:`TenantModelLimiter.admit` reserves output tokens by ``policy``:
  ``"max_tokens"`` (reserve ``max_tokens``, never refunded), ``"refund"`` (reserve ``max_tokens``,
  refund the unused part at settle) or ``"estimate"`` (reserve an estimate, settle the difference
  either way: the bucket may go negative and the tenant waits until the debt is repaid).
* :func:`reservation_run`: a greedy tenant against the output bucket under each policy: the output
  tokens it gets per minute against the limit, the worst minute, and the requests it can start at once.
* :func:`distributed_run`: ``G`` gateways admitting one tenant's tokens: ``"central"`` (one shared
  bucket, a store round trip per request), ``"split"`` (each gateway a bucket of rate/G: never over,
  but a tenant whose traffic lands on one gateway gets 1/G), ``"sync"`` (each gateway admits against
  the shared level it last synced, every ``sync_s``). :func:`sync_overshoot_bound` is the sync
  scheme's worst over-admission in one interval, ``(G - 1)(C + r S)``.
* :func:`limit_cost`: what a tenant at its limits costs the fleet, through
  :func:`lib.fleet.capacity.request_cost` and :func:`~lib.fleet.capacity.fleet_for_load`, and the
  exchange rate between an output and an input token.

Units: tokens, seconds, tokens per minute only where named ``*_per_min`` / ``itpm`` / ``otpm``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

from .token_bucket import TokenBucket

__all__ = ["POLICIES", "SCHEMES", "DistributedRun", "LimitCost", "Reservation", "ReservationRun",
           "TenantModelLimiter", "distributed_run", "limit_cost", "output_lengths", "reservation_run",
           "sync_overshoot_bound"]

POLICIES = ("max_tokens", "refund", "estimate")
SCHEMES = ("central", "split", "sync")


@dataclass(frozen=True)
class Reservation:
    """What admission took: the prompt's input tokens and the output tokens reserved."""

    input_tokens: int
    reserved_output: float


class TenantModelLimiter:
    """Two buckets for one (tenant, model): ``itpm`` input and ``otpm`` output tokens per minute, each
    holding ``burst_s`` seconds of its rate (60: a minute's worth, the usual "per minute" reading)."""

    def __init__(self, itpm: float, otpm: float, *, burst_s: float = 60.0, policy: str = "refund",
                 estimate: float | None = None, clock: Callable[[], float] | None = None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if policy == "estimate" and estimate is None:
            raise ValueError("policy 'estimate' needs estimate (output tokens reserved per request)")
        burst = real("burst_s", burst_s, 0, low_open=True, unit="seconds")
        kw = {} if clock is None else {"clock": clock}
        ri = real("itpm", itpm, 0, low_open=True, unit="tokens per minute") / 60.0
        ro = real("otpm", otpm, 0, low_open=True, unit="tokens per minute") / 60.0
        self.input = TokenBucket(ri * burst, ri, **kw)
        self.output = TokenBucket(ro * burst, ro, **kw)
        self.policy = policy
        self.estimate = None if estimate is None else real("estimate", estimate, 0, low_open=True, unit="tokens")

    def reserve_for(self, max_tokens: int) -> float:
        """Output tokens this policy reserves for a request allowed ``max_tokens``."""
        m = integer("max_tokens", max_tokens, 1, unit="tokens")
        return float(m) if self.policy != "estimate" else min(float(m), self.estimate)

    def admit(self, prompt_tokens: int, max_tokens: int) -> Reservation | None:
        """Take the prompt from the input bucket and the reservation from the output bucket, both or
        neither; None when either is short (a 429). A request that can never fit raises ValueError (a 4xx)."""
        p = integer("prompt_tokens", prompt_tokens, 1, unit="tokens")
        r = self.reserve_for(max_tokens)
        if p > self.input.capacity or r > self.output.capacity:
            raise ValueError(f"a request of {p} prompt tokens reserving {r:g} output tokens never fits buckets of "
                             f"{self.input.capacity:g} and {self.output.capacity:g} tokens: answer 4xx, not 429")
        if not self.input.try_acquire(p):
            return None
        if not self.output.try_acquire(r):
            self.input.refund(p)
            return None
        return Reservation(p, r)

    def settle(self, reservation: Reservation, output_tokens: int) -> None:
        """The stream ended after ``output_tokens``: refund or charge the difference by policy."""
        o = integer("output_tokens", output_tokens, 0, unit="tokens")
        diff = reservation.reserved_output - o
        if self.policy == "max_tokens":
            return
        if diff > 0:
            self.output.refund(diff)
        elif diff < 0:
            self.output.debit(-diff)

    def retry_after(self, prompt_tokens: int, max_tokens: int) -> float:
        """Seconds until both buckets hold this request (if nobody else takes any)."""
        return max(self.input.retry_after(prompt_tokens), self.output.retry_after(self.reserve_for(max_tokens)))


def output_lengths(mean: float, cv: float, max_tokens: int, n: int, seed: int) -> np.ndarray:
    """``n`` output lengths: lognormal with ``mean`` and coefficient of variation ``cv``, rounded, clipped
    to [1, max_tokens] (a stream stops at max_tokens)."""
    mu_x = real("mean", mean, 1, unit="tokens")
    c = real("cv", cv, 0, unit="(std / mean)")
    m = integer("max_tokens", max_tokens, 1, unit="tokens")
    rng = np.random.default_rng(integer("seed", seed, 0))
    s2 = math.log(1 + c * c)
    x = rng.lognormal(math.log(mu_x) - s2 / 2, math.sqrt(s2), integer("n", n, 1))
    return np.clip(np.rint(x), 1, m)


@dataclass(frozen=True)
class ReservationRun:
    """A greedy tenant's output tokens under one policy: ``per_min`` delivered per minute in steady
    state (the run's second half), ``peak_min`` the most generated in any 60 s window, ``first_s``
    the requests started in the first second (from a full bucket)."""

    policy: str
    per_min: float
    peak_min: float
    first_s: int
    started: int


def reservation_run(otpm: float, outputs: np.ndarray, max_tokens: int, tpot_s: float, policy: str, *,
                    burst_s: float = 60.0, estimate: float | None = None, horizon_s: float = 600.0,
                    dt_s: float = 0.1) -> ReservationRun:
    """A tenant with unlimited demand against the output bucket (``otpm``, ``burst_s``) under ``policy``:
    each step settles the requests that finished, then starts requests while the bucket admits them.
    Request ``i`` generates ``outputs[i % n]`` tokens, one every ``tpot_s``; its tokens are spread evenly
    over its stream when counting windows."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    now = [0.0]
    lim = TenantModelLimiter(otpm, otpm, burst_s=burst_s, policy=policy,
                             estimate=estimate if estimate is not None else float(np.mean(outputs)),
                             clock=lambda: now[0])
    tpot = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    steps = int(round(real("horizon_s", horizon_s, 1, unit="seconds") / dt_s))
    gen = np.zeros(steps + 2 + int(float(np.max(outputs)) * tpot / dt_s) + 1)
    running: list[tuple[float, int, Reservation, int]] = []
    n_out, i, first = len(outputs), 0, 0
    def start(k: int, started: int) -> int:
        """Start requests while the bucket admits them (at most 10,000 a step); return the count."""
        nonlocal i
        while started < 10_000:
            o = int(outputs[i % n_out])
            if not lim.output.try_acquire(lim.reserve_for(max_tokens)):
                break
            r = Reservation(1, lim.reserve_for(max_tokens))
            dur = o * tpot
            heapq.heappush(running, (now[0] + dur, i, r, o))
            a, b = k, k + max(1, int(round(dur / dt_s)))
            gen[a:b] += o / (b - a)
            i += 1
            started += 1
        return started

    for k in range(steps + 1):
        now[0] = k * dt_s
        started_here = 0
        while running and running[0][0] <= now[0] + 1e-12:
            _, _, res, o = heapq.heappop(running)
            lim.settle(res, o)
            # the tenant always wants more: it spends each refund at once, before the next one lands (two
            # refunds settled back to back could push the bucket past its capacity and waste tokens)
            started_here = start(k, started_here)
        started_here = start(k, started_here)
        if now[0] < 1.0:
            first += started_here
    half = steps // 2
    gen = gen[:steps + 1]
    per_min = gen[half:].sum() / ((steps + 1 - half) * dt_s) * 60.0
    w = int(round(60.0 / dt_s))
    csum = np.concatenate([[0.0], np.cumsum(gen)])
    peak = float(np.max(csum[w:] - csum[:-w])) if len(gen) >= w else float(gen.sum())
    return ReservationRun(policy, float(per_min), peak, first, i)


def sync_overshoot_bound(rate: float, capacity: float, gateways: int, sync_s: float) -> float:
    """The most the sync scheme admits beyond the bucket in one sync interval: every gateway spends the
    whole level it last saw plus the interval's refill, (G - 1)(C + r S)."""
    g = integer("gateways", gateways, 1)
    return (g - 1) * (real("capacity", capacity, 0, low_open=True) + real("rate", rate, 0, low_open=True)
                      * real("sync_s", sync_s, 0))


@dataclass(frozen=True)
class DistributedRun:
    """One tenant's tokens through ``G`` gateways: ``admitted_rate`` (tokens/s over the run, against
    the limit's rate), ``overshoot`` (the most admitted in any window beyond C + r x window, tokens)."""

    scheme: str
    admitted_rate: float
    overshoot: float
    worst_window_s: float


def distributed_run(rate: float, capacity: float, gateways: int, sync_s: float, scheme: str, *,
                    demand: float = math.inf, hot_share: float | None = None, horizon_s: float = 120.0,
                    dt_s: float = 0.01) -> DistributedRun:
    """A tenant offering ``demand`` tokens/s (inf: as much as it is allowed), split over ``gateways``
    evenly or with ``hot_share`` of it on gateway 0 (the rest even), admitted by ``scheme`` (module
    doc). The bucket (``capacity``, ``rate``) starts full. Tokens are fluid (no request granularity)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    g = integer("gateways", gateways, 1, 1000)
    r = real("rate", rate, 0, low_open=True, unit="tokens/s")
    c = real("capacity", capacity, 0, low_open=True, unit="tokens")
    s_sync = real("sync_s", sync_s, 0, low_open=True, unit="seconds")
    d = demand if math.isinf(demand) else real("demand", demand, 0, unit="tokens/s")
    if hot_share is None:
        shares = np.full(g, 1.0 / g)
    else:
        h = real("hot_share", hot_share, 0, 1)
        shares = np.full(g, (1 - h) / (g - 1)) if g > 1 else np.ones(1)
        shares[0] = h if g > 1 else 1.0
    steps = int(round(real("horizon_s", horizon_s, 0, low_open=True) / dt_s))
    want = np.full(g, math.inf) if math.isinf(d) else d * shares * dt_s
    if math.isinf(d):
        want = np.where(shares > 0, math.inf, 0.0)
    adm = np.zeros(steps)
    if scheme == "central":
        level = c
        for k in range(steps):
            level = min(c, level + r * dt_s) if k else level
            take = min(float(np.sum(want)), max(level, 0.0))
            level -= take
            adm[k] = take
    elif scheme == "split":
        levels = c * shares if hot_share is None else np.full(g, c / g)
        rates = np.full(g, r / g)
        caps = levels.copy()
        for k in range(steps):
            if k:
                levels = np.minimum(caps, levels + rates * dt_s)
            take = np.minimum(want, np.maximum(levels, 0.0))
            levels -= take
            adm[k] = take.sum()
    else:
        level, seen_t = c, 0.0  # the shared store's level at the last sync, and when
        views = np.full(g, c)  # each gateway's local copy of the bucket: the synced level, its own refill and spending
        local = np.zeros(g)  # spent since the last sync, per gateway
        every = max(1, int(round(s_sync / dt_s)))
        for k in range(steps):
            t = k * dt_s
            if k and k % every == 0:  # push the spending, pull the level
                level = min(c, level + r * (t - seen_t)) - local.sum()
                seen_t, local = t, np.zeros(g)
                views = np.full(g, level)
            elif k:
                views = np.minimum(c, views + r * dt_s)
            take = np.minimum(want, np.maximum(views, 0.0))
            views -= take
            local += take
            adm[k] = take.sum()
    csum = np.concatenate([[0.0], np.cumsum(adm)])
    worst, worst_w = 0.0, 0.0
    for w in sorted({1, 10, int(round(s_sync / dt_s)), int(round(2 * s_sync / dt_s)), int(round(1.0 / dt_s)),
                     int(round(60.0 / dt_s))}):
        if 1 <= w <= steps:
            over = float(np.max(csum[w:] - csum[:-w])) - (c + r * w * dt_s)
            if over > worst:
                worst, worst_w = over, w * dt_s
    return DistributedRun(scheme, float(adm.sum() / (steps * dt_s)), worst, worst_w)


@dataclass(frozen=True)
class LimitCost:
    """A tenant's limits priced on one deployment (:func:`limit_cost`)."""

    requests_per_min: float
    binding: str  # "input" or "output": which limit caps the requests of this shape
    input_token_replica_s: float  # replica-seconds per prompt token (prefill)
    output_token_replica_s: float  # replica-seconds per output token (decode at the batch)
    replicas: object  # lib.fleet.capacity.FleetSize at the limit

    @property
    def output_per_input(self) -> float:
        """How many input tokens one output token costs, in replica time."""
        return self.output_token_replica_s / self.input_token_replica_s


def limit_cost(dep, itpm: float, otpm: float, prompt_len: int, output_len: int, tpot_target_s: float,
               utilization: float | None = None) -> LimitCost:
    """Requests per minute a tenant can send at limits ``itpm``/``otpm`` with requests of
    ``prompt_len`` + ``output_len`` tokens (min(ITPM / P, OTPM / O), and which binds), each token's
    replica time from :func:`lib.fleet.capacity.request_cost`, and the replicas that rate needs
    (:func:`lib.fleet.capacity.fleet_for_load`)."""
    from .capacity import fleet_for_load, request_cost

    cost = request_cost(dep, prompt_len, output_len, tpot_target_s)
    by_in = real("itpm", itpm, 0, low_open=True) / prompt_len
    by_out = real("otpm", otpm, 0, low_open=True) / output_len
    rpm = min(by_in, by_out)
    return LimitCost(rpm, "input" if by_in <= by_out else "output", 1.0 / cost.prefill_tokens_per_s,
                     1.0 / cost.decode_tokens_per_s, fleet_for_load(rpm / 60.0, cost, utilization))
