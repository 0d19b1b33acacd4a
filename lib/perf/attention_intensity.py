"""Decode-attention arithmetic intensity for MHA, GQA and MLA (absorbed and materialized).

At decode, each sequence's attention reads that sequence's own KV cache: the bytes grow with
the batch exactly as the FLOPs do, so batching never changes attention's intensity. What sets
it is how many query heads (times query tokens per sequence) share each cached byte.

The cache of one layer is described as ``kv_units`` groups, each holding
``cache_elements_per_unit`` elements per token and read by ``heads_per_unit`` query heads:

* MHA / GQA: units = KV heads, elements = 2 x head_dim (K and V), heads per unit = H / KV heads,
  d_qk = d_v = head_dim.
* MLA absorbed (DeepSeek-V2/V3 decode): one unit, the latent c_KV plus the shared RoPE key
  (512 + 64 = 576 elements), read by all H heads; W_UK is folded into the query (d_qk = 576)
  and W_UV into the output projection (d_v = 512: the heads attend in latent space).
* MLA materialized: the latent is first expanded to per-head K (192) and V (128) in HBM, then
  plain MHA runs over it (H units of 320 elements, one head each).

Per decode step, per GPU, all layers (q = query tokens per sequence, 1 without speculation/MTP):

    FLOPs = batch x layers x heads_gpu x q x context x 2 (d_qk + d_v)
    bytes = batch x layers x (context x units_gpu x elements x b_kv + q x heads_gpu x (d_qk + d_v) x b_act)

and for long context the intensity tends to q x heads_per_unit x 2 (d_qk + d_v) / (elements x b_kv):
q x g for GQA in BF16 (1 for MHA), and 128 x 2 x 1088 / (576 x 2) = 242 FLOP/byte for
DeepSeek-V3's absorbed MLA in BF16. Softmax and rescaling FLOPs (a few per score, on CUDA
cores) are not counted; they are a few percent of the matmul FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer
from lib.perf.roofline import RooflineTime, roofline_time
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model


@dataclass(frozen=True)
class AttentionGeometry:
    """How one layer's KV cache is laid out and read at decode (one GPU's share)."""

    query_heads: int  # query heads on this GPU
    kv_units: int  # distinct cached K/V groups on this GPU
    cache_elements_per_unit: int  # elements cached per token per unit
    d_qk: int  # score dot-product length per head
    d_v: int  # value length per head (output of the attention-weighted sum)

    @property
    def heads_per_unit(self) -> float:
        """Query heads that read each cached unit (the GQA group size; 128 for absorbed MLA)."""
        return self.query_heads / self.kv_units

    @property
    def cache_elements_per_token(self) -> int:
        """Cached elements per token per layer on this GPU."""
        return self.kv_units * self.cache_elements_per_unit


def attention_geometry(mdl: str | Model, tp: int = 1, absorbed: bool = True) -> AttentionGeometry:
    """The decode-attention layout of ``mdl`` on one of ``tp`` tensor-parallel GPUs.

    Query heads split evenly (H / tp). KV units split while tp <= units and are replicated
    past that (each GPU keeps one unit): GQA with tp > KV heads, and MLA's single latent on
    every GPU. ``absorbed`` only matters for MLA models.
    """
    m = model(mdl)
    tp = integer("tp", tp, 1)
    h = m.num_attention_heads
    if h % tp:
        raise ValueError(f"tp={tp} must divide the {h} attention heads of {m.key}")
    if m.is_mla and absorbed:
        units, elements = 1, m.kv_lora_rank + m.qk_rope_head_dim
        d_qk, d_v = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
    elif m.is_mla:
        d_qk, d_v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        units, elements = h, d_qk + d_v
    else:
        units, elements = m.num_kv_heads, 2 * m.head_dim
        d_qk = d_v = m.head_dim
    if tp <= units:
        if units % tp:
            raise ValueError(
                f"tp={tp} must divide the {units} KV units of {m.key} (or be a multiple of it)"
            )
        units_gpu = units // tp
    else:
        if tp % units:
            raise ValueError(
                f"tp={tp} must be a multiple of the {units} KV units of {m.key} (or divide it)"
            )
        units_gpu = 1
    return AttentionGeometry(h // tp, units_gpu, elements, d_qk, d_v)


def decode_attention_flops_bytes(
    mdl: str | Model,
    context: int,
    batch: int = 1,
    query_tokens: int = 1,
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    tp: int = 1,
    absorbed: bool = True,
) -> tuple[float, float]:
    """FLOPs and minimum HBM bytes of one decode step's attention, per GPU, all layers.

    FLOPs = batch x layers x heads x q x context x 2 (d_qk + d_v)  (QK^T and PV matmuls);
    bytes = batch x layers x (context x cache elements x b_kv + q x heads x (d_qk + d_v) x b_act)
    (each sequence reads its own KV once; queries read and outputs written once).
    """
    m = model(mdl)
    context = integer("context", context, 0, unit="tokens")
    batch = integer("batch", batch, 1)
    query_tokens = integer("query_tokens", query_tokens, 1)
    geo = attention_geometry(m, tp, absorbed)
    b_kv, b_act = bytes_per_element(kv_dtype), bytes_per_element(act_dtype)
    per_seq_layer_flops = geo.query_heads * query_tokens * context * 2.0 * (geo.d_qk + geo.d_v)
    per_seq_layer_bytes = (
        context * geo.cache_elements_per_token * b_kv
        + query_tokens * geo.query_heads * (geo.d_qk + geo.d_v) * b_act
    )
    scale = batch * m.num_layers
    return scale * per_seq_layer_flops, scale * per_seq_layer_bytes


def decode_attention_intensity(
    mdl: str | Model,
    context: int | None = None,
    query_tokens: int = 1,
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    tp: int = 1,
    absorbed: bool = True,
) -> float:
    """FLOP per byte of decode attention; independent of batch (it cancels).

    ``context=None`` gives the long-context limit
    I = q x heads_per_unit x 2 (d_qk + d_v) / (cache_elements_per_unit x b_kv):
    q x g for GQA/MHA in BF16, about 242 for DeepSeek-V3's absorbed MLA in BF16.
    An integer context gives the exact ratio including the query/output traffic.
    """
    if context is None:
        query_tokens = integer("query_tokens", query_tokens, 1)
        geo = attention_geometry(mdl, tp, absorbed)
        b_kv = bytes_per_element(kv_dtype)
        bytes_per_element(act_dtype)  # validate
        return (
            query_tokens
            * geo.heads_per_unit
            * 2.0
            * (geo.d_qk + geo.d_v)
            / (geo.cache_elements_per_unit * b_kv)
        )
    flops, nbytes = decode_attention_flops_bytes(
        mdl, context, 1, query_tokens, kv_dtype, act_dtype, tp, absorbed
    )
    return flops / nbytes


def decode_attention_time(
    mdl: str | Model,
    chip: str | GPU,
    context: int,
    batch: int = 1,
    query_tokens: int = 1,
    kv_dtype: str = "bf16",
    tp: int = 1,
    absorbed: bool = True,
    compute_dtype: str = "bf16",
) -> RooflineTime:
    """Roofline bound of one decode step's attention on one GPU: max(FLOPs / peak, bytes / bandwidth)."""
    flops, nbytes = decode_attention_flops_bytes(
        mdl, context, batch, query_tokens, kv_dtype, compute_dtype, tp, absorbed
    )
    return roofline_time(flops, nbytes, gpu(chip), compute_dtype)


def query_tokens_for_ridge(
    mdl: str | Model,
    chip: str | GPU,
    kv_dtype: str = "bf16",
    tp: int = 1,
    absorbed: bool = True,
    compute_dtype: str = "bf16",
) -> float:
    """Query tokens per sequence (speculative / MTP tokens verified together) that bring the
    long-context attention intensity to the ridge: q* = ridge / I(q = 1). Batching cannot do this;
    more queries per sequence can, because they share the same KV read."""
    per_query = decode_attention_intensity(mdl, None, 1, kv_dtype, compute_dtype, tp, absorbed)
    return gpu(chip).ridge_point(compute_dtype) / per_query


def absorbed_extra_flops_factor(mdl: str | Model) -> float:
    """How many times more attention FLOPs absorbed MLA does than materialized MLA per context token:
    (d_qk + d_v) absorbed / (d_qk + d_v) materialized = (576 + 512) / (192 + 128) = 3.4 for DeepSeek-V3.
    Absorption trades FLOPs (cheap at intensity 1) for bytes (the binding resource)."""
    m = model(mdl)
    if not m.is_mla:
        raise ValueError(
            f"{m.key} does not use MLA; absorption applies to MLA models only (e.g. deepseek-v3)"
        )
    a, n = attention_geometry(m, 1, True), attention_geometry(m, 1, False)
    return (a.d_qk + a.d_v) / (n.d_qk + n.d_v)
