"""One replica's operating point: the batch its TPOT target and KV pool allow, and what it earns
under a workload (tokens per second, p95 TPOT, goodput), measured in the simulator's steady state.

* :func:`batch_limits`: three ceilings on the decode batch at a context of ``c`` cached tokens per
  sequence, each from the function that owns it: the TPOT target (every sequence of a batch waits
  for the same step, so the batch may grow until ``t(B) = target``:
  :func:`lib.perf.throughput.batch_for_step_time` on the one decode step model), the KV pool
  (``Deployment.budget.max_concurrency(c)``: pool tokens / c, a fraction) and the engine's
  ``max_num_seqs``. The limit is the floor of the smallest; :attr:`BatchLimits.binding` names it.
* :func:`steady_run`: a simulation (:func:`lib.scheduling.simulate`, steps priced by the cost)
  whose numbers are read in steady state. A run that starts empty spends its first ``W`` seconds
  (a request's time in the system) filling up, and its last requests leave an emptying engine, so
  both ends flatter it. One Poisson stream of requests is drawn and labelled in
  arrival order: a warm-up (class 1), the measured requests (class 0) and a cool-down (class 2).
  The policy must not use priorities, so the classes are labels only; :meth:`SimResult.metrics` with ``priority=0`` gives
  the measured requests' TPOT, TTFT and SLO attainment. Over the window in which the measured
  requests arrive, the run also gives the output tokens emitted per second and the mean number of
  running sequences (the batch the replica actually runs).

SI units: seconds, requests per second, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.search import largest_true

__all__ = ["BatchLimits", "SteadyRun", "batch_limits", "steady_run"]


@dataclass(frozen=True)
class BatchLimits:
    """The ceilings on the decode batch at ``context`` cached tokens per sequence (module doc)."""

    context: int
    tpot_target_s: float
    by_tpot: float  # largest (fractional) batch whose decode step meets the target; 0 if batch 1 misses
    by_kv: float  # sequences of this context the KV pool holds (fractional)
    by_engine: int  # max_num_seqs
    step_at_limit_s: float  # the decode step at the limit (nan when the limit is 0)

    @property
    def limit(self) -> int:
        """floor(min(by_tpot, by_kv, by_engine)): the most sequences a decode step should run."""
        return int(min(self.by_tpot, self.by_kv, self.by_engine))

    @property
    def binding(self) -> str:
        """Which ceiling sets the limit: 'the TPOT target', 'the KV pool' or 'max_num_seqs'."""
        smallest = min(self.by_tpot, self.by_kv, self.by_engine)
        if self.by_tpot == smallest:
            return "the TPOT target"
        return "the KV pool" if self.by_kv == smallest else "max_num_seqs"


def _by_tpot_from_table(cost, c: int, target: float) -> float | None:
    """Largest (fractional) batch whose tabulated decode step ``cost.decode_s(B, B c)`` meets the
    target, by bisection on the table (0 if batch 1 misses; inf past the table's max_batch)."""
    top = cost.max_batch

    def step(b: int) -> float:
        return cost.decode_s(b, b * c)

    if step(1) > target:
        return 0.0
    if step(top) <= target:
        return math.inf
    lo = largest_true(lambda b: step(b) <= target, 2, top - 1)  # step(1) <= target < step(top)
    hi = lo + 1
    return lo + (target - step(lo)) / (step(hi) - step(lo))


def batch_limits(dep, context: int, tpot_target_s: float, assume=None, cost=None) -> BatchLimits:
    """The batch the TPOT target allows (decode step <= target), the batch the KV pool holds and
    ``max_num_seqs``, at ``context`` cached tokens per sequence (module doc).

    ``cost``: a :class:`~lib.scheduling.cost.StepCost` of ``dep`` (optional). The TPOT ceiling is then
    read off its decode table (the same step model, tabulated within 0.1%) instead of about twenty
    ``decode_step`` calls: fast enough for a widget. A target that allows more than the table's
    ``max_batch`` (``max_num_seqs``) then gives ``by_tpot = inf``: it does not bind."""
    from lib.perf import throughput
    from lib.perf.deployment import require

    dep = require(dep)
    c = integer("context", context, 1, unit="tokens")
    target = real("tpot_target_s", tpot_target_s, 0, low_open=True, unit="seconds")
    dep.mdl.check_context(c)
    if cost is not None and (getattr(cost, "dep", None) != dep or not hasattr(cost, "decode_s")):
        raise ValueError("cost must be the StepCost of dep (step_cost(dep)), or None")
    if cost is not None:
        by_tpot = _by_tpot_from_table(cost, c, target)
    else:
        try:
            by_tpot = throughput.batch_for_step_time(dep, c, target, assume)
        except ValueError:  # even one sequence's step is longer than the target
            by_tpot = 0.0
    by_kv = dep.budget.max_concurrency(c)
    lim = BatchLimits(c, target, by_tpot, by_kv, dep.max_num_seqs, math.nan)
    if lim.limit >= 1:
        at = (cost.decode_s(lim.limit, lim.limit * c) if cost is not None and lim.limit <= cost.max_batch
              else throughput.step_s(dep, lim.limit, c, assume))
        lim = BatchLimits(c, target, by_tpot, by_kv, dep.max_num_seqs, at)
    return lim


@dataclass(frozen=True)
class SteadyRun:
    """A simulation read in steady state (module doc): ``result`` the whole run, ``window`` =
    (first, last) arrival of the measured requests (s), ``metrics`` their
    :class:`~lib.scheduling.metrics.Metrics` under the SLO, ``tokens_per_s`` the output tokens
    the replica emitted per second in the window (every request's, not only the measured ones'),
    ``mean_running`` the time-average of running sequences in the window."""

    rate: float
    result: object
    window: tuple[float, float]
    metrics: object
    tokens_per_s: float
    mean_running: float

    @property
    def goodput_tokens_per_s(self) -> float:
        """tokens_per_s x the share of the measured requests' output tokens that belong to requests
        within both targets (the SLO's goodput, at the window's rate)."""
        m = self.metrics
        share = m.goodput_tokens_per_s / m.output_tokens_per_s if m.output_tokens_per_s > 0 else 0.0
        return self.tokens_per_s * share


def _window_tokens(res, t0: float, t1: float) -> int:
    """Output tokens emitted in [t0, t1) by all requests of a run."""
    n = 0
    for r in res.requests:
        times = res.token_times(r.rid)
        n += int(np.count_nonzero((times >= t0) & (times < t1)))
    return n


def steady_run(cost, prompt, output, rate: float, *, n_measured: int = 300, n_warmup: int = 200,
               n_cooldown: int = 100, policy=None, max_tokens: int | None = None, slo=None,
               seed: int = 0, max_steps: int | None = None, block_size: int | None = None) -> SteadyRun:
    """Simulate Poisson arrivals at ``rate`` requests/s with ``prompt`` and ``output`` length
    distributions (:mod:`lib.scheduling.workloads`): ``n_warmup`` requests, then ``n_measured``
    measured ones, then ``n_cooldown`` more, one Poisson stream; read the measured ones in steady
    state (module doc). ``policy``: a :class:`~lib.scheduling.Policy` without priorities (None:
    the default, which takes ``max_num_seqs`` and the token budget from the cost); ``slo``: an
    :class:`~lib.scheduling.SLO` (None: no targets); ``max_tokens``: the declared output cap.
    ``max_steps`` stops the run after that many engine steps (a budget for widgets: the metrics
    then cover the measured requests that finished, the tokens the window saw until the stop).
    ``block_size`` (None: the cost's) simulates the pool in coarser blocks holding the same tokens
    (``kv_blocks`` scaled down; a sequence rounds up to a whole block): fewer allocator operations.
    Deterministic for a ``seed``."""
    from lib.scheduling.engine import simulate
    from lib.scheduling.metrics import SLO
    from lib.scheduling.policies import Policy
    from lib.scheduling.resident import time_average
    from lib.scheduling.workloads import Workload, trace

    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    n_meas = integer("n_measured", n_measured, 2, unit="requests")
    n_warm = integer("n_warmup", n_warmup, 0, unit="requests")
    n_cool = integer("n_cooldown", n_cooldown, 0, unit="requests")
    policy = Policy() if policy is None else policy
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy, got {policy!r}")
    if policy.use_priority or policy.kv_share_cap:
        raise ValueError("policy must not use priorities or KV shares: the warm-up and cool-down classes are "
                         "labels only here")
    slo = SLO() if slo is None else slo
    pool = {}
    if block_size is not None:
        size = integer("block_size", block_size, 1, unit="tokens")
        pool = dict(block_size=size, kv_blocks=max(1, cost.kv_blocks * cost.block_size // size))

    stream = Workload(prompt=prompt, output=output, rate=lam, n_requests=n_warm + n_meas + n_cool,
                      max_tokens=max_tokens).generate(seed)
    labels = [1] * n_warm + [0] * n_meas + [2] * n_cool  # warm-up, measured, cool-down: labels only
    res = simulate(trace([(r.arrival_s, r.prompt_len, r.output_len, cls, r.max_tokens)
                          for r, cls in zip(stream, labels, strict=True)]), policy, cost, max_steps=max_steps, **pool)
    arrivals = np.array([r.arrival_s for r in res.requests if r.priority == 0])
    t0, t1 = float(arrivals.min()), min(float(arrivals.max()), res.end_s)
    if res.end_s <= t0:
        raise ValueError(f"max_steps={max_steps} stopped the run before the measured requests arrived: raise "
                         "max_steps or lower n_warmup")
    if t1 <= t0:
        raise ValueError("the measured requests arrived at one instant: raise n_measured")
    return SteadyRun(lam, res, (t0, t1), res.metrics(slo, priority=0), _window_tokens(res, t0, t1) / (t1 - t0),
                     time_average(res, "running", t0, t1))
