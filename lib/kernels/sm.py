"""One streaming multiprocessor's resources, and what a kernel's launch gets of them.

* :func:`sm_limits`: the per-SM limits of a GPU's compute capability (``data/hardware.yaml``,
  ``compute_capabilities``) with the GPU's own shared memory per SM and SM count.
* :func:`occupancy`: thread blocks (and warps) resident on one SM for a launch of ``threads``
  threads per block using ``registers`` registers per thread and ``smem_bytes`` bytes of shared
  memory per block, and which limit binds. The arithmetic is ``cuda_occupancy.h``'s:

  - warps:  floor(max_warps_per_sm / ceil(threads / 32)), and at most ``max_blocks_per_sm``;
  - registers: a warp holds ``ceil(32 r / 256) * 256`` registers, drawn from one of the SM's 4
    register sub-partitions (65,536 / 4 each), so warps by registers = 4 * floor(16,384 / that),
    blocks = floor(those warps / warps per block); a block over the per-block register limit, or
    r > 255, does not launch;
  - shared memory: a block holds ``ceil((smem + 1 KiB reserved) / 128) * 128`` bytes; blocks =
    floor(smem per SM / that); more than the per-block maximum does not launch.

  Occupancy = resident warps / max warps per SM. :func:`register_cap` inverts it: the most registers
  per thread that still give ``min_blocks`` blocks (what ``__launch_bounds__`` asks ptxas for).
  Shared memory per SM is the largest carveout
  (a kernel that asks for it); smaller carveouts round the shared-memory limit down.
* :func:`wave_efficiency` and :func:`waves`: a grid of B blocks on S resident slots (SMs x blocks per
  SM) runs in ceil(B / S) waves; the last one is partly empty.

Units: bytes, registers (32-bit), threads, warps, blocks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lib.inputs import integer
from lib.registry.data import load_yaml
from lib.registry.hardware import GPU, gpu
from lib.units import KiB

__all__ = ["SMLimits", "Occupancy", "sm_limits", "occupancy", "register_cap", "waves", "wave_efficiency"]


@dataclass(frozen=True)
class SMLimits:
    """Per-SM limits of one GPU (module doc); memory-system granules too (sector, line, banks)."""

    gpu: str
    compute_capability: str
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_block: int
    max_registers_per_thread: int
    register_alloc_unit: int
    register_sub_partitions: int
    smem_per_sm_bytes: int
    max_smem_per_block_bytes: int
    smem_alloc_unit_bytes: int
    smem_reserved_per_block_bytes: int
    sector_bytes: int
    cache_line_bytes: int
    smem_banks: int
    bank_width_bytes: int

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size


@functools.cache
def _table() -> dict:
    return load_yaml("hardware.yaml")["compute_capabilities"]


def sm_limits(chip: str | GPU) -> SMLimits:
    """The per-SM limits of ``chip`` (an NVIDIA GPU of ``data/hardware.yaml``); ValueError for a
    GPU without a compute capability (AMD's CUs have other limits) or without shared memory data."""
    g = gpu(chip)
    table = _table()
    if g.compute_capability is None or g.compute_capability not in table:
        nvidia = [k for k in _names() if gpu(k).compute_capability in table]
        raise ValueError(f"{g.key}: no CUDA compute capability in data/hardware.yaml (per-SM limits are "
                         f"NVIDIA's); choose one of {', '.join(nvidia)}")
    if g.smem_per_sm_bytes is None:
        raise ValueError(f"{g.key}: data/hardware.yaml has no smem_per_sm_kib")
    row = {k: v["value"] for k, v in {**table["common"], **table[g.compute_capability]}.items()}
    return SMLimits(
        gpu=g.key, compute_capability=g.compute_capability, sm_count=g.compute_units,
        warp_size=row["warp_size"], max_threads_per_block=row["max_threads_per_block"],
        max_warps_per_sm=row["max_warps_per_sm"], max_blocks_per_sm=row["max_blocks_per_sm"],
        registers_per_sm=row["registers_per_sm"], max_registers_per_block=row["max_registers_per_block"],
        max_registers_per_thread=row["max_registers_per_thread"], register_alloc_unit=row["register_alloc_unit"],
        register_sub_partitions=row["register_sub_partitions"], smem_per_sm_bytes=int(g.smem_per_sm_bytes),
        max_smem_per_block_bytes=int(row["max_smem_per_block_kib"] * KiB),
        smem_alloc_unit_bytes=row["smem_alloc_unit_bytes"],
        smem_reserved_per_block_bytes=row["smem_reserved_per_block_bytes"],
        sector_bytes=row["sector_bytes"], cache_line_bytes=row["cache_line_bytes"],
        smem_banks=row["smem_banks"], bank_width_bytes=row["bank_width_bytes"],
    )


def _names() -> list[str]:
    from lib.registry.hardware import gpu_names

    return gpu_names()


@dataclass(frozen=True)
class Occupancy:
    """What one SM holds of a launch (module doc). ``blocks_by`` maps each limit ("warps",
    "blocks", "registers", "shared memory") to the blocks it allows; ``binding`` names the limits
    that set ``blocks_per_sm`` (ties list several); 0 blocks means the launch cannot run."""

    threads_per_block: int
    registers_per_thread: int
    smem_per_block_bytes: int
    warps_per_block: int
    registers_per_warp: int  # allocated, after rounding
    smem_allocated_per_block_bytes: int
    blocks_by: dict
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int

    @property
    def occupancy(self) -> float:
        """Resident warps / the SM's maximum (0..1)."""
        return self.warps_per_sm / self.max_warps_per_sm

    @property
    def binding(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.blocks_by.items() if v == self.blocks_per_sm)


def occupancy(chip: str | GPU | SMLimits, threads_per_block: int, registers_per_thread: int,
              smem_per_block_bytes: int = 0) -> Occupancy:
    """Blocks and warps of one launch resident per SM (module doc: ``cuda_occupancy.h``'s limits).

    H100, 256 threads, 32 registers, no shared memory: 8 blocks, 64 warps, occupancy 1.0;
    at 128 registers: 2 blocks (registers bind), occupancy 0.25."""
    lim = chip if isinstance(chip, SMLimits) else sm_limits(chip)
    t = integer("threads_per_block", threads_per_block, 1, lim.max_threads_per_block, unit="threads")
    r = integer("registers_per_thread", registers_per_thread, 1, lim.max_registers_per_thread, unit="registers")
    s = integer("smem_per_block_bytes", smem_per_block_bytes, 0, lim.max_smem_per_block_bytes, unit="bytes")
    warps = -(-t // lim.warp_size)
    regs_warp = -(-r * lim.warp_size // lim.register_alloc_unit) * lim.register_alloc_unit
    assumed = regs_warp * -(-warps // lim.register_sub_partitions) * lim.register_sub_partitions
    if max(assumed, regs_warp * warps) > lim.max_registers_per_block:
        by_regs = 0  # the block's registers exceed the per-block limit: the launch fails
    else:
        per_part = lim.registers_per_sm // lim.register_sub_partitions
        by_regs = (per_part // regs_warp) * lim.register_sub_partitions // warps
    smem_alloc = -(-(s + lim.smem_reserved_per_block_bytes) // lim.smem_alloc_unit_bytes) * lim.smem_alloc_unit_bytes
    blocks_by = {
        "warps": lim.max_warps_per_sm // warps,
        "blocks": lim.max_blocks_per_sm,
        "registers": by_regs,
        "shared memory": lim.smem_per_sm_bytes // smem_alloc,
    }
    blocks = min(blocks_by.values())
    return Occupancy(t, r, s, warps, regs_warp, smem_alloc, blocks_by, blocks, blocks * warps, lim.max_warps_per_sm)


def register_cap(chip: str | GPU | SMLimits, threads_per_block: int, min_blocks: int = 1,
                 smem_per_block_bytes: int = 0) -> int:
    """Registers per thread ptxas may use under ``__launch_bounds__(threads_per_block, min_blocks)``:
    the largest r <= 255 with :func:`lib.kernels.sm.occupancy` >= ``min_blocks`` blocks per SM.

    H100, 256 threads: 4 blocks -> 64 registers, 2 -> 128, 1 -> 255. ValueError when no register
    count can give ``min_blocks`` blocks (the warp, block or shared-memory limit already binds)."""
    lim = chip if isinstance(chip, SMLimits) else sm_limits(chip)
    b = integer("min_blocks", min_blocks, 1, lim.max_blocks_per_sm, unit="blocks per SM")
    best = None
    for r in range(1, lim.max_registers_per_thread + 1):
        if occupancy(lim, threads_per_block, r, smem_per_block_bytes).blocks_per_sm >= b:
            best = r
        else:
            break  # fewer registers never lower occupancy: the first miss ends the run
    if best is None:
        o = occupancy(lim, threads_per_block, 1, smem_per_block_bytes)
        other = {k: v for k, v in o.blocks_by.items() if k != "registers"}
        limit = min(other, key=other.get)
        raise ValueError(f"no register count gives {b} blocks of {threads_per_block} threads on {lim.gpu}: the "
                         f"{limit} limit allows {other[limit]} (min_blocks must be at most {other[limit]})")
    return best


def waves(thread_blocks: int, slots: int) -> int:
    """ceil(thread_blocks / slots): the rounds a grid needs when ``slots`` blocks run at once
    (slots = SMs x resident blocks per SM)."""
    thread_blocks, slots = integer("thread_blocks", thread_blocks, 1), integer("slots", slots, 1)
    return math.ceil(thread_blocks / slots)


def wave_efficiency(thread_blocks: int, slots: int) -> float:
    """Fraction of the launched waves' block slots that hold work: w / ceil(w), w = blocks / slots.

    48 blocks on 108 slots: 0.44; 96: 0.89; 144: 0.67 (the second wave is a third full).
    """
    return thread_blocks / (waves(thread_blocks, slots) * slots)
