"""Tiled attention forward (FlashAttention-2 loop order) with running max and sum per row block.

For query block i (Br rows) and key blocks j = 1..Tc (Bc keys each; the last block of either
axis may be shorter: blocks need not divide the sequence), with S_ij = Q_i K_j^T * scale (+ mask):

    m_i^(j)  = max(m_i^(j-1), rowmax(S_ij))                         (vector of Br running maxima)
    P~_ij    = exp(S_ij - m_i^(j))                                   (Br x Bc, never written out)
    l_i^(j)  = exp(m_i^(j-1) - m_i^(j)) * l_i^(j-1) + rowsum(P~_ij)  (vector of Br running sums)
    O_i^(j)  = diag(exp(m_i^(j-1) - m_i^(j))) O_i^(j-1) + P~_ij V_j  (the rescale is a diagonal matrix)

and at the end O_i = diag(l_i)^-1 O_i^(Tc), L_i = m_i + log(l_i) (the log-sum-exp kept for the
backward pass). FlashAttention-1 (Dao et al. 2022, arXiv:2205.14135, Algorithm 1) runs the same
recurrence with the loops swapped (K/V blocks outside) and rescales O in HBM at every step;
FlashAttention-2 (arXiv:2307.08691, Algorithm 1) keeps O_i on chip and divides by l once.

Tile map: under a causal (or sliding-window, or any) mask, a tile with no allowed entry is SKIPPED
(never computed), a tile with every entry allowed is FULL (no mask applied), the rest are PARTIAL.
:func:`causal_tile_map` gives it in closed form, :func:`tile_map` from any boolean mask.

The NaN edge case: a row whose entries are all masked inside a tile that is computed, while its
running max is still -inf (no allowed key in any earlier tile), gets m_new = -inf and
exp(S - m_new) = exp(-inf - (-inf)) = NaN; alpha = exp(m_old - m_new) is NaN too, and the NaN
then survives every later tile (alpha = 0 multiplies NaN). It happens to rows that DO have keys
later: a sliding window whose first key tile is partial for the block but empty for the row,
left padding that fills the first tile, a query row of padding. ``guard_masked_rows=False``
reproduces it; the guard exponentiates against 0 while m is -inf (so masked entries give exactly
0 and alpha = exp(-inf) = 0) and returns 0 with L = -inf for a row that never saw a key.

HBM traffic of naive vs tiled attention in bytes (Theorem 2 of the paper: Theta(N d + N^2) vs
Theta(N^2 d^2 / M)) lives in :mod:`lib.attention.traffic` (its one home) and is re-exported here:
:func:`naive_hbm_bytes`, :func:`tiled_hbm_bytes`, :func:`flash_block_sizes`,
:func:`theorem2_orders`. :attr:`TiledResult.elements_read` counts what this loop touches; a test
holds it equal to the FA2 count of :func:`lib.attention.traffic.tiled_traffic`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer

from ._common import acc_dtype_of, build_mask, check_qkv, expand_kv, masked_scores, scale_of
from .traffic import flash_block_sizes, naive_hbm_bytes, theorem2_orders, tiled_hbm_bytes

__all__ = [
    "FULL",
    "PARTIAL",
    "SKIP",
    "TiledResult",
    "block_ranges",
    "causal_tile_map",
    "flash_block_sizes",
    "naive_hbm_bytes",
    "rescale_diagonal",
    "tile_counts",
    "theorem2_orders",
    "tile_map",
    "tiled_attention",
    "tiled_hbm_bytes",
]

SKIP, PARTIAL, FULL = 0, 1, 2
"""Tile kinds in a tile map: no allowed entry (skipped), some allowed (masked), all allowed."""


def block_ranges(n: int, block: int) -> list[tuple[int, int]]:
    """[(start, stop), ...] covering 0..n in blocks of ``block`` (the last one shorter if it does
    not divide n); ceil(n / block) blocks, none for n = 0."""
    n, block = integer("n", n, 0), integer("block", block, 1)
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def tile_map(allowed: object, block_q: int, block_k: int) -> np.ndarray:
    """Classify each (query block i, key block j) tile of a boolean mask (..., Nq, Nk), True = attend.

    Returns an int8 array (ceil(Nq/Br), ceil(Nk/Bc)): SKIP (0) if no entry of the tile is allowed
    in any leading index (batch, head), FULL (2) if all are, PARTIAL (1) otherwise.
    """
    a = np.asarray(allowed)
    if a.dtype != bool or a.ndim < 2:
        raise ValueError(f"allowed must be a boolean array (..., n_q, n_k), got {a.dtype} of shape {a.shape}")
    a = a.reshape((-1,) + a.shape[-2:])
    rows, cols = block_ranges(a.shape[1], block_q), block_ranges(a.shape[2], block_k)
    out = np.empty((len(rows), len(cols)), np.int8)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            t = a[:, r0:r1, c0:c1]
            out[i, j] = FULL if t.all() else PARTIAL if t.any() else SKIP
    return out


def causal_tile_map(n_q: int, n_k: int, block_q: int, block_k: int, query_offset: int = 0,
                    window: int | None = None) -> np.ndarray:
    """The tile map of a causal (optionally sliding-window) mask, in closed form.

    Rows r0..r1-1 sit at positions p = offset + r; keys c0..c1-1. Causal: FULL iff c1 - 1 <= offset
    + r0 (the first row already sees the last key), SKIP iff c0 > offset + r1 - 1 (the last row
    sees none). With a window w (row p sees p - w < j <= p): also SKIP iff c1 - 1 <= offset + r0 -
    w, and FULL needs c0 > offset + r1 - 1 - w. About half the tiles of a square causal mask are
    skipped: Tr (Tr - 1) / 2 of Tr^2 when Br = Bc divides N.
    """
    rows = block_ranges(n_q, block_q)
    cols = block_ranges(n_k, block_k)
    off = integer("query_offset", query_offset, 0)
    w = None if window is None else integer("window", window, 1, unit="tokens")
    out = np.empty((len(rows), len(cols)), np.int8)
    for i, (r0, r1) in enumerate(rows):
        first, last = off + r0, off + r1 - 1
        for j, (c0, c1) in enumerate(cols):
            if c0 > last or (w is not None and c1 - 1 <= first - w):
                out[i, j] = SKIP
            elif c1 - 1 <= first and (w is None or c0 > last - w):
                out[i, j] = FULL
            else:
                out[i, j] = PARTIAL
    return out


def tile_counts(tiles: object) -> dict[str, int]:
    """{'skip': n, 'partial': n, 'full': n, 'computed': partial + full, 'total': n} of a tile map."""
    t = np.asarray(tiles)
    counts = {"skip": int((t == SKIP).sum()), "partial": int((t == PARTIAL).sum()), "full": int((t == FULL).sum())}
    return {**counts, "computed": counts["partial"] + counts["full"], "total": int(t.size)}


def rescale_diagonal(m_old: object, m_new: object, guard_masked_rows: bool = True) -> np.ndarray:
    """diag(exp(m_old - m_new)): the Br x Br matrix that rescales O and l when the running maxima move.

    Entries are in [0, 1] (m_new >= m_old); a row whose max is still -inf gets exp(-inf - (-inf)) =
    NaN unless guarded (then it uses m_new = 0: exp(-inf) = 0, harmless since its O and l are 0).
    """
    old = np.asarray(m_old, dtype=np.float64).reshape(-1)
    new = np.asarray(m_new, dtype=np.float64).reshape(-1)
    if old.shape != new.shape:
        raise ValueError(f"m_old and m_new must have the same length, got {old.size} and {new.size}")
    if (new < old).any():
        raise ValueError("m_new must be >= m_old element-wise (a running max never decreases)")
    if guard_masked_rows:
        new = np.where(np.isneginf(new), 0.0, new)
    with np.errstate(invalid="ignore"):
        return np.diag(np.exp(old - new))


@dataclass(frozen=True)
class TiledResult:
    """What :func:`tiled_attention` returns.

    out (B, Hq, Nq, dv) and lse (B, Hq, Nq) in the accumulation dtype; ``tiles`` the tile map the
    loop used (all tiles computed when skipping is off); ``elements_read`` / ``elements_written``
    the HBM elements the loop touched over all (batch, head) pairs (Q_i once per query block, K_j
    and V_j once per computed tile, O_i and L_i written once); ``m_history`` / ``l_history``
    (Tc + 1, B, Hq, Nq) the running max and sum of every row after each key block (index 0: the
    start, -inf and 0), when ``record`` was set.
    """

    out: np.ndarray
    lse: np.ndarray
    tiles: np.ndarray
    elements_read: int
    elements_written: int
    m_history: np.ndarray | None = None
    l_history: np.ndarray | None = None

    @property
    def tiles_computed(self) -> int:
        return tile_counts(self.tiles)["computed"]


def tiled_attention(q: object, k: object, v: object, mask: object = None, *, causal: bool = False,
                    query_offset: int = 0, scale: float | None = None, block_q: int = 16,
                    block_k: int = 16, acc_dtype: object = np.float32, guard_masked_rows: bool = True,
                    skip_masked_tiles: bool = True, record: bool = False) -> TiledResult:
    """Attention by tiles of Br = ``block_q`` queries x Bc = ``block_k`` keys with the online
    recurrence (module docstring); never forms the Nq x Nk matrix beyond one tile.

    Inputs and masks as in :func:`lib.attention.naive.naive_attention` (q (B, Hq, Nq, d), k and v
    with Hkv heads, GQA by h // group; boolean or additive ``mask``; ``causal`` with
    ``query_offset``). m, l and O are held in ``acc_dtype`` across tiles. ``skip_masked_tiles``
    skips a tile whose entries are masked for every (batch, head); ``guard_masked_rows=False``
    reproduces the -inf - (-inf) NaN. Returns a :class:`TiledResult` (O, L = m + log l, tile map,
    counted HBM elements, optional (m, l) history).
    """
    q, k, v, group = check_qkv(q, k, v)
    block_q, block_k = integer("block_q", block_q, 1), integer("block_k", block_k, 1)
    acc = acc_dtype_of(acc_dtype)
    b, hq, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    allowed, additive = build_mask(mask, causal, query_offset, (b, hq, nq, nk))
    sc = scale_of(scale, d)
    ke, ve = expand_kv(k, group).astype(acc), expand_kv(v, group).astype(acc)
    qa = q.astype(acc)
    rows, cols = block_ranges(nq, block_q), block_ranges(nk, block_k)
    if allowed is None:
        tiles = np.full((len(rows), len(cols)), FULL, np.int8)
    else:
        tiles = tile_map(allowed, block_q, block_k)
    if not skip_masked_tiles:
        tiles = np.where(tiles == SKIP, PARTIAL, tiles).astype(np.int8)
    out = np.zeros((b, hq, nq, dv), acc)
    lse = np.full((b, hq, nq), -np.inf, acc)
    hist_m = np.full((len(cols) + 1, b, hq, nq), -np.inf, acc) if record else None
    hist_l = np.zeros((len(cols) + 1, b, hq, nq), acc) if record else None
    reads = writes = 0
    zero, ninf = acc.type(0), acc.type(-np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for i, (r0, r1) in enumerate(rows):
            qi = qa[:, :, r0:r1]
            reads += qi.size
            m = np.full((b, hq, r1 - r0), -np.inf, acc)
            l_sum = np.zeros((b, hq, r1 - r0), acc)
            o = np.zeros((b, hq, r1 - r0, dv), acc)
            for j, (c0, c1) in enumerate(cols):
                if tiles[i, j] != SKIP:
                    kj, vj = ke[:, :, c0:c1], ve[:, :, c0:c1]
                    reads += kj.size + vj.size
                    tile_allowed = None
                    if tiles[i, j] == PARTIAL and allowed is not None:
                        tile_allowed = allowed[:, :, r0:r1, c0:c1]
                    tile_add = None if additive is None else additive[:, :, r0:r1, c0:c1]
                    s = masked_scores(qi, kj, sc, acc, tile_allowed, tile_add)
                    m_new = np.maximum(m, s.max(axis=-1))
                    m_use = np.where(np.isneginf(m_new), zero, m_new) if guard_masked_rows else m_new
                    p = np.exp(s - m_use[..., None]).astype(acc)
                    alpha = np.exp(m - m_use).astype(acc)  # diag(alpha) rescales O and l
                    l_sum = (alpha * l_sum + p.sum(axis=-1, dtype=acc)).astype(acc)
                    o = (alpha[..., None] * o + np.matmul(p, vj)).astype(acc)
                    m = m_new.astype(acc)
                if record:
                    hist_m[j + 1, :, :, r0:r1], hist_l[j + 1, :, :, r0:r1] = m, l_sum
            if guard_masked_rows:
                seen = l_sum > 0
                out[:, :, r0:r1] = np.where(seen[..., None], o / np.where(seen, l_sum, 1)[..., None], zero)
                lse[:, :, r0:r1] = np.where(seen, m + np.log(np.where(seen, l_sum, 1)), ninf)
            else:
                out[:, :, r0:r1] = o / l_sum[..., None]
                lse[:, :, r0:r1] = m + np.log(l_sum)
            writes += (r1 - r0) * b * hq * (dv + 1)
    return TiledResult(out, lse, tiles, int(reads), int(writes), hist_m, hist_l)
