"""Warp memory-access arithmetic: what one warp instruction's 32 addresses cost in global memory
(32-byte sectors) and in shared memory (bank wavefronts). The one home of this arithmetic.

The granules are the GPU's (:func:`lib.kernels.sm.sm_limits`: warp size, sector, cache line, banks
and bank width; data/hardware.yaml, CUDA C++ Best Practices Guide), never literals here.

**Global memory** (:func:`warp_access`). A warp instruction sends one request to L1TEX for all its
active lanes. Lane l, active, with address a_l and access width w bytes, asks for the bytes
[a_l, a_l + w). The request costs one sector for every aligned S-byte chunk (S = 32) that any of
those bytes falls in, and touches one cache line for every aligned L-byte chunk (L = 128):

    sectors = |{ floor(b / S) : b in [a_l, a_l + w), l active }|,  lines likewise with L,
    lane l's sectors are floor(a_l / S) .. floor((a_l + w - 1) / S)  (a range straddling a
    boundary costs both),
    requested bytes = |union of the lanes' byte ranges|   (two lanes reading one byte ask for it once),
    moved bytes = sectors x S,   efficiency = requested / moved,
    ideal sectors = ceil(requested / S)   (the same bytes, packed and sector-aligned).

Inactive lanes (the mask) ask for nothing. A lane's range need not be naturally aligned here:
CUDA faults on a misaligned vector load, so an unaligned 16-byte range models bytes fetched
by narrower loads (a packed struct), and shows what a straddle costs.

**Shared memory** (:func:`shared_access`). 32 banks of 4 bytes: bank(a) = floor(a / 4) mod 32.
A bank serves one 4-byte word per wavefront (cycle); lanes reading the same word share it
(broadcast, multicast), so a phase of the warp costs

    wavefronts = max over banks of (distinct words that bank must serve),

and a warp instruction costs the sum over its phases that have an active lane. The rule for
the phases (a model, stated because NVIDIA's guide documents only the 4-byte case): one wavefront
moves at most banks x bank width = 128 bytes, so an access of w > 4 bytes per lane is processed in
groups of 128 / w consecutive lanes (8 bytes: two half-warps of 16 lanes; 16 bytes: four quarter
warps of 8), each group by the 4-byte rule over the words its lanes touch; w <= 4 is one group of
32. The minimum is one wavefront per active group (a full warp of 16-byte loads: 4); Nsight
Compute counts the wavefronts above it as bank conflicts. Sources: CUDA C++ Programming Guide,
shared memory of compute capability 5.x and later (32 banks, 32-bit words, broadcast); NVIDIA
developer forum, 'Clarification: bank_conflicts metric vs wavefronts for shared memory LDS.128'
(a conflict-free LDS.128 measures 4 wavefronts per instruction, and
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld = wavefronts - that minimum). Shared-memory
accesses must be naturally aligned (a misaligned one faults): :func:`shared_access` refuses others.

**A whole matrix** (:func:`matrix_read`): the sectors and requests to read every element of a row-major
matrix once, warps walking along its rows or down its columns, partial edge warps included.

**Time** (:func:`smem_time_s`): the shared-memory pipe of an SM moves one wavefront per clock (32 banks x
4 B = 128 B per clock), so W wavefronts spread over the SMs take W / (SMs x clock), the clock being the one
the GPU's dense peak is computed at (``tensor_clock_mhz`` in data/hardware.yaml). :func:`tiled_transpose`
counts the shared-memory instructions, wavefronts and conflicts of the classic 32 x 32-tile transpose.

**Patterns** (generators return 32 lane addresses in bytes): :func:`contiguous`, :func:`strided`,
:func:`misaligned`, :func:`matrix_walk` (a row-major matrix read along a row or down a column),
:func:`random_gather`, :func:`tile_walk` (a shared-memory tile, optionally padded). The address-delta
test :func:`access_pattern` names what a trace is (broadcast, contiguous, misaligned, strided,
gather).

Units: bytes; addresses are byte offsets >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer
from lib.kernels.sm import SMLimits, sm_limits
from lib.registry.hardware import GPU

__all__ = [
    "PATTERNS", "WIDTHS", "AccessPattern", "Granules", "MatrixRead", "SharedAccess", "WarpAccess", "access_pattern",
    "TiledTranspose", "bank_of", "contiguous", "granules", "lane_mask", "matrix_read", "matrix_walk", "smem_time_s",
    "tiled_transpose", "misaligned", "random_gather", "shared_access",
    "strided", "tile_walk", "warp_access",
]

WIDTHS = (1, 2, 4, 8, 16)
"""Access widths a lane can load in one instruction, bytes (char .. float4 / int4)."""
PATTERNS = ("idle", "broadcast", "contiguous", "misaligned", "strided", "gather")
"""What :func:`access_pattern` calls a warp's access (module doc)."""


@dataclass(frozen=True)
class Granules:
    """The memory system's units for one GPU, from its compute capability (sm_limits)."""

    gpu: str
    warp_size: int
    sector_bytes: int
    line_bytes: int
    banks: int
    bank_width_bytes: int

    @property
    def wavefront_bytes(self) -> int:
        """Bytes one shared-memory wavefront can move: banks x bank width (128)."""
        return self.banks * self.bank_width_bytes


def granules(chip: str | GPU | SMLimits = "h100-sxm") -> Granules:
    """Warp size, sector, line, banks and bank width of ``chip`` (an NVIDIA GPU of data/hardware.yaml)."""
    lim = chip if isinstance(chip, SMLimits) else sm_limits(chip)
    return Granules(lim.gpu, lim.warp_size, lim.sector_bytes, lim.cache_line_bytes, lim.smem_banks,
                    lim.bank_width_bytes)


def _g(chip) -> Granules:
    return chip if isinstance(chip, Granules) else granules(chip)


def _width(width) -> int:
    if type(width) is bool or not isinstance(width, int | np.integer) or int(width) not in WIDTHS:
        raise ValueError(f"width must be one of {', '.join(map(str, WIDTHS))} bytes per lane, got {width!r}")
    return int(width)


def _lanes(addresses, mask, g: Granules) -> tuple[np.ndarray, np.ndarray]:
    """(addresses as int64, active mask as bool), both of warp-size length, validated."""
    arr = np.asarray(addresses)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"addresses must be integer byte offsets, got an array of dtype {arr.dtype}")
    if arr.shape != (g.warp_size,):
        raise ValueError(f"addresses must hold one address per lane of the warp ({g.warp_size}), got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"addresses must be byte offsets >= 0, got {int(arr.min())}")
    if mask is None:
        active = np.ones(g.warp_size, bool)
    else:
        active = np.asarray(mask)
        if active.dtype != bool or active.shape != (g.warp_size,):
            raise ValueError(f"mask must be {g.warp_size} booleans (True: the lane is active), got "
                             f"dtype {active.dtype} and shape {active.shape}")
    return arr.astype(np.int64), active.copy()


def lane_mask(active_lanes: int, chip: str | GPU | SMLimits | Granules = "h100-sxm") -> np.ndarray:
    """The mask of a warp whose first ``active_lanes`` lanes are active (a tail warp, an ``if (i < n)``)."""
    g = _g(chip)
    n = integer("active_lanes", active_lanes, 0, g.warp_size, unit="lanes")
    return np.arange(g.warp_size) < n


# ---- global memory: sectors and lines --------------------------------------------------------------------


@dataclass(frozen=True)
class WarpAccess:
    """One warp instruction in global memory (module doc). Arrays are per lane unless named per sector."""

    gpu: str
    width: int
    addresses: np.ndarray  # (warp,) int64 byte offsets
    active: np.ndarray  # (warp,) bool
    first_sector: np.ndarray  # (warp,) each lane's first sector index (meaningless where inactive)
    last_sector: np.ndarray  # (warp,) each lane's last sector index
    sectors: np.ndarray  # sorted distinct sector indices touched
    sector_used_bytes: np.ndarray  # bytes of each touched sector some active lane asked for
    lines: np.ndarray  # sorted distinct 128-byte line indices touched
    requested_bytes: int
    sector_bytes: int
    line_bytes: int

    @property
    def active_lanes(self) -> int:
        return int(self.active.sum())

    @property
    def n_sectors(self) -> int:
        """Sectors of this request: what Nsight Compute counts per request (sectors / requests)."""
        return int(self.sectors.size)

    @property
    def n_lines(self) -> int:
        return int(self.lines.size)

    @property
    def moved_bytes(self) -> int:
        """sectors x sector bytes: what the memory system moves for this instruction."""
        return self.n_sectors * self.sector_bytes

    @property
    def efficiency(self) -> float:
        """requested / moved bytes (0..1); 0 for an instruction with no active lane."""
        return self.requested_bytes / self.moved_bytes if self.moved_bytes else 0.0

    @property
    def ideal_sectors(self) -> int:
        """ceil(requested / sector): the sectors the same bytes need when packed and aligned."""
        return -(-self.requested_bytes // self.sector_bytes)

    @property
    def excess_sectors(self) -> int:
        """Sectors above the ideal (what Nsight's uncoalesced-access rule reports, per instruction)."""
        return self.n_sectors - self.ideal_sectors

    @property
    def naturally_aligned(self) -> bool:
        """Every active lane's address is a multiple of its width (CUDA faults otherwise)."""
        return bool((self.addresses[self.active] % self.width == 0).all())


def warp_access(addresses, width: int = 4, mask=None,
                chip: str | GPU | SMLimits | Granules = "h100-sxm") -> WarpAccess:
    """Sectors, lines, requested and moved bytes of one warp instruction (module doc).

    ``addresses``: one byte offset per lane (warp-size integers >= 0); ``width``: bytes per lane
    (1, 2, 4, 8 or 16); ``mask``: warp-size booleans, True for an active lane (None: all active).
    Contiguous fp32 on 32 lanes: 4 sectors, efficiency 1; stride 2: 8 sectors, 0.5; stride 32:
    32 sectors, 0.125."""
    g = _g(chip)
    w = _width(width)
    a, active = _lanes(addresses, mask, g)
    s, line = g.sector_bytes, g.line_bytes
    first, last = a // s, (a + w - 1) // s
    live_first, live_last = first[active], last[active]
    spans = int((live_last - live_first).max()) + 1 if active.any() else 0
    touched = np.concatenate([live_first + k for k in range(spans)] or [np.zeros(0, np.int64)])
    ends = np.concatenate([live_last] * spans) if spans else touched
    sectors = np.unique(touched[touched <= ends])
    lines = np.unique(np.concatenate([a[active] // line, (a[active] + w - 1) // line])) if active.any() \
        else np.zeros(0, np.int64)
    # requested bytes: the union of the lanes' ranges [a, a + w), merged as sorted intervals
    starts = np.sort(a[active])
    used = np.zeros(sectors.size, np.int64)
    requested, cur_lo, cur_hi = 0, None, None
    merged: list[tuple[int, int]] = []
    for lo in starts.tolist():
        hi = lo + w
        if cur_hi is not None and lo <= cur_hi:
            cur_hi = max(cur_hi, hi)
            continue
        if cur_hi is not None:
            merged.append((cur_lo, cur_hi))
        cur_lo, cur_hi = lo, hi
    if cur_hi is not None:
        merged.append((cur_lo, cur_hi))
    for lo, hi in merged:
        requested += hi - lo
        for sec in range(lo // s, (hi - 1) // s + 1):  # bytes of [lo, hi) inside each sector it meets
            used[np.searchsorted(sectors, sec)] += min(hi, (sec + 1) * s) - max(lo, sec * s)
    return WarpAccess(g.gpu, w, a, active, first, last, sectors, used, lines, requested, s, line)


# ---- the address-delta test -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccessPattern:
    """What a warp's addresses are (module doc, :func:`access_pattern`)."""

    kind: str  # one of PATTERNS
    stride_bytes: int | None  # the constant lane-to-lane step, when there is one (0 for broadcast)
    base: int | None  # the virtual lane-0 address of a constant-stride access

    def __str__(self) -> str:
        if self.kind in ("strided", "contiguous", "misaligned"):
            return f"{self.kind} (stride {self.stride_bytes:,} B)"
        return self.kind


def access_pattern(addresses, width: int = 4, mask=None,
                   chip: str | GPU | SMLimits | Granules = "h100-sxm") -> AccessPattern:
    """The address-delta test on the active lanes, in lane order.

    * no active lane: ``idle``;
    * every active lane at one address (one active lane included): ``broadcast``;
    * a_l = a_f + s (l - f) for every active lane l (f: the first active lane; s an integer number
      of bytes per lane step, found from the first two active lanes, inactive lanes skipped):
      |s| = width is ``contiguous`` when the virtual full warp's lowest address (the lane-0 or
      lane-31 slot, whichever is lower) is a multiple of the sector size, else ``misaligned``;
      any other s is ``strided``;
    * anything else: ``gather``.
    """
    g = _g(chip)
    w = _width(width)
    a, active = _lanes(addresses, mask, g)
    lanes = np.flatnonzero(active)
    if lanes.size == 0:
        return AccessPattern("idle", None, None)
    addr = a[lanes]
    if (addr == addr[0]).all():
        return AccessPattern("broadcast", 0, int(addr[0]))
    step, gap = int(addr[1] - addr[0]), int(lanes[1] - lanes[0])
    if step % gap or not (addr == addr[0] + (step // gap) * (lanes - lanes[0])).all():
        return AccessPattern("gather", None, None)
    s = step // gap
    base = int(addr[0]) - s * int(lanes[0])
    if abs(s) == w:
        low = min(base, base + s * (g.warp_size - 1))
        return AccessPattern("contiguous" if low % g.sector_bytes == 0 else "misaligned", s, base)
    return AccessPattern("strided", s, base)


# ---- generators of the classic patterns (32 lane addresses, bytes) -------------------------------------------


def _lane(g: Granules) -> np.ndarray:
    return np.arange(g.warp_size, dtype=np.int64)


def contiguous(width: int = 4, base: int = 0, chip="h100-sxm") -> np.ndarray:
    """Lane l reads element l of an array at ``base``: base + l x width."""
    g = _g(chip)
    return integer("base", base, 0, unit="bytes") + _lane(g) * _width(width)


def strided(stride_elements: int, width: int = 4, base: int = 0, chip="h100-sxm") -> np.ndarray:
    """Lane l reads element l x stride: base + l x stride x width (stride 1 is contiguous)."""
    g = _g(chip)
    s = integer("stride_elements", stride_elements, 0, unit="elements")
    return integer("base", base, 0, unit="bytes") + _lane(g) * s * _width(width)


def misaligned(offset_bytes: int, width: int = 4, chip="h100-sxm") -> np.ndarray:
    """Contiguous, shifted by ``offset_bytes`` from a 128-byte line boundary (a[i + k] with k not a
    multiple of the line's elements)."""
    return contiguous(width, integer("offset_bytes", offset_bytes, 0, unit="bytes"), chip)


def matrix_walk(rows: int, cols: int, elem_bytes: int = 4, along: str = "row", row: int = 0, col: int = 0,
                chip="h100-sxm") -> tuple[np.ndarray, np.ndarray]:
    """(addresses, mask) of a warp reading a row-major rows x cols matrix from (row, col): ``along="row"``
    puts lane l on (row, col + l), consecutive bytes; ``along="column"`` puts lane l on (row + l, col),
    one row pitch (cols x elem_bytes) apart. Lanes that fall off the matrix are inactive."""
    g = _g(chip)
    r, c = integer("rows", rows, 1, unit="rows"), integer("cols", cols, 1, unit="columns")
    w = _width(elem_bytes)
    r0, c0 = integer("row", row, 0, r - 1), integer("col", col, 0, c - 1)
    lane = _lane(g)
    if along == "row":
        rr, cc = np.full_like(lane, r0), c0 + lane
    elif along == "column":
        rr, cc = r0 + lane, np.full_like(lane, c0)
    else:
        raise ValueError(f"along must be 'row' or 'column', got {along!r}")
    inside = (rr < r) & (cc < c)
    return np.where(inside, (rr * c + cc) * w, 0), inside


def random_gather(n_elements: int, width: int = 4, seed: int = 0, chip="h100-sxm") -> np.ndarray:
    """Lane l reads a uniformly random element of an n-element array (an embedding or page-table gather)."""
    g = _g(chip)
    n = integer("n_elements", n_elements, 1, unit="elements")
    rng = np.random.default_rng(integer("seed", seed, 0))
    return rng.integers(0, n, g.warp_size, dtype=np.int64) * _width(width)


def tile_walk(cols: int = 32, pad: int = 0, walk: str = "column", index: int = 0, elem_bytes: int = 4,
              rows: int | None = None, chip="h100-sxm") -> tuple[np.ndarray, np.ndarray]:
    """(addresses, mask) of a warp reading a row-major shared-memory tile of ``rows`` x ``cols`` elements
    whose rows are ``cols + pad`` elements apart (``float tile[rows][cols + pad]``).

    ``walk="column"``: lane l reads tile[l][index] (rows default to the warp size); ``walk="row"``: lane l
    reads tile[index][l], lanes past the last column inactive."""
    g = _g(chip)
    c, p = integer("cols", cols, 1, unit="columns"), integer("pad", pad, 0, unit="elements")
    r = g.warp_size if rows is None else integer("rows", rows, 1, unit="rows")
    w = _width(elem_bytes)
    lane = _lane(g)
    if walk == "column":
        i = integer("index", index, 0, c - 1)
        rr, cc, inside = lane, np.full_like(lane, i), lane < r
    elif walk == "row":
        i = integer("index", index, 0, r - 1)
        rr, cc, inside = np.full_like(lane, i), lane, lane < c
    else:
        raise ValueError(f"walk must be 'row' or 'column', got {walk!r}")
    return np.where(inside, (rr * (c + p) + cc) * w, 0), inside


# ---- a whole matrix read by warps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixRead:
    """Every element of a row-major matrix read once, by warps of consecutive lanes (:func:`matrix_read`)."""

    rows: int
    cols: int
    elem_bytes: int
    along: str
    requests: int  # warp instructions
    sectors: int  # summed over the instructions: a sector two instructions fetch counts twice (no cache)
    sector_bytes: int

    @property
    def useful_bytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes

    @property
    def moved_bytes(self) -> int:
        return self.sectors * self.sector_bytes

    @property
    def efficiency(self) -> float:
        return self.useful_bytes / self.moved_bytes

    @property
    def sectors_per_request(self) -> float:
        return self.sectors / self.requests


def matrix_read(rows: int, cols: int, elem_bytes: int = 4, along: str = "row",
                chip: str | GPU | SMLimits | Granules = "h100-sxm") -> MatrixRead:
    """Sectors and requests to read a row-major rows x cols matrix (base aligned to a sector, as
    cudaMalloc's is) once, every warp instruction covering consecutive lanes:

    * ``along="row"``: each row in ceil(cols / 32) instructions of consecutive columns; an instruction
      covering the bytes [f, f + n w) costs floor((f + n w - 1) / S) - floor(f / S) + 1 sectors, and f
      depends on the row only through (row x pitch) mod S, pitch = cols x w;
    * ``along="column"``: each column in ceil(rows / 32) instructions of consecutive rows; with a pitch of at
      least S bytes every lane has its own sector (rows x cols sectors in all), with a smaller one the lanes
      of an instruction share floor((row x pitch + col x w) / S) sectors.

    The partial warps at the edges (a row or column not a multiple of 32 long) are counted exactly."""
    g = _g(chip)
    r, c = integer("rows", rows, 1, unit="rows"), integer("cols", cols, 1, unit="columns")
    w, s, n = _width(elem_bytes), g.sector_bytes, g.warp_size
    pitch = c * w
    if along == "row":
        per_row = -(-c // n)
        k = np.arange(per_row, dtype=np.int64)
        lanes = np.minimum(n, c - n * k)
        offsets, counts = np.unique((np.arange(r, dtype=np.int64) * pitch) % s, return_counts=True)
        sectors = 0
        for off, count in zip(offsets.tolist(), counts.tolist(), strict=True):
            first = off + n * k * w
            sectors += count * int(((first + lanes * w - 1) // s - first // s + 1).sum())
        return MatrixRead(r, c, w, along, r * per_row, sectors, s)
    if along == "column":
        per_col = -(-r // n)
        if pitch >= s:
            return MatrixRead(r, c, w, along, c * per_col, r * c, s)
        row = np.arange(r, dtype=np.int64)
        sectors = 0
        for col in range(c):
            ids = (row * pitch + col * w) // s
            same_block = (row[1:] // n) == (row[:-1] // n)
            sectors += per_col + int(((ids[1:] != ids[:-1]) & same_block).sum())
        return MatrixRead(r, c, w, along, c * per_col, sectors, s)
    raise ValueError(f"along must be 'row' or 'column', got {along!r}")


# ---- shared memory: banks and wavefronts --------------------------------------------------------------------


def bank_of(address, chip="h100-sxm"):
    """floor(address / bank width) mod banks (an int for an int, an array for an array)."""
    g = _g(chip)
    a = np.asarray(address)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer) or (a.size and a.min() < 0):
        raise ValueError(f"address must be integer byte offsets >= 0, got {address!r}")
    b = (a // g.bank_width_bytes) % g.banks
    return int(b) if b.ndim == 0 else b


@dataclass(frozen=True)
class SharedAccess:
    """One warp instruction in shared memory (module doc)."""

    gpu: str
    width: int
    addresses: np.ndarray  # (warp,)
    active: np.ndarray  # (warp,)
    banks: np.ndarray  # (warp,) bank of each lane's first word (-1 where inactive)
    lanes_per_phase: int
    bank_words: np.ndarray  # (phases, banks): distinct words each bank serves in each phase
    wavefronts: int
    ideal_wavefronts: int  # one per phase with an active lane

    @property
    def conflicts(self) -> int:
        """Wavefronts above the minimum: Nsight's l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld per instruction."""
        return self.wavefronts - self.ideal_wavefronts

    @property
    def way(self) -> int:
        """The worst bank's distinct words in one phase (a 32-way conflict: 32)."""
        return int(self.bank_words.max()) if self.bank_words.size else 0

    @property
    def phases(self) -> int:
        return int(self.bank_words.shape[0])


def shared_access(addresses, width: int = 4, mask=None,
                  chip: str | GPU | SMLimits | Granules = "h100-sxm") -> SharedAccess:
    """Banks and wavefronts of one warp instruction in shared memory (module doc): each group of
    128 / max(width, 4) consecutive lanes costs the most distinct 4-byte words any bank serves in it.

    A column walk down ``float tile[32][32]``: 32 wavefronts (32-way); ``tile[32][33]``: 1."""
    g = _g(chip)
    w = _width(width)
    a, active = _lanes(addresses, mask, g)
    bad = active & (a % w != 0)
    if bad.any():
        lane = int(np.flatnonzero(bad)[0])
        raise ValueError(f"shared-memory accesses must be naturally aligned (address a multiple of the {w}-byte "
                         f"width; CUDA faults otherwise): lane {lane} reads address {int(a[lane])}")
    per_phase = min(g.warp_size, max(1, g.wavefront_bytes // max(w, g.bank_width_bytes)))
    phases = -(-g.warp_size // per_phase)
    words_per_lane = max(1, w // g.bank_width_bytes)
    first_word = a // g.bank_width_bytes
    bank_words = np.zeros((phases, g.banks), np.int64)
    wavefronts = ideal = 0
    for p in range(phases):
        lanes = np.arange(p * per_phase, min(g.warp_size, (p + 1) * per_phase))
        lanes = lanes[active[lanes]]
        if lanes.size == 0:
            continue
        words = np.unique((first_word[lanes][:, None] + np.arange(words_per_lane)).ravel())
        bank_words[p] = np.bincount(words % g.banks, minlength=g.banks)
        wavefronts += int(bank_words[p].max())
        ideal += 1
    banks = np.where(active, first_word % g.banks, -1)
    return SharedAccess(g.gpu, w, a, active, banks, per_phase, bank_words, wavefronts, ideal)


def smem_time_s(wavefronts: float, chip: str | GPU = "h100-sxm") -> float:
    """wavefronts / (SMs x clock), seconds: every SM's shared memory serves one wavefront per clock (module
    doc); ValueError for a GPU whose clock data/hardware.yaml lacks."""
    from lib.inputs import real
    from lib.registry.hardware import gpu

    g = gpu(chip)
    w = real("wavefronts", wavefronts, 0)
    if g.tensor_clock_hz is None or g.compute_capability is None:
        raise ValueError(f"{g.key}: data/hardware.yaml has no SM clock (tensor_clock_mhz) for it; choose one of "
                         + ", ".join(k for k in _gpu_names() if gpu(k).tensor_clock_hz is not None))
    return w / (g.compute_units * g.tensor_clock_hz)


def _gpu_names() -> list[str]:
    from lib.registry.hardware import gpu_names

    return gpu_names()


@dataclass(frozen=True)
class TiledTranspose:
    """An n x n row-major matrix transposed through ``tile[32][32 + pad]`` in shared memory, one warp per tile
    row (:func:`tiled_transpose`). ``store``: a warp writing a tile row (lane l -> tile[r][l]); ``load``: a warp
    reading a tile column (lane l -> tile[l][r]), both at r = 0 (every r costs the same)."""

    n: int
    pad: int
    elem_bytes: int
    tile: int
    tiles: int
    store: SharedAccess
    load: SharedAccess

    @property
    def instructions(self) -> int:
        """Shared-memory store instructions (and as many loads): one per tile row per tile."""
        return self.tiles * self.tile

    @property
    def store_wavefronts(self) -> int:
        return self.instructions * self.store.wavefronts

    @property
    def load_wavefronts(self) -> int:
        return self.instructions * self.load.wavefronts

    @property
    def load_conflicts(self) -> int:
        """Nsight's l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum for the kernel."""
        return self.instructions * self.load.conflicts

    @property
    def store_conflicts(self) -> int:
        return self.instructions * self.store.conflicts

    @property
    def hbm_bytes(self) -> int:
        """Read the matrix once and write it once, both coalesced: 2 n^2 w."""
        return 2 * self.n * self.n * self.elem_bytes

    @property
    def tile_bytes(self) -> int:
        return self.tile * (self.tile + self.pad) * self.elem_bytes


def tiled_transpose(n: int, pad: int = 1, elem_bytes: int = 4,
                    chip: str | GPU | SMLimits | Granules = "h100-sxm") -> TiledTranspose:
    """The shared-memory side of the classic tiled transpose (NVIDIA's 'An Efficient Matrix Transpose in CUDA
    C/C++'): each warp-size square tile is written row by row (coalesced global reads) and read column by
    column (coalesced global writes). n must be a multiple of the warp size."""
    g = _g(chip)
    t = g.warp_size
    side = integer("n", n, t, unit="elements")
    if side % t:
        raise ValueError(f"n must be a multiple of the tile side {t}, got {side:,}")
    p = integer("pad", pad, 0, unit="elements")
    w = _width(elem_bytes)
    store_a, store_m = tile_walk(t, p, "row", 0, w, chip=g)
    load_a, load_m = tile_walk(t, p, "column", 0, w, chip=g)
    store, load = shared_access(store_a, w, store_m, g), shared_access(load_a, w, load_m, g)
    return TiledTranspose(side, p, w, t, (side // t) ** 2, store, load)
