"""Explorers for the roofline questions about batch, energy and datasheets (I100-I105, N003)."""

from __future__ import annotations

import math

import numpy as np

from lib.book.svgplot import subplots
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import datasheet as ds
from lib.perf import energy, moe, moe_cost
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import fmt_bytes, fmt_pct, fmt_time, sig

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
    fig, (ax1, ax2) = subplots(7.4, 2.9, 2)
    ax1.semilogx(batches, uniform, label="uniform routing")
    ax1.semilogx(batches, skewed, "--", label=f"Zipf skew {sig(skew)}")
    ax1.axhline(e, color="grey", lw=0.8)
    ax1.axvline(batch, color="red", lw=0.8)
    ax1.set_xlabel("tokens per step")
    ax1.set_ylabel("distinct experts per layer")
    ax1.legend(fontsize=7)
    labels = {
        "moe": m.key,
        "same_total": "dense, same total params",
        "same_active": "dense, same active params",
    }
    for name, ys in curves.items():
        ax2.loglog(batches, ys, label=labels[name])
    ax2.axvline(batch, color="red", lw=0.8)
    ax2.set_xlabel("tokens per step")
    ax2.set_ylabel("GPU-ms per token")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.minorticks_off()
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.17, top=0.96, wspace=0.3)
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
    return View(
        f"{m.key} on {gpus}x {g.key} ({weight_dtype}), batch {batch}",
        rows,
        fig,
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
    bs = np.unique(np.geomspace(1, hi, 20).astype(int))
    xs = [tput.tokens_per_s(dep, int(b), context) for b in bs]
    fig, (ax,) = subplots(6.0, 3.0)
    ax.semilogx(bs, xs, label="X(B) = B / t(B), modelled step")
    ax.axhline(ceiling, color="grey", ls="--", lw=1, label="ceiling (large-batch slope)")
    if tc < 3 * ceiling:
        ax.axhline(tc, color="purple", ls=":", lw=1, label="tensor-core bound")
    ax.axvline(knee, color="green", lw=1, label=f"knee (half the ceiling) = {sig(knee)}")
    if b_max >= 1:
        ax.axvline(b_max, color="red", lw=1, label=f"KV capacity = {sig(b_max)}")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("tokens/s (replica)")
    ax.minorticks_off()
    ax.legend(fontsize=7, loc="lower right")
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
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
    return View(
        f"{m.key} on {tp}x {g.key}, {context} tokens of context",
        rows,
        fig,
        note,
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
    fig, (ax,) = subplots(6.0, 3.0)
    ax.loglog(bs, curve["j_per_token"], label="power model")
    ax.loglog(bs, at_tdp, ":", color="grey", label="power pinned at TDP")
    ax.loglog(bs, at_floor, "--", color="grey", label="power pinned at batch-1 level")
    ax.axvline(big, color="red", lw=1)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("J per token (GPU boards)")
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
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
    return View(
        f"{m.key} on {tp}x {g.key} ({weight_dtype}, KV {kv_dtype}), {context} tokens of context",
        rows,
        fig,
        note,
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
    fig, (ax,) = subplots(6.4, 0.3 * len(scen) + 1.0)
    names = [s.name for s in scen]
    vals = [max(s.tokens_per_s, 1e-3) for s in scen]
    colors = [
        "tab:green" if s.meets(claim) else ("tab:grey" if not s.fits else "tab:blue") for s in scen
    ]
    ys = np.arange(len(scen))[::-1]
    ax.barh(ys, vals, color=colors)
    ax.axvline(claim, color="red", lw=1.5, label=f"claim {sig(claim)}")
    ax.set_xscale("log")
    ax.set_yticks([])
    lo = min(min(vals), claim) / 3
    for y, name in zip(ys, names, strict=True):
        ax.text(lo * 1.1, y, name, fontsize=7, va="center")
    ax.set_xlim(lo, max(max(vals), claim) * 1.5)
    ax.minorticks_off()
    ax.set_xlabel("ceiling, tokens/s (green: meets the claim; grey: does not fit)")
    ax.legend(fontsize=7, loc="lower right")
    fig.subplots_adjust(left=0.03, right=0.97, bottom=0.8 / (0.3 * len(scen) + 1.0), top=0.97)
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
    return View(
        f"{sig(claim)} tokens/s per user: {model} on {n_gpus}x {gpu}",
        rows,
        fig,
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
    fig, (ax,) = subplots(6.0, 3.0)
    xs = np.arange(len(rows_by_gpu))
    for reg, marker in zip(regimes, "os^", strict=True):
        ys = np.array([speed[r.gpu][reg] for r in rows_by_gpu], dtype=float)
        ys[~np.isfinite(ys)] = np.nan  # an infinite or undefined ratio is left off the plot
        ax.plot(xs, ys, marker=marker, label=reg)
    ax.set_xticks(xs, [r.gpu for r in rows_by_gpu])
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_ylabel(f"speedup per GPU vs {base.gpu}")
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
    rows = []
    for r in rows_by_gpu:
        s = speed[r.gpu]
        if math.isnan(s["capacity"]):
            cap = "n/a (no sequence fits)"
        elif math.isinf(s["capacity"]):
            cap = f"inf ({base.gpu} holds no sequence)"
        else:
            cap = f"{sig(s['capacity'])}x"
        rows.append(
            (
                r.gpu,
                f"compute {sig(s['compute'])}x, bandwidth {sig(s['bandwidth'])}x, capacity {cap} "
                f"(KV holds {sig(r.capacity_batch)} sequences)",
            )
        )
    return View(
        f"{model} ({weight_dtype}) on {n_gpus} GPUs, {context} tokens of context",
        rows,
        fig,
        f"left out (no KV room beside the weights, or no such peak): {', '.join(left_out)}" if left_out else "",
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
    fig, (ax,) = subplots(6.0, 3.0)
    ax.loglog(bs, curve, label="decode step asks for")
    for key in ds.GENERATIONS:
        ax.axhline(ds.bytes_per_flop(key, ds.matmul_dtype(weight_dtype, key)), lw=0.8, ls="--",
                   label=f"{key} supplies ({ds.matmul_dtype(weight_dtype, key)})")
    ax.axvline(batch, color="red", lw=1)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("HBM bytes per FLOP")
    ax.minorticks_off()
    ax.legend(fontsize=6, ncol=2)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.96)
    rows = [
        ("workload bytes/FLOP", sig(demand, 3)),
        (f"{g.key} bytes/FLOP ({cdt.upper()} dense, the matmuls' dtype)", sig(supply, 3)),
        (
            "demand / supply",
            f"{sig(demand / supply)}x ({'memory' if demand > supply else 'compute'}-bound)",
        ),
        ("share of peak FLOP/s usable", fmt_pct(min(1.0, supply / demand))),
    ]
    return View(
        f"{model}, batch {batch}, {context} tokens of context, on {g.key}",
        rows,
        fig,
        values={"demand": demand, "supply": supply},
    )
