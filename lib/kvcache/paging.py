"""Paged KV-cache arithmetic: the waste bound, block sharing, copy-on-write, and a grader.

Pure functions on top of the reference allocator in :mod:`lib.kvcache` (which this module uses
and never changes). Token counts are plain integers, bytes are bytes.

* **Waste** (I011): a sequence of ``L`` tokens in blocks of ``B`` slots takes
  ``ceil(L / B)`` blocks and wastes ``B * ceil(L / B) - L <= B - 1`` slots, only in its last
  block; contiguous preallocation to a maximum length ``M`` wastes ``M - L``.
* **Sharing** (I015): block counts with and without sharing for parallel sampling, beam search
  and a shared prompt prefix, the copy-on-write copies each one triggers, and replays that drive
  the real :class:`~lib.kvcache.BlockAllocator` to count the same things a second way.
* **Grading** (I085, I095): seeded random operation programs and a checker that tallies each
  allocator invariant separately (free or owned, refcount = holders, conservation, copy before
  a shared write, reads what it wrote, no double free, all-or-nothing).

Importing this module pulls in numpy only.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import integer, integer_array, real
from lib.kvcache import BlockAllocator, Op

__all__ = [
    "INVARIANTS",
    "BlockSizeRow",
    "GradeReport",
    "ReplayCount",
    "SharingCount",
    "WasteSummary",
    "admission_trace",
    "beam_search_blocks",
    "beam_search_parents",
    "block_run_bytes",
    "block_size_tradeoff",
    "block_table_entries",
    "blocks_for_tokens",
    "contiguous_waste_tokens",
    "expected_waste_from_pmf",
    "grade_allocator",
    "kv_budget_bytes",
    "lognormal_length_pmf",
    "misaligned_prompt_cost",
    "oracle_failures",
    "paged_waste_bound_tokens",
    "paged_waste_tokens",
    "parse_op",
    "parallel_sampling_blocks",
    "parallel_sampling_curve",
    "pow2_reserved_tokens",
    "prefix_hit_tokens",
    "random_program",
    "replay_beam_search",
    "replay_parallel_sampling",
    "replay_shared_prefix",
    "sample_lognormal_lengths",
    "shared_prefix_blocks",
    "smallest_tp",
    "time_averaged_saving",
    "uniform_residue_waste_tokens",
    "waste_summary",
]


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
    NCCL - CUDA graphs``, with vLLM's defaults from ``data/serving_memory.yaml``); the replica
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


# =========================================================================== sharing (I015)
@dataclass(frozen=True)
class SharingCount:
    """Blocks in use with and without sharing, and the copy-on-write copies sharing costs."""

    blocks_shared: int
    blocks_unshared: int
    copies: int

    @property
    def saved_blocks(self) -> int:
        """``blocks_unshared - blocks_shared``."""
        return self.blocks_unshared - self.blocks_shared

    @property
    def saving(self) -> float:
        """Fraction of the unshared blocks that sharing saves (0 when nothing is allocated)."""
        return self.saved_blocks / self.blocks_unshared if self.blocks_unshared else 0.0


def parallel_sampling_blocks(
    prompt_tokens: int, output_tokens: int, num_samples: int, block_size: int
) -> SharingCount:
    """Blocks for ``n`` samples of a ``P``-token prompt after ``G`` generated tokens each.

    With sharing (fork, then copy-on-write), for ``G >= 1`` and ``r = P mod B``:
    ``floor(P/B) + n * ceil((r + G) / B)`` blocks and ``n - 1`` copies if ``r > 0`` (the first
    ``n - 1`` writers into the shared, partly filled last prompt block copy it; the last one
    writes in place), else 0. Without sharing: ``n * ceil((P + G) / B)``. At ``G = 0`` the
    samples still share the whole prompt: ``ceil(P / B)`` blocks, no copies.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_samples", num_samples, 1)
    b = integer("block_size", block_size, 1)
    r = p % b
    unshared = n * (-(-(p + g) // b))
    if g == 0:
        return SharingCount(-(-p // b), unshared, 0)
    return SharingCount(p // b + n * (-(-(r + g) // b)), unshared, (n - 1) if r else 0)


def parallel_sampling_curve(
    prompt_tokens: int, output_tokens: int, num_samples: int, block_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks in use after each step ``s = 0..G``: (steps, shared, unshared), per the closed form
    of :func:`parallel_sampling_blocks` at every ``s``."""
    p = integer("prompt_tokens", prompt_tokens, 1)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_samples", num_samples, 1)
    b = integer("block_size", block_size, 1)
    s = np.arange(g + 1)
    shared = p // b + n * (-(-(p % b + s) // b))
    shared[0] = -(-p // b)
    return s, shared, n * (-(-(p + s) // b))


def time_averaged_saving(shared, unshared) -> float:
    """Saving in block-steps (memory x time): ``1 - sum(shared) / sum(unshared)``."""
    sh, un = np.asarray(shared, dtype=float), np.asarray(unshared, dtype=float)
    if sh.shape != un.shape or sh.size == 0 or un.sum() <= 0:
        raise ValueError("shared and unshared must be non-empty curves of the same shape")
    return float(1.0 - sh.sum() / un.sum())


def shared_prefix_blocks(
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    num_requests: int,
    block_size: int,
) -> SharingCount:
    """Blocks for ``N`` requests that fork one cached ``S``-token prefix (a system prompt).

    The prefix stays cached (held by its own sequence); each request forks it, then writes its
    ``U`` own prompt tokens and ``G`` output tokens. With ``r = S mod B`` and ``U + G >= 1``:
    ``ceil(S/B) + N * ceil((r + U + G) / B)`` blocks and ``N`` copies if ``r > 0`` (every request
    copies the cached partial block; the cache keeps the original). Without sharing:
    ``N * ceil((S + U + G) / B)``.
    """
    s = integer("prefix_tokens", prefix_tokens, 1)
    u = integer("suffix_tokens", suffix_tokens, 0)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_requests", num_requests, 1)
    b = integer("block_size", block_size, 1)
    r, tail = s % b, u + g
    unshared = n * (-(-(s + tail) // b))
    if tail == 0:
        return SharingCount(-(-s // b), unshared, 0)
    return SharingCount(-(-s // b) + n * (-(-(r + tail) // b)), unshared, n if r else 0)


def misaligned_prompt_cost(
    prompt_tokens: int, num_sharers: int, block_size: int, kv_bytes_per_token: float
) -> dict[str, float]:
    """What ``r = P mod B > 0`` costs when ``n`` sequences share a prompt and all write.

    ``copies = n - 1`` block copies (``copy_bytes = copies * B * bytes/token`` moved once),
    ``duplicated_tokens = (n - 1) * r`` prompt tokens stored ``n`` times instead of once, and
    ``shared_blocks = floor(P / B)``: the partial block is never shared after the first write.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    n = integer("num_sharers", num_sharers, 1)
    b = integer("block_size", block_size, 1)
    per_token = real("kv_bytes_per_token", kv_bytes_per_token, 0.0, 1e12)
    r = p % b
    copies = (n - 1) if r else 0
    return {
        "remainder_tokens": r,
        "copies": copies,
        "copy_bytes": copies * b * per_token,
        "duplicated_tokens": (n - 1) * r,
        "duplicated_bytes": (n - 1) * r * per_token,
        "shared_blocks": p // b,
    }


def beam_search_parents(beam_width: int, steps: int, seed: int = 0) -> np.ndarray:
    """A seeded beam-search lineage: row ``t`` holds the parent index of each beam at step t+1.

    Row 0 is all zeros (every first-step beam extends the one prompt); later rows pick each new
    beam's parent uniformly among the ``k`` live beams (a neutral model of which beams survive;
    real scores concentrate survival on fewer parents, which only increases sharing).
    """
    k = integer("beam_width", beam_width, 1)
    t = integer("steps", steps, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    parents = rng.integers(0, k, size=(t, k))
    parents[0] = 0
    return parents


def _check_parents(parents) -> np.ndarray:
    par = integer_array("parents", parents)
    if par.ndim != 2 or par.shape[0] < 1 or par.shape[1] < 1:
        raise ValueError("parents must be a (steps, beam_width) integer array")
    if np.any(par[0] != 0) or par.max() >= par.shape[1]:
        raise ValueError("parents row 0 must be all 0 and every entry < beam_width")
    return par


def _distinct_per_row(a: np.ndarray) -> np.ndarray:
    srt = np.sort(a, axis=1)
    return (np.diff(srt, axis=1) != 0).sum(axis=1) + 1


def beam_search_blocks(
    prompt_tokens: int, parents, block_size: int, at_steps: Sequence[int] | None = None
) -> list[SharingCount]:
    """Blocks held by ``k`` beams after each step in ``at_steps`` (default: the last step).

    Closed form from the lineage: a full block that ends at prompt position ``e`` is one block
    for every beam if ``e < P``; otherwise it is one block per distinct ancestor (among the live
    beams) at the step that wrote position ``e``. The last, partly filled block is private to each
    beam: ``k`` more blocks when ``(P + s) mod B > 0``. Copies: at each step that writes into a
    partly filled block, ``k - (distinct parents)``. Without sharing: ``k * ceil((P + s) / B)``.
    Step 0 is the prompt alone: ``ceil(P / B)`` blocks.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    b = integer("block_size", block_size, 1)
    par = _check_parents(parents)
    total, k = par.shape
    steps = np.array([total] if at_steps is None else list(at_steps), dtype=np.int64)
    if steps.size == 0 or steps.min() < 0 or steps.max() > total:
        raise ValueError(f"at_steps must be non-empty integers in [0, {total}]")
    # copies per step t (1-based): partial write and parents that have more than one child
    t = np.arange(1, total + 1)
    partial_write = (p + t - 1) % b != 0
    distinct_parents = _distinct_per_row(par)
    copies_cum = np.concatenate(([0], np.cumsum(np.where(partial_write, k - distinct_parents, 0))))
    # distinct ancestors at every block-end step, for all requested populations at once
    rows = steps.size
    anc = np.zeros((rows, k), dtype=np.int64)
    full_gen = np.zeros(rows, dtype=np.int64)
    for v in range(int(steps.max()), 0, -1):
        starting = steps == v
        anc[starting] = np.arange(k)
        active = steps >= v
        if (p + v) % b == 0:  # step v wrote the last slot of a block
            full_gen[active] += _distinct_per_row(anc[active])
        anc = par[v - 1][anc]
    out = []
    for i, s in enumerate(steps.tolist()):
        if s == 0:
            out.append(SharingCount(-(-p // b), k * (-(-p // b)), 0))
            continue
        partial = k if (p + s) % b else 0
        out.append(
            SharingCount(
                int(p // b + full_gen[i] + partial), k * (-(-(p + s) // b)), int(copies_cum[s])
            )
        )
    return out


# ------------------------------------------------------------------ replays on the real allocator
@dataclass(frozen=True)
class ReplayCount:
    """What the real allocator reports after a replay: blocks in use (per step) and copies."""

    used_blocks: tuple[int, ...]  # after step 0 (prompt only), 1, 2, ...
    copies: int
    contents_ok: bool

    @property
    def final_blocks(self) -> int:
        """Blocks in use at the end."""
        return self.used_blocks[-1]


def replay_parallel_sampling(
    prompt_tokens: int,
    output_tokens: int,
    num_samples: int,
    block_size: int,
    allocator_factory: Callable[[int, int], BlockAllocator] = BlockAllocator,
) -> ReplayCount:
    """Drive an allocator: allocate the prompt, fork ``n - 1`` samples, append ``G`` tokens each.

    Sample ``i`` writes token ``i`` at every step; contents_ok says every sample reads back the
    prompt followed by its own tokens. The pool is sized so it never runs out.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_samples", num_samples, 1)
    b = integer("block_size", block_size, 1)
    alloc = allocator_factory(n * (-(-(p + g) // b)) + n, b)
    prompt = [t % 50_000 for t in range(p)]
    alloc.allocate(0, prompt)
    for i in range(1, n):
        alloc.fork(0, i)
    used = [alloc.num_used_blocks]
    for _ in range(g):
        for i in range(n):
            alloc.append_token(i, i)
        used.append(alloc.num_used_blocks)
    ok = all(alloc.tokens(i) == prompt + [i] * g for i in range(n))
    return ReplayCount(tuple(used), len(alloc.copy_events), ok)


def replay_shared_prefix(
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    num_requests: int,
    block_size: int,
    allocator_factory: Callable[[int, int], BlockAllocator] = BlockAllocator,
) -> ReplayCount:
    """Drive an allocator: cache an ``S``-token prefix, then ``N`` requests fork it and write.

    Request ``j`` writes ``U`` suffix tokens and ``G`` output tokens, all equal to ``j``.
    used_blocks has one entry after the prefix and one after each request.
    """
    s = integer("prefix_tokens", prefix_tokens, 1)
    u = integer("suffix_tokens", suffix_tokens, 0)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_requests", num_requests, 1)
    b = integer("block_size", block_size, 1)
    alloc = allocator_factory(-(-s // b) + n * (-(-(s + u + g) // b)) + n, b)
    prefix = [t % 50_000 for t in range(s)]
    alloc.allocate("prefix", prefix)
    used = [alloc.num_used_blocks]
    for j in range(n):
        alloc.fork("prefix", j)
        for _ in range(u + g):
            alloc.append_token(j, j)
        used.append(alloc.num_used_blocks)
    ok = alloc.tokens("prefix") == prefix and all(
        alloc.tokens(j) == prefix + [j] * (u + g) for j in range(n)
    )
    return ReplayCount(tuple(used), len(alloc.copy_events), ok)


def replay_beam_search(
    prompt_tokens: int,
    parents,
    block_size: int,
    allocator_factory: Callable[[int, int], BlockAllocator] = BlockAllocator,
) -> ReplayCount:
    """Drive an allocator through a beam-search lineage (see :func:`beam_search_parents`).

    Each step: free beams with no children; a parent with ``c`` children forks ``c - 1`` new
    sequences and continues itself as the last child; then every beam appends one token (its
    index). contents_ok checks each final beam reads the prompt plus its lineage's tokens.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    b = integer("block_size", block_size, 1)
    par = _check_parents(parents)
    total, k = par.shape
    alloc = allocator_factory(k * (-(-(p + total) // b)) + k + 1, b)
    prompt = [t % 50_000 for t in range(p)]
    alloc.allocate(0, prompt)
    population, next_id = [0], 1
    used = [alloc.num_used_blocks]
    for step in range(total):
        children: dict[int, list[int]] = {}
        for beam, parent in enumerate(par[step].tolist()):
            children.setdefault(parent, []).append(beam)
        for index, seq in enumerate(population):
            if index not in children:
                alloc.free(seq)
        new_population = [0] * k
        for parent, kids in children.items():
            seq = population[parent]
            for kid in kids[:-1]:
                alloc.fork(seq, next_id)
                new_population[kid], next_id = next_id, next_id + 1
            new_population[kids[-1]] = seq
        for beam, seq in enumerate(new_population):
            alloc.append_token(seq, beam)
        population = new_population
        used.append(alloc.num_used_blocks)
    ok = True
    for beam, seq in enumerate(population):
        lineage, a = [], beam
        for step in range(total - 1, -1, -1):
            lineage.append(a)
            a = int(par[step][a])
        ok &= alloc.tokens(seq) == prompt + lineage[::-1]
    return ReplayCount(tuple(used), len(alloc.copy_events), bool(ok))


# =========================================================================== grading (I085, I095)
#: The invariants :func:`grade_allocator` checks, by key, with what each one means.
INVARIANTS: dict[str, str] = {
    "free_or_owned": "every block is free or owned: never both, never neither",
    "refcount_matches": "a block's refcount equals the number of block tables that hold it",
    "conservation": "free blocks + used blocks == total blocks",
    "copy_before_shared_write": (
        "a write into a shared, partly filled block goes to a fresh copy; no other sequence's "
        "tokens change"
    ),
    "reads_what_it_wrote": "every live sequence reads back exactly the tokens it wrote",
    "no_double_free": (
        "no block is on the free list twice; freeing a dead sequence raises and changes nothing"
    ),
    "all_or_nothing": "a failed allocation (OutOfBlocks) leaves the allocator exactly as it was",
    "valid_ops_accepted": "a valid operation either succeeds or raises OutOfBlocks",
}


def random_program(
    rng: random.Random,
    live: Sequence[Hashable],
    dead: Sequence[Hashable],
    next_id: int,
    *,
    max_prompt_tokens: int,
    num_token_values: int = 4,
    dead_free_probability: float = 0.1,
) -> Op:
    """Draw the next operation for a program: allocate, fork, append, or free (maybe a dead id).

    Weights: allocate 0.25, fork 0.15, append 0.45, free 0.15; allocate when nothing is live.
    A free picks a dead sequence with ``dead_free_probability`` (a double-free attempt).
    ``next_id`` names a newly created sequence.
    """
    kind = rng.choices(("allocate", "fork", "append", "free"), (0.25, 0.15, 0.45, 0.15))[0]
    if not live:
        kind = "allocate"
    if kind == "allocate":
        return Op("allocate", next_id, tuple(range(rng.randint(0, max_prompt_tokens))))
    if kind == "fork":
        return Op("fork", rng.choice(list(live)), next_id)
    if kind == "append":
        return Op("append", rng.choice(list(live)), rng.randrange(num_token_values))
    if dead and rng.random() < dead_free_probability:
        return Op("free", rng.choice(list(dead)))
    return Op("free", rng.choice(list(live)))


@dataclass
class GradeReport:
    """Per-invariant tallies over seeded random programs.

    ``checks[key]``: times the invariant was checked; ``violations[key]``: programs whose first
    failing operation broke it; ``first_failure[key]``: (the program's ops, message) of the first
    such program (not shrunk; ``str(op)`` prints an op).
    """

    name: str
    programs: int
    ops_run: int
    checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    first_failure: dict[str, tuple[list[Op], str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no invariant was ever violated."""
        return not any(self.violations.values())

    @property
    def failing(self) -> list[str]:
        """Keys of the violated invariants, in :data:`INVARIANTS` order."""
        return [k for k in INVARIANTS if self.violations[k]]

    def table(self) -> str:
        """One line per invariant: checks, programs violating, the invariant in words."""
        lines = [f"{self.name}: {self.programs} programs, {self.ops_run} operations"]
        for key, words in INVARIANTS.items():
            verdict = "ok  " if not self.violations[key] else "FAIL"
            lines.append(
                f"  {verdict} {key:<25}{self.checks[key]:>7} checks "
                f"{self.violations[key]:>4} failing programs   {words}"
            )
        return "\n".join(lines)


def _snapshot(alloc: BlockAllocator) -> tuple:
    return (
        alloc.free_block_ids(),
        [alloc.refcount(b) for b in range(alloc.num_blocks)],
        {s: alloc.block_table(s) for s in alloc.seq_ids()},
        {s: alloc.tokens(s) for s in alloc.seq_ids()},
    )


def _state_problems(alloc: BlockAllocator, shadow: dict) -> dict[str, str]:
    """The invariants that hold for any state (not tied to the last operation)."""
    problems: dict[str, str] = {}
    free = alloc.free_block_ids()
    free_set = set(free)
    if len(free) != len(free_set):
        doubled = sorted(b for b, c in Counter(free).items() if c > 1)
        problems["no_double_free"] = f"blocks {doubled} are on the free list twice"
    holders = Counter(b for s in alloc.seq_ids() for b in alloc.block_table(s))
    for block in range(alloc.num_blocks):
        count = alloc.refcount(block)
        if (block in free_set) == (count > 0):
            state = "free and owned" if count else "neither free nor owned (leaked)"
            problems.setdefault("free_or_owned", f"block {block} is {state}")
        if count != holders[block]:
            problems.setdefault(
                "refcount_matches",
                f"block {block} has refcount {count}, {holders[block]} tables hold it",
            )
    if alloc.num_free_blocks + alloc.num_used_blocks != alloc.num_blocks:
        problems["conservation"] = (
            f"free {alloc.num_free_blocks} + used {alloc.num_used_blocks} != {alloc.num_blocks}"
        )
    for seq, expected in shadow.items():
        got = alloc.tokens(seq) if seq in alloc.seq_ids() else None
        if got != expected:
            problems.setdefault("reads_what_it_wrote", f"seq {seq} reads {got}, wrote {expected}")
    return problems


def grade_allocator(
    factory: Callable[[], BlockAllocator],
    *,
    num_programs: int = 200,
    num_ops: int = 20,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    num_token_values: int = 4,
    name: str = "",
) -> GradeReport:
    """Run ``num_programs`` seeded random programs on fresh allocators; tally each invariant.

    Each program runs until its first violation (or ``num_ops`` operations). ``factory()`` must
    return a fresh, empty :class:`~lib.kvcache.BlockAllocator` (or subclass). Prompts are up to
    ``max_prompt_tokens`` long (default: the pool's capacity, so OutOfBlocks paths run).
    Deterministic for a given ``seed``.
    """
    n_prog = integer("num_programs", num_programs, 1)
    n_ops = integer("num_ops", num_ops, 1)
    seed = integer("seed", seed, 0)
    probe = factory()
    if not isinstance(probe, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(probe).__name__}")
    cap = probe.num_blocks * probe.block_size
    max_prompt = (
        cap if max_prompt_tokens is None else integer("max_prompt_tokens", max_prompt_tokens, 0)
    )
    report = GradeReport(name or type(probe).__name__, n_prog, 0)
    for index in range(n_prog):
        rng = random.Random(seed * 1_000_003 + index)
        alloc, shadow, dead, ops, next_id = factory(), {}, [], [], 0
        for _ in range(n_ops):
            op = random_program(
                rng,
                list(shadow),
                dead,
                next_id,
                max_prompt_tokens=max_prompt,
                num_token_values=num_token_values,
            )
            next_id += op.kind in ("allocate", "fork")
            ops.append(op)
            problems = _grade_op(alloc, shadow, dead, op, report)
            report.ops_run += 1
            if problems:
                for key, message in problems.items():
                    report.violations[key] += 1
                    report.first_failure.setdefault(key, (list(ops), message))
                break
    return report


def _grade_op(alloc: BlockAllocator, shadow: dict, dead: list, op: Op, report: GradeReport):
    """Apply ``op``, mirror it in ``shadow``, and return the invariants it broke."""
    before = _snapshot(alloc)
    problems: dict[str, str] = {}
    shared_partial = False
    if op.kind == "append":
        table = before[2][op.seq]
        length = len(before[3][op.seq])
        shared_partial = length % alloc.block_size != 0 and before[1][table[-1]] > 1
    try:
        if op.kind == "free" and op.seq in dead:
            try:
                alloc.free(op.seq)
            except ValueError:
                pass
            else:
                problems["no_double_free"] = f"free({op.seq}) of a freed sequence did not raise"
            report.checks["no_double_free"] += 1
            if _snapshot(alloc) != before:
                problems.setdefault(
                    "no_double_free", f"free({op.seq}) of a freed sequence changed state"
                )
            return problems
        op.apply(alloc, shadow)  # swallows OutOfBlocks, leaving shadow unchanged
    except (ValueError, KeyError, IndexError) as err:
        report.checks["valid_ops_accepted"] += 1
        problems["valid_ops_accepted"] = f"{op} raised {type(err).__name__}: {err}"
        return problems
    report.checks["valid_ops_accepted"] += 1
    failed = (
        op.kind in ("allocate", "fork")
        and (op.seq if op.kind == "allocate" else op.arg) not in shadow
    ) or (op.kind == "append" and len(shadow[op.seq]) == len(before[3][op.seq]))
    if failed:  # the operation raised OutOfBlocks inside apply
        report.checks["all_or_nothing"] += 1
        if _snapshot(alloc) != before:
            problems["all_or_nothing"] = f"{op} failed with OutOfBlocks but changed the state"
    if op.kind == "free":
        dead.append(op.seq)
    if op.kind == "append" and shared_partial and not failed:
        report.checks["copy_before_shared_write"] += 1
        after_table = alloc.block_table(op.seq)
        others = {s: t for s, t in before[3].items() if s != op.seq}
        changed = [s for s, t in others.items() if alloc.tokens(s) != t]
        if after_table[-1] == before[2][op.seq][-1]:
            problems["copy_before_shared_write"] = (
                f"{op} wrote into shared block {after_table[-1]} in place"
            )
        elif changed:
            problems["copy_before_shared_write"] = f"{op} changed what seq {changed[0]} reads"
    for key in ("free_or_owned", "refcount_matches", "conservation", "reads_what_it_wrote"):
        report.checks[key] += 1
    report.checks["no_double_free"] += 1
    for key, message in _state_problems(alloc, shadow).items():
        problems.setdefault(key, message)
    return problems


def oracle_failures(
    factory: Callable[[], BlockAllocator],
    oracle: Callable[[BlockAllocator, dict], list[str]],
    *,
    num_programs: int = 200,
    num_ops: int = 20,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
) -> tuple[int, list[Op] | None]:
    """Programs (of ``num_programs`` seeded random ones) after which ``oracle`` complains.

    ``oracle(allocator, shadow)`` is e.g. :func:`lib.kvcache.ownership_oracle` or
    :func:`lib.kvcache.content_oracle`; it runs after every op. Returns (failing programs, the
    first failing program's ops up to the failing op, or None). Same programs as
    :func:`grade_allocator` draws for the same seed, without double-free attempts.
    """
    n_prog = integer("num_programs", num_programs, 1)
    n_ops = integer("num_ops", num_ops, 1)
    seed = integer("seed", seed, 0)
    probe = factory()
    if not isinstance(probe, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(probe).__name__}")
    cap = probe.num_blocks * probe.block_size
    max_prompt = (
        cap if max_prompt_tokens is None else integer("max_prompt_tokens", max_prompt_tokens, 0)
    )
    failing, first = 0, None
    for index in range(n_prog):
        rng = random.Random(seed * 1_000_003 + index)
        alloc, shadow, ops, next_id = factory(), {}, [], 0
        for _ in range(n_ops):
            op = random_program(rng, list(shadow), [], next_id, max_prompt_tokens=max_prompt)
            next_id += op.kind in ("allocate", "fork")
            op.apply(alloc, shadow)
            ops.append(op)
            if oracle(alloc, shadow):
                failing += 1
                first = first or list(ops)
                break
    return failing, first


def admission_trace(
    factory: Callable[[], BlockAllocator], request_tokens: Iterable[int]
) -> tuple[np.ndarray, int]:
    """Serve requests FIFO on one allocator, preempting the oldest when the pool is full.

    For each request of ``L`` tokens: try ``allocate``; on :class:`~lib.kvcache.OutOfBlocks`
    free the oldest live request and retry, until it fits or nothing is left to preempt (then the
    request is rejected). Returns (usable blocks ``free + used`` after each request, rejected
    requests). A correct allocator keeps ``free + used == num_blocks`` throughout.
    """
    from lib.kvcache import OutOfBlocks

    alloc = factory()
    if not isinstance(alloc, BlockAllocator):
        raise ValueError(f"factory must return a BlockAllocator, got {type(alloc).__name__}")
    lengths = integer_array("request_tokens", list(request_tokens))
    live: list[int] = []
    usable = np.empty(lengths.size, dtype=np.int64)
    rejected = 0
    for i, length in enumerate(lengths.tolist()):
        while True:
            try:
                alloc.allocate(i, [0] * length)
                live.append(i)
                break
            except OutOfBlocks:
                if not live:
                    rejected += 1
                    break
                alloc.free(live.pop(0))
        usable[i] = alloc.num_free_blocks + alloc.num_used_blocks
    return usable, rejected


_OP_TEXT = re.compile(
    r"^(?:allocate\(seq=(?P<aseq>-?\d+), tokens=\[(?P<tokens>[\d, ]*)\]\)"
    r"|fork\(parent=(?P<parent>-?\d+), child=(?P<child>-?\d+)\)"
    r"|append\(seq=(?P<pseq>-?\d+), token=(?P<token>\d+)\)"
    r"|free\(seq=(?P<fseq>-?\d+)\))$"
)


def parse_op(text: str) -> Op:
    """Rebuild an :class:`~lib.kvcache.Op` from its printed form (``str(op)``).

    :func:`lib.kvcache.find_minimal_failure` returns programs as strings; this turns them back
    into operations that :func:`lib.kvcache.first_violation` can replay.
    """
    match = _OP_TEXT.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"op must look like allocate(seq=0, tokens=[0, 1]), fork(parent=0, child=1), "
            f"append(seq=0, token=3) or free(seq=0); got {text!r}"
        )
    g = match.groupdict()
    if g["aseq"] is not None:
        tokens = tuple(int(t) for t in g["tokens"].split(",") if t.strip())
        return Op("allocate", int(g["aseq"]), tokens)
    if g["parent"] is not None:
        return Op("fork", int(g["parent"]), int(g["child"]))
    if g["pseq"] is not None:
        return Op("append", int(g["pseq"]), int(g["token"]))
    return Op("free", int(g["fseq"]))
