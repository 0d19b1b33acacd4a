"""How much KV a batch class may hold before it breaks the interactive class's TPOT (I023).

A priority flag orders the queue; it does nothing to the batch sequences already running. Each of
them costs every decode step two things the interactive tokens wait for: its cached tokens are
read by the step's attention (the decode step's ``a C`` term), and its prompt is prefilled in
chunks that ride in the same steps (amortized over its output, ``f(P) / O`` per step). With the
book's step model (:class:`lib.scheduling.cost.StepCost`) the mean step with ``D_i`` interactive
and ``n`` batch decodes is::

    step(n) = dec(D_i + n, C_i + n c_b) + D_i f(P_i) / O_i + n f(P_b) / O_b

with ``c = P + O / 2`` the mean cached tokens of a decode over its life, ``f(P)`` the compute of a
whole prompt (:meth:`~lib.scheduling.cost.StepCost.chunk_compute_s`; chunks sum to it) and
``D_i = lambda_i O_i T`` the interactive decodes in flight at the target (Little's law: each spends
``O_i`` steps of ``T`` decoding). The batch class may run the largest ``n`` with step(n) <= T, and
hold ``n`` times its footprint against the cap: ``c_b`` cached tokens under greedy admission, or
prompt + ``max_tokens`` under reservation (what a reserving engine counts). A mean-step budget: the
tail of TPOT needs margin, which the simulator measures. SI units: seconds, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import real
from lib.search import largest_true

__all__ = ["BatchKVBudget", "DirectStepCost", "batch_kv_budget", "mean_step_parts"]


class DirectStepCost:
    """The two step prices :func:`batch_kv_budget` needs, evaluated with the step models
    themselves rather than a full table (for one-off questions and explorers that must not build
    a :class:`~lib.scheduling.cost.StepCost` per deployment).

    ``decode_s(D, C)`` = dec(D, 0) + a C with CUDA graphs, the decomposition
    :class:`~lib.scheduling.cost.StepCost` documents (the decodes' attention is linear in the
    summed context), each dec(D, 0) = ``decode_step(dep, D, 0).total_s`` computed once and kept,
    and ``a`` one difference quotient of ``decode_step``; eager deployments call
    ``decode_step(dep, D, round(C / D))`` directly. ``chunk_compute_s(c, p)`` =
    :func:`lib.kvcache.long_context.prefill_chunk_compute_s` at the compute-only MFU.
    """

    def __init__(self, dep, *, assume=None, mfu: float | None = None) -> None:
        from lib.perf.deployment import require
        from lib.perf.prefill import default_mfu
        from lib.perf.step import decode_step, step_assumptions

        self.dep = dep = require(dep)
        self.assume = assume or step_assumptions()
        self.mfu = default_mfu(mfu)
        self.max_running = dep.max_num_seqs
        self.kv_blocks = dep.budget.num_blocks
        self.block_size = dep.block_size
        self._dec0: dict[int, float] = {}
        self.attention_s_per_token = None
        if dep.cuda_graphs:
            c0 = min(8192, dep.mdl.max_position_embeddings)
            self.attention_s_per_token = (decode_step(dep, 1, c0, self.assume).total_s - self._decode0(1)) / c0

    def _decode0(self, d: int) -> float:
        if d not in self._dec0:
            from lib.perf.step import decode_step

            self._dec0[d] = decode_step(self.dep, d, 0, self.assume).total_s
        return self._dec0[d]

    def decode_s(self, decode_seqs: int, context_tokens: float) -> float:
        """dec(D, 0) + a C (CUDA graphs), else decode_step(dep, D, round(C / D)).total_s; seconds."""
        if self.attention_s_per_token is not None:
            return self._decode0(decode_seqs) + self.attention_s_per_token * context_tokens
        from lib.perf.step import decode_step

        return decode_step(self.dep, decode_seqs, round(context_tokens / decode_seqs), self.assume).total_s

    def chunk_compute_s(self, chunk_tokens: int, position: int) -> float:
        """prefill_chunk_compute_s(c, p) on the replica, seconds."""
        from lib.kvcache.long_context import prefill_chunk_compute_s

        d = self.dep
        return prefill_chunk_compute_s(d.mdl, d.chip, chunk_tokens, position, d.tp, self.mfu, d.compute_dtype)


@dataclass(frozen=True)
class BatchKVBudget:
    """The answer of :func:`batch_kv_budget` and the terms behind it (seconds; tokens)."""

    tpot_s: float
    interactive_decodes: int  # D_i, rounded up
    step_without_batch_s: float  # step(0)
    read_per_batch_seq_s: float  # attention time one batch sequence adds to every step (its c_b tokens)
    prefill_per_batch_seq_s: float  # f(P_b) / O_b: its prompt's compute, amortized per step of its decode
    batch_decodes: int  # n*: the most batch sequences the target allows
    step_at_cap_s: float  # step(n*)
    footprint_tokens: float  # tokens one batch sequence holds against the cap
    cap_tokens: float  # n* x footprint
    pool_tokens: int

    @property
    def share(self) -> float:
        """cap_tokens / pool_tokens: the fraction of the KV pool the batch class may hold."""
        return self.cap_tokens / self.pool_tokens


def mean_step_parts(cost, batch_decodes: int, *, interactive_decodes: int, interactive_prompt: float,
                    interactive_output: float, batch_prompt: float, batch_output: float) -> dict[str, float]:
    """The mean decode step with ``D_i`` interactive and ``n`` batch decodes, in its three parts (s):

    ``base`` = dec(D_i + n, C_i) (weights, launches, the interactive KV), ``read`` = dec(D_i + n,
    C_i + n c_b) - base (the batch's cached tokens, c = P + O / 2 each), ``prefill`` = D_i f(P_i) /
    O_i + n f(P_b) / O_b (every prompt's compute amortized over its output); ``total`` their sum.
    """
    d_i, n = int(interactive_decodes), int(batch_decodes)
    if d_i < 0 or n < 0:
        raise ValueError(f"decode counts must be >= 0, got interactive {d_i} and batch {n}")
    c_i = d_i * (interactive_prompt + interactive_output / 2)
    c_b = batch_prompt + batch_output / 2
    d = d_i + n
    if d == 0:
        return {"base": 0.0, "read": 0.0, "prefill": 0.0, "total": 0.0}
    base = cost.decode_s(d, c_i)
    read = cost.decode_s(d, c_i + n * c_b) - base
    prefill = (d_i * cost.chunk_compute_s(round(interactive_prompt), 0) / interactive_output
               + n * cost.chunk_compute_s(round(batch_prompt), 0) / batch_output)
    return {"base": base, "read": read, "prefill": prefill, "total": base + read + prefill}


def batch_kv_budget(cost, tpot_s: float, *, interactive_rate: float, interactive_prompt: float,
                    interactive_output: float, batch_prompt: float, batch_output: float,
                    batch_footprint: float | None = None) -> BatchKVBudget:
    """The KV the batch class may hold so the mean decode step stays within ``tpot_s`` (module doc).

    ``cost``: a :class:`~lib.scheduling.cost.StepCost` (what the simulator charges) or a
    :class:`DirectStepCost` (the same models without the table); rates in requests/s, lengths are
    means in tokens; ``batch_footprint``: tokens one batch sequence holds against the cap (None:
    its mean cached tokens P + O / 2, greedy admission; pass prompt + max_tokens under
    reservation). ``batch_decodes`` is 0 when the interactive load alone misses the target.
    """
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    lam = real("interactive_rate", interactive_rate, 0, unit="requests/s")
    p_i = real("interactive_prompt", interactive_prompt, 1, unit="tokens")
    o_i = real("interactive_output", interactive_output, 1, unit="tokens")
    p_b = real("batch_prompt", batch_prompt, 1, unit="tokens")
    o_b = real("batch_output", batch_output, 1, unit="tokens")
    c_b = p_b + o_b / 2
    foot = c_b if batch_footprint is None else real("batch_footprint", batch_footprint, 1, unit="tokens")
    d_i = math.ceil(lam * o_i * t)
    top = cost.max_running
    if d_i > top:
        raise ValueError(f"interactive_rate x output x tpot = {d_i} decodes exceeds the replica's "
                         f"max_running={top}: the interactive class alone cannot run at this target")
    loads = dict(interactive_decodes=d_i, interactive_prompt=p_i, interactive_output=o_i, batch_prompt=p_b,
                 batch_output=o_b)

    def step(n: int) -> float:
        return mean_step_parts(cost, n, **loads)["total"]

    base = step(0)
    pool = cost.kv_blocks * cost.block_size
    n_max = min(top - d_i, math.floor(pool / foot))
    lo = 0
    if base <= t:  # largest n in [0, n_max] with step(n) <= t (step grows with n)
        hi = n_max
        if step(hi) <= t:
            lo = hi
        else:
            lo = largest_true(lambda n: step(n) <= t, 1, hi - 1)  # step(0) <= t < step(hi)
    one = mean_step_parts(cost, 1, **loads)
    return BatchKVBudget(t, d_i, base, one["read"], cost.chunk_compute_s(round(p_b), 0) / o_b, lo, step(lo),
                         foot, lo * foot, pool)
