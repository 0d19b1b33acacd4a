"""Decode throughput against batch, read off the one step model, and the KV ceiling on the batch.

Every number here is a view of :func:`lib.perf.step.decode_step` (the step time) and of
:attr:`lib.perf.deployment.Deployment.budget` (the KV capacity on driver-visible memory); this
module writes no step or capacity formula of its own.

Throughput of a replica at batch B is X(B) = B / t(B), with t(B) the modelled step. Each kernel
of the step lasts max(memory, compute) (a weight read and its GEMM overlap), so t(B) is piecewise
linear and convex in B: flat-ish while the GEMMs stream weights, steeper once they turn
compute-bound. Read off it:

* the ceiling, lim B->inf X(B) = 1 / t'(inf): the inverse of what one more sequence costs once
  every kernel is in its large-batch regime (KV read, GEMM FLOPs, logits, collective bytes);
* the knee, the batch at which X reaches half the ceiling (and, generally, the batch for any
  fraction f of it), found by bisection over the batch on the modelled step;
* the batch a per-token latency budget allows, and the batch at which the weight GEMMs turn
  compute-bound;
* the KV ceiling on the batch: ``Deployment.budget.max_concurrency(context)`` (a fraction:
  1.99 sequences, not 1).

SI units: seconds, bytes, tokens/s. A knee is where two costs are equal (fixed vs per-sequence),
not an optimum of anything.
"""

from __future__ import annotations

import functools
import math

from lib.inputs import fraction, integer, real
from lib.perf.deployment import Deployment, require
from lib.perf.step import StepAssumptions, decode_step, kv_read_fraction
from lib.search import largest_true, smallest_true

LARGE_BATCH = 1 << 20  # far past every kernel's ridge: the step is linear in B from here on


@functools.lru_cache(maxsize=1024)
def _step(dep: Deployment, batch: int, context: int, assume: StepAssumptions | None):
    """decode_step, remembered: the searches below ask for the same (batch, context) several
    times (a ceiling, then a bisection that revisits its bounds). The step is a pure function of
    these frozen inputs."""
    return decode_step(dep, batch, context, assume)




def step_s(dep: Deployment, batch: int, context: int, assume: StepAssumptions | None = None) -> float:
    """t(B): the modelled decode step of ``batch`` sequences at ``context`` tokens, seconds
    (:func:`lib.perf.step.decode_step`)."""
    return _step(require(dep), batch, context, assume).total_s


def tokens_per_s(dep: Deployment, batch: int, context: int, assume: StepAssumptions | None = None) -> float:
    """X(B) = B / t(B), output tokens/s of the replica (one token per sequence per step)."""
    return _step(require(dep), batch, context, assume).tokens_per_s


def _interp_step(dep, b: float, context: int, assume) -> float:
    """t at a fractional batch: linear between the neighbouring integers (t is piecewise linear)."""
    lo = max(1, math.floor(b))
    t_lo = step_s(dep, lo, context, assume)
    if b <= lo:
        return t_lo
    t_hi = step_s(dep, lo + 1, context, assume)
    return t_lo + (b - lo) * (t_hi - t_lo)


def per_sequence_buckets(dep: Deployment, context: int, assume: StepAssumptions | None = None) -> dict:
    """What one more sequence adds to each bucket of the step at large batch, seconds:
    (bucket(2N) - bucket(N)) / N at N = LARGE_BATCH, where every kernel is in its final regime.
    They sum to :func:`per_sequence_s`."""
    context = integer("context", context, 0, unit="tokens")
    a = _step(require(dep), LARGE_BATCH, context, assume).buckets
    b = _step(dep, 2 * LARGE_BATCH, context, assume).buckets
    return {k: (b[k] - a[k]) / LARGE_BATCH for k in a}


def per_sequence_s(dep: Deployment, context: int, assume: StepAssumptions | None = None) -> float:
    """t'(inf): seconds one more sequence adds to a large-batch step (the slope of the step)."""
    return sum(per_sequence_buckets(dep, context, assume).values())


def throughput_ceiling(dep: Deployment, context: int, assume: StepAssumptions | None = None) -> float:
    """lim B->inf B / t(B) = 1 / t'(inf), tokens/s of the replica: what no batch can pass."""
    return 1.0 / per_sequence_s(dep, context, assume)


def step_s_at(dep: Deployment, batch: float, context: int, assume: StepAssumptions | None = None) -> float:
    """t at a fractional batch (>= 1): linear between the neighbouring integers, where the
    modelled step is linear. For a fractional count such as ``budget.max_concurrency``."""
    b = real("batch", batch, 1, unit="sequences")
    return _interp_step(dep, b, integer("context", context, 0, unit="tokens"), assume)


def batch_for_tokens_per_s(
    dep: Deployment, context: int, target_tokens_per_s: float, assume: StepAssumptions | None = None
) -> float:
    """Smallest (fractional) batch whose replica throughput X(B) = B / t(B) reaches the target,
    by bisection on the modelled step. math.inf when the target is at or above the ceiling;
    below 1 when batch 1 already passes it (B = target x t(1))."""
    target = real("target_tokens_per_s", target_tokens_per_s, 0, low_open=True, unit="tokens/s")
    context = integer("context", context, 0, unit="tokens")
    if target >= throughput_ceiling(dep, context, assume):
        return math.inf

    def x(b: int) -> float:
        return tokens_per_s(dep, b, context, assume)

    if x(1) >= target:
        return target * step_s(dep, 1, context, assume)
    lo, hi = 1, 2
    while x(hi) < target:
        lo, hi = hi, hi * 2
        if hi > 4 * LARGE_BATCH:
            return math.inf
    lo = largest_true(lambda b: x(b) < target, lo + 1, hi - 1)  # x(lo) < target <= x(hi)
    hi = lo + 1
    # B / (t_lo + (B - lo) s) = target  =>  B = target (t_lo - lo s) / (1 - target s)
    t_lo, t_hi = step_s(dep, lo, context, assume), step_s(dep, hi, context, assume)
    s = t_hi - t_lo
    return target * (t_lo - lo * s) / (1 - target * s)


def batch_for_fraction(
    dep: Deployment, context: int, fraction_of_ceiling: float, assume: StepAssumptions | None = None
) -> float:
    """Batch B at which X(B) = f x ceiling (f in (0, 1)): :func:`batch_for_tokens_per_s` at
    f x :func:`throughput_ceiling` (integer bisection, then exact interpolation: t is linear
    between integers)."""
    f = real("fraction_of_ceiling", fraction_of_ceiling, 0, 1, low_open=True, high_open=True,
             unit="(of the ceiling)")
    context = integer("context", context, 0, unit="tokens")
    return batch_for_tokens_per_s(dep, context, f * throughput_ceiling(dep, context, assume), assume)


def knee_batch(dep: Deployment, context: int, assume: StepAssumptions | None = None) -> float:
    """The knee: the batch at which throughput reaches half its ceiling (bisection on the step).

    For a straight line t = t0 + B c it is t0 / c, where the fixed and per-sequence costs are
    equal; it is a crossing of two costs, not an optimum."""
    return batch_for_fraction(dep, context, 0.5, assume)


def batch_for_step_time(
    dep: Deployment, context: int, max_step_s: float, assume: StepAssumptions | None = None
) -> float:
    """Largest (fractional) batch whose modelled step fits in ``max_step_s`` (a per-token latency
    budget), by bisection. Raises ValueError when even batch 1 exceeds the budget."""
    real("max_step_s", max_step_s, 0, low_open=True, unit="seconds")
    context = integer("context", context, 0, unit="tokens")
    t1 = step_s(dep, 1, context, assume)
    if t1 > max_step_s:
        raise ValueError(
            f"a step budget of {max_step_s:.3g} s is below the batch-1 step {t1:.3g} s: no batch meets it"
        )
    lo, hi = 1, 2
    while step_s(dep, hi, context, assume) <= max_step_s:
        lo, hi = hi, hi * 2
        if hi > 4 * LARGE_BATCH:
            return math.inf
    lo = largest_true(lambda b: step_s(dep, b, context, assume) <= max_step_s, lo + 1, hi - 1)
    hi = lo + 1
    t_lo, t_hi = step_s(dep, lo, context, assume), step_s(dep, hi, context, assume)
    return lo + (max_step_s - t_lo) / (t_hi - t_lo)


def compute_bound_batch(dep: Deployment, context: int, assume: StepAssumptions | None = None) -> float:
    """Smallest batch at which some kernel of the step turns compute-bound (the step's
    ``compute_excess`` bucket becomes > 0): for dense models the weight GEMMs at the ridge batch
    of the achieved bandwidth and FLOP/s. math.inf when none does up to LARGE_BATCH."""
    context = integer("context", context, 0, unit="tokens")

    def excess(b: int) -> float:
        return _step(require(dep), b, context, assume).buckets["compute_excess"]

    if excess(1) > 0:
        return 1.0
    lo, hi = 1, 2
    while excess(hi) <= 0:  # exponential search, then bisection
        lo, hi = hi, hi * 2
        if hi > LARGE_BATCH:
            return math.inf
    return float(smallest_true(lambda b: not (excess(b) <= 0), lo + 1, hi - 1))  # excess(lo) <= 0 < excess(hi)


def kv_batch_ceiling(dep: Deployment, context: int) -> float:
    """Sequences of ``context`` tokens whose KV cache the replica holds, with the fraction:
    ``dep.budget.max_concurrency(context)`` (the memory budget on driver-visible memory)."""
    context = integer("context", context, 1, unit="tokens")
    return require(dep).budget.max_concurrency(context)


def kv_bytes_per_sequence_per_gpu(dep: Deployment, context: int) -> float:
    """KV bytes one sequence of ``context`` tokens holds on each GPU of the replica: context x
    the budget's bytes per token per GPU (block bytes / block size)."""
    context = integer("context", context, 0, unit="tokens")
    return context * require(dep).budget.kv_bytes_per_token_per_gpu


def kv_read_bytes_per_sequence_per_gpu(dep: Deployment, context: int) -> float:
    """KV bytes one GPU reads per step for one sequence: context x KV bytes/token x read share."""
    context = integer("context", context, 0, unit="tokens")
    return context * require(dep).mdl.kv_bytes_per_token(dep.kv_dtype) * kv_read_fraction(dep)


def tensor_core_ceiling_tokens_per_s(dep: Deployment, context: int, mfu: float = 1.0) -> float:
    """A bound, not the step: tokens/s of a replica if only the tensor cores limited it,
    tp x P x mfu / FLOPs per token at ``context``."""
    context = integer("context", context, 0, unit="tokens")
    mfu = fraction("mfu", mfu, allow_zero=False)
    d = require(dep)
    return d.tp * d.chip.peak_flops(d.compute_dtype) * mfu / d.mdl.flops_per_token(context)


@functools.lru_cache(maxsize=64)
def smallest_fitting_deployment(model: str, gpu: str, max_tp: int = 8) -> Deployment:
    """``model`` on ``gpu`` with the book's default dtypes and engine settings
    (:func:`lib.perf.deployment.deployment`) at the smallest power-of-two tp up to ``max_tp`` that holds
    the weights with a KV pool left (:func:`smallest_tp_that_fits` with no KV demand). ValueError naming
    the model and GPU when even ``max_tp`` does not."""
    from lib.perf.deployment import deployment

    top = integer("max_tp", max_tp, 1, 64)
    try:
        widest = deployment(model, gpu, tp=top)
    except ValueError as e:
        raise ValueError(f"{model} does not fit on {top} x {gpu}: {e}") from None
    return widest.replace(tp=smallest_tp_that_fits(widest, 0.0, max_tp=top))


def smallest_tp_that_fits(dep: Deployment, kv_bytes_total: float = 0.0, max_tp: int = 64) -> int:
    """Smallest power-of-two tp (that shards the model) whose KV pool, per the memory budget on
    driver-visible memory, holds ``kv_bytes_total`` bytes of KV (split across the GPUs that hold
    it). ``dep`` supplies the model, GPU, dtypes and engine settings; its tp is ignored.
    Raises ValueError when no tp up to ``max_tp`` works."""
    require(dep)
    real("kv_bytes_total", kv_bytes_total, 0, unit="bytes")
    tp = 1
    while tp <= max_tp:
        try:
            d = dep.replace(tp=tp)
        except ValueError:
            tp *= 2
            continue
        per_gpu = kv_bytes_total * d.budget.kv_bytes_per_token_per_gpu / d.mdl.kv_bytes_per_token(d.kv_dtype)
        if per_gpu <= d.budget.kv_cache_bytes:
            return tp
        tp *= 2
    raise ValueError(f"{dep.model} in {dep.weight_dtype} does not fit on up to {max_tp} x {dep.gpu}")
