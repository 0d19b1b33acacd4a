"""A view of the decode step (:mod:`lib.perf.step`) as a profiler reader sees it, and the
capacity-plan waterfall built on it.

* **A batch-1 gap** (why is my step 2.5x the floor?): :func:`decode_trace` takes the timeline
  of :func:`lib.perf.step.decode_step` (``timeline=True``) and adds to each GEMM its share of the
  weight floor; :func:`attribute_trace` sorts that timeline into the suspects a trace shows (idle
  gaps, collective kernels, tiny kernels, GEMVs below the bandwidth roof, attention, sampling and
  the host). The suspects regroup the step's own buckets: floor + suspects = the step, exactly.
  No timing here: every duration is the step model's.
* **Where the roofline breaks** in a capacity plan: :func:`roofline_plan` (the twenty-line bound),
  :func:`plan_waterfall` (what each break adds to a step: the step model's buckets, then the
  prompt tokens continuous batching mixes in, priced by :func:`lib.perf.prefill.prefill_time`),
  and single-number helpers for the breaks that are not additive (MoE load, L2 residency; KV
  capacity is ``Deployment.budget``).

SI units: seconds, bytes, FLOP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lib.inputs import fraction, integer
from lib.perf import prefill as pf
from lib.perf import step as st
from lib.perf.deployment import Deployment, require
from lib.registry.hardware import GPU, gpu

BUCKETS = (
    "launch_gaps",
    "collectives",
    "tiny_kernels",
    "gemv_below_roof",
    "sampling_host",
    "attention_kv",
)
BUCKET_SIGNAL = {
    "launch_gaps": "white space between kernels on the GPU stream (CPU/launch-bound)",
    "collectives": "AllReduce / AllGather kernels (NCCL or RCCL), two per layer",
    "tiny_kernels": "a long tail of few-µs norm, rotary, KV-write, activation kernels",
    "gemv_below_roof": "GEMV kernels whose bytes / duration sits below the HBM roof",
    "sampling_host": "sampling kernels, then a D2H copy + sync and an idle gap at the step edge",
    "attention_kv": "the attention kernel: its time grows with context",
}
BUCKET_LABEL = {
    "launch_gaps": "gaps between kernels (CPU / launch)",
    "collectives": "all-reduce / all-gather kernels",
    "tiny_kernels": "tail of tiny kernels",
    "gemv_below_roof": "GEMVs below the bandwidth roof",
    "sampling_host": "sampling + host sync",
    "attention_kv": "attention (KV read)",
}
_CATEGORY = {"gemm": "gemm", "attention": "attention", "small": "elementwise",
             "collective": "collective", "sampling": "sampling"}




# ---- the trace: a view of lib.perf.step ---------------------------------------------------


@dataclass(frozen=True)
class TraceEvent:
    """One kernel on the GPU stream: what a profiler row shows, plus its share of the floor."""

    name: str
    category: str  # gemm | attention | elementwise | collective | sampling
    start_s: float
    duration_s: float
    floor_s: float = 0.0  # weight bytes / datasheet bandwidth (GEMMs only)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Trace:
    """One decode step on one GPU: the host phase [0, host_end_s) then the kernels.

    ``step`` is the :class:`lib.perf.step.DecodeStep` it was read from (``step_s`` is its total)."""

    events: tuple[TraceEvent, ...]
    host_end_s: float
    step_s: float
    step: st.DecodeStep = field(compare=False, repr=False)


def decode_trace(dep: Deployment, batch: int = 1, context: int = 0,
                 assume: st.StepAssumptions | None = None) -> Trace:
    """The timeline of ``lib.perf.step.decode_step(dep, batch, context, assume, timeline=True)``
    as profiler rows; each GEMM also carries its weight bytes / datasheet bandwidth (its floor),
    read from :func:`lib.perf.step.step_kernels`. CUDA graphs on or off is ``dep.cuda_graphs``.
    """
    dep = require(dep)
    a = assume or st.step_assumptions()
    s = st.decode_step(dep, batch, context, a, timeline=True)
    kernels = st.step_kernels(dep, s.batch, s.context, a)
    host = s.events[0]
    if host[1] != "host" or len(kernels) != len(s.events) - 1:
        raise ValueError("lib.perf.step timeline and kernel list disagree")  # a bug, not an input
    bw = dep.chip.memory_bandwidth
    events = []
    for (name, cat, start, dur), k in zip(s.events[1:], kernels, strict=True):
        floor = k.weight_bytes / bw if cat == "gemm" else 0.0
        events.append(TraceEvent(name, _CATEGORY[cat], start, dur, floor))
    return Trace(tuple(events), host[2] + host[3], s.total_s, s)


def attribute_trace(trace: Trace) -> dict[str, float]:
    """Sort a trace into the floor and the six suspect buckets, seconds; they sum to the step.

    floor: sum over GEMMs of weight bytes / datasheet bandwidth; gemv_below_roof: GEMM
    duration minus that; collectives, tiny_kernels (elementwise), attention_kv, sampling_host
    (sampling kernels + the host phase at the step edge): durations; launch_gaps: idle time
    between consecutive kernels (the step model's ``launch_gaps`` bucket).
    """
    if not trace.events:
        raise ValueError("trace has no events")
    out = dict.fromkeys(("floor",) + BUCKETS, 0.0)
    out["sampling_host"] = trace.host_end_s
    prev_end = trace.host_end_s
    for e in trace.events:
        out["launch_gaps"] += e.start_s - prev_end
        prev_end = e.end_s
        if e.category == "gemm":
            out["floor"] += e.floor_s
            out["gemv_below_roof"] += e.duration_s - e.floor_s
        elif e.category == "collective":
            out["collectives"] += e.duration_s
        elif e.category == "elementwise":
            out["tiny_kernels"] += e.duration_s
        elif e.category == "attention":
            out["attention_kv"] += e.duration_s
        elif e.category == "sampling":
            out["sampling_host"] += e.duration_s
        else:
            raise ValueError(f"unknown event category {e.category!r}")
    return out


def suspects(dep: Deployment, batch: int = 1, context: int = 0,
             assume: st.StepAssumptions | None = None) -> tuple[Trace, dict[str, float]]:
    """(trace, attribution) of one decode step: :func:`decode_trace` then :func:`attribute_trace`."""
    trace = decode_trace(dep, batch, context, assume)
    return trace, attribute_trace(trace)


def fusion_saving_s(trace: Trace) -> float:
    """Seconds a step saves if every small elementwise kernel (norms, rotary, KV write,
    activation, embedding) is folded into its neighbours: each one's duration plus the idle gap
    before it. Exact for CUDA-graph replay (the next kernel then starts one launch gap after the
    previous one ends, wherever that is); eager launches queue differently, so it refuses them.
    The folded work's bytes are a few activation rows: not counted."""
    if not trace.step.deployment.cuda_graphs:
        raise ValueError("fusion_saving_s covers CUDA-graph replay (dep.cuda_graphs=True); "
                         "eager gaps depend on the launch queue")
    prev_end, saved = trace.host_end_s, 0.0
    for e in trace.events:
        if e.category == "elementwise":
            saved += e.end_s - prev_end
        prev_end = e.end_s
    return saved


def trace_figure(trace: Trace, layers: int = 2, buckets: dict[str, float] | None = None):
    """Two panels: the first ``layers`` layers of the trace as a Gantt strip (µs, coloured by
    kernel category, white = idle), and the step's buckets as one stacked bar (ms). Returns a
    :class:`lib.book.figures.Drawing` (a fresh figure: a notebook draws it once)."""
    from lib.book import figures

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    colors = {
        "gemm": ("#4c72b0", "GEMV"),
        "attention": ("#dd8452", "attention"),
        "elementwise": ("#55a868", "elementwise"),
        "collective": ("#c44e52", "collective"),
        "sampling": ("#8172b3", "sampling"),
    }
    with figures.style():
        return figures.show(_trace_figure(figures.new_figure(7.0, 4.5), trace, layers, buckets, colors))


def _trace_figure(fig, trace: Trace, layers: int, buckets: dict[str, float] | None, colors: dict):
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    qkv = [i for i, e in enumerate(trace.events) if e.name == "qkv_proj"]
    stop = qkv[layers] if len(qkv) > layers else len(trace.events)
    shown = trace.events[:stop]
    t0 = trace.host_end_s
    for cat, (color, label) in colors.items():
        spans = [((e.start_s - t0) * 1e6, e.duration_s * 1e6) for e in shown if e.category == cat]
        if spans:
            ax1.broken_barh(
                spans, (0, 1), facecolors=color, edgecolor="white", linewidth=0.3, label=label
            )
    ax1.set_yticks([])
    ax1.set_xlabel("µs from the first kernel (white = idle)", fontsize=8)
    ax1.set_title(f"the first {layers} layer(s) of the GPU stream", fontsize=9)
    ax1.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    b = buckets or attribute_trace(trace)
    left = 0.0
    bucket_colors = {
        "floor": "#4c72b0",
        "gemv_below_roof": "#9bb1d6",
        "collectives": "#c44e52",
        "tiny_kernels": "#55a868",
        "attention_kv": "#dd8452",
        "sampling_host": "#8172b3",
        "launch_gaps": "#cccccc",
    }
    for key in ("floor",) + BUCKETS:
        v = b[key] * 1e3
        ax2.barh(
            [0],
            [v],
            left=left,
            color=bucket_colors[key],
            label="floor" if key == "floor" else BUCKET_LABEL[key],
        )
        left += v
    ax2.set_yticks([])
    ax2.set_xlabel("ms per decode step", fontsize=8)
    ax2.set_title("the whole step, by suspect", fontsize=9)
    ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.subplots_adjust(hspace=1.5, bottom=0.2, top=0.93)
    return fig


# ---- where the roofline breaks: the plan and its corrections ------------------------------


def roofline_plan(dep: Deployment, batch: int, context: int) -> dict[str, float]:
    """The twenty-line estimate for a decode replica: a bound, not a step time.

    step bound = max((weights / tp + batch x context x KV bytes/token x shard) / W, FLOPs / P)
    (:func:`lib.perf.roofline.decode_step`); tokens/s = batch / that; plus the per-GPU bytes.
    """
    from lib.perf import roofline as rf

    dep = require(dep)
    m, g, tp = dep.mdl, dep.chip, dep.tp
    bound = rf.decode_step(m, g, tp, batch, context, dep.weight_dtype, dep.kv_dtype, dep.compute_dtype)
    kv = batch * context * m.kv_bytes_per_token(dep.kv_dtype) * rf.kv_shard_fraction(m, tp)
    return {
        "step_s": bound.time_s,
        "tokens_per_s": batch / bound.time_s,
        "weights_per_gpu": m.weight_bytes(dep.weight_dtype) / tp,
        "kv_per_gpu": kv,
        "memory_s": bound.memory_s,
        "compute_s": bound.compute_s,
    }


def prefill_tokens_per_step(batch: int, prompt_len: int, output_len: int) -> float:
    """Prompt tokens a continuous-batching server must prefill per decode step, on average.

    In steady state ``batch`` sequences each finish after ``output_len`` steps, so
    batch / output_len new requests arrive per step, each with ``prompt_len`` tokens:
    batch x prompt_len / output_len.
    """
    if batch < 1 or prompt_len < 0 or output_len < 1:
        raise ValueError(
            f"need batch >= 1, prompt_len >= 0, output_len >= 1; got {batch}, {prompt_len}, {output_len}"
        )
    return batch * prompt_len / output_len


def mixed_prefill_s(dep: Deployment, step: st.DecodeStep, chunk_tokens: float, prompt_len: int,
                    clock_fraction: float = 1.0) -> float:
    """Seconds ``chunk_tokens`` prompt tokens (a slice of a ``prompt_len``-token prompt) add to a
    decode step they join, from the one prefill model (:func:`lib.perf.prefill.prefill_time`):

    share = chunk / prompt_len of one prefill; its compute (at the prefill MFU x
    ``clock_fraction``) runs under the weight read the decode step already streams
    (``step["weights"] + step["weight_bandwidth_shortfall"]``), so only what exceeds that read is
    added, plus the chunk's tensor-parallel all-reduce traffic (never hidden). The chunk's
    all-reduces ride in the step's own calls, so their latency share (a few percent of that
    traffic at 2k-token prompts) is counted twice: an upper estimate, said here.
    """
    dep = require(dep)
    fraction("clock_fraction", clock_fraction, allow_zero=False)
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0, got {chunk_tokens}")
    prompt_len = integer("prompt_len", prompt_len, 1, unit="tokens")
    if chunk_tokens == 0:
        return 0.0
    p = pf.prefill_time(dep, prompt_len, mfu=pf.default_mfu() * clock_fraction)
    share = chunk_tokens / prompt_len
    stream = step["weights"] + step["weight_bandwidth_shortfall"]
    return max(0.0, share * p.compute_s - stream) + share * p.allreduce_s


def plan_waterfall(
    dep: Deployment,
    batch: int,
    context: int,
    prompt_len: int,
    output_len: int,
    assume: st.StepAssumptions | None = None,
    clock_fraction: float = 1.0,
) -> list[tuple[str, float]]:
    """What each break adds to one decode step of the plan, seconds, in order.

    roofline plan: :func:`roofline_plan`'s bound; then the decode step's suspects beyond it
    (:func:`attribute_trace` of :func:`decode_trace`: achieved bandwidth and fixed cost on the
    GEMVs and on attention, collectives, tiny kernels, launch gaps, sampling and host): so the
    first seven rows sum to ``lib.perf.step.decode_step``'s total; then the prompt tokens
    continuous batching mixes into each step (:func:`mixed_prefill_s`), then what a sustained
    clock of ``clock_fraction`` adds to that compute-bound part.
    """
    dep = require(dep)
    fraction("clock_fraction", clock_fraction, allow_zero=False)
    plan = roofline_plan(dep, batch, context)
    trace, b = suspects(dep, batch, context, assume)
    kv_peak = trace.step["kv_cache"]
    rows = [
        ("roofline plan", plan["step_s"]),
        ("GEMVs below the roof (achieved BW, fixed cost)",
         b["floor"] + b["gemv_below_roof"] - (plan["step_s"] - kv_peak)),
        ("attention below the roof", b["attention_kv"] - kv_peak),
        ("collectives", b["collectives"]),
        ("tiny kernels", b["tiny_kernels"]),
        ("launch gaps", b["launch_gaps"]),
        ("sampling + host", b["sampling_host"]),
    ]
    chunk = prefill_tokens_per_step(batch, prompt_len, output_len)
    p = max(prompt_len, 1)
    mixed = mixed_prefill_s(dep, trace.step, chunk, p)
    throttled = mixed_prefill_s(dep, trace.step, chunk, p, clock_fraction)
    rows.append(("prefill mixed into each step", mixed))
    rows.append(("clock throttling (compute-bound part)", throttled - mixed))
    return rows


def prefill_chunk_spike(dep: Deployment, batch: int, context: int, chunk_tokens: int,
                        prompt_len: int, assume: st.StepAssumptions | None = None) -> float:
    """Seconds one decode step of ``batch`` sequences at ``context`` grows by when a
    ``chunk_tokens`` slice of a ``prompt_len``-token prompt lands in it (:func:`mixed_prefill_s`)."""
    dep = require(dep)
    chunk_tokens = integer("chunk_tokens", chunk_tokens, 0, unit="tokens")
    s = st.decode_step(dep, batch, context, assume)
    return mixed_prefill_s(dep, s, chunk_tokens, prompt_len)


def expert_load_imbalance(
    num_experts: int, experts_per_token: int, tokens: int, trials: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Tokens routed to the busiest expert vs the mean, under uniform top-k routing (Monte Carlo).

    Each token picks k distinct experts uniformly (rejection sampling when k <= E / 4, else the
    k smallest of E uniforms); per trial count tokens per expert. Returns
    mean load (tokens x k / E), the expected maximum, and their ratio: with expert
    parallelism the step waits for the busiest expert's GPU.
    """
    import numpy as np

    if num_experts < 1 or not 1 <= experts_per_token <= num_experts:
        raise ValueError(
            f"need 1 <= experts_per_token <= num_experts, got {experts_per_token}, {num_experts}"
        )
    if tokens < 1 or trials < 1:
        raise ValueError(f"tokens and trials must be >= 1, got {tokens}, {trials}")
    rng = np.random.default_rng(seed)
    k, e = experts_per_token, num_experts
    if k == e:
        picks = np.broadcast_to(np.arange(e), (trials, tokens, e))
    elif 4 * k <= e:
        # sparse top-k (e.g. 8 of 256): draw k with replacement and redraw any token whose draw
        # repeats an expert; accepted draws are uniform over distinct k-tuples, so uniform subsets
        picks = rng.integers(0, e, (trials * tokens, k))
        while True:
            srt = np.sort(picks, axis=1)
            bad = np.nonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))[0]
            if bad.size == 0:
                break
            picks[bad] = rng.integers(0, e, (bad.size, k))
    else:  # dense top-k (e.g. 2 of 8): the k smallest of E uniforms is a uniform k-subset
        picks = np.argpartition(rng.random((trials, tokens, e)), k, axis=2)[:, :, :k]
    rows = np.repeat(np.arange(trials), tokens * experts_per_token)
    flat = rows * num_experts + np.asarray(picks).reshape(-1)
    counts = np.bincount(flat, minlength=trials * num_experts).reshape(trials, num_experts)
    mean = tokens * experts_per_token / num_experts
    mx = float(counts.max(axis=1).mean())
    return {"mean": mean, "max": mx, "ratio": mx / mean}


def l2_resident_fraction(kernel_bytes: float, chip: str | GPU) -> float:
    """Fraction of a kernel's working set that fits in L2 (1.0 when it all fits).

    A microbenchmark that replays one kernel on the same buffers then reads from L2, not HBM.
    """
    g = gpu(chip)
    if not kernel_bytes > 0:
        raise ValueError(f"kernel_bytes must be > 0, got {kernel_bytes}")
    return min(1.0, g.l2_bytes / kernel_bytes)


# ---- the step as three Nsight Systems rows (CPU / GPU kernels / communication) -----------

TIMELINE_ROWS = ("cpu", "gpu", "comm")
TIMELINE_ROW_LABEL = {
    "cpu": "CPU / CUDA API",
    "gpu": "GPU kernels",
    "comm": "NCCL / memcpy + sync",
}
TIMELINE_LEDGER = (  # (key, row or None for the floor, label)
    ("floor", None, "bytes / datasheet bandwidth (the floor)"),
    ("below_roof", "gpu", "big kernels below the bandwidth roof"),
    ("big_fixed", "gpu", "start-up and drain of the big kernels"),
    ("tiny_kernels", "gpu", "tiny kernels (norms, rotary, KV write, activation, sampling)"),
    ("dependency_gaps", "gpu", "idle gaps between dependent kernels"),
    ("launch_bound", "cpu", "idle GPU waiting for the CPU's launch calls"),
    ("scheduler", "cpu", "scheduler work between steps (GPU idle)"),
    ("collectives", "comm", "all-reduce / all-gather kernels"),
    ("token_sync", "comm", "sampled tokens to the host: copy + sync (GPU idle)"),
)


@dataclass(frozen=True)
class Span:
    """One bar of a timeline row: ``kind`` says what it is (``launch``, ``sync``, ``scheduler``,
    ``gemm``, ``attention``, ``elementwise``, ``sampling``, ``collective``, ``memcpy``)."""

    name: str
    kind: str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class StepTimeline:
    """One decode step as the three rows of an Nsight Systems view, and a ledger that adds up to it.

    ``rows``: {"cpu" | "gpu" | "comm": tuple of :class:`Span`}; ``ledger``: seconds per key of
    :data:`TIMELINE_LEDGER` (the floor, then what each row adds), summing to ``trace.step_s``;
    ``event_bytes``: the bytes each kernel of ``trace.events`` moves (weights, KV, activations, logits);
    ``floor_bytes``: the weight and KV bytes this GPU reads per step (what the floor divides)."""

    trace: Trace
    rows: dict
    ledger: dict
    event_bytes: tuple
    floor_bytes: float
    bandwidth: float

    @property
    def step_s(self) -> float:
        return self.trace.step_s

    @property
    def achieved_fraction(self) -> float:
        """The step's achieved bandwidth over the datasheet: floor bytes / step time / W."""
        return self.floor_bytes / self.step_s / self.bandwidth

    def kernel_fraction(self, i: int) -> float:
        """Kernel i's own achieved bandwidth over the datasheet: its bytes / its duration / W."""
        e = self.trace.events[i]
        return self.event_bytes[i] / e.duration_s / self.bandwidth

    def big_kernel_fraction(self) -> float:
        """The GEMVs and attention together: their bytes / their summed durations / W (what the
        step would reach if nothing ran between them)."""
        big = [i for i, e in enumerate(self.trace.events) if e.category in ("gemm", "attention")]
        return (sum(self.event_bytes[i] for i in big)
                / sum(self.trace.events[i].duration_s for i in big) / self.bandwidth)

    def row_total_s(self, row: str) -> float:
        """Seconds of the ledger charged to one row (``cpu``, ``gpu`` or ``comm``)."""
        if row not in TIMELINE_ROWS:
            raise ValueError(f"row must be one of {', '.join(TIMELINE_ROWS)}; got {row!r}")
        return sum(self.ledger[k] for k, r, _ in TIMELINE_LEDGER if r == row)


def timeline_rows(dep: Deployment, batch: int = 1, context: int = 0,
                  assume: st.StepAssumptions | None = None) -> StepTimeline:
    """The decode step of :func:`decode_trace` laid out as Nsight Systems' three rows, with a
    ledger: floor + what each row adds = the step (seconds, exactly).

    * **CPU / CUDA API**: ``cudaStreamSynchronize`` waiting for the sampled tokens
      (``sampling_s``), the scheduler (``scheduler_s``), then the launches: eager, one
      ``cudaLaunchKernel`` per kernel, kernel i's call spanning
      [host_end + i x eager_launch_s, host_end + (i + 1) x eager_launch_s) (the step model's
      issue times); with CUDA graphs one ``cudaGraphLaunch`` at host_end (the model charges it
      no time: zero duration).
    * **GPU kernels**: every kernel that is not a collective.
    * **NCCL / memcpy + sync**: the collective kernels, and the device-to-host copy of the
      sampled tokens with its sync ([0, sampling_s)).

    Ledger: floor = (weight + KV bytes) / W; below_roof = the GEMV and attention durations less
    their fixed cost and the floor (achieved bandwidth, extra bytes such as the logits, any
    compute excess); big_fixed = ``kernel_fixed_s`` per GEMV and attention kernel; tiny_kernels
    = elementwise and sampling kernel durations; the idle time before each kernel splits into
    dependency_gaps (all of it under a CUDA graph; eager, up to ``launch_gap_s``, the gap a graph
    would still have) and launch_bound (the rest: the GPU waiting for an eager launch call); collectives = their durations;
    scheduler and token_sync = the host phase, GPU idle.
    """
    a = assume or st.step_assumptions()
    trace = decode_trace(dep, batch, context, a)
    dep = trace.step.deployment
    kernels = st.step_kernels(dep, trace.step.batch, trace.step.context, a)
    bw = dep.chip.memory_bandwidth
    host_end = trace.host_end_s
    ledger = dict.fromkeys(k for k, _, _ in TIMELINE_LEDGER)
    for k in ledger:
        ledger[k] = 0.0
    ledger["token_sync"], ledger["scheduler"] = a.sampling_s, a.scheduler_s
    cpu = [Span("cudaStreamSynchronize (sampled tokens)", "sync", 0.0, a.sampling_s),
           Span("scheduler: next batch", "scheduler", a.sampling_s, a.scheduler_s)]
    comm = [Span("D2H copy of sampled tokens + sync", "memcpy", 0.0, a.sampling_s)]
    gpu_row = []
    if dep.cuda_graphs:
        cpu.append(Span("cudaGraphLaunch", "launch", host_end, 0.0))
    event_bytes, floor_bytes = [], 0.0
    prev_end = host_end
    for i, (e, k) in enumerate(zip(trace.events, kernels, strict=True)):
        gap = e.start_s - prev_end
        # a graph replays back to back: all of its idle time is dependency; eager, past launch_gap_s it is the CPU
        dep_gap = gap if dep.cuda_graphs else min(gap, a.launch_gap_s if i else 0.0)
        ledger["dependency_gaps"] += dep_gap
        ledger["launch_bound"] += gap - dep_gap
        prev_end = e.end_s
        moved = k.weight_bytes + k.kv_bytes + k.other_bytes
        event_bytes.append(moved)
        if not dep.cuda_graphs:
            cpu.append(Span(f"cudaLaunchKernel {e.name}", "launch", host_end + i * a.eager_launch_s,
                            a.eager_launch_s))
        span = Span(e.name, e.category, e.start_s, e.duration_s)
        if e.category == "collective":
            ledger["collectives"] += e.duration_s
            comm.append(span)
            continue
        gpu_row.append(span)
        if e.category in ("gemm", "attention"):
            floor = (k.weight_bytes + k.kv_bytes) / bw
            floor_bytes += k.weight_bytes + k.kv_bytes
            ledger["floor"] += floor
            ledger["big_fixed"] += a.kernel_fixed_s
            ledger["below_roof"] += e.duration_s - a.kernel_fixed_s - floor
        else:
            ledger["tiny_kernels"] += e.duration_s
    rows = {"cpu": tuple(cpu), "gpu": tuple(gpu_row), "comm": tuple(comm)}
    return StepTimeline(trace, rows, ledger, tuple(event_bytes), floor_bytes, bw)


def launch_rates(timeline: StepTimeline, assume: st.StepAssumptions | None = None) -> dict[str, float]:
    """Whether an eager CPU keeps up with the GPU, kernels per second:

    ``cpu_issue`` = 1 / eager_launch_s (what the CPU can issue); ``gpu_consume`` = kernels /
    (summed kernel durations + the dependency gaps) (what the GPU would retire if never starved);
    ``short_kernels`` = how many kernels last less than one eager launch (each exposes the CPU)."""
    a = assume or st.step_assumptions()
    ev = timeline.trace.events
    busy = sum(e.duration_s for e in ev) + timeline.ledger["dependency_gaps"]
    return {"cpu_issue": 1.0 / a.eager_launch_s, "gpu_consume": len(ev) / busy,
            "short_kernels": float(sum(e.duration_s < a.eager_launch_s for e in ev)),
            "kernels": float(len(ev))}
