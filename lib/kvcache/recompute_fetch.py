"""Recompute a cached prefix or fetch its KV: the one home of that comparison (I013, I018).

Recomputing a prefix of P tokens is its prefill, priced by :func:`lib.perf.prefill.prefill_time`
(compute at the compute-only MFU, weight read, tensor-parallel all-reduce traffic); fetching it
moves P x kv_bytes_per_token bytes (each GPU its shard) over a storage tier's link. Also here:
the FLOP and byte counts behind the ratio, the tiers of ``data/assumptions.yaml`` (``storage``) seen from one
GPU, and the compute-bound closed forms of the break-even bandwidth and prefix length.
:mod:`lib.kvcache.tiering` adds the node's capacities and SSD wear on top of these functions.
SI units: FLOP, FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.perf.deployment import require
from lib.perf.roofline import kv_shard_fraction
from lib.registry import assumptions
from lib.registry.data import load_yaml, unknown_name
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model
from lib.search import smallest_true
from lib.units import GB

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
    return assumptions.section("storage")


def tier_names() -> list[str]:
    """Keys of ``data/assumptions.yaml`` (``storage``) tiers, fastest link first."""
    return list(_tiers_doc()["tiers"])


def _host_link_bandwidth(g: GPU) -> tuple[float, str]:
    doc = _tiers_doc()["host_link"]
    if g.key not in doc:
        raise ValueError(f"no host-link entry for {g.key} in data/assumptions.yaml (storage)")
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
    there (NVLink per direction, NIC per GPU, PCIe/host link), else from assumptions.yaml (storage)."""
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
        what = "assumptions.yaml (storage)"
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


def _as_tier(tier: str | StorageTier, chip: str | GPU) -> StorageTier:
    """A StorageTier as given, or the named tier of ``data/assumptions.yaml`` (``storage``) seen from ``chip``."""
    return tier if isinstance(tier, StorageTier) else storage_tier(tier, chip)


def recompute_time_s(dep, prefix_len: int, *, suffix_len: int = 0, mfu: float | None = None) -> float:
    """Prefill time a recompute of a ``prefix_len`` prefix adds, seconds: THE recompute price.

    S = 0 (the prefix alone): :func:`lib.perf.prefill.prefill_time` of P tokens on the replica
    ``dep`` (max(compute at the compute-only MFU, weight read) + the TP all-reduce traffic).
    S > 0 (it rides in the pass of S new tokens that runs anyway): prefill_time(P + S) -
    prefill_time(S), about nothing while that pass is memory-bound (the weights are read once
    either way). The difference also charges the suffix's attention to the P keys (a S P FLOP,
    paid with or without the cache), so it leans towards recompute by at most that term.
    ``mfu`` None: ``prefill.prefill_mfu`` in ``data/assumptions.yaml``.
    """
    from lib.perf.prefill import prefill_time

    dep = require(dep)
    p = integer("prefix_len", prefix_len, 0)
    s = integer("suffix_len", suffix_len, 0)
    if p == 0:
        return 0.0
    whole = prefill_time(dep, p + s, mfu=mfu).time_s
    return whole - (prefill_time(dep, s, mfu=mfu).time_s if s else 0.0)


def fetch_time_s(
    mdl: str | Model, prefix_len: int, tier: StorageTier, *, tp: int = 1, kv_dtype: str = "bf16"
) -> float:
    """Time to fetch a prefix's KV from ``tier``: latency + P x kv_bytes_per_token x shard / bandwidth.

    Each of the ``tp`` GPUs fetches its own shard over its own link, in parallel.
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    p = integer("prefix_len", prefix_len, 0)
    if not isinstance(tier, StorageTier):
        raise ValueError(f"tier must be a StorageTier (see storage_tier()), got {tier!r}")
    if p == 0:
        return 0.0
    per_gpu = p * m.kv_bytes_per_token(kv_dtype) * kv_shard_fraction(m, tp)
    return tier.latency_s + per_gpu / tier.bandwidth


def breakeven_bandwidth(
    dep, prefix_len: int, *, latency_s: float = 0.0, suffix_len: int = 0, mfu: float | None = None
) -> float:
    """Per-GPU link bandwidth (bytes/s) above which fetching beats recomputing the prefix.

    W* = P x kv_bytes_per_token x shard / (:func:`recompute_time_s` - latency); infinite when the
    recompute takes no longer than the fetch latency alone (no link is fast enough).
    """
    dep = require(dep)
    m = dep.mdl
    p = integer("prefix_len", prefix_len, 1)
    lat = real("latency_s", latency_s, 0)
    t = recompute_time_s(dep, p, suffix_len=suffix_len, mfu=mfu)
    if t <= lat:
        return math.inf
    return p * m.kv_bytes_per_token(dep.kv_dtype) * kv_shard_fraction(m, dep.tp) / (t - lat)


def achieved_flops_per_s(
    chip: str | GPU, tp: int = 1, compute_dtype: str = "bf16", mfu: float | None = None
) -> float:
    """Prefill FLOP/s a replica of ``tp`` GPUs sustains: C = tp x dense peak(compute_dtype) x mfu,
    the compute term of :func:`lib.perf.prefill.prefill_time` (``mfu`` None: ``prefill.prefill_mfu``)."""
    from lib.perf.prefill import default_mfu

    tp = integer("tp", tp, 1)
    return tp * gpu(chip).peak_flops(compute_dtype) * default_mfu(mfu)


def breakeven_bandwidth_closed_form(
    mdl: str | Model,
    chip: str | GPU,
    prefix_len: int,
    *,
    tp: int = 1,
    mfu: float | None = None,
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """W* in the compute-bound, zero-latency, no-communication limit, bytes/s per GPU:

    W* = C x shard / flops_per_kv_byte, C = :func:`achieved_flops_per_s` = tp x peak x mfu
    (= peak x mfu / flops_per_kv_byte while tp <= KV heads). One division: the replica's achieved
    FLOP/s over the model's FLOPs per KV byte, times the share of each token one GPU fetches.
    It is also the rate at which a replica prefilling flat out creates KV, per GPU. A bound of
    :func:`breakeven_bandwidth`, which adds the weight read and the TP all-reduces.
    """
    m = model(mdl)
    tp = m.check_tp(tp)
    ratio = flops_per_kv_byte(m, prefix_len, kv_dtype)
    return achieved_flops_per_s(chip, tp, compute_dtype, mfu) * kv_shard_fraction(m, tp) / ratio


def breakeven_prefix_tokens_closed_form(
    mdl: str | Model,
    chip: str | GPU,
    bandwidth: float,
    *,
    latency_s: float = 0.0,
    tp: int = 1,
    mfu: float | None = None,
    compute_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> float:
    """Prefix length P* (tokens) where a compute-bound recompute ties with a fetch over a per-GPU
    link of ``bandwidth`` bytes/s with fixed ``latency_s``; recompute wins below it.

    F(P) / C = L + P b s / W, F(P) = 2N P + a P (P + 1) / 2 (C = :func:`achieved_flops_per_s`,
    b s = KV bytes per token one GPU fetches), i.e. A P^2 + B P - L = 0 with A = a / (2C),
    B = (2N + a / 2) / C - b s / W. No weight-read floor and no all-reduce (the compute term of
    :func:`lib.perf.prefill.prefill_time` alone); :func:`breakeven_prefix_tokens` prices the
    whole pass. Returns 0 when fetching wins at every length and ``math.inf`` when recompute
    always wins (no attention term and B <= 0 with L > 0, or B < 0).
    """
    m = model(mdl)
    tp = m.check_tp(tp)
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
    dep, prefix_len: int, tier: str | StorageTier, *, suffix_len: int = 0, mfu: float | None = None
) -> RecomputeVsFetch:
    """Recompute time (:func:`recompute_time_s`), fetch time from ``tier`` and the break-even
    bandwidth at its latency, for the replica ``dep``."""
    dep = require(dep)
    t = _as_tier(tier, dep.chip)
    rec = recompute_time_s(dep, prefix_len, suffix_len=suffix_len, mfu=mfu)
    fetch = fetch_time_s(dep.mdl, prefix_len, t, tp=dep.tp, kv_dtype=dep.kv_dtype)
    w = breakeven_bandwidth(dep, prefix_len, latency_s=t.latency_s, suffix_len=suffix_len, mfu=mfu)
    return RecomputeVsFetch(t.key, prefix_len, rec, fetch, w, t.bandwidth)


def breakeven_prefix_tokens(
    dep,
    tier: str | StorageTier,
    *,
    suffix_len: int = 0,
    mfu: float | None = None,
    max_tokens: int = 2**22,
) -> float:
    """Shortest prefix (tokens) whose fetch from ``tier`` is faster than its recompute.

    Doubles P until fetch_s < recompute_s, then bisects (the gap grows with P once the pass is
    compute-bound). Returns 1 if even one token is faster to fetch, inf if none up to max_tokens.
    With ``suffix_len`` = 0 a standalone pass charges the whole weight read to the prefix, which
    makes tiny prefixes look expensive to recompute; a request with new tokens (>= 1) pays that
    read anyway, so pass its ``suffix_len`` for the realistic threshold.
    """
    dep = require(dep)
    t = _as_tier(tier, dep.chip)
    limit = integer("max_tokens", max_tokens, 1)

    def fetch_wins(p: int) -> bool:
        fetch = fetch_time_s(dep.mdl, p, t, tp=dep.tp, kv_dtype=dep.kv_dtype)
        return fetch < recompute_time_s(dep, p, suffix_len=suffix_len, mfu=mfu)

    if fetch_wins(1):
        return 1.0
    lo, hi = 1, 2
    while not fetch_wins(hi):
        if hi >= limit:
            return math.inf
        lo, hi = hi, min(2 * hi, limit)
    return float(smallest_true(fetch_wins, lo + 1, hi - 1))  # not fetch_wins(lo), fetch_wins(hi)
