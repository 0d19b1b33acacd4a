"""Mixture-of-experts routing arithmetic: how many experts a decode batch pulls through HBM."""

from __future__ import annotations

import numpy as np


def _check(num_experts: int, experts_per_token: int, batch: int) -> None:
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if not 1 <= experts_per_token <= num_experts:
        raise ValueError(f"experts_per_token must be in [1, num_experts={num_experts}], got {experts_per_token}")
    if batch < 0:
        raise ValueError(f"batch must be >= 0 tokens, got {batch}")


def expected_experts_touched(num_experts: int, experts_per_token: int, batch: int) -> float:
    """Expected distinct experts one layer reads for ``batch`` tokens under uniform top-k routing.

    E[distinct] = E * (1 - (1 - k/E)^B): an expert is missed by one token with probability
    1 - k/E (each token picks k distinct experts uniformly), and by all B tokens independently.
    """
    _check(num_experts, experts_per_token, batch)
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** batch)


def simulate_experts_touched(num_experts: int, experts_per_token: int, batch: int,
                             trials: int = 2000, seed: int = 0) -> np.ndarray:
    """Monte Carlo: distinct experts hit by ``batch`` tokens each choosing k distinct experts.

    Returns one count per trial (uniform routing, the closed form's assumption).
    """
    _check(num_experts, experts_per_token, batch)
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    rng = np.random.default_rng(seed)
    if batch == 0:
        return np.zeros(trials)
    # k distinct experts per token: the first k of a random permutation (argsort of uniforms)
    picks = np.argsort(rng.random((trials, batch, num_experts)), axis=2)[:, :, :experts_per_token]
    hit = np.zeros((trials, num_experts), dtype=bool)
    rows = np.repeat(np.arange(trials), batch * experts_per_token)
    hit[rows, picks.reshape(-1)] = True
    return hit.sum(axis=1).astype(float)
