"""What one engine step costs, in seconds: the book's step models, tabulated once per replica.

The simulator asks one question per step: how long does a step with ``D`` running decodes
(holding ``C`` cached tokens between them) and prefill chunks ``[(c_k, p_k)]`` (``c_k`` new
tokens of a prompt whose first ``p_k`` tokens are already cached) take? Three answers:

* :class:`StepCost` (a :class:`~lib.perf.deployment.Deployment`): the book's own models,
  never a second roofline. Pieces, each from the function that owns it:

  - decode step ``dec(D, c) = decode_step(dep, D, c).total_s`` (:func:`lib.perf.step.decode_step`);
  - chunk compute ``f(c, p) = prefill_chunk_compute_s(c, p)``
    (:func:`lib.kvcache.long_context.prefill_chunk_compute_s`, the compute term of
    :func:`lib.perf.prefill.prefill_time` at the compute-only MFU);
  - weight read of a pass over T tokens ``read(T) = prefill_estimate(T).memory_s`` and its
    tensor-parallel traffic ``ar(T) = prefill_allreduce_s(T)`` (:mod:`lib.perf.prefill`);
  - host time ``h = sampling_s + scheduler_s`` (the decode step's host phase).

  A **mixed step** (decodes + prefill chunks, T = sum c_k + D tokens) is priced as::

      pass(T)  = max(sum_k f(c_k, p_k) + D f(1, 0), read(T)) + ar(T) + h
      step     = max(dec(D, cbar), pass(T) + [dec(D, cbar) - dec(D, 0)])
               = A(C) + max(dec(D, 0), pass(T)),   A(C) = dec(D, cbar) - dec(D, 0)

  with ``cbar = C / D``: every token of the step goes through the weight GEMMs once (a decode
  token as a one-token chunk at position 0, its attention to the cache left out of ``f``), the
  weights are read once for all of them (the overlap rule: max of compute and read, not the
  sum), the all-reduces carry every token, and the decodes' attention over their cache ``A``
  is the decode step's own attention time, added because it is a separate, memory-bound
  kernel. A step is never faster than the decode step of its decodes alone. Special cases:
  no chunks: ``dec(D, cbar)``; no decodes: ``pass(T)``, which for one whole prompt at
  position 0 is ``prefill_time(dep, P).time_s + h`` and for one chunk
  ``prefill_chunk_step_s(dep, c, p) + h`` (the same terms). :func:`exact_step_s` evaluates
  this definition with the functions themselves (slow: ~1 ms per decode step), and is the
  oracle of the table.

  The table: ``dec(D, 0)`` at every D up to ``max_batch``, interpolated linearly from a grid of
  decode_step calls refined until every interval's midpoint is within :data:`REL_TOL` (1e-3);
  ``A(C) = a C``, exactly linear in the summed context with CUDA graphs (each attention kernel
  lasts fixed + max(KV bytes, FLOPs), both proportional to D x c), so ``a`` is one difference
  quotient (eager deployments hide launches behind long kernels, which is not separable: a 2-D
  table of dec(D, cbar) instead, within 2%); ``f`` is exactly quadratic (``f(c, p) = alpha c +
  beta (c p + c (c + 1) / 2)``, as its docstring states) and its two coefficients are read back
  from ``f`` itself; ``read`` and ``ar`` on a token grid (every integer to 64, then 8 points per
  doubling to 2^21, linear beyond; within 1e-3). A ragged batch is priced at its mean context
  (exact for the linear KV term). Tested against :func:`exact_step_s`, ``decode_step``,
  ``prefill_time`` and ``prefill_chunk_step_s``.
  Swaps: :func:`lib.kvcache.recompute_fetch.fetch_time_s` over the ``host_dram`` tier (the host
  link, PCIe or C2C, at its achieved rate), both directions alike.

* :class:`LinearCost`: ``fixed + per_seq D + per_context_token C + per_prefill_token P``, for
  closed-form queueing checks and "a batch costs 100 ms whatever its size".
* :class:`FunctionCost`: any ``fn(decode_seqs, context_tokens, chunks) -> seconds``.

Every cost offers ``step_s(decode_seqs, context_tokens, chunks)`` and ``swap_s(tokens)``, and
the defaults ``kv_blocks``, ``block_size``, ``max_running``, ``token_budget`` the simulator
takes when a call leaves them out. SI units: seconds, tokens.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence

from lib.inputs import integer, real

__all__ = ["REL_TOL", "FunctionCost", "LinearCost", "StepCost", "exact_step_s", "step_cost"]

#: Interpolation tolerance of the decode table: an interval is split until its midpoint is
#: within this relative error of decode_step.
REL_TOL = 1e-3


def _grid(top: int, dense_to: int, per_doubling: int = 8) -> list[int]:
    """Integers 1..dense_to, then about ``per_doubling`` points per doubling up to ``top``."""
    pts = set(range(1, min(dense_to, top) + 1))
    x = float(dense_to)
    while x < top:
        x *= 2 ** (1 / per_doubling)
        pts.add(min(top, int(round(x))))
    pts.add(top)
    return sorted(pts)


def _refined(fn: Callable[[int], float], xs: list[int], rel_tol: float) -> tuple[list[int], list[float]]:
    """fn on integer grid ``xs``, refined: an interval whose midpoint the linear interpolation
    misses by more than ``rel_tol`` (relative) is split there, recursively."""
    pts = {x: fn(x) for x in xs}
    todo = list(zip(xs, xs[1:], strict=False))
    while todo:
        lo, hi = todo.pop()
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        y = fn(mid)
        pts[mid] = y
        guess = pts[lo] + (pts[hi] - pts[lo]) * (mid - lo) / (hi - lo)
        if abs(guess - y) > rel_tol * abs(y):
            todo += [(lo, mid), (mid, hi)]
    keys = sorted(pts)
    return keys, [pts[k] for k in keys]


class _Table:
    """y(x) on a sorted grid: exact at grid points, linear between, linear beyond the ends."""

    __slots__ = ("xs", "ys")

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.xs, self.ys = list(xs), list(ys)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        i = bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return ys[i]
        i = min(max(i, 1), len(xs) - 1)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


def _check_step(decode_seqs, context_tokens, chunks) -> None:
    integer("decode_seqs", decode_seqs, 0)
    real("context_tokens", context_tokens, 0, unit="tokens")
    for c, p in chunks:
        integer("chunk tokens", c, 1)
        integer("chunk position", p, 0)


class StepCost:
    """Step times of one replica ``dep``, tabulated once from the book's step models (module doc).

    ``assume``: :func:`lib.perf.step.step_assumptions` (None: central); ``mfu``: the prefill's
    compute-only MFU (None: ``prefill.prefill_mfu``); ``max_batch``: the largest decode batch
    the table covers (None: ``dep.max_num_seqs``); ``swap_tier``: where a swapped KV goes
    (:func:`lib.kvcache.recompute_fetch.storage_tier`). Building it calls ``decode_step`` about
    70 times (0.05-0.1 s; eager deployments about 430 times, 0.5 s); :func:`step_cost` caches
    built tables.
    """

    def __init__(self, dep, *, assume=None, mfu: float | None = None, max_batch: int | None = None,
                 swap_tier: str = "host_dram") -> None:
        from lib.kvcache.long_context import prefill_chunk_compute_s
        from lib.kvcache.recompute_fetch import storage_tier
        from lib.perf.deployment import require
        from lib.perf.prefill import default_mfu, prefill_allreduce_s, prefill_estimate
        from lib.perf.step import decode_step, step_assumptions

        self.dep = dep = require(dep)
        self.assume = a = assume or step_assumptions()
        self.mfu = u = default_mfu(mfu)
        top = integer("max_batch", dep.max_num_seqs if max_batch is None else max_batch, 1)
        self.max_batch = top
        m, g = dep.mdl, dep.chip
        # decode: dec(D, 0) on a grid of D, then every integer D by linear interpolation
        c0 = min(8192, m.max_position_embeddings)
        if dep.cuda_graphs:
            base = _Table(*_refined(lambda b: decode_step(dep, b, 0, a).total_s, _grid(top, 16, 4),
                                    REL_TOL))
            self._dec0 = [0.0] + [base(b) for b in range(1, top + 1)]
            self.attention_s_per_token = (decode_step(dep, 1, c0, a).total_s - self._dec0[1]) / c0
            self._eager = None
        else:  # eager launches hide behind long kernels: not separable, so a 2-D table (D, cbar)
            bs = _grid(top, 4, 4)
            cs = [0, *(1 << k for k in range(7, 18) if (1 << k) < m.max_position_embeddings),
                  m.max_position_embeddings]
            rows = [_Table(cs, [decode_step(dep, b, c, a).total_s for c in cs]) for b in bs]
            self._eager = (bs, rows)
            self._dec0 = [0.0] + [self._decode_eager(b, 0.0) for b in range(1, top + 1)]
            self.attention_s_per_token = math.nan
        self.host_s = a.sampling_s + a.scheduler_s
        # chunk compute: f(c, p) = alpha c + beta (c p + c (c + 1) / 2), read back from f
        def f(c, p):
            return prefill_chunk_compute_s(m, g, c, p, dep.tp, u, dep.compute_dtype)

        far = 1 << 20
        self.chunk_pair_s = (f(1, far) - f(1, 0)) / far  # beta: one (query, key) pair
        self.chunk_token_s = f(1, 0) - self.chunk_pair_s  # alpha: one token through the GEMMs
        # weight read and TP all-reduces of a pass over T tokens
        ts = _grid(1 << 21, 64)
        self._read = _Table(ts, [prefill_estimate(m, g, t, dep.tp, u, dep.weight_dtype,
                                                  dep.compute_dtype, dep.kv_dtype).memory_s for t in ts])
        self._ar = _Table(ts, [prefill_allreduce_s(m, g, t, dep.tp, 1, dep.act_dtype) for t in ts])
        tier = storage_tier(swap_tier, g)
        self.swap_tier = tier
        # engine defaults the simulator takes when a call leaves them out
        self.kv_blocks = dep.budget.num_blocks
        self.block_size = dep.block_size
        self.max_running = min(dep.max_num_seqs, top)
        self.token_budget = dep.max_num_batched_tokens

    def __repr__(self) -> str:
        return f"StepCost({self.dep.label}, max_batch={self.max_batch})"

    def _decode_eager(self, d: int, cbar: float) -> float:
        """Bilinear in (D, cbar) on the eager table (linear beyond the last context)."""
        bs, rows = self._eager
        i = min(max(bisect_left(bs, d), 1), len(bs) - 1)
        lo, hi = rows[i - 1](cbar), rows[i](cbar)
        return lo + (hi - lo) * (d - bs[i - 1]) / (bs[i] - bs[i - 1])

    def decode_s(self, decode_seqs: int, context_tokens: float) -> float:
        """dec(D, C / D) = dec(D, 0) + a C: a decode-only step, seconds (C: cached tokens summed).

        Eager deployments (``cuda_graphs=False``) read a 2-D table of (D, C / D) instead."""
        if decode_seqs > self.max_batch:
            raise ValueError(f"decode_seqs={decode_seqs} exceeds the table's max_batch={self.max_batch}")
        if self._eager is not None:
            return self._decode_eager(decode_seqs, context_tokens / decode_seqs)
        return self._dec0[decode_seqs] + self.attention_s_per_token * context_tokens

    def chunk_compute_s(self, chunk_tokens: int, position: int) -> float:
        """f(c, p) = alpha c + beta (c p + c (c + 1) / 2): compute of one chunk, seconds."""
        return chunk_tokens * (self.chunk_token_s
                               + self.chunk_pair_s * (position + (chunk_tokens + 1) / 2))

    def pass_s(self, decode_seqs: int, chunks: Sequence[tuple[int, int]]) -> float:
        """pass(T) = max(sum f(c_k, p_k) + D f(1, 0), read(T)) + ar(T) + h, seconds."""
        compute = decode_seqs * (self.chunk_token_s + self.chunk_pair_s)
        tokens = decode_seqs
        for c, p in chunks:
            tokens += c
            compute += c * (self.chunk_token_s + self.chunk_pair_s * (p + (c + 1) / 2))
        return max(compute, self._read(tokens)) + self._ar(tokens) + self.host_s

    def step_s(self, decode_seqs: int, context_tokens: float,
               chunks: Sequence[tuple[int, int]] = ()) -> float:
        """One engine step, seconds: a C + max(dec(D, 0), pass(T)) (module doc); no chunks:
        dec(D, 0) + a C; no decodes: pass(T); nothing: 0."""
        if not chunks:
            return self.decode_s(decode_seqs, context_tokens) if decode_seqs else 0.0
        pre = self.pass_s(decode_seqs, chunks)
        if not decode_seqs:
            return pre
        if decode_seqs > self.max_batch:
            raise ValueError(f"decode_seqs={decode_seqs} exceeds the table's max_batch={self.max_batch}")
        dec0 = self._dec0[decode_seqs]
        return self.decode_s(decode_seqs, context_tokens) - dec0 + max(dec0, pre)

    def swap_s(self, tokens: int) -> float:
        """Moving ``tokens`` of KV (each GPU its shard) over the host link, one way, seconds:
        :func:`lib.kvcache.recompute_fetch.fetch_time_s` on the ``swap_tier``."""
        from lib.kvcache.recompute_fetch import fetch_time_s

        if tokens <= 0:
            return 0.0
        d = self.dep
        return fetch_time_s(d.mdl, int(tokens), self.swap_tier, tp=d.tp, kv_dtype=d.kv_dtype)


@functools.lru_cache(maxsize=16)
def _cached(dep, assume, mfu, max_batch, swap_tier) -> StepCost:
    return StepCost(dep, assume=assume, mfu=mfu, max_batch=max_batch, swap_tier=swap_tier)


def step_cost(dep, *, assume=None, mfu: float | None = None, max_batch: int | None = None,
              swap_tier: str = "host_dram") -> StepCost:
    """A :class:`StepCost` for ``dep``, built once per argument set and cached (16 kept)."""
    from lib.perf.deployment import require

    return _cached(require(dep), assume, mfu, max_batch, swap_tier)


def exact_step_s(dep, decode_seqs: int, context: int, chunks: Sequence[tuple[int, int]] = (), *,
                 assume=None, mfu: float | None = None) -> float:
    """The mixed-step definition of the module doc, evaluated with the models themselves, seconds.

    ``context`` is per decode (decode_step's argument; the table takes the sum D x context).
    step = max(dec(D, c), pass(T) + dec(D, c) - dec(D, 0)), pass(T) = max(sum
    prefill_chunk_compute_s(c_k, p_k) + D prefill_chunk_compute_s(1, 0), prefill_estimate(T)
    .memory_s) + prefill_allreduce_s(T) + sampling + scheduler. Slow (about 1 ms per call): the
    oracle that :class:`StepCost` is tested against, not for the simulator's inner loop.
    """
    from lib.kvcache.long_context import prefill_chunk_compute_s
    from lib.perf.deployment import require
    from lib.perf.prefill import default_mfu, prefill_allreduce_s, prefill_estimate
    from lib.perf.step import decode_step, step_assumptions

    dep = require(dep)
    _check_step(decode_seqs, context, chunks)
    a = assume or step_assumptions()
    u = default_mfu(mfu)
    m, g, d = dep.mdl, dep.chip, decode_seqs
    if not chunks:
        if not d:
            raise ValueError("a step needs decode_seqs >= 1 or at least one chunk")
        return decode_step(dep, d, context, a).total_s
    tokens = d + sum(c for c, _ in chunks)
    compute = sum(prefill_chunk_compute_s(m, g, c, p, dep.tp, u, dep.compute_dtype) for c, p in chunks)
    compute += d * prefill_chunk_compute_s(m, g, 1, 0, dep.tp, u, dep.compute_dtype)
    read = prefill_estimate(m, g, tokens, dep.tp, u, dep.weight_dtype, dep.compute_dtype,
                            dep.kv_dtype).memory_s
    pre = max(compute, read) + prefill_allreduce_s(m, g, tokens, dep.tp, 1, dep.act_dtype)
    pre += a.sampling_s + a.scheduler_s
    if not d:
        return pre
    dec = decode_step(dep, d, context, a).total_s
    return max(dec, pre + dec - decode_step(dep, d, 0, a).total_s)


class LinearCost:
    """An analytic step: fixed_s + per_seq_s D + per_context_token_s C + per_prefill_token_s P.

    For closed-form checks (batch 1 and ``per_prefill_token_s`` alone: a request's service time
    is its prompt length times it, so an M/G/1 queue with the prompt distribution as service)
    and for "a batch costs ``fixed_s`` whatever its size". Swaps cost ``swap_s_per_token`` per
    token. ``kv_blocks``, ``block_size``, ``max_running``, ``token_budget``: the defaults
    :func:`lib.scheduling.simulate` takes (a pool of ``kv_blocks`` blocks; 256 sequences and
    8192 tokens per step, vLLM's defaults, unless given).
    """

    def __init__(self, fixed_s: float = 0.0, per_seq_s: float = 0.0, per_context_token_s: float = 0.0,
                 per_prefill_token_s: float = 0.0, *, swap_s_per_token: float = 0.0,
                 kv_blocks: int = 1 << 16, block_size: int = 16, max_running: int = 256,
                 token_budget: int = 8192) -> None:
        self.fixed_s = real("fixed_s", fixed_s, 0, unit="seconds")
        self.per_seq_s = real("per_seq_s", per_seq_s, 0, unit="seconds")
        self.per_context_token_s = real("per_context_token_s", per_context_token_s, 0, unit="seconds")
        self.per_prefill_token_s = real("per_prefill_token_s", per_prefill_token_s, 0, unit="seconds")
        self.swap_s_per_token = real("swap_s_per_token", swap_s_per_token, 0, unit="seconds")
        if self.fixed_s + self.per_seq_s + self.per_prefill_token_s <= 0:
            raise ValueError("a LinearCost needs fixed_s, per_seq_s or per_prefill_token_s > 0 "
                             "(a step that takes no time never ends a simulation)")
        self.kv_blocks = integer("kv_blocks", kv_blocks, 1)
        self.block_size = integer("block_size", block_size, 1)
        self.max_running = integer("max_running", max_running, 1)
        self.token_budget = integer("token_budget", token_budget, self.max_running)

    def __repr__(self) -> str:
        return (f"LinearCost(fixed_s={self.fixed_s}, per_seq_s={self.per_seq_s}, per_context_token_s="
                f"{self.per_context_token_s}, per_prefill_token_s={self.per_prefill_token_s})")

    def step_s(self, decode_seqs: int, context_tokens: float,
               chunks: Sequence[tuple[int, int]] = ()) -> float:
        """fixed + per_seq D + per_context_token C + per_prefill_token sum c_k, seconds (0 when empty)."""
        prefill = 0
        for c, _ in chunks:
            prefill += c
        if not decode_seqs and not prefill:
            return 0.0
        return (self.fixed_s + self.per_seq_s * decode_seqs
                + self.per_context_token_s * context_tokens + self.per_prefill_token_s * prefill)

    def swap_s(self, tokens: int) -> float:
        """swap_s_per_token x tokens, seconds."""
        return self.swap_s_per_token * tokens


class FunctionCost(LinearCost):
    """Any step price: ``fn(decode_seqs, context_tokens, chunks) -> seconds`` (chunks as
    ``[(tokens, position)]``). Must return a finite number > 0 for a non-empty step."""

    def __init__(self, fn: Callable, *, swap_s_per_token: float = 0.0, kv_blocks: int = 1 << 16,
                 block_size: int = 16, max_running: int = 256, token_budget: int = 8192) -> None:
        if not callable(fn):
            raise ValueError(f"fn must be callable as fn(decode_seqs, context_tokens, chunks), got {fn!r}")
        super().__init__(fixed_s=1.0, swap_s_per_token=swap_s_per_token, kv_blocks=kv_blocks,
                         block_size=block_size, max_running=max_running, token_budget=token_budget)
        self.fn = fn

    def __repr__(self) -> str:
        return f"FunctionCost({getattr(self.fn, '__name__', self.fn)!r})"

    def step_s(self, decode_seqs: int, context_tokens: float,
               chunks: Sequence[tuple[int, int]] = ()) -> float:
        """fn(decode_seqs, context_tokens, chunks), checked finite and > 0 (0 for an empty step)."""
        if not decode_seqs and not chunks:
            return 0.0
        t = self.fn(decode_seqs, context_tokens, list(chunks))
        if not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise ValueError(f"fn must return a finite number of seconds > 0, got {t!r}")
        return float(t)
