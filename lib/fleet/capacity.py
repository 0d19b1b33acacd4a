"""What a request costs a replica, the fleet a load needs, what that costs, and how long a replica
takes to start: the arithmetic every systems-design page sizes its boxes with.

* :func:`request_cost`: the replica-seconds one request takes on one replica of a
  :class:`~lib.perf.deployment.Deployment`, by phase. Prefill occupies the whole replica for
  ``prefill_time(dep, P).time_s`` (:func:`lib.perf.prefill.prefill_time`, the book's one prefill
  model); decode shares each step among the ``B`` sequences of the batch, so one request's decode
  costs ``O t(B, c) / B`` with ``t`` the one decode step (:func:`lib.perf.throughput.step_s`) at the
  mean context ``c = P + O / 2``. ``B`` is the batch the TPOT target, the KV pool (at the longest
  context ``P + O``) and ``max_num_seqs`` allow (:func:`lib.scheduling.replica.batch_limits`).
  ``replica_s = prefill_s + decode_s``: phase-separated, an upper estimate of a chunked engine,
  where prompt tokens ride on decode steps' weight reads (checked against the simulator). A prompt
  whose first ``h`` tokens hit a prefix cache (``cached_len``) prefills only its ``P - h`` new tokens,
  attending to the ``h`` cached ones: :func:`lib.kvcache.long_context.prefill_chunk_step_s` (the
  chunk model, equal to ``prefill_time`` at ``h = 0``), the one home of a warm prefill.
* :func:`fleet_for_load`: ``replicas = rate x replica_s / utilization`` (the exact fraction, then
  the ceiling) and the GPUs it takes, from a :class:`RequestCost` or a plain replica_s.
* :func:`gpu_hour_usd`: the one price per GPU-hour of each chip (``data/assumptions.yaml``).
* :func:`usd_per_million_tokens`: dollars per million input and output tokens, each phase priced
  by the replica-seconds it occupies at the planned utilization.
* :func:`replica_start_s`: container pull + weights over the load bandwidth + engine warm-up.

SI units: seconds, bytes, requests per second, US dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry import assumptions

__all__ = ["FleetSize", "ReplicaStart", "RequestCost", "TokenPrices", "default_utilization", "fleet_for_load",
           "gpu_hour_usd", "prefill_s", "replica_start_s", "request_cost", "usd_per_million_tokens", "whole_replicas"]


def default_utilization(utilization: float | None = None) -> float:
    """``utilization`` if given, else ``fleet.utilization_ceiling`` (the planned busy fraction), in (0, 1]."""
    u = assumptions.resolve(utilization, "fleet.utilization_ceiling")
    return real("utilization", u, 0, 1, low_open=True)


def gpu_hour_usd(chip=None, usd_per_gpu_hour: float | None = None) -> float:
    """US dollars per GPU-hour of ``chip`` (a name or GPU; None: the book's H100 price), or
    ``usd_per_gpu_hour`` when given. H100 SXM is ``serving_memory.gpu_hour_usd``; the other chips
    ``fleet.gpu_hour_usd_by_chip``."""
    from lib.perf.memory import fact
    from lib.registry.hardware import gpu

    if usd_per_gpu_hour is not None:
        return real("usd_per_gpu_hour", usd_per_gpu_hour, 0, low_open=True, unit="USD per GPU-hour")
    if chip is None:
        return float(fact("gpu_hour_usd"))
    key = gpu(chip).key
    if key == "h100-sxm":
        return float(fact("gpu_hour_usd"))
    table = assumptions.entry("fleet.gpu_hour_usd_by_chip")
    if key not in table:
        priced = ", ".join(["h100-sxm", *(k for k, v in table.items() if isinstance(v, dict))])
        raise ValueError(f"no GPU-hour price for {key!r}: priced chips are {priced}; pass usd_per_gpu_hour")
    return float(table[key]["value"])


@dataclass(frozen=True)
class RequestCost:
    """One request of ``prompt_len`` + ``output_len`` tokens on one replica of ``dep`` (module doc).

    ``batch``: the decode batch the replica runs; ``limits``: the ceilings it came from (None when
    the batch was given); ``prefill_s``: the replica time of the prompt's prefill;
    ``decode_step_s``: the decode step at ``batch`` and the mean context."""

    dep: object
    prompt_len: int
    output_len: int
    batch: int
    limits: object
    prefill_s: float
    decode_step_s: float

    @property
    def decode_s(self) -> float:
        """Replica-seconds of the request's decode: O t(B, c) / B."""
        return self.output_len * self.decode_step_s / self.batch

    @property
    def replica_s(self) -> float:
        """Replica-seconds per request: prefill + decode (phase-separated)."""
        return self.prefill_s + self.decode_s

    @property
    def prefill_share(self) -> float:
        """prefill_s / replica_s: the share of a replica's busy time the prompt takes."""
        return self.prefill_s / self.replica_s

    @property
    def max_rate(self) -> float:
        """Requests per second one replica completes when always busy: 1 / replica_s."""
        return 1.0 / self.replica_s

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second of prefill time: P / prefill_s."""
        return self.prompt_len / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Output tokens per second while decoding at the batch: B / t(B, c)."""
        return self.batch / self.decode_step_s

    @property
    def tpot_s(self) -> float:
        """Time per output token a client sees: the decode step (one token per sequence per step)."""
        return self.decode_step_s


def request_cost(dep, prompt_len: int, output_len: int, tpot_target_s: float | None = None, *,
                 batch: int | None = None, mfu: float | None = None, cached_len: int = 0) -> RequestCost:
    """Replica-seconds of one request by phase (module doc). Give ``tpot_target_s`` (the batch is the
    largest the target, the KV pool and ``max_num_seqs`` allow) or ``batch`` (used as is, still
    refused above what the KV pool holds). ``mfu``: the prefill's (None: the book's default).
    ``cached_len``: prompt tokens whose KV a prefix cache already holds (the prefill is warm; the
    decode and the KV the sequence holds do not change)."""
    from lib.perf.deployment import require
    from lib.perf.throughput import step_s
    from lib.scheduling.replica import batch_limits

    dep = require(dep)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    longest = dep.mdl.check_context(p + o, "prompt_len + output_len")
    mean_ctx = p + o // 2
    if (tpot_target_s is None) == (batch is None):
        raise ValueError("give exactly one of tpot_target_s (the batch follows from it) or batch")
    limits = None
    if batch is None:
        limits = batch_limits(dep, longest, tpot_target_s)
        b = limits.limit
        if b < 1:
            why = (f"one sequence's decode step is {step_s(dep, 1, longest) * 1e3:.3g} ms, over the "
                   f"{tpot_target_s * 1e3:.3g} ms TPOT target" if limits.binding == "the TPOT target"
                   else f"the KV pool holds {limits.by_kv:.2f} sequences of {longest} tokens")
            raise ValueError(f"{dep.label} cannot serve this request: {why}")
    else:
        b = integer("batch", batch, 1, unit="sequences")
        held = dep.budget.max_concurrency(longest)
        if b > held:
            raise ValueError(f"batch = {b} exceeds the {held:.2f} sequences of {longest} tokens the KV pool of "
                             f"{dep.label} holds")
    return RequestCost(dep, p, o, b, limits, prefill_s(dep, p, cached_len, mfu=mfu), step_s(dep, b, mean_ctx))


def prefill_s(dep, prompt_len: int, cached_len: int = 0, *, mfu: float | None = None) -> float:
    """Replica time of a prompt's prefill with its first ``cached_len`` tokens cached: ``prefill_time(P)``
    when cold, else the chunk of ``P - h`` new tokens at position ``h``
    (:func:`lib.kvcache.long_context.prefill_chunk_step_s`: max(compute incl. attention to the cached
    keys, weight read) + all-reduces of the new tokens). The last prompt token is always computed."""
    from lib.kvcache.long_context import prefill_chunk_step_s
    from lib.perf.deployment import require
    from lib.perf.prefill import prefill_time

    dep = require(dep)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    h = integer("cached_len", cached_len, 0, p - 1, unit="tokens")
    return prefill_time(dep, p, mfu=mfu).time_s if h == 0 else prefill_chunk_step_s(dep, p - h, h, mfu=mfu)


@dataclass(frozen=True)
class FleetSize:
    """Replicas for ``rate`` requests/s at ``utilization``: ``exact`` (a fraction) and ``replicas`` (its ceiling)."""

    rate: float
    utilization: float
    replica_s: float
    gpus_per_replica: int
    exact: float

    @property
    def replicas(self) -> int:
        """:func:`whole_replicas` of ``exact``."""
        return whole_replicas(self.exact)

    @property
    def gpus(self) -> int:
        """replicas x GPUs per replica."""
        return self.replicas * self.gpus_per_replica

    @property
    def busy(self) -> float:
        """The busy fraction the whole replicas actually run at: rate x replica_s / replicas."""
        return self.rate * self.replica_s / self.replicas


def whole_replicas(exact: float):
    """Whole replicas for an exact need: ceil(exact), at least 1 (a hair over an integer from rounding
    counts as that integer); an infinite need stays inf."""
    return exact if not math.isfinite(exact) else max(1, math.ceil(exact - 1e-9))


def fleet_for_load(rate: float, cost, utilization: float | None = None, *,
                   gpus_per_replica: int | None = None) -> FleetSize:
    """Replicas for ``rate`` requests/s: rate x replica_s / utilization (``utilization`` None: the
    planned ceiling, :func:`default_utilization`). ``cost``: a :class:`RequestCost`, or a plain number of
    replica-seconds per request (a capacity measured or derived elsewhere, e.g. 1 / requests/s of a
    simulated replica) with ``gpus_per_replica`` given."""
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    u = default_utilization(utilization)
    if isinstance(cost, RequestCost):
        if gpus_per_replica is not None:
            raise ValueError("gpus_per_replica comes from the RequestCost's deployment; give it only with a plain "
                             "replica_s")
        return FleetSize(lam, u, cost.replica_s, cost.dep.gpus_per_replica, lam * cost.replica_s / u)
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        raise ValueError(f"cost must be a RequestCost (request_cost(...)) or replica-seconds per request, got "
                         f"{type(cost).__name__}")
    rs = real("replica_s", cost, 0, low_open=True, unit="replica-seconds per request")
    if gpus_per_replica is None:
        raise ValueError("give gpus_per_replica with a plain replica_s")
    g = integer("gpus_per_replica", gpus_per_replica, 1)
    return FleetSize(lam, u, rs, g, lam * rs / u)


@dataclass(frozen=True)
class TokenPrices:
    """Dollars per million tokens of each phase at a GPU-hour price and a utilization."""

    usd_per_gpu_hour: float
    utilization: float
    input_usd_per_m: float  # prefill replica-time per prompt token
    output_usd_per_m: float  # decode replica-time per output token
    prompt_len: int
    output_len: int

    @property
    def usd_per_request(self) -> float:
        """(P x input + O x output) / 1e6."""
        return (self.prompt_len * self.input_usd_per_m + self.output_len * self.output_usd_per_m) * 1e-6

    @property
    def input_share(self) -> float:
        """Share of a request's dollars spent on its prompt."""
        return self.prompt_len * self.input_usd_per_m * 1e-6 / self.usd_per_request


def usd_per_million_tokens(cost: RequestCost, usd_per_gpu_hour: float | None = None,
                           utilization: float | None = None) -> TokenPrices:
    """Cost of serving, per million tokens of each phase:
    input = prefill_s x G x price / 3600 / u / P x 1e6, output = t(B) / B x G x price / 3600 / u x 1e6,
    with G the replica's GPUs, u the utilization (idle time is paid for too) and the price
    :func:`gpu_hour_usd` of the deployment's chip unless ``usd_per_gpu_hour`` is given."""
    if not isinstance(cost, RequestCost):
        raise ValueError(f"cost must be a RequestCost (request_cost(...)), got {type(cost).__name__}")
    price = gpu_hour_usd(cost.dep.chip, usd_per_gpu_hour)
    u = default_utilization(utilization)
    usd_per_replica_s = price * cost.dep.gpus_per_replica / 3600.0 / u
    inp = cost.prefill_s * usd_per_replica_s / cost.prompt_len * 1e6
    out = cost.decode_step_s / cost.batch * usd_per_replica_s * 1e6
    return TokenPrices(price, u, inp, out, cost.prompt_len, cost.output_len)


@dataclass(frozen=True)
class ReplicaStart:
    """The stages of bringing one replica up, seconds."""

    pull_s: float
    weights_s: float
    warmup_s: float
    weight_bytes: float

    @property
    def total_s(self) -> float:
        """pull + weights + warm-up: the stages run one after another."""
        return self.pull_s + self.weights_s + self.warmup_s


def replica_start_s(dep, *, load_gb_s: float | None = None, pull_s: float | None = None,
                    warmup_s: float | None = None) -> ReplicaStart:
    """Time from a node assigned to a replica serving: container pull + replica weight bytes / (nodes x
    per-node load bandwidth) + engine warm-up. Defaults: ``fleet.image_pull_s``,
    ``fleet.weight_load_gb_s`` (GB/s per node), ``fleet.engine_warmup_s``."""
    from lib.perf.collectives import gpus_per_node
    from lib.perf.deployment import require

    dep = require(dep)
    bw = real("load_gb_s", assumptions.resolve(load_gb_s, "fleet.weight_load_gb_s"), 0, low_open=True,
              unit="GB/s") * 1e9
    pull = real("pull_s", assumptions.resolve(pull_s, "fleet.image_pull_s"), 0, unit="seconds")
    warm = real("warmup_s", assumptions.resolve(warmup_s, "fleet.engine_warmup_s"), 0, unit="seconds")
    nodes = math.ceil(dep.gpus_per_replica / gpus_per_node(chip=dep.chip))
    wbytes = dep.mdl.weight_bytes(dep.weight_dtype)
    return ReplicaStart(pull, wbytes / (nodes * bw), warm, wbytes)

