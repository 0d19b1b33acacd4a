"""The sizing chain of a fleet at a fixed request rate, node by node (N033 ten-thousand-rps-fleet).

Rate -> tokens per second per phase -> one replica's operating point under the SLO pair ->
replicas -> GPUs and nodes -> the router's state. Every replica count and price comes from
:mod:`lib.fleet.capacity`; the prefill is warm for the cached share of the prompt
(``lib.fleet.capacity.request_cost(..., cached_len=)``).

The SLO pair sets two limits on every replica:

* the **TPOT target** sets the decode batch ``B`` (:func:`lib.scheduling.replica.batch_limits`
  through ``request_cost``), hence the replica-seconds of a request and the replicas
  ``rate x replica_s / u`` at the planned utilization ``u``;
* the **TTFT target** (at quantile ``q``) caps how busy a replica's prefill may run: prefills are
  served one at a time, an M/D/1 queue of service ``prefill_s``, whose q-quantile time in system
  stays within the target up to ``rho_ttft`` (:func:`ttft_utilization`, exact on a sample path), so
  each replica takes at most ``rho_ttft / prefill_s`` requests/s.

The replicas are the larger of the two; :attr:`FleetChain.binding` names the SLO that binds.

The router's state, if it routes by prefix (it must know what every replica caches): one index
entry per cached KV block per replica, ``replicas x pool tokens / block size`` entries of
``fleet.router_index_bytes_per_block`` each; it learns of new blocks at ``(new prompt tokens/s +
output tokens/s) / block size`` events per second (evictions match them in steady state).

SI units: seconds, requests per second, tokens, bytes, US dollars.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from lib.fleet.capacity import whole_replicas
from lib.inputs import fraction, integer, real
from lib.registry import assumptions

__all__ = ["FleetChain", "fleet_chain", "serving_deployment", "ttft_replicas", "ttft_utilization"]


def serving_deployment(model, gpu, tp: int, dtype: str = "bf16"):
    """A replica serving in ``dtype`` ("bf16" or "fp8"): FP8 stores the weights and the KV cache in FP8 and
    computes in FP8 where the chip has an FP8 peak (else in BF16, weight-only quantization)."""
    from lib.perf.deployment import deployment
    from lib.registry.hardware import gpu as chip_of

    if dtype not in ("bf16", "fp8"):
        raise ValueError(f"dtype must be 'bf16' or 'fp8', got {dtype!r}")
    if dtype == "bf16":
        return deployment(model, gpu, tp=tp)
    compute = "fp8" if "fp8" in chip_of(gpu).dtypes else "bf16"
    return deployment(model, gpu, tp=tp, weight_dtype="fp8", kv_dtype="fp8", compute_dtype=compute)


TTFT_SAMPLE_PATH = 40_000  # Poisson arrivals in the sample path behind ttft_utilization


@functools.lru_cache(maxsize=512)
def _ttft_utilization_unit(ratio: float, q: float, seed: int) -> float:
    import numpy as np

    from lib.scheduling.queueing import sample_path_utilization

    return sample_path_utilization(np.ones(TTFT_SAMPLE_PATH), ratio, q, seed=seed, rel_tol=1e-3)


def ttft_utilization(prefill_s: float, ttft_target_s: float, q: float = 0.99, seed: int = 0) -> float:
    """Highest busy fraction of a replica's prefill whose q-quantile TTFT stays within the target:
    prefills served one at a time with a constant service time (M/D/1), solved exactly on a Poisson
    sample path (:func:`lib.scheduling.queueing.sample_path_utilization`, Lindley's recursion); 0 when
    even an idle replica misses the target. The two-moment closed form
    (:func:`~lib.scheduling.queueing.utilization_for_sojourn_quantile`, ``scv = 0``) is within 0.02 of it
    once the target is 10 prefills or more, but returns 0 for targets of 2-3 prefills where the exact
    queue still allows 10-30% busy."""
    s = real("prefill_s", prefill_s, 0, low_open=True, unit="seconds")
    t = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    if t <= s:
        return 0.0
    return _ttft_utilization_unit(round(t / s, 6), q, integer("seed", seed, 0))


def ttft_replicas(rate: float, prefill_s: float, rho_ttft: float) -> float:
    """Replicas a TTFT target needs when each replica's prefill may run ``rho_ttft`` busy
    (:func:`ttft_utilization`): rate x prefill_s / rho_ttft; 0 at no load, inf when rho_ttft is 0."""
    if rate == 0:
        return 0.0
    return math.inf if rho_ttft <= 0 else rate * prefill_s / rho_ttft


@dataclass(frozen=True)
class FleetChain:
    """The chain at one rate (module doc)."""

    rate: float
    cached_len: int
    cost: object  # lib.fleet.capacity.RequestCost with the warm prefill
    fleet: object  # lib.fleet.capacity.FleetSize at the planned utilization
    ttft_target_s: float
    ttft_q: float
    rho_ttft: float  # prefill busy fraction the TTFT target allows
    gpus_per_node: int
    usd_per_gpu_hour: float
    router_bytes_per_block: float

    def at_rate(self, rate: float) -> FleetChain:
        """The same chain (same replica, same SLO pair) at another request rate: only the counts move."""
        from lib.fleet.capacity import fleet_for_load

        lam = real("rate", rate, 0, low_open=True, unit="requests/s")
        return dataclasses.replace(self, rate=lam, fleet=fleet_for_load(lam, self.cost, self.fleet.utilization))

    # ---- tokens per second, by phase
    @property
    def prompt_tokens_per_s(self) -> float:
        """rate x P: prompt tokens arriving per second."""
        return self.rate * self.cost.prompt_len

    @property
    def computed_prompt_tokens_per_s(self) -> float:
        """rate x (P - h): prompt tokens the fleet prefills (the rest come from the prefix cache)."""
        return self.rate * (self.cost.prompt_len - self.cached_len)

    @property
    def output_tokens_per_s(self) -> float:
        """rate x O."""
        return self.rate * self.cost.output_len

    # ---- replicas
    @property
    def by_tpot(self) -> float:
        """Replicas by replica-seconds at the TPOT target's batch and the planned utilization (a fraction)."""
        return self.fleet.exact

    @property
    def by_ttft(self) -> float:
        """Replicas the TTFT target needs: rate x prefill_s / rho_ttft (inf when rho_ttft is 0)."""
        return ttft_replicas(self.rate, self.cost.prefill_s, self.rho_ttft)

    @property
    def binding(self) -> str:
        """'the TTFT target' (the prefill queue) or 'decode throughput' (replica-seconds at the decode batch,
        which the TPOT target, the KV pool or max_num_seqs sets: ``cost.limits.binding``)."""
        return "the TTFT target" if self.by_ttft > self.by_tpot else "decode throughput"

    @property
    def replicas(self) -> int:
        """Whole replicas: the ceiling of the larger need (ValueError when TTFT cannot be met at all)."""
        if not math.isfinite(self.by_ttft):
            raise ValueError(f"the prefill alone ({self.cost.prefill_s:.3g} s) misses the {self.ttft_target_s:.3g} s "
                             "TTFT target even on an idle replica: cache more of the prompt, add TP or relax the target")
        return whole_replicas(max(self.by_tpot, self.by_ttft))

    @property
    def gpus(self) -> int:
        """replicas x GPUs per replica."""
        return self.replicas * self.cost.dep.gpus_per_replica

    @property
    def nodes(self) -> int:
        """Nodes: whole replicas per node when a replica fits in one, else whole nodes per replica."""
        g = self.cost.dep.gpus_per_replica
        if g <= self.gpus_per_node:
            return math.ceil(self.replicas / (self.gpus_per_node // g))
        return self.replicas * math.ceil(g / self.gpus_per_node)

    @property
    def usd_per_hour(self) -> float:
        """GPUs x the chip's price per GPU-hour."""
        return self.gpus * self.usd_per_gpu_hour

    @property
    def busy(self) -> float:
        """Busy fraction the whole replicas run at: rate x replica_s / replicas."""
        return self.rate * self.cost.replica_s / self.replicas

    @property
    def prefill_busy(self) -> float:
        """Busy fraction of each replica's prefill: rate x prefill_s / replicas (<= rho_ttft)."""
        return self.rate * self.cost.prefill_s / self.replicas

    # ---- router state
    @property
    def blocks_per_replica(self) -> int:
        """KV blocks one replica's pool holds: pool tokens / block size."""
        b = self.cost.dep.budget
        return b.token_capacity // b.block_size

    @property
    def router_entries(self) -> int:
        """(block hash, replica) pairs a prefix-aware router tracks when every pool is full of cached blocks."""
        return self.replicas * self.blocks_per_replica

    @property
    def router_bytes(self) -> float:
        """router_entries x bytes per entry."""
        return self.router_entries * self.router_bytes_per_block

    @property
    def router_events_per_s(self) -> float:
        """Blocks stored fleet-wide per second: (new prompt + output tokens)/s / block size."""
        return (self.computed_prompt_tokens_per_s + self.output_tokens_per_s) / self.cost.dep.budget.block_size


def fleet_chain(dep, rate: float, prompt_len: int, output_len: int, cached_len: int, tpot_target_s: float,
                ttft_target_s: float, ttft_q: float = 0.99, utilization: float | None = None,
                router_bytes_per_block: float | None = None, seed: int = 0) -> FleetChain:
    """The chain for ``rate`` requests/s of ``prompt_len`` + ``output_len`` tokens with ``cached_len``
    prompt tokens served from the prefix cache, under the SLO pair (module doc). ``seed``: the Poisson sample
    path of :func:`ttft_utilization`."""
    from lib.fleet.capacity import fleet_for_load, gpu_hour_usd, request_cost
    from lib.perf.collectives import gpus_per_node
    from lib.perf.deployment import require

    dep = require(dep)
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    h = integer("cached_len", cached_len, 0, p - 1, unit="tokens")
    t = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    q = fraction("ttft_q", ttft_q, allow_zero=False)
    if q >= 1:
        raise ValueError(f"ttft_q must be below 1, got {q}")
    cost = request_cost(dep, p, output_len, tpot_target_s, cached_len=h)
    per_entry = real("router_bytes_per_block",
                     assumptions.resolve(router_bytes_per_block, "fleet.router_index_bytes_per_block"), 0,
                     low_open=True, unit="bytes")
    return FleetChain(lam, h, cost, fleet_for_load(lam, cost, utilization), t, q,
                      ttft_utilization(cost.prefill_s, t, q, seed), gpus_per_node(chip=dep.chip),
                      gpu_hour_usd(dep.chip), per_entry)
