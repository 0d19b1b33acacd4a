"""Placement of a training layout's parallel axes: what each axis moves per step, over which
link, and what it would cost on the other one; the smallest pipeline that fits a fleet; and the
one-matmul view of tensor parallelism (the live tensors of Y = X @ W and how a column or row
split shares them out).

* :func:`axis_traffic`: per axis of a :class:`lib.training.step.TrainingLayout` (TP, CP, EP, PP,
  DP), the payload, collective, message per call, calls per step, bytes each GPU puts on the
  wire per step, the link, and the seconds (total and exposed) that
  :func:`lib.training.step.training_step` charges. The message sizes are the step model's own
  (tests re-price them with :func:`lib.perf.collectives.collective` and match the step's times).
* :func:`axis_time_on`: the same per-step traffic of one axis priced on NVLink (the group inside
  a node) or on the network (one member per node): the cost of misplacing it.
* :func:`fleet_layout`: tensor parallelism across the node, the fewest pipeline stages whose
  per-GPU memory (:func:`lib.training.step.training_memory`) fits, data parallelism for the rest.
* :func:`matmul_tensor_bytes`, :func:`matmul_split_bytes`: Y = X @ W with X (m, k), W (k, n):
  forward tensors, the backward's gradients, the optimizer state of W; per GPU under a column
  split (W[:, n/t], no forward collective, dX all-reduced in the backward) or a row split
  (W[k/t, :], X split by columns, Y all-reduced in the forward).

SI units: bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer
from lib.perf.collectives import collective, ring_bytes_per_gpu, send
from lib.registry.dtypes import bytes_per_element
from lib.training import state
from lib.training.step import (
    TrainingAssumptions,
    TrainingLayout,
    axis_calls,
    require_layout,
    training_memory,
    training_step,
)

__all__ = ["AXES", "LINKS", "SPLITS", "SPLIT_ALLREDUCE", "AxisTraffic", "axis_time_on", "axis_traffic", "fleet_layout",
           "fsdp_hiding_tokens", "fsdp_vs_pipeline", "matmul_split_bytes",
           "matmul_tensor_bytes", "tp_overlap_for_share"]

AXES = ("TP", "CP", "EP", "PP", "DP")
LINKS = ("nvlink", "network")
SPLITS = ("data", "column", "row")
SPLIT_ALLREDUCE = {"data": "dW, after the backward", "column": "dX, in the backward", "row": "Y, in the forward"}


@dataclass(frozen=True)
class AxisTraffic:
    """One parallel axis's communication in one optimizer step, per GPU."""

    axis: str
    degree: int
    payload: str  # what moves: "activations", "K/V chunks", "token copies", "stage boundary", "gradients", ...
    kind: str  # collective kind, or "send"
    message_bytes: float  # per call (all-gather / reduce-scatter: the full gathered buffer)
    calls: float  # calls per step per GPU
    wire_bytes: float  # bytes one GPU sends per step (ring accounting)
    link: str  # the link the step model priced it on
    time_s: float  # all of it, seconds per step
    exposed_s: float  # the part on the critical path


def axis_traffic(layout: TrainingLayout, assume: TrainingAssumptions | None = None) -> list[AxisTraffic]:
    """Each parallel axis of ``layout`` with degree > 1 (order TP, CP, EP, PP, DP): what it moves
    per step per GPU, on which link, and the seconds :func:`training_step` charges it (PP: every
    micro-batch's boundary send, of which the fill and drain are exposed; the bubble is not
    communication and is left out). ZeRO's two DP collectives are one row, kind
    ``reduce_scatter + all_gather``."""
    lay = require_layout(layout)
    st = training_step(lay, assume)
    times = {"TP": (st.tp_s, st.tp_exposed_s), "CP": (st.cp_s, st.cp_exposed_s), "EP": (st.ep_s, st.ep_exposed_s),
             "PP": (st.pp_s, st.p2p_exposed_s), "DP": (st.dp_s, st.dp_exposed_s)}
    degree = {"TP": lay.tp, "CP": lay.cp, "EP": lay.ep, "PP": lay.pp, "DP": lay.dp}
    rows = []
    for axis, calls in axis_calls(lay).items():
        kinds = " + ".join(c.kind for c in calls)
        payload = " / ".join(c.payload for c in calls)
        wire = sum(ring_bytes_per_gpu(c.kind, c.message_bytes, c.group) * c.calls for c in calls)
        total, exposed = times[axis]
        rows.append(AxisTraffic(axis, degree[axis], payload, kinds, calls[0].message_bytes, sum(c.calls for c in calls),
                                wire, st.fabrics.get(axis, "none"), total, exposed))
    return rows


def axis_time_on(layout: TrainingLayout, axis: str, link: str) -> float:
    """Seconds per step of ``axis``'s traffic (:func:`axis_traffic`) if its group sat wholly on
    ``link``: ``"nvlink"`` (every member in one node; the group must fit the node) or ``"network"``
    (one member per node, each over its own NIC). 0 when the axis is not used."""
    lay = require_layout(layout)
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}; got {axis!r}")
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}; got {link!r}")
    calls = axis_calls(lay).get(axis, [])
    total = 0.0
    for _, kind, msg, k, n, _stride in calls:
        if kind == "send":
            total += send(msg, lay.chip, across_nodes=link == "network").time_s * k
            continue
        if link == "nvlink" and n > lay.node:
            raise ValueError(f"a {axis} group of {n} GPUs does not fit one node of {lay.node} GPUs on NVLink")
        total += collective(kind, msg, n, lay.chip, nodes_gpus=n if link == "nvlink" else 1).time_s * k
    return total


def fleet_layout(mdl, chip, n_gpus: int, batch_tokens: float, seq_len: int = 8192, tp: int | None = None,
                 zero_stage: int = 1, recompute: str = "none", micro_batch: int = 1) -> TrainingLayout:
    """The layout a fleet of ``n_gpus`` gets for a global batch of ``batch_tokens`` tokens: TP =
    ``tp`` (default: the node, halved until it divides the attention heads), the fewest pipeline
    stages (powers of two dividing n / tp) whose :func:`training_memory` fits the driver-visible
    memory, DP = n / (tp x pp), micro-batches = batch sequences / (dp x micro_batch) (at least 1).
    ValueError when no pipeline depth fits or the fleet is not a multiple of tp."""
    n = integer("n_gpus", n_gpus, 1)
    probe = TrainingLayout(mdl, chip, seq_len=seq_len, recompute=recompute, zero_stage=zero_stage,
                           micro_batch=micro_batch)
    if tp is None:
        tp = min(probe.node, n)
        while tp > 1 and (probe.mdl.num_attention_heads % tp or n % tp):
            tp //= 2
    tp = integer("tp", tp, 1)
    if n % tp:
        raise ValueError(f"n_gpus={n} must be a multiple of tp={tp}")
    seqs = max(1.0, float(batch_tokens) / seq_len)
    pp = 1
    while pp <= min(n // tp, probe.mdl.num_layers):
        if (n // tp) % pp == 0:
            dp = n // (tp * pp)
            m = max(1, round(seqs / (dp * micro_batch)))
            lay = probe.replace(tp=tp, pp=pp, dp=dp, micro_batches=m)
            if training_memory(lay)["headroom"] >= 0:
                return lay
        pp *= 2
    raise ValueError(f"{probe.mdl.key} does not fit {n} x {probe.chip.name} at tp={tp} with any pipeline depth "
                     f"(ZeRO stage {zero_stage}, recompute {recompute}): add GPUs, shard more or recompute")


def matmul_tensor_bytes(m: int, k: int, n: int, dtype: str = "bf16", training: bool = True,
                        **recipe) -> dict[str, float]:
    """Live tensors of Y = X @ W, X (m, k), W (k, n), bytes: ``X``, ``W``, ``Y`` in ``dtype``; with
    ``training`` also ``dY`` and ``dX`` (m x n, m x k, ``dtype``) and W's ``gradients`` (in ``dtype``
    unless ``grad_dtype`` is given), ``master``
    and ``optimizer`` state per :func:`lib.training.state.state_breakdown_per_param` (``recipe``:
    its keywords; the weights' own bytes are ``W``). ``total`` sums them (all alive at once at the
    end of the backward, before the optimizer step frees nothing: the upper bound)."""
    m, k, n = (integer(name, v, 1) for name, v in (("m", m), ("k", k), ("n", n)))
    e = bytes_per_element(dtype)
    out = {"X": m * k * e, "W": k * n * e, "Y": m * n * e}
    if training:
        recipe.setdefault("grad_dtype", dtype)  # gradients in the weights' dtype unless told otherwise
        per = state.state_breakdown_per_param(weight_dtype=dtype, **recipe)
        out.update({"dY": m * n * e, "dX": m * k * e, "gradients": k * n * per["gradients"],
                    "master": k * n * per["master"], "optimizer": k * n * per["optimizer"]})
    out["total"] = sum(out.values())
    return out


def matmul_split_bytes(m: int, k: int, n: int, t: int, split: str, dtype: str = "bf16",
                       training: bool = True, **recipe) -> dict[str, float]:
    """Each of ``t`` GPUs' share of :func:`matmul_tensor_bytes`, by which of the three dimensions
    is cut: ``data`` (m, the tokens: X, Y, dY, dX / t, W and its state whole on every GPU; the
    partial dW, k x n, is all-reduced after the backward: data parallelism), ``column`` (n: W, Y,
    dY, W's state / t; X and dX whole on every GPU; the backward all-reduces the partial dX,
    m x k), ``row`` (k: X, W, dX, W's state / t; each GPU computes a full-size partial Y,
    all-reduced in the forward, m x n, and keeps the whole dY). Adds ``allreduce_bytes``: that
    all-reduce's message per GPU (pass: :data:`SPLIT_ALLREDUCE`), 0 at t = 1 or when nothing
    needs it (an inference-only column split)."""
    t = integer("t", t, 1)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    whole = matmul_tensor_bytes(m, k, n, dtype, training, **recipe)
    dim, size = {"data": ("m", m), "column": ("n", n), "row": ("k", k)}[split]
    if size % t:
        raise ValueError(f"t={t} must divide {dim}={size} for a {split} split")
    cut = {"data": ("X", "Y", "dY", "dX"), "column": ("W", "Y", "dY", "gradients", "master", "optimizer"),
           "row": ("X", "W", "dX", "gradients", "master", "optimizer")}[split]
    out = {name: (b / t if name in cut else b) for name, b in whole.items() if name != "total"}
    out["total"] = sum(out.values())
    e = bytes_per_element(dtype)
    msg = {"column": m * k * e if training else 0.0, "row": m * n * e,
           "data": k * n * e if training else 0.0}[split]
    out["allreduce_bytes"] = msg if t > 1 else 0.0
    return out


def fsdp_vs_pipeline(mdl, chip, n_gpus: int, batch_tokens: float, seq_len: int = 8192,
                     micro_batch: int = 1) -> tuple[TrainingLayout, TrainingLayout]:
    """The two ways a model too big for one node's tensor-parallel group spans nodes, on the same
    fleet and global batch: (FSDP, pipeline). FSDP: TP = the node, no pipeline, ZeRO stage 3 over
    the data-parallel ranks (weights gathered over the network every micro-batch). Pipeline: TP =
    the node, the fewest stages (powers of two) whose memory fits with unsharded state (ZeRO 0),
    plain data parallelism for the rest. Micro-batches = batch sequences / (dp x micro_batch)."""
    fsdp = fleet_layout(mdl, chip, n_gpus, batch_tokens, seq_len, zero_stage=3, micro_batch=micro_batch)
    if fsdp.pp > 1:
        raise ValueError(f"{fsdp.mdl.key} does not fit {n_gpus} GPUs even fully sharded without a pipeline")
    pipe = fleet_layout(mdl, chip, n_gpus, batch_tokens, seq_len, tp=fsdp.tp, zero_stage=0, micro_batch=micro_batch)
    return fsdp, pipe


def fsdp_hiding_tokens(layout: TrainingLayout, assume: TrainingAssumptions | None = None) -> float:
    """Napkin form of the tokens per micro-batch (per tensor-parallel group) above which ZeRO-3's
    per-micro-batch traffic hides under that micro-batch's matmuls. As the step model prices it,
    each micro-batch all-gathers the GPU's weights twice (forward and backward) and reduce-scatters
    its gradients: 3 (n - 1) / n x 2 P / tp bytes over its NIC share, against 6 P / tp FLOPs per
    token at peak x ``gemm_efficiency``, of which ``dp_overlap`` can cover communication:

        T* = (n - 1) / n x peak x gemm_eff / (NIC bytes/s x bus_eff x dp_overlap)

    (the parameters cancel: it is the network's ridge point in tokens). Latency, the non-matmul
    kernels and the TP time that the step model also lets the traffic hide under are left out."""
    from lib.perf.collectives import network_fabric
    from lib.training.step import training_assumptions

    lay = require_layout(layout)
    a = assume or training_assumptions()
    n = lay.dp * lay.cp
    if n < 2:
        raise ValueError("fsdp_hiding_tokens needs dp x cp >= 2 ranks to shard over")
    net = network_fabric(lay.chip)
    return (n - 1) / n * lay.chip.peak_flops(lay.dtype) * a.gemm_efficiency / (
        net.peer_bandwidth * net.bus_efficiency * a.dp_overlap)


def tp_overlap_for_share(layout: TrainingLayout, share: float, assume: TrainingAssumptions | None = None) -> float | None:
    """The ``tp_overlap`` (share of the tensor-parallel collectives hidden under compute) at which
    exposed TP time is ``share`` of :func:`training_step`'s step, by bisection on the step model
    (the rest of ``assume`` kept); None when even no overlap leaves TP under ``share`` (nothing to
    hide) or the layout has no TP. Exposed share falls monotonically with the overlap."""
    from dataclasses import replace as _replace

    from lib.inputs import fraction
    from lib.training.step import training_assumptions

    lay = require_layout(layout)
    share = fraction("share", share, allow_zero=False)
    base = assume or training_assumptions()

    def exposed(ov: float) -> float:
        s = training_step(lay, _replace(base, tp_overlap=ov))
        return s.tp_exposed_s / s.step_s

    if lay.tp == 1 or exposed(0.0) <= share:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if exposed(mid) > share else (lo, mid)
    return 0.5 * (lo + hi)
