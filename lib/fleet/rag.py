"""A retrieval-augmented generation fleet: embedder, sharded vector index, reranker, answer model (N058).

* **Encoders** (embedder, cross-encoder reranker) are sized from tokens, not queries. One token of
  an encoder of ``L`` layers and width ``d`` costs ``2 x 12 L d^2`` FLOP of matmuls (the matmul
  parameters; embedding tables are lookups) plus ``4 L c d`` of bidirectional attention over a
  sequence of ``c`` tokens (:func:`encoder_flops_per_token`; shape ``fleet.rag_encoder_layers`` /
  ``fleet.rag_encoder_hidden``). A fleet of them: tokens/s x FLOP/token / (dense BF16 peak x
  ``fleet.encoder_mfu``) / utilization GPUs (:func:`encoder_fleet`). One request's pass takes
  ``max(tokens x FLOP/token / (peak x MFU), matmul weight bytes / HBM bandwidth)``
  (:func:`encoder_pass_s`). The reranker scores ``candidates`` (query, passage) pairs per query:
  it is sized from pairs x pair tokens.
* **The vector index** is sharded by memory (``vectors x bytes per vector / fleet.ann_shard_bytes``
  shards) and replicated by queries (``rate / fleet.ann_qps_per_replica / utilization`` replicas of
  each shard) (:func:`index_fleet`). A query fans out to every shard and waits for the slowest: the
  q-quantile of the max of ``S`` shards is each shard's ``q^(1/S)`` quantile, each shard's latency a
  lognormal through ``fleet.ann_shard_p50_s`` and ``fleet.ann_shard_p99_s`` (:func:`fanout_quantile_s`).
* **The answer model** is :func:`lib.fleet.sizing_chain.fleet_chain` at the rate the cache lets
  through, with the TTFT target the latency budget leaves it.
* **The latency budget** (:func:`rag_fleet`): the gateway (``fleet.gateway_processing_s``), one
  routing hop per stage (``fleet.routing_s``), the embedder's pass, the index fan-out at its
  quantile, the reranker's pass over the query's pairs; what remains of the end-to-end
  time-to-first-token budget is the answer model's TTFT target. Adding the stages' quantiles is
  conservative for independent light-tailed stages (both would have to hit their tails on the same query),
  though quantiles are not additive in general.
* **The cache** is a semantic answer cache consulted after the embedder: a hit returns a stored
  answer and skips the index, the reranker and the answer model, so those three scale with
  ``1 - hit rate``. :func:`hit_rate_for_nodes` is the hit rate that brings the answer tier to a
  node count.

SI units: seconds, tokens, FLOP, FLOP/s, bytes, requests per second, US dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.registry import assumptions

__all__ = ["EncoderFleet", "IndexFleet", "RagFleet", "encoder_flops_per_token", "encoder_fleet", "encoder_matmul_params",
           "encoder_pass_s", "fanout_quantile_s", "hit_rate_for_nodes", "index_fleet", "rag_fleet"]


def _shape(layers, hidden) -> tuple[int, int]:
    lay = integer("layers", assumptions.resolve(layers, "fleet.rag_encoder_layers"), 1)
    hid = integer("hidden", assumptions.resolve(hidden, "fleet.rag_encoder_hidden"), 1)
    return lay, hid


def encoder_matmul_params(layers: int | None = None, hidden: int | None = None) -> float:
    """12 L d^2: Q, K, V, O (4 d^2) and a 4x FFN (8 d^2) per layer."""
    lay, hid = _shape(layers, hidden)
    return 12.0 * lay * hid * hid


def encoder_flops_per_token(seq_tokens: int, layers: int | None = None, hidden: int | None = None) -> float:
    """FLOP per token of an encoder pass over ``seq_tokens``: 2 x 12 L d^2 + 4 L c d (module doc)."""
    lay, hid = _shape(layers, hidden)
    c = integer("seq_tokens", seq_tokens, 1, unit="tokens")
    return 2.0 * encoder_matmul_params(lay, hid) + 4.0 * lay * c * hid


def _peak(chip, mfu):
    from lib.registry.hardware import gpu

    g = gpu(chip)
    m = fraction("mfu", assumptions.resolve(mfu, "fleet.encoder_mfu"), allow_zero=False)
    return g, g.peak_flops("bf16") * m


def encoder_pass_s(tokens: int, seq_tokens: int, chip, mfu: float | None = None) -> float:
    """One pass over ``tokens`` tokens (sequences of ``seq_tokens``) on one GPU: compute at the MFU or the
    BF16 matmul weights' read, whichever is longer."""
    g, flops = _peak(chip, mfu)
    n = integer("tokens", tokens, 1, unit="tokens")
    return max(n * encoder_flops_per_token(seq_tokens) / flops, 2.0 * encoder_matmul_params() / g.memory_bandwidth)


@dataclass(frozen=True)
class EncoderFleet:
    """GPUs for ``tokens_per_s`` of an encoder on ``chip`` (module doc)."""

    role: str
    tokens_per_s: float
    seq_tokens: int
    chip: str
    gpu_flops_per_s: float  # dense BF16 peak x MFU
    flops_per_token: float
    utilization: float
    usd_per_gpu_hour: float

    @property
    def flops_per_s(self) -> float:
        return self.tokens_per_s * self.flops_per_token

    @property
    def gpus_exact(self) -> float:
        return self.flops_per_s / self.gpu_flops_per_s / self.utilization

    @property
    def gpus(self) -> int:
        return 0 if self.tokens_per_s == 0 else max(1, math.ceil(self.gpus_exact - 1e-9))

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.usd_per_gpu_hour


def encoder_fleet(role: str, tokens_per_s: float, seq_tokens: int, chip, mfu: float | None = None,
                  utilization: float | None = None) -> EncoderFleet:
    """GPUs an encoder fleet needs: tokens/s x FLOP/token / (peak x MFU) / utilization."""
    from lib.fleet.capacity import default_utilization, gpu_hour_usd

    g, flops = _peak(chip, mfu)
    t = real("tokens_per_s", tokens_per_s, 0, unit="tokens/s")
    return EncoderFleet(str(role), t, integer("seq_tokens", seq_tokens, 1), g.key, flops,
                        encoder_flops_per_token(seq_tokens), default_utilization(utilization), gpu_hour_usd(g.key))


def fanout_quantile_s(shards: int, q: float = 0.99, p50_s: float | None = None, p99_s: float | None = None) -> float:
    """q-quantile of the slowest of ``shards`` independent shard searches: each shard's lognormal
    (through its p50 and p99) at ``q ** (1 / shards)``."""
    from statistics import NormalDist

    s = integer("shards", shards, 1)
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    p50 = real("p50_s", assumptions.resolve(p50_s, "fleet.ann_shard_p50_s"), 0, low_open=True, unit="seconds")
    p99 = real("p99_s", assumptions.resolve(p99_s, "fleet.ann_shard_p99_s"), 0, low_open=True, unit="seconds")
    if p99 < p50:
        raise ValueError(f"p99_s = {p99} must be at least p50_s = {p50}")
    nd = NormalDist()
    sigma = math.log(p99 / p50) / nd.inv_cdf(0.99)
    return p50 * math.exp(sigma * nd.inv_cdf(q ** (1.0 / s)))


@dataclass(frozen=True)
class IndexFleet:
    """A sharded, replicated vector index (module doc)."""

    rate: float
    n_vectors: float
    bytes_per_vector: float
    shard_bytes: float
    qps_per_replica: float
    utilization: float

    @property
    def index_bytes(self) -> float:
        return self.n_vectors * self.bytes_per_vector

    @property
    def shards(self) -> int:
        return max(1, math.ceil(self.index_bytes / self.shard_bytes - 1e-9))

    @property
    def replicas_per_shard(self) -> int:
        """Every query visits every shard, so each shard's replicas carry the whole rate."""
        return 0 if self.rate == 0 else max(1, math.ceil(self.rate / self.qps_per_replica / self.utilization - 1e-9))

    @property
    def hosts(self) -> int:
        return self.shards * self.replicas_per_shard


def index_fleet(rate: float, n_vectors: float, bytes_per_vector: float, shard_bytes: float | None = None,
                qps_per_replica: float | None = None, utilization: float | None = None) -> IndexFleet:
    """Shards by memory, replicas by queries (module doc)."""
    from lib.fleet.capacity import default_utilization

    return IndexFleet(real("rate", rate, 0, unit="queries/s"), real("n_vectors", n_vectors, 1),
                      real("bytes_per_vector", bytes_per_vector, 0, low_open=True, unit="bytes"),
                      real("shard_bytes", assumptions.resolve(shard_bytes, "fleet.ann_shard_bytes"), 0, low_open=True,
                           unit="bytes"),
                      real("qps_per_replica", assumptions.resolve(qps_per_replica, "fleet.ann_qps_per_replica"), 0,
                           low_open=True, unit="queries/s"),
                      default_utilization(utilization))


@dataclass(frozen=True)
class RagFleet:
    """The four tiers at one query rate and cache hit rate, and the latency budget (module doc)."""

    rate: float
    hit_rate: float
    embedder: EncoderFleet
    index: IndexFleet
    reranker: EncoderFleet
    llm: object  # lib.fleet.sizing_chain.FleetChain at the miss rate
    stages: tuple  # ((name, seconds), ...) before the answer model
    ttft_budget_s: float
    llm_ttft_s: float  # what the budget leaves the answer model
    fanout_s: float
    candidates: int
    pair_tokens: int

    @property
    def miss_rate(self) -> float:
        return self.rate * (1 - self.hit_rate)

    @property
    def pairs_per_s(self) -> float:
        return self.miss_rate * self.candidates

    @property
    def llm_nodes(self) -> int:
        return self.llm.nodes

    @property
    def usd_per_hour(self) -> float:
        """GPU tiers only (embedder, reranker, answer model); index hosts are CPU machines, priced apart."""
        return self.embedder.usd_per_hour + self.reranker.usd_per_hour + self.llm.usd_per_hour


def rag_fleet(dep, rate: float, hit_rate: float, query_tokens: int, candidates: int, pair_tokens: int, prompt_len: int,
              cached_len: int, output_len: int, tpot_target_s: float, ttft_budget_s: float, n_vectors: float,
              bytes_per_vector: float, encoder_gpu, q: float = 0.99, utilization: float | None = None,
              seed: int = 0) -> RagFleet:
    """Size the four tiers for ``rate`` queries/s with a cache ``hit_rate`` (module doc). ``dep``: the
    answer model's replica; ``encoder_gpu``: the chip of the embedder and reranker."""
    from lib.fleet.capacity import default_utilization
    from lib.fleet.sizing_chain import fleet_chain

    lam = real("rate", rate, 0, low_open=True, unit="queries/s")
    h = real("hit_rate", hit_rate, 0, 1, high_open=True)
    qt = integer("query_tokens", query_tokens, 1, unit="tokens")
    k = integer("candidates", candidates, 1, unit="pairs per query")
    pt = integer("pair_tokens", pair_tokens, 2, unit="tokens")
    tb = real("ttft_budget_s", ttft_budget_s, 0, low_open=True, unit="seconds")
    u = default_utilization(utilization)
    miss = lam * (1 - h)
    emb = encoder_fleet("embedder", lam * qt, qt, encoder_gpu, utilization=u)
    idx = index_fleet(miss, n_vectors, bytes_per_vector, utilization=u)
    rer = encoder_fleet("reranker", miss * k * pt, pt, encoder_gpu, utilization=u)
    fan = fanout_quantile_s(idx.shards, q)
    hop = float(assumptions.value("fleet.routing_s"))
    stages = (("gateway", float(assumptions.value("fleet.gateway_processing_s"))),
              ("routing hops (4)", 4 * hop),
              ("embed the query", encoder_pass_s(qt, qt, encoder_gpu)),
              (f"index fan-out to {idx.shards} shards (p{100 * q:g})", fan),
              (f"rerank {k} pairs", encoder_pass_s(k * pt, pt, encoder_gpu)))
    left = tb - sum(s for _, s in stages)
    if left <= 0:
        raise ValueError(f"the stages before the answer model take {sum(s for _, s in stages):.3g} s, the whole "
                         f"{tb:.3g} s budget: raise ttft_budget_s or rerank fewer candidates")
    llm = fleet_chain(dep, miss, prompt_len, output_len, cached_len, tpot_target_s, left, q, utilization=u, seed=seed)
    return RagFleet(lam, h, emb, idx, rer, llm, stages, tb, left, fan, k, pt)


def hit_rate_for_nodes(fleet: RagFleet, target_nodes: int) -> float:
    """The smallest cache hit rate at which the answer tier fits ``target_nodes`` nodes (same replica,
    same SLO pair; bisection to 1e-4). 0 when it already fits."""
    n = integer("target_nodes", target_nodes, 1, unit="nodes")
    whole = fleet.llm.at_rate(fleet.rate)

    def nodes(h: float) -> int:
        return whole.at_rate(max(fleet.rate * (1 - h), 1e-9)).nodes

    if nodes(0.0) <= n:
        return 0.0
    lo, hi = 0.0, 1.0 - 1e-9
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if nodes(mid) <= n else (mid, hi)
    return hi
