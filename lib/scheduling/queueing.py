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
* Tails: the M/M/1 sojourn (wait + service) is exponential, P(W > t) = e^(-(mu - lambda) t), so
  its q-quantile is ln(1 / (1 - q)) E[S] / (1 - rho). For M/G/1 the same form with E[S] scaled
  by (1 + C^2) / 2 (the Pollaczek-Khinchine factor, exact for the mean wait; the heavy-traffic
  exponential approximation for the whole distribution, Kingman 1961, "The single server queue
  in heavy traffic", Proc. Cambridge Phil. Soc. 57) is exact at C^2 = 1 and close for light
  tails; heavy-tailed service (lognormal prompts) has a fatter tail than it, which
  :func:`lindley_waits` (the exact FCFS recursion, Lindley 1952) measures on a sample path.

SI units: seconds, requests per second.
"""

from __future__ import annotations

import math

from lib.inputs import real

__all__ = [
    "lindley_waits",
    "sample_path_utilization",
    "littles_law",
    "mg1_mean_wait_s",
    "mg1_utilization_for_mean_wait",
    "mm1_mean_in_system",
    "mm1_mean_sojourn_s",
    "mm1_mean_wait_s",
    "mm1_sojourn_quantile_s",
    "mm1_utilization_for_wait_quantile",
    "mm1_wait_quantile_s",
    "sojourn_quantile_approx_s",
    "utilization_for_sojourn_quantile",
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



def mm1_sojourn_quantile_s(arrival_rate: float, service_rate: float, q: float = 0.99) -> float:
    """M/M/1 q-quantile of the time in system (wait + service), seconds.

    The sojourn is exponential with rate mu - lambda: t_q = ln(1 / (1 - q)) / (mu - lambda);
    q = 0.99: ln(100) E[S] / (1 - rho).
    """
    lam, mu = _rates(arrival_rate, service_rate)
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    return math.log(1 / (1 - q)) / (mu - lam)


def sojourn_quantile_approx_s(arrival_rate: float, mean_service_s: float, scv: float = 1.0,
                              q: float = 0.99) -> float:
    """q-quantile of the time in system of an M/G/1 queue, two-moment approximation, seconds.

    t_q = ln(1 / (1 - q)) x E[S] (1 + C^2) / 2 / (1 - rho): the M/M/1 sojourn quantile with the
    service time scaled by the Pollaczek-Khinchine factor (1 + C^2) / 2 (module doc). Exact for
    exponential service (C^2 = 1); within a few percent of the exact queue for constant service;
    optimistic for heavy-tailed service.
    """
    lam = real("arrival_rate", arrival_rate, 0, unit="requests/s")
    es = real("mean_service_s", mean_service_s, 0, low_open=True, unit="seconds")
    c2 = real("scv", scv, 0)
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    rho = lam * es
    if rho >= 1:
        raise ValueError(f"utilization lambda E[S] = {rho:.3g} must be below 1")
    return math.log(1 / (1 - q)) * es * (1 + c2) / 2 / (1 - rho)


def utilization_for_sojourn_quantile(mean_service_s: float, target_s: float, q: float = 0.99,
                                     scv: float = 1.0) -> float:
    """Highest utilization whose q-quantile time in system is at most ``target_s``.

    Inverts :func:`sojourn_quantile_approx_s`: rho = 1 - ln(1 / (1 - q)) E[S] (1 + C^2) / (2 T),
    exact for M/M/1 (``scv`` = 1: rho = 1 - ln(100) E[S] / T at q = 0.99, the "run at 70%" rule
    when T is about 15 service times). Returns 0 when even an idle server misses the target
    (the formula would go negative).
    """
    es = real("mean_service_s", mean_service_s, 0, low_open=True, unit="seconds")
    t = real("target_s", target_s, 0, low_open=True, unit="seconds")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    c2 = real("scv", scv, 0)
    return max(0.0, 1 - math.log(1 / (1 - q)) * es * (1 + c2) / (2 * t))


def lindley_waits(arrivals_s, services_s):
    """Exact FCFS single-server waits (s) of a sample path: Lindley's recursion.

    W_0 = 0, W_n = max(0, W_{n-1} + S_{n-1} - (A_n - A_{n-1})) (Lindley, "The theory of queues
    with a single server", Proc. Cambridge Phil. Soc. 48, 1952), evaluated without a loop:
    with U_n = sum_{i <= n} (S_{i-1} - (A_i - A_{i-1})), W_n = U_n - min(0, min_{k <= n} U_k).
    ``arrivals_s`` sorted, ``services_s`` >= 0, same length; returns a numpy array.
    """
    import numpy as np

    a = np.asarray(arrivals_s, dtype=float)
    s = np.asarray(services_s, dtype=float)
    if a.ndim != 1 or a.shape != s.shape or not len(a):
        raise ValueError("arrivals_s and services_s must be non-empty 1-D sequences of the same length")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(s)) and np.all(s >= 0)):
        raise ValueError("arrivals_s must be finite and services_s finite and >= 0")
    if np.any(np.diff(a) < 0):
        raise ValueError("arrivals_s must be sorted (FCFS order)")
    x = np.empty_like(a)
    x[0] = 0.0
    x[1:] = s[:-1] - np.diff(a)
    u = np.cumsum(x)
    return u - np.minimum(np.minimum.accumulate(u), 0.0)


def sample_path_utilization(services_s, target_s: float, q: float = 0.99, *, seed: int = 0,
                            rel_tol: float = 1e-4) -> float:
    """Highest utilization at which the exact FCFS queue meets a q-quantile target on time in system.

    ``services_s`` is a sample of service times (s); Poisson arrivals are drawn once with ``seed``
    (unit exponential gaps, scaled to E[S] / rho), and rho is bisected so that the q-quantile of
    wait (:func:`lindley_waits`) + service equals ``target_s``. Returns 0 when the services alone
    miss it (their own q-quantile is above the target: no utilization helps). The exact
    counterpart of :func:`utilization_for_sojourn_quantile`, for any service distribution.
    """
    import numpy as np

    svc = np.asarray(services_s, dtype=float)
    if svc.ndim != 1 or len(svc) < 100 or not np.all(np.isfinite(svc)) or np.any(svc < 0) or svc.sum() <= 0:
        raise ValueError("services_s must be at least 100 finite service times >= 0 (seconds), not all zero")
    t = real("target_s", target_s, 0, low_open=True, unit="seconds")
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    real("rel_tol", rel_tol, 0, low_open=True)
    if np.quantile(svc, q) > t:
        return 0.0
    gaps = np.random.default_rng(seed).exponential(1.0, len(svc))
    es = svc.mean()

    def quantile(rho: float) -> float:
        arrivals = np.cumsum(gaps * (es / rho))
        return float(np.quantile(lindley_waits(arrivals, svc) + svc, q))

    lo, hi = 0.0, 1.0
    while hi - lo > rel_tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if quantile(mid) <= t else (lo, mid)
    return lo
