"""One long prompt against running decodes: what each chunk budget costs, and what a long prefill did.

Three views of the same situation, all priced by a step cost of :mod:`lib.scheduling.cost`
(the book's step models; never a second step formula here):

* :func:`chunk_plan` and :func:`prefill_steps`: the steps a decode-first scheduler (Sarathi,
  vLLM V1) gives one prompt of ``P`` tokens while ``D`` decodes run, with a token budget ``B``
  per step and an optional per-request cap ``L`` (vLLM's ``long_prefill_token_threshold``).
  Step ``k`` carries the chunk ``c_k = min(P - p_k, B - D, L)`` at position
  ``p_k = c_0 + ... + c_(k-1)`` beside the ``D`` decodes, whose cached tokens grow by ``D`` a step
  (``C_k = C + k D``), and lasts ``step_k = cost.step_s(D, C_k, [(c_k, p_k)])``. Every decoder
  waits ``step_k`` for its next token (the inter-token gap), and the prompt's first token comes
  at the end of the last chunk: its prefill time (TTFT without queueing) is ``sum_k step_k``.
  Nobody else arrives in this view; the simulator (:func:`lib.scheduling.simulate`) is the
  dynamic one, and a test holds the two to the same numbers.
* :func:`budget_window`: the budgets ``B`` that keep both the prompt's prefill time under a TTFT
  target and every decode gap under a TPOT (inter-token) target. The largest step grows with
  ``B`` (each chunk is bigger, and the last one sits deepest in the prompt) and the prefill time
  shrinks with it (fewer steps, each paying the weight read, the all-reduce latency and the host
  time again), so the TPOT target caps the budget from above and the TTFT target bounds it from
  below: ``B_ttft <= B <= B_gap``, read off a scan of candidate budgets (empty when
  ``B_ttft > B_gap``).
* :func:`prefill_damage`: from a simulated run, what one long prefill did to everyone else: the
  gaps before, during and after it, how long arrivals were locked out, and how long the slowdown
  outlived it (the backlog it left, and the long request's own KV read, keep the steps slower).
* :func:`head_of_line` and :func:`long_prompt_run`: the two scenarios those questions simulate
  (short requests queued behind one long request; a steady stream that one long prompt hits).
* :func:`chunk_cap` and :func:`backlog_gate`: the coupling of the two targets (the TPOT target caps
  the chunk, which caps the prefill throughput ``mu``, which caps the backlog ``mu x T_ttft`` the
  TTFT target absorbs) and the admission rule it gives: admit while the prompt tokens ahead, the
  newcomer's included, drain within the TTFT target; tell the others when to retry.

SI units: seconds, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.search import largest_true

__all__ = [
    "BudgetWindow",
    "GateResult",
    "HeadOfLine",
    "PrefillDamage",
    "PrefillSteps",
    "backlog_gate",
    "budget_window",
    "chunk_cap",
    "chunk_plan",
    "default_granularity",
    "head_of_line",
    "long_prompt_run",
    "prefill_damage",
    "prefill_steps",
]


def chunk_plan(prompt_len: int, budget: int, decode_seqs: int = 0,
               cap: int | None = None) -> tuple[tuple[int, int], ...]:
    """The chunks ``((c_k, p_k), ...)`` (tokens, position) a decode-first step gives one prompt.

    ``c_k = min(P - p_k, B - D, L)``: the budget left after the ``D`` decodes' one token each,
    capped by ``L`` (None: no cap); ``p_(k+1) = p_k + c_k``, ``p_0 = 0``. The chunks sum to P.
    """
    P = integer("prompt_len", prompt_len, 1, unit="tokens")
    D = integer("decode_seqs", decode_seqs, 0)
    B = integer("budget", budget, D + 1, unit="tokens per step (> decode_seqs: a chunk needs room)")
    per_step = B - D
    if cap is not None:
        per_step = min(per_step, integer("cap", cap, 1, unit="tokens"))
    full, last = divmod(P, per_step)
    plan = [(per_step, k * per_step) for k in range(full)]
    if last:
        plan.append((last, full * per_step))
    return tuple(plan)


@dataclass(frozen=True)
class PrefillSteps:
    """The steps that carry one prompt's chunks (see :func:`prefill_steps`), seconds."""

    prompt_len: int
    budget: int
    decode_seqs: int
    context_tokens: float
    chunks: tuple[tuple[int, int], ...]  # (tokens, position) per step
    step_s: np.ndarray  # duration of each of those steps
    decode_step_s: float  # the decodes' step without the prompt: cost.step_s(D, C), 0 when D = 0

    @property
    def n_steps(self) -> int:
        """Steps the prompt takes: ceil(P / min(B - D, L))."""
        return len(self.chunks)

    @property
    def ttft_s(self) -> float:
        """The prompt's prefill time, first scheduled to first token: sum of its steps (no queue)."""
        return float(self.step_s.sum())

    @property
    def max_gap_s(self) -> float:
        """The longest of its steps: the worst inter-token gap a running decode sees (s)."""
        return float(self.step_s.max())

    @property
    def first_gap_s(self) -> float:
        """The first chunk's step (position 0): the gap when the prompt starts (s)."""
        return float(self.step_s[0])

    @property
    def slowdown(self) -> float:
        """max_gap_s / decode_step_s: how many decode steps the worst step lasts (nan when D = 0)."""
        return self.max_gap_s / self.decode_step_s if self.decode_step_s > 0 else math.nan

    @property
    def prefill_tokens_per_s(self) -> float:
        """P / prefill time: the prefill throughput this budget leaves the prompt (tokens/s)."""
        return self.prompt_len / self.ttft_s


def _check_cost(cost) -> None:
    if not callable(getattr(cost, "step_s", None)):
        raise ValueError("cost must offer step_s(decode_seqs, context_tokens, chunks): "
                         "step_cost(dep), LinearCost or FunctionCost")


def prefill_steps(cost, prompt_len: int, budget: int, decode_seqs: int = 0, context_tokens: float = 0.0,
                  cap: int | None = None) -> PrefillSteps:
    """Price the steps of :func:`chunk_plan` with ``cost``: ``step_k = cost.step_s(D, C + k D, [(c_k, p_k)])``.

    ``context_tokens`` C: the cached tokens the ``decode_seqs`` running decodes hold between them
    when the prompt starts (each decode adds one a step). Returns a :class:`PrefillSteps`
    (``ttft_s`` = sum of the steps, ``max_gap_s`` = the longest).
    """
    _check_cost(cost)
    plan = chunk_plan(prompt_len, budget, decode_seqs, cap)
    D = decode_seqs
    C = real("context_tokens", context_tokens, 0, unit="tokens")
    if D == 0 and C > 0:
        raise ValueError("context_tokens must be 0 when decode_seqs is 0 (no decode holds a cache)")
    steps = np.array([cost.step_s(D, C + k * D, [chunk]) for k, chunk in enumerate(plan)])
    return PrefillSteps(prompt_len, budget, D, C, plan, steps, cost.step_s(D, C) if D else 0.0)


@dataclass(frozen=True)
class BudgetWindow:
    """The token budgets that meet both targets (see :func:`budget_window`), with both curves."""

    prompt_len: int
    decode_seqs: int
    ttft_target_s: float
    gap_target_s: float
    granularity: int  # the candidates' chunk sizes are multiples of it (tokens)
    budgets: np.ndarray  # candidate budgets B = D + granularity x k (tokens per step)
    ttft_s: np.ndarray  # the prompt's prefill time at each candidate
    max_gap_s: np.ndarray  # the worst decode gap at each candidate

    def _edge(self, ok: np.ndarray, from_top: bool) -> int | None:
        if from_top:  # smallest B such that every candidate from B up is ok
            bad = np.flatnonzero(~ok)
            i = 0 if not len(bad) else bad[-1] + 1
            return int(self.budgets[i]) if i < len(ok) else None
        bad = np.flatnonzero(~ok)  # largest B such that every candidate up to B is ok
        i = len(ok) - 1 if not len(bad) else bad[0] - 1
        return int(self.budgets[i]) if i >= 0 else None

    @property
    def min_budget_for_ttft(self) -> int | None:
        """Smallest candidate B from which every larger candidate meets the TTFT target (None: none)."""
        return self._edge(self.ttft_s <= self.ttft_target_s, from_top=True)

    @property
    def max_budget_for_gap(self) -> int | None:
        """Largest candidate B up to which every candidate meets the gap target (None: not even the first)."""
        return self._edge(self.max_gap_s <= self.gap_target_s, from_top=False)

    @property
    def feasible(self) -> bool:
        """Some budget meets both: both edges exist and min_budget_for_ttft <= max_budget_for_gap."""
        lo, hi = self.min_budget_for_ttft, self.max_budget_for_gap
        return lo is not None and hi is not None and lo <= hi


def default_granularity(prompt_len: int, candidates: int = 256) -> int:
    """The smallest power of two >= 16 that cuts a ``prompt_len`` prompt into at most ``candidates`` chunk sizes."""
    P = integer("prompt_len", prompt_len, 1, unit="tokens")
    return max(16, 1 << max(0, math.ceil(math.log2(P / integer("candidates", candidates, 1)))))


def budget_window(cost, prompt_len: int, decode_seqs: int, context_tokens: float, ttft_target_s: float,
                  gap_target_s: float, *, cap: int | None = None, granularity: int | None = None) -> BudgetWindow:
    """The budgets B with prefill time <= ``ttft_target_s`` and every gap <= ``gap_target_s``.

    Candidates: ``B = D + g k`` for k = 1, 2, ... until one chunk holds the whole prompt (``g``:
    ``granularity``, None: :func:`default_granularity`, at most 256 candidates), each priced by
    :func:`prefill_steps`. The prefill time falls with B in a sawtooth (one step fewer each time
    ``ceil(P / (B - D))`` drops, a little more between drops, where the last chunk shrinks to a
    step that still pays the weight read) and the worst step grows with B, up to rounding; so the
    window is stated for every candidate inside it: ``min_budget_for_ttft`` is the smallest B
    from which every larger candidate meets the TTFT target, ``max_budget_for_gap`` the largest B
    up to which every candidate meets the gap target, and every candidate between them meets both.
    """
    _check_cost(cost)
    P = integer("prompt_len", prompt_len, 1, unit="tokens")
    D = integer("decode_seqs", decode_seqs, 0)
    t_ttft = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    t_gap = real("gap_target_s", gap_target_s, 0, low_open=True, unit="seconds")
    g = default_granularity(P) if granularity is None else integer("granularity", granularity, 1, unit="tokens")
    chunks = np.arange(g, P + g, g)
    chunks[-1] = min(chunks[-1], P)  # the last candidate holds the whole prompt in one chunk
    curves = [prefill_steps(cost, P, int(D + c), D, context_tokens, cap) for c in chunks]
    return BudgetWindow(P, D, t_ttft, t_gap, g, D + chunks,
                        np.array([s.ttft_s for s in curves]), np.array([s.max_gap_s for s in curves]))


@dataclass(frozen=True)
class PrefillDamage:
    """What one request's prefill did to the others in a simulated run (see :func:`prefill_damage`)."""

    rid: int
    start_s: float  # the long request first scheduled
    end_s: float  # its first token: the prefill is over
    step_s: np.ndarray  # durations of the steps that carried its chunks
    baseline_gap_s: float  # mean gap of the others' tokens in the before_s before start_s
    peak_gap_s: float  # the longest gap of another request that overlaps the prefill
    arrivals: int  # other requests that arrived while it prefilled
    locked_out: int  # of those, how many were first scheduled only after it finished
    lockout_s: float  # the longest queue wait of those arrivals (0 when none arrived)
    after_gap_s: float  # mean gap of the others' tokens while the slowdown lasts (nan if it does not)
    recovery_s: float  # from end_s to the first bin_s window whose mean gap is within tol of the baseline
    backlog_end_s: float  # from end_s to the last finish of the requests that arrived during the prefill

    @property
    def prefill_s(self) -> float:
        """end_s - start_s: first scheduled to first token of the long request (s)."""
        return self.end_s - self.start_s

    @property
    def first_step_s(self) -> float:
        """The first step carrying its chunk (s)."""
        return float(self.step_s[0])

    @property
    def last_step_s(self) -> float:
        """The last step carrying its chunk (s): the deepest chunk, usually the longest."""
        return float(self.step_s[-1])


def prefill_damage(res, rid: int, *, before_s: float = 5.0, bin_s: float = 1.0, tol: float = 0.1) -> PrefillDamage:
    """Measure request ``rid``'s prefill in a :class:`~lib.scheduling.metrics.SimResult` ``res``.

    Window: ``start`` = its first scheduling, ``end`` = its first token. The others' inter-token
    gaps are placed at the time of the later token: the baseline is their mean over
    ``[start - before_s, start)``, the peak the longest gap that overlaps ``[start, end]``
    (the gap of the prompt's last step ends at ``end``, with its first token).
    Lock-out: requests arriving in ``[start, end)``, how many started only after ``end``, and the
    longest queue wait among them. After-effect: windows ``(end + k bin_s, end + (k + 1) bin_s]``
    of the gaps that end after the prefill; ``recovery_s`` is the start of the first window whose
    mean gap is at most ``(1 + tol)`` x the baseline (``nan`` when none is, inside the run),
    ``after_gap_s`` the mean gap over ``(end, end + recovery_s]`` (``nan`` when that is empty); ``backlog_end_s`` is when the last request that
    arrived during the prefill finished, from ``end`` (nan if none arrived or one never finished).
    """
    recs = res.requests
    rid = integer("rid", rid, 0, len(recs) - 1)
    before_s = real("before_s", before_s, 0, low_open=True, unit="seconds")
    bin_s = real("bin_s", bin_s, 0, low_open=True, unit="seconds")
    tol = real("tol", tol, 0, unit="(fraction)")
    me = recs[rid]
    start, end = me.first_scheduled_s, me.first_token_s
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"request {rid} never finished its prefill in this run")
    tl = res.timeline
    mine = np.array([any(r == rid for r, _, _ in chunks) for chunks in tl.chunks], dtype=bool)
    step_s = tl.duration_s[mine]
    ends, gaps = [], []
    for r in recs:
        if r.rid == rid:
            continue
        t = res.token_times(r.rid)
        if len(t) > 1:
            ends.append(t[1:])
            gaps.append(np.diff(t))
    ends = np.concatenate(ends) if ends else np.zeros(0)
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    before = (ends >= start - before_s) & (ends < start)
    baseline = float(gaps[before].mean()) if before.any() else math.nan
    overlap = (ends > start) & (ends - gaps < end)
    peak = float(gaps[overlap].max()) if overlap.any() else math.nan
    others = [r for r in recs if r.rid != rid and start <= r.arrival_s < end]
    waits = [r.queue_s if math.isfinite(r.first_scheduled_s) else r.departure_s - r.arrival_s for r in others]
    late = sum(1 for r in others if not r.first_scheduled_s < end)
    recovery = math.nan
    last = float(ends.max()) if len(ends) else end
    k = 0
    while end + k * bin_s < last:
        win = (ends > end + k * bin_s) & (ends <= end + (k + 1) * bin_s)
        if win.any() and gaps[win].mean() <= (1 + tol) * baseline:
            recovery = k * bin_s
            break
        k += 1
    span = (ends > end) & (ends <= end + recovery) if math.isfinite(recovery) else np.zeros(len(ends), bool)
    after = float(gaps[span].mean()) if span.any() else math.nan
    finishes = [r.finish_s for r in others]
    backlog = (max(finishes) - end) if finishes and all(math.isfinite(f) for f in finishes) else math.nan
    return PrefillDamage(rid, start, end, step_s, baseline, peak, len(others), late,
                         max(waits) if waits else 0.0, after, recovery, backlog)


# ---- the two scenarios the notebooks and explorers simulate ------------------------------------


def _pool_for(cost, rows) -> int:
    """The cost's KV pool, or fewer blocks when these requests could never touch them all.

    A pool at least as large as the blocks of every request at its largest (prompt + output)
    never runs dry, so it behaves exactly like the full pool; a smaller allocator is only faster
    to build. Requests that could fill the real pool get the real pool."""
    need = sum(-(-(p + o) // cost.block_size) for _, p, o in rows)
    return min(cost.kv_blocks, need + 1)


@dataclass(frozen=True)
class HeadOfLine:
    """Short requests queued behind one long request, simulated with and without it."""

    with_long: object  # SimResult with the long request (rid long_rid)
    without: object  # SimResult of the short requests alone (same arrival times)
    long_rid: int
    short_rids: tuple[int, ...]  # in with_long; in ``without`` they are 0..n-1 in the same order

    @property
    def ttft_s(self) -> np.ndarray:
        """The short requests' TTFT with the long request in front (s)."""
        return np.array([self.with_long.requests[r].ttft_s for r in self.short_rids])

    @property
    def ttft_alone_s(self) -> np.ndarray:
        """Their TTFT without it (s)."""
        return np.array([r.ttft_s for r in self.without.requests])

    @property
    def extra_ttft_s(self) -> np.ndarray:
        """What the long request costs each short one: TTFT with it - TTFT without it (s)."""
        return self.ttft_s - self.ttft_alone_s

    @property
    def long_ttft_s(self) -> float:
        """The long request's own TTFT (s)."""
        return self.with_long.requests[self.long_rid].ttft_s


def head_of_line(cost, policy, long_prompt: int, long_output: int, short_prompt: int, short_output: int,
                 n_short: int, lead_s: float = 0.0, *, first_tokens_only: bool = False) -> HeadOfLine:
    """One long request at t = 0, then ``n_short`` short ones at ``lead_s`` (all at once; FCFS puts
    the long one first when ``lead_s`` = 0), simulated under ``policy`` with and without the long one.

    "Long" can be either half of the job: a long prompt (``long_prompt`` large) or a long output
    (``long_output`` large). Returns a :class:`HeadOfLine`: ``extra_ttft_s`` is what it costs each
    short request. The KV pool is the cost's, or just what these requests can touch (same result).
    ``first_tokens_only``: stop each run once every request has its first token (TTFTs are then
    exact; later tokens, TPOT and finishes are not simulated): the long output's decode steps
    are what a TTFT question does not need to pay for.
    """
    n = integer("n_short", n_short, 1)
    lead = real("lead_s", lead_s, 0, unit="seconds")
    shorts = [(lead, integer("short_prompt", short_prompt, 1, unit="tokens"),
               integer("short_output", short_output, 1, unit="tokens"))] * n
    long_row = (0.0, integer("long_prompt", long_prompt, 1, unit="tokens"),
                integer("long_output", long_output, 1, unit="tokens"))
    from lib.scheduling.engine import simulate
    from lib.scheduling.workloads import trace

    rows = [long_row, *shorts]

    def run(rs):
        reqs = trace(rs)
        if not first_tokens_only:
            return simulate(reqs, policy, cost, kv_blocks=_pool_for(cost, rs))
        # stop soon after the last first token: start from the time to prefill every prompt
        # alone, and double the horizon until every request has its first token
        budget = policy.token_budget or cost.token_budget
        horizon = lead + 1.3 * prefill_steps(cost, sum(p for _, p, _ in rs), budget).ttft_s + 0.05
        while True:
            res = simulate(reqs, policy, cost, kv_blocks=_pool_for(cost, rs), horizon_s=horizon)
            if res.complete or all(math.isfinite(r.first_token_s) for r in res.requests):
                return res
            horizon *= 2

    return HeadOfLine(run(rows), run(shorts), 0, tuple(range(1, n + 1)))


def long_prompt_run(cost, policy, long_prompt: int, long_output: int, bg_prompt: int, bg_output: int,
                    rate: float, warmup_s: float, after_s: float):
    """A steady stream of short requests (one every 1 / ``rate`` s, ``bg_prompt`` + ``bg_output``
    tokens) with one long request arriving at ``warmup_s``; returns ``(SimResult, rid of the long one)``.

    The stream runs from 0 until ``warmup_s`` + the long prompt's prefill (estimated alone:
    :func:`prefill_steps` with the policy's budget and cap, times 1.25 for the decodes beside it)
    + ``after_s``, so the run shows the steady state before, the prefill, and what follows it; the
    run stops ``after_s`` after the long prompt's first token (requests still inside then are
    ``unfinished``: a stream the replica cannot keep up with never drains), run again with a later
    horizon when the prefill outlasts the estimate.
    Deterministic (uniform arrivals, constant lengths): every change in the gaps comes from the
    long request. The KV pool is the cost's, or just what these requests can touch (same result).
    """
    from lib.scheduling.engine import simulate
    from lib.scheduling.workloads import trace

    rate = real("rate", rate, 0, low_open=True, unit="requests/s")
    warmup_s = real("warmup_s", warmup_s, 0, unit="seconds")
    after_s = real("after_s", after_s, 0, unit="seconds")
    budget = policy.token_budget or cost.token_budget
    est = 1.25 * prefill_steps(cost, long_prompt, budget, 0, 0, policy.long_prefill_cap).ttft_s
    n = math.ceil(rate * (warmup_s + est + after_s))
    rows = [(i / rate, bg_prompt, bg_output) for i in range(n)]
    long_row = (warmup_s, long_prompt, long_output)
    k = sum(1 for t, _, _ in rows if t <= warmup_s)  # trace() orders by arrival: the long one lands at k
    rows.insert(k, long_row)
    reqs, pool = trace(rows), _pool_for(cost, rows)
    horizon = warmup_s + est + after_s  # an overloaded stream would otherwise run on and on
    while True:
        res = simulate(reqs, policy, cost, kv_blocks=pool, horizon_s=horizon)
        first = res.requests[k].first_token_s
        if res.complete or (math.isfinite(first) and first + after_s <= horizon):
            return res, k
        horizon = first + after_s if math.isfinite(first) else 2 * horizon  # the prefill took longer


# ---- the coupling of the two targets, and an admission rule built on it ----------------------------


def chunk_cap(cost, decode_seqs: int, context_tokens: float, gap_target_s: float, position: int = 0,
              max_chunk: int = 1 << 20) -> int:
    """The largest prefill chunk ``c`` (tokens) that keeps a step within ``gap_target_s``.

    ``c = max{c : cost.step_s(D, C, [(c, position)]) <= gap_target_s}``, by bisection on integers
    (the step grows with ``c``); 0 when even the decodes alone (or a one-token chunk) exceed the
    target, ``max_chunk`` when it fits. ``position`` is where the chunk sits in its prompt: deeper
    chunks attend to more and must be smaller.
    """
    _check_cost(cost)
    D = integer("decode_seqs", decode_seqs, 0)
    C = real("context_tokens", context_tokens, 0, unit="tokens")
    target = real("gap_target_s", gap_target_s, 0, low_open=True, unit="seconds")
    integer("position", position, 0, unit="tokens")
    hi = integer("max_chunk", max_chunk, 1, unit="tokens")

    def fits(c: int) -> bool:
        return cost.step_s(D, C, [(c, position)]) <= target

    if not fits(1):
        return 0
    if fits(hi):
        return hi
    return largest_true(fits, 2, hi - 1)  # fits(1) and not fits(hi)


@dataclass(frozen=True)
class GateResult:
    """What :func:`backlog_gate` decided for each request, in arrival order."""

    admitted: np.ndarray  # bool per request
    backlog_tokens: np.ndarray  # prompt tokens queued ahead of it when it arrived (after draining)
    retry_after_s: np.ndarray  # rejected: when the backlog will have drained enough for it; admitted: 0
    prefill_tokens_per_s: float
    ttft_target_s: float

    @property
    def admitted_fraction(self) -> float:
        """Admitted / all (nan for no requests)."""
        return float(self.admitted.mean()) if len(self.admitted) else math.nan

    @property
    def max_backlog_tokens(self) -> float:
        """mu x TTFT target: the prompt tokens the target can absorb ahead of a request, itself included."""
        return self.prefill_tokens_per_s * self.ttft_target_s


def backlog_gate(requests, prefill_tokens_per_s: float, ttft_target_s: float) -> GateResult:
    """Admission by prefill backlog: admit request i iff ``(W_i + P_i) / mu <= T_ttft``.

    ``mu`` (``prefill_tokens_per_s``): the prefill throughput the replica gives waiting prompts
    (with chunked prefill under a TPOT target: the largest chunk the target allows, over the
    step it makes). ``W_i``: prompt tokens admitted and not yet prefilled when request i
    arrives, a fluid queue: it drains at ``mu`` between arrivals (never below 0) and grows by
    each admitted prompt. A rejected request gets ``retry_after = (W_i + P_i) / mu - T_ttft``:
    the time after which, with no other admission, the same request would pass. ``requests``:
    :class:`~lib.scheduling.workloads.Request` objects (any order; decided in arrival order).
    """
    mu = real("prefill_tokens_per_s", prefill_tokens_per_s, 0, low_open=True, unit="tokens/s")
    target = real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds")
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
    n = len(reqs)
    admitted = np.zeros(n, dtype=bool)
    backlog = np.zeros(n)
    retry = np.zeros(n)
    w, t = 0.0, reqs[0].arrival_s if reqs else 0.0
    for i, r in enumerate(reqs):
        w = max(0.0, w - mu * (r.arrival_s - t))
        t = r.arrival_s
        backlog[i] = w
        wait = (w + r.prompt_len) / mu
        if wait <= target:
            admitted[i] = True
            w += r.prompt_len
        else:
            retry[i] = wait - target
    return GateResult(admitted, backlog, retry, mu, target)
