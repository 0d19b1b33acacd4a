"""Explorers for training at scale: long context (N014), a trillion-parameter MoE (N068) and a
frontier run's plan (N022). Views call lib only (:mod:`lib.training.step`, :mod:`lib.training.state`,
:mod:`lib.training.plan`); each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_ratio, fmt_time, fmt_unit, sig

LONG_CONTEXT_MODELS = ("llama-3.1-405b", "llama-3.1-70b", "llama-3.1-8b")
SEQ_LENS = (16384, 32768, 65536, 131072)
MAX_BARS = 9  # cp = 1, 2, ..., 256


def long_context_layouts(model: str, gpu: str, seq_len: int, tp: int, pp: int, replicas: int, micro_batches: int,
                         recompute: str = "none") -> dict:
    """The layouts N014 compares, the fleet fixed at tp x pp x replicas GPUs: every candidate
    context-parallel degree (dp = replicas / cp) with its peak memory, and the smallest that fits
    (``fit``; None when none does)."""
    from lib.training import plan
    from lib.training.step import TrainingLayout, training_memory

    base = TrainingLayout(model, gpu, tp=tp, pp=pp, dp=replicas, cp=1, seq_len=seq_len, micro_batches=micro_batches,
                          recompute=recompute)
    cands = plan.context_parallel_candidates(base)[:MAX_BARS]
    rows = [(cp, base.replace(cp=cp, dp=replicas // cp)) for cp in cands]
    mems = {cp: training_memory(lay) for cp, lay in rows}
    try:
        fit = plan.min_context_parallel(base, max_cp=cands[-1])
    except ValueError:
        fit = None
    return {"base": base, "layouts": dict(rows), "memory": mems, "fit": fit}


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.93)
    ax = fig.add_subplot()
    x = list(range(MAX_BARS))
    state = ax.bar(x, [1.0] * MAX_BARS, color="C0", label="training state")
    acts = ax.bar(x, [1.0] * MAX_BARS, bottom=[1.0] * MAX_BARS, color="C1", label="activations + logits")
    cap = ax.axhline(80.0, color="C3", linestyle="--", label="driver-visible memory")
    ax.set_xlabel("context-parallel degree (dp x cp fixed)")
    ax.set_ylabel("GB per GPU (log scale)")
    figures.log_scale(ax, "y")
    ax.grid(True, axis="y")
    figures.legend(ax, [state, acts, cap], loc="upper right")
    return SimpleNamespace(ax=ax, state=state, acts=acts, cap=cap)


def _draw(a, cps, state_gb, act_gb, cap_gb, fit_cp) -> None:
    n = len(cps)
    for i in range(MAX_BARS):
        on = i < n
        s, b = a.state.patches[i], a.acts.patches[i]
        s.set_visible(on)
        b.set_visible(on)
        if on:
            s.set_height(state_gb[i])
            b.set_y(state_gb[i])
            b.set_height(act_gb[i])
            b.set_color("C2" if cps[i] == fit_cp else "C1")
    a.cap.set_ydata([cap_gb, cap_gb])
    a.ax.set_xticks(range(n), [str(c) for c in cps])
    a.ax.set_xlim(-0.6, n - 0.4)
    tops = [s + b for s, b in zip(state_gb, act_gb, strict=True)]
    a.ax.set_ylim(min(min(state_gb), cap_gb) / 2, max(max(tops), cap_gb) * 2)


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "training.long_context",
    model=Choice(LONG_CONTEXT_MODELS, label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200", "a100-sxm", "mi300x"), label="GPU"),
    seq_len=Choice(SEQ_LENS, label="sequence (tokens)"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    pp=Choice((1, 2, 4, 8, 16), label="pipeline stages"),
    replicas=Choice((16, 32, 64, 128, 256), label="dp x cp replicas"),
    micro_batches=IntRange(1, 64, label="micro-batches per step"),
    recompute=Choice(("none", "selective", "full"), label="recompute"),
)
def long_context(model: str, gpu: str, seq_len: int, tp: int, pp: int, replicas: int, micro_batches: int,
                 recompute: str) -> View:
    """N014: peak memory per GPU at each context-parallel degree, and the ring's cost at the smallest that fits."""
    from lib.training.state import layer_activation_bytes
    from lib.training.step import training_step

    r = long_context_layouts(model, gpu, seq_len, tp, pp, replicas, micro_batches, recompute)
    mems, fit = r["memory"], r["fit"]
    cps = list(mems)
    state_gb = [(m["total"] - m["activations"]) / 1e9 for m in mems.values()]
    act_gb = [m["activations"] / 1e9 for m in mems.values()]
    cap = next(iter(mems.values()))["capacity"]
    base = r["base"]
    per_layer = layer_activation_bytes(model, seq_len, 1)
    rows = [("one layer's activations, one sequence, one GPU", fmt_bytes(per_layer, "GB")),
            ("memory per GPU at cp = 1", fmt_bytes(mems[1]["total"], "GB"))]
    if fit is None:
        caption = (f"Peak memory per GPU against the context-parallel degree: none up to {cps[-1]} fits the "
                   f"{fmt_bytes(cap, 'GB')} of a {base.chip.name} (dashed); more stages or recompute are needed.")
        note = "no degree fits: add pipeline stages, recompute, or replicas"
        values = {"fit_cp": 0.0}
    else:
        st = training_step(fit)
        rows += [("smallest context-parallel degree that fits", f"{fit.cp} ({fit.label})"),
                 ("memory per GPU there", fmt_bytes(mems[fit.cp]["total"], "GB")),
                 ("ring traffic time per step", fmt_time(st.cp_s)),
                 ("of it exposed", fmt_time(st.cp_exposed_s)),
                 ("MFU of the layout", fmt_pct(st.mfu))]
        caption = (f"Peak memory per GPU against the context-parallel degree, log scale: cp = {fit.cp} (green) is the "
                   f"first under the {fmt_bytes(cap, 'GB')} that one {base.chip.name} shows (dashed).")
        note = f"{fmt_int(fit.n_gpus)} GPUs; the ring {'hides' if st.cp_exposed_s == 0 else 'shows'} under attention"
        values = {"fit_cp": float(fit.cp), "cp_s": st.cp_s, "cp_exposed_s": st.cp_exposed_s, "mfu": st.mfu}
    fig = _FIGURE(cps, state_gb, act_gb, cap / 1e9, fit.cp if fit else None)
    return View(f"{base.mdl.key} at {fmt_int(seq_len)} tokens on {base.chip.name}", rows, fig, caption=caption,
                note=note, values=values)


# ---- N068: a trillion-parameter MoE -----------------------------------------------------------

MOE_EXPERTS = (256, 384, 512)
EP_BARS = (1, 2, 4, 8, 16, 32, 64)
_MOE_PARTS = ("compute", "EP all-to-all", "router imbalance", "pipeline bubble", "other")


@functools.lru_cache(maxsize=8)
def moe_1t(experts: int = 384):
    """The page's hypothetical trillion-parameter MoE (not in data/models.yaml): DeepSeek-V3 with
    ``experts`` routed experts per MoE layer and 64 attention heads instead of 128 (the two changes
    Kimi K2 made to the same architecture), everything else as DeepSeek-V3."""
    import dataclasses
    from types import MappingProxyType

    from lib.registry.models import model

    if experts not in MOE_EXPERTS:
        raise ValueError(f"experts must be one of {MOE_EXPERTS}, got {experts!r}")
    base = model("deepseek-v3")
    return dataclasses.replace(base, key=f"deepseek-v3-{experts}e-64h (hypothetical)", num_experts=experts,
                               num_attention_heads=64, num_kv_heads=64, published=MappingProxyType({}))


def moe_layouts(experts: int, gpu: str, pp: int, ep: int, replicas: int, micro_batches: int, zero_stage: int,
                skew: float, seq_len: int = 4096) -> dict:
    """N068's layouts: TP1 x PP x ``replicas`` data-parallel ranks, expert parallelism of each degree
    in :data:`EP_BARS` that divides the experts and the replicas (the chosen ``ep`` must be one), with
    each one's step, memory and the seconds a router of Zipf ``skew`` adds (contiguous placement)."""
    from lib.perf.moe_cost import zipf_inclusion_probabilities
    from lib.training import plan
    from lib.training.step import TrainingLayout, training_memory, training_step

    m = moe_1t(experts)
    chosen = TrainingLayout(m, gpu, tp=1, pp=pp, dp=replicas, ep=ep, seq_len=seq_len, micro_batches=micro_batches,
                            zero_stage=zero_stage)
    pi = zipf_inclusion_probabilities(m.num_experts, m.experts_per_token, skew)
    rows = {}
    for e in EP_BARS:
        if m.num_experts % e or replicas % e:
            continue
        lay = chosen.replace(ep=e)
        st = training_step(lay)
        ratio = plan.ep_rank_load_ratio(pi, e) if e > 1 else 1.0
        rows[e] = {"layout": lay, "step": st, "memory": training_memory(lay), "ratio": ratio,
                   "imbalance_s": plan.expert_imbalance_s(st, ratio)}
    return {"model": m, "chosen": chosen, "pi": pi, "rows": rows}


def _parts(r: dict) -> list[float]:
    b = r["step"].buckets
    compute = b["model FLOPs at peak"] + b["GEMM efficiency"] + b["recompute"] + b["non-matmul kernels"]
    other = b["TP communication"] + b["CP communication"] + b["DP communication"] + b["optimizer"]
    return [compute, b["EP all-to-all"], r["imbalance_s"], b["pipeline bubble"], other]


def _build_moe(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.2, top=0.93)
    ax = fig.add_subplot()
    x = list(range(len(EP_BARS)))
    stacks = [ax.bar(x, [0.0] * len(x), color=f"C{i}", label=name) for i, name in enumerate(_MOE_PARTS)]
    ax.set_xlabel("expert-parallel degree (faded: does not fit in memory)")
    ax.set_ylabel("seconds per step")
    ax.grid(True, axis="y")
    figures.legend(ax, stacks, loc="upper left", ncol=2)
    return SimpleNamespace(ax=ax, stacks=stacks)


def _draw_moe(a, eps, parts, fits, node) -> None:
    n = len(eps)
    for j in range(len(EP_BARS)):
        bottom = 0.0
        for i, bars in enumerate(a.stacks):
            p = bars.patches[j]
            p.set_visible(j < n)
            if j < n:
                p.set_y(bottom)
                p.set_height(parts[j][i])
                p.set_alpha(1.0 if fits[j] else 0.3)
                bottom += parts[j][i]
    a.ax.set_xticks(range(n), [f"{e}{' (node)' if e == node else ''}" for e in eps])
    a.ax.set_xlim(-0.6, n - 0.4)
    a.ax.set_ylim(0, max(sum(p) for p in parts) * 1.35)


_MOE_FIGURE = figures.LiveFigure(6.0, 3.0, _build_moe, _draw_moe)


@explorer(
    "training.moe_layout",
    experts=Choice(MOE_EXPERTS, label="routed experts per layer"),
    gpu=Choice(("h100-sxm", "h200", "b200", "a100-sxm"), label="GPU"),
    pp=Choice((4, 8, 16, 32), label="pipeline stages"),
    ep=Choice((1, 2, 4, 8, 16, 32, 64), label="expert parallel"),
    replicas=Choice((64, 128, 256), label="data-parallel replicas"),
    micro_batches=IntRange(4, 64, label="micro-batches per step"),
    zero_stage=Choice((1, 2, 3), label="ZeRO stage"),
    skew=FloatRange(0.0, 1.2, 0.05, label="router skew (Zipf)"),
)
def moe_layout(experts: int, gpu: str, pp: int, ep: int, replicas: int, micro_batches: int, zero_stage: int,
               skew: float) -> View:
    """N068: the step of a trillion-parameter MoE at each expert-parallel degree, with memory and router skew."""
    r = moe_layouts(experts, gpu, pp, ep, replicas, micro_batches, zero_stage, skew)
    rows_by_ep, m, chosen = r["rows"], r["model"], r["chosen"]
    if ep not in rows_by_ep:
        raise ValueError(f"ep={ep} must divide the {m.num_experts} experts and the {replicas} replicas")
    eps = list(rows_by_ep)
    parts = [_parts(rows_by_ep[e]) for e in eps]
    fits = [rows_by_ep[e]["memory"]["headroom"] >= 0 for e in eps]
    c = rows_by_ep[ep]
    st, mem = c["step"], c["memory"]
    stretched = st.step_s + c["imbalance_s"]
    rows = [("total / active parameters", f"{sig(m.params_total / 1e12)}T / {sig(m.params_active / 1e9)}B"),
            ("layout", c["layout"].label),
            ("memory per GPU", f"{fmt_bytes(mem['total'], 'GB')} of {fmt_bytes(mem['capacity'], 'GB')}"),
            ("EP all-to-all per step", f"{fmt_time(st.ep_s)} over {st.fabrics.get('EP', 'none')}"),
            ("busiest EP rank's load", fmt_ratio(c["ratio"])),
            ("step, balanced router / this router", f"{fmt_time(st.step_s)} / {fmt_time(stretched)}"),
            ("MFU, balanced / this router", f"{fmt_pct(st.mfu)} / {fmt_pct(st.mfu * st.step_s / stretched)}")]
    node = chosen.node
    fastest = min((e for e, f in zip(eps, fits, strict=True) if f),
                  key=lambda e: rows_by_ep[e]["step"].step_s + rows_by_ep[e]["imbalance_s"], default=None)
    caption = (f"Step time by expert-parallel degree for the hypothetical {sig(m.params_total / 1e12)}T MoE: "
               + (f"the fastest degree that fits is {fastest}." if fastest else "no degree fits in memory."))
    fig = _MOE_FIGURE(eps, parts, fits, node)
    return View(f"{m.key} on {fmt_int(chosen.n_gpus)} x {chosen.chip.name}", rows, fig, caption=caption,
                note=f"router skew {sig(skew)}: the hottest expert gets {fmt_ratio(max(r['pi']) * len(r['pi']) / sum(r['pi']))} the mean",
                values={"step_s": st.step_s, "ep_s": st.ep_s, "ratio": c["ratio"], "fastest": float(fastest or 0)})


# ---- N022: a frontier run's plan ------------------------------------------------------------------

PLAN_MODELS = ("llama-3.1-405b", "llama-3.1-70b", "qwen2.5-72b", "llama-3.1-8b")
_PLAN_PARTS = ("compute", "checkpoint writes", "rewound work", "restarts")


def frontier_schedule(model: str, gpu: str, tokens_t: float, n_gpus: int, mfu: float, storage_tbps: float,
                      restart_minutes: float):
    """N022's calendar: 6 N D FLOPs for ``tokens_t`` trillion tokens, the fleet equation at ``mfu``,
    Llama 3's failure rate, a checkpoint of :func:`lib.training.checkpoint.checkpoint_bytes` written
    at ``storage_tbps`` (blocking), restarts of ``restart_minutes`` plus the reload, Young's interval."""
    from lib.registry.models import model as get_model
    from lib.training import checkpoint, flops, plan

    m = get_model(model)
    total = flops.six_n_d(m.params_total, tokens_t * 1e12)
    write_s = checkpoint.checkpoint_bytes(m) / (storage_tbps * 1e12)
    return plan.run_schedule(total, n_gpus, gpu, mfu, write_s, restart_minutes * 60.0 + write_s)


def _build_plan(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.2, top=0.9)
    ax = fig.add_subplot()
    bars = [ax.barh([0, 1], [0.0, 0.0], color=f"C{i}", label=name) for i, name in enumerate(_PLAN_PARTS)]
    ax.set_yticks([0, 1], ["pure compute", "with failures"])
    ax.invert_yaxis()
    ax.set_xlabel("days")
    ax.grid(True, axis="x")
    figures.legend(ax, bars, loc="lower right", ncol=2)
    return SimpleNamespace(ax=ax, bars=bars)


def _draw_plan(a, compute_days, parts_days) -> None:
    left = [0.0, 0.0]
    widths = [[compute_days, parts_days[0]]] + [[0.0, d] for d in parts_days[1:]]
    for bars, w in zip(a.bars, widths, strict=True):
        for j, p in enumerate(bars.patches):
            p.set_x(left[j])
            p.set_width(w[j])
            left[j] += w[j]
    a.ax.set_xlim(0, max(left) * 1.15)


_PLAN_FIGURE = figures.LiveFigure(6.0, 2.4, _build_plan, _draw_plan)


@explorer(
    "training.frontier_plan",
    model=Choice(PLAN_MODELS, label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200", "a100-sxm"), label="GPU"),
    tokens_t=FloatRange(1.0, 30.0, 0.5, label="training tokens (trillions)"),
    n_gpus=Choice((2048, 4096, 8192, 16384, 32768), label="GPUs"),
    mfu=FloatRange(0.2, 0.6, 0.005, label="MFU"),
    storage_tbps=FloatRange(0.2, 10.0, 0.1, label="checkpoint storage (TB/s)"),
    restart_minutes=FloatRange(1.0, 60.0, 0.5, label="restart, minutes (before the reload)"),
)
def frontier_plan(model: str, gpu: str, tokens_t: float, n_gpus: int, mfu: float, storage_tbps: float,
                  restart_minutes: float) -> View:
    """N022: the calendar of a frontier run, pure compute against wall time with failures and checkpoints."""
    s = frontier_schedule(model, gpu, tokens_t, n_gpus, mfu, storage_tbps, restart_minutes)
    day = 86400.0
    g = s.losses
    wall = s.wall_s / day
    parts = [s.compute_s / day, g.checkpoint * wall, g.rewound * wall, g.restart * wall]
    rows = [("pure compute", f"{sig(s.compute_s / day)} days"),
            ("job MTBF", fmt_unit(s.mtbf_s / 3600, "hours")),
            ("checkpoint every (Young)", fmt_unit(s.interval_s / 60, "minutes")),
            ("goodput", fmt_pct(s.goodput)),
            ("wall time", f"{sig(wall)} days"),
            ("interruptions", f"{fmt_int(s.interruptions)} ({sig(s.interruptions / wall)} a day)")]
    top = max(range(1, 4), key=lambda i: parts[i])
    caption = (f"{sig(s.compute_s / day)} days of compute become {sig(wall)} days of wall time; the largest loss is "
               f"{_PLAN_PARTS[top]} ({sig(parts[top])} days).")
    fig = _PLAN_FIGURE(s.compute_s / day, parts)
    return View(f"{model} on {fmt_int(n_gpus)} x {gpu}, {sig(tokens_t)}T tokens", rows, fig, caption=caption,
                note=f"{fmt_int(s.checkpoints)} checkpoints over the run",
                values={"wall_days": wall, "interruptions": s.interruptions, "goodput": s.goodput})
