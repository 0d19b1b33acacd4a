"""Autoscaling an LLM serving fleet: what each signal sees, how many warm spares a ramp needs, and a
fluid simulation of scaling and shedding (W03 routing-and-autoscaling).

* :func:`gpu_util_reading`: what the GPU-utilization metric (the fraction of time any kernel runs, as
  DCGM's ``GPU_UTIL`` and nvidia-smi report it) shows for a replica. A replica runs kernels whenever
  at least one request is in flight; with requests arriving at ``r`` per second and staying
  ``request_s`` (prefill plus ``O`` decode steps), the in-flight count is Poisson with mean
  ``r x request_s`` (M/G/infinity), so the reading is ``1 - exp(-r request_s)``. The replica's real
  busy share is ``r x replica_s`` (:attr:`lib.fleet.capacity.RequestCost.replica_s`), much smaller:
  batching packs many requests into one step. The metric saturates long before the replica does.
* :func:`spares_for_ramp`: warm spares = the load the ramp adds during one replica start
  (:func:`lib.fleet.capacity.replica_start_s`), in replicas at the target utilization:
  ``ceil(rise min(1, start_s / ramp_s) replica_s / u)``.
* :func:`simulate`: one-second fluid steps. Arrivals (interactive and batch) join one queue served
  at ``ready x dt / replica_s`` requests per step; the wait is the queue's drain time
  ``Q replica_s / ready``. The autoscaler runs every ``eval_s``: the ``queue`` policy asks for
  ``(rate x replica_s + Q replica_s / drain_s) / u`` replicas (the demand the router sees: arrivals and
  queue); the ``gpu_util`` policy is the HPA rule ``ready x reading / target`` on
  :func:`gpu_util_reading`. A new replica is ready after ``start_s``; a warm spare (weights loaded,
  idle) joins at once and a replacement spare starts cold. Batch requests are shed while the wait
  exceeds ``shed_after_s``.

SI units: seconds, requests per second, replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["ScaleRun", "gpu_util_reading", "ramp", "simulate", "spares_for_ramp"]


def gpu_util_reading(rate_per_replica: float, request_s: float) -> float:
    """The GPU-utilization metric of a replica: P(at least one request in flight) = 1 - exp(-r request_s)."""
    r = real("rate_per_replica", rate_per_replica, 0, unit="requests/s")
    d = real("request_s", request_s, 0, low_open=True, unit="s")
    return 1.0 - math.exp(-r * d)


def spares_for_ramp(rise: float, ramp_s: float, start_s: float, replica_s: float, utilization: float) -> int:
    """Warm spares a ramp that adds ``rise`` requests/s over ``ramp_s`` seconds (0: a step) needs so that no
    request waits for a cold start: the load added during one start, ``rise x min(1, start_s / ramp_s)``,
    in replicas at utilization ``u`` (:func:`lib.fleet.capacity.fleet_for_load` of that load, rounded up):
    ``ceil(added x replica_s / u)``."""
    from lib.fleet.capacity import fleet_for_load

    d = real("rise", rise, 0, unit="requests/s")
    r = real("ramp_s", ramp_s, 0, unit="s")
    t = real("start_s", start_s, 0, unit="s")
    rs = real("replica_s", replica_s, 0, low_open=True, unit="s")
    u = real("utilization", utilization, 0, 1, low_open=True)
    added = d if r == 0 else d * min(1.0, t / r)
    return fleet_for_load(added, rs, u, gpus_per_replica=1).replicas if added > 0 else 0


def ramp(duration_s: float, base: float, peak: float, start_s: float, ramp_s: float, dt: float = 1.0) -> np.ndarray:
    """Request rate per step: ``base`` until ``start_s``, a straight line to ``peak`` over ``ramp_s``
    (0: a step), then ``peak``."""
    dur = real("duration_s", duration_s, 0, low_open=True, unit="s")
    b = real("base", base, 0, unit="requests/s")
    p = real("peak", peak, 0, unit="requests/s")
    t0 = real("start_s", start_s, 0, unit="s")
    rs = real("ramp_s", ramp_s, 0, unit="s")
    t = np.arange(0.0, dur, dt)
    if rs == 0:
        return np.where(t < t0, b, p)
    return b + (p - b) * np.clip((t - t0) / rs, 0.0, 1.0)


@dataclass
class ScaleRun:
    """Per step: time, offered rate, ready and starting replicas, warm spares, queue, wait, shed batch."""

    t: np.ndarray
    rate: np.ndarray
    ready: np.ndarray
    starting: np.ndarray
    spares: np.ndarray
    queue: np.ndarray
    wait_s: np.ndarray
    shed: np.ndarray
    dt: float
    gpus_per_replica: int

    def slo_violation_s(self, wait_slo_s: float) -> float:
        """Seconds during which the queue wait exceeds ``wait_slo_s``."""
        return float(np.sum(self.wait_s > wait_slo_s) * self.dt)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours held: ready + starting + warm spares, every step."""
        return float(np.sum(self.ready + self.starting + self.spares) * self.dt * self.gpus_per_replica / 3600.0)

    @property
    def shed_requests(self) -> float:
        return float(np.sum(self.shed))

    @property
    def max_wait_s(self) -> float:
        return float(self.wait_s.max())


def simulate(rates: np.ndarray, replica_s: float, start_s: float, *, policy: str = "queue", replicas0: int,
             utilization: float | None = None, gpu_target: float | None = None, request_s: float = 10.0,
             drain_s: float | None = None, spares: int = 0, min_replicas: int = 1, max_replicas: int = 1000,
             eval_s: float | None = None,
             batch_share: float = 0.0, shed_after_s: float | None = None, gpus_per_replica: int = 1,
             dt: float = 1.0) -> ScaleRun:
    """Fluid simulation of a fleet under ``rates`` (requests/s per step of ``dt``) with an autoscaler
    (module doc). ``policy``: ``"queue"``, ``"gpu_util"`` or ``"fixed"`` (never scales). None takes
    ``utilization`` from :func:`lib.fleet.capacity.default_utilization`, ``gpu_target``, ``drain_s`` and
    ``eval_s`` from ``fleet.hpa_gpu_util_target``, ``fleet.autoscaler_drain_s`` and ``fleet.autoscaler_eval_s``."""
    from lib.fleet.capacity import default_utilization
    from lib.registry import assumptions

    utilization = default_utilization(utilization)
    gpu_target = assumptions.resolve(gpu_target, "fleet.hpa_gpu_util_target")
    drain_s = real("drain_s", assumptions.resolve(drain_s, "fleet.autoscaler_drain_s"), 0, low_open=True, unit="s")
    eval_s = assumptions.resolve(eval_s, "fleet.autoscaler_eval_s")
    if policy not in ("queue", "gpu_util", "fixed"):
        raise ValueError(f"policy must be 'queue', 'gpu_util' or 'fixed', got {policy!r}")
    rs = real("replica_s", replica_s, 0, low_open=True, unit="s")
    st = real("start_s", start_s, 0, unit="s")
    lo = integer("min_replicas", min_replicas, 1)
    hi = integer("max_replicas", max_replicas, lo)
    ready = float(integer("replicas0", replicas0, lo, hi))
    warm = integer("spares", spares, 0)
    u = real("utilization", utilization, 0, 1, low_open=True)
    g_target = real("gpu_target", gpu_target, 0, 1, low_open=True)
    bshare = real("batch_share", batch_share, 0, 1)
    ev = max(1, round(real("eval_s", eval_s, 0, low_open=True, unit="s") / dt))
    rates = np.asarray(rates, dtype=float)
    n = rates.size
    pending: list[float] = []  # ready times of cold starts (serving replicas and spare refills alike)
    refills: list[float] = []  # ready times of cold starts that will become spares
    q = 0.0
    out = {k: np.zeros(n) for k in ("ready", "starting", "spares", "queue", "wait", "shed")}
    window = []
    for i in range(n):
        t = i * dt
        ready += sum(1 for x in pending if x <= t)
        pending = [x for x in pending if x > t]
        warm += sum(1 for x in refills if x <= t)
        refills = [x for x in refills if x > t]
        arrivals = rates[i] * dt
        wait = q * rs / ready
        shed = 0.0
        if shed_after_s is not None and wait > shed_after_s:
            shed = arrivals * bshare
            arrivals -= shed
        q = max(0.0, q + arrivals - ready * dt / rs)
        window.append(rates[i])
        if policy != "fixed" and (i + 1) % ev == 0:
            lam = float(np.mean(window))
            window = []
            if policy == "queue":
                want = (lam * rs + q * rs / drain_s) / u
            else:
                want = ready * gpu_util_reading(lam / ready, request_s) / g_target
            target = min(hi, max(lo, math.ceil(want - 1e-9)))
            have = ready + len(pending)
            if target > have:
                add = target - int(have)
                now = min(add, warm)  # warm spares join at once; each is replaced by a cold start
                ready += now
                warm -= now
                refills += [t + st] * now
                pending += [t + st] * (add - now)
            elif target < ready:
                ready = float(target)
        out["ready"][i] = ready
        out["starting"][i] = len(pending) + len(refills)
        out["spares"][i] = warm
        out["queue"][i] = q
        out["wait"][i] = q * rs / ready
        out["shed"][i] = shed
    return ScaleRun(np.arange(n) * dt, rates, out["ready"], out["starting"], out["spares"], out["queue"], out["wait"],
                    out["shed"], dt, int(gpus_per_replica))
