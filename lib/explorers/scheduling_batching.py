"""Explorers for the batching questions of the scheduling section (W02, I019, I020, I064, N028).

Each view calls lib only: the simulator (:func:`lib.scheduling.simulate`) with an analytic step
cost where the point is the schedule itself, the batching closed forms
(:mod:`lib.scheduling.batching`), and the book's step models (:mod:`lib.perf.step`,
:mod:`lib.scheduling.cost`) where the point is time.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.scheduling import LinearCost, LogNormal, Policy, Workload, simulate
from lib.scheduling import batching as bt
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

# ---- W02: static vs continuous batching, slot by slot --------------------------------------------

STEPS_SHOWN = 3000  # about this many static steps are simulated: 2 to 12 batches


def _schedule_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.14, top=0.9)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.static_live, = ax.plot([], [], color="#c44e52", lw=1.2, drawstyle="steps-post", label="static: live sequences")
    a.pad, = ax.plot([], [], color="#999999", lw=1.0, ls="--", drawstyle="steps-post",
                     label="static: padding (finished, slot still held)")
    a.cont_live, = ax.plot([], [], color="#4c72b0", lw=1.4, drawstyle="steps-post",
                           label="continuous: live sequences")
    a.cap = ax.axhline(1.0, color="black", ls=":", lw=0.8, label="batch (slots)")
    ax.set_ylabel("sequences")
    ax.set_xlabel("engine step (every step costs the same)")
    ax.grid(True)
    return a


def _schedule_draw(a: SimpleNamespace, static_steps, static_live, static_held, cont_steps, cont_live,
                   batch: int, title: str) -> None:
    a.static_live.set_data(static_steps, static_live)
    a.pad.set_data(static_steps, static_held - static_live)
    a.cont_live.set_data(cont_steps, cont_live)
    a.cap.set_ydata([batch, batch])
    a.ax.set_xlim(0, max(static_steps[-1], cont_steps[-1]) * 1.02 + 1)
    a.ax.set_ylim(0, batch * 1.35 + 0.5)
    a.ax.set_title(title, loc="left")
    figures.legend(a.ax, [a.static_live, a.pad, a.cont_live, a.cap], fontsize=7, loc="upper right", ncol=2)


_SCHEDULE_FIGURE = figures.LiveFigure(6.4, 3.2, _schedule_build, _schedule_draw)


def _occupancy(res) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step starts, live sequences, slots held) of a run whose every step costs 1, kept only where
    a value changes (a step line needs no more): live = decodes plus the requests prefilling
    (their first token), held = live + static padding; a last point closes the line."""
    tl = res.timeline
    prefilling = np.array([len(ch) for ch in tl.chunks], dtype=float)
    live = tl.decode_tokens + prefilling
    held = live + tl.padding
    keep = np.ones(len(live), dtype=bool)
    keep[1:] = (np.diff(live) != 0) | (np.diff(held) != 0)
    return (np.append(tl.start_s[keep], tl.end_s[-1]), np.append(live[keep], live[-1]),
            np.append(held[keep], held[-1]))


def _live_share(res, batch: int | None = None) -> float:
    """Live sequences over held slots, step by step (every step costs 1); with ``batch``, over
    ``batch`` slots and only while requests wait (the final drain excluded)."""
    tl = res.timeline
    live = tl.decode_tokens + np.array([len(ch) for ch in tl.chunks], dtype=float)
    if batch is None:
        return float(live.sum() / (live + tl.padding).sum())
    busy = tl.waiting > 0
    return float(live[busy].sum() / (batch * busy.sum())) if busy.any() else 1.0


@explorer(
    "scheduling.static_vs_continuous",
    batch=IntRange(1, 128, log=True, label="batch (slots)"),
    output_median=IntRange(1, 1024, log=True, label="output length median (tokens)"),
    output_sigma=FloatRange(0.0, 2.5, 0.1, label="output length sigma (log-normal; 0: all equal)"),
    max_tokens=IntRange(16, 1024, log=True, label="max_tokens (cap)"),
)
def static_vs_continuous(batch: int, output_median: int, output_sigma: float, max_tokens: int) -> View:
    """W02: the slots of static and continuous batching on the same requests, every step costing
    the same (the decode-bound limit), against the closed form E[L] / E[max of B]."""
    if output_median > max_tokens:
        raise ValueError(f"output_median={output_median} is above max_tokens={max_tokens}: every reply would be cut")
    out = LogNormal(output_median, output_sigma, cap=max_tokens)
    mean, top = bt.length_mean(out), bt.expected_max_length(out, batch)
    eff = mean / top
    batches = int(min(12, max(2, STEPS_SHOWN // top)))
    n = batches * batch
    # one time unit per step, one-token prompts (prefill negligible), one KV block per request
    cost = LinearCost(fixed_s=1.0, max_running=batch, token_budget=max(batch, 1 << 16), kv_blocks=batch + 1,
                      block_size=max_tokens + 1)
    wl = Workload(prompt=1, output=out, arrival="burst", rate=None, n_requests=n, max_tokens=max_tokens)
    static = simulate(wl, Policy(batching="static", max_running=batch), cost, seed=0)
    cont = simulate(wl, Policy(max_running=batch), cost, seed=0)
    s_steps, s_live, s_held = _occupancy(static)
    c_steps, c_live, _ = _occupancy(cont)
    useful = _live_share(static)  # static: live share of the held slots
    c_busy = _live_share(cont, batch)  # continuous: of its slots, while requests wait
    fig = _SCHEDULE_FIGURE(
        s_steps, s_live, s_held, c_steps, c_live, batch,
        f"{n} requests: static {static.end_s:,.0f} steps ({fmt_pct(useful)} of held slots live), "
        f"continuous {cont.end_s:,.0f} steps",
    )
    rows = [
        ("mean output E[L]", f"{sig(mean)} tokens"),
        (f"longest of {batch}, E[max]", f"{sig(top)} tokens"),
        ("static slot efficiency E[L] / E[max]", fmt_pct(eff)),
        (f"  simulated here ({batches} batches)", fmt_pct(useful)),
        ("continuous: slots live while requests wait", fmt_pct(c_busy)),
        ("continuous gain, closed form E[max] / E[L]", f"{sig(1 / eff)}x"),
        ("  simulated here (live share continuous / static)", f"{sig(c_busy / useful)}x"),
    ]
    note = ("Red: each static batch runs until its longest member ends, and the grey dashed line counts the "
            "slots its finished members still hold (padding). Blue: continuous batching refills a slot the "
            "step it frees, so every slot stays live while requests wait and the same requests finish "
            "sooner; its tail is the last requests draining, which a server with a steady stream never "
            f"reaches. {batches} batches are a small sample of a heavy tail: the closed form is the long-run value.")
    caption = (f"Red: the live sequences of each static batch, which holds its slots until its longest member ends (grey "
               f"dashed: slots held by finished members); blue: continuous batching, refilling a slot the step it frees. "
               f"Static keeps {fmt_pct(useful)} of its held slots live and takes {fmt_int(static.end_s)} steps for the "
               f"{n} requests, continuous {fmt_int(cont.end_s)}.")
    return View(f"batch {batch}, outputs log-normal (median {output_median}, sigma {output_sigma:g}, cap {max_tokens})",
                rows, fig, note, caption=caption,
                values={"efficiency": eff, "simulated_efficiency": useful, "continuous_live": c_busy,
                        "gain": 1 / eff, "simulated_gain": c_busy / useful})


# ---- I019: the token budget as a point on the roofline ------------------------------------------

_MODELS = tuple(models.model_names())
_GPUS = tuple(hardware.gpu_names())


def budget_points(dep, batch: int, context: int, tpot_target_s: float) -> dict:
    """The token budgets one replica's step defines (tokens per step, decodes included), from lib:

    ``paper``: the datasheet crossover of the weight GEMMs (:func:`lib.perf.prefill.weight_read_crossover_tokens`);
    ``knee``: ``batch`` decodes plus the prefill tokens that ride free beside them on the step model
    (:func:`lib.scheduling.batching.free_prefill_tokens`); ``tpot``: the most a step may carry and
    stay within ``tpot_target_s`` (:func:`lib.scheduling.batching.prefill_tokens_within`; 0 when the
    decodes alone exceed it); ``default``: the engine's max_num_batched_tokens."""
    from lib.perf.prefill import weight_read_crossover_tokens
    from lib.scheduling import step_cost

    cost = step_cost(dep, max_batch=batch)
    ctx = batch * context
    try:
        tpot = batch + bt.prefill_tokens_within(cost, batch, ctx, tpot_target_s)
    except ValueError:
        tpot = 0
    return {
        "paper": weight_read_crossover_tokens(dep.mdl, dep.chip, dep.weight_dtype, dep.compute_dtype),
        "knee": batch + bt.free_prefill_tokens(cost, batch, ctx),
        "tpot": tpot,
        "default": dep.max_num_batched_tokens,
        "cost": cost,
    }


def _budget_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.paper_curve, = ax.plot([], [], color="grey", lw=1.5, ls="--", label="datasheet roofline (weights alone)")
    a.model_curve, = ax.plot([], [], color="#4c72b0", lw=2, label="modelled step")
    a.paper = ax.axvline(1.0, color="grey", ls=":", lw=1)
    a.knee = ax.axvline(1.0, color="#55a868", lw=1.2)
    a.tpot = ax.axvline(1.0, color="#c44e52", lw=1.2)
    a.default = ax.axvline(1.0, color="black", ls="-.", lw=1)
    ax.set_xlabel("tokens per step (decodes + prefill chunk)")
    ax.set_ylabel("tokens/s through the step")
    ax.grid(True)
    return a


def _budget_draw(a: SimpleNamespace, ts, paper_tps, model_tps, pts: dict, batch: int) -> None:
    a.paper_curve.set_data(ts, paper_tps)
    a.model_curve.set_data(ts, model_tps)
    a.model_curve.set_label(f"modelled step with {batch} decodes")
    for key, line, label in (("paper", a.paper, "datasheet ridge"), ("knee", a.knee, "modelled knee"),
                             ("tpot", a.tpot, "largest step within the TPOT target"),
                             ("default", a.default, "engine default budget")):
        x = pts[key]
        line.set_xdata([x, x])
        line.set_visible(x >= 1)
        line.set_label(f"{label}: {x:,.0f}")
    a.ax.set_xlim(ts[0], ts[-1])
    top = max(max(paper_tps), max(model_tps))
    a.ax.set_ylim(min(min(paper_tps), min(model_tps)) * 0.8, top * 1.5)
    figures.legend(a.ax, [a.paper_curve, a.model_curve, a.paper, a.knee, a.tpot, a.default], fontsize=7,
                   loc="lower right")


_BUDGET_FIGURE = figures.LiveFigure(6.4, 3.4, _budget_build, _budget_draw)


@explorer(
    "scheduling.token_budget",
    model=Choice(_MODELS),
    gpu=Choice(_GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True, label="running decodes"),
    context=IntRange(128, 32768, log=True, label="cached tokens per decode"),
    tpot_target=FloatRange(0.005, 0.5, 0.005, label="TPOT target (s)"),
)
def token_budget(model: str, gpu: str, tp: int, batch: int, context: int, tpot_target: float) -> View:
    """I019: tokens/s through one step against the tokens it carries, on the datasheet roofline and
    on the book's step model, with the budgets that matter marked."""
    from lib.perf.deployment import Deployment
    from lib.perf.prefill import prefill_estimate

    dep = Deployment(model, gpu, tp=tp)
    dep.mdl.check_context(context)
    fits = dep.budget.max_sequences(context)  # decodes of this context the KV pool holds at once
    if fits < 1:
        raise ValueError(f"the KV pool of {dep.label} cannot hold one sequence of {context:,} tokens")
    running = min(batch, fits)
    pts = budget_points(dep, running, context, tpot_target)
    cost = pts["cost"]
    ts = np.unique(np.geomspace(running + 1, max(4 * pts["default"], 16 * pts["knee"], 2 * pts["tpot"]),
                                28).astype(int))
    m, g = dep.mdl, dep.chip
    paper = [t / prefill_estimate(m, g, int(t), tp, 1.0, dep.weight_dtype, dep.compute_dtype, dep.kv_dtype,
                                  include_attention=False).time_s for t in ts]
    model_tps = [t / cost.step_s(running, running * context, [(int(t) - running, 0)]) for t in ts]
    fig = _BUDGET_FIGURE(ts, paper, model_tps, pts, running)
    step = {k: cost.step_s(running, running * context, [(int(pts[k]) - running, 0)]) if pts[k] > running
            else cost.step_s(running, running * context) for k in ("knee", "default")}
    rows = [
        ("decodes in the step", f"{running}" + ("" if running == batch else
                                                f" (the KV pool holds no more than {fits} of {context:,} tokens)")),
        ("datasheet ridge (paper knee)", f"{pts['paper']:,.0f} tokens"),
        (f"modelled knee with {running} decodes", f"{pts['knee']:,} tokens, step {fmt_time(step['knee'])}"),
        ("largest step within the TPOT target",
         f"{pts['tpot']:,} tokens" if pts["tpot"] else "none: the decodes alone exceed it"),
        ("engine default budget", f"{pts['default']:,} tokens, step {fmt_time(step['default'])}"),
        ("decode step alone", fmt_time(cost.step_s(running, running * context))),
    ]
    note = ("Left of the knee a step's time is set by reading the weights, so tokens ride nearly free and "
            "throughput climbs with the budget; right of it every token costs compute and the step, which "
            "every running decode waits for, grows with the budget. The dashed line is the roofline on paper "
            "(peak FLOP/s, datasheet bandwidth, no overheads).")
    side = "left" if pts["default"] < pts["knee"] else "right"
    caption = (f"Tokens/s through one step against the tokens it carries: the modelled step (blue) climbs while the "
               f"weight read dominates and flattens past its knee at {fmt_int(pts['knee'])} tokens. The engine default "
               f"budget ({fmt_int(pts['default'])}) is {side} of the knee; the other vertical lines are the datasheet "
               "ridge and the largest step within the TPOT target.")
    return View(f"{model} on {tp}x {gpu}: {running} decodes at {context:,} cached tokens", rows, fig, note,
                caption=caption,
                values={k: float(v) for k, v in pts.items() if k != "cost"})


# ---- I020: goodput against the batch ------------------------------------------------------------------


def _goodput_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.tput, = ax.plot([], [], color="#4c72b0", lw=2, label="tokens/s (throughput)")
    a.good, = ax.plot([], [], color="#55a868", lw=2, ls="--", label="goodput (steps within the TPOT target)")
    a.b0 = ax.axvline(1.0, color="grey", ls=":", lw=1)
    a.b2 = ax.axvline(1.0, color="grey", ls="--", lw=1)
    a.best = ax.axvline(1.0, color="#c44e52", lw=1.2)
    a.kv = ax.axvline(1.0, color="black", ls="-.", lw=1)
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("output tokens/s (replica)")
    ax.grid(True)
    return a


def _goodput_draw(a: SimpleNamespace, bs, xs, gb, gx, b0: int, best: float, kv: int) -> None:
    a.tput.set_data(bs, xs)
    floor = min(xs) / 3
    a.good.set_data(gb, [max(g, floor) for g in gx])  # log axis: zero goodput drawn at the bottom
    for line, x, label in ((a.b0, b0, f"B = {b0:,}"), (a.b2, 2 * b0, f"2B = {2 * b0:,}"),
                           (a.best, best, f"largest batch within the target = {best:,.0f}"),
                           (a.kv, kv, f"KV pool ceiling = {kv:,}")):
        line.set_xdata([x, x])
        line.set_visible(x >= 1)
        line.set_label(label)
    a.ax.set_xlim(bs[0], bs[-1])
    a.ax.set_ylim(floor * 0.9, max(xs) * 1.6)
    figures.legend(a.ax, [a.tput, a.good, a.b0, a.b2, a.best, a.kv], fontsize=7, loc="upper left")


_GOODPUT_FIGURE = figures.LiveFigure(6.4, 3.4, _goodput_build, _goodput_draw)


@explorer(
    "scheduling.goodput_vs_batch",
    model=Choice(_MODELS),
    gpu=Choice(_GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    context=IntRange(128, 32768, log=True, label="cached tokens per sequence"),
    batch=IntRange(1, 4096, log=True, label="batch B (doubled to 2B)"),
    tpot_slo=FloatRange(0.005, 0.5, 0.005, label="TPOT target (s)"),
)
def goodput_vs_batch(model: str, gpu: str, tp: int, context: int, batch: int, tpot_slo: float) -> View:
    """I020: decode throughput B / t(B) against the batch, and the goodput left once every sequence
    of the batch shares a step longer than the TPOT target (decode steps only), at B and 2B."""
    import functools

    from lib.perf import throughput as tput
    from lib.perf.deployment import Deployment

    dep = Deployment(model, gpu, tp=tp)
    dep.mdl.check_context(context)
    step = functools.cache(lambda b: tput.step_s(dep, int(b), context))
    kv = dep.budget.max_sequences(context)
    try:
        best = min(tput.batch_for_step_time(dep, context, tpot_slo), kv)
    except ValueError:
        best = 0.0  # batch 1 already misses the target
    top = max(4 * batch, 2 * best, 2 * kv, 8)
    bs = np.unique(np.geomspace(1, top, 12).astype(int).tolist() + [batch, 2 * batch])

    def goodput(b: int) -> float:
        return b / step(b) if step(b) <= tpot_slo and b <= kv else 0.0

    xs = [b / step(b) for b in bs]
    # goodput: throughput up to the edge, then a vertical drop to zero at it
    edge = int(best)
    gb = [b for b in bs if b <= edge] + ([edge, edge] if edge >= 1 else []) + [b for b in bs if b > edge]
    gx = ([b / step(b) for b in bs if b <= edge] + ([edge / step(edge), 0.0] if edge >= 1 else [])
          + [0.0 for b in bs if b > edge])
    fig = _GOODPUT_FIGURE(bs, xs, gb, gx, batch, best, kv)
    rows = [
        (f"step at B = {batch:,} and 2B = {2 * batch:,}", f"{fmt_time(step(batch))} and {fmt_time(step(2 * batch))}"),
        ("tokens/s at B and 2B", f"{sig(batch / step(batch))} and {sig(2 * batch / step(2 * batch))} "
                                 f"(+{fmt_pct(step(batch) * 2 / step(2 * batch) - 1)})"),
        ("goodput at B and 2B", f"{sig(goodput(batch))} and {sig(goodput(2 * batch))}"),
        ("largest batch within the target", f"{best:,.1f}" if best else "none: batch 1 misses it"),
        ("KV pool ceiling at this context", f"{kv:,} sequences"),
    ]
    note = ("Every sequence of a batch waits for the same step, so per-user speed is 1 / t(B) for all of them: "
            "goodput follows throughput up to the batch whose step meets the target, then drops to zero at "
            "once. Decode steps only; prompts mixed into the steps move the cliff left (the simulation in the "
            "notebook).")
    cliff = (f"drops to zero past a batch of {sig(best)}, where the shared step passes the TPOT target of "
             f"{fmt_time(tpot_slo)}" if best >= 1 else
             f"is zero at every batch: even batch 1 misses the TPOT target of {fmt_time(tpot_slo)}")
    caption = (f"Throughput (blue) keeps rising with the batch, but goodput (green, dashed) {cliff}. At B = "
               f"{fmt_int(batch)} goodput is {sig(goodput(batch))} tokens/s, at 2B {sig(goodput(2 * batch))}.")
    return View(f"{model} on {tp}x {gpu}, {context:,} cached tokens, TPOT target {fmt_time(tpot_slo)}", rows, fig,
                note, caption=caption, values={"best": float(best), "kv": float(kv), "goodput_b": goodput(batch),
                              "goodput_2b": goodput(2 * batch), "gain_2b": step(batch) * 2 / step(2 * batch)})


# ---- I064: long outputs and a KV footprint that keeps growing --------------------------------------


def _kv_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.cohort, = ax.plot([], [], color="#c44e52", lw=2, label="admitted together: all at the same length")
    a.steady = ax.axhline(1.0, color="#4c72b0", lw=1.5, ls="--", label="steady stream: the average they hold")
    a.pool = ax.axhline(1.0, color="black", lw=1.2, label="KV pool")
    a.dry = ax.axvline(1.0, color="grey", ls=":", lw=1)
    ax.set_xlabel("tokens generated per sequence")
    ax.set_ylabel("KV held, GB per GPU")
    ax.grid(True)
    return a


def _kv_draw(a: SimpleNamespace, gs, held, steady: float, pool: float, dry: float) -> None:
    a.cohort.set_data(gs, held)
    a.steady.set_ydata([steady, steady])
    a.pool.set_ydata([pool, pool])
    a.dry.set_xdata([dry, dry])
    a.dry.set_visible(0 < dry < gs[-1])
    a.dry.set_label(f"pool runs dry at {dry:,.0f} tokens")
    a.ax.set_xlim(0, gs[-1])
    a.ax.set_ylim(0, max(max(held), pool, steady) * 1.1)
    figures.legend(a.ax, [a.cohort, a.steady, a.pool, a.dry], fontsize=7, loc="upper left")


_KV_FIGURE = figures.LiveFigure(6.4, 3.2, _kv_build, _kv_draw)


@explorer(
    "scheduling.long_output_kv",
    model=Choice(_MODELS),
    gpu=Choice(_GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    prompt=IntRange(16, 8192, log=True, label="prompt tokens"),
    output_median=IntRange(64, 32768, log=True, label="reply median (tokens)"),
    output_sigma=FloatRange(0.0, 1.5, 0.1, label="reply spread (sigma of ln)"),
    max_tokens=IntRange(256, 131072, log=True, label="max_tokens (cap)"),
    clients=IntRange(1, 1024, log=True, label="sequences running"),
)
def long_output_kv(model: str, gpu: str, tp: int, prompt: int, output_median: int, output_sigma: float,
                   max_tokens: int, clients: int) -> View:
    """I064: the KV a batch of long replies holds as it generates, against the pool; the batch the pool
    sustains in a steady stream; and the time a user waits for a long reply at that batch's step."""
    from lib.perf.deployment import Deployment
    from lib.perf.step import decode_step

    if output_median > max_tokens:
        raise ValueError(f"output_median={output_median} is above max_tokens={max_tokens}: every reply would be cut")
    dep = Deployment(model, gpu, tp=tp)
    dep.mdl.check_context(prompt + max_tokens)
    budget = dep.budget
    per_token = budget.kv_bytes_per_token_per_gpu
    pool_tokens = budget.token_capacity
    out = LogNormal(output_median, output_sigma, cap=max_tokens)
    resident = bt.resident_kv_tokens(prompt, out)
    steady_batch = pool_tokens / resident
    worst = budget.max_sequences(prompt + max_tokens)
    gs = np.linspace(0, max_tokens, 64)
    held = clients * (prompt + gs) * per_token / 1e9
    dry = pool_tokens / clients - prompt
    fig = _KV_FIGURE(gs, held, clients * resident * per_token / 1e9, budget.kv_cache_bytes / 1e9, dry)
    running = max(1, min(clients, int(steady_batch), dep.max_num_seqs))
    step = decode_step(dep, running, int(resident)).total_s
    rows = [
        ("KV per token, per GPU", fmt_bytes(per_token, "KB")),
        ("KV pool", f"{pool_tokens:,} tokens ({budget.kv_cache_bytes / 1e9:.1f} GB per GPU)"),
        ("mean tokens a running sequence holds", f"{resident:,.0f} (length-biased: long replies stay longer)"),
        ("batch the pool sustains in a steady stream", f"{steady_batch:,.1f}"),
        ("batch if each reserves prompt + max_tokens", f"{worst:,}"),
        (f"{clients} admitted together run the pool dry at", f"{dry:,.0f} tokens each" if dry > 0 else "admission"),
        (f"step at {running} sequences (TPOT)", fmt_time(step)),
        (f"a {max_tokens:,}-token reply at that TPOT", fmt_time(max_tokens * step)),
    ]
    note = ("Red: the KV of sequences admitted together grows by one token per step each until the pool "
            "(black) runs dry and the scheduler must preempt. Blue: in a steady stream the sequences are at "
            "all stages, so they hold the length-biased average; the batch the pool sustains is the pool "
            "over that average, far below what the prompts alone would admit.")
    if dry <= 0:
        fate = ", but their prompts alone overflow the pool (black)"
    elif dry < max_tokens:
        fate = f" and runs the pool (black) dry after {fmt_int(dry)} tokens each"
    else:
        fate = " and stays within the pool (black) up to max_tokens"
    caption = (f"Red: the KV of {clients} sequences admitted together grows one token per step each{fate}. Blue: "
               f"a steady stream holds the length-biased average instead, so the pool sustains {sig(steady_batch)} "
               "sequences.")
    return View(f"{model} on {tp}x {gpu}: {clients} sequences, prompt {prompt:,}, replies median {output_median:,}",
                rows, fig, note, caption=caption, values={"steady_batch": steady_batch, "worst": float(worst), "dry": dry,
                                         "step": step})


# ---- N028: offline batches, ragged prompts and the memory that stops them ---------------------------


def _offline_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.packed, = ax.plot([], [], color="#4c72b0", lw=2, marker="o", ms=3, label="prefill, prompts packed")
    a.padded, = ax.plot([], [], color="#c44e52", lw=2, marker="o", ms=3, label="prefill, prompts padded to the longest")
    a.kv_packed = ax.axvline(1.0, color="#4c72b0", ls="--", lw=1)
    a.kv_padded = ax.axvline(1.0, color="#c44e52", ls="--", lw=1)
    ax.set_xlabel("requests in one batch")
    ax.set_ylabel("prefill pass (s)")
    ax.grid(True)
    return a


def _offline_draw(a: SimpleNamespace, bs, packed, padded, kv_packed: int, kv_padded: int) -> None:
    a.packed.set_data(bs, packed)
    a.padded.set_data(bs, padded)
    for line, x, label in ((a.kv_packed, kv_packed, "KV holds this many, packed"),
                           (a.kv_padded, kv_padded, "KV holds this many, padded")):
        line.set_xdata([x, x])
        line.set_visible(x >= 1)
        line.set_label(f"{label}: {x:,}")
    a.ax.set_xlim(bs[0] * 0.8, max(bs[-1], kv_packed, 2) * 1.25)
    a.ax.set_ylim(min(packed) * 0.7, max(padded) * 1.4)
    figures.legend(a.ax, [a.packed, a.padded, a.kv_packed, a.kv_padded], fontsize=7, loc="upper left")


_OFFLINE_FIGURE = figures.LiveFigure(6.4, 3.2, _offline_build, _offline_draw)


@explorer(
    "scheduling.offline_batch",
    model=Choice(_MODELS),
    gpu=Choice(_GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    n_requests=IntRange(2, 1024, log=True, label="requests in the job (one has nothing to batch with)"),
    prompt_median=IntRange(16, 8192, log=True, label="prompt median (tokens)"),
    prompt_sigma=FloatRange(0.0, 1.5, 0.1, label="prompt spread (sigma of ln)"),
    max_tokens=IntRange(16, 8192, log=True, label="max_tokens (reply cap)"),
)
def offline_batch(model: str, gpu: str, tp: int, n_requests: int, prompt_median: int, prompt_sigma: float,
                  max_tokens: int) -> View:
    """N028: one prefill pass over a batch of ragged prompts, packed (each prompt its own length) or
    padded to the longest, and the batch the KV pool holds either way (prompt + max_tokens each)."""
    from lib.perf.deployment import Deployment
    from lib.scheduling import step_cost

    dep = Deployment(model, gpu, tp=tp)
    cap = dep.mdl.max_position_embeddings - max_tokens
    if cap < 1:
        raise ValueError(f"max_tokens={max_tokens:,} leaves no room for a prompt in {model}'s "
                         f"{dep.mdl.max_position_embeddings:,}-token window")
    prompts = LogNormal(prompt_median, prompt_sigma, cap=cap).sample(np.random.default_rng(0), n_requests)
    cost = step_cost(dep, max_batch=1)
    bs = sorted({min(n_requests, 2**k) for k in range(11)} | {n_requests})
    packed = [cost.pass_s(0, [(int(p), 0) for p in prompts[:b]]) for b in bs]
    padded = [cost.pass_s(0, [(int(prompts[:b].max()), 0)] * b) for b in bs]
    kv_packed = dep.budget.max_sequences(int(round(prompts.mean())) + max_tokens)
    kv_padded = dep.budget.max_sequences(int(prompts.max()) + max_tokens)
    fig = _OFFLINE_FIGURE(bs, packed, padded, kv_packed, kv_padded)
    waste = 1 - prompts.sum() / (n_requests * prompts.max())
    rows = [
        ("prompt tokens, packed / padded", f"{int(prompts.sum()):,} / {n_requests * int(prompts.max()):,} "
                                           f"({fmt_pct(waste)} padding)"),
        (f"one prefill pass over {n_requests:,}, packed / padded", f"{fmt_time(packed[-1])} / {fmt_time(padded[-1])}"),
        ("batch the KV pool holds (prompt + max_tokens each), packed / padded", f"{kv_packed:,} / {kv_padded:,}"),
        (f"batches for {n_requests:,} requests, packed / padded",
         f"{-(-n_requests // max(kv_packed, 1)):,} / {-(-n_requests // max(kv_padded, 1)):,}"),
    ]
    note = ("Padding every prompt to the longest in the batch computes and stores tokens that do not exist: "
            "the red line sits above the blue one by the padding share, and the padded batch hits the KV pool "
            "(dashed lines) at a smaller size. Packing (variable-length attention, or a continuous-batching "
            "engine) removes both.")
    caption = (f"One prefill pass against the batch size, prompts packed (blue) or padded to the longest (red); padding "
               f"adds {fmt_pct(waste)} of tokens that do not exist. The dashed lines are the batches the KV pool holds: "
               f"{fmt_int(kv_packed)} packed, {fmt_int(kv_padded)} padded.")
    return View(f"{model} on {tp}x {gpu}: {n_requests:,} prompts, median {prompt_median:,}, sigma {prompt_sigma:g}",
                rows, fig, note, caption=caption, values={"waste": float(waste), "kv_packed": float(kv_packed),
                                         "kv_padded": float(kv_padded), "packed_s": packed[-1], "padded_s": padded[-1]})
