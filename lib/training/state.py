"""Training memory: the state a run keeps per parameter, how ZeRO / FSDP shard it, and the
activations the backward pass needs.

* **State per parameter** (:func:`state_bytes_per_param`): weights, gradients and optimizer
  state. Mixed-precision Adam (ZeRO's accounting): bf16 weights 2 + bf16 gradients 2 + fp32
  master weights, momentum and variance 12 = 16 bytes.
* **Sharding** (:func:`state_bytes_per_gpu`): tensor and pipeline parallelism split the
  parameters (each GPU owns params / (tp x pp)); ZeRO then shards over the data-parallel group:
  stage 1 the optimizer states, stage 2 also the gradients, stage 3 (FSDP) also the weights.
* **Activations** (:func:`activation_bytes_per_token_per_layer`): Korthikanti et al.'s accounting
  (arXiv:2205.05198, sec. 4.1) made model-aware: per token per layer, in 16-bit activations,
  the tensors the backward pass reads:
    - attention: the QKV projection's input (h), Q, K, V (h_q + 2 kv), the attention output that
      the output projection reads (h_q); without FlashAttention also the scores, their softmax
      and dropout (5 a s bytes); FlashAttention keeps only a float32 log-sum-exp per head;
    - MLP: its input (h) and, per intermediate width f, the GELU input and output (2 f) or the
      SwiGLU gate, up and product (3 f);
    - the two norms' inputs (2 h); with dropout, two 1-byte masks (2 h bytes).
  A GPT-3-style layer (4h GELU MLP, multi-head attention, dropout) gives exactly their
  34 h + 5 a s bytes per token. Tensor parallelism splits everything but the norms', the QKV
  input's and the MLP input's h each (10 h with dropout) unless sequence parallelism splits
  those too; full recomputation keeps only the layer input (2 h, / tp with sequence parallelism).

SI units: bytes.
"""

from __future__ import annotations

import math

from lib.inputs import integer
from lib.registry.dtypes import bytes_per_element
from lib.registry.models import Model, model

__all__ = [
    "OPTIMIZERS", "ZERO_STAGES", "activation_bytes_per_token_per_layer", "layer_activation_bytes",
    "gpus_to_hold", "in_flight_micro_batches", "logits_bytes_per_token", "state_bytes_per_gpu", "state_bytes_per_param", "state_bytes_total",
    "state_breakdown_per_param",
]

OPTIMIZERS = ("adam", "adam-bf16-states", "sgd-momentum", "adafactor")
ZERO_STAGES = (0, 1, 2, 3)
_RECOMPUTE = ("none", "selective", "full")


def state_breakdown_per_param(optimizer: str = "adam", weight_dtype: str = "bf16",
                              grad_dtype: str = "bf16", master_weights: bool = True) -> dict[str, float]:
    """Bytes per parameter of each kind of state: ``weights``, ``gradients``, ``master`` (fp32
    copy, mixed precision), ``optimizer`` (Adam: fp32 m and v = 8; bf16 states = 4; SGD momentum
    fp32 = 4; Adafactor's factored second moment ~ 0)."""
    opt = {"adam": 8.0, "adam-bf16-states": 4.0, "sgd-momentum": 4.0, "adafactor": 0.0}
    if optimizer not in opt:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    w, g = bytes_per_element(weight_dtype), bytes_per_element(grad_dtype)
    master = 4.0 if master_weights and w < 4 else 0.0
    return {"weights": w, "gradients": g, "master": master, "optimizer": opt[optimizer]}


def state_bytes_per_param(optimizer: str = "adam", weight_dtype: str = "bf16", grad_dtype: str = "bf16",
                          master_weights: bool = True) -> float:
    """Bytes of training state per parameter: weights + gradients + master copy + optimizer
    states (mixed-precision Adam: 2 + 2 + 4 + 8 = 16)."""
    return sum(state_breakdown_per_param(optimizer, weight_dtype, grad_dtype, master_weights).values())


def state_bytes_total(mdl: str | Model | float, **recipe) -> float:
    """Training state of the whole model: total parameters (a model name, a Model, or a count)
    x :func:`state_bytes_per_param` (``recipe``: its keyword arguments)."""
    params = _params(mdl)
    return params * state_bytes_per_param(**recipe)


def _params(mdl: str | Model | float) -> float:
    if isinstance(mdl, (int, float)) and not isinstance(mdl, bool):
        if mdl <= 0:
            raise ValueError(f"params must be > 0, got {mdl!r}")
        return float(mdl)
    return float(model(mdl).params_total)


def state_bytes_per_gpu(mdl: str | Model | float, tp: int = 1, pp: int = 1, dp: int = 1, zero_stage: int = 0,
                        ep: int = 1, **recipe) -> dict[str, float]:
    """Each GPU's share of the training state, bytes, by kind (and ``total``).

    The GPU owns params / (tp x pp) (for an MoE, ``ep`` further splits the routed experts: use a
    Model, whose expert parameters are divided by ep); ZeRO over the ``dp`` data-parallel ranks
    then divides the optimizer states (stage >= 1), the master weights (>= 1), gradients (>= 2)
    and weights (3). ZeRO's Figure 1 (7.5B parameters, 64 GPUs): 120, 31.4, 16.6, 1.9 GB.
    """
    tp, pp, dp = integer("tp", tp, 1), integer("pp", pp, 1), integer("dp", dp, 1)
    ep = integer("ep", ep, 1)
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}; got {zero_stage!r}")
    params = _owned_params(mdl, ep) / (tp * pp)
    per = state_breakdown_per_param(**recipe)
    shard = {"weights": zero_stage >= 3, "gradients": zero_stage >= 2, "master": zero_stage >= 1,
             "optimizer": zero_stage >= 1}
    out = {k: params * b / (dp if shard[k] else 1) for k, b in per.items()}
    out["total"] = sum(out.values())
    return out


def _owned_params(mdl: str | Model | float, ep: int) -> float:
    """Parameters one expert-parallel rank holds: dense ones whole, routed experts / ep."""
    if ep == 1 or isinstance(mdl, (int, float)):
        if ep != 1:
            raise ValueError("ep > 1 needs a model (its routed-expert parameters), not a parameter count")
        return _params(mdl)
    m = model(mdl)
    if not m.is_moe:
        raise ValueError(f"ep={ep} needs a mixture-of-experts model; {m.key} is dense")
    if m.num_experts % ep:
        raise ValueError(f"ep={ep} must divide {m.key}'s {m.num_experts} experts")
    from lib.perf.moe_cost import routed_params_total

    routed = routed_params_total(m)
    return m.params_total - routed + routed / ep


def _check_recompute(recompute: str) -> str:
    if recompute not in _RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(_RECOMPUTE)}; got {recompute!r}")
    return recompute


def activation_bytes_per_token_per_layer(mdl: str | Model, seq_len: int, tp: int = 1,
                                         sequence_parallel: bool = False, recompute: str = "none",
                                         flash_attention: bool = True, dropout: bool = False,
                                         act_dtype: str = "bf16", moe_layer: bool = True) -> float:
    """Bytes one token keeps for the backward pass in one (dense-MLP) layer, on one of ``tp``
    GPUs (module docstring). ``seq_len`` matters only without FlashAttention (the 5 a s bytes of
    scores, softmax and dropout per token, which Korthikanti's selective recompute drops).
    For a mixture of experts, ``moe_layer`` counts the MLP as its top-k routed plus shared
    experts (each token's average; the hottest expert's GPU holds more); else the dense MLP of
    ``intermediate_size`` (DeepSeek-V3's first dense layers)."""
    m = model(mdl)
    s = integer("seq_len", seq_len, 1, unit="tokens")
    tp = integer("tp", tp, 1)
    recompute = _check_recompute(recompute)
    e = bytes_per_element(act_dtype)
    h = m.hidden_size
    if recompute == "full":
        return e * h / (tp if sequence_parallel else 1)
    hq = m.num_attention_heads * (m.v_head_dim if m.is_mla else m.head_dim)
    kv = m.num_kv_heads * m.head_dim if not m.is_mla else hq  # MLA trains on decompressed K and V
    f = m.intermediate_size
    if m.is_moe and moe_layer:  # the routed top-k and shared experts each keep their own intermediates
        f = (m.experts_per_token + m.shared_experts) * m.expert_intermediate_size
    mlp_inner = 2 * f if m.mlp == "gelu_2matrix" else 3 * f
    sharded = e * (hq + 2 * kv + hq + mlp_inner)  # Q, K, V, attention output; MLP intermediates
    replicated = e * (h + h + 2 * h)  # QKV input, MLP input, the two norms' inputs
    if dropout:
        replicated += 2.0 * h  # 1-byte masks after the attention and MLP outputs (full width after the all-reduce)
    scores = 0.0
    if not flash_attention and recompute == "none":
        scores = 5.0 * m.num_attention_heads * s  # softmax out 2 + dropout mask 1 + dropout out 2 bytes
    elif flash_attention:
        sharded += 4.0 * m.num_attention_heads  # the fp32 log-sum-exp per head
    return (replicated / (tp if sequence_parallel else 1)) + (sharded + scores) / tp


def layer_activation_bytes(mdl: str | Model, seq_len: int, micro_batch: int = 1, **kwargs) -> float:
    """Bytes one layer keeps for a micro-batch of ``micro_batch`` sequences of ``seq_len`` tokens:
    tokens x :func:`activation_bytes_per_token_per_layer` (keyword arguments passed on). Under
    context parallelism pass the GPU's own share of the sequence (seq_len / cp)."""
    b = integer("micro_batch", micro_batch, 1)
    return b * seq_len * activation_bytes_per_token_per_layer(mdl, seq_len, **kwargs)


def logits_bytes_per_token(mdl: str | Model, tp: int = 1, dtype: str = "fp32") -> float:
    """Bytes of the output logits one token keeps for the loss's backward: vocab x bytes / tp
    (the vocabulary-parallel head splits them; fp32 for a stable cross-entropy)."""
    m = model(mdl)
    return m.vocab_size * bytes_per_element(dtype) / integer("tp", tp, 1)


def in_flight_micro_batches(pp: int, micro_batches: int, interleave: int = 1) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once under 1F1B:
    min(pp, m), times Narayanan's interleaving factor 1 + (pp - 1) / (pp x v) for v > 1."""
    pp, m, v = integer("pp", pp, 1), integer("micro_batches", micro_batches, 1), integer("interleave", interleave, 1)
    base = min(pp, m)
    return base * (1.0 + (pp - 1) / (pp * v)) if v > 1 else float(base)


def gpus_to_hold(total_bytes: float, bytes_per_gpu: float) -> int:
    """Whole GPUs whose memory holds ``total_bytes``: ceil(total / per GPU)."""
    if bytes_per_gpu <= 0:
        raise ValueError(f"bytes_per_gpu must be > 0, got {bytes_per_gpu!r}")
    return max(1, math.ceil(total_bytes / bytes_per_gpu))
