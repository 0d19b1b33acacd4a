"""Disaggregated prefill and decode: the KV cache a prompt leaves, and how long it takes to cross
from the prefill replica to the decode replica.

* :func:`kv_transfer` / :func:`kv_transfer_s`: the one model of a prompt's KV hand-off.

  bytes  = P x ``Model.kv_bytes_per_token(kv_dtype)`` (the unique KV of the prompt; GQA heads
  replicated across TP ranks are sent once);
  lanes  = min(GPUs of the prefill replica, GPUs of the decode replica): each GPU sends its
  share over its own NIC share (:func:`lib.perf.collectives.network_fabric`), all in parallel;
  messages per lane = 1 (``"bulk"``: one coalesced buffer), the layers the lane holds
  (``"layer"``: one send per layer, what lets the transfer run behind the prefill) or layers x
  blocks x (K, V) (``"block"``: one send per paged-KV block, the naive hand-off);
  time   = messages x :func:`lib.perf.collectives.send` (bytes per message), the slower of the two
  chips' links. Each message pays the link latency, so the count of messages, not the bytes,
  is what a naive paged hand-off pays for.
* :meth:`KVTransfer.exposed_s`: what the transfer adds to the time to first token after a
  prefill of ``prefill_s``: everything for ``bulk``/``block`` (sent after the prefill), and for
  ``layer`` (layer l sent while layer l + 1 computes) ``max(tau, L tau - (L - 1) prefill_s / L)``
  with ``tau`` one layer's send and ``L`` the layers.

* :func:`colocated_capacity`: requests/s one replica serves when prefill and decode share it
  (chunked prefill) and every step must stay within the TPOT target ``T`` while every prompt
  finishes its prefill within the TTFT budget ``tau``. In steady state a step of length ``s``
  carries ``D = lambda O s`` decodes and ``C`` prompt tokens, ``C = max(lambda P s, P s / tau)``
  (the load's prompt tokens, or the chunk that finishes one prompt within ``tau``); the step is
  the simulator's own mixed step (:func:`lib.scheduling.cost.step_cost`), and ``s`` its fixed point
  ``s = step(D(s), C(s))``, so

      lambda_colo = max lambda such that s <= T and the KV pool holds D (P + O) + P (D <= max_num_seqs).

  Where the TPOT target binds, ``s = T``; where the KV pool or max_num_seqs binds, steps are shorter
  than ``T`` and the rate is ``D / (O s)``.

  A TTFT budget below the prefill's own time, or a chunk ``P T / tau`` that alone overruns
  ``T``, makes colocation infeasible: that is the fight.
* :func:`disaggregated_capacity`: the same request on two pools: a prefill replica completes
  ``1 / prefill_time(P)`` prompts/s (:func:`lib.perf.prefill.prefill_time`), a decode replica
  ``B / (O t(B))`` with ``B`` the batch the TPOT target and its KV pool allow
  (:func:`lib.scheduling.replica.batch_limits`); the time to first token is the prefill plus
  the exposed part of the KV hand-off (:meth:`KVTransfer.exposed_s`).
  :func:`disaggregated_within`: the same when it meets both targets, else None (the TTFT is
  checked before the decode side's batch search).

SI units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["GRANULARITIES", "Colocated", "Disaggregated", "KVTransfer", "PoolSizes", "colocated_capacity",
           "disaggregated_capacity", "disaggregated_within", "link_budget", "LinkBudget", "longest_colocated_prompt", "longest_disaggregated_prompt", "pool_sizes",
           "kv_bytes", "kv_transfer", "kv_transfer_s"]

GRANULARITIES = ("bulk", "layer", "block")


def kv_bytes(dep, prompt_len: int) -> float:
    """Unique KV bytes of a ``prompt_len``-token prompt on ``dep``:
    :func:`lib.perf.memory.kv_bytes_per_sequence` with the deployment's model and kv_dtype."""
    from lib.perf.deployment import require
    from lib.perf.memory import kv_bytes_per_sequence

    dep = require(dep)
    integer("prompt_len", prompt_len, 1, unit="tokens")
    return kv_bytes_per_sequence(dep.mdl, prompt_len, dep.kv_dtype)


@dataclass(frozen=True)
class KVTransfer:
    """One prompt's KV hand-off from a prefill replica to a decode replica (module doc).

    ``bytes_total``: unique KV bytes; ``lanes``: GPUs sending in parallel, each over its NIC;
    ``messages``: sends per lane; ``latency_s`` / ``bandwidth_s``: the two parts of the lane's
    time; ``layers``: layers one lane holds (for the layer-wise overlap); ``link``: the fabric."""

    prompt_len: int
    granularity: str
    bytes_total: float
    lanes: int
    messages: int
    layers: int
    latency_s: float
    bandwidth_s: float
    link_bytes_per_s: float
    link: str

    @property
    def time_s(self) -> float:
        """Seconds from the first byte sent to the last byte received (one lane; lanes run in parallel)."""
        return self.latency_s + self.bandwidth_s

    @property
    def bytes_per_lane(self) -> float:
        return self.bytes_total / self.lanes

    @property
    def effective_bytes_per_s(self) -> float:
        """Bytes the replica pair moves per second of transfer: bytes_total / time_s."""
        return self.bytes_total / self.time_s if self.time_s > 0 else math.inf

    def exposed_s(self, prefill_s: float) -> float:
        """Seconds the transfer adds after a prefill of ``prefill_s``: all of it unless layer-wise;
        layer-wise ``max(tau, L tau - (L - 1) prefill_s / L)``, tau one layer's send."""
        t = real("prefill_s", prefill_s, 0)
        if self.granularity != "layer":
            return self.time_s
        n = self.layers
        tau = self.time_s / n
        return max(tau, n * tau - (n - 1) * t / n)


def kv_transfer(dep, prompt_len: int, decode_dep=None, *, granularity: str = "bulk",
                across_nodes: bool = True) -> KVTransfer:
    """The KV hand-off of a ``prompt_len``-token prompt from a replica of ``dep`` to one of
    ``decode_dep`` (default: the same layout), over the network (``across_nodes``) or the node's
    scale-up link. See the module docstring for the formula. ``granularity``: bulk, layer or block."""
    from lib.perf.collectives import send
    from lib.perf.deployment import require

    dep = require(dep)
    dec = dep if decode_dep is None else require(decode_dep)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}; got {granularity!r}")
    if not isinstance(across_nodes, bool):
        raise ValueError(f"across_nodes must be True or False, got {across_nodes!r}")
    if dec.model != dep.model or dec.kv_dtype != dep.kv_dtype:
        raise ValueError(
            f"decode_dep must serve the same model and kv_dtype as dep ({dep.model}, {dep.kv_dtype}); "
            f"got {dec.model}, {dec.kv_dtype}"
        )
    total = kv_bytes(dep, prompt_len)
    p = int(prompt_len)
    lanes = min(dep.gpus_per_replica, dec.gpus_per_replica)
    m = dep.mdl
    layers = math.ceil(m.num_layers / max(dep.pp, dec.pp))
    if granularity == "bulk":
        messages = 1
    elif granularity == "layer":
        messages = layers
    else:
        per_layer = math.ceil(p / dep.block_size) * (1 if m.is_mla else 2)
        messages = layers * per_layer
    per_message = total / lanes / messages
    worst = None
    for chip in {dep.gpu, dec.gpu}:
        one = send(per_message, chip, across_nodes=across_nodes)
        if worst is None or one.time_s > worst.time_s:
            worst = one
    link_rate = per_message / worst.bandwidth_s if worst.bandwidth_s > 0 else math.inf
    return KVTransfer(p, granularity, total, lanes, messages, layers,
                      messages * worst.latency_s, messages * worst.bandwidth_s, link_rate, worst.fabric)


def kv_transfer_s(dep, prompt_len: int, decode_dep=None, *, granularity: str = "bulk",
                  across_nodes: bool = True) -> float:
    """Seconds to move a ``prompt_len``-token prompt's KV from a ``dep`` replica to a
    ``decode_dep`` replica: ``kv_transfer(...).time_s`` (module docstring)."""
    return kv_transfer(dep, prompt_len, decode_dep, granularity=granularity,
                       across_nodes=across_nodes).time_s


# ---- colocated vs disaggregated capacity ------------------------------------------------------


@dataclass(frozen=True)
class Colocated:
    """One colocated replica at its capacity (module doc): ``rate`` requests/s, the ``decodes``
    and ``chunk_tokens`` a step carries, the ``step_s`` it takes, and what stopped the rate
    (``binding``: 'the TPOT target', 'the KV pool' or 'max_num_seqs'). ``rate`` is 0 when
    colocation cannot meet both targets (``reason`` says why)."""

    dep: object
    prompt_len: int
    output_len: int
    tpot_s: float
    ttft_s: float
    rate: float
    decodes: float
    chunk_tokens: float
    step_s: float
    binding: str
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.rate > 0

    @property
    def gpu_s(self) -> float:
        """GPU-seconds per request: GPUs per replica / rate (inf when infeasible)."""
        return self.dep.gpus_per_replica / self.rate if self.rate > 0 else math.inf

    @property
    def ttft_prefill_s(self) -> float:
        """The prefill part of the time to first token: P / C steps of ``step_s`` (no queueing)."""
        return self.prompt_len / self.chunk_tokens * self.step_s if self.chunk_tokens > 0 else math.inf


def _mixed_step_s(cost, d: float, c: float, p: int, o: int) -> float:
    """The mixed step with a fractional decode count (linear between its neighbours)."""
    chunk = [(max(1, round(c)), max(0, round((p - c) / 2)))] if c > 0 else []
    lo = math.floor(d)

    def at(n: int) -> float:
        if n == 0:
            return cost.step_s(0, 0, chunk) if chunk else 0.0
        return cost.step_s(n, n * (p + o / 2), chunk)

    w = d - lo
    return at(lo) if w == 0 else (1 - w) * at(lo) + w * at(lo + 1)


def colocated_capacity(dep, prompt_len: int, output_len: int, tpot_s: float, ttft_s: float) -> Colocated:
    """The requests/s one replica of ``dep`` serves with chunked prefill under a TPOT target
    ``tpot_s`` on every step and a prefill budget ``ttft_s`` per prompt (module doc); bisection
    on the rate."""
    from lib.perf.deployment import require
    from lib.scheduling.cost import step_cost

    dep = require(dep)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    dep.mdl.check_context(p + o, "prompt_len + output_len")
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    tau = real("ttft_s", ttft_s, 0, low_open=True, unit="seconds")
    cost = step_cost(dep)
    cap, seqs = dep.budget.token_capacity, min(dep.max_num_seqs, cost.max_batch)
    c_min = p * t / tau

    def at(lam: float, s: float):
        return lam * o * s, max(lam * p * s, p * s / tau)

    def step_at(lam: float, s: float) -> float:
        return _mixed_step_s(cost, *at(lam, s), p, o)

    # The steady step s is the fixed point s = step(d(s), c(s)) with d = lam O s decodes and c the chunk; it must be
    # at most T (the TPOT target), and d at most d_max (the KV pool with one prompt being prefilled, or
    # max_num_seqs), i.e. s at most d_max / (lam O). As step(s) - s is positive for short steps and crosses zero once,
    # a rate is feasible when the step at the largest allowed s, s_e = min(T, d_max / (lam O)), fits within s_e.
    # Where the TPOT target binds the steady step is T; where memory binds it is shorter (lam O s decodes, not lam O T).
    kv_d = (cap - p) / (p + o)
    d_max = min(kv_d, seqs - 1)
    mem_binding = "the KV pool" if kv_d <= seqs - 1 else "max_num_seqs"

    def s_edge(lam: float) -> float:
        return t if lam * o * t <= d_max else d_max / (lam * o)

    def state(lam: float):
        if d_max <= 0 and lam > 0:
            return 0.0, 0.0, math.inf, mem_binding
        s_e = s_edge(lam)
        d, c = at(lam, s_e)
        step = _mixed_step_s(cost, d, c, p, o)
        if step <= s_e:
            return d, c, step, "the TPOT target"
        return d, c, (step if s_e == t else math.inf), ("the TPOT target" if s_e == t else mem_binding)

    def fixed_point(lam: float) -> float:
        s = s_edge(lam)  # iterate s = step(s) down from the edge (the step grows with s)
        for _ in range(200):
            nxt = step_at(lam, s)
            if abs(nxt - s) <= 1e-9 * t:
                return nxt
            s = nxt
        return s

    first = _mixed_step_s(cost, 0.0, c_min, p, o) if c_min <= cap else math.inf
    if p > cap:
        return Colocated(dep, p, o, t, tau, 0.0, 0.0, c_min, math.inf, "the KV pool",
                         f"one {p:,}-token prompt does not fit the KV pool ({cap:,} tokens)")
    if first > t:
        return Colocated(dep, p, o, t, tau, 0.0, 0.0, c_min, first, "the TPOT target",
                         f"finishing a {p:,}-token prefill within {tau:.3g} s takes chunks of {c_min:.0f} tokens, "
                         f"and a step carrying one already lasts {first * 1e3:.3g} ms, over the {t * 1e3:.3g} ms target")
    lo, hi = 0.0, 1.0
    while state(hi)[2] <= t:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid in (lo, hi):  # the bracket is two adjacent floats: further halvings change nothing
            break
        lo, hi = (mid, hi) if state(mid)[2] <= t else (lo, mid)
    step = fixed_point(lo) if lo > 0 else first
    d, c = at(lo, step)
    binding = state(hi)[3]
    return Colocated(dep, p, o, t, tau, lo, d, c, step, binding)


@dataclass(frozen=True)
class Disaggregated:
    """One request on separate pools (module doc): prompts/s of a prefill replica, requests/s of
    a decode replica at its ``batch`` (``binding`` the ceiling that set it), the KV hand-off, and
    the time to first token it gives (prefill + exposed transfer; no queueing)."""

    prefill_dep: object
    decode_dep: object
    prompt_len: int
    output_len: int
    prefill_s: float
    batch: int
    binding: str
    decode_step_s: float
    transfer: KVTransfer
    tpot_target_s: float = math.nan

    @property
    def prefill_rate(self) -> float:
        return 1.0 / self.prefill_s

    @property
    def decode_rate(self) -> float:
        return self.batch / (self.output_len * self.decode_step_s) if self.batch > 0 else 0.0

    @property
    def ttft_s(self) -> float:
        return _ttft_s(self.prefill_s, self.transfer)

    @property
    def gpu_s(self) -> float:
        """GPU-seconds per request over both pools: g_p / prefill_rate + g_d / decode_rate."""
        if self.decode_rate <= 0:
            return math.inf
        return (self.prefill_dep.gpus_per_replica / self.prefill_rate
                + self.decode_dep.gpus_per_replica / self.decode_rate)

    @property
    def decode_share(self) -> float:
        """The decode pool's share of the GPUs (the pool ratio the load needs)."""
        return self.decode_dep.gpus_per_replica / self.decode_rate / self.gpu_s

    @property
    def kv_stream_bytes_per_s(self) -> float:
        """The KV bytes/s a prefill replica emits running flat out: KV bytes per prompt / prefill_s (the
        link that keeps up with the prefill)."""
        return self.transfer.bytes_total / self.prefill_s

    @property
    def nic_utilization(self) -> float:
        """The share of the prefill replica's NICs the KV stream takes when it runs flat out:
        kv_stream_bytes_per_s / (lanes x the link's achieved bytes/s)."""
        return self.kv_stream_bytes_per_s / (self.transfer.lanes * self.transfer.link_bytes_per_s)


def _ttft_s(prefill_s: float, transfer: KVTransfer) -> float:
    """Time to first token on two pools: the prefill plus the exposed part of its KV hand-off (seconds)."""
    return prefill_s + transfer.exposed_s(prefill_s)


def _disaggregated(prefill_dep, decode_dep, prompt_len: int, output_len: int, tpot_s: float, ttft_s: float | None,
                   granularity: str, across_nodes: bool) -> Disaggregated | None:
    """:func:`disaggregated_capacity`; with a ``ttft_s`` budget, None as soon as the prefill side misses it
    (before the decode side's batch search, the costly part)."""
    from lib.perf.deployment import require
    from lib.perf.prefill import prefill_time
    from lib.perf.throughput import step_s
    from lib.scheduling.replica import batch_limits

    pd, dd = require(prefill_dep), require(decode_dep)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    dd.mdl.check_context(p + o, "prompt_len + output_len")
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    tr = kv_transfer(pd, p, dd, granularity=granularity, across_nodes=across_nodes)
    pre = prefill_time(pd, p).time_s
    if ttft_s is not None and _ttft_s(pre, tr) > ttft_s:
        return None
    limits = batch_limits(dd, p + o, t)
    b = limits.limit
    step = step_s(dd, b, p + o // 2) if b >= 1 else math.inf
    return Disaggregated(pd, dd, p, o, pre, b, limits.binding, step, tr, t)


def disaggregated_capacity(prefill_dep, decode_dep, prompt_len: int, output_len: int, tpot_s: float, *,
                           granularity: str = "layer", across_nodes: bool = True) -> Disaggregated:
    """The two pools' capacities for one request shape (module doc)."""
    return _disaggregated(prefill_dep, decode_dep, prompt_len, output_len, tpot_s, None, granularity, across_nodes)


def disaggregated_within(prefill_dep, decode_dep, prompt_len: int, output_len: int, tpot_s: float, ttft_s: float, *,
                         granularity: str = "layer", across_nodes: bool = True) -> Disaggregated | None:
    """:func:`disaggregated_capacity` when the two pools meet both targets (a decode batch of at least
    one within ``tpot_s``, and ``ttft_s`` >= prefill + exposed hand-off), else None. The time to first
    token is checked first, so a prompt over the budget skips the decode side's batch search."""
    tau = real("ttft_s", ttft_s, 0, low_open=True, unit="seconds")
    d = _disaggregated(prefill_dep, decode_dep, prompt_len, output_len, tpot_s, tau, granularity, across_nodes)
    return d if d is not None and d.batch >= 1 else None


@dataclass(frozen=True)
class PoolSizes:
    """A load of ``rate`` requests/s served colocated or on two pools, each sized by
    :func:`lib.fleet.capacity.fleet_for_load` (:class:`~lib.fleet.capacity.FleetSize`)."""

    colocated: object  # FleetSize, or None when colocation cannot meet the targets
    prefill: object
    decode: object

    @property
    def disaggregated_gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus


def pool_sizes(rate: float, colo: Colocated, dis: Disaggregated, utilization: float | None = None) -> PoolSizes:
    """Size both designs for ``rate`` requests/s with :func:`lib.fleet.capacity.fleet_for_load`, each
    from its replica-seconds per request: a prefill replica's ``prefill_s``, a decode replica's
    ``1 / decode_rate`` (= O t(B) / B), a colocated replica's ``1 / rate`` (its step mixes both phases)."""
    from lib.fleet.capacity import fleet_for_load

    if dis.batch < 1:
        raise ValueError(f"the decode pool cannot serve {dis.prompt_len + dis.output_len:,}-token sequences "
                         f"within the TPOT target")
    col = None
    if colo.feasible:
        col = fleet_for_load(rate, 1.0 / colo.rate, utilization, gpus_per_replica=colo.dep.gpus_per_replica)
    pre = fleet_for_load(rate, dis.prefill_s, utilization, gpus_per_replica=dis.prefill_dep.gpus_per_replica)
    dec = fleet_for_load(rate, 1.0 / dis.decode_rate, utilization, gpus_per_replica=dis.decode_dep.gpus_per_replica)
    return PoolSizes(col, pre, dec)


def _longest(ok, top: int) -> int:
    """The largest prompt length p in [1, top] with ok(p), for an ok true then false as p grows (integer
    bisection); 0 when not even p = 1 is."""
    from lib.search import largest_true

    if ok(top):
        return top
    if not ok(1):
        return 0
    return largest_true(ok, 2, top - 1)  # ok(1), not ok(top): 1 when nothing between is ok


def longest_colocated_prompt(dep, output_len: int, tpot_s: float, ttft_s: float) -> int:
    """The longest prompt (tokens) a colocated replica can serve with both targets: bisection on
    P for :func:`colocated_capacity` being feasible (a chunk of P T / tau tokens fits one step of
    T). 0 when not even a one-token prompt can; the window minus the output when every prompt can."""
    o = integer("output_len", output_len, 1, unit="tokens")
    top = dep.mdl.max_position_embeddings - o
    if top < 1:
        raise ValueError(f"output_len = {o:,} leaves no room for a prompt in {dep.model}'s window")

    def ok(p: int) -> bool:
        return colocated_capacity(dep, p, o, tpot_s, ttft_s).feasible

    return _longest(ok, top)


def longest_disaggregated_prompt(prefill_dep, decode_dep, output_len: int, tpot_s: float, ttft_s: float, *,
                                 granularity: str = "layer") -> int:
    """The longest prompt whose prefill plus exposed KV hand-off fits ``ttft_s`` and whose
    sequence the decode pool can batch within ``tpot_s`` (bisection; 0 when none)."""
    o = integer("output_len", output_len, 1, unit="tokens")
    real("ttft_s", ttft_s, 0, low_open=True, unit="seconds")
    top = decode_dep.mdl.max_position_embeddings - o
    if top < 1:
        raise ValueError(f"output_len = {o:,} leaves no room for a prompt in {decode_dep.model}'s window")

    def ok(p: int) -> bool:
        return disaggregated_within(prefill_dep, decode_dep, p, o, tpot_s, ttft_s, granularity=granularity) is not None

    return _longest(ok, top)


@dataclass(frozen=True)
class LinkBudget:
    """Where one prefill -> decode hand-off runs out (see :func:`link_budget`). Rates are requests/s
    into ONE replica of that side; bytes are KV bytes summed over the replica's GPUs."""

    sender_compute_rate: float  # 1 / prefill_s
    sender_nic_rate: float  # lanes x achieved link bytes/s / KV bytes per request
    sender_pool_bytes: float
    sender_held_bytes: float  # at its full rate: rate x transfer time x KV bytes (Little)
    receiver_kv_rate: float  # by_kv / (O t(by_kv))
    receiver_tpot_rate: float  # by_tpot / (O t(by_tpot))
    receiver_nic_rate: float
    receiver_pool_bytes: float
    kv_bytes: float  # per request

    @property
    def receiver_rate(self) -> float:
        """The most requests/s one decode replica takes: the smallest of its three limits."""
        return min(self.receiver_kv_rate, self.receiver_tpot_rate, self.receiver_nic_rate)

    @property
    def receiver_binding(self) -> str:
        """Which receiver limit binds: 'KV memory', 'the TPOT target' or 'the NICs' (ties: memory first)."""
        r = self.receiver_rate
        if self.receiver_kv_rate == r:
            return "KV memory"
        return "the TPOT target" if self.receiver_tpot_rate == r else "the NICs"

    @property
    def receiver_nic_utilization(self) -> float:
        """The decode replica's NICs' busy share at its own limit: receiver_rate / receiver_nic_rate."""
        return self.receiver_rate / self.receiver_nic_rate

    @property
    def sender_nic_utilization(self) -> float:
        """The prefill replica's NICs' busy share at its full rate: compute rate / NIC rate."""
        return self.sender_compute_rate / self.sender_nic_rate

    @property
    def fan_in(self) -> float:
        """Prefill replicas one decode replica absorbs: receiver_rate / sender_compute_rate."""
        return self.receiver_rate / self.sender_compute_rate

    @property
    def stall_absorb_s(self) -> float:
        """Seconds a prefill replica can keep producing while its receiver takes nothing, before its own
        KV pool is full: (pool - held) / (rate x KV bytes)."""
        return (self.sender_pool_bytes - self.sender_held_bytes) / (self.sender_compute_rate * self.kv_bytes)


def link_budget(dis: Disaggregated) -> LinkBudget:
    """The limits of both ends of a disaggregated hand-off (``dis`` from :func:`disaggregated_capacity`):

    * sender (a prefill replica): its compute, 1 / prefill_s; its NICs, lanes x achieved bytes/s /
      KV bytes; the KV it holds, only while sending (Little: rate x transfer x bytes);
    * receiver (a decode replica): its KV pool holds ``by_kv`` sequences of P + O tokens for O steps
      each, by_kv / (O t(by_kv)); the TPOT target, by_tpot / (O t(by_tpot)); its NICs, as above
      (:func:`lib.scheduling.replica.batch_limits` gives by_kv and by_tpot).
    """
    from lib.perf.throughput import step_s
    from lib.scheduling.replica import batch_limits

    if not isinstance(dis, Disaggregated):
        raise ValueError(f"dis must be a Disaggregated (disaggregated_capacity(...)), got {type(dis).__name__}")
    p, o, tr = dis.prompt_len, dis.output_len, dis.transfer
    dd, pd = dis.decode_dep, dis.prefill_dep
    lim = batch_limits(dd, p + o, dis.tpot_target_s)

    def rate_at(b: float) -> float:
        n = int(min(b, dd.max_num_seqs))
        return n / (o * step_s(dd, n, p + o // 2)) if n >= 1 else 0.0

    nic = tr.lanes * tr.link_bytes_per_s / tr.bytes_total
    return LinkBudget(
        1.0 / dis.prefill_s, nic, pd.budget.kv_cache_bytes * pd.gpus_per_replica,
        tr.time_s * tr.bytes_total / dis.prefill_s,
        rate_at(lim.by_kv), rate_at(lim.by_tpot), nic, dd.budget.kv_cache_bytes * dd.gpus_per_replica, tr.bytes_total)
