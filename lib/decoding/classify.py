"""An LLM as a classifier: a label's probability from the next-token logits, and its calibration (W08).

Read the next-token distribution after the prompt instead of parsing generated text. Each label
owns several token ids (spellings: "Yes", " Yes", " yes", "YES"; a leading space is a different
token), so a label's log-probability is the log-sum-exp of its tokens' log-softmax values
(:func:`label_log_probs`). Restricted to two labels, P(yes | yes or no) = sigmoid(lse_yes - lse_no)
(:func:`binary_label_score` returns that difference, the *score*; :func:`label_mass` says how much
of the next-token mass the labels hold at all, a format check). Raw scores are often over- or
under-confident and biased toward one label; calibrate them on labelled data with temperature
scaling, p = sigmoid(s / T), or Platt scaling, p = sigmoid(a s + b) (:func:`fit_platt`, Newton's
method on the log-loss), and measure calibration with the expected calibration error
(:func:`expected_calibration_error`, :func:`reliability_table`).

:func:`synthetic_yes_no` makes a seeded labelled set whose truth is known: P(yes | x) = sigmoid(x)
and a model whose score is ``slope x + bias``, its yes and no mass split over spellings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = [
    "LabelSet",
    "Platt",
    "binary_label_score",
    "expected_calibration_error",
    "fit_platt",
    "label_log_probs",
    "label_mass",
    "log_loss",
    "logsumexp",
    "reliability_table",
    "sigmoid",
    "synthetic_yes_no",
]


def logsumexp(x, axis: int = -1) -> np.ndarray:
    """log(sum(exp(x))) over ``axis``, with the max subtracted first (no overflow); -inf for all -inf."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def sigmoid(x) -> np.ndarray:
    """1 / (1 + e^-x), computed without overflow for large |x|."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _logits(logits) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim not in (1, 2) or z.shape[-1] == 0:
        raise ValueError(f"logits must be (V,) or (N, V), got shape {z.shape}")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("logits must be finite or -inf (masked)")
    return z


def _ids(name: str, ids: Sequence[int], vocab: int) -> np.ndarray:
    a = np.asarray(list(ids))
    if a.size == 0 or not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"{name} must be a non-empty list of token ids in [0, {vocab}), got {list(ids)!r}")
    if len(set(a.tolist())) != a.size:
        raise ValueError(f"{name} lists a token id twice: {list(ids)!r}")
    return a


def label_log_probs(logits, labels: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """{label: log P(label)} with log P(label) = logsumexp over its token ids of log_softmax(logits).

    ``logits``: (V,) or (N, V) next-token logits; ``labels``: label -> its token ids (every spelling).
    A token id may belong to one label only (two labels sharing a token would count its mass twice).
    """
    z = _logits(logits)
    if not labels:
        raise ValueError("labels must map at least one label to its token ids")
    seen: dict[int, str] = {}
    for name, ids in labels.items():
        for i in _ids(f"labels[{name!r}]", ids, z.shape[-1]).tolist():
            if i in seen:
                raise ValueError(f"token id {i} belongs to both {seen[i]!r} and {name!r}")
            seen[i] = name
    lsm = z - logsumexp(z)[..., None]
    return {name: logsumexp(lsm[..., list(ids)]) for name, ids in labels.items()}


def binary_label_score(logits, yes_ids: Sequence[int], no_ids: Sequence[int]) -> np.ndarray:
    """s = log P(yes) - log P(no) (group log-sum-exp); P(yes | yes or no) = sigmoid(s)."""
    lp = label_log_probs(logits, {"yes": yes_ids, "no": no_ids})
    return lp["yes"] - lp["no"]


def label_mass(logits, yes_ids: Sequence[int], no_ids: Sequence[int]) -> np.ndarray:
    """P(yes) + P(no): the share of the next-token mass the labels hold (low: the prompt's format failed)."""
    lp = label_log_probs(logits, {"yes": yes_ids, "no": no_ids})
    return np.exp(lp["yes"]) + np.exp(lp["no"])


# ---- calibration -----------------------------------------------------------------------------------------


def _scores_labels(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    if s.size == 0 or s.shape != y.shape or not np.isfinite(s).all():
        raise ValueError("scores and labels must be equal-length, non-empty, finite")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    return s, y.astype(np.float64)


def log_loss(probs, labels) -> float:
    """Mean negative log-likelihood, -mean(y ln p + (1 - y) ln(1 - p)), nats; p clipped to [1e-15, 1 - 1e-15]."""
    p, y = _scores_labels(probs, labels)
    if ((p < 0) | (p > 1)).any():
        raise ValueError("probs must lie in [0, 1]")
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


@dataclass(frozen=True)
class Platt:
    """p = sigmoid(a s + b). Temperature scaling is the case b = 0, T = 1 / a."""

    a: float
    b: float
    iterations: int

    @property
    def temperature(self) -> float:
        return math.inf if self.a == 0 else 1 / self.a

    def __call__(self, scores) -> np.ndarray:
        return sigmoid(self.a * np.asarray(scores, dtype=np.float64) + self.b)


def fit_platt(scores, labels, *, bias: bool = True, l2: float = 1e-6, max_iter: int = 100) -> Platt:
    """Fit p = sigmoid(a s + b) by Newton's method on the mean log-loss (plus ``l2`` (a^2 + b^2) / 2,
    which keeps separable data finite). ``bias=False`` fits temperature scaling (b = 0)."""
    s, y = _scores_labels(scores, labels)
    real("l2", l2, 0.0)
    integer("max_iter", max_iter, 1)
    x = np.column_stack([s, np.ones_like(s)]) if bias else s[:, None]

    def loss(w):
        u = x @ w  # -log sigmoid(u) = logaddexp(0, -u): stable for any u
        return float(np.mean(y * np.logaddexp(0, -u) + (1 - y) * np.logaddexp(0, u)) + l2 * (w @ w) / 2)

    w = np.zeros(x.shape[1])
    w[0] = 1.0
    current, iterations = loss(w), 0
    while iterations < max_iter:
        iterations += 1
        p = sigmoid(x @ w)
        grad = x.T @ (p - y) / s.size + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x / s.size + l2 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        for _ in range(60):  # damped Newton: halve the step until the loss does not rise
            trial = loss(w - step)
            if trial <= current:
                break
            step = step / 2
        w, current = w - step, min(trial, current)
        if np.abs(step).max() < 1e-12:
            break
    return Platt(float(w[0]), float(w[1]) if bias else 0.0, iterations)


def reliability_table(probs, labels, bins: int = 10) -> list[tuple[float, float, int, float, float]]:
    """Equal-width bins of [0, 1] (the last closed): (low, high, count, mean predicted, observed rate);
    empty bins are left out."""
    p, y = _scores_labels(probs, labels)
    bins = integer("bins", bins, 1, 1000)
    if ((p < 0) | (p > 1)).any():
        raise ValueError("probs must lie in [0, 1]")
    idx = np.minimum((p * bins).astype(int), bins - 1)
    rows = []
    for b in range(bins):
        sel = idx == b
        if sel.any():
            rows.append((b / bins, (b + 1) / bins, int(sel.sum()), float(p[sel].mean()), float(y[sel].mean())))
    return rows


def expected_calibration_error(probs, labels, bins: int = 10) -> float:
    """ECE = sum over bins of (n_b / n) |mean predicted_b - observed rate_b| (equal-width bins)."""
    rows = reliability_table(probs, labels, bins)
    n = sum(r[2] for r in rows)
    return float(sum(r[2] / n * abs(r[3] - r[4]) for r in rows))


# ---- a labelled set whose truth is known ---------------------------------------------------------------------


@dataclass(frozen=True)
class LabelSet:
    """A synthetic yes/no set: next-token ``logits`` (N, V) over ``vocab`` (token strings), the label
    groups' token ids, the true labels, the true P(yes | item) and the evidence x behind it."""

    logits: np.ndarray
    vocab: tuple[str, ...]
    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]
    labels: np.ndarray
    true_prob: np.ndarray
    evidence: np.ndarray

    def ids(self, *tokens: str) -> list[int]:
        """The token ids of the given strings."""
        missing = [t for t in tokens if t not in self.vocab]
        if missing:
            raise ValueError(f"tokens {missing!r} are not in the vocabulary {self.vocab[:10]!r}")
        return [self.vocab.index(t) for t in tokens]


YES_SPELLINGS = (" Yes", "Yes", " yes", " YES")
NO_SPELLINGS = (" No", "No", " no", " NO")


def synthetic_yes_no(n: int, seed: int = 0, *, slope: float = 2.0, bias: float = 0.8, label_mass: float = 0.9,
                     evidence_std: float = 1.5, fillers: int = 60) -> LabelSet:
    """``n`` items: evidence x ~ N(0, evidence_std^2), truth P(yes | x) = sigmoid(x), label y ~ Bernoulli.
    The model's score is s = slope x + bias (slope > 1: over-confident; bias > 0: leans yes); its
    next-token distribution puts about ``label_mass`` on the labels, sigmoid(s) of it on yes and the
    rest on no, each split over the spellings by a per-item Dirichlet (the leading-space form gets the
    most), and the remainder over ``fillers`` other tokens. Each row is shifted by a random constant
    (logits are defined up to one). Group log-sum-exp recovers s exactly."""
    n = integer("n", n, 2)
    rng = np.random.default_rng(integer("seed", seed, 0))
    real("slope", slope, 0.0, low_open=True)
    real("bias", bias)
    mass = fraction("label_mass", label_mass, allow_zero=False)
    fillers = integer("fillers", fillers, 1)
    x = rng.normal(0.0, real("evidence_std", evidence_std, 0.0, low_open=True), n)
    truth = sigmoid(x)
    y = (rng.random(n) < truth).astype(np.int64)
    score = slope * x + bias
    on_labels = np.clip(mass + rng.normal(0, 0.05, n), 0.05, 0.999) if mass < 1 else np.ones(n)
    def dirichlet(alpha):  # normalised gammas: a Dirichlet draw per row, vectorised
        g = rng.gamma(np.asarray(alpha), size=(n, len(alpha)))
        return g / g.sum(axis=1, keepdims=True)

    w_yes = dirichlet([6.0, 1.5, 1.0, 0.3])  # " Yes" gets the most: after "Answer:" the space belongs to the token
    w_no = dirichlet([6.0, 1.5, 1.0, 0.3])
    w_other = dirichlet(np.full(fillers, 0.5))
    p_yes = sigmoid(score)
    probs = np.concatenate([(on_labels * p_yes)[:, None] * w_yes, (on_labels * (1 - p_yes))[:, None] * w_no,
                            (1 - on_labels)[:, None] * w_other], axis=1)
    with np.errstate(divide="ignore"):
        logits = np.log(probs) + rng.normal(0, 3.0, n)[:, None]
    vocab = YES_SPELLINGS + NO_SPELLINGS + tuple(f"<tok{i}>" for i in range(fillers))
    return LabelSet(logits, vocab, tuple(range(4)), tuple(range(4, 8)), y, truth, x)
