"""Seeded token-sequence workloads for prefix caches: multi-turn chat and branching agents.

Token ids are drawn uniformly from ``range(vocab_size)``; a small vocabulary makes accidental
partial matches (and so edge splits) common, a large one makes them rare.
"""

from __future__ import annotations

import numpy as np

from lib.inputs import integer

__all__ = ["branching_agent_trace", "multi_turn_chat_trace"]


def multi_turn_chat_trace(
    num_conversations: int,
    num_turns: int,
    *,
    system_prompt_tokens: int = 32,
    user_tokens: int = 8,
    reply_tokens: int = 8,
    vocab_size: int = 1000,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """Requests of interleaved chats sharing one system prompt; each turn extends its chat.

    Turn ``t`` of a conversation is ``system + user_1 + reply_1 + ... + user_t + reply_t``; the
    next turn of that conversation starts with it. Turns from different conversations are
    interleaved in a seeded random order (each conversation's turns stay in order). Returns
    ``num_conversations * num_turns`` token tuples.
    """
    num_conversations = integer("num_conversations", num_conversations, 1)
    num_turns = integer("num_turns", num_turns, 1)
    system_prompt_tokens = integer("system_prompt_tokens", system_prompt_tokens, 0)
    user_tokens = integer("user_tokens", user_tokens, 0)
    reply_tokens = integer("reply_tokens", reply_tokens, 0)
    vocab_size = integer("vocab_size", vocab_size, 1)
    rng = np.random.default_rng(seed)
    system = tuple(rng.integers(0, vocab_size, system_prompt_tokens).tolist())
    history = [system] * num_conversations
    order = rng.permutation(np.repeat(np.arange(num_conversations), num_turns)).tolist()
    requests = []
    for conversation in order:
        turn = rng.integers(0, vocab_size, user_tokens + reply_tokens).tolist()
        history[conversation] = history[conversation] + tuple(turn)
        requests.append(history[conversation])
    return requests


def branching_agent_trace(
    num_requests: int,
    *,
    system_prompt_tokens: int = 32,
    step_tokens: int = 8,
    max_depth: int = 6,
    vocab_size: int = 1000,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """Agent trajectories that branch from a shared system prompt with tool outputs appended.

    The first request is ``system + step``. Each later request picks an earlier request (seeded,
    uniformly) and extends it with one new step of ``step_tokens`` (a tool call and its output);
    a request already ``max_depth`` steps deep restarts from the system prompt instead. So many
    branches share the system prompt and some share longer trajectories.
    """
    num_requests = integer("num_requests", num_requests, 1)
    system_prompt_tokens = integer("system_prompt_tokens", system_prompt_tokens, 0)
    step_tokens = integer("step_tokens", step_tokens, 1)
    max_depth = integer("max_depth", max_depth, 1)
    vocab_size = integer("vocab_size", vocab_size, 1)
    rng = np.random.default_rng(seed)
    system = tuple(rng.integers(0, vocab_size, system_prompt_tokens).tolist())
    requests: list[tuple[int, ...]] = []
    depths: list[int] = []
    for _ in range(num_requests):
        base, depth = system, 0
        if requests:
            parent = int(rng.integers(0, len(requests)))
            if depths[parent] < max_depth:
                base, depth = requests[parent], depths[parent]
        step = tuple(rng.integers(0, vocab_size, step_tokens).tolist())
        requests.append(base + step)
        depths.append(depth + 1)
    return requests
