"""Online softmax for one query: the three-line recurrence and the reads it saves.

Safe softmax over N scores x_1..x_N reads them three times (three passes, 3N reads, N writes):

    m = max_j x_j;   l = sum_j exp(x_j - m);   p_j = exp(x_j - m) / l

The online normalizer (Milakov and Gimelshein 2018, arXiv:1805.02867) folds the first two
passes into one by carrying a running max and a running sum, rescaling the sum whenever the max
moves (2N reads, N writes):

    m_j = max(m_{j-1}, x_j)
    l_j = l_{j-1} exp(m_{j-1} - m_j) + exp(x_j - m_j)

and attention needs no normalized p at all, only O = sum_j p_j v_j, which obeys the same rescale:

    o_j = o_{j-1} exp(m_{j-1} - m_j) + exp(x_j - m_j) v_j,      O = o_N / l_N

so one pass reads each score once (N reads) and writes none: the scores never reach memory. That is
FlashAttention's recurrence for one query row; :mod:`lib.attention.tiled` runs it for a tile of
rows over tiles of keys. Here the recurrence can also advance a block of B keys at a time
(m_new = max(m, max of the block)), which is what one key tile does.

A masked score is -inf. While every score seen so far is -inf, m = -inf and exp(x - m) =
exp(-inf - (-inf)) = NaN; ``guard_masked_rows`` (default) exponentiates against 0 instead, so
masked keys weigh 0 and an all-masked row ends with l = 0 (output 0, LSE -inf).

Reads are counted as score (or K/V row) elements touched by each pass, the unit of the IO count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer

from ._common import acc_dtype_of, float_array, scale_of

__all__ = [
    "OnlineTrace",
    "SoftmaxIO",
    "online_attention_one_query",
    "online_softmax",
    "online_softmax_trace",
    "safe_softmax",
    "softmax_io",
]


@dataclass(frozen=True)
class SoftmaxIO:
    """Score elements read and written by one softmax (or attention) over N scores of one query."""

    method: str
    passes: int
    reads: int  # score elements read
    writes: int  # probability elements written (0 when the scores never leave the chip)

    @property
    def total(self) -> int:
        return self.reads + self.writes


_IO = {"three_pass": (3, 3, 1), "online": (2, 2, 1), "fused_attention": (1, 1, 0)}


def softmax_io(n: int, method: str = "online") -> SoftmaxIO:
    """Hand count of score traffic for one query's N scores, in elements.

    three_pass (safe softmax): max, sum, normalize: 3N reads, N writes. online: (max, sum) in one
    pass then normalize: 2N reads, N writes. fused_attention (FlashAttention, one query): each
    score is produced, used for (m, l, o) and dropped: N reads (of the score as it is produced),
    0 writes. Multiply by bytes per element for bytes.
    """
    n = integer("n", n, 0, unit="scores")
    if method not in _IO:
        raise ValueError(f"method must be one of {', '.join(_IO)}, got {method!r}")
    passes, r, w = _IO[method]
    return SoftmaxIO(method, passes, r * n, w * n)


class _Counter:
    """Counts elements read from one array, pass by pass."""

    def __init__(self, x: np.ndarray):
        self.x, self.reads = x, 0

    def read(self, start: int, stop: int) -> np.ndarray:
        self.reads += stop - start
        return self.x[start:stop]


def _vector(name: str, x: object) -> np.ndarray:
    arr = float_array(name, x, ndim=1)
    if np.isposinf(arr).any():
        raise ValueError(f"{name} must not contain +inf (use -inf for a masked score)")
    return arr


def safe_softmax(x: object, acc_dtype: object = np.float32, guard_masked_rows: bool = True
                 ) -> tuple[np.ndarray, SoftmaxIO]:
    """p = exp(x - max x) / sum exp(x - max x) in three passes over ``x`` (N scores, -inf = masked);
    returns p (in ``acc_dtype``) and the counted reads/writes (3N, N). All -inf: zeros if guarded."""
    acc = acc_dtype_of(acc_dtype)
    c = _Counter(_vector("x", x).astype(acc))
    n = c.x.size
    m = c.read(0, n).max() if n else acc.type(-np.inf)  # pass 1
    m_use = acc.type(0) if (guard_masked_rows and np.isneginf(m)) else m
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.exp(c.read(0, n) - m_use).sum(dtype=acc)  # pass 2
        p = np.exp(c.read(0, n) - m_use) / total  # pass 3
    if guard_masked_rows and total == 0:
        p = np.zeros(n, acc)
    return p.astype(acc), SoftmaxIO("three_pass", 3, c.reads, n)


@dataclass(frozen=True)
class OnlineTrace:
    """The running (m, l) after each block of keys; index 0 is the start (m = -inf, l = 0).

    ``m[t]``, ``l[t]``: running max and sum after the first ``ends[t]`` scores; ``rescale[t]`` =
    exp(m[t-1] - m[t]), the factor the old sum (and output) is multiplied by at step t (1 at t = 0).
    ``lse`` = m + log(l) at the end; ``reads``: score elements read (N for the single pass).
    """

    ends: np.ndarray
    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the paper's name
    rescale: np.ndarray
    lse: float
    reads: int


def _advance(m: np.ndarray, l_sum: np.ndarray, block: np.ndarray, guard: bool):
    """One step of the recurrence over a block of scores (last axis): returns (m_new, l_new, alpha, p)."""
    with np.errstate(invalid="ignore", over="ignore"):
        m_new = np.maximum(m, block.max(axis=-1) if block.shape[-1] else m)
        m_use = np.where(np.isneginf(m_new), 0, m_new).astype(m.dtype) if guard else m_new
        alpha = np.exp(m - m_use)
        p = np.exp(block - m_use[..., None])
        l_new = alpha * l_sum + p.sum(axis=-1, dtype=m.dtype)
    return m_new.astype(m.dtype), l_new.astype(m.dtype), alpha.astype(m.dtype), p.astype(m.dtype)


def online_softmax_trace(x: object, block_size: int = 1, acc_dtype: object = np.float32,
                         guard_masked_rows: bool = True) -> OnlineTrace:
    """Run m_t = max(m_{t-1}, max of block t), l_t = l_{t-1} exp(m_{t-1} - m_t) + sum exp(x - m_t)
    over ``x`` in blocks of ``block_size`` scores (one pass, N reads); return every (m, l)."""
    acc = acc_dtype_of(acc_dtype)
    block_size = integer("block_size", block_size, 1, unit="scores")
    c = _Counter(_vector("x", x).astype(acc))
    m, l_sum = np.array(-np.inf, acc), np.array(0, acc)
    ends, ms, ls, alphas = [0], [m], [l_sum], [np.array(1, acc)]
    for start in range(0, c.x.size, block_size):
        stop = min(start + block_size, c.x.size)
        m, l_sum, alpha, _ = _advance(m, l_sum, c.read(start, stop), guard_masked_rows)
        ends.append(stop), ms.append(m), ls.append(l_sum), alphas.append(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        m_end = np.where(np.isneginf(m), 0, m) if guard_masked_rows else m
        lse = float(m_end + np.log(l_sum))
    return OnlineTrace(np.array(ends), np.array(ms, acc), np.array(ls, acc), np.array(alphas, acc), lse, c.reads)


def online_softmax(x: object, block_size: int = 1, acc_dtype: object = np.float32,
                   guard_masked_rows: bool = True) -> tuple[np.ndarray, SoftmaxIO]:
    """Softmax of ``x`` in two passes: the online (m, l) recurrence, then p_j = exp(x_j - m) / l.
    Returns p (in ``acc_dtype``) and the counted reads/writes (2N, N)."""
    t = online_softmax_trace(x, block_size, acc_dtype, guard_masked_rows)
    acc = acc_dtype_of(acc_dtype)
    c = _Counter(np.asarray(x).astype(acc))
    m, l_sum = t.m[-1], t.l[-1]
    m_use = acc.type(0) if (guard_masked_rows and np.isneginf(m)) else m
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.exp(c.read(0, c.x.size) - m_use) / l_sum  # pass 2
    if guard_masked_rows and l_sum == 0:
        p = np.zeros(c.x.size, acc)
    return p.astype(acc), SoftmaxIO("online", 2, t.reads + c.reads, c.x.size)


def online_attention_one_query(q: object, k: object, v: object, mask: object = None, *,
                               block_size: int = 1, scale: float | None = None,
                               acc_dtype: object = np.float32, guard_masked_rows: bool = True
                               ) -> tuple[np.ndarray, float, OnlineTrace]:
    """Attention of one query q (d,) over keys k (N, d) and values v (N, dv) in ONE pass.

    For each block of keys: s = k_blk q * scale (-inf where ``mask`` (N,) is False), then
    m_new = max(m, max s), alpha = exp(m - m_new), l = alpha l + sum exp(s - m_new),
    o = alpha o + exp(s - m_new) v_blk; finally O = o / l (0 when l = 0), LSE = m + log l.
    Returns (O (dv,), LSE, trace); trace.reads counts scores consumed (N, each once, none stored).
    """
    acc = acc_dtype_of(acc_dtype)
    block_size = integer("block_size", block_size, 1, unit="keys")
    q, k, v = float_array("q", q, 1), float_array("k", k, 2), float_array("v", v, 2)
    if k.shape[1] != q.shape[0] or v.shape[0] != k.shape[0]:
        raise ValueError(f"need q (d,), k (N, d), v (N, dv); got {q.shape}, {k.shape}, {v.shape}")
    n = k.shape[0]
    if mask is None:
        allowed = np.ones(n, bool)
    else:
        allowed = np.asarray(mask)
        if allowed.dtype != bool or allowed.shape != (n,):
            raise ValueError(f"mask must be a boolean array of shape ({n},), got {allowed.dtype} {allowed.shape}")
    sc = acc.type(scale_of(scale, q.shape[0]))
    qa, ka, va = q.astype(acc), k.astype(acc), v.astype(acc)
    m, l_sum, o = np.array(-np.inf, acc), np.array(0, acc), np.zeros(v.shape[1], acc)
    ends, ms, ls, alphas, reads = [0], [m], [l_sum], [np.array(1, acc)], 0
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        s = np.where(allowed[start:stop], (ka[start:stop] @ qa) * sc, acc.type(-np.inf)).astype(acc)
        reads += stop - start
        m, l_sum, alpha, p = _advance(m, l_sum, s, guard_masked_rows)
        with np.errstate(invalid="ignore"):
            o = (alpha * o + p @ va[start:stop]).astype(acc)
        ends.append(stop), ms.append(m), ls.append(l_sum), alphas.append(alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        if guard_masked_rows and l_sum == 0:
            out, lse = np.zeros_like(o), -np.inf
        else:
            out, lse = (o / l_sum).astype(acc), float(m + np.log(l_sum))
    trace = OnlineTrace(np.array(ends), np.array(ms, acc), np.array(ls, acc), np.array(alphas, acc), lse, reads)
    return out, lse, trace
