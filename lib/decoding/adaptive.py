"""Adaptive speculation: per-request acceptance populations, draft-length policies, and a
step-level simulation of a replica that speculates.

A request ``r`` has its own per-token acceptance ``a_r`` (drawn from a :class:`Population`: a
Beta distribution per traffic class, e.g. code high, chat low). Every step a :class:`Policy`
picks how many tokens ``k_r`` each running request drafts; the accepted prefix is drawn i.i.d.
(``min(Geometric, k_r)``, as in :func:`lib.decoding.speculative.simulate_speculative_tokens_per_step`)
and the request emits it plus the target's own token.

Step times never come from a second model: a :class:`StepTable` tabulates the terms of
:func:`lib.decoding.speculative.speculative_step` (:func:`lib.perf.step.decode_step` at
``query_tokens = k + 1`` plus ``k`` drafter forwards) once per deployment, drafter and context,
over a grid of batches (linear interpolation between grid batches, exact on the grid).

Two ways of running requests (:func:`simulate`):

* ``batch=1``: every request alone on the replica (the single-stream case); each request's time
  is the sum of its own steps.
* ``batch=B``: ``B`` slots share every step; a finished request's slot takes the next one. The
  step drafts ``max k_r`` rounds and verifies every row in one pass: ``verify="padded"`` prices it
  at ``query_tokens = max k_r + 1`` for all rows (the step costs what the longest draft costs);
  ``verify="ragged"`` at the rows' mean ``k_r + 1`` (a flattened-token engine: weights and KV read
  once, per-token work for the tokens actually verified), interpolated between whole query counts.

SI units: seconds. Acceptances are per drafted token, in [0, 1].
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from lib.decoding.speculative import Drafter, acceptance_needed, speculative_tokens_per_step
from lib.inputs import fraction, integer, real
from lib.perf.deployment import Deployment, require
from lib.perf.step import decode_step

__all__ = [
    "POLICY_KINDS",
    "MixDraftLengths",
    "Population",
    "Policy",
    "SimResult",
    "StepTable",
    "best_draft_tokens_for",
    "breakeven_acceptance",
    "draw_requests",
    "estimate_acceptance",
    "mix_draft_lengths",
    "simulate",
    "simulate_load",
    "tpot_draws",
    "weighted_quantile",
    "step_table",
    "token_probabilities",
]


# ---- acceptance populations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Population:
    """One traffic class: per-request acceptance ~ Beta with mean ``mean_acceptance`` and
    concentration ``concentration`` (alpha + beta; larger = requests more alike), a ``share`` of
    the requests, ``output_tokens`` generated per request."""

    name: str
    mean_acceptance: float
    concentration: float
    share: float
    output_tokens: int

    def __post_init__(self) -> None:
        real(f"{self.name} mean_acceptance", self.mean_acceptance, 0, 1, low_open=True)
        if self.mean_acceptance >= 1:
            raise ValueError(f"{self.name} mean_acceptance must be below 1; got {self.mean_acceptance}")
        real(f"{self.name} concentration", self.concentration, 0, low_open=True)
        fraction(f"{self.name} share", self.share)
        integer(f"{self.name} output_tokens", self.output_tokens, 1, unit="tokens")


def draw_requests(populations: tuple[Population, ...] | list[Population], n: int, seed: int = 0):
    """``n`` requests drawn from the mix: (acceptance per request, output tokens, population index).

    Each request's class is drawn with probability ``share`` (shares are normalized), then its
    acceptance from that class's Beta(m c, (1 - m) c)."""
    pops = tuple(populations)
    if not pops or not all(isinstance(p, Population) for p in pops):
        raise ValueError("populations must be a non-empty list of Population")
    n = integer("requests", n, 1, unit="requests")
    shares = np.array([p.share for p in pops], dtype=float)
    if shares.sum() <= 0:
        raise ValueError("population shares must not all be zero")
    rng = np.random.default_rng(seed)
    which = rng.choice(len(pops), size=n, p=shares / shares.sum())
    acc = np.empty(n)
    for i, p in enumerate(pops):
        m = which == i
        acc[m] = rng.beta(p.mean_acceptance * p.concentration, (1 - p.mean_acceptance) * p.concentration, m.sum())
    tokens = np.array([pops[i].output_tokens for i in which], dtype=np.int64)
    return acc, tokens, which


# ---- the step table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTable:
    """Step times of one deployment + drafter at one context, by batch and draft length.

    ``batches``: the grid (ascending); ``plain_s[i]``: a plain decode step at ``batches[i]``;
    ``verify_s[i, k]``: the verification pass over ``k + 1`` tokens per row (``verify_s[i, 0]``
    is the plain step); ``draft_round_s[i]``: one drafter forward for the whole batch."""

    label: str
    context: int
    max_draft_tokens: int
    batches: np.ndarray
    plain_s: np.ndarray
    verify_s: np.ndarray
    draft_round_s: np.ndarray
    _rows: dict = field(default_factory=dict, compare=False, repr=False)

    def row(self, batch: float) -> np.ndarray:
        """step_s(batch, k) for k = 0..max_draft_tokens (cached per batch)."""
        got = self._rows.get(batch)
        if got is None:
            v = self._interp(batch, self.verify_s)
            d = float(self._interp(batch, self.draft_round_s))
            got = self._rows[batch] = v + np.arange(self.max_draft_tokens + 1) * d
        return got

    def _interp(self, batch: float, values: np.ndarray) -> np.ndarray:
        b = real("batch", batch, 1, float(self.batches[-1]), unit="sequences")
        i = int(np.searchsorted(self.batches, b))
        if self.batches[min(i, len(self.batches) - 1)] == b:
            return values[min(i, len(self.batches) - 1)]
        lo, hi = self.batches[i - 1], self.batches[i]
        w = (b - lo) / (hi - lo)
        return (1 - w) * values[i - 1] + w * values[i]

    def plain(self, batch: float) -> float:
        """Plain decode step at ``batch`` (seconds)."""
        return float(self._interp(batch, self.plain_s))

    def step_s(self, batch: float, draft_tokens) -> np.ndarray | float:
        """Speculative step with every row drafting ``k`` (array ok): ``k`` drafter rounds plus
        the verification pass at ``k + 1`` tokens per row; ``k = 0`` is the plain step."""
        k = np.asarray(draft_tokens)
        if k.size and (k.min() < 0 or k.max() > self.max_draft_tokens):
            raise ValueError(f"draft_tokens must be in 0..{self.max_draft_tokens}; got {draft_tokens}")
        out = self.row(batch)[k.astype(int)]
        return float(out) if out.ndim == 0 else out

    def ragged_verify_s(self, batch: float, mean_query_tokens: float) -> float:
        """Verification pass when rows verify different counts: at the rows' mean ``k + 1``,
        linear between the two whole counts around it (per-token work scales with the tokens;
        weights and KV are read once either way)."""
        q = real("mean_query_tokens", mean_query_tokens, 1, self.max_draft_tokens + 1)
        v = self._interp(batch, self.verify_s)
        lo = int(math.floor(q))
        if lo >= self.max_draft_tokens + 1:
            return float(v[-1])
        return float(v[lo - 1] + (q - lo) * (v[lo] - v[lo - 1]))


#: The default batch grid of a :class:`StepTable`.
BATCH_GRID = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


@functools.lru_cache(maxsize=32)
def step_table(dep: Deployment, drafter: Drafter, context: int = 1024, max_draft_tokens: int = 12,
               batches: tuple[int, ...] = BATCH_GRID) -> StepTable:
    """Tabulate the speculative step on ``dep`` with ``drafter`` at ``context`` for every batch of
    ``batches`` and ``k`` in ``0..max_draft_tokens`` (cached): the same terms as
    :func:`lib.decoding.speculative.speculative_step` (a unit test holds them equal), each
    :func:`lib.perf.step.decode_step` called once: the plain step, the verification pass at
    ``query_tokens = k + 1``, and one drafter forward per batch."""
    require(dep)
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a Drafter (model_drafter, free_drafter, ...); got {type(drafter).__name__}")
    top = integer("max_draft_tokens", max_draft_tokens, 1, 31, unit="tokens")
    ctx = integer("context", context, 0, unit="tokens")
    bs = tuple(sorted({integer("batch", b, 1, unit="sequences") for b in batches}))
    plain, verify, rounds = [], [], []
    for b in bs:
        row = [decode_step(dep, b, ctx).total_s]
        row += [decode_step(dep, b, ctx, query_tokens=k + 1).total_s for k in range(1, top + 1)]
        plain.append(row[0])
        verify.append(row)
        rounds.append(drafter.token_s(b, ctx))
    return StepTable(f"{dep.label} + {drafter.name}", ctx, top, np.array(bs, dtype=float), np.array(plain),
                     np.array(verify), np.array(rounds))


def best_draft_tokens_for(table: StepTable, acceptance, batch: float = 1, k_min: int = 0, k_max: int | None = None):
    """Per acceptance (array ok), the ``k`` in ``k_min..k_max`` with the least time per token at
    ``batch`` if every row drafted it: argmin_k step_s(batch, k) / E(a, k) (ties: shorter)."""
    k_max = table.max_draft_tokens if k_max is None else integer("k_max", k_max, 0, table.max_draft_tokens)
    k_min = integer("k_min", k_min, 0, k_max)
    ks = np.arange(k_min, k_max + 1)
    cost = np.asarray(table.step_s(batch, ks), dtype=float)
    a = np.asarray(acceptance, dtype=float)
    per_token = cost[None, :] / speculative_tokens_per_step(a.reshape(-1, 1), ks[None, :])
    out = ks[np.argmin(per_token, axis=1)]
    return int(out[0]) if a.ndim == 0 else out


def breakeven_acceptance(table: StepTable, batch: float, draft_tokens: int) -> float:
    """The acceptance below which speculating ``k`` tokens at ``batch`` gives a longer time per
    token than plain decoding: E(a, k) = step_s(batch, k) / plain(batch). Solved with
    :func:`lib.decoding.speculative.acceptance_needed` (target speedup 1, with the step ratio
    written as 1 + k c). math.inf when even a = 1 does not pay; 0 when k = 0."""
    k = integer("draft_tokens", draft_tokens, 0, table.max_draft_tokens)
    if k == 0:
        return 0.0
    ratio = table.step_s(batch, k) / table.plain(batch)
    return acceptance_needed(1.0, k, max(ratio - 1.0, 0.0) / k)


def estimate_acceptance(accepted, trials, prior_mean: float, prior_strength: float):
    """Posterior-mean acceptance of a request: (s m + accepted) / (s + trials), a Beta(s m, s (1 - m))
    prior updated with Bernoulli trials. A step that drafts k and accepts j < k observed j + 1
    trials (the rejected token ends the run; later drafts were never judged); j = k observed k."""
    return (prior_strength * prior_mean + np.asarray(accepted, dtype=float)) / (prior_strength + np.asarray(trials, dtype=float))


# ---- policies ------------------------------------------------------------------------------------

#: Policy kinds (see :class:`Policy`).
POLICY_KINDS = ("fixed", "adaptive", "oracle", "confidence", "batch_adaptive", "per_load", "load_switch", "guard")


@dataclass(frozen=True)
class Policy:
    """How many tokens each running request drafts this step.

    * ``fixed``: every request ``k``.
    * ``adaptive``: each request the ``k`` best for its own running acceptance estimate
      (:func:`estimate_acceptance`, prior ``prior_mean`` of strength ``prior_strength``) at the
      current batch, between ``k_min`` and ``k_max``.
    * ``oracle``: as adaptive with the request's true acceptance.
    * ``confidence``: per step, draft while the probability that every token drafted so far is
      accepted (the product of the drafter's calibrated per-token acceptance probabilities) stays
      at or above ``threshold``, at least ``k_min`` and at most ``k_max`` tokens (the stopping rule
      of SpecDec++ and of EAGLE-2's confidence-ranked tree, with a perfectly calibrated drafter).
    * ``batch_adaptive``: one ``k`` for the whole batch, the one with the most expected tokens per
      second given every row's estimate: argmax_k sum_r E(a_r, k) / step_s(B, k) (at batch 1 the
      same as ``adaptive``).
    * ``per_load``: one ``k`` per batch size: the best for ``prior_mean`` at the current batch, or,
      with ``k_by_batch`` ((batch, k) pairs), the k of the largest listed batch at or below the
      current one (the smallest listed one below them all).
    * ``load_switch``: ``k`` while the batch is at most ``max_batch``, else 0 (an on/off switch).
    * ``guard``: one ``k`` per step, the best for the step's least-accepting row (lowest estimate)
      at the current batch: no row's expected time per token is worse than it would be at any other
      k, the worst row's least of all (0 once that row is below the break-even acceptance).

    ``off_below`` (any kind): a request whose estimate is below it drafts 0 (its drafts stop
    costing verification work in a ragged batch; in a padded one only if every row stops).
    ``off_breakeven`` (any kind): the same with the threshold :func:`breakeven_acceptance` at the
    current batch and the policy's k for that row."""

    kind: str
    k: int = 4
    prior_mean: float = 0.7
    prior_strength: float = 4.0
    k_min: int = 1
    k_max: int = 12
    max_batch: int = 32
    off_below: float = 0.0
    threshold: float = 0.5
    off_breakeven: bool = False
    k_by_batch: tuple = ()
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"policy kind must be one of {', '.join(POLICY_KINDS)}; got {self.kind!r}")
        integer("k", self.k, 0, 31, unit="tokens")
        integer("k_max", self.k_max, 0, 31, unit="tokens")
        integer("k_min", self.k_min, 0, self.k_max, unit="tokens")
        fraction("prior_mean", self.prior_mean)
        real("prior_strength", self.prior_strength, 0, low_open=True)
        integer("max_batch", self.max_batch, 1, unit="sequences")
        fraction("off_below", self.off_below)
        fraction("threshold", self.threshold)
        for pair in self.k_by_batch:
            if len(pair) != 2:
                raise ValueError(f"k_by_batch must hold (batch, k) pairs; got {pair!r}")
            integer("k_by_batch batch", pair[0], 1, unit="sequences")
            integer("k_by_batch k", pair[1], 0, 31, unit="tokens")

    @property
    def label(self) -> str:
        return self.name or {"fixed": f"fixed k = {self.k}", "adaptive": "per-request k (running estimate)",
                             "oracle": "per-request k (true acceptance)",
                             "confidence": f"per-step stop (threshold {self.threshold:g})", "batch_adaptive": "one k per step",
                             "per_load": "k per batch size",
                             "load_switch": f"k = {self.k} up to batch {self.max_batch}, else off",
                             "guard": "k for the step's least-accepting row"}[self.kind]

    def draft_tokens(self, table: StepTable, batch: int, est: np.ndarray, true: np.ndarray,
                     token_p: np.ndarray | None = None) -> np.ndarray:
        """k per running row at ``batch`` given the rows' estimates, true acceptances and (for
        ``confidence``) this step's per-position acceptance probabilities ``token_p[row, i]``."""
        n = len(est)
        top = min(self.k_max, table.max_draft_tokens)
        if self.kind == "confidence":
            if token_p is None:
                raise ValueError("the confidence policy needs the per-token acceptance probabilities")
            run = np.cumprod(token_p[:, :top], axis=1) >= self.threshold
            k = np.maximum(np.cumprod(run, axis=1).sum(axis=1), min(self.k_min, top))
        elif self.kind == "fixed":
            k = np.full(n, min(self.k, table.max_draft_tokens))
        elif self.kind in ("adaptive", "oracle") or (self.kind == "batch_adaptive" and batch == 1):
            k = best_draft_tokens_for(table, true if self.kind == "oracle" else est, batch, min(self.k_min, top), top)
            k = np.atleast_1d(k)
        elif self.kind == "batch_adaptive":
            ks = np.arange(min(self.k_min, top), top + 1)
            rate = speculative_tokens_per_step(est.reshape(-1, 1), ks[None, :]).sum(axis=0) / table.step_s(batch, ks)
            k = np.full(n, ks[int(np.argmax(rate))])
        elif self.kind == "per_load" and self.k_by_batch:
            pairs = sorted(self.k_by_batch)
            below = [kk for b, kk in pairs if b <= batch]
            k = np.full(n, min(below[-1] if below else pairs[0][1], top))
        elif self.kind == "per_load":
            key = ("per_load", batch, self.prior_mean, top)
            if key not in table._rows:
                table._rows[key] = best_draft_tokens_for(table, self.prior_mean, batch, 0, top)
            k = np.full(n, table._rows[key])
        elif self.kind == "guard":
            k = np.full(n, best_draft_tokens_for(table, float(est.min()), batch, 0, top))
        else:  # load_switch
            k = np.full(n, min(self.k, table.max_draft_tokens) if batch <= self.max_batch else 0)
        if self.off_below > 0:
            k = np.where(est < self.off_below, 0, k)
        if self.off_breakeven:
            floor = np.array([_breakeven_cached(table, batch, int(j)) for j in k])
            k = np.where(est < floor, 0, k)
        return k.astype(np.int64)


def _breakeven_cached(table: StepTable, batch: float, k: int) -> float:
    key = ("breakeven", batch, k)
    got = table._rows.get(key)
    if got is None:
        got = table._rows[key] = breakeven_acceptance(table, batch, k)
    return got


# ---- the simulation ------------------------------------------------------------------------------


@dataclass
class SimResult:
    """Per request: ``decode_s`` (first step start to last token), ``tokens`` (emitted),
    ``steps``, ``drafted`` and ``accepted`` tokens, ``trials`` (drafted tokens the target judged:
    accepted plus one per rejection), ``acceptance`` (true); whole run:
    ``elapsed_s``, ``step_k`` (max k of each step), ``step_batch``, ``step_s``. Requests that did
    not finish before ``horizon_s`` have ``done`` False."""

    acceptance: np.ndarray
    tokens: np.ndarray
    decode_s: np.ndarray
    steps: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    trials: np.ndarray
    done: np.ndarray
    elapsed_s: float
    step_k: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_batch: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def per_token_s(self) -> np.ndarray:
        """Each finished request's decode time per output token (its mean TPOT)."""
        return self.decode_s[self.done] / self.tokens[self.done]

    @property
    def tokens_per_s(self) -> float:
        """Output tokens of finished requests over the elapsed time (batch 1: the sum of the
        requests' times, one after another)."""
        return float(self.tokens[self.done].sum() / self.elapsed_s)


def token_probabilities(rng, a: np.ndarray, width: int, token_concentration: float | None) -> np.ndarray:
    """Per-position acceptance probabilities of one step, rows x ``width``: each ~ Beta(a k, (1 - a) k)
    with k = ``token_concentration`` (None: every position exactly a). Their mean is a, so the
    accepted run of a fixed draft length is still min(Geometric, k) with E from eq. 1."""
    if token_concentration is None:
        return np.repeat(a[:, None], width, axis=1)
    c = float(token_concentration)
    lo, hi = np.clip(a * c, 1e-9, None), np.clip((1 - a) * c, 1e-9, None)
    return rng.beta(np.repeat(lo[:, None], width, 1), np.repeat(hi[:, None], width, 1))


def _accepted(rng, p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Leading accepted positions (u < p) of each row, capped at that row's k."""
    ok = rng.random(p.shape) < p
    run = np.cumprod(ok, axis=1).sum(axis=1)
    return np.minimum(run, k).astype(np.int64)


def simulate(acceptance, output_tokens, table: StepTable, policy: Policy, batch: int = 1, *,
             verify: str = "padded", seed: int = 0, horizon_s: float | None = None,
             token_concentration: float | None = None, until_done: int | None = None,
             max_steps: int = 200_000) -> SimResult:
    """Run the requests (module doc): ``batch=1`` all alone (each its own steps at batch 1), else
    ``batch`` slots filled in order. ``verify``: ``padded`` or ``ragged`` (module doc).
    ``horizon_s`` stops a batched run at that time (unfinished requests: ``done`` False).
    ``token_concentration``: spread of the per-token acceptance probabilities around each
    request's acceptance (:func:`token_probabilities`; None: none). ``until_done``: a batched run
    stops once the first ``until_done`` requests have finished (the later ones keep the batch full
    meanwhile and are reported unfinished or finished as they are: measure only the first ones)."""
    a = np.asarray(acceptance, dtype=float)
    t = np.asarray(output_tokens, dtype=np.int64)
    if a.ndim != 1 or len(a) == 0 or t.shape != a.shape:
        raise ValueError("acceptance and output_tokens must be 1-D arrays of the same non-zero length")
    if np.any((a < 0) | (a > 1)):
        raise ValueError("acceptance must be in [0, 1]")
    if np.any(t < 1):
        raise ValueError("output_tokens must be at least 1")
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy; got {type(policy).__name__}")
    b = integer("batch", batch, 1, int(table.batches[-1]), unit="sequences")
    if verify not in ("padded", "ragged"):
        raise ValueError(f"verify must be padded or ragged; got {verify!r}")
    rng = np.random.default_rng(seed)
    n = len(a)
    emitted = np.zeros(n, np.int64)
    steps = np.zeros(n, np.int64)
    drafted = np.zeros(n, np.int64)
    acc = np.zeros(n, np.int64)
    trials = np.zeros(n, np.int64)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    prior_mean, strength = policy.prior_mean, policy.prior_strength

    def one_step(rows, size):
        est = estimate_acceptance(acc[rows], trials[rows], prior_mean, strength)
        p = token_probabilities(rng, a[rows], table.max_draft_tokens, token_concentration)
        k = policy.draft_tokens(table, size, est, a[rows], p)
        j = _accepted(rng, p, k)
        emit = np.minimum(j + 1, t[rows] - emitted[rows])
        emitted[rows] += emit
        steps[rows] += 1
        drafted[rows] += k
        acc[rows] += j
        trials[rows] += np.where(j < k, j + 1, k)
        return k

    if b == 1:  # every request alone: rows advance in lockstep, each with its own clock
        clock = np.zeros(n)
        start[:] = 0.0
        live = np.arange(n)
        for _ in range(max_steps):
            if len(live) == 0:
                break
            k = one_step(live, 1)
            clock[live] += table.step_s(1, k)
            live = live[emitted[live] < t[live]]
        end = clock
        done = emitted >= t
        return SimResult(a, emitted, end - start, steps, drafted, acc, trials, done, float(clock[done].sum()))

    now = 0.0
    nxt = min(b, n)
    slots = list(range(nxt))
    start[slots] = 0.0
    ks, sizes, durs = [], [], []
    watch = None if until_done is None else integer("until_done", until_done, 1, n)
    for _ in range(max_steps):
        if not slots or (horizon_s is not None and now >= horizon_s):
            break
        if watch is not None and bool(np.all(emitted[:watch] >= t[:watch])):
            break
        rows = np.array(slots)
        size = len(rows)
        k = one_step(rows, size)
        kmax = int(k.max())
        if verify == "padded" or kmax == 0:
            dur = table.step_s(size, kmax)
        else:
            d = float(table._interp(size, table.draft_round_s))
            dur = kmax * d + table.ragged_verify_s(size, float(k.mean()) + 1.0)
        now += dur
        ks.append(kmax)
        sizes.append(size)
        durs.append(dur)
        keep = []
        for r in slots:
            if emitted[r] >= t[r]:
                end[r] = now
                if nxt < n:
                    start[nxt] = now
                    keep.append(nxt)
                    nxt += 1
            else:
                keep.append(r)
        slots = keep
    done = emitted >= t
    return SimResult(a, emitted, np.where(done, end - start, np.nan), steps, drafted, acc, trials, done, now,
                     np.array(ks), np.array(sizes), np.array(durs))


# ---- the two-class mix in expectation ------------------------------------------------------------


@dataclass(frozen=True)
class MixDraftLengths:
    """Expected time per token of a two-class mix (a share ``s`` of the requests in class 1, all of
    the same length) by draft length, every row drafting the same ``k`` at ``batch``:
    ``per_token_s[c, k]`` = step_s(B, k) / E(a_c, k) for class c, and ``mix_per_token_s[k]`` =
    step_s(B, k) (s / E(a1, k) + (1 - s) / E(a2, k)) (a class-c request needs T / E_c steps, so the
    mix's tokens per row-step is the harmonic mean). ``best_k``: per class; ``fixed_k``: the best
    single k for the mix. ``per_class_gain``: each class its own k at batch 1 (requests alone),
    over the best fixed k. ``padded_per_class_gain``: the same per-class k inside a padded batch of
    B rows, where a step holding both classes costs step_s(B, max(k1, k2)): time per token
    step_s(B, max k) (s / E(a1, k1) + (1 - s) / E(a2, k2)) against the mix's best fixed k at B
    (negative: a loss). Both classes are taken present in every step (probability
    1 - s^B - (1 - s)^B)."""

    batch: int
    ks: np.ndarray
    per_token_s: np.ndarray
    mix_per_token_s: np.ndarray
    best_k: tuple[int, int]
    fixed_k: int
    per_class_gain: float
    padded_per_class_gain: float
    plain_s: float


def mix_draft_lengths(table: StepTable, acceptance: tuple[float, float], share: float, batch: int = 1,
                      max_draft_tokens: int | None = None) -> MixDraftLengths:
    """Expected-value view of a two-class mix (see :class:`MixDraftLengths`), from the table."""
    a1, a2 = (fraction("acceptance", x) for x in acceptance)
    s = fraction("share", share)
    b = integer("batch", batch, 1, int(table.batches[-1]), unit="sequences")
    top = table.max_draft_tokens if max_draft_tokens is None else integer("max_draft_tokens", max_draft_tokens, 0,
                                                                          table.max_draft_tokens)
    ks = np.arange(top + 1)
    e = speculative_tokens_per_step(np.array([[a1], [a2]]), ks[None, :])
    cost = np.asarray(table.step_s(b, ks))
    per = cost[None, :] / e
    mix = cost * (s / e[0] + (1 - s) / e[1])
    fixed = int(np.argmin(mix))
    c1, c2 = table.step_s(1, ks) / e[0], table.step_s(1, ks) / e[1]
    per_class = s * float(c1.min()) + (1 - s) * float(c2.min())
    per_class_gain = float(np.min(s * c1 + (1 - s) * c2)) / per_class - 1
    k1, k2 = int(np.argmin(per[0])), int(np.argmin(per[1]))
    padded = float(cost[max(k1, k2)] * (s / e[0, k1] + (1 - s) / e[1, k2]))
    return MixDraftLengths(b, ks, per, mix, (k1, k2), fixed, per_class_gain, float(mix[fixed]) / padded - 1,
                           table.plain(b))


# ---- load: a day of batch levels ----------------------------------------------------------------


def weighted_quantile(values, weights, q: float) -> float:
    """The ``q`` quantile of ``values`` with ``weights`` (the smallest value whose cumulative weight
    reaches q of the total: the inverse of the weighted empirical CDF)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    fraction("q", q)
    if v.shape != w.shape or v.size == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("values and weights must be non-empty arrays of one shape, weights >= 0 with a positive sum")
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    i = int(np.searchsorted(cum, q * cum[-1] - 1e-12 * cum[-1]))
    return float(v[order][min(i, v.size - 1)])


@dataclass
class LoadResult:
    """Requests measured at each load level, pooled: per request ``per_token_s`` (its mean time per
    output token), ``acceptance``, ``batch`` (its level), ``weight`` (its share of all requests of
    the day: the level's time share x its request rate / requests measured there). ``tokens_per_s``
    per level; ``time_share`` per level."""

    per_token_s: np.ndarray
    acceptance: np.ndarray
    batch: np.ndarray
    weight: np.ndarray
    levels: tuple[int, ...]
    time_share: tuple[float, ...]
    tokens_per_s: tuple[float, ...]

    def quantile(self, q: float) -> float:
        """Weighted quantile of the per-request time per token over the day."""
        return weighted_quantile(self.per_token_s, self.weight, q)


def simulate_load(populations, table: StepTable, policy: Policy, levels, time_share, *, per_level: int = 2,
                  seed: int = 0, verify: str = "padded", token_concentration: float | None = None) -> LoadResult:
    """A day of load as batch levels: at each level ``B`` (held for ``time_share`` of the day) a
    batched :func:`simulate` with ``B`` slots kept full measures the first ``per_level x B``
    requests; each is weighted by its level's share of the day's requests: time share x arrival
    rate, the rate that keeps B sequences busy without speculation, B / (mean output tokens x
    plain step) (Little's law), the same for every policy. The batch is held at B (speculation,
    serving the same arrivals faster, would shrink it a little, which only lowers its step). A
    request lives at one level (load changes slowly against a request's life). Deterministic."""
    lv = tuple(integer("batch level", b, 1, int(table.batches[-1]), unit="sequences") for b in levels)
    sh = tuple(fraction("time share", x) for x in time_share)
    if len(lv) != len(sh) or not lv or sum(sh) <= 0:
        raise ValueError("levels and time_share must be non-empty, of one length, with a positive total share")
    m = integer("per_level", per_level, 1, 50)
    pops = tuple(populations)
    t_max = max(p.output_tokens for p in pops)
    t_min = min(p.output_tokens for p in pops)
    t_mean = sum(p.share * p.output_tokens for p in pops) / sum(p.share for p in pops)
    out = {k: [] for k in ("tpot", "acc", "batch", "weight")}
    rates = []
    for i, (b, share) in enumerate(zip(lv, sh, strict=True)):
        measured = m * b
        fillers = b * (2 + (m * t_max) // t_min)
        acc, tok, _ = draw_requests(pops, measured + fillers, seed=seed * 7919 + i)
        res = simulate(acc, tok, table, policy, b, seed=seed * 7919 + 104729 + i, verify=verify,
                       token_concentration=token_concentration, until_done=measured)
        first = np.arange(measured)
        tpot = res.decode_s[first] / res.tokens[first]
        arrivals = b / (t_mean * table.plain(b))  # requests per second that keep B busy without speculation
        rates.append(float(res.tokens[res.done].sum() / res.elapsed_s))
        out["tpot"].append(tpot)
        out["acc"].append(acc[first])
        out["batch"].append(np.full(measured, b))
        out["weight"].append(np.full(measured, share * arrivals / measured))
    w = np.concatenate(out["weight"])
    return LoadResult(np.concatenate(out["tpot"]), np.concatenate(out["acc"]), np.concatenate(out["batch"]),
                      w / w.sum(), lv, sh, tuple(rates))


def tpot_draws(table: StepTable, batch: float, draft_tokens: int, acceptance, output_tokens: int, seed: int = 0):
    """Each request's mean time per output token at ``batch`` with every row drafting ``k``, drawn from
    the renewal central limit theorem: a request of T tokens takes N(T) steps with
    N ~ Normal(T / mu, T sigma^2 / mu^3), mu and sigma^2 the mean and variance of the tokens one step
    emits (X = min(Geometric, k) + 1: P(X = j + 1) = a^j (1 - a) for j < k, a^k for j = k), so
    t_token = t_step (1 / mu) (1 + Z sigma / sqrt(mu T)), Z standard normal. Arrays of acceptance ok."""
    k = integer("draft_tokens", draft_tokens, 0, table.max_draft_tokens)
    t = integer("output_tokens", output_tokens, 1, unit="tokens")
    a = np.atleast_1d(np.asarray(acceptance, dtype=float))
    j = np.arange(k + 1)
    pmf = np.where(j[None, :] < k, a[:, None] ** j[None, :] * (1 - a[:, None]), a[:, None] ** k)
    mu = (pmf * (j + 1)).sum(axis=1)
    var = (pmf * (j + 1) ** 2).sum(axis=1) - mu ** 2
    z = np.random.default_rng(seed).standard_normal(a.size)
    return table.step_s(batch, k) / mu * (1 + z * np.sqrt(np.maximum(var, 0) / (mu * t)))
