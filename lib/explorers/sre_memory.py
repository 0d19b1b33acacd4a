"""Explorers for device memory in serving (I081): a seeded memory series with one injected leak,
the budget's ceiling, and the diagnosis that names the leak (:mod:`lib.sre.memory_growth`).

Views call lib only; the figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import GiB, fmt_bytes, fmt_duration, fmt_unit

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b", "llama-3.1-405b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")
NO_LEAK = "no leak"


@lru_cache(maxsize=64)
def _budget(model: str, gpu: str, tp: int, weight_dtype: str):
    from lib.perf.memory import memory_budget

    return memory_budget(model, gpu, tp=tp, weight_dtype=weight_dtype)


def growth_analysis(model: str, gpu: str, tp: int, weight_dtype: str, injected: str | None, request_rate: float,
                    hours: float, prompt_tokens: int, output_tokens: int, seed: int = 0):
    """Budget, suspects, the seeded series with ``injected`` (None: no leak), its diagnosis, and the
    time to OOM: the headroom margin over the measured rate for a climb or a staircase; inf for a
    flat series, and for one that settled (bounded) unless the series itself hit the ceiling."""
    from lib.sre import memory_growth as mg

    budget = _budget(model, gpu, tp, weight_dtype)
    sus = mg.suspects(budget, prompt_tokens, output_tokens)
    series = mg.simulate_series(budget, injected, request_rate, hours, prompt_tokens, output_tokens, seed=seed)
    diag = mg.diagnose(series, sus)
    if diag.fit.family == mg.NONE:
        oom_s = math.inf
    elif diag.fit.family == mg.BOUNDED:  # it stopped growing: only the OOM the series saw counts
        oom_s = series.oom_s if series.oom_s is not None else math.inf
    else:
        oom_s = mg.time_to_oom_s(budget.headroom_margin_bytes, max(diag.fit.rate_bytes_per_s, 0.0))
    return SimpleNamespace(budget=budget, suspects=sus, series=series, diagnosis=diag, oom_s=oom_s)


def _build(fig) -> SimpleNamespace:
    from matplotlib.ticker import MaxNLocator

    fig.subplots_adjust(left=0.11, right=0.98, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    (used,) = ax.plot([0, 1], [0, 0], color="C0", lw=1.2, label="device memory in use")
    (fit,) = ax.plot([0, 1], [0, 0], color="k", lw=0.8, ls="--", label="least-squares rate")
    cap = ax.axhline(1.0, color="C3", lw=1.0, ls=":", label="visible memory (OOM)")
    base = ax.axhline(0.5, color="0.5", lw=0.8, ls="-.", label="budget at peak")
    ax.set_xlabel("hours")
    ax.set_ylabel("GiB")
    ax.grid(True)
    ax.legend(loc="lower right", fontsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    return SimpleNamespace(ax=ax, used=used, fit=fit, cap=cap, base=base)


def _draw(a, t_h, used_gib, fit_gib, cap_gib, base_gib) -> None:
    a.used.set_data(t_h, used_gib)
    a.fit.set_data(t_h, fit_gib)
    a.cap.set_ydata([cap_gib, cap_gib])
    a.base.set_ydata([base_gib, base_gib])
    a.ax.set_xlim(0, max(float(t_h[-1]), 1e-3))
    lo = base_gib - 0.05 * (cap_gib - base_gib)
    a.ax.set_ylim(lo, cap_gib + 0.08 * (cap_gib - lo))


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


def _suspect_choices():
    from lib.sre.memory_growth import SUSPECTS

    return (NO_LEAK, *SUSPECTS)


@explorer(
    "sre.memory_growth",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    injected=Choice(_suspect_choices(), label="injected leak"),
    request_rate=FloatRange(0.1, 20.0, 0.1, label="requests/s per replica"),
    hours=FloatRange(1.5, 24.0, 0.5, label="hours observed"),
    prompt_tokens=IntRange(256, 8192, label="prompt tokens"),
    output_tokens=IntRange(16, 2048, label="output tokens"),
)
def memory_growth(model: str, gpu: str, tp: int, weight_dtype: str, injected: str, request_rate: float,
                  hours: float, prompt_tokens: int, output_tokens: int) -> View:
    """I081: the memory series with one injected leak, its rate per request and the suspect it names."""
    r = growth_analysis(model, gpu, tp, weight_dtype, None if injected == NO_LEAK else injected, request_rate,
                        hours, prompt_tokens, output_tokens)
    return growth_view(r)


def growth_view(r) -> View:
    """The view of one :func:`growth_analysis` result."""
    from lib.sre.memory_growth import BOUNDED, LINEAR, SHAPE_WORDS

    d, se, b = r.diagnosis, r.series, r.budget
    fit = d.fit
    rows = [("headroom margin at peak", fmt_bytes(b.headroom_margin_bytes, "GiB")),
            ("growth rate", f"{fmt_unit(fit.rate_bytes_per_s * 3600 / 2**20, 'MiB/h')} ({fit.family})"),
            ("bytes per request", fmt_bytes(max(fit.bytes_per_request, 0.0), "KiB") if fit.family == LINEAR
             else "not per request"),
            ("time to OOM at this rate", fmt_duration(r.oom_s)),
            ("named", d.named or "none of the suspects")]
    rows += [(name, verdict) for name, verdict in d.verdicts.items()]
    t_h = se.t_s / 3600
    slope, icpt = np.polyfit(se.t_s, se.used_bytes, 1)
    story = (f"the series hits the ceiling after {fmt_duration(se.oom_s)}" if se.oom_s is not None else
             f"at the fitted rate it reaches the ceiling in {fmt_duration(r.oom_s)}" if np.isfinite(r.oom_s) else
             "it settles below the ceiling" if fit.family == BOUNDED else "it stays flat")
    caption = (f"Device memory in use (blue) against the visible {fmt_bytes(b.visible_bytes, 'GiB')} (red, dotted) "
               f"and the budget at peak (grey): {SHAPE_WORDS[fit.family]}; {story}; the diagnosis names "
               f"{'the ' + d.named if d.named else 'none of the suspects'}.")
    fig = _FIGURE(t_h, se.used_bytes / GiB, (icpt + slope * se.t_s) / GiB, b.visible_bytes / GiB, b.peak_bytes / GiB)
    title = f"{b.model_key} on {b.gpu_key} TP{b.tp}: {se.injected or 'no leak'} injected"
    return View(title, rows, fig, caption=caption,
                values={"rate_bytes_per_s": fit.rate_bytes_per_s, "oom_s": r.oom_s,
                        "margin_bytes": b.headroom_margin_bytes})


# ---- I083: multimodal phases -------------------------------------------------------------------

VLM_GPUS = ("h100-sxm", "h200", "b200", "mi300x")


def multimodal_analysis(gpu: str, tp: int, utilization: float, height: int, width: int, max_pixels: int,
                        profile_max_pixels: int, images_per_step: int, images_per_request: int,
                        running: int, text_tokens: int, flash: bool, tower: str = "qwen2.5-vl-72b",
                        max_num_batched_tokens: int | None = None):
    """The budget as the engine profiled it (``images_per_step`` images at ``profile_max_pixels``), the
    phase peaks at ``max_pixels``, and the KV pages the ``running`` requests hold."""
    from lib.perf.memory import activation_peak_bytes, memory_budget
    from lib.sre import multimodal as mm

    t = mm.vision_tower(tower)
    tok = mm.image_tokens(height, width, t, max_pixels)
    tok_prof = mm.image_tokens(height, width, t, min(profile_max_pixels, t.max_pixels))
    probe = memory_budget(t.decoder, gpu, tp=tp, gpu_memory_utilization=utilization,
                          max_num_batched_tokens=max_num_batched_tokens)
    profiled = mm.phase_peaks(probe, t, tok_prof, images_per_step, flash=flash)
    act_dec = activation_peak_bytes(t.decoder, probe.max_num_batched_tokens, tp)
    measured = max(act_dec, profiled.encode)
    budget = memory_budget(t.decoder, gpu, tp=tp, gpu_memory_utilization=utilization,
                           max_num_batched_tokens=max_num_batched_tokens, activation_bytes_override=measured)
    peaks = mm.phase_peaks(budget, t, tok, images_per_step, flash=flash)
    per_request = images_per_request * tok + text_tokens
    each = budget.blocks_per_sequence(per_request)
    running_fit = min(running, budget.num_blocks // each)
    used_blocks = running_fit * each
    return SimpleNamespace(running_fit=running_fit, tower=t, budget=budget, tokens=tok, tokens_profiled=tok_prof, peaks=peaks,
                           decoder_activation=act_dec, profiled_encode=profiled.encode, measured=measured,
                           per_request_tokens=per_request, used_blocks=used_blocks,
                           free_fraction=1 - used_blocks / budget.num_blocks)


def _build_mm(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.14, top=0.95)
    ax = fig.add_subplot()
    x = np.arange(3)
    bars = ax.bar(x, np.zeros(3), color="C0")
    line = ax.axhline(1.0, color="C3", ls=":", lw=1.2, label="allowed per step")
    ax.set_xticks(x, ["encode", "prefill", "decode"])
    ax.set_ylabel("GB per GPU, transient")
    ax.grid(True, axis="y")
    ax.legend(loc="upper right", fontsize=7)
    return SimpleNamespace(ax=ax, bars=bars, line=line)


def _draw_mm(a, values, allowance) -> None:
    for bar, v in zip(a.bars, values, strict=True):
        bar.set_height(v)
        bar.set_color("C3" if v > allowance else "C0")
    a.line.set_ydata([allowance, allowance])
    a.ax.set_ylim(0, 1.15 * max(*values, allowance))


_MM_FIGURE = figures.LiveFigure(5.0, 2.6, _build_mm, _draw_mm)


@explorer(
    "sre.multimodal_phases",
    gpu=Choice(VLM_GPUS, label="GPU"),
    tp=Choice((2, 4, 8), label="tensor parallel"),
    utilization=FloatRange(0.7, 0.97, 0.01, label="gpu_memory_utilization"),
    height=IntRange(224, 8192, label="image height (px)"),
    width=IntRange(224, 8192, label="image width (px)"),
    max_pixels=Choice((1003520, 4014080, 12845056), label="max_pixels now"),
    images_per_step=IntRange(1, 32, label="images encoded per step"),
    flash=Choice((True, False), label="memory-efficient ViT attention"),
)
def multimodal_phases(gpu: str, tp: int, utilization: float, height: int, width: int, max_pixels: int,
                      images_per_step: int, flash: bool) -> View:
    """I083: the encode, prefill and decode transients of a vision-language step against the budget."""
    from lib.sre.multimodal import vision_tower

    r = multimodal_analysis(gpu, tp, utilization, height, width, max_pixels, vision_tower().card_max_pixels,
                            images_per_step, 4, 4, 1000, flash)
    return multimodal_view(r)


def multimodal_view(r) -> View:
    """The view of one :func:`multimodal_analysis` result."""
    p, b = r.peaks, r.budget
    oom = p.oom_phase
    rows = [("image tokens (now / profiled)", f"{r.tokens:,} / {r.tokens_profiled:,}"),
            ("allowed per step", fmt_bytes(p.allowance, "GB")),
            *((f"{k} transient", f"{fmt_bytes(v, 'GB')} ({'over by ' + fmt_bytes(v - p.allowance, 'GB') if v > p.allowance else 'fits'})")
              for k, v in p.phases.items()),
            ("KV pages free", f"{100 * r.free_fraction:.0f}% of {b.num_blocks:,} blocks"),
            ("verdict", f"OOM in the {oom} phase" if oom else "every phase fits")]
    caption = (f"Transient bytes of each phase on one GPU (bars; red when over) against what a step may use, the "
               f"measured activations plus the free headroom (red, dotted, {fmt_bytes(p.allowance, 'GB')}): "
               + (f"the {oom} phase runs out while {100 * r.free_fraction:.0f}% of the KV pages are free."
                  if oom else "every phase fits."))
    fig = _MM_FIGURE([v / 1e9 for v in p.phases.values()], p.allowance / 1e9)
    return View(f"{r.tower.name} on {b.gpu_key} TP{b.tp}", rows, fig, caption=caption,
                values={"allowance": p.allowance, **p.phases})


# ---- I076: the prefix boundary of two consecutive turns --------------------------------------------


@lru_cache(maxsize=32)
def _turn_pair(template: str, system_words: int, block_size: int, reply_words: int, seed: int):
    """Two consecutive turns of one conversation and their prefix boundary (cached: tokenizing is the cost)."""
    from lib.decoding.tokenizer import WordTokenizer
    from lib.sre import prefix_regression as pr

    first, second = pr.chat_corpus(template, 1, 2, system_words, 50, reply_words, seed=seed, tokenizer=WordTokenizer())
    return first, second, pr.prefix_boundary(first.prompt + first.reply, second.prompt, block_size)


def boundary_analysis(model: str, gpu: str, tp: int, template: str, system_words: int, block_size: int,
                      reply_words: int = 250, seed: int = 0):
    """Two consecutive turns of one conversation under ``template``: the prefix boundary between the
    first turn (prompt + reply, what the cache holds) and the second prompt, and the second turn's
    prefill with and without that reuse (:func:`lib.perf.prefill.prefill_time`)."""
    from lib.perf.deployment import deployment
    from lib.perf.prefill import prefill_time

    dep = deployment(model, gpu, tp=tp)
    first, second, bd = _turn_pair(template, system_words, block_size, reply_words, seed)
    n = len(second.prompt)
    reused = min(bd.reusable_tokens, n - 1)  # the last prompt token always runs: its logits start the reply
    s_first, s_second, bd_static = _turn_pair("static", system_words, block_size, reply_words, seed)
    reused_static = min(bd_static.reusable_tokens, len(s_second.prompt) - 1)
    t_with = prefill_time(dep, n - reused).time_s
    t_static = prefill_time(dep, len(s_second.prompt) - reused_static).time_s
    return SimpleNamespace(dep=dep, first=first, second=second, boundary=bd, prompt=n, reused=reused,
                           reused_static=reused_static, ttft_s=t_with, ttft_static_s=t_static,
                           lost=reused_static - reused)


def _build_bd(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.16, right=0.98, bottom=0.3, top=0.92)
    ax = fig.add_subplot()
    y = [1, 0]
    hit = ax.barh(y, [0, 0], color="C2", label="reused from the cache")
    miss = ax.barh(y, [0, 0], left=[0, 0], color="C3", label="prefilled again")
    (mark,) = ax.plot([0, 0], [-0.4, 1.4], color="k", lw=1.0, ls=":")
    ax.set_yticks(y, ["static template", "this template"])
    ax.set_xlabel("prompt tokens of the second turn")
    ax.legend(loc="lower right", fontsize=7)
    return SimpleNamespace(ax=ax, hit=hit, miss=miss, mark=mark)


def _draw_bd(a, reused, total, first_diff) -> None:
    for i in range(2):
        a.hit[i].set_width(reused[i])
        a.miss[i].set_x(reused[i])
        a.miss[i].set_width(total[i] - reused[i])
    a.mark.set_xdata([first_diff, first_diff])
    a.ax.set_xlim(0, 1.02 * max(total))


_BD_FIGURE = figures.LiveFigure(6.0, 2.2, _build_bd, _draw_bd)


@explorer(
    "sre.prefix_boundary",
    model=Choice(("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    template=Choice(("static", "timestamp"), label="chat template"),
    system_words=IntRange(20, 3000, label="system prompt words"),
    block_size=Choice((16, 32, 64), label="KV block size"),
)
def prefix_boundary_view(model: str, gpu: str, tp: int, template: str, system_words: int, block_size: int) -> View:
    """I076: where two consecutive turns' tokenizations part, the block whose chained hash changes,
    and what the lost reuse costs the second turn's TTFT."""
    from lib.units import fmt_time

    r = boundary_analysis(model, gpu, tp, template, system_words, block_size)
    bd = r.boundary
    rows = [("first differing token", f"{bd.first_diff:,} of {r.prompt:,}"),
            ("first block whose hash changes", f"{bd.first_changed_block:,} (block size {block_size})"),
            ("tokens reused / prefilled", f"{r.reused:,} / {r.prompt - r.reused:,}"),
            ("reuse lost against the static template", f"{r.lost:,} tokens"),
            ("second turn's prefill", f"{fmt_time(r.ttft_s)} (static template: {fmt_time(r.ttft_static_s)})")]
    caption = (f"The second turn's {r.prompt:,} prompt tokens, reused (green) or prefilled again (red), under this "
               f"template and the static one; the dotted line is the first differing token ({bd.first_diff:,}): "
               f"{r.lost:,} tokens of reuse lost.")
    fig = _BD_FIGURE([r.reused_static, r.reused], [r.prompt, r.prompt], bd.first_diff)
    return View(f"{model} on {gpu} TP{tp}, {template} template", rows, fig, caption=caption,
                values={"reused": r.reused, "lost": r.lost, "ttft_s": r.ttft_s})
