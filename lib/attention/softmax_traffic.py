"""Naive attention's HBM traffic per head for each way its softmax can be written.

Unfused attention is three kernels over the score matrix: QK^T writes S (one write per score),
the softmax reads S and writes P, and PV reads P (one read per score). What the softmax kernel
itself costs per score depends on how it is written (:func:`lib.attention.online_softmax.softmax_io`):

    softmax kernel   its reads  its writes   whole attention, per score element
    three_pass           3          1        4 reads (3 + PV), 2 writes (QK^T + 1): 6 accesses
    online               2          1        3 reads, 2 writes: 5 accesses
    row_on_chip          1          1        2 reads, 2 writes: 4 (FlashAttention paper, Algorithm 0)

``row_on_chip`` is a softmax kernel that loads a whole row into on-chip memory once, so its
passes never go back to HBM: possible only while a row fits on chip. Fused attention
(FlashAttention) writes no score at all; its traffic is Q, K, V, O and the K/V re-reads,
:func:`lib.attention.traffic.tiled_traffic` (textbook) or :func:`~lib.attention.traffic.compulsory_traffic`
(the floor). Every byte count goes through :func:`lib.attention.traffic.naive_traffic`, the one home
of naive attention's traffic; this module only supplies the read and write counts.
"""

from __future__ import annotations

from lib.inputs import integer

from .online_softmax import softmax_io
from .traffic import AttentionTraffic, naive_traffic

__all__ = ["SOFTMAX_KERNELS", "naive_traffic_by_softmax", "score_accesses_per_element"]

SOFTMAX_KERNELS = ("three_pass", "online", "row_on_chip")
"""Ways an unfused softmax kernel can be written (see the module docstring)."""


def score_accesses_per_element(softmax: str = "three_pass") -> tuple[int, int]:
    """(reads, writes) of each score element over the whole unfused attention: the softmax kernel's
    own (``softmax_io`` per element, or 1 and 1 for ``row_on_chip``) plus S written by QK^T and P
    read by PV."""
    if softmax not in SOFTMAX_KERNELS:
        raise ValueError(f"softmax must be one of {', '.join(SOFTMAX_KERNELS)}, got {softmax!r}")
    if softmax == "row_on_chip":
        reads, writes = 1, 1
    else:
        io = softmax_io(1, softmax)
        reads, writes = io.reads, io.writes
    return reads + 1, writes + 1


def naive_traffic_by_softmax(n_q: int, head_dim: int, softmax: str = "three_pass", dtype: str = "fp16", *,
                             n_k: int | None = None, score_dtype: str | None = None) -> AttentionTraffic:
    """HBM bytes of one head's unfused attention whose softmax kernel is ``softmax``:

        reads  = (Nq d + 2 Nk d) b + r Nq Nk b_s,   writes = Nq d b + w Nq Nk b_s

    with (r, w) = :func:`score_accesses_per_element` ((4, 2), (3, 2) or (2, 2)); ``score_dtype``
    (default ``dtype``) is how S and P are stored (many unfused kernels keep them in FP32).
    """
    integer("n_q", n_q, 1, unit="queries")
    reads, writes = score_accesses_per_element(softmax)
    return naive_traffic(n_q, head_dim, dtype, n_k=n_k, score_dtype=score_dtype,
                         score_reads=reads, score_writes=writes)
