"""GRPO's loss: group-relative advantages, the clipped importance ratio, the KL to a reference, and
how the per-token terms are averaged. A torch reference (:class:`GRPO`) and an independent numpy
oracle (:func:`loss_and_grad`) that returns the loss and its gradient in closed form.

Conventions (one batch of ``P`` prompts x ``G`` sampled answers, ``B = P * G`` rows, the answers
of one prompt on consecutive rows; ``T`` padded token positions):

* advantage of answer i of a group, A_i = (r_i - mean(r)) / (std(r) + eps), std the sample
  standard deviation (N - 1, as TRL computes it); a group whose rewards are all equal has std 0
  and advantage exactly 0 (eps keeps 0 / 0 away), and so adds no policy gradient.
* ratio per token rho = exp(logp_new - logp_old), logp_old the log-probability under the policy
  that sampled the answer, a constant (detached: on the first inner step it is the same forward's
  output, equal to logp_new, and its gradient must not cancel logp_new's).
* clipped surrogate per token: -min(rho A, clip(rho, 1 - e, 1 + e) A) (PPO), plus
  beta * k3, k3 = exp(ref - new) - (ref - new) - 1 >= 0 (Schulman's unbiased, non-negative
  estimator of KL(new || ref) from samples of the new policy).
* aggregation over the valid tokens (mask): ``"sequence"`` (GRPO paper: mean over each answer's
  tokens, then over answers; a token of a long answer weighs less), ``"token"`` (DAPO: sum over
  every valid token of the batch / their number), ``"constant"`` (Dr. GRPO: sum / (B x T), a
  normalizer that depends on neither the answer's nor the batch's lengths).

Dimensionless; the loss is per token, its gradient with respect to each token's log-probability.
"""

from __future__ import annotations

import numpy as np

from lib.inputs import integer, real

__all__ = ["AGGREGATIONS", "GRPO", "advantages_numpy", "length_spread_group", "loss_and_grad", "token_push",
           "token_weights"]

AGGREGATIONS = ("sequence", "token", "constant")
STD_EPS = 1e-4  # TRL's epsilon in the advantage's denominator


def _check_config(group_size, clip_eps, kl_coef, aggregation, eps) -> tuple:
    g = integer("group_size", group_size, 2, unit="answers per prompt (the sample std needs two)")
    c = real("clip_eps", clip_eps, 0, 1, low_open=True, high_open=True)
    k = real("kl_coef", kl_coef, 0)
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    e = real("eps", eps, 0, low_open=True)
    return g, c, k, aggregation, e


class GRPO:
    """The reference GRPO loss in torch (module doc for the formulas).

    ``GRPO(group_size, clip_eps=0.2, kl_coef=0.0, aggregation="sequence", eps=1e-4)``;
    ``advantages(rewards)`` -> (B,); ``loss(logp_new, logp_old, logp_ref, rewards, mask)`` -> a
    scalar tensor whose gradient flows into ``logp_new`` only.
    """

    def __init__(self, group_size: int, clip_eps: float = 0.2, kl_coef: float = 0.0,
                 aggregation: str = "sequence", eps: float = STD_EPS):
        (self.group_size, self.clip_eps, self.kl_coef, self.aggregation,
         self.eps) = _check_config(group_size, clip_eps, kl_coef, aggregation, eps)

    def advantages(self, rewards):
        """(B,) rewards, groups of ``group_size`` consecutive rows -> (B,) advantages, each group
        centred on its own mean and scaled by its own sample std (+ eps)."""
        import torch

        r = torch.as_tensor(rewards, dtype=torch.float64)
        if r.ndim != 1 or r.numel() % self.group_size:
            raise ValueError(f"rewards must be a 1-D tensor of groups of {self.group_size}, got shape {tuple(r.shape)}")
        groups = r.view(-1, self.group_size)
        mean = groups.mean(dim=1, keepdim=True)
        std = groups.std(dim=1, keepdim=True)  # sample std (N - 1); 0 when every answer scored the same
        return ((groups - mean) / (std + self.eps)).view(-1)

    def loss(self, logp_new, logp_old, logp_ref, rewards, mask):
        """The GRPO loss of one batch: logp_* (B, T) log-probabilities of the sampled tokens under the
        current policy, the sampling policy and the frozen reference; mask (B, T), 1 on real tokens."""
        import torch

        adv = self.advantages(rewards).to(logp_new.dtype)[:, None]  # (B, 1): one advantage per answer
        m = torch.as_tensor(mask, dtype=logp_new.dtype)
        ratio = torch.exp(logp_new - logp_old.detach())
        unclipped = ratio * adv
        clipped = torch.clamp(ratio, 1.0 - self.clip_eps, 1.0 + self.clip_eps) * adv
        per_token = -torch.min(unclipped, clipped)  # pessimistic: the smaller objective
        if self.kl_coef:
            d = logp_ref.detach() - logp_new
            per_token = per_token + self.kl_coef * (torch.exp(d) - d - 1.0)
        per_token = per_token * m  # padded positions contribute nothing, whatever they hold
        if self.aggregation == "sequence":
            return (per_token.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)).mean()
        if self.aggregation == "token":
            return per_token.sum() / m.sum().clamp(min=1.0)
        return per_token.sum() / (m.shape[0] * m.shape[1])


# ---- the numpy oracle: the same formulas written independently, with the gradient in closed form ----


def advantages_numpy(rewards, group_size: int, eps: float = STD_EPS) -> np.ndarray:
    """Group-relative advantages in numpy, one group at a time (same formula as :meth:`GRPO.advantages`)."""
    g = integer("group_size", group_size, 2)
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or len(r) % g:
        raise ValueError(f"rewards must be 1-D with a multiple of {g} entries, got shape {r.shape}")
    out = np.empty_like(r)
    for start in range(0, len(r), g):
        grp = r[start:start + g]
        mu = sum(grp) / g
        sd = (sum((x - mu) ** 2 for x in grp) / (g - 1)) ** 0.5
        out[start:start + g] = [(x - mu) / (sd + eps) for x in grp]
    return out


def token_weights(mask, aggregation: str) -> np.ndarray:
    """(B, T) weight of each token's term in the loss: 1 / (B |o_i|) for ``"sequence"``,
    1 / sum |o_i| for ``"token"``, 1 / (B T) for ``"constant"``; 0 on padding."""
    m = np.asarray(mask, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"mask must be (batch, tokens), got shape {m.shape}")
    B, T = m.shape
    if aggregation == "sequence":
        return m / (B * np.maximum(m.sum(axis=1, keepdims=True), 1.0))
    if aggregation == "token":
        return m / max(m.sum(), 1.0)
    if aggregation == "constant":
        return m / (B * T)
    raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")


def loss_and_grad(logp_new, logp_old, logp_ref, rewards, mask, group_size: int, clip_eps: float = 0.2,
                  kl_coef: float = 0.0, aggregation: str = "sequence", eps: float = STD_EPS) -> tuple[float, np.ndarray]:
    """The GRPO loss and its gradient d loss / d logp_new (B, T), in numpy, token by token.

    Per token, with rho = exp(new - old), A the answer's advantage, w its weight (:func:`token_weights`):
    the surrogate term is -rho A where the unclipped branch is the minimum (its gradient -rho A) and
    the constant -clip(rho) A where the clipped one is strictly smaller (gradient 0); the KL term
    beta (exp(ref - new) - (ref - new) - 1) has gradient beta (1 - exp(ref - new)).
    """
    g, c, k, agg, e = _check_config(group_size, clip_eps, kl_coef, aggregation, eps)
    new, old, ref = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_old, logp_ref))
    adv = advantages_numpy(rewards, g, e)
    w = token_weights(mask, agg)
    B, T = new.shape
    if adv.shape != (B,):
        raise ValueError(f"rewards must have one entry per row ({B}), got {adv.shape}")
    loss, grad = 0.0, np.zeros((B, T))
    for i in range(B):
        for t in range(T):
            if w[i, t] == 0.0:
                continue
            rho = np.exp(new[i, t] - old[i, t])
            a = adv[i]
            un, cl = rho * a, min(max(rho, 1.0 - c), 1.0 + c) * a
            if un <= cl:  # the unclipped branch is the minimum (ties: clip inactive, gradient flows)
                term, d = -un, -un
            else:
                term, d = -cl, 0.0
            if k:
                diff = ref[i, t] - new[i, t]
                term += k * (np.exp(diff) - diff - 1.0)
                d += k * (1.0 - np.exp(diff))
            loss += w[i, t] * term
            grad[i, t] = w[i, t] * d
    return float(loss), grad


def token_push(rewards, lengths, group_size: int, aggregation: str, padded_length: int | None = None,
               eps: float = STD_EPS) -> tuple[np.ndarray, np.ndarray]:
    """On the first (on-policy) inner step, how hard one gradient-descent step pushes each answer's
    tokens: per token A_i w_i (minus the gradient of the loss with respect to a token's log-prob),
    and per answer |o_i| A_i w_i. Returns (per-token push (B,), per-answer push (B,)).

    ``lengths`` are the answers' token counts; ``padded_length`` (the "constant" normaliser's T)
    defaults to the longest answer. Under ``"sequence"`` a token weighs 1 / (B |o_i|): a long
    wrong answer is penalised less per token than a short one, a short right answer rewarded more.
    """
    n = np.asarray(lengths)
    if n.ndim != 1 or len(n) != len(np.asarray(rewards)) or (n < 1).any():
        raise ValueError(f"lengths must be one positive token count per answer, got {lengths!r}")
    T = int(n.max()) if padded_length is None else integer("padded_length", padded_length, int(n.max()))
    mask = (np.arange(T)[None, :] < n[:, None]).astype(np.float64)
    per_token = advantages_numpy(rewards, group_size, eps) * token_weights(mask, aggregation)[:, 0]
    return per_token, per_token * n


def length_spread_group(group_size: int, correct: int, shortest: int, longest: int) -> tuple[np.ndarray, np.ndarray]:
    """One prompt's group for the length-bias demonstrations: ``correct`` answers with reward 1 and the
    rest 0, each class with lengths spread geometrically from ``shortest`` to ``longest`` tokens (a class
    of one answer gets ``shortest``). Returns (rewards, lengths), right answers first."""
    g = integer("group_size", group_size, 2)
    c = integer("correct", correct, 0, g, unit="answers (at most the group size)")
    lo = integer("shortest", shortest, 1, unit="tokens")
    hi = integer("longest", longest, lo, unit="tokens (at least shortest)")

    def spread(k):
        return np.round(np.geomspace(lo, hi, k)).astype(int) if k > 1 else np.full(k, lo)

    return np.r_[np.ones(c), np.zeros(g - c)], np.r_[spread(c), spread(g - c)]
