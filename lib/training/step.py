"""The training step on a parallel layout: the one model of a training step's time, memory and MFU.

A :class:`TrainingLayout` places ``n = tp x cp x dp x pp`` GPUs in Megatron's order, tensor
parallelism innermost: a TP group is ``tp`` consecutive GPUs (inside a node while tp <= the node),
then context parallelism, then data parallelism (expert parallelism, for an MoE, inside the
cp x dp ranks), then pipeline stages outermost. Each group's collective is priced by
:func:`lib.perf.collectives.collective` with the number of its members that share a node, so a
DP group under TP8 is a ring over the network (one rank per node) and TP8 stays on NVLink.

Per step (``micro_batches`` micro-batches of ``micro_batch`` sequences per DP rank):

* compute: hardware FLOPs per GPU (:func:`lib.training.flops.hardware_flops_per_token`, recompute
  included) / (dense peak x ``training.gemm_efficiency``), plus memory-bound kernels as
  ``training.nonmatmul_overhead`` x that time;
* tensor parallelism: per layer and micro-batch, 2 collectives of the micro-batch's activations
  in the forward, 2 in the backward (2 more when full recompute re-runs the forward), each an
  all-reduce, or with sequence parallelism a reduce-scatter + all-gather of the same bytes;
  exposed except ``training.tp_overlap``;
* context parallelism (ring attention, pass-KV): per layer and micro-batch, cp - 1 hops of the
  GPU's K/V chunk forward and twice that backward (K/V and their gradients), each hidden under
  the attention of the local queries against the chunk just received; only the excess is exposed;
* expert parallelism: per MoE layer and micro-batch, dispatch + combine all-to-alls of each
  token's top-k copies in the forward and again in the backward, exposed;
* pipeline: 1F1B with ``interleave`` virtual stages: the step is (m + (pp - 1) / v) micro-batch
  times (Narayanan et al. 2021), plus the stage-boundary sends on the fill and drain path;
* data parallelism: the gradients of the parameters a GPU owns, reduced over the dp x cp ranks
  that replicate them (all-reduce; ZeRO 1-2: reduce-scatter + all-gather of the weights; ZeRO 3
  / FSDP: weights all-gathered in the forward and backward of every micro-batch and its gradients
  reduce-scattered after each), hidden under
  ``training.dp_overlap`` of the last micro-batch's backward (every micro-batch's, for ZeRO 3);
* optimizer: ``training.optimizer_bytes_per_param`` bytes per owned (ZeRO: sharded) parameter
  over HBM bandwidth.

MFU = model FLOPs of the step (:func:`lib.training.flops.model_flops_per_token` x tokens) /
(n x dense peak x step time). Not modelled: host and data-loader stalls, stragglers, failures
(see :mod:`lib.training.reliability`), load imbalance between experts.

SI units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from lib.inputs import fraction, integer
from lib.perf.collectives import collective, gpus_per_node, send
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.training import flops, state

__all__ = ["Call", "TrainingAssumptions", "axis_calls", "require_layout", "TrainingLayout", "TrainingStep", "training_assumptions", "training_memory",
           "training_step"]


@dataclass(frozen=True)
class TrainingAssumptions:
    """The modelling numbers of the training step that are not datasheet facts (data/assumptions.yaml, training)."""

    gemm_efficiency: float
    nonmatmul_overhead: float
    dp_overlap: float
    tp_overlap: float
    optimizer_bytes_per_param: float

    def __post_init__(self) -> None:
        fraction("gemm_efficiency", self.gemm_efficiency, allow_zero=False)
        if not 0 <= self.nonmatmul_overhead <= 5:
            raise ValueError(f"nonmatmul_overhead must be in [0, 5], got {self.nonmatmul_overhead!r}")
        fraction("dp_overlap", self.dp_overlap)
        fraction("tp_overlap", self.tp_overlap)
        if self.optimizer_bytes_per_param < 0:
            raise ValueError(f"optimizer_bytes_per_param must be >= 0, got {self.optimizer_bytes_per_param!r}")


def training_assumptions(**overrides) -> TrainingAssumptions:
    """The central values of ``training.*`` in data/assumptions.yaml, with ``overrides``."""
    names = ("gemm_efficiency", "nonmatmul_overhead", "dp_overlap", "tp_overlap", "optimizer_bytes_per_param")
    unknown = set(overrides) - set(names)
    if unknown:
        raise ValueError(f"unknown training assumption(s) {sorted(unknown)}; valid: {', '.join(names)}")
    base = {n: float(assumptions.value(f"training.{n}")) for n in names}
    return TrainingAssumptions(**{**base, **overrides})


@dataclass(frozen=True)
class TrainingLayout:
    """A training job: model, chip, parallel degrees and batch shape (module docstring)."""

    model: str | Model
    gpu: str | GPU
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    seq_len: int = 8192
    micro_batch: int = 1  # sequences per micro-batch per DP rank
    micro_batches: int = 1  # micro-batches per step per DP rank (gradient accumulation; the pipeline's m)
    zero_stage: int = 1
    recompute: str = "none"
    sequence_parallel: bool = True
    interleave: int = 1  # virtual pipeline stages per GPU
    dtype: str = "bf16"  # the matmul dtype (its dense peak)
    node_gpus: int | None = None  # GPUs per node; default lib.perf.collectives.gpus_per_node

    def __post_init__(self) -> None:
        m, g = self.mdl, self.chip
        for name in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "micro_batches", "interleave"):
            integer(name, getattr(self, name), 1)
        m.check_tp(self.tp)
        s = integer("seq_len", self.seq_len, 1, unit="tokens")
        if s > m.max_position_embeddings:
            raise ValueError(f"seq_len must be at most {m.key}'s {m.max_position_embeddings:,}-token window, got {s:,}")
        if s % self.cp:
            raise ValueError(f"cp={self.cp} must divide seq_len={s:,} (each context rank holds seq_len / cp tokens)")
        if self.pp > m.num_layers:
            raise ValueError(f"pp={self.pp} must be at most {m.key}'s {m.num_layers} layers")
        if self.interleave > 1 and (self.pp == 1 or self.pp * self.interleave > m.num_layers):
            raise ValueError(f"interleave={self.interleave} needs pp > 1 and pp x interleave at most "
                             f"the {m.num_layers} layers")
        if self.ep > 1:
            if not m.is_moe:
                raise ValueError(f"ep={self.ep} needs a mixture-of-experts model; {m.key} is dense")
            if m.num_experts % self.ep or (self.dp * self.cp) % self.ep:
                raise ValueError(f"ep={self.ep} must divide {m.key}'s {m.num_experts} experts and dp x cp = "
                                 f"{self.dp * self.cp}")
        if self.zero_stage not in state.ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {state.ZERO_STAGES}; got {self.zero_stage!r}")
        if self.recompute not in flops.RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(flops.RECOMPUTE)}; got {self.recompute!r}")
        g.peak_flops(self.dtype)
        node = self.node
        if self.tp > node and self.tp % node:
            raise ValueError(f"tp={self.tp} spans nodes of {node} GPUs: it must be a multiple of {node}")
        for axis, size, stride in (("cp", self.cp, self.tp), ("dp x cp", self.dp * self.cp, self.tp),
                                   ("ep", self.ep, self.tp * self.cp)):
            k = self.members_per_node(stride, size)
            if size > k and size % k:
                raise ValueError(f"the {axis} group ({size} ranks, {k} of them per {node}-GPU node) does not "
                                 f"fill whole nodes: make {axis} a multiple of {k} or at most {k}")

    @property
    def mdl(self) -> Model:
        return model(self.model)

    @property
    def chip(self) -> GPU:
        return gpu(self.gpu)

    @property
    def node(self) -> int:
        return gpus_per_node(self.node_gpus, self.chip)

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on: dp x micro-batches x micro-batch x seq_len."""
        return self.dp * self.micro_batches * self.micro_batch * self.seq_len

    @property
    def layers_per_stage(self) -> int:
        return math.ceil(self.mdl.num_layers / self.pp)

    def members_per_node(self, stride: int, size: int) -> int:
        """Members of a group of ``size`` ranks spaced ``stride`` apart that share one node."""
        return max(1, min(size, self.node // stride)) if stride < self.node else 1

    @property
    def label(self) -> str:
        parts = [f"TP{self.tp}"] + [f"{k}{v}" for k, v in (("CP", self.cp), ("EP", self.ep), ("PP", self.pp))
                                    if v > 1] + [f"DP{self.dp}"]
        return f"{self.mdl.key} on {self.n_gpus:,} x {self.chip.name}, {' '.join(parts)}"

    def replace(self, **changes) -> TrainingLayout:
        return replace(self, **changes)


@dataclass(frozen=True)
class TrainingStep:
    """One optimizer step on a layout, seconds per bucket (module docstring); per GPU."""

    layout: TrainingLayout
    assume: TrainingAssumptions
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    matmul_s: float  # every matmul, recompute included
    recompute_s: float  # the part of matmul_s that re-runs forward work
    nonmatmul_s: float
    tp_s: float
    tp_exposed_s: float
    cp_s: float
    cp_exposed_s: float
    ep_s: float
    ep_exposed_s: float
    bubble_s: float
    p2p_exposed_s: float
    dp_s: float
    dp_exposed_s: float
    optimizer_s: float
    fabrics: dict = field(default_factory=dict)  # axis -> the link its collective crossed
    pp_s: float = 0.0  # every stage-boundary send of the step (p2p_exposed_s: those on the fill and drain path)
    cp_hop_send_s: float = 0.0  # one ring hop's K/V send (context parallelism), per layer and micro-batch
    cp_hop_compute_s: float = 0.0  # the attention it hides under: local queries against the chunk received

    @property
    def micro_batch_s(self) -> float:
        """One micro-batch on one stage: compute and the exposed TP / CP / EP communication."""
        lay = self.layout
        return (self.matmul_s + self.nonmatmul_s + self.tp_exposed_s + self.cp_exposed_s
                + self.ep_exposed_s) / lay.micro_batches

    @property
    def step_s(self) -> float:
        """m micro-batches + pipeline bubble + fill/drain sends + exposed DP + optimizer."""
        return (self.micro_batch_s * self.layout.micro_batches + self.bubble_s + self.p2p_exposed_s
                + self.dp_exposed_s + self.optimizer_s)

    @property
    def tokens_per_s(self) -> float:
        return self.layout.tokens_per_step / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs per GPU / (dense peak x step time)."""
        return self.model_flops_per_gpu / (self.layout.chip.peak_flops(self.layout.dtype) * self.step_s)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs (recompute included) per GPU / (dense peak x step time)."""
        return self.hardware_flops_per_gpu / (self.layout.chip.peak_flops(self.layout.dtype) * self.step_s)

    @property
    def ideal_s(self) -> float:
        """Model FLOPs per GPU at the full dense peak: the time an MFU of 100% would take."""
        return self.model_flops_per_gpu / self.layout.chip.peak_flops(self.layout.dtype)

    @property
    def buckets(self) -> dict[str, float]:
        """Where the step goes, seconds, summing to ``step_s``: useful matmul work at the dense
        peak, then each loss in turn."""
        matmul_useful = self.matmul_s - self.recompute_s
        return {
            "model FLOPs at peak": self.ideal_s,
            "GEMM efficiency": matmul_useful - self.ideal_s,
            "recompute": self.recompute_s,
            "non-matmul kernels": self.nonmatmul_s,
            "TP communication": self.tp_exposed_s,
            "CP communication": self.cp_exposed_s,
            "EP all-to-all": self.ep_exposed_s,
            "pipeline bubble": self.bubble_s + self.p2p_exposed_s,
            "DP communication": self.dp_exposed_s,
            "optimizer": self.optimizer_s,
        }


class Call(NamedTuple):
    """One kind of communication a step makes on one parallel axis, per GPU."""

    payload: str  # what moves
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send
    message_bytes: float  # per call: the rank's buffer (the full gathered buffer for all-gather / reduce-scatter)
    calls: int  # per step
    group: int  # ranks in the collective (2 for a send)
    stride: int  # rank distance between neighbouring members: where they sit (TrainingLayout.members_per_node)


def axis_calls(layout: TrainingLayout) -> dict[str, list[Call]]:
    """Every collective and send of one step, by axis (TP, CP, EP, PP, DP; axes of degree 1 left
    out), as the step model prices them (module docstring): the one description of a step's traffic.

    TP: 4 (6 under full recompute) all-reduces of a micro-batch's activations per layer; CP: the
    ring's K/V chunk, cp - 1 hops per layer, three times (forward; K/V and their gradients back);
    EP: dispatch and combine of each token's top-k copies, forward and backward, per MoE layer; PP:
    the boundary activations forward and their gradients back, per micro-batch; DP: the owned
    parameters' gradients (all-reduce; ZeRO 1-2: reduce-scatter + all-gather once a step; ZeRO 3:
    per micro-batch, two all-gathers and a reduce-scatter)."""
    lay = layout
    m = lay.mdl
    e = bytes_per_element("bf16")
    mb, layers = lay.micro_batches, lay.layers_per_stage
    local_tokens = lay.micro_batch * lay.seq_len // lay.cp
    per_layer = 6 if lay.recompute == "full" else 4
    out: dict[str, list[Call]] = {}
    if lay.tp > 1:
        out["TP"] = [Call("activations", "all_reduce", local_tokens * m.hidden_size * e, per_layer * layers * mb,
                          lay.tp, 1)]
    if lay.cp > 1:
        chunk = local_tokens * m.kv_elements_per_token_per_layer() * m.kv_share_per_rank(lay.tp) * e
        out["CP"] = [Call("K/V chunks", "send", chunk, (lay.cp - 1) * layers * mb * 3, 2, lay.tp)]
    if lay.ep > 1:
        tok = local_tokens / (lay.tp if lay.sequence_parallel else 1)
        moe_layers = math.ceil(m.num_moe_layers / lay.pp)
        out["EP"] = [Call("token copies", "all_to_all", tok * m.experts_per_token * m.hidden_size * e,
                          per_layer * moe_layers * mb, lay.ep, lay.tp * lay.cp)]
    if lay.pp > 1:
        boundary = local_tokens * m.hidden_size * e / (lay.tp if lay.sequence_parallel else 1)
        out["PP"] = [Call("stage boundary", "send", boundary, 2 * mb, 2, lay.tp * lay.cp * lay.dp)]
    replicas = lay.dp * lay.cp
    if replicas > 1:
        grads = state.state_bytes_per_gpu(m, lay.tp, lay.pp, 1, 0, ep=lay.ep)["weights"]
        if lay.zero_stage == 0:
            out["DP"] = [Call("gradients", "all_reduce", grads, 1, replicas, lay.tp)]
        else:
            per_step = mb if lay.zero_stage == 3 else 1
            out["DP"] = [Call("gradients", "reduce_scatter", grads, per_step, replicas, lay.tp),
                         Call("weights", "all_gather", grads, 2 * per_step if lay.zero_stage == 3 else 1,
                              replicas, lay.tp)]
    return out


def _collective_s(lay: TrainingLayout, kind: str, message: float, size: int, stride: int) -> tuple[float, str]:
    if size == 1 or message <= 0:
        return 0.0, "none"
    k = lay.members_per_node(stride, size)
    c = collective(kind, message, size, lay.chip, nodes_gpus=k)
    return c.time_s, ("network" if k == 1 else c.fabric)


@functools.lru_cache(maxsize=512)
def _step(lay: TrainingLayout, a: TrainingAssumptions) -> TrainingStep:
    m, g = lay.mdl, lay.chip
    e = bytes_per_element("bf16")
    n, peak = lay.n_gpus, g.peak_flops(lay.dtype)
    tokens = lay.tokens_per_step
    model_f = flops.model_flops_per_token(m, lay.seq_len) * tokens / n
    hw_f = flops.hardware_flops_per_token(m, lay.seq_len, lay.recompute) * tokens / n
    rate = peak * a.gemm_efficiency
    matmul_s, recompute_s = hw_f / rate, (hw_f - model_f) / rate
    nonmatmul_s = a.nonmatmul_overhead * matmul_s
    fabrics: dict[str, str] = {}
    mb, L = lay.micro_batches, m.num_layers
    local_tokens = lay.micro_batch * lay.seq_len // lay.cp  # one micro-batch's tokens on a TP group
    calls = axis_calls(lay)

    def priced(axis: str) -> list[float]:
        """Seconds of one call of each of the axis's collectives (and its fabric, recorded)."""
        out = []
        for c in calls.get(axis, []):
            if c.kind == "send":
                hop = send(c.message_bytes, g, across_nodes=c.stride >= lay.node)
                t, fabric = hop.time_s, hop.fabric
            else:
                t, fabric = _collective_s(lay, c.kind, c.message_bytes, c.group, c.stride)
            fabrics.setdefault(axis, fabric)
            out.append(t)
        return out

    def total(axis: str) -> float:
        return sum(t * c.calls for t, c in zip(priced(axis), calls.get(axis, []), strict=True))

    # tensor parallelism: on the critical path except the overlapped share
    tp_s = total("TP")
    tp_exposed = (1.0 - a.tp_overlap) * tp_s

    # context parallelism: each ring hop hides under the attention of the local queries against the
    # chunk just received (causal, load-balanced: half of a full block)
    cp_s = cp_exposed = hop_send = hop_compute = 0.0
    if "CP" in calls:
        (hop_send,), (ring,) = priced("CP"), calls["CP"]
        hop_flops = m.attention_flops_per_token(1) / L * local_tokens * (lay.seq_len / lay.cp) / 2 / lay.tp
        hop_compute = hop_flops / rate
        cp_s = hop_send * ring.calls
        cp_exposed = max(0.0, hop_send - hop_compute) * ring.calls

    # expert parallelism: exposed
    ep_s = total("EP")
    ep_exposed = ep_s

    # pipeline: bubble and the sends on the fill and drain path (the rest overlap the other stages)
    bubble = p2p = pp_s = 0.0
    compute_mb = (matmul_s + nonmatmul_s + tp_exposed + cp_exposed + ep_exposed) / mb
    if "PP" in calls:
        bubble = (lay.pp - 1) / lay.interleave * compute_mb
        p2p = 2 * (lay.pp - 1) * priced("PP")[0]
        pp_s = total("PP")

    # data parallelism: hidden under the backward of the last micro-batch (ZeRO 3: of every one)
    owned = state.state_bytes_per_gpu(m, lay.tp, lay.pp, 1, 0, ep=lay.ep)["weights"] / e  # parameters
    replicas = lay.dp * lay.cp
    dp_s = total("DP")
    dp_exposed = 0.0
    if dp_s:
        backward_mb = (matmul_s - recompute_s) * 2 / 3 / mb
        if lay.zero_stage == 3:
            dp_exposed = mb * max(0.0, dp_s / mb - a.dp_overlap * compute_mb)
        else:
            dp_exposed = max(0.0, dp_s - a.dp_overlap * backward_mb)

    # optimizer: a memory-bound pass over the owned (ZeRO: sharded) parameters
    shard = replicas if lay.zero_stage >= 1 else 1
    optimizer_s = owned / shard * a.optimizer_bytes_per_param / g.memory_bandwidth

    return TrainingStep(lay, a, model_f, hw_f, matmul_s, recompute_s, nonmatmul_s, tp_s, tp_exposed, cp_s,
                        cp_exposed, ep_s, ep_exposed, bubble, p2p, dp_s, dp_exposed, optimizer_s, fabrics, pp_s,
                        hop_send, hop_compute)


def require_layout(layout: object) -> TrainingLayout:
    """``layout`` when it is a :class:`TrainingLayout`; else ValueError naming what was passed."""
    if not isinstance(layout, TrainingLayout):
        raise ValueError(f"layout must be a TrainingLayout, got {type(layout).__name__}")
    return layout


def training_step(layout: TrainingLayout, assume: TrainingAssumptions | None = None) -> TrainingStep:
    """The step of ``layout`` under ``assume`` (default :func:`training_assumptions`)."""
    return _step(require_layout(layout), assume or training_assumptions())


def training_memory(layout: TrainingLayout) -> dict[str, float]:
    """Bytes per GPU at the peak of a step: the training state (ZeRO over dp x cp), the first
    stage's activations (1F1B: min(pp, m) micro-batches in flight, interleaving adds; under full
    recompute the layer inputs plus the one layer the backward rebuilds), and the last stage's fp32
    logits; ``total``, the driver-visible ``capacity`` and ``headroom``."""
    from lib.perf.memory import visible_memory_bytes

    lay = layout
    m = lay.mdl
    st = state.state_bytes_per_gpu(m, lay.tp, lay.pp, lay.dp * lay.cp, lay.zero_stage, ep=lay.ep)
    local = lay.seq_len // lay.cp
    per_layer = state.layer_activation_bytes(m, local, lay.micro_batch, tp=lay.tp,
                                             sequence_parallel=lay.sequence_parallel, recompute=lay.recompute)
    in_flight = state.in_flight_micro_batches(lay.pp, lay.micro_batches, lay.interleave)
    rebuilt = 0.0  # full recompute: the backward rebuilds one layer's whole set of activations at a time
    if lay.recompute == "full":
        rebuilt = state.layer_activation_bytes(m, local, lay.micro_batch, tp=lay.tp,
                                               sequence_parallel=lay.sequence_parallel)
    first = per_layer * lay.layers_per_stage * in_flight + rebuilt
    logits = lay.micro_batch * local * state.logits_bytes_per_token(m, lay.tp)
    last = per_layer * lay.layers_per_stage + rebuilt + logits
    activations = max(first, last) if lay.pp > 1 else first + logits
    out = {k: v for k, v in st.items() if k != "total"}
    out["activations"] = activations
    out["total"] = st["total"] + activations
    out["capacity"] = visible_memory_bytes(lay.chip)
    out["headroom"] = out["capacity"] - out["total"]
    return out
