"""Explorers for the thesis pages (N087 defensible-thesis).

Views call :mod:`lib.judgment.thesis` only: the limits on a replica's decode batch against context
(KV capacity, a per-token latency target, the engine cap), the batch at which decode would reach the
chip's ridge point, and the contexts where each thesis's counterargument takes over. One persistent
matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.judgment import thesis
from lib.perf import datasheet, roofline, throughput
from lib.perf.deployment import deployment
from lib.registry import hardware, models
from lib.scheduling.cost import step_cost
from lib.units import fmt_int, fmt_sci, sig

_POINTS = 9


@functools.lru_cache(maxsize=64)
def _curves(model: str, gpu: str, tp: int, kv_dtype: str, weight_dtype: str, tpot_ms: float) -> SimpleNamespace:
    """Batch limits on a log grid of contexts, and the two crossing contexts, for one deployment."""
    dep = deployment(model, gpu, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype)
    cost = step_cost(dep)  # the step tabulated once per replica (lru-cached): a new target costs table look-ups
    top = int(models.model(model).max_position_embeddings)
    ctx = np.unique(np.geomspace(128, top, _POINTS).astype(int))
    lims = [thesis.batch_limits(dep, int(c), tpot_ms / 1e3, cost) for c in ctx]
    ridge_b = [thesis.decode_compute_bound_batch(model, gpu, int(c), weight_dtype, kv_dtype) for c in ctx]
    return SimpleNamespace(
        dep=dep, cost=cost, ctx=ctx, kv=np.array([x.kv for x in lims]), lat=np.array([x.latency for x in lims]),
        engine=float(dep.max_num_seqs), ridge_b=np.array(ridge_b),
        kv_binds_from=thesis.kv_binding_context(dep, tpot_ms / 1e3, 128, top, cost),
        compute_limit=thesis.compute_bound_context_limit(model, gpu, weight_dtype, kv_dtype))


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.kv = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="KV capacity")[0]
    a.lat = ax.plot([1.0], [1.0], color="C1", lw=1.8, label="latency target")[0]
    a.eng = ax.plot([1.0], [1.0], color="0.4", lw=1.2, ls=":", label="engine cap (max_num_seqs)")[0]
    a.ridge = ax.plot([1.0], [1.0], color="C3", lw=1.5, ls="--", label="batch that reaches the ridge")[0]
    a.cross = ax.axvline(1.0, color="C0", lw=1.0, ls="-.")
    a.here = ax.axvline(1.0, color="k", lw=0.8)
    figures.log_scale(ax, "both")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("sequences in the decode batch")
    ax.grid(True)
    return a


def _draw(a, c, context) -> None:
    x = c.ctx.astype(float)
    a.kv.set_data(x, np.maximum(c.kv, 1e-3))
    lat = np.where((c.lat > 0) & np.isfinite(c.lat), c.lat, np.nan)  # inf: past max_num_seqs, the cap binds
    a.lat.set_data(x, lat)
    a.eng.set_data([x[0], x[-1]], [c.engine, c.engine])
    fin = np.isfinite(c.ridge_b)
    a.ridge.set_data(x[fin], c.ridge_b[fin])
    a.ridge.set_visible(bool(fin.any()))
    show_cross = math.isfinite(c.kv_binds_from)
    a.cross.set_xdata([c.kv_binds_from if show_cross else x[0]] * 2)
    a.cross.set_visible(show_cross)
    a.here.set_xdata([context, context])
    ys = [v for v in (*c.kv, *lat, c.engine, *c.ridge_b[fin]) if v > 0 and math.isfinite(v)]
    a.ax.set_xlim(x[0], x[-1])
    a.ax.set_ylim(max(0.1, min(ys) / 2), max(ys) * 2)
    figures.legend(a.ax, [a.kv, a.lat, a.eng, a.ridge], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "behavioral.thesis",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    context=IntRange(128, 131072, log=True, label="context (tokens)"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    tpot_ms=FloatRange(5.0, 200.0, 1.0, label="per-token latency target (ms)"),
)
def thesis_view(model: str, gpu: str, tp: int, context: int, weight_dtype: str, kv_dtype: str,
                tpot_ms: float) -> View:
    """N087: the two theses on one replica: what sets the decode batch as context grows (KV capacity,
    the latency target or the engine cap), and the batch at which decode would reach the ridge."""
    if not 5.0 <= tpot_ms <= 200.0:
        raise ValueError(f"tpot_ms must be in [5, 200], got {tpot_ms!r}")
    c = _curves(model, gpu, tp, kv_dtype, weight_dtype, float(tpot_ms))
    mdl = models.model(model)
    mdl.check_context(context, "context")
    lim = thesis.batch_limits(c.dep, context, tpot_ms / 1e3, c.cost)
    need = thesis.decode_compute_bound_batch(model, gpu, context, weight_dtype, kv_dtype)
    ridge = roofline.ridge_point(gpu, datasheet.matmul_dtype(weight_dtype, gpu))
    kv_from = "never (up to the model's context)" if math.isinf(c.kv_binds_from) else f"{fmt_int(c.kv_binds_from)} tokens"
    rows = [("replica", f"{model} on {tp} x {gpu}, {weight_dtype} weights, {kv_dtype} KV"),
            (f"batch limits at {fmt_int(context)} tokens",
             f"KV {sig(lim.kv)}, latency "
             + (f"{sig(lim.latency)}" if math.isfinite(lim.latency) else "above the engine cap")
             + f", engine {fmt_int(lim.engine)}"),
            ("what sets the batch here", lim.binding),
            ("KV capacity sets the batch from", kv_from),
            (f"ridge point of the {gpu}", f"{sig(ridge)} FLOP/byte"),
            ("batch at which decode reaches it", "no batch (the KV term alone exceeds the supply)"
             if math.isinf(need) else f"{fmt_int(need)} sequences"),
            ("some batch is compute-bound up to", f"{fmt_int(c.compute_limit)} tokens of context")]
    caption = (f"Limits on the decode batch of {model} on {tp} x {gpu} against context (log-log): KV capacity "
               f"(solid blue) falls as 1/context, the {sig(tpot_ms)} ms latency batch (orange) more slowly; "
               f"the dash-dot line marks where KV starts to bind ({kv_from}); the red dashed curve is the batch "
               f"decode needs to reach the ridge, finite only up to {fmt_int(c.compute_limit)} tokens.")
    fig = _FIGURE(c, float(context))
    return View(f"What sets the batch: {lim.binding} at {fmt_int(context)} tokens", rows, fig, caption=caption,
                note=lim.binding, values={"kv": lim.kv, "latency": lim.latency, "ridge_batch": need,
                                          "kv_binds_from": c.kv_binds_from})


# ---- N092 infrastructure-predictions ---------------------------------------------------------------------

_CHIPS = ("a100-sxm", "h100-sxm", "h200", "b200")


def _build_pred(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.16, top=0.93, wspace=0.32)
    a = SimpleNamespace(ax1=fig.add_subplot(1, 2, 1), ax2=fig.add_subplot(1, 2, 2))
    a.pts = a.ax1.plot([2020.0], [1.0], "o", color="C0", label="datasheets")[0]
    a.fit = a.ax1.plot([2020.0], [1.0], "--", color="C0", lw=1.2, label="extrapolated")[0]
    a.now1 = a.ax1.axvline(2026.0, color="k", lw=0.8)
    a.ax1.set_xlabel("year")
    a.ax1.set_ylabel("BF16 ridge point (FLOP/byte)")
    a.ax1.grid(True)
    a.fleet = a.ax2.plot([2024.0], [1.0], color="C1", lw=1.8, label="GPUs for a frontier run")[0]
    a.human = a.ax2.axhline(1.0, color="C3", ls=":", lw=1.2, label="hand restarts stop working")
    a.now2 = a.ax2.axvline(2026.0, color="k", lw=0.8)
    figures.log_scale(a.ax2, "y")
    a.ax2.set_xlabel("year")
    a.ax2.set_ylabel("GPUs (latest chip at each date)")
    a.ax2.grid(True)
    return a


def _draw_pred(a, px, py, fx, fy, years, gpus, human, date) -> None:
    a.pts.set_data(px, py)
    a.fit.set_data(fx, fy)
    a.now1.set_xdata([date, date])
    a.ax1.set_xlim(min(px) - 0.5, max(fx) + 0.5)
    a.ax1.set_ylim(0, max(max(py), max(fy)) * 1.15)
    a.fleet.set_data(years, gpus)
    a.human.set_ydata([human, human])
    a.now2.set_xdata([date, date])
    a.ax2.set_xlim(years[0], years[-1])
    a.ax2.set_ylim(min(min(gpus), human) / 3, max(max(gpus), human) * 3)
    figures.legend(a.ax1, [a.pts, a.fit], fontsize=7, loc="upper left")
    figures.legend(a.ax2, [a.fleet, a.human], fontsize=7, loc="upper left")


_PRED = figures.LiveFigure(7.5, 3.0, _build_pred, _draw_pred)


@explorer(
    "behavioral.predictions",
    date=FloatRange(2022.5, 2030.0, 0.25, label="date of the predictions (year)"),
    horizon_years=FloatRange(0.5, 5.0, 0.5, label="horizon (years)"),
    growth_per_year=FloatRange(1.5, 8.0, 0.1, label="frontier compute growth per year"),
    run_days=FloatRange(30.0, 365.0, 5.0, label="frontier run length (days)"),
    prompt_len=IntRange(1024, 131072, log=True, label="prompt handed off (tokens)"),
)
def predictions_view(date: float, horizon_years: float, growth_per_year: float, run_days: float,
                     prompt_len: int) -> View:
    """N092: the ridge extrapolated from the chips announced by ``date``, the frontier fleet against the year,
    and the KV hand-off of a ``prompt_len`` prompt (Llama 3.1 70B, TP8 on the newest chip)."""
    for name, v, lo, hi in (("date", date, 2022.5, 2030.0), ("horizon_years", horizon_years, 0.5, 5.0),
                            ("growth_per_year", growth_per_year, 1.5, 8.0), ("run_days", run_days, 30.0, 365.0)):
        if not (isinstance(v, int | float) and math.isfinite(v) and lo <= v <= hi):
            raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {v!r}")
    fc = thesis.ridge_forecast(_CHIPS, date, date + horizon_years)
    avail = thesis.chips_available(_CHIPS, date)
    latest = avail[-1]
    ff = thesis.frontier_fleet(date, latest, growth_per_year=growth_per_year, days=run_days)
    dep = deployment("llama-3.1-70b", latest, tp=8)
    kv = thesis.kv_handoff(dep, prompt_len)
    px = [thesis.announced(c) for c in avail]
    py = [roofline.ridge_point(c) for c in avail]
    fx = np.linspace(thesis.announced(latest), fc.target, 12)
    fy = fc.ridge_latest * fc.ridge_per_year ** (fx - fx[0])
    years = np.linspace(2024.0, max(2030.0, date + horizon_years), 25)
    gpus = [thesis.frontier_fleet(float(y), thesis.chips_available(_CHIPS, float(y))[-1], growth_per_year=growth_per_year,
                                  days=run_days).gpus for y in years]
    rows = [("chips announced by then", ", ".join(avail)),
            ("1. ridge per year / at the horizon", f"{sig(fc.ridge_per_year)}x / {sig(fc.ridge_target)} FLOP/byte"),
            ("   sinks if the chip of the horizon has", f"{sig(fc.bandwidth_to_hold / 1e12)} TB/s or more"),
            (f"3. frontier run at {date:g}", f"{fmt_sci(ff.flops)} FLOP, {fmt_int(ff.gpus)} x {latest} for {sig(run_days)} days"),
            ("   job interrupted every", f"{sig(ff.job_mtbf_s / 3600)} hours"),
            ("   hand restarts work below", f"{fmt_int(ff.gpus_human_limit)} GPUs"),
            (f"4. KV hand-off of {fmt_int(prompt_len)} tokens", f"{sig(kv.share * 100)}% of its prefill"),
            ("   sinks below a per-GPU link of", "never (latency alone)" if math.isinf(kv.link_to_sink)
             else f"{sig(kv.link_to_sink * 8 / 1e9)} Gb/s effective")]
    caption = (f"Left: BF16 ridge points of the chips announced by {date:g} (dots) and the extrapolation at "
               f"{sig(fc.ridge_per_year)}x a year to {fc.target:g} (dashed). Right: GPUs a frontier run needs at "
               f"{sig(growth_per_year)}x compute a year in {sig(run_days)} days, against the "
               f"{fmt_int(ff.gpus_human_limit)} GPUs above which the job is interrupted more than once a day.")
    fig = _PRED(px, py, fx, fy, years, gpus, ff.gpus_human_limit, float(date))
    return View(f"Predictions dated {date:g}", rows, fig, caption=caption,
                values={"ridge_target": fc.ridge_target, "gpus": ff.gpus, "share": kv.share})


# ---- N078 why-this-work ----------------------------------------------------------------------------------


def _build_why(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.long = ax.plot([1.0], [0.1], color="C0", lw=1.8, label="at this context")[0]
    a.short = ax.plot([1.0], [0.1], color="C2", lw=1.2, ls="--", label="at 128 tokens")[0]
    a.here = ax.plot([1.0], [0.1], "o", color="C3", ms=6, label="this batch")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("decode batch (sequences)")
    ax.set_ylabel("share of dense peak decode can use")
    ax.grid(True)
    return a


def _draw_why(a, bs, u_long, u_short, batch, u_here) -> None:
    a.long.set_data(bs, u_long)
    a.short.set_data(bs, u_short)
    a.here.set_data([batch], [u_here])
    a.ax.set_xlim(bs[0], bs[-1])
    a.ax.set_ylim(max(1e-4, min(min(u_long), min(u_short)) / 2), 1.5)
    figures.legend(a.ax, [a.long, a.short, a.here], fontsize=7, loc="lower right")


_WHY = figures.LiveFigure(6.0, 3.0, _build_why, _draw_why)


@explorer(
    "behavioral.why_this_work",
    background=Choice(thesis.BACKGROUNDS, label="your background"),
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    context=IntRange(128, 131072, log=True, label="context (tokens)"),
    batch=IntRange(1, 1024, log=True, label="decode batch"),
)
def why_view(background: str, model: str, gpu: str, tp: int, context: int, batch: int) -> View:
    """N078: the constraint each background maps to, with its number; the figure is the kernels' one (how
    much of the chip decode can use) because it moves with every input here."""
    if background not in thesis.BACKGROUNDS:
        raise ValueError(f"background must be one of {', '.join(thesis.BACKGROUNDS)}, got {background!r}")
    mdl = models.model(model)
    mdl.check_context(context, "context")
    dep = deployment(model, gpu, tp=tp)
    held = throughput.kv_batch_ceiling(dep, context)
    if batch > held:
        raise ValueError(f"batch ({batch}) sequences of {context:,} tokens do not fit: the KV cache of {model} on {tp} x "
                         f"{gpu} holds {sig(held)}")
    chips = tuple(c for c in _CHIPS)
    cons = thesis.background_constraints(dep, context, batch, 2026.0, min(32768, int(mdl.max_position_embeddings)), chips)
    bs = np.unique(np.geomspace(1, 1024, 24).astype(int))
    u_long = [thesis.decode_flop_utilization(model, gpu, tp, int(b), context) for b in bs]
    u_short = [thesis.decode_flop_utilization(model, gpu, tp, int(b), 128) for b in bs]
    u_here = cons["kernels"].value
    order = [background] + [b for b in thesis.BACKGROUNDS if b != background]
    rows = [(f"{b}: {cons[b].constraint}", cons[b].sentence) for b in order]
    caption = (f"Share of the {gpu}'s dense peak that decode of {model} at TP{tp} can use against the batch (log-log), at "
               f"{context:,} tokens (solid) and 128 (dashed): {sig(100 * u_here)}% at batch {batch}.")
    fig = _WHY(bs.astype(float), u_long, u_short, float(batch), u_here)
    return View(f"Why this work, from {background}", rows, fig, caption=caption,
                values={b: cons[b].value for b in thesis.BACKGROUNDS})


# ---- N084 staying-current: one published table reproduced ------------------------------------------------


def _build_repro(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.diag = ax.plot([10, 2000], [10, 2000], color="0.5", lw=1.0, ls=":", label="model = published")[0]
    a.model = ax.plot([1.0], [1.0], "o", color="C0", ms=6, label="book's decode step")[0]
    a.floor = ax.plot([1.0], [1.0], "^", color="C1", ms=6, label="floor at measured bandwidth")[0]
    a.sheet = ax.plot([1.0], [1.0], "v", color="C3", ms=6, label="floor at datasheet bandwidth")[0]
    a.pick = ax.plot([1.0], [1.0], "s", mfc="none", mec="k", ms=11, label="selected row")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("published tokens/s (gpt-fast, A100)")
    ax.set_ylabel("tokens/s, book's model")
    ax.grid(True)
    return a


def _draw_repro(a, pub, model, floor, sheet, pick_x, pick_y) -> None:
    a.model.set_data(pub, model)
    a.floor.set_data(pub, floor)
    a.sheet.set_data(pub, sheet)
    a.pick.set_data([pick_x], [pick_y])
    lo, hi = min(min(pub), min(model)) / 1.5, max(max(sheet), max(pub)) * 1.5
    a.diag.set_data([lo, hi], [lo, hi])
    a.ax.set_xlim(lo, hi)
    a.ax.set_ylim(lo, hi)
    figures.legend(a.ax, [a.model, a.floor, a.sheet, a.diag, a.pick], fontsize=7, loc="upper left")


_REPRO = figures.LiveFigure(6.0, 3.4, _build_repro, _draw_repro)
_ROWS = ("llama-2-7b TP1", "llama-2-7b TP2", "llama-2-7b TP4", "llama-2-7b TP8", "llama-2-70b TP8")


@explorer(
    "behavioral.reproduce",
    row=Choice(_ROWS, label="published row"),
    context=IntRange(16, 4096, log=True, label="context (tokens)"),
    streaming_pct=FloatRange(60.0, 100.0, 0.5, label="measured / datasheet bandwidth (%)"),
)
def reproduce_view(row: str, context: int, streaming_pct: float) -> View:
    """N084: gpt-fast's published batch-1 decode table against the book's model, row by row."""
    from lib.judgment import reproduce

    if row not in _ROWS:
        raise ValueError(f"row must be one of {', '.join(_ROWS)}, got {row!r}")
    if not (isinstance(streaming_pct, int | float) and math.isfinite(streaming_pct) and 60 <= streaming_pct <= 100):
        raise ValueError(f"streaming_pct must be in [60, 100], got {streaming_pct!r}")
    table = reproduce.gpt_fast_table(context, streaming_pct / 100)
    m, tp = row.split(" TP")
    r = next(x for x in table if x.model == m and x.tp == int(tp))
    rows = [("published (gpt-fast README)", f"{sig(r.published)} tokens/s"),
            ("floor at datasheet bandwidth", f"{sig(r.floor_datasheet)} tokens/s"),
            (f"floor at {sig(streaming_pct)}% of it", f"{sig(r.floor_measured)} tokens/s ({sig(r.explained_by_bandwidth)}x)"),
            ("book's decode step", f"{sig(r.modelled)} tokens/s ({sig(r.explained_by_step)}x for the step's overheads)"),
            ("model against published", f"{r.gap:+.1%}"),
            ("worst row of the table", f"{reproduce.worst_gap(table).model} TP{reproduce.worst_gap(table).tp}: "
                                       f"{reproduce.worst_gap(table).gap:+.1%}")]
    caption = (f"Each gpt-fast row (batch 1, A100) at its published rate (x) against the book's model (y, log-log): "
               f"the datasheet floors sit far above the diagonal, the modelled step near it; {row} is off by {r.gap:+.1%}.")
    fig = _REPRO([x.published for x in table], [x.modelled for x in table], [x.floor_measured for x in table],
                 [x.floor_datasheet for x in table], r.published, r.modelled)
    return View(f"Reproducing gpt-fast: {row}", rows, fig, caption=caption, values={"gap": r.gap, "modelled": r.modelled})
