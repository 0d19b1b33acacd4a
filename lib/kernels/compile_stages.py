"""torch.compile's stages on a decode MLP block: the kernels each stage launches, what a call costs on the
GPU and on the host, and the three ways the gain is given back (a graph break, recompilation, inputs a
CUDA graph must copy). N005.

**The block** (:func:`mlp_block`): x -> RMSNorm (in fp32) -> SwiGLU (w1, w3: d -> f; w2: f -> d) -> + x, at
``batch`` rows, as the list of aten operations Dynamo and AOTAutograd capture (the unit tests compare it with
a real trace). ``graph_break=True`` adds the data-dependent check ``if float(scale.max()) > 1e6`` after the
norm's rsqrt: a ``max`` and a ``.item()`` that ends the first graph.

**Kernels.** Eager (:func:`eager_kernels`) launches one kernel per operation. Inductor (:func:`inductor_kernels`)
keeps each matmul an extern cuBLAS call; folds an ``add`` of a matmul's output and a same-shaped tensor into
that call as ``addmm`` when nothing pointwise consumes the sum (its post-grad pattern; the bias is copied into
the output first); and merges every other operation into the kernel of the operations it reads from
(producer to consumer), except that a reduction of an already reduced value starts a new kernel. Each merged
group is one Triton kernel that reads what comes from outside it and writes what leaves it; its name follows
Inductor's (``triton_{poi|red|per}_fused_`` + the sorted op names). A graph break is a wall: nothing fuses
across it, and what the second graph needs the first writes to memory.

**Time of one kernel** is the step model's rule (:func:`lib.perf.step.kernel_time_s`): fixed cost +
max(bytes / (HBM bandwidth x streaming efficiency), FLOPs / (peak x matmul efficiency)).

**Time of one call** (:func:`call_period_s`): calls run back to back; each graph costs the host
``entry_s`` to enter (nothing eager, :func:`compiled_call_s` compiled) and ``eager_launch_s`` per host launch
(one per kernel, one per CUDA-graph replay); the GPU runs each kernel by the step model's launch rule
(:func:`lib.perf.step.kernel_start`); a ``.item()`` stops the host until the GPU has drained and the scalar
has come back (:func:`sync_s`). The steady-state period is max(host work, GPU work) when nothing syncs, and
the two add where a sync serializes them. Stages (:data:`STAGES`): eager; eager replayed from one CUDA graph
(the launch-free floor of the eager kernels); Inductor; Inductor under ``mode="reduce-overhead"``, which
first copies every input that is not static into the graph's buffers (closure tensors are not static:
:func:`copied_input_bytes`).

**Recompilation** (:func:`compile_events`): Dynamo's cache per function, keyed by the guarded input shapes,
for ``dynamic=False`` (one entry per shape), ``None`` ("auto": the first shape static, the second distinct
one recompiles with the dimension dynamic) and ``True``; sizes 0 and 1 are always specialized; past
``compile_stages.recompile_limit`` entries a new shape runs eagerly.

:func:`trace_demo` runs the real thing on the CPU on a small block (imports torch): Dynamo's graphs, guards
and break reasons, AOTAutograd's forward and backward graphs, the static inputs CUDA graphs would keep, and
recompiles counted by a recording backend. Units: bytes, FLOPs, seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu
from lib.units import US

__all__ = [
    "CALIBRATIONS",
    "DTYPES",
    "DYNAMIC",
    "STAGES",
    "STAGE_LABELS",
    "WEIGHTS",
    "Block",
    "Calibration",
    "CompileStages",
    "Kernel",
    "Op",
    "Segment",
    "StageCost",
    "Tensor",
    "TraceDemo",
    "block_for_model",
    "calibration",
    "call_period_s",
    "compile_events",
    "compile_stages",
    "compiled_call_s",
    "copied_input_bytes",
    "eager_kernels",
    "inductor_kernels",
    "kernel_pipes",
    "kernel_s",
    "MEASURED_SETUP",
    "is_measured_setup",
    "measured_call_s",
    "measured_gemv_efficiency",
    "measured_recompile_s",
    "mlp_block",
    "recompile_limit",
    "stage_cost",
    "sync_s",
    "trace_demo",
]

DTYPES = ("bf16", "fp16", "fp32")
"""Storage dtypes of the block's activations and weights (the norm always runs in fp32)."""
STAGES = ("eager", "eager_graph", "inductor", "reduce_overhead")
STAGE_LABELS = {"eager": "eager", "eager_graph": "eager kernels in one CUDA graph",
                "inductor": "torch.compile (Inductor)", "reduce_overhead": 'mode="reduce-overhead"'}
WEIGHTS = ("parameters", "closure")
"""How the block holds its weights: nn.Parameters of a module (static for CUDA graphs) or tensors a
function closes over (inputs from eager: copied before every replay)."""
CALIBRATIONS = ("book", "h200-measured")
"""Where the launch and bandwidth constants come from: the book's assumptions (any GPU) or the H200
measurement (data/measured-h200.yaml)."""
DYNAMIC = ("false", "auto", "true")
"""torch.compile's ``dynamic=False``, ``None`` (automatic dynamic shapes) and ``True``."""
EPS = 1e-6  # the norm's epsilon (only its presence matters here)
PERSISTENT_REDUCTION = 1024  # Inductor keeps a reduction of at most this many elements in one block ("per")


def _choice(name: str, value: str, options: Sequence[str]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {value!r}")
    return value


# ---- the block as the graph Dynamo captures ----------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """A 2-D tensor of the block: ``rows`` x ``cols`` elements of ``dtype``."""

    name: str
    rows: int
    cols: int
    dtype: str

    @property
    def bytes(self) -> float:
        return float(self.rows * self.cols * bytes_per_element(self.dtype))


@dataclass(frozen=True)
class Op:
    """One aten operation: its target (as the FX graph names it), what kind of kernel it is, the tensors it
    reads and the tensor it writes, and the graph it belongs to (1 after a graph break)."""

    target: str
    kind: str  # pointwise | reduction | matmul | sync
    inputs: tuple[str, ...]
    out: Tensor
    graph: int = 0

    @property
    def name(self) -> str:
        return self.out.name


@dataclass(frozen=True)
class Block:
    """The decode MLP block (module docstring): graph inputs and the operations in execution order."""

    d: int
    f: int
    batch: int
    dtype: str
    graph_break: bool
    inputs: tuple[Tensor, ...]
    ops: tuple[Op, ...]

    WEIGHT_NAMES = ("g", "w1", "w3", "w2")

    def tensor(self, name: str) -> Tensor:
        for t in self.inputs:
            if t.name == name:
                return t
        for op in self.ops:
            if op.name == name:
                return op.out
        raise ValueError(f"the block has no tensor {name!r}")

    def producer(self, name: str) -> Op | None:
        return next((op for op in self.ops if op.name == name), None)

    def consumers(self, name: str) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if name in op.inputs)

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights (the norm's gain and the three projections): what one call must read."""
        return sum(self.tensor(n).bytes for n in self.WEIGHT_NAMES)

    @property
    def output(self) -> str:
        return self.ops[-1].name

    @property
    def graphs(self) -> int:
        return 1 + max(op.graph for op in self.ops)

    @property
    def compute_ops(self) -> tuple[Op, ...]:
        """The operations that launch a kernel (every one but the ``.item()``)."""
        return tuple(op for op in self.ops if op.kind != "sync")

    @property
    def matmul_flops(self) -> float:
        return sum(_flops(self, op) for op in self.ops)


def mlp_block(d: int, f: int, batch: int, dtype: str = "bf16", graph_break: bool = False) -> Block:
    """The block at hidden size ``d``, intermediate size ``f`` and ``batch`` rows (module docstring). In
    fp32 the two dtype conversions are no-ops and launch nothing."""
    d = integer("d", d, 1, 1 << 17, unit="hidden size")
    f = integer("f", f, 1, 1 << 19, unit="intermediate size")
    b = integer("batch", batch, 1, 1 << 16, unit="rows")
    dt = _choice("dtype", dtype, DTYPES)
    inputs = (Tensor("x", b, d, dt), Tensor("g", 1, d, dt), Tensor("w1", f, d, dt), Tensor("w3", f, d, dt),
              Tensor("w2", d, f, dt))
    ops: list[Op] = []
    graph = 0

    def add(name, target, kind, ins, rows, cols, out_dtype):
        ops.append(Op(target, kind, tuple(ins), Tensor(name, rows, cols, out_dtype), graph))
        return name

    h = "x" if dt == "fp32" else add("h", "_to_copy", "pointwise", ["x"], b, d, "fp32")  # x.float()
    sq = add("sq", "pow", "pointwise", [h], b, d, "fp32")
    ms = add("ms", "mean", "reduction", [sq], b, 1, "fp32")
    mse = add("ms_eps", "add", "pointwise", [ms], b, 1, "fp32")
    r = add("r", "rsqrt", "pointwise", [mse], b, 1, "fp32")
    if graph_break:  # if float(scale.max()) > 1e6: ... (the branch is not taken)
        mx = add("r_max", "max", "reduction", [r], 1, 1, "fp32")
        add("r_max_host", "item", "sync", [mx], 1, 1, "fp32")
        graph = 1
    hn = add("hn", "mul", "pointwise", [h, r], b, d, "fp32")
    hb = hn if dt == "fp32" else add("hb", "_to_copy", "pointwise", [hn], b, d, dt)
    hg = add("hg", "mul", "pointwise", [hb, "g"], b, d, dt)
    a = add("gate", "mm", "matmul", [hg, "w1"], b, f, dt)
    s = add("gate_silu", "silu", "pointwise", [a], b, f, dt)
    c = add("up", "mm", "matmul", [hg, "w3"], b, f, dt)
    u = add("u", "mul", "pointwise", [s, c], b, f, dt)
    dn = add("down", "mm", "matmul", [u, "w2"], b, d, dt)
    add("out", "add", "pointwise", ["x", dn], b, d, dt)
    return Block(d, f, b, dt, bool(graph_break), inputs, tuple(ops))


def block_for_model(mdl, batch: int, dtype: str = "bf16", graph_break: bool = False) -> Block:
    """:func:`mlp_block` with the MLP shape of a dense SwiGLU model (:func:`lib.perf.decode_kernels.gemm_shapes`:
    d = the gate/up projection's K, f = half its N)."""
    from lib.perf.decode_kernels import gemm_shapes
    from lib.registry.models import model

    m = model(mdl)
    if m.is_moe:
        raise ValueError(f"{m.key} is a mixture of experts; the block is one dense MLP: choose a dense model")
    if m.mlp != "swiglu":
        raise ValueError(f"the block is a SwiGLU MLP; {m.key} has a {m.mlp} MLP: choose a SwiGLU model")
    k, n, _ = gemm_shapes(m, 1)["gate_up_proj"]
    return mlp_block(int(k), int(n) // 2, batch, dtype, graph_break)


def _flops(block: Block, op: Op) -> float:
    if op.kind != "matmul":
        return 0.0
    a, w = (block.tensor(n) for n in op.inputs)
    return 2.0 * a.rows * a.cols * w.rows


# ---- kernels ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One thing the GPU runs for the block: ``kind`` aten (an eager op), triton (an Inductor kernel),
    cublas (a matmul), copy (a device-to-device copy the host issues) or sync (a ``.item()``: no GPU work,
    the host waits). Bytes it reads and writes in HBM, FLOPs, the graph it belongs to."""

    name: str
    kind: str
    ops: tuple[str, ...]
    read_bytes: float
    write_bytes: float
    flops: float = 0.0
    graph: int = 0

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def is_kernel(self) -> bool:
        """Counted as a kernel by a profiler (copies and the sync are memcpy events, not kernels)."""
        return self.kind in ("aten", "triton", "cublas")


def eager_kernels(block: Block) -> tuple[Kernel, ...]:
    """One kernel per operation, reading every input and writing its output (the ``.item()`` is a sync)."""
    out = []
    for op in block.ops:
        if op.kind == "sync":
            out.append(Kernel(f"{op.target} (device to host, host waits)", "sync", (op.name,), 0.0, 0.0, 0.0, op.graph))
            continue
        reads = sum(block.tensor(n).bytes for n in op.inputs)
        kind = "cublas" if op.kind == "matmul" else "aten"
        name = f"cuBLAS mm ({op.inputs[1]})" if op.kind == "matmul" else f"aten {op.target}"
        out.append(Kernel(name, kind, (op.name,), reads, op.out.bytes, _flops(block, op), op.graph))
    return tuple(out)


def _addmm_folds(block: Block) -> dict[str, tuple[str, str]]:
    """{add op name: (matmul op name, bias tensor)} for every add Inductor folds into the matmul before it."""
    folds = {}
    for op in block.ops:
        if op.target != "add" or len(op.inputs) != 2:
            continue
        for i, name in enumerate(op.inputs):
            mm = block.producer(name)
            other = op.inputs[1 - i]
            if mm is None or mm.kind != "matmul" or mm.graph != op.graph:
                continue
            bias = block.tensor(other)
            same = (bias.rows, bias.cols, bias.dtype) == (mm.out.rows, mm.out.cols, mm.out.dtype)
            pointwise_use = any(c.kind == "pointwise" for c in block.consumers(op.name))
            if same and not pointwise_use and len(block.consumers(mm.name)) == 1:
                folds[op.name] = (mm.name, other)
                break
    return folds


def inductor_kernels(block: Block) -> tuple[Kernel, ...]:
    """Inductor's kernels for the block, graph by graph (module docstring): extern matmuls (an add folded in
    as addmm, its bias copied first), Triton kernels for the merged pointwise and reduction groups, and the
    sync of a graph break."""
    folds = _addmm_folds(block)
    folded_into = {mm: (add, bias) for add, (mm, bias) in folds.items()}
    parent: dict[str, str] = {}
    has_reduction: dict[str, bool] = {}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    fusible = [op for op in block.ops if op.kind in ("pointwise", "reduction") and op.name not in folds]
    names = {op.name for op in fusible}
    for op in fusible:
        parent[op.name] = op.name
        has_reduction[op.name] = op.kind == "reduction"
        for src in op.inputs:
            prod = block.producer(src)
            if src not in names or prod.graph != op.graph:
                continue
            a, b = root(src), root(op.name)
            if a == b or (op.kind == "reduction" and has_reduction[a]):
                continue  # a reduction of reduced data needs the first reduction finished everywhere
            parent[b] = a
            has_reduction[a] = has_reduction[a] or has_reduction[b]

    groups: dict[str, list[Op]] = {}
    for op in fusible:
        groups.setdefault(root(op.name), []).append(op)

    def leaves(name: str, members: set[str]) -> bool:
        """Does tensor ``name`` made inside ``members`` have to be written to memory?"""
        users = block.consumers(name)
        return name == block.output or any(u.name not in members for u in users)

    kernels: list[tuple[int, Kernel]] = []
    for members_ops in groups.values():
        members = {op.name for op in members_ops}
        reads = {n for op in members_ops for n in op.inputs if n not in members}
        writes = [op.name for op in members_ops if leaves(op.name, members)]
        reduction = [op for op in members_ops if op.kind == "reduction"]
        if reduction:
            r_in = block.tensor(reduction[0].inputs[0])
            r_len = r_in.rows * r_in.cols // max(1, reduction[0].out.rows * reduction[0].out.cols)
            prefix = "per" if r_len <= PERSISTENT_REDUCTION else "red"
        else:
            prefix = "poi"
        name = f"triton_{prefix}_fused_" + "_".join(sorted({op.target for op in members_ops}))
        first = block.ops.index(members_ops[0])
        kernels.append((first, Kernel(name, "triton", tuple(op.name for op in members_ops),
                                      sum(block.tensor(n).bytes for n in reads),
                                      sum(block.tensor(n).bytes for n in writes), 0.0, members_ops[0].graph)))
    for i, op in enumerate(block.ops):
        if op.kind == "matmul":
            reads = sum(block.tensor(n).bytes for n in op.inputs)
            if op.name in folded_into:
                add, bias = folded_into[op.name]
                out = block.producer(add).out
                kernels.append((i - 0.5, Kernel(f"copy {bias} into the addmm output", "copy", (add,),
                                                block.tensor(bias).bytes, out.bytes, 0.0, op.graph)))
                kernels.append((i, Kernel(f"cuBLAS addmm ({op.inputs[1]}, bias {bias})", "cublas", (op.name, add),
                                          reads + out.bytes, out.bytes, _flops(block, op), op.graph)))
            else:
                kernels.append((i, Kernel(f"cuBLAS mm ({op.inputs[1]})", "cublas", (op.name,), reads, op.out.bytes,
                                          _flops(block, op), op.graph)))
        elif op.kind == "sync":
            kernels.append((i, Kernel(f"{op.target} (device to host, host waits)", "sync", (op.name,), 0.0, 0.0, 0.0,
                                      op.graph)))
    return tuple(k for _, k in sorted(kernels, key=lambda t: t[0]))


def copied_input_bytes(block: Block, weights: str = "parameters") -> float:
    """Bytes ``mode="reduce-overhead"`` copies into the CUDA graph's static buffers before every replay: the
    activation x always (an input from eager), and the weights too when they are closure tensors (not
    nn.Parameters, buffers or ``mark_static_address`` tensors)."""
    _choice("weights", weights, WEIGHTS)
    return block.tensor("x").bytes + (block.weight_bytes if weights == "closure" else 0.0)


# ---- calibration: the launch and bandwidth constants -----------------------------------------------------------


def compiled_call_s() -> float:
    """Host seconds to enter one compiled graph beyond its launches (``compile_stages.compiled_call_us``)."""
    return float(assumptions.value("compile_stages.compiled_call_us")) * US


def recompile_limit() -> int:
    """Compiled versions Dynamo keeps per function before it runs new inputs eagerly
    (``compile_stages.recompile_limit``)."""
    return int(assumptions.value("compile_stages.recompile_limit"))


def sync_s() -> float:
    """Host seconds a ``.item()`` costs beyond waiting for the GPU: the device-to-host copy's fixed cost
    (:func:`lib.kernels.elementwise.copy_fixed_s`) + the host's wake-up after the stream drains
    (``kernels_benchmarking.sync_wakeup_us``, :func:`lib.kernels.benchmarking.bench_assumptions`)."""
    from lib.kernels.benchmarking import bench_assumptions
    from lib.kernels.elementwise import copy_fixed_s

    return copy_fixed_s() + bench_assumptions().sync_s


MEASURED_GEMV_SHAPES = ((14336, 4096), (4096, 14336))
"""(n, k) of the measured decode GEMVs that are the measured block's projections (Llama 3.1 8B's MLP)."""


def measured_gemv_efficiency(batch: int = 8) -> float:
    """The H200's measured rate for the block's three projections at ``batch`` (data/measured-h200.yaml,
    gemv, CUDA-graph timing): their weight bytes / their summed times, over the datasheet bandwidth.
    w1 and w3 are the (14336, 4096) shape, w2 the (4096, 14336) one."""
    from lib.registry.measured import measured

    rows = {(r["n"], r["k"]): r for r in measured("gemv.rows") if r.get("batch") == batch and not r.get("hot")
            and "graph" in r.get("timed", "")}
    missing = [s for s in MEASURED_GEMV_SHAPES if s not in rows]
    if missing:
        have = sorted({r["batch"] for r in measured("gemv.rows")})
        raise ValueError(f"the H200 GEMV measurement has no batch-{batch} row for {missing}; batches measured: {have}")
    counts = {MEASURED_GEMV_SHAPES[0]: 2, MEASURED_GEMV_SHAPES[1]: 1}
    nbytes = sum(c * n * k * 2 for (n, k), c in counts.items())  # bf16 weights
    seconds = sum(c * rows[s]["s"] for s, c in counts.items())
    return nbytes / seconds / gpu("h200").memory_bandwidth


@dataclass(frozen=True)
class Calibration:
    """The constants a call is priced with: the step model's assumptions and the compiled-graph entry cost."""

    name: str
    assume: object  # lib.perf.step.StepAssumptions
    entry_s: float
    sync_s: float


def calibration(name: str = "book", chip: str | GPU = "h200") -> Calibration:
    """``book``: :func:`lib.perf.step.step_assumptions` (central) and :func:`compiled_call_s`, for any GPU.
    ``h200-measured`` (the H200 only): the same model with the H200's measured constants
    (data/measured-h200.yaml): kernel fixed cost = a one-element add replayed from a CUDA graph
    (``launch_overhead.cuda_graph_add_s``, gap 0: that time holds both), eager launch = the same add from
    Python (``torch_eager_add_s``), streaming efficiency = :func:`measured_gemv_efficiency`, graph entry =
    a compiled one-element add minus the eager one (``compile_stages_probe.tiny_call_s``, medians)."""
    from lib.perf.step import step_assumptions

    _choice("calibration", name, CALIBRATIONS)
    g = gpu(chip)
    if name == "book":
        return Calibration(name, step_assumptions(), compiled_call_s(), sync_s())
    if g.key != "h200":
        raise ValueError(f"the h200-measured calibration holds the H200's measured constants; {g.key} has none: "
                         "choose calibration 'book' for other GPUs")
    from lib.registry.measured import measured

    tiny = measured("compile_stages_probe.tiny_call_s")
    entry = statistics.median(tiny["compiled_inductor"]) - statistics.median(tiny["eager"])
    a = step_assumptions(kernel_fixed_s=measured("launch_overhead.cuda_graph_add_s"), launch_gap_s=0.0,
                         eager_launch_s=measured("launch_overhead.torch_eager_add_s"),
                         gemv_efficiency=min(1.0, measured_gemv_efficiency()))
    return Calibration(name, a, entry, sync_s())


# ---- time ---------------------------------------------------------------------------------------------------


def kernel_pipes(k: Kernel, chip: str | GPU, dtype: str, assume) -> tuple[float, float]:
    """(memory, math) seconds of one kernel: bytes / (HBM bandwidth x streaming efficiency) and FLOPs /
    (``dtype`` peak x matmul efficiency); (0, 0) for a sync."""
    if k.kind == "sync":
        return 0.0, 0.0
    g = gpu(chip)
    memory = k.bytes / (g.memory_bandwidth * assume.gemv_efficiency)
    compute = k.flops / (g.peak_flops(dtype) * assume.matmul_efficiency) if k.flops else 0.0
    return memory, compute


def kernel_s(k: Kernel, chip: str | GPU, dtype: str, assume) -> float:
    """GPU seconds of one kernel by :func:`lib.perf.step.kernel_time_s`: fixed cost + the slower of its
    :func:`kernel_pipes` (they overlap); 0 for a sync."""
    from lib.perf.step import kernel_time_s

    if k.kind == "sync":
        return 0.0
    return kernel_time_s(assume.kernel_fixed_s, *kernel_pipes(k, chip, dtype, assume))


@dataclass(frozen=True)
class Segment:
    """One graph's share of a call: host seconds to enter it, kernels the host launches one by one (GPU
    seconds each), kernels replayed from one CUDA graph (one host launch), and whether a ``.item()``
    follows (the host waits for the GPU)."""

    entry_s: float
    eager: tuple[float, ...] = ()
    graph: tuple[float, ...] = ()
    sync_after: bool = False

    @property
    def launches(self) -> int:
        return len(self.eager) + (1 if self.graph else 0)


def call_period_s(segments: Sequence[Segment], assume, sync_seconds: float = 0.0, calls: int = 8) -> float:
    """Steady-state seconds per call of a function called back to back (module docstring): ``calls`` calls
    simulated kernel by kernel with :func:`lib.perf.step.kernel_start`; the period is measured over the second
    half, when the queue has settled."""
    from lib.perf.step import kernel_start

    calls = integer("calls", calls, 2, 1000)
    real("sync_seconds", sync_seconds, 0, unit="seconds")
    gpu_end = cpu = 0.0
    first = True
    ends = []
    for _ in range(calls):
        for seg in segments:
            cpu += seg.entry_s
            for d in seg.eager:
                start, cpu = kernel_start(gpu_end, cpu, first, False, assume)
                gpu_end, first = start + d, False
            if seg.graph:
                cpu += assume.eager_launch_s  # the replay is one launch
                for i, d in enumerate(seg.graph):
                    start, _ = kernel_start(gpu_end, cpu, first, True, assume)
                    start = max(start, cpu) if i == 0 else start
                    gpu_end, first = start + d, False
            if seg.sync_after:
                cpu = max(cpu, gpu_end) + sync_seconds
        ends.append(max(gpu_end, cpu))
    half = calls // 2
    return (ends[-1] - ends[half - 1]) / (calls - half)


@dataclass(frozen=True)
class StageCost:
    """One stage of the block: its kernels (with GPU seconds), host and GPU work per call, and the steady
    period of back-to-back calls."""

    stage: str
    kernels: tuple[Kernel, ...]
    kernel_seconds: tuple[float, ...]
    segments: tuple[Segment, ...]
    host_s: float
    gpu_s: float
    period_s: float
    copied_bytes: float = 0.0

    @property
    def kernel_count(self) -> int:
        """Kernels a profiler would count (copies and syncs excluded)."""
        return sum(k.is_kernel for k in self.kernels)

    @property
    def launches(self) -> int:
        """Host launches per call (a CUDA-graph replay counts one)."""
        return sum(s.launches for s in self.segments)

    @property
    def syncs(self) -> int:
        return sum(s.sync_after for s in self.segments)

    @property
    def bound(self) -> str:
        """What sets the period: 'sync' (host and GPU take turns), 'host' or 'GPU'."""
        if self.syncs:
            return "sync"
        return "host" if self.host_s > self.gpu_s else "GPU"

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)


def _graphs_of(kernels: Sequence[Kernel]) -> list[list[Kernel]]:
    out: list[list[Kernel]] = []
    for k in kernels:
        if not out or (out[-1] and out[-1][-1].kind == "sync"):
            out.append([])
        out[-1].append(k)
    return out


def stage_cost(block: Block, stage: str, chip: str | GPU, cal: Calibration, weights: str = "parameters",
               calls: int = 8) -> StageCost:
    """One stage of :data:`STAGES` for ``block`` on ``chip`` priced with ``cal`` (module docstring).
    ``eager_graph`` is refused for a block with a graph break (a CUDA graph cannot capture ``.item()``)."""
    _choice("stage", stage, STAGES)
    _choice("weights", weights, WEIGHTS)
    a = cal.assume
    if stage == "eager_graph" and block.graph_break:
        raise ValueError("a CUDA graph cannot capture the .item() of the graph break: eager_graph needs graph_break=False")
    kernels = eager_kernels(block) if stage in ("eager", "eager_graph") else inductor_kernels(block)
    copied = 0.0
    if stage == "reduce_overhead":
        copied = copied_input_bytes(block, weights)
        copy = Kernel("copy non-static inputs into the graph's buffers", "copy", (), copied, copied, 0.0, 0)
        kernels = (copy, *kernels)
    secs = tuple(kernel_s(k, chip, block.dtype, a) for k in kernels)
    timed = dict(zip(kernels, secs, strict=True))
    segments = []
    for i, graph in enumerate(_graphs_of(kernels)):
        work = tuple(timed[k] for k in graph if k.kind != "sync")
        sync_after = graph[-1].kind == "sync"
        entry = 0.0 if stage in ("eager", "eager_graph") else cal.entry_s
        if stage == "eager":
            segments.append(Segment(entry, eager=work, sync_after=sync_after))
        elif stage == "eager_graph":
            segments.append(Segment(entry, graph=work, sync_after=sync_after))
        elif stage == "inductor":
            segments.append(Segment(entry, eager=work, sync_after=sync_after))
        else:  # reduce-overhead: the input copy is launched, then the graph replayed
            pre = (work[0],) if i == 0 else ()
            segments.append(Segment(entry, eager=pre, graph=work[len(pre):], sync_after=sync_after))
    segments = tuple(segments)
    host = sum(s.entry_s + s.launches * a.eager_launch_s for s in segments) + \
        sum(s.sync_after for s in segments) * cal.sync_s
    runs = sum(len(s.eager) + len(s.graph) for s in segments)
    gpu_work = sum(secs) + runs * a.launch_gap_s  # per call in steady state: a gap before each kernel
    period = call_period_s(segments, a, cal.sync_s, calls)
    return StageCost(stage, tuple(kernels), secs, segments, host, gpu_work, period, copied)


@dataclass(frozen=True)
class CompileStages:
    """Every stage of one block on one GPU under one calibration (:func:`compile_stages`)."""

    block: Block
    gpu: str
    cal: Calibration
    weights: str
    stages: dict  # stage -> StageCost

    def __getitem__(self, stage: str) -> StageCost:
        return self.stages[stage]

    @property
    def floor_s(self) -> float:
        """The block's weights at the datasheet HBM bandwidth: no call can be faster."""
        return self.block.weight_bytes / gpu(self.gpu).memory_bandwidth


def compile_stages(model: str = "llama-3.1-8b", batch: int = 8, chip: str | GPU = "h200", dtype: str = "bf16",
                   calibration_name: str = "book", weights: str = "parameters", graph_break: bool = False,
                   calls: int = 8) -> CompileStages:
    """The block of ``model`` at ``batch`` through every stage (:func:`stage_cost`); with a graph break the
    eager-in-one-graph stage is left out."""
    g = gpu(chip)
    block = block_for_model(model, batch, dtype, graph_break)
    cal = calibration(calibration_name, g)
    stages = {s: stage_cost(block, s, g, cal, weights, calls) for s in STAGES
              if not (s == "eager_graph" and graph_break)}
    return CompileStages(block, g.key, cal, weights, stages)


# ---- the H200 measurement -------------------------------------------------------------------------------------

MEASURED_SETUP = {"model": "llama-3.1-8b", "batch": 8, "gpu": "h200", "dtype": "bf16"}
"""The setup data/measured-h200.yaml measured the stages at (d 4096, f 14336: Llama 3.1 8B's MLP)."""

_MEASURED_CASES = {  # (stage, weights, graph break) -> (cases of compile_stages, cases of compile_stages_probe)
    ("eager", "parameters", False): (("eager",), ("eager",)),
    ("eager", "closure", False): (("eager",), ("eager",)),
    ("eager_graph", "parameters", False): (("eager_in_one_cuda_graph_s",), ()),
    ("eager_graph", "closure", False): (("eager_in_one_cuda_graph_s",), ()),
    ("inductor", "parameters", False): (("module_inductor",), ("inductor_module",)),
    ("inductor", "closure", False): (("inductor",), ("inductor_closure",)),
    ("reduce_overhead", "parameters", False): (("module_inductor_cudagraphs",), ("cudagraphs_module",)),
    ("reduce_overhead", "closure", False): (("inductor_cudagraphs", "inductor_cudagraphs_marked"),
                                            ("cudagraphs_closure",)),
    ("inductor", "closure", True): (("inductor_graph_break",), ("graph_break",)),
}


def measured_call_s(stage: str, weights: str = "parameters", graph_break: bool = False) -> tuple[float, ...]:
    """Every wall-clock time per call the H200 measured for this stage of the block at :data:`MEASURED_SETUP`
    (seconds; the first run's value first, then the probe's three repeats), or () where nothing was measured.
    Eager does not depend on how the weights are held."""
    from lib.registry.measured import measured

    _choice("stage", stage, STAGES)
    _choice("weights", weights, WEIGHTS)
    first, probe = _MEASURED_CASES.get((stage, weights, bool(graph_break)), ((), ()))
    out = []
    for case in first:
        v = measured(f"compile_stages.{case}")
        out.append(float(v if isinstance(v, float) else v["wall_s_per_call"]))
    for case in probe:
        out.extend(float(t) for t in measured(f"compile_stages_probe.{case}.wall_s_per_call"))
    return tuple(out)


def is_measured_setup(model: str, batch: int, chip: str | GPU, dtype: str) -> bool:
    """Is this the block and GPU the H200 measurement ran?"""
    return (model, batch, gpu(chip).key, dtype) == tuple(MEASURED_SETUP[k] for k in ("model", "batch", "gpu", "dtype"))


# ---- recompilation -------------------------------------------------------------------------------------------


def compile_events(shapes: Sequence[int], dynamic: str = "false", limit: int | None = None) -> tuple[str, ...]:
    """For each call of a compiled function with batch ``shapes[i]``: 'compile', 'hit' (a cached graph's
    guards pass) or 'eager' (the cache is full: Dynamo runs the frame eagerly). ``dynamic`` in
    :data:`DYNAMIC`; ``limit`` defaults to :func:`recompile_limit`. Sizes 1 are specialized in every mode."""
    _choice("dynamic", dynamic, DYNAMIC)
    lim = recompile_limit() if limit is None else integer("limit", limit, 1)
    entries: set = set()
    out = []
    for n in shapes:
        n = integer("batch", n, 1)
        if dynamic == "false":
            hit, key = ("static", n) in entries, ("static", n)
        elif dynamic == "true":
            key = ("static", 1) if n == 1 else ("dynamic",)
            hit = key in entries
        else:  # auto: a shape seen before, or the dynamic graph; else static first, dynamic from the 2nd size
            hit = ("static", n) in entries or (n > 1 and ("dynamic",) in entries)
            key = ("static", n) if (n == 1 or not entries) else ("dynamic",)
        if hit:
            out.append("hit")
        elif len(entries) >= lim:
            out.append("eager")
        else:
            entries.add(key)
            out.append("compile")
    return tuple(out)


def measured_recompile_s() -> float:
    """Median seconds of one Inductor compile of the block on the H200 (torch 2.11): the first calls of the
    ``dynamic=False`` sweep that compiled (data/measured-h200.yaml, compile_stages.recompiles; calls that
    took under 0.1 s were served from the compile cache or ran eagerly and are left out)."""
    from lib.registry.measured import measured

    rows = measured("compile_stages.recompiles.first_calls")
    return statistics.median(r["first_call_s"] for r in rows if r["first_call_s"] >= 0.1)


# ---- the real thing on the CPU --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceDemo:
    """What torch.compile's front end does to a small block on the CPU (:func:`trace_demo`)."""

    torch_version: str
    d: int
    f: int
    batch: int
    dtype: str
    dynamo_graphs: int
    dynamo_breaks: int
    dynamo_ops: int
    guards: tuple[tuple[str, str], ...]  # (what is guarded, guard kind)
    break_graphs: int
    break_breaks: int
    break_reason: str
    inference_ops: tuple[str, ...]  # aten targets of AOTAutograd's inference graph (closure weights)
    closure_static: tuple[int, ...]  # graph inputs CUDA graphs would treat as static (closure weights)
    forward_ops: tuple[str, ...]  # training: nn.Parameters, a forward and a backward graph
    backward_ops: tuple[str, ...]
    saved_tensors: int  # what the forward keeps for the backward
    parameter_static: tuple[int, ...]
    compiles_false: tuple[int, ...]  # compiles per call over batches 1..12, dynamic=False
    compiles_auto: tuple[int, ...]  # the same, dynamic=None
    sweep: tuple[int, ...]
    seconds: float


def _targets(gm) -> tuple[str, ...]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            t = getattr(n.target, "__name__", str(n.target))
            out.append(t.split(".")[0])
    return tuple(out)


def trace_demo(d: int = 64, f: int = 224, batch: int = 8, dtype: str = "bf16", seed: int = 0,
               sweep: int = 12) -> TraceDemo:
    """Run torch.compile's front end on the CPU on the block at d x f (imports torch; about a second after the
    import). Dynamo: ``torch._dynamo.explain`` of the block and of the block with the ``.item()`` check (graphs,
    breaks, the first break reason, the guards). AOTAutograd, through ``aot_autograd`` with compilers that only
    record the graphs (no Inductor): the inference graph with closure weights and the static inputs it reports
    for CUDA graphs; the forward and backward graphs with the weights as nn.Parameters. Recompiles: a
    recording backend counts compiles of a small function over batches 1..``sweep`` with ``dynamic=False`` and
    ``None``."""
    import importlib
    import logging
    import time

    # Dynamo imports triton: lib's choice of Triton's interpreter mode must come first, or every interpreted kernel
    # of the book fails afterwards in this process
    importlib.import_module("lib.kernels.triton_env")
    import torch
    import torch._dynamo as dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    d = integer("d", d, 1, 4096)
    f = integer("f", f, 1, 16384)
    batch = integer("batch", batch, 1, 1024)
    sweep = integer("sweep", sweep, 1, 32)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[_choice("dtype", dtype, DTYPES)]
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(integer("seed", seed, 0))
    w1, w3 = ((torch.randn(f, d, generator=gen) * 0.02).to(tdt) for _ in range(2))
    w2 = (torch.randn(d, f, generator=gen) * 0.02).to(tdt)
    g = torch.ones(d, dtype=tdt)
    x = torch.randn(batch, d, generator=gen).to(tdt)

    def block(x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g
        u = torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)
        return x + u @ w2.T

    def block_with_break(x):
        h = x.float()
        scale = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        if float(scale.max()) > 1e6:  # data-dependent Python control flow: Dynamo must stop here
            scale = scale.clamp(max=1e6)
        h = (h * scale).to(x.dtype) * g
        u = torch.nn.functional.silu(h @ w1.T) * (h @ w3.T)
        return x + u @ w2.T

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2, self.g = (torch.nn.Parameter(t.clone()) for t in (w1, w3, w2, g))

        def forward(self, x):
            h = x.float()
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * self.g
            u = torch.nn.functional.silu(h @ self.w1.T) * (h @ self.w3.T)
            return x + u @ self.w2.T

    quiet = logging.getLogger("torch._dynamo")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the break and the recompile limit are the point here, not warnings
    try:
        return _trace(torch, dynamo, aot_autograd, make_boxed_func, block, block_with_break, Block, x, gen, sweep,
                      (d, f, batch, dtype), t0)
    finally:
        quiet.setLevel(level)


def _trace(torch, dynamo, aot_autograd, make_boxed_func, block, block_with_break, Block, x, gen, sweep, shape, t0):
    import time

    dynamo.reset()
    ex = dynamo.explain(block)(x)
    guards = tuple((gd.name or "(global state)", gd.create_fn_name()) for gd in ex.out_guards)
    ex_break = dynamo.explain(block_with_break)(x)
    reason = str(ex_break.break_reasons[0].reason).strip().splitlines()[0] if ex_break.break_reasons else ""

    graphs: list[tuple[str, object, tuple[int, ...]]] = []

    def fw(gm, example_inputs):
        ctx = torch._guards.TracingContext.try_get()
        static = tuple(ctx.fw_metadata.static_input_indices) if ctx is not None and ctx.fw_metadata else ()
        graphs.append(("fw", gm, static))
        return make_boxed_func(gm.forward)

    def bw(gm, example_inputs):
        graphs.append(("bw", gm, ()))
        return make_boxed_func(gm.forward)

    recording = aot_autograd(fw_compiler=fw, bw_compiler=bw)
    dynamo.reset()
    with torch.no_grad():
        torch.compile(block, backend=recording)(x)
    _, infer_gm, closure_static = graphs[-1]
    dynamo.reset()
    graphs.clear()
    y = torch.compile(Block(), backend=recording)(x)
    y.float().sum().backward()
    (_, fw_gm, param_static), (_, bw_gm, _) = graphs[0], graphs[1]
    fw_out = next(n for n in fw_gm.graph.nodes if n.op == "output").args[0]

    counted = [0]

    def counting(gm, example_inputs):
        counted[0] += 1
        return gm.forward

    def small(x):
        return torch.nn.functional.silu(x) * 2.0  # a small function: the sweep counts compiles, not their size

    per_call = {}
    for mode, dyn in (("false", False), ("auto", None)):
        dynamo.reset()
        fn = torch.compile(small, backend=counting, dynamic=dyn)
        calls = []
        for n in range(1, sweep + 1):
            before = counted[0]
            fn(torch.randn(n, 16, generator=gen))
            calls.append(counted[0] - before)
        per_call[mode] = tuple(calls)
    dynamo.reset()
    return TraceDemo(torch.__version__, *shape, ex.graph_count, ex.graph_break_count, ex.op_count,
                     guards, ex_break.graph_count, ex_break.graph_break_count, reason, _targets(infer_gm),
                     closure_static, _targets(fw_gm), _targets(bw_gm), len(fw_out) - 1, param_static,
                     per_call["false"], per_call["auto"], tuple(range(1, sweep + 1)), time.perf_counter() - t0)


# ---- the CPU trace, recorded -----------------------------------------------------------------------------------

RECORDED_TRACE = "recorded-trace-demo.json"  # under data/: trace_demo's result at its defaults, and the torch version


def _installed_torch() -> str | None:
    """The installed torch's version without importing it (importing torch._dynamo takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def recorded_trace_demo() -> TraceDemo | None:
    """:func:`trace_demo` at its default arguments as recorded in ``data/recorded-trace-demo.json`` by
    :func:`record_trace_demo`, or None if the file is missing or was recorded with another torch than the one
    installed. tests/unit/test_kernels_compile_stages.py re-runs the trace and fails when the record is stale."""
    import json

    from lib.registry.data import DATA_DIR

    path = DATA_DIR / RECORDED_TRACE
    if not path.is_file():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    if raw.get("torch_installed") != _installed_torch():
        return None
    demo = raw["demo"]
    return TraceDemo(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                        for k, v in demo.items()})


def trace_or_record(d: int = 64, f: int = 224, batch: int = 8, dtype: str = "bf16", seed: int = 0, sweep: int = 12,
                    live: bool = False) -> TraceDemo:
    """:func:`recorded_trace_demo` when the arguments are the defaults, ``live`` is False and the record matches
    the installed torch (the page then runs in a second, not the five that importing Dynamo and tracing take);
    else :func:`trace_demo` itself."""
    default = (d, f, batch, dtype, seed, sweep) == (64, 224, 8, "bf16", 0, 12)
    recorded = None if live or not default else recorded_trace_demo()
    return recorded if recorded is not None else trace_demo(d, f, batch, dtype, seed, sweep)


def record_trace_demo() -> None:
    """Run :func:`trace_demo` at its defaults and write ``data/recorded-trace-demo.json`` (run after a torch
    upgrade: ``python -c "from lib.kernels.compile_stages import record_trace_demo; record_trace_demo()"``)."""
    import dataclasses
    import json

    from lib.registry.data import DATA_DIR

    demo = dataclasses.asdict(trace_demo())
    demo["seconds"] = 0.0  # wall time of the recording run: not a result
    doc = {"what": "lib.kernels.compile_stages.trace_demo() at its defaults, on the CPU; written by "
                   "record_trace_demo(), checked against a fresh trace by tests/unit/test_kernels_compile_stages.py",
           "torch_installed": _installed_torch(), "demo": demo}
    (DATA_DIR / RECORDED_TRACE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
