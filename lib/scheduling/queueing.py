"""Queueing closed forms the simulator is checked against and the notebooks reason with.

One server, Poisson arrivals at rate lambda (requests/s), service times S with mean E[S]
(s), utilization rho = lambda E[S] < 1. "Wait" is the time in the queue before service starts
(Wq); "sojourn" adds the service (W = Wq + E[S]).

* M/M/1 (exponential service, rate mu = 1 / E[S]): Wq = rho / (mu - lambda), W = 1 / (mu - lambda),
  L = rho / (1 - rho); the wait's tail P(Wq > t) = rho e^(-(mu - lambda) t), so its q-quantile is
  ln(rho / (1 - q)) / (mu - lambda) when rho > 1 - q (else 0): p99 = ln(100 rho) / (mu - lambda).
  Kleinrock, *Queueing Systems, Vol. 1: Theory* (Wiley, 1975), ch. 3; Harchol-Balter,
  *Performance Modeling and Design of Computer Systems* (CUP, 2013), ch. 13-14.
* M/G/1, Pollaczek-Khinchine: Wq = lambda E[S^2] / (2 (1 - rho)) = rho (1 + C^2) E[S] / (2 (1 - rho)),
  C^2 = Var[S] / E[S]^2 the squared coefficient of variation (0: constant service, M/D/1;
  1: exponential). Kleinrock 1975, ch. 5; Harchol-Balter 2013, ch. 23.
* Little's law L = lambda W for any stable system in steady state (Little, "A Proof for the
  Queuing Formula L = lambda W", Operations Research 9(3), 1961).

SI units: seconds, requests per second.
"""

from __future__ import annotations

import math

from lib.inputs import real

__all__ = [
    "littles_law",
    "mg1_mean_wait_s",
    "mg1_utilization_for_mean_wait",
    "mm1_mean_in_system",
    "mm1_mean_sojourn_s",
    "mm1_mean_wait_s",
    "mm1_utilization_for_wait_quantile",
    "mm1_wait_quantile_s",
]


def _rates(arrival_rate: float, service_rate: float) -> tuple[float, float]:
    lam = real("arrival_rate", arrival_rate, 0, unit="requests/s")
    mu = real("service_rate", service_rate, 0, low_open=True, unit="requests/s")
    if lam >= mu:
        raise ValueError(f"arrival_rate ({lam:g}/s) must be below service_rate ({mu:g}/s): "
                         "at utilization >= 1 the queue grows without bound")
    return lam, mu


def mm1_mean_wait_s(arrival_rate: float, service_rate: float) -> float:
    """M/M/1 mean time in queue, seconds: Wq = rho / (mu - lambda), rho = lambda / mu."""
    lam, mu = _rates(arrival_rate, service_rate)
    return (lam / mu) / (mu - lam)


def mm1_mean_sojourn_s(arrival_rate: float, service_rate: float) -> float:
    """M/M/1 mean time in system, seconds: W = 1 / (mu - lambda)."""
    lam, mu = _rates(arrival_rate, service_rate)
    return 1.0 / (mu - lam)


def mm1_mean_in_system(arrival_rate: float, service_rate: float) -> float:
    """M/M/1 mean number in system (queue + service): L = rho / (1 - rho)."""
    lam, mu = _rates(arrival_rate, service_rate)
    rho = lam / mu
    return rho / (1 - rho)


def mm1_wait_quantile_s(arrival_rate: float, service_rate: float, q: float = 0.99) -> float:
    """M/M/1 q-quantile of the time in queue, seconds.

    P(Wq > t) = rho e^(-(mu - lambda) t), so t_q = ln(rho / (1 - q)) / (mu - lambda) for
    rho > 1 - q, and 0 otherwise (more than a fraction q of requests never wait).
    q = 0.99: ln(100 rho) / (mu - lambda).
    """
    lam, mu = _rates(arrival_rate, service_rate)
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    rho = lam / mu
    if rho <= 1 - q:
        return 0.0
    return math.log(rho / (1 - q)) / (mu - lam)


def mm1_utilization_for_wait_quantile(service_s: float, target_s: float, q: float = 0.99) -> float:
    """Highest M/M/1 utilization whose q-quantile wait is at most ``target_s``.

    Solves ln(rho / (1 - q)) / (mu (1 - rho)) = target for rho in (1 - q, 1) (mu = 1 /
    service_s), by bisection (the left side grows with rho). It depends on the target only
    through target / service_s: the "run at 70%" rule of thumb is one value of that ratio.
    """
    s = real("service_s", service_s, 0, low_open=True, unit="seconds")
    t = real("target_s", target_s, 0, low_open=True, unit="seconds")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    mu = 1.0 / s

    def quantile(rho: float) -> float:
        return math.log(rho / (1 - q)) / (mu * (1 - rho))

    lo, hi = 1 - q, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if quantile(mid) <= t else (lo, mid)
        if hi - lo < 1e-13:
            break
    return lo


def mg1_mean_wait_s(arrival_rate: float, mean_service_s: float, second_moment_s2: float | None = None,
                    *, scv: float | None = None) -> float:
    """M/G/1 mean time in queue (Pollaczek-Khinchine), seconds.

    Wq = lambda E[S^2] / (2 (1 - rho)), rho = lambda E[S]; give E[S^2] (s^2) or the squared
    coefficient of variation ``scv`` = C^2 (then E[S^2] = (1 + C^2) E[S]^2).
    """
    lam = real("arrival_rate", arrival_rate, 0, unit="requests/s")
    es = real("mean_service_s", mean_service_s, 0, low_open=True, unit="seconds")
    if (second_moment_s2 is None) == (scv is None):
        raise ValueError("give exactly one of second_moment_s2 and scv")
    if scv is not None:
        es2 = (1 + real("scv", scv, 0)) * es * es
    else:
        es2 = real("second_moment_s2", second_moment_s2, 0, unit="s^2")
        if es2 < es * es * (1 - 1e-12):
            raise ValueError(f"second_moment_s2 ({es2:g}) cannot be below mean_service_s^2 ({es * es:g})")
    rho = lam * es
    if rho >= 1:
        raise ValueError(f"utilization lambda E[S] = {rho:.3g} must be below 1")
    return lam * es2 / (2 * (1 - rho))


def mg1_utilization_for_mean_wait(mean_service_s: float, scv: float, target_s: float) -> float:
    """Highest M/G/1 utilization whose mean wait is at most ``target_s``.

    From Pollaczek-Khinchine, rho (1 + C^2) E[S] / (2 (1 - rho)) = t gives
    rho = 2 t / (2 t + (1 + C^2) E[S]): more variance in service (C^2 up) lowers it.
    """
    es = real("mean_service_s", mean_service_s, 0, low_open=True, unit="seconds")
    c2 = real("scv", scv, 0)
    t = real("target_s", target_s, 0, low_open=True, unit="seconds")
    return 2 * t / (2 * t + (1 + c2) * es)


def littles_law(*, L: float | None = None, arrival_rate: float | None = None,
                W: float | None = None) -> float:
    """Little's law L = lambda W: give two of L (mean number in system), ``arrival_rate``
    (lambda, per second) and W (mean time in system, seconds); returns the third."""
    given = {k: v for k, v in (("L", L), ("arrival_rate", arrival_rate), ("W", W)) if v is not None}
    if len(given) != 2:
        raise ValueError(f"give exactly two of L, arrival_rate and W; got {sorted(given) or 'none'}")
    for k, v in given.items():
        real(k, v, 0)
    if L is None:
        return arrival_rate * W
    if W is None:
        if arrival_rate == 0:
            raise ValueError("arrival_rate must be > 0 to solve for W")
        return L / arrival_rate
    if W == 0:
        raise ValueError("W must be > 0 to solve for arrival_rate")
    return L / W

