"""The decode step: the one model of how long a decode step takes on a Deployment.

A step runs ``batch`` sequences forward by one token, each attending to ``context`` cached
tokens. It is built as the timeline a profiler would show on one GPU of each stage, stages
one after the other (with pipeline parallelism a token passes every stage in turn, so the
step is that latency; a stage's GPU holds 1 / pp of the layers, and ``weight_bytes_per_gpu``
says so):

1. **Host phase**: ``sampling_us + scheduler_us`` of CPU work on the critical path (returning
   the sampled tokens, building the next batch) while the GPU idles.
2. **Kernels**, in execution order (per layer: norm, QKV GEMM, rotary, KV write, attention,
   O GEMM, all-reduce, norm, gate/up GEMM, activation, down GEMM, all-reduce; once per step:
   embedding, final norm, LM head, logits all-gather, sampling; between pipeline stages a
   peer-to-peer send of the activations). Each kernel lasts
   ``kernel_fixed + max(bytes / (W x eff), FLOPs / (P x matmul_eff))``: the per-kernel
   roofline, so a weight read and the GEMM that consumes it overlap (max, not sum). Weight
   GEMMs stream at ``gemv_bandwidth_efficiency``, attention reads the KV cache at
   ``attention_kv_bandwidth_efficiency``. Collectives come from :mod:`lib.perf.collectives`
   (the vendor's link, hierarchical across nodes).
3. **Launches**: with CUDA graphs the GPU idles ``launch_gap_us`` between kernels. Eager, the
   CPU issues kernel i at ``host_end + (i + 1) x eager_launch_us`` and the GPU starts it at
   ``max(previous end + launch_gap, issue time)``: long kernels hide the launch cost, runs of
   short ones expose it. Only what the GPU cannot hide is charged.

The step is then attributed to buckets that add up to it exactly: the read floor (weights,
KV cache at datasheet bandwidth), the bandwidth shortfall of each, compute beyond memory,
fixed per-kernel time, launch gaps, collective latency and bandwidth, host time. Every
constant comes from ``data/assumptions.yaml`` (``decode_step``) unless overridden.
SI units: bytes, FLOP, seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.perf import collectives
from lib.perf.deployment import Deployment, require
from lib.perf.moe import expected_experts_touched
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.units import US

BUCKETS = (
    "weights",
    "kv_cache",
    "weight_bandwidth_shortfall",
    "kv_bandwidth_shortfall",
    "compute_excess",
    "kernel_fixed",
    "launch_gaps",
    "allreduce_latency",
    "allreduce_bandwidth",
    "sampling",
    "scheduler",
)
LOGIT_BYTES = 4.0  # logits are produced and sampled in FP32


@dataclass(frozen=True)
class StepAssumptions:
    """What a decode step costs beyond the model, chip and workload. SI units; see the yaml."""

    gemv_efficiency: float
    kv_efficiency: float
    matmul_efficiency: float
    kernel_fixed_s: float
    launch_gap_s: float
    eager_launch_s: float
    sampling_s: float
    scheduler_s: float
    sampling_kernels: int
    allreduce_algorithm: str = "ring"

    def __post_init__(self) -> None:
        for name in ("gemv_efficiency", "kv_efficiency", "matmul_efficiency"):
            fraction(name, getattr(self, name), allow_zero=False)
        for name in ("kernel_fixed_s", "launch_gap_s", "eager_launch_s", "sampling_s", "scheduler_s"):
            real(name, getattr(self, name), 0, unit="seconds")
        object.__setattr__(self, "sampling_kernels", integer("sampling_kernels", self.sampling_kernels, 0))
        if self.allreduce_algorithm not in collectives.ALGORITHMS:
            raise ValueError(
                f"allreduce_algorithm must be one of {', '.join(collectives.ALGORITHMS)}; "
                f"got {self.allreduce_algorithm!r}"
            )

    def replace(self, **changes) -> StepAssumptions:
        """A validated copy with some fields changed."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown step assumption(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


_YAML = {  # field -> (key under decode_step, scale to SI, which end of the range is fast)
    "gemv_efficiency": ("gemv_bandwidth_efficiency", 1.0, "high"),
    "kv_efficiency": ("attention_kv_bandwidth_efficiency", 1.0, "high"),
    "matmul_efficiency": ("matmul_flops_efficiency", 1.0, "high"),
    "kernel_fixed_s": ("kernel_fixed_us", US, "low"),
    "launch_gap_s": ("launch_gap_us", US, "low"),
    "eager_launch_s": ("eager_launch_us", US, "low"),
    "sampling_s": ("sampling_us", US, "low"),
    "scheduler_s": ("scheduler_us", US, "low"),
}
LEVELS = ("optimistic", "central", "pessimistic")


@functools.cache
def _level_values(level: str) -> tuple:
    """The data's values for one level, SI (read once: every decode step starts here)."""
    values = {}
    for field, (key, scale, fast) in _YAML.items():
        path = f"decode_step.{key}"
        lo, hi = assumptions.value_range(path)
        slow = "low" if fast == "high" else "high"
        end = {"central": None, "optimistic": fast, "pessimistic": slow}[level]
        v = assumptions.value(path) if end is None else {"low": lo, "high": hi}[end]
        values[field] = v * scale
    values["sampling_kernels"] = assumptions.value("decode_step.sampling_kernels")
    values["allreduce_algorithm"] = "auto" if level == "optimistic" else "ring"
    return tuple(values.items())


def step_assumptions(level: str = "central", **overrides) -> StepAssumptions:
    """Step assumptions from ``data/assumptions.yaml``: ``central`` values (NCCL ring all-reduce),
    or the fast (``optimistic``: each all-reduce also takes its fastest algorithm, one-shot for
    small messages) or slow (``pessimistic``) end of every range.
    Keyword arguments set single fields (None keeps the data value)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}; got {level!r}")
    values = dict(_level_values(level))
    unknown = set(overrides) - set(values)
    if unknown:
        raise ValueError(f"unknown step assumption(s) {sorted(unknown)}; valid: {sorted(values)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return StepAssumptions(**values)


# ---- the kernels of one step -----------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One launch on one GPU: what it moves and computes, and how long it runs (seconds)."""

    name: str
    category: str  # gemm | attention | small | collective | sampling
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    other_bytes: float = 0.0
    flops: float = 0.0
    collective_latency_s: float = 0.0
    collective_bandwidth_s: float = 0.0


def kv_read_fraction(dep: Deployment) -> float:
    """Share of each token's KV one GPU reads: 1 / tp up to the KV heads (then 1 / KV heads,
    replicated), 1 for MLA's latent; divided by ``dcp`` when decode context parallelism
    splits the replicated copies."""
    return dep.mdl.kv_share_per_rank(dep.tp) / dep.dcp


def _layer_kernels(dep: Deployment, batch: int, context: int, moe_layer: bool,
                   a: StepAssumptions, query_tokens: int = 1) -> list[Kernel]:
    m, tp = dep.mdl, dep.tp
    b_w, b_a = bytes_per_element(dep.weight_dtype), bytes_per_element(dep.act_dtype)
    q = query_tokens
    B, d = batch * q, m.hidden_size  # B: tokens through the weight GEMMs (q per sequence)
    att = m.attention_params_per_layer()
    o_params = m.num_attention_heads * (m.v_head_dim if m.is_mla else m.head_dim) * d
    # each sequence's cached KV is read once for all q query tokens; query j also sees the j before it
    kv_layer = batch * context * m.kv_bytes_per_token(dep.kv_dtype) / m.num_layers * kv_read_fraction(dep)
    att_flops = batch * sum(m.attention_flops_per_token(context + j) for j in range(q)) / m.num_layers / tp
    msg = B * d * b_a
    out = [
        Kernel("norm", "small"),
        Kernel("qkv_proj", "gemm", weight_bytes=(att - o_params) * b_w / tp, flops=2 * B * (att - o_params) / tp),
        Kernel("rotary", "small"),
        Kernel("kv_write", "small"),
        Kernel("attention", "attention", kv_bytes=kv_layer, flops=att_flops),
        Kernel("o_proj", "gemm", weight_bytes=o_params * b_w / tp, flops=2 * B * o_params / tp),
    ]
    ar = _collective(dep, "all_reduce", msg, a) if tp > 1 else None
    if ar:
        out.append(ar)
    out.append(Kernel("norm", "small"))
    if moe_layer:
        per_expert = m._ffn_params(m.expert_intermediate_size)
        touched = expected_experts_touched(m.num_experts, m.experts_per_token, B)
        router = m.hidden_size * m.num_experts
        read = ((touched + m.shared_experts) * per_expert + router) * b_w / tp
        used = 2 * B * ((m.experts_per_token + m.shared_experts) * per_expert + router) / tp
        out.append(Kernel("experts_gate_up", "gemm", weight_bytes=read * 2 / 3, flops=used * 2 / 3))
        out.append(Kernel("activation", "small"))
        out.append(Kernel("experts_down", "gemm", weight_bytes=read / 3, flops=used / 3))
    else:
        ffn = m._ffn_params(m.intermediate_size)
        up = 2 / 3 if m.mlp != "gelu_2matrix" else 1 / 2
        out.append(Kernel("gate_up_proj", "gemm", weight_bytes=ffn * up * b_w / tp, flops=2 * B * ffn * up / tp))
        out.append(Kernel("activation", "small"))
        out.append(Kernel("down_proj", "gemm", weight_bytes=ffn * (1 - up) * b_w / tp,
                          flops=2 * B * ffn * (1 - up) / tp))
    if ar:
        out.append(ar)
    return out


def _collective(dep: Deployment, kind: str, message: float, a: StepAssumptions,
                tag: str = "") -> Kernel:
    """One collective over the TP group (all-reduces take the assumed algorithm)."""
    algo = a.allreduce_algorithm if kind == "all_reduce" else "ring"
    c = collectives.collective(kind, message, dep.tp, dep.chip, algo)
    return Kernel(f"{kind}{'_' + tag if tag else ''}", "collective",
                  collective_latency_s=c.latency_s, collective_bandwidth_s=c.bandwidth_s)


def _stage_send(dep: Deployment, message: float) -> Kernel:
    """A pipeline stage hands ``message`` bytes to the next (:func:`lib.perf.collectives.send`;
    over the network when the replica is larger than a node)."""
    across = dep.tp * dep.pp > collectives.gpus_per_node(chip=dep.chip)
    c = collectives.send(message, dep.chip, across)
    return Kernel("pp_send", "collective", collective_latency_s=c.latency_s,
                  collective_bandwidth_s=c.bandwidth_s)


def _step_plan(dep: Deployment, batch: int, context: int, a: StepAssumptions,
               query_tokens: int) -> tuple[list[Kernel], list[int]]:
    """The distinct kernels of one step and the order they launch in (indices into the first list):
    the layers repeat the same few kernels, so they are built and priced once."""
    m, tp = dep.mdl, dep.tp
    b_a, b_w = bytes_per_element(dep.act_dtype), bytes_per_element(dep.weight_dtype)
    B, V, d = batch * query_tokens, m.vocab_size, m.hidden_size
    distinct: list[Kernel] = []

    def add(kernels: list[Kernel]) -> list[int]:
        distinct.extend(kernels)
        return list(range(len(distinct) - len(kernels), len(distinct)))

    order = add([Kernel("embedding", "small", other_bytes=B * d * b_a)])
    dense = add(_layer_kernels(dep, batch, context, False, a, query_tokens))
    moe = add(_layer_kernels(dep, batch, context, True, a, query_tokens)) if m.is_moe else dense
    send = add([_stage_send(dep, B * d * b_a)]) if dep.pp > 1 else []
    per_stage = -(-m.num_layers // dep.pp)
    for layer in range(m.num_layers):
        if layer and layer % per_stage == 0:  # the activations move to the next stage's GPUs
            order += send
        order += moe if (m.is_moe and layer >= m.first_dense_layers) else dense
    tail = [Kernel("final_norm", "small"),
            Kernel("lm_head", "gemm", weight_bytes=V * d * b_w / tp, flops=2 * B * V * d / tp,
                   other_bytes=B * V * LOGIT_BYTES / tp)]
    if tp > 1:
        tail.append(_collective(dep, "all_gather", B * V * LOGIT_BYTES, a, tag="logits"))
    order += add(tail)
    order += add([Kernel("sampling", "sampling", other_bytes=B * V * LOGIT_BYTES)]) * a.sampling_kernels
    return distinct, order


def step_kernels(dep: Deployment, batch: int, context: int,
                 a: StepAssumptions | None = None, query_tokens: int = 1) -> list[Kernel]:
    """Every launch of one decode step on one GPU, in execution order (``query_tokens`` per
    sequence: 1 plain, k + 1 when k drafted tokens are verified)."""
    distinct, order = _step_plan(dep, batch, context, a or step_assumptions(), query_tokens)
    return [distinct[i] for i in order]


# ---- the step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeStep:
    """One decode step on one GPU of ``deployment``: buckets (seconds) that add up to ``total_s``."""

    deployment: Deployment
    batch: int
    context: int
    buckets: dict
    n_kernels: int
    n_collectives: int
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    kv_copies: float  # GPUs holding each KV byte (1 when split; > 1 when replicated)
    events: tuple = ()  # (name, category, start_s, duration_s) per launch, host phase first
    query_tokens: int = 1  # tokens per sequence through the step (k + 1 when verifying k drafts)

    def __getitem__(self, name: str) -> float:
        return self.buckets[name]

    @property
    def total_s(self) -> float:
        return sum(self.buckets.values())

    @property
    def floor_s(self) -> float:
        """Bytes this GPU reads / datasheet bandwidth: the read floor."""
        return self.buckets["weights"] + self.buckets["kv_cache"]

    @property
    def mbu_floor_s(self) -> float:
        """The MBU = 100% step: each KV byte counted once across the group."""
        return self.buckets["weights"] + self.buckets["kv_cache"] / self.kv_copies

    @property
    def mbu(self) -> float:
        """Model bandwidth utilization: unique bytes at datasheet bandwidth / step time."""
        return self.mbu_floor_s / self.total_s

    @property
    def collective_s(self) -> float:
        return self.buckets["allreduce_latency"] + self.buckets["allreduce_bandwidth"]

    allreduce_s = collective_s

    @property
    def kernel_overhead_s(self) -> float:
        """Fixed per-kernel time plus launch gaps: the per-kernel tax."""
        return self.buckets["kernel_fixed"] + self.buckets["launch_gaps"]

    @property
    def host_s(self) -> float:
        return self.buckets["sampling"] + self.buckets["scheduler"]

    @property
    def sharded_s(self) -> float:
        """The reads and their shortfall: what shrinks as tp grows."""
        b = self.buckets
        return b["weights"] + b["kv_cache"] + b["weight_bandwidth_shortfall"] + b["kv_bandwidth_shortfall"]

    @property
    def fixed_s(self) -> float:
        """Everything that does not shrink with tp."""
        return self.total_s - self.sharded_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the replica: batch / step time (one token per sequence;
        a verification step's expected yield is :mod:`lib.decoding.speculative`'s business)."""
        return self.batch / self.total_s


def kernel_time_s(fixed_s: float, *pipe_s: float) -> float:
    """One kernel's duration in the book's step model: its fixed cost (the grid's start, first DRAM
    round trip and drain, ``kernel_fixed_s``) plus the slowest of its pipes, which overlap (memory at
    the achievable bandwidth, tensor or vector math, special functions). Seconds. Every kernel time
    in lib (the decode step, the row-wise and benchmarked kernels of lib.kernels) is this sum."""
    return fixed_s + max(pipe_s, default=0.0)


def kernel_start(prev_end_s: float, cpu_s: float, first: bool, cuda_graphs: bool,
                 a: StepAssumptions) -> tuple[float, float]:
    """The launch rule of one stream of dependent kernels: a kernel starts ``launch_gap_s`` after the
    previous one ends (the first at once); eager, the CPU issues it ``eager_launch_s`` after its
    previous issue (``cpu_s``) and it cannot start earlier, so short kernels wait for the CPU.
    Returns (start, the CPU's clock after this issue), seconds."""
    start = prev_end_s + (0.0 if first else a.launch_gap_s)
    if not cuda_graphs:
        cpu_s += a.eager_launch_s
        start = max(start, cpu_s)
    return start, cpu_s


def launch_starts(durations_s, host_end_s: float, cuda_graphs: bool, a: StepAssumptions):
    """Start time of every kernel of one dependent stream under :func:`kernel_start`'s rule, seconds,
    in closed form: with A_i the sum of (duration + launch_gap) of the kernels before i and c_i the
    CPU's issue time (eager: host_end + (i + 1) x eager_launch; graphs: none), start_i =
    A_i + max over j <= i of (c_j - A_j), the first kernel starting at max(host_end, c_0)."""
    d = np.asarray(durations_s, dtype=float)
    a_sum = np.concatenate([[0.0], np.cumsum(d[:-1] + a.launch_gap_s)])
    issue = np.full(d.size, -np.inf)
    if not cuda_graphs:
        issue = host_end_s + a.eager_launch_s * np.arange(1, d.size + 1)
    issue[0] = max(host_end_s, issue[0])
    return a_sum + np.maximum.accumulate(issue - a_sum)


def decode_step(dep: Deployment, batch: int = 1, context: int = 0,
                assume: StepAssumptions | None = None, timeline: bool = False,
                query_tokens: int = 1) -> DecodeStep:
    """Model one decode step of ``batch`` sequences at ``context`` cached tokens (see module doc).

    ``assume``: :func:`step_assumptions` (default central values); CUDA graphs on or off is the
    deployment's ``cuda_graphs``. ``timeline=True`` keeps every launch in ``events``.
    ``query_tokens`` (q): tokens per sequence in the step, 1 for plain decode, k + 1 to verify k
    drafted tokens. The weights and each sequence's cached KV are read once for all q; GEMM FLOPs,
    activations, all-reduce messages, logits and sampling scale with batch x q; attention FLOPs are
    those of q queries at ``context``, ``context + 1``, ... ``context + q - 1`` keys.
    """
    require(dep)
    batch = integer("batch", batch, 1, unit="sequences")
    query_tokens = integer("query_tokens", query_tokens, 1, 64, unit="tokens per sequence")
    context = dep.mdl.check_context(context)
    dep.mdl.check_context(context + query_tokens - 1, "context + query_tokens - 1")
    a = assume or step_assumptions()
    g = dep.chip
    bw = g.memory_bandwidth
    peak = g.peak_flops(dep.compute_dtype) * a.matmul_efficiency
    b = dict.fromkeys(BUCKETS, 0.0)
    b["sampling"], b["scheduler"] = a.sampling_s, a.scheduler_s
    host_end = a.sampling_s + a.scheduler_s
    distinct, plan = _step_plan(dep, batch, context, a, query_tokens)
    order = np.asarray(plan, dtype=np.intp)
    counts = np.bincount(order, minlength=len(distinct))
    col = {name: i for i, name in enumerate(BUCKETS)}
    per = np.zeros((len(distinct), len(BUCKETS)))  # bucket seconds of one launch of each kernel
    dur = np.empty(len(distinct))
    moved = np.zeros((len(distinct), 2))  # weight and KV bytes of one launch
    for j, k in enumerate(distinct):
        if k.category == "collective":
            dur[j] = k.collective_latency_s + k.collective_bandwidth_s
            per[j, col["allreduce_latency"]] = k.collective_latency_s
            per[j, col["allreduce_bandwidth"]] = k.collective_bandwidth_s
            continue
        eff = a.kv_efficiency if k.category == "attention" else a.gemv_efficiency
        floor_w, floor_kv = k.weight_bytes / bw, k.kv_bytes / bw
        mem = (k.weight_bytes + k.kv_bytes + k.other_bytes) / (bw * eff)
        comp = k.flops / peak
        dur[j] = kernel_time_s(a.kernel_fixed_s, mem, comp)
        per[j, col["weights"]] = floor_w
        per[j, col["kv_cache"]] = floor_kv
        short = "kv_bandwidth_shortfall" if k.category == "attention" else "weight_bandwidth_shortfall"
        per[j, col[short]] = mem - floor_w - floor_kv
        per[j, col["compute_excess"]] = max(0.0, comp - mem)
        per[j, col["kernel_fixed"]] = a.kernel_fixed_s
        moved[j] = k.weight_bytes, k.kv_bytes
    # correctly rounded sums: the same step always gives the same bits, whatever numpy's summation order
    for c, name in enumerate(BUCKETS):
        if name not in ("sampling", "scheduler", "launch_gaps"):
            b[name] = math.fsum(int(n) * x for n, x in zip(counts, per[:, c], strict=True))
    n_coll = int(counts[[j for j, k in enumerate(distinct) if k.category == "collective"]].sum())
    w_bytes, kv_bytes = (math.fsum(int(n) * x for n, x in zip(counts, moved[:, c], strict=True)) for c in (0, 1))
    d = dur[order]
    starts = launch_starts(d, host_end, dep.cuda_graphs, a)
    if dep.cuda_graphs:  # every kernel after the first waits exactly one launch gap
        b["launch_gaps"] = (len(plan) - 1) * a.launch_gap_s
    else:
        b["launch_gaps"] = math.fsum(starts[1:] - (starts[:-1] + d[:-1])) + (starts[0] - host_end)
    events = None
    if timeline:
        events = [("host", "host", 0.0, host_end)] + [
            (distinct[i].name, distinct[i].category, float(t), float(x))
            for i, t, x in zip(plan, starts, d, strict=True)]
    n_kernels = len(plan)
    copies = kv_read_fraction(dep) * dep.tp  # ranks holding each KV byte (DCP splits the copies)
    return DecodeStep(dep, batch, context, b, n_kernels, n_coll, w_bytes / dep.pp, kv_bytes / dep.pp,
                      max(copies, 1.0), tuple(events) if timeline else (), query_tokens)
