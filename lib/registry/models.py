"""Transformer models as immutable typed records, loaded from ``data/models.yaml``.

Everything is derived from the architecture fields (Hugging Face config names):
parameter counts (total, active for MoE, embedding, non-embedding), FLOPs per token (the
2N matmul rule and the context-dependent attention term, separately) and KV-cache bytes per
token (MHA, GQA and MLA aware; dtype aware). Counts are plain numbers of parameters,
FLOPs are FLOP per token of forward pass, bytes are bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from lib.registry.data import load_yaml, unknown_name
from lib.registry.dtypes import bytes_per_element


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. Fields mirror config.json; derived quantities are methods."""

    key: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    mlp: str = "swiglu"  # swiglu | swiglu_moe | gelu_2matrix
    norm: str = "rmsnorm"  # rmsnorm (weight) | layernorm (weight and bias)
    linear_bias: str = "none"  # none | qkv | all
    position_embedding: str = "rope"  # rope | learned
    attention: str = "GQA"  # GQA (MHA when kv heads == heads) | MLA
    # mixture of experts
    num_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_intermediate_size: int = 0
    first_dense_layers: int = 0
    # multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    # ---- structure -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention == "MLA"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    def check_tp(self, tp: object) -> int:
        """``tp`` as an int when it divides the attention heads (the loose rule of the per-GPU
        formulas); else ValueError naming the heads. A Deployment applies vLLM's full rule."""
        from lib.inputs import integer

        tp = integer("tp", tp, 1)
        if self.num_attention_heads % tp:
            raise ValueError(
                f"tp={tp} must divide the {self.num_attention_heads} attention heads of {self.key}"
            )
        return tp

    def check_context(self, tokens: object, what: str = "context") -> int:
        """``tokens`` as an int when it is a position count this model has (0 up to its window,
        ``max_position_embeddings``); else ValueError naming the window."""
        from lib.inputs import integer

        t = integer(what, tokens, 0, unit="tokens")
        if t > self.max_position_embeddings:
            raise ValueError(f"{what} must be at most {self.key}'s {self.max_position_embeddings:,}-token window, "
                             f"got {t:,}")
        return t

    def kv_share_per_rank(self, tp: int) -> float:
        """Fraction of each token's KV one of ``tp`` tensor-parallel ranks holds: 1 / tp up to
        the KV-head count, then 1 / KV heads (heads replicated); 1 for MLA's single latent.
        No divisibility check (an even split of any degree): see :meth:`check_tp`."""
        return 1.0 if self.is_mla else max(1.0 / tp, 1.0 / self.num_kv_heads)

    def kv_heads_per_rank(self, tp: object) -> int:
        """KV heads one of ``tp`` tensor-parallel ranks holds (replicated past the KV-head count):
        H_kv x :meth:`kv_share_per_rank`, after :meth:`check_tp`. Llama 3.1 405B (8 KV heads) at
        TP16: 1."""
        return round(self.num_kv_heads * self.kv_share_per_rank(self.check_tp(tp)))

    @property
    def gqa_group_size(self) -> float:
        """Query heads per cached KV head (1 = MHA; MLA shares one latent across all heads)."""
        return self.num_attention_heads if self.is_mla else self.num_attention_heads / self.num_kv_heads

    # ---- parameters ------------------------------------------------------------------
    # The params_* counts are cached_property: computed once per (immutable) Model and stored in
    # the instance __dict__ (a frozen dataclass blocks setattr, not that); they are plain ints.
    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def attention_params_per_layer(self) -> int:
        """Q, K, V, O projections (and MLA's down/up projections and latent norms)."""
        d, h = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk
            kv = (d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + h * self.v_head_dim * d
        q_out, kv_out = h * self.head_dim, self.num_kv_heads * self.head_dim
        weights = d * q_out + 2 * d * kv_out + q_out * d
        bias = {"none": 0, "qkv": q_out + 2 * kv_out, "all": q_out + 2 * kv_out + d}[self.linear_bias]
        return weights + bias

    def _ffn_params(self, inner: int) -> int:
        d = self.hidden_size
        if self.mlp == "gelu_2matrix":
            return 2 * d * inner + (inner + d if self.linear_bias == "all" else 0)
        return 3 * d * inner  # gate, up, down

    def mlp_params_per_layer(self, layer: int = -1, active: bool = False) -> int:
        """FFN parameters of one layer; for MoE ``active=True`` counts only the routed top-k."""
        if not self.is_moe or (0 <= layer < self.first_dense_layers):
            return self._ffn_params(self.intermediate_size)
        routed = self.experts_per_token if active else self.num_experts
        router = self.hidden_size * self.num_experts + (self.num_experts if self.is_mla else 0)
        return (routed + self.shared_experts) * self._ffn_params(self.expert_intermediate_size) + router

    def _layer_params(self, layer: int, active: bool) -> int:
        return (self.attention_params_per_layer() + self.mlp_params_per_layer(layer, active)
                + 2 * self._norm_params())

    @functools.cached_property
    def params_embedding(self) -> int:
        """Lookup tables: token embedding (and learned positions). They do no arithmetic."""
        learned = self.max_position_embeddings if self.position_embedding == "learned" else 0
        return (self.vocab_size + learned) * self.hidden_size

    @functools.cached_property
    def params_lm_head(self) -> int:
        """Output projection; 0 when tied (it reuses the embedding matrix)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def _params(self, active: bool) -> int:
        layers = sum(self._layer_params(i, active) for i in range(self.num_layers))
        return self.params_embedding + layers + self._norm_params() + self.params_lm_head

    @functools.cached_property
    def params_total(self) -> int:
        """Every stored parameter (all experts)."""
        return self._params(active=False)

    @functools.cached_property
    def params_active(self) -> int:
        """Parameters one token touches (dense models: all of them; MoE: top-k + shared experts)."""
        return self._params(active=True)

    @functools.cached_property
    def params_non_embedding(self) -> int:
        """Total minus the lookup tables (Kaplan et al.'s N)."""
        return self.params_total - self.params_embedding

    @functools.cached_property
    def params_norm(self) -> int:
        """Norm weights (and biases): stored, touched by elementwise ops only."""
        return (2 * self.num_layers + 1) * self._norm_params()

    @functools.cached_property
    def matmul_params_active(self) -> int:
        """Active parameters that take part in a matmul per token: each costs 2 FLOPs (one FMA).

        Excludes the embedding lookup and norm weights; includes the LM head (tied or not).
        """
        head = self.vocab_size * self.hidden_size
        return self.params_active - self.params_embedding - self.params_norm - self.params_lm_head + head

    # ---- FLOPs -----------------------------------------------------------------------
    def weight_flops_per_token(self) -> float:
        """The '2N' term: 2 x matmul parameters, FLOP per token, independent of context."""
        return 2.0 * self.matmul_params_active

    def attention_flops_per_token(self, context: int) -> float:
        """Score and value matmuls for one query token attending to ``context`` keys, FLOP.

        2 * layers * context * heads * (d_qk + d_v); MHA/GQA: d_qk = d_v = head_dim, so
        4 * layers * context * heads * head_dim. MLA (unabsorbed): d_qk = 192, d_v = 128.
        """
        if context < 0:
            raise ValueError(f"context must be >= 0 tokens, got {context}")
        if self.is_mla:
            dqk, dv = self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        else:
            dqk = dv = self.head_dim
        return 2.0 * self.num_layers * context * self.num_attention_heads * (dqk + dv)

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs for one token at ``context``: 2N + attention term."""
        return self.weight_flops_per_token() + self.attention_flops_per_token(context)

    def prefill_flops(self, prompt_len: int) -> float:
        """Forward FLOPs of a causal prefill: 2N * P + attention summed over positions 1..P."""
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1 token, got {prompt_len}")
        mean_context = (prompt_len + 1) / 2
        return prompt_len * (self.weight_flops_per_token()
                             + self.attention_flops_per_token(1) * mean_context)

    def attention_breakeven_context(self) -> float:
        """Context at which the attention term equals the 2N term (the 2N rule is off by 2x)."""
        return self.weight_flops_per_token() / self.attention_flops_per_token(1)

    # ---- memory ----------------------------------------------------------------------
    def weight_bytes(self, dtype: str = "bf16") -> float:
        """Bytes to store every parameter in ``dtype``."""
        return self.params_total * bytes_per_element(dtype)

    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token per layer: 2 * kv_heads * head_dim, or MLA's latent + rope key."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV-cache bytes per token across all layers: layers * elements * bytes per element."""
        return self.num_layers * self.kv_elements_per_token_per_layer() * bytes_per_element(dtype)


_FIELD_MAP = {
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "n_shared_experts": "shared_experts",
    "moe_intermediate_size": "expert_intermediate_size",
    "first_k_dense_replace": "first_dense_layers",
}


def _build(key: str, raw: dict) -> Model:
    fields = set(Model.__dataclass_fields__)
    kwargs = {"key": key}
    for name, value in raw.items():
        name = _FIELD_MAP.get(name, name)
        if name in fields and name not in ("published",):
            kwargs[name] = value
    if raw.get("attention") == "MLA":
        kwargs.setdefault("head_dim", raw["v_head_dim"])
    if raw.get("num_local_experts"):
        kwargs["expert_intermediate_size"] = raw["intermediate_size"]
    kwargs["published"] = MappingProxyType({k: raw[k] for k in raw if k.startswith(("params_", "active_", "kv_"))})
    return Model(**kwargs)


@functools.cache
def _registry() -> Mapping[str, Model]:
    doc = load_yaml("models.yaml")
    return MappingProxyType({k: _build(k, v) for k, v in doc["models"].items()})


def model_names() -> list[str]:
    """Keys accepted by :func:`model`, in the order of ``data/models.yaml``."""
    return list(_registry())


def model(name: str | Model) -> Model:
    """Look up a model by key (``"llama-3.1-70b"``); a Model passes through unchanged."""
    if isinstance(name, Model):
        return name
    try:
        return _registry()[name]
    except KeyError:
        raise unknown_name("model", name, model_names()) from None
