"""Explorers for the roofline questions about batch, energy and datasheets (I100-I105, N003)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import datasheet as ds
from lib.perf import energy, moe, moe_cost
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

MOE_MODELS = tuple(k for k in models.model_names() if models.model(k).is_moe)
GPUS = tuple(hardware.gpu_names())
MODELS = tuple(models.model_names())


def _compute_dtype(weight_dtype: str, chip=None) -> str:
    """Matmul dtype used with a weight dtype: FP8 weights run FP8 matmuls (where the chip has an
    FP8 peak), others BF16."""
    if chip is not None:
        return ds.matmul_dtype(weight_dtype, chip)
    return "fp8" if weight_dtype == "fp8" else "bf16"


def _tokens(x: float) -> str:
    return f"{sig(x)} tokens/s"


# ---- I102 -------------------------------------------------------------------------------------


@explorer(
    "roofline.moe_experts",
    model=Choice(MOE_MODELS),
    gpu=Choice(GPUS),
    gpus=IntRange(1, 64, log=True, label="GPUs per replica"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    batch=IntRange(1, 8192, log=True, label="tokens per decode step"),
    skew=FloatRange(0.0, 2.0, 0.1, label="routing skew (Zipf exponent)"),
)
def moe_experts(
    model: str, gpu: str, gpus: int, weight_dtype: str, batch: int, skew: float
) -> View:
    """I102: distinct experts a decode batch reads, its bytes, and per-token cost vs dense."""
    m, g = models.model(model), hardware.gpu(gpu)
    if not m.is_moe:
        raise ValueError(
            f"{model} is not a mixture-of-experts model; pick one of {', '.join(MOE_MODELS)}"
        )
    # the weights must leave a KV cache in the memory budget (driver-visible memory): Deployment says why not
    Deployment(m, g, tp=gpus, weight_dtype=weight_dtype, compute_dtype=_compute_dtype(weight_dtype, g))
    cdt = _compute_dtype(weight_dtype, g)
    e, k = m.num_experts, m.experts_per_token
    pi = moe_cost.zipf_inclusion_probabilities(e, k, skew)
    batches = np.unique(np.geomspace(1, 8192, 40).astype(int))
    uniform = [moe.expected_experts_touched(e, k, int(b)) for b in batches]
    skewed = [moe_cost.expected_experts_touched_nonuniform(pi, int(b)) for b in batches]
    curves = {
        name: v / 1e-3
        for name, v in moe_cost.per_token_time_curves(  # GPU-ms per token
            m, g, batches, weight_dtype, cdt
        ).items()
    }
    labels = {
        "moe": m.key,
        "same_total": "dense, same total params",
        "same_active": "dense, same active params",
    }
    fig = _MOE_FIGURE(batches, uniform, skewed, f"Zipf skew {sig(skew)}", e,
                      {labels[name]: ys for name, ys in curves.items()}, batch)
    here = moe_cost.compare_with_dense(m, g, batch, weight_dtype, cdt, gpus)
    touched = moe.expected_experts_touched(e, k, batch)
    b_c = moe_cost.compute_bound_batch(m, g, weight_dtype, cdt)
    rows = [
        ("experts per layer read (uniform)", f"{sig(touched)} of {e}"),
        (
            "experts per layer read (skewed)",
            f"{sig(moe_cost.expected_experts_touched_nonuniform(pi, batch))} of {e}",
        ),
        ("weight bytes per step", fmt_bytes(here["moe"].weight_bytes)),
        ("step time (roofline)", f"{fmt_time(here['moe'].time_s)} ({here['moe'].bound}-bound)"),
        (
            "per-token cost vs dense same-total",
            f"{sig(here['same_total'].time_per_token_s / here['moe'].time_per_token_s)}x cheaper",
        ),
        (
            "per-token cost vs dense same-active",
            f"{sig(here['moe'].time_per_token_s / here['same_active'].time_per_token_s)}x dearer",
        ),
        ("compute-bound from batch", f"{sig(b_c)} tokens"),
        ("hottest expert load / mean (skewed)", f"{sig(moe_cost.hottest_expert_load_ratio(pi))}x"),
    ]
    caption = (
        f"Left: the distinct experts a step reads climb toward all {e} (grey) as the tokens per step grow; at "
        f"this batch of {fmt_int(batch)} (red) it reads {sig(touched)}. Right: per token, the MoE costs "
        f"{sig(here['moe'].time_per_token_s / here['same_total'].time_per_token_s)}x a dense model of the same "
        f"total parameters and {sig(here['moe'].time_per_token_s / here['same_active'].time_per_token_s)}x one of "
        "the same active parameters."
    )
    return View(
        f"{m.key} on {gpus}x {g.key} ({weight_dtype}), batch {batch}",
        rows,
        fig,
        caption=caption,
        values={"touched": touched, "bytes": here["moe"].weight_bytes, "compute_bound_batch": b_c},
    )


# ---- I104 -------------------------------------------------------------------------------------


@explorer(
    "roofline.throughput_knee",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    context=IntRange(1, 131072, label="context tokens per sequence"),
    batch=IntRange(1, 4096, log=True, label="batch (marker)"),
)
def throughput_knee(
    model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, context: int, batch: int
) -> View:
    """I104: the modelled step's throughput against batch, its knee and ceiling, and the KV ceiling."""
    m, g = models.model(model), hardware.gpu(gpu)
    m.check_context(context)
    dep = Deployment(m, g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     compute_dtype=_compute_dtype(weight_dtype, g))
    ceiling = tput.throughput_ceiling(dep, context)
    knee = tput.knee_batch(dep, context)
    b_max = tput.kv_batch_ceiling(dep, context)
    b_c = tput.compute_bound_batch(dep, context)
    tc = tput.tensor_core_ceiling_tokens_per_s(dep, context)
    hi = max(4 * knee, 2 * b_max, 2 * batch, 8)
    bs = np.unique(np.geomspace(1, hi, 12).astype(int))  # 12 points draw the curve; each is a step model call
    xs = [tput.tokens_per_s(dep, int(b), context) for b in bs]
    fig = _KNEE_FIGURE(bs, xs, ceiling, tc, knee, b_max)
    here = tput.step_s(dep, batch, context)
    rows = [
        ("step at batch 1", fmt_time(tput.step_s(dep, 1, context))),
        ("each extra sequence at large batch", fmt_time(1 / ceiling)),
        ("ceiling", _tokens(ceiling)),
        ("tensor-core bound", _tokens(tc)),
        ("knee (half the ceiling)", sig(knee)),
        ("KV capacity (sequences)", sig(b_max)),
        ("a kernel turns compute-bound from batch",
         "never" if math.isinf(b_c) else sig(b_c)),
        (f"throughput at batch {batch}", _tokens(batch / here)),
        (f"step time at batch {batch}", fmt_time(here)),
    ]
    note = (
        ""
        if batch <= b_max
        else f"batch {batch} does not fit: the KV cache holds {sig(b_max)} sequences"
    )
    reach = (f"at the KV capacity (red, {sig(b_max)} sequences) the replica reaches "
             f"{fmt_pct(tput.tokens_per_s(dep, int(b_max), context) / ceiling)} of that ceiling"
             if b_max >= 1 else "no sequence fits in the KV cache, so no batch is reachable")
    caption = (f"Throughput climbs with batch and bends at the knee (green, {sig(knee)} sequences, half the dashed "
               f"ceiling of {_tokens(ceiling)}); {reach}.")
    return View(
        f"{m.key} on {tp}x {g.key}, {context} tokens of context",
        rows,
        fig,
        note,
        caption=caption,
        values={"knee": knee, "ceiling": ceiling, "b_max": float(b_max)},
    )


# ---- I105 -------------------------------------------------------------------------------------


@explorer(
    "roofline.joules_per_token",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="GPUs (tensor parallel)"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    context=IntRange(1, 131072, label="context tokens per sequence"),
    batch=IntRange(1, 4096, log=True, label="large batch"),
    floor_fraction=FloatRange(0.1, 1.0, 0.05, label="batch-1 power / TDP"),
)
def joules_per_token(
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    context: int,
    batch: int,
    floor_fraction: float,
) -> View:
    """I105: J/token = power / throughput, batch 1 against a large batch (the modelled step)."""
    m, g = models.model(model), hardware.gpu(gpu)
    m.check_context(context)
    dep = Deployment(m, g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     compute_dtype=_compute_dtype(weight_dtype, g))
    b_max = tput.kv_batch_ceiling(dep, context)
    if b_max < 1:
        raise ValueError(
            f"no sequence of {context} tokens fits beside the weights on {tp}x {g.key} "
            f"(the KV cache holds {sig(b_max)})"
        )
    big = min(batch, int(b_max))
    bs = np.unique(np.geomspace(1, max(int(b_max), 2), 24).astype(int))
    curve = energy.decode_energy(dep, context, bs, floor_fraction)
    x = curve["tokens_per_s"]
    at_tdp = energy.joules_per_token(tp * g.tdp_w, x)
    at_floor = energy.joules_per_token(tp * g.tdp_w * floor_fraction, x)
    fig = _JOULES_FIGURE(bs, curve["j_per_token"], at_tdp, at_floor, big)
    one = energy.decode_energy(dep, context, 1, floor_fraction)
    many = energy.decode_energy(dep, context, big, floor_fraction)
    rows = [
        ("batch 1: tokens/s, power", f"{_tokens(one['tokens_per_s'])}, {sig(one['power_w'])} W"),
        (
            f"batch {big}: tokens/s, power",
            f"{_tokens(many['tokens_per_s'])}, {sig(many['power_w'])} W",
        ),
        ("J/token at batch 1", f"{sig(one['j_per_token'])} J"),
        (f"J/token at batch {big}", f"{sig(many['j_per_token'])} J"),
        ("throughput swing", f"{sig(many['tokens_per_s'] / one['tokens_per_s'])}x"),
        ("power swing", f"{sig(many['power_w'] / one['power_w'])}x"),
        ("J/token swing", f"{sig(one['j_per_token'] / many['j_per_token'])}x"),
    ]
    note = f"batch capped at the KV ceiling ({sig(b_max)})" if batch > b_max else ""
    caption = (f"Energy per token is power over throughput: from batch 1 to batch {fmt_int(big)} (red) throughput grows "
               f"{sig(many['tokens_per_s'] / one['tokens_per_s'])}x and power {sig(many['power_w'] / one['power_w'])}x, "
               f"so J/token goes from {sig(one['j_per_token'])} to {sig(many['j_per_token'])}. The grey lines pin "
               "power at TDP and at the batch-1 level.")
    return View(
        f"{m.key} on {tp}x {g.key} ({weight_dtype}, KV {kv_dtype}), {context} tokens of context",
        rows,
        fig,
        note,
        caption=caption,
        values={"j1": one["j_per_token"], "jB": many["j_per_token"]},
    )


# ---- I100 -------------------------------------------------------------------------------------


@explorer(
    "roofline.headline_claim",
    claim=FloatRange(1.0, 5000.0, 10.0, label="claimed tokens/s per user"),
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 8, log=True, label="GPUs claimed"),
    context=IntRange(0, 32768, label="context tokens"),
    acceptance=FloatRange(0.0, 1.0, 0.05, label="speculative acceptance rate"),
    draft_tokens=IntRange(0, 16, label="drafted tokens per step"),
    draft_cost=FloatRange(0.0, 0.5, 0.01, label="draft cost / target step"),
)
def headline_claim(
    claim: float,
    model: str,
    gpu: str,
    n_gpus: int,
    context: int,
    acceptance: float,
    draft_tokens: int,
    draft_cost: float,
) -> View:
    """I100: the bandwidth floor against a headline, and the readings that would make it true."""
    scen = ds.headline_scenarios(
        claim, model, gpu, n_gpus, context, acceptance, draft_tokens, draft_cost
    )
    fig = _HEADLINE_FIGURE(scen, claim, layout=(max(_HEADLINE_ROWS, len(scen)),))
    base = scen[0]
    rows = [("claim / BF16 floor", f"{sig(claim / base.tokens_per_s)}x")]
    rows += [
        (
            s.name,
            f"{sig(s.tokens_per_s)}{'' if s.fits else ' (does not fit)'}"
            f"{'  meets' if s.meets(claim) else ''}",
        )
        for s in scen
    ]
    meeting = [s.name for s in scen if s.meets(claim)]
    caption = (f"Each bar is one reading of the claim (weights dtype, speculation, a smaller model, a batch "
               f"aggregate) and its bandwidth ceiling in tokens/s per user; the red line is the claim, {sig(claim)}. "
               + (f"{len(meeting)} of {len(scen)} readings reach it (green), the first '{meeting[0]}'."
                  if meeting else f"None of the {len(scen)} readings reaches it."))
    return View(
        f"{sig(claim)} tokens/s per user: {model} on {n_gpus}x {gpu}",
        rows,
        fig,
        caption=caption,
        values={"floor": base.tokens_per_s, "n_meeting": float(sum(s.meets(claim) for s in scen))},
    )


# ---- I101 -------------------------------------------------------------------------------------


@explorer(
    "roofline.generation_regimes",
    model=Choice(MODELS),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    compute_dtype=Choice(("bf16", "fp8"), label="matmuls"),
    n_gpus=IntRange(1, 64, log=True, label="GPUs per replica"),
    context=IntRange(1, 131072, label="context tokens"),
    prompt_len=IntRange(1, 131072, label="prompt tokens (prefill)"),
)
def generation_regimes(
    model: str, weight_dtype: str, kv_dtype: str, compute_dtype: str, n_gpus: int, context: int,
    prompt_len: int
) -> View:
    """I101: A100 -> H100 -> H200 -> B200, one speedup per regime (per GPU, vs the oldest that runs)."""
    rows_by_gpu, left_out = [], []
    for g in ds.GENERATIONS:
        if compute_dtype not in hardware.gpu(g).dtypes:
            left_out.append(f"{g} (no {compute_dtype} peak)")
            continue
        try:
            rows_by_gpu.append(ds.regime_row(model, g, n_gpus, context, prompt_len, weight_dtype,
                                             kv_dtype, compute_dtype))
        except ValueError:
            left_out.append(g)  # the weights leave no room for a KV cache at this GPU count
    if not rows_by_gpu:
        raise ValueError(f"{model} ({weight_dtype}) leaves no room for a KV cache on {n_gpus} GPUs of "
                         "any generation: add GPUs or pick a smaller dtype")
    base = rows_by_gpu[0]
    regimes = ("compute", "bandwidth", "capacity")
    speed = {r.gpu: ds.regime_speedups(base, r) for r in rows_by_gpu}
    ys = {reg: [speed[r.gpu][reg] for r in rows_by_gpu] for reg in regimes}
    fig = _REGIMES_FIGURE([r.gpu for r in rows_by_gpu], ys, base.gpu)
    rows, caps = [], {}
    for r in rows_by_gpu:
        s = speed[r.gpu]
        if math.isnan(s["capacity"]):
            cap = "n/a (no sequence fits)"
        elif math.isinf(s["capacity"]):
            cap = f"inf ({base.gpu} holds no sequence)"
        else:
            cap = f"{sig(s['capacity'])}x"
        caps[r.gpu] = cap
        rows.append(
            (
                r.gpu,
                f"compute {sig(s['compute'])}x, bandwidth {sig(s['bandwidth'])}x, capacity {cap} "
                f"(KV holds {sig(r.capacity_batch)} sequences)",
            )
        )
    last = rows_by_gpu[-1].gpu
    caption = (f"Each line is one regime's speedup per GPU over the {base.gpu}: compute (prefill time), bandwidth "
               "(batch-1 decode) and capacity (tokens/s at the KV ceiling). "
               + (f"On the {last} they read {sig(speed[last]['compute'])}x, {sig(speed[last]['bandwidth'])}x and "
                  f"{caps[last]}: how much a generation gains depends on the regime."
                  if last != base.gpu else f"Only the {base.gpu} runs this setup, so each line is a single point."))
    return View(
        f"{model} ({weight_dtype}) on {n_gpus} GPUs, {context} tokens of context",
        rows,
        fig,
        f"left out (no KV room beside the weights, or no such peak): {', '.join(left_out)}" if left_out else "",
        caption=caption,
        values={f"{r.gpu}_{k}": v for r in rows_by_gpu for k, v in speed[r.gpu].items()},
    )


# ---- N003 -------------------------------------------------------------------------------------


@explorer(
    "roofline.bytes_per_flop",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    batch=IntRange(1, 4096, log=True),
    context=IntRange(0, 131072, label="context tokens"),
    weight_dtype=Choice(("bf16", "fp8", "int4"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    tokens_per_pass=FloatRange(1.0, 8.0, 0.1, label="tokens accepted per pass (speculation)"),
)
def bytes_per_flop(
    model: str,
    gpu: str,
    batch: int,
    context: int,
    weight_dtype: str,
    kv_dtype: str,
    tokens_per_pass: float,
) -> View:
    """N003: bytes per FLOP the decode step asks for against what each chip supplies."""
    g = hardware.gpu(gpu)
    demand = ds.decode_bytes_per_flop(
        model, batch, context, weight_dtype, kv_dtype, tokens_per_pass
    )
    cdt = ds.matmul_dtype(weight_dtype, g)
    supply = ds.bytes_per_flop(g, cdt)
    bs = np.unique(np.geomspace(1, 4096, 50).astype(int))
    curve = ds.decode_bytes_per_flop(
        model, bs, context, weight_dtype, kv_dtype, tokens_per_pass
    )
    supplies = {f"{key} supplies ({ds.matmul_dtype(weight_dtype, key)})":
                ds.bytes_per_flop(key, ds.matmul_dtype(weight_dtype, key)) for key in ds.GENERATIONS}
    fig = _BYTES_FIGURE(bs, curve, supplies, batch)
    rows = [
        ("workload bytes/FLOP", sig(demand, 3)),
        (f"{g.key} bytes/FLOP ({cdt.upper()} dense, the matmuls' dtype)", sig(supply, 3)),
        (
            "demand / supply",
            f"{sig(demand / supply)}x ({'memory' if demand > supply else 'compute'}-bound)",
        ),
        ("share of peak FLOP/s usable", fmt_pct(min(1.0, supply / demand))),
    ]
    caption = (f"The solid line is what the decode step asks for, falling as batch shares the weight read; each dashed "
               f"line is a chip's supply, and above it the step is memory-bound on that chip. At batch {fmt_int(batch)} (red) "
               f"it asks {sig(demand)} bytes/FLOP, {sig(demand / supply)}x the {g.key}'s supply: "
               f"{'memory' if demand > supply else 'compute'}-bound.")
    return View(
        f"{model}, batch {batch}, {context} tokens of context, on {g.key}",
        rows,
        fig,
        caption=caption,
        values={"demand": demand, "supply": supply},
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _moe_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.17, top=0.96, wspace=0.3)
    ax1, ax2 = fig.subplots(1, 2)
    figures.log_scale(ax1, "x")
    figures.log_scale(ax2)
    a = SimpleNamespace(ax1=ax1, ax2=ax2)
    a.uniform, = ax1.plot([], [], label="uniform routing")
    a.skewed, = ax1.plot([], [], "--")
    a.experts = ax1.axhline(1.0, color="grey", lw=0.8, label="experts per layer")
    a.batch1 = ax1.axvline(1.0, color="red", lw=0.8, label="this batch")
    ax1.set_xlabel("tokens per step")
    ax1.set_ylabel("distinct experts per layer")
    a.costs = [ax2.plot([], [])[0] for _ in range(3)]
    a.batch2 = ax2.axvline(1.0, color="red", lw=0.8, label="this batch")
    ax2.set_xlabel("tokens per step")
    ax2.set_ylabel("GPU-ms per token")
    return a


def _moe_draw(a: SimpleNamespace, batches, uniform, skewed, skew_label: str, experts: int, costs: dict,
              batch: int) -> None:
    a.uniform.set_data(batches, uniform)
    a.skewed.set_data(batches, skewed)
    a.skewed.set_label(skew_label)
    a.experts.set_ydata([experts, experts])
    for line, (label, ys) in zip(a.costs, costs.items(), strict=True):
        line.set_data(batches, ys)
        line.set_label(label)
    for ax, vline in ((a.ax1, a.batch1), (a.ax2, a.batch2)):
        vline.set_xdata([batch, batch])
        ax.relim(visible_only=True)
        ax.autoscale_view()
    figures.legend(a.ax1, [a.uniform, a.skewed, a.experts, a.batch1], fontsize=7)
    figures.legend(a.ax2, [*a.costs, a.batch2], fontsize=7)


_MOE_FIGURE = figures.LiveFigure(7.4, 2.9, _moe_build, _moe_draw)


def _knee_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
    ax = fig.add_subplot()
    figures.log_scale(ax, "x")
    a = SimpleNamespace(ax=ax)
    a.curve, = ax.plot([], [], label="X(B) = B / t(B), modelled step")
    a.ceiling = ax.axhline(1.0, color="grey", ls="--", lw=1, label="ceiling (large-batch slope)")
    a.tensor_core = ax.axhline(1.0, color="purple", ls=":", lw=1, label="tensor-core bound")
    a.knee = ax.axvline(1.0, color="green", lw=1)
    a.kv = ax.axvline(1.0, color="red", lw=1)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("tokens/s (replica)")
    return a


def _knee_draw(a: SimpleNamespace, bs, xs, ceiling: float, tc: float, knee: float, b_max: float) -> None:
    a.curve.set_data(bs, xs)
    a.ceiling.set_ydata([ceiling, ceiling])
    a.tensor_core.set_ydata([tc, tc])
    a.tensor_core.set_visible(tc < 3 * ceiling)
    a.knee.set_xdata([knee, knee])
    a.knee.set_label(f"knee (half the ceiling) = {sig(knee)}")
    a.kv.set_xdata([b_max, b_max])
    a.kv.set_visible(b_max >= 1)
    a.kv.set_label(f"KV capacity = {sig(b_max)}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.curve, a.ceiling, a.tensor_core, a.knee, a.kv], fontsize=7, loc="lower right")


_KNEE_FIGURE = figures.LiveFigure(6.0, 3.0, _knee_build, _knee_draw)


def _joules_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.model, = ax.plot([], [], label="power model")
    a.tdp, = ax.plot([], [], ":", color="grey", label="power pinned at TDP")
    a.floor, = ax.plot([], [], "--", color="grey", label="power pinned at batch-1 level")
    a.batch = ax.axvline(1.0, color="red", lw=1, label="large batch")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("J per token (GPU boards)")
    return a


def _joules_draw(a: SimpleNamespace, bs, j_model, j_tdp, j_floor, big: int) -> None:
    a.model.set_data(bs, j_model)
    a.tdp.set_data(bs, j_tdp)
    a.floor.set_data(bs, j_floor)
    a.batch.set_xdata([big, big])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.model, a.tdp, a.floor, a.batch], fontsize=7)


_JOULES_FIGURE = figures.LiveFigure(6.0, 3.0, _joules_build, _joules_draw)

_MEETS, _SHORT, _NO_FIT = "tab:green", "tab:blue", "tab:grey"


_HEADLINE_ROWS = 16  # bars built once; headline_scenarios gives at most 13 readings


def _headline_build(fig, capacity: int) -> SimpleNamespace:
    from matplotlib.patches import Patch

    ax = fig.add_subplot()
    figures.log_scale(ax, "x")
    a = SimpleNamespace(ax=ax, bars=ax.barh(np.arange(capacity), np.ones(capacity)))
    a.names = [ax.text(1.0, y, "", fontsize=7, va="center") for y in range(capacity)]
    a.claim = ax.axvline(1.0, color="red", lw=1.5)
    a.kinds = [Patch(color=_MEETS, label="meets the claim"), Patch(color=_SHORT, label="falls short"),
               Patch(color=_NO_FIT, label="does not fit")]
    ax.set_yticks([])
    ax.set_xlabel("ceiling, tokens/s")
    return a


def _headline_draw(a: SimpleNamespace, scen: list, claim: float) -> None:
    from matplotlib.colors import to_rgba

    n = len(scen)
    height = 0.3 * n + 1.0  # the figure grows with the number of readings
    a.ax.figure.set_size_inches(6.4, height)
    a.ax.figure.subplots_adjust(left=0.03, right=0.78, bottom=0.8 / height, top=0.97)
    vals = [max(s.tokens_per_s, 1e-3) for s in scen]
    lo = min(min(vals), claim) / 3
    colors = [_MEETS if s.meets(claim) else (_NO_FIT if not s.fits else _SHORT) for s in scen]
    for i, (bar, name) in enumerate(zip(a.bars, a.names, strict=True)):
        bar.set_visible(i < n)
        name.set_visible(i < n)
        if i < n:  # first reading on top
            bar.set_xy((lo / 10, n - 1 - i - 0.4))  # the bar starts left of the axes: a log axis has no zero
            bar.set_width(vals[i] - lo / 10)
            bar.set_color(colors[i])
            name.set_position((lo * 1.1, n - 1 - i))
            name.set_text(scen[i].name)
    for kind in a.kinds:
        kind.set_visible(kind.get_facecolor() in {to_rgba(c) for c in colors})
    a.claim.set_xdata([claim, claim])
    a.claim.set_label(f"claim {sig(claim)}")
    a.ax.set_xlim(lo, max(max(vals), claim) * 1.5)
    a.ax.set_ylim(-0.6, n - 0.4)
    figures.legend(a.ax, [a.claim, *a.kinds], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


_HEADLINE_FIGURE = figures.LiveFigure(6.4, 2.0, _headline_build, _headline_draw)


def _regimes_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.12, top=0.96)
    ax = fig.add_subplot()
    figures.log_scale(ax, "y")
    lines = [ax.plot([], [], marker=marker, label=reg)[0]
             for reg, marker in zip(("compute", "bandwidth", "capacity"), "os^", strict=True)]
    return SimpleNamespace(ax=ax, lines=lines)


def _regimes_draw(a: SimpleNamespace, gpus: list[str], speedups: dict, base: str) -> None:
    xs = np.arange(len(gpus))
    for line, ys in zip(a.lines, speedups.values(), strict=True):
        ys = np.array(ys, dtype=float)
        ys[~np.isfinite(ys)] = np.nan  # an infinite or undefined ratio is left off the plot
        line.set_data(xs, ys)
    a.ax.set_xticks(xs, gpus)
    a.ax.set_xlim(-0.3, len(gpus) - 0.7)
    a.ax.set_ylabel(f"speedup per GPU vs {base}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view(scalex=False)
    figures.legend(a.ax, a.lines, fontsize=7)


_REGIMES_FIGURE = figures.LiveFigure(6.0, 3.0, _regimes_build, _regimes_draw)


def _bytes_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.demand, = ax.plot([], [], label="decode step asks for")
    a.supplies = [ax.axhline(1.0, lw=0.8, ls="--", color=f"C{i + 1}") for i in range(len(ds.GENERATIONS))]
    a.batch = ax.axvline(1.0, color="red", lw=1, label="this batch")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("HBM bytes per FLOP")
    return a


def _bytes_draw(a: SimpleNamespace, bs, curve, supplies: dict, batch: int) -> None:
    a.demand.set_data(bs, curve)
    for line, (label, value) in zip(a.supplies, supplies.items(), strict=True):
        line.set_ydata([value, value])
        line.set_label(label)
    a.batch.set_xdata([batch, batch])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.demand, *a.supplies, a.batch], fontsize=6, ncol=2)


_BYTES_FIGURE = figures.LiveFigure(6.0, 3.0, _bytes_build, _bytes_draw)
