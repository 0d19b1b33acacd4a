"""Block sharing and copy-on-write (I015): block counts with and without sharing for parallel
sampling, beam search and a shared prompt prefix, the copies each triggers, and replays that drive
the real :class:`lib.kvcache.BlockAllocator` to count the same things a second way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, integer_array, real
from lib.kvcache import BlockAllocator
from lib.kvcache.allocator import read_sequence, require_protocol


def _scalar_or_array(values: object):
    return int(values) if np.ndim(values) == 0 else values


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
def _used_blocks(alloc) -> int:
    """Blocks not on the free list (read through the allocator protocol)."""
    return alloc.num_blocks - len(set(alloc.free_block_ids()))


def _append_counting_copy(alloc, seq, token, length: int) -> int:
    """Append ``token`` to ``seq`` (which holds ``length`` tokens); 1 if its partly filled last
    block moved to another block id (a copy-on-write), else 0. Black-box: no copy log needed."""
    partial = length % alloc.block_size != 0
    last = alloc.block_table(seq)[-1] if partial else None
    alloc.append_token(seq, token)
    return int(partial and alloc.block_table(seq)[-1] != last)


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
    allocator_factory: Callable[[int, int], object] = BlockAllocator,
) -> ReplayCount:
    """Drive an allocator: allocate the prompt, fork ``n - 1`` samples, append ``G`` tokens each.

    Sample ``i`` writes token ``i`` at every step; contents_ok says every sample reads back the
    prompt followed by its own tokens. The pool is sized so it never runs out.
    """
    p = integer("prompt_tokens", prompt_tokens, 1)
    g = integer("output_tokens", output_tokens, 0)
    n = integer("num_samples", num_samples, 1)
    b = integer("block_size", block_size, 1)
    alloc = require_protocol(allocator_factory(n * (-(-(p + g) // b)) + n, b), "allocator_factory")
    prompt = [t % 50_000 for t in range(p)]
    alloc.allocate(0, prompt)
    for i in range(1, n):
        alloc.fork(0, i)
    used, copies = [_used_blocks(alloc)], 0
    for step in range(g):
        for i in range(n):
            copies += _append_counting_copy(alloc, i, i, p + step)
        used.append(_used_blocks(alloc))
    ok = all(read_sequence(alloc, i, p + g) == prompt + [i] * g for i in range(n))
    return ReplayCount(tuple(used), copies, ok)


def replay_shared_prefix(
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    num_requests: int,
    block_size: int,
    allocator_factory: Callable[[int, int], object] = BlockAllocator,
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
    alloc = require_protocol(
        allocator_factory(-(-s // b) + n * (-(-(s + u + g) // b)) + n, b), "allocator_factory"
    )
    prefix = [t % 50_000 for t in range(s)]
    alloc.allocate("prefix", prefix)
    used, copies = [_used_blocks(alloc)], 0
    for j in range(n):
        alloc.fork("prefix", j)
        for k in range(u + g):
            copies += _append_counting_copy(alloc, j, j, s + k)
        used.append(_used_blocks(alloc))
    ok = read_sequence(alloc, "prefix", s) == prefix and all(
        read_sequence(alloc, j, s + u + g) == prefix + [j] * (u + g) for j in range(n)
    )
    return ReplayCount(tuple(used), copies, ok)


def replay_beam_search(
    prompt_tokens: int,
    parents,
    block_size: int,
    allocator_factory: Callable[[int, int], object] = BlockAllocator,
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
    alloc = require_protocol(allocator_factory(k * (-(-(p + total) // b)) + k + 1, b), "allocator_factory")
    prompt = [t % 50_000 for t in range(p)]
    alloc.allocate(0, prompt)
    population, next_id, copies = [0], 1, 0
    used = [_used_blocks(alloc)]
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
            copies += _append_counting_copy(alloc, seq, beam, p + step)
        population = new_population
        used.append(_used_blocks(alloc))
    ok = True
    for beam, seq in enumerate(population):
        lineage, a = [], beam
        for step in range(total - 1, -1, -1):
            lineage.append(a)
            a = int(par[step][a])
        ok &= read_sequence(alloc, seq, p + total) == prompt + lineage[::-1]
    return ReplayCount(tuple(used), copies, bool(ok))
