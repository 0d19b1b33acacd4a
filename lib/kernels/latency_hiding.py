"""What occupancy is for: hiding memory latency, by Little's law, and what a register cap costs.

An SM keeps a kernel's memory pipe full only if enough bytes are in flight: by Little's law the
bytes in flight one SM needs are its share of the bandwidth times the latency,

    B_needed = (W / SMs) x L                                   (bytes per SM)

and a kernel supplies

    B_flight = warps_per_sm x 32 x loads_in_flight x bytes_per_load

(each thread issues ``loads_in_flight`` independent loads of ``bytes_per_load`` bytes before it
uses the first). The achieved fraction of the bandwidth is min(1, B_flight / B_needed): warps
(occupancy) and independent loads per warp (ILP) are interchangeable, so fewer warps doing more
independent work each can keep the same bytes in flight.

* :func:`bytes_in_flight_needed`, :func:`bytes_in_flight`, :func:`streaming_loop` (the
  fraction, with the register spills a cap adds: each spilled register costs
  ``kernels_gemm.spill_accesses_per_iteration`` 4-byte accesses per loop iteration, counted as
  memory traffic in the worst case and as none when L1 absorbs it);
* :func:`lib.kernels.sm.register_cap`: the registers per thread ptxas may use under
  ``__launch_bounds__(threads, min_blocks)``: the largest r whose occupancy
  (:func:`lib.kernels.sm.occupancy`) still fits ``min_blocks`` blocks (``-maxrregcount=r`` sets
  the same cap directly, for every kernel of the file);
* :func:`achieved_occupancy`: the time-averaged resident warps of a grid whose last wave is
  partly empty (equal-length blocks; the tail effect only), against the theoretical occupancy;
* :func:`closed_loop_throughput`: an event simulation of a fixed number of outstanding requests
  against a latency and a bandwidth (the oracle the closed form is checked against).

The loaded memory latency L is an assumption (``kernels_gemm.dram_latency_ns``). SI units.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.kernels.sm import Occupancy, occupancy, sm_limits, wave_efficiency, waves
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu

__all__ = ["dram_latency_s", "bytes_in_flight_needed", "bytes_in_flight", "LoopTraffic", "streaming_loop",
           "spill_bytes_per_iteration", "achieved_occupancy",
           "closed_loop_throughput", "REGISTER_BYTES"]

REGISTER_BYTES = 4  # a 32-bit register
LOAD_WIDTHS = (4, 8, 16)  # bytes per thread of one global load: 32-, 64- and 128-bit


def dram_latency_s(latency_s: float | None = None) -> float:
    """The loaded memory latency Little's law uses: ``latency_s``, or ``kernels_gemm.dram_latency_ns``."""
    if latency_s is None:
        return float(assumptions.value("kernels_gemm.dram_latency_ns")) * 1e-9
    return real("latency_s", latency_s, 0, 1e-3, low_open=True, unit="seconds")


def bytes_in_flight_needed(chip: str | GPU, latency_s: float | None = None) -> float:
    """Bytes one SM must keep in flight to draw its share of the HBM bandwidth: (W / SMs) x L.

    H100 SXM at 600 ns: 3.35e12 / 132 x 600e-9 = 15.2 kB."""
    g = gpu(chip)
    return g.memory_bandwidth / g.compute_units * dram_latency_s(latency_s)


def bytes_in_flight(warps_per_sm: int, loads_in_flight: int, bytes_per_load: int, warp_size: int = 32) -> float:
    """Bytes one SM has in flight: warps x warp_size x independent loads per thread x bytes per load."""
    w = integer("warps_per_sm", warps_per_sm, 0)
    n = integer("loads_in_flight", loads_in_flight, 1, 64, unit="independent loads per thread")
    if bytes_per_load not in LOAD_WIDTHS:
        raise ValueError(f"bytes_per_load must be one of {LOAD_WIDTHS} (a 32-, 64- or 128-bit load), got {bytes_per_load!r}")
    return float(w * integer("warp_size", warp_size, 1) * n * bytes_per_load)


def spill_bytes_per_iteration(spilled_registers: int, accesses: float | None = None) -> float:
    """Local-memory bytes one thread moves per loop iteration for ``spilled_registers`` spilled
    registers: spilled x 4 B x accesses (``kernels_gemm.spill_accesses_per_iteration``: 2, a store
    and a reload, for a value the loop updates; 1 for a loop-invariant one)."""
    s = integer("spilled_registers", spilled_registers, 0, 255, unit="registers")
    a = (float(assumptions.value("kernels_gemm.spill_accesses_per_iteration")) if accesses is None
         else real("accesses", accesses, 0, 2, unit="accesses per iteration"))
    return s * REGISTER_BYTES * a


@dataclass(frozen=True)
class LoopTraffic:
    """A memory-bound main loop on one SM (module doc). ``slowdown_*``: time per useful byte against
    streaming the kernel's own bytes at the full bandwidth (1.0 = at the roof)."""

    occupancy: Occupancy
    bytes_in_flight: float  # per SM
    bytes_needed: float  # per SM, Little's law
    own_bytes_per_iteration: float  # per thread: loads_in_flight x bytes_per_load
    spill_bytes_per_iteration: float  # per thread, if every spill access reaches L2 / HBM

    @property
    def bandwidth_fraction(self) -> float:
        """min(1, bytes in flight / bytes needed): the share of the SM's bandwidth the loop can draw."""
        return min(1.0, self.bytes_in_flight / self.bytes_needed) if self.occupancy.blocks_per_sm else 0.0

    @property
    def spill_ratio(self) -> float:
        """Spill bytes / the kernel's own bytes, per iteration."""
        return self.spill_bytes_per_iteration / self.own_bytes_per_iteration

    @property
    def slowdown_best(self) -> float:
        """Spills all hit in L1: only the bandwidth fraction counts (inf if nothing is resident)."""
        f = self.bandwidth_fraction
        return math.inf if f == 0 else 1.0 / f

    @property
    def slowdown_worst(self) -> float:
        """Every spill access reaches L2 / HBM and is paid at the same achieved rate."""
        return self.slowdown_best * (1.0 + self.spill_ratio)


def streaming_loop(chip: str | GPU, threads_per_block: int, registers_per_thread: int, smem_per_block_bytes: int,
                   loads_in_flight: int, bytes_per_load: int, spilled_registers: int = 0,
                   latency_s: float | None = None) -> LoopTraffic:
    """Occupancy, bytes in flight against Little's law, and spill traffic of one kernel's main loop."""
    lim = sm_limits(chip)
    occ = occupancy(lim, threads_per_block, registers_per_thread, smem_per_block_bytes)
    flight = bytes_in_flight(occ.warps_per_sm, loads_in_flight, bytes_per_load, lim.warp_size)
    return LoopTraffic(occ, flight, bytes_in_flight_needed(chip, latency_s), float(loads_in_flight * bytes_per_load),
                       spill_bytes_per_iteration(spilled_registers))


def achieved_occupancy(chip: str | GPU, occ: Occupancy, grid_blocks: int) -> float:
    """Time-averaged resident warps / max warps of a grid of ``grid_blocks`` equal-length blocks:
    theoretical occupancy x blocks / (waves x slots), slots = SMs x resident blocks per SM. The
    tail effect only: blocks that end unevenly and the launch ramp lower a measured value further."""
    g = gpu(chip)
    if occ.blocks_per_sm == 0:
        return 0.0
    slots = g.compute_units * occ.blocks_per_sm
    return occ.occupancy * wave_efficiency(integer("grid_blocks", grid_blocks, 1), slots)


def grid_waves(chip: str | GPU, occ: Occupancy, grid_blocks: int) -> int:
    """Waves of a grid: ceil(blocks / (SMs x resident blocks per SM))."""
    if occ.blocks_per_sm == 0:
        raise ValueError("the launch does not fit on an SM (0 resident blocks): no waves to count")
    return waves(grid_blocks, gpu(chip).compute_units * occ.blocks_per_sm)


def closed_loop_throughput(requests: int, bytes_per_request: float, latency_s: float, bandwidth: float,
                           horizon_latencies: int = 40) -> float:
    """Bytes/s of ``requests`` outstanding requests, each reissued as soon as it returns, through a
    memory that serves ``bandwidth`` bytes/s (one request at a time, first come first served) and
    then returns the data ``latency_s`` later: an event simulation over ``horizon_latencies``
    latencies. The oracle for min(W, N b / (L + b / W)), Little's law's closed form."""
    n = integer("requests", requests, 1, 100_000)
    b = real("bytes_per_request", bytes_per_request, 0, low_open=True)
    lat = real("latency_s", latency_s, 0, low_open=True)
    bw = real("bandwidth", bandwidth, 0, low_open=True)
    service = b / bw
    horizon = integer("horizon_latencies", horizon_latencies, 2) * (lat + service)
    ready = [0.0] * n  # when each request is next issued
    heapq.heapify(ready)
    server_free = 0.0
    done_bytes = 0.0
    warm = horizon / 4  # count only the steady state
    while True:
        t = heapq.heappop(ready)
        start = max(t, server_free)
        server_free = start + service
        back = server_free + lat
        if back > horizon:
            break
        if back > warm:
            done_bytes += b
        heapq.heappush(ready, back)
    return done_bytes / (horizon - warm)
