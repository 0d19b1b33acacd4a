"""The GEMM mainloop from Ampere to Blackwell: what TMA, wgmma, tensor memory and the CTA pair take off the threads.

One CTA computes a ``tile_m x tile_n`` block of C = A B. Each step of its K loop, one *K tile* ``bk`` deep,
brings a ``tile_m x bk`` slice of A and a ``bk x tile_n`` slice of B into shared memory and multiplies them on
the tensor cores. Two jobs surround the multiply, and each generation moved one of them off the threads:

* **address generation** (:data:`COPIES`): with ``ldg+sts`` or ``cp.async`` every thread copies its share of
  the operand bytes, 16 bytes per instruction (``cp_async_max_bytes``), computing a global address, a swizzled
  shared address and a predicate for each copy (``kernels_mainloop.address_ops_per_copy`` integer instructions);
  with ``tma`` one elected thread issues one ``cp.async.bulk.tensor`` per operand box (at most
  ``tma_box_max_elements`` rows and ``tma_swizzle_max_bytes`` of K per box,
  :func:`tma_copies`), the copy engine generates the addresses and bounds-checks them, and completion is a
  transaction byte count on an mbarrier rather than a CTA-wide ``bar.sync``;
* **operand staging** (:data:`MMAS`): ``mma.sync.m16n8k16`` takes its operands from registers, so every warp
  first copies them out of shared memory with ``ldmatrix`` (.x4: 512 B per warp instruction) and holds them;
  ``wgmma.mma_async`` (compute capability 9.0) reads A and B from shared memory through descriptors, one
  instruction per warpgroup of 4 warps for a 64 x N x 16 product; ``tcgen05.mma`` (10.0) is issued by one
  thread for a 128 x N x 16 product (256 x N across a CTA pair) and accumulates in tensor memory.

:func:`ktile_instructions` counts, per K tile and per SM, the warp instructions each job costs for any
combination the hardware allows (:func:`mma_unit` reads each compute capability's instruction facts from
``data/hardware.yaml``): the difference between two combinations is what one change removes.

The accumulator and the operand bytes are priced in bytes (I040):

* :func:`accumulator`: a fp32 ``tile_m x tile_n`` accumulator per SM lives in the register file (256 KiB) up to
  9.0 and in tensor memory (``tmem_lanes x tmem_columns x 4`` B = 256 KiB, ``tile_n`` columns per 128 rows)
  on 10.0; :func:`warp_specialized_registers` is the Hopper register split CUTLASS sets with ``setmaxnreg``
  (``kernels_mainloop``: producer 40 / consumers 232, or 24 / 240 from 208 accumulator registers per thread).
* :func:`smem_port`: per SM and per clock, the shared-memory bytes the MMA instructions read
  (``kernels_mainloop.operand_reads_per_instruction``: each instruction reads its A and B slices once, so the
  read intensity is :func:`lib.kernels.gemm_tiles.tile_intensity` of the *instruction* shape) and the bytes TMA
  writes (the intensity of the tile each SM stages: a CTA pair stages half of A and half of B per SM, the
  intensity of the pair tile), against the 32 banks x 4 B = 128 B the SM's shared memory serves per clock,
  at :func:`tensor_flops_per_sm_clock`.

The tile's own arithmetic (intensity, stage bytes, stages, accumulator registers per thread, the pipeline
against the L2 latency) is :mod:`lib.kernels.gemm_tiles`'s; the per-SM limits are :mod:`lib.kernels.sm`'s.
Units: instructions, bytes, registers (32-bit), FLOP, clocks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.kernels.gemm_tiles import (
    accumulator_registers,
    max_stages,
    overhead_registers,
    stage_bytes,
    swizzle_bk,
    tile_intensity,
)
from lib.kernels.sm import sm_limits
from lib.registry import assumptions
from lib.registry.data import load_yaml
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu

__all__ = ["COPIES", "MMAS", "MmaUnit", "mma_unit", "tensor_flops_per_sm_clock", "tma_copies", "KTile",
           "ktile_instructions", "instruction_shape", "mainloop_paths", "path_label", "SmemPort", "smem_port", "Accumulator", "accumulator",
           "WarpSpecializedRegisters", "warp_specialized_registers", "ACCUMULATOR_BYTES", "async_gpus",
           "GenerationConfig", "generation_configs"]

COPIES = ("ldg+sts", "cp.async", "tma")
"""How operand bytes reach shared memory: through registers (LDG then STS), per thread without registers
(cp.async, compute capability 8.0), or one bulk tensor copy per box (TMA, 9.0)."""
MMAS = ("mma.sync", "wgmma", "tcgen05")
"""The tensor-core instruction: per warp from registers (8.0), per warpgroup from shared memory (9.0 only),
per thread into tensor memory (10.0)."""
ACCUMULATOR_BYTES = 4  # fp32
_COPY_BYTES_LDG = 16  # LDG.128 / STS.128: the widest per-thread load and store
_SYNC_PER_WARP = {"ldg+sts": 2, "cp.async": 3}  # bar.sync x2; commit_group + wait_group + bar.sync
_TMA_PRODUCER_SYNC = 2  # wait on the stage's empty barrier, arrive.expect_tx on its full barrier
_TMA_CONSUMER_SYNC = 2  # wait on the full barrier, arrive on the empty barrier (per consumer warp)
_WGMMA_SYNC = 3  # wgmma.fence, commit_group, wait_group (per consumer warp)
_TCGEN05_SYNC = 2  # the MMA thread waits on the full barrier; tcgen05.commit arrives on the empty one


@dataclass(frozen=True)
class MmaUnit:
    """The tensor-core instruction and the asynchronous-copy facts of one compute capability
    (``data/hardware.yaml`` ``compute_capabilities``)."""

    compute_capability: str
    instruction: str
    m: int  # rows of one instruction (one CTA)
    n_max: int
    k_bytes: int  # K x element bytes of one instruction (32: k16 in bf16)
    issue_threads: int  # 32: a warp; 128: a warpgroup; 1: one thread
    operands: str
    accumulator: str
    cta_group_max: int
    flops_per_sm_clock_bf16: float | None
    tma_box_max_elements: int | None  # None: no TMA (before 9.0)
    tma_swizzle_max_bytes: int | None
    tmem_bytes: int  # 0 without tensor memory
    tmem_columns: int
    tmem_lanes: int
    setmaxnreg: tuple[int, int] | None
    cp_async_max_bytes: int
    ldmatrix_x4_bytes: int
    mbarrier_bytes: int

    @property
    def mma(self) -> str:
        """The :data:`MMAS` name of this capability's own MMA."""
        return "tcgen05" if self.instruction.startswith("tcgen05") else (
            "wgmma" if self.instruction.startswith("wgmma") else "mma.sync")

    @property
    def has_tma(self) -> bool:
        return self.tma_box_max_elements is not None


@functools.cache
def _unit(cc: str) -> MmaUnit:
    table = load_yaml("hardware.yaml")["compute_capabilities"]
    row = {k: v["value"] for k, v in {**table["common"], **table[cc]}.items()}
    lanes, cols = row.get("tmem_lanes", 0), row.get("tmem_columns", 0)
    nreg = (row["setmaxnreg_min"], row["setmaxnreg_max"]) if "setmaxnreg_min" in row else None
    return MmaUnit(cc, row["mma_instruction"], row["mma_m"], row["mma_n_max"], row["mma_k_bytes"],
                   row["mma_issue_threads"], row["mma_operands"], row["mma_accumulator"], row["mma_cta_group_max"],
                   row.get("tensor_flops_per_sm_clock_bf16"), row.get("tma_box_max_elements"),
                   row.get("tma_swizzle_max_bytes"), lanes * cols * ACCUMULATOR_BYTES, cols, lanes, nreg,
                   row["cp_async_max_bytes"], row["ldmatrix_x4_bytes"], row["mbarrier_bytes"])


def async_gpus() -> tuple[str, ...]:
    """The GPUs of data/hardware.yaml with TMA and an asynchronous MMA (compute capability 9.0 and 10.0)."""
    from lib.registry.hardware import gpu_names

    return tuple(k for k in gpu_names() if gpu(k).compute_capability is not None and mma_unit(k).has_tma)


def mma_unit(chip: str | GPU) -> MmaUnit:
    """The instruction facts of ``chip``'s compute capability; ValueError for a GPU without one (AMD)."""
    lim = sm_limits(chip)  # refuses a GPU without NVIDIA per-SM limits, naming the ones that have them
    return _unit(lim.compute_capability)


def tensor_flops_per_sm_clock(chip: str | GPU, dtype: str = "bf16") -> float:
    """Dense tensor-core FLOP one SM does per clock in ``dtype``: the capability's bf16 rate
    (``tensor_flops_per_sm_clock_bf16``: 4,096 on 9.0, 8,192 on 10.0) x 2 / element bytes: the tensor cores take
    the same operand bytes per clock in every tensor dtype, so FP8 doubles the FLOP and TF32 halves them (the
    datasheet peaks agree to 0.1%: tests). ValueError where data/hardware.yaml has no per-clock rate (before 9.0)
    or the GPU has no tensor peak in ``dtype``."""
    g = gpu(chip)
    unit = mma_unit(g)
    if unit.flops_per_sm_clock_bf16 is None:
        raise ValueError(f"{g.key} (compute capability {unit.compute_capability}): data/hardware.yaml has no tensor "
                         "FLOP per SM per clock for it; the Hopper (9.0) and Blackwell (10.0) GPUs have one")
    if dtype not in g.dtypes or dtype == "fp32":
        raise ValueError(f"{g.key} has no dense {dtype} tensor peak; its tensor dtypes: "
                         f"{', '.join(d for d in g.dtypes if d != 'fp32')}")
    return unit.flops_per_sm_clock_bf16 * bytes_per_element("bf16") / bytes_per_element(dtype)


def tma_copies(rows: int, bk: int, dtype: str = "bf16", chip: str | GPU = "h100-sxm") -> int:
    """TMA instructions that bring a ``rows x bk`` K-major operand slice into shared memory:
    ceil(rows / box rows) x ceil(bk e / swizzle bytes) (a box spans at most 256 rows and, with the 128-byte
    swizzle wgmma and tcgen05 read, 128 bytes of K). 128 x 64 bf16: 1; 512 x 64: 2; 128 x 128 bf16: 2."""
    unit = mma_unit(chip)
    if not unit.has_tma:
        raise ValueError(f"TMA needs compute capability 9.0 or newer; {gpu(chip).key} is {unit.compute_capability}")
    r = integer("rows", rows, 1, 65536)
    k = integer("bk", bk, 1, 4096)
    inner = k * bytes_per_element(dtype)
    return math.ceil(r / unit.tma_box_max_elements) * math.ceil(inner / unit.tma_swizzle_max_bytes)


@dataclass(frozen=True)
class KTile:
    """Warp instructions one SM issues for one K tile of its CTA (module doc), by job. A warp instruction is
    one issue slot of an SM scheduler (all 32 lanes of a warp execute it). For a CTA pair, per SM."""

    copy: str
    mma: str
    tile_m: int  # the MMA tile (the pair's, with cta_group = 2)
    tile_n: int
    bk: int
    element_bytes: float
    cta_group: int
    mma_warps: int  # warps that run the MMA (mma.sync: all of them; wgmma: the consumer warpgroups; tcgen05: 1)
    loader_warps: int  # warps that issue the copies (TMA: one elected thread of one warp)
    operand_bytes: float  # staged per SM per K tile
    copies: float  # copy instructions (ldg+sts counts LDG and STS)
    address: float  # integer instructions computing the copies' addresses
    staging: float  # ldmatrix
    mmas: float  # tensor-core instructions, as warp issues (a wgmma counts once per warp of its warpgroup)
    sync: float  # barrier, commit and wait instructions
    copies_per_loader_thread: float
    mma_per_issuer: float  # per warp (mma.sync), per warpgroup (wgmma), per issuing thread (tcgen05)
    staging_per_warp: float
    operand_registers: int  # registers per MMA thread holding operand fragments (one k16 step, one buffer)
    warp_tile: tuple[int, int] = (0, 0)  # mma.sync: the rows x columns of C each warp owns

    @property
    def total(self) -> float:
        return self.copies + self.address + self.staging + self.mmas + self.sync

    @property
    def address_generation(self) -> float:
        """What TMA takes over: the copies, their address arithmetic and their completion (loader sync)."""
        return self.copies + self.address + self._copy_sync

    @property
    def operand_staging(self) -> float:
        """What wgmma takes over: ldmatrix and the per-warp MMA instructions."""
        return self.staging + self.mmas

    @property
    def _copy_sync(self) -> float:
        if self.copy == "tma":
            return _TMA_PRODUCER_SYNC
        return _SYNC_PER_WARP[self.copy] * self.loader_warps

    def by_job(self) -> dict[str, float]:
        return {"copies": self.copies, "address arithmetic": self.address, "operand staging (ldmatrix)": self.staging,
                "tensor-core instructions": self.mmas, "barriers and waits": self.sync}


def _warp_grid(tm: int, tn: int, warps: int) -> tuple[int, int]:
    """The (rows, cols) grid of warps over the tile that needs the fewest ldmatrix per warp (square-ish)."""
    best = None
    for wr in range(1, warps + 1):
        if warps % wr:
            continue
        wc = warps // wr
        if tm % (16 * wr) or tn % (16 * wc):
            continue
        cost = tm // wr // 16 + tn // wc // 16
        if best is None or cost < best[0]:
            best = (cost, wr, wc)
    if best is None:
        raise ValueError(f"{warps} warps cannot split a {tm} x {tn} tile into warp tiles of whole 16 x 16 blocks")
    return best[1], best[2]


def instruction_shape(chip: str | GPU, tile_m: int, tile_n: int, mma: str | None = None,
                      cta_group: int = 1) -> tuple[int, int]:
    """(M, N) of the tensor-core instruction that covers a ``tile_m x tile_n`` tile: wgmma M = 64, N = min(tile_n,
    256); tcgen05 M = min(tile_m, 128 x cta_group) (tile_m is the pair's tile with a CTA pair), N = min(tile_n,
    256); mma.sync 16 x 8."""
    unit = mma_unit(chip)
    kind = unit.mma if mma is None else mma
    if kind == "mma.sync":
        return 16, 8
    n = min(tile_n, unit.n_max if unit.mma == kind else 256)
    if kind == "wgmma":
        return 64, n
    return min(tile_m, 128 * cta_group), n


def ktile_instructions(chip: str | GPU, tile_m: int, tile_n: int, bk: int = 64, *, copy: str, mma: str,
                       warps: int = 8, dtype: str = "bf16", cta_group: int = 1,
                       address_ops: float | None = None) -> KTile:
    """Warp instructions per K tile per SM (module doc) for one ``copy`` x ``mma`` combination.

    ``warps``: the warps that run the MMA (mma.sync: the CTA's warps, which also copy; wgmma: 4 per consumer
    warpgroup, which also copy unless ``copy`` is TMA; ignored for tcgen05, issued by one thread). ``tile_m`` is the
    pair's tile with ``cta_group=2`` (tcgen05 only: each SM stages half of A and half of B).
    ``address_ops``: integer instructions per 16-byte copy (``kernels_mainloop.address_ops_per_copy``).

    H100, 128 x 128, bk 64, bf16, 4 warps: cp.async + mma.sync issues 16 copies and 32 ldmatrix and 128 mma.sync per
    warp; TMA + wgmma 2 TMA copies and 8 wgmma per warpgroup."""
    g = gpu(chip)
    unit = mma_unit(g)
    if copy not in COPIES:
        raise ValueError(f"copy must be one of {', '.join(COPIES)}, got {copy!r}")
    if mma not in MMAS:
        raise ValueError(f"mma must be one of {', '.join(MMAS)}, got {mma!r}")
    cc = unit.compute_capability
    if copy == "tma" and not unit.has_tma:
        raise ValueError(f"TMA needs compute capability 9.0 or newer; {g.key} is {cc} (it copies with cp.async)")
    if mma in ("wgmma", "tcgen05") and unit.mma != mma:
        raise ValueError(f"{mma} does not exist on {g.key} (compute capability {cc}): its tensor-core instruction is "
                         f"{unit.instruction}" + (" (wgmma is sm_90a only)" if mma == "wgmma" else ""))
    if mma == "tcgen05" and copy != "tma":
        raise ValueError("a tcgen05 mainloop is fed by TMA here: copy must be 'tma'")
    cg = integer("cta_group", cta_group, 1, 2)
    if cg == 2 and mma != "tcgen05":
        raise ValueError("a CTA pair (cta_group=2) runs one tcgen05.mma across two SMs: mma must be 'tcgen05'")
    e = bytes_per_element(dtype)
    tm = integer("tile_m", tile_m, 16, 1024)
    tn = integer("tile_n", tile_n, 8, 1024)
    k = integer("bk", bk, 8, 1024)
    if (k * e) % unit.k_bytes:
        raise ValueError(f"bk x element bytes must be a multiple of {unit.k_bytes} B (one instruction's K), got "
                         f"{k} x {e:g}")
    if mma == "mma.sync" and e != 2:
        raise ValueError(f"the mma.sync path counted here is m16n8k16 with 16-bit operands; {dtype} is {e:g} bytes")
    alpha = (float(assumptions.value("kernels_mainloop.address_ops_per_copy")) if address_ops is None
             else real("address_ops", address_ops, 0, 64, unit="integer instructions per copy"))

    tm_sm, tn_sm = tm // cg, tn // cg  # per SM: half of A (along M) and half of B (along N) with a pair
    if tm % cg or tn % cg:
        raise ValueError(f"a CTA pair splits the tile in halves: {tm} x {tn} must be even")
    operand_bytes = (tm_sm + tn_sm) * k * e
    k_steps = k * e / unit.k_bytes  # instructions along K per K tile
    staging = staging_per_warp = 0.0
    operand_registers = 0
    warp_tile = (0, 0)

    if mma == "mma.sync":
        w = integer("warps", warps, 1, 32, unit="warps")
        wr, wc = _warp_grid(tm, tn, w)
        wm, wn = tm // wr, tn // wc
        warp_tile = (wm, wn)
        ldsm = (wm // 16 + wn // 16) * (k // 16)  # .x4: one 16 x 16 block of A or B (512 B) per instruction
        per_warp = (wm // 16) * (wn // 8) * (k // 16)
        mma_warps, mma_issues, mma_per_issuer = w, w * per_warp, per_warp
        staging, staging_per_warp = float(w * ldsm), float(ldsm)
        operand_registers = (wm // 16) * 4 + (wn // 8) * 2  # A: 4 registers per 16 x 16, B: 2 per 16 x 8
        mma_sync = 0.0
    elif mma == "wgmma":
        w = integer("warps", warps, 4, 32, unit="warps (4 per consumer warpgroup)")
        if w % 4:
            raise ValueError(f"wgmma runs on warpgroups of 4 warps: warps must be a multiple of 4, got {w}")
        groups = w // 4
        m_i, n_i = instruction_shape(g, tm, tn, "wgmma")
        if tm % (m_i * groups):
            raise ValueError(f"{groups} consumer warpgroup(s) of 64-row wgmma need tile_m a multiple of {m_i * groups}, "
                             f"got {tm}")
        if tn % n_i or n_i % 8:
            raise ValueError(f"tile_n must be a multiple of 8 and of the instruction's N ({n_i}), got {tn}")
        per_group = (tm // groups // m_i) * (tn // n_i) * k_steps
        mma_warps, mma_issues, mma_per_issuer = w, w * per_group, per_group
        mma_sync = _WGMMA_SYNC * w
    else:
        m_i, n_i = instruction_shape(g, tm, tn, "tcgen05", cg)
        if tm % m_i or m_i < 64 * cg:
            raise ValueError(f"tcgen05 with cta_group {cg} takes M = {64 * cg} to {128 * cg}: tile_m {tm} does not fit")
        if tn % n_i:
            raise ValueError(f"tile_n must be a multiple of the instruction's N ({n_i}), got {tn}")
        per_pair = (tm // m_i) * (tn // n_i) * k_steps  # issued by one thread of the leader CTA
        mma_warps, mma_issues, mma_per_issuer = 1, per_pair / cg, per_pair
        mma_sync = float(_TCGEN05_SYNC)

    if copy == "tma":
        copies = float(tma_copies(tm_sm, k, dtype, g) + tma_copies(tn_sm, k, dtype, g))
        loader_warps, per_thread, address = 1, copies, 1.0  # one thread; one K-coordinate update per K tile
        consumer_sync = _TMA_CONSUMER_SYNC * mma_warps if mma != "tcgen05" else 0.0
        sync = _TMA_PRODUCER_SYNC + consumer_sync + mma_sync
    else:
        loader_warps = mma_warps
        threads = 32 * loader_warps
        per_thread = math.ceil(operand_bytes / (unit.cp_async_max_bytes * threads))
        per_thread_instr = per_thread * (2 if copy == "ldg+sts" else 1)  # LDG.128 + STS.128, or one cp.async
        copies = float(loader_warps * per_thread_instr)
        address = alpha * per_thread * loader_warps
        sync = _SYNC_PER_WARP[copy] * loader_warps + mma_sync
    return KTile(copy, mma, tm, tn, k, e, cg, mma_warps, loader_warps, operand_bytes, copies, address, staging,
                 float(mma_issues), float(sync), float(per_thread), float(mma_per_issuer), staging_per_warp,
                 operand_registers, warp_tile)


def path_label(copy: str, mma: str) -> str:
    """'cp.async + mma.sync', 'TMA + wgmma', ...: how the pages name a combination."""
    return f"{'TMA' if copy == 'tma' else copy} + {mma}"


def mainloop_paths(chip: str | GPU, tile_m: int, tile_n: int, bk: int = 64, consumer_warpgroups: int = 2,
                   dtype: str = "bf16") -> dict[str, KTile]:
    """:func:`ktile_instructions` for every copy x MMA combination ``chip`` runs on this tile, from the CTA whose
    warps do everything (cp.async + mma.sync, 4 x ``consumer_warpgroups`` warps) to the chip's own path (TMA +
    wgmma on 9.0, TMA + tcgen05 on 10.0; one CTA per MMA), keyed by :func:`path_label`. ValueError before 9.0."""
    unit = mma_unit(chip)
    if not unit.has_tma:
        raise ValueError(f"TMA and the asynchronous MMAs need compute capability 9.0 or newer; {gpu(chip).key} is "
                         f"{unit.compute_capability}: its GEMMs run cp.async + mma.sync only")
    w = 4 * integer("consumer_warpgroups", consumer_warpgroups, 1, 4)
    combos = [("cp.async", "mma.sync")]
    combos += [("cp.async", "wgmma"), ("tma", "mma.sync"), ("tma", "wgmma")] if unit.mma == "wgmma" else \
        [("tma", "mma.sync"), ("tma", "tcgen05")]
    return {path_label(c, m): ktile_instructions(chip, tile_m, tile_n, bk, copy=c, mma=m, warps=w, dtype=dtype)
            for c, m in combos}


# ---- bytes: the accumulator and the shared-memory port (I040) ----------------------------------------------


@dataclass(frozen=True)
class Accumulator:
    """A fp32 accumulator of ``tile_m x tile_n`` per SM and where it lives (module doc)."""

    gpu: str
    tile_m: int  # per SM
    tile_n: int
    home: str  # "registers" or "tensor memory"
    bytes: float
    register_file_bytes: float
    tmem_bytes: float
    threads: int  # the threads that hold it (registers)
    registers_per_thread: int  # 0 in tensor memory
    tmem_columns: int  # 0 in registers
    tmem_columns_total: int

    @property
    def share(self) -> float:
        """Of its home: the register file, or tensor memory."""
        return self.bytes / (self.register_file_bytes if self.home == "registers" else self.tmem_bytes)

    @property
    def registers_freed_bytes(self) -> float:
        """Register-file bytes the accumulator does not take (all of it, in tensor memory)."""
        return self.bytes if self.home == "tensor memory" else 0.0

    @property
    def buffers(self) -> int:
        """Accumulators of this size tensor memory holds at once (2: the epilogue of one tile overlaps the
        mainloop of the next); 0 in registers."""
        return self.tmem_columns_total // self.tmem_columns if self.tmem_columns else 0


def accumulator(chip: str | GPU, tile_m: int, tile_n: int, threads: int = 256, cta_group: int = 1) -> Accumulator:
    """Where the fp32 accumulator of a ``tile_m x tile_n`` MMA tile lives on ``chip``, per SM (``tile_m`` is the
    pair's with ``cta_group=2``: each SM holds tile_m / 2 rows). Registers (before 10.0): tile_m tile_n / threads per
    thread (:func:`lib.kernels.gemm_tiles.accumulator_registers`). Tensor memory (10.0): ceil(rows / 128) x tile_n
    32-bit columns of the 512. H100 128 x 256: 128 KiB, half the register file; B200: the same bytes in 256 of
    the 512 tensor-memory columns, and no registers."""
    g = gpu(chip)
    lim = sm_limits(g)
    unit = mma_unit(g)
    cg = integer("cta_group", cta_group, 1, unit.cta_group_max, unit="CTAs per MMA")
    tm = integer("tile_m", tile_m, 1, 1024)
    tn = integer("tile_n", tile_n, 1, 1024)
    if tm % cg:
        raise ValueError(f"a CTA pair splits tile_m in halves: {tm} is odd")
    rows = tm // cg
    nbytes = float(rows * tn * ACCUMULATOR_BYTES)
    rf = float(lim.registers_per_sm * ACCUMULATOR_BYTES)
    if unit.accumulator == "tensor memory":
        cols = math.ceil(rows / unit.tmem_lanes) * tn
        if cols > unit.tmem_columns:
            raise ValueError(f"a {rows} x {tn} fp32 accumulator needs {cols} tensor-memory columns; an SM has "
                             f"{unit.tmem_columns}")
        return Accumulator(g.key, rows, tn, "tensor memory", nbytes, rf, float(unit.tmem_bytes), 0, 0, cols,
                           unit.tmem_columns)
    t = integer("threads", threads, 32, lim.max_threads_per_block, unit="threads holding the accumulator")
    return Accumulator(g.key, rows, tn, "registers", nbytes, rf, 0.0, t, accumulator_registers(rows, tn, t), 0, 0)


@dataclass(frozen=True)
class WarpSpecializedRegisters:
    """CUTLASS's Hopper register split (``kernels_mainloop``): one producer warpgroup lowers its registers with
    setmaxnreg, the consumer warpgroups raise theirs; registers per thread."""

    gpu: str
    tile_m: int
    tile_n: int
    consumer_threads: int
    producer_threads: int
    accumulator_per_thread: int
    heavy: bool  # accumulator_per_thread >= kernels_mainloop.heavy_pressure_registers
    producer: int
    consumer: int
    overhead: int  # kernels_gemm.gemm_overhead_registers
    registers_per_sm: int

    @property
    def total(self) -> int:
        """Registers the CTA holds: producer threads x producer + consumer threads x consumer."""
        return self.producer_threads * self.producer + self.consumer_threads * self.consumer

    @property
    def fits_register_file(self) -> bool:
        return self.total <= self.registers_per_sm

    @property
    def left_per_consumer(self) -> int:
        """Registers a consumer thread keeps beside its accumulator."""
        return self.consumer - self.accumulator_per_thread

    @property
    def spilled(self) -> int:
        """Registers per consumer thread over its limit: max(0, accumulator + overhead - consumer)."""
        return max(0, self.accumulator_per_thread + self.overhead - self.consumer)

    @property
    def accumulator_fits(self) -> bool:
        """The accumulator alone fits the consumer limit (if not, no compiler can keep it in registers)."""
        return self.accumulator_per_thread <= self.consumer


def warp_specialized_registers(chip: str | GPU, tile_m: int, tile_n: int, consumer_warpgroups: int = 2,
                               overhead: int | None = None) -> WarpSpecializedRegisters:
    """The setmaxnreg split of a Hopper warp-specialized GEMM (CUTLASS cooperative: one 128-thread producer, two
    consumer warpgroups on one tile): accumulator tile_m tile_n / consumer threads per thread; producer 40 and
    consumers 232 registers, or 24 and 240 once the accumulator needs 208 or more. H100 128 x 256: 128 accumulator
    registers, 104 left; 256 x 256: 256, over the 240 a thread may be given. ValueError without setmaxnreg."""
    g = gpu(chip)
    lim = sm_limits(g)
    unit = mma_unit(g)
    if unit.setmaxnreg is None:
        raise ValueError(f"setmaxnreg (register reallocation between warpgroups) needs compute capability 9.0; "
                         f"{g.key} is {unit.compute_capability}")
    groups = integer("consumer_warpgroups", consumer_warpgroups, 1, 4)
    threads = 128 * groups
    acc = accumulator_registers(integer("tile_m", tile_m, 1, 1024), integer("tile_n", tile_n, 1, 1024), threads)
    heavy = acc >= int(assumptions.value("kernels_mainloop.heavy_pressure_registers"))
    key = "heavy_" if heavy else ""
    producer = int(assumptions.value(f"kernels_mainloop.{key}producer_registers"))
    consumer = int(assumptions.value(f"kernels_mainloop.{key}consumer_registers"))
    lo, hi = unit.setmaxnreg
    for name, r in (("producer", producer), ("consumer", consumer)):
        if not lo <= r <= hi or r % 8:
            raise ValueError(f"{name} registers {r} outside setmaxnreg's multiples of 8 in [{lo}, {hi}]")
    return WarpSpecializedRegisters(g.key, tile_m, tile_n, threads, 128, acc, heavy, producer, consumer,
                                    overhead_registers(overhead), lim.registers_per_sm)


@dataclass(frozen=True)
class SmemPort:
    """Shared-memory bytes one SM moves per clock for an MMA tile at the tensor cores' peak (module doc)."""

    gpu: str
    dtype: str
    tile_m: int  # the MMA tile (the pair's with cta_group 2)
    tile_n: int
    cta_group: int
    mma: str
    instruction_m: int
    instruction_n: int
    flops_per_clock: float  # per SM, dense, this dtype
    port_bytes_per_clock: int  # banks x bank width
    read_intensity: float  # FLOP per byte the MMA instructions read from shared memory
    fill_intensity: float  # FLOP per byte TMA writes into this SM's shared memory

    @property
    def reads_per_clock(self) -> float:
        return self.flops_per_clock / self.read_intensity

    @property
    def fill_per_clock(self) -> float:
        return self.flops_per_clock / self.fill_intensity

    @property
    def read_share(self) -> float:
        return self.reads_per_clock / self.port_bytes_per_clock

    @property
    def fill_share(self) -> float:
        return self.fill_per_clock / self.port_bytes_per_clock

    @property
    def total_share(self) -> float:
        """(reads + fill) / port: above 1, the shared memory cannot feed the tensor cores at their peak if
        writes and reads share its 128 B per clock (module doc)."""
        return self.read_share + self.fill_share


def smem_port(chip: str | GPU, tile_m: int, tile_n: int, dtype: str = "bf16", cta_group: int = 1) -> SmemPort:
    """The shared-memory demand per clock of a ``tile_m x tile_n`` MMA tile on ``chip``'s own tensor-core
    instruction (wgmma on 9.0, tcgen05 on 10.0; ``tile_m`` the pair's with ``cta_group=2``): reads at
    :func:`lib.kernels.gemm_tiles.tile_intensity` of the instruction shape (:func:`instruction_shape`), TMA fill at
    the intensity of the tile (per SM, the pair stages half of A and half of B). H100 128 x 256 bf16: 80 B reads +
    48 B fill per clock; B200 1-SM 128 x 256: 96 + 96; B200 pair 256 x 256: 64 + 64, of 128."""
    g = gpu(chip)
    lim = sm_limits(g)
    unit = mma_unit(g)
    if unit.mma == "mma.sync":
        raise ValueError(f"{g.key} (compute capability {unit.compute_capability}) has no asynchronous MMA reading "
                         "shared memory; its mma.sync operands come through ldmatrix")
    cg = integer("cta_group", cta_group, 1, unit.cta_group_max, unit="CTAs per MMA")
    tm = integer("tile_m", tile_m, 16, 1024)
    tn = integer("tile_n", tile_n, 8, 1024)
    m_i, n_i = instruction_shape(g, tm, tn, unit.mma, cg)
    flops = tensor_flops_per_sm_clock(g, dtype)
    return SmemPort(g.key, dtype, tm, tn, cg, unit.mma, m_i, n_i, flops, lim.smem_banks * lim.bank_width_bytes,
                    tile_intensity(m_i, n_i, dtype), tile_intensity(tm, tn, dtype))


@dataclass(frozen=True)
class GenerationConfig:
    """One mainloop of :func:`generation_configs`: its MMA tile, accumulator, shared-memory port and stages, per SM."""

    name: str
    gpu: str
    tile_m: int  # the MMA tile (the pair's with cta_group 2)
    tile_n: int
    cta_group: int
    bk: int
    acc: Accumulator
    port: SmemPort
    stage_bytes: float  # per SM
    stages: int  # that fit in one block's shared memory


def generation_configs(hopper: str | GPU, blackwell: str | GPU, tile_m: int, tile_n: int,
                       dtype: str = "bf16") -> dict[str, GenerationConfig]:
    """The three mainloops I040 compares for one Hopper tile, keyed "Hopper", "Blackwell 1 SM", "Blackwell pair":
    the tile on ``hopper`` (consumer warpgroups of 64 rows, at most 2, holding the accumulator), the same tile on one
    ``blackwell`` SM, and the CTA pair that doubles its rows (each SM stages tile_m rows of A and tile_n / 2 columns
    of B). bk is one 128-byte swizzle row (:func:`lib.kernels.gemm_tiles.swizzle_bk`)."""
    h, b = gpu(hopper), gpu(blackwell)
    if mma_unit(h).mma != "wgmma":
        raise ValueError(f"hopper must be a compute capability 9.0 GPU (wgmma); {h.key} is {mma_unit(h).compute_capability}")
    if mma_unit(b).mma != "tcgen05":
        raise ValueError(f"blackwell must be a compute capability 10.0 GPU (tcgen05); {b.key} is "
                         f"{mma_unit(b).compute_capability}")
    tm = integer("tile_m", tile_m, 64, 128, unit="rows (a pair's MMA is at most 256 rows)")
    tn = integer("tile_n", tile_n, 8, 256)
    bk = swizzle_bk(dtype, b)
    out = {}
    for name, chip, rows, cg in (("Hopper", h, tm, 1), ("Blackwell 1 SM", b, tm, 1), ("Blackwell pair", b, 2 * tm, 2)):
        threads = 128 * min(2, tm // 64)
        out[name] = GenerationConfig(name, chip.key, rows, tn, cg, bk, accumulator(chip, rows, tn, threads, cg),
                                     smem_port(chip, rows, tn, dtype, cg), stage_bytes(rows // cg, tn // cg, bk, dtype),
                                     max_stages(chip, rows // cg, tn // cg, bk, dtype))
    return out
