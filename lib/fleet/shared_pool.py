"""One GPU pool for serving and training: dedicated split, fully shared, and floor-plus-borrow (N048
shared-training-inference-pool).

* :func:`diurnal_rate`: a day of serving traffic, ``trough`` to ``peak`` requests/s on a cosine (peak
  at ``peak_hour``; :func:`lib.fleet.diurnal.demand`); its steepest climb is
  :func:`lib.fleet.diurnal.steepest_climb`, ``(peak - trough) / 2 x 2 pi / day``.
* :func:`reclaim_s`: how long a preempted training gang takes to hand GPUs to serving: the
  checkpoint it writes on the way out (``save_s``, from :func:`lib.training.reliability.checkpoint_transfer_s`
  in the notebook; 0 for a kill), process teardown, then a serving replica's start
  (:func:`lib.fleet.capacity.replica_start_s`).
* :func:`buffer_replicas`: serving replicas held beyond the current need so the climb during one reclaim
  is covered at the planned utilization: :func:`lib.fleet.autoscaling.spares_for_ramp` with the
  reclaim time as the start time.
* :func:`simulate_day`: per step (``dt``), serving holds replicas by the design's rule, training gets
  the rest of the pool in whole gangs. ``dedicated``: serving holds ``floor`` (its peak fleet plus the
  buffer, sized by the caller) or its largest need, all day.
  ``shared``: serving asks for what it needs now and receives it one reclaim later. ``floor_borrow``:
  serving never drops below a floor and, every ``window_s``, reclaims ahead the largest need of the
  next window plus one reclaim, plus the buffer. Each time training shrinks it loses ``save_s +
  restart_s`` of every GPU it still holds (the checkpoint on the way out and the relaunch), plus, for a
  kill, half a checkpoint interval of rolled-back work. Serving is short when its offered busy share
  on the replicas it holds passes 1 (the queue grows without bound).

SI units: seconds, requests per second, GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.fleet import diurnal
from lib.inputs import integer, real

__all__ = ["DayRun", "buffer_for", "buffer_replicas", "diurnal_rate", "reclaim_s", "simulate_day", "with_surge"]

def diurnal_rate(trough: float, peak: float, peak_hour: float = 14.0, dt: float = 60.0) -> np.ndarray:
    """Requests/s at each step of one day, ``trough`` at night to ``peak`` at ``peak_hour``: the section's
    one daily curve, :func:`lib.fleet.diurnal.demand` with mean (trough + peak) / 2 and peak-to-trough
    peak / trough, i.e. trough + (peak - trough) (1 + cos(2 pi (t - peak_hour) / day)) / 2."""
    lo = real("trough", trough, 0, low_open=True, unit="requests/s")
    hi = real("peak", peak, lo, unit="requests/s")
    t = np.arange(0.0, diurnal.DAY_S, real("dt", dt, 0, low_open=True, unit="s"))
    return diurnal.demand(t, (lo + hi) / 2, hi / lo, peak_hour)


def with_surge(rates: np.ndarray, rise: float, at_hour: float, ramp_s: float, hold_s: float = 3600.0,
               dt: float = 60.0) -> np.ndarray:
    """``rates`` plus a surge: ``rise`` requests/s more, reached over ``ramp_s`` from ``at_hour``, held for
    ``hold_s``, then gone (a launch, a viral post, a failover from another region)."""
    d = real("rise", rise, 0, unit="requests/s")
    h = real("at_hour", at_hour, 0, 24, unit="hours")
    r = real("ramp_s", ramp_s, 0, unit="s")
    hold = real("hold_s", hold_s, 0, unit="s")
    t = np.arange(rates.size) * dt - h * 3600.0
    shape = np.clip(t, 0.0, r) / r if r > 0 else (t >= 0).astype(float)
    return np.asarray(rates, dtype=float) + d * shape * (t < r + hold)


def reclaim_s(save_s: float, teardown_s: float, start_s: float) -> float:
    """Seconds from "serving needs these GPUs" to a serving replica on them: save + teardown + start."""
    return (real("save_s", save_s, 0, unit="s") + real("teardown_s", teardown_s, 0, unit="s")
            + real("start_s", start_s, 0, unit="s"))


def buffer_replicas(climb: float, reclaim: float, replica_s: float, utilization: float) -> int:
    """Replicas held ahead of need so that the climb during one reclaim stays at the planned utilization:
    ceil(climb x reclaim x replica_s / u) (:func:`lib.fleet.autoscaling.spares_for_ramp`, rise over one reclaim)."""
    from lib.fleet.autoscaling import spares_for_ramp

    c = real("climb", climb, 0, unit="requests/s per s")
    r = real("reclaim", reclaim, 0, unit="s")
    return spares_for_ramp(c * r, r, r, replica_s, utilization) if r > 0 else 0


def buffer_for(climb: float, surge: float, surge_ramp_s: float, reclaim: float, replica_s: float,
               utilization: float) -> int:
    """Replicas held ahead of need when a surge can land on top of the daily climb: the load both add
    within one reclaim, ``climb x reclaim + surge x min(1, reclaim / surge_ramp_s)``, in replicas at
    utilization ``u`` (:func:`lib.fleet.autoscaling.spares_for_ramp` of that rise)."""
    from lib.fleet.autoscaling import spares_for_ramp

    c = real("climb", climb, 0, unit="requests/s per s")
    s_ = real("surge", surge, 0, unit="requests/s")
    rs_ = real("surge_ramp_s", surge_ramp_s, 0, unit="s")
    r = real("reclaim", reclaim, 0, unit="s")
    added = c * r + (s_ if rs_ == 0 else s_ * min(1.0, r / rs_))
    return spares_for_ramp(added, 0.0, r, replica_s, utilization)


@dataclass
class DayRun:
    """Per step: serving replicas held, training GPUs, serving's offered busy share. Totals: GPU-seconds
    of serving work, of training held and of training lost to preemption; preemptions."""

    design: str
    held: np.ndarray
    train_gpus: np.ndarray
    busy_share: np.ndarray
    pool_gpus: int
    dt: float
    serve_busy_gpu_s: float
    train_held_gpu_s: float
    train_lost_gpu_s: float
    preemptions: int

    @property
    def short_s(self) -> float:
        """Seconds serving was offered more than its held replicas can do (busy share > 1)."""
        return float(np.sum(self.busy_share > 1.0) * self.dt)

    @property
    def train_useful_gpu_h(self) -> float:
        return (self.train_held_gpu_s - self.train_lost_gpu_s) / 3600.0

    @property
    def utilization(self) -> float:
        """Useful share of the pool's GPU-time: serving's busy GPU-seconds + training's held minus lost."""
        return (self.serve_busy_gpu_s + self.train_held_gpu_s - self.train_lost_gpu_s) / (self.pool_gpus * self.dt *
                                                                                          self.held.size)


def simulate_day(rates: np.ndarray, replica_s: float, gpus_per_replica: int, pool_gpus: int, gang_gpus: int, *,
                 design: str, utilization: float, reclaim: float, save_s: float, restart_s: float,
                 rollback_s: float = 0.0, buffer: int = 0, floor: int = 0, window_s: float = 1800.0,
                 forecast: np.ndarray | None = None, dt: float = 60.0) -> DayRun:
    """One day of ``rates`` (per step of ``dt``) on a pool of ``pool_gpus`` (module doc). ``forecast``: the
    rates ``floor_borrow`` plans its reclaims on (None: ``rates`` itself, a perfect forecast); a surge
    missing from the forecast is what the buffer is for."""
    if design not in ("dedicated", "shared", "floor_borrow"):
        raise ValueError(f"design must be 'dedicated', 'shared' or 'floor_borrow', got {design!r}")
    rs = real("replica_s", replica_s, 0, low_open=True, unit="s")
    gpr = integer("gpus_per_replica", gpus_per_replica, 1)
    pool = integer("pool_gpus", pool_gpus, gpr)
    gang = integer("gang_gpus", gang_gpus, 1)
    u = real("utilization", utilization, 0, 1, low_open=True)
    rec = real("reclaim", reclaim, 0, unit="s")
    rates = np.asarray(rates, dtype=float)
    n = rates.size
    need = np.ceil(rates * rs / u - 1e-9).astype(int)
    max_rep = pool // gpr
    if need.max() > max_rep:
        raise ValueError(f"serving needs {int(need.max())} replicas at its peak but the pool of {pool} GPUs holds "
                         f"{max_rep}: grow the pool")
    lag = int(math.ceil(rec / dt))
    win = max(1, int(round(window_s / dt)))
    if design == "dedicated":
        target = np.full(n, min(max_rep, max(floor, int(need.max()))))
    elif design == "shared":
        target = np.maximum(need, 1)
    else:
        plan = need if forecast is None else np.ceil(np.asarray(forecast, dtype=float) * rs / u - 1e-9).astype(int)
        if plan.size != n:
            raise ValueError(f"forecast has {plan.size} steps, rates {n}")
        target = np.zeros(n, dtype=int)
        for i in range(0, n, win):  # every window, reclaim ahead the next window's largest need (+ one reclaim)
            target[i:i + win] = min(max_rep, max(floor, int(plan[i:min(n, i + win + lag)].max()) + buffer))
    # a rise arrives one reclaim after it is asked for; a release is immediate
    held = np.minimum(target, target[np.maximum(np.arange(n) - lag, 0)])
    train = ((pool - held * gpr) // gang) * gang
    busy = rates * rs / np.maximum(held, 1)
    lost, pre = 0.0, 0
    for i in range(1, n):
        if train[i] < train[i - 1]:
            pre += 1
            lost += train[i] * (save_s + restart_s + rollback_s) + (train[i - 1] - train[i]) * rollback_s
    return DayRun(design, held, train, busy, pool, dt,
                  float(np.sum(np.minimum(rates * rs, held) * gpr) * dt), float(np.sum(train) * dt), lost, pre)
