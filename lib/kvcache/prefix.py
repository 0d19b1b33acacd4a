"""Prefix caching by the numbers, and the checkers the prefix-cache notebooks run.

Builds on the reference implementations in :mod:`lib.kvcache` (used, never changed):

* **Recompute vs fetch** (I013). Recomputing a cached prefix of ``P`` tokens costs its prefill,
  ``F(P) = 2N P + a P (P + 1) / 2`` FLOP (``a`` = attention FLOPs per query-key pair); fetching
  it costs ``P * kv_bytes_per_token`` bytes over some link. The model's FLOPs per KV byte against
  the GPU's achieved FLOP/s per link byte/s decides: the break-even link bandwidth is
  ``W* = peak * mfu / (F(P) / (P * kv_bytes_per_token))`` per GPU (compute-bound, no latency).
  This module is the single source of that arithmetic; :mod:`lib.kvcache.tiering` (I018) calls it for
  its replica-level view of HBM, host DRAM and SSD tiers.
* **Storage tiers** (``data/storage_tiers.yaml`` plus the link figures already in
  ``data/hardware.yaml``): per-GPU bandwidth and fixed latency of each place KV can be fetched from.
* **Hit-rate and savings accounting** (N027): replay a trace through
  :class:`lib.kvcache.RadixCache`; closed forms for shared-prompt and multi-turn-chat traces; a
  brute-force oracle (longest common prefix with every earlier request); prefill FLOPs with a
  cached prefix.
* **Radix-tree tools** (I090): a text rendering of the tree, scripted operation scenarios, an
  oracle check (longest common prefix over all stored sequences, slot provenance, slot
  accounting, pins) and two defective variants that the check catches.
* **Block-cache tools** (I092, I014): a KV-provenance oracle for
  :class:`lib.kvcache.PrefixBlockCache`, weak and unchained hashes, a colliding-block finder, the
  birthday bound, KV bytes per block and the pool size in blocks.

Everything is SI inside: FLOP, FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.kvcache import (
    CacheAllocation,
    OutOfSlots,
    PrefixBlockCache,
    RadixCache,
    branching_agent_trace,
    hash_block,
    multi_turn_chat_trace,
)
from lib.kvcache.radix import RadixNode
from lib.perf.memory import default_memory_utilization, kv_free_bytes_per_gpu
from lib.perf.memory import fact as memory_fact
from lib.perf.roofline import kv_shard_fraction, weight_bytes_read_per_step
from lib.registry.data import load_yaml, unknown_name
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.units import GB

__all__ = [
    "BlockCacheRun",
    "DefectiveRadixCache",
    "HitTrace",
    "KVProvenanceOracle",
    "OracleReport",
    "PrefillSavings",
    "PrefixAccounting",
    "RADIX_SCENARIOS",
    "RadixOp",
    "RadixStep",
    "RecomputeVsFetch",
    "StorageTier",
    "WORKLOADS",
    "available_tiers",
    "birthday_collision_probability",
    "breakeven_bandwidth",
    "breakeven_bandwidth_closed_form",
    "breakeven_prefix_tokens",
    "brute_force_hits",
    "chat_prefix_accounting",
    "compare_recompute_fetch",
    "fetch_time_s",
    "find_colliding_block",
    "flops_per_kv_byte",
    "kv_block_bytes",
    "kv_pool_blocks",
    "longest_common_prefix",
    "pass_time_s",
    "prefill_flops_with_cached_prefix",
    "prefill_savings",
    "radix_oracle_check",
    "radix_scenario",
    "recompute_flops",
    "recompute_flops_per_token",
    "recompute_time_s",
    "render_radix_tree",
    "replay_radix",
    "run_block_cache",
    "shared_prompt_hit_rate",
    "simulate_radix_hits",
    "storage_tier",
    "tier_names",
    "truncated_hash",
    "unchained_hash",
    "unrelated_trace",
    "workload_trace",
]


# ---- validation helpers ------------------------------------------------------------------


def _tp(m: Model, tp: object) -> int:
    tp = integer("tp", tp, 1)
    if m.num_attention_heads % tp:
        raise ValueError(
            f"tp={tp} must divide the {m.num_attention_heads} attention heads of {m.key}"
        )
    return tp


# ---- recompute vs fetch: FLOPs and bytes ---------------------------------------------------


def recompute_flops(mdl: str | Model, prefix_len: int) -> float:
    """FLOPs to recompute a prefix of ``prefix_len`` tokens: its causal prefill, whole replica.

    F(P) = 2N P + a P (P + 1) / 2 (``Model.prefill_flops``); 0 for an empty prefix.
    """
    m = model(mdl)
    p = integer("prefix_len", prefix_len, 0)
    return 0.0 if p == 0 else m.prefill_flops(p)


def recompute_flops_per_token(mdl: str | Model, prefix_len: int) -> float:
    """Average prefill FLOPs per prefix token, F(P) / P = 2N + a (P + 1) / 2 (FLOP per token).

    Grows with the prefix because each token attends to all the tokens before it.
    """
    p = integer("prefix_len", prefix_len, 1)
    return recompute_flops(mdl, p) / p


def flops_per_kv_byte(mdl: str | Model, prefix_len: int, kv_dtype: str = "bf16") -> float:
    """The one ratio: recompute FLOPs per byte of KV a fetch moves, (F(P) / P) / kv_bytes_per_token.

    Tensor parallelism divides both the FLOPs and (up to the KV-head count) the bytes, so the
    ratio is per replica. Fetching wins on a link of ``W`` bytes/s when this ratio exceeds
    (achieved FLOP/s) / W.
    """
    m = model(mdl)
    return recompute_flops_per_token(m, prefix_len) / m.kv_bytes_per_token(kv_dtype)


def prefill_flops_with_cached_prefix(mdl: str | Model, prompt_len: int, cached_len: int) -> float:
    """FLOPs to prefill positions ``cached_len + 1 .. prompt_len`` when the first ``cached_len``
    tokens' KV is cached: (L - h) 2N + a (L (L + 1) - h (h + 1)) / 2.

    The uncached tokens still attend to the cached ones. prefill_flops(L) minus this is exactly
    F(h), the prefix's own prefill: causal attention never looks forward. Returns 0 when h = L.
    """
    m = model(mdl)
    length = integer("prompt_len", prompt_len, 0)
    h = integer("cached_len", cached_len, 0)
    if h > length:
        raise ValueError(f"cached_len ({h}) must be <= prompt_len ({length})")
    a = m.attention_flops_per_token(1)
    return (length - h) * m.weight_flops_per_token() + a * (length * (length + 1) - h * (h + 1)) / 2


# ---- storage tiers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageTier:
    """A place a prefix's KV can be fetched from, seen from one GPU.

    ``peak_bandwidth`` (bytes/s per GPU, one direction) x ``efficiency`` = ``bandwidth`` achieved
    by a bulk copy; ``latency_s`` is the fixed cost of one fetch.
    """

    key: str
    name: str
    peak_bandwidth: float
    efficiency: float
    latency_s: float
    source: str

    @property
    def bandwidth(self) -> float:
        """Achieved bytes/s per GPU."""
        return self.peak_bandwidth * self.efficiency


def _tiers_doc() -> dict:
    return load_yaml("storage_tiers.yaml")


def tier_names() -> list[str]:
    """Keys of ``data/storage_tiers.yaml`` tiers, fastest link first."""
    return list(_tiers_doc()["tiers"])


def _host_link_bandwidth(g: GPU) -> tuple[float, str]:
    doc = _tiers_doc()["host_link"]
    if g.key not in doc:
        raise ValueError(f"no host-link entry for {g.key} in data/storage_tiers.yaml")
    entry = doc[g.key]
    if "host_link_gbps" in entry:
        return float(entry["host_link_gbps"]) * GB, entry.get("note", "host link")
    gen = int(entry["pcie_gen"])
    std = load_yaml("hardware.yaml")["interconnect_standards"].get(f"pcie_gen{gen}_x16")
    if std is None:
        raise ValueError(f"hardware.yaml has no pcie_gen{gen}_x16 entry")
    return float(std["unidirectional_gbps"]["value"]) * GB, f"PCIe Gen{gen} x16 per direction"


def storage_tier(name: str, chip: str | GPU) -> StorageTier:
    """Tier ``name`` as seen from one ``chip``: link bandwidth from hardware.yaml where it lives
    there (NVLink per direction, NIC per GPU, PCIe/host link), else from storage_tiers.yaml."""
    g = gpu(chip)
    tiers = _tiers_doc()["tiers"]
    if name not in tiers:
        raise unknown_name("storage tier", name, list(tiers))
    raw = tiers[name]
    link = raw["link"]
    if link == "nvlink":
        if not g.scaleup_bandwidth:
            raise ValueError(
                f"{g.name} has no NVLink-class link: tier {name!r} does not exist there"
            )
        peak, what = g.scaleup_bandwidth, "NVLink per direction (hardware.yaml)"
    elif link == "rdma":
        if not g.scaleout_bandwidth:
            raise ValueError(
                f"hardware.yaml lists no network (NIC) bandwidth for {g.name}: tier {name!r} unavailable"
            )
        peak, what = g.scaleout_bandwidth, "NIC per GPU (hardware.yaml)"
    elif link == "host":
        peak, what = _host_link_bandwidth(g)
    elif link == "fixed":
        peak = float(raw["bandwidth_gbps"]["value"]) * GB * float(raw["devices_per_gpu"]["value"])
        what = "storage_tiers.yaml"
    else:  # pragma: no cover - data error
        raise ValueError(f"tier {name!r} has unknown link kind {link!r}")
    return StorageTier(
        key=name,
        name=raw["name"],
        peak_bandwidth=peak,
        efficiency=float(raw["efficiency"]["value"]),
        latency_s=float(raw["latency_us"]["value"]) * 1e-6,
        source=what,
    )


def available_tiers(chip: str | GPU) -> list[StorageTier]:
    """Every tier that exists for ``chip`` (a GPU without NVLink has no peer tier, etc.)."""
    out = []
    for name in tier_names():
        try:
            out.append(storage_tier(name, chip))
        except ValueError:
            continue
    return out


# ---- recompute vs fetch: time -------------------------------------------------------------------


def _pass_kw(tp: int, mfu: float, weight_dtype: str, compute_dtype: str, kv_dtype: str) -> dict:
    """The pass settings every recompute-vs-fetch function forwards to :func:`pass_time_s`."""
    return dict(
        tp=tp, mfu=mfu, weight_dtype=weight_dtype, compute_dtype=compute_dtype, kv_dtype=kv_dtype
    )


def _as_tier(tier: str | StorageTier, chip: str | GPU) -> StorageTier:
    """A StorageTier as given, or the named tier of ``data/storage_tiers.yaml`` seen from ``chip``."""
    return tier if isinstance(tier, StorageTier) else storage_tier(tier, chip)


def pass_time_s(
    mdl: str | Model,
    chip: str | GPU,
    new_tokens: int,
    cached_tokens: int = 0,
    *,
    tp: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Time of one prefill pass over ``new_tokens`` with ``cached_tokens`` already cached, seconds.

    max(FLOPs / (tp x peak x mfu), bytes per GPU / HBM bandwidth), FLOPs from
    :func:`prefill_flops_with_cached_prefix`, bytes = weights / tp + KV of the whole context
    (read by attention, the new part written) x shard fraction. 0 when ``new_tokens`` = 0.
    """
    m, g = model(mdl), gpu(chip)
    tp = _tp(m, tp)
    mfu = fraction("mfu", mfu, allow_zero=False)
    new = integer("new_tokens", new_tokens, 0)
    cached = integer("cached_tokens", cached_tokens, 0)
    if new == 0:
        return 0.0
    flops = prefill_flops_with_cached_prefix(m, cached + new, cached)
    compute = flops / (tp * g.peak_flops(compute_dtype) * mfu)
    weights = weight_bytes_read_per_step(m, new, weight_dtype) / tp
    kv = (cached + new) * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    return max(compute, (weights + kv) / g.memory_bandwidth)


def recompute_time_s(
    mdl: str | Model,
    chip: str | GPU,
    prefix_len: int,
    *,
    suffix_len: int = 0,
    tp: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Extra prefill time of recomputing a ``prefix_len`` prefix instead of reusing its KV, seconds.

    pass(P + S new) - pass(S new after P cached): the prefix alone (S = 0) costs its whole
    prefill; riding along with a suffix it costs only what it adds to that pass, which is about
    nothing while the pass is memory-bound (the weights are read once either way).
    """
    kw = _pass_kw(tp, mfu, weight_dtype, compute_dtype, kv_dtype)
    p = integer("prefix_len", prefix_len, 0)
    s = integer("suffix_len", suffix_len, 0)
    return pass_time_s(mdl, chip, p + s, 0, **kw) - pass_time_s(mdl, chip, s, p, **kw)


def fetch_time_s(
    mdl: str | Model, prefix_len: int, tier: StorageTier, *, tp: int = 1, kv_dtype: str = "bf16"
) -> float:
    """Time to fetch a prefix's KV from ``tier``: latency + P x kv_bytes_per_token x shard / bandwidth.

    Each of the ``tp`` GPUs fetches its own shard over its own link, in parallel.
    """
    m = model(mdl)
    tp = _tp(m, tp)
    p = integer("prefix_len", prefix_len, 0)
    if not isinstance(tier, StorageTier):
        raise ValueError(f"tier must be a StorageTier (see storage_tier()), got {tier!r}")
    if p == 0:
        return 0.0
    per_gpu = p * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    return tier.latency_s + per_gpu / tier.bandwidth


def breakeven_bandwidth(
    mdl: str | Model,
    chip: str | GPU,
    prefix_len: int,
    *,
    latency_s: float = 0.0,
    suffix_len: int = 0,
    tp: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Per-GPU link bandwidth (bytes/s) above which fetching beats recomputing the prefix.

    W* = P x kv_bytes_per_token x shard / (recompute_s - latency); infinite when the recompute
    takes no longer than the fetch latency alone (no link is fast enough).
    """
    m = model(mdl)
    p = integer("prefix_len", prefix_len, 1)
    lat = real("latency_s", latency_s, 0)
    t = recompute_time_s(
        m, chip, p, suffix_len=suffix_len, **_pass_kw(tp, mfu, weight_dtype, compute_dtype, kv_dtype)
    )
    if t <= lat:
        return math.inf
    return p * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp) / (t - lat)


def achieved_flops_per_s(
    chip: str | GPU, tp: int = 1, compute_dtype: str = "bf16", mfu: float = 1.0
) -> float:
    """Prefill FLOP/s a replica of ``tp`` GPUs sustains: C = tp x dense peak(compute_dtype) x mfu."""
    tp = integer("tp", tp, 1)
    return tp * gpu(chip).peak_flops(compute_dtype) * fraction("mfu", mfu, allow_zero=False)


def breakeven_bandwidth_closed_form(
    mdl: str | Model,
    chip: str | GPU,
    prefix_len: int,
    *,
    tp: int = 1,
    mfu: float = 1.0,
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """W* in the compute-bound, zero-latency limit, bytes/s per GPU:

    W* = C x shard / flops_per_kv_byte, C = :func:`achieved_flops_per_s` = tp x peak x mfu
    (= peak x mfu / flops_per_kv_byte while tp <= KV heads). One division: the replica's achieved
    FLOP/s over the model's FLOPs per KV byte, times the share of each token one GPU fetches.
    It is also the rate at which a replica prefilling flat out creates KV, per GPU.
    """
    m = model(mdl)
    tp = _tp(m, tp)
    ratio = flops_per_kv_byte(m, prefix_len, kv_dtype)
    return achieved_flops_per_s(chip, tp, compute_dtype, mfu) * kv_shard_fraction(m, tp) / ratio


def breakeven_prefix_tokens_closed_form(
    mdl: str | Model,
    chip: str | GPU,
    bandwidth: float,
    *,
    latency_s: float = 0.0,
    tp: int = 1,
    mfu: float = 1.0,
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Prefix length P* (tokens) where a compute-bound recompute ties with a fetch over a per-GPU
    link of ``bandwidth`` bytes/s with fixed ``latency_s``; recompute wins below it.

    F(P) / C = L + P b s / W, F(P) = 2N P + a P (P + 1) / 2 (C = :func:`achieved_flops_per_s`,
    b s = KV bytes per token one GPU fetches), i.e. A P^2 + B P - L = 0 with A = a / (2C),
    B = (2N + a / 2) / C - b s / W. No weight-read floor (a recompute riding in a pass that
    runs anyway); :func:`breakeven_prefix_tokens` prices the whole pass. Returns 0 when fetching
    wins at every length and ``math.inf`` when recompute always wins (no attention term and
    B <= 0 with L > 0, or B < 0).
    """
    m = model(mdl)
    tp = _tp(m, tp)
    c = achieved_flops_per_s(chip, tp, compute_dtype, mfu)
    w = real("bandwidth", bandwidth, 0, low_open=True, unit="bytes/s")
    t0 = real("latency_s", latency_s, 0)
    a_coef = m.attention_flops_per_token(1) / (2 * c)
    b_coef = (m.weight_flops_per_token() + m.attention_flops_per_token(1) / 2) / c - (
        m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp) / w
    )
    if a_coef == 0:
        if b_coef <= 0:
            return math.inf if (t0 > 0 or b_coef < 0) else 0.0
        return t0 / b_coef
    root = (-b_coef + math.sqrt(b_coef * b_coef + 4 * a_coef * t0)) / (2 * a_coef)
    return max(root, 0.0)


@dataclass(frozen=True)
class RecomputeVsFetch:
    """One prefix, one tier: both costs and the bandwidth at which they tie."""

    tier: str
    prefix_len: int
    recompute_s: float
    fetch_s: float
    breakeven_bandwidth: float  # bytes/s per GPU, at this tier's latency
    tier_bandwidth: float  # bytes/s per GPU, achieved

    @property
    def speedup(self) -> float:
        """recompute_s / fetch_s: above 1 fetching wins by that factor."""
        return math.inf if self.fetch_s == 0 else self.recompute_s / self.fetch_s

    @property
    def winner(self) -> str:
        return "fetch" if self.fetch_s < self.recompute_s else "recompute"


def compare_recompute_fetch(
    mdl: str | Model,
    chip: str | GPU,
    prefix_len: int,
    tier: str | StorageTier,
    *,
    suffix_len: int = 0,
    tp: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> RecomputeVsFetch:
    """Recompute time, fetch time from ``tier`` and the break-even bandwidth at its latency."""
    t = _as_tier(tier, chip)
    kw = _pass_kw(tp, mfu, weight_dtype, compute_dtype, kv_dtype)
    rec = recompute_time_s(mdl, chip, prefix_len, suffix_len=suffix_len, **kw)
    fetch = fetch_time_s(mdl, prefix_len, t, tp=tp, kv_dtype=kv_dtype)
    w = breakeven_bandwidth(
        mdl, chip, prefix_len, latency_s=t.latency_s, suffix_len=suffix_len, **kw
    )
    return RecomputeVsFetch(t.key, prefix_len, rec, fetch, w, t.bandwidth)


def breakeven_prefix_tokens(
    mdl: str | Model,
    chip: str | GPU,
    tier: str | StorageTier,
    *,
    suffix_len: int = 0,
    tp: int = 1,
    mfu: float = 1.0,
    weight_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    max_tokens: int = 2**22,
) -> float:
    """Shortest prefix (tokens) whose fetch from ``tier`` is faster than its recompute.

    Doubles P until fetch_s < recompute_s, then bisects (the gap grows with P once the pass is
    compute-bound). Returns 1 if even one token is faster to fetch, inf if none up to max_tokens.
    With ``suffix_len`` = 0 a standalone pass charges the whole weight read to the prefix, which
    makes tiny prefixes look expensive to recompute; a request with new tokens (>= 1) pays that
    read anyway, so pass its ``suffix_len`` for the realistic threshold.
    """
    t = _as_tier(tier, chip)
    kw = dict(suffix_len=suffix_len, **_pass_kw(tp, mfu, weight_dtype, compute_dtype, kv_dtype))
    limit = integer("max_tokens", max_tokens, 1)

    def fetch_wins(p: int) -> bool:
        return fetch_time_s(mdl, p, t, tp=tp, kv_dtype=kv_dtype) < recompute_time_s(
            mdl, chip, p, **kw
        )

    if fetch_wins(1):
        return 1.0
    lo, hi = 1, 2
    while not fetch_wins(hi):
        if hi >= limit:
            return math.inf
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fetch_wins(mid) else (mid, hi)
    return float(hi)


# ---- hit-rate and savings accounting ----------------------------------------------------------

WORKLOADS = ("unrelated", "shared_prompt", "multi_turn_chat", "branching_agent")


def unrelated_trace(
    num_requests: int, prompt_tokens: int, *, vocab_size: int = 128_000, seed: int = 0
) -> list[tuple[int, ...]]:
    """``num_requests`` prompts of ``prompt_tokens`` uniform random tokens: no intended sharing.

    With vocabulary V, two prompts share a first token with probability 1/V (the only hits).
    """
    n = integer("num_requests", num_requests, 1)
    length = integer("prompt_tokens", prompt_tokens, 1)
    v = integer("vocab_size", vocab_size, 1)
    rng = np.random.default_rng(seed)
    return [tuple(row) for row in rng.integers(0, v, (n, length)).tolist()]


def workload_trace(
    kind: str,
    *,
    num_requests: int,
    system_prompt_tokens: int,
    turn_tokens: int,
    num_turns: int = 4,
    vocab_size: int = 128_000,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """The four traces of N027 with one set of knobs (token counts per request comparable):

    * unrelated: system_prompt_tokens + turn_tokens random tokens each, nothing shared;
    * shared_prompt: one shared system prompt + turn_tokens of user text per request;
    * multi_turn_chat: num_requests // num_turns conversations of num_turns turns, each turn
      adding turn_tokens (a quarter user, the rest the model's reply), interleaved;
    * branching_agent: each request extends a random earlier one by turn_tokens (a tool call and
      its output), restarting from the system prompt at depth num_turns.
    """
    if kind not in WORKLOADS:
        raise ValueError(f"kind must be one of {', '.join(WORKLOADS)}, got {kind!r}")
    n = integer("num_requests", num_requests, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    k = integer("turn_tokens", turn_tokens, 1)
    turns = integer("num_turns", num_turns, 1)
    if kind == "unrelated":
        return unrelated_trace(n, s + k, vocab_size=vocab_size, seed=seed)
    if kind == "shared_prompt":
        return multi_turn_chat_trace(
            n,
            1,
            system_prompt_tokens=s,
            user_tokens=k,
            reply_tokens=0,
            vocab_size=vocab_size,
            seed=seed,
        )
    if kind == "multi_turn_chat":
        user = max(k // 4, 1) if k > 1 else 1
        return multi_turn_chat_trace(
            max(n // turns, 1),
            turns,
            system_prompt_tokens=s,
            user_tokens=user,
            reply_tokens=k - user,
            vocab_size=vocab_size,
            seed=seed,
        )
    return branching_agent_trace(
        n, system_prompt_tokens=s, step_tokens=k, max_depth=turns, vocab_size=vocab_size, seed=seed
    )


@dataclass(frozen=True)
class HitTrace:
    """Per-request outcome of :func:`simulate_radix_hits` (tokens)."""

    prompt_tokens: tuple[int, ...]
    hit_tokens: tuple[int, ...]
    cached_tokens_peak: int  # most tokens held in the tree at once
    unique_tokens: int  # tokens in the tree at the end (= distinct prefixes if nothing was evicted)
    evicted_tokens: int
    num_nodes: int  # radix nodes at the end (edges), against unique_tokens for a plain trie

    @property
    def hit_rate(self) -> float:
        """Token hit rate: sum(hit) / sum(prompt)."""
        total = sum(self.prompt_tokens)
        return sum(self.hit_tokens) / total if total else 0.0

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


def simulate_radix_hits(
    requests: Sequence[Sequence[int]], num_slots: int | None = None, *, token_scale: int = 1
) -> HitTrace:
    """Replay ``requests`` one at a time through ``RadixCache(num_slots)``: match, then insert.

    ``num_slots`` None = room for every token (no eviction). ``token_scale`` multiplies every
    reported token count (a trace whose tokens each stand for that many real tokens; hit rates are
    unchanged when all lengths scale together). Raises OutOfSlots (a ValueError) if one request
    is longer than the pool.
    """
    reqs = [tuple(r) for r in requests]
    if not reqs:
        raise ValueError("requests must hold at least one token sequence")
    scale = integer("token_scale", token_scale, 1)
    unbounded = num_slots is None
    slots = (sum(len(r) for r in reqs) or 1) if unbounded else integer("num_slots", num_slots, 1)
    cache = RadixCache(slots)
    hits, prompts, peak, evicted = [], [], 0, 0
    for r in reqs:
        if not r:
            hits.append(0)
            prompts.append(0)
            continue
        before = cache.num_cached_tokens
        if unbounded:  # nothing is evicted: the tokens insert adds are exactly the misses
            cache.insert(r)
            hit = len(r) - (cache.num_cached_tokens - before)
        else:
            hit = cache.match_prefix(r).num_tokens
            cache.insert(r)
            evicted += before + (len(r) - hit) - cache.num_cached_tokens
        peak = max(peak, cache.num_cached_tokens)
        hits.append(hit * scale)
        prompts.append(len(r) * scale)
    return HitTrace(
        tuple(prompts),
        tuple(hits),
        peak * scale,
        cache.num_cached_tokens * scale,
        evicted * scale,
        sum(1 for _ in cache.nodes()),
    )


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def brute_force_hits(requests: Sequence[Sequence[int]]) -> list[int]:
    """Oracle for an unbounded prefix cache: request k hits max over j < k of LCP(r_k, r_j).

    No tree: compares every pair (O(n^2 L)); an independent check of :func:`simulate_radix_hits`.
    """
    arrays = [np.asarray(r) for r in requests]
    out = []
    for k, r in enumerate(arrays):
        best = 0
        for prev in arrays[:k]:
            if best == len(r):
                break
            best = max(best, longest_common_prefix(r, prev))
        out.append(best)
    return out


def shared_prompt_hit_rate(num_requests: int, system_prompt_tokens: int, user_tokens: int) -> float:
    """Closed form, unbounded cache: every request but the first hits the S-token system prompt.

    hit rate = (n - 1) S / (n (S + U)).
    """
    n = integer("num_requests", num_requests, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    u = integer("user_tokens", user_tokens, 0)
    return 0.0 if s + u == 0 else (n - 1) * s / (n * (s + u))


@dataclass(frozen=True)
class PrefixAccounting:
    """Token totals of a trace under an unbounded prefix cache."""

    hit_tokens: int
    prompt_tokens: int
    unique_tokens: int  # KV a prefix cache keeps: each distinct prefix once

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def chat_prefix_accounting(
    num_conversations: int,
    num_turns: int,
    system_prompt_tokens: int,
    user_tokens: int,
    reply_tokens: int,
) -> PrefixAccounting:
    """Closed form for ``multi_turn_chat_trace`` with an unbounded cache (k = user + reply):

    prompt tokens = C (T S + k T (T + 1) / 2); hits = (C - 1) S + C ((T - 1) S + k T (T - 1) / 2)
    (turn t re-reads turn t - 1 whole; each conversation's first turn hits only the system
    prompt, the very first request nothing); unique = S + C T k.
    """
    c = integer("num_conversations", num_conversations, 1)
    t = integer("num_turns", num_turns, 1)
    s = integer("system_prompt_tokens", system_prompt_tokens, 0)
    k = integer("user_tokens", user_tokens, 0) + integer("reply_tokens", reply_tokens, 0)
    prompt = c * (t * s + k * t * (t + 1) // 2)
    hits = (c - 1) * s + c * ((t - 1) * s + k * t * (t - 1) // 2)
    return PrefixAccounting(hits, prompt, s + c * t * k)


@dataclass(frozen=True)
class PrefillSavings:
    """Prefill work of a trace without and with its prefix hits (FLOP, whole replica)."""

    flops_without: float
    flops_with: float
    tokens_without: int
    tokens_with: int

    @property
    def flops_saved(self) -> float:
        return self.flops_without - self.flops_with

    @property
    def fraction_saved(self) -> float:
        return self.flops_saved / self.flops_without if self.flops_without else 0.0


def prefill_savings(
    mdl: str | Model, prompt_lens: Sequence[int], hit_lens: Sequence[int]
) -> PrefillSavings:
    """Sum over requests of F(L) (no cache) and of the prefill with h cached tokens.

    A full hit still runs the last prompt token (its logits give the first output token; vLLM
    and SGLang do this), so h is capped at L - 1.
    """
    m = model(mdl)
    if len(prompt_lens) != len(hit_lens):
        raise ValueError(
            f"prompt_lens ({len(prompt_lens)}) and hit_lens ({len(hit_lens)}) differ in length"
        )
    without = with_ = 0.0
    t_without = t_with = 0
    for length, hit in zip(prompt_lens, hit_lens, strict=True):
        length = integer("prompt length", length, 0)
        hit = integer("hit length", hit, 0)
        if hit > length:
            raise ValueError(f"a hit ({hit}) cannot exceed its prompt ({length})")
        if length == 0:
            continue
        h = min(hit, length - 1)
        without += m.prefill_flops(length)
        with_ += prefill_flops_with_cached_prefix(m, length, h)
        t_without += length
        t_with += length - h
    return PrefillSavings(without, with_, t_without, t_with)


# ---- radix tree: rendering, scenarios, oracle, defects ----------------------------------------


def _ranges(slots: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    if not slots:
        return "-"
    parts, start, prev = [], slots[0], slots[0]
    for s in list(slots[1:]) + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ",".join(parts)


def _edge_label(tokens: Sequence[int], max_tokens: int) -> str:
    shown = " ".join(map(str, tokens[:max_tokens]))
    more = len(tokens) - max_tokens
    return f"[{shown}{f' …+{more}' if more > 0 else ''}]"


def render_radix_tree(cache: RadixCache, *, max_tokens_shown: int = 8) -> list[str]:
    """The tree as text, one line per node (children in token order):

    ``├─ [1 2 3] slots 0-2 · lock 1 · t=3``: edge tokens, their KV slots, lock count (pinned by
    running requests) and last access time (the LRU clock).
    """
    if not isinstance(cache, RadixCache):
        raise ValueError(f"cache must be a RadixCache, got {type(cache).__name__}")
    max_tokens_shown = integer("max_tokens_shown", max_tokens_shown, 1)
    lines = [
        f"root ({cache.num_cached_tokens} cached, {cache.num_free_slots} free of {cache.num_slots})"
    ]

    def walk(node: RadixNode, prefix: str) -> None:
        kids = [node.children[k] for k in sorted(node.children)]
        for i, child in enumerate(kids):
            last = i == len(kids) - 1
            lock = f" · lock {child.lock_count}" if child.lock_count else ""
            lines.append(
                f"{prefix}{'└─ ' if last else '├─ '}{_edge_label(child.tokens, max_tokens_shown)}"
                f" slots {_ranges(child.slots)}{lock} · t={child.last_access}"
            )
            walk(child, prefix + ("   " if last else "│  "))

    walk(cache.root, "")
    return lines


@dataclass(frozen=True)
class RadixOp:
    """One scripted operation: insert/match ``tokens``, lock/unlock the node step ``ref`` returned,
    or evict ``count`` tokens."""

    kind: str
    tokens: tuple[int, ...] = ()
    ref: int = 0
    count: int = 0

    def describe(self) -> str:
        if self.kind in ("insert", "match"):
            return f"{self.kind} {_edge_label(self.tokens, 12)}"
        if self.kind in ("lock", "unlock"):
            return f"{self.kind} the node step {self.ref} returned"
        return f"evict {self.count} tokens"


def _radix_scenarios() -> dict[str, tuple[str, list[RadixOp]]]:
    ins = lambda *t: RadixOp("insert", tuple(t))  # noqa: E731
    match = lambda *t: RadixOp("match", tuple(t))  # noqa: E731
    chat = multi_turn_chat_trace(
        3, 3, system_prompt_tokens=4, user_tokens=2, reply_tokens=2, vocab_size=10, seed=0
    )
    agent = branching_agent_trace(
        10, system_prompt_tokens=4, step_tokens=3, max_depth=3, vocab_size=10, seed=1
    )
    return {
        "edge_split": (
            "inserts that diverge inside an edge split it; a match that ends inside one splits too",
            [
                ins(1, 2, 3, 4, 5, 6),
                ins(1, 2, 3, 7, 8),
                match(1, 2, 9),
                ins(1, 2, 3, 4, 5, 6, 10, 11),
                ins(4, 4),
                match(1, 2, 3, 4, 5, 6, 10, 11, 12),
            ],
        ),
        "pin_and_evict": (
            "a running request pins its path; eviction skips it until it is unlocked",
            [
                ins(1, 2, 3, 4, 5),
                RadixOp("lock", ref=1),
                ins(1, 2, 3, 8, 9),
                ins(6, 6, 6, 6),
                ins(7, 7, 7, 7),
                RadixOp("unlock", ref=1),
                RadixOp("evict", count=5),
            ],
        ),
        "evict_cascade": (
            "leaves go first, LRU order; a parent whose last child left becomes a leaf in turn",
            [
                ins(1, 2, 3, 4),
                ins(1, 2, 3, 5),
                ins(1, 2, 6),
                ins(9, 9),
                match(9, 9),
                RadixOp("evict", count=1),
                RadixOp("evict", count=2),
                RadixOp("evict", count=3),
            ],
        ),
        "chat": (
            "a 3-conversation, 3-turn chat trace (4-token system prompt)",
            [RadixOp("insert", r) for r in chat],
        ),
        "agent": (
            "a branching agent trace: each request extends an earlier one",
            [RadixOp("insert", r) for r in agent],
        ),
    }


RADIX_SCENARIOS = tuple(_radix_scenarios())


def radix_scenario(name: str) -> tuple[str, list[RadixOp]]:
    """(description, operations) of a scripted scenario; names in ``RADIX_SCENARIOS``."""
    scenarios = _radix_scenarios()
    if name not in scenarios:
        raise unknown_name("radix scenario", name, list(scenarios))
    return scenarios[name]


@dataclass(frozen=True)
class RadixStep:
    """State after one operation (step 0 = the empty cache)."""

    index: int
    op: str
    result: str
    tree: tuple[str, ...]
    num_cached: int
    num_free: int
    num_pinned: int
    slot_state: tuple[str, ...]  # per slot: 'free', 'cached' or 'pinned'


def _slot_state(cache: RadixCache) -> tuple[str, ...]:
    state = ["free"] * cache.num_slots
    for node in cache.nodes():
        for s in node.slots:
            state[s] = "pinned" if node.lock_count else "cached"
    return tuple(state)


def replay_radix(
    ops: Sequence[RadixOp], num_slots: int, upto: int | None = None
) -> list[RadixStep]:
    """Run ``ops`` on a fresh ``RadixCache(num_slots)``; the state after each (steps 0..upto).

    Failures (OutOfSlots, unlocking an unlocked node) are reported in the step's result, not
    raised, so a reader can see them.
    """
    n = integer("num_slots", num_slots, 1)
    upto = len(ops) if upto is None else min(integer("upto", upto, 0), len(ops))
    cache = RadixCache(n)
    returned: dict[int, RadixNode] = {}

    def snap(i: int, op: str, result: str) -> RadixStep:
        return RadixStep(
            i,
            op,
            result,
            tuple(render_radix_tree(cache)),
            cache.num_cached_tokens,
            cache.num_free_slots,
            cache.num_pinned_tokens,
            _slot_state(cache),
        )

    steps = [snap(0, "start", "empty cache")]
    for i, op in enumerate(ops[:upto], start=1):
        try:
            if op.kind == "insert":
                hit = cache.match_prefix(op.tokens).num_tokens
                m = cache.insert(op.tokens)
                returned[i] = m.node
                result = f"reused {hit} tokens, new slots {_ranges(m.slots[hit:])}"
            elif op.kind == "match":
                m = cache.match_prefix(op.tokens)
                returned[i] = m.node
                result = f"matched {m.num_tokens} tokens, slots {_ranges(m.slots)}"
            elif op.kind in ("lock", "unlock"):
                if op.ref not in returned:
                    raise ValueError(f"step {op.ref} returned no node")
                getattr(cache, op.kind)(returned[op.ref])
                result = f"{op.kind}ed; pinned tokens now {cache.num_pinned_tokens}"
            elif op.kind == "evict":
                freed = cache.evict(op.count)
                result = f"freed {freed} tokens"
            else:
                raise ValueError(f"unknown operation {op.kind!r}")
        except ValueError as err:
            result = f"{type(err).__name__}: {err}"
        steps.append(snap(i, op.describe(), result))
    return steps


class DefectiveRadixCache(RadixCache):
    """RadixCache with one classic bug, for the oracle to catch.

    * ``split_keeps_slots``: an edge split gives the new upper node the first slots but forgets
      to cut them from the lower node, so two nodes own them and both free them (a double free).
    * ``evict_ignores_pins``: eviction takes any leaf, locked or not, so a running request's
      KV slots go back to the pool and are handed to the next insert.
    """

    DEFECTS = ("split_keeps_slots", "evict_ignores_pins")

    def __init__(self, num_slots: int, defect: str) -> None:
        if defect not in self.DEFECTS:
            raise ValueError(f"defect must be one of {', '.join(self.DEFECTS)}, got {defect!r}")
        super().__init__(num_slots)
        self.defect = defect

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        if self.defect != "split_keeps_slots":
            return super()._split(child, at)
        upper = self._new_node(child.tokens[:at], child.slots[:at], parent=child.parent)
        upper.lock_count, upper.last_access = child.lock_count, child.last_access
        child.parent.children[child.tokens[0]] = upper
        child.tokens, child.parent = child.tokens[at:], upper  # BUG: child.slots not cut
        upper.children[child.tokens[0]] = child
        return upper

    def evict(self, num_tokens: int) -> int:
        if self.defect != "evict_ignores_pins":
            return super().evict(num_tokens)
        num_tokens = integer("num_tokens", num_tokens, 0)
        heap = [
            (n.last_access, n.node_id, n) for n in self.nodes() if not n.children
        ]  # BUG: no lock check
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            self._free_slots.extend(reversed(leaf.slots))
            self._num_cached_tokens -= len(leaf.tokens)
            freed += len(leaf.tokens)
            leaf.evicted, leaf.parent = True, None
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed


class _PrefixIds:
    """Exact ids for token prefixes: id(t_0..t_i) = table[(id(t_0..t_{i-1}), t_i)].

    Equal ids <=> equal prefixes (a dict keyed by the actual values, so no collisions), at O(1)
    per token instead of comparing whole prefixes. ``unit`` > 1 interns whole blocks.
    """

    def __init__(self) -> None:
        self._table: dict[tuple[int, tuple[int, ...] | int], int] = {}

    def of(self, tokens: Sequence[int], unit: int = 1) -> list[int]:
        """Id of every prefix ending at a unit boundary (and of the whole sequence)."""
        out, parent = [], -1
        for start in range(0, len(tokens), unit):
            piece = tokens[start] if unit == 1 else tuple(tokens[start : start + unit])
            parent = self._table.setdefault((parent, piece), len(self._table))
            out.append(parent)
        return out


@dataclass(frozen=True)
class OracleReport:
    """Outcome of :func:`radix_oracle_check`."""

    requests: int
    checks: int
    hit_tokens: int
    prompt_tokens: int
    evicted_tokens: int
    violations: tuple[str, ...]
    skipped: int = 0  # requests that did not fit beside the pinned ones (OutOfSlots)

    @property
    def ok(self) -> bool:
        return not self.violations


def radix_oracle_check(
    requests: Sequence[Sequence[int]],
    num_slots: int | None = None,
    *,
    running: int = 4,
    cache_factory: Callable[[int], RadixCache] = RadixCache,
    max_violations: int = 5,
) -> OracleReport:
    """Replay ``requests`` with up to ``running`` of them pinned at a time; check every step.

    Before each insert: match length = max LCP over ``cached_sequences()`` (brute force); with
    ``num_slots`` None (no eviction) also = max LCP over every earlier request; every matched
    slot still holds the token prefix it was filled with (slot provenance, tracked here). After
    each insert: no slot free twice, free + cached = pool, no running request's slot free,
    the tree's edge lengths sum to the cached count. Stops after ``max_violations``.
    """
    reqs = [tuple(r) for r in requests]
    if not reqs or any(not r for r in reqs):
        raise ValueError("requests must be non-empty token sequences")
    run = integer("running", running, 1)
    limit = integer("max_violations", max_violations, 1)
    unbounded = num_slots is None
    slots = sum(len(r) for r in reqs) if unbounded else integer("num_slots", num_slots, 1)
    cache = cache_factory(slots)
    owner: dict[int, int] = {}  # slot -> id of the token prefix its KV was filled with
    prefix_ids = _PrefixIds()
    live: deque[tuple[int, list[int], RadixNode, tuple[int, ...]]] = deque()
    violations: list[str] = []
    checks = hits = prompt = evicted = skipped = 0

    def fail(msg: str) -> bool:
        violations.append(msg)
        return len(violations) >= limit

    for k, r in enumerate(reqs):
        try:
            expected = max(
                (longest_common_prefix(r, s) for s in cache.cached_sequences()), default=0
            )
            m = cache.match_prefix(r)
            checks += 1
            if m.num_tokens != expected:
                if fail(
                    f"request {k}: matched {m.num_tokens} tokens, brute force over stored sequences says {expected}"
                ):
                    break
            if unbounded:
                best = max((longest_common_prefix(r, s) for s in reqs[:k]), default=0)
                checks += 1
                if m.num_tokens != best and fail(
                    f"request {k}: matched {m.num_tokens} tokens, LCP with earlier requests is {best}"
                ):
                    break
            ids = prefix_ids.of(r)
            bad = [i for i, s in enumerate(m.slots) if i >= len(r) or owner.get(s) != ids[i]]
            checks += 1
            if bad and fail(
                f"request {k}: {len(bad)} matched slot(s) hold KV of another prefix"
                f" (first at position {bad[0]})"
            ):
                break
            before = cache.num_cached_tokens
            try:
                ins = cache.insert(r)
            except OutOfSlots:
                skipped += 1  # every unpinned token is gone and this request still does not fit
                continue
            hit = min(m.num_tokens, len(r))
            evicted += before + (len(r) - hit) - cache.num_cached_tokens
            hits += hit
            prompt += len(r)
            for i in range(hit, len(r)):
                if i < len(ins.slots):
                    owner[ins.slots[i]] = ids[i]
            cache.lock(ins.node)
            live.append((k, ids, ins.node, tuple(ins.slots)))
            free = cache.free_slots()
            free_set = set(free)
            checks += 5
            msgs = []
            if len(free_set) != len(free):
                msgs.append(f"after request {k}: a slot is in the free pool twice (double free)")
            if len(free_set) + cache.num_cached_tokens != slots:
                msgs.append(
                    f"after request {k}: free ({len(free_set)}) + cached"
                    f" ({cache.num_cached_tokens}) != pool ({slots})"
                )
            for rk, rids, _, rslots in live:
                if free_set & set(rslots):
                    msgs.append(
                        f"after request {k}: running request {rk} has KV slots in the free pool"
                    )
                    break
                if any(owner.get(s) != rids[i] for i, s in enumerate(rslots)):
                    msgs.append(
                        f"after request {k}: running request {rk}'s KV slots were handed to another"
                        " sequence (evicted while pinned)"
                    )
                    break
            if sum(len(n.tokens) for n in cache.nodes()) != cache.num_cached_tokens:
                msgs.append(f"after request {k}: edge lengths do not sum to the cached count")
            if any(fail(msg) for msg in msgs):
                break
            if len(live) > run:
                _, _, node, _ = live.popleft()
                cache.unlock(node)
        except ValueError as err:  # e.g. unlocking a node a defective eviction removed
            if fail(f"request {k}: {type(err).__name__}: {err}"):
                break
    return OracleReport(len(reqs), checks, hits, prompt, evicted, tuple(violations), skipped)


# ---- block caches: provenance oracle, hashes, collisions ---------------------------------------


BlockHashFn = Callable[[int | None, tuple[int, ...]], int]


def truncated_hash(bits: int) -> BlockHashFn:
    """A weak chained hash: the low ``bits`` bits of :func:`lib.kvcache.hash_block`.

    With 2^bits values, collisions among n blocks become likely near n ~ 2^(bits/2).
    """
    b = integer("bits", bits, 1, 64, unit="(hash_block gives 64)")
    mask = (1 << b) - 1

    def weak(parent: int | None, block_tokens: tuple[int, ...]) -> int:
        return hash_block(parent, block_tokens) & mask

    weak.__name__ = f"truncated_hash_{b}"
    return weak


def unchained_hash(parent_hash: int | None, block_tokens: tuple[int, ...]) -> int:
    """The classic mistake: hash a block by its own tokens only, ignoring the prefix before it.

    Two prompts with the same block at position i then name it alike, although its KV depends on
    every earlier token.
    """
    return hash_block(None, block_tokens)


def find_colliding_block(
    hash_fn: BlockHashFn,
    block_tokens: Sequence[int],
    *,
    parent_hash: int | None = None,
    vocab_size: int = 1000,
    seed: int = 0,
    max_tries: int = 1_000_000,
) -> tuple[int, ...]:
    """A block of the same length with different tokens but the same ``hash_fn(parent, block)``.

    Random search (seeded); raises ValueError if none is found in ``max_tries`` (a strong hash).
    """
    target_block = tuple(block_tokens)
    if not target_block:
        raise ValueError("block_tokens must hold at least one token")
    tries = integer("max_tries", max_tries, 1)
    v = integer("vocab_size", vocab_size, 2)
    target = hash_fn(parent_hash, target_block)
    rng = np.random.default_rng(seed)
    batch = 4096
    done = 0
    while done < tries:
        for row in rng.integers(0, v, (min(batch, tries - done), len(target_block))).tolist():
            cand = tuple(row)
            if cand != target_block and hash_fn(parent_hash, cand) == target:
                return cand
        done += batch
    raise ValueError(f"no colliding block found in {tries} tries: the hash looks strong enough")


def birthday_collision_probability(num_items: float, hash_bits: int) -> float:
    """P(at least two of n items share a hash of b bits) ~ 1 - exp(-n (n - 1) / 2^(b + 1))."""
    n = real("num_items", num_items, 0)
    b = integer("hash_bits", hash_bits, 1)
    return -math.expm1(-n * (n - 1) / 2.0 ** (b + 1))


class KVProvenanceOracle:
    """Wraps a :class:`lib.kvcache.PrefixBlockCache` and remembers, per block, the exact token
    prefix its KV was computed from. A hit on a block computed from a different prefix is wrong
    KV, whatever the hashes say: KV of block i is a function of tokens 0 .. end of block i.

    Uses only what ``allocate`` returns, never the cache's internals.
    """

    def __init__(self, cache: PrefixBlockCache) -> None:
        if not isinstance(cache, PrefixBlockCache):
            raise ValueError(f"cache must be a PrefixBlockCache, got {type(cache).__name__}")
        self.cache = cache
        self.computed_from: dict[int, int] = {}  # block -> id of the prefix its KV came from
        self._ids = _PrefixIds()
        self.violations: list[str] = []
        self.wrong_requests: set = set()
        self._tokens: dict = {}

    def allocate(self, request_id, tokens: Sequence[int]) -> CacheAllocation:
        """Allocate through the cache; check every hit block's provenance; record fresh ones."""
        tokens = tuple(tokens)
        alloc = self.cache.allocate(request_id, tokens)
        ids = self._ids.of(tokens, self.cache.block_size)
        for i, block in enumerate(alloc.block_ids):
            prefix = ids[i]
            if i < alloc.num_hit_blocks:
                if self.computed_from.get(block) != prefix:
                    self.violations.append(
                        f"request {request_id!r} block {i}: reused block {block}, whose KV was computed"
                        " from a different prefix"
                    )
                    self.wrong_requests.add(request_id)
            else:
                self.computed_from[block] = prefix
        self._tokens[request_id] = tokens
        return alloc

    def free(self, request_id) -> None:
        self.cache.free(request_id)
        self._tokens.pop(request_id, None)

    def payload_matches(self, request_id) -> bool:
        """Whether the request's blocks hold its own tokens (the cache's stand-in for KV)."""
        return self.cache.read_tokens(request_id) == list(self._tokens[request_id])


@dataclass(frozen=True)
class BlockCacheRun:
    """Outcome of :func:`run_block_cache`."""

    hit_tokens: int
    prompt_tokens: int
    wrong_kv_requests: int  # requests handed KV computed from another prefix (provenance oracle)
    payload_mismatches: int  # requests whose blocks hold other tokens (a stricter, visible subset)
    max_stranded_blocks: int
    first_violation: str

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_block_cache(
    requests: Sequence[Sequence[int]],
    *,
    num_blocks: int,
    block_size: int,
    hash_fn: BlockHashFn = hash_block,
    verify_on_hit: bool = True,
    eviction_order: str = "tail_first",
    running: int = 1,
    track_stranded: bool = True,
) -> BlockCacheRun:
    """Replay ``requests`` through a PrefixBlockCache (``running`` at a time, oldest freed first)
    under the provenance oracle; count hits, wrong-KV requests and (if ``track_stranded``, an
    O(cache) scan per request) the most stranded blocks seen."""
    if not isinstance(verify_on_hit, bool):
        raise ValueError(f"verify_on_hit must be True or False, got {verify_on_hit!r}")
    run = integer("running", running, 1)
    cache = PrefixBlockCache(
        num_blocks,
        block_size,
        hash_fn=hash_fn,
        verify_on_hit=verify_on_hit,
        eviction_order=eviction_order,
    )
    oracle = KVProvenanceOracle(cache)
    live: deque[int] = deque()
    hits = prompt = mismatches = stranded = 0
    for k, r in enumerate(requests):
        alloc = oracle.allocate(k, r)
        hits += alloc.num_hit_tokens
        prompt += len(r)
        mismatches += not oracle.payload_matches(k)
        live.append(k)
        if len(live) >= run:
            oracle.free(live.popleft())
        if track_stranded:
            stranded = max(stranded, len(cache.stranded_blocks()))
    return BlockCacheRun(
        hits,
        prompt,
        len(oracle.wrong_requests),
        mismatches,
        stranded,
        oracle.violations[0] if oracle.violations else "",
    )


# ---- KV blocks in bytes -------------------------------------------------------------------------


def kv_block_bytes(
    mdl: str | Model, block_size: int = 16, kv_dtype: str = "bf16", tp: int = 1
) -> float:
    """KV bytes of one block of ``block_size`` tokens: block_size x kv_bytes_per_token x shard.

    tp = 1 gives the whole replica's block (all layers, all KV heads); tp > 1 one GPU's share.
    """
    m = model(mdl)
    bs = integer("block_size", block_size, 1)
    return bs * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, _tp(m, tp))


def kv_pool_blocks(
    mdl: str | Model,
    chip: str | GPU,
    *,
    tp: int = 1,
    block_size: int | None = None,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    memory_utilization: float | None = None,
) -> int:
    """Blocks the KV pool of one replica holds: floor(free / per-GPU block bytes), with free =
    memory x utilization - weights / tp (:func:`lib.perf.memory.kv_free_bytes_per_gpu`). Activations
    and the CUDA context come out of the (1 - utilization) margin. Raises ValueError when the
    weights alone do not fit. None takes vLLM's defaults from ``data/serving_memory.yaml``:
    ``engine_defaults.block_size`` and ``engine_defaults.gpu_memory_utilization``."""
    m, g = model(mdl), gpu(chip)
    tp = _tp(m, tp)
    if block_size is None:
        block_size = memory_fact("block_size")
    util = fraction("memory_utilization", default_memory_utilization(memory_utilization), allow_zero=False)
    free = kv_free_bytes_per_gpu(m, g, tp, weight_dtype, util)
    if free <= 0:
        raise ValueError(
            f"{m.key} in {weight_dtype} needs {m.weight_bytes(weight_dtype) / tp / GB:.1f} GB per GPU at"
            f" tp={tp}; {g.key} offers {g.memory_bytes * util / GB:.1f} GB: raise tp or quantize"
        )
    return int(free // kv_block_bytes(m, block_size, kv_dtype, tp))
