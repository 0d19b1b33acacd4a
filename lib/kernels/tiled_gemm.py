"""A reference tiled GEMM in numpy that runs the way a GPU kernel does, with switchable defects (N009).

``C[M, N] = A[M, K] B[K, N]``: the grid has one CTA per output tile of ``tile_m x tile_n``
(``ceil(M / tile_m) x ceil(N / tile_n)`` of them); each CTA walks the K dimension in
``n_k = ceil(K / tile_k)`` K tiles, loads one tile of A and one of B (masked: an element past the
matrix reads 0), multiplies them on the tensor cores and adds the product into its accumulator;
after the last K tile it rounds the accumulator to the storage dtype once and stores it.

Numerics, stated so each one can be checked:

* inputs and output are held in a storage dtype (``bf16`` or ``fp16``; numpy float32 arrays
  holding values of that dtype, :func:`lib.attention.naive.round_to_dtype`);
* the MMA of one K tile is computed exactly (float64) and rounded once to fp32: a model of a
  tensor core, whose internal sums are at least fp32;
* the accumulator is fp32 (``acc = fp32(acc + P)``); the store rounds it to the storage dtype.

Every tile of every CTA computes the same thing as one big vectorized step, so the emulation is
a loop over K tiles only, and every output is deterministic for a given ``run``.

The defects (:data:`DEFECTS`), each invisible when the whole problem fits in one tile:

* ``k_offset`` (indexing): B's pointer advances along the wrong axis between K tiles
  (``b_ptrs += BLOCK_K * stride_bn`` instead of ``stride_bk``): K tile ``kt >= 1`` reads
  ``B_flat[r N + n + kt tile_k]`` (row r of the tile, column n) instead of ``B[kt tile_k + r, n]``,
  the loads still masked by the correct K and N bounds (a read past B's allocation gives 0);
* ``k_tail`` (indexing): the K loop runs ``K // tile_k`` times, dropping the partial last tile;
* ``grid_map`` (indexing): the program id is split with the wrong tile count,
  ``(pid // grid_m, pid % grid_m)`` instead of ``(pid // grid_n, pid % grid_n)``: on a
  non-square tile grid some output tiles are computed twice and others never written (the output
  buffer keeps its initial zeros);
* ``low_precision_acc`` (precision): the accumulator is kept in the storage dtype,
  ``acc = dtype(fp32(acc + P))`` after every K tile, instead of fp32;
* ``missing_barrier`` (race): no barrier between the compute on K tile ``kt`` and the load of
  tile ``kt + 1`` into the same shared-memory buffer. Each CTA has ``warps`` warps; warp w computes
  rows ``w tile_m / warps ...`` of the output tile and loads rows ``w tile_k / warps ...`` of the B
  tile. At each K tile that has a successor, each warp is late with probability
  ``late_fraction`` (a seeded draw per ``run``); a late warp computes with the B tile whose rows
  owned by the early warps already hold tile ``kt + 1``;
* ``split_k_order`` (race): K is split across ``split_k`` CTAs per output tile (contiguous runs
  of K tiles, fp32 partial sums), and each adds its partial into the storage-dtype output with an
  atomic add (``out = dtype(out + partial)``) in the order the CTAs finish, drawn per ``run``.

:func:`tolerance` derives the per-element bound a correct kernel meets against a float64
oracle; :func:`run_design` is the test that catches every defect, and :func:`ablation` shows what
each of its ingredients catches. SI and plain counts throughout; errors are in the output's units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from lib.attention.naive import round_to_dtype
from lib.inputs import fraction, integer

__all__ = [
    "DEFECTS", "CANDIDATE", "DEFECT_TITLES", "STORAGE_DTYPES", "TileConfig", "GemmKernel", "make_kernel",
    "tiled_gemm", "TileSweep", "sweep_k_tiles", "sweep_many", "SIGNATURES", "signature", "unit_roundoff", "random_inputs", "oracle", "tolerance", "relative_error", "error_ratio",
    "ErrorPattern", "error_pattern", "warp_blocks", "TORCH_ASSERT_CLOSE_DEFAULTS", "passes_assert_close_defaults", "split_k_fp32_flips",
    "TestDesign", "TestVerdict", "run_matrix", "design_for", "run_design", "ablation", "ABLATIONS",
    "accumulator_error_ratio", "accumulator_ratio_closed_form", "race_clean_probability", "grid_map_unwritten",
]

STORAGE_DTYPES = ("bf16", "fp16")
DEFECTS = ("k_offset", "k_tail", "grid_map", "low_precision_acc", "missing_barrier", "split_k_order")
CANDIDATE = {"k_offset": "indexing", "k_tail": "indexing", "grid_map": "indexing",
             "low_precision_acc": "precision", "missing_barrier": "race", "split_k_order": "race"}
DEFECT_TITLES = {
    "k_offset": "B's K-tile offset advanced with the wrong stride",
    "k_tail": "partial last K tile dropped (K // tile_k iterations)",
    "grid_map": "program id split with the wrong tile count",
    "low_precision_acc": "accumulator kept in the storage dtype",
    "missing_barrier": "no barrier before the next tile's load",
    "split_k_order": "split-K partials added atomically in arrival order",
}
_UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
_SUBNORMAL_HALF = {"bf16": 2.0**-134, "fp16": 2.0**-25, "fp32": 2.0**-150}  # half the smallest subnormal
_RACE_STREAM = 0x7ACE  # the seed stream of a run's timing (which warps are late, which CTA adds first)


def unit_roundoff(dtype: str) -> float:
    """u = 2^-p for a dtype with p significand bits (round to nearest: |fl(x) - x| <= u |x|):
    bf16 2^-8, fp16 2^-11, fp32 2^-24."""
    if dtype not in _UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {', '.join(_UNIT_ROUNDOFF)}, got {dtype!r}")
    return _UNIT_ROUNDOFF[dtype]


def _dtype(dtype: str) -> str:
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype (the storage dtype) must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    return dtype


@dataclass(frozen=True)
class TileConfig:
    """The kernel's launch shape: output tile ``tile_m x tile_n``, K tile ``tile_k``, ``warps`` per
    CTA (each owns tile_m / warps output rows and tile_k / warps rows of the B tile it loads), the
    probability ``late_fraction`` that a warp is still computing when the others load the next tile
    (``missing_barrier``), and the ``split_k`` CTAs per output tile (``split_k_order``)."""

    tile_m: int = 64
    tile_n: int = 32
    tile_k: int = 32
    warps: int = 4
    late_fraction: float = 1 / 64
    split_k: int = 4

    def __post_init__(self) -> None:
        for name in ("tile_m", "tile_n", "tile_k"):
            integer(name, getattr(self, name), 1, 1024)
        integer("warps", self.warps, 1, 32)
        if self.tile_m % self.warps or self.tile_k % self.warps:
            raise ValueError(f"warps must divide tile_m and tile_k (each warp owns whole rows), got warps "
                             f"{self.warps} for tile_m {self.tile_m}, tile_k {self.tile_k}")
        fraction("late_fraction", self.late_fraction)
        integer("split_k", self.split_k, 1, 64)

    def grid(self, m: int, n: int) -> tuple[int, int]:
        """(grid_m, grid_n) = (ceil(M / tile_m), ceil(N / tile_n)) output tiles."""
        return -(-m // self.tile_m), -(-n // self.tile_n)

    def k_tiles(self, k: int) -> int:
        """n_k = ceil(K / tile_k)."""
        return -(-k // self.tile_k)


def _check_inputs(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a (M, K) and b (K, N) must be 2-D with matching K, got {a.shape} and {b.shape}")
    if min(a.shape + b.shape) < 1:
        raise ValueError(f"every dimension must be >= 1, got a {a.shape}, b {b.shape}")
    for name, x in (("a", a), ("b", b)):
        if not np.issubdtype(x.dtype, np.floating) or not np.isfinite(x).all():
            raise ValueError(f"{name} must be a finite floating-point array")
    return a, b


@dataclass(frozen=True)
class _Prepared:
    """Rounded, zero-padded operands as K tiles (A: (n_k, M', tile_k), B: (n_k, tile_k, N')) and their
    products P[kt] = A_kt B_kt (float64, (n_k, M', N')): what every CTA's MMAs compute."""

    a3: np.ndarray
    b3: np.ndarray
    prods: np.ndarray
    gm: int
    gn: int


_PREPARED: list = []  # the last few (a copy, b copy, key, _Prepared): launches of one problem share the products
_PREPARED_KEEP = 8


def _prepare(a, b, dtype: str, config: TileConfig, defect: str | None) -> _Prepared:
    """:class:`_Prepared` for these inputs, memoized on their values (a launch of another kernel, or
    another launch, on the same problem reuses the products: they do not depend on either)."""
    key = (dtype, config.tile_m, config.tile_n, config.tile_k, defect == "k_offset")
    for a_seen, b_seen, key_seen, prep in _PREPARED:
        if (key_seen == key and a_seen.shape == a.shape and b_seen.shape == b.shape
                and np.array_equal(a_seen, a) and np.array_equal(b_seen, b)):
            return prep
    prep = _prepare_new(a, b, dtype, config, defect)
    _PREPARED.insert(0, (np.array(a), np.array(b), key, prep))
    del _PREPARED[_PREPARED_KEEP:]
    return prep


def _prepare_new(a, b, dtype: str, config: TileConfig, defect: str | None) -> _Prepared:
    m, k = a.shape
    n = b.shape[1]
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    gm, gn = config.grid(m, n)
    nk = config.k_tiles(k)
    a64 = round_to_dtype(a.astype(np.float32), dtype).astype(np.float64)
    b64 = round_to_dtype(b.astype(np.float32), dtype).astype(np.float64)
    ap = np.zeros((gm * tm, nk * tk))
    ap[:m, :k] = a64
    b3 = np.zeros((nk * tk, gn * tn))
    b3[:k, :n] = b64
    b3 = b3.reshape(nk, tk, gn * tn)
    if defect == "k_offset":
        for kt in range(1, nk):
            b3[kt] = _k_offset_tile(b64, kt, tk, gn * tn)
    a3 = np.ascontiguousarray(ap.reshape(gm * tm, nk, tk).transpose(1, 0, 2))
    return _Prepared(a3, b3, np.matmul(a3, b3), gm, gn)


def _outputs(prep: _Prepared, dtype: str, config: TileConfig, defect: str | None, run: int,
             record: Sequence[int]) -> dict[int, np.ndarray]:
    """{n: C stored after n K tiles} for each n in ``record`` (1 <= n <= n_k), the whole padded grid:
    for K = n tile_k and the prefix inputs A[:, :K], B[:K] this is exactly what the kernel stores
    (a race draws the same timing for the first K tiles, and a problem's last K tile has no successor)."""
    prods, gm, gn = prep.prods, prep.gm, prep.gn
    nk = prods.shape[0]
    want = sorted(set(record))
    out: dict[int, np.ndarray] = {}
    if defect == "split_k_order":
        p32 = prods.astype(np.float32)
        for n_steps in want:
            out[n_steps] = _split_k(p32[:n_steps], dtype, config, gm, gn,
                                    np.random.default_rng([run, _RACE_STREAM, n_steps]))
    else:
        rng = np.random.default_rng([run, _RACE_STREAM])
        low = defect == "low_precision_acc"
        acc = np.zeros(prods.shape[1:], np.float32)
        for kt in range(max(want)):
            p = prods[kt]
            if kt + 1 in want:  # the last K tile of a recorded problem: no successor to race with
                last = acc + p.astype(np.float32)
                out[kt + 1] = round_to_dtype(round_to_dtype(last, dtype) if low else last, dtype)
            if defect == "missing_barrier" and kt + 1 < nk:
                p = p + _race_delta(prep.a3[kt], prep.b3[kt], prep.b3[kt + 1], config, gm, gn, rng)
            acc = acc + p.astype(np.float32)
            if low:
                acc = round_to_dtype(acc, dtype)
    if defect == "grid_map":
        mask = np.repeat(np.repeat(_written_tiles(gm, gn), config.tile_m, axis=0), config.tile_n, axis=1)
        out = {key: c * mask for key, c in out.items()}
    return out


def _written_tiles(gm: int, gn: int) -> np.ndarray:
    """(gm, gn) booleans: the tiles the ``grid_map`` draft writes, pid by pid as its grid runs."""
    written = np.zeros((gm, gn), bool)
    for pid in range(gm * gn):
        pm, pn = pid // gm, pid % gm
        if pm < gm and pn < gn:
            written[pm, pn] = True
    return written


def tiled_gemm(a, b, dtype: str = "bf16", *, config: TileConfig = TileConfig(), defect: str | None = None,
               run: int = 0) -> np.ndarray:
    """C = A B as the tiled kernel computes it (module docstring), with one ``defect`` or none.

    ``a`` (M, K) and ``b`` (K, N) are rounded to the storage ``dtype`` (as the kernel reads them);
    ``run`` numbers the launch: it seeds the timing a race depends on (the correct kernel and the
    deterministic defects ignore it). Returns float32 (M, N) holding values of ``dtype``.
    """
    dtype = _dtype(dtype)
    defect = _defect(defect)
    run = integer("run", run, 0)
    a, b = _check_inputs(a, b)
    m, k = a.shape
    steps = k // config.tile_k if defect == "k_tail" else config.k_tiles(k)
    if steps == 0:  # the k_tail draft with K < tile_k: the loop never runs, the store writes zeros
        return np.zeros((m, b.shape[1]), np.float32)
    c = _outputs(_prepare(a, b, dtype, config, defect), dtype, config, defect, run, [steps])[steps]
    return np.ascontiguousarray(c[:m, :b.shape[1]], dtype=np.float32)


def _defect(defect: str | None) -> str | None:
    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"defect must be None or one of {', '.join(DEFECTS)}, got {defect!r}")
    return defect


@dataclass(frozen=True)
class TileSweep:
    """Relative error ||C - C*||_F / ||C*||_F against the number of K tiles (K = n tile_k)."""

    defect: str | None
    k_tiles: tuple[int, ...]
    correct: np.ndarray  # (len(k_tiles),): the correct kernel
    errors: np.ndarray  # (runs, len(k_tiles)): the defective kernel, launch by launch

    def spread(self) -> np.ndarray:
        """max / min over the launches at each tile count (1: deterministic)."""
        return self.errors.max(axis=0) / self.errors.min(axis=0)

    def growth_exponent(self, from_tiles: int = 4) -> float:
        """Least-squares slope of log(median error) on log(n) over the tile counts >= ``from_tiles``:
        about 0.5 for an error that grows like sqrt(n), 0 for one that does not grow."""
        n = np.asarray(self.k_tiles, float)
        keep = n >= from_tiles
        if keep.sum() < 2:
            raise ValueError(f"need two tile counts >= {from_tiles} to fit a slope, got {list(self.k_tiles)}")
        y = np.median(self.errors, axis=0)[keep]
        return float(np.polyfit(np.log(n[keep]), np.log(y), 1)[0])


SIGNATURES = {
    "none": "matches the correct kernel at every tile count of the sweep",
    "output_tiles": "wrong already at one K tile and flat in K: an output-tile bug (indexing)",
    "step": "exact at one K tile, then a jump at the first K-tile boundary that stays: an offset bug (indexing)",
    "growth": "exact at one K tile, then a deterministic error that grows with the K-tile count (precision)",
    "race": "changes from launch to launch with identical inputs (race or ordering)",
}


def signature(sweep: TileSweep) -> str:
    """Which key of :data:`SIGNATURES` a sweep shows (it must include 1 and 2 K tiles): ``race`` if
    the launches disagree; ``none`` if every error equals the correct kernel's; ``output_tiles`` if
    wrong (>10x) at one K tile; ``step`` if right at one K tile and >10x off at two; else ``growth``."""
    counts = list(sweep.k_tiles)
    if 1 not in counts or 2 not in counts:
        raise ValueError(f"the sweep must include 1 and 2 K tiles, got {counts}")
    if (sweep.spread() > 1 + 1e-12).any():
        return "race"
    e, base = sweep.errors[0], sweep.correct
    if np.allclose(e, base, rtol=1e-12, atol=0):
        return "none"
    one, two = counts.index(1), counts.index(2)
    if e[one] > 10 * base[one]:
        return "output_tiles"
    if e[two] > 10 * base[two]:
        return "step"
    return "growth"


def sweep_k_tiles(defect: str | None, k_tiles: Sequence[int], *, m: int, n: int, dtype: str = "bf16",
                  config: TileConfig = TileConfig(), runs: int = 1, seed: int = 0) -> TileSweep:
    """The error of the correct kernel and of ``defect``'s for K = t tile_k, each t of ``k_tiles`` (full
    K tiles, so ``k_tail`` drops nothing here), on standard-normal (m, K) x (K, n) inputs drawn once at
    the largest K (the smaller problems use its prefixes), for launches ``run = 0 .. runs - 1``.
    The float64 oracle of each prefix is the running sum of the exact K-tile products."""
    return sweep_many([defect], k_tiles, m=m, n=n, dtype=dtype, config=config, runs=runs, seed=seed)[defect]


def sweep_many(defects: Sequence[str | None], k_tiles: Sequence[int], *, m: int, n: int, dtype: str = "bf16",
               config: TileConfig = TileConfig(), runs: int = 1, seed: int = 0) -> dict:
    """{defect: :func:`sweep_k_tiles`} for several defects on the same inputs (shared oracle and
    correct kernel)."""
    counts = tuple(integer("k_tiles", t, 1, 4096) for t in k_tiles)
    if not counts:
        raise ValueError("k_tiles must name at least one tile count")
    runs, dtype = integer("runs", runs, 1, 64), _dtype(dtype)
    defects = [_defect(d) for d in defects]
    a, b = random_inputs(m, n, max(counts) * config.tile_k, dtype, seed)
    good = _prepare(a, b, dtype, config, None)
    exact = np.cumsum(good.prods, axis=0)  # exact[t - 1] = A[:, :t tile_k] B[:t tile_k] in float64

    def err(out: dict, t: int) -> float:
        return relative_error(out[t][:m, :n], exact[t - 1][:m, :n])

    ref = _outputs(good, dtype, config, None, 0, counts)
    correct = np.array([err(ref, t) for t in counts])
    result = {}
    for defect in defects:
        bad = _prepare(a, b, dtype, config, defect) if defect == "k_offset" else good
        errors = np.empty((runs, len(counts)))
        for r in range(runs):
            if r and CANDIDATE.get(defect) != "race":  # nothing else reads the launch number
                errors[r] = errors[0]
                continue
            out = ref if defect in (None, "k_tail") else _outputs(bad, dtype, config, defect, r, counts)
            errors[r] = [err(out, t) for t in counts]
        result[defect] = TileSweep(defect, counts, correct, errors)
    return result


def _k_offset_tile(b: np.ndarray, kt: int, tk: int, n_pad: int) -> np.ndarray:
    """K tile ``kt`` of B as the ``k_offset`` draft loads it: flat offset advanced by kt tile_k
    along N (the row stride skipped), masks still on the true K and N bounds; reads past the
    allocation give 0."""
    k, n = b.shape
    flat = b.reshape(-1)
    r = np.arange(tk)[:, None]
    c = np.arange(n_pad)[None, :]
    idx = r * n + c + kt * tk
    ok = (kt * tk + r < k) & (c < n) & (idx < flat.size)
    out = np.zeros((tk, n_pad))
    out[ok] = flat[idx[ok]]
    return out


def _race_delta(a_t, b_now, b_next, config: TileConfig, gm: int, gn: int, rng) -> np.ndarray:
    """What the late warps of every CTA add wrongly at one K step: their rows of A times (next -
    current) on the B rows the early warps already overwrote."""
    tm, tn, tk, w = config.tile_m, config.tile_n, config.tile_k, config.warps
    late = rng.random((gm, gn, w)) < config.late_fraction
    delta = np.zeros((gm * tm, gn * tn))
    rows_per, krows_per = tm // w, tk // w
    diff = b_next - b_now
    racy = late.any(axis=2) & ~late.all(axis=2)  # CTAs with a late warp and an early one
    if racy.sum() > 4:  # many: one batched product over every CTA, masked
        early_k = np.repeat(~late, krows_per, axis=2)  # (gm, gn, tk)
        late_rows = np.repeat(late & racy[..., None], rows_per, axis=2)  # (gm, gn, tm)
        x = a_t.reshape(gm, 1, tm, tk) * early_k[:, :, None, :]  # (gm, gn, tm, tk)
        y = diff.reshape(tk, gn, tn).transpose(1, 0, 2)[None]  # (1, gn, tk, tn)
        d = np.matmul(x, y) * late_rows[..., None]  # (gm, gn, tm, tn)
        return d.transpose(0, 2, 1, 3).reshape(gm * tm, gn * tn)
    for pm, pn in zip(*np.nonzero(racy), strict=True):
        early_k = np.repeat(~late[pm, pn], krows_per)  # B-tile rows the early warps own
        rows = pm * tm + np.nonzero(np.repeat(late[pm, pn], rows_per))[0]
        c0 = pn * tn
        delta[rows, c0:c0 + tn] = a_t[rows][:, early_k] @ diff[early_k, c0:c0 + tn]
    return delta


def _split_k(p32: np.ndarray, dtype: str, config: TileConfig, gm: int, gn: int, rng) -> np.ndarray:
    """Split-K over the K-tile products ``p32`` (n_k, M', N'): ``s = min(split_k, n_k)`` CTAs per
    output tile, each summing a contiguous run of K tiles in fp32, then ``out = dtype(out + partial)``
    in a per-tile arrival order."""
    tm, tn = config.tile_m, config.tile_n
    nk = p32.shape[0]
    s = min(config.split_k, nk)
    bounds = np.linspace(0, nk, s + 1).round().astype(int)
    partials = []
    for j in range(s):
        acc = np.zeros(p32.shape[1:], np.float32)
        for kt in range(bounds[j], bounds[j + 1]):
            acc = acc + p32[kt]
        partials.append(acc)
    stack = np.stack(partials).reshape(s, gm, tm, gn, tn)
    order = np.argsort(rng.random((gm, gn, s)), axis=2)
    out = np.zeros((gm, tm, gn, tn), np.float32)
    for step in range(s):
        pick = order[:, :, step]  # (gm, gn): which split lands now in each tile
        add = np.take_along_axis(stack, pick[None, :, None, :, None], axis=0)[0]
        out = round_to_dtype(out + add, dtype)
    return out.reshape(gm * tm, gn * tn)


@dataclass(frozen=True)
class GemmKernel:
    """A kernel under test: ``kernel(a, b, run=0)`` returns C in ``dtype``; the attributes say what
    a tester may know (the tile shape and the storage dtype)."""

    name: str
    dtype: str = "bf16"
    config: TileConfig = field(default_factory=TileConfig)
    defect: str | None = None

    def __call__(self, a, b, run: int = 0) -> np.ndarray:
        return tiled_gemm(a, b, self.dtype, config=self.config, defect=self.defect, run=run)

    @property
    def tile_m(self) -> int:
        return self.config.tile_m

    @property
    def tile_n(self) -> int:
        return self.config.tile_n

    @property
    def tile_k(self) -> int:
        return self.config.tile_k


def make_kernel(defect: str | None = None, dtype: str = "bf16", config: TileConfig = TileConfig()) -> GemmKernel:
    """The correct kernel (``defect=None``) or one with a defect of :data:`DEFECTS`."""
    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"defect must be None or one of {', '.join(DEFECTS)}, got {defect!r}")
    return GemmKernel(defect or "correct", _dtype(dtype), config, defect)


# ---- oracle, tolerance, error measures -----------------------------------------------------------

def random_inputs(m: int, n: int, k: int, dtype: str = "bf16", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal A (M, K) and B (K, N) from ``default_rng(seed)``, rounded to ``dtype``
    (float32 arrays): the kernel and the oracle see the same values."""
    m, n, k = integer("m", m, 1), integer("n", n, 1), integer("k", k, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    a = round_to_dtype(rng.standard_normal((m, k)).astype(np.float32), _dtype(dtype))
    b = round_to_dtype(rng.standard_normal((k, n)).astype(np.float32), dtype)
    return a, b


def oracle(a, b) -> np.ndarray:
    """A B in float64 (numpy): the exact product to about 1e-16 relative, on the same stored inputs."""
    a, b = _check_inputs(a, b)
    return a.astype(np.float64) @ b.astype(np.float64)


def tolerance(a, b, dtype: str = "bf16", tile_k: int = 32, exact=None) -> np.ndarray:
    """Per-element bound |C_kernel - C*| <= tol that a correct kernel (fp32 accumulator, output
    rounded to ``dtype``) meets for any summation order, against the float64 oracle C*:

        tol_ij = u_s |C*_ij| + (1 + u_s) gamma_m (|A| |B|)_ij + eta_s,
        gamma_m = m u_32 / (1 - m u_32),  m = tile_k + ceil(K / tile_k)

    u_s is the storage dtype's unit roundoff (the one rounding at the store), eta_s half its smallest
    subnormal, and gamma_m Higham's bound for an inner product whose terms pass through at most m
    fp32 roundings: tile_k inside one K tile's MMA (if the hardware sums it in fp32 in the worst
    order) plus one per K tile added into the accumulator. Deterministic: no false alarm, ever.
    ``exact``: C* if already computed (else A B in float64 here).
    """
    a, b = _check_inputs(a, b)
    us, eta = unit_roundoff(_dtype(dtype)), _SUBNORMAL_HALF[dtype]
    tk = integer("tile_k", tile_k, 1)
    m_roundings = tk + -(-a.shape[1] // tk)
    mu = m_roundings * unit_roundoff("fp32")
    gamma = mu / (1 - mu)
    exact = a.astype(np.float64) @ b.astype(np.float64) if exact is None else np.asarray(exact, np.float64)
    return us * np.abs(exact) + (1 + us) * gamma * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + eta


def relative_error(c, exact) -> float:
    """||C - C*||_F / ||C*||_F (NaN or inf in C count as an infinite error)."""
    c, exact = np.asarray(c, np.float64), np.asarray(exact, np.float64)
    if c.shape != exact.shape:
        raise ValueError(f"c and exact must have the same shape, got {c.shape} and {exact.shape}")
    if not np.isfinite(c).all():
        return math.inf
    norm = np.linalg.norm(exact)
    return float(np.linalg.norm(c - exact) / norm) if norm > 0 else float(np.linalg.norm(c))


def error_ratio(c, exact, tol) -> np.ndarray:
    """|C - C*| / tol per element (> 1: outside the bound; NaN counts as inf)."""
    with np.errstate(invalid="ignore"):
        r = np.abs(np.asarray(c, np.float64) - exact) / tol
    return np.where(np.isnan(r), np.inf, r)


# ---- the precision candidate in closed form ----------------------------------------------------

def accumulator_error_ratio(dtype: str = "bf16", k: int = 4096, tile_k: int = 32, m: int = 64, n: int = 64,
                            seed: int = 0) -> float:
    """Relative error of the ``low_precision_acc`` kernel over that of the correct one (both store
    ``dtype``), simulated on standard-normal inputs of (m, k) x (k, n)."""
    cfg = TileConfig(tile_m=max(4, min(64, m)), tile_n=max(1, min(64, n)), tile_k=tile_k, warps=1)
    a, b = random_inputs(m, n, k, dtype, seed)
    exact = oracle(a, b)
    good = relative_error(tiled_gemm(a, b, dtype, config=cfg), exact)
    bad = relative_error(tiled_gemm(a, b, dtype, config=cfg, defect="low_precision_acc"), exact)
    return bad / good


def accumulator_ratio_closed_form(n_k_tiles: int) -> float:
    """sqrt((n + 1) / 2): the correct kernel rounds once, at the store, with variance ~ u^2 |C|^2 ~ n;
    a low-precision accumulator rounds after each K tile j = 1..n at magnitude ~ sqrt(j) (random-sign
    data), variance ~ sum j = n (n + 1) / 2. Independent of the dtype and of tile_k."""
    n = integer("n_k_tiles", n_k_tiles, 1)
    return math.sqrt((n + 1) / 2)


def race_clean_probability(late_fraction: float, warps: int, ctas: int, k_tiles: int) -> float:
    """Probability that a ``missing_barrier`` run computes the right answer: at each of the
    k_tiles - 1 steps that have a next tile, each CTA is clean unless it has both a late warp and an
    early one: (p^w + (1 - p)^w)^(ctas (k_tiles - 1))."""
    p = fraction("late_fraction", late_fraction)
    w, c, n = integer("warps", warps, 1), integer("ctas", ctas, 1), integer("k_tiles", k_tiles, 1)
    return (p**w + (1 - p) ** w) ** (c * (n - 1))


def grid_map_unwritten(grid_m: int, grid_n: int) -> int:
    """Output tiles the ``grid_map`` draft never writes: pid in [0, g_m g_n) maps to
    (pid // g_m, pid % g_m), distinct pairs with a column below g_m and a row below g_n, so exactly
    min(g_m, g_n)^2 of them land inside the grid: g_m g_n - min(g_m, g_n)^2 tiles stay unwritten
    (none on a square grid)."""
    gm, gn = integer("grid_m", grid_m, 1), integer("grid_n", grid_n, 1)
    return gm * gn - min(gm, gn) ** 2


# ---- where the error lands, and what a stock tolerance says ----------------------------------------

@dataclass(frozen=True)
class ErrorPattern:
    """Where the elements outside the bound (|C - C*| > tol) sit in the output."""

    share_elements: float  # of all elements
    share_rows: float  # rows with at least one
    share_cols: float  # columns with at least one
    share_tiles: float  # output tiles with at least one
    tile_fill: float  # within those tiles, the share of their elements outside (1: whole tiles)
    share_warp_blocks: float  # (warp row group x output tile) blocks with at least one


def warp_blocks(c, exact, tol, config: TileConfig = TileConfig()) -> np.ndarray:
    """(grid_m x warps, grid_n) booleans: the (warp row group, output tile column) blocks holding an
    element outside the bound; the row groups wholly past M are dropped."""
    bad = error_ratio(c, exact, tol) > 1
    m, n = bad.shape
    gm, gn = config.grid(m, n)
    rows_per = config.tile_m // config.warps
    pad = np.zeros((gm * config.tile_m, gn * config.tile_n), bool)
    pad[:m, :n] = bad
    blocks = pad.reshape(gm * config.warps, rows_per, gn, config.tile_n).any(axis=(1, 3))
    return blocks[: -(-m // rows_per)]


def error_pattern(c, exact, tol, config: TileConfig = TileConfig()) -> ErrorPattern:
    """:class:`ErrorPattern` of an output ``c`` against ``exact`` within ``tol`` (M, N arrays)."""
    bad = error_ratio(c, exact, tol) > 1
    m, n = bad.shape
    gm, gn = config.grid(m, n)
    tm, tn = config.tile_m, config.tile_n
    pad = np.zeros((gm * tm, gn * tn), bool)
    pad[:m, :n] = bad
    valid = np.zeros_like(pad)
    valid[:m, :n] = True
    per_tile = pad.reshape(gm, tm, gn, tn).sum(axis=(1, 3))
    size_tile = valid.reshape(gm, tm, gn, tn).sum(axis=(1, 3))
    hit = per_tile > 0
    return ErrorPattern(float(bad.mean()), float(bad.any(axis=1).mean()), float(bad.any(axis=0).mean()),
                        float(hit.mean()), float((per_tile[hit] / size_tile[hit]).mean()) if hit.any() else 0.0,
                        float(warp_blocks(c, exact, tol, config).mean()))


TORCH_ASSERT_CLOSE_DEFAULTS = {"bf16": (1.6e-2, 1e-5), "fp16": (1e-3, 1e-5)}
"""(rtol, atol) that ``torch.testing.assert_close`` uses when none are given: torch/testing/_comparison.py,
``_DTYPE_PRECISIONS`` (torch.bfloat16: (0.016, 1e-5), torch.float16: (0.001, 1e-5)); checked against the
installed torch in tests/unit/test_kernels_tiled_gemm.py."""


def passes_assert_close_defaults(c, exact, dtype: str) -> bool:
    """Whether |C - C*| <= atol + rtol |C*| everywhere with torch's default (rtol, atol) for ``dtype``."""
    rtol, atol = TORCH_ASSERT_CLOSE_DEFAULTS[_dtype(dtype)]
    with np.errstate(invalid="ignore"):
        return bool((np.abs(np.asarray(c, np.float64) - exact) <= atol + rtol * np.abs(exact)).all())


def split_k_fp32_flips(m: int, n: int, k: int, dtype: str = "bf16", split_k: int = 4,
                       config: TileConfig = TileConfig(), seed: int = 0) -> tuple[float, float]:
    """The quieter split-K: ``split_k`` fp32 partial sums (contiguous runs of K tiles) added in fp32 in
    two random orders per element, then rounded once to ``dtype``. Returns (share of elements whose fp32
    sum differs between the orders, share whose stored value differs): the stored value moves only
    where the fp32 difference straddles a rounding boundary of ``dtype``."""
    a, b = random_inputs(m, n, k, dtype, seed)
    p32 = _prepare(a, b, _dtype(dtype), config, None).prods.astype(np.float32)[:, :m, :n]
    s = min(integer("split_k", split_k, 2, 64), p32.shape[0])
    bounds = np.linspace(0, p32.shape[0], s + 1).round().astype(int)
    partials = []
    for j in range(s):
        acc = np.zeros((m, n), np.float32)
        for kt in range(bounds[j], bounds[j + 1]):
            acc = acc + p32[kt]
        partials.append(acc)
    stack = np.stack(partials)
    rng = np.random.default_rng([seed, _RACE_STREAM])
    sums = []
    for _ in range(2):
        order = np.argsort(rng.random((s, m, n)), axis=0)
        total = np.zeros((m, n), np.float32)
        for step in range(s):
            total = total + np.take_along_axis(stack, order[step][None], axis=0)[0]
        sums.append(total)
    stored = [round_to_dtype(x, dtype) for x in sums]
    return float((sums[0] != sums[1]).mean()), float((stored[0] != stored[1]).mean())


# ---- the test design -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TestDesign:
    """A pre-ship test of a GEMM kernel: for each shape, seeded random inputs in the storage dtype,
    the kernel's output against the float64 oracle within :func:`tolerance` (``oracle``), and
    ``runs`` launches compared bitwise with the first (``bitwise``)."""

    __test__ = False  # not a pytest class

    name: str
    shapes: tuple[tuple[int, int, int], ...]
    runs: int = 3
    oracle: bool = True
    bitwise: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("a test design needs at least one shape")
        for s in self.shapes:
            if len(s) != 3:
                raise ValueError(f"a shape is (M, N, K), got {s!r}")
            for name, v in zip("mnk", s, strict=True):
                integer(name, v, 1, 1 << 14)
        integer("runs", self.runs, 1, 16)


@dataclass(frozen=True)
class TestVerdict:
    """What one design said about one kernel: passed, or the first failure (shape, what failed)."""

    __test__ = False

    kernel: str
    design: str
    passed: bool
    reason: str = ""
    worst_ratio: float = 0.0  # max |C - C*| / tol over every shape and run checked
    differing: int = 0  # elements that differ bitwise between runs (over every shape)


def design_for(config: TileConfig = TileConfig(), tiles: int = 24, seed: int = 0) -> TestDesign:
    """The pre-ship design for a kernel with this tile shape, two problems and three launches each:
    (1) 2.5 x 4.5 output tiles (a 3 x 5 tile grid, not square) and ``tiles`` + 1/2 K tiles, no
    dimension a tile multiple; (2) a decode-like problem: M = tile_m / 4 + 1 (one partial row tile),
    7 tiles and a bit in N, ``tiles`` + 9 K tiles and a remainder. ``seed`` draws the inputs."""
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    t = integer("tiles", tiles, 2, 512)
    return TestDesign("pre-ship design", (
        (2 * tm + tm // 2 + 1, 4 * tn + tn // 2 + 3, t * tk + tk // 2 + 1),
        (tm // 4 + 1, 7 * tn + 5, (t + 9) * tk + 3),
    ), seed=integer("seed", seed, 0))


def _multiple(x: int, t: int) -> int:
    return max(t, (x // t) * t)


ABLATIONS = ("one tile (the shipped unit test)", "tile multiples only", "square tile grid",
             "no float64 oracle", "a single run")


def ablation(config: TileConfig = TileConfig(), tiles: int = 24, seed: int = 0) -> dict[str, TestDesign]:
    """The pre-ship design and five weakened copies, one ingredient removed each (:data:`ABLATIONS`)."""
    full = design_for(config, tiles, seed)
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    (m1, n1, k1), (m2, n2, k2) = full.shapes
    gm = config.grid(m1, n1)[0]
    return {
        full.name: full,
        ABLATIONS[0]: replace(full, name=ABLATIONS[0], shapes=((tm, tn, tk),)),
        ABLATIONS[1]: replace(full, name=ABLATIONS[1], shapes=tuple(
            (_multiple(m, tm), _multiple(n, tn), _multiple(k, tk)) for m, n, k in full.shapes)),
        ABLATIONS[2]: replace(full, name=ABLATIONS[2], shapes=((m1, gm * tn - tn // 2 + 1, k1),)),
        ABLATIONS[3]: replace(full, name=ABLATIONS[3], oracle=False),
        ABLATIONS[4]: replace(full, name=ABLATIONS[4], runs=1),
    }


def run_design(kernel: Callable, design: TestDesign, dtype: str | None = None, tile_k: int | None = None,
               cache: dict | None = None) -> TestVerdict:
    """Run ``design`` on ``kernel`` (``kernel(a, b, run=r)``; its ``dtype`` and ``tile_k`` attributes
    are used unless given). ``cache`` (a dict) memoizes outputs by (kernel name, shape, run)."""
    dtype = dtype or getattr(kernel, "dtype", "bf16")
    tk = tile_k or getattr(kernel, "tile_k", 32)
    name = getattr(kernel, "name", getattr(kernel, "__name__", "kernel"))
    cache = {} if cache is None else cache
    worst, differing, first_failure = 0.0, 0, ""
    for shape in design.shapes:
        m, n, k = shape
        problem = ("problem", dtype, tk, shape, design.seed)
        if problem not in cache:
            a, b = random_inputs(m, n, k, dtype, design.seed)
            exact = oracle(a, b)
            cache[problem] = a, b, exact, tolerance(a, b, dtype, tk, exact)
        a, b, exact, tol = cache[problem]

        def launch(r: int, shape=shape, a=a, b=b) -> np.ndarray:
            key = (name, dtype, shape, design.seed, r)
            if key not in cache:
                cache[key] = np.asarray(kernel(a, b, run=r), np.float32)
            return cache[key]

        first = launch(0)
        if first.shape != (m, n):
            return TestVerdict(name, design.name, False, f"shape {shape}: output {first.shape}, expected {(m, n)}")
        if design.oracle:
            ratio = error_ratio(first, exact, tol)
            worst = max(worst, float(ratio.max()))
            bad = int((ratio > 1).sum())
            if bad and not first_failure:
                i, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
                first_failure = (f"shape (M, N, K) = {shape}: {bad:,} of {m * n:,} elements outside the tolerance; "
                                 f"worst C[{i}, {j}] = {first[i, j]:.6g}, float64 {exact[i, j]:.6g}, "
                                 f"{ratio[i, j]:.3g}x the bound")
        if design.bitwise:
            for r in range(1, design.runs):
                diff = int((launch(r).view(np.uint32) != first.view(np.uint32)).sum())
                differing += diff
                if diff and not first_failure:
                    first_failure = (f"shape (M, N, K) = {shape}: run {r} differs from run 0 in {diff:,} of {m * n:,} "
                                     "elements (bitwise)")
    return TestVerdict(name, design.name, not first_failure, first_failure, worst, differing)


def run_matrix(kernels: Sequence[GemmKernel], designs: dict[str, TestDesign]) -> dict[tuple[str, str], TestVerdict]:
    """{(design name, kernel name): verdict} for every design on every kernel (outputs shared)."""
    cache: dict = {}
    return {(d, k.name): run_design(k, design, cache=cache) for d, design in designs.items() for k in kernels}


# ---- figures ------------------------------------------------------------------------------------

_STYLE = {None: ("correct kernel", "black", "o-"), "k_offset": ("k_offset (indexing)", "#9467bd", "v-"),
          "k_tail": ("k_tail (indexing)", "#8c564b", "^-"), "grid_map": ("grid_map (indexing)", "#e377c2", "D-"),
          "low_precision_acc": ("low_precision_acc (precision)", "#1f77b4", "s-"),
          "missing_barrier": ("missing_barrier (race)", "#d62728", "x-"),
          "split_k_order": ("split_k_order (race)", "#ff7f0e", "+-")}


def plot_sweeps(sweeps: dict, title: str):
    """Relative error against the number of K tiles, one line per :class:`TileSweep` (median launch) and
    a min-max band for those whose launches differ; the correct kernel from the first sweep. Returns a
    :class:`lib.book.figures.Drawing`."""
    from lib.book import figures

    if not sweeps:
        raise ValueError("plot_sweeps needs at least one sweep")
    with figures.style():
        fig = figures.new_figure(6.6, 4.3)
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.36, top=0.93)
        ax = fig.add_subplot()
        figures.log_scale(ax, "x", base=2)
        figures.log_scale(ax, "y", base=10)
        first = next(iter(sweeps.values()))
        n = np.asarray(first.k_tiles, float)
        label, color, style = _STYLE[None]
        handles = [ax.plot(n, first.correct, style, color=color, lw=1.6, ms=3, label=label)[0]]
        for defect, sw in sweeps.items():
            label, color, style = _STYLE[defect]
            med = np.median(sw.errors, axis=0)
            handles.append(ax.plot(n, med, style, color=color, lw=1.3, ms=4, label=label)[0])
            if (sw.spread() > 1 + 1e-12).any():
                handles.append(ax.fill_between(n, sw.errors.min(axis=0), sw.errors.max(axis=0), color=color,
                                               alpha=0.18, lw=0, label=f"{defect}: min to max over launches"))
        ax.set_xlabel("K tiles n (K = n x tile_k)")
        ax.set_ylabel("relative error ||C - C*|| / ||C*||")
        ax.set_title(title, fontsize=8)
        ax.grid(True)
        figures.legend(ax, handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7,
                       frameon=False)
    return figures.show(fig)


def plot_error_maps(ratios: dict, config: TileConfig, title: str):
    """One panel per kernel: each element of the output inside its bound (white), outside by less than
    10x (orange) or by 10x or more (dark red), with the output-tile grid drawn over it."""
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from lib.book import figures

    if not ratios:
        raise ValueError("plot_error_maps needs at least one output")
    colors = ("white", "#fdae61", "#a50026")
    cols = 3
    rows = -(-len(ratios) // cols)
    with figures.style():
        fig = figures.new_figure(6.6, 2.3 * rows + 0.6)
        fig.subplots_adjust(left=0.04, right=0.99, bottom=0.1, top=0.9, wspace=0.12, hspace=0.3)
        for i, (name, r) in enumerate(ratios.items()):
            ax = fig.add_subplot(rows, cols, i + 1)
            level = np.where(r > 10, 2, np.where(r > 1, 1, 0))
            ax.imshow(level, cmap=ListedColormap(colors), vmin=0, vmax=2, interpolation="nearest", aspect="auto")
            m, n = r.shape
            for x in range(config.tile_n, n, config.tile_n):
                ax.axvline(x - 0.5, color="grey", lw=0.5)
            for y in range(config.tile_m, m, config.tile_m):
                ax.axhline(y - 0.5, color="grey", lw=0.5)
            ax.set_title(name, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.legend(handles=[Patch(facecolor=c, edgecolor="grey", label=t) for c, t in
                            zip(colors, ("inside the bound", "outside, < 10x", "outside, >= 10x"), strict=True)]
                   + [Line2D([], [], color="grey", lw=0.8, label="output-tile boundaries")],
                   loc="lower center", ncol=4, fontsize=7, frameon=False)
        fig.suptitle(title, fontsize=8)
    return figures.show(fig)
