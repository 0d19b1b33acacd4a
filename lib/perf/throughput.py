"""Decode throughput as a function of batch: the step-time line, its hyperbola, the knee and the KV ceiling.

One decode step of ``B`` sequences on a memory-bound server costs, per GPU,

    t(B) = t0 + B * c,
    t0 = weight bytes streamed / tp / W_eff             (read every weight once per step)
    c  = context * KV bytes/token * shard / W_eff       (each sequence reads its own KV cache)
       + d * b / tp / W_eff                              (and its row of the embedding table)
       + FLOPs per token at ``context`` / tp / P_eff     (each sequence's matmuls and attention)

with W_eff = bandwidth x bandwidth_efficiency and P_eff = peak x mfu. Adding the compute term
to the memory terms (rather than taking the max) is the no-overlap model: an upper bound on
the roofline step, exact when memory and compute do not overlap, and within c_compute / c of
the overlapped bound. Throughput X(B) = B / t(B) is a hyperbola rising to the ceiling 1 / c.
Its knee, B* = t0 / c, is where the fixed and the per-sequence costs are equal: throughput is
half the ceiling and the step (the per-token latency) has doubled from t0.

All quantities SI: seconds, bytes, tokens/s. The weights streamed are
:func:`lib.perf.roofline.weight_bytes_streamed` (all but the embedding table, which a step reads
one row per sequence). For MoE models t0 reads every expert (the large-batch limit; see
:mod:`lib.perf.moe` for the batch-dependent count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.perf.memory import default_memory_utilization, kv_capacity_sequences
from lib.perf.roofline import kv_shard_fraction, lookup_bytes_read, weight_bytes_streamed
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model


def _check_tp(m: Model, tp: int) -> int:
    tp = integer("tp", tp, 1)
    if m.num_attention_heads % tp:
        raise ValueError(
            f"tp={tp} must divide the {m.num_attention_heads} attention heads of {m.key}"
        )
    return tp


def _per_sequence_compute_s(
    m: Model, g: GPU, context: int, tp: int, compute_dtype: str, mfu: float
) -> float:
    """c_F: one sequence's FLOPs at ``context`` on one of ``tp`` GPUs at mfu x peak, seconds."""
    mfu = fraction("mfu", mfu, allow_zero=False)
    return m.flops_per_token(context) / tp / (g.peak_flops(compute_dtype) * mfu)


@dataclass(frozen=True)
class StepLine:
    """t(B) = fixed_s + B * (kv_s + row_s + compute_s), seconds per decode step on one GPU.

    ``fixed_s`` (t0) is paid once per step; ``kv_s`` (its KV read), ``row_s`` (its embedding
    row, d x b / tp bytes: negligible, kept so the line is exactly the roofline's bytes) and
    ``compute_s`` once per sequence.
    """

    fixed_s: float
    kv_s: float
    compute_s: float
    row_s: float = 0.0

    def __post_init__(self):
        for name in ("fixed_s", "kv_s", "compute_s", "row_s"):
            real(name, getattr(self, name), 0, unit="seconds")
        if self.per_sequence_s <= 0:
            raise ValueError(
                "the per-sequence cost kv_s + row_s + compute_s must be > 0 "
                "(else throughput has no ceiling)"
            )

    @property
    def per_sequence_s(self) -> float:
        """c: seconds each extra sequence adds to a step."""
        return self.kv_s + self.row_s + self.compute_s

    def step_s(self, batch):
        """t(B) = t0 + B c, seconds (scalar or array ``batch``)."""
        b = np.asarray(batch, dtype=float)
        if np.any(b < 0) or not np.all(np.isfinite(b)):
            raise ValueError(f"batch must be finite and >= 0, got {batch!r}")
        out = self.fixed_s + b * self.per_sequence_s
        return float(out) if out.ndim == 0 else out

    def throughput(self, batch):
        """X(B) = B / (t0 + B c), tokens/s for the replica (one token per sequence per step)."""
        b = np.asarray(batch, dtype=float)
        out = b / np.asarray(self.step_s(b))
        return float(out) if out.ndim == 0 else out

    @property
    def ceiling_tokens_per_s(self) -> float:
        """lim B->inf X(B) = 1 / c, tokens/s: set by per-sequence cost, not by the weights."""
        return 1.0 / self.per_sequence_s

    @property
    def knee_batch(self) -> float:
        """B* = t0 / c: fixed cost = per-sequence cost; X(B*) = ceiling / 2 and t(B*) = 2 t0."""
        return self.fixed_s / self.per_sequence_s

    def batch_for_fraction(self, fraction: float) -> float:
        """Batch at which X(B) = fraction x ceiling: B = f / (1 - f) x t0 / c (f in (0, 1))."""
        f = real("fraction", fraction, 0, 1, low_open=True, high_open=True, unit="(of the ceiling)")
        return f / (1 - f) * self.knee_batch

    def batch_for_step_time(self, max_step_s: float) -> float:
        """Largest batch whose step fits in ``max_step_s`` (a per-token latency SLO): (T - t0) / c.

        Raises ValueError when even an empty step (t0) exceeds the budget.
        """
        real("max_step_s", max_step_s, 0, low_open=True, unit="seconds")
        if max_step_s < self.fixed_s:
            raise ValueError(
                f"a step budget of {max_step_s:.3g} s is below the weight-read floor "
                f"t0 = {self.fixed_s:.3g} s: no batch meets it"
            )
        return (max_step_s - self.fixed_s) / self.per_sequence_s


def decode_step_line(
    mdl: str | Model,
    chip: str | GPU,
    context: int,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    bandwidth_efficiency: float = 1.0,
    mfu: float = 1.0,
) -> StepLine:
    """The step-time line of decoding at ``context`` tokens per sequence, per GPU of a TP group.

    t0 = weight_bytes_streamed(weight_dtype) / tp / (W eta_W);
    c_kv = context x kv_bytes_per_token(kv_dtype) x kv_shard_fraction / (W eta_W);
    c_row = lookup row bytes / tp / (W eta_W), the row being d x b_w (2 d with learned positions);
    c_compute = flops_per_token(context) / tp / (P(compute_dtype) x mfu).
    Seconds. TP communication and launch overheads are not included (see I001).
    """
    m, g = model(mdl), gpu(chip)
    tp = _check_tp(m, tp)
    context = integer("context", context, 0, unit="tokens")
    eta_w = fraction("bandwidth_efficiency", bandwidth_efficiency, allow_zero=False)
    eta_p = fraction("mfu", mfu, allow_zero=False)
    bandwidth = g.memory_bandwidth * eta_w
    fixed = weight_bytes_streamed(m, weight_dtype) / tp / bandwidth
    row = lookup_bytes_read(m, 1, weight_dtype)
    kv = context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp) / bandwidth
    compute = _per_sequence_compute_s(m, g, context, tp, compute_dtype, eta_p)
    return StepLine(fixed, kv, compute, row / tp / bandwidth)


def kv_bytes_per_sequence_per_gpu(
    mdl: str | Model, context: int, tp: int = 1, kv_dtype: str = "bf16"
) -> float:
    """KV-cache bytes one sequence of ``context`` tokens holds on each GPU: context x kv/token x shard."""
    m = model(mdl)
    tp = _check_tp(m, tp)
    context = integer("context", context, 0, unit="tokens")
    return context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)


def kv_batch_ceiling(
    mdl: str | Model,
    chip: str | GPU,
    context: int,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_utilization: float | None = None,
) -> int:
    """Most sequences of ``context`` tokens whose KV cache fits beside the weights (per replica).

    :func:`lib.perf.memory.kv_capacity_sequences` with the serving default utilization instead of 1
    (None: vLLM's gpu_memory_utilization, ``engine_defaults.gpu_memory_utilization`` in
    ``data/serving_memory.yaml``): B_max = floor((memory x utilization - weights / tp) /
    (context x kv/token x shard)). Raises ValueError when the weights alone do not fit or
    ``context`` < 1 (an empty cache has no ceiling); 0 when not even one sequence's KV fits.
    """
    return kv_capacity_sequences(
        mdl, chip, context, tp, weight_dtype, kv_dtype, default_memory_utilization(memory_utilization)
    )


def compute_bound_batch(
    line: StepLine,
    mdl: str | Model,
    chip: str | GPU,
    context: int,
    tp: int = 1,
    compute_dtype: str = "bf16",
    mfu: float = 1.0,
) -> float:
    """Batch at which the overlapped roofline flips to compute-bound: B F / P = t0 + B (c_kv + c_row).

    B_c = t0 / (F / P - c_kv - c_row), with F / P the per-sequence compute seconds of ``line``
    (recomputed here from the model so the caller cannot mix setups). Returns math.inf when
    each sequence costs more memory time than compute time (then no batch is compute-bound:
    the tensor cores never set the ceiling).
    """
    m, g = model(mdl), gpu(chip)
    tp = _check_tp(m, tp)
    context = integer("context", context, 0, unit="tokens")
    per_seq_compute = _per_sequence_compute_s(m, g, context, tp, compute_dtype, mfu)
    margin = per_seq_compute - line.kv_s - line.row_s
    if margin <= 0:
        return math.inf
    return line.fixed_s / margin


def kv_compute_balance_context(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    bandwidth_efficiency: float = 1.0,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
) -> float:
    """Context at which one sequence's memory read takes as long as its FLOPs:
    c_kv(L) + c_row = c_compute(L).

    L x kv x shard / W_eff + r / (tp W_eff) = (F0 + a L) / (tp P_eff), with F0 = 2N (context-free
    FLOPs), a the attention FLOPs per context token and r = d x b_w the sequence's embedding row,
    so L* = (F0 / (tp P_eff) - r / (tp W_eff)) / (kv x shard / W_eff - a / (tp P_eff)).
    Above L* no batch is compute-bound (see :func:`compute_bound_batch`); math.inf when the KV
    read never catches up (attention intensity at or above the ridge, e.g. MLA at high head count).
    """
    m, g = model(mdl), gpu(chip)
    tp = _check_tp(m, tp)
    eta_w = fraction("bandwidth_efficiency", bandwidth_efficiency, allow_zero=False)
    w = g.memory_bandwidth * eta_w
    p = tp * g.peak_flops(compute_dtype) * fraction("mfu", mfu, allow_zero=False)
    per_token_kv_s = m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp) / w
    per_token_attn_s = m.attention_flops_per_token(1) / p
    margin = per_token_kv_s - per_token_attn_s
    if margin <= 0:
        return math.inf
    row_s = lookup_bytes_read(m, 1, weight_dtype) / tp / w
    return (m.weight_flops_per_token() / p - row_s) / margin


def tensor_core_ceiling_tokens_per_s(
    mdl: str | Model,
    chip: str | GPU,
    context: int,
    tp: int = 1,
    compute_dtype: str = "bf16",
    mfu: float = 1.0,
) -> float:
    """Tokens/s of a replica if only the tensor cores limited it: tp x P x mfu / FLOPs per token."""
    m, g = model(mdl), gpu(chip)
    tp = _check_tp(m, tp)
    context = integer("context", context, 0, unit="tokens")
    mfu = fraction("mfu", mfu, allow_zero=False)
    return tp * g.peak_flops(compute_dtype) * mfu / m.flops_per_token(context)


def smallest_tp_that_fits(
    mdl: str | Model,
    chip: str | GPU,
    weight_dtype: str = "bf16",
    kv_bytes_total: float = 0.0,
    memory_utilization: float | None = None,
    max_tp: int = 64,
) -> int:
    """Smallest power-of-two tp (dividing the head count) whose GPUs hold weights + ``kv_bytes_total``.

    Per GPU: weights / tp + kv_bytes_total x kv_shard_fraction(tp) <= memory x utilization
    (None: ``engine_defaults.gpu_memory_utilization`` in ``data/serving_memory.yaml``).
    Raises ValueError when no tp up to ``max_tp`` works.
    """
    m, g = model(mdl), gpu(chip)
    u = fraction(
        "memory_utilization", default_memory_utilization(memory_utilization), allow_zero=False
    )
    real("kv_bytes_total", kv_bytes_total, 0, unit="bytes")
    tp = 1
    while tp <= max_tp:
        if m.num_attention_heads % tp == 0:
            per_gpu = m.weight_bytes(weight_dtype) / tp + kv_bytes_total * kv_shard_fraction(m, tp)
            if per_gpu <= g.memory_bytes * u:
                return tp
        tp *= 2
    raise ValueError(
        f"{m.key} in {weight_dtype} does not fit on up to {max_tp} x {g.key} "
        f"at {u:.0%} memory utilization"
    )
