"""Tiering the KV cache across HBM, host DRAM and local NVMe SSD: what each tier holds, what a
prefix costs to bring back from it, what recomputing the same prefix costs, and how long the
SSD survives the eviction traffic.

One ratio decides fetch against recompute. Recomputing a P-token prefix costs its prefill
FLOPs F(P) = P (2N + a (P + 1) / 2) (lib.registry.models.Model.prefill_flops); fetching it costs its KV
bytes P b over the tier's bandwidth W. With an achievable compute rate C = n_gpus x peak x MFU,

    recompute / fetch = (F(P) / C) / (P b / W) = I(P) / (C / W),   I(P) = F(P) / (P b)

so fetching wins when the model's FLOPs per cached byte I(P) exceed the tier's "ridge"
C / W. Equivalently the tier must deliver at least W* = C / I(P) bytes/s, which is also the
rate at which a fully busy prefill *creates* KV: the bandwidth a tier must read at to beat
recompute is the bandwidth it must absorb writes at if every new block is spilled to it.

A *replica* is n_gpus GPUs holding one copy of the model (tensor parallel); a node has
gpus_per_node GPUs and shares host DRAM and SSDs among its replicas in proportion to GPUs.
Bandwidths here are the replica's (bytes/s into all its GPUs) and bytes are the KV's unique
bytes; the recompute-vs-fetch arithmetic itself lives in :mod:`lib.kvcache.recompute_fetch` (per
GPU, shard-aware, recompute = :func:`lib.perf.prefill.prefill_time`) and the functions below
are its replica view; the HBM tier is :func:`lib.perf.memory.memory_budget`. SI units throughout: FLOP, FLOP/s,
bytes, bytes/s, seconds. Facts and assumptions come from ``data/assumptions.yaml`` (``storage``) (its
``node``, ``workload`` and ``tiers`` sections) through :func:`default_node` and
:func:`workload_defaults`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lib.inputs import fraction, integer, real
from lib.kvcache import recompute_fetch as rf
from lib.perf.prefill import default_mfu as prefill_default_mfu
from lib.perf.prefill import prefill_time
from lib.perf.roofline import kv_shard_fraction
from lib.registry import assumptions
from lib.registry.hardware import GPU
from lib.registry.models import Model, model
from lib.units import GB, TB, US

SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365.0


def _gpus(n_gpus: int, gpus_per_node: int) -> int:
    n_gpus = integer("n_gpus", n_gpus, 1)
    if n_gpus > gpus_per_node or gpus_per_node % n_gpus:
        raise ValueError(f"n_gpus={n_gpus} must divide the node's {gpus_per_node} GPUs")
    return n_gpus


def default_mfu(mfu: float | None = None) -> float:
    """``mfu``, or (None) ``prefill.prefill_mfu`` of ``data/assumptions.yaml``
    (:func:`lib.perf.prefill.default_mfu`), the default of every ``mfu`` argument in this module."""
    return prefill_default_mfu(mfu)


def check_context_window(mdl: str | Model, tokens: int, what: str = "prefix") -> int:
    """``tokens`` if the model can hold that many positions, else ValueError naming its window
    (``max_position_embeddings``): a prefix longer than the window cannot exist."""
    m = model(mdl)
    t = integer(f"{what} tokens", tokens, 1)
    if t > m.max_position_embeddings:
        raise ValueError(
            f"a {t:,}-token {what} exceeds {m.key}'s {m.max_position_embeddings:,}-token context window"
        )
    return t


# ---- the node: facts and assumptions ------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """Host DRAM and local SSDs of one GPU server, SI units (bytes, bytes/s, seconds)."""

    gpus_per_node: int
    dram_bytes: float
    dram_usable_fraction: float
    dram_bandwidth: float  # all channels, both sockets
    pcie_h2d_bandwidth: float  # per GPU, measured
    dram_latency_s: float
    ssd_drives: int
    ssd_capacity_bytes: float  # per drive
    ssd_read_bandwidth: float  # per drive, datasheet sequential
    ssd_write_bandwidth: float  # per drive, datasheet sequential
    ssd_read_efficiency: float
    ssd_latency_s: float
    ssd_dwpd: float
    ssd_warranty_years: float


def _entries(section: dict) -> dict:
    return {k: v for k, v in section.items() if isinstance(v, dict) and "value" in v}


def _fact_entries() -> dict:
    """{section: {name: yaml entry}} for host, ssd and workload, under this module's names
    (the aliases of :func:`facts`)."""
    doc = assumptions.section("storage")
    host, ssd = _entries(doc["node"]["host"]), _entries(doc["node"]["ssd"])
    dram_tier, nvme = doc["tiers"]["host_dram"], doc["tiers"]["local_nvme"]
    host["dram_fetch_latency_us"] = dram_tier["latency_us"]
    host["nvlink_c2c_gbps_per_direction"] = {"value": doc["host_link"]["gb200"]["host_link_gbps"]}
    ssd["read_gbps"] = nvme["bandwidth_gbps"]
    ssd["read_efficiency"] = nvme["efficiency"]
    ssd["fetch_latency_us"] = nvme["latency_us"]
    return {"host": host, "ssd": ssd, "workload": _entries(doc["workload"])}


def facts() -> dict:
    """The node's values in ``data/assumptions.yaml`` (``storage``) as {section: {name: value}} (yaml units).

    host and ssd: the ``node`` section, plus the values it shares with the per-GPU tiers under
    the names this module uses: host dram_fetch_latency_us = tiers.host_dram.latency_us and
    nvlink_c2c_gbps_per_direction = host_link.gb200; ssd read_gbps, read_efficiency and
    fetch_latency_us = tiers.local_nvme's bandwidth_gbps, efficiency and latency_us.
    workload: the ``workload`` section.
    """
    return {s: {k: e["value"] for k, e in d.items()} for s, d in _fact_entries().items()}


def fact(section: str, name: str, given=None):
    """``given`` when it is not None, else :func:`facts`' value of ``name`` in ``section`` (yaml
    units): how a notebook parameter left None takes its data value."""
    if given is not None:
        return given
    values = facts()
    if section not in values or name not in values[section]:
        known = sorted(values.get(section, values))
        raise ValueError(f"no storage fact {section}.{name}; known there: {', '.join(known)}")
    return values[section][name]


def fact_range(section: str, name: str) -> tuple[float, float]:
    """(low, high) that ``data/assumptions.yaml`` (``storage``) gives for one of :func:`facts`' values
    (``fact_range("ssd", "capacity_tb")``: the drive family's smallest and largest capacity);
    (value, value) where it states no range. Yaml units."""
    entries = _fact_entries()
    if section not in entries:
        raise ValueError(f"section must be one of {sorted(entries)}, got {section!r}")
    entry = entries[section].get(name)
    if entry is None:
        raise ValueError(f"{section} has no {name!r}; known: {', '.join(sorted(entries[section]))}")
    value = entry["value"]
    return entry.get("low", value), entry.get("high", value)


def default_node(**overrides) -> NodeSpec:
    """The 8-GPU node of ``data/assumptions.yaml`` (``storage``) (2 TB DDR5, PCIe Gen5, 8 PM1743-class SSDs).

    Keyword overrides replace fields (SI units), e.g. ``default_node(ssd_drives=1)``.
    """
    f = facts()
    h, s = f["host"], f["ssd"]
    node = NodeSpec(
        gpus_per_node=8,
        dram_bytes=h["dram_bytes_per_node_tb"] * TB,
        dram_usable_fraction=h["dram_usable_fraction"],
        dram_bandwidth=h["dram_channels_per_node"] * h["dram_gbps_per_channel"] * GB,
        pcie_h2d_bandwidth=h["pcie_h2d_gbps_per_gpu"] * GB,
        dram_latency_s=h["dram_fetch_latency_us"] * US,
        ssd_drives=int(s["drives_per_node"]),
        ssd_capacity_bytes=s["capacity_tb"] * TB,
        ssd_read_bandwidth=s["read_gbps"] * GB,
        ssd_write_bandwidth=s["write_gbps"] * GB,
        ssd_read_efficiency=s["read_efficiency"],
        ssd_latency_s=s["fetch_latency_us"] * US,
        ssd_dwpd=s["dwpd"],
        ssd_warranty_years=s["warranty_years"],
    )
    unknown = set(overrides) - set(NodeSpec.__dataclass_fields__)
    if unknown:
        raise ValueError(
            f"unknown NodeSpec fields {sorted(unknown)}; valid: {sorted(NodeSpec.__dataclass_fields__)}"
        )
    return _check_node(replace(node, **overrides))


def _check_node(node: NodeSpec) -> NodeSpec:
    """``node`` with its counts as python ints; raises ValueError on any out-of-range field."""
    node = replace(
        node,
        gpus_per_node=integer("gpus_per_node", node.gpus_per_node, 1),
        ssd_drives=integer("ssd_drives", node.ssd_drives, 0),
    )
    for name in (
        "dram_bytes",
        "dram_bandwidth",
        "pcie_h2d_bandwidth",
        "ssd_capacity_bytes",
        "ssd_read_bandwidth",
        "ssd_write_bandwidth",
        "ssd_dwpd",
        "ssd_warranty_years",
    ):
        real(name, getattr(node, name), 0, low_open=True)
    for name in ("dram_latency_s", "ssd_latency_s"):
        real(name, getattr(node, name), 0)
    fraction("dram_usable_fraction", node.dram_usable_fraction, allow_zero=False)
    fraction("ssd_read_efficiency", node.ssd_read_efficiency, allow_zero=False)
    return node


def workload_defaults() -> dict:
    """prefill_share, output_tokens_per_prompt_token, spill_fraction from ``data/assumptions.yaml`` (``storage``)."""
    return dict(facts()["workload"])


# ---- recompute against fetch: the replica view of lib.kvcache.recompute_fetch ------------------


def compute_rate(
    chip: str | GPU, n_gpus: int = 1, compute_dtype: str = "bf16", mfu: float | None = None
) -> float:
    """Achievable prefill FLOP/s of a replica: C = n_gpus x dense peak(compute_dtype) x MFU
    (:func:`lib.kvcache.recompute_fetch.achieved_flops_per_s`). MFU None: :func:`default_mfu`
    (``prefill.prefill_mfu`` in ``data/assumptions.yaml``), as for every ``mfu`` below."""
    n_gpus = integer("n_gpus", n_gpus, 1)
    return rf.achieved_flops_per_s(chip, n_gpus, compute_dtype, default_mfu(mfu))


def fetch_time_s(
    mdl: str | Model,
    prefix_tokens: int,
    bandwidth: float,
    kv_dtype: str = "bf16",
    latency_s: float = 0.0,
) -> float:
    """Seconds to bring a prefix's KV back from a tier: latency + P x b / W.

    b = Model.kv_bytes_per_token(kv_dtype) (all layers, all KV heads of the replica);
    W = bytes/s the tier delivers into the replica's GPUs (``math.inf`` for HBM: resident).
    :func:`lib.kvcache.recompute_fetch.fetch_time_s` over one link of bandwidth W.
    """
    p = integer("prefix_tokens", prefix_tokens, 1)
    w = float(bandwidth)
    if not (w > 0):
        raise ValueError(
            f"bandwidth must be > 0 bytes/s (math.inf for a resident tier), got {bandwidth!r}"
        )
    link = rf.StorageTier("replica", "the replica's link", w, 1.0, real("latency_s", latency_s, 0),
                          "lib.kvcache.tiering")
    return rf.fetch_time_s(mdl, p, link, kv_dtype=kv_dtype)


def recompute_intensity(mdl: str | Model, prefix_tokens: int, kv_dtype: str = "bf16") -> float:
    """FLOPs of recompute per byte of cached KV: I(P) = F(P) / (P x b), FLOP/byte
    (:func:`lib.kvcache.recompute_fetch.flops_per_kv_byte`).

    Independent of hardware. It grows with P (the attention term) and with model size per KV
    byte: GQA and MLA raise it, an MHA model has the lowest.
    """
    return rf.flops_per_kv_byte(mdl, integer("prefix_tokens", prefix_tokens, 1), kv_dtype)


def tier_ridge(
    chip: str | GPU,
    bandwidth: float,
    n_gpus: int = 1,
    compute_dtype: str = "bf16",
    mfu: float | None = None,
) -> float:
    """The tier's FLOPs-per-byte threshold C / W: fetching wins for models with I(P) above it."""
    w = real("bandwidth", bandwidth, 0, low_open=True)
    return compute_rate(chip, n_gpus, compute_dtype, mfu) / w


def breakeven_bandwidth(
    mdl: str | Model,
    chip: str | GPU,
    prefix_tokens: int,
    n_gpus: int = 1,
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    mfu: float | None = None,
) -> float:
    """Bytes/s a tier must deliver to the replica for fetch to tie with a compute-bound recompute:
    W* = C / I(P), the bound of :func:`lib.kvcache.recompute_fetch.breakeven_bandwidth_closed_form`
    (per GPU) over the share s of each token one GPU holds: the replica's unique KV bytes per
    second. Also the rate a replica creates KV while prefilling flat out. Latency, weight read and
    all-reduce ignored (long prefixes); :func:`tier_costs` prices the whole prefill.
    """
    m = model(mdl)
    per_gpu = rf.breakeven_bandwidth_closed_form(
        m, chip, integer("prefix_tokens", prefix_tokens, 1), tp=n_gpus, mfu=default_mfu(mfu),
        compute_dtype=compute_dtype, kv_dtype=kv_dtype,
    )
    return per_gpu / kv_shard_fraction(m, n_gpus)


def breakeven_prefix_tokens(
    mdl: str | Model,
    chip: str | GPU,
    bandwidth: float,
    latency_s: float = 0.0,
    n_gpus: int = 1,
    kv_dtype: str = "bf16",
    compute_dtype: str = "bf16",
    mfu: float | None = None,
) -> float:
    """Prefix length P* where a compute-bound recompute and a fetch take equally long; recompute
    wins below it: :func:`lib.kvcache.recompute_fetch.breakeven_prefix_tokens_closed_form` with the
    replica's bandwidth W split as each GPU's share W x s. Returns 0 when fetching wins at every
    length, ``math.inf`` when recompute always wins.
    """
    m = model(mdl)
    w = real("bandwidth", bandwidth, 0, low_open=True)
    return rf.breakeven_prefix_tokens_closed_form(
        m, chip, w * kv_shard_fraction(m, n_gpus), latency_s=latency_s, tp=n_gpus, mfu=default_mfu(mfu),
        compute_dtype=compute_dtype, kv_dtype=kv_dtype,
    )


# ---- the tiers of a replica -----------------------------------------------------------------


@dataclass(frozen=True)
class TierCost:
    """One tier as seen by one replica, for a prefix of ``prefix_tokens`` tokens."""

    name: str
    capacity_bytes: float  # this replica's share
    capacity_tokens: float
    bandwidth: float  # bytes/s into the replica's GPUs (inf: resident, no copy)
    latency_s: float
    prefix_tokens: int
    fetch_s: float
    recompute_s: float

    @property
    def speedup(self) -> float:
        """recompute / fetch (inf for a resident tier)."""
        return math.inf if self.fetch_s == 0 else self.recompute_s / self.fetch_s

    @property
    def value_s(self) -> float:
        """What holding the prefix here saves on a hit: recompute time - fetch time (s)."""
        return self.recompute_s - self.fetch_s

    @property
    def value_per_token_s(self) -> float:
        return self.value_s / self.prefix_tokens


def host_bandwidth(node: NodeSpec, n_gpus: int = 1) -> float:
    """Host DRAM -> replica bytes/s: n_gpus x min(PCIe H2D per GPU, DRAM bandwidth / GPUs per node)."""
    node = _check_node(node)
    n_gpus = _gpus(n_gpus, node.gpus_per_node)
    return n_gpus * min(node.pcie_h2d_bandwidth, node.dram_bandwidth / node.gpus_per_node)


def ssd_bandwidth(node: NodeSpec, n_gpus: int = 1) -> float:
    """SSD -> replica bytes/s: the replica's share of drives x read x efficiency, capped by its PCIe."""
    node = _check_node(node)
    n_gpus = _gpus(n_gpus, node.gpus_per_node)
    share = n_gpus / node.gpus_per_node
    return min(
        node.ssd_drives * node.ssd_read_bandwidth * node.ssd_read_efficiency * share,
        n_gpus * node.pcie_h2d_bandwidth,
    )


def tier_costs(dep, prefix_tokens: int, node: NodeSpec | None = None, mfu: float | None = None) -> list[TierCost]:
    """HBM, DRAM and SSD for the replica ``dep``: capacity, bandwidth, fetch and recompute time of a prefix.

    HBM = the KV pool of :func:`lib.perf.memory.memory_budget` on driver-visible memory
    (``dep.budget``: kv_cache_bytes per GPU x GPUs, ``token_capacity`` tokens), resident (no fetch);
    DRAM = usable host DRAM x n_gpus / gpus_per_node at :func:`host_bandwidth`;
    SSD = drives x capacity x n_gpus / gpus_per_node at :func:`ssd_bandwidth`.
    Recompute = :func:`lib.kvcache.recompute_fetch.recompute_time_s` (the prefill time).
    A prefix longer than the model's context window is refused (:func:`check_context_window`).
    """
    node = node or default_node()
    node = _check_node(node)
    m = dep.mdl
    n_gpus = _gpus(dep.tp, node.gpus_per_node)
    p = check_context_window(m, prefix_tokens)
    b = m.kv_bytes_per_token(dep.kv_dtype)
    share = n_gpus / node.gpus_per_node
    recompute = rf.recompute_time_s(dep, p, mfu=mfu)
    budget = dep.budget
    dram = node.dram_bytes * node.dram_usable_fraction * share
    ssd = node.ssd_drives * node.ssd_capacity_bytes * share
    rows = [
        ("HBM", budget.kv_cache_bytes * n_gpus, float(budget.token_capacity), math.inf, 0.0),
        ("host DRAM", dram, dram / b, host_bandwidth(node, n_gpus), node.dram_latency_s),
    ]
    if node.ssd_drives:
        rows.append(("NVMe SSD", ssd, ssd / b, ssd_bandwidth(node, n_gpus), node.ssd_latency_s))
    out = []
    for name, cap, tokens, bw, lat in rows:
        fetch = 0.0 if math.isinf(bw) else fetch_time_s(m, p, bw, dep.kv_dtype, lat)
        out.append(TierCost(name, cap, tokens, bw, lat, p, fetch, recompute))
    return out


# ---- SSD wear-out ---------------------------------------------------------------------------


def prefill_tokens_per_s(dep, prompt_tokens: int, mfu: float | None = None) -> float:
    """Prompt tokens/s a replica prefills flat out: P / :func:`lib.perf.prefill.prefill_time` (P)."""
    p = check_context_window(dep.mdl, prompt_tokens, "prompt")
    return p / prefill_time(dep, p, mfu=mfu).time_s


def kv_write_rate(
    dep,
    prompt_tokens: int,
    mfu: float | None = None,
    prefill_share: float | None = None,
    output_tokens_per_prompt_token: float | None = None,
    spill_fraction: float | None = None,
) -> float:
    """Bytes/s of new KV a busy replica ``dep`` sends to the SSD tier.

    w = prefill_share x prefill_tokens_per_s x (1 + output per prompt token) x b x spill_fraction:
    every computed prompt token and every generated token creates b bytes of KV, and a
    write-through or LRU-victim SSD tier eventually receives ``spill_fraction`` of them.
    None takes the value of :func:`workload_defaults` (``workload`` in ``data/assumptions.yaml`` (``storage``)).
    """
    dflt = workload_defaults()
    if prefill_share is None:
        prefill_share = dflt["prefill_share"]
    if output_tokens_per_prompt_token is None:
        output_tokens_per_prompt_token = dflt["output_tokens_per_prompt_token"]
    if spill_fraction is None:
        spill_fraction = dflt["spill_fraction"]
    share = fraction("prefill_share", prefill_share, allow_zero=False)
    out = real("output_tokens_per_prompt_token", output_tokens_per_prompt_token, 0)
    spill = fraction("spill_fraction", spill_fraction, allow_zero=False)
    tokens = share * prefill_tokens_per_s(dep, prompt_tokens, mfu) * (1 + out)
    return tokens * dep.mdl.kv_bytes_per_token(dep.kv_dtype) * spill


def ssd_endurance_bytes(capacity_bytes: float, dwpd: float, warranty_years: float) -> float:
    """Rated bytes written (TBW x 1e12): capacity x DWPD x 365 x warranty years."""
    return (
        real("capacity_bytes", capacity_bytes, 0, low_open=True)
        * real("dwpd", dwpd, 0, low_open=True)
        * DAYS_PER_YEAR
        * real("warranty_years", warranty_years, 0, low_open=True)
    )


def drive_writes_per_day(write_rate: float, capacity_bytes: float) -> float:
    """Full-drive writes per day at a steady write rate: rate x 86400 / capacity."""
    return (
        real("write_rate", write_rate, 0)
        * SECONDS_PER_DAY
        / real("capacity_bytes", capacity_bytes, 0, low_open=True)
    )


@dataclass(frozen=True)
class Wear:
    """SSD wear under a steady write stream (all drives of the tier together)."""

    offered_rate: float  # bytes/s the tier is asked to write
    absorbed_rate: float  # min(offered, drives x write bandwidth)
    endurance_bytes: float  # rated bytes written, all drives
    lifetime_s: float  # endurance / absorbed rate
    line_rate_lifetime_s: float  # endurance / (drives x write bandwidth): the floor
    drive_writes_per_day: float  # at the absorbed rate

    @property
    def lifetime_days(self) -> float:
        return self.lifetime_s / SECONDS_PER_DAY

    @property
    def saturated(self) -> bool:
        """True when the drives cannot absorb the offered writes (the tier drops or stalls)."""
        return self.offered_rate > self.absorbed_rate


def ssd_wear(
    write_rate: float, node: NodeSpec | None = None, write_amplification: float = 1.0
) -> Wear:
    """How long the node's SSD tier lasts under ``write_rate`` bytes/s (whole node).

    lifetime = drives x capacity x DWPD x 365 x years / (min(rate, drives x write bw) x WAF).
    ``write_amplification`` is relative to the workload the DWPD rating assumes (1 = same).
    At the drives' full write bandwidth the lifetime is the floor: DWPD x warranty days x the
    time to fill a drive once.
    """
    node = node or default_node()
    node = _check_node(node)
    if node.ssd_drives < 1:
        raise ValueError("the node has no SSD drives (ssd_drives = 0): nothing wears out")
    rate = real("write_rate", write_rate, 0)
    waf = real("write_amplification", write_amplification, 1)
    capacity = node.ssd_drives * node.ssd_capacity_bytes
    write_bw = node.ssd_drives * node.ssd_write_bandwidth
    endurance = ssd_endurance_bytes(capacity, node.ssd_dwpd, node.ssd_warranty_years)
    absorbed = min(rate, write_bw)
    lifetime = math.inf if absorbed == 0 else endurance / (absorbed * waf)
    return Wear(
        rate,
        absorbed,
        endurance,
        lifetime,
        endurance / (write_bw * waf),
        drive_writes_per_day(absorbed * waf, capacity),
    )
