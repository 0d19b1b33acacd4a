"""The prefill "server" of a queueing model: its service time per prompt, from the book's step
model, and the moments of that service time over a prompt-length distribution.

A replica's time to first token is a wait in a queue plus the request's own prefill. Treating the
prefill as one FCFS server (prefill is compute-bound, so packing prompts into one step barely
changes the work) gives the M/G/1 queue of :mod:`lib.scheduling.queueing`, whose service time S is

    S(P) = sum_j step_s(0, 0, [(x_j, p_j)])

over the chunks x_j <= B (token budget) of a P-token prompt at positions p_j, on an idle engine
(:func:`prompt_service_s`). Its mean and squared coefficient of variation C^2 = Var[S] / E[S]^2
over the prompt distribution (:func:`service_moments`) set the utilization a latency target
allows. Long prompts cost more than in proportion (attention is quadratic in the prompt), so the
C^2 of S exceeds the C^2 of the prompt length.
SI units: seconds; lengths in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer

__all__ = ["ServiceMoments", "ServiceTable", "prompt_service_s", "sample_services", "service_moments", "service_table"]


def prompt_service_s(cost, prompt_lens):
    """Prefill time (s) of each prompt on an otherwise idle engine: its chunks of at most the
    token budget, one step each, priced by ``cost`` (sum_j step_s(0, 0, [(x_j, p_j)])). Takes an
    int or an array of ints; each distinct length is priced once."""
    import numpy as np

    from lib.scheduling.resident import _cost_attr, _prefill

    budget = _cost_attr(cost, "token_budget")
    lens = np.asarray(prompt_lens)
    if lens.size == 0 or not np.issubdtype(lens.dtype, np.integer) or lens.min() < 1:
        raise ValueError(f"prompt_lens must be integers >= 1 (tokens), got {prompt_lens!r}")
    uniq, inverse = np.unique(lens, return_inverse=True)
    priced = np.array([_prefill(cost, 0, 0.0, int(p), budget)[0] for p in uniq])
    out = priced[inverse].reshape(lens.shape)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class ServiceMoments:
    """Mean (s), second moment (s^2) and C^2 = E[S^2] / E[S]^2 - 1 of the prefill service time."""

    mean_s: float
    second_moment_s2: float

    @property
    def scv(self) -> float:
        """Squared coefficient of variation C^2 = Var[S] / E[S]^2."""
        return max(0.0, self.second_moment_s2 / self.mean_s**2 - 1)


@dataclass(frozen=True)
class ServiceTable:
    """:func:`prompt_service_s` on quadrature nodes of a prompt distribution (see
    :func:`service_table`): ``lens`` (tokens, one per node), ``services_s`` and ``weights``."""

    lens: object
    services_s: object
    weights: object

    def moments(self) -> ServiceMoments:
        """E[S] and E[S^2] by the quadrature."""
        w, s = self.weights, self.services_s
        return ServiceMoments(float((w * s).sum()), float((w * s * s).sum()))

    def price(self, prompt_lens):
        """S of each prompt length, interpolated linearly between the nodes (nodes are under 0.5%
        apart in length: within 1e-3 relative, the largest error where a prompt needs one more
        chunk and S jumps by a step's fixed cost; exact at the nodes)."""
        import numpy as np

        lens = np.asarray(prompt_lens, dtype=float)
        xp, idx = np.unique(self.lens, return_index=True)
        if len(xp) == 1:
            return np.full(lens.shape, float(self.services_s[0]))
        return np.interp(lens, xp, np.asarray(self.services_s)[idx])


def service_table(cost, prompt, *, points: int = 4001) -> ServiceTable:
    """:func:`prompt_service_s` on the quadrature nodes of a prompt-length distribution.

    ``prompt``: an int (constant), a :class:`~lib.scheduling.workloads.Constant`, or a
    :class:`~lib.scheduling.workloads.LogNormal` (P = round(median e^(sigma z)), z standard
    normal, clipped to [1, cap]): E[f(P)] = integral f(P(z)) phi(z) dz on ``points`` nodes
    evenly spaced over z in [-9, 9] (trapezoid rule; the tail past 9 sigma weighs below 1e-18).
    """
    import numpy as np

    from lib.scheduling.workloads import Constant, LogNormal

    integer("points", points, 101)
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        prompt = Constant(prompt)
    if isinstance(prompt, Constant):
        return ServiceTable(np.array([prompt.value]), np.array([prompt_service_s(cost, prompt.value)]),
                            np.array([1.0]))
    if not isinstance(prompt, LogNormal):
        raise ValueError(f"prompt must be an int, Constant or LogNormal, got {prompt!r}")
    z = np.linspace(-9.0, 9.0, points)
    lens = np.rint(prompt.median * np.exp(prompt.sigma * z))
    lens = np.clip(lens, 1, prompt.cap or np.iinfo(np.int64).max).astype(np.int64)
    w = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) * (z[1] - z[0])
    w[0] *= 0.5
    w[-1] *= 0.5
    return ServiceTable(lens, prompt_service_s(cost, lens), w)


def service_moments(cost, prompt, *, points: int = 4001) -> ServiceMoments:
    """E[S] and E[S^2] of :func:`prompt_service_s` over a prompt-length distribution, by the
    quadrature of :func:`service_table`. Deterministic, unlike a sample's moments: a lognormal's
    second moment sits in its far tail (at sigma = 1, 7% of E[P^2] lies beyond z = 3.5), where a
    sample of 10^5 is still thin."""
    return service_table(cost, prompt, points=points).moments()


def sample_services(cost, prompt, n: int, seed: int = 0, *, points: int = 4001):
    """``n`` prompt lengths drawn from ``prompt`` with ``seed`` and their prefill times (s), priced
    through :func:`service_table` on ``points`` nodes (exact at its nodes, interpolated between
    them): (lens, services)."""
    import numpy as np

    from lib.scheduling.workloads import as_length

    integer("n", n, 1)
    integer("seed", seed, 0)
    dist = as_length("prompt", prompt)
    lens = dist.sample(np.random.default_rng(seed), n)
    return lens, service_table(cost, dist, points=points).price(lens)
