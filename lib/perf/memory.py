"""Serving memory on a GPU: the budget around the KV cache (THE KV capacity of the book), the
block ceiling it implies, and where parallelism puts the KV cache.

Three parts, all per GPU and in SI units (bytes, seconds) unless a name says otherwise:

1. **Components.** Each thing that takes GPU memory while serving is a function with its
   formula: weights, the activation peak of one forward pass, the sampler's logits buffers,
   CUDA-graph pools, NCCL buffers, the non-torch memory an engine measures, the CUDA context and
   allocator fragmentation. Facts and assumptions come from ``data/assumptions.yaml`` (``serving_memory``).
2. **Budget.** :func:`memory_budget` assembles them the way vLLM sizes its KV cache:
   ``KV = utilization x visible memory - (what the engine measures or estimates)``, while the
   CUDA context, fragmentation and (in older engines) the CUDA graphs must fit in the
   ``1 - utilization`` headroom. The KV bytes become a block count and a ceiling on sequences.
3. **Placement.** :func:`kv_placement` says how many bytes of each token's KV a GPU stores under
   tensor, pipeline and decode-context parallelism or data-parallel attention, and how many
   duplicate copies exist (tensor parallelism past the KV-head count replicates heads; MLA's
   single latent is replicated on every TP rank). :func:`fleet` turns that into tokens and
   sequences for ``n`` GPUs.

The context lengths at which a replica stops coping live in :mod:`lib.kvcache.long_context`.
:func:`naive_kv_bytes` is the naive one-line answer a notebook contrasts with the budget, never
a capacity.

GiB = 2**30 bytes and GB = 1e9 bytes are kept apart; the engine's own logs use GiB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from lib.inputs import fraction, integer, real
from lib.perf.roofline import kv_shard_fraction
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.units import GiB

_SECTIONS = ("engine_defaults", "measured", "assumptions")

# ---- facts ----------------------------------------------------------------------------------


def _doc() -> dict:
    return assumptions.section("serving_memory")


def fact(name: str, given=None):
    """``given`` when it is not None, else the value of ``name`` in the ``serving_memory`` section of
    ``data/assumptions.yaml`` (engine defaults, measurements, assumptions): the one place a
    notebook parameter left None takes its data value."""
    if given is not None:
        return given
    doc = _doc()
    for section in _SECTIONS:
        if name in doc.get(section, {}):
            return doc[section][name]["value"]
    known = sorted(k for s in _SECTIONS for k in doc.get(s, {}))
    raise ValueError(f"unknown serving-memory fact {name!r}; known: {', '.join(known)}")


def default_memory_utilization(memory_utilization: float | None = None) -> float:
    """``memory_utilization``, or (None) vLLM's default ``gpu_memory_utilization`` as
    ``data/assumptions.yaml`` (``serving_memory``) records it (``engine_defaults.gpu_memory_utilization``)."""
    return fact("gpu_memory_utilization") if memory_utilization is None else memory_utilization


def fact_range(name: str) -> tuple[float, float]:
    """(low, high) of a fact that states a range; (value, value) when it states none."""
    doc = _doc()
    for section in _SECTIONS:
        entry = doc.get(section, {}).get(name)
        if entry is not None:
            v = entry["value"]
            return entry.get("low", v), entry.get("high", v)
    fact(name)  # raises with the list of known names
    raise AssertionError  # pragma: no cover


def fact_source(name: str) -> str:
    """The source texts behind a fact (or 'assumption: ...' when it is one)."""
    doc = _doc()
    for section in _SECTIONS:
        entry = doc.get(section, {}).get(name)
        if entry is not None:
            refs = [doc["sources"].get(s, s) for s in entry.get("src", [])]
            if "assumption" in entry:
                refs.insert(0, "assumption: " + " ".join(str(entry["assumption"]).split()))
            return "; ".join(refs) or "no source listed"
    fact(name)
    raise AssertionError  # pragma: no cover


# ---- validation ---------------------------------------------------------------------------


def _check_pp(m: Model, pp: int) -> int:
    pp = integer("pp", pp, 1)
    if pp > m.num_layers:
        raise ValueError(f"pp={pp} cannot exceed the {m.num_layers} layers of {m.key}")
    return pp


def _stage_layer_fraction(m: Model, pp: int) -> float:
    """Share of the layers on the most loaded pipeline stage: ceil(layers / pp) / layers."""
    return math.ceil(m.num_layers / pp) / m.num_layers


# ---- 1. components --------------------------------------------------------------------------


def visible_memory_bytes(chip: str | GPU) -> float:
    """Total device memory the driver reports (what ``torch.cuda.mem_get_info`` calls total), bytes.

    Engines multiply this, not the datasheet capacity, by ``gpu_memory_utilization``. Uses the
    logged figure from ``data/assumptions.yaml`` (``serving_memory``) where one exists (H100 SXM 79.19 GiB, H200
    139.72 GiB), else the datasheet capacity of ``data/hardware.yaml`` (decimal GB).
    """
    g = gpu(chip)
    table = _doc()["visible_memory_gib"]
    if g.key in table:
        return float(table[g.key]["value"]) * GiB
    return g.memory_bytes


def visible_memory_source(chip: str | GPU) -> str:
    """Where :func:`visible_memory_bytes` comes from for ``chip``: a driver log or the datasheet."""
    g = gpu(chip)
    table = _doc()["visible_memory_gib"]
    if g.key in table:
        return "driver-reported total in vLLM logs: " + "; ".join(
            _doc()["sources"][s] for s in table[g.key]["src"]
        )
    return "datasheet capacity (no driver-reported total on file for this GPU)"


def kv_bytes_per_token_formula(
    num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: float
) -> float:
    """KV bytes per token from four config numbers: 2 (K and V) x layers x KV heads x head_dim x bytes.

    Feeding ``num_attention_heads`` instead of ``num_key_value_heads`` is the classic mistake:
    for a GQA model it overstates the cache by the group size (8x for Llama 3.1 70B).
    """
    num_layers = integer("num_layers", num_layers, 1)
    num_kv_heads = integer("num_kv_heads", num_kv_heads, 1)
    head_dim = integer("head_dim", head_dim, 1)
    real("bytes_per_value", bytes_per_value, 0, low_open=True)
    return 2.0 * num_layers * num_kv_heads * head_dim * bytes_per_value


def kv_bytes_per_sequence(mdl: str | Model, context: int, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes of one sequence of ``context`` tokens, whole model, one copy: context x bytes/token."""
    m = model(mdl)
    context = integer("context", context, 1)
    return context * m.kv_bytes_per_token(kv_dtype)


def weight_bytes_per_gpu(
    mdl: str | Model,
    tp: int = 1,
    weight_dtype: str = "bf16",
    pp: int = 1,
    dp_attention: bool = False,
) -> float:
    """Weight bytes on each GPU of a replica of ``tp x pp`` GPUs, worst pipeline stage.

    Tensor/pipeline parallel: W b / (tp pp) (stage share taken as 1/pp). With data-parallel
    attention the attention weights are replicated on every rank of the stage and only the
    rest (FFN / experts, embeddings, head) is split: A b / pp + (W - A) b / (tp pp).
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    pp = _check_pp(m, pp)
    b = bytes_per_element(weight_dtype)
    total = m.params_total * b
    if not dp_attention:
        return total / (tp * pp)
    attn = m.attention_params_per_layer() * m.num_layers * b
    return attn / pp + (total - attn) / (tp * pp)


def _mlp_inner_per_token(m: Model) -> int:
    """FFN hidden width one token goes through: dense intermediate, or (top-k + shared) experts."""
    dense = m.intermediate_size
    if not m.is_moe:
        return dense
    routed = (m.experts_per_token + m.shared_experts) * m.expert_intermediate_size
    return max(dense if m.first_dense_layers else 0, routed)


def activation_peak_bytes(
    mdl: str | Model, tokens: int, tp: int = 1, act_dtype: str = "bf16"
) -> float:
    """Peak live activations of one forward pass over ``tokens`` tokens on one of ``tp`` GPUs, bytes.

    Activations are freed layer by layer, so the peak is the widest point inside one layer:
    b x T x (2 d + max(attention live width, FFN live width)), with 2 d for the residual and the
    normed input, attention = (q + 2 kv) / tp head widths + its output, FFN = gate+up (2 I / tp)
    plus the activated product (I / tp). MLA adds the shared latent and the up-projected K/V;
    MoE uses (top-k + shared) x expert width. An estimate of what the engine measures by a
    profiling forward pass at ``max_num_batched_tokens``; it excludes the sampler (see
    :func:`sampler_bytes`).
    """
    m = model(mdl)
    tokens = integer("tokens", tokens, 1)
    tp = m.check_tp(tp)
    b = bytes_per_element(act_dtype)
    d = m.hidden_size
    heads = m.num_attention_heads // tp
    if m.is_mla:
        q = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        up = heads * (m.qk_nope_head_dim + m.v_head_dim)
        attn = q + latent + up + heads * m.v_head_dim
    else:
        kv_heads = m.kv_heads_per_rank(tp)
        attn = (heads + 2 * kv_heads) * m.head_dim + heads * m.head_dim
    ffn = 3 * _mlp_inner_per_token(m) / tp
    return b * tokens * (2 * d + max(attn, ffn))


def logits_bytes(mdl: str | Model, rows: int, dtype: str = "fp32") -> float:
    """Logits of ``rows`` sampled positions over the full vocabulary: rows x vocab x bytes.

    The LM head is vocabulary-parallel, but the logits are gathered to the rank that samples,
    which holds all of them (vLLM upcasts to FP32 for sampling).
    """
    m = model(mdl)
    rows = integer("rows", rows, 1)
    return rows * m.vocab_size * bytes_per_element(dtype)


def sampler_bytes(mdl: str | Model, rows: int, bytes_per_entry: float | None = None) -> float:
    """Sampler working set: rows x vocab x bytes per entry (default 8: FP32 logits + FP32 probs).

    A sort-based top-p/top-k adds 12 bytes per entry (FP32 values + int64 indices). ``rows`` is
    max_num_seqs for decode, or every prompt token when prompt logprobs are requested.
    """
    m = model(mdl)
    rows = integer("rows", rows, 1)
    per = fact("sampler_bytes_per_vocab_entry") if bytes_per_entry is None else bytes_per_entry
    return rows * m.vocab_size * real("bytes_per_entry", per, 0, low_open=True)


def cuda_graph_bytes(
    mdl: str | Model,
    tp: int = 1,
    capture_sizes: int | None = None,
    max_capture_size: int | None = None,
    bytes_per_capture: float | None = None,
    act_dtype: str = "bf16",
) -> float:
    """CUDA-graph memory on one GPU: one shared pool plus a remainder per captured size, bytes.

    pool = activation peak of the largest captured batch; total = pool + sizes x per-capture
    bytes. Defaults: 51 sizes up to 512 tokens (vLLM's capture list), 20 MiB per size (an
    assumption calibrated on logged captures, range 6-28 MiB).
    """
    n = fact("cuda_graph_capture_sizes") if capture_sizes is None else capture_sizes
    top = fact("cuda_graph_max_capture_size") if max_capture_size is None else max_capture_size
    per = fact("cuda_graph_bytes_per_capture") if bytes_per_capture is None else bytes_per_capture
    n = integer("capture_sizes", n, 1)
    top = integer("max_capture_size", top, 1)
    real("bytes_per_capture", per, 0)
    return activation_peak_bytes(mdl, top, tp, act_dtype) + n * per


def nccl_buffer_bytes(
    chip: str | GPU,
    tp: int,
    channels: int | None = None,
    connections_per_channel: int | None = None,
    nvls: bool | None = None,
) -> float:
    """NCCL's own device buffers on one rank of a ``tp``-GPU communicator, bytes.

    channels x connections x (Simple 4 MiB + LL128 4.69 MiB + LL 0.5 MiB) for ring/tree, plus the
    NVLink-SHARP buffers (288 MiB per rank, logged on 8x H200) when NVLS is on: by default on
    NVSwitch Hopper/Blackwell parts above 2 ranks. 0 for one GPU. A floor: NCCL also registers
    user buffers and allocates per collective size, which is why engines measure instead.
    """
    g = gpu(chip)
    tp = integer("tp", tp, 1)
    if tp == 1:
        return 0.0
    ch = fact("nccl_channels") if channels is None else channels
    conn = (
        fact("nccl_connections_per_channel")
        if connections_per_channel is None
        else connections_per_channel
    )
    ch = integer("channels", ch, 1)
    conn = integer("connections_per_channel", conn, 1)
    per_connection = (
        fact("nccl_buffsize_bytes")
        + fact("nccl_ll128_buffsize_bytes")
        + fact("nccl_ll_buffsize_bytes")
    )
    use_nvls = (g.key in fact("nvls_capable_gpus") and tp > 2) if nvls is None else bool(nvls)
    return ch * conn * per_connection + (fact("nvls_per_rank_bytes") if use_nvls else 0.0)


def non_torch_bytes(tp: int) -> float:
    """Non-torch memory an engine instance adds per GPU (NCCL, custom all-reduce, library workspaces).

    From two vLLM measurements: 0.16 GiB at TP1 (H100) and 5.21-5.68 GiB (mid 5.45) at TP8 on
    8x H200 with NVLS; linear in tp between them and flat beyond 8 (an assumption: per-rank
    buffers depend on the local peers, not the group size).
    """
    tp = integer("tp", tp, 1)
    lo, hi = fact("non_torch_tp1_gib"), fact("non_torch_tp8_gib")
    return (lo + (hi - lo) * min(tp - 1, 7) / 7) * GiB


def cuda_context_bytes() -> float:
    """CUDA context per GPU (driver state and loaded kernels) before the engine allocates, bytes."""
    return float(fact("cuda_context_bytes"))


def fragmentation_bytes(transient_bytes: float, fraction: float | None = None) -> float:
    """Reserved-but-unallocated memory at peak: fraction x transient working set, bytes.

    The engine sizes the KV cache from the peak of *allocated* bytes; the caching allocator's
    *reserved* peak is larger by this much, and it comes out of the headroom.
    """
    real("transient_bytes", transient_bytes, 0)
    f = fact("fragmentation_fraction") if fraction is None else fraction
    return transient_bytes * real("fragmentation_fraction", f, 0, 1)


# ---- 2. placement -------------------------------------------------------------------------


@dataclass(frozen=True)
class KVPlacement:
    """Where one token's KV cache lives for one model and parallel layout.

    ``bytes_per_token_per_gpu``: bytes of each served token on one GPU. ``gpus_per_token``: GPUs
    of a replica holding part of every token of a sequence (tp x pp; pp for data-parallel
    attention, whose ranks serve different sequences). ``copies``: full copies of each token's
    KV that exist (1 = no duplication).
    """

    model_key: str
    kv_dtype: str
    tp: int
    pp: int
    dcp: int
    dp_attention: bool
    bytes_per_token: float
    bytes_per_token_per_gpu: float
    gpus_per_token: int
    copies: float

    @property
    def wasted_fraction(self) -> float:
        """Share of every GPU's KV bytes that duplicates another GPU's: 1 - 1 / copies."""
        return 1.0 - 1.0 / self.copies


def max_dcp(mdl: str | Model, tp: int) -> int:
    """Largest decode-context-parallel degree that removes duplication: tp x shard fraction.

    GQA: tp / KV heads when tp exceeds the KV heads, else 1; MLA: tp (the latent is on every rank).
    """
    m = model(mdl)
    return max(1, round(tp * kv_shard_fraction(m, tp)))


def kv_placement(
    mdl: str | Model,
    tp: int = 1,
    kv_dtype: str = "bf16",
    pp: int = 1,
    dcp: int = 1,
    dp_attention: bool = False,
) -> KVPlacement:
    """KV bytes per token per GPU and duplication for a layout.

    Tensor parallel: bytes x s / dcp x stage share, with s = :func:`lib.perf.roofline.kv_shard_fraction`
    (1/tp up to the KV-head count, then 1/KV heads: heads replicated; 1 for MLA). The copies are
    tp x s / dcp; decode context parallelism splits the replicated ranks' tokens and must divide
    tp x s. Data-parallel attention: each rank keeps whole tokens of its own sequences (copies 1).
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    pp = _check_pp(m, pp)
    dcp = integer("dcp", dcp, 1)
    per_token = m.kv_bytes_per_token(kv_dtype)
    stage = _stage_layer_fraction(m, pp)
    if dp_attention:
        if dcp != 1:
            raise ValueError(
                "dcp must be 1 with data-parallel attention (each rank holds whole sequences)"
            )
        return KVPlacement(m.key, kv_dtype, tp, pp, 1, True, per_token, per_token * stage, pp, 1.0)
    s = kv_shard_fraction(m, tp)
    replication = max_dcp(m, tp)
    if replication % dcp:
        raise ValueError(
            f"dcp={dcp} must divide the {replication} duplicate copies {m.key} has at tp={tp} "
            f"(allowed: divisors of {replication})"
        )
    return KVPlacement(
        m.key,
        kv_dtype,
        tp,
        pp,
        dcp,
        False,
        per_token,
        per_token * s / dcp * stage,
        tp * pp,
        replication / dcp,
    )


# ---- 3. budget ----------------------------------------------------------------------------


COMPONENTS = (
    "cuda_context",
    "weights",
    "activations",
    "sampler",
    "attention_workspace",
    "non_torch",
    "cuda_graphs",
    "fragmentation",
)
MEASURED, ESTIMATED, HEADROOM = "measured", "estimated", "headroom"


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as a serving engine lays it out, bytes.

    ``components``: every non-KV consumer. ``engine_view``: how a vLLM-style engine accounts for
    each: ``measured`` (profiled at startup and subtracted), ``estimated`` (predicted and
    subtracted) or ``headroom`` (not subtracted: it must fit in the 1 - utilization slack).
    """

    model_key: str
    gpu_key: str
    tp: int
    pp: int
    dcp: int
    dp_attention: bool
    weight_dtype: str
    kv_dtype: str
    visible_bytes: float
    gpu_memory_utilization: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_bytes_per_token_per_gpu: float
    components: Mapping[str, float] = field(default_factory=dict)
    engine_view: Mapping[str, str] = field(default_factory=dict)

    @property
    def requested_bytes(self) -> float:
        """utilization x visible memory: what the engine lets itself use."""
        return self.gpu_memory_utilization * self.visible_bytes

    @property
    def subtracted_bytes(self) -> float:
        """Non-KV bytes the engine subtracts before sizing the KV cache (measured + estimated)."""
        return sum(v for k, v in self.components.items() if self.engine_view[k] != HEADROOM)

    @property
    def kv_cache_bytes(self) -> float:
        """requested - subtracted: the KV pool the engine allocates."""
        return self.requested_bytes - self.subtracted_bytes

    @property
    def headroom_bytes(self) -> float:
        """(1 - utilization) x visible memory."""
        return self.visible_bytes - self.requested_bytes

    @property
    def headroom_demand_bytes(self) -> float:
        """What must fit in the headroom: the components the engine does not subtract."""
        return sum(v for k, v in self.components.items() if self.engine_view[k] == HEADROOM)

    @property
    def headroom_margin_bytes(self) -> float:
        """headroom - demand; negative means the GPU runs out of memory at peak."""
        return self.headroom_bytes - self.headroom_demand_bytes

    @property
    def peak_bytes(self) -> float:
        """Everything at once: all components plus the KV pool."""
        return sum(self.components.values()) + self.kv_cache_bytes

    @property
    def block_bytes(self) -> float:
        """One KV block on this GPU: block_size x bytes per token per GPU."""
        return self.block_size * self.kv_bytes_per_token_per_gpu

    @property
    def num_blocks(self) -> int:
        """floor(KV pool / block bytes)."""
        return max(0, int(self.kv_cache_bytes // self.block_bytes))

    @property
    def token_capacity(self) -> int:
        """Tokens the pool holds (this GPU's slice of each): blocks x block size."""
        return self.num_blocks * self.block_size

    def blocks_per_sequence(self, context: int) -> int:
        """ceil(context / block size): a partly filled last block still takes a whole block."""
        context = integer("context", context, 1)
        return math.ceil(context / self.block_size)

    def max_concurrency(self, context: int) -> float:
        """vLLM's 'maximum concurrency for context tokens per request': blocks x size / context."""
        context = integer("context", context, 1)
        return self.token_capacity / context

    def max_sequences(self, context: int) -> int:
        """Sequences of ``context`` tokens that fit at once: min(max_num_seqs, blocks // blocks each).

        A ceiling: it assumes every sequence at full length, no prefix sharing, and no blocks
        held back by the scheduler.
        """
        return min(self.max_num_seqs, self.num_blocks // self.blocks_per_sequence(context))

    def table(self) -> list[tuple[str, float, str]]:
        """(component, bytes, engine view) rows, KV last."""
        rows = [(k, v, self.engine_view[k]) for k, v in self.components.items()]
        return rows + [("kv_cache", self.kv_cache_bytes, "remainder")]


def default_batch_limits(chip: str | GPU) -> tuple[int, int]:
    """vLLM API-server defaults (``engine_defaults`` in ``data/assumptions.yaml`` (``serving_memory``)):
    max_num_batched_tokens / max_num_seqs on GPUs of at least large_gpu_memory_gib other than
    A100, else max_num_batched_tokens_small_gpu / max_num_seqs_small_gpu."""
    chip = gpu(chip)
    if visible_memory_bytes(chip) >= fact("large_gpu_memory_gib") * GiB and not chip.key.startswith("a100"):
        return fact("max_num_batched_tokens"), fact("max_num_seqs")
    return fact("max_num_batched_tokens_small_gpu"), fact("max_num_seqs_small_gpu")


def default_block_size(mdl: str | Model) -> int:
    """vLLM's KV block size for ``mdl``: 16 tokens, 64 for MLA models (FlashMLA), from
    ``data/assumptions.yaml`` (``serving_memory``)."""
    return fact("mla_block_size_flashmla") if model(mdl).is_mla else fact("block_size")


def memory_budget(
    mdl: str | Model,
    chip: str | GPU,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int | None = None,
    pp: int = 1,
    dcp: int = 1,
    dp_attention: bool = False,
    cuda_graphs: bool = True,
    engine_counts_cuda_graphs: bool = True,
    cuda_graph_bytes_override: float | None = None,
    non_torch_bytes_override: float | None = None,
    cuda_context_bytes_override: float | None = None,
    fragmentation_fraction: float | None = None,
    sampler_rows: int | None = None,
    sampler_bytes_per_entry: float | None = None,
    attention_workspace_bytes: float | None = None,
    activation_bytes_override: float | None = None,
    act_dtype: str = "bf16",
) -> MemoryBudget:
    """Serving memory budget of one GPU, laid out the way vLLM sizes its KV cache.

    KV = u x M - (W + A + S + w + N + G), where M is the driver-visible memory, u the
    utilization (0.9), W weights per GPU, A the activation peak at ``max_num_batched_tokens``,
    S the sampler at ``sampler_rows`` (default max_num_seqs) rows, w the attention workspace,
    N the non-torch memory (NCCL ...), G the CUDA graphs when the engine estimates them
    (logged as vLLM's default since v0.21.0, a disputed default; G itself is
    :func:`cuda_graph_bytes`, our model). The CUDA context C, fragmentation F (and G when not estimated) must fit in
    (1 - u) x M. Blocks = floor(KV / (block size x KV bytes per token per GPU)). Defaults from
    ``data/assumptions.yaml`` (``serving_memory``); MLA models default to 64-token blocks (FlashMLA). The
    ``*_override`` arguments take what an engine logged instead of the model. Raises
    ValueError when the subtracted memory alone exceeds u x M or no whole block fits.
    """
    m, g = model(mdl), gpu(chip)
    placement = kv_placement(m, tp, kv_dtype, pp, dcp, dp_attention)
    u = fraction(
        "gpu_memory_utilization", default_memory_utilization(gpu_memory_utilization), allow_zero=False
    )
    dflt_tokens, dflt_seqs = default_batch_limits(g)
    tokens = integer(
        "max_num_batched_tokens",
        dflt_tokens if max_num_batched_tokens is None else max_num_batched_tokens,
        1,
    )
    seqs = integer("max_num_seqs", dflt_seqs if max_num_seqs is None else max_num_seqs, 1)
    if block_size is None:
        block_size = default_block_size(m)
    block_size = integer("block_size", block_size, 1)
    rows = integer("sampler_rows", min(seqs, tokens) if sampler_rows is None else sampler_rows, 1)
    activations = (
        activation_peak_bytes(m, tokens, tp, act_dtype)
        if activation_bytes_override is None
        else real("activation_bytes_override", activation_bytes_override, 0)
    )
    sampler = sampler_bytes(m, rows, sampler_bytes_per_entry)
    if cuda_graphs:
        graphs = (
            cuda_graph_bytes(m, tp, act_dtype=act_dtype)
            if cuda_graph_bytes_override is None
            else real("cuda_graph_bytes_override", cuda_graph_bytes_override, 0)
        )
    else:
        graphs = 0.0
    components = {
        "cuda_context": (
            cuda_context_bytes()
            if cuda_context_bytes_override is None
            else real("cuda_context_bytes_override", cuda_context_bytes_override, 0)
        ),
        "weights": weight_bytes_per_gpu(m, tp, weight_dtype, pp, dp_attention),
        "activations": activations,
        "sampler": sampler,
        "attention_workspace": (
            fact("flashinfer_workspace_bytes")
            if attention_workspace_bytes is None
            else real("attention_workspace_bytes", attention_workspace_bytes, 0)
        ),
        "non_torch": (
            non_torch_bytes(tp * pp)
            if non_torch_bytes_override is None
            else real("non_torch_bytes_override", non_torch_bytes_override, 0)
        ),
        "cuda_graphs": graphs,
        "fragmentation": fragmentation_bytes(activations + sampler, fragmentation_fraction),
    }
    view = {
        "cuda_context": HEADROOM,
        "weights": MEASURED,
        "activations": MEASURED,
        "sampler": MEASURED,
        "attention_workspace": MEASURED,
        "non_torch": MEASURED,
        "cuda_graphs": ESTIMATED if engine_counts_cuda_graphs else HEADROOM,
        "fragmentation": HEADROOM,
    }
    budget = MemoryBudget(
        m.key,
        g.key,
        tp,
        pp,
        placement.dcp,
        dp_attention,
        weight_dtype,
        kv_dtype,
        visible_memory_bytes(g),
        u,
        block_size,
        tokens,
        seqs,
        placement.bytes_per_token_per_gpu,
        MappingProxyType(components),
        MappingProxyType(view),
    )
    if budget.kv_cache_bytes <= 0:
        raise ValueError(
            f"{m.key} ({weight_dtype}) at tp={tp}, pp={pp} on {g.key}: weights and measured overheads take "
            f"{budget.subtracted_bytes / 1e9:.1f} GB per GPU but utilization {u} allows "
            f"{budget.requested_bytes / 1e9:.1f} GB: no room for a KV cache; add GPUs or quantize"
        )
    if budget.num_blocks < 1:
        raise ValueError(
            f"the KV pool of {budget.kv_cache_bytes / 1e6:.0f} MB per GPU holds no whole "
            f"{budget.block_size}-token block of {budget.block_bytes / 1e6:.1f} MB"
        )
    return budget


def naive_kv_bytes(
    mdl: str | Model, chip: str | GPU, tp: int = 1, weight_dtype: str = "bf16"
) -> float:
    """The naive one-line answer, NOT the capacity: datasheet memory - weights / tp, bytes per GPU.

    M_datasheet - W b / tp, with no utilization, no driver-visible memory, no activations, CUDA
    graphs or NCCL buffers. Notebooks show it only to say how far it is from the real pool,
    :func:`memory_budget` (``Deployment.budget``), which is THE KV capacity of the book.
    Negative when the weights alone exceed the card.
    """
    m, g = model(mdl), gpu(chip)
    return g.memory_bytes - weight_bytes_per_gpu(m, m.check_tp(tp), weight_dtype)


# ---- fleets: n GPUs as replicas of one layout ----------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """``n_gpus`` GPUs split into identical replicas of ``tp x pp`` GPUs with one KV layout."""

    label: str
    n_gpus: int
    replicas: int
    budget: MemoryBudget
    placement: KVPlacement

    @property
    def gpus_per_replica(self) -> int:
        return self.placement.tp * self.placement.pp

    @property
    def engines_per_replica(self) -> int:
        """Independent KV pools per replica: tp with data-parallel attention, else 1."""
        return self.gpus_per_replica // self.placement.gpus_per_token

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens whose KV (or this GPU's slice of it) one GPU holds."""
        return self.budget.token_capacity

    @property
    def tokens_per_replica(self) -> int:
        """Tokens of KV one replica holds: tokens per GPU x independent pools."""
        return self.tokens_per_gpu * self.engines_per_replica

    @property
    def tokens_total(self) -> int:
        return self.tokens_per_replica * self.replicas

    def sequences(self, context: int) -> int:
        """Sequences of ``context`` tokens the whole deployment holds at once (max_num_seqs per engine)."""
        return self.replicas * self.engines_per_replica * self.budget.max_sequences(context)

    @property
    def wasted_bytes_per_gpu(self) -> float:
        """KV bytes on each GPU that duplicate another GPU's: pool x (1 - 1 / copies)."""
        return self.budget.kv_cache_bytes * self.placement.wasted_fraction

    @property
    def wasted_bytes_total(self) -> float:
        return self.wasted_bytes_per_gpu * self.n_gpus


def fleet(
    mdl: str | Model,
    chip: str | GPU,
    n_gpus: int,
    tp: int,
    pp: int = 1,
    dcp: int = 1,
    dp_attention: bool = False,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    label: str | None = None,
    **budget_kwargs,
) -> Fleet:
    """KV capacity of ``n_gpus`` GPUs as n / (tp pp) replicas of one layout (see :func:`memory_budget`).

    Raises ValueError when tp x pp does not divide n_gpus or a replica's GPUs cannot hold the weights.
    """
    m = model(mdl)
    n_gpus = integer("n_gpus", n_gpus, 1)
    tp = m.check_tp(tp)
    pp = _check_pp(m, pp)
    if n_gpus % (tp * pp):
        raise ValueError(f"tp x pp = {tp * pp} must divide n_gpus = {n_gpus}")
    budget = memory_budget(
        m,
        chip,
        tp,
        weight_dtype,
        kv_dtype,
        pp=pp,
        dcp=dcp,
        dp_attention=dp_attention,
        **budget_kwargs,
    )
    placement = kv_placement(m, tp, kv_dtype, pp, dcp, dp_attention)
    if label is None:
        parts = [f"TP{tp}"] + ([f"PP{pp}"] if pp > 1 else []) + ([f"DCP{dcp}"] if dcp > 1 else [])
        parts += ["DP-attention"] if dp_attention else []
        label = " x ".join(parts) + (
            f" (x{n_gpus // (tp * pp)} replicas)" if n_gpus > tp * pp else ""
        )
    return Fleet(label, n_gpus, n_gpus // (tp * pp), budget, placement)


def gpu_hour_cost(n_gpu_equivalents: float, usd_per_gpu_hour: float | None = None) -> float:
    """US dollars per hour of ``n_gpu_equivalents`` GPUs: n x price (price an assumption)."""
    real("n_gpu_equivalents", n_gpu_equivalents, 0)
    price = fact("gpu_hour_usd") if usd_per_gpu_hour is None else usd_per_gpu_hour
    return n_gpu_equivalents * real("usd_per_gpu_hour", price, 0)
