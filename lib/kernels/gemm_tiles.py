"""What sizes a GEMM tile (I036) and what each step of a hand-written SGEMM buys (N099).

A CTA computes a ``tile_m x tile_n`` block of C = A B and walks K in steps of ``bk``. Each step
loads ``(tile_m + tile_n) bk`` operand elements into shared memory and does ``2 tile_m tile_n bk``
FLOPs on them, so its **operand intensity** is

    I = 2 tile_m tile_n / ((tile_m + tile_n) e)        FLOP per byte, e = bytes per element

(:func:`tile_intensity`; ``bk`` cancels). Each dimension of the tile answers to a different part of
the SM:

* **M and N, reuse**: the CTA's loads come from L2 at the chip's L2 bandwidth W_L2
  (:func:`lib.kernels.l2.l2_read_bandwidth`), so the tile sustains at most I x W_L2; it stops being
  the limit when I reaches the *L2 ridge point* P / W_L2 (:func:`l2_ridge_point`). One level down,
  the MMA tile that reads shared memory meets the same arithmetic against the shared-memory
  bandwidth (:func:`smem_bandwidth`, :func:`smem_ridge_point`).
* **K, the swizzle row**: a row of the shared-memory tile is one pass over the 32 banks of 4 bytes,
  128 bytes, the widest swizzle TMA writes (``CU_TENSOR_MAP_SWIZZLE_128B`` requires the box's inner
  dimension to be at most 128 bytes: CUDA Driver API, ``cuTensorMapEncodeTiled``), so
  bk = 128 B / e: 64 in bf16, 128 in fp8 (:func:`swizzle_bk`).
* **What stops the tile growing**: the fp32 accumulator holds tile_m x tile_n registers over the
  CTA's threads, against 255 per thread and 65,536 per SM (:func:`accumulator_registers`, with
  :func:`lib.kernels.sm.register_cap` and the registers a kernel needs besides,
  ``kernels_gemm.gemm_overhead_registers``); and the pipeline's stages hold
  ``stages (tile_m + tile_n) bk e`` bytes of shared memory against the per-block maximum
  (:func:`smem_bytes`, :func:`max_stages`).
* **Stages, latency**: a K loop with s buffers takes, per step, (:func:`pipeline_step_s`)

      T = max(c, b, (L + b + c) / s),   c = 2 tile_m tile_n bk / (eta P / SMs),  b = bytes / (W_L2 / SMs)

  with L the L2 latency (``kernels_gemm.l2_latency_ns``): load j may start only when compute j - s
  has freed its buffer, and it takes L + b to arrive, so the chain load -> compute -> next load into
  the same buffer spans L + b + c and covers s steps. :func:`simulate_pipeline` is its event-driven
  oracle. :func:`tile_plan` puts the five together for one tile; :func:`triton_comparison` pairs
  the plan with the H200 measurement of each Triton configuration (``data/measured-h200.yaml``).

The SGEMM steps (N099) are the five fp32 kernels of ``tools/device/kernels.cu``
(:data:`SGEMM_KERNELS`). For each, :func:`sgemm_step` counts per FMA: the bytes a warp moves from L2
(32-byte sectors of its global loads, :func:`lib.kernels.access.warp_access`) and the bytes its
shared-memory instructions move (wavefronts x 128 B, :func:`lib.kernels.access.shared_access`, on
the addresses each instruction of the kernel's index math produces for one warp); and the ceilings
those put on the FP32 rate: 2 x bandwidth / (bytes per FMA). The shared loads are counted as
compiled: nvcc (CUDA 13.0, sm_90) turns the register-blocked kernel's eight scalar reads of one
row into two 16-byte LDS.128, in the float4 kernel and in the scalar one alike, and the 32 x 32
kernel's four consecutive reads of A into one (the SASS listing, read with nvdisasm).
:func:`kernel_source` returns a kernel's text from ``kernels.cu`` for a page to show;
:func:`reference_tiled_matmul` is the register-blocked loop nest in numpy and :func:`check_tiled_matmul`
grades any implementation of it against the float64 oracle (:mod:`lib.kernels.tiled_gemm`).

SI units: bytes, seconds, FLOP, FLOP/s; registers are 32-bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.kernels import access
from lib.kernels.l2 import l2_read_bandwidth
from lib.kernels.sm import occupancy, register_cap, sm_limits
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu

__all__ = ["ACCUMULATOR_BYTES", "SWIZZLE_MODES_BYTES", "TILE_SIDES", "tile_intensity", "square_side",
           "l2_ridge_point", "smem_bandwidth", "smem_ridge_point", "swizzle_row_bytes", "swizzle_bk",
           "stage_bytes", "smem_bytes", "max_stages", "accumulator_registers", "overhead_registers",
           "l2_latency_s", "pipeline_step_s", "stages_to_hide", "simulate_pipeline", "TilePlan", "tile_plan",
           "triton_comparison", "SGEMM_KERNELS", "SgemmKernel", "SgemmStep", "sgemm_kernel", "sgemm_step",
           "sgemm_steps", "smem_instructions", "smem_wavefronts", "kernel_source", "reference_tiled_matmul", "check_tiled_matmul", "LOOP_DRAFTS"]

ACCUMULATOR_BYTES = 4  # fp32: one 32-bit register per accumulator element
SWIZZLE_MODES_BYTES = (32, 64, 128)  # CUtensorMapSwizzle: the span the 16-byte chunks are permuted within
TILE_SIDES = (16, 32, 64, 128, 256)  # tile_m / tile_n a CTA tile takes here (TMA boxes are at most 256)


def _side(name: str, value) -> int:
    v = integer(name, value, 1, 256)
    if v not in TILE_SIDES:
        raise ValueError(f"{name} must be one of {', '.join(map(str, TILE_SIDES))}, got {value!r}")
    return v


def _dtype_of(chip: GPU, dtype: str) -> float:
    if dtype not in chip.dtypes:
        raise ValueError(f"{chip.key} has no dense {dtype} peak in data/hardware.yaml; its dtypes: "
                         f"{', '.join(chip.dtypes)}")
    return chip.peak_flops(dtype)


# ---- M and N: reuse against the L2 and shared-memory ridge points ----------------------------------


def tile_intensity(tile_m: int, tile_n: int, dtype: str = "bf16") -> float:
    """FLOP per operand byte of one K step: 2 tm tn bk / ((tm + tn) bk e) = 2 tm tn / ((tm + tn) e).

    128 x 128 in bf16: 64; 256 x 128: 85.3; 64 x 64: 32."""
    tm = integer("tile_m", tile_m, 1, 4096)
    tn = integer("tile_n", tile_n, 1, 4096)
    return 2.0 * tm * tn / ((tm + tn) * bytes_per_element(dtype))


def square_side(intensity: float, dtype: str = "bf16") -> float:
    """The side t of the square tile with operand intensity ``intensity``: I = t / e, so t = e I."""
    return real("intensity", intensity, 0, low_open=True, unit="FLOP/byte") * bytes_per_element(dtype)


def l2_ridge_point(chip: str | GPU, dtype: str = "bf16", efficiency: float = 1.0) -> float:
    """FLOP per byte of L2 traffic at which a tile stops being L2-bound: eta P / W_L2 (P the dense
    ``dtype`` peak, W_L2 :func:`lib.kernels.l2.l2_read_bandwidth`). H200 bf16 at eta = 1: 101."""
    g = gpu(chip)
    eff = real("efficiency", efficiency, 0, 1, low_open=True)
    return eff * _dtype_of(g, dtype) / l2_read_bandwidth(g)


def smem_bandwidth(chip: str | GPU) -> float:
    """Whole-chip shared-memory bandwidth, bytes/s: every SM moves one wavefront (banks x bank width
    = 128 B) per clock (:func:`lib.kernels.access.smem_time_s`, the clock of the dense peak). H100:
    132 x 128 B x 1.83 GHz = 30.9 TB/s. ValueError for a GPU without that clock."""
    g = gpu(chip)
    lim = sm_limits(g)
    return lim.smem_banks * lim.bank_width_bytes / access.smem_time_s(1.0, g)


def smem_ridge_point(chip: str | GPU, dtype: str = "bf16", efficiency: float = 1.0) -> float:
    """FLOP per byte of shared-memory traffic at which an MMA tile stops being bound by it:
    eta P / :func:`smem_bandwidth` (H100 bf16: 4,096 FLOP per clock per SM over 128 B, 32)."""
    g = gpu(chip)
    eff = real("efficiency", efficiency, 0, 1, low_open=True)
    return eff * _dtype_of(g, dtype) / smem_bandwidth(g)


# ---- K: the swizzle row ----------------------------------------------------------------------------


def swizzle_row_bytes(chip: str | GPU = "h100-sxm") -> int:
    """One pass over the shared-memory banks, banks x bank width = 128 B: the widest swizzle
    (``CU_TENSOR_MAP_SWIZZLE_128B``), whose 16-byte chunks are permuted over the eight rows that fill
    the 32 banks once each."""
    lim = sm_limits(chip)
    row = lim.smem_banks * lim.bank_width_bytes
    if row not in SWIZZLE_MODES_BYTES:
        raise ValueError(f"{lim.gpu}: a bank row of {row} B is not a TMA swizzle span {SWIZZLE_MODES_BYTES}")
    return row


def swizzle_bk(dtype: str = "bf16", chip: str | GPU = "h100-sxm") -> int:
    """bk = swizzle row / element bytes: the K extent of one 128-byte row (bf16 64, fp8 128, fp32 32)."""
    e = bytes_per_element(dtype)
    bk = swizzle_row_bytes(chip) / e
    if bk != int(bk):
        raise ValueError(f"{dtype}: {e} B elements do not divide a {swizzle_row_bytes(chip)} B row")
    return int(bk)


# ---- what stops the tile growing: registers and shared memory --------------------------------------


def stage_bytes(tile_m: int, tile_n: int, bk: int, dtype: str = "bf16") -> float:
    """Shared memory of one pipeline stage: (tile_m + tile_n) bk e bytes (128 x 128 x 64 bf16: 32 KiB)."""
    return (integer("tile_m", tile_m, 1, 4096) + integer("tile_n", tile_n, 1, 4096)) * \
        integer("bk", bk, 1, 4096) * bytes_per_element(dtype)


def smem_bytes(tile_m: int, tile_n: int, bk: int, stages: int, dtype: str = "bf16") -> float:
    """stages x (tile_m + tile_n) x bk x e: the operand buffers of an s-stage pipeline."""
    return integer("stages", stages, 1, 64) * stage_bytes(tile_m, tile_n, bk, dtype)


def max_stages(chip: str | GPU, tile_m: int, tile_n: int, bk: int, dtype: str = "bf16",
               reserved_bytes: float = 0.0) -> int:
    """floor((max shared memory per block - reserved) / stage bytes): the deepest pipeline one CTA can
    hold (0 when not even one stage fits). ``reserved_bytes``: an epilogue buffer or barriers."""
    lim = sm_limits(chip)
    room = lim.max_smem_per_block_bytes - real("reserved_bytes", reserved_bytes, 0, unit="bytes")
    return max(0, int(room // stage_bytes(tile_m, tile_n, bk, dtype)))


def accumulator_registers(tile_m: int, tile_n: int, threads: int) -> int:
    """fp32 accumulator registers per thread: ceil(tile_m tile_n / threads) (256 x 128 over 256 threads:
    128; 256 x 256: 256, past the 255 a thread may hold)."""
    tm = integer("tile_m", tile_m, 1, 4096)
    tn = integer("tile_n", tile_n, 1, 4096)
    t = integer("threads", threads, 1, 1024)
    return -(-tm * tn // t)


def overhead_registers(value: int | None = None) -> int:
    """Registers per thread a GEMM holds besides its accumulator: ``value``, or
    ``kernels_gemm.gemm_overhead_registers`` (64; 32-84 measured on H200 Triton kernels)."""
    if value is None:
        return int(assumptions.value("kernels_gemm.gemm_overhead_registers"))
    return integer("overhead_registers", value, 0, 255, unit="registers")


# ---- stages: the pipeline against the L2 latency ---------------------------------------------------


def l2_latency_s(latency_s: float | None = None) -> float:
    """The latency one pipeline stage hides: ``latency_s``, or ``kernels_gemm.l2_latency_ns``."""
    if latency_s is None:
        return float(assumptions.value("kernels_gemm.l2_latency_ns")) * 1e-9
    return real("latency_s", latency_s, 0, 1e-3, unit="seconds")


def pipeline_step_s(compute_s: float, load_s: float, latency_s: float, stages: int) -> float:
    """Steady-state time per K step of an s-buffer pipeline (module doc): max(c, b, (L + b + c) / s).

    ``compute_s`` c: one step's MMAs; ``load_s`` b: its bytes at the SM's bandwidth share; ``latency_s``
    L; ``stages``: the loads that may be in flight, one per buffer (s = 1: serial, L + b + c)."""
    c = real("compute_s", compute_s, 0, low_open=True, unit="seconds")
    b = real("load_s", load_s, 0, unit="seconds")
    lat = real("latency_s", latency_s, 0, unit="seconds")
    s = integer("stages", stages, 1, 256)
    return max(c, b, (lat + b + c) / s)


def stages_to_hide(compute_s: float, load_s: float, latency_s: float) -> int:
    """The fewest stages at which :func:`pipeline_step_s` reaches max(c, b): ceil((L + b + c) / max(c, b)), the
    ratio taken 1e-9 low so that a ratio a rounding error above a whole number does not ask for one more stage."""
    c = real("compute_s", compute_s, 0, low_open=True, unit="seconds")
    b = real("load_s", load_s, 0, unit="seconds")
    lat = real("latency_s", latency_s, 0, unit="seconds")
    return max(1, math.ceil((lat + b + c) / max(c, b) * (1 - 1e-9)))


def simulate_pipeline(compute_s: float, load_s: float, latency_s: float, stages: int, steps: int = 400) -> float:
    """Event-driven oracle of :func:`pipeline_step_s`: load j issues when its buffer is free (compute
    j - s has ended) and the memory pipe is free, holds the pipe for ``load_s``, arrives ``latency_s``
    later; compute j starts when its load has arrived and compute j - 1 has ended. Returns the mean
    step time over the last whole cycles of ``s`` steps in the second half of ``steps`` (a latency-bound
    pipeline repeats every ``s`` steps, so a window of any other length is off by part of a cycle)."""
    c = real("compute_s", compute_s, 0, low_open=True)
    b = real("load_s", load_s, 0)
    lat = real("latency_s", latency_s, 0)
    s = integer("stages", stages, 1, 256)
    n = integer("steps", steps, 8, 100_000)
    end = [0.0] * n
    pipe_free = 0.0
    for j in range(n):
        buffer_free = end[j - s] if j >= s else 0.0
        issue = max(buffer_free, pipe_free)
        pipe_free = issue + b
        arrive = pipe_free + lat
        end[j] = max(arrive, end[j - 1] if j else 0.0) + c
    window = max(s, (n // 2) // s * s)
    return (end[-1] - end[-1 - window]) / window


# ---- one tile, all five constraints ----------------------------------------------------------------


@dataclass(frozen=True)
class TilePlan:
    """One CTA tile on one GPU (module doc). Seconds, bytes, FLOP; one CTA per SM."""

    gpu: str
    dtype: str
    tile_m: int
    tile_n: int
    bk: int
    stages: int
    warps: int
    element_bytes: float
    sms: int
    peak_flops: float  # dense datasheet peak in this dtype
    efficiency: float  # eta, the large-GEMM efficiency: the compute roof is eta P
    l2_bandwidth: float  # whole chip
    latency_s: float
    overhead_registers: int
    register_limit: int  # per thread for one CTA per SM (lib.kernels.sm.register_cap); 0 if the smem does not fit
    max_registers_per_thread: int
    registers_per_sm: int
    max_smem_per_block: int
    smem_per_sm: int

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def flops_per_step(self) -> float:
        return 2.0 * self.tile_m * self.tile_n * self.bk

    @property
    def bytes_per_step(self) -> float:
        return (self.tile_m + self.tile_n) * self.bk * self.element_bytes

    @property
    def intensity(self) -> float:
        """FLOP per operand byte (:func:`tile_intensity`)."""
        return self.flops_per_step / self.bytes_per_step

    @property
    def l2_roof_flops(self) -> float:
        """I x W_L2: the chip's FLOP/s if every operand byte comes from L2 at its full bandwidth."""
        return self.intensity * self.l2_bandwidth

    @property
    def compute_roof_flops(self) -> float:
        return self.efficiency * self.peak_flops

    @property
    def smem_bytes(self) -> float:
        return self.stages * self.bytes_per_step

    @property
    def fits_smem(self) -> bool:
        return self.smem_bytes <= self.max_smem_per_block

    @property
    def accumulator_registers_per_cta(self) -> int:
        """tile_m x tile_n: the registers the fp32 accumulator takes over the whole CTA."""
        return self.tile_m * self.tile_n

    @property
    def accumulator_share_of_sm(self) -> float:
        """Accumulator registers / the SM's register file (256 x 128: one half; 256 x 256: all of it)."""
        return self.accumulator_registers_per_cta / self.registers_per_sm

    @property
    def accumulator_per_thread(self) -> int:
        return accumulator_registers(self.tile_m, self.tile_n, self.threads)

    @property
    def registers_needed(self) -> int:
        """Accumulator + overhead registers per thread."""
        return self.accumulator_per_thread + self.overhead_registers

    @property
    def spilled_registers(self) -> int:
        """Registers per thread over the limit (the compiler spills them to local memory)."""
        return max(0, self.registers_needed - self.register_limit) if self.fits_smem else 0

    @property
    def accumulator_fits(self) -> bool:
        """The accumulator alone fits the register limit (if not, it spills whatever else the kernel needs)."""
        return self.fits_smem and self.accumulator_per_thread <= self.register_limit

    @property
    def launches(self) -> bool:
        return self.fits_smem

    @property
    def ctas_per_sm(self) -> int:
        """Resident CTAs per SM at min(needed, limit) registers (:func:`lib.kernels.sm.occupancy`)."""
        if not self.fits_smem:
            return 0
        regs = min(self.registers_needed, self.register_limit)
        return occupancy(self.gpu, self.threads, regs, int(self.smem_bytes)).blocks_per_sm

    @property
    def compute_s(self) -> float:
        """c: one K step's MMAs at one SM's share of eta P."""
        return self.flops_per_step / (self.compute_roof_flops / self.sms)

    @property
    def load_s(self) -> float:
        """b: one K step's operand bytes at one SM's share of the L2 bandwidth."""
        return self.bytes_per_step / (self.l2_bandwidth / self.sms)

    @property
    def step_s(self) -> float:
        return pipeline_step_s(self.compute_s, self.load_s, self.latency_s, self.stages)

    @property
    def stages_needed(self) -> int:
        """Stages at which the latency is hidden (:func:`stages_to_hide`)."""
        return stages_to_hide(self.compute_s, self.load_s, self.latency_s)

    @property
    def max_stages(self) -> int:
        return max_stages(self.gpu, self.tile_m, self.tile_n, self.bk, self.dtype)

    @property
    def flops(self) -> float:
        """Modelled chip FLOP/s: SMs x flops_per_step / step_s (spills and launch failures not priced)."""
        return self.sms * self.flops_per_step / self.step_s

    @property
    def bound(self) -> str:
        """Which term sets step_s: 'compute', 'L2 bandwidth' or 'latency'."""
        terms = {"compute": self.compute_s, "L2 bandwidth": self.load_s,
                 "latency": (self.latency_s + self.load_s + self.compute_s) / self.stages}
        return max(terms, key=terms.get)

    @property
    def verdict(self) -> str:
        """'runs', 'spills' or 'does not launch' (shared memory over the per-block maximum)."""
        if not self.fits_smem:
            return "does not launch"
        return "spills" if self.spilled_registers else "runs"


@functools.lru_cache(maxsize=512)
def _register_limit(chip: str, threads: int, smem: int) -> int:
    """:func:`lib.kernels.sm.register_cap` at one block per SM, memoized (an explorer asks for many tiles)."""
    return register_cap(chip, threads, 1, smem)


def tile_plan(chip: str | GPU, tile_m: int = 128, tile_n: int = 128, dtype: str = "bf16", bk: int | None = None,
              stages: int = 4, warps: int = 8, matmul_efficiency: float | None = None, latency_s: float | None = None,
              overhead: int | None = None) -> TilePlan:
    """The five constraints of one tile (module doc). ``bk`` defaults to :func:`swizzle_bk`; ``matmul_efficiency``
    to ``decode_step.matmul_flops_efficiency`` (the compute roof is eta P); ``latency_s`` to
    ``kernels_gemm.l2_latency_ns``; ``overhead`` to ``kernels_gemm.gemm_overhead_registers``."""
    g = gpu(chip)
    lim = sm_limits(g)
    tm, tn = _side("tile_m", tile_m), _side("tile_n", tile_n)
    peak = _dtype_of(g, dtype)
    k = swizzle_bk(dtype, g) if bk is None else integer("bk", bk, 8, 512)
    s = integer("stages", stages, 1, 16)
    w = integer("warps", warps, 1, lim.max_threads_per_block // lim.warp_size)
    if matmul_efficiency is None:
        from lib.perf.step import step_assumptions

        matmul_efficiency = step_assumptions().matmul_efficiency
    eff = real("matmul_efficiency", matmul_efficiency, 0, 1, low_open=True)
    smem = smem_bytes(tm, tn, k, s, dtype)
    limit = _register_limit(g.key, 32 * w, int(smem)) if smem <= lim.max_smem_per_block_bytes else 0
    return TilePlan(g.key, dtype, tm, tn, k, s, w, bytes_per_element(dtype), g.compute_units, peak, eff,
                    l2_read_bandwidth(g), l2_latency_s(latency_s), overhead_registers(overhead), limit,
                    lim.max_registers_per_thread, lim.registers_per_sm, lim.max_smem_per_block_bytes,
                    lim.smem_per_sm_bytes)


def triton_comparison(gpu_name: str = "h200", latency_s: float | None = None) -> list[tuple[dict, TilePlan]]:
    """Each Triton configuration measured on ``gpu_name`` (``triton_tiles.rows`` of its measurement file,
    bf16) with the :func:`tile_plan` of the same tile, bk, stages and warps."""
    from lib.registry.measured import measured

    rows = measured("triton_tiles.rows", gpu_name)
    out = []
    for r in rows:
        tm, tn = (int(x) for x in r["tile"].split("x"))
        out.append((r, tile_plan(gpu_name, tm, tn, "bf16", r["bk"], r["stages"], r["warps"], latency_s=latency_s)))
    return out


# ---- N099: the steps of a hand-written SGEMM (tools/device/kernels.cu) -----------------------------


@dataclass(frozen=True)
class SgemmKernel:
    """One fp32 kernel of ``tools/device/kernels.cu``: its block tile, K tile, per-thread tile, block shape."""

    key: str
    title: str
    block_m: int  # output rows per CTA (1 x block for the naive kernels: see block_threads)
    block_n: int
    bk: int  # K per shared-memory tile (1 for the naive kernels: they read global memory every k)
    thread_m: int  # outputs per thread (register tile)
    thread_n: int
    threads: int
    shared: bool  # stages operands in shared memory

    @property
    def fmas_per_thread_per_k(self) -> int:
        return self.thread_m * self.thread_n


SGEMM_KERNELS = {
    "naive_rows": SgemmKernel("naive_rows", "naive, threads along rows", 32, 8, 1, 1, 1, 256, False),
    "naive_cols": SgemmKernel("naive_cols", "naive, threads along columns", 8, 32, 1, 1, 1, 256, False),
    "smem": SgemmKernel("smem", "32 x 32 shared-memory tiles", 32, 32, 32, 1, 1, 1024, True),
    "reg2d": SgemmKernel("reg2d", "128 x 128 tile, 8 x 8 per thread", 128, 128, 8, 8, 8, 256, True),
    "reg2d_vec": SgemmKernel("reg2d_vec", "the same with float4 loads", 128, 128, 8, 8, 8, 256, True),
}
"""The five measured kernels (``sgemm_steps`` of data/measured-h200.yaml), in the order of the steps."""


def sgemm_kernel(key: str) -> SgemmKernel:
    if key not in SGEMM_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(SGEMM_KERNELS)}, got {key!r}")
    return SGEMM_KERNELS[key]


_WORD = 4  # fp32


def _warp_threads(warp: int) -> np.ndarray:
    return warp * 32 + np.arange(32)


def smem_instructions(key: str, warp: int = 0) -> list[tuple[str, str, np.ndarray, int]]:
    """(kind 'load'|'store', operand 'A'|'B', byte addresses of the 32 lanes, width) for every shared-memory
    instruction one warp issues in one K tile, from the kernel's index math (as compiled: see module doc)."""
    t = _warp_threads(warp)
    ins: list[tuple[str, str, np.ndarray, int]] = []
    if key == "smem":  # As[32][32], Bs[32][32]; block (32, 32): tx = t % 32, ty = t / 32
        ts = 32
        tx, ty = t % ts, t // ts
        b_base = ts * ts * _WORD
        ins.append(("store", "A", (ty * ts + tx) * _WORD, 4))
        ins.append(("store", "B", b_base + (ty * ts + tx) * _WORD, 4))
        for k in range(0, ts, 4):  # As[ty][k..k+3]: one LDS.128 (a broadcast: the warp shares ty)
            ins.append(("load", "A", (ty * ts + k) * _WORD, 16))
        for k in range(ts):  # Bs[k][tx]
            ins.append(("load", "B", b_base + (k * ts + tx) * _WORD, 4))
        return ins
    if key in ("reg2d", "reg2d_vec"):  # As[8][128], Bs[8][128]; 256 threads, thread tile 8 x 8
        bm = bn = 128
        bk, tm, tn = 8, 8, 8
        b_base = bk * bm * _WORD
        if key == "reg2d":
            for i in range(bm * bk // 256):  # As[k][m] = A[m][k0 + k]: e = t + 256 i, m = e / 8, k = e % 8
                e = t + 256 * i
                ins.append(("store", "A", ((e % bk) * bm + e // bk) * _WORD, 4))
            for i in range(bk * bn // 256):  # Bs[k][n]: k = e / 128, n = e % 128
                e = t + 256 * i
                ins.append(("store", "B", b_base + ((e // bn) * bn + e % bn) * _WORD, 4))
        else:
            m, kq = t // 2, (t % 2) * 4  # one float4 of A per thread, stored transposed: 4 scalar stores
            for c in range(4):
                ins.append(("store", "A", ((kq + c) * bm + m) * _WORD, 4))
            k, n = t // (bn // 4), (t % (bn // 4)) * 4  # one float4 of B per thread: one STS.128
            ins.append(("store", "B", b_base + (k * bn + n) * _WORD, 16))
        trow, tcol = t // (bn // tn), t % (bn // tn)
        for k in range(bk):
            for i in range(0, tm, 4):  # a[i..i+3] = As[k][trow * 8 + i ..]: LDS.128
                ins.append(("load", "A", (k * bm + trow * tm + i) * _WORD, 16))
            for j in range(0, tn, 4):  # b[j..j+3] = Bs[k][tcol * 8 + j ..]: LDS.128
                ins.append(("load", "B", b_base + (k * bn + tcol * tn + j) * _WORD, 16))
        return ins
    return ins  # the naive kernels use no shared memory


def smem_wavefronts(key: str, chip: str | GPU = "h100-sxm", warp: int = 0) -> dict[str, int]:
    """Shared-memory wavefronts one warp spends per K tile of kernel ``key``: {'loads', 'stores',
    'load_instructions', 'store_instructions', 'ideal'} (ideal: one wavefront per active lane group,
    :func:`lib.kernels.access.shared_access`); zeros for a kernel without shared memory."""
    sgemm_kernel(key)
    out = {"loads": 0, "stores": 0, "load_instructions": 0, "store_instructions": 0, "ideal": 0}
    for kind, _op, addr, width in smem_instructions(key, integer("warp", warp, 0, 31)):
        acc = access.shared_access(addr, width, chip=chip)
        out[kind + "s"] += acc.wavefronts
        out[kind + "_instructions"] += 1
        out["ideal"] += acc.ideal_wavefronts
    return out


def _naive_sectors(key: str, chip) -> dict[str, int]:
    """Sectors one warp's A and B loads touch at one k (K = 4,096: consecutive rows of A are 16 KiB apart)."""
    lane = np.arange(32)
    if key == "naive_rows":  # lanes on 32 consecutive rows of one column: A strided by a row, B one word
        a, b = lane * 4096 * _WORD, np.zeros(32, np.int64)
    else:  # lanes on 32 consecutive columns of one row: A one word (a broadcast), B contiguous
        a, b = np.zeros(32, np.int64), lane * _WORD
    return {"A": access.warp_access(a, 4, chip=chip).n_sectors, "B": access.warp_access(b, 4, chip=chip).n_sectors}


@dataclass(frozen=True)
class SgemmStep:
    """One kernel's traffic per FMA and the FP32 rate each resource allows (module doc). FLOP/s."""

    kernel: SgemmKernel
    gpu: str
    operands_per_fma: float  # global elements the kernel's loads request per FMA (2 naive, (bm + bn) / (bm bn) tiled)
    l2_bytes_per_fma: float  # bytes of the 32-byte sectors its global loads touch, per FMA
    smem_bytes_per_fma: float  # shared-memory (or, naive, L1 data-path) wavefronts x 128 B per FMA
    smem_wavefronts: dict
    fp32_peak: float
    l2_ceiling: float
    smem_ceiling: float | None  # None: no shared memory (naive), or no SM clock in data/hardware.yaml
    l1_note: str

    @property
    def requested_bytes_per_fma(self) -> float:
        return self.operands_per_fma * _WORD

    @property
    def ceiling(self) -> float:
        """min of the FP32 peak and the known bandwidth ceilings (the naive kernels' L2 term assumes no L1
        reuse: see ``l1_note``)."""
        known = [self.fp32_peak, self.l2_ceiling] + ([self.smem_ceiling] if self.smem_ceiling else [])
        return min(known)

    @property
    def bound(self) -> str:
        terms = {"FP32 peak": self.fp32_peak, "L2 bandwidth": self.l2_ceiling}
        if self.smem_ceiling:
            terms["shared memory"] = self.smem_ceiling
        return min(terms, key=terms.get)


def sgemm_step(key: str, chip: str | GPU = "h200") -> SgemmStep:
    """The traffic and ceilings of kernel ``key`` on ``chip`` (module doc)."""
    k = sgemm_kernel(key)
    g = gpu(chip)
    lim = sm_limits(g)
    peak = _dtype_of(g, "fp32")
    try:
        w_smem = smem_bandwidth(g)
    except ValueError:
        w_smem = None
    wave_bytes = lim.smem_banks * lim.bank_width_bytes
    if k.shared:
        fmas_per_warp_tile = 32 * k.fmas_per_thread_per_k * k.bk
        waves = smem_wavefronts(key, g)
        smem_b = (waves["loads"] + waves["stores"]) * wave_bytes / fmas_per_warp_tile
        operands = (k.block_m + k.block_n) / (k.block_m * k.block_n)
        l2_b = operands * _WORD  # coalesced: each tile row is whole sectors
        note = ""
    else:
        sectors = _naive_sectors(key, g)
        waves = {"loads": 0, "stores": 0, "load_instructions": 0, "store_instructions": 0, "ideal": 0,
                 "sectors_a": sectors["A"], "sectors_b": sectors["B"]}
        operands = 2.0
        l2_b = (sectors["A"] + sectors["B"]) * lim.sector_bytes / 32.0  # one warp request per k: 32 FMAs
        smem_b = 0.0
        note = "L2 term: every sector a warp's loads touch comes from L2 (no reuse in L1)"
    l2_ceiling = 2.0 * l2_read_bandwidth(g) / l2_b
    smem_ceiling = 2.0 * w_smem / smem_b if (w_smem and smem_b) else None
    return SgemmStep(k, g.key, operands, l2_b, smem_b, waves, peak, l2_ceiling, smem_ceiling, note)


def sgemm_steps(chip: str | GPU = "h200") -> dict[str, SgemmStep]:
    """:func:`sgemm_step` for every kernel of :data:`SGEMM_KERNELS`."""
    return {key: sgemm_step(key, chip) for key in SGEMM_KERNELS}


def kernel_source(name: str, body_from: str | None = None, body_to: str | None = None) -> str:
    """The text of kernel ``name`` (an ``extern "C" __global__`` function of ``tools/device/kernels.cu``, the
    book's own measured code) with the comment and ``#define`` lines just above it; from the first line containing
    ``body_from`` on and up to (not including) the next line containing ``body_to``, if given."""
    from lib.registry.data import DATA_DIR

    path = DATA_DIR.parent / "tools" / "device" / "kernels.cu"
    lines = path.read_text(encoding="utf-8").splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith('extern "C"') and f" {name}(" in ln), None)
    if head is None:
        raise ValueError(f"no kernel {name!r} in tools/device/kernels.cu")
    start = head
    while start > 0 and lines[start - 1].startswith(("//", "#define")):
        start -= 1
    end = next(i for i in range(head, len(lines)) if lines[i] == "}")
    text = lines[start:end + 1]
    if body_from is not None:
        cut = next((i for i, ln in enumerate(text) if body_from in ln), None)
        if cut is None:
            raise ValueError(f"{name}: no line containing {body_from!r}")
        text = text[cut:]
    if body_to is not None:
        stop = next((i for i, ln in enumerate(text) if body_to in ln), None)
        if stop is None:
            raise ValueError(f"{name}: no line containing {body_to!r}")
        text = text[:stop]
    return "\n".join(text)


# ---- practice: the register-blocked loop nest -----------------------------------------------------


def reference_tiled_matmul(a, b, block_m: int = 32, block_n: int = 32, bk: int = 8, thread_m: int = 4,
                           thread_n: int = 4) -> np.ndarray:
    """C = A B in fp32 by kernel 4's loop nest: for each block tile, for each K tile (the shared-memory
    copy, zero-padded at the edges), for each k, every thread adds the outer product of its thread_m
    values of A and thread_n values of B into its fp32 register tile. Edges of any size are handled by
    padding (the kernel itself requires multiples). Returns float32 (M, N)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a (M, K) and b (K, N) must be 2-D with matching K, got {a.shape} and {b.shape}")
    bm, bn, k_t = integer("block_m", block_m, 1, 1024), integer("block_n", block_n, 1, 1024), integer("bk", bk, 1, 1024)
    tm, tn = integer("thread_m", thread_m, 1, bm), integer("thread_n", thread_n, 1, bn)
    if bm % tm or bn % tn:
        raise ValueError(f"thread_m must divide block_m and thread_n block_n, got {tm}/{bm} and {tn}/{bn}")
    m, kk = a.shape
    n = b.shape[1]
    c = np.zeros((m, n), np.float32)
    for i0 in range(0, m, bm):
        for j0 in range(0, n, bn):
            acc = np.zeros((bm // tm, bn // tn, tm, tn), np.float32)  # (thread row, thread col, register tile)
            for k0 in range(0, kk, k_t):
                a_s = np.zeros((bm, k_t), np.float32)  # the shared-memory tiles, zero past the edges
                b_s = np.zeros((k_t, bn), np.float32)
                blk_a = a[i0:i0 + bm, k0:k0 + k_t]
                blk_b = b[k0:k0 + k_t, j0:j0 + bn]
                a_s[:blk_a.shape[0], :blk_a.shape[1]] = blk_a
                b_s[:blk_b.shape[0], :blk_b.shape[1]] = blk_b
                for k in range(k_t):
                    av = a_s[:, k].reshape(bm // tm, tm)  # each thread row's tm values
                    bv = b_s[k, :].reshape(bn // tn, tn)
                    acc += av[:, None, :, None] * bv[None, :, None, :]  # one FMA per register, fp32
            tile = acc.transpose(0, 2, 1, 3).reshape(bm, bn)
            c[i0:i0 + bm, j0:j0 + bn] = tile[:min(bm, m - i0), :min(bn, n - j0)]
    return c


def _draft_k_tail(a, b, block_m=32, block_n=32, bk=8, thread_m=4, thread_n=4):
    """Drops the partial last K tile (loops K // bk times)."""
    kk = (np.asarray(a).shape[1] // bk) * bk
    if kk == 0:
        return np.zeros((np.asarray(a).shape[0], np.asarray(b).shape[1]), np.float32)
    return reference_tiled_matmul(np.asarray(a)[:, :kk], np.asarray(b)[:kk], block_m, block_n, bk, thread_m, thread_n)


def _draft_edge(a, b, block_m=32, block_n=32, bk=8, thread_m=4, thread_n=4):
    """Computes only whole block tiles (the kernel's M, N multiple-of-128 assumption): edges stay zero."""
    a, b = np.asarray(a), np.asarray(b)
    m, n = (a.shape[0] // block_m) * block_m, (b.shape[1] // block_n) * block_n
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    if m and n:
        c[:m, :n] = reference_tiled_matmul(a[:m], b[:, :n], block_m, block_n, bk, thread_m, thread_n)
    return c


def _draft_reset(a, b, block_m=32, block_n=32, bk=8, thread_m=4, thread_n=4):
    """Resets the accumulator at every K tile (acc declared inside the k0 loop): keeps the last tile only."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    k0 = ((a.shape[1] - 1) // bk) * bk
    return reference_tiled_matmul(a[:, k0:], b[k0:], block_m, block_n, bk, thread_m, thread_n)


LOOP_DRAFTS = {"k_tail": _draft_k_tail, "edge_tiles": _draft_edge, "accumulator_reset": _draft_reset}
"""Defective loop nests :func:`check_tiled_matmul` must fail, each with a docstring saying what it does."""

_CHECK_SHAPES = ((32, 32, 8), (64, 96, 40), (70, 45, 37), (5, 130, 200), (1, 1, 1))


def check_tiled_matmul(candidate, block_m: int = 32, block_n: int = 32, bk: int = 8, thread_m: int = 4,
                       thread_n: int = 4, seed: int = 0):
    """Grade ``candidate(a, b, block_m, block_n, bk, thread_m, thread_n) -> C`` (fp32 inputs) against the
    float64 oracle (:func:`lib.kernels.tiled_gemm.oracle`) within gamma_(K+1) |A| |B|, the bound of any
    order of K fp32 multiply-adds, on shapes
    with whole tiles, partial tiles in every dimension, and one element; returns a
    :class:`lib.book.practice.PracticeReport` naming the first failing shape."""
    from lib.book.practice import Case, grade
    from lib.kernels import tiled_gemm as tg

    if not callable(candidate):
        raise ValueError(f"candidate must be a function (a, b, block_m, block_n, bk, thread_m, thread_n) -> C, "
                         f"got {candidate!r}")
    rng = np.random.default_rng(integer("seed", seed, 0))
    cases = []
    for m, n, k in _CHECK_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        cases.append(Case(f"M, N, K = {m}, {n}, {k}", ((m, n, k, a, b),)))

    def run(fn, ops):
        for m, n, k, a, b in ops:
            got = np.asarray(fn(a, b, block_m, block_n, bk, thread_m, thread_n), np.float64)
            assert got.shape == (m, n), f"(M, N, K) = {(m, n, k)}: output shape {got.shape}, expected {(m, n)}"
            exact = tg.oracle(a, b)
            # any order of K fp32 multiply-adds: |C - C*| <= gamma_(K+1) (|A| |B|) (Higham), u = 2^-24
            mu = (k + 1) * tg.unit_roundoff("fp32")
            tol = mu / (1 - mu) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30
            bad = ~(np.abs(got - exact) <= tol)
            assert not bad.any(), (f"(M, N, K) = {(m, n, k)}: {int(bad.sum())} of {m * n} elements outside the fp32 "
                                   f"bound; first at {tuple(int(x) for x in np.argwhere(bad)[0])}")

    def describe(ops):
        return "\n".join(f"  C = candidate(a[{m}x{k}], b[{k}x{n}])" for m, n, k, _a, _b in ops)

    return grade("tiled SGEMM loop nest (N099)", lambda: candidate, cases, run, describe)
