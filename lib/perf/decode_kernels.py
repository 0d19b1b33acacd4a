"""One decode step of a dense transformer, kernel by kernel: the FLOP and byte inventory, intensity,
and each kernel's roofline bound.

A decode step runs ``batch`` sequences forward by one token each, every sequence attending to
``context`` cached tokens. Per layer the step launches weight GEMMs (QKV, O, gate/up, down),
one attention kernel and a handful of elementwise kernels (RMSNorm, residual add, rotary, KV
write, activation); once per step an embedding lookup, a final norm, the LM head and sampling.

Counting rules (per GPU of a ``tp``-way tensor-parallel group; SI units: FLOP, bytes, seconds):

* weight GEMM ``[B, K] x [K, N]``: FLOPs ``2 B K N`` (bias: ``2 B N``); bytes
  ``b_w K N`` (weights, bias included) ``+ b_a B (K + N)`` (activations in and out).
  Column-parallel QKV, gate/up and LM head split N by tp; row-parallel O and down split K.
* attention, per layer: FLOPs ``4 B h_loc d_h L`` (scores and values over L keys); bytes
  ``B L kv_loc 2 d_h b_kv`` (the cache) ``+ 2 B h_loc d_h b_a`` (query in, output out).
* elementwise kernels move a few activation rows and do a few FLOPs per element
  (constants below); they are replicated on every TP rank.

The matmul and attention kernels add up to ``batch x Model.flops_per_token(context) / tp``
exactly (while tp <= KV heads); the bytes add up to the weights actually touched (the
embedding table contributes only ``batch`` rows) + KV read and written + activations.
Covers dense GQA/MHA models; MoE and MLA models raise ValueError (see
:func:`attention_decode_intensity` for MLA's attention alone).

This is an inventory table, not a timing model: ``roofline_s`` (max of FLOPs / peak and bytes /
bandwidth at datasheet peaks) is a per-kernel *bound* used to rank kernels. The step time (achieved
bandwidth, fixed per-kernel cost, launch gaps, collectives, host) is
:func:`lib.perf.step.decode_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer
from lib.perf.roofline import RooflineTime, roofline_time
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.search import smallest_true

# FLOPs per element of the elementwise kernels (they never matter for time: all are
# memory-bound by two to three orders of magnitude; counted so the table is complete).
RMSNORM_FLOPS_PER_ELEMENT = 4.0  # square, accumulate, scale by rsqrt, multiply by weight
LAYERNORM_FLOPS_PER_ELEMENT = 7.0  # mean, centre, square, accumulate, scale, weight, bias
ROTARY_FLOPS_PER_ELEMENT = 3.0  # x1 cos - x2 sin: two multiplies and an add per output
SILU_MUL_FLOPS_PER_ELEMENT = 5.0  # neg, exp, add, divide (silu) and the gate multiply
GELU_FLOPS_PER_ELEMENT = 8.0  # tanh approximation
SOFTMAX_FLOPS_PER_ELEMENT = 5.0  # max, subtract, exp, sum, divide
LOGIT_BYTES = 4.0  # logits are produced and sampled in FP32

FUSION_LEVELS = ("none", "partial", "full")
CATEGORIES = ("weight_gemm", "attention", "elementwise", "sampling")
_FIX = {
    "weight_gemm": "batch (or fewer weight bytes: FP8/INT4)",
    "attention": "architecture (GQA/MLA) or KV dtype; context multiplies it",
    "elementwise": "fusion",
    "sampling": "fusion / overlap with the next step",
}


@dataclass(frozen=True)
class KernelCost:
    """One kernel of a decode step, summed over its ``launches`` per step, on one GPU.

    ``weight_bytes``, ``kv_bytes`` and ``activation_bytes`` partition ``bytes``.
    """

    name: str
    category: str
    launches: int
    flops: float
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float
    roofline: RooflineTime

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved (0 for a pure copy)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def roofline_s(self) -> float:
        """Roofline bound at datasheet peaks, seconds: max(FLOPs / peak, bytes / bandwidth).
        A bound for ranking kernels, not a kernel's time (that is lib.perf.step)."""
        return self.roofline.time_s

    @property
    def fix(self) -> str:
        """What can lower this kernel's cost: fusion, batch, or only the architecture."""
        return _FIX[self.category]


@dataclass(frozen=True)
class _Shard:
    q_heads: float
    kv_heads: float
    inter: float
    vocab: float
    tp: int


def _check_model(m: Model) -> None:
    if m.is_moe or m.is_mla:
        raise ValueError(
            f"{m.key} is {'MoE' if m.is_moe else 'MLA'}: the per-kernel decode table covers dense "
            "GQA/MHA models (llama-*, qwen2.5-72b, gpt3-175b); for MLA attention use "
            "attention_decode_intensity"
        )


def _shard(m: Model, tp: int) -> _Shard:
    tp = integer("tp", tp, 1)
    if m.num_attention_heads % tp:
        raise ValueError(
            f"tp={tp} must divide the {m.num_attention_heads} attention heads of {m.key}"
        )
    kvh = m.num_kv_heads
    if tp <= kvh and kvh % tp:
        raise ValueError(f"tp={tp} must divide the {kvh} KV heads of {m.key}")
    if tp > kvh and tp % kvh:
        raise ValueError(
            f"tp={tp} must be a multiple of the {kvh} KV heads of {m.key} (replication)"
        )
    # Past the KV-head count each rank keeps one (replicated) KV head.
    return _Shard(
        m.num_attention_heads / tp,
        max(kvh / tp, 1.0),
        m.intermediate_size / tp,
        m.vocab_size / tp,
        tp,
    )


def _check_inputs(batch: int, context: int, fusion: str) -> tuple[int, int]:
    batch = integer("batch", batch, 1, unit="sequences")
    context = integer("context", context, 1, unit="tokens (keys attended)")
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion must be one of {FUSION_LEVELS}, got {fusion!r}")
    return batch, context


def gemm_shapes(mdl: str | Model, tp: int = 1) -> dict[str, tuple[float, float, float]]:
    """Per-GPU weight GEMMs of one layer and the LM head: name -> (K, N, bias elements).

    QKV: K = d, N = (h + 2 kv) d_h / tp; O: K = h d_h / tp, N = d; gate/up (SwiGLU, one fused
    GEMM): K = d, N = 2 I / tp (GELU MLP: I / tp); down: K = I / tp, N = d; LM head:
    K = d, N = V / tp. Bias elements follow Model.linear_bias ('qkv' or 'all'); a
    row-parallel (O, down) bias is added on one rank in practice and is split evenly here, so
    the ranks sum to the model's parameter count.
    """
    m = model(mdl)
    _check_model(m)
    s = _shard(m, tp)
    d, dh = m.hidden_size, m.head_dim
    q_out, kv_out = s.q_heads * dh, s.kv_heads * dh
    all_bias = m.linear_bias == "all"
    qkv_bias = q_out + 2 * kv_out if m.linear_bias in ("qkv", "all") else 0.0
    up_n = (2 if m.mlp == "swiglu" else 1) * s.inter
    return {
        "qkv_proj": (d, q_out + 2 * kv_out, qkv_bias),
        "o_proj": (q_out, d, d / tp if all_bias else 0.0),
        "gate_up_proj": (d, up_n, s.inter if all_bias and m.mlp != "swiglu" else 0.0),
        "down_proj": (s.inter, d, d / tp if all_bias else 0.0),
        "lm_head": (d, s.vocab, 0.0),
    }


def gemm_intensity(
    k: float,
    n: float,
    batch,
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    bias: float = 0.0,
    out_bytes: float | None = None,
):
    """FLOP per byte of a decode weight GEMM [B, K] x [K, N] (+ bias), as counted in the table.

    (2 B K N + 2 B bias) / (b_w (K N + bias) + B (b_a K + b_out N)). ``batch`` may be a
    number or a numpy array; with b_w = b_a the value approaches B from below.
    """
    if k <= 0 or n <= 0 or bias < 0:
        raise ValueError(f"need k, n > 0 and bias >= 0, got {k}, {n}, {bias}")
    b_w, b_a = bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    b_o = b_a if out_bytes is None else out_bytes
    return (2.0 * batch * k * n + 2.0 * batch * bias) / (
        b_w * (k * n + bias) + batch * (b_a * k + b_o * n)
    )


def _gemm(
    name: str,
    launches: int,
    batch: int,
    k: float,
    n: float,
    bias: float,
    b_w: float,
    b_a: float,
    out_bytes: float | None = None,
) -> tuple:
    flops = launches * (2.0 * batch * k * n + 2.0 * batch * bias)
    weight = launches * b_w * (k * n + bias)
    out = b_a if out_bytes is None else out_bytes
    act = launches * batch * (b_a * k + out * n)
    return name, "weight_gemm", launches, flops, weight, 0.0, act


def decode_step_kernels(
    mdl: str | Model,
    chip: str | GPU,
    batch: int = 1,
    context: int = 4096,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    fusion: str = "none",
) -> list[KernelCost]:
    """The kernels of one decode step on one of ``tp`` GPUs, each summed over its launches.

    ``fusion``: 'none' (every op its own kernel: 7 elementwise kernels per layer),
    'partial' (residual add fused into the following RMSNorm, rotary fused with the KV write:
    4 per layer, as vLLM ships), 'full' (all elementwise work folded into GEMM/attention
    prologues and epilogues: their intermediate activation round trips vanish).
    Norm and embedding weights are read in ``act_dtype``; GEMM weights (LM head included) in
    ``weight_dtype``; the cache in ``kv_dtype``. The roofline bound uses ``compute_dtype`` peaks.
    """
    m, g = model(mdl), gpu(chip)
    _check_model(m)
    batch, context = _check_inputs(batch, context, fusion)
    s = _shard(m, tp)
    b_w, b_kv, b_a = (bytes_per_element(x) for x in (weight_dtype, kv_dtype, act_dtype))
    g.peak_flops(compute_dtype)  # raises a clear ValueError if the chip lacks that unit
    L, d, dh, B = m.num_layers, m.hidden_size, m.head_dim, batch
    q_el, kv_el = s.q_heads * dh, s.kv_heads * dh
    layernorm = m.norm == "layernorm"
    norm_fpe = LAYERNORM_FLOPS_PER_ELEMENT if layernorm else RMSNORM_FLOPS_PER_ELEMENT
    norm_params = d * (2 if layernorm else 1)
    rope = m.position_embedding == "rope"
    shapes = gemm_shapes(m, tp)
    rows: list[tuple] = []

    # once per step: embedding rows (token, and learned position if any), added together
    learned = m.position_embedding == "learned"
    emb_rows = 2 if learned else 1
    rows.append(
        (
            "embedding",
            "elementwise",
            1,
            B * d * (1 if learned else 0),
            b_a * B * d * emb_rows,
            0.0,
            b_a * B * d,
        )
    )

    def norm(name: str, launches: int, adds: int) -> tuple:
        # a norm reads x and its weight and writes y; a fused add+norm also reads the residual
        # branch and writes the updated residual stream (2 more activation rows per add)
        flops = B * d * (launches * norm_fpe + adds)
        act = b_a * B * d * (2 * launches + 2 * adds)
        return name, "elementwise", launches, flops, launches * b_a * norm_params, 0.0, act

    kv_new = B * 2 * kv_el  # new K and V elements written to the cache per layer
    rotary_act = b_a * B * (q_el + kv_el) * 2  # read and write q and k
    rotary_flops = ROTARY_FLOPS_PER_ELEMENT * B * (q_el + kv_el) if rope else 0.0
    if m.mlp == "swiglu":
        act_flops, act_bytes = SILU_MUL_FLOPS_PER_ELEMENT * B * s.inter, b_a * B * 3 * s.inter
    else:
        act_flops, act_bytes = GELU_FLOPS_PER_ELEMENT * B * s.inter, b_a * B * 2 * s.inter
    norm_name = "layernorm" if layernorm else "rmsnorm"

    if fusion == "none":
        # 2L + 1 norms (two per layer and the final one), 2L residual adds, each its own kernel
        rows.append(norm(norm_name, 2 * L + 1, 0))
        if rope:
            rows.append(("rotary", "elementwise", L, L * rotary_flops, 0.0, 0.0, L * rotary_act))
        # the KV write reads k and v from the QKV output and stores them in the cache
        rows.append(
            ("kv_cache_write", "elementwise", L, 0.0, 0.0, L * b_kv * kv_new, L * b_a * kv_new)
        )
        rows.append(
            ("residual_add", "elementwise", 2 * L, 2 * L * B * d, 0.0, 0.0, 2 * L * 3 * b_a * B * d)
        )
        rows.append(("activation", "elementwise", L, L * act_flops, 0.0, 0.0, L * act_bytes))
    elif fusion == "partial":
        # every residual add rides in the next norm: 2L + 1 norm kernels carrying 2L adds
        rows.append(norm(f"fused_add_{norm_name}", 2 * L + 1, 2 * L))
        # rotary fused with the KV write: q, k, v read once, q written back, k and v cached
        if rope:
            rows.append(
                (
                    "rotary_kv_write",
                    "elementwise",
                    L,
                    L * rotary_flops,
                    0.0,
                    L * b_kv * kv_new,
                    L * b_a * B * (2 * q_el + 2 * kv_el),
                )
            )
        else:
            rows.append(
                ("kv_cache_write", "elementwise", L, 0.0, 0.0, L * b_kv * kv_new, L * b_a * kv_new)
            )
        rows.append(("activation", "elementwise", L, L * act_flops, 0.0, 0.0, L * act_bytes))
    else:
        # everything folds into GEMM/attention prologues and epilogues: no launches of its own;
        # the norm scales are still read, the new K/V still stored, and each residual add
        # still reads and writes the residual stream once (in the O/down epilogue)
        flops = B * d * ((2 * L + 1) * norm_fpe + 2 * L) + L * (rotary_flops + act_flops)
        rows.append(
            (
                "fused_into_neighbours",
                "elementwise",
                0,
                flops,
                (2 * L + 1) * b_a * norm_params,
                L * b_kv * kv_new,
                2 * L * 2 * b_a * B * d,
            )
        )

    # attention over `context` keys, per layer
    att_flops = L * 4.0 * B * s.q_heads * dh * context
    att_kv = L * B * context * 2 * kv_el * b_kv
    att_act = L * 2 * b_a * B * q_el
    rows.append(("attention", "attention", L, att_flops, 0.0, att_kv, att_act))

    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        k, n, bias = shapes[name]
        rows.append(_gemm(name, L, B, k, n, bias, b_w, b_a))

    # once per step: LM head (FP32 logits) and sampling over the full vocabulary
    k, n, bias = shapes["lm_head"]
    rows.append(_gemm("lm_head", 1, B, k, n, bias, b_w, b_a, out_bytes=LOGIT_BYTES))
    vocab = m.vocab_size
    rows.append(
        (
            "sampling",
            "sampling",
            1,
            SOFTMAX_FLOPS_PER_ELEMENT * B * vocab,
            0.0,
            0.0,
            LOGIT_BYTES * B * vocab + 8.0 * B,
        )
    )

    out = []
    for name, cat, launches, flops, wb, kb, ab in rows:
        out.append(
            KernelCost(
                name,
                cat,
                launches,
                flops,
                wb,
                kb,
                ab,
                roofline_time(flops, wb + kb + ab, g, compute_dtype),
            )
        )
    return out


def kernels_per_layer(fusion: str, mdl: str | Model = "llama-3.1-8b") -> int:
    """Kernel launches in one decoder layer: 5 compute kernels (4 GEMMs + attention) plus the
    elementwise ones left by ``fusion`` (none: 7 with rotary, partial: 4, full: 0)."""
    m = model(mdl)
    _check_model(m)
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion must be one of {FUSION_LEVELS}, got {fusion!r}")
    rope = m.position_embedding == "rope"
    return 5 + {"none": 6 + (1 if rope else 0), "partial": 4, "full": 0}[fusion]


def step_totals(kernels: list[KernelCost]) -> dict[str, float]:
    """Sums over a kernel table: flops, bytes, weight/kv/activation bytes, launches, and
    ``roofline_s``, the sum of the kernels' roofline bounds (a floor for the step, not its time:
    the step time is :func:`lib.perf.step.decode_step`)."""
    if not kernels:
        raise ValueError("kernels must be a non-empty list of KernelCost")
    return {
        "flops": sum(k.flops for k in kernels),
        "bytes": sum(k.bytes for k in kernels),
        "weight_bytes": sum(k.weight_bytes for k in kernels),
        "kv_bytes": sum(k.kv_bytes for k in kernels),
        "activation_bytes": sum(k.activation_bytes for k in kernels),
        "roofline_s": sum(k.roofline_s for k in kernels),
        "launches": sum(k.launches for k in kernels),
    }


def attention_decode_intensity(
    mdl: str | Model,
    context: int = 4096,
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    absorbed: bool = True,
    tp: int = 1,
) -> float:
    """FLOP per byte of one decode attention kernel on one of ``tp`` GPUs, independent of batch
    (each sequence reads its own cache).

    GQA/MHA with h query and kv KV heads per GPU (kv = max(KV heads / tp, 1): past the KV-head
    count each rank keeps a replicated head): 4 h d_h L / (2 kv d_h L b_kv + 2 h d_h b_a), which
    tends to 2 g / b_kv for long contexts (g = h / kv, the group size per GPU).
    MLA (DeepSeek-V2/V3), absorbed: each cached latent of (r + r_rope) elements serves all h heads
    of the rank (the latent is replicated across ranks) with 2 h (r + r_rope) score and 2 h r value
    FLOPs: ~ 2 h (2 r + r_rope) / ((r + r_rope) b_kv). ``absorbed=False`` uses MLA's
    materialized per-head K and V (d_qk = 192, d_v = 128).
    """
    m = model(mdl)
    context = integer("context", context, 1, unit="tokens")
    b_kv, b_a = bytes_per_element(kv_dtype), bytes_per_element(act_dtype)
    if m.is_mla:
        tp = integer("tp", tp, 1)
        if m.num_attention_heads % tp:
            raise ValueError(
                f"tp={tp} must divide the {m.num_attention_heads} attention heads of {m.key}"
            )
        h = m.num_attention_heads / tp
        r, rr = m.kv_lora_rank, m.qk_rope_head_dim
        if absorbed:
            flops = 2.0 * h * (r + rr) * context + 2.0 * h * r * context
            nbytes = (r + rr) * context * b_kv + b_a * h * ((r + rr) + r)
        else:
            dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
            flops = 2.0 * h * (dqk + dv) * context
            nbytes = h * (dqk + dv) * context * b_kv + b_a * h * (dqk + dv)
        return flops / nbytes
    s = _shard(m, tp)
    dh = m.head_dim
    flops = 4.0 * s.q_heads * dh * context
    nbytes = 2 * s.kv_heads * dh * context * b_kv + 2 * b_a * s.q_heads * dh
    return flops / nbytes


def gemm_attention_crossover_batch(
    k: float,
    n: float,
    attention_intensity: float,
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    out_bytes: float | None = None,
) -> float:
    """Batch B* at which a weight GEMM's intensity equals attention's (FLOP/byte).

    2 B K N / (b_w K N + B (b_a K + b_o N)) = A  =>  B* = A b_w K N / (2 K N - A (b_a K + b_o N)),
    b_o the output bytes per element (b_a; FP32 logits for the LM head). Below B* attention is
    the more intense kernel, above it the GEMM is. Raises ValueError when the GEMM can never
    reach A (2 K N <= A (b_a K + b_o N)). Biases are ignored (they move B* by < 0.1%).
    """
    if k <= 0 or n <= 0:
        raise ValueError(f"k and n must be > 0, got {k}, {n}")
    if not attention_intensity > 0:
        raise ValueError(f"attention_intensity must be > 0 FLOP/byte, got {attention_intensity}")
    b_w, b_a = bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    b_o = b_a if out_bytes is None else out_bytes
    denom = 2.0 * k * n - attention_intensity * (b_a * k + b_o * n)
    if denom <= 0:
        raise ValueError(f"a {k:g}x{n:g} GEMM never reaches {attention_intensity:.3g} FLOP/byte")
    return attention_intensity * b_w * k * n / denom


def kernel_table(kernels: list[KernelCost]) -> list[dict[str, float | str]]:
    """Rows for display: name, category, launches, FLOPs, bytes, intensity, roofline bound and
    its share of the summed bounds, fix."""
    total = step_totals(kernels)["roofline_s"]
    return [
        {
            "name": k.name,
            "category": k.category,
            "launches": k.launches,
            "flops": k.flops,
            "bytes": k.bytes,
            "intensity": k.intensity,
            "roofline_s": k.roofline_s,
            "share": k.roofline_s / total if total else 0.0,
            "fix": k.fix,
        }
        for k in kernels
    ]


def time_crossover_batch(
    mdl: str | Model,
    chip: str | GPU,
    gemm: str,
    context: int = 4096,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    max_batch: int = 1 << 16,
) -> int | None:
    """Smallest batch at which the attention kernel's roofline bound reaches ``gemm``'s.

    Both bounds are summed over one step (the per-layer kernels over all layers, the LM head
    once). Attention time grows with batch x context; a memory-bound GEMM's barely moves, so
    this flip depends on context (unlike the intensity flip). Bisection over integer batches
    on the full kernel table; None if it does not happen by ``max_batch``.
    """
    names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
    if gemm not in names:
        raise ValueError(f"gemm must be one of {names}, got {gemm!r}")

    def gap(b: int) -> float:
        ks = {
            k.name: k
            for k in decode_step_kernels(
                mdl, chip, b, context, tp, weight_dtype, kv_dtype, "bf16", compute_dtype
            )
        }
        return ks["attention"].roofline_s - ks[gemm].roofline_s  # both summed over one whole step

    if gap(max_batch) < 0:
        return None
    if gap(1) >= 0:
        return 1
    return smallest_true(lambda b: gap(b) >= 0, 2, max_batch - 1)  # gap(1) < 0 <= gap(max_batch)
