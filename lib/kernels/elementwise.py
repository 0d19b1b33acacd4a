"""Elementwise kernels: a vector add and chains of elementwise operations, their launch
configuration, their HBM and host-copy traffic, and what fusing a chain saves. The one home of
these kernels and their cost.

**The index and the mask.** A launch of ``grid`` programs (CUDA: thread blocks) of ``block``
elements gives program ``pid`` the elements ``pid x block + [0, block)``; the grid is the smallest
that covers n elements, ceil(n / block), so the last program's lanes past n hold no element and the
mask ``offsets < n`` switches them off (:func:`grid_size`, :func:`program_offsets`; the Triton
kernel ``vector_add`` writes the same lines). CUDA's one-thread-per-element form is
``i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) ...`` (:data:`CUDA_VECTOR_ADD`).

**Launch configuration** (:func:`launch_config`): grid = ceil(n / elements per block); the blocks
an SM holds at once come from :func:`lib.kernels.sm.occupancy` (threads and registers per
thread), slots = SMs x that, and the grid runs in :func:`lib.kernels.sm.waves` waves.

**Time of a streaming kernel.** Every kernel here is priced by :func:`lib.kernels.rowwise.stream_cost`
(the one model of a kernel that streams HBM): fixed per-kernel cost + max(bytes / (datasheet
bandwidth x streaming efficiency), vector math, exponentials), with the decode step's fixed cost
and streaming efficiency (:func:`lib.perf.step.step_assumptions`).

**Host copies** (:func:`host_copy_s`): a fixed cost per copy (``kernels_elementwise.copy_fixed_us``)
+ bytes / (PCIe x16 per direction of the GPU's generation,
:func:`lib.perf.collectives.pcie_bandwidth`, x the pinned-memory efficiency of the host tier,
``storage.tiers.host_dram.efficiency``, x ``kernels_elementwise.pageable_fraction_of_pinned`` for
pageable memory). A vector add of n elements moves 3 n b bytes through HBM and, when its inputs
start and its output ends on the host, the same 3 n b bytes over PCIe (:func:`vector_add_cost`), so
the copies take (HBM bandwidth x efficiency) / (PCIe bandwidth x efficiency) times the add,
whatever n is (once fixed costs are small).

**Fusion** (:func:`chain_cost`): k elementwise operations on one tensor, each its own kernel, read
and write the tensor k times (2k passes over HBM) and pay k launches; fused into one kernel they
read it once and write it once (2 passes) and pay one. The kernels run back to back by the decode
step's launch rule (:func:`launch_sequence_s`). :func:`launch_crossover_elements` is the tensor
size at which one kernel's memory time equals its per-kernel overhead. :func:`epilogue_fusion`
prices the third fusion shape, an activation folded into the matmul before it.

The Triton kernels are built on first use (:func:`kernels`), so ``import lib`` and the explorers
never import triton or torch. :func:`counted_traffic` counts the bytes Triton's CPU interpreter
loads and stores. Units: bytes, seconds, elements.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from lib.inputs import integer
from lib.kernels import rowwise as rw
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu

__all__ = [
    "CHAIN_OPS",
    "CUDA_VECTOR_ADD",
    "DEMO_CHAIN_PARAMS",
    "DTYPES",
    "HOST_MEMORY",
    "LAUNCH_MODES",
    "ChainCost",
    "ChainOp",
    "EpilogueFusion",
    "LaunchConfig",
    "Traffic",
    "VectorAddCost",
    "add",
    "chain_cost",
    "chain_fused",
    "chain_reference",
    "chain_unfused",
    "copy_fixed_s",
    "counted_traffic",
    "epilogue_fusion",
    "grid_size",
    "host_copy_s",
    "host_link_bandwidth",
    "kernels",
    "launch_config",
    "launch_crossover_elements",
    "launch_sequence_s",
    "mask_demo",
    "pageable_fraction",
    "per_kernel_overhead_s",
    "program_offsets",
    "vector_add_cost",
]

DTYPES = rw.ROW_DTYPES
"""Storage dtypes of the tensors these kernels read and write (fp32, fp16, bf16)."""
HOST_MEMORY = ("pinned", "pageable")
"""Host memory a copy starts from or lands in: page-locked (DMA straight from it) or pageable."""
LAUNCH_MODES = ("cuda_graph", "eager")
"""How a sequence of kernels is launched: replayed from a CUDA graph, or issued one by one by the CPU."""

CUDA_VECTOR_ADD = """\
__global__ void vector_add(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // this thread's element
    if (i < n) {                                     // the last block runs past n
        out[i] = x[i] + y[i];
    }
}

// host: one thread per element, enough blocks to cover n
int blocks = (n + threads - 1) / threads;            // ceil(n / threads)
vector_add<<<blocks, threads>>>(d_x, d_y, d_out, n);
"""
"""The CUDA form of the vector add and its launch (a listing; never compiled here)."""


def _dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


# ---- the index, the mask and the launch ------------------------------------------------------


def grid_size(n: int, block: int) -> int:
    """Programs (blocks) to launch so every one of ``n`` elements has one: ceil(n / block)."""
    n = integer("n", n, 1, unit="elements")
    block = integer("block", block, 1, unit="elements")
    return (n + block - 1) // block  # ceil: the last program covers the tail


def program_offsets(pid: int, block: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The element indices program ``pid`` handles and which of them exist: (offsets, mask), numpy
    arrays of length ``block`` (int64 and bool), as the Triton kernel computes them."""
    offsets = pid * block + np.arange(block, dtype=np.int64)  # the global index of each lane
    mask = offsets < n  # lanes past the end exist only in the last program
    return offsets, mask


@dataclass(frozen=True)
class LaunchConfig:
    """A 1-D launch over n elements (module docstring)."""

    gpu: str
    n: int
    elements_per_block: int
    threads_per_block: int
    registers_per_thread: int
    grid: int  # blocks (programs) launched
    blocks_per_sm: int  # resident at once (lib.kernels.sm.occupancy)
    binding: tuple[str, ...]  # the limits that set blocks_per_sm
    sm_count: int
    waves: int

    @property
    def slots(self) -> int:
        """Blocks the whole GPU runs at once: SMs x resident blocks per SM."""
        return self.sm_count * self.blocks_per_sm

    @property
    def wave_count(self) -> float:
        """grid / slots, with its fraction (the last wave may be partly empty)."""
        return self.grid / self.slots

    @property
    def wave_efficiency(self) -> float:
        """grid / (waves x slots): the share of the launched waves' block slots that hold work."""
        return self.grid / (self.waves * self.slots)

    @property
    def elements_per_thread(self) -> int:
        return self.elements_per_block // self.threads_per_block

    @property
    def masked_lanes(self) -> int:
        """Lanes of the last block past n: grid x elements per block - n."""
        return self.grid * self.elements_per_block - self.n

    @property
    def tail_elements(self) -> int:
        """Elements the last block holds."""
        return self.n - (self.grid - 1) * self.elements_per_block


def launch_config(n: int, chip: str | GPU, threads_per_block: int = 256, registers_per_thread: int = 16,
                  elements_per_thread: int = 1) -> LaunchConfig:
    """Grid, resident blocks and waves of a 1-D launch over ``n`` elements: blocks of
    ``threads_per_block`` threads, each thread ``elements_per_thread`` elements (CUDA's one per
    thread; a Triton program of BLOCK elements and w warps: BLOCK / 32 w), using
    ``registers_per_thread`` registers. ValueError for a launch no SM can hold."""
    from lib.kernels.sm import occupancy, sm_limits, waves

    g = gpu(chip)
    lim = sm_limits(g)
    n = integer("n", n, 1, unit="elements")
    ept = integer("elements_per_thread", elements_per_thread, 1, unit="elements")
    occ = occupancy(lim, threads_per_block, registers_per_thread)
    if occ.blocks_per_sm == 0:
        raise ValueError(f"{g.key}: a block of {threads_per_block} threads at {registers_per_thread} registers each "
                         f"does not fit on an SM ({lim.max_registers_per_block:,} registers per block at most)")
    per_block = occ.threads_per_block * ept
    grid = grid_size(n, per_block)
    return LaunchConfig(g.key, n, per_block, occ.threads_per_block, occ.registers_per_thread, grid,
                        occ.blocks_per_sm, occ.binding, lim.sm_count, waves(grid, lim.sm_count * occ.blocks_per_sm))


# ---- host copies ---------------------------------------------------------------------------------


def pageable_fraction() -> float:
    """Copy bandwidth from pageable host memory as a fraction of pinned
    (``kernels_elementwise.pageable_fraction_of_pinned``)."""
    return float(assumptions.value("kernels_elementwise.pageable_fraction_of_pinned"))


def host_link_bandwidth(chip: str | GPU, memory: str = "pinned") -> float:
    """Achieved host-device copy bytes/s, one direction: :func:`lib.perf.collectives.pcie_bandwidth`
    x the pinned efficiency of the host tier (``storage.tiers.host_dram.efficiency``) x, for
    ``memory="pageable"``, :func:`pageable_fraction`. ValueError for a GPU whose host link is not
    PCIe (GB200's NVLink-C2C: see :func:`lib.kvcache.recompute_fetch.storage_tier`)."""
    from lib.kvcache.recompute_fetch import storage_tier
    from lib.perf.collectives import pcie_bandwidth

    g = gpu(chip)
    if memory not in HOST_MEMORY:
        raise ValueError(f"memory must be one of {', '.join(HOST_MEMORY)}; got {memory!r}")
    tier = storage_tier("host_dram", g)
    link = pcie_bandwidth(g)
    if not math.isclose(tier.peak_bandwidth, link):
        raise ValueError(f"{g.key}'s host link is not PCIe x16 (its host tier runs {tier.peak_bandwidth / 1e9:.0f} GB/s "
                         f"per direction, PCIe {link / 1e9:.0f}): choose a GPU on a PCIe host link")
    return link * tier.efficiency * (1.0 if memory == "pinned" else pageable_fraction())


def copy_fixed_s() -> float:
    """Seconds one host-device copy costs beyond its bytes (``kernels_elementwise.copy_fixed_us``)."""
    return float(assumptions.value("kernels_elementwise.copy_fixed_us")) * 1e-6


def host_copy_s(n_bytes: float, chip: str | GPU, memory: str = "pinned") -> float:
    """Seconds of one copy of ``n_bytes`` between host and device:
    :func:`copy_fixed_s` + bytes / :func:`host_link_bandwidth`."""
    from lib.inputs import real

    return copy_fixed_s() + real("n_bytes", n_bytes, 0, unit="bytes") / host_link_bandwidth(chip, memory)


# ---- the vector add: HBM against PCIe ------------------------------------------------------------


@dataclass(frozen=True)
class VectorAddCost:
    """out = x + y over n elements on one GPU, with x and y copied in from the host and out copied
    back (module docstring). Seconds and bytes."""

    n: int
    dtype: str
    gpu: str
    memory: str
    kernel: rw.RowKernelCost  # the add: 2 reads + 1 write per element
    launch: LaunchConfig
    link_peak: float  # PCIe bytes/s per direction (datasheet)
    link_bandwidth: float  # achieved, this host memory
    copy_fixed_s: float  # per copy, beyond its bytes
    h2d_bytes: float  # x and y: two copies
    d2h_bytes: float  # out: one copy

    @property
    def bytes(self) -> float:
        """HBM bytes the add moves: 3 n b."""
        return self.kernel.bytes

    @property
    def h2d_s(self) -> float:
        """The two input copies: 2 x fixed + their bytes / the achieved link bandwidth."""
        return 2 * self.copy_fixed_s + self.h2d_bytes / self.link_bandwidth

    @property
    def d2h_s(self) -> float:
        """The output copy: fixed + its bytes / the achieved link bandwidth."""
        return self.copy_fixed_s + self.d2h_bytes / self.link_bandwidth

    @property
    def copies_s(self) -> float:
        """Host-to-device copies of x and y, then the device-to-host copy of out, one after another."""
        return self.h2d_s + self.d2h_s

    @property
    def overlapped_copies_s(self) -> float:
        """The copies chunked over streams: inputs in and outputs out run on the link's two directions
        at once, so the longer direction sets the time: max(h2d, d2h)."""
        return max(self.h2d_s, self.d2h_s)

    @property
    def ratio(self) -> float:
        """Copies / the add (each at its achieved bandwidth, the add with its fixed cost)."""
        return self.copies_s / self.kernel.time_s

    @property
    def peak_ratio(self) -> float:
        """Copies at the datasheet PCIe rate / the add at the datasheet HBM rate: the same bytes over
        the two links, so HBM bandwidth / PCIe bandwidth exactly."""
        return ((self.h2d_bytes + self.d2h_bytes) / self.link_peak) / self.kernel.floor_s


def vector_add_cost(n: int, chip: str | GPU, dtype: str = "fp32", memory: str = "pinned",
                    threads_per_block: int = 256, registers_per_thread: int = 16) -> VectorAddCost:
    """The add of two ``n``-element vectors of ``dtype`` on ``chip`` (one element per thread,
    ``threads_per_block``), its HBM time (:func:`lib.kernels.rowwise.stream_cost`: 2 reads and 1
    write per element, 1 FP32 add), and the host copies of its two inputs and its output
    (:func:`host_link_bandwidth` from ``memory``)."""
    from lib.perf.collectives import pcie_bandwidth

    g = gpu(chip)
    b = bytes_per_element(_dtype(dtype))
    n = integer("n", n, 1, unit="elements")
    kernel = rw.stream_cost(1, n, g, dtype, 2, 1, vector_ops=1, name="vector add")
    cfg = launch_config(n, g, threads_per_block, registers_per_thread)
    return VectorAddCost(n, dtype, g.key, memory, kernel, cfg, pcie_bandwidth(g), host_link_bandwidth(g, memory),
                         copy_fixed_s(), 2.0 * n * b, 1.0 * n * b)


# ---- chains of elementwise operations, unfused and fused ------------------------------------------


@dataclass(frozen=True)
class ChainOp:
    """One elementwise operation of the chain: its name, formula, FP32 vector operations and
    exponentials per element."""

    name: str
    formula: str
    vector_ops: int
    exps: int


CHAIN_OPS = (
    ChainOp("dequant scale", "x * s_in", 1, 0),
    ChainOp("bias", "x + b", 1, 0),
    ChainOp("SiLU", "x / (1 + exp(-x))", 3, 1),
    ChainOp("clamp", "min(max(x, -c), c)", 2, 0),
    ChainOp("quant scale", "x * s_out", 1, 0),
)
"""The demo chain: a quantized linear layer's output run through dequantize, bias, SiLU, clamp to
the next format's range and requantize, each op its own kernel in eager PyTorch. A chain of k ops
cycles through these."""

DEMO_CHAIN_PARAMS = {"s_in": 0.05, "bias": 0.1, "clamp": 2.0, "s_out": 8.0}
"""The chain's constants in the demos: dequantize scale, bias, clamp bound, requantize scale."""


def _ops(k: int) -> tuple[ChainOp, ...]:
    k = integer("ops", k, 1, 64, unit="operations")
    return tuple(CHAIN_OPS[i % len(CHAIN_OPS)] for i in range(k))


def _launch_mode(launch: str) -> str:
    if launch not in LAUNCH_MODES:
        raise ValueError(f"launch must be one of {', '.join(LAUNCH_MODES)}; got {launch!r}")
    return launch


def launch_sequence_s(durations, launch: str = "cuda_graph", assume=None) -> float:
    """Seconds from the first issue to the end of the last of a run of dependent kernels on one
    stream, by :func:`lib.perf.step.kernel_start` (the decode step's launch rule): with CUDA graphs each kernel after the first
    starts ``launch_gap_s`` after the previous one ends; eager, the CPU issues kernel i at
    (i + 1) x ``eager_launch_s`` and the GPU starts it at max(previous end + gap, issue time), so
    short kernels wait for the CPU and long ones hide it."""
    from lib.perf.step import kernel_start, step_assumptions

    a = assume or step_assumptions()
    graphs = _launch_mode(launch) == "cuda_graph"
    prev_end = cpu = 0.0
    for i, d in enumerate(durations):
        start, cpu = kernel_start(prev_end, cpu, i == 0, graphs, a)
        prev_end = start + float(d)
    return prev_end


def per_kernel_overhead_s(launch: str = "cuda_graph", assume=None) -> float:
    """What one more kernel of a run costs beyond its bytes: the fixed cost plus the launch gap
    (CUDA graph), or the CPU's issue cost when that is longer (eager)."""
    from lib.perf.step import step_assumptions

    a = assume or step_assumptions()
    gpu_side = a.kernel_fixed_s + a.launch_gap_s
    return gpu_side if _launch_mode(launch) == "cuda_graph" else max(a.eager_launch_s, gpu_side)


def launch_crossover_elements(chip: str | GPU, dtype: str = "bf16", launch: str = "cuda_graph",
                              assume=None) -> float:
    """Tensor size (elements) at which one elementwise kernel's memory time (one read and one write,
    2 n b / (bandwidth x efficiency)) equals :func:`per_kernel_overhead_s`: below it launches set a
    chain's time, above it bytes do. n* = overhead x bandwidth x efficiency / (2 b)."""
    from lib.perf.step import step_assumptions

    a = assume or step_assumptions()
    g = gpu(chip)
    b = bytes_per_element(_dtype(dtype))
    return per_kernel_overhead_s(launch, a) * g.memory_bandwidth * a.gemv_efficiency / (2.0 * b)


@dataclass(frozen=True)
class ChainCost:
    """A chain of elementwise ops over one tensor of n elements, unfused (one kernel per op) and
    fused (one kernel), launched back to back (module docstring). Seconds and bytes."""

    n: int
    ops: tuple[str, ...]
    dtype: str
    gpu: str
    launch: str
    unfused: tuple[rw.RowKernelCost, ...]
    fused: rw.RowKernelCost
    unfused_s: float
    fused_s: float

    @property
    def k(self) -> int:
        return len(self.ops)

    @property
    def passes_unfused(self) -> int:
        """Passes over the tensor in HBM: a read and a write per kernel."""
        return 2 * self.k

    @property
    def passes_fused(self) -> int:
        return 2

    @property
    def bytes_unfused(self) -> float:
        return sum(c.bytes for c in self.unfused)

    @property
    def bytes_fused(self) -> float:
        return self.fused.bytes

    @property
    def memory_unfused_s(self) -> float:
        """The unfused kernels' memory time alone (bytes at the streaming efficiency)."""
        return sum(c.memory_s for c in self.unfused)

    @property
    def speedup(self) -> float:
        return self.unfused_s / self.fused_s

    @property
    def saved_s(self) -> float:
        return self.unfused_s - self.fused_s

    @property
    def overhead_share_unfused(self) -> float:
        """Share of the unfused time that is not memory time (fixed costs, gaps, waiting on the CPU)."""
        return 1.0 - self.memory_unfused_s / self.unfused_s


def chain_cost(n: int, ops: int, chip: str | GPU, dtype: str = "bf16", launch: str = "cuda_graph",
               assume=None) -> ChainCost:
    """A chain of ``ops`` elementwise operations (:data:`CHAIN_OPS`, cycled) over ``n`` elements of
    ``dtype``: unfused, each op one kernel that reads and writes the tensor
    (:func:`lib.kernels.rowwise.stream_cost`, its FP32 operations and exponentials); fused, one
    kernel that reads it once, applies every op in registers and writes it once. Each run of kernels
    is timed by :func:`launch_sequence_s` (``launch``)."""
    from lib.perf.step import step_assumptions

    a = assume or step_assumptions()
    g = gpu(chip)
    chain = _ops(ops)
    n = integer("n", n, 1, unit="elements")
    dt = _dtype(dtype)
    kw = {"efficiency": a.gemv_efficiency, "fixed_s": a.kernel_fixed_s}
    unfused = tuple(rw.stream_cost(1, n, g, dt, 1, 1, vector_ops=op.vector_ops, exps=op.exps, name=op.name, **kw)
                    for op in chain)
    fused = rw.stream_cost(1, n, g, dt, 1, 1, vector_ops=sum(op.vector_ops for op in chain),
                           exps=sum(op.exps for op in chain), name="fused chain", **kw)
    return ChainCost(n, tuple(op.name for op in chain), dt, g.key, _launch_mode(launch), unfused, fused,
                     launch_sequence_s([c.time_s for c in unfused], launch, a), launch_sequence_s([fused.time_s], launch, a))


# ---- the third fusion shape: an activation folded into the matmul before it ------------------------


@dataclass(frozen=True)
class EpilogueFusion:
    """The MLP's first matmul (gate and up projections) and its activation, as two kernels and as
    one kernel whose epilogue applies the activation before the single write. Seconds, bytes, FLOP."""

    model: str
    tokens: int
    gpu: str
    dtype: str
    k: int  # hidden size (the matmul's K)
    n: int  # the matmul's output columns
    act_out: int  # the activation's output columns (n / 2 for SwiGLU)
    gemm_flops: float
    gemm_bytes: float
    gemm_compute_s: float  # FLOPs at the matmul efficiency
    gemm_memory_s: float  # bytes at the streaming efficiency
    fused_memory_s: float  # the fused kernel writes act_out columns instead of n
    epilogue_flops: float  # the activation's FP32 operations
    fixed_s: float
    launch_gap_s: float
    activation: rw.RowKernelCost  # the separate activation kernel

    @property
    def gemm_s(self) -> float:
        return self.fixed_s + max(self.gemm_compute_s, self.gemm_memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.gemm_compute_s >= self.gemm_memory_s else "memory"

    @property
    def unfused_s(self) -> float:
        """The matmul, a launch gap, the activation kernel."""
        return self.gemm_s + self.launch_gap_s + self.activation.time_s

    @property
    def fused_s(self) -> float:
        """One kernel: max(compute, the smaller write) + fixed; the epilogue's FP32 work runs on the
        CUDA cores beside the tensor cores and is counted in :attr:`epilogue_flop_share` only."""
        return self.fixed_s + max(self.gemm_compute_s, self.fused_memory_s)

    @property
    def saved_s(self) -> float:
        return self.unfused_s - self.fused_s

    @property
    def gemm_change_s(self) -> float:
        """How much the matmul kernel itself gets faster when it writes the activation instead of its
        full output (0 when it is compute-bound)."""
        return self.gemm_s - self.fused_s

    @property
    def epilogue_flop_share(self) -> float:
        """The activation's operations / the matmul's FLOPs: c / (2 k x n / act_out)."""
        return self.epilogue_flops / self.gemm_flops


def epilogue_fusion(mdl: str, tokens: int, chip: str | GPU, dtype: str = "bf16", tp: int = 1,
                    assume=None) -> EpilogueFusion:
    """The gate/up matmul of ``mdl`` over ``tokens`` tokens (K = hidden, N from
    :func:`lib.perf.decode_kernels.gemm_shapes`) and its activation (SwiGLU: reads the gate and up
    halves, writes one; GELU: reads and writes the output), unfused and fused. FLOPs and bytes of
    the matmul from :func:`lib.perf.roofline.gemm_flops_bytes`; its time fixed + max(FLOPs / (peak x
    matmul efficiency), bytes / (bandwidth x streaming efficiency)), the decode step's kernel rule;
    the activation kernel by :func:`lib.kernels.rowwise.stream_cost`."""
    from lib.perf import decode_kernels as dk
    from lib.perf.roofline import gemm_flops_bytes
    from lib.perf.step import step_assumptions
    from lib.registry.models import model

    a = assume or step_assumptions()
    g = gpu(chip)
    m = model(mdl)
    dt = _dtype(dtype)
    t = integer("tokens", tokens, 1, unit="tokens")
    k, n, _ = dk.gemm_shapes(m, tp)["gate_up_proj"]
    k, n = int(k), int(n)
    swiglu = m.mlp == "swiglu"
    act_out = n // 2 if swiglu else n
    flops, nbytes = gemm_flops_bytes(t, n, k, dt)
    b = bytes_per_element(dt)
    per_el = dk.SILU_MUL_FLOPS_PER_ELEMENT if swiglu else dk.GELU_FLOPS_PER_ELEMENT
    act = rw.stream_cost(t, act_out, g, dt, 2 if swiglu else 1, 1, vector_ops=per_el,
                         exps=1, name="SiLU-and-mul" if swiglu else "GELU",
                         efficiency=a.gemv_efficiency, fixed_s=a.kernel_fixed_s)
    bw = g.memory_bandwidth * a.gemv_efficiency
    return EpilogueFusion(m.key, t, g.key, dt, k, n, act_out, flops, nbytes,
                          flops / (g.peak_flops(dt) * a.matmul_efficiency), nbytes / bw,
                          (nbytes - (n - act_out) * t * b) / bw, per_el * t * act_out, a.kernel_fixed_s,
                          a.launch_gap_s, act)


# ---- the Triton kernels ----------------------------------------------------------------------------


@functools.cache
def kernels() -> SimpleNamespace:
    """The Triton kernels, built on first use (imports triton, and torch through
    :mod:`lib.kernels.triton_env`, which picks the CPU interpreter when there is no GPU)."""
    global triton, tl  # the kernels read them as module globals, as Triton expects
    from lib.kernels.triton_env import tl, triton

    @triton.jit
    def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # which block of BLOCK elements; int64: pid * BLOCK may pass 2^31
        offsets = pid * BLOCK + tl.arange(0, BLOCK)  # the global index of each lane
        mask = offsets < n  # the last program's lanes past n hold no element
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)

    @triton.jit
    def vector_add_unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)  # no mask: the last program reads and writes past n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))

    @triton.jit
    def chain_op(x_ptr, y_ptr, n, s_in, bias, clamp, s_out, OP: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # one read of the tensor
        if OP == 0:
            x = x * s_in
        elif OP == 1:
            x = x + bias
        elif OP == 2:
            x = x / (1.0 + tl.exp(-x))
        elif OP == 3:
            x = tl.minimum(tl.maximum(x, -clamp), clamp)
        else:
            x = x * s_out
        tl.store(y_ptr + offsets, x.to(y_ptr.dtype.element_ty), mask=mask)  # one write, in the storage dtype

    @triton.jit
    def chain_fused(x_ptr, y_ptr, n, s_in, bias, clamp, s_out, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # the one read
        x = x * s_in  # dequantize
        x = x + bias
        x = x / (1.0 + tl.exp(-x))  # SiLU
        x = tl.minimum(tl.maximum(x, -clamp), clamp)
        x = x * s_out  # requantize
        tl.store(y_ptr + offsets, x.to(y_ptr.dtype.element_ty), mask=mask)  # the one write

    return SimpleNamespace(vector_add=vector_add, vector_add_unmasked=vector_add_unmasked, chain_op=chain_op,
                           chain_fused=chain_fused)


def _vector(x, name: str):
    import torch

    if not isinstance(x, torch.Tensor) or x.ndim != 1 or x.numel() < 1:
        raise ValueError(f"{name} must be a non-empty 1-D torch tensor, got {type(x).__name__} {getattr(x, 'shape', '')}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")
    return x


def _block(block: int) -> int:
    b = integer("block", block, 1, 1 << 16, unit="elements")
    if b & (b - 1):
        raise ValueError(f"block must be a power of two (tl.arange needs one), got {b}")
    return b


def add(x, y, out=None, *, block: int = 1024, masked: bool = True):
    """out = x + y by the Triton kernel: grid = (ceil(n / block),), ``block`` elements per program.
    ``masked=False`` launches the kernel without the bounds mask (the defect: its last program reads
    and writes past n, into whatever memory follows). Returns out."""
    import torch

    x, y = _vector(x, "x"), _vector(y, "y")
    if y.shape != x.shape or y.dtype != x.dtype:
        raise ValueError(f"x and y must have one shape and dtype, got {tuple(x.shape)} {x.dtype} and "
                         f"{tuple(y.shape)} {y.dtype}")
    out = torch.empty_like(x) if out is None else _vector(out, "out")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError("out must have x's shape and dtype")
    b = _block(block)
    n = x.numel()
    k = kernels().vector_add if masked else kernels().vector_add_unmasked
    k[(grid_size(n, b),)](x, y, out, n, BLOCK=b)
    return out


def _chain_args(params: dict) -> tuple[float, float, float, float]:
    try:
        return tuple(float(params[k]) for k in ("s_in", "bias", "clamp", "s_out"))
    except KeyError as err:
        raise ValueError(f"params must give s_in, bias, clamp and s_out; missing {err}") from None


def chain_unfused(x, params: dict, *, block: int = 1024):
    """The five ops of :data:`CHAIN_OPS` as five launches of the one-op kernel, each reading the
    previous result from memory and writing its own in x's dtype. Returns the last result."""
    import torch

    x = _vector(x, "x")
    args, b = _chain_args(params), _block(block)
    grid = (grid_size(x.numel(), b),)
    cur = x
    for op in range(len(CHAIN_OPS)):
        nxt = torch.empty_like(x)
        kernels().chain_op[grid](cur, nxt, x.numel(), *args, OP=op, BLOCK=b)
        cur = nxt
    return cur


def chain_fused(x, params: dict, *, block: int = 1024):
    """The five ops of :data:`CHAIN_OPS` in one kernel: one read of x, the ops in fp32 registers,
    one write in x's dtype."""
    import torch

    x = _vector(x, "x")
    args, b = _chain_args(params), _block(block)
    y = torch.empty_like(x)
    kernels().chain_fused[(grid_size(x.numel(), b),)](x, y, x.numel(), *args, BLOCK=b)
    return y


def chain_reference(x, params: dict, *, fp32: bool = False):
    """The chain in torch, op by op as eager PyTorch runs it: each result rounded to x's dtype
    (``fp32=True``: every op in float32, rounded once at the end)."""
    import torch

    s_in, bias, clamp, s_out = _chain_args(params)
    dt = x.dtype
    v = x.float()
    steps = (lambda t: t * s_in, lambda t: t + bias, torch.nn.functional.silu,
             lambda t: t.clamp(-clamp, clamp), lambda t: t * s_out)
    for f in steps:
        v = f(v) if fp32 else f(v).to(dt).float()
    return v.to(dt)


# ---- counting the bytes the interpreter moves -----------------------------------------------------


@dataclass
class Traffic:
    """Bytes and element accesses Triton's loads and stores moved (masked-off lanes move nothing)."""

    read_bytes: int = 0
    written_bytes: int = 0
    loads: int = 0  # load instructions (tl.load calls, per program)
    stores: int = 0

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.written_bytes


@contextlib.contextmanager
def counted_traffic():
    """Count, while the block runs, the bytes every Triton load and store moves: the lanes whose
    mask is on x the pointer's element size. Instruments the CPU interpreter (ValueError on a GPU,
    where a profiler's dram__bytes counters are the tool)."""
    from lib.kernels.triton_env import INTERPRETED

    if not INTERPRETED:
        raise ValueError("counted_traffic instruments Triton's CPU interpreter; on a GPU read the bytes from "
                         "Nsight Compute (dram__bytes_read.sum, dram__bytes_write.sum)")
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store
    tally = Traffic()

    def size(ptrs) -> int:
        return ptrs.get_element_ty().primitive_bitwidth // 8

    def counted_load(self, ptrs, mask, *args):
        tally.read_bytes += int(np.count_nonzero(mask.data)) * size(ptrs)
        tally.loads += 1
        return load(self, ptrs, mask, *args)

    def counted_store(self, ptrs, value, mask, *args):
        tally.written_bytes += int(np.count_nonzero(mask.data)) * size(ptrs)
        tally.stores += 1
        return store(self, ptrs, value, mask, *args)

    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store
    try:
        yield tally
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


# ---- what the mask prevents ---------------------------------------------------------------------


@dataclass(frozen=True)
class MaskDemo:
    """One launch of the add on x, y and out laid out back to back in one allocation, followed by a
    neighbouring tensor (what the caching allocator puts next to out)."""

    n: int
    block: int
    masked: bool
    grid: int
    out_correct: bool  # out == x + y exactly
    neighbour_changed: int  # elements of the neighbour the launch overwrote
    neighbour_before: tuple[float, ...]  # its first few values, before and after
    neighbour_after: tuple[float, ...]

    @property
    def lanes_past_n(self) -> int:
        return self.grid * self.block - self.n


def mask_demo(n: int, block: int, masked: bool = True, seed: int = 0, shown: int = 4) -> MaskDemo:
    """Run :func:`add` (masked or not) with x, y, out and a neighbouring tensor of ``block``
    elements carved back to back out of one torch allocation, so a write past out lands in the
    neighbour (not in memory Python owns), and report what changed."""
    import torch

    n = integer("n", n, 1, unit="elements")
    b = _block(block)
    gen = torch.Generator().manual_seed(integer("seed", seed, 0))
    heap = torch.empty(3 * n + b, dtype=torch.float32)
    x, y, out, neighbour = heap[:n], heap[n:2 * n], heap[2 * n:3 * n], heap[3 * n:]
    x.copy_(torch.randn(n, generator=gen))
    y.copy_(torch.randn(n, generator=gen))
    out.zero_()
    # recognisable values; each ends in .5, so no sum of two of them (what an unmasked program stores when its
    # loads run into the neighbour too) can equal one, and a write is always a change
    neighbour.copy_(torch.arange(1, b + 1, dtype=torch.float32) * 1000.0 + 0.5)
    before = neighbour.clone()
    add(x, y, out, block=b, masked=masked)
    changed = int((neighbour != before).sum())
    k = integer("shown", shown, 1)
    return MaskDemo(n, b, bool(masked), grid_size(n, b), bool(torch.equal(out, x + y)), changed,
                    tuple(before[:k].tolist()), tuple(neighbour[:k].tolist()))
