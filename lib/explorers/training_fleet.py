"""Explorers for the fleet equation (N037, N038, N041, N011): training time against MFU, the GPUs
a deadline needs, the price of a training token, and where a training step's time goes.

Views call lib only (:mod:`lib.training.flops`, :mod:`lib.training.step`,
:mod:`lib.training.reliability`); each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.units import fmt_int, fmt_pct, fmt_sci, fmt_unit, sig

DAY_S = 86400.0
MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())


def _check_band(mfu: float, mfu_low: float, mfu_high: float) -> None:
    if not mfu_low < mfu_high:
        raise ValueError(f"mfu_low ({mfu_low}) must be below mfu_high ({mfu_high})")


# ---- N037: training time against MFU ---------------------------------------------------------------


def _build_time(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    band = ax.axvspan(0.3, 0.5, color="C2", alpha=0.15, label="MFU band")
    (curve,) = ax.plot([], [], color="C0", lw=2, label="days = C / (n P MFU)")
    (dot,) = ax.plot([], [], "o", color="C3", label="stated MFU")
    ax.set_xlabel("MFU")
    ax.set_ylabel("training days (compute only)")
    ax.grid(True)
    figures.legend(ax, [curve, band, dot], loc="upper right")
    return SimpleNamespace(ax=ax, band=band, curve=curve, dot=dot)


def _draw_time(a, xs, days, mfu, day, lo, hi) -> None:
    a.curve.set_data(xs, days)
    a.dot.set_data([mfu], [day])
    a.band.set_x(lo)
    a.band.set_width(hi - lo)
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(0, float(days[0]) * 1.05)


_TIME = figures.LiveFigure(6.0, 2.8, _build_time, _draw_time)


@explorer(
    "training.training_time",
    model=Choice(MODELS),
    tokens_t=FloatRange(0.1, 100.0, 0.1, label="training tokens (trillions)"),
    gpu=Choice(GPUS),
    n_gpus=IntRange(8, 131072, label="GPUs", log=True),
    mfu=FloatRange(0.1, 0.7, 0.01, label="MFU"),
    mfu_low=FloatRange(0.1, 0.7, 0.01, label="MFU band, low"),
    mfu_high=FloatRange(0.1, 0.7, 0.01, label="MFU band, high"),
)
def training_time(model: str, tokens_t: float, gpu: str, n_gpus: int, mfu: float, mfu_low: float,
                  mfu_high: float) -> View:
    """N037: compute-only training days from the fleet equation, and their swing over an MFU band."""
    from lib.training import flops

    _check_band(mfu, mfu_low, mfu_high)
    m = models.model(model)
    c = flops.six_n_d(m.params_active, tokens_t * 1e12)
    day = flops.training_time_s(c, n_gpus, gpu, mfu) / DAY_S
    lo_d = flops.training_time_s(c, n_gpus, gpu, mfu_high) / DAY_S
    hi_d = flops.training_time_s(c, n_gpus, gpu, mfu_low) / DAY_S
    xs = np.linspace(0.15, 0.7, 56)
    days = np.array([flops.training_time_s(c, n_gpus, gpu, float(x)) for x in xs]) / DAY_S
    chip = hardware.gpu(gpu)
    rows = [("compute C = 6 N D", f"{fmt_sci(c)} FLOP"),
            ("fleet peak (bf16 dense)", fmt_unit(n_gpus * chip.peak_flops("bf16") / 1e18, "EFLOP/s")),
            (f"days at MFU {fmt_pct(mfu)}", fmt_unit(day, "days")),
            (f"days over MFU {fmt_pct(mfu_low)} to {fmt_pct(mfu_high)}", f"{sig(lo_d)} to {sig(hi_d)}"),
            ("one MFU point near the stated MFU", fmt_unit(day / (100 * mfu), "days"))]
    caption = (f"Compute-only training days for {fmt_sci(c)} FLOP on {fmt_int(n_gpus)} x {chip.name} against MFU: a "
               f"hyperbola, {sig(hi_d)} days at {fmt_pct(mfu_low)} falling to {sig(lo_d)} at {fmt_pct(mfu_high)} "
               f"(green band); the red dot is {sig(day)} days at {fmt_pct(mfu)}.")
    fig = _TIME(xs, days, mfu, day, mfu_low, mfu_high)
    return View(f"{m.key}, {sig(tokens_t)}T tokens on {fmt_int(n_gpus)} x {chip.name}", rows, fig, caption=caption,
                values={"flops": c, "days": day, "days_low_mfu": hi_d, "days_high_mfu": lo_d})


# ---- N038: the GPUs a deadline needs, with the margin priced ------------------------------------------


MARGIN_LABELS = {"failures": "failures and restarts", "stragglers": "stragglers", "evaluation": "evaluation pauses",
                 "scale": "MFU lost to scale"}


def failure_cost(model, n_gpus: int) -> SimpleNamespace:
    """What failures cost a synchronous job of ``n_gpus`` training ``model`` (a name or a registry model):
    Llama 3's interruption rate per GPU gives the job MTBF M; a blocking checkpoint of the model's
    training state (``lib.training.checkpoint``) written at the file system's sustained rate
    (``training.checkpoint_storage_tbps``) takes C; a restart R is detection + rescheduling + init
    (``training.restart_*_minutes``) plus reading the checkpoint back at the same rate; the interval is
    Young's sqrt(2CM). Returns mtbf_s, interval_s, write_s, restart_s, checkpoint_bytes and goodput
    (``reliability.goodput``: .lost is the fraction of wall time lost)."""
    from lib.registry import assumptions
    from lib.training import checkpoint, reliability

    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise ValueError(f"n_gpus must be a positive integer, got {n_gpus!r}")
    m = models.model(model) if isinstance(model, str) else model
    ck_bytes = checkpoint.checkpoint_bytes(m)
    write_s = reliability.checkpoint_transfer_s(ck_bytes, 1, assumptions.value("training.checkpoint_storage_tbps") * 1e12)
    restart_s = 60 * sum(assumptions.value(f"training.restart_{k}_minutes") for k in ("detect", "reschedule", "init"))
    restart_s += write_s  # read the checkpoint back at the same rate
    mtbf = reliability.job_mtbf_s(n_gpus)
    tau = reliability.young_interval_s(write_s, mtbf)
    return SimpleNamespace(mtbf_s=mtbf, interval_s=tau, write_s=write_s, restart_s=restart_s, checkpoint_bytes=ck_bytes,
                           goodput=reliability.goodput(tau, write_s, mtbf, restart_s))


def fleet_plan(model: str, tokens_t: float, gpu: str, deadline_days: float, mfu: float, step_cv: float = 0.01,
               eval_tokens_b: float = 1.0, eval_every_b: float = 50.0, eval_speed: float = 0.5,
               mfu_from_smaller_fleet: bool = True) -> SimpleNamespace:
    """The fleet for a deadline: compute-only GPUs (the fleet equation solved for n), each margin term
    as a fraction of wall time lost, the margined count and its roundings. The failure and straggler
    terms depend on the fleet they apply to, so the margined count is a fixed point (a few passes).

    Terms: failures (Llama 3's rate per GPU, a blocking checkpoint of the model's state at the file
    system's sustained rate every Young interval, a restart of detection + rescheduling + init + reload,
    ``training.restart_*``); stragglers (the slowest of n ranks with step-time jitter ``step_cv``);
    evaluation (``eval_tokens_b`` billion forward-only tokens every ``eval_every_b`` billion training
    tokens at ``eval_speed`` x the training FLOP rate); scale (Llama 3's MFU at 16,384 GPUs over its MFU
    at 8,192, when the stated MFU was measured on a smaller fleet)."""
    import math

    from lib.registry import assumptions
    from lib.training import flops, stragglers

    m = models.model(model)
    if not 0 < deadline_days <= 3650:
        raise ValueError(f"deadline_days must be in (0, 3650], got {deadline_days!r}")
    c = flops.six_n_d(m.params_active, tokens_t * 1e12)
    deadline_s = deadline_days * DAY_S
    base = flops.gpus_for_deadline(c, deadline_s, gpu, mfu)
    lo, hi = assumptions.value_range("training.mfu_llama3_8k")
    scale = 1 - lo / hi if mfu_from_smaller_fleet else 0.0
    n = max(1, math.ceil(base))
    for _ in range(6):
        f = failure_cost(m, n)
        mtbf, tau, g = f.mtbf_s, f.interval_s, f.goodput
        write_s, restart_s, ck_bytes = f.write_s, f.restart_s, f.checkpoint_bytes
        if g.lost >= 0.25:  # the first-order goodput overstates the loss by about its square beyond this
            raise ValueError(f"at {n:,} GPUs the job is interrupted every {sig(mtbf / 60)} minutes against a restart of "
                             f"{sig(restart_s / 60)} minutes: failures would take a quarter of the time or more, past "
                             "the reach of the first-order failure model; relax the deadline (fewer GPUs) or shorten "
                             "the restart")
        slow = stragglers.expected_slowest(n, step_cv) - 1.0
        parts = {"failures": g.lost, "stragglers": slow / (1 + slow),
                 "evaluation": flops.eval_time_fraction(eval_tokens_b * 1e9, eval_every_b * 1e9, eval_speed),
                 "scale": scale}
        margin = flops.fleet_margin(parts.values())
        n_new = max(1, math.ceil(base * (1 + margin)))
        if n_new == n:
            break
        n = n_new
    return SimpleNamespace(model=m, flops=c, deadline_s=deadline_s, base=base, parts=parts, margin=margin,
                           margined=base * (1 + margin), n=n, pow2=flops.next_power_of_two(base * (1 + margin)),
                           mtbf_s=mtbf, interval_s=tau, write_s=write_s, restart_s=restart_s, goodput=g,
                           slowdown=slow, checkpoint_bytes=ck_bytes)


def _build_fleet(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.04, right=0.97, bottom=0.42, top=0.96)
    ax = fig.add_subplot()
    colors = ["C0", "C3", "C1", "C2", "C4"]
    bars = []
    for col, lab in zip(colors, ["compute only", *MARGIN_LABELS.values()], strict=True):
        bar = ax.barh([0], [1.0], left=[0.0], color=col)[0]
        bar.set_label(lab)
        bars.append(bar)
    line = ax.axvline(1.0, color="k", ls="--", lw=1.2, label="next power of two")
    ax.set_yticks([])
    ax.set_xlabel("GPUs")
    ax.grid(True, axis="x")
    ax.legend(handles=[*bars, line], loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=7)
    return SimpleNamespace(ax=ax, bars=bars, line=line)


def _draw_fleet(a, widths, pow2) -> None:
    left = 0.0
    for bar, w in zip(a.bars, widths, strict=True):
        bar.set_x(left)
        bar.set_width(w)
        left += w
    a.line.set_xdata([pow2, pow2])
    a.ax.set_xlim(0, max(pow2, left) * 1.05)


_FLEET = figures.LiveFigure(6.0, 2.6, _build_fleet, _draw_fleet)


@explorer(
    "training.fleet_size",
    model=Choice(MODELS),
    tokens_t=FloatRange(0.1, 100.0, 0.1, label="training tokens (trillions)"),
    gpu=Choice(GPUS),
    deadline_days=FloatRange(1.0, 365.0, 1.0, label="deadline (days)"),
    mfu=FloatRange(0.1, 0.7, 0.01, label="MFU"),
    step_cv=FloatRange(0.0, 0.05, 0.001, label="step-time jitter (CV)"),
    mfu_from_smaller_fleet=Choice((True, False), label="MFU measured on a smaller fleet"),
)
def fleet_size(model: str, tokens_t: float, gpu: str, deadline_days: float, mfu: float, step_cv: float,
               mfu_from_smaller_fleet: bool) -> View:
    """N038: GPUs for a deadline, each margin term, and the power-of-two rounding."""
    p = fleet_plan(model, tokens_t, gpu, deadline_days, mfu, step_cv, mfu_from_smaller_fleet=mfu_from_smaller_fleet)
    chip = hardware.gpu(gpu)
    adds = fleet_adds(p)
    rows = [("compute only (fleet equation)", fmt_unit(p.base, "GPUs"))]
    rows += [(f"+ {MARGIN_LABELS[k]}", f"loses {fmt_pct(v)}, {fmt_unit(d, 'GPUs')}")
             for (k, v), d in zip(p.parts.items(), adds, strict=True)]
    rows += [("margin", fmt_pct(p.margin)), ("with the margin", fmt_unit(p.margined, "GPUs")),
             ("next power of two", fmt_int(p.pow2))]
    caption = (f"GPUs to train {p.model.key} on {sig(tokens_t)}T tokens in {sig(deadline_days)} days on {chip.name} at "
               f"{fmt_pct(mfu)} MFU: {fmt_int(p.base)} for the compute (blue), {fmt_pct(p.margin)} more for the "
               f"margin terms, {fmt_int(p.margined)} in all; the dashed line is the power of two it rounds to, "
               f"{fmt_int(p.pow2)}.")
    fig = _FLEET([p.base, *adds], p.pow2)
    return View(f"Fleet for {p.model.key}, {sig(tokens_t)}T tokens in {sig(deadline_days)} days", rows, fig,
                caption=caption, values={"base": p.base, "margin": p.margin, "pow2": float(p.pow2)})


def fleet_adds(p: SimpleNamespace) -> list[float]:
    """GPUs each margin term of a :func:`fleet_plan` adds, in order (they sum to margined - base)."""
    from lib.training import flops

    terms = list(p.parts.values())
    return [p.base * (flops.fleet_margin(terms[:k]) - flops.fleet_margin(terms[:k - 1])) for k in range(1, len(terms) + 1)]


# ---- N041: the price of a training token, against an inference token -----------------------------------


def token_prices(model: str, gpu: str, mfu: float, usd_per_gpu_hour: float | None, seq_len: int, serve_tp: int,
                 serve_batch: int, serve_context: int, prompt_len: int) -> SimpleNamespace:
    """Dollars per training token (6N and with attention at ``seq_len``, :mod:`lib.training.flops`),
    per decoded token of a replica of ``serve_tp`` GPUs at ``serve_batch`` x ``serve_context``
    (:func:`lib.perf.throughput.tokens_per_s`, the decode step model), per prefilled prompt token
    (:func:`lib.perf.prefill.prefill_time`), the decode MFU, the cheapest decode token (the
    throughput ceiling) and the batch at which a decoded token costs as much as a training token."""
    import math

    from lib.perf import throughput as th
    from lib.perf.deployment import deployment
    from lib.perf.memory import gpu_hour_cost
    from lib.perf.prefill import prefill_time
    from lib.training import flops

    m, chip = models.model(model), hardware.gpu(gpu)
    price = gpu_hour_cost(1, usd_per_gpu_hour)
    per_flop = flops.usd_per_flop(gpu, mfu, price)
    train_6n = per_flop * 6 * m.params_active
    train_attn = flops.usd_per_training_token(m, seq_len, gpu, mfu, price)
    dep = deployment(m, gpu, tp=serve_tp)
    replica_usd_s = gpu_hour_cost(serve_tp, price) / 3600.0
    x = th.tokens_per_s(dep, serve_batch, serve_context)
    decode = replica_usd_s / x
    fwd = m.flops_per_token(serve_context)
    decode_mfu = x * fwd / (serve_tp * chip.peak_flops("bf16"))
    ceiling = th.throughput_ceiling(dep, serve_context)
    kv_batch = dep.budget.max_concurrency(serve_context)
    even = th.batch_for_tokens_per_s(dep, serve_context, replica_usd_s / train_6n)
    pf_batch = max(1, min(64, 16384 // prompt_len))
    pf = prefill_time(dep, prompt_len, pf_batch)
    prefill = replica_usd_s * pf.time_s / (pf_batch * prompt_len)
    return SimpleNamespace(model=m, chip=chip, price=price, per_flop=per_flop, train_6n=train_6n,
                           train_attn=train_attn, dep=dep, decode_tokens_s=x, decode=decode, decode_mfu=decode_mfu,
                           decode_fwd_flops=fwd, ceiling_usd=replica_usd_s / ceiling, kv_batch=kv_batch,
                           even_batch=even if math.isfinite(even) else math.inf, prefill=prefill, prefill_batch=pf_batch,
                           replica_usd_s=replica_usd_s)


def _build_cost(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    (decode,) = ax.plot([], [], color="C0", lw=2, label="decoded token")
    train = ax.axhline(1.0, color="C3", lw=1.5, label="training token (6N)")
    prefill = ax.axhline(1.0, color="C2", lw=1.2, ls=":", label="prompt token (prefill)")
    kv = ax.axvline(1.0, color="k", lw=1.0, ls="--", label="KV cache full")
    (dot,) = ax.plot([], [], "o", color="C1", label="stated batch")
    figures.log_scale(ax, "both")
    ax.set_xlabel("decode batch (sequences)")
    ax.set_ylabel("US dollars per million tokens")
    ax.grid(True)
    return SimpleNamespace(ax=ax, decode=decode, train=train, prefill=prefill, kv=kv, dot=dot)


def _draw_cost(a, batches, per_m, train_m, prefill_m, kv_batch, batch, at_m) -> None:
    a.decode.set_data(batches, per_m)
    a.train.set_ydata([train_m, train_m])
    a.prefill.set_ydata([prefill_m, prefill_m])
    a.kv.set_xdata([kv_batch, kv_batch])
    a.kv.set_visible(kv_batch <= batches[-1])
    a.dot.set_data([batch], [at_m])
    lo = min(min(per_m), train_m, prefill_m)
    hi = max(max(per_m), train_m)
    a.ax.set_xlim(batches[0], batches[-1])
    a.ax.set_ylim(lo / 2, hi * 2)
    figures.legend(a.ax, [a.decode, a.train, a.prefill, a.kv, a.dot], loc="upper right")


_COST = figures.LiveFigure(6.0, 2.9, _build_cost, _draw_cost)


@explorer(
    "training.token_cost",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    mfu=FloatRange(0.1, 0.7, 0.01, label="training MFU"),
    usd_per_gpu_hour=FloatRange(0.5, 20.0, 0.1, label="USD per GPU-hour"),
    serve_tp=Choice((1, 2, 4, 8), label="serving TP"),
    serve_batch=IntRange(1, 1024, label="decode batch", log=True),
    serve_context=IntRange(128, 32768, label="decode context (tokens)", log=True),
)
def token_cost(model: str, gpu: str, mfu: float, usd_per_gpu_hour: float, serve_tp: int, serve_batch: int,
               serve_context: int) -> View:
    """N041: dollars per training token against a decoded and a prefilled token on the same GPUs."""
    from lib.perf import throughput as th

    window = models.model(model).max_position_embeddings
    p = token_prices(model, gpu, mfu, usd_per_gpu_hour, min(8192, window), serve_tp, serve_batch,
                     min(serve_context, window), min(2048, window))
    batches = [2**k for k in range(0, 11)]
    per_m = [p.replica_usd_s / th.tokens_per_s(p.dep, b, serve_context) * 1e6 for b in batches]
    rows = [("training token (6N)", f"{fmt_unit(p.train_6n * 1e6, 'microdollars')} at {fmt_pct(mfu)} MFU"),
            (f"decoded token, batch {serve_batch}", f"{fmt_unit(p.decode * 1e6, 'microdollars')} at {fmt_pct(p.decode_mfu)} MFU"),
            ("prompt token (prefill)", fmt_unit(p.prefill * 1e6, "microdollars")),
            ("cheapest decoded token (ceiling)", fmt_unit(p.ceiling_usd * 1e6, "microdollars")),
            ("decode matches training at batch", "never" if p.even_batch == float("inf") else sig(p.even_batch)),
            ("KV cache holds", fmt_unit(p.kv_batch, "sequences"))]
    even = ("no batch brings a decoded token down to a training token's price" if p.even_batch > p.kv_batch else
            f"a decoded token gets as cheap as a training token only from batch {sig(p.even_batch)}")
    caption = (f"US dollars per million tokens for {p.model.key} on {p.chip.name}: decoding (blue) against the batch at "
               f"{fmt_int(serve_context)} tokens of context, a training token (red) and a prompt token (green, dotted); "
               f"{even} (the KV cache holds {sig(p.kv_batch)} sequences, dashed).")
    fig = _COST(batches, per_m, p.train_6n * 1e6, p.prefill * 1e6, p.kv_batch, serve_batch, p.decode * 1e6)
    return View(f"{p.model.key}: a training token against an inference token", rows, fig, caption=caption,
                values={"train": p.train_6n, "decode": p.decode, "prefill": p.prefill})


# ---- N011: MFU from a step time, and where the rest of the step goes ------------------------------------


def mfu_breakdown(model: str, gpu: str, tp: int, pp: int, dp: int, seq_len: int, micro_batches: int, interleave: int,
                  recompute: str, step_s: float) -> SimpleNamespace:
    """MFU of a measured ``step_s`` on a layout (:func:`lib.training.flops.mfu`), and the measured step
    split into the step model's buckets (:func:`lib.training.step.training_step`) plus the residual the
    model does not explain (measured - modelled; negative when the model is slower than the measurement)."""
    from lib.inputs import real
    from lib.training import flops
    from lib.training.step import TrainingLayout, training_step

    t = real("step_s", step_s, 0, low_open=True, unit="seconds")
    lay = TrainingLayout(model, gpu, tp=tp, pp=pp, dp=dp, seq_len=seq_len, micro_batch=1, micro_batches=micro_batches,
                         interleave=interleave, recompute=recompute)
    st = training_step(lay)
    mfu = flops.mfu(lay.tokens_per_step / t, lay.mdl, seq_len, lay.n_gpus, lay.chip)
    hfu = mfu * flops.hardware_flops_per_token(lay.mdl, seq_len, recompute) / flops.model_flops_per_token(lay.mdl, seq_len)
    if hfu > 1:
        raise ValueError(f"a {sig(t)} s step on {lay.label} would execute {fmt_pct(hfu)} of the dense peak: faster than "
                         f"the hardware; step_s must be at least {sig(t * hfu)} s")
    shares = {k: v / t for k, v in st.buckets.items()}
    shares["not modelled"] = (t - st.step_s) / t
    return SimpleNamespace(layout=lay, step=st, step_s=t, mfu=mfu, hfu=hfu, shares=shares)


def _build_mfu(fig, n) -> SimpleNamespace:
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.15, top=0.97)
    ax = fig.add_subplot()
    bars = ax.barh(range(n), [0.0] * n, color="C0")
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel("share of the measured step")
    ax.grid(True, axis="x")
    return SimpleNamespace(ax=ax, bars=bars)


def _draw_mfu(a, labels, shares) -> None:
    for i, bar in enumerate(a.bars):
        shown = i < len(labels)
        bar.set_visible(shown)
        bar.set_width(shares[i] if shown else 0.0)
        if shown:
            bar.set_color("C2" if i == 0 else "C7" if labels[i] == "not modelled" else "C3")
    a.ax.set_yticks(range(len(labels)), labels, fontsize=7)
    a.ax.set_ylim(len(labels) - 0.5, -0.5)
    a.ax.set_xlim(min(0.0, min(shares)) * 1.1, max(shares) * 1.1)


_MFU = figures.LiveFigure(6.0, 3.0, _build_mfu, _draw_mfu)


@explorer(
    "training.mfu",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP"),
    pp=IntRange(1, 32, label="PP"),
    dp=IntRange(1, 1024, label="DP", log=True),
    seq_len=IntRange(1024, 32768, label="sequence (tokens)", log=True),
    micro_batches=IntRange(1, 128, label="micro-batches per step"),
    interleave=IntRange(1, 8, label="virtual stages per GPU"),
    recompute=Choice(("none", "selective", "full"), label="recompute"),
    step_s=FloatRange(0.1, 120.0, 0.1, label="measured step (s)"),
)
def mfu_view(model: str, gpu: str, tp: int, pp: int, dp: int, seq_len: int, micro_batches: int, interleave: int,
             recompute: str, step_s: float) -> View:
    """N011: MFU and HFU of a measured step, and the step model's account of the rest."""
    b = mfu_breakdown(model, gpu, tp, pp, dp, seq_len, micro_batches, interleave, recompute, step_s)
    items = [(k, v) for k, v in b.shares.items() if abs(v) > 1e-4 or k == "model FLOPs at peak"]
    labels, shares = [k for k, _ in items], [v for _, v in items]
    rows = [("layout", b.layout.label), ("tokens per step", fmt_int(b.layout.tokens_per_step)),
            ("MFU of the measured step", fmt_pct(b.mfu)), ("HFU (recompute counted)", fmt_pct(b.hfu)),
            ("modelled step / MFU", f"{sig(b.step.step_s)} s / {fmt_pct(b.step.mfu)}")]
    rows += [(k, fmt_pct(v)) for k, v in items[1:]]
    top = max(items[1:], key=lambda kv: kv[1])
    caption = (f"The measured {sig(step_s)} s step of {b.layout.label}, split: model FLOPs at the dense peak (green) "
               f"are {fmt_pct(b.mfu)}; the largest loss is {top[0]} ({fmt_pct(top[1])}); grey is what the step model "
               "does not explain.")
    fig = _MFU(labels, shares, layout=(11,))
    return View(f"MFU of {b.layout.label}", rows, fig, caption=caption,
                values={"mfu": b.mfu, "hfu": b.hfu, "model_step_s": b.step.step_s})
