"""Warm and cold prefill of a prompt, and the fleet that serves long prompts as two pools (I073).

A warm prefill (the first ``h`` prompt tokens' KV already cached) is the fleet core's
(:func:`lib.fleet.capacity.prefill_s`; a request's cost with it, ``request_cost(..., cached_len=h)``):
the ``P - h`` new tokens at position ``h``, attending to the cached keys.
* :func:`one_pool`: every request, warm or cold, on one pool. Its prefills share one FCFS queue per
  replica whose service is a mixture (a share ``w`` warm, the rest cold); the busy fraction at which
  each class's q-quantile TTFT meets its own target is bisected on a Poisson sample path
  (:func:`lib.scheduling.queueing.lindley_waits`): warm requests wait behind cold prefills, so the
  warm target, not the cold one, usually sets how busy the pool may run.
* :func:`two_pools`: cold requests go to a **cold pool** that only prefills (one replica, one
  prompt at a time) and hands the KV layer by layer to the **warm pool**
  (:func:`lib.fleet.disaggregation.kv_transfer`, ``granularity="layer"``), which prefills the warm
  requests' new tokens and decodes everything. Each pool is the larger of its busy-time need at the
  planned utilization and its TTFT need (:func:`lib.fleet.sizing_chain.ttft_utilization` of its own
  prefill against its own target); the warm pool's replica-seconds per request are
  ``w x warm prefill + O t(B) / B`` (:func:`lib.fleet.capacity.fleet_for_load` on that cost).
* :func:`resident_prefixes`: what keeping the sessions warm takes: ``rate x turn gap`` live sessions
  (Little's law), each holding a prompt's KV between turns, against the warm pool's KV pools and the
  nodes' host DRAM (``storage.node.host.dram_bytes_per_node_tb``), and the fetch of one prefix from
  host DRAM (:func:`lib.kvcache.recompute_fetch.fetch_time_s`).

SI units: seconds, tokens, bytes, FLOP, FLOP/s, requests per second.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lib.fleet.capacity import whole_replicas
from lib.fleet.sizing_chain import ttft_replicas
from lib.inputs import fraction, integer, real

__all__ = ["OnePool", "Residency", "TwoPools", "one_pool", "resident_prefixes", "two_pools"]


def _check_shape(prompt_len, new_tokens, warm_share):
    p = integer("prompt_len", prompt_len, 2, unit="tokens")
    n = integer("new_tokens", new_tokens, 1, p - 1, unit="tokens")
    w = fraction("warm_share", warm_share)
    return p, n, w


@dataclass(frozen=True)
class OnePool:
    """Warm and cold requests on one pool (module doc)."""

    rate: float
    warm_share: float
    cold_prefill_s: float
    warm_cost: object  # RequestCost with the warm prefill
    rho_ttft: float  # busy fraction of the mixed prefill queue the TTFT target allows
    fleet: object  # FleetSize by busy time at the planned utilization

    @property
    def mean_prefill_s(self) -> float:
        """w x warm + (1 - w) x cold prefill."""
        return self.warm_share * self.warm_cost.prefill_s + (1 - self.warm_share) * self.cold_prefill_s

    @property
    def by_busy(self) -> float:
        return self.fleet.exact

    @property
    def by_ttft(self) -> float:
        return ttft_replicas(self.rate, self.mean_prefill_s, self.rho_ttft)

    @property
    def replicas(self) -> float:
        """Whole replicas (inf when the TTFT target cannot be met at any size)."""
        need = max(self.by_busy, self.by_ttft)
        return whole_replicas(need)

    @property
    def gpus(self) -> float:
        return self.replicas * self.warm_cost.dep.gpus_per_replica


def _class_quantiles_ok(gaps, services, warm, rho, tw, tc, q) -> bool:
    """Do both classes meet their q-quantile TTFT targets on this sample path at busy fraction ``rho``?"""
    import numpy as np

    from lib.scheduling.queueing import lindley_waits

    arrivals = np.cumsum(gaps * (services.mean() / rho))
    sojourn = lindley_waits(arrivals, services) + services
    ok_w = not warm.any() or float(np.quantile(sojourn[warm], q)) <= tw
    ok_c = warm.all() or float(np.quantile(sojourn[~warm], q)) <= tc
    return ok_w and ok_c


def one_pool(dep, rate: float, prompt_len: int, new_tokens: int, output_len: int, warm_share: float,
             tpot_target_s: float, warm_ttft_s: float, cold_ttft_s: float, q: float = 0.99,
             utilization: float | None = None, seed: int = 0, samples: int = 20_000) -> OnePool:
    """Warm (``new_tokens`` new of ``prompt_len``) and cold requests on one pool of ``dep`` (module doc).
    Each class keeps its own q-quantile TTFT target (a quantile over the mixture would let the minority
    class miss freely): the busy fraction is bisected on one Poisson sample path, Lindley's recursion
    (:func:`lib.scheduling.queueing.lindley_waits`) giving every prefill's wait behind the others."""
    import numpy as np

    from lib.fleet.capacity import fleet_for_load, prefill_s, request_cost

    p, n, w = _check_shape(prompt_len, new_tokens, warm_share)
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    tw = real("warm_ttft_s", warm_ttft_s, 0, low_open=True, unit="seconds")
    tc = real("cold_ttft_s", cold_ttft_s, 0, low_open=True, unit="seconds")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    cost = request_cost(dep, p, output_len, tpot_target_s, cached_len=p - n)
    cold = prefill_s(dep, p)
    rng = np.random.default_rng(seed)
    m = integer("samples", samples, 100)
    warm = rng.random(m) < w
    services = np.where(warm, cost.prefill_s, cold)
    gaps = rng.exponential(1.0, m)
    rho = 0.0
    if _class_quantiles_ok(gaps, services, warm, 1e-9, tw, tc, q):
        lo, hi = 0.0, 1.0
        while hi - lo > 1e-4:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _class_quantiles_ok(gaps, services, warm, mid, tw, tc, q) else (lo, mid)
        rho = lo
    mixed = dataclasses.replace(cost, prefill_s=w * cost.prefill_s + (1 - w) * cold)
    return OnePool(lam, w, cold, cost, rho, fleet_for_load(lam, mixed, utilization))


@dataclass(frozen=True)
class TwoPools:
    """Cold pool (prefill only, KV handed off layer by layer) and warm pool (module doc)."""

    rate: float
    warm_share: float
    cold_dep: object
    cold_prefill_s: float
    transfer: object  # lib.fleet.disaggregation.KVTransfer, layer-wise
    rho_cold: float
    warm_cost: object  # RequestCost on the warm pool, warm prefill
    rho_warm: float
    utilization: float
    warm_fleet: object  # FleetSize of the warm pool by busy time

    @property
    def cold_rate(self) -> float:
        return (1 - self.warm_share) * self.rate

    @property
    def warm_rate(self) -> float:
        return self.warm_share * self.rate

    @property
    def cold_service_s(self) -> float:
        """A cold request's time on the cold pool: prefill + the exposed part of the layer-wise hand-off."""
        return self.cold_prefill_s + self.transfer.exposed_s(self.cold_prefill_s)

    @property
    def cold_by_busy(self) -> float:
        return self.cold_rate * self.cold_service_s / self.utilization

    @property
    def cold_by_ttft(self) -> float:
        return ttft_replicas(self.cold_rate, self.cold_service_s, self.rho_cold)

    @property
    def cold_replicas(self) -> float:
        need = max(self.cold_by_busy, self.cold_by_ttft)
        if self.cold_rate == 0:
            return 0
        return whole_replicas(need)

    @property
    def warm_by_busy(self) -> float:
        return self.warm_fleet.exact

    @property
    def warm_by_ttft(self) -> float:
        return ttft_replicas(self.warm_rate, self.warm_cost.prefill_s, self.rho_warm)

    @property
    def warm_replicas(self) -> float:
        need = max(self.warm_by_busy, self.warm_by_ttft)
        return whole_replicas(need)

    @property
    def gpus(self) -> float:
        return (self.cold_replicas * self.cold_dep.gpus_per_replica
                + self.warm_replicas * self.warm_cost.dep.gpus_per_replica)

    def at_share(self, warm_share: float) -> TwoPools:
        """The same pools (same replicas' prefills, hand-off and TTFT ceilings) at another warm share."""
        from lib.fleet.capacity import fleet_for_load

        w = fraction("warm_share", warm_share)
        mixed = dataclasses.replace(self.warm_cost, prefill_s=w * self.warm_cost.prefill_s)  # warm_cost: the full warm prefill
        return dataclasses.replace(self, warm_share=w, warm_fleet=fleet_for_load(self.rate, mixed, self.utilization))

    @property
    def transfer_bytes_per_s(self) -> float:
        """KV bytes/s crossing from the cold pool to the warm pool: cold rate x one prompt's KV."""
        return self.cold_rate * self.transfer.bytes_total


def two_pools(cold_dep, warm_dep, rate: float, prompt_len: int, new_tokens: int, output_len: int, warm_share: float,
              tpot_target_s: float, warm_ttft_s: float, cold_ttft_s: float, q: float = 0.99,
              utilization: float | None = None, seed: int = 0) -> TwoPools:
    """Size the cold and warm pools (module doc)."""
    from lib.fleet.capacity import default_utilization, fleet_for_load, prefill_s, request_cost
    from lib.fleet.disaggregation import kv_transfer
    from lib.fleet.sizing_chain import ttft_utilization
    from lib.perf.deployment import require

    cold_dep, warm_dep = require(cold_dep), require(warm_dep)
    p, n, w = _check_shape(prompt_len, new_tokens, warm_share)
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    tw = real("warm_ttft_s", warm_ttft_s, 0, low_open=True, unit="seconds")
    tc = real("cold_ttft_s", cold_ttft_s, 0, low_open=True, unit="seconds")
    u = default_utilization(utilization)
    cost = request_cost(warm_dep, p, output_len, tpot_target_s, cached_len=p - n)
    cold = prefill_s(cold_dep, p)
    xfer = kv_transfer(cold_dep, p, warm_dep, granularity="layer")
    service = cold + xfer.exposed_s(cold)
    mixed = dataclasses.replace(cost, prefill_s=w * cost.prefill_s)
    return TwoPools(lam, w, cold_dep, cold, xfer, ttft_utilization(service, tc, q, seed), cost,
                    ttft_utilization(cost.prefill_s, tw, q, seed), u, fleet_for_load(lam, mixed, u))


@dataclass(frozen=True)
class Residency:
    """Keeping the sessions' prefixes warm between turns (module doc)."""

    sessions: float  # live sessions: rate x turn gap
    prefix_bytes: float  # one prompt's KV, whole model
    hbm_pool_bytes: float  # KV pool bytes of the warm pool (all replicas)
    host_bytes: float  # host DRAM of the warm pool's nodes
    host_fetch_s: float  # one prefix from host DRAM into a warm replica

    @property
    def needed_bytes(self) -> float:
        return self.sessions * self.prefix_bytes

    @property
    def hbm_share(self) -> float:
        """Share of the live prefixes the warm pool's HBM could hold if it held nothing else."""
        return min(1.0, self.hbm_pool_bytes / self.needed_bytes)

    @property
    def fits_host(self) -> bool:
        return self.needed_bytes <= self.hbm_pool_bytes + self.host_bytes


def resident_prefixes(warm_dep, warm_replicas: int, rate: float, turn_gap_s: float, prompt_len: int) -> Residency:
    """Live sessions x prefix KV against the warm pool's HBM pools and its nodes' host DRAM (module doc)."""
    from lib.fleet.disaggregation import kv_bytes
    from lib.kvcache.recompute_fetch import fetch_time_s, storage_tier
    from lib.perf.collectives import gpus_per_node
    from lib.perf.deployment import require
    from lib.registry import assumptions

    dep = require(warm_dep)
    r = integer("warm_replicas", warm_replicas, 1, unit="replicas")
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    gap = real("turn_gap_s", turn_gap_s, 0, low_open=True, unit="seconds")
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    per_token = dep.mdl.kv_bytes_per_token(dep.kv_dtype)
    nodes = math.ceil(r * dep.gpus_per_replica / gpus_per_node(chip=dep.chip))
    host = nodes * float(assumptions.value("storage.node.host.dram_bytes_per_node_tb")) * 1e12
    fetch = fetch_time_s(dep.mdl, p, storage_tier("host_dram", dep.chip), tp=dep.tp, kv_dtype=dep.kv_dtype)
    return Residency(lam * gap, kv_bytes(dep, p), r * dep.budget.token_capacity * per_token, host, fetch)
