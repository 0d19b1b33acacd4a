"""Explorers for the KV-cache memory notebooks: per-sequence KV (N036), long-context serving
(N031), the serving memory budget (I010), memory beyond weights and KV (I106), GQA vs MLA on
real GPUs (I017) and tensor parallelism past the KV-head count (I107)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.kvcache import long_context as lc
from lib.perf import memory as mem
from lib.perf import prefill as pf
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.registry.dtypes import bytes_per_element
from lib.units import GiB, fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())
KV_DTYPES = ("bf16", "fp16", "fp8")
WEIGHT_DTYPES = ("bf16", "fp8")
COLORS = {
    mem.MEASURED: "#4c72b0",
    mem.ESTIMATED: "#dd8452",
    mem.HEADROOM: "#c44e52",
    "remainder": "#55a868",
}


def _compute_dtype(weight_dtype: str) -> str:
    return "fp8" if weight_dtype == "fp8" else "bf16"


@explorer(
    "kvcache.kv_per_sequence",
    model=Choice(MODELS),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    context=IntRange(1, 1048576, label="context tokens"),
)
def kv_per_sequence(model: str, kv_dtype: str, weight_dtype: str, context: int) -> View:
    """N036: one sequence's KV cache against the model's weights, and the query-heads mistake."""
    m = models.model(model)
    per_token = m.kv_bytes_per_token(kv_dtype)
    per_seq = mem.kv_bytes_per_sequence(m, context, kv_dtype)
    weights = m.weight_bytes(weight_dtype)
    wrong_heads = m.num_attention_heads
    wrong = context * mem.kv_bytes_per_token_formula(
        m.num_layers, wrong_heads, m.head_dim, bytes_per_element(kv_dtype)
    )
    xs = np.unique(np.geomspace(1024, max(2 * context, 262144), 40).astype(int))
    wrong_gb = None if m.is_mla else xs * wrong / context / 1e9
    fig = _KV_FIGURE(xs, xs * per_token / 1e9, wrong_gb, weights / 1e9, weight_dtype, context)
    rows = [
        ("KV per token", fmt_bytes(per_token, "KiB")),
        ("KV per sequence", fmt_bytes(per_seq)),
        ("weights", fmt_bytes(weights)),
        ("KV / weights", fmt_pct(per_seq / weights)),
    ]
    if m.is_mla:
        rows.append(("query-heads mistake", "n/a: MLA caches one shared latent"))
    else:
        rows += [
            ("query heads / KV heads", sig(m.gqa_group_size)),
            ("with query heads (wrong)", fmt_bytes(wrong)),
        ]
    if m.is_mla:
        mistake = ""
    elif m.num_kv_heads == m.num_attention_heads:
        mistake = " With as many KV heads as query heads, counting query heads (dashed) happens to be right."
    else:
        mistake = (f" The dashed line counts query heads instead of KV heads: {sig(wrong / (context * per_token))}x "
                   "too much.")
    share = fmt_pct(per_seq / weights) if per_seq < weights else f"{sig(per_seq / weights)}x"
    caption = (f"One sequence's KV grows linearly with its context and equals the {weight_dtype} weights "
               f"({fmt_bytes(weights)}, black) at {sig(weights / per_token)} tokens; at this context "
               f"({fmt_int(context)}, red) it is {share} their size.{mistake}")
    return View(
        f"{m.key}, {context:,} tokens, KV in {kv_dtype}",
        rows,
        fig,
        caption=caption,
        values={
            "per_token": per_token,
            "per_sequence": per_seq,
            "weights": weights,
            "wrong": wrong,
        },
    )


@explorer(
    "kvcache.long_context",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    context=IntRange(1024, 1048576, label="context tokens"),
    target_sequences=IntRange(1, 1024, label="sequences needed in flight"),
    ttft_slo_s=FloatRange(0.1, 60.0, 0.1, label="TTFT SLO (s)"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="prefill fraction of peak"),
)
def long_context(
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    context: int,
    target_sequences: int,
    ttft_slo_s: float,
    mfu: float,
) -> View:
    """N031: capacity, TTFT and the scheduler as context grows; where each one breaks."""
    m, g = models.model(model), hardware.gpu(gpu)
    cdt = _compute_dtype(weight_dtype)
    dep = Deployment(m, g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=cdt)
    budget = dep.budget
    cap_ctx = lc.capacity_break_context(budget, target_sequences)
    ttft_ctx = lc.ttft_break_context(dep, ttft_slo_s, mfu)
    share = mem.fact("headroom_fraction_for_admission")
    sched_ctx = lc.scheduler_break_context(budget)
    xs = np.unique(np.geomspace(1024, max(4 * context, 1 << 20), 32).astype(int))
    seqs = np.array([budget.token_capacity / x for x in xs])
    ttft = np.array(
        [pf.prefill_time(dep, int(x), mfu=mfu).time_s for x in xs]
    )
    shares = np.array([lc.admission_share(budget, int(x)) for x in xs])
    fig = _LONG_FIGURE(xs, seqs / target_sequences, ttft_slo_s / ttft, share / shares, context)
    est = pf.prefill_time(dep, context, mfu=mfu)
    chunk = min(budget.max_num_batched_tokens, context)
    last_step = lc.prefill_chunk_step_s(dep, chunk, max(0, context - chunk), 0, mfu)
    rows = [
        (
            "KV of one request",
            f"{fmt_bytes(mem.kv_bytes_per_sequence(m, context, kv_dtype))} "
            f"({fmt_bytes(context * budget.kv_bytes_per_token_per_gpu)} per GPU)",
        ),
        ("requests that fit", f"{budget.max_sequences(context):,}"),
        ("prefill (prefill_time, all-reduce included)", fmt_time(est.time_s)),
        ("last chunked-prefill step", fmt_time(last_step)),
        ("one request's share of the pool", fmt_pct(lc.admission_share(budget, context))),
        ("capacity breaks at", f"{cap_ctx:,} tokens"),
        ("TTFT breaks at", f"{sig(ttft_ctx)} tokens"),
        ("scheduler breaks at", f"{sched_ctx:,} tokens"),
    ]
    breaks = {"capacity": cap_ctx, "TTFT": ttft_ctx, "the scheduler": sched_ctx}
    first = min(breaks, key=breaks.get)
    caption = (f"Each line is one limit's margin as the context grows; it breaks where its line falls below 1 (black). "
               f"Capacity breaks at {fmt_int(cap_ctx)} tokens, TTFT at {sig(ttft_ctx)} and the scheduler at "
               f"{fmt_int(sched_ctx)}: {first} breaks first.")
    return View(
        f"{m.key} on {tp}x {g.key}",
        rows,
        fig,
        caption=caption,
        values={
            "capacity": cap_ctx,
            "ttft": ttft_ctx,
            "scheduler": sched_ctx,
            "prefill_s": est.time_s,
        },
    )


@explorer(
    "kvcache.memory_budget",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    gpu_memory_utilization=FloatRange(0.5, 0.99, 0.01, label="gpu_memory_utilization"),
    max_num_batched_tokens=IntRange(256, 65536, log=True, label="max_num_batched_tokens"),
    max_num_seqs=IntRange(1, 2048, log=True, label="max_num_seqs"),
    block_size=Choice((8, 16, 32, 64, 128), label="block size"),
    context=IntRange(1, 1048576, label="context per sequence"),
)
def memory_budget(
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    context: int,
) -> View:
    """I010: the budget a vLLM-style engine lays out on each GPU, and the block ceiling it implies."""
    b = mem.memory_budget(
        model,
        gpu,
        tp,
        weight_dtype,
        kv_dtype,
        gpu_memory_utilization,
        max_num_batched_tokens,
        max_num_seqs,
        block_size,
    )
    rows = [
        (f"{name.replace('_', ' ')} ({view})", fmt_bytes(value)) for name, value, view in b.table()
    ]
    rows += [
        ("KV blocks", f"{b.num_blocks:,} of {fmt_bytes(b.block_bytes, 'MB')}"),
        ("tokens in the pool", f"{b.token_capacity:,}"),
        (f"sequences of {context:,} tokens", f"{b.max_sequences(context):,}"),
        ("headroom margin", fmt_bytes(b.headroom_margin_bytes)),
    ]
    note = "" if b.headroom_margin_bytes >= 0 else "headroom margin negative: this GPU OOMs at peak"
    margin = (f"{fmt_bytes(b.headroom_margin_bytes)} stay free at peak" if b.headroom_margin_bytes >= 0 else
              f"at peak it is {fmt_bytes(-b.headroom_margin_bytes)} short")
    caption = (f"One GPU's memory, left to right: the pieces the engine measures or estimates, the headroom it does not "
               f"count, and the KV cache ({fmt_bytes(b.kv_cache_bytes)}), sized so the counted pieces reach the dashed "
               f"utilization limit. The solid line is the memory the driver shows; {margin}.")
    return View(
        f"{b.model_key} on {tp}x {b.gpu_key}",
        rows,
        _BUDGET_FIGURE(b, layout=(len(b.table()),)),
        note=note,
        caption=caption,
        values={"kv": b.kv_cache_bytes, "blocks": b.num_blocks, "margin": b.headroom_margin_bytes},
    )


@explorer(
    "kvcache.memory_beyond",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    max_num_batched_tokens=IntRange(256, 65536, log=True, label="max_num_batched_tokens"),
    max_num_seqs=IntRange(1, 2048, log=True, label="max_num_seqs"),
    prompt_logprobs=Choice(("off", "on"), label="prompt logprobs"),
    sampler=Choice(("sort-free", "sort-based"), label="top-p/top-k sampler"),
    fragmentation=FloatRange(0.0, 0.5, 0.01, label="fragmentation fraction"),
)
def memory_beyond(
    model: str,
    gpu: str,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    prompt_logprobs: str,
    sampler: str,
    fragmentation: float,
) -> View:
    """I106: everything besides weights and KV, sized, with how the engine accounts for it."""
    m, g = models.model(model), hardware.gpu(gpu)
    rows_sampled = (
        max_num_batched_tokens
        if prompt_logprobs == "on"
        else min(max_num_seqs, max_num_batched_tokens)
    )
    per_entry = mem.fact("sampler_bytes_per_vocab_entry") + (12 if sampler == "sort-based" else 0)
    b = mem.memory_budget(
        m,
        g,
        tp,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        fragmentation_fraction=fragmentation,
        sampler_rows=rows_sampled,
        sampler_bytes_per_entry=per_entry,
    )
    items = [(k, v, b.engine_view[k]) for k, v in b.components.items() if k != "weights"]
    fig = _BEYOND_FIGURE(items, layout=(len(items),))
    total = sum(v for _, v, _ in items)
    rows = [(f"{k.replace('_', ' ')} ({view})", fmt_bytes(v, "GiB")) for k, v, view in items]
    rows += [
        ("total beyond weights and KV", fmt_bytes(total, "GiB")),
        ("as KV tokens lost per GPU", f"{sig(total / b.kv_bytes_per_token_per_gpu)}"),
        ("headroom margin", fmt_bytes(b.headroom_margin_bytes, "GiB")),
    ]
    name, largest, _ = max(items, key=lambda item: item[1])
    caption = (f"Everything on one GPU besides weights and KV: {fmt_bytes(total, 'GiB')} in all, the largest "
               f"{name.replace('_', ' ')} ({fmt_bytes(largest, 'GiB')}). The colour says how the engine accounts for "
               "each: measured in its profiling run, estimated, or left out as headroom.")
    return View(
        f"{m.key} on {tp}x {g.key}", rows, fig, caption=caption, values={"total": total, **dict(b.components)}
    )


def _try_deployment(mdl, gpu, n, tp, weight_dtype, kv_dtype, **kw):
    try:
        return mem.fleet(mdl, gpu, n, tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype, **kw)
    except ValueError:
        return None


GQA_MODELS = tuple(k for k in MODELS if not models.model(k).is_mla)
MLA_MODELS = tuple(k for k in MODELS if models.model(k).is_mla)


@explorer(
    "kvcache.gqa_vs_mla",
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 64, log=True, label="GPUs"),
    tp=IntRange(1, 64, log=True, label="tensor parallel"),
    gqa_model=Choice(GQA_MODELS, label="GQA model"),
    mla_model=Choice(MLA_MODELS, label="MLA model"),
    gqa_weight_dtype=Choice(WEIGHT_DTYPES, label="GQA model weights"),
    mla_weight_dtype=Choice(WEIGHT_DTYPES, label="MLA model weights"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    context=IntRange(1024, 1048576, label="context per sequence"),
)
def gqa_vs_mla(
    gpu: str,
    n_gpus: int,
    tp: int,
    gqa_model: str,
    mla_model: str,
    gqa_weight_dtype: str,
    mla_weight_dtype: str,
    kv_dtype: str,
    context: int,
) -> View:
    """I017: a GQA model vs an MLA model on n GPUs as n / tp replicas: TP, TP + DCP, DP attention."""
    if n_gpus % tp:
        raise ValueError(f"tensor parallel {tp} must divide the {n_gpus} GPUs")
    layouts = (("TP", {}), ("TP + DCP", {"dcp": "max"}), ("DP attention", {"dp_attention": True}))
    rows, values = [], {}
    sequences = {}
    for key, wdt in ((gqa_model, gqa_weight_dtype), (mla_model, mla_weight_dtype)):
        m = models.model(key)
        rows.append((f"{key} KV per token", fmt_bytes(m.kv_bytes_per_token(kv_dtype), "KB")))
        heights = []
        for name, kw in layouts:
            kw = dict(kw)
            if m.num_attention_heads % tp:
                rows.append(
                    (f"{key}, {name}", f"TP{tp} does not divide its {m.num_attention_heads} heads")
                )
                heights.append(0)
                continue
            if kw.get("dcp") == "max":
                kw["dcp"] = mem.max_dcp(m, tp)
            d = _try_deployment(m, gpu, n_gpus, tp, wdt, kv_dtype, **kw)
            if d is None:
                rows.append((f"{key}, {name}", "does not fit"))
                heights.append(0)
                continue
            seqs = d.sequences(context)
            heights.append(seqs)
            values[f"{key}|{name}"] = seqs
            rows.append(
                (
                    f"{key}, {name}",
                    f"{fmt_bytes(d.placement.bytes_per_token_per_gpu, 'KB')}/token/GPU, "
                    f"{d.tokens_total:,} tokens, {seqs} seqs, "
                    f"{fmt_bytes(d.wasted_bytes_total)} duplicated",
                )
            )
        sequences[key] = heights
    fig = _GQA_FIGURE([n for n, _ in layouts], sequences, context)
    best = []
    for key, heights in sequences.items():
        i = int(np.argmax(heights))
        best.append(f"{key} most with {layouts[i][0]} ({fmt_int(heights[i])})" if heights[i] > 0 else
                    f"{key} fits no layout")
    caption = (f"Sequences of {fmt_int(context)} tokens that {n_gpus}x {gpu} hold under each layout, the GQA model "
               f"beside the MLA one; a missing bar is a layout that does not fit. Here {best[0]}, {best[1]}.")
    return View(f"{n_gpus}x {gpu} at TP{tp}, KV in {kv_dtype}", rows, fig, caption=caption, values=values)


@explorer(
    "kvcache.tp_past_kv_heads",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    n_gpus=IntRange(1, 64, log=True, label="GPUs"),
    weight_dtype=Choice(WEIGHT_DTYPES, label="weights"),
    kv_dtype=Choice(KV_DTYPES, label="KV cache"),
    context=IntRange(1024, 1048576, label="context per sequence"),
)
def tp_past_kv_heads(
    model: str, gpu: str, n_gpus: int, weight_dtype: str, kv_dtype: str, context: int
) -> View:
    """I107: n GPUs as TP=n (heads replicated past the KV-head count) against the layouts that avoid it."""
    m = models.model(model)
    if m.is_mla:
        raise ValueError(
            f"{m.key} uses MLA (one latent, no KV heads to split): see kvcache.gqa_vs_mla"
        )
    h = m.num_kv_heads
    candidates = [("TP = all GPUs", dict(tp=n_gpus))]
    if n_gpus > h:
        rest = n_gpus // h
        candidates += [
            (f"TP{h} x {rest} replicas", dict(tp=h)),
            (f"TP{h} x PP{rest}", dict(tp=h, pp=rest)),
            (f"TP{n_gpus} + DCP{rest}", dict(tp=n_gpus, dcp=rest)),
        ]
    rows, labels, heights, values = [], [], [], {}
    for name, kw in candidates:
        if n_gpus % (kw["tp"] * kw.get("pp", 1)) or m.num_attention_heads % kw["tp"]:
            continue
        d = _try_deployment(m, gpu, n_gpus, weight_dtype=weight_dtype, kv_dtype=kv_dtype, **kw)
        if d is None:
            rows.append((name, "does not fit"))
            continue
        seqs = d.sequences(context)
        labels.append(name)
        heights.append(d.tokens_total / 1e6)
        values[name] = d.tokens_total
        rows.append(
            (
                name,
                f"weights {fmt_bytes(d.budget.components['weights'])}/GPU, "
                f"KV {fmt_bytes(d.placement.bytes_per_token_per_gpu, 'KB')}/token/GPU, "
                f"{d.tokens_total:,} tokens, {seqs} seqs, duplicated {fmt_bytes(d.wasted_bytes_total)}",
            )
        )
    if not labels:
        raise ValueError(f"no layout of {m.key} fits on {n_gpus}x {gpu} in {weight_dtype}")
    fig = _LAYOUTS_FIGURE(labels, heights, layout=(max(_LAYOUT_ROWS, len(labels)),))
    best = labels[int(np.argmax(heights))]
    if n_gpus <= h:
        verdict = f"{n_gpus} GPUs do not pass its {h} KV heads, so TP over all of them copies no head."
    elif "TP = all GPUs" in labels:
        verdict = (f"past {h} KV heads TP = all GPUs copies heads, so it holds "
                   f"{fmt_pct(heights[labels.index('TP = all GPUs')] / max(heights))} of the best ('{best}').")
    else:
        verdict = f"the most is held by '{best}'."
    caption = (f"Million tokens of KV that {n_gpus}x {gpu} hold under each layout (a layout that does not fit has no "
               f"bar); {verdict}")
    return View(f"{m.key} on {n_gpus}x {gpu} ({h} KV heads)", rows, fig, caption=caption, values=values)


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _margins(fig, bottom: float = 0.18) -> None:
    fig.subplots_adjust(bottom=bottom, left=0.13, right=0.97, top=0.95)


def _kv_build(fig) -> SimpleNamespace:
    _margins(fig)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.kv, = ax.plot([], [], label="KV per sequence")
    a.wrong, = ax.plot([], [], ls="--", label="with query heads (wrong)")
    a.weights = ax.axhline(1.0, color="black", lw=1)
    a.context = ax.axvline(1.0, color="red", lw=1, label="this context")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("GB")
    return a


def _kv_draw(a: SimpleNamespace, xs, kv_gb, wrong_gb, weights_gb: float, weight_dtype: str, context: int) -> None:
    a.kv.set_data(xs, kv_gb)
    a.wrong.set_visible(wrong_gb is not None)  # MLA caches one latent: no query-heads mistake
    a.wrong.set_data(xs, kv_gb if wrong_gb is None else wrong_gb)
    a.weights.set_ydata([weights_gb, weights_gb])
    a.weights.set_label(f"weights ({weight_dtype})")
    a.context.set_xdata([context, context])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.kv, a.wrong, a.weights, a.context], fontsize=7)


_KV_FIGURE = figures.LiveFigure(6.0, 3.0, _kv_build, _kv_draw)


def _long_build(fig) -> SimpleNamespace:
    _margins(fig)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.margins = [ax.plot([], [], label=label)[0] for label in (
        "capacity: sequences / needed", "TTFT: SLO / prefill time", "scheduler: free slack / one request")]
    a.one = ax.axhline(1.0, color="black", lw=1, label="breaks below 1")
    a.context = ax.axvline(1.0, color="red", lw=1, label="this context")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("margin (breaks below 1)")
    return a


def _long_draw(a: SimpleNamespace, xs, capacity, ttft, scheduler, context: int) -> None:
    for line, ys in zip(a.margins, (capacity, ttft, scheduler), strict=True):
        line.set_data(xs, ys)
    a.context.set_xdata([context, context])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [*a.margins, a.one, a.context], fontsize=7)


_LONG_FIGURE = figures.LiveFigure(6.0, 3.2, _long_build, _long_draw)

_BUDGET_KINDS = (("measured", mem.MEASURED), ("estimated", mem.ESTIMATED), ("headroom (not counted)", mem.HEADROOM),
                 ("KV cache", "remainder"))


def _budget_build(fig, n: int) -> SimpleNamespace:
    from matplotlib.patches import Patch

    fig.subplots_adjust(bottom=0.48, top=0.97, left=0.13, right=0.97)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.barh(np.zeros(n), np.zeros(n), height=0.9, edgecolor="white")
    a.names = [ax.text(0.0, 0.0, "", ha="center", va="center", fontsize=7, color="white") for _ in range(n)]
    a.requested = ax.axvline(0.0, color="black", ls="--", lw=1, label="utilization limit")
    a.visible = ax.axvline(0.0, color="black", lw=1.5, label="visible memory")
    ax.set_yticks([])
    ax.set_ylim(-0.5, 0.5)
    ax.set_xlabel("GB per GPU")
    kinds = [Patch(color=COLORS[view], label=label) for label, view in _BUDGET_KINDS]
    ax.legend(handles=[*kinds, a.requested, a.visible], fontsize=7, ncol=3, loc="upper center",
              bbox_to_anchor=(0.5, -0.42))
    return a


def _budget_draw(a: SimpleNamespace, b: mem.MemoryBudget) -> None:
    left = 0.0
    for bar, text, (name, value, view) in zip(a.bars, a.names, b.table(), strict=True):
        bar.set_x(left)
        bar.set_width(value / 1e9)
        bar.set_facecolor(COLORS[view])
        text.set_position((left + value / 2e9, 0))
        text.set_text(name.replace("_", " "))
        text.set_visible(value / b.visible_bytes > 0.1)
        left += value / 1e9
    a.requested.set_xdata([b.requested_bytes / 1e9] * 2)
    a.visible.set_xdata([b.visible_bytes / 1e9] * 2)
    a.ax.set_xlim(0.0, 1.05 * max(left, b.visible_bytes / 1e9))


_BUDGET_FIGURE = figures.LiveFigure(6.2, 2.2, _budget_build, _budget_draw)


def _beyond_build(fig, n: int) -> SimpleNamespace:
    from matplotlib.patches import Patch

    _margins(fig)
    fig.subplots_adjust(left=0.3)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, bars=ax.barh(range(n), np.zeros(n)))
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU")
    a.kinds = [Patch(color=COLORS[view], label=label) for label, view in _BUDGET_KINDS[:3]]
    return a


def _beyond_draw(a: SimpleNamespace, items: list) -> None:
    for bar, (_, value, view) in zip(a.bars, items, strict=True):
        bar.set_width(value / GiB)
        bar.set_color(COLORS[view])
    a.ax.set_yticks(range(len(items)), [k.replace("_", " ") for k, _, _ in items], fontsize=8)
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, a.kinds, fontsize=7, loc="lower right")


_BEYOND_FIGURE = figures.LiveFigure(6.0, 2.8, _beyond_build, _beyond_draw)


def _gqa_build(fig) -> SimpleNamespace:
    _margins(fig, bottom=0.12)
    ax = fig.add_subplot()
    width = 0.38
    bars = [ax.bar(np.arange(3) + (j - 0.5) * width, np.zeros(3), width) for j in range(2)]
    return SimpleNamespace(ax=ax, bars=bars)


def _gqa_draw(a: SimpleNamespace, layouts: list[str], sequences: dict, context: int) -> None:
    for bars, (key, heights) in zip(a.bars, sequences.items(), strict=True):
        for bar, h in zip(bars, heights, strict=True):
            bar.set_height(h)
        bars.set_label(key)
    a.ax.set_xticks(np.arange(3), layouts)
    a.ax.set_ylabel(f"sequences of {context:,} tokens")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, a.bars, fontsize=7)


_GQA_FIGURE = figures.LiveFigure(6.0, 2.8, _gqa_build, _gqa_draw)


_LAYOUT_ROWS = 4  # tp_past_kv_heads compares at most four layouts


def _layouts_build(fig, capacity: int) -> SimpleNamespace:
    _margins(fig)
    fig.subplots_adjust(left=0.3)
    ax = fig.add_subplot()
    bars = ax.barh(range(capacity), np.zeros(capacity), label="tokens of KV held")
    ax.set_xlabel("million tokens of KV the GPUs hold")
    return SimpleNamespace(ax=ax, bars=bars)


def _layouts_draw(a: SimpleNamespace, labels: list[str], heights: list[float]) -> None:
    for i, bar in enumerate(a.bars):
        bar.set_visible(i < len(labels))
        bar.set_width(heights[i] if i < len(labels) else 0.0)
    a.ax.set_yticks(range(len(labels)), labels, fontsize=8)
    a.ax.set_ylim(len(labels) - 0.5, -0.5)  # first layout on top
    a.ax.set_xlim(0, 1.05 * max(heights))


_LAYOUTS_FIGURE = figures.LiveFigure(6.0, 2.8, _layouts_build, _layouts_draw)


__all__ = [
    "kv_per_sequence",
    "long_context",
    "memory_budget",
    "memory_beyond",
    "gqa_vs_mla",
    "tp_past_kv_heads",
]
