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

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.perf.deployment import Deployment, require
from lib.perf.step import StepAssumptions, decode_step

__all__ = [
    "Drafter",
    "SpeculativeStep",
    "acceptance_needed",
    "best_draft_tokens",
    "free_drafter",
    "model_drafter",
    "simulate_speculative_tokens_per_step",
    "speculative_speedup",
    "speculative_step",
    "speculative_tokens_per_step",
]


def speculative_tokens_per_step(acceptance: float, draft_tokens: int) -> float:
    """Expected tokens per verify step: (1 - a^(k+1)) / (1 - a) for acceptance a, k drafted tokens.

    Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding"
    (ICML 2023), eq. 1, assuming i.i.d. acceptances. a = 1 gives k + 1; a = 0 gives 1.
    """
    g = integer("draft_tokens", draft_tokens, 0)
    fraction("acceptance", acceptance)
    if acceptance == 1:
        return float(g + 1)
    return (1 - acceptance ** (g + 1)) / (1 - acceptance)


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
    return Drafter(draft.label, "model", lambda b, c: decode_step(draft, b, c, assume).total_s)


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
    plain = decode_step(dep, batch, context, assume).total_s
    verify = decode_step(dep, batch, context, assume, query_tokens=k + 1).total_s if k else plain
    draft = k * drafter.token_s(batch, context) if k else 0.0
    return SpeculativeStep(batch, context, k, a, plain, draft, verify, speculative_tokens_per_step(a, k))


def best_draft_tokens(dep: Deployment, drafter: Drafter, acceptance: float, batch: int = 1, context: int = 0,
                      max_draft_tokens: int = 12, assume: StepAssumptions | None = None) -> SpeculativeStep:
    """The draft length ``k`` in ``0..max_draft_tokens`` with the most tokens per second (ties: the
    shorter); ``k = 0`` when speculation does not pay at this batch."""
    top = integer("max_draft_tokens", max_draft_tokens, 0, 32, unit="tokens")
    steps = [speculative_step(dep, drafter, k, acceptance, batch, context, assume) for k in range(top + 1)]
    return max(steps, key=lambda s: (s.tokens_per_s, -s.draft_tokens))
