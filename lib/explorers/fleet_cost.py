"""Explorers for the serving bill (I065 serving-cost-model).

Views call :mod:`lib.fleet.capacity` only (a request's replica-seconds by phase, the fleet a load needs,
dollars per million tokens of each phase). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "llama-3.1-405b", "mixtral-8x7b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")


@functools.lru_cache(maxsize=64)
def _dep(model: str, gpu: str, tp: int, weight_dtype: str):
    from lib.perf.deployment import deployment

    return deployment(model, gpu, tp=tp, weight_dtype=weight_dtype)


@functools.lru_cache(maxsize=4096)
def _cost(model: str, gpu: str, tp: int, weight_dtype: str, prompt_len: int, output_len: int, tpot_s: float):
    from lib.fleet.capacity import request_cost

    return request_cost(_dep(model, gpu, tp, weight_dtype), prompt_len, output_len, tpot_s)


def _share_or_nan(*args) -> float:
    try:
        return _cost(*args).prefill_share
    except ValueError:
        return math.nan


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve = ax.plot([1.0], [0.5], color="C0", lw=1.8, marker=".", label="prompt's share of the bill")[0]
    a.here = ax.plot([1.0], [0.5], "o", color="C3", ms=7, label="this workload")[0]
    a.two_thirds = ax.axhline(2 / 3, color="0.4", ls=":", lw=1.2, label="two thirds")
    figures.log_scale(ax, "x")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("share of the replica-seconds (and dollars)")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw(a, ps, shares, p, share) -> None:
    a.curve.set_data(ps, shares)
    a.here.set_data([p], [share])
    a.ax.set_xlim(ps[0] / 1.3, ps[-1] * 1.3)
    figures.legend(a.ax, [a.curve, a.here, a.two_thirds], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.cost_model",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    prompt_len=IntRange(16, 65536, label="prompt tokens"),
    output_len=IntRange(1, 16384, label="reply tokens"),
    tpot_ms=FloatRange(10.0, 200.0, 1.0, label="TPOT target (ms)"),
    utilization=FloatRange(0.3, 1.0, 0.05, label="utilization ceiling"),
)
def cost_model(model: str, gpu: str, tp: int, weight_dtype: str, prompt_len: int, output_len: int,
               tpot_ms: float, utilization: float) -> View:
    """I065: a request's replica-seconds by phase, the prompt's share of the bill, dollars per million
    tokens of each phase, and the share against the prompt length at this reply length."""
    from lib.fleet.capacity import fleet_for_load, usd_per_million_tokens

    tpot_s = tpot_ms / 1e3
    args = (model, gpu, tp, weight_dtype)
    c = _cost(*args, prompt_len, output_len, tpot_s)
    prices = usd_per_million_tokens(c, utilization=utilization)
    per_rps = fleet_for_load(1.0, c, utilization)
    top = max(64, min(65536, _dep(*args).mdl.max_position_embeddings - output_len))
    ps = np.unique(np.geomspace(16, top, 12).astype(int))
    shares = np.array([_share_or_nan(*args, int(p), output_len, tpot_s) for p in ps])
    rows = [("batch at the TPOT target", f"{c.batch} sequences ({c.limits.binding} binds)"),
            ("prefill per request", f"{fmt_time(c.prefill_s)} of the replica"),
            ("decode per request", f"{fmt_time(c.decode_s)} of the replica ({sig(output_len)} x {fmt_time(c.decode_step_s)} / {c.batch})"),
            ("prompt's share of the bill", fmt_pct(c.prefill_share)),
            ("input / output, per M tokens", f"${sig(prices.input_usd_per_m)} / ${sig(prices.output_usd_per_m)}"),
            ("replicas per request/s", f"{sig(per_rps.exact)} ({sig(per_rps.exact * c.dep.gpus_per_replica)} GPUs)")]
    verdict = "above" if c.prefill_share >= 2 / 3 else "below"
    caption = (f"The prompt's share of each request's replica-seconds against the prompt length (log x) for "
               f"{sig(output_len)}-token replies on {c.dep.label}; this workload's prompt takes {fmt_pct(c.prefill_share)}, "
               f"{verdict} two thirds (gaps: prompts the KV pool cannot batch at the TPOT target).")
    fig = _FIGURE(ps, shares, prompt_len, c.prefill_share)
    return View(f"Serving cost: {sig(prompt_len)} in, {sig(output_len)} out", rows, fig, caption=caption,
                note=f"prompt {verdict} two thirds",
                values={"share": c.prefill_share, "input": prices.input_usd_per_m, "output": prices.output_usd_per_m})


def _build_tornado(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.27, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, n=6)
    ys = np.arange(a.n)
    a.low = ax.barh(ys, np.zeros(a.n), left=np.zeros(a.n), height=0.6, color="C0", label="assumption at its low end")
    a.high = ax.barh(ys, np.zeros(a.n), left=np.zeros(a.n), height=0.6, color="C1", label="assumption at its high end")
    a.base = ax.axvline(1.0, color="0.2", lw=1.2)
    ax.set_yticks(ys)
    ax.set_yticklabels([""] * a.n)
    ax.invert_yaxis()
    ax.set_xlabel("list price, USD per million tokens")
    ax.grid(True, axis="x")
    return a


def _draw_tornado(a, names, lows, highs, base) -> None:
    for i in range(a.n):
        lo, hi = lows[i], highs[i]
        a.low[i].set_x(min(lo, base))
        a.low[i].set_width(abs(base - lo))
        a.high[i].set_x(min(hi, base))
        a.high[i].set_width(abs(hi - base))
    a.ax.set_yticklabels(names)
    a.base.set_xdata([base, base])
    span = [*lows, *highs, base]
    pad = 0.05 * (max(span) - min(span) or base)
    a.ax.set_xlim(max(0.0, min(span) - pad), max(span) + pad)
    figures.legend(a.ax, [a.low, a.high], fontsize=7, loc="lower right")


_TORNADO = figures.LiveFigure(6.0, 3.2, _build_tornado, _draw_tornado)


@explorer(
    "fleet.token_price",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    prompt_len=IntRange(16, 65536, label="prompt tokens"),
    output_len=IntRange(2, 16384, label="reply tokens"),
    tpot_ms=FloatRange(10.0, 200.0, 1.0, label="TPOT target (ms)"),
    utilization=FloatRange(0.3, 1.0, 0.05, label="utilization ceiling"),
    margin=FloatRange(0.0, 0.9, 0.05, label="gross margin"),
    price=Choice(("blended", "input", "output"), label="price shown"),
)
def token_price(model: str, gpu: str, tp: int, weight_dtype: str, prompt_len: int, output_len: int,
                tpot_ms: float, utilization: float, margin: float, price: str) -> View:
    """I071: the list price of input and output tokens from cost and margin, and the tornado of the book's
    assumption ranges (lib.fleet.pricing.assumption_ranges) around it."""
    from lib.fleet.pricing import RANGE_LABELS, assumption_ranges, list_price, tornado

    dep = _dep(model, gpu, tp, weight_dtype)
    base = {"prompt_len": prompt_len, "output_len": output_len, "tpot_target_s": tpot_ms / 1e3, "margin": margin,
            "utilization": utilization}
    lp = list_price(dep, **base)
    ranges = assumption_ranges(gpu, tpot_ms / 1e3, output_len)
    bars = tornado(dep, base, ranges, which=price)[:6]
    pick = {"blended": lambda x: x.blended_usd_per_m, "input": lambda x: x.input_usd_per_m,
            "output": lambda x: x.output_usd_per_m}[price]
    names = [RANGE_LABELS[b.name] for b in bars]
    lows, highs = [pick(b.at_low) for b in bars], [pick(b.at_high) for b in bars]
    rows = [("cost per M in / out", f"${sig(lp.cost.input_usd_per_m)} / ${sig(lp.cost.output_usd_per_m)}"),
            ("list per M in / out", f"${sig(lp.input_usd_per_m)} / ${sig(lp.output_usd_per_m)}"),
            ("output priced as", f"{sig(lp.output_over_input)} input tokens"),
            ("blended list per M", f"${sig(lp.blended_usd_per_m)}"),
            (f"moves the {price} price most", f"{names[0]}: ${sig(min(lows[0], highs[0]))} to ${sig(max(lows[0], highs[0]))}")]
    caption = (f"The {price} list price with each assumption at the low and at the high end of its range (see the legend), the others "
               f"at base (the line, ${sig(pick(lp))} per million); the {names[0].lower()} moves it most.")
    fig = _TORNADO(names, lows, highs, pick(lp))
    return View(f"Token pricing: {dep.label}", rows, fig, caption=caption, note=f"top: {names[0]}",
                values={"input": lp.input_usd_per_m, "output": lp.output_usd_per_m, "top": bars[0].name})


_LEDGER_LINES = ("prefill GPUs", "decode GPUs", "TTFT headroom", "whole replicas", "retries")


def _build_ledger(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.16, right=0.97, bottom=0.18, top=0.93)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, bars=[])
    y = np.arange(2)
    for i, name in enumerate(_LEDGER_LINES):
        a.bars.append(ax.barh(y, [0.0, 0.0], left=[0.0, 0.0], height=0.55, color=f"C{i}", label=name))
    ax.set_yticks(y)
    ax.set_yticklabels(["baseline", "proposal"])
    ax.invert_yaxis()
    ax.set_xlabel("USD per hour")
    ax.grid(True, axis="x")
    return a


def _draw_ledger(a, base_lines, cand_lines) -> None:
    left = [0.0, 0.0]
    for bars, name in zip(a.bars, _LEDGER_LINES, strict=True):
        vals = [base_lines.get(name, 0.0), cand_lines.get(name, 0.0)]
        for j, bar in enumerate(bars):
            bar.set_x(left[j])
            bar.set_width(vals[j])
        left = [left[0] + vals[0], left[1] + vals[1]]
    a.ax.set_xlim(0, 1.05 * max(left))
    figures.legend(a.ax, a.bars, fontsize=7, loc="lower right", ncol=2)


_LEDGER = figures.LiveFigure(6.0, 3.0, _build_ledger, _draw_ledger)


@functools.lru_cache(maxsize=256)
def _base_ledger(model, gpu, tp, rate, prompt_len, output_len, tpot_s, utilization):
    from lib.fleet.ledger import price_ledger

    return price_ledger("baseline", _dep(model, gpu, tp, "bf16"), rate, prompt_len, output_len, tpot_target_s=tpot_s,
                        utilization=utilization, quality=0.0, n_path=20_000)


@explorer(
    "fleet.cost_ledger",
    proposal=Choice(("cheaper GPU", "FP8 KV cache", "higher utilization", "truncate prompts", "FP8 weights")),
    model=Choice(("llama-3.1-70b", "llama-3.1-8b", "qwen2.5-72b")),
    gpu=Choice(("h100-sxm", "h200", "b200")),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    rate=FloatRange(1.0, 500.0, 1.0, label="requests/s"),
    prompt_len=Choice((500, 1000, 2000, 3000, 4000, 8000), label="prompt tokens"),
    output_len=Choice((100, 200, 400, 800), label="reply tokens"),
    tpot_ms=Choice((25.0, 50.0, 75.0, 100.0), label="TPOT target (ms)"),
    ttft_s=Choice((0.5, 1.0, 2.0, 5.0), label="TTFT p99 target (s)"),
    quality_drop=FloatRange(0.0, 5.0, 0.1, label="eval points lost"),
    tolerance=FloatRange(0.0, 2.0, 0.1, label="eval points allowed"),
    size_for_ttft=Choice((False, True), label="size the proposal for the TTFT target"),
)
def cost_ledger(proposal: str, model: str, gpu: str, tp: int, rate: float, prompt_len: int, output_len: int,
                tpot_ms: float, ttft_s: float, quality_drop: float, tolerance: float, size_for_ttft: bool) -> View:
    """I075: a proposal's ledger against the baseline's, line by line, its claimed and real saving, and the gates."""
    from lib.fleet.ledger import audit
    from lib.fleet.ledger import proposal as make

    base = _base_ledger(model, gpu, tp, rate, prompt_len, output_len, tpot_ms / 1e3, 0.7)
    p = make(proposal, base, quality=-quality_drop, retry_share=0.0, size_for_ttft_s=ttft_s if size_for_ttft else None,
             tpot_target_s=tpot_ms / 1e3, n_path=20_000, cheap_gpu="a100-sxm" if gpu != "a100-sxm" else "l40s")
    a = audit(base, p.ledger, p.claim, p.claimed_saving, quality_tolerance=tolerance, tpot_target_s=tpot_ms / 1e3,
              ttft_target_s=ttft_s)
    rows = [("the claim", f"{p.claim}: saves ${sig(a.claimed_saving)} an hour"),
            ("the total", f"${sig(base.total)} -> ${sig(p.ledger.total)} an hour ({'saves' if a.total_saving > 0 else 'costs'} "
                          f"${sig(abs(a.total_saving))})"),
            ("moved to", ", ".join(f"{k} +${sig(v)}" for k, v in a.moved_to.items()) or "nothing"),
            ("TPOT / TTFT p99", f"{fmt_time(p.ledger.tpot_s)} / {fmt_time(p.ledger.ttft_quantile_s) if math.isfinite(p.ledger.ttft_quantile_s) else 'unbounded'}"),
            ("verdict", "accept" if a.accepted else "reject: " + "; ".join(a.reasons))]
    caption = (f"Dollars per hour by line for the baseline and the '{proposal}' proposal at {sig(rate)} requests/s; the proposer "
               f"claims ${sig(a.claimed_saving)} an hour, the total moves by ${sig(-a.total_saving)}.")
    fig = _LEDGER(base.lines, p.ledger.lines)
    return View(f"Cost ledger: {proposal}", rows, fig, caption=caption, note="accept" if a.accepted else "reject",
                values={"claimed": a.claimed_saving, "total": a.total_saving, "accepted": a.accepted})
