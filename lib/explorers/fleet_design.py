"""Explorers for the fleet sizing chains (N056 api-to-gpu-walkthrough, N033 ten-thousand-rps-fleet,
I073 long-prompt-serving-design, N034 capstone-deployment).

Views call :mod:`lib.fleet.walkthrough` (users -> rate -> replicas), :mod:`lib.fleet.sizing_chain`
(rate -> tokens -> replicas under the SLO pair -> nodes -> router state), :mod:`lib.fleet.long_prompt`
(warm and cold prefill, one pool or two), :mod:`lib.fleet.capstone` (preconditions, the mechanism
ladder, the first request) and, through them,
:mod:`lib.fleet.capacity` only. One persistent matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_duration, fmt_int, fmt_pct, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b", "llama-3.1-405b")
GPUS = ("h100-sxm", "h200", "a100-sxm", "b200", "mi300x")


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.exact = ax.plot([0.0], [0.0], color="C0", lw=1.6, label="replicas needed (exact)")[0]
    a.whole = ax.plot([0.0], [0.0], color="C0", lw=1.0, ls="--", drawstyle="steps-post", label="whole replicas")[0]
    a.zero = ax.plot([0.0], [0.0], color="C3", lw=1.2, ls=":", label="no think time (always in flight)")[0]
    a.here = ax.plot([0.0], [0.0], "o", color="C1", ms=6, label="these users")[0]
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("replicas")
    ax.grid(True)
    return a


def _draw(a, us, exact, whole, zero, users, here) -> None:
    a.exact.set_data(us, exact)
    a.whole.set_data(us, whole)
    a.zero.set_data(us, zero)
    a.here.set_data([users], [here])
    a.ax.set_xlim(0, us[-1])
    a.ax.set_ylim(0, max(float(np.max(zero)), float(np.max(whole))) * 1.05 + 0.5)
    figures.legend(a.ax, [a.exact, a.whole, a.zero, a.here], fontsize=7, loc="upper left")


_WALK = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.walkthrough",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP"),
    users=IntRange(10, 100_000, label="concurrent users"),
    think_s=FloatRange(0.0, 300.0, 1.0, label="think time (s)"),
    prompt_len=IntRange(64, 32_768, log=True, label="prompt (tokens)"),
    output_len=IntRange(16, 4096, log=True, label="output (tokens)"),
    tpot_ms=FloatRange(10.0, 200.0, 5.0, label="TPOT target (ms)"),
)
def walkthrough(model: str, gpu: str, tp: int, users: int, think_s: float, prompt_len: int, output_len: int,
                tpot_ms: float) -> View:
    """N056: concurrent users -> request rate (Little's law) -> replicas -> GPUs -> dollars per hour."""
    from lib.fleet.capacity import fleet_for_load
    from lib.fleet.walkthrough import request_rate, sizing_chain
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    ch = sizing_chain(dep, users, think_s, prompt_len, output_len, tpot_ms / 1e3, ttft_budget_s=2.0)
    us = np.linspace(0.0, 2.0 * users, 61)[1:]
    exact = np.array([fleet_for_load(request_rate(u, think_s, ch.response_s), ch.cost).exact for u in us])
    whole = np.ceil(exact - 1e-9)
    zero = np.array([fleet_for_load(request_rate(u, 0.0, ch.response_s), ch.cost).exact for u in us])
    c = ch.cost
    rows = [("replica", dep.label),
            ("one request's time in system", f"{fmt_time(ch.response_s)} (prefill {fmt_time(c.prefill_s)} + "
                                             f"{fmt_int(output_len)} x {fmt_time(c.decode_step_s)})"),
            ("request rate (Little's law)", f"{sig(ch.rate)} requests/s"),
            ("requests in flight", sig(ch.in_flight)),
            ("replica-seconds per request", fmt_time(c.replica_s)),
            ("decode batch allowed", f"{fmt_int(c.batch)} (set by {c.limits.binding})"),
            ("replicas", f"{fmt_int(ch.replicas)} ({sig(ch.fleet.exact)} exact at {fmt_pct(ch.fleet.utilization)})"),
            ("GPUs", fmt_int(ch.gpus)),
            ("dollars per hour", f"${sig(ch.usd_per_hour)}"),
            ("in flight per replica / batch", fmt_pct(ch.slot_use)),
            ("KV per sequence (whole model)", fmt_bytes(dep.mdl.kv_bytes_per_token(dep.kv_dtype) * (prompt_len + output_len)))]
    caption = (f"Replicas against concurrent users (think time {sig(think_s)} s): {fmt_int(users)} users make "
               f"{sig(ch.rate)} requests/s and need {fmt_int(ch.replicas)} replicas; with no think time the same "
               f"users would need {sig(fleet_for_load(request_rate(users, 0.0, ch.response_s), c).exact)}.")
    fig = _WALK(us, exact, whole, zero, users, ch.fleet.exact)
    return View(f"Users to replicas: {dep.label}", rows, fig, caption=caption,
                note=f"{fmt_int(ch.gpus)} GPUs, ${sig(ch.usd_per_hour)} per hour",
                values={"rate": ch.rate, "replicas": ch.replicas, "gpus": ch.gpus})


def _build_10k(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.tpot = ax.plot([0.0], [0.0], color="C0", lw=1.6, marker=".", label="nodes by the TPOT target (replica-seconds)")[0]
    a.ttft = ax.plot([0.0], [0.0], color="C3", lw=1.2, ls="--", label="nodes by the TTFT target (prefill queue)")[0]
    a.here = ax.plot([0.0], [0.0], "o", color="C1", ms=6, label="this TPOT target")[0]
    ax.set_xlabel("TPOT target (ms)")
    ax.set_ylabel("nodes")
    ax.grid(True)
    return a


def _draw_10k(a, xs, by_tpot, by_ttft, x, here) -> None:
    a.tpot.set_data(xs, by_tpot)
    a.ttft.set_data(xs, by_ttft)
    a.here.set_data([x], [here])
    a.ax.set_xlim(xs[0], xs[-1])
    top = [v for v in list(by_tpot) + list(by_ttft) if np.isfinite(v)]
    a.ax.set_ylim(0, max(top) * 1.08 + 1)
    figures.legend(a.ax, [a.tpot, a.ttft, a.here], fontsize=7, loc="upper right")


_TEN_K = figures.LiveFigure(6.0, 3.2, _build_10k, _draw_10k)
TPOT_SWEEP_MS = (15.0, 25.0, 40.0, 60.0, 90.0, 140.0, 200.0)


@explorer(
    "fleet.ten_k",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP"),
    dtype=Choice(("bf16", "fp8"), label="weights and KV"),
    rate=FloatRange(100.0, 50_000.0, 100.0, label="requests/s"),
    prompt_len=IntRange(64, 32_768, log=True, label="prompt (tokens)"),
    output_len=IntRange(16, 4096, log=True, label="output (tokens)"),
    cached_pct=FloatRange(0.0, 95.0, 5.0, label="prompt served from cache (%)"),
    tpot_ms=FloatRange(15.0, 200.0, 5.0, label="TPOT target (ms)"),
    ttft_ms=FloatRange(50.0, 5000.0, 50.0, label="p99 TTFT target (ms)"),
)
def ten_k(model: str, gpu: str, tp: int, dtype: str, rate: float, prompt_len: int, output_len: int, cached_pct: float,
          tpot_ms: float, ttft_ms: float) -> View:
    """N033: rate -> tokens/s per phase -> replicas under the SLO pair -> nodes -> router state."""
    import math

    from lib.fleet.sizing_chain import fleet_chain, serving_deployment

    dep = serving_deployment(model, gpu, tp, dtype)
    cached = min(int(prompt_len * cached_pct / 100.0), prompt_len - 1)
    ch = fleet_chain(dep, rate, prompt_len, output_len, cached, tpot_ms / 1e3, ttft_ms / 1e3)
    nodes_here = ch.nodes
    per = max(1, ch.gpus_per_node // dep.gpus_per_replica) if dep.gpus_per_replica <= ch.gpus_per_node else None

    def nodes_of(replicas: float) -> float:
        return replicas / per if per else replicas * math.ceil(dep.gpus_per_replica / ch.gpus_per_node)

    xs, t_nodes, f_nodes = [], [], []
    for x in TPOT_SWEEP_MS:
        try:
            c = fleet_chain(dep, rate, prompt_len, output_len, cached, x / 1e3, ttft_ms / 1e3)
        except ValueError:
            continue  # batch 1 misses this TPOT target
        xs.append(x)
        t_nodes.append(nodes_of(c.by_tpot))
        f_nodes.append(nodes_of(c.by_ttft))
    c = ch.cost
    rows = [("replica", dep.label),
            ("tokens/s: prompt (computed) / output", f"{sig(ch.prompt_tokens_per_s)} ({sig(ch.computed_prompt_tokens_per_s)}) / "
                                                   f"{sig(ch.output_tokens_per_s)}"),
            ("decode batch at the TPOT target", f"{fmt_int(c.batch)} (set by {c.limits.binding})"),
            ("prefill, warm", fmt_time(c.prefill_s)),
            ("prefill busy the TTFT target allows", fmt_pct(ch.rho_ttft)),
            ("replicas by TPOT / by TTFT", f"{sig(ch.by_tpot)} / {sig(ch.by_ttft)}: {ch.binding} binds"),
            ("replicas, GPUs, nodes", f"{fmt_int(ch.replicas)}, {fmt_int(ch.gpus)}, {fmt_int(nodes_here)}"),
            ("dollars per hour", f"${sig(ch.usd_per_hour)}"),
            ("router index", f"{sig(ch.router_entries)} entries, {fmt_bytes(ch.router_bytes)}"),
            ("router events", f"{sig(ch.router_events_per_s)} blocks/s")]
    caption = (f"Nodes against the TPOT target at {sig(rate)} requests/s: the solid line is the replica-seconds need at "
               f"each target's batch, the dashed one the TTFT target's; the larger sets the fleet, here "
               f"{fmt_int(nodes_here)} nodes ({ch.binding} binds).")
    fig = _TEN_K(np.array(xs), np.array(t_nodes), np.array(f_nodes), tpot_ms, nodes_of(max(ch.by_tpot, ch.by_ttft)))
    return View(f"{sig(rate)} requests/s on {dep.label}", rows, fig, caption=caption,
                note=f"{fmt_int(nodes_here)} nodes, ${sig(ch.usd_per_hour)} per hour",
                values={"replicas": ch.replicas, "nodes": nodes_here, "router_bytes": ch.router_bytes})


def _build_long(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.warm = ax.plot([0.0], [0.0], color="C0", lw=1.4, label="two pools: warm pool")[0]
    a.total = ax.plot([0.0], [0.0], color="C3", lw=1.8, label="two pools: warm + cold")[0]
    a.one = ax.plot([0.0], [0.0], "s", color="C2", ms=6, label="one pool (cold prefills freeze streams)")[0]
    a.here = ax.plot([0.0], [0.0], "o", color="C1", ms=6, label="this warm share")[0]
    ax.set_xlabel("warm share of requests (%)")
    ax.set_ylabel("GPUs")
    ax.grid(True)
    return a


def _draw_long(a, xs, warm, total, x, one, here) -> None:
    a.warm.set_data(xs, warm)
    a.total.set_data(xs, total)
    a.one.set_data([x], [one])
    a.one.set_visible(bool(np.isfinite(one)))
    a.here.set_data([x], [here])
    a.ax.set_xlim(xs[0], xs[-1])
    top = [v for v in [*total, one, here] if np.isfinite(v)]
    a.ax.set_ylim(0, max(top) * 1.08 + 1)
    figures.legend(a.ax, [a.warm, a.total, a.one, a.here], fontsize=7, loc="upper right")


_LONG = figures.LiveFigure(6.0, 3.2, _build_long, _draw_long)
WARM_SWEEP_PCT = (50.0, 60.0, 70.0, 80.0, 85.0, 90.0, 93.0, 95.0, 97.0, 98.0, 99.0, 100.0)


@explorer(
    "fleet.long_prompt",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP (both pools)"),
    rate=FloatRange(0.5, 500.0, 0.5, label="requests/s"),
    prompt_len=IntRange(1024, 131_072, log=True, label="prompt (tokens)"),
    new_tokens=IntRange(64, 8192, log=True, label="new tokens per warm request"),
    output_len=IntRange(16, 4096, log=True, label="output (tokens)"),
    warm_pct=FloatRange(50.0, 100.0, 1.0, label="warm requests (%)"),
    tpot_ms=FloatRange(15.0, 200.0, 5.0, label="TPOT target (ms)"),
    warm_ttft_s=FloatRange(0.1, 10.0, 0.1, label="warm p99 TTFT (s)"),
    cold_ttft_s=FloatRange(0.5, 30.0, 0.5, label="cold p99 TTFT (s)"),
)
def long_prompt(model: str, gpu: str, tp: int, rate: float, prompt_len: int, new_tokens: int, output_len: int,
                warm_pct: float, tpot_ms: float, warm_ttft_s: float, cold_ttft_s: float) -> View:
    """I073: cold vs warm prefill of a long prompt, and the GPUs of two pools against the warm share."""
    from lib.fleet.long_prompt import one_pool, two_pools
    from lib.perf.deployment import deployment

    if new_tokens >= prompt_len:
        raise ValueError(f"new tokens ({new_tokens}) must be fewer than the prompt ({prompt_len}): the rest is the cached prefix")
    dep = deployment(model, gpu, tp=tp)
    w = warm_pct / 100.0
    args = (dep, dep, rate, prompt_len, new_tokens, output_len)
    here = two_pools(*args, w, tpot_ms / 1e3, warm_ttft_s, cold_ttft_s)
    if not (np.isfinite(here.cold_replicas) and np.isfinite(here.warm_replicas)):
        raise ValueError(f"a TTFT target is below the prefill it must cover (cold {fmt_time(here.cold_service_s)}, warm "
                         f"{fmt_time(here.warm_cost.prefill_s)}): relax it or add TP")
    xs = np.array(WARM_SWEEP_PCT)
    warm_g, total_g = [], []
    for x in xs:
        tp2 = here.at_share(x / 100.0)
        warm_g.append(tp2.warm_replicas * dep.gpus_per_replica)
        total_g.append(tp2.gpus)
    one = one_pool(dep, rate, prompt_len, new_tokens, output_len, w, tpot_ms / 1e3, warm_ttft_s, cold_ttft_s,
                   samples=4000)
    rows = [("replica (both pools)", dep.label),
            ("cold prefill (+ exposed KV hand-off)", f"{fmt_time(here.cold_prefill_s)} "
                                                     f"(+ {fmt_time(here.transfer.exposed_s(here.cold_prefill_s))})"),
            ("warm prefill", fmt_time(here.warm_cost.prefill_s)),
            ("cold pool: busy allowed by its TTFT", fmt_pct(here.rho_cold)),
            ("cold pool replicas", f"{fmt_int(here.cold_replicas)} for {sig(here.cold_rate)} cold requests/s"),
            ("warm pool replicas", f"{fmt_int(here.warm_replicas)} (by busy {sig(here.warm_by_busy)}, "
                                   f"by TTFT {sig(here.warm_by_ttft)})"),
            ("two pools: GPUs", fmt_int(here.gpus)),
            ("one pool: GPUs", fmt_int(one.gpus) if np.isfinite(one.gpus) else "cannot meet both TTFT targets"),
            ("KV across the fabric", f"{sig(here.transfer_bytes_per_s / 1e9)} GB/s")]
    caption = (f"GPUs against the share of warm requests at {sig(rate)} requests/s of {fmt_int(prompt_len)}-token prompts: "
               f"the red line is both pools, the blue the warm pool alone; at {sig(warm_pct)}% warm the two pools take "
               f"{fmt_int(here.gpus)} GPUs.")
    fig = _LONG(xs, np.array(warm_g, float), np.array(total_g, float), warm_pct, float(one.gpus), float(here.gpus))
    return View(f"Long prompts on {dep.label}", rows, fig, caption=caption,
                note=f"two pools: {fmt_int(here.gpus)} GPUs", values={"gpus": here.gpus, "cold": here.cold_replicas})


RUNG_LABELS = ("one at a time", "+ batching", "+ prefix cache", "+ FP8")


def _build_cap(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.93)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.bar(range(len(RUNG_LABELS)), [1.0] * len(RUNG_LABELS), color=["0.6", "C0", "C2", "C3"])
    a.texts = [ax.text(i, 1.0, "", ha="center", va="bottom", fontsize=8) for i in range(len(RUNG_LABELS))]
    ax.set_xticks(range(len(RUNG_LABELS)))
    ax.set_xticklabels(RUNG_LABELS, fontsize=8)
    figures.log_scale(ax, "y")
    ax.set_ylabel("GPUs for the load")
    ax.grid(True, axis="y")
    return a


def _draw_cap(a, gpus) -> None:
    top = 1.0
    for i, (bar, txt) in enumerate(zip(a.bars, a.texts, strict=True)):
        g = gpus[i] if i < len(gpus) else float("nan")
        shown = bool(np.isfinite(g))
        bar.set_visible(shown)
        bar.set_height(g if shown else 1.0)
        txt.set_visible(shown)
        txt.set_position((i, g if shown else 1.0))
        txt.set_text(fmt_int(g) if shown else "")
        top = max(top, g if shown else 1.0)
    a.ax.set_ylim(0.8, top * 3)


_CAP = figures.LiveFigure(6.0, 3.2, _build_cap, _draw_cap)


@explorer(
    "fleet.capstone",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP"),
    rate=FloatRange(1.0, 5000.0, 1.0, label="requests/s"),
    prompt_len=IntRange(256, 32_768, log=True, label="prompt (tokens)"),
    prefix_pct=FloatRange(0.0, 95.0, 5.0, label="shared prefix (% of prompt)"),
    output_len=IntRange(16, 4096, log=True, label="output (tokens)"),
    tpot_ms=FloatRange(10.0, 200.0, 5.0, label="TPOT target (ms)"),
    ttft_ms=FloatRange(50.0, 5000.0, 50.0, label="TTFT target (ms)"),
)
def capstone(model: str, gpu: str, tp: int, rate: float, prompt_len: int, prefix_pct: float, output_len: int,
             tpot_ms: float, ttft_ms: float) -> View:
    """N034: the preconditions on this layout, the GPUs as mechanisms are added, and the first request."""
    from lib.fleet.capstone import first_request, mechanism_ladder, preconditions

    prefix = min(int(prompt_len * prefix_pct / 100.0), prompt_len - 1)
    lay = preconditions(model, gpu, tp, prompt_len, prefix, output_len, tpot_ms / 1e3, ttft_ms / 1e3)
    if not lay.fits:
        raise ValueError(lay.reason or f"the KV pool holds {lay.seqs_held:.2f} sequences of {prompt_len + output_len} tokens")
    if not lay.step_ok:
        raise ValueError(f"one sequence's decode step is {fmt_time(lay.step1_s)}, over the {sig(tpot_ms)} ms TPOT target: "
                         "no batch can meet it; add TP or quantize")
    rungs = mechanism_ladder(lay.dep, rate, prompt_len, prefix, output_len, tpot_ms / 1e3)
    first = first_request(lay.dep, prompt_len, prefix)
    rows = [("replica", lay.dep.label),
            ("KV pool holds (full-context sequences)", sig(lay.seqs_held)),
            ("decode step at batch 1", f"{fmt_time(lay.step1_s)} (target {sig(tpot_ms)} ms)"),
            ("prefill, prefix warm", f"{fmt_time(lay.prefill_s)} (target {sig(ttft_ms)} ms): "
                                     + ("fits" if lay.prefill_ok else "misses")),
            *((r.name, f"{fmt_int(r.fleet.gpus)} GPUs (batch {fmt_int(r.cost.batch)})") for r in rungs),
            ("first request from zero replicas", fmt_duration(first.from_zero_s))]
    gpus = [float(r.fleet.gpus) for r in rungs]
    caption = (f"GPUs for {sig(rate)} requests/s as mechanisms are added (log scale): from {fmt_int(gpus[0])} serving one "
               f"request at a time to {fmt_int(gpus[-1])} with all of them.")
    return View(f"Capstone: {lay.dep.label}", rows, _CAP(gpus), caption=caption,
                note="the TTFT target is missed even on an idle replica" if not lay.prefill_ok else
                f"{fmt_int(gpus[-1])} GPUs", values={"gpus": gpus[-1], "first_s": first.from_zero_s})


__all__ = ["GPUS", "MODELS", "RUNG_LABELS", "TPOT_SWEEP_MS", "WARM_SWEEP_PCT", "capstone", "long_prompt", "ten_k",
           "walkthrough"]
