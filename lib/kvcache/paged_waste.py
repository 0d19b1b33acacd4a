"""Paged KV-cache waste and block size (I011): a sequence of ``L`` tokens in blocks of ``B`` slots
takes ``ceil(L / B)`` blocks and wastes ``B * ceil(L / B) - L <= B - 1`` slots, only in its last
block; contiguous preallocation to a maximum length ``M`` wastes ``M - L``. Also the block-size
trade-off (table width, contiguous run, prefix-hit granularity) and the replica's KV bytes
(:func:`lib.perf.memory.memory_budget`). Token counts are integers, bytes are bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, integer_array, real


def _scalar_or_array(values: object):
    return int(values) if np.ndim(values) == 0 else values


# =========================================================================== waste (I011)
def blocks_for_tokens(num_tokens, block_size: int):
    """Blocks a sequence of ``num_tokens`` tokens occupies: ``ceil(L / B)``.

    ``num_tokens`` may be an int or an integer array (tokens, >= 0); ``block_size`` in tokens.
    """
    b = integer("block_size", block_size, 1)
    n = integer_array("num_tokens", num_tokens)
    return _scalar_or_array(-(-n // b))


def paged_waste_tokens(num_tokens, block_size: int):
    """Empty token slots a paged sequence holds: ``B * ceil(L / B) - L``, in [0, B - 1].

    Only the last block can be partly filled, so the waste per sequence is below one block.
    """
    b = integer("block_size", block_size, 1)
    n = integer_array("num_tokens", num_tokens)
    return _scalar_or_array(-(-n // b) * b - n)


def paged_waste_bound_tokens(block_size: int) -> int:
    """The worst case per sequence: ``B - 1`` empty slots (a last block holding one token)."""
    return integer("block_size", block_size, 1) - 1


def uniform_residue_waste_tokens(block_size: int) -> float:
    """Expected waste per sequence, ``(B - 1) / 2`` tokens, when ``L mod B`` is uniform.

    Holds for any length distribution much wider than a block (the residue then forgets the
    distribution's shape); :func:`expected_waste_from_pmf` gives the exact value otherwise.
    """
    return (integer("block_size", block_size, 1) - 1) / 2


def contiguous_waste_tokens(num_tokens, reserved_tokens):
    """Slots a contiguous reservation wastes: ``reserved - L`` (reserved >= L, tokens)."""
    n = integer_array("num_tokens", num_tokens)
    r = integer_array("reserved_tokens", reserved_tokens)
    if np.any(n > r):
        raise ValueError(
            "num_tokens must not exceed reserved_tokens (a reservation holds the sequence)"
        )
    return _scalar_or_array(r - n)


def pow2_reserved_tokens(num_tokens):
    """Reservation rounded up to a power of two, ``2**ceil(log2 L)`` (1 for L <= 1).

    A contiguous allocator that knows a sequence's length only to a factor of two. Close to, but
    not, the vLLM paper's Orca (Pow2) baseline, which rounds only the output part of the
    reservation ("if the true output length is 25, it reserves 32 positions for outputs",
    Kwon et al. 2023, sec. 6.1); rounding the whole length wastes more on long prompts.
    """
    n = integer_array("num_tokens", num_tokens)
    out = np.ones_like(n)
    big = n > 1
    out[big] = 1 << np.ceil(np.log2(n[big])).astype(np.int64)
    out[big & (out < n)] *= 2  # guard against float rounding just below a power of two
    return _scalar_or_array(out)


def lognormal_length_pmf(
    median_tokens: float, sigma: float, max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact pmf of ``L = clip(ceil(X), 1, max_tokens)`` for ``X ~ LogNormal(ln median, sigma)``.

    ``P(L <= l) = Phi((ln l - ln median) / sigma)`` for ``1 <= l < max_tokens``; the rest of the
    mass sits on ``max_tokens`` (requests cut at the engine's maximum length). Returns
    ``(lengths 1..max_tokens, probabilities)``. The sampler below draws from this same law.
    """
    median = real("median_tokens", median_tokens, 1.0, 1e7)
    s = real("sigma", sigma, 0.01, 5.0)
    m = integer("max_tokens", max_tokens, 1)
    lengths = np.arange(1, m + 1)
    z = (np.log(lengths[:-1]) - math.log(median)) / (s * math.sqrt(2.0))
    erf = np.frompyfunc(math.erf, 1, 1)
    cdf = 0.5 * (1.0 + erf(z).astype(float))
    probs = np.diff(np.concatenate(([0.0], cdf, [1.0])))
    return lengths, probs


def sample_lognormal_lengths(
    num_sequences: int, median_tokens: float, sigma: float, max_tokens: int, seed: int = 0
) -> np.ndarray:
    """Seeded sequence lengths ``clip(ceil(median * exp(sigma * Z)), 1, max_tokens)``, Z ~ N(0, 1)."""
    n = integer("num_sequences", num_sequences, 1)
    median = real("median_tokens", median_tokens, 1.0, 1e7)
    s = real("sigma", sigma, 0.01, 5.0)
    m = integer("max_tokens", max_tokens, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    x = median * np.exp(s * rng.standard_normal(n))
    return np.clip(np.ceil(x), 1, m).astype(np.int64)


def expected_waste_from_pmf(lengths, probs, block_size: int) -> float:
    """Exact expected paged waste, ``sum_l p(l) * (B * ceil(l / B) - l)`` tokens."""
    p = np.asarray(probs, dtype=float)
    waste = paged_waste_tokens(integer_array("lengths", lengths, 1), block_size)
    if p.shape != np.shape(waste) or np.any(p < 0) or not math.isclose(p.sum(), 1.0, rel_tol=1e-9):
        raise ValueError("probs must be non-negative, sum to 1 and match lengths in shape")
    return float(np.dot(p, waste))


@dataclass(frozen=True)
class WasteSummary:
    """Token slots reserved for a set of sequences under three schemes, and what they hold.

    ``used``: tokens actually written; ``paged``: ``B * ceil(L / B)`` each; ``contiguous_max``:
    ``max_tokens`` each (reserve the engine maximum); ``contiguous_pow2``: the next power of two.
    """

    num_sequences: int
    block_size: int
    max_tokens: int
    used: int
    paged: int
    contiguous_max: int
    contiguous_pow2: int
    paged_max_waste: int

    def utilization(self, scheme: str) -> float:
        """Fraction of reserved slots that hold a token: ``used / reserved`` for ``scheme``."""
        reserved = {
            "paged": self.paged,
            "contiguous_max": self.contiguous_max,
            "contiguous_pow2": self.contiguous_pow2,
        }
        if scheme not in reserved:
            raise ValueError(f"scheme must be one of {sorted(reserved)}, got {scheme!r}")
        return self.used / reserved[scheme]

    def mean_waste_tokens(self, scheme: str) -> float:
        """Mean empty slots per sequence under ``scheme`` (tokens)."""
        return self.used * (1 / self.utilization(scheme) - 1) / self.num_sequences

    @property
    def mean_tokens(self) -> float:
        """Mean sequence length (tokens)."""
        return self.used / self.num_sequences


def waste_summary(lengths, block_size: int, max_tokens: int) -> WasteSummary:
    """Sum reserved slots over ``lengths`` for paged, max-length and power-of-two reservation."""
    n = integer_array("lengths", lengths, 1)
    m = integer("max_tokens", max_tokens, 1)
    if n.size == 0:
        raise ValueError("lengths must hold at least one sequence")
    if n.max() > m:
        raise ValueError(f"lengths must be <= max_tokens={m}, got {n.max()}")
    b = integer("block_size", block_size, 1)
    waste = paged_waste_tokens(n, b)
    return WasteSummary(
        num_sequences=int(n.size),
        block_size=b,
        max_tokens=m,
        used=int(n.sum()),
        paged=int((n + waste).sum()),
        contiguous_max=int(m * n.size),
        contiguous_pow2=int(np.minimum(pow2_reserved_tokens(n), max(m, 1)).sum()),
        paged_max_waste=int(np.max(waste)),
    )


def kv_budget_bytes(
    model, gpu, tp: int, weight_dtype: str = "bf16", memory_utilization: float | None = None
) -> float:
    """KV bytes a replica of ``tp`` GPUs holds, counted at the model's full bytes per token.

    The per-GPU pool is :func:`lib.perf.memory.memory_budget`'s (the one KV-capacity formula:
    ``u x driver-visible memory - weights / tp - activations - sampler - attention workspace -
    NCCL - CUDA graphs``, with vLLM's defaults from ``data/assumptions.yaml`` (``serving_memory``)); the replica
    holds ``pool / s`` bytes of whole tokens, ``s`` being the share of each token one GPU stores
    (``1 / tp`` while tp <= KV heads). ``memory_utilization`` is vLLM's
    ``gpu_memory_utilization`` (None: its default, 0.9). Raises ValueError when the weights and
    overheads leave no room for a KV cache.
    """
    from lib.perf import memory
    from lib.registry import models

    b = memory.memory_budget(model, gpu, tp, weight_dtype, gpu_memory_utilization=memory_utilization)
    return b.kv_cache_bytes * models.model(model).kv_bytes_per_token(b.kv_dtype) / b.kv_bytes_per_token_per_gpu


def smallest_tp(
    model, gpu, weight_dtype: str = "bf16", max_weight_fraction: float = 0.5, max_tp: int = 64
) -> int:
    """Smallest power-of-two TP whose weight shard fills at most ``max_weight_fraction`` of a GPU.

    A rule of thumb that leaves the rest for KV; TP must also divide the attention heads.
    """
    from lib.registry import hardware, models

    m, g = models.model(model), hardware.gpu(gpu)
    frac = real("max_weight_fraction", max_weight_fraction, 0.01, 1.0)
    tp = 1
    while tp <= integer("max_tp", max_tp, 1):
        fits = m.weight_bytes(weight_dtype) / tp <= frac * g.memory_bytes
        if fits and m.num_attention_heads % tp == 0:
            return tp
        tp *= 2
    raise ValueError(f"{m.key} does not fit on up to {max_tp} x {g.key} with that weight fraction")


def block_table_entries(max_tokens: int, block_size: int) -> int:
    """Width of a block table for ``max_tokens``: ``ceil(max_tokens / B)`` block ids."""
    return int(blocks_for_tokens(integer("max_tokens", max_tokens, 1), block_size))


def block_run_bytes(model, kv_dtype: str, block_size: int) -> float:
    """Contiguous bytes one block holds for one layer, one KV head, K or V: ``B * d_head * b``.

    This is the run an attention kernel reads before it must look up the next block id (vLLM's
    layout keeps each head's slots of a block together). For MLA it is the block's slice of the
    shared latent plus the rope key: ``B * (kv_lora_rank + rope dim) * b``.
    """
    from lib.registry import models
    from lib.registry.dtypes import bytes_per_element

    m = models.model(model)
    b = integer("block_size", block_size, 1)
    width = m.kv_lora_rank + m.qk_rope_head_dim if m.is_mla else m.head_dim
    return b * width * bytes_per_element(kv_dtype)


def prefix_hit_tokens(prefix_tokens, block_size: int):
    """Tokens a block-granular prefix cache can reuse: ``B * floor(P / B)`` (full blocks only)."""
    b = integer("block_size", block_size, 1)
    p = integer_array("prefix_tokens", prefix_tokens)
    return _scalar_or_array(p // b * b)


@dataclass(frozen=True)
class BlockSizeRow:
    """One block size in the trade-off: waste, kernel run length, table width, prefix granularity.

    Tokens are tokens, bytes are bytes. ``waste_*`` are per sequence; ``utilization`` is over the
    simulated lengths; ``table_entries`` is the block-table width at ``max_tokens``.
    """

    block_size: int
    waste_bound_tokens: int
    waste_closed_tokens: float
    waste_exact_tokens: float
    waste_sim_tokens: float
    waste_mean_bytes: float
    utilization: float
    run_bytes: float
    block_bytes: float
    table_entries: int
    lookups_per_token: float
    prefix_lost_tokens: int


def block_size_tradeoff(
    model,
    kv_dtype: str,
    block_sizes: Iterable[int],
    lengths,
    max_tokens: int,
    prefix_tokens: int,
    pmf: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[BlockSizeRow]:
    """The block-size table for ``model``: one :class:`BlockSizeRow` per block size.

    waste_closed = (B-1)/2; waste_exact from ``pmf`` (when given, else NaN); waste_sim = mean
    over ``lengths``; waste_mean_bytes = waste_sim * KV bytes per token; run_bytes per
    :func:`block_run_bytes`; block_bytes = B * KV bytes per token (all layers);
    lookups_per_token = mean ceil(L/B) * layers (block ids an attention kernel resolves per
    decoded token); prefix_lost_tokens = P mod B (prefix tokens a block-granular cache recomputes).
    """
    from lib.registry import models

    m = models.model(model)
    per_token = m.kv_bytes_per_token(kv_dtype)
    n = integer_array("lengths", lengths, 1)
    p = integer("prefix_tokens", prefix_tokens, 0)
    rows = []
    for b in block_sizes:
        b = integer("block_size", b, 1)
        s = waste_summary(n, b, max_tokens)
        sim = s.mean_waste_tokens("paged")
        rows.append(
            BlockSizeRow(
                block_size=b,
                waste_bound_tokens=paged_waste_bound_tokens(b),
                waste_closed_tokens=uniform_residue_waste_tokens(b),
                waste_exact_tokens=expected_waste_from_pmf(*pmf, b) if pmf else math.nan,
                waste_sim_tokens=sim,
                waste_mean_bytes=sim * per_token,
                utilization=s.utilization("paged"),
                run_bytes=block_run_bytes(m, kv_dtype, b),
                block_bytes=b * per_token,
                table_entries=block_table_entries(max_tokens, b),
                lookups_per_token=float(np.mean(blocks_for_tokens(n, b))) * m.num_layers,
                prefix_lost_tokens=p - int(prefix_hit_tokens(p, b)),
            )
        )
    return rows
