"""Explorers for the scheduling notebooks about KV memory: what a preemption costs (I016), how
much KV a batch class may hold (I023), token reservation (I091), deferred reclamation (I096)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, Text, View, explorer
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.scheduling.kv_share import DirectStepCost, batch_kv_budget, mean_step_parts
from lib.scheduling.preemption import preemption_price, swap_recompute_crossover
from lib.scheduling.reclaim_practice import RECLAIM_VARIANTS, parse_program, reclaim_variant, replay
from lib.scheduling.reservation import reservation_tradeoff
from lib.units import MS, fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())
KV_DTYPES = ("bf16", "fp8")


# ---- I016: one preemption, priced three ways ---------------------------------------------------


def _preempt_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.alone, = ax.plot([], [], color="#c44e52", label="recompute: its own prefill")
    a.riding, = ax.plot([], [], color="#dd8452", ls="--", label="recompute riding with the decodes")
    a.swap, = ax.plot([], [], color="#4c72b0", label="swap out + back in (host link)")
    a.victim = ax.axvline(1.0, color="grey", lw=1)
    ax.set_xlabel("victim's cached tokens (prompt + generated)")
    ax.set_ylabel("ms of GPU time per preemption")
    return a


def _preempt_draw(a: SimpleNamespace, xs, alone, riding, swap, victim: int) -> None:
    a.alone.set_data(xs, alone)
    a.riding.set_data(xs, riding)
    a.swap.set_data(xs, swap)
    a.victim.set_xdata([victim, victim])
    a.victim.set_label(f"this victim: {victim:,} tokens")
    positive = [v for v in (*alone, *riding, *swap) if v > 0]
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(min(positive) / 2, max(positive) * 2)
    figures.legend(a.ax, [a.alone, a.riding, a.swap, a.victim], fontsize=7, loc="upper left")


_PREEMPT_FIGURE = figures.LiveFigure(6.0, 3.0, _preempt_build, _preempt_draw)


@explorer(
    "scheduling.preemption_cost",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    victim_tokens=IntRange(16, 131072, log=True, label="victim's cached tokens"),
    decodes=IntRange(1, 1024, log=True, label="decodes in the step"),
)
def preemption_cost(model: str, gpu: str, tp: int, kv_dtype: str, victim_tokens: int, decodes: int) -> View:
    """I016: recompute vs swap for one victim, and where they cross (lib.kvcache.recompute_fetch)."""
    dep = Deployment(model, gpu, tp=tp, kv_dtype=kv_dtype)
    m = dep.mdl
    if victim_tokens > m.max_position_embeddings:
        raise ValueError(f"victim_tokens={victim_tokens:,} exceeds {model}'s context window of "
                         f"{m.max_position_embeddings:,} tokens")
    price = preemption_price(dep, victim_tokens, decodes)
    top = min(m.max_position_embeddings, 131072)
    xs = np.unique(np.geomspace(16, top, 28).astype(int))
    curves = [preemption_price(dep, int(x), decodes) for x in xs]
    alone = [c.recompute_s / MS for c in curves]
    riding = [c.recompute_riding_s / MS for c in curves]
    swap = [c.swap_round_trip_s / MS for c in curves]
    fig = _PREEMPT_FIGURE(xs, alone, riding, swap, victim_tokens)
    cross = swap_recompute_crossover(dep, decodes, high=top)
    round_trip = price.swap_round_trip_s
    cheaper = "swap" if round_trip < price.recompute_riding_s else "recompute"
    rows = [
        ("victim's KV (whole replica)", fmt_bytes(price.kv_bytes)),
        ("recompute alone", fmt_time(price.recompute_s)),
        (f"recompute riding with {decodes} decodes", fmt_time(price.recompute_riding_s)),
        ("swap out + in", fmt_time(round_trip)),
        ("cheaper for this victim", cheaper),
        ("swap wins from", f"{cross:,} tokens" if cross <= top else f"never below {top:,} tokens"),
    ]
    ratio = price.recompute_riding_s / round_trip
    note = (f"Recompute (riding) costs {sig(ratio)}x the swap round trip here. The swap line is straight (bytes "
            "over the host link); the recompute lines bend up with attention, and riding with the decodes is "
            "nearly free while the pass stays memory-bound.")
    wins = f"swap wins from {fmt_int(cross)} tokens" if cross <= top else f"swap never wins below {fmt_int(top)} tokens"
    caption = (f"GPU time to bring back a preempted request against its cached tokens: recompute its prefill alone (red) "
               f"or riding with the step's {decodes} decodes (dashed), or swap its KV out and back over the host link "
               f"(blue). For this victim of {fmt_int(victim_tokens)} tokens (grey) {cheaper} is cheaper; {wins}.")
    return View(f"{dep.label}: preempting a {victim_tokens:,}-token request", rows, fig, note, caption=caption,
                values={"recompute": price.recompute_s, "recompute_riding": price.recompute_riding_s,
                        "round_trip": round_trip, "kv_bytes": price.kv_bytes, "crossover": cross})


# ---- I023: the KV a batch class may hold -----------------------------------------------------------


def _share_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.base, = ax.plot([], [], color="#4c72b0", label="decode step: weights + interactive KV")
    a.read, = ax.plot([], [], color="#dd8452", label="+ the batch's KV read")
    a.total, = ax.plot([], [], color="#c44e52", label="+ batch prompts' prefill (mean TPOT)")
    a.target = ax.axhline(0.0, color="black", ls=":", lw=1, label="TPOT target")
    a.cap = ax.axvline(0.0, color="grey", lw=1)
    ax.set_xlabel("batch class's share of the KV pool (%)")
    ax.set_ylabel("mean decode step, ms")
    ax.grid(True)
    return a


def _share_draw(a: SimpleNamespace, xs, base, read, total, target_ms: float, cap_pct: float) -> None:
    a.base.set_data(xs, base)
    a.read.set_data(xs, read)
    a.total.set_data(xs, total)
    a.target.set_ydata([target_ms, target_ms])
    a.cap.set_xdata([cap_pct, cap_pct])
    a.cap.set_label(f"cap: {cap_pct:.3g}% of the pool")
    a.ax.set_xlim(0, max(xs[-1], 1e-9))
    a.ax.set_ylim(0, max(max(total), target_ms) * 1.1)
    figures.legend(a.ax, [a.base, a.read, a.total, a.target, a.cap], fontsize=7, loc="upper left")


_SHARE_FIGURE = figures.LiveFigure(6.0, 3.0, _share_build, _share_draw)


@explorer(
    "scheduling.batch_kv_share",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    tpot_ms=FloatRange(2.0, 200.0, 0.5, label="interactive TPOT target (ms)"),
    interactive_rate=FloatRange(0.1, 50.0, 0.1, label="interactive requests/s"),
    interactive_prompt=IntRange(16, 32768, label="interactive prompt (mean tokens)"),
    interactive_output=IntRange(8, 8192, label="interactive output (mean tokens)"),
    batch_prompt=IntRange(16, 65536, label="batch prompt (mean tokens)"),
    batch_output=IntRange(8, 16384, label="batch output (mean tokens)"),
    batch_headroom=IntRange(0, 32768, label="batch max_tokens above the mean output"),
)
def batch_kv_share(model: str, gpu: str, tp: int, tpot_ms: float, interactive_rate: float, interactive_prompt: int,
                   interactive_output: int, batch_prompt: int, batch_output: int, batch_headroom: int) -> View:
    """I023: the KV share a batch class may hold before the mean interactive step passes the TPOT
    target (lib.scheduling.kv_share on the step models, evaluated directly). A batch request
    reserves ``max_tokens = batch_output + batch_headroom`` (so max_tokens is never below the output)."""
    batch_max_tokens = batch_output + batch_headroom
    cost = DirectStepCost(Deployment(model, gpu, tp=tp))
    loads = dict(interactive_rate=interactive_rate, interactive_prompt=interactive_prompt,
                 interactive_output=interactive_output, batch_prompt=batch_prompt, batch_output=batch_output)
    foot = batch_prompt + batch_max_tokens - 1
    b = batch_kv_budget(cost, tpot_ms * MS, batch_footprint=foot, **loads)
    n_top = max(2 * b.batch_decodes, 8)
    n_top = min(n_top, cost.max_running - b.interactive_decodes, int(b.pool_tokens // foot))
    ns = np.unique(np.linspace(0, max(n_top, 1), 10).astype(int))
    parts = [mean_step_parts(cost, int(n), interactive_decodes=b.interactive_decodes,
                             **{k: v for k, v in loads.items() if k != "interactive_rate"}) for n in ns]
    xs = [100 * n * foot / b.pool_tokens for n in ns]
    base = [p["base"] / MS for p in parts]
    read = [(p["base"] + p["read"]) / MS for p in parts]
    total = [p["total"] / MS for p in parts]
    fig = _SHARE_FIGURE(xs, base, read, total, tpot_ms, 100 * b.share)
    kv_bytes = b.cap_tokens * cost.dep.mdl.kv_bytes_per_token(cost.dep.kv_dtype)
    rows = [
        ("interactive decodes in flight (Little)", f"{b.interactive_decodes}"),
        ("step with no batch work", fmt_time(b.step_without_batch_s)),
        ("one batch sequence adds per step", f"{fmt_time(b.read_per_batch_seq_s)} read + "
                                             f"{fmt_time(b.prefill_per_batch_seq_s)} prefill"),
        ("batch sequences allowed", f"{b.batch_decodes}"),
        ("batch class may hold", f"{b.cap_tokens:,.0f} tokens ({fmt_bytes(kv_bytes)})"),
        ("share of the KV pool", fmt_pct(b.share)),
    ]
    note = ("The batch cap is where the red line (the mean step, i.e. the interactive TPOT) meets the target: "
            "each batch sequence adds its KV read and its amortized prefill to every step."
            if b.batch_decodes else "The interactive load alone already misses this target: no batch work fits.")
    cap = (f"It meets the TPOT target of {fmt_time(tpot_ms * MS)} at {fmt_pct(b.share)} of the pool (grey), "
           f"{b.batch_decodes} batch sequences." if b.batch_decodes else
           f"The interactive load alone misses the TPOT target of {fmt_time(tpot_ms * MS)}: the batch class gets "
           "no share.")
    caption = (f"The mean decode step, which is the interactive TPOT, as the batch class holds more of the KV pool: each "
               f"batch sequence adds its KV read and its amortized prefill (red). {cap}")
    return View(f"{cost.dep.label}: KV the batch class may hold at TPOT {sig(tpot_ms)} ms", rows, fig, note,
                caption=caption,
                values={"share": b.share, "cap_tokens": b.cap_tokens, "batch_decodes": b.batch_decodes,
                        "step_without_batch": b.step_without_batch_s})


# ---- I091: what a reservation costs and what max_tokens trades -------------------------------------


def _reserve_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax, "x", base=2)
    a = SimpleNamespace(ax=ax)
    a.idle, = ax.plot([], [], color="#dd8452", label="reserved KV never written (%)")
    a.cut, = ax.plot([], [], color="#c44e52", label="requests cut off at max_tokens (%)")
    a.conc, = ax.plot([], [], color="#4c72b0", ls="--", label="concurrency: reservation / greedy (%)")
    a.choice = ax.axvline(1.0, color="grey", lw=1)
    ax.set_xlabel("max_tokens declared")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.grid(True)
    return a


def _reserve_draw(a: SimpleNamespace, ms, idle, cut, conc, chosen: int) -> None:
    a.idle.set_data(ms, idle)
    a.cut.set_data(ms, cut)
    a.conc.set_data(ms, conc)
    a.choice.set_xdata([chosen, chosen])
    a.choice.set_label(f"max_tokens {chosen:,}")
    a.ax.set_xlim(ms[0], ms[-1])
    figures.legend(a.ax, [a.idle, a.cut, a.conc, a.choice], fontsize=7, loc="center left")


_RESERVE_FIGURE = figures.LiveFigure(6.0, 3.0, _reserve_build, _reserve_draw)


@explorer(
    "scheduling.token_reservation",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    prompt_median=IntRange(16, 32768, log=True, label="prompt median (tokens)"),
    output_median=IntRange(2, 32768, log=True, label="output median (tokens; a TPOT needs two)"),
    output_sigma=FloatRange(0.0, 2.5, 0.1, label="output spread (log-normal sigma)"),
    max_tokens=IntRange(16, 131072, log=True, label="max_tokens declared"),
)
def token_reservation(model: str, gpu: str, tp: int, prompt_median: int, output_median: int, output_sigma: float,
                      max_tokens: int) -> View:
    """I091: what reserving prompt + max_tokens costs against greedy admission, and what a smaller
    max_tokens cuts off (log-normal lengths drawn with lib.scheduling's distributions, seed 0)."""
    from lib.scheduling import LogNormal

    dep = Deployment(model, gpu, tp=tp)
    pool = dep.budget.num_blocks * dep.block_size
    rng = np.random.default_rng(0)
    prompts = LogNormal(prompt_median, 0.5).sample(rng, 10000)
    outputs = LogNormal(output_median, output_sigma).sample(rng, 10000)
    top = max(131072, max_tokens)
    ms = np.unique(np.geomspace(16, top, 24).astype(int))
    t = reservation_tradeoff(pool, prompts, outputs, ms)
    here = reservation_tradeoff(pool, prompts, outputs, [max_tokens])
    fig = _RESERVE_FIGURE(ms, 100 * t["idle"], 100 * t["cut"], 100 * t["reserve_conc"] / t["greedy_conc"], max_tokens)
    never = float((prompts + max_tokens > pool).mean())
    rows = [
        ("KV pool", f"{pool:,} tokens"),
        ("requests running at once: reservation", sig(here["reserve_conc"][0])),
        ("requests running at once: greedy (mean holding)", sig(here["greedy_conc"][0])),
        ("reserved KV never written", fmt_pct(here["idle"][0])),
        ("requests cut off at max_tokens", fmt_pct(here["cut"][0])),
        ("rejected at once (prompt + max_tokens > pool)", fmt_pct(never)),
    ]
    note = ("Raise max_tokens and fewer requests are cut off, but more of every reservation sits empty and fewer "
            "requests run at once; the blue dashed line is the concurrency reservation keeps against greedy admission.")
    caption = (f"Raising max_tokens (right) cuts off fewer requests (red), but more of each reservation is never written "
               f"(orange) and reservation runs fewer requests than greedy admission (blue, dashed). At max_tokens = "
               f"{fmt_int(max_tokens)} (grey), {fmt_pct(here['cut'][0])} are cut off, {fmt_pct(here['idle'][0])} of the "
               f"reserved KV stays empty and reservation runs "
               f"{fmt_pct(here['reserve_conc'][0] / here['greedy_conc'][0])} of greedy's concurrency.")
    return View(f"{dep.label}: reserving prompt + {max_tokens:,} tokens", rows, fig, note, caption=caption,
                values={"reserve_conc": float(here["reserve_conc"][0]), "greedy_conc": float(here["greedy_conc"][0]),
                        "idle": float(here["idle"][0]), "cut": float(here["cut"][0]), "pool": pool})


# ---- I096: replay a program on a request table -------------------------------------------------------

_RECLAIM_EXAMPLES = (
    "admit a 2; launch a; disconnect a; admit a 2; complete 1",
    "admit a 3; launch a; disconnect a; admit b 2; admit c 2; complete 1; admit c 2",
    "admit a 2; launch a; complete 1; dup 1",
    "admit a 2; launch a; disconnect a; admit a 2; launch a; complete 1; complete 2",
)


@explorer(
    "scheduling.deferred_reclaim",
    implementation=Choice(("reference", *RECLAIM_VARIANTS), label="request table"),
    num_pages=IntRange(2, 16, label="pages in the pool"),
    program=Text(_RECLAIM_EXAMPLES, 600, label="program"),
)
def deferred_reclaim(implementation: str, num_pages: int, program: str) -> View:
    """I096: what each operation of a typed program does on the reference or a draft request table,
    and the grader's verdict on it (lib.scheduling.reclaim_practice.replay)."""
    ops = parse_program(program)
    rows = replay(reclaim_variant(implementation), num_pages, ops)
    return View(f"{implementation} on a {num_pages}-page pool", [(f"{i}. {op}" if op != "verdict" else op, out)
                                                                  for i, (op, out) in enumerate(rows, 1)],
                note="complete K and dup K deliver the K-th launch's completion (dup: again). Try the drafts on the "
                     "first example: a late completion after the id was reused.",
                values={"ops": len(ops)})
