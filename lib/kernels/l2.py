"""L2 residency and persistence: what CUDA's access policy window can keep in L2, and what it saves.

On NVIDIA GPUs of compute capability 8.0 and newer a program may set aside part of the L2 for
*persisting* accesses (``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n)``, at most
``cudaDeviceProp::persistingL2CacheMaxSize``) and mark one contiguous range per stream or kernel
node as persisting (``cudaStreamAttrValue.accessPolicyWindow``: ``base_ptr``, ``num_bytes`` up to
``accessPolicyMaxWindowSize``, ``hitRatio``, ``hitProp = cudaAccessPropertyPersisting``,
``missProp = cudaAccessPropertyStreaming``). Lines marked persisting keep the set-aside; streaming
traffic can use it only while it is free.

This module prices that mechanism for a decode step, in bytes and seconds (SI):

* :func:`persisting_max_bytes`, :func:`l2_read_bandwidth`: per-GPU facts from
  ``data/assumptions.yaml`` (``kernels_l2``: a device query or a measurement where one was found,
  a graded ratio otherwise);
* :func:`hit_ratio`: the fraction of a window that can persist without thrashing the set-aside;
* :func:`pinning`: bytes a pinned window moves from HBM to L2 per step and the time that saves;
* :func:`shared_prefix`, :func:`prefix_pinning`, :func:`cascade_saving_s`: the one case where
  pinning pays in decode (a system prompt's KV that every sequence of the batch re-reads) against
  the kernel change that pays more (shared-prefix, "cascade", attention reads it once per batch).

The bytes come from the book's one model of each quantity: KV bytes per token from the model
config (:meth:`lib.registry.models.Model.kv_bytes_per_token`) times the share one GPU reads
(:func:`lib.perf.step.kv_read_fraction`); HBM time at the step model's attention efficiency
(:func:`lib.perf.step.step_assumptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu

_SECTION = "kernels_l2"


def _nvidia(chip: str | GPU) -> GPU:
    g = gpu(chip)
    if g.vendor != "NVIDIA" or g.compute_capability is None or float(g.compute_capability) < 8.0:
        raise ValueError(f"{g.key}: CUDA's L2 access policy window needs an NVIDIA GPU of compute capability 8.0 "
                         f"or newer; {g.name} has none")
    return g


def _per_gpu(key: str, chip: GPU):
    table = assumptions.entry(f"{_SECTION}.{key}")
    return table.get(chip.key)


def persisting_max_bytes(chip: str | GPU) -> float:
    """The largest L2 set-aside for persisting accesses, bytes (``persistingL2CacheMaxSize``):
    the device query in ``kernels_l2.persisting_max_bytes`` where one was found, else
    ``kernels_l2.persisting_fraction_of_l2`` x the GPU's L2 (:attr:`GPU.l2_bytes`)."""
    g = _nvidia(chip)
    known = _per_gpu("persisting_max_bytes", g)
    if known is not None:
        return float(known["value"])
    return assumptions.value(f"{_SECTION}.persisting_fraction_of_l2") * g.l2_bytes


def persisting_max_provenance(chip: str | GPU) -> str:
    """How :func:`persisting_max_bytes` is known for this GPU: 'measured' (queried on a GPU lent to this
    project, graded primary), 'printed' (a device query printed elsewhere, secondary) or 'ratio' (no query:
    ``kernels_l2.persisting_fraction_of_l2`` of the L2)."""
    known = _per_gpu("persisting_max_bytes", _nvidia(chip))
    if known is None:
        return "ratio"
    return "measured" if known.get("check") == "primary" else "printed"


def access_policy_max_window_bytes(chip: str | GPU) -> float | None:
    """``accessPolicyMaxWindowSize`` (bytes, the longest address range one access-policy window can mark) where a
    device query of this GPU is in ``kernels_l2.access_policy_max_window_bytes``; None where none was found."""
    known = _per_gpu("access_policy_max_window_bytes", _nvidia(chip))
    return None if known is None else float(known["value"])


def l2_read_bandwidth(chip: str | GPU) -> float:
    """Whole-chip L2 read bandwidth, bytes/s: the measurement in ``kernels_l2.l2_read_bandwidth_tbps``
    where one was found, else ``kernels_l2.l2_to_hbm_bandwidth_ratio`` x datasheet HBM bandwidth
    (any vendor: only the persistence API is NVIDIA's)."""
    g = gpu(chip)
    known = _per_gpu("l2_read_bandwidth_tbps", g)
    if known is not None:
        return float(known["value"]) * 1e12
    return assumptions.value(f"{_SECTION}.l2_to_hbm_bandwidth_ratio") * g.memory_bandwidth


def l2_share_per_sm(chip: str | GPU) -> float:
    """One SM's fair share of the L2 bandwidth when every SM streams: :func:`l2_read_bandwidth` / SMs,
    bytes/s (what a split-K fixup's partial tiles move at)."""
    g = gpu(chip)
    return l2_read_bandwidth(g) / g.compute_units


def l2_bandwidth_grade(chip: str | GPU) -> str:
    """How :func:`l2_read_bandwidth` is known for this GPU: 'measured' (a published benchmark of this
    GPU), 'assumed' (another GPU's measurement carried over, argued in the yaml) or 'ratio'."""
    known = _per_gpu("l2_read_bandwidth_tbps", gpu(chip))
    if known is None:
        return "ratio"
    return "measured" if str(known.get("check", "")).startswith("secondary") else "assumed"


def hit_ratio(window_bytes: float, carveout_bytes: float) -> float:
    """``accessPolicyWindow.hitRatio`` that keeps the persisting lines within the set-aside:
    min(1, carve-out / window). A larger ratio makes the window's own lines evict each other."""
    window_bytes = real("window_bytes", window_bytes, 0, low_open=True, unit="bytes")
    carveout_bytes = real("carveout_bytes", carveout_bytes, 0, unit="bytes")
    return min(1.0, carveout_bytes / window_bytes)


@dataclass(frozen=True)
class Pinning:
    """A pinned window and what it does to one decode step (bytes, seconds)."""

    window_bytes: float  # accessPolicyWindow.num_bytes, one window
    windows_per_step: int  # windows pinned in turn per step (1 across steps, or one per layer)
    reads_per_window: int  # times each window is read per step
    carveout_bytes: float
    hit_ratio: float
    resident_bytes: float  # window x hitRatio: what stays in the set-aside
    l2_reads_per_window: int  # reads served by L2 (the first read of a per-layer window comes from HBM)
    moved_bytes: float  # bytes per step served by L2 instead of HBM
    hbm_bandwidth: float  # achieved HBM bandwidth the reads would have had, bytes/s
    l2_bandwidth: float
    saving_s: float  # moved x (1 / hbm_bandwidth - 1 / l2_bandwidth)

    @property
    def hot_bytes_per_step(self) -> float:
        """Bytes the step reads from the pinned windows, HBM or L2: windows x reads x window."""
        return self.windows_per_step * self.reads_per_window * self.window_bytes


def pinning(window_bytes: float, reads_per_window: int, chip: str | GPU, *, windows_per_step: int = 1,
            resident_across_steps: bool = True, carveout_bytes: float | None = None,
            hbm_efficiency: float | None = None) -> Pinning:
    """What pinning ``windows_per_step`` windows of ``window_bytes`` each, each read
    ``reads_per_window`` times per step, saves per step.

    resident = window x :func:`hit_ratio` (carve-out default :func:`persisting_max_bytes`). A window
    that stays pinned across steps (``resident_across_steps``) serves every read from L2; a window
    re-pointed for each use (one per layer) must load its lines once per step, so one read per
    window still comes from HBM. moved = windows x resident x L2-served reads;
    saving = moved x (1 / (eta W) - 1 / W_L2), eta the attention's achieved HBM fraction
    (``decode_step.attention_kv_bandwidth_efficiency``) and W_L2 :func:`l2_read_bandwidth`.
    The baseline is every read from HBM: the saving is an upper bound where an unpinned L2 would
    already keep the window between reads.
    """
    from lib.perf.step import step_assumptions

    g = _nvidia(chip)
    reads_per_window = integer("reads_per_window", reads_per_window, 1)
    windows_per_step = integer("windows_per_step", windows_per_step, 1)
    carve = persisting_max_bytes(g) if carveout_bytes is None else real(
        "carveout_bytes", carveout_bytes, 0, persisting_max_bytes(g), unit="bytes")
    eff = step_assumptions().kv_efficiency if hbm_efficiency is None else fraction(
        "hbm_efficiency", hbm_efficiency, allow_zero=False)
    h = hit_ratio(window_bytes, carve)
    resident = h * window_bytes
    served = reads_per_window if resident_across_steps else reads_per_window - 1
    moved = windows_per_step * resident * served
    w_hbm, w_l2 = eff * g.memory_bandwidth, l2_read_bandwidth(g)
    return Pinning(window_bytes, windows_per_step, reads_per_window, carve, h, resident, served, moved, w_hbm,
                   w_l2, moved * (1.0 / w_hbm - 1.0 / w_l2))


@dataclass(frozen=True)
class SharedPrefix:
    """A prefix of ``prefix_tokens`` (a system prompt) whose KV every one of ``batch`` sequences reads
    each decode step, on one GPU of the deployment (bytes)."""

    batch: int
    prefix_tokens: int
    layers: int
    kv_bytes_per_token: float  # all layers, the share this GPU reads
    prefix_bytes: float  # one copy, all layers
    naive_read_bytes: float  # per step: each sequence reads it (the decode step's model)
    cascade_read_bytes: float  # per step: read once for the whole batch

    @property
    def prefix_bytes_per_layer(self) -> float:
        return self.prefix_bytes / self.layers

    @property
    def cascade_saved_bytes(self) -> float:
        """(batch - 1) x prefix bytes: what reading the prefix once per batch removes per step."""
        return self.naive_read_bytes - self.cascade_read_bytes


def shared_prefix(dep, batch: int, prefix_tokens: int) -> SharedPrefix:
    """The KV bytes of a shared prefix on one GPU of ``dep`` (:class:`lib.perf.deployment.Deployment`):
    prefix x KV bytes per token x the GPU's share (:func:`lib.perf.step.kv_read_fraction`); read
    batch times per step by a kernel that attends each sequence on its own, once by a shared-prefix
    (cascade) kernel."""
    from lib.perf.deployment import require
    from lib.perf.step import kv_read_fraction

    dep = require(dep)
    batch = integer("batch", batch, 1, unit="sequences")
    prefix_tokens = integer("prefix_tokens", prefix_tokens, 1, unit="tokens")
    m = dep.mdl
    m.check_context(prefix_tokens)
    per_token = m.kv_bytes_per_token(dep.kv_dtype) * kv_read_fraction(dep)
    prefix = prefix_tokens * per_token
    return SharedPrefix(batch, prefix_tokens, m.num_layers, per_token, prefix, batch * prefix, prefix)


def prefix_pinning(dep, batch: int, prefix_tokens: int, carveout_bytes: float | None = None) -> tuple[Pinning, str]:
    """The better of two ways to pin a shared prefix's KV, and its name:

    * ``"whole prefix"``: one window over every layer's prefix KV, pinned across steps: each of the
      batch's reads is served by L2 for the part that stays resident;
    * ``"one layer at a time"``: a window per attention kernel (a kernel-node attribute in the CUDA
      graph) over that layer's prefix KV: the first sequence loads it, the other batch - 1 hit.

    Needs the prefix's blocks contiguous in memory (one window is one address range)."""
    sp = shared_prefix(dep, batch, prefix_tokens)
    chip = dep.chip
    whole = pinning(sp.prefix_bytes, batch, chip, carveout_bytes=carveout_bytes)
    layer = pinning(sp.prefix_bytes_per_layer, batch, chip, windows_per_step=sp.layers, resident_across_steps=False,
                    carveout_bytes=carveout_bytes)
    return (whole, "whole prefix") if whole.saving_s >= layer.saving_s else (layer, "one layer at a time")


def cascade_saving_s(dep, batch: int, prefix_tokens: int, hbm_efficiency: float | None = None) -> float:
    """Seconds per step a shared-prefix (cascade) attention kernel saves: the (batch - 1) extra reads
    of the prefix's KV at the attention's achieved HBM bandwidth, (batch - 1) x prefix bytes / (eta W)."""
    from lib.perf.step import step_assumptions

    sp = shared_prefix(dep, batch, prefix_tokens)
    eff = step_assumptions().kv_efficiency if hbm_efficiency is None else fraction(
        "hbm_efficiency", hbm_efficiency, allow_zero=False)
    return sp.cascade_saved_bytes / (eff * dep.chip.memory_bandwidth)


def lru_keeps(hot_bytes: float, reuse_distance_bytes: float, chip: str | GPU) -> bool:
    """Whether an unpinned, least-recently-used L2 still holds a line of a ``hot_bytes`` set when it
    is read again after ``reuse_distance_bytes`` of other traffic: hot + distance <= L2 size."""
    g = gpu(chip)
    real("hot_bytes", hot_bytes, 0, unit="bytes")
    real("reuse_distance_bytes", reuse_distance_bytes, 0, unit="bytes")
    return hot_bytes + reuse_distance_bytes <= g.l2_bytes
