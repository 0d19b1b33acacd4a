"""Row-wise kernels: softmax (and, below, RMSNorm and LayerNorm) in Triton, their HBM traffic, and
the block-size and wide-row arithmetic. The one home of these kernels and their cost.

**The softmax kernel** (:func:`softmax`, kernel ``softmax_rows``): one program per row. The program
loads its whole row once into registers, as a block of ``BLOCK`` = the next power of two >= n_cols
lanes (the lanes past the row load -inf, so they weigh exp(-inf) = 0), takes the max, exp(x - max),
the sum, divides, and writes the row once: one read and one write of HBM per element, what a copy
of the matrix moves. Half inputs are upcast to fp32 before the max (``ACC_FP32``); a row whose
entries are all -inf writes zeros (the book's convention; ``torch.softmax`` gives NaN).
:func:`softmax_looped` is the fix for rows too wide for one program's registers: it walks the row
in tiles twice, the first pass carrying the online (max, sum) recurrence of
:mod:`lib.attention.online_softmax` (whose numpy code is its oracle), the second writing
exp(x - m) / l: two reads and one write.

**The block-size rule and the wide-row limit.** Each of the program's 32 x num_warps threads holds
BLOCK / threads fp32 values of the row, one register each, plus ``overhead`` registers of its own
(pointers, offsets, the mask, the max and the sum: ``kernels_rowwise.row_kernel_overhead_registers``
in data/assumptions.yaml). A thread may use at most the registers that still let one block of the
launch reside on an SM (:func:`lib.kernels.sm.occupancy`: 255 per thread, and 65,536 per block, so
64 per thread at 32 warps). Past that the compiler spills the row to local memory. The widest row
one program holds is therefore

    widest = 2^floor(log2((cap - overhead) x 32 x num_warps))      elements, cap = registers per thread

(BLOCK is a power of two). The num_warps rule the published kernels use (Unsloth's and Liger's
``calculate_settings``): 4 warps below BLOCK 2048, 8 below 8192, 16 below 32768, 32 from there.

**Cost** (:func:`row_kernel_cost`): bytes = what each design reads and writes per element x rows x
n_cols x bytes per element (:data:`SOFTMAX_DESIGNS`; the multi-pass counts are
:func:`lib.attention.online_softmax.softmax_io`'s), time = fixed + max(memory, vector math, exp)
with memory = bytes / (datasheet bandwidth x streaming efficiency), vector math = FP32 operations /
the FP32 (non-tensor) peak, exp = exponentials / (SFU results per SM per clock x SMs x clock), and
the fixed cost and streaming efficiency of :func:`lib.perf.step.step_assumptions`. A copy of the
same matrix (read it once, write it once) pays the same fixed cost and efficiency; a kernel is
done when it runs at ``kernels_rowwise.done_fraction_of_copy`` of the copy's speed.

The Triton kernels are built on first use (:func:`kernels`), so ``import lib`` and the explorers
never import triton or torch. Units: bytes, seconds, elements, registers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from lib.inputs import integer, real
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu

__all__ = [
    "LAYERNORM_VARIANCE",
    "NORM_KINDS",
    "REVIEW_CHANGES",
    "REVIEW_TITLES",
    "ROW_DTYPES",
    "SOFTMAX_DESIGNS",
    "VECTOR_BYTES",
    "WARPS_RULE",
    "NormPipeline",
    "RowFit",
    "RowKernelCost",
    "add_norm",
    "block_size",
    "copy_cost",
    "done_fraction_of_copy",
    "emulate_norm_program",
    "emulate_softmax_program",
    "kernels",
    "layernorm_variance",
    "norm_ceiling",
    "norm_pipeline",
    "norm_review",
    "num_warps_for_block",
    "overhead_registers",
    "relative_error",
    "register_cap_per_thread",
    "row_fit",
    "row_kernel_cost",
    "softmax",
    "softmax_design_io",
    "softmax_looped",
    "stream_cost",
    "torch_dtype",
    "widest_row_in_registers",
]

ROW_DTYPES = ("fp32", "fp16", "bf16")
"""Storage dtypes of the rows these kernels read and write."""

SOFTMAX_DESIGNS = ("row_in_registers", "online_two_pass", "three_pass")
"""How a softmax kernel can be written: the row loaded once into registers (one read, one write);
two passes over the row in HBM with the online (max, sum) recurrence (two reads, one write); the
textbook three passes: max, sum, normalize (three reads, one write)."""

# Per element of the row: FP32 vector operations and exponentials (the SFU's) of each design.
# row_in_registers: max (compare), subtract, add into the sum, multiply by 1/sum; one exp.
# online_two_pass: pass 1 max, subtract, add (the per-tile rescale is per tile, not per element);
# pass 2 subtract, multiply: 5 operations and 2 exps. three_pass: max; subtract, add; subtract,
# multiply: 5 operations, 2 exps.
_VECTOR_OPS = {"row_in_registers": 4, "online_two_pass": 5, "three_pass": 5}
_EXPS = {"row_in_registers": 1, "online_two_pass": 2, "three_pass": 2}
_SOFTMAX_IO = {"online_two_pass": "online", "three_pass": "three_pass"}

WARPS_RULE = ((32768, 32), (8192, 16), (2048, 8), (1, 4))
"""The published block-size rule (module docstring): (smallest BLOCK, num_warps), from the top."""
RULE_SOURCE = ("unslothai/unsloth unsloth/kernels/utils.py calculate_settings (and linkedin/Liger-Kernel "
               "ops/utils.py, which copies it): BLOCK_SIZE = next_power_of_2(n); num_warps = 32 if BLOCK_SIZE >= "
               "32768, 16 if >= 8192, 8 if >= 2048, else 4; MAX_FUSED_SIZE = 65536")


def _dtype(dtype: str) -> str:
    if dtype not in ROW_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(ROW_DTYPES)}; got {dtype!r}")
    return dtype


# ---- the block-size rule and the wide-row limit -------------------------------------------------


def block_size(n_cols: int) -> int:
    """BLOCK = the next power of two >= n_cols: the lanes one program spans (Triton's tl.arange
    needs a power of two); the BLOCK - n_cols lanes past the row are masked."""
    n = integer("n_cols", n_cols, 1, unit="columns")
    return 1 << (n - 1).bit_length()


def num_warps_for_block(block: int) -> int:
    """The published num_warps rule (``RULE_SOURCE``): 4 below BLOCK 2048, 8 below 8192, 16 below
    32768, 32 from 32768 on."""
    b = integer("block", block, 1, unit="lanes")
    return next(w for start, w in WARPS_RULE if b >= start)


def overhead_registers() -> int:
    """Registers per thread a one-program-per-row kernel keeps besides its share of the row
    (``kernels_rowwise.row_kernel_overhead_registers``, an assumption with a range)."""
    return int(assumptions.value("kernels_rowwise.row_kernel_overhead_registers"))


def done_fraction_of_copy() -> float:
    """The speed, as a fraction of a copy of the same bytes, at which a memory-bound kernel is
    done (``kernels_rowwise.done_fraction_of_copy``)."""
    return float(assumptions.value("kernels_rowwise.done_fraction_of_copy"))


def _num_warps(num_warps: int, chip: GPU) -> int:
    from lib.kernels.sm import sm_limits

    lim = sm_limits(chip)
    most = lim.max_threads_per_block // lim.warp_size
    w = integer("num_warps", num_warps, 1, most, unit="warps")
    if w & (w - 1):
        raise ValueError(f"num_warps must be a power of two (Triton's rule), from 1 to {most}; got {w}")
    return w


def register_cap_per_thread(chip: str | GPU, num_warps: int) -> int:
    """The most registers per thread a launch of 32 x ``num_warps`` threads may use and still have
    one block resident on an SM: :func:`lib.kernels.sm.register_cap` at ``min_blocks`` = 1
    (255 at up to 8 warps on every NVIDIA GPU here; 128 at 16 warps; 64 at 32)."""
    g = gpu(chip)
    return _register_cap(g.key, _num_warps(num_warps, g))


@functools.cache
def _register_cap(key: str, num_warps: int) -> int:
    from lib.kernels.sm import register_cap, sm_limits

    lim = sm_limits(key)
    return register_cap(lim, num_warps * lim.warp_size, 1)


def widest_row_in_registers(chip: str | GPU, num_warps: int, overhead: int | None = None) -> int:
    """Widest row (a power of two, elements) one program of ``num_warps`` warps holds in registers
    without spilling: 2^floor(log2((cap - overhead) x threads)), one fp32 register per element."""
    from lib.kernels.sm import sm_limits

    g = gpu(chip)
    o = overhead_registers() if overhead is None else integer("overhead", overhead, 0, unit="registers")
    cap = register_cap_per_thread(g, num_warps)
    if cap <= o:
        raise ValueError(f"{g.key}: {num_warps} warps leave {cap} registers per thread, not more than the {o} "
                         "overhead registers: no row fits")
    elements = (cap - o) * num_warps * sm_limits(g).warp_size
    return 1 << (elements.bit_length() - 1)


@dataclass(frozen=True)
class RowFit:
    """How one program of the softmax launch holds a row of ``n_cols`` (module docstring)."""

    gpu: str
    n_cols: int
    block: int
    num_warps: int
    threads: int
    elements_per_thread: int  # fp32 registers of row data per thread
    overhead_registers: int
    register_cap: int  # registers per thread one resident block allows
    widest_row: int  # at this num_warps
    programs_per_sm: int  # resident programs (blocks) per SM at the registers it needs (capped)

    @property
    def registers_needed(self) -> int:
        return self.elements_per_thread + self.overhead_registers

    @property
    def fits(self) -> bool:
        """The row sits in registers without spilling."""
        return self.registers_needed <= self.register_cap

    @property
    def idle_lane_fraction(self) -> float:
        """Masked lanes of the block: (BLOCK - n_cols) / BLOCK (registers and exp work, never bytes)."""
        return (self.block - self.n_cols) / self.block


def row_fit(chip: str | GPU, n_cols: int, num_warps: int | None = None, overhead: int | None = None) -> RowFit:
    """BLOCK, num_warps (the published rule unless given), registers per thread, whether the row fits
    and how many such programs an SM holds (:func:`lib.kernels.sm.occupancy`)."""
    from lib.kernels.sm import occupancy, sm_limits

    g = gpu(chip)
    lim = sm_limits(g)
    block = block_size(n_cols)
    w = num_warps_for_block(block) if num_warps is None else _num_warps(num_warps, g)
    o = overhead_registers() if overhead is None else integer("overhead", overhead, 0, unit="registers")
    threads = w * lim.warp_size
    per_thread = max(1, block // threads)  # a block narrower than the threads is replicated
    cap = register_cap_per_thread(g, w)
    widest = widest_row_in_registers(g, w, o) if cap > o else 0
    programs = occupancy(lim, threads, min(per_thread + o, cap)).blocks_per_sm
    return RowFit(g.key, int(n_cols), block, w, threads, per_thread, o, cap, widest, programs)


# ---- traffic and time ---------------------------------------------------------------------------


def softmax_design_io(design: str) -> tuple[int, int]:
    """(reads, writes) of HBM per element of the row for a softmax ``design``: (1, 1) for the row in
    registers; the online and three-pass counts of :func:`lib.attention.online_softmax.softmax_io`
    ((2, 1) and (3, 1))."""
    if design not in SOFTMAX_DESIGNS:
        raise ValueError(f"design must be one of {', '.join(SOFTMAX_DESIGNS)}; got {design!r}")
    if design == "row_in_registers":
        return 1, 1
    from lib.attention.online_softmax import softmax_io

    io = softmax_io(1, _SOFTMAX_IO[design])
    return io.reads, io.writes


@dataclass(frozen=True)
class RowKernelCost:
    """Bytes and modelled time of one row-wise kernel over a rows x n_cols matrix (module docstring).
    Seconds; ``exp_s`` is None where data/hardware.yaml has no SFU rate for the GPU."""

    name: str
    rows: int
    n_cols: int
    dtype: str
    gpu: str
    bytes_read: float
    bytes_written: float
    vector_ops: float
    exps: float
    bandwidth: float  # datasheet bytes/s
    efficiency: float  # the streaming fraction of it
    fixed_s: float
    compute_s: float  # vector ops at the FP32 (non-tensor) peak
    exp_s: float | None
    min_bytes: float  # what a copy of the matrix moves: one read and one write

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def floor_s(self) -> float:
        """bytes / datasheet bandwidth."""
        return self.bytes / self.bandwidth

    @property
    def memory_s(self) -> float:
        """bytes / (bandwidth x streaming efficiency)."""
        return self.bytes / (self.bandwidth * self.efficiency)

    @property
    def time_s(self) -> float:
        """fixed + max(memory, vector math, exp): the pipes overlap, the slowest one sets the time."""
        from lib.perf.step import kernel_time_s

        return kernel_time_s(self.fixed_s, self.memory_s, self.compute_s, self.exp_s or 0.0)

    @property
    def bound(self) -> str:
        parts = {"memory": self.memory_s, "vector math": self.compute_s, "exp (SFU)": self.exp_s or 0.0}
        return max(parts, key=parts.get)

    @property
    def effective_bandwidth(self) -> float:
        """The matrix's read + write bytes / time (bytes/s): what a benchmark of the kernel reports."""
        return self.min_bytes / self.time_s


def _check_shape(rows: int, n_cols: int) -> tuple[int, int]:
    return integer("rows", rows, 1, unit="rows"), integer("n_cols", n_cols, 1, unit="columns")


def _efficiency_and_fixed(efficiency: float | None, fixed_s: float | None) -> tuple[float, float]:
    from lib.perf.step import step_assumptions

    a = step_assumptions()
    eff = a.gemv_efficiency if efficiency is None else real("efficiency", efficiency, 0, 1, low_open=True)
    fixed = a.kernel_fixed_s if fixed_s is None else real("fixed_s", fixed_s, 0, unit="seconds")
    return eff, fixed


def stream_cost(rows: int, n_cols: int, chip: str | GPU, dtype: str, reads: float, writes: float, *,
                vector_ops: float = 0.0, exps: float = 0.0, name: str = "kernel",
                efficiency: float | None = None, fixed_s: float | None = None) -> RowKernelCost:
    """Bytes and time of any row-wise kernel over rows x n_cols elements of ``dtype`` that moves
    ``reads`` + ``writes`` element-sized HBM accesses per element (fractions allowed: an fp32 output
    of a bf16 matrix is 2 writes) and does ``vector_ops`` FP32 operations and ``exps`` exponentials
    per element, timed as in the module docstring."""
    rows, n_cols = _check_shape(rows, n_cols)
    g = gpu(chip)
    b = bytes_per_element(_dtype(dtype))
    reads, writes = real("reads", reads, 0), real("writes", writes, 0)
    vector_ops, exps = real("vector_ops", vector_ops, 0), real("exps", exps, 0)
    eff, fixed = _efficiency_and_fixed(efficiency, fixed_s)
    n = rows * n_cols
    sfu = None
    if g.sfu_ops_per_sm_clock is not None and g.tensor_clock_hz is not None:
        sfu = g.sfu_ops_per_sm_clock * g.compute_units * g.tensor_clock_hz
    return RowKernelCost(
        name, rows, n_cols, dtype, g.key, reads * n * b, writes * n * b, vector_ops * n, exps * n,
        g.memory_bandwidth, eff, fixed, vector_ops * n / g.peak_flops("fp32"),
        None if sfu is None else exps * n / sfu, 2.0 * n * b)


def copy_cost(rows: int, n_cols: int, chip: str | GPU, dtype: str = "bf16", *, efficiency: float | None = None,
              fixed_s: float | None = None) -> RowKernelCost:
    """A copy of the rows x n_cols matrix: one read and one write per element, no arithmetic; the
    speed of light of every row-wise kernel (same fixed cost and streaming efficiency)."""
    return stream_cost(rows, n_cols, chip, dtype, 1, 1, name="copy", efficiency=efficiency, fixed_s=fixed_s)


def row_kernel_cost(rows: int, n_cols: int, chip: str | GPU, dtype: str = "bf16",
                    design: str = "row_in_registers", *, efficiency: float | None = None,
                    fixed_s: float | None = None) -> RowKernelCost:
    """Bytes and time of a softmax ``design`` (:data:`SOFTMAX_DESIGNS`) over rows x n_cols in
    ``dtype``: reads and writes per element from :func:`softmax_design_io`, the vector operations
    and exponentials of ``_VECTOR_OPS`` / ``_EXPS``, timed as in the module docstring. ``efficiency``
    and ``fixed_s`` default to the decode step's streaming efficiency and per-kernel fixed cost."""
    reads, writes = softmax_design_io(design)
    return stream_cost(rows, n_cols, chip, dtype, reads, writes, vector_ops=_VECTOR_OPS[design],
                       exps=_EXPS[design], name=design, efficiency=efficiency, fixed_s=fixed_s)


# ---- the numerics of one program, emulated in numpy ----------------------------------------------


def _round(x: np.ndarray, acc: str) -> np.ndarray:
    if acc == "fp32":
        return np.asarray(x, np.float32)
    from lib.attention.naive import round_to_dtype

    return round_to_dtype(np.asarray(x, np.float32), acc)


def emulate_softmax_program(x: np.ndarray, acc_dtype: str, threads: int) -> np.ndarray:
    """What one program of the softmax kernel computes for each row of ``x`` (rows, n_cols; values
    already in the input dtype) when its arithmetic runs in ``acc_dtype`` ("fp32", "fp16", "bf16"):
    x - max rounded to acc, exp computed in fp32 (Triton's exp takes fp32) and rounded to acc, the
    sum reduced in the kernel's order (each of ``threads`` threads adds its BLOCK / threads lanes one
    by one, then a pairwise tree across threads), every partial sum rounded to acc, and the
    division in fp32 (Triton promotes it). Returns float32 probabilities (all -inf rows: zeros).
    A numpy emulation, because the CPU interpreter cannot do bf16 arithmetic."""
    if acc_dtype not in ROW_DTYPES:
        raise ValueError(f"acc_dtype must be one of {', '.join(ROW_DTYPES)}; got {acc_dtype!r}")
    x = np.asarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (rows, n_cols), got shape {x.shape}")
    rows, n = x.shape
    block = block_size(n)
    t = integer("threads", threads, 1, unit="threads")
    if t & (t - 1):
        raise ValueError(f"threads must be a power of two, got {t}")
    lanes = np.full((rows, block), -np.inf, np.float32)
    lanes[:, :n] = x
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = lanes.max(axis=1, keepdims=True)
        m = np.where(np.isneginf(m), np.float32(0), m)
        z = _round(lanes - m, acc_dtype)
        e = _round(np.exp(z), acc_dtype)
        per = max(1, block // t)
        part = e.reshape(rows, per, -1)  # thread j holds lanes j, j + threads, ...
        s = part[:, 0, :]
        for i in range(1, per):
            s = _round(s + part[:, i, :], acc_dtype)
        while s.shape[1] > 1:
            s = _round(s[:, 0::2] + s[:, 1::2], acc_dtype)
        den = s[:, :1].astype(np.float32)
        y = e / np.where(den == 0, np.float32(1), den)
    return y[:, :n].astype(np.float32)


def relative_error(y: np.ndarray, exact: np.ndarray, floor: float = 1e-3) -> float:
    """Largest relative error |y - e| / |e| over the entries e of ``exact`` (rows, n_cols) whose
    magnitude is at least ``floor`` x their row's largest: for a softmax, the probabilities a sampler
    or an attention output actually feels; for a norm, every output but the near-zero ones (smaller
    entries round to nothing in any dtype)."""
    y, e = np.asarray(y, np.float64), np.asarray(exact, np.float64)
    if y.shape != e.shape or e.ndim != 2:
        raise ValueError(f"y and exact must be 2-D arrays of one shape, got {y.shape} and {e.shape}")
    f = real("floor", floor, 0, 1, low_open=True)
    mag = np.abs(e)
    top = mag.max(axis=1, keepdims=True)
    keep = (mag >= f * top) & (top > 0)
    if not keep.any():
        raise ValueError("no entry to compare: every row of exact is zero")
    with np.errstate(invalid="ignore"):
        err = np.abs(y - e)[keep] / mag[keep]
    return float(np.nan_to_num(err, nan=np.inf).max())


# ---- normalization: the kernels a reviewer sees and the six changes (N006) ------------------------

NORM_KINDS = ("rmsnorm", "layernorm")

REVIEW_CHANGES = ("fp32_accumulation", "output_dtype", "row_in_registers", "fuse_residual_add",
                  "one_pass_statistics", "vectorized_loads")
"""The six changes of a normalization kernel review, in the order a reviewer asks for them: the
correctness fix first, then the three that remove bytes or launches (the cast kernel, then the row
in registers, then the fused add, which pays only once the row is read once), then the two the
bandwidth model does not price (a reduction per row, load instructions)."""

REVIEW_TITLES = {
    "fp32_accumulation": "accumulate the statistics in fp32",
    "output_dtype": "write the output dtype directly (no fp32 output and cast kernel)",
    "row_in_registers": "one program per row, the row held in registers (read it once)",
    "fuse_residual_add": "fuse the residual add into the norm",
    "one_pass_statistics": "one pass for the statistics (Welford, or sum and sum of squares together)",
    "vectorized_loads": "16-byte vectorized loads",
}

VECTOR_BYTES = 16
"""The widest global load a thread issues (LDG.128): 8 bf16 or 4 fp32 values."""

_NORM_OPS = {"rmsnorm": 4, "layernorm": 6}  # per element: square and add, scale, weight (LN: subtract, bias)


@dataclass(frozen=True)
class NormPipeline:
    """The kernels one residual add + normalization runs as, after the changes in ``applied``
    (module docstring of the review: :func:`norm_pipeline`)."""

    kind: str
    tokens: int
    hidden: int
    dtype: str
    gpu: str
    applied: tuple[str, ...]
    kernels: tuple[RowKernelCost, ...]
    statistics_passes: int  # sweeps over the row for the statistics (over HBM unless the row is in registers)
    block_reductions: int  # block-wide reductions per row (each a barrier)
    load_instructions_per_row: float  # warp-wide global load instructions, every kernel and pass
    accumulation: str  # the dtype the statistics are summed in

    @property
    def launches(self) -> int:
        return len(self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)

    @property
    def time_s(self) -> float:
        """The kernels one after the other: each its fixed cost + max(memory, math)."""
        return sum(k.time_s for k in self.kernels)


def _norm_kind(kind: str) -> str:
    if kind not in NORM_KINDS:
        raise ValueError(f"kind must be one of {', '.join(NORM_KINDS)}; got {kind!r}")
    return kind


def norm_pipeline(tokens: int, hidden: int, chip: str | GPU, dtype: str = "bf16", kind: str = "rmsnorm",
                  applied=(), *, efficiency: float | None = None, fixed_s: float | None = None) -> NormPipeline:
    """The kernels of h = x + residual, y = norm(h) (``kind``), over tokens x hidden in ``dtype``,
    before and after the review's changes (``applied``, a subset of :data:`REVIEW_CHANGES`).

    The kernel under review: an add kernel (reads x and the residual, writes h); a norm kernel that
    loops over the row in tiles, one sweep per statistic (RMSNorm: the sum of squares; LayerNorm: the
    mean, then the variance) plus one to normalize, reading h on every sweep, accumulating in the
    input dtype with one scalar load per element, and writing fp32; a cast kernel (reads fp32,
    writes ``dtype``). In element-sized HBM accesses per element of the matrix:

    * ``output_dtype``: the norm writes ``dtype`` (1 instead of 4 / b), the cast kernel goes;
    * ``row_in_registers``: every statistic and the output from one read of the row (one sweep
      over HBM instead of statistics + 1);
    * ``fuse_residual_add``: the norm reads x and the residual and writes h itself, so the add
      kernel and the norm's read of h go;
    * ``one_pass_statistics``: LayerNorm's mean and variance in one sweep and one block reduction
      (a looped kernel saves a read; with the row in registers, a barrier per row);
    * ``vectorized_loads``: 16-byte loads instead of one element per thread: the same bytes in
      fewer load instructions;
    * ``fp32_accumulation``: no bytes; the statistics' error (:func:`emulate_norm_program`).

    Weights (hidden x b) are read once per program from L2 and are not counted. Times as in
    :func:`stream_cost`."""
    kind = _norm_kind(kind)
    unknown = set(applied) - set(REVIEW_CHANGES)
    if unknown:
        raise ValueError(f"unknown change(s) {sorted(unknown)}; the review's changes: {', '.join(REVIEW_CHANGES)}")
    on = frozenset(applied)
    b = bytes_per_element(_dtype(dtype))
    fp32_units = 4.0 / b  # an fp32 element in units of the storage element
    stats = 1 if kind == "rmsnorm" or "one_pass_statistics" in on else 2
    fused = "fuse_residual_add" in on
    sweeps = 1 if "row_in_registers" in on else stats + 1
    out_units = 1.0 if "output_dtype" in on else fp32_units
    ops = _NORM_OPS[kind] + (1 if fused else 0)
    plan = []  # (name, reads, writes, ops, bytes per element each read)
    if not fused:
        plan.append(("residual add", 2.0, 1.0, 1.0))
    plan.append(("norm", sweeps * (2.0 if fused else 1.0), out_units + (1.0 if fused else 0.0), float(ops)))
    if out_units != 1.0:
        plan.append(("cast to " + dtype, fp32_units, 1.0, 0.0))
    kernels = tuple(stream_cost(tokens, hidden, chip, dtype, r, w, vector_ops=o, name=n, efficiency=efficiency,
                                fixed_s=fixed_s) for n, r, w, o in plan)
    vector = "vectorized_loads" in on
    loads = 0.0
    for n, r, _, _ in plan:
        elem = 4.0 if n.startswith("cast") else b  # the cast kernel reads fp32
        width = VECTOR_BYTES if vector else elem
        loads += r * hidden * b / (32 * width)
    g = gpu(chip)
    reductions = 1 if kind == "rmsnorm" or "one_pass_statistics" in on else 2
    acc = "fp32" if "fp32_accumulation" in on else dtype
    return NormPipeline(kind, int(tokens), int(hidden), dtype, g.key, tuple(sorted(on, key=REVIEW_CHANGES.index)),
                        kernels, stats, reductions, loads, acc)


def norm_review(tokens: int, hidden: int, chip: str | GPU, dtype: str = "bf16", kind: str = "rmsnorm", *,
                efficiency: float | None = None, fixed_s: float | None = None) -> list[NormPipeline]:
    """The kernel under review, then the pipeline after each of :data:`REVIEW_CHANGES` in turn
    (cumulative): seven pipelines."""
    out = [norm_pipeline(tokens, hidden, chip, dtype, kind, (), efficiency=efficiency, fixed_s=fixed_s)]
    for i in range(len(REVIEW_CHANGES)):
        out.append(norm_pipeline(tokens, hidden, chip, dtype, kind, REVIEW_CHANGES[: i + 1], efficiency=efficiency,
                                 fixed_s=fixed_s))
    return out


def norm_ceiling(tokens: int, hidden: int, chip: str | GPU, dtype: str = "bf16", residual: bool = True, *,
                 efficiency: float | None = None, fixed_s: float | None = None) -> RowKernelCost:
    """The copy that sets the ceiling: the bytes a normalization must move, in one launch. Without a
    residual, read one row and write one row (a copy of the matrix); with one, read x and the
    residual and write h and y (two copies' bytes)."""
    n = 2.0 if residual else 1.0
    return stream_cost(tokens, hidden, chip, dtype, n, n, name="copy (the ceiling)", efficiency=efficiency,
                       fixed_s=fixed_s)


def _thread_sum(v: np.ndarray, acc: str, threads: int) -> np.ndarray:
    """Row sums of v (rows, block) in the kernel's order: each thread adds its lanes in turn, then a
    pairwise tree across threads, every partial rounded to ``acc``."""
    rows, block = v.shape
    per = max(1, block // threads)
    part = v.reshape(rows, per, -1)
    s = part[:, 0, :]
    for i in range(1, per):
        s = _round(s + part[:, i, :], acc)
    while s.shape[1] > 1:
        s = _round(s[:, 0::2] + s[:, 1::2], acc)
    return s[:, 0]


def emulate_norm_program(x: np.ndarray, acc_dtype: str, threads: int, kind: str = "rmsnorm",
                         eps: float = 1e-6) -> np.ndarray:
    """What one program of :func:`add_norm` computes (before the weight and bias) for each row of
    ``x`` (rows, hidden; values already in the storage dtype) when its statistics run in
    ``acc_dtype``, in Triton's semantics: RMSNorm squares and sums in acc (each square and partial
    sum rounded; the sum reduced per thread, then a tree), then mean, rsqrt and the scaling in fp32
    (Triton promotes the division); LayerNorm sums x in acc, and the centered variance in fp32
    once the mean is fp32. Returns float32 outputs. A numpy emulation: the CPU interpreter sums half
    precision in fp32 internally."""
    if acc_dtype not in ROW_DTYPES:
        raise ValueError(f"acc_dtype must be one of {', '.join(ROW_DTYPES)}; got {acc_dtype!r}")
    kind = _norm_kind(kind)
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be 2-D (rows, hidden), got shape {x.shape}")
    t = integer("threads", threads, 1, unit="threads")
    if t & (t - 1):
        raise ValueError(f"threads must be a power of two, got {t}")
    eps = real("eps", eps, 0, low_open=True)
    rows, n = x.shape
    lanes = np.zeros((rows, block_size(n)), np.float32)
    lanes[:, :n] = x
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if kind == "layernorm":
            mean = (_thread_sum(lanes, acc_dtype, t) / n).astype(np.float32)
            centered = np.where(np.arange(lanes.shape[1]) < n, lanes - mean[:, None], 0).astype(np.float32)
            var = (_thread_sum(centered * centered, "fp32", t) / n).astype(np.float32)
            y = centered * (1 / np.sqrt(var + np.float32(eps)))[:, None]
        else:
            sq = _round(lanes * lanes, acc_dtype)
            var = (_thread_sum(sq, acc_dtype, t) / n).astype(np.float32)
            y = lanes * (1 / np.sqrt(var + np.float32(eps)))[:, None]
    return y[:, :n].astype(np.float32)


LAYERNORM_VARIANCE = ("two_pass", "sum_and_sumsq", "welford")


def layernorm_variance(x: np.ndarray, method: str = "welford", threads: int = 256) -> np.ndarray:
    """Each row's variance in fp32 by ``method``: ``two_pass`` (the mean, then the centered sum of
    squares: two sweeps, exact to rounding), ``sum_and_sumsq`` (one sweep: E[x^2] - E[x]^2, which
    cancels when |mean| >> std), ``welford`` (one sweep: each thread updates (n, mean, M2) per
    element, then Chan's pairwise combine across threads: one pass and no cancellation)."""
    if method not in LAYERNORM_VARIANCE:
        raise ValueError(f"method must be one of {', '.join(LAYERNORM_VARIANCE)}; got {method!r}")
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be 2-D (rows, hidden), got shape {x.shape}")
    t = integer("threads", threads, 1, unit="threads")
    rows, n = x.shape
    f32 = np.float32
    if method == "two_pass":
        mean = (x.sum(axis=1, dtype=f32) / f32(n)).astype(f32)
        d = (x - mean[:, None]).astype(f32)
        return ((d * d).sum(axis=1, dtype=f32) / f32(n)).astype(f32)
    if method == "sum_and_sumsq":
        s1, s2 = x.sum(axis=1, dtype=f32), (x * x).sum(axis=1, dtype=f32)
        mean = (s1 / f32(n)).astype(f32)
        return (s2 / f32(n) - mean * mean).astype(f32)
    pad = -(-n // t) * t
    lanes = np.full((rows, pad), np.nan, f32)
    lanes[:, :n] = x
    part = lanes.reshape(rows, -1, t)  # thread j holds lanes j, j + t, ...
    cnt = np.zeros((rows, t), f32)
    mean = np.zeros((rows, t), f32)
    m2 = np.zeros((rows, t), f32)
    for i in range(part.shape[1]):
        v = part[:, i, :]
        ok = ~np.isnan(v)
        c1 = cnt + ok
        delta = np.where(ok, v - mean, 0).astype(f32)
        mean = np.where(ok, mean + delta / np.maximum(c1, 1), mean).astype(f32)
        m2 = np.where(ok, m2 + delta * (np.where(ok, v, 0) - mean), m2).astype(f32)
        cnt = c1.astype(f32)
    while cnt.shape[1] > 1:  # Chan et al.'s combine of (n, mean, M2), pairwise
        na, nb = cnt[:, 0::2], cnt[:, 1::2]
        nab = na + nb
        delta = (mean[:, 1::2] - mean[:, 0::2]).astype(f32)
        w = np.where(nab > 0, nb / np.maximum(nab, 1), 0).astype(f32)
        mean = (mean[:, 0::2] + delta * w).astype(f32)
        m2 = (m2[:, 0::2] + m2[:, 1::2] + delta * delta * na * w).astype(f32)
        cnt = nab
    return (m2[:, 0] / f32(n)).astype(f32)


# ---- the Triton kernels and their launches ---------------------------------------------------------


@functools.cache
def kernels() -> SimpleNamespace:
    """The Triton kernels, built on first use (imports triton, and torch through
    :mod:`lib.kernels.triton_env`, which picks the CPU interpreter when there is no GPU)."""
    global triton, tl  # the kernels read them as module globals, as Triton expects
    from lib.kernels.triton_env import tl, triton

    @triton.jit
    def softmax_rows(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols,
                     BLOCK: tl.constexpr, ACC_FP32: tl.constexpr = True, SUBTRACT_MAX: tl.constexpr = True):
        row = tl.program_id(0).to(tl.int64)  # one program per row; int64: rows x stride can pass 2^31
        cols = tl.arange(0, BLOCK)  # BLOCK = next power of two >= n_cols
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols, other=-float("inf"))  # the one read
        if ACC_FP32:
            x = x.to(tl.float32)  # half inputs: max, exp, sum and divide in fp32
        if SUBTRACT_MAX:
            m = tl.max(x, axis=0)
            x = x - tl.where(m == -float("inf"), 0.0, m)  # every exponent <= 0; an all -inf row stays -inf
        num = tl.exp(x.to(tl.float32)).to(x.dtype)  # Triton's exp takes fp32; keep the kernel's dtype
        den = tl.sum(num, axis=0)
        y = num / tl.where(den == 0.0, 1.0, den)  # an all -inf row writes zeros, not 0 / 0
        tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)  # the one write

    @triton.jit
    def softmax_rows_looped(x_ptr, y_ptr, lse_ptr, x_row_stride, y_row_stride, n_cols, TILE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        x_row, y_row = x_ptr + row * x_row_stride, y_ptr + row * y_row_stride
        cols = tl.arange(0, TILE)
        m = tl.full((), -float("inf"), tl.float32)  # running max
        s = tl.full((), 0.0, tl.float32)  # running sum of exp(x - m)
        for start in range(0, n_cols, TILE):  # pass 1: read 1, the online (max, sum) recurrence
            x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - m_use) + tl.sum(tl.exp(x - m_use), axis=0)
            m = m_new
        m_use = tl.where(m == -float("inf"), 0.0, m)
        tl.store(lse_ptr + row, m_use + tl.log(s))
        for start in range(0, n_cols, TILE):  # pass 2: read 2, normalize, the one write
            x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
            y = tl.exp(x - m_use) / tl.where(s == 0.0, 1.0, s)
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=start + cols < n_cols)

    @triton.jit
    def add_norm_rows(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, row_stride, n_cols, eps,
                      BLOCK: tl.constexpr, LAYERNORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                      ACC_FP32: tl.constexpr = True):
        row = tl.program_id(0).to(tl.int64)  # one program per row (token)
        cols = tl.arange(0, BLOCK)  # the whole row: BLOCK = next power of two >= n_cols
        in_row = cols < n_cols
        x = tl.load(x_ptr + row * row_stride + cols, mask=in_row, other=0.0)  # read 1
        if ACC_FP32:
            x = x.to(tl.float32)  # the statistics in fp32 (the correctness fix)
        if HAS_RESIDUAL:  # the residual add, fused: h = x + residual never makes a round trip
            r = tl.load(r_ptr + row * row_stride + cols, mask=in_row, other=0.0)  # read 2
            x = x + (r.to(tl.float32) if ACC_FP32 else r)
            tl.store(h_ptr + row * row_stride + cols, x.to(h_ptr.dtype.element_ty), mask=in_row)  # the new residual
        if LAYERNORM:
            mean = tl.sum(x, axis=0) / n_cols
            x = tl.where(in_row, x - mean, 0.0)  # centered in registers: no second read, no cancellation
        var = tl.sum(x * x, axis=0) / n_cols  # Triton promotes the division to fp32
        y = x * (1.0 / tl.sqrt(var + eps)) * tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
        if LAYERNORM:
            y = y + tl.load(b_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=in_row)  # the output dtype

    return SimpleNamespace(softmax_rows=softmax_rows, softmax_rows_looped=softmax_rows_looped,
                           add_norm_rows=add_norm_rows)


def _rows_tensor(x):
    import torch

    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"x must be a 2-D torch tensor (rows, n_cols), got {type(x).__name__} "
                         f"{getattr(x, 'shape', '')}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x must have at least one row and one column, got shape {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def softmax(x, *, acc_fp32: bool = True, subtract_max: bool = True, num_warps: int | None = None):
    """Row softmax of the 2-D tensor ``x`` by the one-program-per-row kernel: grid = (rows,),
    BLOCK = :func:`block_size` (n_cols), num_warps by the published rule unless given. Returns a
    tensor of x's dtype. ``acc_fp32=False`` keeps half inputs in their dtype (the error it costs);
    ``subtract_max=False`` reproduces the overflow. bf16 with ``acc_fp32=False`` is refused on the
    CPU interpreter, which stores bf16 as raw 16-bit integers (use :func:`emulate_softmax_program`)."""
    import torch

    from lib.kernels.triton_env import INTERPRETED

    x = _rows_tensor(x)
    if not acc_fp32 and x.dtype == torch.bfloat16 and INTERPRETED:
        raise ValueError("the CPU interpreter cannot do bf16 arithmetic; emulate bf16 accumulation with "
                         "emulate_softmax_program")
    rows, n_cols = x.shape
    block = block_size(n_cols)
    warps = num_warps_for_block(block) if num_warps is None else integer("num_warps", num_warps, 1, 32)
    y = torch.empty_like(x)
    with np.errstate(all="ignore"):  # the interpreter's numpy would warn about the overflow it reproduces
        kernels().softmax_rows[(rows,)](x, y, x.stride(0), y.stride(0), n_cols, BLOCK=block,
                                        ACC_FP32=bool(acc_fp32), SUBTRACT_MAX=bool(subtract_max), num_warps=warps)
    return y


def softmax_looped(x, tile: int = 1024, num_warps: int = 8):
    """Row softmax for rows wider than one program's registers: two passes over each row in tiles
    of ``tile`` (a power of two) lanes. Returns (y of x's dtype, lse float32 per row: m + log l,
    -inf for an all -inf row)."""
    import torch

    x = _rows_tensor(x)
    t = integer("tile", tile, 1, unit="lanes")
    if t & (t - 1):
        raise ValueError(f"tile must be a power of two, got {t}")
    rows, n_cols = x.shape
    y = torch.empty_like(x)
    lse = torch.empty(rows, dtype=torch.float32, device=x.device)
    with np.errstate(all="ignore"):  # log(0) of an all -inf row is the -inf it should be
        kernels().softmax_rows_looped[(rows,)](x, y, lse, x.stride(0), y.stride(0), n_cols, TILE=t,
                                               num_warps=integer("num_warps", num_warps, 1, 32))
    return y, lse


def add_norm(x, weight, residual=None, bias=None, *, kind: str = "rmsnorm", eps: float = 1e-6,
             acc_fp32: bool = True):
    """The reviewed normalization kernel: h = x + residual (when given), y = norm(h) x weight (+ bias
    for LayerNorm), one program per row with the row in registers, statistics in fp32, the output
    written in x's dtype. Returns (y, h), h None without a residual. ``acc_fp32=False`` keeps the
    statistics in x's dtype (the bug the review fixes; on the CPU interpreter only elementwise
    rounding is faithful, so measure its error with :func:`emulate_norm_program`)."""
    import torch

    kind = _norm_kind(kind)
    x = _rows_tensor(x)
    rows, n = x.shape
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (n,):
        raise ValueError(f"weight must be a tensor of shape ({n},), got {getattr(weight, 'shape', weight)!r}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape):
        raise ValueError(f"residual must be a tensor of x's shape {tuple(x.shape)}")
    if kind == "layernorm" and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
        raise ValueError(f"layernorm needs a bias tensor of shape ({n},)")
    eps = real("eps", eps, 0, low_open=True)
    r = None if residual is None else residual.contiguous()
    x = x.contiguous()
    y = torch.empty_like(x)
    h = None if r is None else torch.empty_like(x)
    block = block_size(n)
    with np.errstate(all="ignore"):
        kernels().add_norm_rows[(rows,)](x, x if r is None else r, weight, weight if bias is None else bias, y,
                                         y if h is None else h, x.stride(0), n, eps, BLOCK=block,
                                         LAYERNORM=kind == "layernorm", HAS_RESIDUAL=r is not None,
                                         ACC_FP32=bool(acc_fp32), num_warps=num_warps_for_block(block))
    return y, h


def torch_dtype(dtype: str):
    """The torch dtype of a row dtype name (imports torch)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[_dtype(dtype)]
