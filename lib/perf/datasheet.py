"""Datasheet arithmetic: generation ratios, the three regimes they feed, headline-claim checks,
and the bytes-per-FLOP balance of chips against the decode workload.

* Generation ratios (A100 -> H100 -> H200 -> B200): peak FLOP/s, HBM bandwidth, HBM capacity
  and bytes per FLOP (W / P), all from ``data/hardware.yaml``.
* Three regimes, each with its own speedup: compute-bound (prefill: the FLOP/s ratio),
  bandwidth-bound (batch-1 decode: the bandwidth ratio) and capacity-bound (decode at the
  largest batch whose KV cache fits beside the weights on a fixed number of GPUs). Step times
  come from :func:`lib.perf.step.decode_step`, prefill from :func:`lib.perf.prefill.prefill_time`,
  KV capacity from the memory budget on driver-visible memory (``Deployment.budget``).
* Headline claims: the per-user decode ceiling (bandwidth / bytes per token) and the
  unstated conditions (weight dtype, speculative decoding, GPU count, batch aggregate,
  smaller model) that would lift it to the claim.
* Bytes per FLOP the decode workload asks for, against what the chip supplies, and the
  shoreline arithmetic of HBM stacks along a die edge.

SI units: FLOP/s, bytes, bytes/s, seconds, tokens/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.decoding.speculative import speculative_speedup
from lib.inputs import integer, real
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.perf.roofline import (
    kv_shard_fraction,
    lookup_bytes_read,
    weight_bytes_read_per_step,
    weight_bytes_streamed,
)
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model

GENERATIONS = ("a100-sxm", "h100-sxm", "h200", "b200")


# ---- generation ratios ---------------------------------------------------------------------


def bytes_per_flop(chip: str | GPU, dtype: str = "bf16") -> float:
    """HBM bytes/s over dense peak FLOP/s: W / P, bytes per FLOP (the inverse of the ridge point)."""
    g = gpu(chip)
    return g.memory_bandwidth / g.peak_flops(dtype)


def spec_ratios(old: str | GPU, new: str | GPU, dtype: str = "bf16") -> dict[str, float]:
    """new / old for peak FLOP/s (``dtype``), HBM bandwidth, HBM capacity and bytes per FLOP."""
    a, b = gpu(old), gpu(new)
    return {
        "flops": b.peak_flops(dtype) / a.peak_flops(dtype),
        "bandwidth": b.memory_bandwidth / a.memory_bandwidth,
        "capacity": b.memory_bytes / a.memory_bytes,
        "bytes_per_flop": bytes_per_flop(b, dtype) / bytes_per_flop(a, dtype),
    }


def _deployment(m: Model, g: GPU, n: int, weight_dtype: str, kv_dtype: str = "bf16",
                compute_dtype: str = "bf16", memory_utilization: float | None = None) -> Deployment | None:
    """The TP-n replica, or None when it cannot be built (heads do not shard, weights leave no KV room)."""
    try:
        return Deployment(m, g, tp=n, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                          compute_dtype=compute_dtype, memory_utilization=memory_utilization)
    except ValueError:
        return None


def gpus_to_fit(
    mdl: str | Model,
    chip: str | GPU,
    weight_dtype: str = "bf16",
    memory_utilization: float | None = None,
    max_gpus: int = 64,
) -> int:
    """Smallest power-of-two GPU count (tensor parallel) whose memory budget on driver-visible
    memory leaves room for a KV cache beside the weights (``Deployment`` builds).
    ``memory_utilization`` None: vLLM's default. Raises ValueError when none up to ``max_gpus`` does.
    """
    m, g = model(mdl), gpu(chip)
    n = 1
    while n <= max_gpus:
        if _deployment(m, g, n, weight_dtype, memory_utilization=memory_utilization) is not None:
            return n
        n *= 2
    raise ValueError(f"{m.key} in {weight_dtype} does not fit on {max_gpus} x {g.key}")


def gpus_for_batch(
    mdl: str | Model,
    chip: str | GPU,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_utilization: float | None = None,
    max_gpus: int = 64,
) -> int:
    """Smallest power-of-two GPU count whose KV pool (memory budget on driver-visible memory)
    holds ``batch`` sequences of ``context`` tokens: ``budget.max_concurrency(context) >= batch``.
    Raises ValueError if none up to ``max_gpus``."""
    m, g = model(mdl), gpu(chip)
    b = integer("batch", batch, 1)
    context = integer("context", context, 1)
    n = 1
    while n <= max_gpus:
        dep = _deployment(m, g, n, weight_dtype, kv_dtype, memory_utilization=memory_utilization)
        if dep is not None and dep.budget.max_concurrency(context) >= b:
            return n
        n *= 2
    raise ValueError(
        f"{b} sequences of {context} tokens of {m.key} ({weight_dtype}) do not fit on "
        f"{max_gpus} x {g.key}"
    )


@dataclass(frozen=True)
class RegimeRow:
    """One chip, one deployment of ``n_gpus``: the number each regime cares about."""

    gpu: str
    n_gpus: int
    prefill_s: float  # compute-bound: time to prefill one prompt (lib.perf.prefill.prefill_time)
    decode_batch1_tokens_per_s: float  # bandwidth-bound: one user's tokens/s (the modelled step)
    capacity_batch: float  # sequences whose KV fits beside the weights, with the fraction
    capacity_tokens_per_s: float  # capacity-bound: replica tokens/s at that batch

    @property
    def capacity_tokens_per_s_per_gpu(self) -> float:
        return self.capacity_tokens_per_s / self.n_gpus


def regime_row(
    mdl: str | Model,
    chip: str | GPU,
    n_gpus: int,
    context: int,
    prompt_len: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    memory_utilization: float | None = None,
) -> RegimeRow:
    """The three regime numbers for ``mdl`` on ``n_gpus`` x ``chip`` (tensor parallel).

    prefill_s: :func:`lib.perf.prefill.prefill_time` of ``prompt_len`` tokens (prefill MFU,
    TP all-reduce traffic included); decode_batch1: 1 / t(1) of the modelled step at ``context``;
    capacity: B = ``budget.max_concurrency(context)`` (fractional: no edge artifact when one
    sequence barely fits), tokens/s = B / t(B), t interpolated between integer batches; below one
    sequence, B / t(1) (the replica time-shares one slot). Raises ValueError when the weights
    leave no room for a KV cache.
    """
    m, g = model(mdl), gpu(chip)
    n = integer("n_gpus", n_gpus, 1)
    ctx = integer("context", context, 1)
    p = integer("prompt_len", prompt_len, 1)
    dep = Deployment(m, g, tp=n, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     compute_dtype=compute_dtype, memory_utilization=memory_utilization)
    b_max = dep.budget.max_concurrency(ctx)
    cap = b_max / tput.step_s_at(dep, max(b_max, 1.0), ctx) if b_max > 0 else 0.0
    return RegimeRow(g.key, n, prefill_time(dep, p).time_s, tput.tokens_per_s(dep, 1, ctx), b_max, cap)


def regime_speedups(old: RegimeRow, new: RegimeRow) -> dict[str, float]:
    """new over old, per GPU, in each regime: compute (prefill time ratio), bandwidth (batch-1
    tokens/s ratio), capacity (tokens/s per GPU at each one's KV ceiling; inf when old holds no
    sequence)."""
    per_gpu = new.n_gpus / old.n_gpus  # compare work per GPU when deployments differ in size
    cap_old, cap_new = old.capacity_tokens_per_s_per_gpu, new.capacity_tokens_per_s_per_gpu
    if cap_old > 0:
        capacity = cap_new / cap_old
    else:
        capacity = math.inf if cap_new > 0 else math.nan
    return {
        "compute": old.prefill_s / new.prefill_s / per_gpu,
        "bandwidth": new.decode_batch1_tokens_per_s / old.decode_batch1_tokens_per_s / per_gpu,
        "capacity": capacity,
    }


# ---- headline claims -----------------------------------------------------------------------


def per_user_decode_ceiling(
    mdl: str | Model,
    chip: str | GPU,
    n_gpus: int = 1,
    weight_dtype: str = "bf16",
    context: int = 0,
    kv_dtype: str = "bf16",
    tokens_per_weight_read: float = 1.0,
) -> float:
    """Upper bound on one user's decode tokens/s at batch 1: the bandwidth floor, inverted.

    tokens/s <= tau x n x W / (weights x b_w + context x KV bytes/token x n x shard(n)), where
    tau = tokens produced per pass over the weights (1 plain; > 1 with speculative decoding,
    counting the verify pass only) and shard(n) the KV fraction per GPU. For an MoE the weights
    are those one token reads (top-k experts; a multi-token verify pass reads more). Ignores
    communication, kernel overheads and the draft's cost (see :func:`speculative_speedup`).
    """
    m, g = model(mdl), gpu(chip)
    n = integer("n_gpus", n_gpus, 1)
    ctx = integer("context", context, 0)
    real("tokens_per_weight_read", tokens_per_weight_read, 1)
    weights = weight_bytes_read_per_step(m, 1, weight_dtype)  # MoE: only the routed top-k are read
    per_gpu_bytes = weights / n + ctx * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, n)
    return tokens_per_weight_read * g.memory_bandwidth / per_gpu_bytes


def batch_for_aggregate(
    claim_tokens_per_s: float,
    mdl: str | Model,
    chip: str | GPU,
    n_gpus: int,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Smallest batch whose AGGREGATE tokens/s reaches the claim on the modelled step
    (:func:`lib.perf.throughput.batch_for_tokens_per_s`, TP ``n_gpus``). math.inf when the claim
    is at or above the throughput ceiling."""
    real("claim_tokens_per_s", claim_tokens_per_s, 0, low_open=True)
    m, g = model(mdl), gpu(chip)
    n = integer("n_gpus", n_gpus, 1)
    cdt = "fp8" if weight_dtype == "fp8" and "fp8" in g.dtypes else "bf16"
    dep = Deployment(m, g, tp=n, weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=cdt)
    return tput.batch_for_tokens_per_s(dep, integer("context", context, 0), claim_tokens_per_s)


@dataclass(frozen=True)
class Scenario:
    """One reading of a headline: what it assumes and the ceiling that follows."""

    name: str
    tokens_per_s: float  # per-user ceiling under this reading (aggregate for the batch row)
    fits: bool  # the memory budget holds the weights and at least one sequence's KV
    note: str = ""

    def meets(self, claim: float) -> bool:
        return self.fits and self.tokens_per_s >= claim


def headline_scenarios(
    claim_tokens_per_s: float,
    mdl: str | Model,
    chip: str | GPU,
    n_gpus: int = 1,
    context: int = 0,
    acceptance: float = 0.8,
    draft_tokens: int = 4,
    draft_cost: float = 0.05,
    small_model: str = "llama-3.1-8b",
    multi_gpus: int = 8,
    memory_utilization: float | None = None,
) -> list[Scenario]:
    """Readings of "X tokens/s per user for ``mdl`` on ``n_gpus`` x ``chip``" and their ceilings.

    BF16 as stated; FP8 / INT4 weights; speculative decoding (speedup from
    :func:`speculative_speedup`) on each dtype; ``multi_gpus`` GPUs in BF16 and FP8;
    ``small_model`` in BF16 and FP8; the batch aggregate (B from :func:`batch_for_aggregate`).
    KV is BF16 at ``context`` tokens throughout. Ceilings ignore overheads, so a claim above
    every ceiling is impossible under that reading; one below is merely not ruled out. A reading
    fits when the memory budget on driver-visible memory (``Deployment.budget``) holds at least one
    sequence of ``context`` tokens; the aggregate rows need the batch the modelled step
    (:mod:`lib.perf.throughput`) needs and report the budget's count with its fraction.
    ``memory_utilization`` None: ``engine_defaults.gpu_memory_utilization`` in ``data/assumptions.yaml`` (``serving_memory``).
    """
    real("claim_tokens_per_s", claim_tokens_per_s, 0, low_open=True)
    m, g = model(mdl), gpu(chip)
    n = integer("n_gpus", n_gpus, 1)
    ctx = integer("context", context, 0)
    spec = speculative_speedup(acceptance, draft_tokens, draft_cost)

    def holds(mm: Model, dtype: str, gpus: int) -> float:
        """Sequences of ``ctx`` tokens the budget holds (fractional); -1 when it cannot be built."""
        dep = _deployment(mm, g, gpus, dtype, memory_utilization=memory_utilization)
        if dep is None:
            return -1.0
        return dep.budget.max_concurrency(max(ctx, 1))

    def fits(mm: Model, dtype: str, gpus: int) -> bool:
        return holds(mm, dtype, gpus) >= 1

    rows = []
    for dtype in ("bf16", "fp8", "int4"):
        rows.append(
            Scenario(
                f"{m.key} {dtype.upper()} weights, {n} GPU",
                per_user_decode_ceiling(m, g, n, dtype, ctx),
                fits(m, dtype, n),
            )
        )
    for dtype in ("bf16", "fp8", "int4"):
        base = per_user_decode_ceiling(m, g, n, dtype, ctx)
        rows.append(
            Scenario(
                f"{m.key} {dtype.upper()} + speculative decoding",
                base * spec,
                fits(m, dtype, n),
                f"x{spec:.2f}: acceptance {acceptance}, {draft_tokens} drafted, draft cost {draft_cost}",
            )
        )
    if multi_gpus > n and m.num_attention_heads % multi_gpus == 0:
        for dtype in ("bf16", "fp8"):
            rows.append(
                Scenario(
                    f"{m.key} {dtype.upper()} on {multi_gpus} GPUs (TP{multi_gpus})",
                    per_user_decode_ceiling(m, g, multi_gpus, dtype, ctx),
                    fits(m, dtype, multi_gpus),
                    "tensor-parallel communication ignored",
                )
            )
    small = model(small_model)
    if small.key != m.key:
        for dtype in ("bf16", "fp8"):
            rows.append(
                Scenario(
                    f"{small.key} {dtype.upper()} (a smaller model)",
                    per_user_decode_ceiling(small, g, n, dtype, ctx),
                    fits(small, dtype, n),
                )
            )
    for dtype in ("bf16", "fp8", "int4"):
        if fits(m, dtype, n):
            b = batch_for_aggregate(claim_tokens_per_s, m, g, n, max(ctx, 1), dtype)
            limit = holds(m, dtype, n)
            ok = b <= limit
            rows.append(
                Scenario(
                    f"{m.key} {dtype.upper()}, aggregate over a batch",
                    claim_tokens_per_s if ok else 0.0,
                    ok,
                    f"needs batch {math.ceil(b) if math.isfinite(b) else 'inf'}; KV holds {limit:.2f}",
                )
            )
    return rows


# ---- bytes per FLOP: workload against chip ---------------------------------------------------


def kv_bytes_per_token_mha(mdl: str | Model, dtype: str = "bf16") -> float:
    """KV bytes per token the model WOULD cache with one KV head per query head (no GQA/MLA):
    layers x 2 x heads x head_dim x b. For MLA, heads x (qk_nope + qk_rope + v) per layer."""
    m = model(mdl)
    if m.is_mla:
        per_layer = m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    else:
        per_layer = 2 * m.num_attention_heads * m.head_dim
    return m.num_layers * per_layer * bytes_per_element(dtype)


def decode_bytes_per_flop(
    mdl: str | Model,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    tokens_per_pass: float = 1.0,
    kv_bytes_per_token: float | None = None,
) -> float:
    """HBM bytes per FLOP a decode step asks for (the workload's side of the balance):

    (weights streamed / (B tau) + d x b_w + context x KV bytes/token / tau) / FLOPs per token at
    ``context``, with tau the tokens each sequence accepts per forward pass (speculative decoding:
    the verify pass reads the weights once for the whole batch and each sequence's KV once for
    all its drafted positions, so both terms are shared by tau tokens), d x b_w the token's
    embedding row, and KV bytes/token from the model unless ``kv_bytes_per_token`` overrides it
    (e.g. to undo GQA). Weights streamed: :func:`lib.perf.roofline.weight_bytes_streamed` (all but
    the embedding table; every expert, i.e. MoE at large batch). ``batch`` may be an array.
    Compare it with :func:`bytes_per_flop` of the chip at the dtype the matmuls run in.
    """
    m = model(mdl)
    b = np.asarray(batch, dtype=float)
    if b.size == 0 or np.any(b < 1) or not np.all(np.isfinite(b)) or np.any(b != np.floor(b)):
        raise ValueError(f"batch must be an integer >= 1 (or an array of them), got {batch!r}")
    ctx = integer("context", context, 0)
    tau = real("tokens_per_pass", tokens_per_pass, 1)
    kv = (
        m.kv_bytes_per_token(kv_dtype)
        if kv_bytes_per_token is None
        else real("kv_bytes_per_token", kv_bytes_per_token, 0)
    )
    row = lookup_bytes_read(m, 1, weight_dtype)
    per_token_bytes = weight_bytes_streamed(m, weight_dtype) / (b * tau) + row + ctx * kv / tau
    out = per_token_bytes / m.flops_per_token(ctx)
    return float(out) if out.ndim == 0 else out


def matmul_dtype(weight_dtype: str, chip: str | GPU) -> str:
    """The dtype a decode's matmuls run in: FP8 for FP8 (or FP4 on chips with an FP4 peak: FP4)
    weights where the chip has that peak, else BF16 (weight-only formats dequantize)."""
    g = gpu(chip)
    return weight_dtype if weight_dtype in ("fp8", "fp4") and weight_dtype in g.dtypes else "bf16"


def _packaging() -> dict:
    return assumptions.section("power")


def hbm_stack_bandwidth(pin_rate_gbps: float, bus_bits: int | None = None) -> float:
    """Bytes/s of one HBM stack: bus width (1024 bits) x per-pin rate / 8."""
    real("pin_rate_gbps", pin_rate_gbps, 0, low_open=True)
    bits = (
        bus_bits
        if bus_bits is not None
        else _packaging()["hbm"]["bus_width_bits_per_stack"]["value"]
    )
    return integer("bus_bits", bits, 1) * pin_rate_gbps * 1e9 / 8


def implied_pin_rate_gbps(chip: str | GPU) -> float:
    """Per-pin data rate the datasheet bandwidth implies: W x 8 / (stacks x 1024 bits), Gb/s."""
    g = gpu(chip)
    stacks = _packaging()["hbm"]["stacks_per_gpu"]
    if g.key not in stacks:
        raise ValueError(
            f"no HBM stack count for {g.key} in assumptions.yaml (power); known: {', '.join(stacks)}"
        )
    bits = _packaging()["hbm"]["bus_width_bits_per_stack"]["value"]
    return g.memory_bandwidth * 8 / (stacks[g.key]["value"] * bits) / 1e9


def stacks_on_shoreline(edge_mm: float, stack_mm: float, edges: int) -> int:
    """HBM stacks that fit along a die: edges x floor(edge length / stack footprint)."""
    for name, v in (("edge_mm", edge_mm), ("stack_mm", stack_mm)):
        real(name, v, 0, low_open=True)
    return integer("edges", edges, 0) * int(edge_mm // stack_mm)


def shoreline_bandwidth_per_die(pin_rate_gbps: float) -> float:
    """Bytes/s a reticle-limited die can reach with HBM on its HBM edges (data: reticle, footprint)."""
    d = _packaging()
    long_edge = max(d["packaging"]["reticle_mm"]["value"])
    stacks = stacks_on_shoreline(
        long_edge,
        d["hbm"]["stack_footprint_mm"]["value"],
        d["packaging"]["hbm_edges_per_die"]["value"],
    )
    return stacks * hbm_stack_bandwidth(pin_rate_gbps)
