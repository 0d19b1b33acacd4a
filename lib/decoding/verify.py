"""Verification of drafted tokens: the greedy prefix match, the rejection-sampling verifier, and the
exact output distribution of a verifier by enumeration on a small vocabulary.

Conventions (one batch of ``B`` sequences, at most ``K`` drafted tokens each, vocabulary ``V``):

* ``drafted`` (B, K) int: row b's drafted tokens in columns ``0 .. num_drafted[b] - 1``, padded
  with ``PAD`` (-1) after them (rows draft different numbers of tokens: ragged, padded);
* ``target_probs`` (B, K + 1, V): position j is the target's distribution for the token after the
  first j drafted tokens (position ``num_drafted[b]`` is the bonus position);
* ``draft_probs`` (B, K, V): the drafter's distribution the token at position j was drawn from;
* a result holds ``tokens`` (B, K + 1): the emitted tokens (the accepted drafts, then one token of
  the target's), padded with ``PAD``; ``num_accepted`` and ``num_emitted = num_accepted + 1``.

The rejection rule (Leviathan, Kalman and Matias, ICML 2023; Chen et al., arXiv:2302.01318):
accept drafted token x with probability min(1, p(x) / q(x)); at the first rejection emit a token
drawn from the residual norm(max(0, p - q)); when all drafts are accepted emit a bonus token drawn
from the target at the next position. The emitted token at any position is then distributed as p:
P(x) = q(x) min(1, p/q) + (1 - sum_y min(p, q)) (p(x) - min(p, q)(x)) / (1 - sum_y min(p, q)) = p(x).

:func:`step_distribution` and :func:`stream_distribution` compute a verifier's output
distribution exactly from a :class:`Rule` (the accept probability, the residual and the bonus as
the sampler really draws them), so a lossless rule and a biased one can be told apart with no
sampling at all; :func:`chi_square_test` and :func:`detection_power` are the seeded statistical
test a grader runs on an implementation it cannot enumerate. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lib.decoding.sampling import chi_square_bins, chi_square_of_counts, softmax
from lib.inputs import integer, integer_array, real

__all__ = [
    "BIASED_RULES",
    "PAD",
    "REFERENCE_RULE",
    "Rule",
    "ToyModel",
    "VerifyResult",
    "binomial_upper_bound",
    "chi_square_statistic",
    "chi_square_test",
    "critical_value",
    "detection_power",
    "greedy_verify",
    "inverse_cdf",
    "kv_slots",
    "rejection_verify",
    "reused_uniform_first_token",
    "step_distribution",
    "stream_distribution",
    "target_stream_distribution",
    "total_variation",
]

PAD = -1


@dataclass(frozen=True)
class VerifyResult:
    """What one verification step emits per row (module doc): ``tokens`` (B, K + 1) padded with PAD."""

    tokens: np.ndarray
    num_accepted: np.ndarray
    num_emitted: np.ndarray
    kv_rollback: np.ndarray  # KV slots written by the pass that are now invalid (see greedy_verify)

    def emitted(self, row: int) -> tuple[int, ...]:
        """Row ``row``'s emitted tokens, in order."""
        return tuple(int(t) for t in self.tokens[row, : self.num_emitted[row]])


def _batch(drafted, num_drafted) -> tuple[np.ndarray, np.ndarray]:
    d = integer_array("drafted", drafted, PAD)
    if d.ndim != 2:
        raise ValueError(f"drafted must be a (batch, max_draft) array of token ids, got shape {d.shape}")
    n = integer_array("num_drafted", num_drafted, 0)
    if n.shape != (d.shape[0],) or (n.size and n.max() > d.shape[1]):
        raise ValueError(f"num_drafted must hold one count in [0, {d.shape[1]}] per row ({d.shape[0]} rows), "
                         f"got {n.tolist()}")
    pos = np.arange(d.shape[1])
    inside = pos[None, :] < n[:, None]
    if (d[inside] < 0).any():
        raise ValueError("drafted must hold a token id >= 0 in each row's first num_drafted columns")
    return d, n


# ---- temperature zero: the prefix match ----------------------------------------------------------


def greedy_verify(target_argmax, drafted, num_drafted) -> VerifyResult:
    """Greedy verification: accept the longest prefix where the draft equals the target's argmax.

    ``target_argmax`` (B, K + 1): the target's argmax at each position of the verification pass.
    n_b = the number of leading positions j < num_drafted[b] with drafted[b, j] == target[b, j];
    the emitted tokens are target[b, 0 .. n_b] (the accepted drafts equal the target's tokens there,
    and position n_b holds the correction, or the bonus when every draft matched): n_b + 1 tokens.
    KV: the pass fed the last emitted token and the num_drafted[b] drafts, writing one KV slot each;
    the slots of the num_drafted[b] - n_b rejected drafts are invalid (``kv_rollback``), and the new
    token has no slot yet (the next pass feeds it).
    """
    d, n = _batch(drafted, num_drafted)
    t = integer_array("target_argmax", target_argmax, 0)
    B, K = d.shape
    if t.shape != (B, K + 1):
        raise ValueError(f"target_argmax must have shape (batch, max_draft + 1) = {(B, K + 1)}, got {t.shape}")
    pos = np.arange(K + 1)
    match = (d == t[:, :K]) & (pos[None, :K] < n[:, None])  # padded columns never match
    accepted = np.cumprod(match, axis=1).sum(axis=1)  # length of the matching prefix
    tokens = np.where(pos[None, :] <= accepted[:, None], t, PAD)  # drafts == target on the prefix
    rollback = n - accepted  # KV of the rejected drafts; the emitted token's KV is written next pass
    return VerifyResult(tokens, accepted, accepted + 1, rollback)


# ---- the rejection-sampling verifier ---------------------------------------------------------------


def inverse_cdf(probs, u) -> np.ndarray:
    """Sample each row of ``probs`` (..., V) with one uniform ``u`` (...) in [0, 1): the index i with
    cdf[i - 1] <= u < cdf[i], i.e. the count of cdf entries <= u, capped at the last index with
    positive probability (a row summing to 0.9999999 after rounding must not return V). Assumes
    each row sums to 1: leftover mass of a row that sums to less lands on that last index."""
    p = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(p, axis=-1)
    idx = (cdf <= np.asarray(u)[..., None]).sum(axis=-1)
    last = p.shape[-1] - 1 - np.argmax(p[..., ::-1] > 0, axis=-1)
    return np.minimum(idx, last)


def rejection_verify(target_probs, draft_probs, drafted, num_drafted, rng) -> VerifyResult:
    """Speculative sampling over a ragged batch (module doc); ``rng`` a numpy Generator or an int seed.

    Row b accepts drafted token x at position j < num_drafted[b] when u * q_j(x) < p_j(x), u ~ U[0, 1)
    (probability min(1, p/q)), up to its first rejection n_b; position n_b then emits a token drawn
    from norm(max(0, p - q)) after a rejection, or from p (the bonus) when every draft was accepted.
    """
    rng = np.random.default_rng(rng)
    d, n = _batch(drafted, num_drafted)
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    B, K = d.shape
    if p.ndim != 3 or p.shape[:2] != (B, K + 1) or q.shape != (B, K, p.shape[2]):
        raise ValueError(f"target_probs must be (batch, max_draft + 1, vocab) = {(B, K + 1, 'V')} and draft_probs "
                         f"(batch, max_draft, vocab) = {(B, K, 'V')}; got {p.shape} and {q.shape}")
    if (d >= p.shape[2]).any():
        raise ValueError(f"drafted token ids must be below the vocabulary size {p.shape[2]}")
    rows = np.arange(B)
    pos = np.arange(K)
    valid = pos[None, :] < n[:, None]  # the padded columns are not drafts
    x = np.where(valid, d, 0)
    px = np.take_along_axis(p[:, :K], x[..., None], axis=-1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    u = rng.random((B, K))
    accept = (u * qx < px) & valid  # u < p/q: probability min(1, p/q)
    accepted = np.cumprod(accept, axis=1).sum(axis=1)  # up to the first rejection
    rejected = accepted < n
    p_next = p[rows, accepted]  # the target at the first position not accepted
    q_next = q[rows, np.minimum(accepted, K - 1)] if K else np.zeros_like(p_next)
    residual = np.maximum(p_next - q_next, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    residual = np.where(mass > 0, residual / np.where(mass > 0, mass, 1.0), p_next)  # mass 0 only if p == q
    final = np.where(rejected[:, None], residual, p_next)  # the residual, or the bonus from p
    y = inverse_cdf(final, rng.random(B))
    tokens = np.full((B, K + 1), PAD, dtype=np.int64)
    tokens[:, :K] = np.where(pos[None, :] < accepted[:, None], d, PAD)
    tokens[rows, accepted] = y
    return VerifyResult(tokens, accepted, accepted + 1, n - accepted)


def reused_uniform_first_token(p, q) -> np.ndarray:
    """Exact distribution of the FIRST emitted token (k >= 1 drafts) of a verifier that samples the
    final token with the uniform of its last accept test instead of a fresh one (the practice draft
    "acceptance uniform reused"). The first token is the draft x ~ q when it is accepted (u < p(x)/q(x))
    and otherwise the residual sample inverse_cdf(norm(max(0, p - q)), u) with the same u, which is then
    known to lie in [p(x)/q(x), 1): P(y) = min(p, q)(y) + sum_x q(x) |[r_x, 1) & [c_{y-1}, c_y)|, with
    r_x = p(x)/q(x) and c the residual's CDF (its last positive entry extended to 1, as inverse_cdf caps).
    A fresh uniform gives p exactly; this one gives p only when the residual has a single token."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 1 or q.shape != p.shape or (p < 0).any() or (q < 0).any():
        raise ValueError(f"p and q must be probability vectors of the same length, got shapes {p.shape}, {q.shape}")
    if abs(p.sum() - 1) > 1e-9 or abs(q.sum() - 1) > 1e-9:
        raise ValueError(f"p and q must each sum to 1, got {p.sum():.12g} and {q.sum():.12g}")
    out = np.minimum(p, q)
    residual = np.maximum(p - q, 0.0)
    if residual.sum() == 0:
        return out  # p == q: never rejected
    hi = np.cumsum(residual / residual.sum())
    last = len(p) - 1 - int(np.argmax(residual[::-1] > 0))
    hi[last:] = 1.0
    lo = np.concatenate([[0.0], hi[:-1]])
    r = _min_ratio(p, q)  # u >= r rejects
    for x in np.flatnonzero((q > 0) & (r < 1)):
        out += q[x] * np.clip(hi - np.maximum(lo, r[x]), 0.0, None)
    return out


# ---- exact output distributions by enumeration ---------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A verifier as three maps on probability vectors, as its sampler really draws (for enumeration):
    ``accept(p, q)``: the probability of accepting each token x; ``residual(p, q)``: the distribution
    of the token emitted after a rejection; ``bonus(p)``: the distribution of the token emitted after
    full acceptance, or None when no bonus token is emitted."""

    name: str
    accept: Callable[[np.ndarray, np.ndarray], np.ndarray]
    residual: Callable[[np.ndarray, np.ndarray], np.ndarray]
    bonus: Callable[[np.ndarray], np.ndarray | None]


def _norm_residual(p, q):
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    return r / s if s > 0 else p


def _min_ratio(p, q):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 1.0)


def _unnormalised_residual(p, q):
    """max(0, p - q) fed to inverse_cdf unnormalised: the missing mass lands on its last positive index."""
    r = np.maximum(p - q, 0.0)
    if r.sum() == 0:
        return p
    out = r.copy()
    out[len(r) - 1 - int(np.argmax(r[::-1] > 0))] += 1.0 - r.sum()
    return out


REFERENCE_RULE = Rule("lossless", _min_ratio, _norm_residual, lambda p: p)
BIASED_RULES = {
    "residual not renormalised": Rule("residual not renormalised", _min_ratio, _unnormalised_residual, lambda p: p),
    "residual = p": Rule("residual = p", _min_ratio, lambda p, q: p, lambda p: p),
    "bonus token dropped": Rule("bonus token dropped", _min_ratio, _norm_residual, lambda p: None),
    "accept only if p >= q": Rule("accept only if p >= q", lambda p, q: (p >= q).astype(float), _norm_residual,
                                  lambda p: p),
}


def step_distribution(target: Callable, draft: Callable, num_drafted: int, rule: Rule = REFERENCE_RULE) -> dict:
    """Exact distribution of the tokens one verification step emits: {emitted tuple: probability}.

    ``target(prefix)`` and ``draft(prefix)`` give the probability vectors after the drafted tokens
    ``prefix`` (a tuple). Recursion over positions j < num_drafted: draft x with q(x), accepted with
    rule.accept(p, q)[x] (continue with prefix + x), else emit prefix + y with y ~ rule.residual(p, q);
    at j = num_drafted emit prefix + y, y ~ rule.bonus(p) (prefix alone when there is no bonus).
    Exact up to float rounding; cost V^num_drafted.
    """
    k = integer("num_drafted", num_drafted, 0)
    out: dict = {}

    def add(seq, prob):
        if prob > 0:
            out[seq] = out.get(seq, 0.0) + prob

    def walk(prefix: tuple, prob: float) -> None:
        p = np.asarray(target(prefix), dtype=np.float64)
        if len(prefix) == k:
            b = rule.bonus(p)
            if b is None:
                add(prefix, prob)
            else:
                for y in np.flatnonzero(b):
                    add(prefix + (int(y),), prob * b[y])
            return
        q = np.asarray(draft(prefix), dtype=np.float64)
        a = rule.accept(p, q)
        reject = float(np.sum(q * (1.0 - a)))
        if reject > 0:
            r = rule.residual(p, q)
            for y in np.flatnonzero(r):
                add(prefix + (int(y),), prob * reject * r[y])
        for x in np.flatnonzero(q * a):
            walk(prefix + (int(x),), prob * q[x] * a[x])

    walk((), 1.0)
    return out


@dataclass(frozen=True)
class ToyModel:
    """A seeded toy target and drafter on a small vocabulary whose distributions depend on the prefix.

    The target's logits after a context come from a table of ``states`` rows (std ``logit_std``),
    indexed by a rolling hash of the context; the drafter's are the target's plus Gaussian noise of
    std ``draft_noise`` (0: the drafter is the target). Probabilities via ``sampling.softmax``.
    """

    vocab: int = 4
    states: int = 64
    logit_std: float = 1.5
    draft_noise: float = 1.0
    seed: int = 0

    def __post_init__(self):
        integer("vocab", self.vocab, 2, 64)
        integer("states", self.states, 1, 4096)
        real("logit_std", self.logit_std, 0)
        real("draft_noise", self.draft_noise, 0)
        integer("seed", self.seed, 0)
        rng = np.random.default_rng(self.seed)
        t = rng.standard_normal((self.states, self.vocab)) * self.logit_std
        object.__setattr__(self, "_logits", (t, t + rng.standard_normal(t.shape) * self.draft_noise))
        object.__setattr__(self, "_memo", {})

    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        return self._logits

    def _state(self, context: tuple) -> int:
        h = 7
        for tok in context:
            h = (h * 1_000_003 + int(tok) + 1) % 2_147_483_647
        return h % self.states

    def target_logits(self, context: tuple) -> np.ndarray:
        return self._tables()[0][self._state(context)]

    def target(self, context: tuple, temperature: float = 1.0) -> np.ndarray:
        """The target's next-token distribution after ``context`` (read-only, memoised per state)."""
        return self._probs(0, self._state(context), temperature)

    def draft(self, context: tuple, temperature: float = 1.0) -> np.ndarray:
        """The drafter's next-token distribution after ``context`` (read-only, memoised per state)."""
        return self._probs(1, self._state(context), temperature)

    def _probs(self, which: int, state: int, temperature: float) -> np.ndarray:
        key = (which, state, temperature)
        if key not in self._memo:
            p = softmax(self._tables()[which][state], temperature)
            p.setflags(write=False)
            self._memo[key] = p
        return self._memo[key]


def stream_distribution(target: Callable, draft: Callable, draft_tokens: int, num_tokens: int,
                        rule: Rule = REFERENCE_RULE) -> dict:
    """Exact distribution of the first ``num_tokens`` output tokens when speculative steps of
    ``draft_tokens`` drafts each run from an empty context: {token tuple: probability}.
    ``target(context)`` / ``draft(context)`` give the next-token distributions after a context."""
    k = integer("draft_tokens", draft_tokens, 0)
    n = integer("num_tokens", num_tokens, 1)
    out: dict = {}

    def walk(context: tuple, prob: float) -> None:
        if len(context) >= n:
            key = context[:n]
            out[key] = out.get(key, 0.0) + prob
            return
        step = step_distribution(lambda pre: target(context + pre), lambda pre: draft(context + pre), k, rule)
        for seq, pr in step.items():
            if not seq:
                raise ValueError(f"rule {rule.name!r} emitted nothing in a step: the stream never advances")
            walk(context + seq, prob * pr)

    walk((), 1.0)
    return out


def target_stream_distribution(target: Callable, vocab: int, num_tokens: int) -> dict:
    """The target's own distribution of its first ``num_tokens`` tokens: prod_i p(y_i | y_<i)."""
    n = integer("num_tokens", num_tokens, 1)
    out = {(): 1.0}
    for _ in range(n):
        out = {seq + (y,): pr * float(target(seq)[y]) for seq, pr in out.items() for y in range(vocab)}
    return {s: pr for s, pr in out.items() if pr > 0}


def total_variation(a: dict, b: dict) -> float:
    """Total-variation distance 1/2 sum |a(s) - b(s)| between two distributions given as dicts."""
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


# ---- the seeded statistical test -------------------------------------------------------------------


def _outcome_arrays(counts: dict, expected: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """(counts, probabilities) over ``expected``'s outcomes, and the count of outcomes it does not list."""
    keys = list(expected)
    c = np.array([counts.get(k, 0) for k in keys], dtype=np.int64)
    return c, np.array([expected[k] for k in keys], dtype=np.float64), int(sum(counts.values()) - c.sum())


def chi_square_statistic(counts: dict, expected: dict, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's X^2 = sum (O - E)^2 / E of observed ``counts`` (outcome -> count) against the
    probabilities ``expected`` (outcome -> probability), binned as
    :func:`lib.decoding.sampling.chi_square_bins` bins them (the book's one chi-square,
    :func:`~lib.decoding.sampling.chi_square_of_counts`); inf when an outcome of probability 0, or one
    ``expected`` does not list, was observed. Returns (X^2, bins)."""
    if sum(counts.values()) <= 0:
        raise ValueError("counts must hold at least one observation")
    c, p, outside = _outcome_arrays(counts, expected)
    res = chi_square_of_counts(c, p / p.sum(), min_expected)
    if outside or res.impossible:
        return math.inf, res.bins
    return res.statistic, res.bins


def _simulated_statistics(expected_by_group: list, sampled_by_group: list, sizes: list, sims: int,
                          rng) -> np.ndarray:
    """X^2 (summed over groups) of ``sims`` multinomial samples drawn from ``sampled_by_group``,
    measured against ``expected_by_group``: :func:`chi_square_statistic` vectorized (same bins)."""
    total = np.zeros(sims)
    for e, b, n in zip(expected_by_group, sampled_by_group, sizes, strict=True):
        keys = list(e)
        pe = np.array([e[k] for k in keys], dtype=np.float64)
        pe = pe / pe.sum()
        pb = np.array([b.get(k, 0.0) for k in keys] + [max(0.0, 1.0 - sum(b.get(k, 0.0) for k in keys))])
        obs = rng.multinomial(n, pb / pb.sum(), size=sims)
        bins = chi_square_bins(pe, n)
        live = bins >= 0
        size = int(bins.max()) + 1
        onehot = np.zeros((len(keys), size))
        onehot[np.flatnonzero(live), bins[live]] = 1.0
        o = obs[:, :-1] @ onehot
        x = onehot.T @ (n * pe)
        stat = ((o - x) ** 2 / x).sum(axis=1)
        stat[(obs[:, :-1][:, ~live] > 0).any(axis=1) | (obs[:, -1] > 0)] = np.inf  # an impossible outcome happened
        total += stat
    return total


def chi_square_test(counts_by_group: list, expected_by_group: list, alpha: float = 1e-3, sims: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """The grader's test: the sum over groups of :func:`chi_square_statistic`, and its critical value
    (:func:`critical_value`). Returns (statistic, critical value); reject when statistic > critical."""
    if len(counts_by_group) != len(expected_by_group) or not counts_by_group:
        raise ValueError("counts_by_group and expected_by_group must be non-empty lists of the same length")
    stat = sum(chi_square_statistic(c, e)[0] for c, e in zip(counts_by_group, expected_by_group, strict=True))
    return stat, critical_value(expected_by_group, [sum(c.values()) for c in counts_by_group], alpha, sims, seed)


def critical_value(expected_by_group: list, sizes: list, alpha: float = 1e-3, sims: int = 2000,
                   seed: int = 0) -> float:
    """The 1 - ``alpha`` quantile of the summed X^2 of ``sims`` seeded multinomial samples of ``sizes``
    draws from ``expected_by_group``: the test's critical value under a correct verifier (a
    parametric bootstrap: no chi-square table, exact for these cells up to sampling)."""
    real("alpha", alpha, 0, 1, low_open=True, high_open=True)
    integer("sims", sims, 10)
    null = _simulated_statistics(expected_by_group, expected_by_group, sizes, sims, np.random.default_rng(seed))
    return float(np.quantile(null, 1 - alpha))


def detection_power(expected_by_group: list, biased_by_group: list, sizes: list, alpha: float = 1e-3,
                    sims: int = 2000, seed: int = 0) -> float:
    """Probability that the test rejects when the samples really come from the biased distributions:
    the share of ``sims`` multinomial samples of ``sizes`` draws from ``biased_by_group`` whose X^2
    against ``expected_by_group`` exceeds :func:`critical_value` (same seed, same ``alpha``)."""
    crit = critical_value(expected_by_group, sizes, alpha, sims, seed)
    stats = _simulated_statistics(expected_by_group, biased_by_group, sizes, sims, np.random.default_rng(seed + 1))
    return float(np.mean(stats > crit))


def binomial_upper_bound(events: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided exact (Clopper-Pearson) upper confidence bound on a rate from ``events`` seen in
    ``trials`` independent trials: the rate r at which P(X <= events | trials, r) = 1 - confidence,
    X ~ Binomial(trials, r) (bisection on the binomial CDF, summed in log space). With no events it
    is 1 - (1 - confidence)^(1/trials), about 3/trials at 95% (the rule of three): a zero count
    bounds a rate, it does not make it zero. 1.0 when every trial was an event."""
    n = integer("trials", trials, 1)
    f = integer("events", events, 0, n)
    c = real("confidence", confidence, 0, 1, low_open=True, high_open=True)
    if f == n:
        return 1.0
    if f == 0:
        return 1.0 - (1.0 - c) ** (1.0 / n)
    logc = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(f + 1)]

    def cdf(r: float) -> float:
        return sum(math.exp(lc + i * math.log(r) + (n - i) * math.log1p(-r)) for i, lc in enumerate(logc))

    lo, hi = f / n, 1.0  # cdf falls from above 1 - c at the observed rate to 0 at 1
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if cdf(mid) > 1.0 - c:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def kv_slots(seq_len, num_drafted, num_accepted) -> dict:
    """KV positions around one verification step, per row (0-based positions, half-open ranges).

    Before the step a sequence holds ``seq_len`` tokens and KV for the first seq_len - 1 (its last
    token has not been through the model). The pass feeds that token and the ``num_drafted`` drafts,
    writing positions [seq_len - 1, seq_len + num_drafted). After ``num_accepted`` drafts pass and one
    token is emitted, the sequence holds seq_len + num_accepted + 1 tokens, KV is valid on
    [0, seq_len + num_accepted), and the slots [seq_len + num_accepted, seq_len + num_drafted) hold
    rejected drafts: num_drafted - num_accepted slots to roll back. Returns arrays:
    ``written_from``, ``written_to``, ``valid_len``, ``invalid_from``, ``invalid_to``, ``rollback``,
    ``new_seq_len``.
    """
    n = integer_array("seq_len", seq_len, 1)
    d = integer_array("num_drafted", num_drafted, 0)
    a = integer_array("num_accepted", num_accepted, 0)
    if np.any(a > d):
        raise ValueError("num_accepted must not exceed num_drafted")
    return {"written_from": n - 1, "written_to": n + d, "valid_len": n + a, "invalid_from": n + a,
            "invalid_to": n + d, "rollback": d - a, "new_seq_len": n + a + 1}
