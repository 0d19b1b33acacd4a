"""Explorer for torch.compile's stages on a decode MLP block (N005): per stage, the kernels, the host and GPU
work of one call and the period of back-to-back calls, from :mod:`lib.kernels.compile_stages` only (no torch;
the CPU trace is the notebook's). The figure is a persistent matplotlib figure updated in place."""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, IntRange, View, explorer
from lib.kernels import compile_stages as cs
from lib.registry import hardware, models
from lib.units import fmt_bytes, fmt_int, fmt_ratio, fmt_time

ALL_GPUS = tuple(hardware.gpu_names())
DENSE_SWIGLU = tuple(k for k in models.model_names()
                     if not models.model(k).is_moe and models.model(k).mlp == "swiglu")
"""Dense models with a SwiGLU MLP: the block's shape."""
BREAKS = ("none", ".item() check")
_STAGES = cs.STAGES
_SHORT = {"eager": "eager", "eager_graph": "eager in one\nCUDA graph", "inductor": "Inductor",
          "reduce_overhead": "reduce-overhead"}


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{fmt_int(n)} {one if n == 1 else (many or one + 's')}"


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.3, top=0.88)
    a = SimpleNamespace(ax=ax)
    ys = list(range(len(_STAGES)))
    a.host = ax.barh([y + 0.18 for y in ys], [0.0] * len(ys), height=0.34, color="#ff7f0e", label="host work per call")
    a.gpu = ax.barh([y - 0.18 for y in ys], [0.0] * len(ys), height=0.34, color="#1f77b4", label="GPU work per call")
    a.period, = ax.plot([], [], "D", color="black", ms=6, label="period of back-to-back calls (model)")
    a.measured, = ax.plot([], [], "x", color="#d62728", ms=8, mew=2, label="H200 measured")
    a.floor = ax.axvline(1.0, color="grey", lw=1, ls="--", label="weights at datasheet HBM bandwidth")
    a.missing = [ax.text(0.0, y, "", fontsize=7, va="center", color="grey") for y in ys]
    ax.set_yticks(ys)
    ax.set_yticklabels([_SHORT[s] for s in _STAGES], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("microseconds per call")
    ax.grid(True, axis="x")
    return a


def _draw(a, host_us, gpu_us, period_us, measured, floor_us, xmax, notes, title) -> None:
    for bar, w in zip(a.host, host_us, strict=True):
        bar.set_width(w)
    for bar, w in zip(a.gpu, gpu_us, strict=True):
        bar.set_width(w)
    ys = [y for y, p in enumerate(period_us) if p is not None]
    a.period.set_data([period_us[y] for y in ys], ys)
    a.measured.set_data([m for m, _ in measured], [y for _, y in measured])
    a.floor.set_xdata([floor_us, floor_us])
    for text, note in zip(a.missing, notes, strict=True):
        text.set_text(note)
    a.ax.set_xlim(0, xmax)
    a.ax.set_title(title, fontsize=9)
    handles = [a.host, a.gpu, a.period, a.floor] + ([a.measured] if measured else [])
    figures.legend(a.ax, handles, loc="upper center", bbox_to_anchor=(0.45, -0.16), ncol=2, fontsize=7,
                   frameon=False)


_FIGURE = figures.LiveFigure(6.2, 4.2, _build, _draw)


@explorer(
    "cuda_kernels.compile_stages",
    gpu=Choice(ALL_GPUS),
    model=Choice(DENSE_SWIGLU, label="model (its MLP shape)"),
    batch=IntRange(1, 512, log=True, label="batch (rows)"),
    dtype=Choice(cs.DTYPES, label="dtype"),
    calibration=Choice(cs.CALIBRATIONS, label="launch and bandwidth constants"),
    weights=Choice(cs.WEIGHTS, label="weights held as"),
    graph_break=Choice(BREAKS, label="graph break"),
)
def compile_stages_view(gpu: str, model: str, batch: int, dtype: str, calibration: str, weights: str,
                        graph_break: str) -> View:
    """N005: the decode MLP block of ``model`` at ``batch`` through eager, eager in one CUDA graph, Inductor and
    reduce-overhead: kernels, host and GPU work per call, the period of back-to-back calls, and the H200
    measurement where the setup is the measured one."""
    if graph_break not in BREAKS:
        raise ValueError(f"graph_break must be one of {', '.join(BREAKS)}; got {graph_break!r}")
    brk = graph_break != "none"
    c = cs.compile_stages(model, batch, gpu, dtype, calibration, weights, brk)
    here = cs.is_measured_setup(model, batch, gpu, dtype)
    host_us, gpu_us, period_us, notes, measured = [], [], [], [], []
    rows = [("weights", f"{fmt_bytes(c.block.weight_bytes, 'MB')}: {fmt_time(c.floor_s)} at the datasheet HBM "
                        "bandwidth")]
    for y, stage in enumerate(_STAGES):
        s = c.stages.get(stage)
        if s is None:
            host_us.append(0.0)
            gpu_us.append(0.0)
            period_us.append(None)
            notes.append("  none: a CUDA graph cannot capture .item()")
            continue
        host_us.append(s.host_s * 1e6)
        gpu_us.append(s.gpu_s * 1e6)
        period_us.append(s.period_s * 1e6)
        notes.append("")
        got = cs.measured_call_s(stage, weights, brk) if here else ()
        measured += [(m * 1e6, y) for m in got]
        seen = f"; H200 measured {', '.join(fmt_time(m) for m in got)}" if got else ""
        extra = f", copies {fmt_bytes(s.copied_bytes, 'MB')} first" if stage == "reduce_overhead" else ""
        rows.append((cs.STAGE_LABELS[stage],
                     f"{_count(s.kernel_count, 'kernel')}, {_count(s.launches, 'host launch', 'host launches')}{extra}: "
                     f"{fmt_time(s.period_s)} per call (host {fmt_time(s.host_s)}, GPU {fmt_time(s.gpu_s)}; "
                     f"{s.bound}-bound){seen}"))
    eager, ro = c["eager"], c["reduce_overhead"]
    rows.append(("reduce-overhead against eager", fmt_ratio(eager.period_s / ro.period_s)))
    xmax = 1.12 * max(max(host_us), max(gpu_us), max(m for m, _ in measured) if measured else 0.0,
                      c.floor_s * 1e6)
    fig = _FIGURE(host_us, gpu_us, period_us, measured, c.floor_s * 1e6, xmax, notes,
                  f"{model} MLP block, batch {batch}, {dtype}, {gpu}\n{calibration} constants, weights as {weights}"
                  + ("" if not brk else ", .item() break"))
    slowest = max(c.stages.values(), key=lambda s: s.period_s)
    fastest = min(c.stages.values(), key=lambda s: s.period_s)
    caption = (f"Each stage's time is the longer of its two bars unless a .item() makes the host wait for the GPU "
               f"(then they add): {cs.STAGE_LABELS[slowest.stage]} is the slowest here "
               f"({fmt_time(slowest.period_s)}, {slowest.bound}-bound) and {cs.STAGE_LABELS[fastest.stage]} the "
               f"fastest ({fmt_time(fastest.period_s)}, {fastest.bound}-bound), against a floor of "
               f"{fmt_time(c.floor_s)} for the weights alone.")
    note = ("Per kernel: fixed cost + max(bytes / (HBM x streaming efficiency), FLOPs / (peak x matmul efficiency)); "
            "per call: host entry per graph + a launch per kernel (one per CUDA-graph replay), GPU and host overlap "
            "except at a sync.")
    return View(f"torch.compile stages: {model} MLP block at batch {batch} on {gpu}", rows, fig, note,
                values={f"{k}_s": v.period_s for k, v in c.stages.items()} | {"floor_s": c.floor_s},
                caption=caption)


__all__ = ["ALL_GPUS", "BREAKS", "DENSE_SWIGLU", "compile_stages_view"]
