"""Speculative decoding's arithmetic: tokens per verification step, the speedup, and the step time.

A drafter proposes ``k`` tokens per sequence; the target verifies them in one pass of ``k + 1``
query tokens per sequence and keeps the accepted prefix plus one token of its own. With i.i.d.
per-token acceptance ``a`` (Leviathan, Kalman and Matias, ICML 2023, eq. 1) a step yields

    E[tokens] = (1 - a^(k+1)) / (1 - a)          (k + 1 at a = 1; 1 at a = 0)

:func:`speculative_speedup` is the paper's closed form with a constant draft-to-target cost ratio
and a verification pass that costs one plain step. :func:`speculative_step` prices the same step
on a :class:`~lib.perf.deployment.Deployment` with the book's one step model
(:func:`lib.perf.step.decode_step`): the verification pass at ``query_tokens = k + 1`` (weights and
each sequence's KV read once, FLOPs for every query token, so it stops being free once the batch
nears the compute ridge) plus ``k`` drafter steps priced by a :class:`Drafter`. SI units: seconds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.perf.deployment import Deployment, require
from lib.perf.step import StepAssumptions, decode_step, step_assumptions, step_kernels
from lib.registry.dtypes import bytes_per_element
from lib.search import smallest_true

__all__ = [
    "Drafter",
    "SpeculativeStep",
    "acceptance_needed",
    "best_draft_tokens",
    "break_even_batch",
    "break_even_batch_estimate",
    "draft_length_table",
    "free_drafter",
    "model_drafter",
    "simulate_speculative_tokens_per_step",
    "speculative_speedup",
    "speculative_step",
    "speculative_tokens_per_step",
    "verify_free_tokens",
    "verify_ridge_batch",
]


def speculative_tokens_per_step(acceptance, draft_tokens):
    """Expected tokens per verify step: (1 - a^(k+1)) / (1 - a) for acceptance a, k drafted tokens.

    Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding"
    (ICML 2023), eq. 1, assuming i.i.d. acceptances. a = 1 gives k + 1; a = 0 gives 1. Scalars give
    a float; arrays (broadcast against each other) give an array.
    """
    if np.ndim(acceptance) == 0 and np.ndim(draft_tokens) == 0:
        g = integer("draft_tokens", draft_tokens, 0)
        fraction("acceptance", acceptance)
        if acceptance == 1:
            return float(g + 1)
        return (1 - acceptance ** (g + 1)) / (1 - acceptance)
    a = np.asarray(acceptance, dtype=float)
    k = np.asarray(draft_tokens)
    if not (np.isfinite(a).all() and ((a >= 0) & (a <= 1)).all()):
        raise ValueError("acceptance must hold fractions in [0, 1]")
    if not (np.issubdtype(k.dtype, np.integer) or np.array_equal(k, np.round(k))) or (k < 0).any():
        raise ValueError("draft_tokens must hold whole numbers >= 0")
    k = k.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1 - a ** (k + 1)) / (1 - a)
    return np.where(a >= 1, k + 1, out)


def speculative_speedup(acceptance: float, draft_tokens: int, draft_cost: float) -> float:
    """Wall-clock speedup of speculative decoding: tokens per step / (1 + k c).

    c = one draft forward's time over one target forward's time (Leviathan et al. 2023,
    Theorem 3.8); verify cost taken as one target step (memory-bound: true while k + 1 tokens
    per sequence times the batch stay far below the ridge; :func:`speculative_step` drops that
    assumption).
    """
    real("draft_cost", draft_cost, 0)
    g = integer("draft_tokens", draft_tokens, 0)
    return speculative_tokens_per_step(acceptance, g) / (1 + g * draft_cost)


def acceptance_needed(target_speedup: float, draft_tokens: int, draft_cost: float) -> float:
    """Smallest acceptance rate a whose :func:`speculative_speedup` reaches ``target_speedup``
    (bisection; the speedup rises monotonically with a). math.inf when even a = 1 falls short;
    0 when no speculation is needed (target <= speedup at a = 0)."""
    real("target_speedup", target_speedup, 0, low_open=True)
    if speculative_speedup(1.0, draft_tokens, draft_cost) < target_speedup:
        return math.inf
    if speculative_speedup(0.0, draft_tokens, draft_cost) >= target_speedup:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if speculative_speedup(mid, draft_tokens, draft_cost) < target_speedup else (lo, mid)
    return hi


def simulate_speculative_tokens_per_step(acceptance: float, draft_tokens: int, steps: int = 20000,
                                         seed: int = 0) -> np.ndarray:
    """Monte Carlo of the tokens each verify step emits: accepted drafts until the first
    rejection (at most k), plus the one token the target always contributes."""
    g = integer("draft_tokens", draft_tokens, 0)
    s = integer("steps", steps, 1)
    fraction("acceptance", acceptance)
    rng = np.random.default_rng(seed)
    if g == 0:
        return np.ones(s)
    accepted = rng.random((s, g)) < acceptance
    return np.cumprod(accepted, axis=1).sum(axis=1) + 1.0


# ---- the step on a deployment ------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _step_s(dep: Deployment, batch: int, context: int, assume: StepAssumptions | None, query_tokens: int) -> float:
    """:func:`decode_step`'s total, remembered: a speculative step prices the same (batch, context)
    for every draft length and acceptance, and the batch searches revisit their bounds. A pure
    function of frozen inputs."""
    return decode_step(dep, batch, context, assume, query_tokens=query_tokens).total_s



@dataclass(frozen=True)
class Drafter:
    """How a drafter costs. ``token_s(batch, context)``: seconds to draft one token for every
    sequence of the batch (one drafter forward); ``name`` for display; ``kind``: ``model`` (a
    separate small model), ``head`` (a head on the target's features, e.g. EAGLE / MTP),
    ``lookup`` (n-gram / prompt lookup, no forward pass)."""

    name: str
    kind: str
    token_s: Callable[[int, int], float]

    def __post_init__(self) -> None:
        if self.kind not in ("model", "head", "lookup"):
            raise ValueError(f"drafter kind must be model, head or lookup; got {self.kind!r}")


def model_drafter(draft: Deployment, assume: StepAssumptions | None = None) -> Drafter:
    """A separate draft model on its own :class:`Deployment` (usually the target's GPUs): each
    drafted token is one :func:`decode_step` of the draft at the same batch and context."""
    require(draft)
    return Drafter(draft.label, "model", lambda b, c: _step_s(draft, b, c, assume, 1))


def free_drafter(name: str = "prompt lookup", token_s: float = 0.0) -> Drafter:
    """A drafter with no forward pass (n-gram / prompt lookup): ``token_s`` seconds per drafted
    token for the whole batch, whatever the batch and context (host-side string matching)."""
    cost = real("token_s", token_s, 0.0, unit="seconds")
    return Drafter(name, "lookup", lambda b, c: cost)


@dataclass(frozen=True)
class SpeculativeStep:
    """One speculative step for ``batch`` sequences at ``context``: ``draft_tokens`` drafter
    forwards, then one verification pass of ``draft_tokens + 1`` query tokens per sequence.
    Seconds; ``tokens_per_step`` is per sequence (expected)."""

    batch: int
    context: int
    draft_tokens: int
    acceptance: float
    plain_step_s: float  # the target's own decode step (no speculation)
    draft_s: float  # k drafter forwards
    verify_s: float  # the target's pass over k + 1 tokens per sequence
    tokens_per_step: float

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the replica (all sequences)."""
        return self.batch * self.tokens_per_step / self.step_s

    @property
    def plain_tokens_per_s(self) -> float:
        return self.batch / self.plain_step_s

    @property
    def speedup(self) -> float:
        """Tokens per second with speculation over without (< 1: speculation slows the replica)."""
        return self.tokens_per_s / self.plain_tokens_per_s

    @property
    def per_token_latency_s(self) -> float:
        """Mean time between one sequence's output tokens (TPOT)."""
        return self.step_s / self.tokens_per_step

    @property
    def verify_overhead(self) -> float:
        """Verification pass over the plain step: 1 while the pass is memory-bound, then growing."""
        return self.verify_s / self.plain_step_s


def speculative_step(dep: Deployment, drafter: Drafter, draft_tokens: int, acceptance: float, batch: int = 1,
                     context: int = 0, assume: StepAssumptions | None = None) -> SpeculativeStep:
    """Price one speculative step on ``dep`` (module doc): ``k`` drafter forwards
    (``drafter.token_s(batch, context)`` each; drafts priced at ``context``, an error of k tokens of
    context) plus :func:`decode_step` at ``query_tokens = k + 1``; ``k = 0`` is plain decoding.
    ``acceptance``: i.i.d. per-token acceptance rate (0-1)."""
    require(dep)
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a Drafter (model_drafter, free_drafter, ...); got {type(drafter).__name__}")
    k = integer("draft_tokens", draft_tokens, 0, 32, unit="tokens")
    a = fraction("acceptance", acceptance)
    plain = _step_s(dep, batch, context, assume, 1)
    verify = _step_s(dep, batch, context, assume, k + 1) if k else plain
    draft = k * drafter.token_s(batch, context) if k else 0.0
    return SpeculativeStep(batch, context, k, a, plain, draft, verify, speculative_tokens_per_step(a, k))


def best_draft_tokens(dep: Deployment, drafter: Drafter, acceptance: float, batch: int = 1, context: int = 0,
                      max_draft_tokens: int = 12, assume: StepAssumptions | None = None) -> SpeculativeStep:
    """The draft length ``k`` in ``0..max_draft_tokens`` with the most tokens per second (ties: the
    shorter); ``k = 0`` when speculation does not pay at this batch."""
    top = integer("max_draft_tokens", max_draft_tokens, 0, 32, unit="tokens")
    steps = [speculative_step(dep, drafter, k, acceptance, batch, context, assume) for k in range(top + 1)]
    return max(steps, key=lambda s: (s.tokens_per_s, -s.draft_tokens))


# ---- where speculation runs out of spare compute ------------------------------------------------

MAX_SEARCH_BATCH = 1 << 16  # the batch searches below stop here (no replica holds more sequences)


def verify_free_tokens(dep: Deployment, assume: StepAssumptions | None = None) -> float:
    """T*: tokens per step at which one weight GEMM of the step model turns compute-bound, the
    roofline ridge in tokens. A GEMM over T tokens reads N K b_w bytes at W x gemv_eff and does
    2 T N K FLOPs at P x matmul_eff, so the two times meet at

        T* = P x matmul_eff x b_w / (2 W x gemv_eff)        (tokens; b_w bytes per weight)

    which is the chip's ridge (P / W, FLOP/B) times b_w / 2 and the efficiency ratio. The
    verification pass of k drafts per sequence (batch x (k + 1) tokens through the GEMMs) is free
    while batch x (k + 1) < T*. A closed form: :func:`verify_ridge_batch` reads the same point off
    the step model itself."""
    require(dep)
    a = assume or step_assumptions()
    g = dep.chip
    b_w = bytes_per_element(dep.weight_dtype)
    return g.peak_flops(dep.compute_dtype) * a.matmul_efficiency * b_w / (2 * g.memory_bandwidth * a.gemv_efficiency)


def verify_ridge_batch(dep: Deployment, draft_tokens: int, context: int = 0,
                       assume: StepAssumptions | None = None) -> float:
    """Smallest batch at which a weight GEMM of the verification pass of ``draft_tokens`` (k)
    drafts per sequence (the step model's kernels at ``query_tokens = k + 1``,
    :func:`lib.perf.step.step_kernels`) runs longer on its FLOPs than on its bytes, by the same
    per-kernel comparison :func:`decode_step` makes (FLOPs at P x matmul_eff against bytes at
    W x gemv_eff): from here on every extra drafted token costs tensor-core time. GEMMs only (a
    near-empty context makes attention's few bytes look compute-bound at any batch). Integer search;
    math.inf when no batch up to ``MAX_SEARCH_BATCH`` gets there. ``k = 0``: the plain step's."""
    require(dep)
    q = integer("draft_tokens", draft_tokens, 0, 32, unit="tokens") + 1
    context = integer("context", context, 0, unit="tokens")
    a = assume or step_assumptions()
    peak = dep.chip.peak_flops(dep.compute_dtype) * a.matmul_efficiency
    bw = dep.chip.memory_bandwidth * a.gemv_efficiency

    def excess(b: int) -> float:
        return float(any(k.category == "gemm" and k.flops / peak > (k.weight_bytes + k.kv_bytes + k.other_bytes) / bw
                         for k in step_kernels(dep, b, context, a, q)))

    return float(_first_true(excess, MAX_SEARCH_BATCH))


def _first_true(bad: Callable[[int], float], top: int) -> int | float:
    """Smallest integer b in 1..top with bad(b) > 0 (bad is monotone in b), else math.inf."""
    if bad(1) > 0:
        return 1
    lo, hi = 1, 2
    while bad(hi) <= 0:
        if hi >= top:
            return math.inf
        lo, hi = hi, min(2 * hi, top)
    return smallest_true(lambda b: not (bad(b) <= 0), lo + 1, hi - 1)  # bad(lo) <= 0 < bad(hi)


def break_even_batch(dep: Deployment, drafter: Drafter, draft_tokens: int, acceptance: float, context: int = 0,
                     assume: StepAssumptions | None = None, max_batch: int = MAX_SEARCH_BATCH) -> float:
    """The batch at which speculation stops paying: where :func:`speculative_step`'s speedup
    (replica tokens/s with k drafts over without) falls to 1, found by integer search on the step
    model (the speedup falls with the batch) and linear interpolation of the speedup between the
    two integers around the crossing (a fraction: 183.4 sequences, not 183). 1.0 when speculation
    does not pay even at batch 1; math.inf when it still pays at ``max_batch``."""
    k = integer("draft_tokens", draft_tokens, 1, 32, unit="tokens")
    top = integer("max_batch", max_batch, 1, unit="sequences")
    context = integer("context", context, 0, unit="tokens")

    def up(b: int) -> float:
        return speculative_step(dep, drafter, k, acceptance, b, context, assume).speedup

    if up(1) <= 1:
        return 1.0
    if top < 2:
        return math.inf
    lo, hi = 1, 2  # exponential search over powers of two, then regula falsi on the integers
    while up(hi) > 1:
        if hi >= top:
            return math.inf
        lo, hi = hi, min(2 * hi, top)
    while hi - lo > 1:
        s_lo, s_hi = up(lo), up(hi)
        guess = lo + (s_lo - 1) / (s_lo - s_hi) * (hi - lo)  # the speedup is nearly linear in a bracket
        for m in dict.fromkeys((min(max(math.floor(guess), lo + 1), hi - 1), min(max(math.ceil(guess), lo + 1), hi - 1),
                                (lo + hi) // 2)):
            if lo < m < hi:
                lo, hi = (m, hi) if up(m) > 1 else (lo, m)
    s_lo, s_hi = up(lo), up(hi)
    return lo + (s_lo - 1) / (s_lo - s_hi)


def break_even_batch_estimate(acceptance: float, draft_tokens: int, draft_cost: float, ridge_tokens: float) -> float:
    """Closed form of :func:`break_even_batch` for a step that is all weight read: the plain step
    costs t (memory-bound, batch below the ridge), the verification pass max(t, t B (k + 1) / T*)
    (its GEMMs see B (k + 1) tokens), the drafts k c t. The speedup E / (max(1, B (k+1) / T*) + k c)
    falls to 1 at

        B = T* (E - k c) / (k + 1)         (sequences; E = speculative_tokens_per_step(a, k))

    0 when E <= 1 + k c (no batch pays). It ignores what the step model adds: the KV read (which a
    verification pass shares across its k + 1 tokens, so long contexts move the real crossing up),
    fixed per-step costs (idem) and the drafter's cost growing with the batch (down)."""
    k = integer("draft_tokens", draft_tokens, 1, 32, unit="tokens")
    c = real("draft_cost", draft_cost, 0)
    t_star = real("ridge_tokens", ridge_tokens, 0, low_open=True, unit="tokens")
    e = speculative_tokens_per_step(acceptance, k)
    if e <= 1 + k * c:
        return 0.0
    return t_star * (e - k * c) / (k + 1)


def draft_length_table(dep: Deployment, drafter: Drafter, acceptance: float, batch_buckets, context: int = 0,
                       max_draft_tokens: int = 8, assume: StepAssumptions | None = None) -> tuple[SpeculativeStep, ...]:
    """The table an engine ships: for each batch bucket (its upper edge; a running batch is padded
    up to the next captured CUDA-graph size, so the bucket's step is the edge's), the draft length
    k in 0..max_draft_tokens with the most replica tokens/s (:func:`best_draft_tokens`; k = 0:
    speculation off). ``batch_buckets``: increasing batch sizes >= 1."""
    edges = [integer("batch_buckets", b, 1, unit="sequences") for b in batch_buckets]
    if not edges or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"batch_buckets must be a non-empty increasing list of batch sizes; got {list(batch_buckets)}")
    return tuple(best_draft_tokens(dep, drafter, acceptance, b, context, max_draft_tokens, assume) for b in edges)
