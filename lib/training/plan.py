"""Planning a run from the training core: the searches a plan makes over :mod:`lib.training.step`.

* :func:`min_context_parallel`: the smallest context-parallel degree at which a layout's peak
  memory (:func:`lib.training.step.training_memory`) fits the GPU, the fleet held fixed (data
  parallelism gives up what context parallelism takes, as Llama 3 did at 128K tokens).
* Router imbalance under expert parallelism: :func:`ep_rank_loads` / :func:`ep_rank_load_ratio`
  (the busiest EP rank's expected tokens over the mean, from each expert's inclusion probability,
  :func:`lib.perf.moe_cost.zipf_inclusion_probabilities`), :func:`routed_expert_flops_share` and
  :func:`expert_imbalance_s` (the seconds the busiest rank adds to a step of
  :func:`lib.training.step.training_step`, whose all-to-all assumes a balanced router).
* :func:`best_fitting_layout`: among a layout's interleaving and recompute variants, the one with
  the highest MFU whose memory fits.
* :func:`run_schedule`: a run's calendar: pure compute from the fleet equation, then failures
  (:func:`lib.training.reliability.job_mtbf_s`), checkpoints at Young's interval and restarts turn
  it into wall time through :func:`lib.training.reliability.goodput`; the interruptions and
  checkpoints that wall time holds.

SI units: bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry.models import Model, model
from lib.training import flops, reliability
from lib.training.step import TrainingLayout, TrainingStep, training_memory, training_step

__all__ = [
    "EP_PLACEMENTS", "RunSchedule", "best_fitting_layout", "context_parallel_candidates", "ep_rank_load_ratio",
    "ep_rank_loads", "expected_nodes_touched", "expert_imbalance_s", "min_context_parallel", "routed_expert_flops_share",
    "run_schedule",
]

EP_PLACEMENTS = ("contiguous", "round_robin")


def context_parallel_candidates(layout: TrainingLayout, fixed_replicas: bool = True) -> list[int]:
    """Context-parallel degrees a search tries: the powers of two that divide ``seq_len`` (each
    rank holds seq_len / cp tokens) and, with ``fixed_replicas``, the layout's dp x cp (the
    replicas of each stage, kept constant: dp = dp x cp / cp)."""
    if not isinstance(layout, TrainingLayout):
        raise ValueError(f"layout must be a TrainingLayout, got {type(layout).__name__}")
    replicas = layout.dp * layout.cp
    out, cp = [], 1
    while cp <= layout.seq_len:
        if layout.seq_len % cp == 0 and (not fixed_replicas or replicas % cp == 0):
            out.append(cp)
        cp *= 2
    return out


def min_context_parallel(layout: TrainingLayout, fixed_replicas: bool = True, max_cp: int | None = None) -> TrainingLayout:
    """The layout with the smallest context-parallel degree (a power of two from
    :func:`context_parallel_candidates`, at most ``max_cp``) whose peak memory per GPU fits:
    ``training_memory(layout)["headroom"] >= 0``. With ``fixed_replicas`` the data-parallel
    degree becomes dp x cp / cp' so the fleet stays the same size. Raises ValueError, naming the
    largest degree tried and its shortfall, when none fits."""
    cands = context_parallel_candidates(layout, fixed_replicas)
    if max_cp is not None:
        cands = [c for c in cands if c <= integer("max_cp", max_cp, 1)]
    replicas = layout.dp * layout.cp
    best = None
    for cp in cands:
        lay = layout.replace(cp=cp, dp=replicas // cp if fixed_replicas else layout.dp)
        mem = training_memory(lay)
        if mem["headroom"] >= 0:
            return lay
        best = (cp, mem)
    if best is None:
        raise ValueError("no context-parallel degree to try: seq_len and dp x cp share no power of two")
    cp, mem = best
    raise ValueError(f"no context-parallel degree up to {cp} fits {layout.mdl.key} at {layout.seq_len:,} tokens on "
                     f"{layout.chip.name}: at cp={cp} a GPU needs {mem['total'] / 1e9:.1f} GB of "
                     f"{mem['capacity'] / 1e9:.1f} GB (more pipeline stages, recompute or more replicas help)")


def ep_rank_loads(pi, ep: int, placement: str = "contiguous"):
    """Expected tokens per token routed that each of ``ep`` expert-parallel ranks receives: the sum
    of its experts' inclusion probabilities ``pi`` (one per expert, summing to k; index 0 the most
    popular). ``contiguous``: rank r holds experts r E/ep .. (r + 1) E/ep - 1 (popular experts
    together: the worst placement); ``round_robin``: expert e on rank e mod ep. A numpy array of ep
    loads summing to k."""
    import numpy as np

    from lib.perf.moe_cost import _check_pi

    p = _check_pi(pi)
    ep = integer("ep", ep, 1)
    if p.size % ep:
        raise ValueError(f"ep={ep} must divide the {p.size} experts")
    if placement not in EP_PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(EP_PLACEMENTS)}; got {placement!r}")
    if placement == "contiguous":
        return p.reshape(ep, -1).sum(axis=1)
    return np.array([p[r::ep].sum() for r in range(ep)])


def ep_rank_load_ratio(pi, ep: int, placement: str = "contiguous") -> float:
    """The busiest expert-parallel rank's expected load over the mean, max(loads) x ep / k, for
    :func:`ep_rank_loads` (1 = balanced; ep = 1 gives 1; one expert per rank gives
    :func:`lib.perf.moe_cost.hottest_expert_load_ratio`)."""
    loads = ep_rank_loads(pi, ep, placement)
    return float(loads.max() * loads.size / loads.sum())


def routed_expert_flops_share(mdl: str | Model, seq_len: int, recompute: str = "none") -> float:
    """Fraction of the FLOPs a GPU executes per token that run in the routed experts:
    passes x 2 x k x params per expert x MoE layers / :func:`lib.training.flops.hardware_flops_per_token`,
    passes = 3 (forward and backward), 4 under full recompute (the re-run forward)."""
    from lib.perf.moe_cost import params_per_expert

    m = model(mdl)
    if not m.is_moe:
        raise ValueError(f"{m.key} is dense: it has no routed experts")
    passes = 4.0 if recompute == "full" else 3.0
    routed = 2.0 * m.experts_per_token * params_per_expert(m) * m.num_moe_layers
    return passes * routed / flops.hardware_flops_per_token(m, seq_len, recompute)


def expert_imbalance_s(step: TrainingStep, rank_load_ratio: float) -> float:
    """Seconds per step the busiest expert-parallel rank adds when it receives ``rank_load_ratio``
    x the mean tokens: its routed-expert share of the matmul and non-matmul time
    (:func:`routed_expert_flops_share`) and the all-to-all it receives, each x (ratio - 1). The
    other ranks wait at the next collective, so the whole step pays it."""
    if not isinstance(step, TrainingStep):
        raise ValueError(f"step must be a TrainingStep, got {type(step).__name__}")
    r = real("rank_load_ratio", rank_load_ratio, 1.0)
    lay = step.layout
    share = routed_expert_flops_share(lay.mdl, lay.seq_len, lay.recompute)
    return (r - 1.0) * ((step.matmul_s + step.nonmatmul_s) * share + step.ep_exposed_s)


def expected_nodes_touched(num_experts: int, experts_per_token: int, nodes: int) -> float:
    """Expected distinct nodes one token's k experts land on when the E experts are spread evenly
    over ``nodes`` nodes and the router picks k distinct experts uniformly:
    nodes x (1 - C(E - E/nodes, k) / C(E, k)) (exact, hypergeometric). The all-to-all crosses the
    network once per node touched besides the token's own (with per-node deduplication)."""
    from math import comb

    e = integer("num_experts", num_experts, 1)
    k = integer("experts_per_token", experts_per_token, 1)
    n = integer("nodes", nodes, 1)
    if k > e:
        raise ValueError(f"experts_per_token must be at most num_experts={e}, got {k}")
    if e % n:
        raise ValueError(f"nodes={n} must divide the {e} experts")
    return n * (1.0 - comb(e - e // n, k) / comb(e, k))


def best_fitting_layout(layout: TrainingLayout, interleaves=None, recomputes=("none", "selective", "full")) -> TrainingLayout:
    """The variant of ``layout`` with the highest :func:`lib.training.step.training_step` MFU whose
    :func:`lib.training.step.training_memory` fits, over ``interleaves`` (default: every v with
    pp x v at most the layers; just 1 when pp = 1) and ``recomputes``. Raises ValueError when none fits."""
    if not isinstance(layout, TrainingLayout):
        raise ValueError(f"layout must be a TrainingLayout, got {type(layout).__name__}")
    if interleaves is None:
        interleaves = range(1, layout.mdl.num_layers // layout.pp + 1) if layout.pp > 1 else (1,)
    best, best_mfu = None, -1.0
    for v in interleaves:
        for rc in recomputes:
            lay = layout.replace(interleave=v, recompute=rc)
            if training_memory(lay)["headroom"] < 0:
                continue
            mfu = training_step(lay).mfu
            if mfu > best_mfu:
                best, best_mfu = lay, mfu
    if best is None:
        raise ValueError(f"no interleaving or recompute variant of {layout.label} fits in {layout.chip.name}'s memory")
    return best


@dataclass(frozen=True)
class RunSchedule:
    """A run's calendar (seconds): pure compute, and what failures and checkpoints make of it."""

    compute_s: float  # the fleet equation: C / (GPUs x peak x MFU)
    n_gpus: int
    mtbf_s: float  # the job's mean time between interruptions
    checkpoint_s: float  # blocking time per checkpoint
    restart_s: float  # detection + rescheduling + initialisation + reload, per interruption
    interval_s: float  # work between checkpoints (Young's optimum unless given)
    losses: reliability.Goodput

    @property
    def goodput(self) -> float:
        return self.losses.goodput

    @property
    def wall_s(self) -> float:
        """Wall time: compute / goodput (first order: the losses are fractions of wall time)."""
        return self.compute_s / self.goodput

    @property
    def interruptions(self) -> float:
        """Expected interruptions over the wall time: wall / MTBF."""
        return self.wall_s / self.mtbf_s

    @property
    def interruptions_compute_only(self) -> float:
        """Interruptions over the pure-compute time alone (the naive count): compute / MTBF."""
        return self.compute_s / self.mtbf_s

    @property
    def checkpoints(self) -> float:
        """Checkpoints written: compute / interval (one per interval of useful work, redone ones excluded)."""
        return self.compute_s / self.interval_s


def run_schedule(total_flops: float, n_gpus: int, chip, mfu: float, checkpoint_s: float, restart_s: float,
                 rate_per_gpu_s: float | None = None, interval_s: float | None = None, dtype: str = "bf16") -> RunSchedule:
    """The calendar of a run of ``total_flops`` on ``n_gpus`` at ``mfu``:
    compute = :func:`lib.training.flops.training_time_s`; MTBF = :func:`lib.training.reliability.job_mtbf_s`
    (``rate_per_gpu_s`` default Llama 3's); the interval = ``interval_s`` or Young's sqrt(2 C M); the
    losses = :func:`lib.training.reliability.goodput`; wall = compute / goodput."""
    compute = flops.training_time_s(total_flops, n_gpus, chip, mfu, dtype)
    mtbf = reliability.job_mtbf_s(n_gpus, rate_per_gpu_s)
    c = real("checkpoint_s", checkpoint_s, 0, low_open=True, unit="seconds")
    tau = reliability.young_interval_s(c, mtbf) if interval_s is None else real("interval_s", interval_s, 0,
                                                                                 low_open=True, unit="seconds")
    g = reliability.goodput(tau, c, mtbf, restart_s)
    if g.goodput <= 0:
        raise ValueError(f"the run never finishes: checkpoints and failures take all the time (lost {g.lost:.0%})")
    return RunSchedule(compute, n_gpus, mtbf, c, float(restart_s), tau, g)
