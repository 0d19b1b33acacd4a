"""Tenants sharing a replica: quotas in the resources requests consume, and isolation of compute, KV
memory and the prefix cache (I068 multi-tenant-quotas, W05 multi-tenant-serving).

* :func:`request_resources`: what one request of ``prompt_len`` + ``output_len`` tokens takes from a
  replica of a :class:`~lib.perf.deployment.Deployment`: its peak KV bytes
  (:func:`lib.perf.memory.kv_bytes_per_sequence`) and their share of the replica's KV pool
  (:func:`lib.kvcache.long_context.admission_share` on ``dep.budget``, whole blocks), its prefill
  FLOPs (``Model.prefill_flops``) and replica-seconds (:func:`lib.fleet.capacity.request_cost`; a
  prompt whose first ``cached_len`` tokens hit the prefix cache gets its warm prefill from there,
  :func:`lib.fleet.capacity.prefill_s`), and its KV byte-seconds: the bytes it holds integrated
  over its life, ``b ((h + (P - h) / 2) t_p + (P + O / 2) O t)`` with ``b`` the KV bytes per token,
  ``h`` the cached tokens, ``t_p`` the prefill time and ``t`` the decode step.
* Compute isolation inside a replica: prefill work cut into chunks (a chunked-prefill engine's unit)
  and ordered by :func:`fifo_finish` (one queue) or :func:`sfq_finish` (start-time fair queuing, a
  weighted fair queue: each tenant's jobs get start tags ``S = max(v, F_prev)`` and finish tags
  ``F = S + work / weight``; the server takes the smallest start tag and ``v`` is the start tag in
  service; an idle server restarts ``v`` at the largest finish tag served). :func:`gps_finish` is the
  fluid ideal (generalized processor sharing) that weighted fair queuing approximates, computed event
  by event. :func:`sfq_delay_bound` is SFQ's guarantee (Goyal, Vin and Cheng, SIGCOMM 1996): a job
  finishes by its expected arrival at the tenant's reserved rate plus the largest job of every other
  tenant plus its own size. SFQ is not within a fixed lag of GPS: GPS serves a tenant faster than its
  reserved rate while others idle.
* :func:`prefill_chunks`: a request's prefill as chunk jobs; chunk ``[s, e)`` costs
  :func:`lib.fleet.capacity.prefill_s` ``(dep, e, cached_len=s)``, the one warm-prefill model (its
  attention to the ``s`` tokens before it is kept, and each chunk pays its own weight read).

KV memory isolation is a per-class share cap in the simulator
(:class:`lib.scheduling.policies.Policy` ``kv_share_cap``); this module only prices it.
SI units: bytes, seconds, FLOP.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["Job", "RequestResources", "fairness_run", "fifo_finish", "gps_finish", "prefill_chunks",
           "request_resources", "sfq_delay_bound", "sfq_finish", "shed_by_priority"]


@dataclass(frozen=True)
class RequestResources:
    """One request's draw on one replica (module doc)."""

    prompt_len: int
    output_len: int
    kv_bytes: float  # peak, at P + O tokens
    pool_tokens: int  # the replica's KV pool, tokens
    pool_share: float  # peak KV as a share of the pool, in whole blocks (long_context.admission_share)
    kv_bytes_per_token: float
    prefill_flops: float
    prefill_s: float
    decode_step_s: float
    replica_s: float
    cached_len: int = 0  # prompt tokens a prefix cache already held

    @property
    def kv_byte_s(self) -> float:
        """KV bytes held integrated over the request's life (the cached prefix, the prefill ramp, then decode)."""
        p, o, h = self.prompt_len, self.output_len, self.cached_len
        return self.kv_bytes_per_token * ((h + (p - h) / 2) * self.prefill_s + (p + o / 2) * o * self.decode_step_s)

    @property
    def life_s(self) -> float:
        """Prefill plus the decode steps: how long the request holds KV."""
        return self.prefill_s + self.output_len * self.decode_step_s


def request_resources(dep, prompt_len: int, output_len: int, tpot_target_s: float | None = None, *,
                      batch: int | None = None, cached_len: int = 0) -> RequestResources:
    """What one request takes from a replica of ``dep`` (module doc). The decode step, the prefill (warm
    when ``cached_len`` > 0) and the replica-seconds are :func:`lib.fleet.capacity.request_cost`'s (give
    ``tpot_target_s`` or ``batch``); ``prefill_flops`` is the cold prompt's."""
    from lib.kvcache.long_context import admission_share
    from lib.perf.deployment import require
    from lib.perf.memory import kv_bytes_per_sequence

    from .capacity import request_cost

    dep = require(dep)
    cost = request_cost(dep, prompt_len, output_len, tpot_target_s, batch=batch, cached_len=cached_len)
    p, o = cost.prompt_len, cost.output_len
    pool = int(dep.budget.token_capacity)
    if p + o > pool:
        raise ValueError(f"a request of {p + o:,} tokens exceeds the {pool:,}-token KV pool of {dep.label}")
    return RequestResources(p, o, kv_bytes_per_sequence(dep.mdl, p + o, dep.kv_dtype), pool,
                            admission_share(dep.budget, p + o), dep.mdl.kv_bytes_per_token(dep.kv_dtype),
                            dep.mdl.prefill_flops(p), cost.prefill_s, cost.decode_step_s, cost.replica_s,
                            int(cached_len))


@dataclass(frozen=True)
class Job:
    """A unit of replica work: ``work_s`` seconds of a whole replica, from ``tenant``'s request ``req``,
    released at ``arrival_s`` (a request's chunks all arrive with it and run in order)."""

    arrival_s: float
    tenant: str
    work_s: float
    req: int


def prefill_chunks(dep, prompt_len: int, chunk: int, arrival_s: float, tenant: str, req: int) -> list[Job]:
    """``prompt_len`` prefilled in chunks of ``chunk`` tokens: chunk ``[s, e)`` costs
    ``prefill_s(dep, e, cached_len=s)`` (:func:`lib.fleet.capacity.prefill_s`: the ``e - s`` new tokens
    attending to the ``s`` before them, with the chunk's own weight read)."""
    from .capacity import prefill_s

    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    c = integer("chunk", chunk, 1, unit="tokens")
    ends = list(range(c, p, c)) + [p]
    return [Job(arrival_s, tenant, prefill_s(dep, e, s), req) for s, e in zip([0] + ends[:-1], ends, strict=True)]


def _check(jobs) -> list[Job]:
    jobs = list(jobs)
    for j in jobs:
        if not isinstance(j, Job) or not j.work_s > 0 or j.arrival_s < 0:
            raise ValueError(f"jobs must be Job records with work_s > 0 and arrival_s >= 0, got {j!r}")
    return jobs


def fifo_finish(jobs) -> list[float]:
    """Finish time of each job (input order) on one non-preemptive server taking jobs in arrival order
    (ties in input order)."""
    jobs = _check(jobs)
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    t, out = 0.0, [0.0] * len(jobs)
    for i in order:
        t = max(t, jobs[i].arrival_s) + jobs[i].work_s
        out[i] = t
    return out


def _weights(jobs, weights) -> dict:
    w = {} if weights is None else dict(weights)
    for j in jobs:
        w.setdefault(j.tenant, 1.0)
        real(f"weight of {j.tenant!r}", w[j.tenant], 0, low_open=True)
    return w


def sfq_finish(jobs, weights: dict | None = None) -> list[float]:
    """Finish time of each job (input order) under start-time fair queuing (module doc): a weighted fair
    queue, non-preemptive, each tenant's jobs in arrival order. ``weights``: {tenant: weight} (default 1)."""
    jobs = _check(jobs)
    w = _weights(jobs, weights)
    arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    queues: dict[str, deque] = defaultdict(deque)
    last_f: dict[str, float] = defaultdict(float)
    ready: list[tuple[float, int, int]] = []  # (start tag, seq, job) of each tenant's head job
    v, t, a, out, seq = 0.0, 0.0, 0, [0.0] * len(jobs), 0

    def admit(i):
        nonlocal seq
        tenant = jobs[i].tenant
        queues[tenant].append(i)
        if len(queues[tenant]) == 1:  # it is the head: tag it now
            s = max(v, last_f[tenant])
            heapq.heappush(ready, (s, seq, i))
            seq += 1

    while a < len(arrivals) or ready:
        if not ready:  # idle: a new busy period starts at the largest finish tag served (Goyal et al.)
            v = max([v, *last_f.values()])
            t = max(t, jobs[arrivals[a]].arrival_s)
        while a < len(arrivals) and jobs[arrivals[a]].arrival_s <= t:
            admit(arrivals[a])
            a += 1
        s, _, i = heapq.heappop(ready)
        v = s
        tenant = jobs[i].tenant
        last_f[tenant] = s + jobs[i].work_s / w[tenant]
        t += jobs[i].work_s
        out[i] = t
        queues[tenant].popleft()
        if queues[tenant]:  # the tenant's next job becomes its head
            heapq.heappush(ready, (max(v, last_f[tenant]), seq, queues[tenant][0]))
            seq += 1
        while a < len(arrivals) and jobs[arrivals[a]].arrival_s <= t:
            admit(arrivals[a])
            a += 1
    return out


def sfq_delay_bound(jobs, weights: dict | None = None) -> list[float]:
    """SFQ's delay guarantee per job (input order) on a server of rate 1 (Goyal, Vin and Cheng 1996,
    Theorem 4): ``EAT_j + sum of the other tenants' largest jobs + l_j``, where ``EAT_j = max(A_j,
    EAT_(j-1) + l_(j-1) / r_f)`` is the job's expected arrival at its tenant's reserved rate
    ``r_f = w_f / sum of the weights`` (the tenants present)."""
    jobs = _check(jobs)
    w = _weights(jobs, weights)
    tenants = {j.tenant for j in jobs}
    total = sum(w[t] for t in tenants)
    lmax = {t: max(j.work_s for j in jobs if j.tenant == t) for t in tenants}
    out, eat, prev = [0.0] * len(jobs), {}, {}
    for i in sorted(range(len(jobs)), key=lambda k: (jobs[k].arrival_s, k)):
        t = jobs[i].tenant
        p = prev.get(t)
        eat[i] = jobs[i].arrival_s if p is None else max(jobs[i].arrival_s, eat[p] + jobs[p].work_s * total / w[t])
        prev[t] = i
        out[i] = eat[i] + sum(lmax[n] for n in tenants if n != t) + jobs[i].work_s
    return out


def gps_finish(jobs, weights: dict | None = None) -> list[float]:
    """Finish time of each job (input order) under generalized processor sharing: the server's rate is
    split among backlogged tenants in proportion to their weights (a fluid ideal), each tenant's jobs
    in arrival order. Exact, event by event."""
    jobs = _check(jobs)
    w = _weights(jobs, weights)
    arrivals = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    queues: dict[str, deque] = defaultdict(deque)
    left = [j.work_s for j in jobs]
    out = [0.0] * len(jobs)
    t, a = 0.0, 0
    while a < len(arrivals) or any(queues.values()):
        active = [k for k, q in queues.items() if q]
        if not active:
            t = max(t, jobs[arrivals[a]].arrival_s)
            while a < len(arrivals) and jobs[arrivals[a]].arrival_s <= t:
                queues[jobs[arrivals[a]].tenant].append(arrivals[a])
                a += 1
            continue
        wsum = sum(w[k] for k in active)
        dt_done = min(left[queues[k][0]] * wsum / w[k] for k in active)
        dt_arr = jobs[arrivals[a]].arrival_s - t if a < len(arrivals) else float("inf")
        dt = min(dt_done, dt_arr)
        for k in active:
            left[queues[k][0]] -= dt * w[k] / wsum
        t += dt
        for k in active:
            i = queues[k][0]
            if left[i] <= 1e-12 * max(1.0, jobs[i].work_s):
                out[i] = t
                queues[k].popleft()
        while a < len(arrivals) and jobs[arrivals[a]].arrival_s <= t:
            queues[jobs[arrivals[a]].tenant].append(arrivals[a])
            a += 1
    return out


def fairness_run(dep, heavy_prompt: int, heavy_burst: int, light_prompt: int, light_rate: float, horizon_s: float,
                 seed: int, weights: dict | None = None) -> dict:
    """A heavy tenant submits ``heavy_burst`` prompts of ``heavy_prompt`` tokens at t = 0; a light tenant
    sends ``light_prompt``-token prompts as a Poisson stream at ``light_rate``/s for ``horizon_s``. Prefill
    in chunks of the engine's token budget, ordered three ways. Returns {"jobs", "light" (index of each
    light request's last chunk), "heavy" (indices of the heavy chunks), "fifo"/"sfq"/"gps" (finish times),
    "ttft" ({order: light TTFTs, numpy})}."""
    import numpy as np

    rng = np.random.default_rng(integer("seed", seed, 0))
    chunk = int(dep.budget.max_num_batched_tokens)
    jobs: list[Job] = []
    for k in range(integer("heavy_burst", heavy_burst, 0, 64)):
        jobs += prefill_chunks(dep, heavy_prompt, chunk, 0.0, "heavy", k)
    heavy = list(range(len(jobs)))
    light, t, n = [], 0.0, 0
    lam = real("light_rate", light_rate, 0, low_open=True, unit="requests/s")
    horizon = real("horizon_s", horizon_s, 0, low_open=True, unit="seconds")
    while True:
        t += float(rng.exponential(1 / lam))
        if t > horizon:
            break
        jobs += prefill_chunks(dep, light_prompt, chunk, t, "light", 100_000 + n)
        light.append(len(jobs) - 1)
        n += 1
    if not light:
        raise ValueError("no light request arrives within horizon_s at light_rate: raise either")
    out = {"jobs": jobs, "light": light, "heavy": heavy,
           "fifo": fifo_finish(jobs), "sfq": sfq_finish(jobs, weights), "gps": gps_finish(jobs, weights)}
    out["ttft"] = {k: np.array([out[k][i] - jobs[i].arrival_s for i in light]) for k in ("fifo", "sfq", "gps")}
    return out


def shed_by_priority(capacity: float, offered: dict) -> dict:
    """Strict-priority admission under overload: classes in key order (the first is the most important)
    take capacity until it runs out. Returns {class: admitted}; admitted <= offered, total <= capacity."""
    left = real("capacity", capacity, 0)
    out = {}
    for k, v in offered.items():
        take = min(real(f"offered[{k!r}]", v, 0), left)
        out[k] = take
        left -= take
    return out
