"""Wave quantization of a tiled GEMM, and the three ways to win the partial wave back.

A GEMM C[M, N] = A[M, K] B[K, N] is cut into output tiles of tile_m x tile_n; each tile is one
CTA that runs the whole K loop. A persistent Hopper or Blackwell GEMM runs one CTA per SM (its
pipeline stages fill the shared memory) and loops over tiles, so ``slots = SMs`` tiles run at once:

    tiles = ceil(M / tile_m) x ceil(N / tile_n),     waves = ceil(tiles / slots)

(:func:`lib.kernels.sm.waves`). Two CTAs sharing an SM would not shrink the quantum: they split its
tensor cores, so the SM's share of the work is still whole tiles. A tile takes
t_tile = 2 tile_m tile_n K / (P / SMs x eta) with
P the dense peak and eta the GEMM efficiency of that tile shape (``decode_step.matmul_flops_efficiency``
x ``kernels_gemm.tile_efficiency.<shape>``); padding rows and columns of edge tiles are computed
too. The GEMM takes max(waves x t_tile, bytes / W): the ideal, max(F / (P eta), bytes / W), is
the roofline at the same efficiency (:func:`lib.perf.roofline.roofline_time`), so the difference
is what the quantization wastes.

The fixes priced here:

* a tile shape (:func:`tile_shapes`): smaller tiles make more, fuller waves but run at a lower
  efficiency;
* split-K of the leftover tiles (:func:`split_leftover`): the full waves run as before; each of
  the L tiles of the partial wave is cut into s pieces along K that run on the idle SMs
  (s <= slots / L), then the owner of each tile adds the s - 1 fp32 partial tiles the others
  wrote: t = full x t_tile + t_tile / s + write + (s - 1) (read + add) + a hand-off latency, the
  partial tiles moving through L2 at one SM's share of its bandwidth (:func:`lib.kernels.l2.l2_read_bandwidth`
  / SMs) and the hand-off
  costing two memory latencies (``kernels_gemm.dram_latency_ns``: publish, observe). The best s
  balances t_tile / s against (s - 1) reads: about sqrt(t_tile / t_read). Stream-K generalizes it
  (every SM gets an equal share of all K iterations);
* the scheduler (:func:`token_budget`): a prefill batch of M tokens with M a multiple of tile_m
  whose tile rows fill whole waves, floor(w x slots / cols) x tile_m tokens.

:func:`simulate_tile_queue` is the brute-force oracle: SMs taking tiles from a queue.
SI units: seconds, FLOP, bytes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.kernels.l2 import l2_share_per_sm
from lib.kernels.latency_hiding import dram_latency_s
from lib.kernels.sm import wave_efficiency, waves
from lib.perf.decode_kernels import gemm_shapes
from lib.perf.roofline import gemm_flops_bytes, roofline_time
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu

__all__ = ["TILE_SHAPES", "PROJECTIONS", "parse_tile", "tile_efficiency", "projection_nk", "WaveGemm", "gemm_waves",
           "tile_shapes", "SplitLeftover", "split_leftover", "token_budget", "layer_waves", "time_vs_tokens",
           "simulate_tile_queue", "PARTIAL_BYTES_PER_ELEMENT"]

TILE_SHAPES = ("256x128", "128x256", "128x128", "128x64", "64x128", "64x64")
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
LAYER_PROJECTIONS = PROJECTIONS[:4]  # once per layer; the LM head runs once per pass
PARTIAL_BYTES_PER_ELEMENT = 4  # split-K partial sums are fp32


def parse_tile(tile: str) -> tuple[int, int]:
    """(tile_m, tile_n) of a tile shape such as ``"128x128"`` (one of :data:`TILE_SHAPES`)."""
    if tile not in TILE_SHAPES:
        raise ValueError(f"tile must be one of {', '.join(TILE_SHAPES)} (tile_m x tile_n), got {tile!r}")
    m, n = tile.split("x")
    return int(m), int(n)


def tile_efficiency(tile: str, matmul_efficiency: float | None = None) -> float:
    """Fraction of the dense peak a GEMM built of ``tile`` tiles sustains: the large-GEMM efficiency
    (``decode_step.matmul_flops_efficiency``, or ``matmul_efficiency``) x the tile's relative
    efficiency (``kernels_gemm.tile_efficiency.<tile>``)."""
    parse_tile(tile)
    if matmul_efficiency is None:
        from lib.perf.step import step_assumptions

        matmul_efficiency = step_assumptions().matmul_efficiency
    eff = real("matmul_efficiency", matmul_efficiency, 0, 1, low_open=True)
    return eff * float(assumptions.value(f"kernels_gemm.tile_efficiency.{tile}"))


def projection_nk(mdl: str, projection: str, tp: int = 1) -> tuple[int, int]:
    """(N, K) of one weight GEMM of ``mdl`` on one GPU of a ``tp``-way group, from
    :func:`lib.perf.decode_kernels.gemm_shapes` (Llama 3.1 70B at TP 4, QKV: N = 2,560, K = 8,192)."""
    if projection not in PROJECTIONS:
        raise ValueError(f"projection must be one of {', '.join(PROJECTIONS)}, got {projection!r}")
    k, n, _ = gemm_shapes(mdl, tp)[projection]
    if k != int(k) or n != int(n):
        raise ValueError(f"{mdl} at tp={tp}: the {projection} shard is not whole ({k} x {n})")
    return int(n), int(k)


@dataclass(frozen=True)
class WaveGemm:
    """One tiled GEMM on one GPU (module doc). Times in seconds."""

    m: int
    n: int
    k: int
    tile: str
    gpu: str
    dtype: str
    rows: int  # tile rows: ceil(M / tile_m)
    cols: int  # tile columns: ceil(N / tile_n)
    slots: int  # tiles that run at once: one per SM
    efficiency: float  # fraction of the dense peak this tile shape sustains
    tile_s: float  # one tile's K loop on its share of an SM
    flops: float
    bytes: float
    memory_s: float  # bytes / datasheet bandwidth
    ideal_compute_s: float  # F / (P x efficiency)

    @property
    def tile_m(self) -> int:
        return parse_tile(self.tile)[0]

    @property
    def tile_n(self) -> int:
        return parse_tile(self.tile)[1]

    @property
    def tiles(self) -> int:
        return self.rows * self.cols

    @property
    def waves(self) -> int:
        return waves(self.tiles, self.slots)

    @property
    def wave_efficiency(self) -> float:
        """Tiles / (waves x slots): the share of the launched tile slots that hold a tile."""
        return wave_efficiency(self.tiles, self.slots)

    @property
    def last_wave_tiles(self) -> int:
        return self.tiles - (self.waves - 1) * self.slots

    @property
    def compute_s(self) -> float:
        """waves x t_tile: every wave lasts one tile, however few tiles it holds."""
        return self.waves * self.tile_s

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def ideal_s(self) -> float:
        """The roofline at this efficiency: max(F / (P eta), bytes / W)."""
        return max(self.ideal_compute_s, self.memory_s)

    @property
    def waste_s(self) -> float:
        return self.time_s - self.ideal_s

    @property
    def bound(self) -> str:
        """'compute' when the waves set the time, 'memory' when the bytes do."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def padding_fraction(self) -> float:
        """Share of the tiles' FLOPs spent on padding rows and columns (tile quantization)."""
        return 1.0 - (self.m * self.n) / (self.rows * self.tile_m * self.cols * self.tile_n)


def gemm_waves(m: int, n: int, k: int, chip: str | GPU, tile: str = "128x128", dtype: str = "bf16",
               matmul_efficiency: float | None = None) -> WaveGemm:
    """Tiles, waves and wave-quantized time of C[m, n] = A[m, k] B[k, n] (module doc).

    Llama 3.1 70B QKV at TP 4 (n = 2,560, k = 8,192), m = 896, 128 x 128 on an H100 SXM: 7 x 20 =
    140 tiles on 132 SMs, 2 waves, the second holding 8 tiles."""
    g = gpu(chip)
    m, n, k = (integer(name, v, 1, 10**7) for name, v in (("m", m), ("n", n), ("k", k)))
    tm, tn = parse_tile(tile)
    slots = g.compute_units
    eff = tile_efficiency(tile, matmul_efficiency)
    flops, nbytes = gemm_flops_bytes(m, n, k, dtype)
    roof = roofline_time(flops, nbytes, g, dtype)
    tile_s = 2.0 * tm * tn * k / (g.peak_flops(dtype) / slots * eff)
    return WaveGemm(m, n, k, tile, g.key, dtype, -(-m // tm), -(-n // tn), slots, eff, tile_s, flops, nbytes,
                    roof.memory_s, roof.compute_s / eff)


def tile_shapes(m: int, n: int, k: int, chip: str | GPU, dtype: str = "bf16",
                matmul_efficiency: float | None = None) -> dict[str, WaveGemm]:
    """:func:`gemm_waves` for every tile shape of :data:`TILE_SHAPES`."""
    return {t: gemm_waves(m, n, k, chip, t, dtype, matmul_efficiency) for t in TILE_SHAPES}


@dataclass(frozen=True)
class SplitLeftover:
    """The full waves data-parallel, the leftover tiles split s ways along K (module doc)."""

    base: WaveGemm
    splits: int
    max_splits: int
    partial_bytes: float  # one fp32 partial tile
    write_s: float  # each extra piece writes its partial tile (in parallel)
    read_add_s: float  # the owner reads and adds one partial tile
    handoff_s: float  # publish the partials, observe them: two memory latencies

    @property
    def full_waves(self) -> int:
        return self.base.tiles // self.base.slots

    @property
    def leftover_tiles(self) -> int:
        return self.base.tiles - self.full_waves * self.base.slots

    @property
    def piece_s(self) -> float:
        return self.base.tile_s / self.splits

    @property
    def fixup_s(self) -> float:
        """0 without a split; else write + (s - 1) x (read + add) + hand-off."""
        if self.splits == 1:
            return 0.0
        return self.write_s + (self.splits - 1) * self.read_add_s + self.handoff_s

    @property
    def compute_s(self) -> float:
        if self.leftover_tiles == 0:
            return self.base.compute_s
        return self.full_waves * self.base.tile_s + self.piece_s + self.fixup_s

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.base.memory_s)

    @property
    def saved_s(self) -> float:
        return self.base.time_s - self.time_s


def split_leftover(m: int, n: int, k: int, chip: str | GPU, tile: str = "128x128", dtype: str = "bf16",
                   splits: int | None = None, matmul_efficiency: float | None = None,
                   l2_bandwidth_per_sm: float | None = None, latency_s: float | None = None,
                   k_step: int = 64) -> SplitLeftover:
    """Split-K of the partial wave's tiles over the idle SMs (module doc). ``splits=None`` picks the s
    in 1..max_splits with the shortest time; max_splits = min(slots // leftover, K / k_step) (each piece
    keeps at least one ``k_step``-deep iteration)."""
    g = gpu(chip)
    base = gemm_waves(m, n, k, g, tile, dtype, matmul_efficiency)
    full = base.tiles // base.slots
    left = base.tiles - full * base.slots
    max_s = max(1, min(base.slots // left if left else 1, k // integer("k_step", k_step, 1)))
    bw = (l2_share_per_sm(g) if l2_bandwidth_per_sm is None
          else real("l2_bandwidth_per_sm", l2_bandwidth_per_sm, 0, low_open=True, unit="bytes/s"))
    partial = float(base.tile_m * base.tile_n * PARTIAL_BYTES_PER_ELEMENT)
    add_s = base.tile_m * base.tile_n / (g.peak_flops("fp32") / base.slots)  # one fp32 add per element
    handoff = 2.0 * dram_latency_s(latency_s)

    def make(s: int) -> SplitLeftover:
        return SplitLeftover(base, s, max_s, partial, partial / bw, partial / bw + add_s, handoff)

    if splits is not None:
        return make(integer("splits", splits, 1, max_s, unit=f"pieces per leftover tile ({left} leftover tiles)"))
    return min((make(s) for s in range(1, max_s + 1)), key=lambda r: (r.time_s, r.splits))


def token_budget(n: int, chip: str | GPU, tile: str = "128x128", waves_: int = 1) -> int:
    """The most tokens M (a multiple of tile_m) whose ceil(M / tile_m) x ceil(N / tile_n) tiles fit
    in ``waves_`` waves: floor(waves x slots / cols) x tile_m; 0 when one row of tiles is already
    more than that many waves."""
    g = gpu(chip)
    tm, tn = parse_tile(tile)
    cols = -(-integer("n", n, 1) // tn)
    w = integer("waves", waves_, 1)
    return (w * g.compute_units // cols) * tm


def layer_waves(mdl: str, chip: str | GPU, tp: int, tokens: int, tile: str = "128x128",
                dtype: str = "bf16") -> dict[str, WaveGemm]:
    """:func:`gemm_waves` for each weight GEMM of one layer (QKV, O, gate/up, down) at M = ``tokens``."""
    return {p: gemm_waves(tokens, *projection_nk(mdl, p, tp), chip, tile, dtype)
            for p in LAYER_PROJECTIONS}


def time_vs_tokens(n: int, k: int, chip: str | GPU, tile: str, dtype: str,
                   tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(wave-quantized time, ideal time) in seconds for every M in ``tokens``: :func:`gemm_waves`
    vectorized (the saw-tooth figure)."""
    g = gpu(chip)
    ref = gemm_waves(1, n, k, g, tile, dtype)
    ms = np.asarray(tokens, dtype=np.int64)
    if ms.ndim != 1 or ms.size == 0 or ms.min() < 1:
        raise ValueError("tokens must be a non-empty 1-D array of positive integers")
    tiles = -(-ms // ref.tile_m) * ref.cols
    wave_count = -(-tiles // ref.slots)
    b = gemm_flops_bytes(1, 1, 1, dtype)[1] / 3  # bytes per element
    memory = b * (ms * k + k * n + ms * n) / g.memory_bandwidth
    ideal = np.maximum(2.0 * ms * n * k / (g.peak_flops(dtype) * ref.efficiency), memory)
    return np.maximum(wave_count * ref.tile_s, memory), ideal


def simulate_tile_queue(durations, slots: int) -> tuple[float, float]:
    """Brute force: ``slots`` SMs take tiles from a queue in order, each as soon as it is free;
    returns (makespan, idle slot-seconds before the makespan). Durations in seconds."""
    s = integer("slots", slots, 1)
    free = [0.0] * s
    busy = 0.0
    for d in durations:
        d = real("duration", d, 0)
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
        busy += d
    makespan = max(free)
    return makespan, s * makespan - busy

