"""Weight distribution: how long ``S`` bytes take to reach ``N`` receivers, each behind its own link.

Every receiver must take all ``S`` bytes through its own download link of ``b`` bytes/s, so no scheme
beats :func:`link_floor_s` ``= S / b``. The schemes, priced in closed form:

* :func:`naive_s`: one source serves every copy through its own uplink ``b_src``: ``N S / b_src``.
* :func:`doubling_s`: store-and-forward doubling (a binomial tree, whole copies): every holder sends
  the whole model to one new node per round, ``ceil(log2(N + 1))`` rounds of ``S / b``.
* :func:`pipelined_s`: the weights cut into ``C`` equal chunks sent down a chain (``fanout = 1``) or a
  complete ``k``-ary tree; a sender's uplink sends each chunk to its ``k`` children in turn, one chunk
  send costs ``tau = S / (C b) + alpha`` (``alpha``: the per-chunk overhead a send occupies the link
  with: request, header, acknowledgement), and the last chunk reaches the deepest, last-served node at
  ``T = k (C - 1 + d) tau`` with ``d`` the depth (a chain: ``d = N``). A chain approaches the floor;
  a ``k``-ary tree uploads ``k`` copies per interior node, so it approaches ``k`` times the floor.
* :func:`best_chunks`: ``C* = sqrt((d - 1) S / (b alpha))`` minimises ``T(C)``: more chunks shorten the
  pipeline's fill (``(d - 1) S / (C b)``) and add overhead (``C alpha``).
* :func:`rack_uplink_bytes` / :func:`rack_uplink_s`: the bytes that cross each rack's uplink for a
  given placement, and the time the busiest uplink needs for them; :func:`random_rack_in_bytes` the
  expected in-bytes of a rack when receivers are ordered at random.
* :func:`storage_egress_s`: copies pulled from an object store over its egress limit.
* :func:`fleet_load_bounds`: the three bounds a fleet load meets (per-node link, rack uplink, storage
  egress) and which binds; :func:`fleet_load`: those bounds for every node pulling its own copy from the
  store and for one copy read once and passed node to node in striped, pipelined chains, with the
  time that schedule takes.

:func:`simulate` is the oracle of the closed forms: a chunk-level schedule of any forwarding tree
(``children`` lists, node 0 the source), every sender's uplink serialised chunk-major over its children,
each node forwarding a chunk once it holds it. SI units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["Bounds", "FleetLoad", "best_chunks", "fleet_load", "binomial_tree", "chain", "chunk_count", "doubling_s", "fleet_load_bounds",
           "kary_tree", "link_floor_s", "naive_s", "pipelined_s", "rack_of_receivers", "rack_uplink_bytes",
           "rack_uplink_s", "random_rack_in_bytes", "simulate", "storage_egress_s", "tree_depth"]


def _size(size_bytes) -> float:
    return real("size_bytes", size_bytes, 0, low_open=True, unit="bytes")


def _link(name: str, bytes_per_s) -> float:
    return real(name, bytes_per_s, 0, low_open=True, unit="bytes/s")


def link_floor_s(size_bytes: float, link_bytes_s: float) -> float:
    """S / b: the time one receiver needs to take all ``size_bytes`` through its own link."""
    return _size(size_bytes) / _link("link_bytes_s", link_bytes_s)


def naive_s(size_bytes: float, receivers: int, source_bytes_s: float) -> float:
    """N S / b_src: one source sends every receiver its own copy through its uplink."""
    n = integer("receivers", receivers, 1)
    return n * _size(size_bytes) / _link("source_bytes_s", source_bytes_s)


def doubling_s(size_bytes: float, receivers: int, link_bytes_s: float) -> float:
    """ceil(log2(N + 1)) x S / b: whole-copy doubling (each holder sends one new node a copy per round)."""
    n = integer("receivers", receivers, 1)
    return math.ceil(math.log2(n + 1) - 1e-12) * link_floor_s(size_bytes, link_bytes_s)


def tree_depth(receivers: int, fanout: int) -> int:
    """Depth (in hops below the source) of the deepest receiver of a complete ``fanout``-ary tree
    filled level by level: the smallest d with k + k^2 + ... + k^d >= N; a chain (k = 1): N."""
    n = integer("receivers", receivers, 1)
    k = integer("fanout", fanout, 1)
    if k == 1:
        return n
    d, held, level = 0, 0, 1
    while held < n:
        d, level = d + 1, level * k
        held += level
    return d


def chunk_count(size_bytes: float, chunk_bytes: float) -> int:
    """ceil(S / chunk): the chunks the weights are cut into (equal chunks of S / C bytes)."""
    s = _size(size_bytes)
    c = real("chunk_bytes", chunk_bytes, 0, low_open=True, unit="bytes")
    return max(1, math.ceil(s / c - 1e-9))


def pipelined_s(size_bytes: float, receivers: int, link_bytes_s: float, chunks: int, fanout: int = 1,
                chunk_overhead_s: float = 0.0) -> float:
    """k (C - 1 + d) tau with tau = S / (C b) + alpha (module doc): the last chunk at the deepest,
    last-served receiver of a pipelined chain (k = 1) or complete k-ary tree. Exact for a chain and
    for a tree whose last level is full; an upper bound otherwise (a partial last level may spare the
    deepest node the last child slot)."""
    s = _size(size_bytes)
    b = _link("link_bytes_s", link_bytes_s)
    c = integer("chunks", chunks, 1)
    k = integer("fanout", fanout, 1)
    a = real("chunk_overhead_s", chunk_overhead_s, 0, unit="seconds")
    d = tree_depth(receivers, k)
    return k * (c - 1 + d) * (s / (c * b) + a)


def best_chunks(size_bytes: float, receivers: int, link_bytes_s: float, fanout: int = 1,
                chunk_overhead_s: float = 0.0, max_chunks: int | None = None) -> int:
    """The chunk count that minimises :func:`pipelined_s`: C* = sqrt((d - 1) S / (b alpha)) rounded to the
    better neighbour, within [1, max_chunks] (default: S / 1 MB, chunks of at least a megabyte). With no
    overhead more chunks always help: the cap is returned; with a single hop (d = 1) one chunk is best."""
    s = _size(size_bytes)
    b = _link("link_bytes_s", link_bytes_s)
    k = integer("fanout", fanout, 1)
    a = real("chunk_overhead_s", chunk_overhead_s, 0, unit="seconds")
    cap = max(1, int(s // 1e6)) if max_chunks is None else integer("max_chunks", max_chunks, 1)
    d = tree_depth(receivers, k)
    if a == 0 or d == 1:
        return cap if a == 0 else 1
    star = math.sqrt((d - 1) * s / (b * a))
    options = {min(cap, max(1, math.floor(star))), min(cap, max(1, math.ceil(star)))}
    return min(options, key=lambda c: (pipelined_s(s, receivers, b, c, k, a), c))


# ---- forwarding trees: children[i] = the receivers node i sends to, in the order its uplink serves them ----


def _nodes(receivers: int) -> int:
    return integer("receivers", receivers, 1) + 1


def chain(receivers: int) -> list[list[int]]:
    """Source 0 -> 1 -> 2 -> ... -> N."""
    n = _nodes(receivers)
    return [[i + 1] if i + 1 < n else [] for i in range(n)]


def kary_tree(receivers: int, fanout: int) -> list[list[int]]:
    """A complete ``fanout``-ary tree in level order: node i sends to k i + 1 ... k i + k."""
    n = _nodes(receivers)
    k = integer("fanout", fanout, 1)
    return [[j for j in range(k * i + 1, k * i + k + 1) if j < n] for i in range(n)]


def binomial_tree(receivers: int) -> list[list[int]]:
    """Whole-copy doubling: in round r every holder i < 2^r sends to i + 2^r. Node i's children, in
    round order: i + 2^r for the rounds after the one it received in."""
    n = _nodes(receivers)
    out = []
    for i in range(n):
        r = 0 if i == 0 else i.bit_length()
        kids = []
        while i + (1 << r) < n:
            kids.append(i + (1 << r))
            r += 1
        out.append(kids)
    return out


def _check_tree(children) -> list[list[int]]:
    if not isinstance(children, (list, tuple)) or not children:
        raise ValueError("children must be a non-empty list of lists (children[i]: the nodes node i sends to)")
    n = len(children)
    parent = [-1] * n
    for i, kids in enumerate(children):
        for j in kids:
            if not (isinstance(j, (int, np.integer)) and 0 < j < n) or parent[j] != -1:
                raise ValueError(f"children must form a tree rooted at node 0: node {j!r} (a child of {i}) is out of range "
                                 "or has two parents")
            parent[j] = i
    order, seen = [0], 0
    while seen < len(order):
        order.extend(children[order[seen]])
        seen += 1
    if len(order) != n:
        raise ValueError(f"children must reach every node from the source: {n - len(order)} nodes are unreachable")
    return [list(map(int, kids)) for kids in children]


def simulate(children, size_bytes: float, link_bytes_s: float, chunks: int, chunk_overhead_s: float = 0.0) -> np.ndarray:
    """Arrival time of each node's last chunk (node 0, the source, holds everything at t = 0).

    Each chunk send occupies the sender's uplink for tau = S / (C b) + alpha; a sender serves its
    children chunk-major (chunk 0 to every child in order, then chunk 1, ...), a send starts when the
    sender holds the chunk and its uplink is free, and a receiver holds the chunk when the send ends.
    Send s of a sender ends at ``e_s = max(r_s, e_{s-1}) + tau``, i.e. ``e_s = (s + 1) tau + max_{j <= s}
    (r_j - j tau)``: one cumulative maximum per sender. Cost: N x C array elements."""
    kids_of = _check_tree(children)
    s = _size(size_bytes)
    b = _link("link_bytes_s", link_bytes_s)
    c = integer("chunks", chunks, 1)
    a = real("chunk_overhead_s", chunk_overhead_s, 0, unit="seconds")
    tau = s / (c * b) + a
    n = len(kids_of)
    have = [None] * n
    have[0] = np.zeros(c)
    done = np.zeros(n)
    order = [0]
    for p in order:
        kids = kids_of[p]
        if not kids:
            continue
        k = len(kids)
        ready = np.repeat(have[p], k)  # send s = chunk s // k to child s % k
        steps = np.arange(ready.size) * tau
        end = steps + tau + np.maximum.accumulate(ready - steps)
        for j, child in enumerate(kids):
            have[child] = end[j::k]
            done[child] = have[child][-1]
            order.append(child)
        have[p] = None if p else have[p]  # free what no one reads again
    return done


# ---- racks ---------------------------------------------------------------------------------------------


def rack_of_receivers(receivers: int, rack_size: int, aware: bool = True, seed: int = 0) -> np.ndarray:
    """Rack of each node (index 0, the source, gets rack -1: outside every receiver rack). ``aware``:
    consecutive receivers share a rack (a forwarding order sorted by rack); else a random order."""
    n = integer("receivers", receivers, 1)
    r = integer("rack_size", rack_size, 1)
    racks = np.arange(n) // r
    if not aware:
        racks = np.random.default_rng(seed).permutation(racks)
    return np.concatenate([[-1], racks])


def rack_uplink_bytes(children, rack_of, size_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(in, out) bytes crossing each receiver rack's uplink: S per forwarding edge whose two ends sit
    in different racks (the source, rack -1, is outside every rack)."""
    kids_of = _check_tree(children)
    s = _size(size_bytes)
    racks = np.asarray(rack_of)
    if racks.shape != (len(kids_of),):
        raise ValueError(f"rack_of must give one rack per node ({len(kids_of)}), got shape {racks.shape}")
    m = int(racks.max()) + 1
    inb, outb = np.zeros(max(m, 1)), np.zeros(max(m, 1))
    for p, kids in enumerate(kids_of):
        for ch in kids:
            if racks[p] != racks[ch]:
                inb[racks[ch]] += s
                if racks[p] >= 0:
                    outb[racks[p]] += s
    return inb, outb


def rack_uplink_s(children, rack_of, size_bytes: float, uplink_bytes_s: float) -> float:
    """max over racks of max(in, out) bytes / uplink (full duplex): the time the busiest rack uplink
    needs for the copies that cross it, a lower bound on the broadcast."""
    u = _link("uplink_bytes_s", uplink_bytes_s)
    inb, outb = rack_uplink_bytes(children, rack_of, size_bytes)
    return float(max(inb.max(), outb.max())) / u


def random_rack_in_bytes(size_bytes: float, receivers: int, rack_size: int) -> float:
    """Expected bytes into one full rack when the forwarding order is random: each of its R receivers has
    a parent outside the rack with probability about (N - R) / (N - 1), so R S (N - R) / (N - 1)."""
    s = _size(size_bytes)
    n = integer("receivers", receivers, 2)
    r = integer("rack_size", rack_size, 1, n)
    return r * s * (n - r) / (n - 1)


def storage_egress_s(size_bytes: float, copies: float, egress_bytes_s: float) -> float:
    """copies x S / egress: the time an object store's egress limit needs to serve ``copies`` reads."""
    k = real("copies", copies, 0, low_open=True)
    return k * _size(size_bytes) / _link("egress_bytes_s", egress_bytes_s)


@dataclass(frozen=True)
class Bounds:
    """The three lower bounds on loading ``size_bytes`` onto a fleet, seconds, and which binds."""

    node_link_s: float
    rack_uplink_s: float
    storage_s: float

    @property
    def binding(self) -> str:
        """The name of the largest bound."""
        named = {"the per-node link": self.node_link_s, "the rack uplink": self.rack_uplink_s,
                 "the storage egress": self.storage_s}
        return max(named, key=named.get)

    @property
    def floor_s(self) -> float:
        """The largest of the three: no schedule loads the fleet faster."""
        return max(self.node_link_s, self.rack_uplink_s, self.storage_s)


def fleet_load_bounds(size_bytes: float, node_bytes_s: float, rack_in_copies: float, uplink_bytes_s: float,
                      store_copies: float, egress_bytes_s: float) -> Bounds:
    """Per-node link S / b_node; rack uplink (copies into the busiest rack) x S / uplink; storage egress
    (copies read from the store) x S / egress."""
    s = _size(size_bytes)
    return Bounds(link_floor_s(s, node_bytes_s),
                  real("rack_in_copies", rack_in_copies, 0) * s / _link("uplink_bytes_s", uplink_bytes_s),
                  storage_egress_s(s, store_copies, egress_bytes_s))


@dataclass(frozen=True)
class FleetLoad:
    """A fleet load two ways (:func:`fleet_load`): ``naive`` (every node reads its own copy from the store)
    and ``broadcast`` (one copy of each shard read once, then node to node), the striped chains' ``heads``,
    their common rate ``chain_rate_bytes_s`` and the time ``broadcast_s`` the pipelined schedule takes."""

    shard_bytes: float
    replicas: int
    shards: int
    naive: Bounds
    broadcast: Bounds
    heads: int
    chain_rate_bytes_s: float
    chunks: int
    broadcast_s: float

    @property
    def naive_s(self) -> float:
        """Every node's flow gets min(read, uplink share, egress share): the largest naive bound (exact for
        identical nodes under fair sharing)."""
        return self.naive.floor_s

    @property
    def store_bytes_naive(self) -> float:
        """Bytes read from the store when every node pulls its own shard: replicas x shards x shard."""
        return self.replicas * self.shards * self.shard_bytes


def fleet_load(shard_bytes: float, replicas: int, node_read_bytes_s: float, node_link_bytes_s: float,
               egress_bytes_s: float, rack_nodes: int, uplink_bytes_s: float, chunks: int,
               chunk_overhead_s: float = 0.0, shards: int = 1) -> FleetLoad:
    """Load ``replicas`` copies of a model cut into ``shards`` node shards of ``shard_bytes`` each (a
    replica spans ``shards`` nodes), racks of ``rack_nodes`` nodes behind ``uplink_bytes_s``.

    Naive: every node reads its shard from the store at ``node_read_bytes_s`` through its own link (the read
    counts at most at ``node_link_bytes_s``): bounds shard / min(read, link), min(rack_nodes, replicas x
    shards) x shard / uplink (a rack holds no more nodes than the fleet), replicas x shards x shard / egress.
    Broadcast: each shard is read from the store once and sent down a rack-ordered chain of the
    ``replicas`` nodes that need it. Bounds: shard / link, min(rack_nodes, shards) x shard / uplink,
    shards x shard / egress; the chains can run at ``target = min(link, uplink / min(rack_nodes, shards),
    egress / shards)``. One node's store read (``node_read_bytes_s``) is usually below that, so the shard
    is cut into ``H = ceil(target / read)`` stripes (at most ``replicas``), each read by its own head node
    and sent down its own chain through every node (each node's link carries all H stripes). The chains
    run at ``rate = min(target, H x read)`` and take :func:`pipelined_s` of one stripe (shard / H bytes,
    ceil(chunks / H) chunks) at rate / H."""
    s = _size(shard_bytes)
    r = integer("replicas", replicas, 1)
    n_sh = integer("shards", shards, 1)
    read = _link("node_read_bytes_s", node_read_bytes_s)
    link = _link("node_link_bytes_s", node_link_bytes_s)
    read = min(read, link)  # a node's store read arrives over its own link
    egress = _link("egress_bytes_s", egress_bytes_s)
    per_rack = integer("rack_nodes", rack_nodes, 1)
    up = _link("uplink_bytes_s", uplink_bytes_s)
    c = integer("chunks", chunks, 1)
    naive = Bounds(s / read, min(per_rack, r * n_sh) * s / up, r * n_sh * s / egress)
    in_rack = min(per_rack, n_sh)
    bcast = Bounds(s / link, in_rack * s / up, n_sh * s / egress)
    target = min(link, up / in_rack, egress / n_sh)
    heads = max(1, min(r, math.ceil(target / read - 1e-9)))
    rate = min(target, heads * read)
    stripe_chunks = max(1, math.ceil(c / heads))
    t = pipelined_s(s / heads, r, rate / heads, stripe_chunks, 1, chunk_overhead_s)
    return FleetLoad(s, r, n_sh, naive, bcast, heads, rate, stripe_chunks, t)
