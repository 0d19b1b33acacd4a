"""Overload arithmetic: a fluid queue in front of a server of fixed capacity, with an optional queue
bound (reject with 429), client timeouts, and clients that retry.

A spike is a stretch of arrivals above capacity. As a fluid (rates, not requests), with capacity
``mu`` (requests/s), arrivals ``lambda(t)`` and a FIFO backlog ``q(t)`` (requests):

    dq/dt = lambda(t) - mu  while q > 0 (or lambda > mu), q <= Q (the bound; arrivals past it rejected)

and an arrival at t waits w(t) = q(t) / mu before its service starts. A client that gives up after
``timeout_s`` is dead if w > timeout: served anyway, its work is wasted. For one spike of rate
``lambda_s`` over D seconds on a base ``lambda_0`` < mu < lambda_s, unbounded:

    backlog at the end B = (lambda_s - mu) D,   peak wait B / mu,   drain time B / (mu - lambda_0)

and the last dead arrival comes (B - mu timeout) / (mu - lambda_0) after the spike ends; it starts
service ``timeout_s`` after that (:func:`spike_closed_form`). :func:`fluid_queue` integrates the
same equations on a time grid for any arrival schedule, with a bound and retries (a rejected client
comes back after a delay: fixed, or spread over a jitter window), which the closed form cannot do.
Both are checked against each other and against the engine simulator (``lib.scheduling.simulate``,
``Policy(queue_limit=..., max_queue_wait_s=...)``) in the tests.
SI units: seconds, requests, requests per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["POLICIES", "FluidRun", "SpikeArithmetic", "compare_policies", "fluid_queue", "spike_closed_form",
           "spike_schedule"]


@dataclass(frozen=True)
class SpikeArithmetic:
    """The closed form for one spike, unbounded queue (module doc). Times after the spike's end."""

    backlog_peak: float  # requests queued when the spike ends
    wait_peak_s: float  # wait of the last arrival of the spike
    drain_s: float  # from the spike's end until the queue is empty
    last_dead_arrival_s: float  # after the end; <= 0 when none after the end is dead
    dead_served_until_s: float  # when the last dead request starts service, after the end (0: none)
    dead_requests: float  # arrivals whose wait exceeds the timeout


def spike_closed_form(capacity: float, base_rate: float, spike_rate: float, spike_s: float,
                      timeout_s: float, *, drain_capacity: float | None = None) -> SpikeArithmetic:
    """One spike of ``spike_rate`` for ``spike_s`` on ``base_rate`` (< capacity < ``spike_rate``),
    unbounded FIFO queue, clients that give up after ``timeout_s`` (module doc).

    ``drain_capacity`` (None: ``capacity``) is the rate the server sustains while draining after
    the spike, when it differs from the rate it sustained during it (a batching engine's
    throughput depends on its batch): the backlog builds at spike - capacity and drains at
    drain_capacity - base, and a wait after the spike is backlog / drain_capacity.
    Dead arrivals: during the spike the wait passes the timeout once (lambda_s - mu) t / mu_d >
    timeout; after it, until the last dead arrival (B - mu_d timeout) / (mu_d - lambda_0).
    """
    mu = real("capacity", capacity, 0, low_open=True, unit="requests/s")
    mu_d = mu if drain_capacity is None else real("drain_capacity", drain_capacity, 0, low_open=True,
                                                    unit="requests/s")
    lam0 = real("base_rate", base_rate, 0, min(mu, mu_d), high_open=True, unit="requests/s (below capacity)")
    lams = real("spike_rate", spike_rate, mu, low_open=True, unit="requests/s (above capacity)")
    d = real("spike_s", spike_s, 0, low_open=True, unit="seconds")
    tau = real("timeout_s", timeout_s, 0, low_open=True, unit="seconds")
    b = (lams - mu) * d
    drain = b / (mu_d - lam0)
    last = (b - mu_d * tau) / (mu_d - lam0)  # the last arrival whose wait passes the timeout
    if b / mu_d <= tau:  # the longest wait stays within the timeout: nobody is dead
        return SpikeArithmetic(b, b / mu_d, drain, last, 0.0, 0.0)
    t_dead = mu_d * tau / (lams - mu)  # into the spike, when waits pass the timeout
    dead = (d - t_dead) * lams + last * lam0
    return SpikeArithmetic(b, b / mu_d, drain, last, last + tau, dead)


def spike_schedule(base_rate: float, spike_rate: float, spike_s: float, before_s: float,
                   after_s: float) -> tuple:
    """((before_s, base), (spike_s, spike), (after_s, base)): the ``rate_schedule`` of a
    :class:`~lib.scheduling.workloads.Workload` and of :func:`fluid_queue`."""
    for name, v in (("base_rate", base_rate), ("spike_rate", spike_rate)):
        real(name, v, 0, unit="requests/s")
    for name, v in (("spike_s", spike_s), ("before_s", before_s), ("after_s", after_s)):
        real(name, v, 0, low_open=True, unit="seconds")
    return ((before_s, base_rate), (spike_s, spike_rate), (after_s, base_rate))


@dataclass(frozen=True)
class FluidRun:
    """Time series of :func:`fluid_queue` (numpy arrays on its grid) and their totals.

    ``t`` grid start times; ``offered`` attempts per second arriving (new + retries); ``backlog``
    queued requests; ``wait_s`` the wait an arrival at t would see (backlog / capacity);
    ``rejected`` rejections per second; ``served`` service starts per second; ``dead`` service
    starts per second of clients already gone (waited past the timeout).
    """

    t: object
    offered: object
    backlog: object
    wait_s: object
    rejected: object
    served: object
    dead: object
    dt: float

    def total(self, name: str) -> float:
        """Integral of a rate series (``offered``, ``rejected``, ``served``, ``dead``), requests."""
        if name not in ("offered", "rejected", "served", "dead"):
            raise ValueError(f"name must be offered, rejected, served or dead; got {name!r}")
        return float(getattr(self, name).sum() * self.dt)

    def last_time(self, name: str, above: float = 1e-9) -> float:
        """Last grid time where a series is above ``above`` (nan when never)."""
        import numpy as np

        series = getattr(self, name)
        idx = np.nonzero(series > above)[0]
        return float(self.t[idx[-1]]) if len(idx) else math.nan


def fluid_queue(schedule, capacity: float, *, timeout_s: float, queue_limit: float | None = None,
                retry_after_s: float | None = None, retry_jitter_s: float = 0.0, max_attempts: int = 1,
                dt: float = 0.25, horizon_s: float | None = None) -> FluidRun:
    """Integrate the fluid queue (module doc) on a grid of ``dt`` seconds.

    ``schedule``: ((duration_s, rate), ...) of new arrivals. ``queue_limit`` (None: unbounded):
    arrivals that would push the backlog past it are rejected (a 429). A rejected client retries
    after ``retry_after_s`` (None: never) plus a delay spread evenly over ``retry_jitter_s``, up to
    ``max_attempts`` attempts in all; every attempt counts in ``offered``. Service starts in FIFO
    order at ``capacity`` per second while there is a backlog; an arrival's wait is the backlog
    ahead of it / capacity, and a service start is dead when its wait passed ``timeout_s``. Runs
    until ``horizon_s`` (None: the schedule's end plus the time to drain and retry). Deterministic.
    """
    import numpy as np

    mu = real("capacity", capacity, 0, low_open=True, unit="requests/s")
    tau = real("timeout_s", timeout_s, 0, low_open=True, unit="seconds")
    dt = real("dt", dt, 0, 10, low_open=True, unit="seconds")
    segs = [(real("duration", d, 0, low_open=True, unit="seconds"), real("rate", r, 0, unit="requests/s"))
            for d, r in schedule]
    if not segs:
        raise ValueError("schedule must hold at least one (duration_s, rate) segment")
    if queue_limit is not None:
        queue_limit = real("queue_limit", queue_limit, 0, unit="requests")
    attempts = integer("max_attempts", max_attempts, 1)
    if retry_after_s is not None:
        retry_after_s = real("retry_after_s", retry_after_s, 0, unit="seconds")
    jitter = real("retry_jitter_s", retry_jitter_s, 0, unit="seconds")
    span = sum(d for d, _ in segs)
    if horizon_s is None:
        peak = sum(d * r for d, r in segs)
        horizon_s = span + peak / mu + (attempts * ((retry_after_s or 0) + jitter)) + 10 * dt
    n = int(math.ceil(real("horizon_s", horizon_s, 0, low_open=True, unit="seconds") / dt))
    t = np.arange(n) * dt
    new = np.zeros(n)
    edges = np.cumsum([0.0] + [d for d, _ in segs])
    for (d, r), a in zip(segs, edges[:-1], strict=True):
        new[(t >= a - 1e-12) & (t < a + d - 1e-12)] = r
    # retries: rejected mass at step k with attempt index j returns, spread over the jitter window
    lag0 = None if retry_after_s is None else max(1, int(round(retry_after_s / dt)))  # a later step
    width = max(1, int(round(jitter / dt)))
    pending = np.zeros((attempts, n))  # pending[j, k]: attempt j+1 arriving at step k (rate)
    pending[0] = new
    offered = np.zeros(n)
    backlog = np.zeros(n)
    rejected = np.zeros(n)
    served = np.zeros(n)
    dead = np.zeros(n)
    # FIFO cohorts: arrival step and amount queued, to know each service start's wait
    cohorts: list[list] = []
    q = 0.0
    for k in range(n):
        backlog[k] = q
        arriving = pending[:, k]
        offered[k] = arriving.sum()
        room = math.inf if queue_limit is None else max(0.0, queue_limit - q)
        admitted = min(offered[k] * dt, room)
        refused = offered[k] * dt - admitted
        rejected[k] = refused / dt
        if admitted > 0:
            cohorts.append([k, admitted])
        if refused > 0 and lag0 is not None:
            for j in range(attempts - 1):  # split the refusal by attempt, in proportion
                share = arriving[j] / offered[k] if offered[k] > 0 else 0.0
                if share <= 0:
                    continue
                start = k + lag0
                lo, hi = min(start, n), min(start + width, n)
                if hi > lo:
                    pending[j + 1, lo:hi] += refused * share / dt / width
        q += admitted
        cap = mu * dt
        while cap > 1e-15 and cohorts:
            step, amount = cohorts[0]
            take = min(amount, cap)
            served[k] += take / dt
            wait = (k - step) * dt
            if wait > tau:
                dead[k] += take / dt
            cap -= take
            q -= take
            if take >= amount - 1e-15:
                cohorts.pop(0)
            else:
                cohorts[0][1] = amount - take
    wait_s = backlog / mu
    return FluidRun(t, offered, backlog, wait_s, rejected, served, dead, dt)


POLICIES = ("accept all", "429 past capacity x timeout", "429 + eager retries", "429 + Retry-After with jitter")


def compare_policies(capacity: float, base_rate: float, spike_rate: float, spike_s: float, timeout_s: float, *,
                     before_s: float = 20.0, steps: int = 4000, eager_retry_s: float = 1.0,
                     max_attempts: int = 10, policies=POLICIES) -> dict:
    """The fluid queue of one spike under each of :data:`POLICIES`.

    * accept all: unbounded;
    * a bound Q = capacity x timeout (the queue the server drains within a client's patience),
      arrivals past it rejected with a 429;
    * the same, rejected clients retrying after ``eager_retry_s`` (up to ``max_attempts``);
    * the same, clients honouring Retry-After R = Q / capacity (the wait the bound implies) plus a
      jitter window J = rejections / (capacity - base_rate), which spreads the rejected clients over
      the spare capacity after the spike.

    The grid has about ``steps`` steps over the run (the spike, the drain, two retry rounds).
    Returns {policy: FluidRun} for each of ``policies`` and "bound", "retry_after_s", "jitter_s",
    "closed_form", "spike_end_s".
    """
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"policies must be among {', '.join(POLICIES)}; got {unknown}")
    closed = spike_closed_form(capacity, base_rate, spike_rate, spike_s, timeout_s)
    integer("steps", steps, 100)
    after = closed.drain_s + 3 * timeout_s + 30.0
    sched = spike_schedule(base_rate, spike_rate, spike_s, before_s, after)
    span = before_s + spike_s + after
    bound = capacity * timeout_s
    bounded = fluid_queue(sched, capacity, timeout_s=timeout_s, queue_limit=bound, dt=span / steps)
    retry_after = bound / capacity
    jitter = bounded.total("rejected") / (capacity - base_rate)
    horizon = span + 2 * (retry_after + jitter)
    dt = horizon / steps
    make = {
        "accept all": lambda: fluid_queue(sched, capacity, timeout_s=timeout_s, dt=dt, horizon_s=horizon),
        "429 past capacity x timeout": lambda: fluid_queue(sched, capacity, timeout_s=timeout_s, queue_limit=bound,
                                                           dt=dt, horizon_s=horizon),
        "429 + eager retries": lambda: fluid_queue(sched, capacity, timeout_s=timeout_s, queue_limit=bound,
                                                   retry_after_s=eager_retry_s, max_attempts=max_attempts, dt=dt,
                                                   horizon_s=horizon),
        "429 + Retry-After with jitter": lambda: fluid_queue(sched, capacity, timeout_s=timeout_s, queue_limit=bound,
                                                             retry_after_s=retry_after, retry_jitter_s=jitter,
                                                             max_attempts=max_attempts, dt=dt, horizon_s=horizon),
    }
    runs = {p: make[p]() for p in policies}
    return runs | {"bound": bound, "retry_after_s": retry_after, "jitter_s": jitter, "closed_form": closed,
                   "spike_end_s": before_s + spike_s}
