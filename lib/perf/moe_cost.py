"""What a mixture-of-experts decode step costs as the batch grows, and how skewed routing changes it.

Builds on :mod:`lib.perf.moe` (uniform routing: E[distinct experts] = E (1 - (1 - k/E)^B)) and
:func:`lib.perf.roofline.decode_step` (MoE-aware weight bytes). Adds:

* the step's bytes, FLOPs and time per token against two dense yardsticks: a dense model with
  the MoE's TOTAL parameters and one with its ACTIVE parameters;
* the batch at which the MoE step turns compute-bound (a root of a nonlinear equation);
* skewed routing: per-token inclusion probabilities pi_e (sum k, each <= 1), the generalized
  closed form E[distinct] = sum_e (1 - (1 - pi_e)^B), a sampler that draws k distinct experts
  with exactly those marginals (systematic PPS sampling), and the hottest expert's load.

SI units: bytes, FLOP, seconds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.perf import roofline
from lib.perf.moe import expected_experts_touched
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model


def _moe(mdl: str | Model) -> Model:
    m = model(mdl)
    if not m.is_moe:
        raise ValueError(
            f"{m.key} is a dense model; pick a mixture-of-experts model "
            f"(one with num_experts > 0, e.g. mixtral-8x7b or deepseek-v3)"
        )
    return m


def _check_experts(num_experts: int, experts_per_token: int) -> tuple[int, int]:
    num_experts = integer("num_experts", num_experts, 1)
    return num_experts, integer("experts_per_token", experts_per_token, 1, num_experts)


@functools.lru_cache(maxsize=64)
def _sizes(m: Model) -> dict[str, float]:
    """The parameter counts the cost model uses, derived once per model: total, active, streamed
    (every expert / the top-k, without the embedding table) and matmul (all experts / top-k)."""
    per_expert = m._ffn_params(m.expert_intermediate_size)
    inactive = m.num_moe_layers * (m.num_experts - m.experts_per_token) * per_expert
    streamed = roofline.params_streamed(m)  # parameters a step reads whole (all experts)
    return {
        "total": float(m.params_total),
        "active": float(m.params_active),
        "streamed_total": float(streamed),
        "streamed_active": float(streamed - inactive),
        "matmul_active": float(m.matmul_params_active),
        "matmul_total": float(m.matmul_params_active + inactive),
    }


def params_per_expert(mdl: str | Model) -> int:
    """Parameters of one routed expert in one layer: 3 x hidden x expert_intermediate (SwiGLU)."""
    m = _moe(mdl)
    return m._ffn_params(m.expert_intermediate_size)


def routed_params_total(mdl: str | Model) -> int:
    """All routed-expert parameters: MoE layers x experts x params per expert."""
    m = _moe(mdl)
    return m.num_moe_layers * m.num_experts * params_per_expert(m)


def dense_yardsticks(mdl: str | Model) -> dict[str, dict[str, float]]:
    """Two dense models to compare an MoE with, as {name: {params, matmul_params}}.

    'same_total': every expert active (a dense model as big as the MoE's weights);
    'same_active': only the top-k (and shared) experts (a dense model as cheap per token).
    ``params`` sets the bytes read per step: the parameters a step streams, i.e. stored minus
    the embedding table (:func:`lib.perf.roofline.weight_bytes_streamed`; its B looked-up rows,
    B x d, are left out); ``matmul_params`` the FLOPs per token (2 each).
    """
    sz = _sizes(_moe(mdl))
    return {
        "same_total": {"params": sz["streamed_total"], "matmul_params": sz["matmul_total"]},
        "same_active": {"params": sz["streamed_active"], "matmul_params": sz["matmul_active"]},
    }


@dataclass(frozen=True)
class StepCost:
    """One decode step of ``batch`` tokens (context 0: weights only), whole replica on ``tp`` GPUs."""

    batch: int
    weight_bytes: float  # bytes read from HBM per step (whole replica)
    flops: float  # FLOPs per step (whole replica)
    time_s: float  # roofline bound max(compute, memory), per step
    bound: str

    @property
    def time_per_token_s(self) -> float:
        """GPU-seconds of one replica per generated token: step time / batch."""
        return self.time_s / self.batch


def moe_step_cost(
    mdl: str | Model,
    chip: str | GPU,
    batch: int,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    tp: int = 1,
) -> StepCost:
    """Roofline cost of one MoE decode step (uniform routing, no KV): lib.perf.roofline.decode_step.

    bytes = non-expert weights + MoE layers x E[distinct experts](B) x expert bytes;
    FLOPs = B x 2 x active matmul params; time = max(bytes / W, FLOPs / P) per GPU.
    """
    m, b = _moe(mdl), integer("batch", batch, 1, unit="tokens")
    step = roofline.decode_step(
        m, chip, tp=tp, batch=b, context=0, weight_dtype=weight_dtype, compute_dtype=compute_dtype
    )
    return StepCost(b, step.bytes * tp, step.flops * tp, step.time_s, step.bound)


def dense_step_cost(
    params: float,
    matmul_params: float,
    chip: str | GPU,
    batch: int,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    tp: int = 1,
) -> StepCost:
    """Roofline cost of a dense decode step: bytes = params x b, FLOPs = 2 x matmul params x B.

    ``params``: the parameters the step streams (see :func:`dense_yardsticks`)."""
    g, b = gpu(chip), integer("batch", batch, 1, unit="tokens")
    if not (params > 0 and matmul_params > 0):
        raise ValueError(f"params and matmul_params must be > 0, got {params}, {matmul_params}")
    tp = integer("tp", tp, 1)
    nbytes = params * bytes_per_element(weight_dtype)
    flops = 2.0 * matmul_params * b
    t = roofline.roofline_time(flops / tp, nbytes / tp, g, compute_dtype)
    return StepCost(b, nbytes, flops, t.time_s, t.bound)


def compare_with_dense(
    mdl: str | Model,
    chip: str | GPU,
    batch: int,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    tp: int = 1,
) -> dict[str, StepCost]:
    """The MoE step and both dense yardsticks at the same batch: {'moe', 'same_total', 'same_active'}."""
    out = {"moe": moe_step_cost(mdl, chip, batch, weight_dtype, compute_dtype, tp)}
    for name, p in dense_yardsticks(mdl).items():
        out[name] = dense_step_cost(
            p["params"], p["matmul_params"], chip, batch, weight_dtype, compute_dtype, tp
        )
    return out


def compute_bound_batch(
    mdl: str | Model, chip: str | GPU, weight_dtype: str = "bf16", compute_dtype: str = "bf16"
) -> float:
    """Batch (real-valued) at which the MoE step's compute time equals its weight-read time, both at
    datasheet peaks: where two roofline costs cross (the step turns compute-bound), not a best batch.

    Solves B x 2 N_active_matmul / P = bytes(B) / W with bytes(B) =
    :func:`lib.perf.roofline.weight_bytes_read_per_step` (uniform routing), by bisection over B >= 1
    (compute grows linearly, bytes saturate at the total, so there is one root); 1.0 when one
    token is already compute-bound. Independent of tp (both sides divide by it).
    """
    m, g = _moe(mdl), gpu(chip)
    per_token = 2.0 * _sizes(m)["matmul_active"] / g.peak_flops(compute_dtype)

    def gap(b: float) -> float:
        nbytes = roofline.weight_bytes_read_per_step(m, b, weight_dtype)
        return b * per_token - nbytes / g.memory_bandwidth

    if gap(1.0) >= 0:
        return 1.0
    lo, hi = 1.0, 2.0
    while gap(hi) < 0:
        hi *= 2
        if hi > 1e12:
            raise ValueError("no compute-bound batch below 1e12 tokens")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return hi


def dense_compute_bound_batch(
    params: float,
    matmul_params: float,
    chip: str | GPU,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """Closed form for a dense model: B = (P / W) x params x b / (2 x matmul params), the batch where
    the weight read and the GEMM FLOPs cost the same at datasheet peaks (a crossing, not an optimum)."""
    g = gpu(chip)
    return (
        g.ridge_point(compute_dtype)
        * params
        * bytes_per_element(weight_dtype)
        / (2.0 * matmul_params)
    )


def tokens_per_expert(num_experts: int, experts_per_token: int, batch: int) -> float:
    """Mean tokens an expert that is read actually serves: B k / E[distinct](B) (>= 1 for B >= 1)."""
    touched = expected_experts_touched(num_experts, experts_per_token, batch)
    if touched == 0:
        raise ValueError("batch must be >= 1 token")
    return batch * experts_per_token / touched


def per_token_time_curves(
    mdl: str | Model,
    chip: str | GPU,
    batches,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> dict[str, np.ndarray]:
    """Vectorized roofline seconds per token (one GPU-equivalent, no KV) at each batch, for the MoE
    and both dense yardsticks: {'moe', 'same_total', 'same_active'}. Same model as
    :func:`compare_with_dense` (time_s x tp / batch), computed in one pass for plotting."""
    m, g = _moe(mdl), gpu(chip)
    b = np.asarray(batches, dtype=float)
    if b.ndim != 1 or b.size == 0 or np.any(b < 1) or not np.all(np.isfinite(b)):
        raise ValueError("batches must be a non-empty 1-D array of numbers >= 1")
    sz, bpe = _sizes(m), bytes_per_element(weight_dtype)
    w, p = g.memory_bandwidth, g.peak_flops(compute_dtype)
    moe_bytes = np.array([roofline.weight_bytes_read_per_step(m, x, weight_dtype) for x in b])
    out = {"moe": np.maximum(moe_bytes / w, b * 2 * sz["matmul_active"] / p) / b}
    for name, params, matmul in (
        ("same_total", sz["streamed_total"], sz["matmul_total"]),
        ("same_active", sz["streamed_active"], sz["matmul_active"]),
    ):
        out[name] = np.maximum(params * bpe / w, b * 2 * matmul / p) / b
    return out


def batch_for_expert_coverage(num_experts: int, experts_per_token: int, coverage: float) -> float:
    """Tokens per step at which a fraction ``coverage`` of the experts is read in expectation.

    Inverts E (1 - (1 - k/E)^B) = q E: B = ln(1 - q) / ln(1 - k/E). Returns 0 for q = 0 and
    math.inf for q = 1 (unless k = E, when one token reads everything: B = 1).
    """
    num_experts, experts_per_token = _check_experts(num_experts, experts_per_token)
    fraction("coverage", coverage)
    if experts_per_token == num_experts:
        return 1.0 if coverage > 0 else 0.0
    if coverage == 1:
        return math.inf
    return math.log1p(-coverage) / math.log1p(-experts_per_token / num_experts)


# ---- skewed routing ------------------------------------------------------------------------


def zipf_inclusion_probabilities(
    num_experts: int, experts_per_token: int, skew: float
) -> np.ndarray:
    """Per-token probability that each expert is among the k chosen, Zipf-skewed by popularity.

    pi_e proportional to (e + 1)^-skew, scaled so sum(pi) = k, each capped at 1 (the excess is
    spread over the uncapped experts until none exceeds 1). skew = 0 gives k / E each.
    """
    num_experts, experts_per_token = _check_experts(num_experts, experts_per_token)
    real("skew", skew, 0, unit="(the Zipf exponent)")
    w = np.arange(1, num_experts + 1, dtype=float) ** (-float(skew))
    pi = np.zeros(num_experts)
    capped = np.zeros(num_experts, dtype=bool)
    for _ in range(num_experts + 1):
        room = experts_per_token - capped.sum()
        free = ~capped
        pi[free] = room * w[free] / w[free].sum()
        pi[capped] = 1.0
        over = free & (pi > 1.0)
        if not over.any():
            break
        capped |= over
    return np.minimum(pi, 1.0)


def _check_pi(pi) -> np.ndarray:
    p = np.asarray(pi, dtype=float)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)):
        raise ValueError("inclusion probabilities must be a non-empty 1-D array of finite numbers")
    if np.any(p < 0) or np.any(p > 1 + 1e-12):
        raise ValueError("each inclusion probability must be in [0, 1]")
    k = p.sum()
    if abs(k - round(k)) > 1e-9 or round(k) < 1:
        raise ValueError(
            f"inclusion probabilities must sum to an integer k >= 1 (experts per token), got {k}"
        )
    return np.minimum(p, 1.0)


def expected_experts_touched_nonuniform(pi, batch: int) -> float:
    """E[distinct experts] for ``batch`` independent tokens with inclusion probabilities pi:
    sum_e (1 - (1 - pi_e)^B). Reduces to lib.perf.moe's E (1 - (1 - k/E)^B) when pi_e = k / E."""
    p = _check_pi(pi)
    batch = integer("batch", batch, 0)
    return float(np.sum(1.0 - (1.0 - p) ** batch))


def simulate_routing(pi, batch: int, trials: int = 500, seed: int = 0) -> dict[str, np.ndarray]:
    """Monte Carlo of ``trials`` decode steps of ``batch`` tokens, each picking k distinct experts.

    Each token uses systematic PPS sampling over a fresh random order of the experts: with
    cumulative sums C_i and one uniform u, expert i is picked iff ceil(C_i - u) > ceil(C_{i-1} - u).
    That picks exactly k = sum(pi) distinct experts with marginals exactly pi.
    Returns {'distinct': experts hit per step, 'max_load': tokens on the hottest expert per step,
    'mean_load': tokens per hit expert per step, 'load': tokens per expert per step (trials x E)}.
    """
    p = _check_pi(pi)
    batch = integer("batch", batch, 1)
    trials = integer("trials", trials, 1)
    e = p.size
    if trials * batch * e > 40_000_000:
        raise ValueError(
            f"trials x batch x experts = {trials * batch * e:,} is too large (limit 40,000,000)"
        )
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((trials, batch, e)), axis=2)
    cum = np.cumsum(p[order], axis=2)
    u = rng.random((trials, batch, 1))
    upper = np.ceil(cum - u)
    lower = np.concatenate([np.zeros((trials, batch, 1)), upper[:, :, :-1]], axis=2)
    picked_in_order = (upper - lower) > 0.5
    picked = np.zeros_like(picked_in_order)
    np.put_along_axis(picked, order, picked_in_order, axis=2)
    load = picked.sum(axis=1)  # (trials, experts)
    distinct = (load > 0).sum(axis=1).astype(float)
    return {
        "distinct": distinct,
        "max_load": load.max(axis=1).astype(float),
        "mean_load": load.sum(axis=1) / np.maximum(distinct, 1.0),
        "load": load.astype(float),
    }


def hottest_expert_load_ratio(pi) -> float:
    """Expected load of the most popular expert over the mean load: max(pi) x E / k (1 = balanced).

    With one expert per GPU (expert parallelism) at a compute-bound batch, the step waits for
    that GPU, so this is the slowdown factor in expectation (random fluctuation adds to it).
    """
    p = _check_pi(pi)
    return float(p.max() * p.size / p.sum())
