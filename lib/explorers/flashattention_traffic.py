"""Explorers for the FlashAttention section: what attention moves through HBM and how fast it runs.

Each view calls lib only: :mod:`lib.attention.traffic` (naive, textbook tiled and L2 traffic),
:mod:`lib.perf.roofline` (the book's roofline), :mod:`lib.attention.utilization` (tensor-core vs
exponential time per tile) and the performance model (:mod:`lib.perf.memory`,
:mod:`lib.perf.prefill`, :mod:`lib.perf.collectives`) for the million-token plan.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.attention import context_parallel as cpx
from lib.attention import traffic as tr
from lib.attention import utilization as ut
from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.perf import memory as mem
from lib.perf import prefill
from lib.perf import roofline as rf
from lib.registry import hardware, models
from lib.search import smallest_true
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

ATTN_DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128, 256)
BLOCKS = (64, 128, 256)


def _placement(gpu: str, dtype: str, seq_len: int, head_dim: int, block_q: int) -> dict:
    """Traffic, FLOPs and roofline bound of one head's attention three ways (lib calls only)."""
    g = hardware.gpu(gpu)
    g.peak_flops(dtype)  # refuses a chip without this dtype's tensor-core peak
    flops = tr.attention_flops(seq_len, head_dim)
    kinds = {
        "naive": tr.naive_traffic(seq_len, head_dim, dtype),
        "tiled (textbook)": tr.tiled_traffic(seq_len, head_dim, block_q, block_q, dtype),
        "tiled + L2": tr.tiled_traffic_l2(seq_len, head_dim, block_q, block_q, dtype, gpu=g.key),
    }
    return {k: rf.roofline_time(flops, t.total_bytes, g, dtype) for k, t in kinds.items()}


@explorer(
    "flashattention.roofline_placement",
    gpu=Choice(tuple(hardware.gpu_names())),
    dtype=Choice(ATTN_DTYPES, label="Q, K, V, scores"),
    seq_len=IntRange(256, 131072, log=True, label="sequence length"),
    head_dim=Choice(HEAD_DIMS, label="head dim"),
    block_q=Choice(BLOCKS, label="query tile Br"),
)
def roofline_placement(gpu: str, dtype: str, seq_len: int, head_dim: int, block_q: int) -> View:
    """N004: one head's attention on the roofline, naive vs textbook tiled vs tiled with L2 reuse."""
    times = _placement(gpu, dtype, seq_len, head_dim, block_q)
    g = hardware.gpu(gpu)
    fig = rf.plot_roofline(g, dtype, {k: t.intensity for k, t in times.items()})
    rows = [("ridge point", f"{sig(g.ridge_point(dtype))} FLOP/byte")]
    for name, t in times.items():
        rows.append((f"{name}: HBM bytes", fmt_bytes(t.bytes, "MB")))
        rows.append((f"{name}: intensity, bound, time", f"{sig(t.intensity)} FLOP/byte, {t.bound}, {fmt_time(t.time_s)}"))
    sides = "; ".join(f"{name} {'right' if t.bound == 'compute' else 'left'} of it ({t.bound}-bound)"
                      for name, t in times.items())
    bounds = ", ".join(f"{name} {t.bound}-bound" for name, t in times.items())
    caption = (f"One head's attention placed three ways on the {g.key} {dtype} roofline: every dot does the same FLOPs, "
               f"so only its HBM bytes move it, and left of the dashed ridge ({sig(g.ridge_point(dtype))} FLOP/byte) a "
               f"dot is memory-bound. Here: {bounds}.")
    return View(f"one head, N = {seq_len:,}, d = {head_dim}, {dtype} on {g.key}", rows, fig, caption=caption,
                note=f"The dashed line is the ridge; every dot does the same FLOPs, so only its bytes move it: {sides}.",
                values={k: t.intensity for k, t in times.items()} | {"ridge": g.ridge_point(dtype)})


def _traffic_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.naive, = ax.plot([], [], color="C3", label="naive (scores in HBM)")
    a.tiled, = ax.plot([], [], color="C1", label="tiled, textbook (K/V per query tile)")
    a.l2, = ax.plot([], [], color="C0", lw=2.5, label="tiled, L2 model")
    a.floor, = ax.plot([], [], color="black", ls=":", label="compulsory (Q, K, V, O once)")
    a.here = ax.axvline(1.0, color="grey", ls="--", lw=1)
    a.knee = ax.axvline(1.0, color="C0", ls="-.", lw=1)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("HBM bytes per head")
    ax.grid(True)
    return a


def _traffic_draw(a: SimpleNamespace, lengths, curves: dict, seq_len: int, knee: int | None) -> None:
    for name, line in (("naive", a.naive), ("tiled", a.tiled), ("l2", a.l2), ("floor", a.floor)):
        line.set_data(lengths, curves[name])
    a.here.set_xdata([seq_len, seq_len])
    a.here.set_label(f"N = {seq_len:,}")
    a.knee.set_visible(knee is not None)
    if knee is not None:
        a.knee.set_xdata([knee, knee])
        a.knee.set_label(f"L2 stops holding K/V: N = {knee:,}")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.naive, a.tiled, a.l2, a.floor, a.here, a.knee], fontsize=7, loc="upper left")


_TRAFFIC_FIGURE = figures.LiveFigure(6.0, 3.4, _traffic_build, _traffic_draw)


def l2_knee_length(head_dim: int, block_q: int, dtype: str, gpu: str, batch_heads: int,
                   l2_usable_fraction: float, tiles_per_sm: int, lockstep: bool, upto: int = 1 << 24) -> int | None:
    """Shortest sequence length at which :func:`lib.attention.traffic.tiled_traffic_l2` has K/V cross
    HBM more than once (bisection over N; the passes never fall as N grows). None below ``upto``."""

    def passes(n: int) -> float:
        return tr.tiled_traffic_l2(n, head_dim, block_q, block_q, dtype, gpu=gpu, batch_heads=batch_heads,
                                   l2_usable_fraction=l2_usable_fraction, tiles_per_sm=tiles_per_sm,
                                   lockstep=lockstep).kv_passes

    if passes(upto) <= 1:
        return None
    if upto == 1:  # N = 1 is the whole range, and it crosses
        return 1
    # passes(1) is taken as <= 1 without a call; passes(upto) > 1
    return smallest_true(lambda n: not (passes(n) <= 1), 2, upto - 1)


@explorer(
    "flashattention.hbm_traffic",
    gpu=Choice(tuple(hardware.gpu_names())),
    dtype=Choice(ATTN_DTYPES, label="Q, K, V, scores"),
    seq_len=IntRange(256, 1048576, log=True, label="sequence length"),
    head_dim=Choice(HEAD_DIMS, label="head dim"),
    block_q=Choice(BLOCKS, label="query tile Br"),
    batch_heads=IntRange(1, 4096, log=True, label="(batch, head) pairs"),
    l2_usable_fraction=FloatRange(0.05, 1.0, 0.05, label="usable share of L2"),
    tiles_per_sm=Choice((1, 2, 3, 4), label="query tiles per SM"),
    lockstep=Choice((True, False), label="tiles of a head share K/V fetches"),
)
def hbm_traffic(gpu: str, dtype: str, seq_len: int, head_dim: int, block_q: int, batch_heads: int,
                l2_usable_fraction: float, tiles_per_sm: int, lockstep: bool) -> View:
    """I030: HBM bytes of one head against length: naive, textbook tiled, the L2 model, the floor."""
    g = hardware.gpu(gpu)
    kw = dict(gpu=g.key, batch_heads=batch_heads, l2_usable_fraction=l2_usable_fraction,
              tiles_per_sm=tiles_per_sm, lockstep=lockstep)
    top = max(4 * seq_len, 1 << 17)
    lengths = np.unique(np.geomspace(256, top, 48).astype(int))
    curves = {
        "naive": [tr.naive_hbm_bytes(int(n), head_dim, dtype) for n in lengths],
        "tiled": [tr.tiled_hbm_bytes(int(n), head_dim, block_q, block_q, dtype) for n in lengths],
        "l2": [tr.tiled_traffic_l2(int(n), head_dim, block_q, block_q, dtype, **kw).total_bytes for n in lengths],
        "floor": [tr.compulsory_traffic(int(n), head_dim, dtype).total_bytes for n in lengths],
    }
    knee = l2_knee_length(head_dim, block_q, dtype, g.key, batch_heads, l2_usable_fraction, tiles_per_sm, lockstep,
                          upto=int(top))
    fig = _TRAFFIC_FIGURE(lengths, curves, seq_len, knee)
    naive = tr.naive_traffic(seq_len, head_dim, dtype)
    book = tr.tiled_traffic(seq_len, head_dim, block_q, block_q, dtype)
    l2 = tr.tiled_traffic_l2(seq_len, head_dim, block_q, block_q, dtype, **kw)
    rows = [("naive", fmt_bytes(naive.total_bytes, "MB")),
            ("tiled, textbook", f"{fmt_bytes(book.total_bytes, 'MB')} ({sig(naive.total_bytes / book.total_bytes)}x less)"),
            ("tiled, L2 model", f"{fmt_bytes(l2.total_bytes, 'MB')} ({sig(naive.total_bytes / l2.total_bytes)}x less)"),
            ("K/V crossings of HBM", f"{sig(l2.kv_passes)} of {sig(l2.textbook_kv_passes)} requests (L2 hit rate "
                                     f"{sig(100 * l2.l2_hit_rate)}%)"),
            ("heads in flight x K/V per head", f"{l2.heads_in_flight} x {fmt_bytes(l2.kv_bytes_per_head, 'MB')} vs "
                                               f"{fmt_bytes(l2.l2_usable_bytes, 'MB')} usable L2"),
            ("L2 stops holding K/V at", f"N = {knee:,}" if knee else f"beyond N = {int(top):,}")]
    where = (f"the L2 line leaves the compulsory floor at N = {knee:,}" if knee else
             "the L2 line stays on the compulsory floor over the whole range")
    caption = (f"HBM bytes of one head against the sequence length: naive (scores in HBM) grows as N², the textbook "
               f"tiled count as N² / Br, and the L2 model (thick) stays near the compulsory floor (dotted) while L2 "
               f"holds K/V: {where}. At N = {fmt_int(seq_len)} (grey) the L2 model moves "
               f"{sig(naive.total_bytes / l2.total_bytes)}x fewer bytes than naive.")
    return View(f"one head, d = {head_dim}, Br = {block_q}, {dtype} on {g.key}", rows, fig, caption=caption,
                note=f"Log-log: naive grows as N squared, the textbook tiled count as N squared / Br; {where}.",
                values={"naive": naive.total_bytes, "textbook": book.total_bytes, "l2": l2.total_bytes,
                        "knee": float(knee or 0)})


_SEGMENTS = (("matmul", "matmul at peak (the utilization)", "C0"),
             ("mma_instruction_loss", "mma.sync below the Hopper peak", "C7"),
             ("exponentials", "exposed exponentials (SFU)", "C3"),
             ("other_alu", "exposed other softmax ALU work", "C1"))
_SCHEDULE_LABELS = {"fa2": "FA2: mma.sync, softmax serialized", "wgmma": "wgmma, softmax serialized",
                    "fa3": "FA3: wgmma, softmax overlapped", "fa3_fp8": "FA3 in FP8, overlapped"}


def _util_build(fig, nbars: int) -> SimpleNamespace:
    fig.subplots_adjust(left=0.36, bottom=0.36, top=0.97)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    y = np.arange(nbars)
    a.bars = {key: ax.barh(y, np.zeros(nbars), color=color, label=label) for key, label, color in _SEGMENTS}
    a.measured, = ax.plot([], [], "kx", ms=8, mew=2, label="published, H100 SXM")
    ax.set_xlim(0, 1)
    ax.set_yticks(y)
    ax.invert_yaxis()
    ax.set_xlabel("share of the time per score")
    ax.grid(True, axis="x")
    return a


def _util_draw(a: SimpleNamespace, labels: list[str], parts: list[dict], measured: list[float | None]) -> None:
    left = np.zeros(len(parts))
    for key, _, _ in _SEGMENTS:
        widths = np.array([p[key] for p in parts])
        for rect, x0, w in zip(a.bars[key], left, widths, strict=True):
            rect.set_x(x0)
            rect.set_width(w)
        left += widths
    a.ax.set_yticklabels(labels, fontsize=7)
    ys = [i for i, m in enumerate(measured) if m is not None]
    a.measured.set_data([measured[i] for i in ys], ys)
    a.measured.set_visible(bool(ys))
    figures.legend(a.ax, [*a.bars.values(), a.measured], fontsize=7, ncol=2, loc="upper center",
                   bbox_to_anchor=(0.3, -0.2))


_UTIL_FIGURE = figures.LiveFigure(6.4, 3.6, _util_build, _util_draw)
SFU_GPUS = tuple(k for k in hardware.gpu_names()
                 if hardware.gpu(k).sfu_ops_per_sm_clock and hardware.gpu(k).tensor_clock_hz)


@explorer(
    "flashattention.utilization",
    gpu=Choice(SFU_GPUS),
    dtype=Choice(("bf16", "fp16", "fp8"), label="matmul dtype"),
    head_dim=Choice(HEAD_DIMS, label="head dim"),
    pass_=Choice(ut.PASSES, label="pass"),
    mma_sync_efficiency=FloatRange(0.3, 1.0, 0.01, label="mma.sync share of Hopper peak"),
    alu_ops_per_score=FloatRange(0.0, 16.0, 0.5, label="other FP32 ops per score"),
)
def utilization(gpu: str, dtype: str, head_dim: int, pass_: str, mma_sync_efficiency: float,
                alu_ops_per_score: float) -> View:
    """I032: the utilization ceiling of FA2's and FA3's schedules, split into the stalls each leaves."""
    g = hardware.gpu(gpu)
    sched = ut.fa_schedules(g, dtype, head_dim, pass_=pass_, mma_sync_efficiency=mma_sync_efficiency,
                            alu_ops_per_score=alu_ops_per_score)
    if dtype != "fp8" and "fp8" in g.dtypes:
        sched["fa3_fp8"] = ut.attention_utilization(g, "fp8", head_dim, pass_=pass_, overlap=True,
                                                    alu_ops_per_score=alu_ops_per_score)
    published = ut.PUBLISHED_H100
    anchor = g.key == "h100-sxm" and head_dim == 128 and pass_ == "forward"
    peak16, peak8 = g.peak_flops("bf16"), (g.peak_flops("fp8") if "fp8" in g.dtypes else None)
    marks = {"fa2": published["fa2_fwd"][0] * 1e12 / peak16, "fa3": published["fa3_best"][0] * 1e12 / peak16,
             "fa3_fp8": published["fa3_fp8"][0] * 1e12 / peak8 if peak8 else None}
    if dtype == "fp8":
        marks = {"fa3": marks["fa3_fp8"]}
    measured = [marks.get(k) if anchor else None for k in sched]
    fig = _UTIL_FIGURE([_SCHEDULE_LABELS[k] for k in sched], [s.breakdown() for s in sched.values()], measured,
                       layout=(len(sched),))
    first = sched["fa2"]
    rows = [("matmul FLOP per SM per clock", sig(first.mma_flops_per_sm_clock)),
            ("exponentials per SM per clock", sig(first.sfu_ops_per_sm_clock)),
            ("matmul FLOPs per score", sig(first.matmul_flops_per_score)),
            ("exp time / matmul time (r)", sig(first.exp_to_matmul_ratio))]
    rows += [(_SCHEDULE_LABELS[k], f"{sig(100 * s.utilization)}% of peak") for k, s in sched.items()]
    note = ("Each bar is the time of one score; only the blue part does matmul work at peak. "
            + (f"Crosses: published H100 SXM throughputs (FA2 forward {published['fa2_fwd'][0]:,.0f}, FA3 up to "
               f"{published['fa3_best'][0]:,.0f}, FP8 about {published['fa3_fp8'][0]:,.0f} TFLOP/s)."
               if anchor else "Published H100 figures are drawn only for H100 SXM, head dim 128, forward."))
    short = {"fa2": "FA2", "wgmma": "wgmma serialized", "fa3": "FA3", "fa3_fp8": "FA3 in FP8"}
    caption = (f"Each bar is the time of one attention score under one schedule on the {g.key}; only the blue part does "
               f"matmul work at peak, so its share is the utilization ceiling: "
               + ", ".join(f"{short[k]} {fmt_pct(s.utilization)}" for k, s in sched.items())
               + (". Crosses mark the published H100 SXM throughputs." if anchor else "."))
    return View(f"{g.key} {dtype}, head dim {head_dim}, {pass_}", rows, fig, note=note, caption=caption,
                values={k: s.utilization for k, s in sched.items()} | {"ratio": first.exp_to_matmul_ratio})


PLAN_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b", "mixtral-8x22b")
PLAN_GPUS = tuple(k for k in hardware.gpu_names() if hardware.gpu(k).scaleout_bandwidth)
PLAN_TP = 8  # one tensor-parallel group: the eight GPUs of a node


def mha_variant(mdl):
    """The model with one KV head per query head (GQA -> MHA), everything else unchanged: the
    single change the million-token plan is tested against."""
    import dataclasses

    m = models.model(mdl)
    return dataclasses.replace(m, key=f"{m.key} as MHA", num_kv_heads=m.num_attention_heads)


def _plan_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    figures.log_scale(ax, "both", base=2)
    a = SimpleNamespace(ax=ax)
    a.gqa, = ax.step([], [], where="post", color="C0", lw=2, label="GPUs to hold the request (as is)")
    a.mha, = ax.step([], [], where="post", color="C3", lw=2, ls="--", label="the same model as MHA")
    a.node = ax.axhline(PLAN_TP, color="grey", lw=1, label="one node of eight GPUs")
    a.here = ax.axvline(1.0, color="black", ls=":", lw=1)
    ax.set_xlabel("tokens in the request")
    ax.set_ylabel("GPUs (TP8 groups x 8)")
    ax.grid(True)
    return a


def _plan_draw(a: SimpleNamespace, contexts, gqa, mha, context: int) -> None:
    a.gqa.set_data(contexts, gqa)
    a.mha.set_data(contexts, mha)
    a.here.set_xdata([context, context])
    a.here.set_label(f"{context:,} tokens")
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.gqa, a.mha, a.node, a.here], fontsize=7, loc="upper left")


_PLAN_FIGURE = figures.LiveFigure(6.0, 3.2, _plan_build, _plan_draw)


@explorer(
    "flashattention.million_token_plan",
    model=Choice(PLAN_MODELS),
    gpu=Choice(PLAN_GPUS),
    context=IntRange(131072, 4194304, log=True, label="tokens in the request"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    prefill_mfu=FloatRange(0.2, 1.0, 0.05, label="prefill MFU"),
)
def million_token_plan(model: str, gpu: str, context: int, weight_dtype: str, kv_dtype: str,
                       prefill_mfu: float) -> View:
    """I034: GPUs one long request needs (TP8 groups, context parallel across them) against its
    length, as is and as MHA; the prefill time of the smallest plan."""
    g = hardware.gpu(gpu)
    m, mha = models.model(model), mha_variant(model)
    budgets = {name: mem.memory_budget(x, g, PLAN_TP, weight_dtype, kv_dtype) for name, x in (("gqa", m), ("mha", mha))}
    contexts = np.unique(np.geomspace(131072, 4194304, 33).astype(int))
    gpus = {name: [PLAN_TP * cpx.groups_to_hold(b, int(c)) for c in contexts] for name, b in budgets.items()}
    fig = _PLAN_FIGURE(contexts, gpus["gqa"], gpus["mha"], context)
    rows = []
    for name, x in (("as is", m), ("as MHA", mha)):
        groups = cpx.groups_to_hold(budgets["gqa" if x is m else "mha"], context)
        ring = cpx.ring_prefill(x, g, context, groups, PLAN_TP, mfu=prefill_mfu, weight_dtype=weight_dtype,
                                kv_dtype=kv_dtype)
        rows.append((f"{name}: KV per request", fmt_bytes(mem.kv_bytes_per_sequence(x, context, kv_dtype), "GiB")))
        rows.append((f"{name}: GPUs to hold it", f"{PLAN_TP * groups} ({groups} x TP{PLAN_TP}, ring over {ring.fabric})"
                     if groups > 1 else f"{PLAN_TP} (one TP{PLAN_TP} node)"))
        rows.append((f"{name}: prefill (TTFT)", fmt_time(ring.ttft_s)))
    est = prefill.prefill_estimate(m, g, context, PLAN_TP, prefill_mfu, weight_dtype)
    rows.append(("attention share of prefill FLOPs", f"{sig(100 * est.flops_attention / est.flops)}%"))
    need = {name: PLAN_TP * cpx.groups_to_hold(b, context) for name, b in budgets.items()}
    caption = (f"The GPUs whose KV pools hold one request, in whole TP8 groups, against its length: the model as is "
               f"(blue) and the same model as MHA (red, dashed); the grey line is one node. At {fmt_int(context)} "
               f"tokens (dotted) it needs {need['gqa']} GPUs as is and {need['mha']} as MHA.")
    return View(f"{model} on {g.key}, {context:,} tokens", rows, fig, caption=caption,
                note="Steps: the GPUs whose KV pools hold one request, in whole TP8 groups; the grey line is one node. "
                     "Where the dashed MHA line leaves the node, the one-node plan breaks.",
                values={"gqa_gpus": float(PLAN_TP * cpx.groups_to_hold(budgets["gqa"], context)),
                        "mha_gpus": float(PLAN_TP * cpx.groups_to_hold(budgets["mha"], context))})
