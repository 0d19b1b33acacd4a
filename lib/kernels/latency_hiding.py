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
  against a latency and a bandwidth (the oracle the closed form is checked against);
* :func:`littles_law_bandwidth`: the whole chip's bandwidth, min(plateau, SMs x B / L), and its
  inverse :func:`implied_latency_s` (the latency a measured bandwidth implies, SMs x B / bandwidth);
  :func:`fit_loaded_latency` fits L (and the plateau) of that model to a measured curve, least
  squares on log bandwidth, exactly (the objective is piecewise quadratic; every piece is solved);
* :func:`gemv`: a decode GEMV y = x W^T (W of N x K, a batch of x rows) on CUDA cores, written the
  usual way (``threads_per_row`` threads share a row, each issuing ``unroll`` loads of
  ``bytes_per_load`` bytes before it uses the first; x staged in shared memory; one fp32 accumulator
  per sequence): its bytes in flight per SM, the places they fall short (too few rows, too few bytes
  per thread, what each extra sequence of the batch costs: occupancy and the shared-memory reads of x),
  and its time (:func:`lib.perf.step.kernel_time_s`: fixed + the slower of memory and compute).
  ``tools/device/gemv_probe.cu`` is the same kernel, timed on the H200 (``gemv_probe`` in
  data/measured-h200.yaml).

The loaded memory latency L is an assumption (``kernels_gemm.dram_latency_ns``); the H200
measurement of ``data/measured-h200.yaml`` (``bytes_in_flight``) is its anchor. SI units.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.kernels.sm import Occupancy, occupancy, sm_limits, wave_efficiency, waves
from lib.registry import assumptions
from lib.registry.dtypes import bytes_per_element
from lib.registry.hardware import GPU, gpu

__all__ = ["dram_latency_s", "bytes_in_flight_needed", "bytes_in_flight", "LoopTraffic", "streaming_loop",
           "spill_bytes_per_iteration", "achieved_occupancy",
           "closed_loop_throughput", "REGISTER_BYTES", "littles_law_bandwidth", "implied_latency_s", "LatencyFit",
           "fit_loaded_latency", "GEMV_THREADS_PER_ROW", "gemv_registers", "Gemv", "gemv", "gemv_places"]

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


# ---- the chip's bandwidth from its bytes in flight, and the latency fitted to a measured curve -------------


def _bytes_array(name: str, values):
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be positive finite numbers (bytes or bytes/s), got {values!r}")
    return arr


def littles_law_bandwidth(bytes_in_flight_per_sm, sms: int, latency_s: float, plateau: float):
    """Bytes/s a chip of ``sms`` SMs draws when each keeps ``bytes_in_flight_per_sm`` bytes in flight:
    min(plateau, SMs x B / L), Little's law capped by what the memory delivers (a float, or an array
    for an array of B). With plateau = W this is :attr:`LoopTraffic.bandwidth_fraction` x W.

    H200 (132 SMs), 16 KiB per SM at 600 ns: 132 x 16,384 / 600e-9 = 3.6 TB/s."""
    import numpy as np

    n = integer("sms", sms, 1)
    lat = real("latency_s", latency_s, 0, 1e-3, low_open=True, unit="seconds")
    top = real("plateau", plateau, 0, low_open=True, unit="bytes/s")
    b = np.asarray(bytes_in_flight_per_sm, dtype=float)
    if not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ValueError(f"bytes_in_flight_per_sm must be finite numbers >= 0, got {bytes_in_flight_per_sm!r}")
    out = np.minimum(top, n * b / lat)
    return float(out) if out.ndim == 0 else out


def implied_latency_s(bytes_in_flight_per_sm, bandwidth, sms: int):
    """The latency Little's law reads off a measured point: SMs x B / bandwidth (seconds; a float or
    an array). Below the knee it is the loaded latency; past it, it grows with the queue the extra bytes
    wait in, so it is only a latency where the bandwidth still rises with B."""
    b = _bytes_array("bytes_in_flight_per_sm", bytes_in_flight_per_sm)
    w = _bytes_array("bandwidth", bandwidth)
    out = integer("sms", sms, 1) * b / w
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class LatencyFit:
    """The model bandwidth = min(plateau, SMs x B / L) fitted to measured (B, bandwidth) points."""

    latency_s: float
    plateau: float  # bytes/s
    sms: int
    plateau_fitted: bool  # False: the plateau was given, only L was fitted
    rms_log_error: float  # sqrt(mean((ln model - ln measured)^2))
    max_log_error: float  # max |ln model - ln measured|
    points: int

    @property
    def bytes_needed_per_sm(self) -> float:
        """The knee: plateau / SMs x L, the bytes per SM at which the model reaches the plateau."""
        return self.plateau / self.sms * self.latency_s

    def bandwidth(self, bytes_in_flight_per_sm):
        """The fitted model at ``bytes_in_flight_per_sm`` (:func:`littles_law_bandwidth`)."""
        return littles_law_bandwidth(bytes_in_flight_per_sm, self.sms, self.latency_s, self.plateau)


def fit_loaded_latency(bytes_in_flight_per_sm, bandwidth, sms: int, plateau: float | None = None) -> LatencyFit:
    """Least squares on ln(bandwidth) of min(P, SMs x B / L) over measured points: L, and P unless
    ``plateau`` is given.

    Exact, not iterative: with s = ln(P L), the knee's ln(SMs x B), a point is on the slope when
    ln(SMs x B_i) <= s and on the plateau otherwise, so between two consecutive ln(SMs x B_i) the
    objective is a quadratic in s (ln L and ln P eliminated in closed form) and each piece is minimized
    on its interval. At least one point must lie on the slope (and, with P fitted, one on the plateau):
    needs two distinct B. H200 (data/measured-h200.yaml): about 430 ns and 4.1 TB/s."""
    import numpy as np

    b = _bytes_array("bytes_in_flight_per_sm", bytes_in_flight_per_sm)
    w = _bytes_array("bandwidth", bandwidth)
    if b.shape != w.shape or b.ndim != 1:
        raise ValueError(f"bytes_in_flight_per_sm and bandwidth must be two lists of the same length, got "
                         f"{b.shape} and {w.shape}")
    n_sm = integer("sms", sms, 1)
    t, y = np.log(n_sm * b), np.log(w)
    knots = np.unique(t)
    if knots.size < 2:
        raise ValueError("fit_loaded_latency needs points at two or more distinct bytes in flight")
    fixed = plateau is not None
    v_fixed = math.log(real("plateau", plateau, 0, low_open=True, unit="bytes/s")) if fixed else 0.0
    ends = list(zip(knots[:-1], knots[1:], strict=True)) + ([(knots[-1], math.inf)] if fixed else [])
    best = None
    for lo, hi in ends:
        slope = t <= lo  # on the slope for every s in [lo, hi]
        if fixed:  # f(s) = sum_slope (t + v - y - s)^2 + const
            s = float(np.clip(np.mean(t[slope] + v_fixed - y[slope]), lo, hi))
            u, v = s - v_fixed, v_fixed
        else:  # d = c + s e, ln L = mean(d), f = |centred d|^2
            e = (~slope).astype(float)
            c = np.where(slope, t - y, -y)
            ce, ee = c - c.mean(), e - e.mean()
            s = float(np.clip(-(ce @ ee) / (ee @ ee), lo, hi))
            u = float(np.mean(c + s * e))
            v = s - u
        err = np.minimum(t - u, v) - y
        f = float(err @ err)
        if best is None or f < best[0] - 1e-15:
            best = (f, u, v, err)
    _, u, v, err = best
    return LatencyFit(math.exp(u), math.exp(v), n_sm, not fixed, float(np.sqrt(np.mean(err**2))),
                      float(np.max(np.abs(err))), int(b.size))


# ---- a decode GEMV on CUDA cores: bytes in flight, the three places they fall short, time -------------------

GEMV_THREADS_PER_ROW = (8, 16, 32, 64, 128, 256)
"""Threads that share one row of W: part of a warp (several rows per warp) up to several warps."""
GEMV_THREADS_PER_BLOCK = 256
X_BYTES = 2  # activations (x) in bf16
ACCUMULATOR_BYTES = 4  # fp32 partial sums (one per sequence; per warp of a row when warps share a row)


def gemv_registers(batch: int, bytes_per_load: int, base: float | None = None) -> int:
    """Registers per thread of this page's GEMV: ceil(base + batch x (1 + bytes_per_load / 16)): one
    fp32 accumulator per sequence of the batch plus the x values in use (about one register per 16 bytes
    of the weight load, per sequence); base = ``kernels_gemm.gemv_base_registers`` (addresses, loop,
    the weight loads ptxas keeps in flight). Fitted to the registers of that kernel compiled on the H200
    (``gemv_probe`` in data/measured-h200.yaml): within 17% of all 45 configurations, batch 1-28."""
    bt = integer("batch", batch, 1, 4096, unit="sequences")
    if bytes_per_load not in LOAD_WIDTHS:
        raise ValueError(f"bytes_per_load must be one of {LOAD_WIDTHS} (a 32-, 64- or 128-bit load), got {bytes_per_load!r}")
    r0 = float(assumptions.value("kernels_gemm.gemv_base_registers")) if base is None else real("base", base, 0, 255)
    return math.ceil(r0 + bt * (1 + bytes_per_load / 16))


@dataclass(frozen=True)
class Gemv:
    """One decode GEMV y = x W^T on CUDA cores (module doc; :func:`gemv`). Bytes, seconds, bytes/s."""

    gpu: str
    n: int  # rows of W (outputs)
    k: int  # columns of W (inputs)
    batch: int
    dtype: str  # of W
    threads_per_row: int
    bytes_per_load: int
    unroll: int  # loads each thread issues before it uses the first
    threads_per_block: int
    rows_per_block: int
    grid_blocks: int
    loads_per_thread: int  # along the thread's share of its row: ceil(K b / (threads_per_row x bytes_per_load))
    loads_in_flight: int  # min(unroll, loads_per_thread)
    rounds: int  # ceil(loads_per_thread / loads_in_flight): latencies one block's threads wait in turn
    registers_per_thread: int
    smem_per_block_bytes: int
    occupancy: Occupancy
    sms: int
    latency_s: float
    plateau: float  # what the memory delivers at best: W x decode_step.gemv_bandwidth_efficiency
    compute_peak: float  # FP32 FLOP/s of the CUDA cores (an FMA is 2 FLOP)
    x_read_wavefronts: int  # shared-memory wavefronts of one warp's read of x (lanes bytes_per_load apart)
    x_read_s: float | None  # every multiply-add's read of x through shared memory; None: no SM clock in data/
    fixed_s: float  # the kernel's fixed cost (decode_step.kernel_fixed_us)
    launch_gap_s: float  # idle GPU before the next kernel of a CUDA graph (decode_step.launch_gap_us)

    @property
    def weight_bytes(self) -> float:
        return self.n * self.k * bytes_per_element(self.dtype)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.n * self.k

    @property
    def slots(self) -> int:
        """Blocks resident at once: SMs x resident blocks per SM."""
        return self.sms * self.occupancy.blocks_per_sm

    @property
    def waves(self) -> int:
        return waves(self.grid_blocks, self.slots)

    @property
    def threads_with_work_per_row(self) -> int:
        """min(threads_per_row, row bytes / bytes_per_load): past that, a row has no load left for a thread."""
        return min(self.threads_per_row, int(self.k * bytes_per_element(self.dtype) // self.bytes_per_load))

    @property
    def block_bytes_in_flight(self) -> float:
        """rows per block x threads with work per row x loads in flight x bytes per load."""
        return float(self.rows_per_block * self.threads_with_work_per_row * self.loads_in_flight * self.bytes_per_load)

    @property
    def first_wave_blocks(self) -> int:
        return min(self.grid_blocks, self.slots)

    @property
    def warps_per_sm(self) -> float:
        """Warps with work per SM while the first wave runs (averaged over the SMs)."""
        return self.first_wave_blocks * self.occupancy.warps_per_block / self.sms

    @property
    def bytes_in_flight(self) -> float:
        """Bytes in flight per SM while the first wave runs: blocks x threads x loads x bytes / SMs."""
        return self.first_wave_blocks * self.block_bytes_in_flight / self.sms

    @property
    def bytes_needed(self) -> float:
        """Bytes per SM that reach the plateau: plateau / SMs x L (Little's law)."""
        return self.plateau / self.sms * self.latency_s

    @property
    def bandwidth_fraction(self) -> float:
        """min(1, bytes in flight / bytes needed): the share of the plateau the first wave draws."""
        return min(1.0, self.bytes_in_flight / self.bytes_needed)

    @property
    def memory_s(self) -> float:
        """Streaming W, wave by wave: each wave takes max(its bytes / plateau, rounds x L), the
        bandwidth or the latency its loads in flight allow (Little's law: bytes / (in flight / L)
        is rounds x L). When ``unroll`` does not divide the loads per thread the last round is short
        but still waits a whole latency, so the rounds are priced one by one:
        sum over rounds of max(round bytes / plateau, L) (the same as above for equal rounds)."""
        block_bytes = self.rows_per_block * self.k * bytes_per_element(self.dtype)
        full, last = divmod(self.grid_blocks, self.slots)
        last_bytes = max(0.0, self.weight_bytes - full * self.slots * block_bytes)
        short = self.loads_per_thread - (self.rounds - 1) * self.loads_in_flight  # loads in the last round

        def wave_s(wave_bytes: float) -> float:
            if short == self.loads_in_flight:  # equal rounds
                return max(wave_bytes / self.plateau, self.rounds * self.latency_s)
            per_load = wave_bytes / self.loads_per_thread
            return ((self.rounds - 1) * max(self.loads_in_flight * per_load / self.plateau, self.latency_s)
                    + max(short * per_load / self.plateau, self.latency_s))

        return full * wave_s(self.slots * block_bytes) + (wave_s(last_bytes) if last else 0.0)

    @property
    def streaming_bandwidth(self) -> float:
        """W's bytes / the memory time: the bandwidth the loads draw, fixed cost aside."""
        return self.weight_bytes / self.memory_s

    @property
    def fma_s(self) -> float:
        """2 batch N K FLOP on the CUDA cores' FP32 FMA peak."""
        return self.flops / self.compute_peak

    @property
    def compute_s(self) -> float:
        """The slower of the FMA pipe and the shared-memory reads of x (one per multiply-add)."""
        return max(self.fma_s, self.x_read_s or 0.0)

    @property
    def time_s(self) -> float:
        """The kernel: :func:`lib.perf.step.kernel_time_s` (fixed + the slower of memory and compute)."""
        from lib.perf.step import kernel_time_s

        return kernel_time_s(self.fixed_s, self.memory_s, self.compute_s)

    @property
    def call_s(self) -> float:
        """One call among many in a CUDA graph: the kernel plus the launch gap."""
        return self.time_s + self.launch_gap_s

    @property
    def bound(self) -> str:
        """What sets the time besides the fixed cost: 'bandwidth', 'latency' (the loads in flight),
        'x reads' (shared memory) or 'FMA'."""
        if self.compute_s > self.memory_s:
            return "x reads" if (self.x_read_s or 0.0) >= self.fma_s else "FMA"
        return "latency" if self.weight_bytes / self.plateau < self.memory_s * (1 - 1e-9) else "bandwidth"


def gemv(chip: str | GPU, n: int, k: int, batch: int = 1, threads_per_row: int = 32, bytes_per_load: int = 16,
         unroll: int = 4, threads_per_block: int = GEMV_THREADS_PER_BLOCK, dtype: str = "bf16",
         latency_s: float | None = None, plateau: float | None = None) -> Gemv:
    """A decode GEMV on CUDA cores (module doc). Each block of ``threads_per_block`` threads owns
    threads_per_block / threads_per_row rows; it stages the batch's x (batch x K bf16) in shared memory,
    then its threads stream their rows with ``unroll`` independent ``bytes_per_load``-byte loads each,
    fp32 accumulators, a shuffle (and, past a warp, shared-memory) reduction. Each multiply-add reads its x value
    from shared memory as a 2-byte read, lane l at K offset (l mod threads_per_row) x bytes_per_load / (bytes of a W
    element), so a warp's read costs :func:`lib.kernels.access.shared_access` wavefronts (4 at 16-byte bf16 loads, a
    4-way bank conflict; 8 at 16-byte fp8 loads) and all
    of them take :func:`lib.kernels.access.smem_time_s` (not priced for a GPU without an SM clock in data/; at a
    small batch the compiler may merge neighbouring reads, which the count does not see). Registers: :func:`gemv_registers`;
    occupancy: :func:`lib.kernels.sm.occupancy`; plateau: W x ``decode_step.gemv_bandwidth_efficiency``;
    fixed cost and launch gap: :func:`lib.perf.step.step_assumptions`. ValueError (with what to change)
    when the launch does not fit: x over the per-block shared memory, over 255 registers."""
    import numpy as np

    from lib.kernels.access import shared_access, smem_time_s
    from lib.perf.step import step_assumptions

    lim = sm_limits(chip)
    g = gpu(chip)
    n_ = integer("n", n, 1, unit="rows of W")
    k_ = integer("k", k, 1, unit="columns of W")
    bt = integer("batch", batch, 1, 4096, unit="sequences")
    if threads_per_row not in GEMV_THREADS_PER_ROW:
        raise ValueError(f"threads_per_row must be one of {GEMV_THREADS_PER_ROW}, got {threads_per_row!r}")
    tpb = integer("threads_per_block", threads_per_block, lim.warp_size, lim.max_threads_per_block, unit="threads")
    if tpb % threads_per_row or tpb % lim.warp_size:
        raise ValueError(f"threads_per_block ({tpb}) must be a multiple of the warp size and of threads_per_row "
                         f"({threads_per_row})")
    u = integer("unroll", unroll, 1, 64, unit="independent loads per thread")
    eb = bytes_per_element(dtype)
    row_bytes = k_ * eb
    if bytes_per_load not in LOAD_WIDTHS or row_bytes % bytes_per_load:
        raise ValueError(f"bytes_per_load must be one of {LOAD_WIDTHS} and divide a row of W ({row_bytes:g} B), "
                         f"got {bytes_per_load!r}")
    regs = gemv_registers(bt, bytes_per_load)
    if regs > lim.max_registers_per_thread:
        raise ValueError(f"at batch {bt} the kernel needs about {regs} registers per thread, over the "
                         f"{lim.max_registers_per_thread} a thread may have: ptxas would spill the accumulators; "
                         f"split the batch or use a tensor-core GEMM")
    rows = tpb // threads_per_row
    warps_per_row = max(1, threads_per_row // lim.warp_size)
    smem = bt * k_ * X_BYTES + (rows * warps_per_row * bt * ACCUMULATOR_BYTES if warps_per_row > 1 else 0)
    if smem > lim.max_smem_per_block_bytes:
        raise ValueError(f"x for batch {bt} is {bt} x {k_:,} x {X_BYTES} B = {smem / 1024:,.0f} KiB of shared memory per "
                         f"block, over the {lim.max_smem_per_block_bytes // 1024} KiB a block may have on {g.key}: "
                         f"stage x in chunks of K or use a tensor-core GEMM at this batch")
    occ = occupancy(lim, tpb, regs, smem)
    if occ.blocks_per_sm == 0:
        raise ValueError(f"{tpb} threads x {regs} registers do not fit one block on a {g.key} SM")
    loads = math.ceil(row_bytes / (threads_per_row * bytes_per_load))
    in_flight = min(u, loads)
    a = step_assumptions()
    top = g.memory_bandwidth * a.gemv_efficiency if plateau is None else real("plateau", plateau, 0, low_open=True,
                                                                                    unit="bytes/s")
    # a warp reads x (bf16) at the K positions of its lanes' weight vectors: lane l at element
    # (l mod threads_per_row) x bytes_per_load / weight bytes, i.e. 2 x that many bytes into the x row
    lanes = (np.arange(lim.warp_size) % threads_per_row * int(bytes_per_load // eb) * X_BYTES).astype(np.int64)
    wavefronts = shared_access(lanes, X_BYTES if X_BYTES >= 4 else 4, chip=lim).wavefronts
    x_reads = bt * n_ * k_ / lim.warp_size * wavefronts  # one read per multiply-add, a warp's 32 per instruction
    x_s = smem_time_s(x_reads, g) if g.tensor_clock_hz is not None else None
    return Gemv(g.key, n_, k_, bt, dtype, threads_per_row, bytes_per_load, u, tpb, rows, math.ceil(n_ / rows), loads,
                in_flight, math.ceil(loads / in_flight), regs, smem, occ, g.compute_units, dram_latency_s(latency_s),
                top, g.peak_flops("fp32"), wavefronts, x_s, a.kernel_fixed_s, a.launch_gap_s)


def gemv_places(kernel: Gemv) -> dict[str, tuple[Gemv, float]]:
    """The three places a GEMV drops below the bytes it needs, each as (the kernel with that place
    fixed, this kernel's time / that kernel's time; 1.0: the place costs nothing here):

    * ``rows``: too few rows for the SMs: the same loads with the threads per row that give the
      shortest time (more threads per row cut K finer: more warps, fewer loads each);
    * ``loads``: too few bytes per thread: 16-byte loads, at least 4 in flight;
    * ``batch``: what the batch costs the same kernel (registers, shared memory for x, the FMA
      pipe): the same kernel at batch 1."""
    def same(**changes) -> Gemv:
        args = dict(n=kernel.n, k=kernel.k, batch=kernel.batch, threads_per_row=kernel.threads_per_row,
                    bytes_per_load=kernel.bytes_per_load, unroll=kernel.unroll,
                    threads_per_block=kernel.threads_per_block, dtype=kernel.dtype, latency_s=kernel.latency_s,
                    plateau=kernel.plateau)
        args.update(changes)
        return gemv(kernel.gpu, **args)

    options = [kernel] + [same(threads_per_row=t) for t in GEMV_THREADS_PER_ROW
                          if t > kernel.threads_per_row and t <= kernel.threads_per_block
                          and kernel.k * bytes_per_element(kernel.dtype) >= t * kernel.bytes_per_load]
    rows = min(options, key=lambda x: x.time_s)
    loads = same(bytes_per_load=16, unroll=max(kernel.unroll, 4)) if kernel.k * bytes_per_element(kernel.dtype) % 16 == 0 \
        else kernel
    one = same(batch=1)
    return {"rows": (rows, kernel.time_s / rows.time_s), "loads": (loads, kernel.time_s / loads.time_s),
            "batch": (one, kernel.time_s / one.time_s)}
