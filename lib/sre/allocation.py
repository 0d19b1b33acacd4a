"""Allocated versus utilized GPUs (N049): where a fleet's gap comes from, and what closes it.

*Allocated* means the scheduler handed a GPU to a job; *utilized* means the GPU did work. The page
measures work with DCGM's profiling counters, per GPU and per minute:

* ``gpu_util`` (``DCGM_FI_DEV_GPU_UTIL``, NVML's utilization): the fraction of time at least one
  kernel ran. It says nothing about how much of the GPU the kernel used.
* ``sm_active`` (``DCGM_FI_PROF_SM_ACTIVE``): the fraction of time at least one warp was resident on
  an SM, averaged over the SMs. NVIDIA's guidance: 0.8 or more is necessary (not sufficient) for
  effective use; under 0.5 likely means ineffective use.
* ``tensor_active`` (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``): the fraction of cycles the tensor pipe
  was busy: how hard the matrix math runs.
* ``fb_used`` (``DCGM_FI_DEV_FB_USED`` over the total, a fraction) and ``process`` (a CUDA process
  holds a context on the GPU, NVML's running compute processes): whether anything is there at all.

The fleet's **utilized** share is the SM-active GPU-time over the fleet's GPU-time; the **gap** is
allocated minus utilized, in points of the fleet. :func:`fleet_telemetry` draws seeded per-minute
series for a mix of jobs (:data:`KINDS`: healthy training, a loader-bound run, idle notebooks,
placeholders, and a launch-bound service as the alternative), :func:`classify` names a job's cause
from its three metrics plus memory and process, and the policy functions price what each fix
recovers: :func:`reclaim_minutes` (idle reclaim after N minutes, checked against the closed form
:func:`expected_reclaim_fraction`), and :func:`policy_points` for the whole set, applied in turn so
no GPU-minute is recovered twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = ["CAUSES", "KINDS", "Job", "Profile", "classify", "expected_gap", "expected_reclaim_fraction", "fleet_gap",
           "fleet_telemetry", "job_series", "POLICIES", "policy_points", "reclaim_minutes", "tenant_table"]

KINDS = ("training", "loader_bound", "notebook", "placeholder", "launch_bound")
CAUSES = {
    "training": "working",
    "loader_bound": "input-bound: works in bursts, waits on data",
    "notebook": "idle: holds memory and a process, runs nothing",
    "placeholder": "placeholder: allocated, nothing running",
    "launch_bound": "launch-bound: kernels too small to fill the GPU",
}
METRICS = ("gpu_util", "sm_active", "tensor_active", "fb_used", "process")


@dataclass(frozen=True)
class Job:
    """One allocation: its tenant, its kind (one of :data:`KINDS`) and its GPUs."""

    tenant: str
    kind: str
    gpus: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        integer("gpus", self.gpus, 1)


@dataclass(frozen=True)
class Profile:
    """What each kind of job looks like to DCGM (fractions).

    ``sm_busy`` / ``tensor_busy``: SM- and tensor-active of a training step while the GPU computes;
    ``loader_tensor``: the loader-bound run's tensor-active (its duty cycle is loader_tensor /
    tensor_busy); ``notebook_active``: the fraction of minutes an interactive notebook runs a cell,
    in sessions of ``session_min`` minutes on average; ``launch_sm``: SM-active of a launch-bound
    service whose GPU_UTIL reads near 1.
    """

    sm_busy: float = 0.9
    tensor_busy: float = 0.5
    loader_tensor: float = 0.2
    notebook_active: float = 0.05
    session_min: float = 20.0
    launch_sm: float = 0.3

    def __post_init__(self):
        for name in ("sm_busy", "tensor_busy", "notebook_active", "launch_sm"):
            fraction(name, getattr(self, name), allow_zero=False)
        real("loader_tensor", self.loader_tensor, 0, self.tensor_busy, low_open=True,
             unit=f"(at most tensor_busy = {self.tensor_busy})")
        real("session_min", self.session_min, 1, unit="minutes")
        if self.notebook_active >= 1:
            raise ValueError(f"notebook_active must be below 1, got {self.notebook_active!r}")

    @classmethod
    def from_assumptions(cls, **overrides) -> Profile:
        """The book's values (``sre.train_sm_busy``, ``train_tensor_busy``, ``notebook_active_fraction``,
        ``notebook_session_min``), with ``overrides``."""
        from lib.registry import assumptions

        base = {"sm_busy": assumptions.value("sre.train_sm_busy"),
                "tensor_busy": assumptions.value("sre.train_tensor_busy"),
                "notebook_active": assumptions.value("sre.notebook_active_fraction"),
                "session_min": float(assumptions.value("sre.notebook_session_min"))}
        return cls(**{**base, **overrides})

    @property
    def loader_duty(self) -> float:
        """The loader-bound run's busy fraction: loader_tensor / tensor_busy."""
        return self.loader_tensor / self.tensor_busy


def _notebook_active(minutes: int, p: Profile, rng, warmup: int) -> np.ndarray:
    """A two-state chain per minute (active sessions of mean ``session_min``; idle stretches sized so
    the stationary active fraction is ``notebook_active``), started from its stationary law: runs of
    geometric lengths (the chain's holding times), alternating, the first state drawn stationary."""
    a = 1.0 / p.session_min                                  # active -> idle, per minute
    b = a * p.notebook_active / (1 - p.notebook_active)      # idle -> active, per minute
    n = minutes + warmup
    state = rng.random() < p.notebook_active
    runs, states, total = [], [], 0
    while total < n:
        k = 64 + int(4 * n * max(a, b))  # a batch of alternating runs
        act = rng.geometric(a, k)
        idl = rng.geometric(b, k)
        first, second = (act, idl) if state else (idl, act)
        lengths = np.empty(2 * k, dtype=np.int64)
        lengths[0::2], lengths[1::2] = first, second
        runs.append(lengths)
        states.append(np.tile([state, not state], k))
        total += int(lengths.sum())
    lengths, flags = np.concatenate(runs), np.concatenate(states)
    return np.repeat(flags, lengths)[:n]


def job_series(kind: str, minutes: int, rng, profile: Profile | None = None, warmup: int = 0) -> dict:
    """Per-minute DCGM series of one GPU of a ``kind`` job (module docstring): arrays of ``minutes``
    values for each of ``gpu_util, sm_active, tensor_active, fb_used, process``. ``warmup`` minutes
    of a notebook's history are drawn and kept under ``"history"`` (the idle run before the window)."""
    p = profile or Profile()
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    m = integer("minutes", minutes, 1)
    noise = rng.normal(0.0, 0.02, m)
    out: dict = {}
    if kind in ("training", "loader_bound"):
        base = 0.97 if kind == "training" else p.loader_duty
        duty = np.clip(base + noise, 0.0, 1.0)
        out = {"gpu_util": np.clip(duty + 0.02, 0, 1), "sm_active": duty * p.sm_busy,
               "tensor_active": duty * p.tensor_busy, "fb_used": np.full(m, 0.9), "process": np.ones(m)}
    elif kind == "notebook":
        state = _notebook_active(m, p, rng, warmup)
        act = state[warmup:]
        duty = np.where(act, rng.uniform(0.3, 0.9, m), 0.0)
        out = {"gpu_util": duty, "sm_active": duty * p.sm_busy, "tensor_active": duty * 0.3,
               "fb_used": np.full(m, 0.5), "process": np.ones(m), "history": state[:warmup]}
    elif kind == "placeholder":
        z = np.zeros(m)
        out = {"gpu_util": z, "sm_active": z.copy(), "tensor_active": z.copy(), "fb_used": z.copy(),
               "process": z.copy()}
    else:  # launch_bound: a kernel is always running, each too small to fill the SMs
        out = {"gpu_util": np.clip(0.95 + noise / 2, 0, 1), "sm_active": np.clip(p.launch_sm + noise, 0, 1),
               "tensor_active": np.clip(0.25 * p.launch_sm + noise / 4, 0, 1), "fb_used": np.full(m, 0.8),
               "process": np.ones(m)}
    return out


def fleet_telemetry(jobs, minutes: int, seed: int = 0, profile: Profile | None = None,
                    warmup: int = 1440) -> list[tuple[Job, dict]]:
    """Per-minute series for every job (one representative GPU per job: a job's GPUs move together)."""
    rng = np.random.default_rng(seed)
    return [(job, job_series(job.kind, minutes, rng, profile, warmup if job.kind == "notebook" else 0))
            for job in jobs]


def classify(series: dict, sm_ok: float = 0.8, idle: float = 0.1) -> str:
    """The cause of a job's allocated-not-used time, from its metrics' means (one of :data:`CAUSES`'
    values): no process and no memory: a placeholder; a process but SM-active under ``idle``: idle;
    GPU_UTIL far above SM-active (a kernel always running, SMs mostly empty): launch-bound; SM-active
    under ``sm_ok`` (NVIDIA's 'necessary for effective use') with GPU_UTIL tracking it (the GPU sits
    empty between bursts): input-bound; otherwise working."""
    mean = {k: float(np.mean(series[k])) for k in METRICS}
    if mean["process"] < 0.1 and mean["fb_used"] < 0.05:
        return CAUSES["placeholder"]
    if mean["sm_active"] < idle:
        return CAUSES["notebook"]
    if mean["gpu_util"] - mean["sm_active"] > 0.4:
        return CAUSES["launch_bound"]
    if mean["sm_active"] < sm_ok:
        return CAUSES["loader_bound"]
    return CAUSES["training"]


def fleet_gap(telemetry, fleet_gpus: int) -> dict:
    """Allocated share, utilized share (SM-active GPU-time / fleet GPU-time) and their gap, fractions."""
    n = integer("fleet_gpus", fleet_gpus, 1)
    alloc = sum(job.gpus for job, _ in telemetry)
    if alloc > n:
        raise ValueError(f"fleet_gpus must hold the jobs' {alloc} GPUs, got {n}")
    used = sum(job.gpus * float(np.mean(s["sm_active"])) for job, s in telemetry)
    return {"allocated": alloc / n, "utilized": used / n, "gap": (alloc - used) / n,
            "tensor": sum(job.gpus * float(np.mean(s["tensor_active"])) for job, s in telemetry) / n}


def tenant_table(telemetry, fleet_gpus: int) -> list[dict]:
    """Per tenant: GPUs, each metric's GPU-weighted mean, the gap points it owns, and the cause that
    owns most of its gap (by :func:`classify` on each job)."""
    tenants: dict = {}
    for job, s in telemetry:
        t = tenants.setdefault(job.tenant, {"tenant": job.tenant, "gpus": 0, "gap_by_cause": {},
                                            **{k: 0.0 for k in METRICS}})
        t["gpus"] += job.gpus
        for k in METRICS:
            t[k] += job.gpus * float(np.mean(s[k]))
        cause = classify(s)
        idle = job.gpus * (1 - float(np.mean(s["sm_active"])))
        t["gap_by_cause"][cause] = t["gap_by_cause"].get(cause, 0.0) + idle
    rows = []
    for t in tenants.values():
        for k in METRICS:
            t[k] /= t["gpus"]
        t["gap_pts"] = 100 * sum(t["gap_by_cause"].values()) / fleet_gpus
        t["cause"] = max(t["gap_by_cause"], key=t["gap_by_cause"].get)
        rows.append(t)
    return sorted(rows, key=lambda r: -r["gap_pts"])


def reclaim_minutes(sm_active, idle_min: int, threshold: float = 0.05, history=None) -> int:
    """Minutes an idle-reclaim policy returns: every minute that is idle (SM-active under
    ``threshold``) and preceded by at least ``idle_min`` idle minutes (the policy fires after
    ``idle_min`` idle minutes and holds the GPU back until the job is active again). ``history``:
    booleans, True for active minutes before the window (an idle run may start before it).

    Per idle run of length L with c idle minutes already behind it: max(0, L - max(0, idle_min - c))."""
    n = integer("idle_min", idle_min, 0, unit="minutes")
    idle = np.asarray(sm_active) < threshold
    if not idle.any():
        return 0
    before = 0
    if history is not None and len(history):
        h = np.asarray(history, dtype=bool)
        active = np.nonzero(h)[0]
        before = len(h) - 1 - int(active[-1]) if len(active) else len(h)
    edges = np.diff(np.concatenate(([0], idle.astype(np.int8), [0])))
    starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
    lengths = ends - starts
    behind = np.where(starts == 0, before, 0)
    return int(np.maximum(0, lengths - np.maximum(0, n - behind)).sum())


def expected_reclaim_fraction(active: float, session_min: float, idle_min: float) -> float:
    """The closed form of :func:`reclaim_minutes` for the notebook chain, per minute of the window:
    P(idle now and the previous N minutes idle) = (1 - f) (1 - b)^N, with f the active fraction,
    a = 1 / session the chance an active minute ends its session, b = a f / (1 - f) the chance an
    idle minute starts one (the chain is reversible, so looking back is like looking forward)."""
    f = fraction("active", active, allow_zero=False)
    if f >= 1:
        raise ValueError(f"active must be below 1, got {active!r}")
    s = real("session_min", session_min, 1, unit="minutes")
    n = real("idle_min", idle_min, 0, unit="minutes")
    b = (1 / s) * f / (1 - f)
    return (1 - f) * (1 - b) ** n


POLICIES = ("reclaim", "preempt", "loader", "quota")


def policy_points(telemetry, fleet_gpus: int, idle_min: int = 30, backfill: float = 0.8,
                  quota: float = 0.25, profile: Profile | None = None, order=POLICIES) -> list[dict]:
    """Gap points each policy recovers (``order``: a sequence of :data:`POLICIES`):

    * ``reclaim``: idle reclaim of interactive jobs (those :func:`classify` calls idle) after
      ``idle_min`` idle minutes: those GPU-minutes go back to the pool, so they leave *allocated*
      (placeholders are exempt: they hold capacity on purpose);
    * ``preempt``: placeholders become preemptible, and preemptible work backfills their GPUs a
      ``backfill`` fraction of the time at a healthy SM-active (0.97 ``sm_busy``): *utilized* rises;
    * ``loader``: the input-bound run reaches the healthy duty cycle on the same GPUs;
    * ``quota``: a quota on allocated-not-used: each tenant's idle allocation still above ``quota``
      of its allocation is handed back (the tenant shrinks its request).

    Each row: ``policy``, ``alone`` and ``in_turn`` (points of the fleet recovered by the policy by
    itself, and after the ones before it in ``order``, so no GPU-minute counts twice), and
    ``gpu_hours_per_day`` (in turn).
    """
    p = profile or Profile()
    n = integer("fleet_gpus", fleet_gpus, 1)
    backfill = fraction("backfill", backfill)
    quota = fraction("quota", quota)
    idle_min = integer("idle_min", idle_min, 0, unit="minutes")
    for name in order:
        if name not in POLICIES:
            raise ValueError(f"order must hold policies from {', '.join(POLICIES)}, got {name!r}")
    healthy_sm = 0.97 * p.sm_busy
    minutes = len(telemetry[0][1]["sm_active"])
    causes = [classify(s) for _, s in telemetry]

    def fresh() -> dict:  # idle GPU-fractions of the window per job, before any policy
        return {i: job.gpus * (1 - float(np.mean(s["sm_active"]))) for i, (job, s) in enumerate(telemetry)}

    def apply(name: str, left: dict) -> float:
        got = 0.0
        if name == "quota":
            by_tenant: dict = {}
            for i, (job, _) in enumerate(telemetry):
                t = by_tenant.setdefault(job.tenant, [0, 0.0, []])
                t[0] += job.gpus
                t[1] += left[i]
                t[2].append(i)
            for alloc, idle, members in by_tenant.values():
                over = max(0.0, idle - quota * alloc)
                for i in members:  # hand back in proportion to each job's idle share
                    left[i] -= over * left[i] / idle if idle else 0.0
                got += over
            return got
        for i, (job, s) in enumerate(telemetry):
            if name == "reclaim" and causes[i] == CAUSES["notebook"]:
                r = job.gpus * reclaim_minutes(s["sm_active"], idle_min, history=s.get("history")) / minutes
            elif name == "preempt" and causes[i] == CAUSES["placeholder"]:
                r = job.gpus * backfill * healthy_sm
            elif name == "loader" and causes[i] == CAUSES["loader_bound"]:
                r = job.gpus * max(0.0, healthy_sm - float(np.mean(s["sm_active"])))
            else:
                continue
            r = min(r, left[i])
            left[i] -= r
            got += r
        return got

    labels = {"reclaim": f"idle reclaim after {idle_min} minutes",
              "preempt": f"preemptible placeholders, backfilled {backfill:.0%} of the time",
              "loader": "loader fixes: the input-bound run at a healthy duty cycle",
              "quota": f"quota: idle allocation above {quota:.0%} of a tenant's handed back"}
    rows, left = [], fresh()
    for name in order:
        alone = apply(name, fresh())
        in_turn = apply(name, left)
        rows.append({"policy": name, "label": labels[name], "alone": 100 * alone / n, "in_turn": 100 * in_turn / n,
                     "gpu_hours_per_day": in_turn * 24})
    return rows


def expected_gap(gpus_by_kind: dict, fleet_gpus: int, profile: Profile | None = None, idle_min: int = 30,
                 backfill: float = 0.8) -> dict:
    """The closed form of the simulated fleet: each kind's expected SM-active (training 0.97 sm_busy,
    loader-bound loader_duty x sm_busy, notebook f x 0.6 x sm_busy (cells run at a duty drawn
    uniformly in [0.3, 0.9]), placeholder 0, launch-bound launch_sm), the gap points each kind owns,
    and the points reclaim (:func:`expected_reclaim_fraction`), preemptible placeholders and loader
    fixes recover. ``gpus_by_kind``: kind -> GPUs."""
    p = profile or Profile()
    n = integer("fleet_gpus", fleet_gpus, 1)
    for kind, g in gpus_by_kind.items():
        if kind not in KINDS:
            raise ValueError(f"gpus_by_kind keys must be from {', '.join(KINDS)}, got {kind!r}")
        integer(f"gpus_by_kind[{kind!r}]", g, 0)
    alloc = sum(gpus_by_kind.values())
    if alloc > n:
        raise ValueError(f"fleet_gpus must hold the {alloc} GPUs allocated, got {n}")
    healthy = 0.97 * p.sm_busy
    sm = {"training": healthy, "loader_bound": p.loader_duty * p.sm_busy,
          "notebook": p.notebook_active * 0.6 * p.sm_busy, "placeholder": 0.0, "launch_bound": p.launch_sm}
    g = {k: gpus_by_kind.get(k, 0) for k in KINDS}
    used = sum(g[k] * sm[k] for k in KINDS)
    owned = {k: 100 * g[k] * (1 - sm[k]) / n for k in KINDS}
    reclaim = g["notebook"] * expected_reclaim_fraction(p.notebook_active, p.session_min, idle_min)
    return {"allocated": alloc / n, "utilized": used / n, "gap_pts": 100 * (alloc - used) / n, "owned_pts": owned,
            "sm_active": sm,
            "recovered_pts": {"reclaim": 100 * reclaim / n,
                              "preempt": 100 * g["placeholder"] * fraction("backfill", backfill) * healthy / n,
                              "loader": 100 * g["loader_bound"] * (healthy - sm["loader_bound"]) / n}}
