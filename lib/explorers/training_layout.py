"""Explorers for training state and parallel placement (N012, W10, N010, N013): the state a run
holds and the fleet it forces, FSDP against a pipeline across nodes, where each axis goes, and
what tensor parallelism costs inside and across the node (:mod:`lib.training.layout`,
:mod:`lib.training.step`, :mod:`lib.training.state`).

Views call lib only; each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "gpt3-175b", "llama-3.1-405b")
GPUS = ("a100-sxm", "h100-sxm", "h200", "b200")
_BUCKET_COLORS = ("C0", "C9", "C8", "C7", "C3", "C6", "C5", "C1", "C4", "C2")


def _bars_build(fig, *names: str) -> SimpleNamespace:
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.2, top=0.84)
    ax = fig.add_subplot()
    rows = [[ax.barh(i, 0.0, left=0.0, color=c, height=0.6)[0] for c in _BUCKET_COLORS[:len(names)]] for i in range(3)]
    ax.set_xlabel("seconds per optimizer step")
    ax.grid(True, axis="x")
    ax.legend(rows[0], names, fontsize=6, loc="upper center", bbox_to_anchor=(0.4, 1.24), ncol=5, frameon=False)
    return SimpleNamespace(ax=ax, rows=rows)


def _bars_draw(a, labels: list[str], buckets: list[dict[str, float]]) -> None:
    """Stacked bars of each step's buckets (up to three steps)."""
    names = list(buckets[0])
    for i, row in enumerate(a.rows):
        left = 0.0
        for j, bar in enumerate(row):
            v = buckets[i][names[j]] if i < len(buckets) else 0.0
            bar.set_x(left)
            bar.set_width(v)
            bar.set_visible(v > 0)
            left += v
    a.ax.set_yticks(range(3), [*labels, "", "", ""][:3], fontsize=7)
    top = max(sum(b.values()) for b in buckets)
    a.ax.set_xlim(0, 1.05 * top)
    a.ax.set_ylim(len(buckets) - 0.5, -0.5)


_SIZING_BARS = figures.LiveFigure(7.0, 2.8, _bars_build, _bars_draw)
_TP_BARS = figures.LiveFigure(7.0, 2.8, _bars_build, _bars_draw)


def _step_bars(live, labels: list[str], buckets: list[dict[str, float]]):
    """Stacked step-bucket bars on ``live`` (one LiveFigure per explorer), legend built once per bucket list."""
    return live(labels, buckets, layout=tuple(buckets[0]))


def sizing(model: str, gpu: str, tokens_t: float, deadline_days: float, batch_tokens_m: float, seq_len: int,
           zero_stage: int) -> SimpleNamespace:
    """N012's whole computation: state, node, fleet (compute floor vs memory floor), the layout, and
    FSDP against a pipeline across nodes on that fleet (micro-batch of one and two sequences)."""
    from lib.perf.memory import visible_memory_bytes
    from lib.registry.hardware import gpu as gpu_of
    from lib.training import flops, layout, state
    from lib.training.step import training_step

    chip = gpu_of(gpu)
    total = state.state_bytes_total(model)
    visible = visible_memory_bytes(chip)
    mem_gpus = state.gpus_to_hold(total, visible)
    flops_total = flops.training_flops(model, tokens_t * 1e12, seq_len)
    compute_gpus = flops.gpus_for_deadline(flops_total, deadline_days * 86400.0, chip)
    node = layout.TrainingLayout(model, gpu, seq_len=seq_len).node
    unit = 8 * node  # whole blocks of eight nodes, so pipelines of 2, 4, 8 stages divide the fleet
    fleet = unit * math.ceil(max(compute_gpus, mem_gpus) / unit)
    lay = layout.fleet_layout(model, gpu, fleet, batch_tokens_m * 1e6, seq_len, zero_stage=zero_stage)
    pairs = {}
    for mb in (1, 2):
        try:
            pairs[mb] = layout.fsdp_vs_pipeline(model, gpu, fleet, batch_tokens_m * 1e6, seq_len, micro_batch=mb)
        except ValueError:
            continue
    return SimpleNamespace(chip=chip, total=total, visible=visible, mem_gpus=mem_gpus, flops=flops_total,
                           compute_gpus=compute_gpus, node=node, fleet=fleet, layout=lay, step=training_step(lay),
                           pairs=pairs)


@explorer(
    "training.state_sizing",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tokens_t=FloatRange(0.1, 100.0, 0.1, label="training tokens (trillions)"),
    deadline_days=FloatRange(7.0, 365.0, 1.0, label="deadline (days)"),
    batch_tokens_m=FloatRange(1.0, 64.0, 1.0, label="global batch (million tokens)"),
    seq_len=Choice((2048, 4096, 8192), label="sequence length"),
    zero_stage=Choice((0, 1, 2, 3), label="ZeRO stage of the layout"),
)
def state_sizing(model: str, gpu: str, tokens_t: float, deadline_days: float, batch_tokens_m: float,
                 seq_len: int, zero_stage: int) -> View:
    """N012: training state, the fleet it and the deadline force, the layout, and FSDP against a
    pipeline across nodes (step buckets of both at one sequence per micro-batch)."""
    from lib.training.step import training_step

    r = sizing(model, gpu, tokens_t, deadline_days, batch_tokens_m, seq_len, zero_stage)
    st = r.step
    rows = [("training state (16 B/param)", fmt_bytes(r.total, "TB")),
            ("one node holds (driver-visible)", fmt_bytes(r.node * r.visible, "TB")),
            ("GPUs to hold the state alone", fmt_int(r.mem_gpus)),
            ("GPUs for the deadline at the published MFU", sig(r.compute_gpus)),
            ("fleet (whole 8-node blocks)", fmt_int(r.fleet)),
            ("layout", r.layout.label),
            ("step time, MFU", f"{fmt_time(st.step_s)}, {fmt_pct(st.mfu)}"),
            ("days for the tokens (step model)", sig(tokens_t * 1e12 / st.tokens_per_s / 86400))]
    labels, buckets = [], []
    if 1 in r.pairs:
        fsdp, pipe = r.pairs[1]
        for lay in (fsdp, pipe):
            s = training_step(lay)
            labels.append(("FSDP " if lay.zero_stage == 3 else "pipeline ") + lay.label.rsplit(", ", 1)[1])
            buckets.append(s.buckets)
        rows.append(("FSDP vs pipeline, 1 sequence per micro-batch",
                     " vs ".join(fmt_time(sum(b.values())) for b in buckets)))
    else:
        labels, buckets = [r.layout.label.rsplit(", ", 1)[1]], [st.buckets]
    fig = _step_bars(_SIZING_BARS, labels, buckets)
    caption = ("Step buckets of " + " and of ".join(f"{lab} ({fmt_time(sum(b.values()))})"
                                                  for lab, b in zip(labels, buckets, strict=True))
               + ", one sequence per micro-batch: FSDP pays exposed DP traffic, the pipeline its bubble.")
    return View(f"Training state and fleet: {model} on {gpu}", rows, fig, caption=caption,
                values={"state_bytes": r.total, "fleet": r.fleet, "step_s": st.step_s})


# ---- W10: one matmul, split -----------------------------------------------------------------

_TENSORS = ("X", "W", "Y", "dY", "dX", "gradients", "master", "optimizer")
_SPLIT_ROWS = ("data", "column", "row")
_NAMES = {"data": "data split", "column": "column split", "row": "row split"}


def _mem_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.2, top=0.86)
    ax = fig.add_subplot()
    rows = [[ax.barh(i, 0.0, left=0.0, color=f"C{j}", height=0.6)[0] for j in range(len(_TENSORS))]
            for i in range(len(_SPLIT_ROWS))]
    cap = ax.axvline(0.0, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("GB per GPU")
    ax.set_yticks(range(3))
    ax.invert_yaxis()
    ax.grid(True, axis="x")
    ax.legend(rows[0], _TENSORS, fontsize=6, loc="upper center", bbox_to_anchor=(0.45, 1.2), ncol=8, frameon=False)
    return SimpleNamespace(ax=ax, rows=rows, cap=cap)


def _mem_draw(a, labels: list[str], parts: list[dict[str, float]], capacity: float) -> None:
    for bars, part in zip(a.rows, parts, strict=True):
        left = 0.0
        for bar, name in zip(bars, _TENSORS, strict=True):
            v = part.get(name, 0.0) / 1e9
            bar.set_x(left)
            bar.set_width(v)
            left += v
    a.ax.set_yticklabels(labels, fontsize=7)
    a.cap.set_xdata([capacity / 1e9, capacity / 1e9])
    a.ax.set_xlim(0, 1.05 * max(capacity, *(p["total"] for p in parts)) / 1e9)


_MEM_BARS = figures.LiveFigure(6.4, 2.4, _mem_build, _mem_draw)


def matmul_numbers(m: int, k: int, n: int, dtype: str, gpu: str, tp: int) -> SimpleNamespace:
    """W10's computation: the tensors of Y = X @ W whole and per GPU under each split, the FLOPs and
    matmul time per GPU, and the all-reduce each split needs on NVLink (or across nodes past one)."""
    from lib.perf.collectives import collective, gpus_per_node, send
    from lib.perf.memory import visible_memory_bytes
    from lib.registry import assumptions
    from lib.registry.hardware import gpu as gpu_of
    from lib.training import layout

    chip = gpu_of(gpu)
    peak = chip.peak_flops(dtype)
    whole = layout.matmul_tensor_bytes(m, k, n, dtype)
    parts = {s: layout.matmul_split_bytes(m, k, n, tp, s, dtype) for s in _SPLIT_ROWS}
    flops = 3 * 2.0 * m * k * n  # forward 2mkn; backward dX and dW, 2mkn each
    eff = assumptions.value("training.gemm_efficiency")
    node = gpus_per_node(None, chip)
    ar = {s: (collective("all_reduce", parts[s]["allreduce_bytes"], tp, chip) if tp > 1 and parts[s]["allreduce_bytes"]
              else None) for s in _SPLIT_ROWS}
    across = {s: collective("all_reduce", parts[s]["allreduce_bytes"], tp, chip, nodes_gpus=1)
              if tp > 1 and parts[s]["allreduce_bytes"] else None for s in ("column", "row")}
    boundary = send(whole["Y"], chip, across_nodes=True)  # a pipeline boundary: Y handed to the next stage
    return SimpleNamespace(chip=chip, whole=whole, parts=parts, flops=flops, compute_s=flops / tp / (peak * eff),
                           compute_1_s=flops / (peak * eff), ar=ar, across=across, node=node,
                           capacity=visible_memory_bytes(chip), boundary=boundary)


@explorer(
    "training.matmul_split",
    m=Choice((4096, 8192, 16384, 32768, 65536, 131072), label="m (tokens)"),
    k=Choice((4096, 8192, 16384, 32768, 65536, 131072), label="k (input width)"),
    n=Choice((4096, 8192, 16384, 32768, 65536, 131072), label="n (output width)"),
    dtype=Choice(("bf16", "fp32"), label="dtype"),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8, 16, 32), label="tensor parallel"),
)
def matmul_split(m: int, k: int, n: int, dtype: str, gpu: str, tp: int) -> View:
    """W10: per-GPU memory of a training Y = X @ W unsplit, column-split and row-split over tp GPUs,
    and the all-reduce each split pays against the matmul time."""
    r = matmul_numbers(m, k, n, dtype, gpu, tp)
    rows = [("forward tensors X, W, Y", fmt_bytes(r.whole["X"] + r.whole["W"] + r.whole["Y"], "GB")),
            ("training, every live tensor", fmt_bytes(r.whole["total"], "GB")),
            ("matmul time per GPU (fwd + bwd)", fmt_time(r.compute_s))]
    for s in _SPLIT_ROWS:
        c = r.ar[s]
        rows.append((f"{s} split per GPU", fmt_bytes(r.parts[s]["total"], "GB")
                     + (f"; all-reduce {fmt_bytes(r.parts[s]['allreduce_bytes'], 'GB')} in {fmt_time(c.time_s)} "
                        f"({c.fabric})" if c else "")))
    fig = _MEM_BARS([f"data (m) / {tp}", f"column (n) / {tp}", f"row (k) / {tp}"],
                    [r.parts[s] for s in _SPLIT_ROWS], r.capacity)
    fits = [s for s in _SPLIT_ROWS if r.parts[s]["total"] <= r.capacity]
    caption = (f"GB per GPU for a training Y = X @ W ({m} x {k} by {k} x {n}, {dtype}) against the "
               f"{fmt_bytes(r.capacity, 'GB')} the driver shows (dashed): "
               + (f"{', '.join(_NAMES[f] for f in fits)} fit{'s' if len(fits) == 1 else ''}." if fits
                  else "no split fits one GPU."))
    return View(f"Y = X @ W split over {tp} GPUs", rows, fig, caption=caption,
                values={"total": r.whole["total"], "column": r.parts["column"]["total"]})


# ---- N010: where each parallelism goes --------------------------------------------------------

_AXES = ("TP", "PP", "DP")


def _place_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.2, top=0.88)
    ax = fig.add_subplot()
    nv = ax.barh([i - 0.2 for i in range(3)], [1.0] * 3, height=0.38, color="C2", label="on NVLink")
    net = ax.barh([i + 0.2 for i in range(3)], [1.0] * 3, height=0.38, color="C3", label="on the network")
    marks = ax.plot([1.0] * 3, range(3), "k|", markersize=14, label="as placed (exposed)")[0]
    ax.set_yticks(range(3), _AXES)
    ax.invert_yaxis()
    ax.set_xlabel("seconds of communication per step (log scale)")
    figures.log_scale(ax, "x")
    ax.grid(True, axis="x")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, 1.14), ncol=3, frameon=False)
    return SimpleNamespace(ax=ax, nv=nv, net=net, marks=marks)


def _place_draw(a, nvlink: list[float], network: list[float], exposed: list[float]) -> None:
    floor = 1e-6
    for bar, v in zip(a.nv, nvlink, strict=True):
        bar.set_width(max(v, floor))
        bar.set_visible(v > 0)
    for bar, v in zip(a.net, network, strict=True):
        bar.set_width(max(v, floor))
        bar.set_visible(v > 0)
    a.marks.set_xdata([max(v, floor) for v in exposed])
    vals = [v for v in (*nvlink, *network, *exposed) if v > 0] or [1e-3]
    a.ax.set_xlim(min(vals) / 3, max(vals) * 3)


_PLACE_BARS = figures.LiveFigure(6.4, 2.4, _place_build, _place_draw)


def placement_numbers(model: str, gpu: str, tp: int, pp: int, dp: int, seq_len: int, micro_batches: int,
                      zero_stage: int) -> SimpleNamespace:
    """N010's computation: the layout's per-axis traffic (:func:`lib.training.layout.axis_traffic`),
    each axis's time on NVLink and on the network (None where the group cannot fit a node), the
    step, and the step with tensor parallelism forced onto the network."""
    from lib.training import layout
    from lib.training.step import TrainingLayout, training_memory, training_step

    lay = TrainingLayout(model, gpu, tp=tp, pp=pp, dp=dp, seq_len=seq_len, micro_batches=micro_batches,
                         zero_stage=zero_stage)
    rows = {r.axis: r for r in layout.axis_traffic(lay)}
    on = {}
    for axis in _AXES:
        on[axis] = {}
        for link in layout.LINKS:
            try:
                on[axis][link] = layout.axis_time_on(lay, axis, link)
            except ValueError:
                on[axis][link] = None
    misplaced = training_step(lay.replace(node_gpus=1)) if tp > 1 and tp <= lay.node else None
    return SimpleNamespace(layout=lay, rows=rows, on=on, step=training_step(lay), memory=training_memory(lay),
                           misplaced=misplaced)


@explorer(
    "training.placement",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8, 16), label="tensor parallel"),
    pp=Choice((1, 2, 4, 8, 16), label="pipeline stages"),
    dp=Choice((1, 2, 4, 8, 16, 32, 64, 128, 256), label="data parallel"),
    seq_len=Choice((2048, 4096, 8192), label="sequence length"),
    micro_batches=Choice((1, 2, 4, 8, 16, 32, 64), label="micro-batches per step"),
    zero_stage=Choice((0, 1, 2, 3), label="ZeRO stage"),
)
def placement(model: str, gpu: str, tp: int, pp: int, dp: int, seq_len: int, micro_batches: int,
              zero_stage: int) -> View:
    """N010: each parallel axis's bytes per step and its time on NVLink against the network, with
    the exposed time of the placement the layout uses."""
    r = placement_numbers(model, gpu, tp, pp, dp, seq_len, micro_batches, zero_stage)
    rows = [("layout", r.layout.label), ("step, MFU", f"{fmt_time(r.step.step_s)}, {fmt_pct(r.step.mfu)}"),
            ("memory headroom per GPU", fmt_bytes(r.memory["headroom"], "GB")
             + (" (does not fit)" if r.memory["headroom"] < 0 else ""))]
    nv, net, exp = [], [], []
    for axis in _AXES:
        a = r.rows.get(axis)
        nv.append(r.on[axis]["nvlink"] or 0.0)
        net.append(r.on[axis]["network"] or 0.0)
        exp.append(a.exposed_s if a else 0.0)
        if a:
            rows.append((f"{axis}{a.degree}: {a.payload}", f"{fmt_bytes(a.wire_bytes, 'GB')}/step on {a.link}, "
                         f"{fmt_time(a.time_s)} ({fmt_time(a.exposed_s)} exposed)"))
    if r.misplaced:
        rows.append(("step with TP on the network", fmt_time(r.misplaced.step_s)))
    fig = _PLACE_BARS(nv, net, exp)
    used = [axis for axis in _AXES if axis in r.rows]
    caption = ("Seconds of communication per step for each axis on NVLink (green) and on the network (red); ticks: "
               "the exposed time as placed. " + ("; ".join(
                   f"{axis}: {fmt_time(r.rows[axis].exposed_s)} exposed on {r.rows[axis].link}" for axis in used)
                   if used else "no axis is split") + ".")
    return View(f"Placement: {r.layout.label}", rows, fig, caption=caption,
                values={"step_s": r.step.step_s})


# ---- N013: what tensor parallelism costs --------------------------------------------------------


def tp_numbers(model: str, gpu: str, seq_len: int, dp: int, micro_batches: int) -> SimpleNamespace:
    """N013's layouts on the same GPUs and batch: TP = the node (inside NVLink), TP = two nodes
    (hierarchical across the NIC; dp halved, micro-batches doubled), and TP = the node with every
    rank on its own node (a flat ring over the NICs); their steps."""
    from lib.training.step import TrainingLayout, training_memory, training_step

    inside = TrainingLayout(model, gpu, tp=8, dp=dp, seq_len=seq_len, micro_batches=micro_batches, zero_stage=1)
    node = inside.node
    if node != 8:
        inside = inside.replace(tp=node)
    if dp % 2:
        raise ValueError(f"dp must be even (the two-node TP layout halves it), got {dp}")
    two = inside.replace(tp=2 * node, dp=dp // 2, micro_batches=2 * micro_batches)
    flat = inside.replace(node_gpus=1)
    return SimpleNamespace(inside=inside, two=two, flat=flat, s_in=training_step(inside), s_two=training_step(two),
                           s_flat=training_step(flat), mem_in=training_memory(inside), mem_two=training_memory(two))


def gemm_table(model: str, gpu: str, tokens: int, degrees=(1, 2, 4, 8, 16, 32, 64)) -> list[SimpleNamespace]:
    """Per TP degree that divides the attention heads: one layer's four weight GEMMs on one GPU
    (:func:`lib.kernels.gemm_waves.layer_waves`, M = ``tokens``): their shapes, the layer's GEMM
    time against the TP1 time / t (the GEMMs' parallel efficiency), the worst wave efficiency, and
    the KV heads each rank holds (replicated past the model's KV heads)."""
    from lib.kernels.gemm_waves import layer_waves
    from lib.registry.models import model as model_of

    m = model_of(model)
    out, base = [], None
    for t in degrees:
        if m.num_attention_heads % t:
            continue
        ws = layer_waves(model, gpu, t, tokens)
        time_s = sum(w.time_s for w in ws.values())
        base = base if base is not None else time_s
        out.append(SimpleNamespace(tp=t, shapes={p: (w.n, w.k) for p, w in ws.items()}, time_s=time_s,
                                   parallel_eff=base / (t * time_s), wave_eff=min(w.wave_efficiency for w in ws.values()),
                                   kv_heads=m.kv_heads_per_rank(t),
                                   kv_copies=m.kv_heads_per_rank(t) * t / m.num_kv_heads))
    return out


@explorer(
    "training.tp_cost",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    seq_len=Choice((2048, 4096, 8192), label="sequence length"),
    dp=Choice((2, 4, 8, 16, 32, 64), label="data parallel (at TP = node)"),
    micro_batches=Choice((1, 2, 4, 8, 16, 32), label="micro-batches per step"),
)
def tp_cost(model: str, gpu: str, seq_len: int, dp: int, micro_batches: int) -> View:
    """N013: the step with TP inside the node, across two nodes, and spread one rank per node."""
    r = tp_numbers(model, gpu, seq_len, dp, micro_batches)
    labels = [f"TP{r.inside.tp} in the node", f"TP{r.two.tp} over 2 nodes", f"TP{r.flat.tp} one rank/node"]
    steps = [r.s_in, r.s_two, r.s_flat]
    rows = [(lab, f"step {fmt_time(s.step_s)}, TP {fmt_time(s.tp_exposed_s)} ({fmt_pct(s.tp_exposed_s / s.step_s)})")
            for lab, s in zip(labels, steps, strict=True)]
    fig = _step_bars(_TP_BARS, labels, [s.buckets for s in steps])
    caption = (f"Step buckets on {r.inside.n_gpus} GPUs: TP is {fmt_pct(r.s_in.tp_exposed_s / r.s_in.step_s)} of the step "
               f"inside the node, {fmt_pct(r.s_two.tp_exposed_s / r.s_two.step_s)} across two nodes and "
               f"{fmt_pct(r.s_flat.tp_exposed_s / r.s_flat.step_s)} with every rank on its own node.")
    return View(f"Tensor-parallel cost: {model} on {gpu}", rows, fig, caption=caption,
                values={"share_inside": r.s_in.tp_exposed_s / r.s_in.step_s})
