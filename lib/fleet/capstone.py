"""The capstone deployment (N034): what must be true of the model, four mechanisms priced, and what the
first request still costs.

* :func:`preconditions`: on one replica layout, the four facts without which no fleet size helps:
  the weights leave a KV pool (the :class:`~lib.perf.deployment.Deployment` builds), the pool holds
  at least one sequence of the full context (``budget.max_concurrency``), one sequence's decode step
  is under the TPOT target (:func:`lib.perf.throughput.step_s`), and an idle replica prefills the
  prompt within the TTFT target (:func:`lib.fleet.capacity.prefill_s` with the prefix warm).
  :func:`layouts` runs them for each tensor-parallel degree and sizes each viable layout's fleet.
* :func:`mechanism_ladder`: the fleet for a load as mechanisms are added, each priced by the lib
  function that owns it: one request at a time (``request_cost(batch=1)``) -> batching up to the
  TPOT target and KV pool (``request_cost(tpot_target_s=...)``) -> prefix caching of the shared
  prefix (``lib.fleet.capacity.request_cost(..., cached_len=)``) -> FP8 weights and KV
  (:func:`lib.fleet.sizing_chain.serving_deployment`). Chunked prefill, the fourth mechanism, buys
  latency rather than replicas: :func:`chunking` prices it as the decode stall it removes and the
  capacity a per-step TPOT costs (:func:`lib.fleet.disaggregation.colocated_capacity`).
* :func:`first_request`: what the first request still costs: a replica started from nothing
  (:func:`lib.fleet.capacity.replica_start_s`) plus its cold prefill (empty prefix cache), and the
  prefix pre-warm that removes the cold prefill at start-up.

SI units: seconds, bytes, requests per second, tokens, US dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["Chunking", "FirstRequest", "Layout", "Rung", "chunking", "first_request", "layouts", "mechanism_ladder",
           "preconditions"]


@dataclass(frozen=True)
class Layout:
    """One tensor-parallel layout's preconditions and, when viable, its fleet (module doc)."""

    tp: int
    dep: object  # None when the weights leave no KV pool
    reason: str  # why the Deployment could not be built ('' when it was)
    seqs_held: float
    step1_s: float
    prefill_s: float
    tpot_target_s: float
    ttft_target_s: float
    fleet: object = None  # FleetSize at the load, when viable

    @property
    def fits(self) -> bool:
        return self.dep is not None and self.seqs_held >= 1

    @property
    def step_ok(self) -> bool:
        return self.fits and self.step1_s < self.tpot_target_s

    @property
    def prefill_ok(self) -> bool:
        return self.fits and self.prefill_s < self.ttft_target_s

    @property
    def viable(self) -> bool:
        return self.fits and self.step_ok and self.prefill_ok

    @property
    def gpus(self) -> float:
        return self.fleet.gpus if self.fleet is not None else math.inf


def preconditions(model, gpu, tp: int, prompt_len: int, prefix_len: int, output_len: int, tpot_target_s: float,
                  ttft_target_s: float, dtype: str = "bf16") -> Layout:
    """The four preconditions on ``tp`` GPUs of ``gpu`` (module doc); refuses nothing, reports all."""
    from lib.fleet.capacity import prefill_s
    from lib.fleet.sizing_chain import serving_deployment
    from lib.perf.throughput import step_s

    p = integer("prompt_len", prompt_len, 2, unit="tokens")
    h = integer("prefix_len", prefix_len, 0, p - 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    t = real("tpot_target_s", tpot_target_s, 0, low_open=True, unit="seconds")
    f = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    try:
        dep = serving_deployment(model, gpu, tp, dtype)
    except ValueError as exc:
        return Layout(tp, None, str(exc), 0.0, math.inf, math.inf, t, f)
    dep.mdl.check_context(p + o, "prompt_len + output_len")
    return Layout(tp, dep, "", dep.budget.max_concurrency(p + o), step_s(dep, 1, p + o),
                  prefill_s(dep, p, h), t, f)


def layouts(model, gpu, rate: float, prompt_len: int, prefix_len: int, output_len: int, tpot_target_s: float,
            ttft_target_s: float, dtype: str = "bf16", tps=(1, 2, 4, 8), utilization: float | None = None) -> list[Layout]:
    """:func:`preconditions` for each TP in ``tps``; each viable layout sized for ``rate`` (warm prefix, TPOT batch)."""
    import dataclasses

    from lib.fleet.capacity import fleet_for_load, request_cost

    out = []
    for tp in tps:
        lay = preconditions(model, gpu, tp, prompt_len, prefix_len, output_len, tpot_target_s, ttft_target_s, dtype)
        if lay.viable:
            cost = request_cost(lay.dep, prompt_len, output_len, tpot_target_s, cached_len=prefix_len)
            lay = dataclasses.replace(lay, fleet=fleet_for_load(rate, cost, utilization))
        out.append(lay)
    return out


@dataclass(frozen=True)
class Rung:
    """One step of the mechanism ladder: the request's cost and the fleet it needs."""

    name: str
    cost: object  # RequestCost
    fleet: object  # FleetSize
    usd_per_gpu_hour: float

    @property
    def usd_per_hour(self) -> float:
        return self.fleet.gpus * self.usd_per_gpu_hour


def mechanism_ladder(dep, rate: float, prompt_len: int, prefix_len: int, output_len: int, tpot_target_s: float,
                     utilization: float | None = None) -> list[Rung]:
    """Fleets for ``rate`` as batching, prefix caching and FP8 are added in turn (module doc). The FP8 rung
    keeps ``dep``'s layout; it is left out when FP8 cannot be built there."""
    from lib.fleet.capacity import fleet_for_load, gpu_hour_usd, request_cost
    from lib.fleet.sizing_chain import serving_deployment

    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    price = gpu_hour_usd(dep.chip)
    steps = [("one request at a time", request_cost(dep, prompt_len, output_len, batch=1)),
             ("+ continuous batching", request_cost(dep, prompt_len, output_len, tpot_target_s)),
             ("+ prefix caching", request_cost(dep, prompt_len, output_len, tpot_target_s, cached_len=prefix_len))]
    try:
        d8 = serving_deployment(dep.model, dep.gpu, dep.tp, "fp8")
        steps.append(("+ FP8 weights and KV", request_cost(d8, prompt_len, output_len, tpot_target_s, cached_len=prefix_len)))
    except ValueError:
        pass
    return [Rung(name, c, fleet_for_load(lam, c, utilization), price) for name, c in steps]


@dataclass(frozen=True)
class Chunking:
    """Chunked prefill priced (module doc): the longest decode stall without it and the capacity with it."""

    stall_s: float  # a whole warm prefill inside one step: every running decode waits this long
    colocated: object  # lib.fleet.disaggregation.Colocated at the TPOT target on every step
    phase_separated_rate: float  # 1 / replica_s of the same request, prefill not chunked

    @property
    def capacity_ratio(self) -> float:
        """Colocated (per-step TPOT) rate / phase-separated rate."""
        return self.colocated.rate / self.phase_separated_rate


def chunking(dep, prompt_len: int, prefix_len: int, output_len: int, tpot_target_s: float, ttft_target_s: float) -> Chunking:
    """Without chunking a decode step that carries a prompt's new tokens lasts their whole prefill (plus the
    step); with it, every step stays within the TPOT target and the new tokens arrive in chunks
    (:func:`lib.fleet.disaggregation.colocated_capacity` on the uncached part of the prompt)."""
    from lib.fleet.capacity import request_cost
    from lib.fleet.disaggregation import colocated_capacity

    cost = request_cost(dep, prompt_len, output_len, tpot_target_s, cached_len=prefix_len)
    colo = colocated_capacity(dep, prompt_len - prefix_len, output_len, tpot_target_s, ttft_target_s)
    return Chunking(cost.prefill_s + cost.decode_step_s, colo, cost.max_rate)


@dataclass(frozen=True)
class FirstRequest:
    """What the first request costs (module doc)."""

    start: object  # lib.fleet.capacity.ReplicaStart
    cold_prefill_s: float
    warm_prefill_s: float
    prewarm_s: float  # prefilling the shared prefix once at start-up

    @property
    def from_zero_s(self) -> float:
        """Scale from zero: the replica starts, then the first request's prefill runs cold."""
        return self.start.total_s + self.cold_prefill_s


def first_request(dep, prompt_len: int, prefix_len: int) -> FirstRequest:
    """The first request's time to first token from zero replicas, and on a fresh replica (module doc)."""
    from lib.fleet.capacity import prefill_s, replica_start_s
    from lib.kvcache.recompute_fetch import recompute_time_s

    return FirstRequest(replica_start_s(dep), prefill_s(dep, prompt_len),
                        prefill_s(dep, prompt_len, prefix_len), recompute_time_s(dep, prefix_len))
