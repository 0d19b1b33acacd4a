"""One capacity unit across GPU generations: the requests per second a replica serves within the SLO.

A GPU count says nothing about capacity when the fleet mixes generations: a B200 replica does not serve
what a H100 replica does, per replica or per GPU, and the ratio depends on the workload and the SLO.
The unit that plans, routes and buys correctly is the rate a replica sustains within both targets:

Both limits are those of :func:`lib.fleet.sizing_chain.fleet_chain` (its ``by_tpot`` and ``by_ttft``), read per
replica rather than per fleet:

* the **TPOT target** sets the decode batch (:func:`lib.fleet.capacity.request_cost`), hence the
  replica-seconds of a request; the replica may run at most ``u / replica_s`` requests/s at the planned
  utilization ceiling ``u`` (:func:`lib.fleet.capacity.default_utilization`);
* the **TTFT target** at quantile ``q`` caps the busy fraction of the replica's prefill, an M/D/1 queue of
  service ``prefill_s`` (:func:`lib.fleet.sizing_chain.ttft_utilization`): at most ``rho_ttft / prefill_s``.

:func:`replica_capacity` gives the smaller of the two (:class:`ReplicaCapacity`, with the binding side and
the dollars per unit-hour from :func:`lib.fleet.capacity.gpu_hour_usd`). A :class:`Pool` is a count of
identical replicas; :func:`route` splits a rate over pools by weights (:func:`weights_by_capacity`: in
proportion to each pool's capacity, so every pool runs at the same fraction of it; :func:`weights_by_gpus`:
in proportion to GPUs, the mistake) and reports each pool's load against its capacity and its TTFT
quantile (:func:`ttft_quantile_s`, the same M/D/1 prefill queue on a Poisson sample path).
:func:`buy` prices extra capacity in each generation by the unit.

Two generations can also split the work by role (I060). :func:`node_replica` is the smallest replica of a
model built as tensor parallelism over one node's GPUs times pipeline stages across nodes (the memory budget
of :mod:`lib.perf.deployment` decides the fit); :func:`fp8_format_disagreement` measures what happens when the
two generations hold the same weights in different FP8 formats (one per-tensor E4M3 scale, as Hopper's FP8
GEMMs take, against MX block scales, as Blackwell's MXFP8 GEMMs take), with :mod:`lib.numerics.fp8`'s rounding.

SI units: seconds, requests per second, US dollars.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["FormatDisagreement", "Pool", "PoolLoad", "ReplicaCapacity", "buy", "fp8_format_disagreement",
           "node_replica", "replica_capacity", "route", "ttft_quantile_s", "weights_by_capacity",
           "weights_by_gpus"]


@dataclass(frozen=True)
class ReplicaCapacity:
    """What one replica serves within the SLO (module doc): the two limits of
    :class:`lib.fleet.sizing_chain.FleetChain` (its ``by_tpot`` and ``by_ttft`` replicas at ``chain.rate``),
    read per replica."""

    chain: object  # lib.fleet.sizing_chain.FleetChain of the replica and the SLO pair
    usd_per_gpu_hour: float

    @property
    def cost(self):
        """The :class:`~lib.fleet.capacity.RequestCost` at the TPOT target."""
        return self.chain.cost

    @property
    def ttft_target_s(self) -> float:
        """The TTFT target, seconds."""
        return self.chain.ttft_target_s

    @property
    def ttft_q(self) -> float:
        """The quantile the TTFT target holds at."""
        return self.chain.ttft_q

    @property
    def utilization(self) -> float:
        """The planned utilization ceiling."""
        return self.chain.fleet.utilization

    @property
    def rho_ttft(self) -> float:
        """Prefill busy fraction the TTFT target allows (:func:`lib.fleet.sizing_chain.ttft_utilization`)."""
        return self.chain.rho_ttft

    @property
    def rate_by_tpot(self) -> float:
        """rate / by_tpot = u / replica_s: requests/s at the utilization ceiling with the TPOT target's batch."""
        return self.chain.rate / self.chain.by_tpot

    @property
    def rate_by_ttft(self) -> float:
        """rate / by_ttft = rho_ttft / prefill_s: requests/s whose prefill queue keeps the TTFT quantile within its
        target."""
        return self.chain.rate / self.chain.by_ttft

    @property
    def rate(self) -> float:
        """Requests/s within both targets: the capacity unit of this replica."""
        return min(self.rate_by_tpot, self.rate_by_ttft)

    @property
    def binding(self) -> str:
        """Which limit sets the rate: "the TTFT target" or "the TPOT batch at the utilization ceiling" (the chain's
        :attr:`~lib.fleet.sizing_chain.FleetChain.binding`, in this page's words)."""
        return "the TTFT target" if self.chain.binding == "the TTFT target" else "the TPOT batch at the utilization ceiling"

    @property
    def gpus(self) -> int:
        """GPUs per replica."""
        return self.cost.dep.gpus_per_replica

    @property
    def rate_per_gpu(self) -> float:
        """rate / GPUs per replica."""
        return self.rate / self.gpus

    @property
    def usd_per_hour(self) -> float:
        """The replica's GPUs x the GPU-hour price."""
        return self.gpus * self.usd_per_gpu_hour

    @property
    def usd_per_request_s_hour(self) -> float:
        """Dollars per hour of one request/s of capacity within the SLO: usd_per_hour / rate."""
        return self.usd_per_hour / self.rate if self.rate > 0 else math.inf


def replica_capacity(dep, prompt_len: int, output_len: int, tpot_target_s: float, ttft_target_s: float, *,
                     ttft_q: float = 0.99, utilization: float | None = None,
                     usd_per_gpu_hour: float | None = None) -> ReplicaCapacity:
    """The capacity unit of one replica of ``dep`` for requests of ``prompt_len`` + ``output_len`` tokens under a
    TPOT target and a TTFT target at quantile ``ttft_q`` (module doc). ValueError when the replica cannot meet
    the TPOT target at all (request_cost's message) or its prefill alone exceeds the TTFT target."""
    from lib.fleet.capacity import gpu_hour_usd
    from lib.fleet.sizing_chain import fleet_chain

    t = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    q = real("ttft_q", ttft_q, 0, 1, low_open=True, high_open=True)
    # The chain at 1 request/s: its two replica counts are the reciprocals of the two per-replica limits.
    chain = fleet_chain(dep, 1.0, prompt_len, output_len, 0, tpot_target_s, ttft_target_s=t, ttft_q=q,
                        utilization=utilization)
    if chain.rho_ttft <= 0:
        raise ValueError(f"{chain.cost.dep.label}: the prefill of {prompt_len} tokens alone takes "
                         f"{chain.cost.prefill_s * 1e3:.3g} ms, at or over the {t * 1e3:.3g} ms TTFT target")
    return ReplicaCapacity(chain, gpu_hour_usd(chain.cost.dep.chip, usd_per_gpu_hour))


@dataclass(frozen=True)
class Pool:
    """``replicas`` identical replicas of one generation, named ``name``."""

    name: str
    unit: ReplicaCapacity
    replicas: int

    def __post_init__(self):
        integer("replicas", self.replicas, 1)
        if not isinstance(self.unit, ReplicaCapacity):
            raise ValueError(f"unit must be a ReplicaCapacity (replica_capacity(...)), got {type(self.unit).__name__}")

    @property
    def capacity(self) -> float:
        """Requests/s the pool serves within the SLO: replicas x the unit's rate."""
        return self.replicas * self.unit.rate

    @property
    def gpus(self) -> int:
        """replicas x GPUs per replica."""
        return self.replicas * self.unit.gpus

    @property
    def usd_per_hour(self) -> float:
        """replicas x the replica's dollars per hour."""
        return self.replicas * self.unit.usd_per_hour


def _pools(pools) -> list:
    pools = list(pools)
    if not pools or not all(isinstance(p, Pool) for p in pools):
        raise ValueError("pools must be a non-empty list of Pool")
    return pools


def weights_by_capacity(pools) -> list[float]:
    """Each pool's share of the traffic in proportion to its capacity within the SLO (the capacity unit)."""
    pools = _pools(pools)
    total = sum(p.capacity for p in pools)
    return [p.capacity / total for p in pools]


def weights_by_gpus(pools) -> list[float]:
    """Each pool's share in proportion to its GPU count: what a router that counts GPUs does."""
    pools = _pools(pools)
    total = sum(p.gpus for p in pools)
    return [p.gpus / total for p in pools]


@functools.lru_cache(maxsize=1024)
def _md1_quantile_unit(rho: float, q: float, seed: int, n: int) -> float:
    import numpy as np

    from lib.scheduling.queueing import lindley_waits

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rho, n))  # service time 1, arrival rate rho
    waits = np.asarray(lindley_waits(arrivals, np.ones(n)))
    return float(np.quantile(waits[n // 10:] + 1.0, q))


def ttft_quantile_s(prefill_s: float, rate: float, q: float = 0.99, *, seed: int = 0, n: int = 100_000) -> float:
    """The q-quantile of queue + prefill for prefills of ``prefill_s`` served one at a time at Poisson ``rate``
    requests/s (M/D/1; Lindley's recursion, :func:`lib.scheduling.queueing.lindley_waits`, on an ``n``-arrival
    path, the first tenth dropped as warm-up). inf when ``rate x prefill_s >= 1`` (the queue grows without bound)."""
    s = real("prefill_s", prefill_s, 0, low_open=True, unit="seconds")
    lam = real("rate", rate, 0, unit="requests/s")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    rho = lam * s
    if rho >= 1:
        return math.inf
    if rho == 0:
        return s
    return s * _md1_quantile_unit(round(rho, 6), q, integer("seed", seed, 0), integer("n", n, 100))


@dataclass(frozen=True)
class PoolLoad:
    """One pool under a routed rate: ``rate`` requests/s in all, ``per_replica`` each."""

    pool: Pool
    share: float
    rate: float

    @property
    def per_replica(self) -> float:
        """rate / replicas."""
        return self.rate / self.pool.replicas

    @property
    def load(self) -> float:
        """per_replica / the unit's rate: above 1 the pool misses its SLO."""
        return self.per_replica / self.pool.unit.rate

    @property
    def busy(self) -> float:
        """per_replica x replica_s: the replica's busy fraction (at or above 1: it cannot keep up at all)."""
        return self.per_replica * self.pool.unit.cost.replica_s

    @property
    def within_slo(self) -> bool:
        """load <= 1 (a hair over from rounding counts as within)."""
        return self.load <= 1 + 1e-9

    def ttft_quantile_s(self, seed: int = 0) -> float:
        """The pool's TTFT quantile (at the unit's q) from its per-replica prefill queue (:func:`ttft_quantile_s`)."""
        u = self.pool.unit
        return ttft_quantile_s(u.cost.prefill_s, self.per_replica, u.ttft_q, seed=seed)


def route(rate: float, pools, weights) -> list[PoolLoad]:
    """Split ``rate`` requests/s over ``pools`` by ``weights`` (non-negative, normalised here)."""
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    pools = _pools(pools)
    w = [real("weight", x, 0) for x in weights]
    if len(w) != len(pools) or sum(w) <= 0:
        raise ValueError(f"weights must be {len(pools)} non-negative numbers with a positive sum, got {list(weights)}")
    total = sum(w)
    return [PoolLoad(p, x / total, lam * x / total) for p, x in zip(pools, w, strict=True)]


@dataclass(frozen=True)
class Purchase:
    """Extra capacity bought as whole replicas of one generation."""

    unit: ReplicaCapacity
    extra_rate: float

    @property
    def replicas(self) -> int:
        """ceil(extra_rate / the unit's rate)."""
        return max(1, math.ceil(self.extra_rate / self.unit.rate - 1e-9))

    @property
    def usd_per_hour(self) -> float:
        """replicas x the replica's dollars per hour."""
        return self.replicas * self.unit.usd_per_hour


def buy(extra_rate: float, units) -> list[Purchase]:
    """Each option (a ReplicaCapacity per generation) bought to add ``extra_rate`` requests/s within the SLO,
    cheapest per hour first."""
    lam = real("extra_rate", extra_rate, 0, low_open=True, unit="requests/s")
    units = list(units)
    if not units or not all(isinstance(u, ReplicaCapacity) for u in units):
        raise ValueError("units must be a non-empty list of ReplicaCapacity")
    return sorted((Purchase(u, lam) for u in units), key=lambda p: p.usd_per_hour)



# ---- two generations, two roles (I060) ------------------------------------------------------------


def node_replica(model, gpu, *, weight_dtype: str = "fp8", kv_dtype: str = "fp8", max_nodes: int = 8):
    """The smallest replica of ``model`` on ``gpu`` built as TP over one node's GPUs x PP = 1, 2, ... nodes
    whose memory budget leaves a KV pool (:func:`lib.perf.deployment.deployment` refuses the rest). FP8 weights
    compute in FP8 where the chip has an FP8 peak. ValueError when ``max_nodes`` nodes do not hold it."""
    from lib.perf.collectives import gpus_per_node
    from lib.perf.deployment import deployment
    from lib.registry.hardware import gpu as chip_of

    chip = chip_of(gpu)
    n = integer("max_nodes", max_nodes, 1)
    per_node = gpus_per_node(chip=chip)
    compute = "fp8" if weight_dtype == "fp8" and "fp8" in chip.dtypes else "bf16"
    last = None
    for pp in range(1, n + 1):
        try:
            return deployment(model, chip.key, tp=per_node, pp=pp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                              compute_dtype=compute)
        except ValueError as e:
            last = e
    raise ValueError(f"{model} in {weight_dtype} does not fit {n} nodes of {chip.key}: {last}")


@dataclass(frozen=True)
class FormatDisagreement:
    """A linear layer's outputs with its weights in two FP8 formats, against the float64 exact ones."""

    err_per_tensor: float  # ||y_pt - y|| / ||y||
    err_mx: float  # ||y_mx - y|| / ||y||
    err_between: float  # ||y_pt - y_mx|| / ||y||
    flips_between: float  # share of rows whose argmax (greedy token) differs between the two formats
    flips_per_tensor: float  # ... between per-tensor and exact
    flips_mx: float  # ... between MX and exact
    clipped_mx: float  # share of weights the MX scales clip (0 with "ceil")


def fp8_format_disagreement(*, vocab: int = 4096, hidden: int = 256, rows: int = 512, block: int = 32,
                            outlier_channels: int = 4, outlier_scale: float = 30.0, rounding: str = "ceil",
                            seed: int = 0) -> FormatDisagreement:
    """A synthetic output projection (``vocab`` x ``hidden`` Gaussian weights of std 0.02, ``outlier_channels``
    input channels scaled by ``outlier_scale``: the outlier channels LLM weights carry) quantized to E4M3 with one
    per-tensor amax scale (:func:`lib.numerics.fp8.amax_scale`, :func:`lib.numerics.fp8.fake_quantize`) and as MX
    (1 x ``block`` tiles along the hidden axis with power-of-two scales: :func:`lib.numerics.fp8.block_fake_quantize`,
    the book's one MX quantizer, scales from :func:`lib.numerics.fp8.mx_block_scale`); ``rows`` Gaussian hidden
    states give logits y = h W^T in float64. Returns the relative errors and how often the greedy token differs."""
    import numpy as np

    from lib.numerics.fp8 import amax_scale, block_fake_quantize, block_scale, fake_quantize

    v, d, r = integer("vocab", vocab, 2), integer("hidden", hidden, 1), integer("rows", rows, 1)
    b = integer("block", block, 1)
    if d % b:
        raise ValueError(f"hidden = {d} must be a multiple of block = {b}")
    k = integer("outlier_channels", outlier_channels, 0, d)
    big = real("outlier_scale", outlier_scale, 1.0, 1e4)
    rng = np.random.default_rng(integer("seed", seed, 0))
    w = rng.standard_normal((v, d)) * 0.02
    w[:, rng.choice(d, k, replace=False)] *= big
    h = rng.standard_normal((r, d))
    w_pt = fake_quantize(w, amax_scale(w))
    scale = block_scale(w, (1, b), "e8m0", rounding)  # (v, 1, d / b, 1)
    blocks = w.reshape(v, 1, d // b, b)
    w_mx = block_fake_quantize(w, (1, b), "e8m0", rounding)
    clipped = float(np.mean(np.abs(blocks) > 448.0 * scale * (1 + 1e-12)))
    # One GEMM for the three weight sets and Frobenius norms without BLAS: fewer multi-threaded BLAS calls keep the
    # explorer fast on a loaded machine (the values are the same products and norms).
    y, y_pt, y_mx = np.split(h @ np.concatenate([w, w_pt, w_mx]).T, 3, axis=1)

    def fro(a):
        return float(np.sqrt(np.sum(a * a)))

    norm = fro(y)
    top, t_pt, t_mx = y.argmax(axis=1), y_pt.argmax(axis=1), y_mx.argmax(axis=1)
    return FormatDisagreement(
        fro(y_pt - y) / norm, fro(y_mx - y) / norm, fro(y_pt - y_mx) / norm, float(np.mean(t_pt != t_mx)),
        float(np.mean(t_pt != top)), float(np.mean(t_mx != top)), clipped)
