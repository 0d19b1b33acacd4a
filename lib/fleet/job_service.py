"""An asynchronous LLM job service: retries, backoff, dead letters, fair queues and budgets (W07).

* Retries: a job attempt fails with probability ``f`` (independent), and the service tries it up to
  ``A`` times: it dead-letters with probability ``f^A`` (:func:`dead_letter_probability`) after
  ``(1 - f^A) / (1 - f)`` attempts on average (:func:`expected_attempts`). Between attempts it waits
  a capped exponential ``min(cap, base 2^k)`` (:func:`backoff_schedule`), with full jitter a uniform
  draw in ``[0, that]``. During an outage of ``D`` seconds a job retried that way knocks about
  ``log2(D / base)`` times, one on a fixed interval ``r`` about ``D / r`` times
  (:func:`attempts_during_outage`): the difference between a retry storm and a queue that waits.
  :func:`simulate_retries` draws the same process (the independent check of the closed forms).
* Fair queues: :func:`simulate_queue` runs jobs of fixed duration on ``slots`` workers from per-tenant
  queues, FIFO across tenants or round-robin between them, so a tenant's burst cannot starve the
  others; :func:`fifo_wait_after_burst` is the drain arithmetic it is checked against.
* Budgets: admission reserves a job's estimated dollars (prompt tokens known, output at ``max_tokens``)
  against the tenant's cap and settles the actual cost at completion (:func:`budget_admissions`).

Prices and replica-seconds come from :mod:`lib.fleet.capacity`; nothing here models a GPU.
SI units: seconds, US dollars, tokens.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["BudgetAdmission", "QueueResult", "RetryResult", "attempts_during_outage", "backoff_schedule",
           "budget_admissions", "dead_letter_probability", "expected_attempts", "expected_backoff_s",
           "fifo_wait_after_burst", "simulate_queue", "simulate_retries"]


def _prob(name: str, f: float) -> float:
    return real(name, f, 0, 1, high_open=True)


def dead_letter_probability(f: float, attempts: int) -> float:
    """P(every one of ``attempts`` independent tries fails) = f^A."""
    return _prob("f", f) ** integer("attempts", attempts, 1)


def expected_attempts(f: float, attempts: int) -> float:
    """Mean tries per job, stopping at the first success or after A: sum_{k<A} f^k = (1 - f^A)/(1 - f)."""
    p = _prob("f", f)
    return sum(p ** k for k in range(integer("attempts", attempts, 1)))


def backoff_schedule(base_s: float, cap_s: float, attempts: int) -> list[float]:
    """The longest wait before retry k = 1..A-1: min(cap, base 2^(k-1)) seconds."""
    b = real("base_s", base_s, 0, low_open=True, unit="s")
    c = real("cap_s", cap_s, b, unit="s (at least base_s)")
    return [min(c, b * 2 ** (k - 1)) for k in range(1, integer("attempts", attempts, 1))]


def expected_backoff_s(base_s: float, cap_s: float, attempts: int, f: float) -> float:
    """Mean seconds a job spends waiting between tries with full jitter (a uniform draw in [0, the
    schedule's wait]): sum_k f^k x wait_k / 2 (retry k happens only after k failures)."""
    p = _prob("f", f)
    return sum(p ** k * w / 2 for k, w in enumerate(backoff_schedule(base_s, cap_s, attempts), start=1))


def attempts_during_outage(outage_s: float, base_s: float, cap_s: float, fixed_interval_s: float,
                           attempts: int) -> tuple[int, int]:
    """Tries one job makes while a dependency is down for ``outage_s``, starting at the outage's
    start: (with the capped exponential schedule, without jitter; on a fixed interval), each capped
    at ``attempts``. Tries happen at the cumulative sums of the waits."""
    d = real("outage_s", outage_s, 0, low_open=True, unit="s")
    r = real("fixed_interval_s", fixed_interval_s, 0, low_open=True, unit="s")
    a = integer("attempts", attempts, 1)
    t, n_exp = 0.0, 1
    for w in backoff_schedule(base_s, cap_s, a):
        t += w
        if t >= d:
            break
        n_exp += 1
    n_fixed = min(a, math.ceil(d / r))
    return n_exp, n_fixed


@dataclass(frozen=True)
class RetryResult:
    """What :func:`simulate_retries` saw."""

    jobs: int
    dead_lettered: int
    attempts: int
    wait_s: float  # total backoff waited by all jobs

    @property
    def dead_letter_share(self) -> float:
        return self.dead_lettered / self.jobs

    @property
    def mean_attempts(self) -> float:
        return self.attempts / self.jobs

    @property
    def mean_wait_s(self) -> float:
        return self.wait_s / self.jobs


def simulate_retries(jobs: int, f: float, attempts: int, base_s: float, cap_s: float, seed: int) -> RetryResult:
    """Draw ``jobs`` jobs through up to ``attempts`` tries, each failing with probability ``f``,
    waiting a full-jitter backoff between tries; count dead letters, tries and waiting."""
    import numpy as np

    rng = np.random.default_rng(integer("seed", seed, 0))
    n = integer("jobs", jobs, 1)
    p = _prob("f", f)
    waits = backoff_schedule(base_s, cap_s, attempts)
    dead = tries = 0
    wait = 0.0
    for _ in range(n):
        for k in range(attempts):
            tries += 1
            if rng.random() >= p:
                break
            if k < attempts - 1:
                wait += rng.uniform(0, waits[k])
        else:
            dead += 1
    return RetryResult(n, dead, tries, wait)


@dataclass(frozen=True)
class QueueResult:
    """Per-tenant waits (seconds from arrival to start) from :func:`simulate_queue`."""

    policy: str
    waits: dict

    def mean(self, tenant: str) -> float:
        w = self.waits[tenant]
        return sum(w) / len(w)

    def quantile(self, tenant: str, q: float) -> float:
        w = sorted(self.waits[tenant])
        return w[min(len(w) - 1, max(0, math.ceil(q * len(w)) - 1))]


def simulate_queue(arrivals: dict, service_s: float, slots: int, policy: str) -> QueueResult:
    """Jobs of ``service_s`` seconds each on ``slots`` workers. ``arrivals``: {tenant: sorted arrival
    times}. ``policy``: "fifo" (one queue, oldest first, whatever the tenant) or "round_robin" (a
    queue per tenant; a free slot takes the oldest job of the next tenant in turn that has one)."""
    if policy not in ("fifo", "round_robin"):
        raise ValueError(f"policy must be 'fifo' or 'round_robin', got {policy!r}")
    s = real("service_s", service_s, 0, low_open=True, unit="s")
    c = integer("slots", slots, 1)
    events = sorted((t, name) for name, ts in arrivals.items() for t in ts)
    queues: dict[str, list[float]] = {name: [] for name in arrivals}
    order = sorted(arrivals)
    turn = 0
    waits: dict[str, list[float]] = {name: [] for name in arrivals}
    free = [0.0] * c  # heap of times each slot becomes free
    heapq.heapify(free)
    i = 0
    fifo: list[tuple[float, str]] = []

    def admit(until: float) -> None:
        nonlocal i
        while i < len(events) and events[i][0] <= until:
            t, name = events[i]
            (fifo.append((t, name)) if policy == "fifo" else queues[name].append(t))
            i += 1

    for _ in range(len(events)):
        now = free[0]
        admit(now)
        if not (fifo or any(queues.values())):  # idle until the next arrival
            now = events[i][0]
            admit(now)
        if policy == "fifo":
            t, name = fifo.pop(0)
        else:
            for k in range(len(order)):
                name = order[(turn + k) % len(order)]
                if queues[name]:
                    turn = (turn + k + 1) % len(order)
                    break
            t = queues[name].pop(0)
        start = max(now, t)  # a job admitted while skipping ahead to an arrival may post-date this slot's free time
        waits[name].append(start - t)
        heapq.heapreplace(free, start + s)
    return QueueResult(policy, waits)


def fifo_wait_after_burst(burst: int, service_s: float, slots: int, arrival_s: float) -> float:
    """Wait of the first job arriving ``arrival_s`` after ``burst`` jobs landed at once on an idle FIFO
    queue of ``slots`` workers. FIFO job k (from 0) starts at floor(k / slots) x service (the burst
    runs in waves of ``slots``), so this job, number ``burst``, waits max(0, floor(burst / slots) x
    service - arrival)."""
    b = integer("burst", burst, 0)
    c = integer("slots", slots, 1)
    s = real("service_s", service_s, 0, low_open=True, unit="s")
    return max(0.0, (b // c) * s - real("arrival_s", arrival_s, 0, unit="s"))


@dataclass(frozen=True)
class BudgetAdmission:
    """Jobs a daily budget admits under two reservation rules (see :func:`budget_admissions`)."""

    estimate_usd: float  # reserved per job: prompt + max_tokens
    actual_usd: float  # spent per job: prompt + mean output
    reserve_only: int  # admitted when reservations are never settled down to actuals
    settled: int  # admitted when each job's reservation is settled at completion
    unbounded_spend_usd: float  # what jobs admitted with no cap at all would cost at the same demand


def budget_admissions(prices, prompt_len: int, max_tokens: int, mean_output: float, budget_usd: float,
                      demand_jobs: int) -> BudgetAdmission:
    """A tenant with a cap of ``budget_usd`` submits ``demand_jobs`` jobs. Each is estimated at
    admission as ``prompt_len`` input tokens (counted by the tokenizer) plus ``max_tokens`` output
    (the bound the request sets), priced by ``prices`` (a :class:`lib.fleet.capacity.TokenPrices`),
    and costs ``mean_output`` output tokens in fact. Reserve-only admits floor(budget / estimate).
    Settling at completion frees the unused part: job k + 1 is admitted while the budget left after k
    settled jobs still holds its estimate, budget - k actual >= estimate, so
    floor((budget - estimate) / actual) + 1 jobs run (0 if the budget is below one estimate; at most
    demand)."""
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    m = integer("max_tokens", max_tokens, 1, unit="tokens")
    o = real("mean_output", mean_output, 0, m, unit="tokens (at most max_tokens)")
    b = real("budget_usd", budget_usd, 0, low_open=True, unit="USD")
    d = integer("demand_jobs", demand_jobs, 1)
    est = (p * prices.input_usd_per_m + m * prices.output_usd_per_m) * 1e-6
    act = (p * prices.input_usd_per_m + o * prices.output_usd_per_m) * 1e-6
    settled = math.floor((b - est) / act) + 1 if b >= est else 0
    return BudgetAdmission(est, act, min(d, math.floor(b / est)), min(d, settled), d * act)
