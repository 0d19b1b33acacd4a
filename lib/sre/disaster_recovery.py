"""Disaster recovery for a months-long training run: what losing one building costs, for each
recovery point and recovery time, against what the warm state at a second site costs.

* **Recovery point** (:func:`recovery_point_s`): checkpoints are copied off-site every ``E``
  seconds, each copy taking ``L`` (:func:`replication_s`: bytes shipped over the inter-site link,
  :func:`lib.training.reliability.checkpoint_transfer_s`). The newest usable copy at a loss time is
  the last one whose copy finished, so the progress lost is uniform on [L, E + L): mean E / 2 + L,
  worst E + L. A copy cannot start before the last one finished: E >= L.
  :func:`simulate_recovery_point` walks the same timeline at random loss times (the independent check).
* **Recovery time** (:class:`RecoveryTime`): detect the loss, decide to fail over, stage data and
  images that are not already there, restore the checkpoint into the second cluster, re-form the
  job there (reschedule, initialise). A part already done in advance (a warm state) costs 0.
* **The bill** (:func:`assess`): progress lost (the recovery point on every GPU), the fleet idle
  during the recovery time, and, while the building is out, the progress a smaller second cluster
  does not make; against the warm state's own cost over the run (standby GPUs kept preemptible).

SI units: seconds, bytes, bytes/s; GPU-days where named.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import fraction, integer, real

__all__ = ["DAY_S", "DRResult", "RecoveryTime", "Strategy", "assess", "incremental_delta", "recovery_point_s",
           "replication_s", "simulate_recovery_point"]

DAY_S = 86400.0


def replication_s(checkpoint_bytes: float, link_bytes_per_s: float, changed_fraction: float = 1.0) -> float:
    """Seconds to copy one checkpoint to the second site: changed_fraction x bytes / link, through
    :func:`lib.training.reliability.checkpoint_transfer_s` (one stream at the link's rate).
    ``changed_fraction`` = 1 is a full copy; an incremental copy ships only what changed since the last
    one (for dense training state with Adam nearly every byte changes every step: about 1)."""
    from lib.training.reliability import checkpoint_transfer_s

    b = real("checkpoint_bytes", checkpoint_bytes, 0, unit="bytes")
    f = fraction("changed_fraction", changed_fraction)
    return checkpoint_transfer_s(b * f, 1, real("link_bytes_per_s", link_bytes_per_s, 0, low_open=True, unit="bytes/s"))


def incremental_delta(steps: int, n: int = 16_384, lr: float = 8e-5, weight_std: float = 0.02, seed: int = 0) -> dict:
    """What an incremental copy of mixed-precision Adam state would ship after ``steps`` optimizer steps:
    ``n`` parameters (fp32 master weights ~ N(0, weight_std), their bf16 copy, fp32 moments m and v: the
    14 bytes a parameter of :func:`lib.training.checkpoint.checkpoint_bytes`) are stepped by Adam
    (beta1 0.9, beta2 0.95, eps 1e-8, learning rate ``lr``; Llama 3 405B's peak is 8e-5) on
    noise-dominated gradients ~ N(0, 1). Returns the share of elements whose bytes changed, per tensor
    ("w32", "w16", "m", "v"), and "compressed": the zlib size (level 1) of the bytewise XOR of the new
    state against the old, over the full state's size: the changed fraction a delta copy would ship
    (about 1 when nearly every byte is new, near 0 for an unchanged state)."""
    import zlib

    import numpy as np

    k = integer("steps", steps, 0)
    n = integer("n", n, 16)
    lr = real("lr", lr, 0, unit="1/step")
    std = real("weight_std", weight_std, 0, low_open=True)
    rng = np.random.default_rng(integer("seed", seed, 0))
    w = (std * rng.standard_normal(n)).astype(np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    for _ in range(10):  # a warmed-up state: the copy happens mid-run, not at step 0
        g = rng.standard_normal(n).astype(np.float32)
        m = 0.9 * m + 0.1 * g
        v = 0.95 * v + 0.05 * g * g
    t0 = 10

    def bf16(x):
        return (x.view(np.uint32) >> 16).astype(np.uint16)

    old = {"w32": w.copy(), "w16": bf16(w), "m": m.copy(), "v": v.copy()}
    for t in range(t0 + 1, t0 + k + 1):
        g = rng.standard_normal(n).astype(np.float32)
        m = np.float32(0.9) * m + np.float32(0.1) * g
        v = np.float32(0.95) * v + np.float32(0.05) * g * g
        mh = m / np.float32(1 - 0.9 ** t)
        vh = v / np.float32(1 - 0.95 ** t)
        w = w - np.float32(lr) * mh / (np.sqrt(vh) + np.float32(1e-8))
    new = {"w32": w, "w16": bf16(w), "m": m, "v": v}
    out = {name: float(np.mean(old[name] != new[name])) for name in old}
    xor = b"".join((np.frombuffer(old[x].tobytes(), np.uint8) ^ np.frombuffer(new[x].tobytes(), np.uint8)).tobytes()
                   for x in old)
    out["compressed"] = len(zlib.compress(xor, 1)) / len(xor)
    return out


def recovery_point_s(replicate_every_s: float, lag_s: float) -> tuple[float, float]:
    """(mean, worst) progress lost, seconds, at a loss at a random time: copies start every E and
    land L later, so the loss is uniform on [L, E + L): (E / 2 + L, E + L). ValueError if E < L."""
    e = real("replicate_every_s", replicate_every_s, 0, low_open=True, unit="seconds")
    lag = real("lag_s", lag_s, 0, unit="seconds")
    if e < lag:
        raise ValueError(f"replicate_every_s ({e:.6g} s) must be at least the copy's lag ({lag:.6g} s): a copy cannot "
                         "start before the last one has landed, or the backlog grows without bound")
    return e / 2.0 + lag, e + lag


def simulate_recovery_point(replicate_every_s: float, lag_s: float, losses: int = 10_000, seed: int = 0,
                            horizon_s: float | None = None):
    """Progress lost at ``losses`` random loss times, seconds (array): copy k of the checkpoint taken at
    k E lands at k E + L; at loss time t the newest landed copy is the largest k with k E + L <= t, and
    the progress lost is t - k E (t - 0 before the first copy lands: all of it). Loss times uniform on
    [E + L, horizon)."""
    import numpy as np

    e = real("replicate_every_s", replicate_every_s, 0, low_open=True, unit="seconds")
    lag = real("lag_s", lag_s, 0, unit="seconds")
    n = integer("losses", losses, 1)
    h = 1000.0 * (e + lag) if horizon_s is None else real("horizon_s", horizon_s, 0, low_open=True, unit="seconds")
    rng = np.random.default_rng(integer("seed", seed, 0))
    t = rng.uniform(min(e + lag, h), h, n)
    landed = np.arange(0.0, h + e, e) + lag  # copy k lands at k E + L
    k = np.searchsorted(landed, t, side="right") - 1
    return np.where(k >= 0, t - np.maximum(k, 0) * e, t)


@dataclass(frozen=True)
class RecoveryTime:
    """The parts of the recovery time, seconds."""

    detect_s: float  # the building is gone: the job, its monitoring and its heartbeat go silent
    decide_s: float  # declare the disaster: the site's estimate, the call to fail over
    stage_s: float  # data and images copied to the second site (0 when staged in advance)
    provision_s: float  # GPUs found at the second site (0 with a standby cluster)
    restore_s: float  # the checkpoint read into the second cluster's GPUs
    reform_s: float  # reschedule and initialise the job on the second cluster

    @property
    def total_s(self) -> float:
        return self.detect_s + self.decide_s + self.stage_s + self.provision_s + self.restore_s + self.reform_s

    def parts(self) -> dict[str, float]:
        return {"detect": self.detect_s, "decide": self.decide_s, "stage": self.stage_s,
                "provision": self.provision_s, "restore": self.restore_s, "re-form": self.reform_s}


@dataclass(frozen=True)
class Strategy:
    """One disaster-recovery choice. ``replicate_every_s``: seconds between off-site copies (None:
    no copy leaves the building); ``staged``: data and images already at the second site;
    ``standby_fraction``: the second cluster's size as a fraction of the job's GPUs, kept warm (0:
    none, GPUs must be provisioned); ``standby_overhead``: the fraction of the standby GPUs' time
    the warm state costs (0: they run other work that yields at once; 1: idle)."""

    name: str
    replicate_every_s: float | None
    staged: bool
    standby_fraction: float
    standby_overhead: float = 0.0

    def __post_init__(self):
        if self.replicate_every_s is not None:
            real("replicate_every_s", self.replicate_every_s, 0, low_open=True, unit="seconds")
        fraction("standby_fraction", self.standby_fraction)
        fraction("standby_overhead", self.standby_overhead)


@dataclass(frozen=True)
class DRResult:
    """What a lost building costs under one strategy, GPU-days of the job's progress, and what the
    strategy costs whether or not the building is lost."""

    strategy: Strategy
    rpo_mean_s: float
    rpo_worst_s: float
    rto: RecoveryTime
    second_speed: float  # the second cluster's progress rate, fraction of the job's
    lost_progress_gpu_days: float  # work redone: the recovery point on every GPU
    idle_gpu_days: float  # the job's GPUs' worth of progress not made during the recovery time
    slow_gpu_days: float  # progress not made while running on the smaller cluster until the building returns
    warm_gpu_days: float  # the warm state over the run: standby GPUs x run days x overhead

    @property
    def loss_gpu_days(self) -> float:
        return self.lost_progress_gpu_days + self.idle_gpu_days + self.slow_gpu_days

    def expected_gpu_days(self, p_loss: float) -> float:
        """Warm state plus the loss weighted by the chance of losing the building during the run."""
        return self.warm_gpu_days + fraction("p_loss", p_loss) * self.loss_gpu_days


def assess(strategy: Strategy, n_gpus: int, run_days: float, outage_days: float, lag_s: float,
           detect_s: float, decide_s: float, stage_s: float, provision_s: float, restore_s: float, reform_s: float,
           second_speed: float) -> DRResult:
    """The bill of ``strategy`` for a job of ``n_gpus`` over ``run_days`` when the building is out for
    ``outage_days`` (from the loss; the job resumes at home when it returns if that is sooner than the
    recovery):

    * recovery point: :func:`recovery_point_s` with the copy's ``lag_s``; with no off-site copy the
      whole run so far is lost (half the run on average);
    * recovery time: detect + decide + (stage unless staged) + (provision unless a standby cluster) +
      restore + re-form, capped at the outage (past it the job simply resumes at home, from the
      off-site copy if one exists, from nothing if none);
    * while the building is out after the recovery, the job runs at ``second_speed`` (the second
      cluster's progress rate as a fraction of the job's, 0 with no GPUs): (1 - speed) of the job's
      GPU-days are not made, unless the work left (uniform over the run at a random loss time) ends
      on the second cluster first (its delay is then work left x (1 - speed) / speed);
    * the warm state: standby GPUs (standby_fraction x n) x run days x standby_overhead."""
    n = integer("n_gpus", n_gpus, 1)
    run = real("run_days", run_days, 0, low_open=True, unit="days")
    out = real("outage_days", outage_days, 0, unit="days")
    speed = fraction("second_speed", second_speed)
    for name, v in (("lag_s", lag_s), ("detect_s", detect_s), ("decide_s", decide_s), ("stage_s", stage_s),
                    ("provision_s", provision_s), ("restore_s", restore_s), ("reform_s", reform_s)):
        real(name, v, 0, unit="seconds")
    if strategy.replicate_every_s is None:
        rpo_mean, rpo_worst = run * DAY_S / 2.0, run * DAY_S
    else:
        rpo_mean, rpo_worst = recovery_point_s(strategy.replicate_every_s, lag_s)
    rto = RecoveryTime(detect_s, decide_s, 0.0 if strategy.staged else stage_s,
                       0.0 if strategy.standby_fraction > 0 else provision_s, restore_s, reform_s)
    down_s = min(rto.total_s, out * DAY_S)
    w = max(0.0, out * DAY_S - rto.total_s) / DAY_S  # days the building stays out after the recovery
    # The loss strikes at a uniform time, leaving R ~ U(0, run) days of work: on the second cluster the run falls
    # behind by (1 - s) w if the building returns first, by R (1 - s) / s if the run finishes there first.
    if speed == 0.0 or w == 0.0:
        slow_days = w
    elif speed * w >= run:
        slow_days = run / 2.0 * (1.0 - speed) / speed
    else:
        slow_days = ((1.0 - speed) * speed * w * w / 2.0 + (1.0 - speed) * w * (run - speed * w)) / run
    return DRResult(strategy, rpo_mean, rpo_worst, rto, speed,
                    lost_progress_gpu_days=n * rpo_mean / DAY_S, idle_gpu_days=n * down_s / DAY_S,
                    slow_gpu_days=n * slow_days,
                    warm_gpu_days=strategy.standby_fraction * n * run * strategy.standby_overhead)
