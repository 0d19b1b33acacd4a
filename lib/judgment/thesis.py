"""Theses about where the constraint sits, as functions of data: each claim, the arithmetic under it,
and the input at which its counterargument wins.

A thesis here is not a sentence: it is a function of ``data/hardware.yaml`` and ``data/models.yaml``
that the book's models evaluate, so a page can say where the claim stops holding.

* **The ridge rises** (:func:`ridge_trend`, :func:`decode_compute_bound_batch`,
  :func:`compute_bound_context_limit`): peak FLOP/s over HBM bandwidth per generation
  (:func:`lib.perf.roofline.ridge_point`, :func:`lib.perf.datasheet.spec_ratios`), and the decode
  batch at which the step reaches the ridge (:func:`lib.perf.prefill.decode_ridge_batch`): the
  counterargument "batch it and decode is compute-bound" wins above that batch, and only below the
  context :func:`lib.perf.prefill.max_context_for_ridge`.
* **At long context the KV cache sets the batch** (:func:`batch_limits`, :func:`kv_binding_context`):
  the three limits on a replica's decode batch (:func:`lib.scheduling.replica.batch_limits`: KV
  capacity from the memory budget on driver-visible memory, the largest batch whose step meets a
  per-token latency target, the engine's ``max_num_seqs``) and the context above which the KV
  ceiling is the smallest of them.

SI units: FLOP/s, bytes/s, seconds, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.perf import datasheet, roofline
from lib.perf.deployment import Deployment
from lib.registry.hardware import GPU
from lib.registry.hardware import gpu as gpu_spec
from lib.registry.models import Model, model
from lib.search import smallest_true


@dataclass(frozen=True)
class GenerationStep:
    """One step between two chips: new / old for dense peak FLOP/s and HBM bandwidth, and the ridges."""

    old: str
    new: str
    flops_ratio: float
    bandwidth_ratio: float
    ridge_old: float  # FLOP/byte
    ridge_new: float  # FLOP/byte

    @property
    def ridge_ratio(self) -> float:
        """How much the ridge moved: flops_ratio / bandwidth_ratio (> 1: it rose)."""
        return self.ridge_new / self.ridge_old

    @property
    def ridge_rose(self) -> bool:
        return self.ridge_new > self.ridge_old


def ridge_trend(chips: list[str] | tuple[str, ...], dtype: str = "bf16") -> list[GenerationStep]:
    """Consecutive steps of ``chips`` (in the order given): the FLOP/s and bandwidth ratios
    (:func:`lib.perf.datasheet.spec_ratios`) and the ridge point before and after
    (:func:`lib.perf.roofline.ridge_point`, dense peak in ``dtype`` over HBM bytes/s, FLOP/byte).

    The ridge rises across a step exactly when FLOP/s grew faster than bandwidth. A chip without a
    dense peak in ``dtype`` raises ValueError (from the registry)."""
    names = [str(c) for c in chips]
    if len(names) < 2:
        raise ValueError(f"chips must name at least two GPUs, got {chips!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"chips must be distinct, got {chips!r}")
    steps = []
    for a, b in zip(names, names[1:], strict=False):
        r = datasheet.spec_ratios(a, b, dtype)
        steps.append(GenerationStep(a, b, r["flops"], r["bandwidth"], roofline.ridge_point(a, dtype),
                                    roofline.ridge_point(b, dtype)))
    return steps


def decode_compute_bound_batch(mdl: str | Model, chip: str | GPU, context: int, weight_dtype: str = "bf16",
                               kv_dtype: str = "bf16") -> float:
    """Smallest whole decode batch at which the step reaches the chip's ridge point (per GPU, tp = 1), in the
    dtype the matmuls run in (:func:`lib.perf.datasheet.matmul_dtype`): ``ceil`` of
    :func:`lib.perf.prefill.decode_ridge_batch`, the home of that balance. Above it the step is compute-bound
    on the roofline.

    The weights are shared by the batch, the KV read is not: when the KV term alone asks for more bytes per
    FLOP than the chip supplies, no batch gets there and the result is ``inf``."""
    from lib.perf import prefill

    m = model(mdl)
    ctx = integer("context", context, 0)
    m.check_context(max(ctx, 1), "context")
    try:
        b = prefill.decode_ridge_batch(m, chip, ctx, 1, weight_dtype, kv_dtype, datasheet.matmul_dtype(weight_dtype, chip))
    except ValueError:  # the bisection found no crossing: the KV floor sits at the supply
        return math.inf
    return float(math.ceil(b)) if math.isfinite(b) else math.inf


def compute_bound_context_limit(mdl: str | Model, chip: str | GPU, weight_dtype: str = "bf16",
                                kv_dtype: str = "bf16") -> float:
    """Longest whole context (tokens) at which SOME batch makes decode compute-bound:
    :func:`lib.perf.prefill.max_context_for_ridge` (the home of that limit), floored, capped at the model's
    maximum context, and stepped down past the few tokens its closed form gains by neglecting the embedding row
    (so that :func:`decode_compute_bound_batch` is finite at the result and ``inf`` one token above it). Above
    it, decode is memory-bound at every batch."""
    from lib.perf import prefill

    m = model(mdl)
    top = int(m.max_position_embeddings)
    lim = prefill.max_context_for_ridge(m, chip, 1, kv_dtype, datasheet.matmul_dtype(weight_dtype, chip))
    c = top if not math.isfinite(lim) else min(top, int(math.floor(lim)))
    while c > 0 and math.isinf(decode_compute_bound_batch(m, chip, c, weight_dtype, kv_dtype)):
        c -= 1
    return float(c)


@dataclass(frozen=True)
class BatchLimits:
    """The three limits on one replica's decode batch at ``context`` tokens (sequences, fractional), named for
    the page: a view of :class:`lib.scheduling.replica.BatchLimits` (by_kv, by_tpot, by_engine)."""

    context: int
    kv: float  # sequences whose KV cache the memory budget holds
    latency: float  # largest batch whose modelled step meets the per-token target (0: not even batch 1)
    engine: float  # max_num_seqs

    @property
    def binding(self) -> str:
        """Which limit is smallest: 'KV capacity', 'latency target' or 'engine cap' (a tie goes to KV)."""
        return min((self.kv, "KV capacity"), (self.latency, "latency target"), (self.engine, "engine cap"))[1]

    @property
    def batch(self) -> float:
        return min(self.kv, self.latency, self.engine)


def batch_limits(dep: Deployment, context: int, tpot_s: float, cost=None) -> BatchLimits:
    """:func:`lib.scheduling.replica.batch_limits` (KV ceiling from the memory budget, the batch
    :func:`lib.perf.throughput.batch_for_step_time` allows at ``tpot_s`` seconds per step, 0 when even batch 1
    misses it, and ``max_num_seqs``), renamed for the page. ``cost``: the replica's
    :func:`lib.scheduling.cost.step_cost` table, which reads the latency batch off the tabulated step instead of
    bisecting on it (the same step model within 0.1%; a target past the table's ``max_num_seqs`` gives
    ``inf``, where the engine cap binds anyway)."""
    from lib.scheduling import replica

    ctx = integer("context", context, 1)
    model(dep.model).check_context(ctx, "context")
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    r = replica.batch_limits(dep, ctx, t, cost=cost)
    return BatchLimits(ctx, float(r.by_kv), float(r.by_tpot), float(r.by_engine))


def kv_binds(dep: Deployment, context: int, tpot_s: float, cost=None) -> bool:
    """Whether the KV ceiling is the binding limit of :func:`batch_limits` at ``context``:
    ``kv <= min(latency, engine)``, a latency target that batch 1 misses counting as no limit (no batch fixes
    it, so the KV ceiling is still what limits the batch the replica holds)."""
    lim = batch_limits(dep, context, tpot_s, cost)
    return lim.kv <= min(lim.latency if lim.latency > 0 else math.inf, lim.engine)


def kv_binding_context(dep: Deployment, tpot_s: float, low: int = 1, high: int | None = None, cost=None) -> float:
    """Shortest context (tokens) in [low, high] at which the KV ceiling is the binding limit of
    :func:`batch_limits`: above it the thesis "the KV cache, not the weights, sets the batch" holds;
    below it the latency target or the engine cap set the batch (the counterargument wins).

    The KV ceiling falls as 1/context while the latency batch falls more slowly (the KV read is one
    term of the step), so the KV limit binds on one side of a single crossing; bisection on it, each probe
    on the replica's step table (``cost``, default :func:`lib.scheduling.cost.step_cost` of ``dep``).
    ``low`` when KV already binds there; ``inf`` when it never binds up to ``high`` (default: the
    model's maximum context)."""
    from lib.scheduling.cost import step_cost

    top = int(model(dep.model).max_position_embeddings) if high is None else integer("high", high, 1)
    lo = integer("low", low, 1, top)
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    table = step_cost(dep) if cost is None else cost

    def binds(c: int) -> bool:
        return kv_binds(dep, c, t, table)

    if binds(lo):
        return float(lo)
    if not binds(top):
        return math.inf
    return float(smallest_true(binds, lo + 1, top - 1))  # binds(lo) false; top when nothing below it binds


# ---- dated predictions (N092 infrastructure-predictions) -------------------------------------------------
#
# Each prediction is evaluated AT A DATE (decimal year): the chips announced by then
# (``judgment.gpu_announced`` in data/assumptions.yaml), growth per year measured between announcements, and
# extrapolations from a dated baseline. Each returns the number at which its counterargument would win.


def announced(chip: str) -> float:
    """Decimal year ``chip`` was announced (``judgment.gpu_announced``); ValueError for a chip with no date."""
    from lib.registry import assumptions

    try:
        return float(assumptions.value(f"judgment.gpu_announced.{chip}"))
    except (KeyError, ValueError) as e:
        raise ValueError(f"no announcement date for {chip!r} in data/assumptions.yaml (judgment.gpu_announced)") from e


def chips_available(chips: list[str] | tuple[str, ...], date: float) -> list[str]:
    """The chips of ``chips`` announced on or before ``date`` (decimal year), oldest first."""
    d = real("date", date, 2000, 2100)
    return sorted((c for c in chips if announced(c) <= d), key=announced)


@dataclass(frozen=True)
class RidgeForecast:
    """The ridge point extrapolated from ``first`` to ``latest`` (the newest chip at ``date``) to ``target``
    (decimal year): per-year factors, and the bandwidth a chip of ``target`` would need to hold today's ridge."""

    date: float
    target: float
    first: str
    latest: str
    flops_per_year: float  # factor per year, dense peak
    bandwidth_per_year: float  # factor per year, HBM bytes/s
    ridge_latest: float  # FLOP/byte
    ridge_target: float  # FLOP/byte, extrapolated
    flops_target: float  # FLOP/s, extrapolated
    bandwidth_target: float  # bytes/s, extrapolated
    bandwidth_to_hold: float  # bytes/s that keeps the ridge at ridge_latest with flops_target

    @property
    def ridge_per_year(self) -> float:
        return self.flops_per_year / self.bandwidth_per_year


def ridge_forecast(chips: list[str] | tuple[str, ...], date: float, target: float, dtype: str = "bf16") -> RidgeForecast:
    """Growth per year of dense peak and bandwidth between the oldest and the newest of ``chips`` announced by
    ``date`` (``(new / old) ** (1 / years)``, from :func:`lib.perf.datasheet.spec_ratios`), carried from the
    newest chip's announcement to ``target``. The counterargument (bandwidth catches up) wins if the chip of
    ``target`` has at least ``bandwidth_to_hold`` = extrapolated FLOP/s / today's ridge."""
    avail = chips_available(chips, date)
    if len(avail) < 2:
        raise ValueError(f"need two of {list(chips)} announced by {date:g} to measure a growth rate; got {avail}")
    t = real("target", target, date, 2100)
    first, latest = avail[0], avail[-1]
    years = announced(latest) - announced(first)
    r = datasheet.spec_ratios(first, latest, dtype)
    fy, by = r["flops"] ** (1 / years), r["bandwidth"] ** (1 / years)
    ahead = t - announced(latest)
    chip = gpu_spec(latest)
    ridge_now = roofline.ridge_point(latest, dtype)
    flops_t = chip.peak_flops(dtype) * fy**ahead
    bw_t = chip.memory_bandwidth * by**ahead
    return RidgeForecast(float(date), t, first, latest, fy, by, ridge_now, flops_t / bw_t, flops_t, bw_t, flops_t / ridge_now)


@dataclass(frozen=True)
class EnergyLevers:
    """J/token of one decode replica (:func:`lib.perf.energy.decode_energy`) at batch 1 and at ``batch`` on the
    old chip, and at ``batch`` on the new one: what batching buys against what the generation buys."""

    batch: int
    j_old_1: float
    j_old_batch: float
    j_new_batch: float
    fleet_batch: int = 1
    j_old_fleet: float = math.nan  # J/token on the old chip at the batch the fleet actually averages

    @property
    def batching_gain(self) -> float:
        return self.j_old_1 / self.j_old_batch

    @property
    def generation_gain(self) -> float:
        return self.j_old_batch / self.j_new_batch

    @property
    def fill_gain(self) -> float:
        """What filling the batch from ``fleet_batch`` to ``batch`` still buys on the old chip."""
        return self.j_old_fleet / self.j_old_batch


def energy_levers(old: Deployment, new: Deployment, context: int, batch: int, fleet_batch: int = 1) -> EnergyLevers:
    """:class:`EnergyLevers` for ``old`` and ``new`` (same model) at ``context`` tokens and ``batch`` sequences
    (the batch the replica can run), with ``fleet_batch`` the batch the fleet actually averages (<= batch)."""
    from lib.perf import energy

    ctx = integer("context", context, 1)
    b = integer("batch", batch, 1)
    fb = integer("fleet_batch", fleet_batch, 1, b)
    if old.model != new.model:
        raise ValueError(f"old and new must serve the same model, got {old.model} and {new.model}")
    eo = energy.decode_energy(old, ctx, [1, b, fb])
    en = energy.decode_energy(new, ctx, [b])
    j = eo["j_per_token"]
    return EnergyLevers(b, float(j[0]), float(j[1]), float(en["j_per_token"][0]), fb, float(j[2]))


def batch_where_hardware_wins(old: Deployment, new: Deployment, context: int, batch_max: int) -> float:
    """Smallest batch at which the old chip's remaining batching gain (J/token at that batch over J/token at
    ``batch_max``) is no more than the generation's gain at ``batch_max``: a fleet already running at or above
    it gets more energy per token from new hardware than from fuller batches. Integer bisection; ``batch_max``
    when even that holds only there."""
    from lib.perf import energy

    ctx = integer("context", context, 1)
    top = integer("batch_max", batch_max, 1)
    gen = energy_levers(old, new, ctx, top).generation_gain
    j_top = float(energy.decode_energy(old, ctx, [top])["j_per_token"][0])

    def ok(b: int) -> bool:
        return float(energy.decode_energy(old, ctx, [b])["j_per_token"][0]) / j_top <= gen

    return 1.0 if ok(1) else float(smallest_true(ok, min(2, top), top - 1))  # top when nothing below it is ok


@dataclass(frozen=True)
class FrontierFleet:
    """A frontier pre-training run at ``date``: compute extrapolated from a dated baseline, the GPUs of ``chip``
    that finish it in ``days`` at ``mfu`` (the fleet equation), and how often such a job is interrupted."""

    date: float
    chip: str
    flops: float  # model FLOPs of the run
    gpus: float  # fractional (the fleet equation)
    job_mtbf_s: float
    gpus_human_limit: float  # GPUs at which the job MTBF equals the hand-restart limit
    date_human_limit: float  # decimal year the frontier fleet crossed that GPU count


def frontier_fleet(date: float, chip: str, *, growth_per_year: float | None = None, days: float | None = None,
                   mfu: float | None = None, human_mtbf_hours: float | None = None) -> FrontierFleet:
    """Compute C(date) = C0 x g ** (date - date0) with C0 = :func:`lib.training.flops.training_flops` of
    Llama 3.1 405B over its tokens (``judgment.frontier_baseline``), g from
    ``judgment.frontier_compute_growth_per_year``; GPUs = :func:`lib.training.flops.gpus_for_deadline`;
    job MTBF = :func:`lib.training.reliability.job_mtbf_s` at the Llama 3 interruption rate. The
    counterargument (restart by hand) holds below the GPU count whose MTBF is ``human_mtbf_hours``."""
    from lib.registry import assumptions
    from lib.training import flops as tflops
    from lib.training import reliability

    d = real("date", date, 2000, 2100)
    g = real("growth_per_year", assumptions.value("judgment.frontier_compute_growth_per_year")
             if growth_per_year is None else growth_per_year, 1, 100)
    run_days = real("days", assumptions.value("judgment.frontier_run_days") if days is None else days, 1, 3650)
    mtbf_h = real("human_mtbf_hours", assumptions.value("judgment.human_restart_mtbf_hours")
                  if human_mtbf_hours is None else human_mtbf_hours, 0.1, 10000)
    d0 = float(assumptions.value("judgment.frontier_baseline.date"))
    c0 = tflops.training_flops("llama-3.1-405b", float(assumptions.value("judgment.frontier_baseline.tokens")), 8192)
    c = c0 * g ** (d - d0)
    n = tflops.gpus_for_deadline(c, run_days * 86400, chip, mfu)
    mtbf = reliability.job_mtbf_s(max(1, math.ceil(n)))
    n_star = reliability.job_mtbf_s(1) / (mtbf_h * 3600)  # MTBF falls as 1 / n
    date_star = d0 + math.log(max(n_star / tflops.gpus_for_deadline(c0, run_days * 86400, chip, mfu), 1e-300)) / math.log(g)
    return FrontierFleet(d, chip, c, n, mtbf, n_star, date_star)


@dataclass(frozen=True)
class KVHandoff:
    """One prompt's KV hand-off to a decode replica over the network against the prefill it follows."""

    prompt_len: int
    transfer_s: float
    prefill_s: float
    link_bytes_per_s: float  # effective per-GPU link rate the transfer runs at
    link_to_sink: float  # effective per-GPU rate at which the hand-off takes max_share of the prefill

    @property
    def share(self) -> float:
        return self.transfer_s / self.prefill_s


def kv_handoff(dep: Deployment, prompt_len: int, max_share: float | None = None) -> KVHandoff:
    """:func:`lib.fleet.disaggregation.kv_transfer` (bulk, across nodes) against
    :func:`lib.perf.prefill.prefill_time`; the sinking link rate is bytes per lane / (max_share x prefill -
    latency) (``judgment.disagg_transfer_share`` by default); inf when the latency alone exceeds it."""
    from lib.fleet import disaggregation
    from lib.perf import prefill
    from lib.registry import assumptions

    share = real("max_share", assumptions.value("judgment.disagg_transfer_share") if max_share is None else max_share,
                 0, 1, low_open=True)
    t = disaggregation.kv_transfer(dep, prompt_len)
    p = prefill.prefill_time(dep, prompt_len).time_s
    room = share * p - t.latency_s
    return KVHandoff(int(prompt_len), t.time_s, p, t.link_bytes_per_s, t.bytes_per_lane / room if room > 0 else math.inf)


# ---- why this work (N078): one constraint per background, each with its number --------------------------

BACKGROUNDS = ("distributed systems", "kernels", "hardware", "SRE")


def decode_flop_utilization(mdl: str | Model, chip: str, tp: int, batch: int, context: int,
                            weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> float:
    """Share of the dense peak (in the dtype the matmuls run in) a decode step can use on the roofline:
    :func:`lib.perf.roofline.attainable_flops` at the step's intensity (:func:`lib.perf.roofline.decode_step`)
    over the peak. Below the ridge it is intensity / ridge: the tensor cores idle the rest of the time."""
    cdt = datasheet.matmul_dtype(weight_dtype, chip)
    st = roofline.decode_step(mdl, chip, tp, batch, context, weight_dtype, kv_dtype, cdt)
    return roofline.attainable_flops(st.intensity, chip, cdt) / gpu_spec(chip).peak_flops(cdt)


@dataclass(frozen=True)
class BackgroundConstraint:
    """Where a background's experience meets the constraint: its name, the number that makes it real (in SI or
    a plain ratio, ``unit`` says which) and the sentence that states it."""

    background: str
    constraint: str
    value: float
    unit: str
    sentence: str


def background_constraints(dep: Deployment, context: int, batch: int, date: float, prompt_len: int,
                           chips: tuple[str, ...] = ("a100-sxm", "h100-sxm", "h200", "b200"),
                           horizon_years: float = 2.0) -> dict[str, BackgroundConstraint]:
    """One constraint per background of :data:`BACKGROUNDS`, each from a thesis of this module:
    distributed systems: the KV hand-off between replicas (:func:`kv_handoff`); kernels: the share of the
    FLOPs decode can use at ``batch`` (:func:`decode_flop_utilization`); hardware: the ridge point per year
    (:func:`ridge_forecast`); SRE: how often a frontier run on the newest chip at ``date`` is interrupted
    (:func:`frontier_fleet`)."""
    from lib.units import fmt_pct, sig

    kv = kv_handoff(dep, prompt_len)
    util = decode_flop_utilization(dep.model, dep.gpu, dep.tp, batch, context, dep.weight_dtype, dep.kv_dtype)
    fc = ridge_forecast(chips, date, date + horizon_years)
    latest = chips_available(chips, date)[-1]
    ff = frontier_fleet(date, latest)
    from lib.fleet import disaggregation

    kvb = disaggregation.kv_bytes(dep, prompt_len)
    return {
        "distributed systems": BackgroundConstraint(
            "distributed systems", "state that moves between replicas: the KV cache", kv.transfer_s, "s",
            f"a {prompt_len:,}-token prompt of {dep.model} carries {sig(kvb / 1e9)} GB of KV; handing it to a decode "
            f"replica takes {sig(kv.transfer_s * 1e3)} ms, {fmt_pct(kv.share)} of its prefill"),
        "kernels": BackgroundConstraint(
            "kernels", "decode cannot use the tensor cores" if util < 0.5 else "decode near the compute roof", util,
            "fraction of peak",
            f"at batch {batch} and {context:,} tokens, decode of {dep.model} on {dep.gpu} can use "
            f"{fmt_pct(util)} of the dense peak" + (": the rest waits on HBM" if util < 1 else ", compute-bound")),
        "hardware": BackgroundConstraint(
            "hardware", "FLOPs outgrow bandwidth" if fc.ridge_per_year > 1 else "bandwidth keeps pace with FLOPs",
            fc.ridge_per_year, "x per year",
            f"from {fc.first} to {fc.latest} the ridge point {'rose' if fc.ridge_per_year > 1 else 'moved'} "
            f"{sig(fc.ridge_per_year)}x a year, toward "
            f"{sig(fc.ridge_target)} FLOP/byte by {fc.target:g}"),
        "SRE": BackgroundConstraint(
            "SRE", "failures at frontier scale", ff.job_mtbf_s, "s",
            f"a {date:g} frontier run on about {ff.gpus:,.0f} {latest}s is interrupted every "
            f"{sig(ff.job_mtbf_s / 3600)} hours at Llama 3's failure rate"),
    }
