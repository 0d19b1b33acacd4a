"""A day of demand against the fleet that serves it: peak sets the fleet, the mean sets the work.

* :func:`demand`: requests/s over a day, a cosine between a trough and a peak ``peak_to_trough``
  times higher: ``rate(t) = m (1 + a cos(2 pi (t - t_peak) / day))`` with ``a = (r - 1) / (r + 1)``,
  so the peak is ``peak_to_mean = 1 + a = 2 r / (r + 1)`` times the mean ``m``.
* :func:`fixed_fleet`: the replicas the peak needs (:func:`lib.fleet.capacity.fleet_for_load`), the
  replica-hours a day they are paid for, the replica-hours of work the day holds
  (``m x replica_s x 24 h``) and what is left idle.
* :func:`autoscale_day`: a minute-by-minute replay of a target-tracking autoscaler: each step it wants
  ``ceil(rate(t + lead) x replica_s / u)`` replicas, launches what it lacks (they serve ``start_s``
  later, paid from launch: :func:`lib.fleet.capacity.replica_start_s` is the start), and releases
  replicas only when the target has stayed below them for ``cooldown_s``. It reports the replica-hours
  paid and the minutes when the ready replicas run above the planned utilization or above 100%.
* :func:`fluid_replica_hours`: the autoscaling floor ``m x replica_s / u x 24 h`` (no rounding, no lag).
* :func:`steepest_climb`: the largest d(rate)/dt of the day, ``m a 2 pi / day`` (requests/s per second).
* :func:`ramp_lag_replicas`: the replicas a reactive autoscaler lags by on the steepest part of the
  ramp: the load the climb adds in ``lag`` (:func:`steepest_climb` x lag) in replicas
  (:func:`lib.fleet.capacity.fleet_for_load`, unrounded), ``m a (2 pi / day) lag replica_s / u``.
* :func:`day_costs`: a day's dollars three ways: the fixed fleet on reserved prices, the autoscaled
  fleet on demand, and a reserved base at the trough's replicas with on-demand replicas above it.

SI units: seconds, requests per second, US dollars.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["DAY_S", "Autoscaled", "DayCosts", "FixedFleet", "autoscale_day", "day_costs", "demand", "fixed_fleet",
           "fluid_replica_hours", "peak_to_mean", "ramp_lag_replicas", "steepest_climb"]

DAY_S = 86_400.0


def _ratio(peak_to_trough) -> float:
    return real("peak_to_trough", peak_to_trough, 1.0, 100.0)


def peak_to_mean(peak_to_trough: float) -> float:
    """2 r / (r + 1): the cosine's peak over its mean (r = 3: 1.5)."""
    r = _ratio(peak_to_trough)
    return 2 * r / (r + 1)


def demand(t_s, mean_rate: float, peak_to_trough: float, peak_hour: float = 15.0):
    """Requests/s at time ``t_s`` (seconds after midnight, scalar or array): m (1 + a cos(2 pi (t - t_peak) / day))."""
    m = real("mean_rate", mean_rate, 0, low_open=True, unit="requests/s")
    r = _ratio(peak_to_trough)
    h = real("peak_hour", peak_hour, 0, 24)
    a = (r - 1) / (r + 1)
    return m * (1 + a * np.cos(2 * np.pi * (np.asarray(t_s, dtype=float) - h * 3600.0) / DAY_S))


def _cost(cost):
    from lib.fleet.capacity import RequestCost

    if not isinstance(cost, RequestCost):
        raise ValueError(f"cost must be a RequestCost (lib.fleet.capacity.request_cost), got {type(cost).__name__}")
    return cost


@dataclass(frozen=True)
class FixedFleet:
    """A fleet sized for the peak and kept all day."""

    replicas: int
    gpus: int
    paid_replica_h: float  # replicas x 24
    work_replica_h: float  # m x replica_s x 24 h / 3600: replica-hours of work the day holds
    peak_rate: float

    @property
    def busy_fraction(self) -> float:
        """Work over paid: the day's mean utilization of the fixed fleet."""
        return self.work_replica_h / self.paid_replica_h

    @property
    def idle_replica_h(self) -> float:
        """Paid minus work."""
        return self.paid_replica_h - self.work_replica_h


def fixed_fleet(cost, mean_rate: float, peak_to_trough: float, utilization: float | None = None) -> FixedFleet:
    """The replicas the peak rate needs at ``utilization`` (fleet_for_load), paid 24 h."""
    from lib.fleet.capacity import fleet_for_load

    c = _cost(cost)
    m = real("mean_rate", mean_rate, 0, low_open=True, unit="requests/s")
    peak = m * peak_to_mean(peak_to_trough)
    size = fleet_for_load(peak, c, utilization)
    return FixedFleet(size.replicas, size.gpus, size.replicas * 24.0, m * c.replica_s * 24.0, peak)


def fluid_replica_hours(cost, mean_rate: float, utilization: float | None = None) -> float:
    """m x replica_s / u x 24 h: what a perfect autoscaler (fractional replicas, no start time) pays."""
    from lib.fleet.capacity import default_utilization

    c = _cost(cost)
    m = real("mean_rate", mean_rate, 0, low_open=True, unit="requests/s")
    return m * c.replica_s / default_utilization(utilization) * 24.0


def steepest_climb(mean_rate: float, peak_to_trough: float) -> float:
    """Largest d(rate)/dt of :func:`demand`, requests/s per second: m a 2 pi / day, a = (r - 1) / (r + 1)
    (equally (peak - trough) pi / day)."""
    m = real("mean_rate", mean_rate, 0, low_open=True, unit="requests/s")
    r = _ratio(peak_to_trough)
    return m * (r - 1) / (r + 1) * 2 * math.pi / DAY_S


def ramp_lag_replicas(cost, mean_rate: float, peak_to_trough: float, lag_s: float,
                      utilization: float | None = None) -> float:
    """Replicas a reactive autoscaler falls behind on the steepest ramp: the load :func:`steepest_climb`
    adds in ``lag_s``, in replicas at utilization u (:func:`lib.fleet.capacity.fleet_for_load`, the
    exact fraction): m a (2 pi / day) x lag x replica_s / u."""
    from lib.fleet.capacity import fleet_for_load

    c = _cost(cost)
    added = steepest_climb(mean_rate, peak_to_trough) * real("lag_s", lag_s, 0, unit="seconds")
    return fleet_for_load(added, c, utilization).exact if added > 0 else 0.0


@dataclass(frozen=True)
class Autoscaled:
    """One simulated day of the autoscaler (:func:`autoscale_day`); arrays per step."""

    t_s: np.ndarray
    need: np.ndarray  # rate x replica_s / u: replicas the planned utilization wants (fractional)
    ready: np.ndarray  # replicas serving
    paid: np.ndarray  # ready + starting
    step_s: float
    utilization: float

    @property
    def paid_replica_h(self) -> float:
        return float(self.paid.sum() * self.step_s / 3600.0)

    @property
    def over_plan_min(self) -> float:
        """Minutes when the ready replicas run above the planned utilization (need > ready)."""
        return float((self.need > self.ready + 1e-9).sum() * self.step_s / 60.0)

    @property
    def overload_min(self) -> float:
        """Minutes when the work exceeds the ready replicas at 100% busy (queues grow without bound)."""
        return float((self.need * self.utilization > self.ready + 1e-9).sum() * self.step_s / 60.0)

    @property
    def worst_deficit(self) -> float:
        """Largest need - ready (replicas), 0 when the fleet always kept up."""
        return float(max(0.0, (self.need - self.ready).max()))


def autoscale_day(cost, mean_rate: float, peak_to_trough: float, start_s: float, *, utilization: float | None = None,
                  lead_s: float = 0.0, cooldown_s: float = 600.0, min_replicas: int = 1, step_s: float = 60.0,
                  peak_hour: float = 15.0, days: int = 2, burst_hour: float | None = None, burst_s: float = 0.0,
                  burst_factor: float = 1.0) -> Autoscaled:
    """Replay a target-tracking autoscaler over ``days`` days and return the last (the first warms up).

    Each step: target = max(min_replicas, ceil(max(forecast(t + lead_s), observed(t)) x replica_s / u)),
    the forecast being the diurnal curve and the observed rate including any burst; launch target - paid
    replicas when short (each serves ``start_s`` later, rounded up to whole steps, paid from launch);
    when paid exceeds the largest target of the last ``cooldown_s``, release the excess, starting
    ones first. A burst multiplies the demand by ``burst_factor`` for ``burst_s`` from ``burst_hour`` on
    the last day (no forecast sees it)."""
    from lib.fleet.capacity import default_utilization

    c = _cost(cost)
    u = default_utilization(utilization)
    st = real("start_s", start_s, 0, 86_400, unit="seconds")
    lead = real("lead_s", lead_s, 0, 86_400, unit="seconds")
    cool = real("cooldown_s", cooldown_s, 0, 86_400, unit="seconds")
    floor = integer("min_replicas", min_replicas, 0)
    dt = real("step_s", step_s, 1, 3600, unit="seconds")
    n_days = integer("days", days, 1, 7)
    steps = int(round(DAY_S / dt))
    t = np.arange(steps * n_days) * dt
    observed = demand(t, mean_rate, peak_to_trough, peak_hour)
    if burst_hour is not None:
        bh = real("burst_hour", burst_hour, 0, 24)
        bs = real("burst_s", burst_s, 0, DAY_S, unit="seconds")
        bf = real("burst_factor", burst_factor, 1.0, 100.0)
        t0 = (n_days - 1) * DAY_S + bh * 3600.0
        observed = np.where((t >= t0) & (t < t0 + bs), observed * bf, observed)
    need = observed * c.replica_s / u
    forecast = demand(t + lead, mean_rate, peak_to_trough, peak_hour) * c.replica_s / u
    target = np.maximum(floor, np.ceil(np.maximum(forecast, need) - 1e-9))
    delay = int(math.ceil(st / dt - 1e-9))
    cool_steps = max(1, int(math.ceil(cool / dt - 1e-9)))
    ready_n = int(target[0])
    starting: deque = deque()  # (step it serves from, count)
    recent: deque = deque()
    ready = np.zeros(t.size)
    paid = np.zeros(t.size)
    for i in range(t.size):
        while starting and starting[0][0] <= i:
            ready_n += starting.popleft()[1]
        pending = sum(k for _, k in starting)
        want = int(target[i])
        recent.append(want)
        if len(recent) > cool_steps:
            recent.popleft()
        if want > ready_n + pending:
            starting.append((i + delay, want - ready_n - pending))
            if delay == 0:
                ready_n += starting.pop()[1]
        else:
            excess = ready_n + pending - max(recent)
            while excess > 0 and starting:  # cancel launches first
                step, k = starting.pop()
                drop = min(k, excess)
                excess -= drop
                if k > drop:
                    starting.append((step, k - drop))
                    break
            if excess > 0:
                ready_n -= excess
        ready[i] = ready_n
        paid[i] = ready_n + sum(k for _, k in starting)
    last = slice(t.size - steps, t.size)
    return Autoscaled(t[last] - t[last][0], need[last], ready[last], paid[last], dt, u)


@dataclass(frozen=True)
class DayCosts:
    """A day's dollars: ``fixed_reserved`` (peak fleet on reserved prices), ``auto_on_demand`` (the
    autoscaled replica-hours on demand) and ``hybrid`` (the trough's replicas reserved, the rest on demand)."""

    fixed_reserved: float
    auto_on_demand: float
    hybrid: float
    base_replicas: int

    @property
    def cheapest(self) -> str:
        named = {"the fixed fleet on reserved prices": self.fixed_reserved,
                 "autoscaling on demand": self.auto_on_demand,
                 "a reserved base with on-demand peaks": self.hybrid}
        return min(named, key=named.get)


def day_costs(fixed: FixedFleet, auto: Autoscaled, usd_per_replica_h: float, reserved_discount: float) -> DayCosts:
    """Fixed fleet at (1 - d) x price x replicas x 24; autoscaled paid replica-hours x price; hybrid: the
    autoscaler's smallest paid count reserved all day at (1 - d), the replica-hours above it on demand."""
    p = real("usd_per_replica_h", usd_per_replica_h, 0, low_open=True, unit="USD per replica-hour")
    d = real("reserved_discount", reserved_discount, 0, 1, high_open=True)
    base = int(auto.paid.min())
    above_h = float((auto.paid - base).sum() * auto.step_s / 3600.0)
    return DayCosts(fixed.paid_replica_h * p * (1 - d), auto.paid_replica_h * p, base * 24.0 * p * (1 - d) + above_h * p,
                    base)
