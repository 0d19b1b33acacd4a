"""Prefix-cache hit rates and the prefill they save (N027): seeded traces replayed through
:class:`lib.kvcache.RadixCache`, a brute-force longest-common-prefix oracle, closed forms for the
shared-prompt and multi-turn-chat traces, and the prefill FLOPs with and without the hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer
from lib.kvcache import (
    RadixCache,
    branching_agent_trace,
    multi_turn_chat_trace,
)
from lib.kvcache.recompute_fetch import prefill_flops_with_cached_prefix
from lib.registry.models import Model, model

# ---- hit-rate and savings accounting ----------------------------------------------------------

WORKLOADS = ("unrelated", "shared_prompt", "multi_turn_chat", "branching_agent")


def unrelated_trace(
    num_requests: int, prompt_tokens: int, *, vocab_size: int = 128_000, seed: int = 0
) -> list[tuple[int, ...]]:
    """``num_requests`` prompts of ``prompt_tokens`` uniform random tokens: no intended sharing.

    With vocabulary V, two prompts share a first token with probability 1/V (the only hits).
    """
    n = integer("num_requests", num_requests, 1)
    length = integer("prompt_tokens", prompt_tokens, 1)
    v = integer("vocab_size", vocab_size, 1)
    rng = np.random.default_rng(seed)
    return [tuple(row) for row in rng.integers(0, v, (n, length)).tolist()]


def workload_trace(
    kind: str,
    *,
    num_requests: int,
    system_prompt_tokens: int,
    turn_tokens: int,
    num_turns: int = 4,
    vocab_size: int = 128_000,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """The four traces of N027 with one set of knobs (token counts per request comparable):

    * unrelated: system_prompt_tokens + turn_tokens random tokens each, nothing shared;
    * shared_prompt: one shared system prompt + turn_tokens of user text per request;
    * multi_turn_chat: num_requests // num_turns conversations of num_turns turns, each turn
      adding turn_tokens (a quarter user, the rest the model's reply), interleaved;
    * branching_agent: each request extends a random earlier one by turn_tokens (a tool call and
      its output), restarting from the system prompt at depth num_turns.
    """
    if kind not in WORKLOADS:
        raise ValueError(f"kind must be one of {', '.join(WORKLOADS)}, got {kind!r}")
    n = integer("num_requests", num_requests, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    k = integer("turn_tokens", turn_tokens, 1)
    turns = integer("num_turns", num_turns, 1)
    if kind == "unrelated":
        return unrelated_trace(n, s + k, vocab_size=vocab_size, seed=seed)
    if kind == "shared_prompt":
        return multi_turn_chat_trace(
            n,
            1,
            system_prompt_tokens=s,
            user_tokens=k,
            reply_tokens=0,
            vocab_size=vocab_size,
            seed=seed,
        )
    if kind == "multi_turn_chat":
        user = max(k // 4, 1) if k > 1 else 1
        return multi_turn_chat_trace(
            max(n // turns, 1),
            turns,
            system_prompt_tokens=s,
            user_tokens=user,
            reply_tokens=k - user,
            vocab_size=vocab_size,
            seed=seed,
        )
    return branching_agent_trace(
        n, system_prompt_tokens=s, step_tokens=k, max_depth=turns, vocab_size=vocab_size, seed=seed
    )


@dataclass(frozen=True)
class HitTrace:
    """Per-request outcome of :func:`simulate_radix_hits` (tokens)."""

    prompt_tokens: tuple[int, ...]
    hit_tokens: tuple[int, ...]
    cached_tokens_peak: int  # most tokens held in the tree at once
    unique_tokens: int  # tokens in the tree at the end (= distinct prefixes if nothing was evicted)
    evicted_tokens: int
    num_nodes: int  # radix nodes at the end (edges), against unique_tokens for a plain trie

    @property
    def hit_rate(self) -> float:
        """Token hit rate: sum(hit) / sum(prompt)."""
        total = sum(self.prompt_tokens)
        return sum(self.hit_tokens) / total if total else 0.0

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


def simulate_radix_hits(
    requests: Sequence[Sequence[int]], num_slots: int | None = None, *, token_scale: int = 1
) -> HitTrace:
    """Replay ``requests`` one at a time through ``RadixCache(num_slots)``: match, then insert.

    ``num_slots`` None = room for every token (no eviction). ``token_scale`` multiplies every
    reported token count (a trace whose tokens each stand for that many real tokens; hit rates are
    unchanged when all lengths scale together). Raises OutOfSlots (a ValueError) if one request
    is longer than the pool.
    """
    reqs = [tuple(r) for r in requests]
    if not reqs:
        raise ValueError("requests must hold at least one token sequence")
    scale = integer("token_scale", token_scale, 1)
    unbounded = num_slots is None
    slots = (sum(len(r) for r in reqs) or 1) if unbounded else integer("num_slots", num_slots, 1)
    cache = RadixCache(slots)
    hits, prompts, peak, evicted = [], [], 0, 0
    for r in reqs:
        if not r:
            hits.append(0)
            prompts.append(0)
            continue
        before = cache.num_cached_tokens
        if unbounded:  # nothing is evicted: the tokens insert adds are exactly the misses
            cache.insert(r)
            hit = len(r) - (cache.num_cached_tokens - before)
        else:
            hit = cache.match_prefix(r).num_tokens
            cache.insert(r)
            evicted += before + (len(r) - hit) - cache.num_cached_tokens
        peak = max(peak, cache.num_cached_tokens)
        hits.append(hit * scale)
        prompts.append(len(r) * scale)
    return HitTrace(
        tuple(prompts),
        tuple(hits),
        peak * scale,
        cache.num_cached_tokens * scale,
        evicted * scale,
        sum(1 for _ in cache.nodes()),
    )


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def brute_force_hits(requests: Sequence[Sequence[int]]) -> list[int]:
    """Oracle for an unbounded prefix cache: request k hits max over j < k of LCP(r_k, r_j).

    No tree: compares every pair (O(n^2 L)); an independent check of :func:`simulate_radix_hits`.
    """
    arrays = [np.asarray(r) for r in requests]
    out = []
    for k, r in enumerate(arrays):
        best = 0
        for prev in arrays[:k]:
            if best == len(r):
                break
            best = max(best, longest_common_prefix(r, prev))
        out.append(best)
    return out


def shared_prompt_hit_rate(num_requests: int, system_prompt_tokens: int, user_tokens: int) -> float:
    """Closed form, unbounded cache: every request but the first hits the S-token system prompt.

    hit rate = (n - 1) S / (n (S + U)).
    """
    n = integer("num_requests", num_requests, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    u = integer("user_tokens", user_tokens, 0)
    return 0.0 if s + u == 0 else (n - 1) * s / (n * (s + u))


@dataclass(frozen=True)
class PrefixAccounting:
    """Token totals of a trace under an unbounded prefix cache."""

    hit_tokens: int
    prompt_tokens: int
    unique_tokens: int  # KV a prefix cache keeps: each distinct prefix once

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def chat_prefix_accounting(
    num_conversations: int,
    num_turns: int,
    system_prompt_tokens: int,
    user_tokens: int,
    reply_tokens: int,
) -> PrefixAccounting:
    """Closed form for ``multi_turn_chat_trace`` with an unbounded cache (k = user + reply):

    prompt tokens = C (T S + k T (T + 1) / 2); hits = (C - 1) S + C ((T - 1) S + k T (T - 1) / 2)
    (turn t re-reads turn t - 1 whole; each conversation's first turn hits only the system
    prompt, the very first request nothing); unique = S + C T k.
    """
    c = integer("num_conversations", num_conversations, 1)
    t = integer("num_turns", num_turns, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    k = integer("user_tokens", user_tokens, 0) + integer("reply_tokens", reply_tokens, 0)
    prompt = c * (t * s + k * t * (t + 1) // 2)
    hits = (c - 1) * s + c * ((t - 1) * s + k * t * (t - 1) // 2)
    return PrefixAccounting(hits, prompt, s + c * t * k)


@dataclass(frozen=True)
class PrefillSavings:
    """Prefill work of a trace without and with its prefix hits (FLOP, whole replica)."""

    flops_without: float
    flops_with: float
    tokens_without: int
    tokens_with: int

    @property
    def flops_saved(self) -> float:
        return self.flops_without - self.flops_with

    @property
    def fraction_saved(self) -> float:
        return self.flops_saved / self.flops_without if self.flops_without else 0.0


def prefill_savings(
    mdl: str | Model, prompt_lens: Sequence[int], hit_lens: Sequence[int]
) -> PrefillSavings:
    """Sum over requests of F(L) (no cache) and of the prefill with h cached tokens.

    A full hit still runs the last prompt token (its logits give the first output token; vLLM
    and SGLang do this), so h is capped at L - 1.
    """
    m = model(mdl)
    if len(prompt_lens) != len(hit_lens):
        raise ValueError(
            f"prompt_lens ({len(prompt_lens)}) and hit_lens ({len(hit_lens)}) differ in length"
        )
    without = with_ = 0.0
    t_without = t_with = 0
    for length, hit in zip(prompt_lens, hit_lens, strict=True):
        length = integer("prompt length", length, 0)
        hit = integer("hit length", hit, 0)
        if hit > length:
            raise ValueError(f"a hit ({hit}) cannot exceed its prompt ({length})")
        if length == 0:
            continue
        h = min(hit, length - 1)
        without += m.prefill_flops(length)
        with_ += prefill_flops_with_cached_prefix(m, length, h)
        t_without += length
        t_with += length - h
    return PrefillSavings(without, with_, t_without, t_with)
