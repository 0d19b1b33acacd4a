"""Failures, checkpoints and goodput: what a fleet loses to interruptions, and the checkpoint
interval that minimizes it.

* Failure rate: interruptions per GPU-hour, by default Llama 3's 405B run (419 unexpected
  interruptions in 54 days on 16,384 H100s, ``training.llama3_*``); a job of n GPUs fails at
  n x that rate (independent failures, any one stops the synchronous job): MTBF = 1 / (n r).
* Lost time per failure: the work since the last checkpoint (tau / 2 on average, for failures
  uniform in the interval) plus the restart (detect, reschedule, reload), R.
* Per unit of time: a blocking checkpoint write C every tau costs C / tau; failures cost
  (tau / 2 + R) / MTBF. The lost fraction is their sum (first order in tau / MTBF), minimised
  at Young's tau* = sqrt(2 C MTBF); Daly's higher-order estimate corrects it when C is not small.
* :func:`simulate_goodput` runs the same job as a renewal process with exponential failures (the
  independent check of the closed forms).

SI units: seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry import assumptions

__all__ = [
    "Goodput", "daly_interval_s", "failure_rate_per_gpu_s", "goodput", "job_mtbf_s", "lost_fraction",
    "simulate_goodput", "young_interval_s",
]

HOUR_S = 3600.0
DAY_S = 86400.0


def failure_rate_per_gpu_s(interruptions: float | None = None, days: float | None = None,
                           gpus: int | None = None) -> float:
    """Interruptions per GPU-second: interruptions / (days x 86,400 x GPUs); each argument
    defaults to Llama 3's (419, 54, 16,384)."""
    k = real("interruptions", assumptions.resolve(interruptions, "training.llama3_interruptions_unexpected"), 0,
             low_open=True)
    d = real("days", assumptions.resolve(days, "training.llama3_interruption_days"), 0, low_open=True)
    n = integer("gpus", assumptions.resolve(gpus, "training.llama3_gpus"), 1)
    return k / (d * DAY_S * n)


def job_mtbf_s(n_gpus: int, rate_per_gpu_s: float | None = None) -> float:
    """Mean time between interruptions of a synchronous job on ``n_gpus``: 1 / (n x rate)."""
    n = integer("n_gpus", n_gpus, 1)
    r = failure_rate_per_gpu_s() if rate_per_gpu_s is None else real("rate_per_gpu_s", rate_per_gpu_s, 0,
                                                                         low_open=True)
    return 1.0 / (n * r)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): the checkpoint interval that minimises the lost fraction, sqrt(2 C M)."""
    c = real("checkpoint_s", checkpoint_s, 0, low_open=True, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    return math.sqrt(2.0 * c * m)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006): sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + C / (18 M)] - C for C < 2M, else M."""
    c = real("checkpoint_s", checkpoint_s, 0, low_open=True, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def lost_fraction(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order fraction of wall time lost: C / tau + (tau / 2 + R) / MTBF (capped at 1).
    ``checkpoint_s`` is the time the job is blocked per checkpoint (0 for a fully asynchronous write)."""
    tau = real("interval_s", interval_s, 0, low_open=True, unit="seconds")
    c = real("checkpoint_s", checkpoint_s, 0, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    r = real("restart_s", restart_s, 0, unit="seconds")
    return min(1.0, c / tau + (tau / 2.0 + r) / m)


@dataclass(frozen=True)
class Goodput:
    """The losses of a run per unit of wall time, by cause (fractions), and what is left."""

    checkpoint: float  # blocking checkpoint writes, C / tau
    rewound: float  # work redone since the last checkpoint, (tau / 2) / M
    restart: float  # detection, rescheduling and reload, R / M
    interval_s: float
    mtbf_s: float

    @property
    def lost(self) -> float:
        return min(1.0, self.checkpoint + self.rewound + self.restart)

    @property
    def goodput(self) -> float:
        return 1.0 - self.lost

    @property
    def failures_per_day(self) -> float:
        return DAY_S / self.mtbf_s


def goodput(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> Goodput:
    """The terms of :func:`lost_fraction`, one by one."""
    lost_fraction(interval_s, checkpoint_s, mtbf_s, restart_s)  # validates
    return Goodput(checkpoint_s / interval_s, interval_s / 2.0 / mtbf_s, restart_s / mtbf_s, interval_s, mtbf_s)


def simulate_goodput(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0,
                     work_s: float | None = None, seed: int = 0, runs: int = 200) -> float:
    """Monte Carlo of the same job: useful work / wall time, failures exponential with mean
    ``mtbf_s`` (none during a restart), work checkpointed every ``interval_s`` of progress at a
    blocking cost ``checkpoint_s``; a failure loses the work and any write since the last
    completed checkpoint and costs ``restart_s``. Averages ``runs`` jobs of ``work_s`` useful
    seconds (default 200 MTBFs). Deterministic for a ``seed``."""
    import numpy as np

    tau = real("interval_s", interval_s, 0, low_open=True, unit="seconds")
    c = real("checkpoint_s", checkpoint_s, 0, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    r = real("restart_s", restart_s, 0, unit="seconds")
    work = 200.0 * m if work_s is None else real("work_s", work_s, 0, low_open=True, unit="seconds")
    integer("runs", runs, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    segments = math.ceil(work / tau)
    wall_total = 0.0
    for _ in range(runs):
        wall, done = 0.0, 0
        next_fail = rng.exponential(m)
        while done < segments:
            seg = min(tau, work - done * tau) + c  # compute one interval, then write its checkpoint
            if next_fail >= seg:
                wall += seg
                next_fail -= seg
                done += 1
            else:
                wall += next_fail + r
                next_fail = rng.exponential(m)
        wall_total += wall
    return work * runs / wall_total
