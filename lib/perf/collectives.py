"""Collective communication: latency plus bytes over the bus, per interconnect and across nodes.

Every collective of the book is priced here (alpha-beta model):

    t = alpha(n) + bytes on the busiest link / (link bytes/s x bus efficiency)

- ring all-reduce: 2 (n - 1) / n x M bytes per GPU; tree all-reduce: 2 M (pipelined double
  binary tree, latency grows with log2 n); one-shot all-reduce: every rank reads the n - 1
  other buffers (the measured custom-kernel latency); ``auto``: the fastest of the three; all-gather and reduce-scatter:
  (n - 1) / n x M, M the full (gathered) buffer; all-to-all: (n - 1) / n x M of each rank's
  M-byte buffer leaves it.
- The link is the vendor's own: NVLink (NVSwitch: any pair at the full per-direction rate),
  Infinity Fabric (MI300X: a full mesh of one 64 GB/s link per peer; a collective over n GPUs
  runs n - 1 rings over disjoint links, so it gets (n - 1) peer links: 1 at TP2, 7 at TP8),
  PCIe for boards without a scale-up link, and the network across nodes, with the node's NICs.
- A group larger than a node is hierarchical: reduce-scatter inside each node, all-reduce of
  each GPU's 1/g shard across nodes over that GPU's NIC, all-gather inside the node; its
  latency is the measured small all-reduce across two nodes, one more hop per doubling of
  the node count. A node is 8 GPUs, or the chip's NVLink domain when larger (GB200 NVL72);
  inside a node a group larger than the NVLink domain (H100 PCIe: bridged pairs) uses PCIe.

Latencies, bus efficiencies, GPUs and NICs per node come from ``data/assumptions.yaml``
(``collectives``). SI units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu
from lib.units import GB, US

ALGORITHMS = ("ring", "tree", "one_shot", "auto")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Fabric:
    """How GPUs of one group talk: the link's name, per-direction bytes/s and latency model."""

    name: str  # "NVLink", "Infinity Fabric", "PCIe", "network"
    peer_bandwidth: float  # bytes/s per direction one GPU can push to one peer
    mesh: bool  # True: one link per peer (the group's bandwidth is n - 1 links); False: switched
    bus_efficiency: float
    key: str  # the section of data/assumptions.yaml collectives

    def bandwidth(self, n: int) -> float:
        """Bytes/s per direction one GPU moves in a collective over ``n`` GPUs of this fabric:
        the switched port rate, or (mesh) n - 1 peer links used at once."""
        return self.peer_bandwidth * (max(n - 1, 1) if self.mesh else 1)

    def alpha_s(self, n: int, steps: int) -> float:
        """Latency of one collective on ``n`` GPUs of this fabric, seconds: NCCL's ring/LL model
        ``base + steps x per_step`` on NVLink and Infinity Fabric (``steps`` ring steps); a
        flat measured figure on PCIe. The network is priced per call by :func:`network_latency_s`."""
        if n <= 1:
            return 0.0
        if self.key in ("nvlink", "infinity_fabric"):
            a = assumptions.entry(f"collectives.{self.key}.ring_ll")
            return (a["base_us"] + steps * a["per_step_us"]) * US
        if self.key == "pcie":
            return assumptions.value("collectives.pcie.latency_us") * US
        return network_latency_s(n)


def network_latency_s(nodes: int) -> float:
    """Latency of one small collective spanning ``nodes`` nodes, seconds: the measured two-node
    all-reduce (``collectives.network.allreduce_latency_us``, the whole call, intra-node hops
    included) x log2(nodes), a tree across nodes that adds one hop per doubling."""
    nodes = integer("nodes", nodes, 1)
    if nodes == 1:
        return 0.0
    return assumptions.value("collectives.network.allreduce_latency_us") * US * math.log2(nodes)


def gpus_per_node(given: int | None = None, chip: str | GPU | None = None) -> int:
    """GPUs that talk without the network: ``given``, else the chip's NVLink domain when it is
    larger than a board (GB200 NVL72: 72), else ``collectives.gpus_per_node`` (8)."""
    if given is not None:
        return integer("gpus_per_node", given, 1)
    board = integer("gpus_per_node", assumptions.value("collectives.gpus_per_node"), 1)
    domain = gpu(chip).scaleup_domain_gpus if chip is not None else None
    return max(board, domain or 0)


def intra_node_fabric(chip: str | GPU, n_gpus: int = 2) -> Fabric:
    """The fabric a group of ``n_gpus`` inside one node uses: NVLink (NVIDIA) or Infinity Fabric
    (AMD) while the group fits the scale-up domain (``scaleup_domain_gpus``: an H100 PCIe's
    NVLink bridge joins pairs only), else PCIe."""
    g = gpu(chip)
    n = integer("n_gpus", n_gpus, 1)
    if g.scaleup_bandwidth and (g.scaleup_domain_gpus is None or n <= g.scaleup_domain_gpus):
        if g.vendor == "AMD":
            eff = assumptions.value("collectives.infinity_fabric.bus_efficiency")
            return Fabric("Infinity Fabric", g.scaleup_bandwidth, True, eff, "infinity_fabric")
        eff = assumptions.value("collectives.nvlink.bus_efficiency")
        return Fabric("NVLink", g.scaleup_bandwidth, False, eff, "nvlink")
    pcie = pcie_bandwidth(g)
    return Fabric("PCIe", pcie, False, assumptions.value("collectives.pcie.bus_efficiency"), "pcie")


def pcie_bandwidth(chip: str | GPU) -> float:
    """Per-direction PCIe x16 bytes/s of the chip's generation (Gen5 for Hopper and later, else Gen4)."""
    from lib.registry.data import load_yaml

    g = gpu(chip)
    gen = 4 if g.arch.startswith(("Ampere", "Ada")) else 5
    std = load_yaml("hardware.yaml")["interconnect_standards"][f"pcie_gen{gen}_x16"]
    return float(std["unidirectional_gbps"]["value"]) * GB


def network_fabric(chip: str | GPU) -> Fabric:
    """The network between nodes, per GPU: the GPU's NIC share of the node's NICs."""
    g = gpu(chip)
    if not g.scaleout_bandwidth:
        raise ValueError(f"{g.name} has no network (NIC) figure in data/hardware.yaml")
    nics = assumptions.value("collectives.nics_per_node")
    per_gpu = g.scaleout_bandwidth * nics / gpus_per_node()
    eff = assumptions.value("collectives.network.bus_efficiency")
    return Fabric("network", per_gpu, False, eff, "network")


def _check(message_bytes: float, n_gpus: int, algorithm: str) -> tuple[float, int]:
    m = real("message_bytes", message_bytes, 0)
    n = integer("n_gpus", n_gpus, 1)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    return m, n


def _flat_all_reduce_s(m: float, n: int, f: Fabric, algorithm: str) -> tuple[float, float]:
    """(latency, bandwidth) seconds of an all-reduce on one fabric; ``auto`` takes the fastest
    of ring, tree and one-shot for this message (what a tuned runtime picks per call)."""
    if n == 1:
        return 0.0, 0.0
    if algorithm == "auto":
        return min((_flat_all_reduce_s(m, n, f, a) for a in ("ring", "tree", "one_shot")), key=sum)
    bw = f.bandwidth(n) * f.bus_efficiency
    if algorithm == "ring":
        return f.alpha_s(n, 2 * (n - 1)), 2 * (n - 1) / n * m / bw
    if algorithm == "tree":
        return f.alpha_s(n, 2 * math.ceil(math.log2(n))), 2 * m / bw
    # one-shot: each rank reads the other n - 1 buffers at once
    return one_shot_latency_s(n, f), (n - 1) * m / bw


def one_shot_latency_s(n: int, f: Fabric) -> float:
    """Measured latency of a one-shot custom all-reduce (H100, 32 KB; linear in n between and
    beyond the measured TP degrees); other fabrics fall back to their ring latency."""
    if f.key != "nvlink":
        return f.alpha_s(n, 2 * (n - 1))
    pts = assumptions.entry("collectives.nvlink.one_shot")
    xs, ys = pts["tp"], pts["us"]
    if n <= xs[0]:
        return ys[0] * US
    for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:], strict=False):
        if n <= x1:
            return (y0 + (y1 - y0) * (n - x0) / (x1 - x0)) * US
    return (ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (n - xs[-1])) * US


@dataclass(frozen=True)
class CollectiveTime:
    """One collective call: latency and bandwidth seconds, and the fabric(s) it crossed."""

    kind: str
    n_gpus: int
    message_bytes: float
    latency_s: float
    bandwidth_s: float
    fabric: str

    @property
    def time_s(self) -> float:
        return self.latency_s + self.bandwidth_s


def collective(kind: str, message_bytes: float, n_gpus: int, chip: str | GPU,
               algorithm: str = "ring", nodes_gpus: int | None = None) -> CollectiveTime:
    """Time of one collective of ``kind`` over ``n_gpus`` GPUs of ``chip``.

    ``message_bytes``: the per-rank buffer (all-reduce, all-to-all) or the full gathered buffer
    (all-gather, reduce-scatter). Groups of at most ``nodes_gpus`` (default
    :func:`gpus_per_node`) stay inside the node; larger groups must be whole nodes and go
    hierarchical (see the module docstring), where ``algorithm`` no longer applies: the node's
    part is a ring, the latency the measured cross-node call.
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"kind must be one of {', '.join(COLLECTIVES)}; got {kind!r}")
    m, n = _check(message_bytes, n_gpus, algorithm)
    g = gpu(chip)
    per_node = gpus_per_node(nodes_gpus, g)
    intra = intra_node_fabric(g, min(n, per_node))
    if n <= per_node:
        lat, bw = _flat(kind, m, n, intra, algorithm)
        return CollectiveTime(kind, n, m, lat, bw, intra.name if n > 1 else "none")
    if n % per_node:
        raise ValueError(
            f"a group of {n} GPUs spans nodes of {per_node}: it must be whole nodes "
            f"(a multiple of {per_node} GPUs)"
        )
    nodes, net = n // per_node, network_fabric(g)
    # bandwidth: hierarchical (the node's fabric, then each GPU's shard over its own NIC);
    # latency: the measured whole call across nodes (network_latency_s)
    if kind == "all_reduce":
        bw = (_flat("reduce_scatter", m, per_node, intra, "ring")[1]
              + _flat("all_reduce", m / per_node, nodes, net, "ring")[1]
              + _flat("all_gather", m, per_node, intra, "ring")[1])
    elif kind in ("all_gather", "reduce_scatter"):
        # the full buffer inside each node, then each GPU's 1/g shard across the nodes
        bw = (_flat(kind, m, per_node, intra, "ring")[1]
              + _flat(kind, m / per_node, nodes, net, "ring")[1])
    else:  # all-to-all: the share bound for other nodes leaves over this GPU's NIC
        inner = _flat("all_to_all", m * per_node / n, per_node, intra, algorithm)[1]
        bw = max(inner, m * (n - per_node) / n / (net.bandwidth(nodes) * net.bus_efficiency))
    return CollectiveTime(kind, n, m, network_latency_s(nodes), bw, f"{intra.name} + network")


def _flat(kind: str, m: float, n: int, f: Fabric, algorithm: str) -> tuple[float, float]:
    if n == 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        return _flat_all_reduce_s(m, n, f, algorithm)
    bw = f.bandwidth(n) * f.bus_efficiency
    if kind in ("all_gather", "reduce_scatter"):
        return f.alpha_s(n, n - 1), (n - 1) / n * m / bw
    # all-to-all: (n - 1) / n of each rank's buffer leaves it
    return f.alpha_s(n, 1), (n - 1) / n * m / bw


def send(message_bytes: float, chip: str | GPU, across_nodes: bool = False) -> CollectiveTime:
    """One peer-to-peer send of ``message_bytes`` (a pipeline stage handing its activations on):
    one hop of latency + bytes over the peer link, or over the GPU's NIC ``across_nodes``."""
    m = real("message_bytes", message_bytes, 0)
    g = gpu(chip)
    if across_nodes:
        f, lat = network_fabric(g), network_latency_s(2)
    else:
        f = intra_node_fabric(g, 2)
        lat = f.alpha_s(2, 1)
    return CollectiveTime("send", 2, m, lat, m / (f.peer_bandwidth * f.bus_efficiency),
                          f.name)


def all_reduce_s(message_bytes: float, n_gpus: int, chip: str | GPU, algorithm: str = "ring",
                 nodes_gpus: int | None = None) -> float:
    """Seconds of one all-reduce of ``message_bytes`` per rank (see :func:`collective`)."""
    return collective("all_reduce", message_bytes, n_gpus, chip, algorithm, nodes_gpus).time_s


def ring_bytes_per_gpu(kind: str, message_bytes: float, n_gpus: int) -> float:
    """Bytes each GPU sends in one ring collective of ``kind`` over ``n_gpus``: all-reduce
    2 (n - 1) / n x M; all-gather, reduce-scatter (M the full buffer) and all-to-all (n - 1) / n x M;
    ``"send"``: M."""
    if kind not in (*COLLECTIVES, "send"):
        raise ValueError(f"kind must be one of {', '.join(COLLECTIVES)} or send; got {kind!r}")
    m, n = _check(message_bytes, n_gpus, "ring")
    if kind == "send":
        return m
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n * m


def ring_allreduce_bytes_per_gpu(message_bytes: float, n_gpus: int) -> float:
    """Bytes each GPU sends in a ring all-reduce: 2 (n - 1) / n x message bytes."""
    return ring_bytes_per_gpu("all_reduce", message_bytes, n_gpus)
