"""Forward-pass arithmetic beyond the roofline core: the weight-matrix inventory behind
"2 FLOPs per parameter", the prefill floor and time to first token, and the ceilings the KV
cache puts on decode batching (capacity and bandwidth).

All quantities SI: FLOP, FLOP/s, bytes, bytes/s, seconds. A "replica" is ``n_gpus`` GPUs
holding one copy of the model with tensor parallelism: FLOPs, weights and (up to the KV-head
count) the KV cache split evenly. Assumption values live in ``data/assumptions.yaml``
and come in as arguments; nothing here hides a default efficiency below 1 except where the
docstring says so. THE prefill time is :func:`prefill_time` (compute at the compute-only MFU,
weight read, and the TP all-reduce traffic that grows with the tokens, charged once);
:func:`prefill_estimate` is its per-GPU roofline part without communication, exact only at one GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.perf import collectives
from lib.perf.roofline import (
    kv_shard_fraction,
    lookup_bytes_read,
    prefill_crossover_tokens,
    weight_bytes_read_per_step,
    weight_bytes_streamed,
)
from lib.registry.assumptions import resolve
from lib.registry.data import load_yaml
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model


def assumptions() -> dict:
    """{name: value} of the prefill assumption and the published anchors beside it
    (``prefill`` and ``anchors`` in ``data/assumptions.yaml``; a group of anchors without a value of
    its own, such as ``flashattention_h100_tflops``, is read by its own module)."""
    doc = load_yaml("assumptions.yaml")
    return {k: v["value"] for sec in ("prefill", "anchors") for k, v in doc[sec].items() if "value" in v}


def default_mfu(mfu: float | None = None) -> float:
    """``mfu``, or (None) ``prefill.prefill_mfu``: the compute-only fraction of dense peak a
    long prefill sustains (communication is priced apart, by :func:`prefill_time`)."""
    return fraction("mfu", resolve(mfu, "prefill.prefill_mfu"), allow_zero=False)


# ---- the weight-matrix inventory ------------------------------------------------------


@dataclass(frozen=True)
class WeightGroup:
    """One kind of parameter tensor, summed over the layers (or experts) that hold it.

    kind: 'matmul' (each active parameter is one multiply-add per token: 2 FLOPs),
    'lookup' (a table read by index: no arithmetic) or 'elementwise' (norm scales, biases:
    about one FLOP per element per token, not on tensor cores).
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    count: int  # tensors of this shape stored in the model
    active_count: int  # tensors of this shape one token touches
    params_stored: int  # count x prod(shape) (0 for a tied head: it reuses the embedding)

    @property
    def params_active(self) -> int:
        """Parameters one token's forward pass uses from this group."""
        return self.active_count * math.prod(self.shape)

    @property
    def flops_per_token(self) -> float:
        """2 per active parameter for matmuls, 1 for elementwise, 0 for lookups."""
        return {"matmul": 2.0, "elementwise": 1.0, "lookup": 0.0}[self.kind] * self.params_active


def weight_inventory(mdl: str | Model) -> list[WeightGroup]:
    """Every parameter tensor of ``mdl`` from its config, counted independently of lib.registry.models.

    Covers MHA/GQA and MLA attention, SwiGLU, GELU two-matrix and MoE FFNs (routed experts stored
    all, active top-k; shared experts; router), RMSNorm / LayerNorm, biases, learned positions,
    tied or untied output head. The sum of ``params_stored`` is the model's parameter count;
    the matmul rows' ``flops_per_token`` sum to the 2N term.
    """
    m = model(mdl)
    d, h, n_l = m.hidden_size, m.num_attention_heads, m.num_layers
    rows: list[WeightGroup] = []

    def add(name, kind, shape, count, active=None, stored=True):
        active = count if active is None else active
        stored_params = count * math.prod(shape) if stored else 0
        if count or active:
            rows.append(WeightGroup(name, kind, tuple(shape), count, active, stored_params))

    add("token embedding", "lookup", (m.vocab_size, d), 1, active=0)
    if m.position_embedding == "learned":
        add("position embedding", "lookup", (m.max_position_embeddings, d), 1, active=0)
    norm_shapes = [(d,)] if m.norm == "rmsnorm" else [(d,), (d,)]  # scale (and bias)
    for i, shape in enumerate(norm_shapes):
        add(
            "norms (2 per layer + final)" + (" bias" if i else ""),
            "elementwise",
            shape,
            2 * n_l + 1,
        )
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        add("q_a_proj (down)", "matmul", (d, m.q_lora_rank), n_l)
        add("q_a_layernorm", "elementwise", (m.q_lora_rank,), n_l)
        add("q_b_proj (up)", "matmul", (m.q_lora_rank, h * qk), n_l)
        add("kv_a_proj (down, + rope key)", "matmul", (d, m.kv_lora_rank + m.qk_rope_head_dim), n_l)
        add("kv_a_layernorm", "elementwise", (m.kv_lora_rank,), n_l)
        add(
            "kv_b_proj (up to K_nope, V)",
            "matmul",
            (m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim)),
            n_l,
        )
        add("o_proj", "matmul", (h * m.v_head_dim, d), n_l)
    else:
        q_out, kv_out = h * m.head_dim, m.num_kv_heads * m.head_dim
        add("q_proj", "matmul", (d, q_out), n_l)
        add("k_proj", "matmul", (d, kv_out), n_l)
        add("v_proj", "matmul", (d, kv_out), n_l)
        add("o_proj", "matmul", (q_out, d), n_l)
        if m.linear_bias in ("qkv", "all"):
            add("q, k, v biases", "elementwise", (q_out + 2 * kv_out,), n_l)
        if m.linear_bias == "all":
            add("o bias", "elementwise", (d,), n_l)

    def ffn(prefix, inner, count, active):
        if m.mlp == "gelu_2matrix":
            add(f"{prefix}fc_in", "matmul", (d, inner), count, active)
            add(f"{prefix}fc_out", "matmul", (inner, d), count, active)
            if m.linear_bias == "all":
                add(f"{prefix}fc biases", "elementwise", (inner + d,), count, active)
        else:
            add(f"{prefix}gate_proj", "matmul", (d, inner), count, active)
            add(f"{prefix}up_proj", "matmul", (d, inner), count, active)
            add(f"{prefix}down_proj", "matmul", (inner, d), count, active)

    dense_layers = m.first_dense_layers if m.is_moe else n_l
    ffn("", m.intermediate_size, dense_layers, dense_layers)
    if m.is_moe:
        moe_l, e, k = m.num_moe_layers, m.num_experts, m.experts_per_token
        ffn("expert ", m.expert_intermediate_size, moe_l * e, moe_l * k)
        if m.shared_experts:
            ffn(
                "shared expert ",
                m.expert_intermediate_size,
                moe_l * m.shared_experts,
                moe_l * m.shared_experts,
            )
        add("router", "matmul", (d, e), moe_l)
        if m.is_mla:  # DeepSeek-V3's e_score_correction_bias
            add("router bias", "elementwise", (e,), moe_l)
    add(
        "lm_head" + (" (tied to embedding)" if m.tie_word_embeddings else ""),
        "matmul",
        (d, m.vocab_size),
        1,
        stored=not m.tie_word_embeddings,
    )
    return rows


def matmul_params_from_inventory(mdl: str | Model) -> int:
    """Active parameters in matmuls (2 FLOPs each per token), summed from :func:`weight_inventory`."""
    return sum(r.params_active for r in weight_inventory(mdl) if r.kind == "matmul")


# ---- the 2N rule against the attention term --------------------------------------------


def kaplan_forward_flops_per_token(mdl: str | Model, n_ctx: int) -> float:
    """Kaplan et al. 2020 (arXiv:2001.08361, Table 1): C_forward = 2 N + 2 n_layer n_ctx d_attn.

    N is Kaplan's non-embedding count; we use the model's matmul parameters without the output
    head (Kaplan's total drops the de-embedding FLOPs) and d_attn = heads x head_dim. The
    context term is the average per token over a causally masked window of ``n_ctx`` tokens
    (QK^T and PV each 2 c d_attn at context c, averaged over c = 1..n_ctx), so it equals half of
    the cost of one token that attends to ``n_ctx`` keys.
    """
    m = model(mdl)
    n_ctx = integer("n_ctx", n_ctx, 0, unit="tokens")
    n = m.matmul_params_active - m.vocab_size * m.hidden_size
    d_attn = (
        m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2
        if m.is_mla
        else m.num_attention_heads * m.head_dim
    )
    return 2.0 * n + 2.0 * m.num_layers * n_ctx * d_attn


# ---- prefill floor and TTFT -----------------------------------------------------------


@dataclass(frozen=True)
class PrefillEstimate:
    """Time of one prefill on one replica: compute at an achieved fraction of peak vs weight read."""

    prompt_len: int
    batch: int
    n_gpus: int
    flops_weights: float  # 2 x matmul params x tokens, whole replica
    flops_attention: float  # causal QK^T and PV, whole replica (0 if excluded)
    replica_flops_per_s: float  # n_gpus x peak x mfu
    compute_s: float  # (flops_weights + flops_attention) / replica_flops_per_s
    memory_s: float  # weight bytes + KV written, per GPU, over HBM bandwidth

    @property
    def flops(self) -> float:
        return self.flops_weights + self.flops_attention

    @property
    def time_s(self) -> float:
        """max(compute, memory): the prefill floor at this MFU."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def prefill_estimate(
    mdl: str | Model,
    chip: str | GPU,
    prompt_len: int,
    n_gpus: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    include_attention: bool = True,
    batch: int = 1,
) -> PrefillEstimate:
    """Prefill of ``batch`` prompts of ``prompt_len`` tokens on ``n_gpus`` GPUs (tensor parallel).

    compute_s = (2 N_matmul x P x batch + attention) / (n_gpus x peak(compute_dtype) x mfu),
    attention = batch x P (P + 1) / 2 x attention FLOPs per key (causal mask);
    memory_s = (weights read / n_gpus + KV written x shard fraction) / HBM bandwidth.
    """
    m, g = model(mdl), gpu(chip)
    n_gpus = m.check_tp(n_gpus)
    prompt_len = integer("prompt_len", prompt_len, 1)
    batch = integer("batch", batch, 1)
    fraction("mfu", mfu, allow_zero=False)
    tokens = prompt_len * batch
    flops_w = m.weight_flops_per_token() * tokens
    flops_a = (
        batch * (m.prefill_flops(prompt_len) - prompt_len * m.weight_flops_per_token())
        if include_attention
        else 0.0
    )
    rate = n_gpus * g.peak_flops(compute_dtype) * mfu
    weights = weight_bytes_read_per_step(m, tokens, weight_dtype) / n_gpus
    kv = tokens * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, n_gpus)
    return PrefillEstimate(
        prompt_len,
        batch,
        n_gpus,
        flops_w,
        flops_a,
        rate,
        (flops_w + flops_a) / rate,
        (weights + kv) / g.memory_bandwidth,
    )


def prefill_allreduce_s(
    mdl: str | Model,
    chip: str | GPU,
    prompt_len: int,
    tp: int,
    batch: int = 1,
    act_dtype: str = "bf16",
) -> float:
    """Tensor-parallel communication of one prefill if not overlapped with compute, seconds.

    2 all-reduces per layer (after attention and after the FFN) of tokens x hidden x b bytes,
    each priced by :func:`lib.perf.collectives.all_reduce_s` (latency + ring bytes over the
    vendor's link): it grows with the tokens, so TTFT does not scale as 1 / tp.
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    prompt_len = integer("prompt_len", prompt_len, 1)
    batch = integer("batch", batch, 1)
    if tp == 1:
        return 0.0
    message = batch * prompt_len * m.hidden_size * bytes_per_element(act_dtype)
    return 2 * m.num_layers * collectives.all_reduce_s(message, tp, chip)


@dataclass(frozen=True)
class PrefillTime:
    """One prefill on one replica: the per-GPU roofline at the MFU, plus tensor-parallel traffic."""

    estimate: PrefillEstimate
    allreduce_s: float  # 2 L all-reduces of tokens x d x b, not overlapped with compute

    @property
    def compute_s(self) -> float:
        return self.estimate.compute_s

    @property
    def memory_s(self) -> float:
        return self.estimate.memory_s

    @property
    def time_s(self) -> float:
        """max(compute, weight read) + all-reduce time: the prefill's wall time."""
        return self.estimate.time_s + self.allreduce_s


def prefill_time(dep, prompt_len: int, batch: int = 1, mfu: float | None = None) -> PrefillTime:
    """Time of prefilling ``batch`` prompts of ``prompt_len`` tokens on one replica of ``dep``.

    time = max(FLOPs / (tp P mfu), bytes / W) + 2 L x all_reduce(tokens x d x b_act, tp).
    ``mfu`` (default ``prefill.prefill_mfu``) covers the kernels only, so the communication is
    charged once, here. The one prefill model of the book: TTFT, recompute and chunk pricing
    call it.
    """
    from lib.perf.deployment import require

    require(dep)
    est = prefill_estimate(dep.mdl, dep.chip, prompt_len, dep.tp, default_mfu(mfu), dep.weight_dtype,
                           dep.compute_dtype, dep.kv_dtype, batch=batch)
    comm = prefill_allreduce_s(dep.mdl, dep.chip, prompt_len, dep.tp, batch, dep.act_dtype)
    return PrefillTime(est, comm)


def ttft_s(prefill: PrefillTime | PrefillEstimate, queue_s: float = 0.0, overhead_s: float = 0.0) -> float:
    """Time to first token = queueing + prefill + fixed overhead, seconds.

    ``prefill`` is a :class:`PrefillTime` (from :func:`prefill_time`: its tensor-parallel
    all-reduces are already in it, so none is added here) or, for one GPU, a
    :class:`PrefillEstimate`. The first output token is sampled from the prefill pass's last
    logits, so no decode step is added. Pass queue_s = 0 to state a TTFT with queueing excluded.
    """
    if isinstance(prefill, PrefillEstimate) and prefill.n_gpus > 1:
        raise ValueError(
            "a PrefillEstimate at n_gpus > 1 lacks its all-reduce traffic: pass prefill_time(dep, ...) instead"
        )
    if not isinstance(prefill, PrefillTime | PrefillEstimate):
        raise ValueError(f"prefill must be a PrefillTime or PrefillEstimate, got {type(prefill).__name__}")
    for name, v in (("queue_s", queue_s), ("overhead_s", overhead_s)):
        real(name, v, 0, unit="seconds")
    return queue_s + prefill.time_s + overhead_s


def prompt_len_for_time(
    mdl: str | Model,
    chip: str | GPU,
    target_s: float,
    n_gpus: int = 1,
    mfu: float = 1.0,
    compute_dtype: str = "bf16",
    include_attention: bool = True,
) -> float:
    """Prompt length whose compute time at ``mfu`` is ``target_s`` (inverse of the floor).

    Solves 2N P + a P (P + 1) / 2 = target x n_gpus x peak x mfu, a = attention FLOPs per key
    (a = 0 without attention): P = (-(2N + a/2) + sqrt((2N + a/2)^2 + 2 a C)) / a.
    """
    m, g = model(mdl), gpu(chip)
    n_gpus = m.check_tp(n_gpus)
    fraction("mfu", mfu, allow_zero=False)
    real("target_s", target_s, 0, low_open=True, unit="seconds")
    c = target_s * n_gpus * g.peak_flops(compute_dtype) * mfu
    two_n = m.weight_flops_per_token()
    a = m.attention_flops_per_token(1) if include_attention else 0.0
    if a == 0:
        return c / two_n
    b = two_n + a / 2
    return (-b + math.sqrt(b * b + 2 * a * c)) / a


def mfu_for_time(
    mdl: str | Model,
    chip: str | GPU,
    prompt_len: int,
    target_s: float,
    n_gpus: int = 1,
    compute_dtype: str = "bf16",
    include_attention: bool = True,
) -> float:
    """The fraction of peak a replica must sustain to prefill ``prompt_len`` tokens in ``target_s``:
    FLOPs / (target x n_gpus x peak). A value above 1 means the target is below the floor."""
    real("target_s", target_s, 0, low_open=True, unit="seconds")
    est = prefill_estimate(
        mdl,
        chip,
        prompt_len,
        n_gpus,
        1.0,
        "bf16",
        compute_dtype,
        include_attention=include_attention,
    )
    return est.compute_s / target_s


# ---- crossover: tokens per pass where weight read = matmul time ---------------------------


def weight_read_crossover_tokens(
    mdl: str | Model,
    chip: str | GPU,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """Tokens T per forward pass at which 2 N_active T / peak = weight bytes read(T) / bandwidth.

    Bytes read are :func:`lib.perf.roofline.weight_bytes_read_per_step` (every weight once, the
    lookup tables one row per token). Dense: the closed form of
    :func:`lib.perf.roofline.prefill_crossover_tokens`, T* = R b S / (2 N_matmul - R b d), about the
    ridge R for 2-byte weights. MoE: the bytes read grow with T as more distinct experts are
    touched (uniform routing), so T* is found by bisection over T >= 1. Attention and the KV
    cache are ignored (the crossover of the weight GEMMs alone).
    """
    m, g = model(mdl), gpu(chip)
    if not m.is_moe:
        return prefill_crossover_tokens(m, g, weight_dtype, compute_dtype)
    peak, bw = g.peak_flops(compute_dtype), g.memory_bandwidth

    def gap(t: float) -> float:
        return m.weight_flops_per_token() * t / peak - weight_bytes_read_per_step(m, t, weight_dtype) / bw

    return _first_crossing(gap)


def _first_crossing(gap) -> float:
    """Smallest t >= 1 with gap(t) >= 0, for gap increasing once positive (bisection, 1e-9 relative)."""
    if gap(1.0) >= 0:
        return 1.0
    lo, hi = 1.0, 2.0
    while gap(hi) < 0:
        lo, hi = hi, hi * 2
        if hi > 1e12:
            raise ValueError("no crossover below 1e12 tokens")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
        if hi - lo <= 1e-9 * hi:
            break
    return hi


# ---- decode: the KV cache's two ceilings on batching --------------------------------------
# capacity: Deployment.budget (lib.perf.memory.memory_budget); bandwidth: the intensity below.


def decode_intensity(
    mdl: str | Model,
    batch: int,
    context: int = 0,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """FLOP per byte of a whole decode step on one of ``tp`` GPUs (weights + KV read).

    I = B (2N + attention(c)) / (W(B) + B c k s), with W(B) the weight bytes read (MoE aware),
    k KV bytes per token and s the shard fraction (tp cancels while tp <= KV heads). With
    context 0 this is the weight GEMMs alone: 2 N_matmul B / (N_total b), about B in BF16.
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    batch = integer("batch", batch, 1)
    context = integer("context", context, 0, unit="tokens")
    flops = batch * m.flops_per_token(context) / tp
    nbytes = weight_bytes_read_per_step(
        m, batch, weight_dtype
    ) / tp + batch * context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    return flops / nbytes


def decode_intensity_limit(
    mdl: str | Model, context: int, tp: int = 1, kv_dtype: str = "bf16"
) -> float:
    """Decode-step intensity as batch -> infinity: (2N + attention(c)) / tp / (c x KV bytes x shard).

    The weights amortize away and every sequence still reads its own KV: this is the highest
    intensity any batch reaches at ``context``.
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    context = integer("context", context, 1)
    return (
        m.flops_per_token(context)
        / tp
        / (context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp))
    )


def decode_ridge_batch(
    mdl: str | Model,
    chip: str | GPU,
    context: int = 0,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """Smallest batch at which a decode step's FLOP time reaches its byte time (whole step).

    Dense: the weights read are W0 + B r (W0: :func:`lib.perf.roofline.weight_bytes_streamed`; r: the
    lookup row one more sequence reads, d x b), so B* = (W0 / tp / BW) / (F(c) / tp / peak - (c k s + r / tp) / BW), with F(c) FLOPs per
    token at context c, k KV bytes per token and s the shard fraction; math.inf when
    F(c) / tp / peak <= c k s / BW (the KV read alone outpaces the compute: no batch gets there).
    MoE (or a B* past the lookup table's size): bisection over B >= 1 (the weights read grow
    with the batch as more experts are touched).
    """
    m, g = model(mdl), gpu(chip)
    tp = m.check_tp(tp)
    context = integer("context", context, 0, unit="tokens")
    per_seq = (
        m.flops_per_token(context) / tp / g.peak_flops(compute_dtype)
        - context * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp) / g.memory_bandwidth
    )
    if per_seq <= 0:
        return math.inf
    bw = g.memory_bandwidth
    if not m.is_moe:
        row = lookup_bytes_read(m, 1, weight_dtype)
        denom = per_seq - row / tp / bw
        if denom > 0:
            b_star = weight_bytes_streamed(m, weight_dtype) / tp / bw / denom
            if b_star <= m.vocab_size and (
                m.position_embedding != "learned" or b_star <= m.max_position_embeddings
            ):
                return b_star

    def gap(b: float) -> float:
        return b * per_seq - weight_bytes_read_per_step(m, b, weight_dtype) / tp / bw

    return _first_crossing(gap)


def max_context_for_ridge(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
) -> float:
    """Longest context at which some decode batch still reaches the ridge (whole step).

    Solves (2N + a c) / tp = R x c x k x s for c: c = 2N / (tp R k s - a), a = attention FLOPs per
    key, k = KV bytes per token, s = shard fraction, R = ridge; math.inf if tp R k s <= a.
    """
    m, g = model(mdl), gpu(chip)
    tp = m.check_tp(tp)
    denom = tp * g.ridge_point(compute_dtype) * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(
        m, tp
    ) - m.attention_flops_per_token(1)
    return math.inf if denom <= 0 else m.weight_flops_per_token() / denom
