"""HBM traffic of attention for one head: naive, tiled (textbook), tiled with L2 reuse, in bytes.

Counts are per (batch, head) pair, for Nq queries against Nk keys of head_dim d (values dv = d),
with ``b`` bytes per element of Q, K, V, O (``dtype``) and of the score matrices (``score_dtype``).

* Naive (FlashAttention paper, Algorithm 0): S = QK^T is written to HBM, read by the softmax,
  P written, read again by PV. Reads: Q, K, V once + 2 Nq Nk scores; writes: 2 Nq Nk + O.
  At Nq = Nk = 8192 in FP16 one score matrix is 8192^2 x 2 B = 134,217,728 B (134 MB) per head,
  and the four passes over it dominate everything else.
* Tiled, FlashAttention-2 loop order (query blocks outside): Q_i read once, O_i and L_i written
  once, K and V read once per query block: Tr = ceil(Nq / Br) times. At 8K with Br = 128 that is
  64 passes over K and V, 268 MB per head against naive's 545 MB: the textbook count is only
  about 2x better (the score traffic became K/V re-reads).
* Tiled, FlashAttention-1 loop order (Algorithm 1: K/V blocks outside, Bc = ceil(M / 4d),
  Br = min(Bc, d) from an SRAM of M elements): K, V read once; Q, O, m, l read and O, m, l written
  once per key block. Theorem 2 of the paper: Theta(N^2 d^2 / M) HBM accesses vs Theta(Nd + N^2).
* Tiled with L2 (:func:`tiled_traffic_l2`): the K/V re-reads of the textbook count are requests to
  the memory system, not HBM transfers. Query tiles of one head run concurrently on different SMs
  and sweep the same K/V tiles at about the same time, so the L2 serves all but the first request.
  The model has two explicit assumptions: (1) tiles of one head that run in the same wave share
  each K/V fetch (``lockstep``); (2) a head whose query tiles span several waves re-reads K/V from
  HBM in each wave unless its K/V (times the heads in flight) stays resident in the usable L2.
  Then K/V cross HBM ``kv_passes`` = 1 time (resident or a single wave), else once per wave, and
  the total approaches the compulsory traffic (Q, K, V, O once): at 8K on an H100 that is
  8.4 MB per head, 65x below naive. The L2 size and SM count come from ``data/hardware.yaml``.

FLOPs for the roofline: 2 Nq Nk d for QK^T plus 2 Nq Nk dv for PV over the visible pairs
(:func:`attention_flops`); softmax exponentials are counted apart (they run on the SFU, not the
tensor cores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lib.inputs import fraction, integer, real
from lib.registry.dtypes import bytes_per_element

__all__ = [
    "AttentionTraffic",
    "L2Traffic",
    "attention_flops",
    "compulsory_traffic",
    "flash_block_sizes",
    "naive_hbm_bytes",
    "naive_traffic",
    "score_matrix_bytes",
    "theorem2_orders",
    "tiled_hbm_bytes",
    "tiled_traffic",
    "tiled_traffic_l2",
    "visible_pairs",
]


def _n_k(n_q: int, n_k: int | None) -> int:
    return n_q if n_k is None else integer("n_k", n_k, 1, unit="keys")


def score_matrix_bytes(n_q: int, n_k: int | None = None, dtype: str = "fp16") -> float:
    """Bytes of one Nq x Nk score (or probability) matrix for one head: Nq Nk b.
    8192 x 8192 in fp16: 134,217,728 B."""
    n_q = integer("n_q", n_q, 1, unit="queries")
    return float(n_q) * _n_k(n_q, n_k) * bytes_per_element(dtype)


def visible_pairs(n_q: int, n_k: int | None = None, causal: bool = False, query_offset: int = 0) -> int:
    """(query, key) pairs attention computes: Nq Nk, or under a causal mask (query i at position
    query_offset + i sees keys j <= query_offset + i) sum_i min(Nk, offset + i + 1)
    (N (N + 1) / 2 for a square mask)."""
    n_q = integer("n_q", n_q, 1, unit="queries")
    n_k = _n_k(n_q, n_k)
    if not causal:
        return n_q * n_k
    off = integer("query_offset", query_offset, 0)
    full_from = max(0, n_k - off)  # rows i >= n_k - off see every key
    ramp = min(n_q, full_from)  # rows 0..ramp-1 see off + i + 1 keys
    return ramp * (off + 1) + ramp * (ramp - 1) // 2 + (n_q - ramp) * n_k


def attention_flops(n_q: int, head_dim: int, n_k: int | None = None, v_dim: int | None = None,
                    causal: bool = False, query_offset: int = 0) -> float:
    """Matmul FLOPs of attention for one head: 2 x pairs x (d + dv) (QK^T and PV, 2 FLOPs per
    multiply-add), pairs = :func:`visible_pairs`. 4 N^2 d for a square non-causal head."""
    d = integer("head_dim", head_dim, 1)
    dv = d if v_dim is None else integer("v_dim", v_dim, 1)
    return 2.0 * visible_pairs(n_q, n_k, causal, query_offset) * (d + dv)


@dataclass(frozen=True)
class AttentionTraffic:
    """HBM bytes of one head's attention, by tensor (reads plus writes of each) and in total.

    ``kv_passes``: how many times K and V cross HBM (1 = compulsory); ``score_bytes``: traffic of
    the Nq x Nk score/probability matrices (0 when tiled); ``stats_bytes``: running max/sum or LSE.
    """

    schedule: str
    q_bytes: float
    k_bytes: float
    v_bytes: float
    o_bytes: float
    score_bytes: float
    stats_bytes: float
    read_bytes: float
    write_bytes: float
    kv_passes: float

    @property
    def total_bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def naive_traffic(n_q: int, head_dim: int, dtype: str = "fp16", *, n_k: int | None = None,
                  score_dtype: str | None = None, score_writes: int = 2, score_reads: int = 2
                  ) -> AttentionTraffic:
    """Naive attention's HBM traffic per head (Algorithm 0 of the FlashAttention paper by default).

    reads  = (Nq d + 2 Nk d) b + score_reads Nq Nk b_s     (Q, K, V; S read by softmax, P by PV)
    writes = Nq d b + score_writes Nq Nk b_s               (O; S and P written)
    Other accountings are the same formula with other counts (a softmax that overwrites S in place
    and a 3-pass softmax: writes 2, reads 3). ``score_dtype`` defaults to ``dtype``.
    """
    n_q = integer("n_q", n_q, 1, unit="queries")
    n_k = _n_k(n_q, n_k)
    d = integer("head_dim", head_dim, 1)
    b = bytes_per_element(dtype)
    bs = bytes_per_element(score_dtype or dtype)
    sw, sr = integer("score_writes", score_writes, 0), integer("score_reads", score_reads, 0)
    q, k, v, o = n_q * d * b, n_k * d * b, n_k * d * b, n_q * d * b
    scores = float(n_q) * n_k * bs * (sw + sr)
    return AttentionTraffic("naive", q, k, v, o, scores, 0.0, q + k + v + float(n_q) * n_k * bs * sr,
                            o + float(n_q) * n_k * bs * sw, 1.0)


def flash_block_sizes(head_dim: int, sram_bytes: float, dtype: str = "fp16") -> tuple[int, int]:
    """(Br, Bc) of FlashAttention Algorithm 1 for an SRAM of M = sram_bytes / b elements:
    Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)."""
    d = integer("head_dim", head_dim, 1)
    m = real("sram_bytes", sram_bytes, 0, low_open=True, unit="bytes") / bytes_per_element(dtype)
    bc = math.ceil(m / (4 * d))
    return min(bc, d), bc


def _causal_kv_rows(n_q: int, n_k: int, block_q: int, block_k: int, offset: int) -> int:
    """Key rows read over all query blocks when tiles above the causal diagonal are skipped."""
    starts = np.arange(0, n_q, block_q)
    last_pos = np.minimum(starts + block_q, n_q) - 1 + offset  # last row's position in each block
    visible = np.minimum(n_k, last_pos + 1)  # keys the block's last row sees
    return int(np.minimum(n_k, -(-visible // block_k) * block_k).sum())  # whole key tiles


def tiled_traffic(n_q: int, head_dim: int, block_q: int = 128, block_k: int = 128, dtype: str = "fp16", *,
                  n_k: int | None = None, schedule: str = "fa2", causal: bool = False, query_offset: int = 0,
                  stats_dtype: str = "fp32") -> AttentionTraffic:
    """Textbook HBM traffic of tiled attention per head (every K/V tile request goes to HBM).

    fa2 (query blocks outside, Tr = ceil(Nq / Br)):
        reads = Nq d b + Tr (2 Nk d b),  writes = Nq d b + Nq b_stats (O and the LSE)
      with ``causal``, query block i reads only the key tiles up to its last row's position
      (query i at position query_offset + i, as in :func:`visible_pairs`; 0 = torch's is_causal).
    fa1 (key blocks outside, Tc = ceil(Nk / Bc), Algorithm 1 incl. the initial O, l, m writes):
        reads = 2 Nk d b + Tc (2 Nq d b + 2 Nq b_stats),  writes = (Tc + 1)(Nq d b + 2 Nq b_stats)
    The default Br = Bc = 128 is the query/key tile of FA2's forward at head_dim 128.
    """
    n_q = integer("n_q", n_q, 1, unit="queries")
    n_k = _n_k(n_q, n_k)
    d = integer("head_dim", head_dim, 1)
    br, bc = integer("block_q", block_q, 1), integer("block_k", block_k, 1)
    b, bst = bytes_per_element(dtype), bytes_per_element(stats_dtype)
    if schedule == "fa2":
        tr = math.ceil(n_q / br)
        off = integer("query_offset", query_offset, 0)
        kv_rows = _causal_kv_rows(n_q, n_k, br, bc, off) if causal else tr * n_k
        q, o, stats = n_q * d * b, n_q * d * b, n_q * bst
        k = v = float(kv_rows) * d * b
        return AttentionTraffic("fa2", q, k, v, o, 0.0, stats, q + k + v, o + stats, kv_rows / n_k)
    if schedule == "fa1":
        if causal:
            raise ValueError("causal=True is modelled for schedule='fa2' only")
        tc = math.ceil(n_k / bc)
        k = v = float(n_k) * d * b
        q = tc * n_q * d * b
        o = (2 * tc + 1) * n_q * d * b
        stats = (4 * tc + 2) * n_q * bst
        reads = k + v + tc * (2 * n_q * d * b + 2 * n_q * bst)
        writes = (tc + 1) * (n_q * d * b + 2 * n_q * bst)
        return AttentionTraffic("fa1", q, k, v, o, 0.0, stats, reads, writes, 1.0)
    raise ValueError(f"schedule must be 'fa2' or 'fa1', got {schedule!r}")


def compulsory_traffic(n_q: int, head_dim: int, dtype: str = "fp16", *, n_k: int | None = None,
                       stats_dtype: str = "fp32") -> AttentionTraffic:
    """The floor: Q, K, V read once, O and the LSE written once: (Nq d + 2 Nk d + Nq d) b + Nq b_stats."""
    n_q = integer("n_q", n_q, 1, unit="queries")
    n_k = _n_k(n_q, n_k)
    one_block = tiled_traffic(n_q, head_dim, n_q, n_k, dtype, n_k=n_k, stats_dtype=stats_dtype)
    return replace(one_block, schedule="compulsory")


def naive_hbm_bytes(n_q: int, head_dim: int, dtype: str = "fp16", **kwargs) -> float:
    """Total HBM bytes (reads + writes) of naive attention per head: :func:`naive_traffic`."""
    return naive_traffic(n_q, head_dim, dtype, **kwargs).total_bytes


def tiled_hbm_bytes(n_q: int, head_dim: int, block_q: int = 128, block_k: int = 128, dtype: str = "fp16",
                    **kwargs) -> float:
    """Total HBM bytes (reads + writes) of textbook tiled attention per head: :func:`tiled_traffic`."""
    return tiled_traffic(n_q, head_dim, block_q, block_k, dtype, **kwargs).total_bytes


def theorem2_orders(n: int, head_dim: int, sram_bytes: float, dtype: str = "fp16") -> dict[str, float]:
    """The growth terms of Theorem 2 (FlashAttention paper) in elements: naive N d + N^2, tiled
    N^2 d^2 / M with M = sram_bytes / b elements (constants dropped: compare shapes, not values)."""
    n = integer("n", n, 1)
    d = integer("head_dim", head_dim, 1)
    m = real("sram_bytes", sram_bytes, 0, low_open=True, unit="bytes") / bytes_per_element(dtype)
    return {"naive": float(n) * d + float(n) ** 2, "tiled": float(n) ** 2 * d**2 / m}


@dataclass(frozen=True)
class L2Traffic(AttentionTraffic):
    """:class:`AttentionTraffic` of the L2 model plus the quantities that decided it."""

    textbook_kv_passes: float  # Tr: K/V tile requests per key tile (what reaches L2)
    concurrent_tiles: int  # query tiles running at once on the GPU
    heads_in_flight: int  # (batch, head) pairs those tiles belong to
    waves_per_head: int  # waves one head's query tiles span
    kv_bytes_per_head: float  # 2 Nk d b
    l2_usable_bytes: float
    kv_resident: bool  # heads_in_flight x kv_bytes_per_head <= usable L2

    @property
    def l2_hit_rate(self) -> float:
        """Fraction of K/V tile requests the L2 serves: 1 - kv_passes / textbook passes."""
        return 1.0 - self.kv_passes / self.textbook_kv_passes


def tiled_traffic_l2(n_q: int, head_dim: int, block_q: int = 128, block_k: int = 128, dtype: str = "fp16",
                     *, n_k: int | None = None, batch_heads: int = 1, gpu: str | None = None,
                     l2_bytes: float | None = None, sm_count: int | None = None, tiles_per_sm: int = 1,
                     l2_usable_fraction: float = 0.5, lockstep: bool = True,
                     stats_dtype: str = "fp32") -> L2Traffic:
    """HBM traffic of tiled (FA2-order, non-causal) attention per head when K/V re-reads can hit in L2.

    concurrent = SMs x ``tiles_per_sm`` (SMs and L2 from ``gpu``, or ``sm_count`` / ``l2_bytes``);
    Tr = ceil(Nq / Br) query tiles per head, launched head by head (query-block index fastest, as
    FA2's grid does); heads_in_flight = min(batch_heads, ceil(concurrent / Tr));
    waves_per_head = ceil(Tr / concurrent); kv_bytes_per_head = 2 Nk d b;
    resident = heads_in_flight x kv_bytes_per_head <= l2_usable_fraction x L2.

        kv_passes = 1                 if resident, or waves_per_head = 1 and ``lockstep``
                  = waves_per_head    if not resident and ``lockstep`` (one fetch per wave)
                  = Tr                otherwise (no sharing: the textbook count)

    K and V bytes = kv_passes x Nk d b each; Q, O and the LSE as in the FA2 count. Assumptions, all
    parameters: one query tile per SM (``tiles_per_sm``); half the L2 usable for sharing
    (``l2_usable_fraction``: NVIDIA's A100/H100 L2 is two partitions, each caching for the SMs
    attached to it, so data all SMs read may sit in both); co-running tiles of one head advance
    through K/V together (``lockstep``), so a K/V tile is in L2 when the laggards ask for it.
    Real kernels sit between this and the textbook count; profilers report the measured value.
    """
    from lib.registry.hardware import gpu as get_gpu

    n_q = integer("n_q", n_q, 1, unit="queries")
    n_k = _n_k(n_q, n_k)
    d = integer("head_dim", head_dim, 1)
    br = integer("block_q", block_q, 1)
    batch_heads = integer("batch_heads", batch_heads, 1)
    tiles_per_sm = integer("tiles_per_sm", tiles_per_sm, 1)
    usable = fraction("l2_usable_fraction", l2_usable_fraction, allow_zero=False)
    chip = get_gpu(gpu) if gpu is not None else None
    if l2_bytes is None:
        if chip is None:
            raise ValueError("give gpu (a name from data/hardware.yaml) or l2_bytes")
        l2_bytes = chip.l2_bytes
    l2_bytes = real("l2_bytes", l2_bytes, 0, low_open=True, unit="bytes")
    if sm_count is None:
        if chip is None:
            raise ValueError("give gpu (a name from data/hardware.yaml) or sm_count")
        sm_count = chip.compute_units
    sm_count = integer("sm_count", sm_count, 1)
    base = tiled_traffic(n_q, d, br, block_k, dtype, n_k=n_k, stats_dtype=stats_dtype)
    b = bytes_per_element(dtype)
    tr = math.ceil(n_q / br)
    concurrent = sm_count * tiles_per_sm
    heads_in_flight = min(batch_heads, math.ceil(concurrent / tr))
    waves = math.ceil(tr / concurrent)
    kv_head = 2.0 * n_k * d * b
    usable_bytes = usable * l2_bytes
    resident = heads_in_flight * kv_head <= usable_bytes
    if resident or (lockstep and waves == 1):
        passes = 1
    elif lockstep:
        passes = waves
    else:
        passes = tr
    k = v = float(passes) * n_k * d * b
    return L2Traffic("fa2+l2", base.q_bytes, k, v, base.o_bytes, 0.0, base.stats_bytes,
                     base.q_bytes + k + v, base.write_bytes, float(passes), float(tr), concurrent,
                     heads_in_flight, waves, kv_head, usable_bytes, resident)
