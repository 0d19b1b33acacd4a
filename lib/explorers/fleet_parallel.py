"""Explorers for parallelism at fleet scale (I056 tensor-parallel-scaling).

Views call :mod:`lib.fleet.parallel_tp` only (each TP degree's GPU-seconds per request through
:func:`lib.fleet.capacity.request_cost`). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import parallel_tp as pt
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(m for m in models.model_names() if not models.model(m).is_mla and models.model(m).num_experts in (0, None))
GPUS = tuple(hardware.gpu_names())
_MAX_LINES = 6
_POINTS = 9


def _base(model: str, gpu: str, weight_dtype: str) -> Deployment:
    """The largest degree up to a node that deploys the model (the options are priced from it)."""
    last = None
    for tp in (8, 4, 2, 1):
        try:
            return Deployment(model, gpu, tp=tp, weight_dtype=weight_dtype,
                              compute_dtype="fp8" if weight_dtype == "fp8" else "bf16")
        except ValueError as exc:
            last = exc
    raise ValueError(f"{model} in {weight_dtype} cannot be deployed on up to 8 {gpu}: {last}")


@functools.lru_cache(maxsize=64)
def tp_curves(model: str, gpu: str, weight_dtype: str, prompt: int, output: int) -> SimpleNamespace:
    """GPU-seconds per request of each degree on a log grid of TPOT targets (tightest feasible to 200 ms)."""
    models.model(model).check_context(prompt + output, "prompt + output")
    dep = _base(model, gpu, weight_dtype)
    degrees = pt._degrees(dep, None)
    floors = {}
    for n in degrees:
        try:
            floors[n] = pt.tightest_tpot_s(dep, n, prompt, output)
        except ValueError:
            pass
    if not floors:
        raise ValueError(f"no TP degree up to a node deploys {model} ({weight_dtype}) on {gpu}")
    lo, hi = min(floors.values()) * 1.001, 0.2
    if lo >= hi:
        raise ValueError(f"even one sequence's decode step at {prompt + output:,} tokens is {fmt_time(lo)}: "
                         "over the 200 ms this explorer spans")
    targets = np.geomspace(lo, hi, _POINTS)
    by_target = pt.gpu_s_by_target(dep, prompt, output, [float(t) for t in targets], list(floors))
    gpu_s = {}
    for n, v in by_target.items():
        y = np.array(v)
        gpu_s[n] = np.where(np.isfinite(y), y, np.nan)  # nan where the degree cannot serve: its line stops
    return SimpleNamespace(dep=dep, floors=floors, targets=targets, gpu_s=gpu_s)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    lines = [ax.plot([1.0], [1.0], marker="o", ms=3, lw=1.6, color=f"C{i}")[0] for i in range(_MAX_LINES)]
    target = ax.axvline(30.0, color="0.3", ls=":", lw=1.2)
    figures.log_scale(ax, "both")
    ax.set_xlabel("TPOT target (ms)")
    ax.set_ylabel("GPU-seconds per request")
    ax.grid(True)
    return SimpleNamespace(ax=ax, lines=lines, target=target)


def _draw(a, targets_ms, curves: dict, tpot_ms: float) -> None:
    ys = []
    shown = []
    for line, (n, y) in zip(a.lines, list(curves.items()) + [(None, None)] * _MAX_LINES, strict=False):
        if n is None or not np.isfinite(y).any():
            line.set_visible(False)
            continue
        line.set_visible(True)
        line.set_data(targets_ms, y)
        line.set_label(f"TP{n}")
        ys.append(y[np.isfinite(y)])
        shown.append(line)
    a.target.set_xdata([tpot_ms, tpot_ms])
    a.ax.set_xlim(min(targets_ms[0], tpot_ms) * 0.9, max(targets_ms[-1], tpot_ms) * 1.1)
    allv = np.concatenate(ys) if ys else np.array([1.0])
    a.ax.set_ylim(allv.min() * 0.8, allv.max() * 1.25)
    figures.legend(a.ax, shown, fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.tp_choice",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    prompt=IntRange(128, 131072, label="prompt (tokens)", log=True),
    output=IntRange(16, 4096, label="output (tokens)", log=True),
    tpot_ms=FloatRange(5.0, 200.0, 1.0, label="TPOT target (ms)"),
)
def tp_choice(model: str, gpu: str, weight_dtype: str, prompt: int, output: int, tpot_ms: float) -> View:
    """I056: GPU-seconds per request of each TP degree against the TPOT target, and the cheapest degree."""
    c = tp_curves(model, gpu, weight_dtype, prompt, output)
    opts = pt.tp_options(c.dep, prompt, output, tpot_ms / 1e3, list(c.floors))
    best = pt.cheapest(opts)
    rows = [(f"TP{n}", (f"{sig(o.gpu_s)} GPU-s/request, batch {fmt_int(o.cost.batch)} ({o.cost.limits.binding})"
                        if o.serves else f"cannot serve: tightest TPOT {fmt_time(c.floors[n])}"))
            for n, o in opts.items()]
    rows.append(("cheapest degree", f"TP{best.tp}" if best else "none meets this target"))
    caption = ("GPU-seconds per request of each TP degree against the TPOT target (log-log); the dotted line is the "
               "target. Each line starts at the tightest target its degree meets: tight targets leave only the large "
               "degrees, loose ones favour the small degree whose per-GPU throughput is highest"
               + (f"; here TP{best.tp} is cheapest." if best else "; here no degree meets the target."))
    ms = c.targets * 1e3
    fig = _FIGURE(ms, c.gpu_s, tpot_ms)
    return View(f"TP choice: {model} {weight_dtype} on {gpu}, {fmt_int(prompt)} + {fmt_int(output)} tokens",
                rows, fig, caption=caption, note="" if best else "tighten nothing: no degree meets this TPOT",
                values={"best_tp": float(best.tp) if best else math.nan,
                        **{f"gpu_s_tp{n}": o.gpu_s for n, o in opts.items()}})


# ---- N026 disaggregation break-even ------------------------------------------------------------

_PROMPTS = 12


@functools.lru_cache(maxsize=64)
def disagg_curves(model: str, gpu: str, tp: int, output: int, tpot_ms: float, ttft_ms: float) -> SimpleNamespace:
    """GPU-seconds per request, colocated and disaggregated (same layout both pools), on a log grid of prompts."""
    from lib.fleet import disaggregation as dg

    dep = Deployment(model, gpu, tp=tp)
    top = dep.mdl.max_position_embeddings - output
    if top < 256:
        raise ValueError(f"output = {output:,} leaves under 256 prompt tokens in {model}'s window")
    prompts = np.unique(np.geomspace(256, top, _PROMPTS).round().astype(int))
    colo, dis = np.full(len(prompts), np.nan), np.full(len(prompts), np.nan)
    for i, p in enumerate(prompts):
        c = dg.colocated_capacity(dep, int(p), output, tpot_ms / 1e3, ttft_ms / 1e3)
        if c.feasible:
            colo[i] = c.gpu_s
        x = dg.disaggregated_within(dep, dep, int(p), output, tpot_ms / 1e3, ttft_ms / 1e3)
        if x is not None:
            dis[i] = x.gpu_s
    return SimpleNamespace(dep=dep, prompts=prompts, colo=colo, dis=dis)


def _dbuild(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    colo = ax.plot([1.0], [1.0], "o-", ms=3, lw=1.6, color="C0", label="colocated (chunked prefill)")[0]
    dis = ax.plot([1.0], [1.0], "s-", ms=3, lw=1.6, color="C1", label="disaggregated (two pools)")[0]
    here = ax.axvline(4096, color="0.3", ls=":", lw=1.2)
    figures.log_scale(ax, "both")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("GPU-seconds per request")
    ax.grid(True)
    return SimpleNamespace(ax=ax, colo=colo, dis=dis, here=here)


def _ddraw(a, prompts, colo, dis, prompt) -> None:
    a.colo.set_data(prompts, colo)
    a.dis.set_data(prompts, dis)
    a.here.set_xdata([prompt, prompt])
    vals = np.concatenate([colo[np.isfinite(colo)], dis[np.isfinite(dis)]])
    vals = vals if vals.size else np.array([1.0])
    a.ax.set_xlim(prompts[0] * 0.8, prompts[-1] * 1.25)
    a.ax.set_ylim(vals.min() * 0.7, vals.max() * 1.4)
    figures.legend(a.ax, [a.colo, a.dis], fontsize=7, loc="upper left")


_DFIGURE = figures.LiveFigure(6.0, 3.2, _dbuild, _ddraw)


@explorer(
    "fleet.disaggregation",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP (both pools)"),
    prompt=IntRange(256, 131072, label="prompt (tokens)", log=True),
    output=IntRange(16, 4096, label="output (tokens)", log=True),
    tpot_ms=FloatRange(10.0, 200.0, 1.0, label="TPOT target (ms)"),
    ttft_ms=FloatRange(100.0, 10000.0, 50.0, label="TTFT budget (ms)"),
)
def disaggregation(model: str, gpu: str, tp: int, prompt: int, output: int, tpot_ms: float, ttft_ms: float) -> View:
    """N026: GPU-seconds per request colocated vs disaggregated over the prompt length, under both targets."""
    from lib.fleet import disaggregation as dg

    c = disagg_curves(model, gpu, tp, output, tpot_ms, ttft_ms)
    dep = c.dep
    colo = dg.colocated_capacity(dep, prompt, output, tpot_ms / 1e3, ttft_ms / 1e3)
    dis = dg.disaggregated_capacity(dep, dep, prompt, output, tpot_ms / 1e3)
    dis_ok = dis.batch >= 1 and dis.ttft_s <= ttft_ms / 1e3
    rows = [("colocated", f"{sig(colo.rate)} requests/s per replica, {sig(colo.gpu_s)} GPU-s per request "
                          f"({fmt_int(colo.decodes)} decodes + {fmt_int(colo.chunk_tokens)} prompt tokens a step)"
             if colo.feasible else f"cannot meet both targets: {colo.reason}"),
            ("disaggregated", (f"{sig(dis.gpu_s)} GPU-s per request; prefill {fmt_time(dis.prefill_s)}, decode batch "
                               f"{fmt_int(dis.batch)}, TTFT {fmt_time(dis.ttft_s)}") if dis_ok else
             f"cannot meet both targets (TTFT {fmt_time(dis.ttft_s)}, decode batch {fmt_int(dis.batch)})"),
            ("KV per request", f"{dis.transfer.bytes_total / 1e9:.3g} GB in {fmt_time(dis.transfer.time_s)} over "
                               f"{dis.transfer.lanes} NIC{'s' if dis.transfer.lanes > 1 else ''}; exposed {fmt_time(dis.transfer.exposed_s(dis.prefill_s))}")]
    if colo.feasible and dis_ok:
        verdict = "disaggregated" if dis.gpu_s < colo.gpu_s else "colocated"
        rows.append(("cheaper per request", f"{verdict} ({fmt_pct(abs(dis.gpu_s / colo.gpu_s - 1))})"))
    caption = ("GPU-seconds per request against the prompt length (log-log), colocated with chunked prefill and on "
               "separate prefill and decode pools; a line stops where that design can no longer meet both the TPOT "
               "target and the TTFT budget, and the dotted line is the chosen prompt.")
    fig = _DFIGURE(c.prompts, c.colo, c.dis, prompt)
    return View(f"Disaggregation: {model} TP{tp} on {gpu}, {fmt_int(prompt)} + {fmt_int(output)} tokens", rows, fig,
                caption=caption, values={"colo_gpu_s": colo.gpu_s, "dis_gpu_s": dis.gpu_s if dis_ok else math.inf})


# ---- I057 the KV hand-off ----------------------------------------------------------------------

_LIMITS = ("prefill compute", "prefill NICs", "decode KV memory", "decode TPOT target", "decode NICs")


def _kbuild(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.27, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    bars = ax.barh(range(len(_LIMITS)), [1.0] * len(_LIMITS), color=["C0", "C0", "C1", "C1", "C1"])
    ax.set_yticks(range(len(_LIMITS)), _LIMITS)
    ax.invert_yaxis()
    figures.log_scale(ax, "x")
    ax.set_xlabel("requests/s into one replica at which the resource runs out")
    ax.grid(True, axis="x")
    return SimpleNamespace(ax=ax, bars=bars)


def _kdraw(a, rates) -> None:
    for bar, r in zip(a.bars, rates, strict=True):
        bar.set_width(r)
    a.ax.set_xlim(min(rates) * 0.5, max(rates) * 2)


_KFIGURE = figures.LiveFigure(6.0, 3.0, _kbuild, _kdraw)


@explorer(
    "fleet.kv_transfer",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP (both pools)"),
    prompt=IntRange(256, 131072, label="prompt (tokens)", log=True),
    output=IntRange(16, 4096, label="output (tokens)", log=True),
    tpot_ms=FloatRange(10.0, 200.0, 1.0, label="TPOT target (ms)"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    link=Choice(("bulk", "layer", "block"), label="hand-off"),
)
def kv_transfer(model: str, gpu: str, tp: int, prompt: int, output: int, tpot_ms: float, kv_dtype: str,
                link: str) -> View:
    """I057: the KV hand-off of one prompt, and where the sender and the receiver run out."""
    from lib.fleet import disaggregation as dg

    dep = Deployment(model, gpu, tp=tp, kv_dtype=kv_dtype)
    dis = dg.disaggregated_capacity(dep, dep, prompt, output, tpot_ms / 1e3, granularity=link)
    if dis.batch < 1:
        raise ValueError(f"one {prompt + output:,}-token sequence already misses {tpot_ms:g} ms per token on {dep.label}")
    lb = dg.link_budget(dis)
    tr = dis.transfer
    rates = [lb.sender_compute_rate, lb.sender_nic_rate, lb.receiver_kv_rate, lb.receiver_tpot_rate, lb.receiver_nic_rate]
    rows = [("KV per request", f"{tr.bytes_total / 1e9:.3g} GB over {tr.lanes} NIC{'s' if tr.lanes > 1 else ''}"),
            (f"{link} hand-off", f"{fmt_time(tr.time_s)} ({fmt_int(tr.messages)} messages per NIC), "
                                f"{fmt_time(tr.exposed_s(dis.prefill_s))} after a {fmt_time(dis.prefill_s)} prefill"),
            ("prefill NICs busy at full rate", fmt_pct(lb.sender_nic_utilization)),
            ("decode replica runs out of", f"{lb.receiver_binding} at {sig(lb.receiver_rate)} requests/s "
                                           f"(NICs {fmt_pct(lb.receiver_nic_utilization)} busy then)"),
            ("prefill replicas per decode replica", sig(lb.fan_in))]
    nic_note = ("far below its NICs" if lb.receiver_binding != "the NICs" else "its NICs before its memory")
    caption = ("Requests per second into one replica at which each resource runs out (log scale): blue the prefill "
               f"(sender) side, orange the decode (receiver) side; the shortest orange bar is what a decode replica "
               f"runs out of first, here {lb.receiver_binding}, {nic_note}.")
    fig = _KFIGURE(rates)
    return View(f"KV hand-off: {model} TP{tp} on {gpu}, {fmt_int(prompt)}-token prompt", rows, fig, caption=caption,
                values={"receiver_rate": lb.receiver_rate, "transfer_s": tr.time_s})


# ---- I058 context parallelism ------------------------------------------------------------------

_MAX_CP = 8


def _cbuild(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    bars = ax.bar(range(_MAX_CP), [1.0] * _MAX_CP, color="C0")
    mean = ax.axhline(1.0, color="0.3", ls=":", lw=1.2)
    ax.set_xlabel("context-parallel rank")
    ax.set_ylabel("attention pairs / mean")
    ax.grid(True, axis="y")
    return SimpleNamespace(ax=ax, bars=bars, mean=mean)


def _cdraw(a, shares) -> None:
    for i, bar in enumerate(a.bars):
        bar.set_visible(i < len(shares))
        bar.set_height(shares[i] if i < len(shares) else 0.0)
    a.ax.set_xlim(-0.6, len(shares) - 0.4)
    a.ax.set_xticks(range(len(shares)))
    a.ax.set_ylim(0, max(2.0, max(shares) * 1.1))


_CFIGURE = figures.LiveFigure(6.0, 3.0, _cbuild, _cdraw)


@explorer(
    "fleet.context_parallel",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    context=IntRange(1024, 131072, label="prompt (tokens)", log=True),
    cp=Choice((2, 4, 8), label="context-parallel groups"),
    tp=Choice((1, 2, 4, 8), label="TP per group"),
    scheme=Choice(("contiguous", "zigzag", "striped"), label="split"),
)
def context_parallel(model: str, gpu: str, context: int, cp: int, tp: int, scheme: str) -> View:
    """I058: ring-attention prefill over cp groups, and the causal-mask balance of the split."""
    from lib.fleet import context_parallel_split as cs
    from lib.registry.models import model as model_of

    m = model_of(model)
    m.check_context(context, "context")
    Deployment(model, gpu, tp=tp)  # the group must hold the weights
    sp = {s: cs.split_prefill(model, gpu, context, cp, tp, s) for s in cs.SCHEMES}
    pairs = cs.pairs_per_rank(context, cp, scheme)
    mean = sum(pairs) / len(pairs)
    ring = sp[scheme].ring
    rows = [(f"TTFT, {s}", f"{fmt_time(x.ttft_s)} (busiest rank {sig(x.imbalance)}× the mean)") for s, x in sp.items()]
    rows += [("ring hop per layer", f"{ring.chunk_bytes / 1e6:.3g} MB over {ring.fabric} in {fmt_time(ring.hop_send_s)}, "
                                    f"attention to hide it {fmt_time(ring.hop_compute_s)}"),
             ("ring hidden", "yes" if ring.ring_hidden else f"no: {fmt_time(ring.exposed_ring_s)} exposed")]
    caption = (f"Causal attention pairs each of the {cp} ranks computes under the {scheme} split, over their mean (dotted): "
               f"the busiest rank sets the pace of every ring step, here {sig(max(pairs) / mean)}× the mean.")
    fig = _CFIGURE([p / mean for p in pairs])
    return View(f"Context parallelism: {model}, {fmt_int(context)} tokens on CP{cp} x TP{tp} {gpu}", rows, fig,
                caption=caption, values={"ttft_s": sp[scheme].ttft_s, "imbalance": sp[scheme].imbalance})
