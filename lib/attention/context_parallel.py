"""Context parallelism for one long request: how many groups hold its KV, and what ring attention costs.

A request of T tokens is split into ``cp`` contiguous groups of T / cp tokens (load-balanced for
the causal mask, as ring-attention implementations do with zig-zag chunks), each group a
tensor-parallel replica of ``tp`` GPUs. Capacity, compute and communication all come from the
book's one model of each:

* **Capacity.** Each GPU's KV pool is :func:`lib.perf.memory.memory_budget` at ``tp``; it holds
  ``token_capacity`` tokens of its head slice, so one request needs
  cp >= ceil(T / token_capacity) groups (:func:`groups_to_hold`).
* **Compute.** Context parallelism splits the prefill FLOPs evenly over the groups:
  compute = :func:`lib.perf.prefill.prefill_estimate` at ``tp`` GPUs / cp; the weight read per
  GPU is unchanged (every group reads its whole TP shard); the tensor-parallel all-reduces carry
  T / cp tokens (:func:`lib.perf.prefill.prefill_allreduce_s`), in every group at once.
* **Ring (pass-KV).** Per layer, every GPU passes its group's K/V chunk, (T / cp) x KV bytes per
  token per layer x the TP shard fraction, to the next group, cp - 1 hops, each priced by
  :func:`lib.perf.collectives.send` (over the node's fabric, or the network when the groups are
  whole nodes). Each hop overlaps with attention of the local queries against the chunk just
  received: the layer's attention FLOPs / (cp^2 x tp) per GPU at the prefill MFU. Only the part
  of a hop longer than that compute is exposed.

TTFT = max(compute, weight read) + all-reduces + exposed ring time (queueing and the first
decode excluded). With cp = 1 this is :func:`lib.perf.prefill.prefill_time` exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer
from lib.perf.memory import MemoryBudget
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model

__all__ = ["RingPrefill", "groups_to_hold", "ring_prefill"]


def groups_to_hold(budget: MemoryBudget, context: int) -> int:
    """Context-parallel groups whose KV pools hold one request of ``context`` tokens:
    ceil(context / tokens each GPU's pool holds) (one whole block per group at least)."""
    context = integer("context", context, 1, unit="tokens")
    if budget.token_capacity < 1:
        raise ValueError("the KV pool holds no token: nothing to split")
    return math.ceil(context / budget.token_capacity)


@dataclass(frozen=True)
class RingPrefill:
    """One request's prefill over ``cp`` context-parallel groups of ``tp`` GPUs (module docstring)."""

    cp: int
    tp: int
    context: int
    fabric: str  # what the ring's sends cross
    chunk_bytes: float  # K/V one GPU passes per hop per layer
    hop_send_s: float  # one hop's send
    hop_compute_s: float  # the attention one GPU does per hop per layer, overlapping the send
    hops_per_layer: int
    layers: int
    compute_s: float  # prefill FLOPs / (cp x tp x peak x mfu)
    weight_read_s: float
    allreduce_s: float  # the TP all-reduces of T / cp tokens

    @property
    def exposed_ring_s(self) -> float:
        """Ring time the attention does not hide: layers x hops x max(0, send - compute)."""
        return self.layers * self.hops_per_layer * max(0.0, self.hop_send_s - self.hop_compute_s)

    @property
    def ring_hidden(self) -> bool:
        """Whether each hop's send fits under the attention it overlaps."""
        return self.hop_send_s <= self.hop_compute_s

    @property
    def ttft_s(self) -> float:
        """max(compute, weight read) + all-reduces + exposed ring time."""
        return max(self.compute_s, self.weight_read_s) + self.allreduce_s + self.exposed_ring_s


def ring_prefill(mdl: str | Model, chip: str | GPU, context: int, cp: int, tp: int, *, mfu: float | None = None,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16", compute_dtype: str = "bf16",
                 act_dtype: str = "bf16", across_nodes: bool | None = None) -> RingPrefill:
    """Prefill of one ``context``-token request on ``cp`` groups of ``tp`` GPUs with pass-KV ring attention.

    ``across_nodes`` (default: cp > 1 and cp x tp larger than one node) sends the ring over the
    network, else over the node's fabric. Formulas in the module docstring; ``mfu`` None is the
    book's prefill MFU (``prefill.prefill_mfu``).
    """
    from lib.perf.collectives import gpus_per_node, send
    from lib.perf.prefill import default_mfu, prefill_allreduce_s, prefill_estimate
    from lib.perf.roofline import kv_shard_fraction

    m, g = model(mdl), gpu(chip)
    context = integer("context", context, 1, unit="tokens")
    cp = integer("cp", cp, 1)
    tp = m.check_tp(tp)
    if context < cp:
        raise ValueError(f"cp={cp} groups need at least one token each; context is {context}")
    u = default_mfu(mfu)
    est = prefill_estimate(m, g, context, tp, u, weight_dtype, compute_dtype, kv_dtype)
    chunk_tokens = math.ceil(context / cp)
    allreduce = prefill_allreduce_s(m, g, chunk_tokens, tp, 1, act_dtype)
    if across_nodes is None:
        across_nodes = cp > 1 and cp * tp > gpus_per_node(chip=g)
    chunk = chunk_tokens * m.kv_bytes_per_token(kv_dtype) / m.num_layers * kv_shard_fraction(m, tp)
    if cp > 1:
        hop = send(chunk, g, across_nodes=across_nodes)
        hop_s, fabric = hop.time_s, hop.fabric
    else:
        hop_s, fabric = 0.0, "none"
    rate = g.peak_flops(compute_dtype) * u
    hop_compute = est.flops_attention / m.num_layers / (cp * cp * tp) / rate
    return RingPrefill(cp, tp, context, fabric, chunk, hop_s, hop_compute, cp - 1, m.num_layers,
                       est.compute_s / cp, est.memory_s, allreduce)
