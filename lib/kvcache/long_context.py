"""Where a long-context replica stops coping (N031): the context lengths at which capacity, time
to first token and the scheduler give out, and the chunked-prefill steps of a long prompt.

Capacity is :func:`lib.perf.memory.memory_budget` (a :class:`~lib.perf.memory.MemoryBudget`);
prefill time is :func:`lib.perf.prefill.prefill_time` (compute at the compute-only MFU, weight
read, TP all-reduces), applied chunk by chunk. SI units: tokens, bytes, seconds.
"""

from __future__ import annotations

from lib.inputs import fraction, integer, real
from lib.perf.memory import MemoryBudget, fact
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.search import largest_true


def prefill_chunk_compute_s(
    mdl: str | Model,
    chip: str | GPU,
    chunk_tokens: int,
    position: int,
    tp: int = 1,
    mfu: float | None = None,
    compute_dtype: str = "bf16",
) -> float:
    """Compute part of one chunked-prefill step: ``chunk_tokens`` new tokens after ``position`` cached ones.

    FLOPs = C x 2N + a x (C p + C (C + 1) / 2), a = attention FLOPs per (query, key) pair; time =
    FLOPs / (tp x peak x mfu), the compute term of :func:`lib.perf.prefill.prefill_time` at the
    compute-only MFU (None: ``prefill.prefill_mfu``). The attention term grows with the position,
    so a fixed token budget stops bounding the step time once p passes 2N / a (the attention
    crossover). The step's wall time is :func:`prefill_chunk_step_s`.
    """
    from lib.perf.prefill import default_mfu

    m, g = model(mdl), gpu(chip)
    tp = m.check_tp(tp)
    c = integer("chunk_tokens", chunk_tokens, 1)
    p = real("position", position, 0)
    u = default_mfu(mfu)
    flops = c * m.weight_flops_per_token() + m.attention_flops_per_token(1) * (
        c * p + c * (c + 1) / 2
    )
    return flops / (tp * g.peak_flops(compute_dtype) * u)


def prefill_chunk_step_s(dep, chunk_tokens: int, position: int, other_tokens: int = 0,
                         mfu: float | None = None) -> float:
    """Wall time of one chunked-prefill step of the replica ``dep``, seconds: ``chunk_tokens`` of a
    prompt at ``position`` plus ``other_tokens`` of other requests' prefill (2N FLOPs each).

    max(compute, weight read) + the TP all-reduces of every token in the step, the terms of
    :func:`lib.perf.prefill.prefill_time`: compute = :func:`prefill_chunk_compute_s` + others x 2N /
    (tp peak mfu); weight read and all-reduce from :mod:`lib.perf.prefill` for the step's tokens.
    """
    from lib.perf.prefill import default_mfu, prefill_allreduce_s, prefill_estimate

    m, g, tp = dep.mdl, dep.chip, dep.tp
    u = default_mfu(mfu)
    other = integer("other_tokens", other_tokens, 0)
    c = integer("chunk_tokens", chunk_tokens, 1)
    compute = prefill_chunk_compute_s(m, g, c, position, tp, u, dep.compute_dtype) + (
        other * m.weight_flops_per_token() / (tp * g.peak_flops(dep.compute_dtype) * u)
    )
    tokens = c + other
    read = prefill_estimate(m, g, tokens, tp, u, dep.weight_dtype, dep.compute_dtype, dep.kv_dtype).memory_s
    return max(compute, read) + prefill_allreduce_s(m, g, tokens, tp, 1, dep.act_dtype)


def capacity_break_context(budget: MemoryBudget, target_sequences: int) -> int:
    """Longest context at which ``target_sequences`` sequences still fit: the pool's tokens / target.

    Rounded down to whole blocks, since each sequence takes ceil(L / block) blocks.
    """
    target_sequences = integer("target_sequences", target_sequences, 1)
    blocks_each = budget.num_blocks // target_sequences
    if blocks_each < 1:
        raise ValueError(
            f"{target_sequences} sequences do not fit even at one block each "
            f"({budget.num_blocks} blocks)"
        )
    return blocks_each * budget.block_size


def admission_share(budget: MemoryBudget, context: int) -> float:
    """Share of the KV pool one sequence of ``context`` tokens needs: blocks each / blocks."""
    return budget.blocks_per_sequence(context) / budget.num_blocks


def scheduler_break_context(budget: MemoryBudget, share: float | None = None) -> int:
    """Context at which one request needs more than ``share`` of the pool (default 10%).

    Under load the pool is nearly full; a request larger than the slack the scheduler normally
    has free waits at the head of the queue (FCFS), blocking everyone behind it, or forces
    preemption as it grows.
    """
    share = fact("headroom_fraction_for_admission") if share is None else share
    s = fraction("share", share, allow_zero=False)
    return int(s * budget.num_blocks) * budget.block_size


def ttft_break_context(dep, ttft_slo_s: float, mfu: float | None = None) -> int:
    """Longest prompt (tokens) whose prefill alone fits in ``ttft_slo_s``: the largest P with
    :func:`lib.perf.prefill.prefill_time` (dep, P) <= SLO (compute at the compute-only MFU, weight
    read, TP all-reduces), by bisection; 0 when even one token does not fit. The compute-only
    closed form :func:`lib.perf.prefill.prompt_len_for_time` bounds it from above.
    """
    from lib.perf.prefill import default_mfu, prefill_time, prompt_len_for_time

    slo = real("ttft_slo_s", ttft_slo_s, 0, low_open=True, unit="seconds")
    mfu = default_mfu(mfu)

    def fits(n: int) -> bool:
        return prefill_time(dep, n, mfu=mfu).time_s <= slo

    if not fits(1):
        return 0
    lo = 1
    hi = int(prompt_len_for_time(dep.mdl, dep.chip, slo, dep.tp, mfu, dep.compute_dtype)) + 2
    if fits(hi):  # not reached while time >= compute time; kept as a guard
        return hi
    return largest_true(fits, lo + 1, hi - 1)  # fits(lo) and not fits(hi): neither called again


def capped_long_prefill_s(dep, prompt_len: int, cap_tokens: int, step_tokens: int,
                          mfu: float | None = None) -> float:
    """Time to first token of a long prompt prefilled at most ``cap_tokens`` per step, seconds.

    Each step runs ``step_tokens`` tokens (the scheduler's budget): c_k = min(cap, remaining)
    of the long prompt at position p_k, and step_tokens - c_k tokens of other requests.
    TTFT = sum_k :func:`prefill_chunk_step_s` (c_k, p_k, step_tokens - c_k). With cap =
    step_tokens and no other work this is the plain chunked prefill; a smaller cap lets short
    requests share every step (no head-of-line wait) and stretches the long request's TTFT.
    """
    p_len = integer("prompt_len", prompt_len, 1)
    cap = integer("cap_tokens", cap_tokens, 1)
    budget = integer("step_tokens", step_tokens, 1)
    if cap > budget:
        raise ValueError(f"cap_tokens={cap} cannot exceed step_tokens={budget}")
    total, pos = 0.0, 0
    while pos < p_len:
        c = min(cap, p_len - pos)
        total += prefill_chunk_step_s(dep, c, pos, budget - c, mfu)
        pos += c
    return total
