"""A goodput ledger: a seeded event log of a training run, and every second of it classified once.

* **The definition.** Goodput = the healthy-step time of the steps that survive into the final
  model, over the wall time the job *held* its GPUs (allocation to release). Steps redone after a
  rollback count once; the excess of a slow step over the healthy step is not goodput; time the
  job queued before it held anything is not in the denominator (it cost the fleet nothing).
* **The run** (:func:`simulate_run`): a start-up, then segments of ``interval_steps`` steps each
  closed by a blocking checkpoint write, with per-step durations from a seeded stream (the healthy
  step, plus straggler episodes that stretch consecutive steps, plus data stalls; drawn event by
  event, so millions of steps cost only their events).
  Failures arrive as a Poisson process in *running* time with mean ``mtbf_s``
  (:func:`lib.training.reliability.job_mtbf_s`), none during a restart or a planned stop, exactly
  the process :func:`lib.training.reliability.simulate_goodput` samples; a failure rewinds to the
  last completed checkpoint and costs detection, rescheduling and reload. Inline evaluations run
  after every ``eval_every`` checkpoints; planned maintenance stops the job after a checkpoint.
* **The ledger** (:func:`ledger`): the log's intervals tile [0, wall) with no gap and no overlap,
  and each interval's seconds go to exactly one of the five loss categories or to goodput (a kept
  compute segment splits into its healthy-step time and its excess), so the categories sum to the
  wall time and can be ranked and owned (:data:`OWNERS`).

SI units: seconds; GPU-hours where named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.search import largest_true

__all__ = [
    "CATEGORIES", "GOODPUT", "ITEMS", "Interval", "Ledger", "OWNERS", "RunLog", "RunSpec", "category_at",
    "goodput_definitions", "ledger", "simulate_run",
]

GOODPUT = "goodput"
CATEGORIES = ("scheduling and start-up", "checkpoint stalls", "failure losses", "slow steps",
              "evaluation, idle and maintenance")
OWNERS = {
    "scheduling and start-up": "cluster scheduler and platform (images, node health checks, launch)",
    "checkpoint stalls": "checkpointing and storage",
    "failure losses": "fleet reliability and the on-call infra engineer (detection, spares, restart path)",
    "slow steps": "training performance and the data pipeline (stragglers, loader stalls)",
    "evaluation, idle and maintenance": "the research team (evaluation cadence) and fleet operations (maintenance windows)",
}
# interval kind -> (category, item); a kept compute segment is split into goodput and "slow steps".
ITEMS = {
    "startup": ("scheduling and start-up", "allocation to first step"),
    "checkpoint": ("checkpoint stalls", "blocking writes"),
    "rewound": ("failure losses", "rewound work"),
    "lost write": ("failure losses", "rewound work"),
    "detect": ("failure losses", "detection"),
    "reschedule": ("failure losses", "rescheduling"),
    "reload": ("failure losses", "relaunch and reload"),
    "eval": ("evaluation, idle and maintenance", "inline evaluation"),
    "maintenance": ("evaluation, idle and maintenance", "planned maintenance"),
}


@dataclass(frozen=True)
class RunSpec:
    """One run's parameters (seconds unless named).

    work_steps: steps the final model needs; step_s: the healthy step; interval_steps: steps between
    checkpoints; checkpoint_s: blocking time of one write; mtbf_s: mean running time between
    failures; detect_s, reschedule_s, reload_s: a failure's restart; startup_s: allocation to the
    first step; stall_prob, stall_mean_s: chance that a step waits on the data loader, and the mean
    wait (exponential); straggler_episodes_per_day (per day of running), straggler_slowdown (step
    factor during an episode), straggler_episode_s (mean length until drained); eval_every: checkpoints
    between inline evaluations (0: none), eval_s; maintenance_per_day (per day of running), maintenance_s:
    a planned stop (taken after a checkpoint, so it rewinds nothing); queue_s: time queued before the
    allocation (not held, only for :func:`goodput_definitions`); n_gpus: GPUs held."""

    work_steps: int
    step_s: float
    interval_steps: int
    checkpoint_s: float
    mtbf_s: float
    detect_s: float = 0.0
    reschedule_s: float = 0.0
    reload_s: float = 0.0
    startup_s: float = 0.0
    stall_prob: float = 0.0
    stall_mean_s: float = 0.0
    straggler_episodes_per_day: float = 0.0
    straggler_slowdown: float = 1.0
    straggler_episode_s: float = 0.0
    eval_every: int = 0
    eval_s: float = 0.0
    maintenance_per_day: float = 0.0
    maintenance_s: float = 0.0
    queue_s: float = 0.0
    n_gpus: int = 1

    def __post_init__(self):
        integer("work_steps", self.work_steps, 1)
        real("step_s", self.step_s, 0, low_open=True, unit="seconds")
        integer("interval_steps", self.interval_steps, 1)
        real("checkpoint_s", self.checkpoint_s, 0, unit="seconds")
        real("mtbf_s", self.mtbf_s, 0, low_open=True, unit="seconds")
        for name in ("detect_s", "reschedule_s", "reload_s", "startup_s", "stall_mean_s", "straggler_episode_s",
                     "eval_s", "maintenance_s", "queue_s"):
            real(name, getattr(self, name), 0, unit="seconds")
        fraction("stall_prob", self.stall_prob)
        real("straggler_episodes_per_day", self.straggler_episodes_per_day, 0, unit="per day of running")
        real("straggler_slowdown", self.straggler_slowdown, 1.0, 10.0, unit="(step-time factor)")
        integer("eval_every", self.eval_every, 0)
        real("maintenance_per_day", self.maintenance_per_day, 0, unit="per day of running")
        integer("n_gpus", self.n_gpus, 1)
        if self.interval_steps * self.step_s + self.checkpoint_s >= 0.5 * self.mtbf_s:
            raise ValueError(f"a checkpoint segment ({self.interval_steps * self.step_s + self.checkpoint_s:.6g} s) "
                             f"must be under half the MTBF ({self.mtbf_s:.6g} s): the run would mostly rewind")

    @property
    def interval_s(self) -> float:
        """Healthy-step time between checkpoints: interval_steps x step_s."""
        return self.interval_steps * self.step_s

    @property
    def restart_s(self) -> float:
        """A failure's restart: detect + reschedule + reload."""
        return self.detect_s + self.reschedule_s + self.reload_s


@dataclass(frozen=True)
class Interval:
    """One stretch of wall time [start_s, end_s) of one kind (see :data:`ITEMS`; ``"compute"`` is a
    segment of steps). For compute: ``steps`` completed, ``ideal_s`` = steps x the healthy step,
    ``kept`` whether the segment survived into the final model (False: rewound by a failure)."""

    start_s: float
    end_s: float
    kind: str
    steps: int = 0
    ideal_s: float = 0.0
    kept: bool = False
    stall_s: float = 0.0  # of the compute time, data-loader stalls (the rest of the excess: straggler episodes)

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class RunLog:
    """The event log of one simulated run: contiguous intervals from 0 to ``wall_s``."""

    spec: RunSpec
    intervals: tuple[Interval, ...]
    failures: int
    checkpoints: int
    evals: int
    maintenances: int
    steps_executed: int  # every step that ran to completion, kept or rewound

    @property
    def wall_s(self) -> float:
        return self.intervals[-1].end_s if self.intervals else 0.0


class _StepStream:
    """Per-attempt step durations without drawing every step: the healthy step, times the slowdown
    inside straggler episodes (each step starts one with probability p, lengths geometric), plus a
    data stall on a step with probability q (exponential). Episode starts and stalls are drawn as
    geometric gaps between events (the same Bernoulli process), so a run of millions of steps costs
    its events, not its steps. ``cum(i)``: seconds of attempts [0, i)."""

    def __init__(self, spec: RunSpec, rng):
        import numpy as np

        self.spec, self.rng, self.n, self.pos = spec, rng, 0, 0
        self.stall_pos, self.stall_amt = np.empty(0, dtype=np.int64), np.empty(0)
        self.stall_cum = np.zeros(1)
        self.ep = []  # merged straggler episodes [lo, hi) in attempts
        self.ep_lo, self.ep_hi, self.ep_cum = np.empty(0), np.empty(0), np.zeros(1)
        s = spec
        self.p_ep = min(1.0, s.straggler_episodes_per_day * s.step_s / 86400.0) \
            if s.straggler_slowdown > 1 and s.straggler_episode_s > 0 else 0.0
        self.p_stall = s.stall_prob if s.stall_mean_s > 0 else 0.0
        self.excess = (s.straggler_slowdown - 1.0) * s.step_s
        self._extend(max(4096, s.work_steps + s.work_steps // 4))

    def _events(self, p: float, lo: int, hi: int):
        """Positions in [lo, hi) of a Bernoulli(p) process, by geometric gaps."""
        import numpy as np

        if p * (hi - lo) < 1e-9:  # no event expected (and numpy's geometric overflows for tiny p)
            return np.empty(0, dtype=np.int64)
        out, last = [], lo - 1
        while True:
            k = int((hi - last) * p * 1.2) + 16
            gaps = np.clip(self.rng.geometric(p, size=k), 1, hi - lo + 1)  # a gap past hi ends the draw either way
            pos = last + np.cumsum(gaps)
            out.append(pos[pos < hi])
            if pos[-1] >= hi:
                break
            last = int(pos[-1])
        return np.concatenate(out)

    def _extend(self, m: int) -> None:
        import numpy as np

        lo, hi = self.n, self.n + m
        stalls = self._events(self.p_stall, lo, hi)
        if stalls.size:
            self.stall_pos = np.concatenate([self.stall_pos, stalls])
            self.stall_amt = np.concatenate([self.stall_amt, self.rng.exponential(self.spec.stall_mean_s, stalls.size)])
            self.stall_cum = np.concatenate([[0.0], np.cumsum(self.stall_amt)])
        starts = self._events(self.p_ep, lo, hi)
        if starts.size:
            mean_len = max(1.0, self.spec.straggler_episode_s / self.spec.step_s)
            lengths = self.rng.geometric(1.0 / mean_len, size=starts.size)
            for a, b in zip(starts.tolist(), (starts + lengths).tolist(), strict=True):
                if self.ep and a <= self.ep[-1][1]:
                    self.ep[-1] = (self.ep[-1][0], max(self.ep[-1][1], b))
                else:
                    self.ep.append((a, b))
            self.ep_lo = np.array([e[0] for e in self.ep], dtype=float)
            self.ep_hi = np.array([e[1] for e in self.ep], dtype=float)
            self.ep_cum = np.concatenate([[0.0], np.cumsum(self.ep_hi - self.ep_lo)])
        self.n = hi

    def cum(self, i: int) -> tuple[float, float]:
        """(seconds, of which data stalls) of attempts [0, i)."""
        import numpy as np

        stall = float(self.stall_cum[np.searchsorted(self.stall_pos, i, side="left")])
        covered = 0.0
        k = int(np.searchsorted(self.ep_lo, i, side="right"))
        if k > 0:
            covered = float(self.ep_cum[k - 1]) + min(i, self.ep_hi[k - 1]) - self.ep_lo[k - 1]
        return i * self.spec.step_s + self.excess * covered + stall, stall

    def ensure(self, k: int) -> None:
        while self.pos + k > self.n:
            self._extend(max(4096, 2 * k, self.n // 2))

    def span(self, k: int) -> tuple[float, float]:
        """(duration, stall) of the next k attempts."""
        self.ensure(k)
        a, sa = self.cum(self.pos)
        b, sb = self.cum(self.pos + k)
        return b - a, sb - sa

    def completed_before(self, k: int, x: float) -> int:
        """How many of the next k attempts end within running time x (x below their total)."""
        c0 = self.cum(self.pos)[0]
        # the largest j in [0, k] with cum(pos + j) - c0 <= x; j = 0 holds (x >= 0) and is not called
        return largest_true(lambda j: self.cum(self.pos + j)[0] - c0 <= x, 1, k)

    def consume(self, k: int) -> None:
        self.pos += k


def simulate_run(spec: RunSpec, seed: int = 0) -> RunLog:
    """Simulate ``spec`` to the end (``work_steps`` kept, the last checkpoint written) and return
    its event log. Deterministic for a ``seed``. See the module docstring for the process."""
    import numpy as np

    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec, got {type(spec).__name__}")
    rng = np.random.default_rng(integer("seed", seed, 0))
    stream = _StepStream(spec, rng)
    out: list[Interval] = []
    append = out.append
    t = 0.0
    step_s, ck_s = spec.step_s, spec.checkpoint_s

    def add(kind, length):
        nonlocal t
        if length > 0:
            append(Interval(t, t + length, kind))
        t += length

    add("startup", spec.startup_s)
    x = rng.exponential(spec.mtbf_s)  # running time to the next failure
    maint_rate = spec.maintenance_per_day / 86400.0
    y = rng.exponential(1.0 / maint_rate) if maint_rate > 0 else math.inf  # running time to the next planned stop
    progress = failures = checkpoints = evals = maints = executed = 0

    def fail(run_s):  # a failure after ``run_s`` of running: restart, draw the next failure
        nonlocal x, y, failures
        failures += 1
        y -= run_s
        add("detect", spec.detect_s)
        add("reschedule", spec.reschedule_s)
        add("reload", spec.reload_s)
        x = rng.exponential(spec.mtbf_s)

    while progress < spec.work_steps:
        k = min(spec.interval_steps, spec.work_steps - progress)
        seg, stall = stream.span(k)
        if x < seg:  # a failure inside the compute: the segment's steps so far are rewound
            done = stream.completed_before(k, x)
            stream.consume(min(done + 1, k))
            executed += done
            if x > 0:
                append(Interval(t, t + x, "compute", done, done * step_s, False))
            t += x
            fail(x)
            continue
        stream.consume(k)
        executed += k
        if x < seg + ck_s:  # a failure during the write: the segment and the partial write are lost
            append(Interval(t, t + seg, "compute", k, k * step_s, False, stall))
            t += seg
            add("lost write", x - seg)
            fail(x)
            continue
        append(Interval(t, t + seg, "compute", k, k * step_s, True, stall))
        t += seg
        add("checkpoint", ck_s)
        checkpoints += 1
        progress += k
        ran = seg + ck_s
        x -= ran
        y -= ran
        if spec.eval_every and checkpoints % spec.eval_every == 0 and progress < spec.work_steps and spec.eval_s > 0:
            evals += 1
            if x < spec.eval_s:  # a failure during the evaluation: nothing rewinds (the checkpoint is written)
                add("eval", x)
                fail(x)
                continue
            add("eval", spec.eval_s)
            x -= spec.eval_s
            y -= spec.eval_s
        if y <= 0 and progress < spec.work_steps:
            maints += 1
            add("maintenance", spec.maintenance_s)
            x = rng.exponential(spec.mtbf_s)  # the restart after maintenance starts a fresh failure clock
            y = rng.exponential(1.0 / maint_rate)
    return RunLog(spec, tuple(out), failures, checkpoints, evals, maints, executed)


@dataclass(frozen=True)
class Ledger:
    """Seconds of wall time by category (:data:`CATEGORIES` and :data:`GOODPUT`), and by
    (category, item). ``seconds`` sums to ``wall_s``."""

    seconds: dict
    items: dict
    wall_s: float
    n_gpus: int
    double_counted_s: float = 0.0  # slow-step excess inside rewound work: what a second classification would add

    @property
    def goodput(self) -> float:
        return self.seconds[GOODPUT] / self.wall_s

    def fraction(self, category: str) -> float:
        if category not in self.seconds:
            raise ValueError(f"category must be one of {(GOODPUT,) + CATEGORIES}, got {category!r}")
        return self.seconds[category] / self.wall_s

    def gpu_hours(self, category: str) -> float:
        """GPU-hours of a category: seconds x GPUs / 3,600."""
        return self.fraction(category) * self.wall_s * self.n_gpus / 3600.0

    def ranked(self) -> list[tuple[str, float]]:
        """The loss categories, largest first: (category, fraction of wall time)."""
        return sorted(((c, self.fraction(c)) for c in CATEGORIES), key=lambda kv: -kv[1])


def ledger(log: RunLog) -> Ledger:
    """Classify every second of ``log`` exactly once. Raises ValueError if the intervals do not
    tile [0, wall) (a gap or an overlap: a second unclassified or classified twice)."""
    if not isinstance(log, RunLog):
        raise ValueError(f"log must be a RunLog, got {type(log).__name__}")
    secs = dict.fromkeys((GOODPUT,) + CATEGORIES, 0.0)
    items: dict = {}
    double = 0.0
    t = 0.0
    for iv in log.intervals:
        if not math.isclose(iv.start_s, t, rel_tol=0, abs_tol=1e-6 * max(1.0, t)) or iv.end_s < iv.start_s:
            raise ValueError(f"interval {iv.kind} at {iv.start_s:.6g} s does not start where the last ended ({t:.6g} s)")
        t = iv.end_s
        parts = []
        if iv.kind == "compute":
            if iv.kept:
                parts = [(GOODPUT, "healthy steps kept", iv.ideal_s),
                         ("slow steps", "straggler episodes", iv.length_s - iv.ideal_s - iv.stall_s),
                         ("slow steps", "data stalls", iv.stall_s)]
            else:
                parts = [("failure losses", "rewound work", iv.length_s)]
                double += max(0.0, iv.length_s - iv.ideal_s)
        elif iv.kind in ITEMS:
            cat, item = ITEMS[iv.kind]
            parts = [(cat, item, iv.length_s)]
        else:
            raise ValueError(f"unknown interval kind {iv.kind!r}")
        for cat, item, s in parts:
            secs[cat] += s
            items[(cat, item)] = items.get((cat, item), 0.0) + s
    return Ledger(secs, items, t, log.spec.n_gpus, double)


def category_at(log: RunLog, t_s: float) -> str:
    """The one category the second at ``t_s`` (0 <= t < wall) belongs to; a kept compute segment
    answers ``"goodput"`` (its slow-step excess is a share of it, not a separate stretch of time)."""
    import bisect

    t = real("t_s", t_s, 0, log.wall_s, high_open=True, unit="seconds")
    starts = [iv.start_s for iv in log.intervals]
    iv = log.intervals[bisect.bisect_right(starts, t) - 1]
    if iv.kind == "compute":
        return GOODPUT if iv.kept else "failure losses"
    return ITEMS[iv.kind][0]


def goodput_definitions(log: RunLog) -> dict[str, float]:
    """The same run under four definitions (fractions):

    * ``held`` (the one that survives): healthy-step time of kept steps / wall time held;
    * ``running``: the same numerator over running time only (start-up, restarts and maintenance
      left out of the denominator: it hides exactly the losses an operator can fix);
    * ``executed``: every step executed, redone ones included, x the healthy step / wall (counts
      rewound work as progress);
    * ``calendar``: kept healthy-step time / (queue + wall) (charges the job for a queue it did not hold)."""
    lg = ledger(log)
    idle_kinds = ("startup", "detect", "reschedule", "reload", "maintenance")
    running = lg.wall_s - sum(iv.length_s for iv in log.intervals if iv.kind in idle_kinds)
    good = lg.seconds[GOODPUT]
    return {"held": good / lg.wall_s, "running": good / running,
            "executed": log.steps_executed * log.spec.step_s / lg.wall_s,
            "calendar": good / (lg.wall_s + log.spec.queue_s)}

