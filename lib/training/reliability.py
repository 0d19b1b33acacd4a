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
    "Goodput", "async_interval_s", "async_lost_fraction", "checkpoint_transfer_s", "daly_interval_s",
    "restart_loss_breakdown", "simulate_async_goodput", "failure_rate_per_gpu_s", "goodput", "job_mtbf_s", "lost_fraction",
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
    ``checkpoint_s`` is the time the job is blocked per checkpoint (0 for a fully asynchronous write);
    the no-drain case of :func:`async_lost_fraction`."""
    real("checkpoint_s", checkpoint_s, 0, unit="seconds")
    return async_lost_fraction(interval_s, checkpoint_s, 0.0, mtbf_s, restart_s)


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
    seconds (default 200 MTBFs). Deterministic for a ``seed``. The blocking case (no drain) of
    :func:`simulate_async_goodput`, which samples failure by failure."""
    real("checkpoint_s", checkpoint_s, 0, unit="seconds")
    return simulate_async_goodput(interval_s, checkpoint_s, 0.0, mtbf_s, restart_s, work_s, seed, runs)


# ---- the write itself, asynchronous checkpoints, and the restart's parts (N017, N021) -------------------------------


def checkpoint_transfer_s(total_bytes: float, writers: int, writer_bytes_per_s: float,
                          storage_bytes_per_s: float | None = None) -> float:
    """Seconds to move a checkpoint of ``total_bytes`` split evenly over ``writers``, each at
    ``writer_bytes_per_s``, into (or out of) a store that takes at most ``storage_bytes_per_s`` in all
    (None: no cap): total / min(writers x per-writer, storage). One rank writing everything is
    ``writers=1``; a sharded write has every rank write its own slice."""
    b = real("total_bytes", total_bytes, 0, unit="bytes")
    n = integer("writers", writers, 1)
    w = real("writer_bytes_per_s", writer_bytes_per_s, 0, low_open=True, unit="bytes/s")
    rate = n * w
    if storage_bytes_per_s is not None:
        rate = min(rate, real("storage_bytes_per_s", storage_bytes_per_s, 0, low_open=True, unit="bytes/s"))
    return b / rate


def _async_inputs(interval_s, blocking_s, drain_s, mtbf_s, restart_s):
    tau = real("interval_s", interval_s, 0, low_open=True, unit="seconds")
    b = real("blocking_s", blocking_s, 0, unit="seconds")
    d = real("drain_s", drain_s, 0, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    r = real("restart_s", restart_s, 0, unit="seconds")
    if d > tau:
        raise ValueError(f"interval_s ({tau:.6g} s) must be at least drain_s ({d:.6g} s): a new asynchronous "
                         "checkpoint cannot start before the previous one has drained to storage")
    return tau, b, d, m, r


def async_lost_fraction(interval_s: float, blocking_s: float, drain_s: float, mtbf_s: float,
                        restart_s: float = 0.0) -> float:
    """First-order lost fraction of an asynchronous checkpoint: the job blocks ``blocking_s`` per
    checkpoint (the snapshot to host memory), then the write drains to storage in the background for
    ``drain_s`` (at most the interval). A failure rolls back to the last *durable* checkpoint, which
    lags by the drain: the rewound work is tau / 2 + D on average, so
    lost = B / tau + (tau / 2 + D + R) / M (capped at 1). With D = 0 it is :func:`lost_fraction`."""
    tau, b, d, m, r = _async_inputs(interval_s, blocking_s, drain_s, mtbf_s, restart_s)
    return min(1.0, b / tau + (tau / 2.0 + d + r) / m)


def async_interval_s(blocking_s: float, drain_s: float, mtbf_s: float) -> float:
    """The interval minimising :func:`async_lost_fraction`: Young's sqrt(2 B M) on the blocking time,
    but never below the drain D (the next checkpoint waits for the last): max(D, sqrt(2 B M))."""
    b = real("blocking_s", blocking_s, 0, unit="seconds")
    d = real("drain_s", drain_s, 0, unit="seconds")
    m = real("mtbf_s", mtbf_s, 0, low_open=True, unit="seconds")
    young = math.sqrt(2.0 * b * m)
    if young == 0 and d == 0:
        raise ValueError("blocking_s and drain_s cannot both be 0: the optimum interval would be 0")
    return max(d, young)


def simulate_async_goodput(interval_s: float, blocking_s: float, drain_s: float, mtbf_s: float,
                           restart_s: float = 0.0, work_s: float | None = None, seed: int = 0,
                           runs: int = 200) -> float:
    """Monte Carlo of an asynchronous checkpoint: useful work / wall time. The job computes
    ``interval_s`` of work, blocks ``blocking_s`` for the snapshot, and checkpoint j becomes durable
    ``drain_s`` after its snapshot ends; failures are exponential with mean ``mtbf_s`` (none during a
    restart); a failure costs ``restart_s`` and rolls back to the last durable checkpoint. Sampled
    failure by failure (O(1) per failure), ``runs`` jobs of ``work_s`` useful seconds (default 200
    MTBFs). With ``drain_s = 0`` it is the same process as :func:`simulate_goodput`."""
    import numpy as np

    tau, b, d, m, r = _async_inputs(interval_s, blocking_s, drain_s, mtbf_s, restart_s)
    work = 200.0 * m if work_s is None else real("work_s", work_s, 0, low_open=True, unit="seconds")
    integer("runs", runs, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    period = tau + b
    wall_total = 0.0
    for _ in range(runs):
        wall, prog = 0.0, 0.0
        while True:
            remaining = work - prog
            n = max(1, math.ceil(remaining / tau - 1e-12))  # segments left, the last one possibly short
            finish = remaining + n * b
            x = rng.exponential(m)
            if x >= finish:
                wall += finish
                break
            k = min(int(x // period), n - 1)  # snapshots completed before the failure
            durable = 0 if x < d else min(int((x - d) // period), k)
            prog += durable * tau
            wall += x + r
        wall_total += wall
    return work * runs / wall_total


def restart_loss_breakdown(mtbf_s: float, interval_s: float, detect_s: float, reschedule_s: float,
                           reload_s: float, blocking_s: float = 0.0, drain_s: float = 0.0) -> dict[str, float]:
    """The lost fraction of :func:`async_lost_fraction` split by cause (fractions of wall time):
    ``detection`` D_det / M, ``rescheduling`` D_sched / M, ``reload`` D_load / M (the restart
    R = their sum), ``rewound`` (tau / 2 + drain) / M, ``checkpoint`` blocking / tau. Their sum is
    ``async_lost_fraction(interval, blocking, drain, M, R)`` below the cap."""
    parts = {k: real(k, v, 0, unit="seconds") for k, v in
             (("detect_s", detect_s), ("reschedule_s", reschedule_s), ("reload_s", reload_s))}
    tau, b, d, m, _ = _async_inputs(interval_s, blocking_s, drain_s, mtbf_s, 0.0)
    return {"detection": parts["detect_s"] / m, "rescheduling": parts["reschedule_s"] / m,
            "reload": parts["reload_s"] / m, "rewound": (tau / 2.0 + d) / m, "checkpoint": b / tau}
