"""Checkpoints as bytes on storage: what a checkpoint holds, the burst that sizes the write tier,
retention, resharding a checkpoint onto another number of GPUs, and lineage.

* **Bytes** (:func:`checkpoint_bytes`): the state a restart needs, from :mod:`lib.training.state`'s
  per-parameter recipe minus the gradients (recomputed by the next step): mixed-precision Adam
  keeps bf16 weights 2 + fp32 master 4 + moments 8 = 14 bytes per parameter.
* **The burst** (:func:`storage_plan`): bytes / burst time is the rate the fast tier must take;
  bytes / (interval - burst) the rate the durable tier must drain.
* **Retention** (:func:`retained`): the last few to resume from plus every k-th as milestones.
* **Resharding** (:func:`save_sharded`, :func:`load_resharded`, :func:`reshard_plan`): each tensor
  split along one dimension over the saving ranks, with its global layout in the metadata; a loader
  with another rank count reads only the overlapping slices.
* **Lineage** (:func:`manifest`, :func:`verify_manifest`, :func:`lineage`): shard hashes, config and
  parent chained into an id, like commits.

SI units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.training.state import _params, state_breakdown_per_param

__all__ = [
    "StoragePlan", "checkpoint_bytes", "checkpoint_bytes_per_param", "drives_for", "lineage", "load_resharded",
    "manifest", "reshard_plan", "retained", "retained_count", "save_sharded", "shard_bounds", "storage_plan",
    "verify_manifest",
]


def checkpoint_bytes_per_param(**recipe) -> float:
    """Bytes per parameter a checkpoint stores: weights + master copy + optimizer states (the
    gradients are not saved). ``recipe``: :func:`lib.training.state.state_breakdown_per_param`'s
    keywords; mixed-precision Adam gives 2 + 4 + 8 = 14."""
    per = state_breakdown_per_param(**recipe)
    return per["weights"] + per["master"] + per["optimizer"]


def checkpoint_bytes(mdl, **recipe) -> float:
    """Bytes of one full checkpoint: total parameters (a model name, a Model or a count) x
    :func:`checkpoint_bytes_per_param`. Each parameter is saved once, whatever the data-parallel
    replication (writers deduplicate replicas, as torch.distributed.checkpoint does)."""
    return _params(mdl) * checkpoint_bytes_per_param(**recipe)


# ---- the burst and the two-stage path (N063) --------------------------------------------------------------------------


@dataclass(frozen=True)
class StoragePlan:
    """What one checkpoint every ``interval_s`` that must land in ``burst_s`` asks of storage.

    The fast tier (node-local NVMe or host memory, or a burst buffer) takes the burst; the durable
    tier (object store, parallel file system) takes the same bytes spread over the rest of the
    interval. Bandwidths in bytes/s."""

    checkpoint_bytes: float
    n_gpus: int
    gpus_per_node: int
    interval_s: float
    burst_s: float

    @property
    def nodes(self) -> int:
        return math.ceil(self.n_gpus / self.gpus_per_node)

    @property
    def burst_bandwidth(self) -> float:
        """Aggregate write rate for the checkpoint to land within the burst: bytes / burst_s."""
        return self.checkpoint_bytes / self.burst_s

    @property
    def average_bandwidth(self) -> float:
        """The same bytes averaged over the interval: bytes / interval_s."""
        return self.checkpoint_bytes / self.interval_s

    @property
    def peak_to_average(self) -> float:
        return self.interval_s / self.burst_s

    @property
    def bytes_per_gpu(self) -> float:
        return self.checkpoint_bytes / self.n_gpus

    @property
    def bytes_per_node(self) -> float:
        return self.checkpoint_bytes / self.nodes

    @property
    def node_burst_bandwidth(self) -> float:
        """Write rate each node's fast tier must take: bytes per node / burst_s."""
        return self.bytes_per_node / self.burst_s

    @property
    def drain_bandwidth(self) -> float:
        """Durable-tier rate that drains one checkpoint before the next burst: bytes / (interval - burst)."""
        return self.checkpoint_bytes / (self.interval_s - self.burst_s)


def storage_plan(checkpoint_bytes_: float, n_gpus: int, interval_s: float, burst_s: float,
                 gpus_per_node: int = 8) -> StoragePlan:
    """A validated :class:`StoragePlan`: ``burst_s`` must be shorter than ``interval_s``."""
    b = real("checkpoint_bytes", checkpoint_bytes_, 0, low_open=True, unit="bytes")
    n = integer("n_gpus", n_gpus, 1)
    g = integer("gpus_per_node", gpus_per_node, 1)
    iv = real("interval_s", interval_s, 0, low_open=True, unit="seconds")
    bs = real("burst_s", burst_s, 0, low_open=True, unit="seconds")
    if bs >= iv:
        raise ValueError(f"burst_s ({bs:.6g} s) must be shorter than interval_s ({iv:.6g} s): the write must end "
                         "before the next checkpoint")
    return StoragePlan(b, n, g, iv, bs)


def drives_for(bandwidth: float, drive_bytes_per_s: float) -> int:
    """Drives (or servers) of ``drive_bytes_per_s`` each that take ``bandwidth``: ceil(bandwidth / per-drive)."""
    bw = real("bandwidth", bandwidth, 0, unit="bytes/s")
    d = real("drive_bytes_per_s", drive_bytes_per_s, 0, low_open=True, unit="bytes/s")
    return max(1, math.ceil(bw / d - 1e-9))


# ---- retention --------------------------------------------------------------------------------------------------------


def retained(n_saved: int, keep_last: int, keep_every: int) -> list[int]:
    """Indices (0-based, in save order) of the checkpoints a policy keeps after ``n_saved`` saves:
    the last ``keep_last`` (to resume from, one more than the newest in case it is corrupt) and
    every ``keep_every``-th (milestones for evaluation and rollback: indices keep_every - 1,
    2 keep_every - 1, ...). The policy is online: a checkpoint it drops is never kept again."""
    n = integer("n_saved", n_saved, 0)
    last = integer("keep_last", keep_last, 1)
    every = integer("keep_every", keep_every, 1)
    return [i for i in range(n) if i >= n - last or (i + 1) % every == 0]


def retained_count(n_saved: int, keep_last: int, keep_every: int) -> int:
    """len(:func:`retained`) in closed form: the milestones floor(n / every) plus the last ``keep_last``
    that are not milestones."""
    n = integer("n_saved", n_saved, 0)
    last = integer("keep_last", keep_last, 1)
    every = integer("keep_every", keep_every, 1)
    tail = min(last, n)
    milestones_in_tail = n // every - (n - tail) // every
    return n // every + tail - milestones_in_tail


# ---- resharding: save with one layout, load with another ---------------------------------------------------------------


def shard_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """[start, stop) of each of ``n`` contiguous shards of ``length`` elements, numpy.array_split's
    convention: the first length % n shards get one element more (a shard may be empty)."""
    length = integer("length", length, 0)
    n = integer("n", n, 1)
    base, extra = divmod(length, n)
    out, start = [], 0
    for r in range(n):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def reshard_plan(length: int, n_old: int, n_new: int) -> list[list[tuple[int, int, int, int]]]:
    """For each new rank, the pieces it reads: (old rank, start, stop, destination offset), with
    start/stop global indices along the sharded dimension. Only overlapping old shards are read."""
    old, new = shard_bounds(length, n_old), shard_bounds(length, n_new)
    plan, r = [], 0
    for lo, hi in new:  # both layouts are sorted: one merge pass, O(n_old + n_new)
        while r < len(old) and old[r][1] <= lo:
            r += 1
        pieces, k = [], r
        while k < len(old) and old[k][0] < hi:
            s, e = max(old[k][0], lo), min(old[k][1], hi)
            if s < e:
                pieces.append((k, s, e, s - lo))
            k += 1
        plan.append(pieces)
    return plan


def save_sharded(tensors: dict, n_ranks: int, dims: dict | None = None) -> tuple[list[dict], dict]:
    """Split each tensor of ``tensors`` (name -> numpy array) along its dimension ``dims[name]``
    (default 0) over ``n_ranks``: returns (shards, metadata), shards[r] = {name: rank r's piece}
    (what rank r would write to its own file) and metadata = {name: (global shape, dtype, dim,
    bounds)}, the layout a loader needs (as torch.distributed.checkpoint's metadata holds each
    shard's global offsets)."""
    import numpy as np

    n = integer("n_ranks", n_ranks, 1)
    dims = dims or {}
    shards = [{} for _ in range(n)]
    meta = {}
    for name, t in tensors.items():
        t = np.asarray(t)
        dim = dims.get(name, 0)
        if not 0 <= dim < t.ndim:
            raise ValueError(f"dims[{name!r}] must be in [0, {t.ndim}) for a {t.ndim}-d tensor, got {dim!r}")
        bounds = shard_bounds(t.shape[dim], n)
        for r, (a, b) in enumerate(bounds):
            shards[r][name] = np.take(t, np.arange(a, b), axis=dim).copy()
        meta[name] = (tuple(t.shape), t.dtype.str, dim, bounds)
    return shards, meta


def load_resharded(shards: list[dict], meta: dict, n_ranks: int) -> tuple[list[dict], list[int]]:
    """Load a checkpoint saved by :func:`save_sharded` (any number of ranks) onto ``n_ranks``: each
    new rank reads only the old shards that overlap its new range (:func:`reshard_plan`) and copies
    the overlapping slices. Returns (new shards, bytes each new rank read)."""
    import numpy as np

    n = integer("n_ranks", n_ranks, 1)
    if set(meta) != set().union(*(s.keys() for s in shards)) and shards:
        raise ValueError("the shards do not hold the tensors the metadata lists")
    out = [{} for _ in range(n)]
    read = [0] * n
    for name, (shape, dtype, dim, bounds) in meta.items():
        if len(bounds) != len(shards):
            raise ValueError(f"{name!r} was saved over {len(bounds)} ranks but {len(shards)} shards are given")
        plan = reshard_plan(shape[dim], len(bounds), n)
        for r, (pieces, (lo, hi)) in enumerate(zip(plan, shard_bounds(shape[dim], n), strict=True)):
            local_shape = list(shape)
            local_shape[dim] = hi - lo
            buf = np.empty(local_shape, dtype=np.dtype(dtype))
            for old, s, e, dst in pieces:
                a = bounds[old][0]
                src = np.take(shards[old][name], np.arange(s - a, e - a), axis=dim)
                index = [slice(None)] * len(shape)
                index[dim] = slice(dst, dst + (e - s))
                buf[tuple(index)] = src
                read[r] += src.nbytes
            out[r][name] = buf
    return out, read


# ---- lineage --------------------------------------------------------------------------------------------------------


def _digest(array) -> str:
    import numpy as np

    a = np.ascontiguousarray(array)
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def manifest(step: int, shards: list[dict], meta: dict, parent: str | None, config: dict) -> dict:
    """A checkpoint's manifest: its step, its parent checkpoint's id (None for the first), the run's
    configuration (data position, code version, hyperparameters: any JSON-able dict), the layout
    (``meta``) and a SHA-256 of every shard's tensors. Its ``id`` hashes all of that, parent
    included, so ids chain like commits: changing any shard, the config or the history changes it."""
    body = {
        "step": integer("step", step, 0),
        "parent": parent,
        "config": config,
        "layout": {k: [list(v[0]), v[1], v[2], [list(b) for b in v[3]]] for k, v in sorted(meta.items())},
        "shards": [{name: _digest(t) for name, t in sorted(s.items())} for s in shards],
    }
    text = json.dumps(body, sort_keys=True)
    return {**body, "id": hashlib.sha256(text.encode()).hexdigest()}


def verify_manifest(man: dict, shards: list[dict]) -> list[str]:
    """Problems found checking ``shards`` against manifest ``man`` (empty when it verifies): a
    shard count that differs, a tensor missing or changed, or an id that does not hash its body."""
    problems = []
    body = {k: v for k, v in man.items() if k != "id"}
    if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != man.get("id"):
        problems.append("the manifest's id does not match its contents")
    if len(shards) != len(man["shards"]):
        return problems + [f"{len(shards)} shards given, the manifest lists {len(man['shards'])}"]
    for r, (have, want) in enumerate(zip(shards, man["shards"], strict=True)):
        for name, digest in want.items():
            if name not in have:
                problems.append(f"shard {r}: {name} missing")
            elif _digest(have[name]) != digest:
                problems.append(f"shard {r}: {name} differs from the manifest")
    return problems


def lineage(manifests: dict, checkpoint_id: str) -> list[str]:
    """The ids from ``checkpoint_id`` back to the run's first checkpoint (``manifests``: id ->
    manifest). Raises ValueError for a missing parent or a cycle."""
    chain, seen = [], set()
    cur = checkpoint_id
    while cur is not None:
        if cur in seen:
            raise ValueError(f"the lineage of {checkpoint_id[:12]} has a cycle at {cur[:12]}")
        if cur not in manifests:
            raise ValueError(f"checkpoint {cur[:12]} is not among the manifests: its lineage is broken")
        seen.add(cur)
        chain.append(cur)
        cur = manifests[cur]["parent"]
    return chain
