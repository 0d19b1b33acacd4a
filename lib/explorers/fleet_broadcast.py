"""Explorer for weight broadcast (W11 weight-broadcast).

The view calls :mod:`lib.fleet.broadcast` only (link floor, naive, doubling, pipelined chain and tree,
best chunk count, the rack-uplink bound of a random or rack-aware order). One persistent matplotlib
figure, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import broadcast as bc
from lib.units import fmt_duration, fmt_int, fmt_ratio, sig


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.chain = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="pipelined chain")[0]
    a.tree = ax.plot([1.0], [1.0], color="C2", lw=1.8, label="pipelined tree")[0]
    a.floor = ax.axhline(1.0, color="0.3", ls=":", lw=1.2, label="link floor S / b")
    a.rack = ax.axhline(1.0, color="C3", ls="--", lw=1.2, label="rack-uplink bound")
    a.doubling = ax.axhline(1.0, color="C4", ls="-.", lw=1.0, label="whole-copy doubling")
    a.here = ax.plot([1.0], [1.0], "o", color="C1", ms=6, label="chosen chunk")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("chunk size (MB)")
    ax.set_ylabel("time until the last receiver has every byte (s)")
    ax.grid(True)
    return a


def _draw(a, mb, t_chain, t_tree, tree_label, floor, rack, doubling, here_mb, here_t) -> None:
    a.chain.set_data(mb, t_chain)
    a.tree.set_data(mb, t_tree)
    a.tree.set_label(tree_label)
    a.floor.set_ydata([floor, floor])
    a.rack.set_ydata([rack, rack])
    a.doubling.set_ydata([doubling, doubling])
    a.here.set_data([here_mb], [here_t])
    top = max(float(np.max(t_chain)), float(np.max(t_tree)), rack, doubling)
    a.ax.set_xlim(mb[0], mb[-1])
    a.ax.set_ylim(0.8 * min(floor, rack), 1.3 * top)
    figures.legend(a.ax, [a.chain, a.tree, a.floor, a.rack, a.doubling, a.here], fontsize=7, loc="upper center")


_FIGURE = figures.LiveFigure(6.0, 3.4, _build, _draw)


@explorer(
    "fleet.broadcast",
    size_gb=FloatRange(1.0, 2000.0, 1.0, label="weights (GB)"),
    workers=IntRange(2, 20000, label="receivers"),
    link_gbps=FloatRange(1.0, 400.0, 1.0, label="link per receiver (Gbit/s)"),
    chunk_mb=FloatRange(1.0, 4096.0, 1.0, label="chunk (MB)"),
    overhead_ms=FloatRange(0.0, 20.0, 0.1, label="per-chunk overhead (ms)"),
    fanout=Choice((2, 3, 4, 8), label="tree fan-out"),
    rack_size=IntRange(1, 64, label="receivers per rack"),
    rack_uplink_gbps=FloatRange(10.0, 1600.0, 10.0, label="rack uplink (Gbit/s)"),
    order=Choice(("rack-aware", "random"), label="forwarding order"),
)
def broadcast_view(size_gb: float, workers: int, link_gbps: float, chunk_mb: float, overhead_ms: float,
                   fanout: int, rack_size: int, rack_uplink_gbps: float, order: str) -> View:
    """W11: time to put ``size_gb`` on every receiver: naive, doubling, pipelined chain and tree against
    the chunk size, the link floor and the rack-uplink bound of the forwarding order."""
    s, b, a = size_gb * 1e9, link_gbps * 1e9 / 8, overhead_ms * 1e-3
    if rack_size > workers:
        raise ValueError(f"receivers per rack ({rack_size}) cannot exceed the receivers ({workers})")
    if chunk_mb * 1e6 > s:
        raise ValueError(f"the chunk ({sig(chunk_mb)} MB) is larger than the weights ({sig(size_gb)} GB)")
    floor = bc.link_floor_s(s, b)
    hi = min(4096.0, size_gb * 1e3)
    mb = np.unique(np.geomspace(1.0, hi, 60))
    counts = [bc.chunk_count(s, m * 1e6) for m in mb]
    t_chain = np.array([bc.pipelined_s(s, workers, b, c, 1, a) for c in counts])
    t_tree = np.array([bc.pipelined_s(s, workers, b, c, fanout, a) for c in counts])
    c_here = bc.chunk_count(s, chunk_mb * 1e6)
    here = bc.pipelined_s(s, workers, b, c_here, 1, a)
    tree_here = bc.pipelined_s(s, workers, b, c_here, fanout, a)
    best = bc.best_chunks(s, workers, b, 1, a)
    t_best = bc.pipelined_s(s, workers, b, best, 1, a)
    # copies into the busiest rack: one (a rack-aware chain) or the expected count of a random order
    copies = 1.0 if order == "rack-aware" else bc.random_rack_in_bytes(s, workers, rack_size) / s
    rack = copies * s / (rack_uplink_gbps * 1e9 / 8)
    doubling = bc.doubling_s(s, workers, b)
    naive = bc.naive_s(s, workers, b)
    chain_total = max(here, rack)
    rows = [("link floor S / b", fmt_duration(floor)),
            ("naive, one source", fmt_duration(naive)),
            ("whole-copy doubling", fmt_duration(doubling)),
            (f"pipelined chain, {fmt_int(c_here)} chunks", f"{fmt_duration(here)} ({fmt_ratio(here / floor)} the floor)"),
            (f"pipelined {fanout}-ary tree", f"{fmt_duration(tree_here)} ({fmt_ratio(tree_here / floor)} the floor)"),
            ("best chain chunk", f"{sig(s / best / 1e6)} MB: {fmt_duration(t_best)}"),
            (f"rack uplink ({order} order)", f"{sig(copies)} copies into a rack: {fmt_duration(rack)}"),
            ("chain with the rack bound", fmt_duration(chain_total))]
    binds = "the rack uplink" if rack > here else "the receivers' links"
    caption = (f"Time for {sig(size_gb)} GB to reach {fmt_int(workers)} receivers at {sig(link_gbps)} Gbit/s against the "
               f"chunk size (log-log); the chain bottoms out at {sig(s / best / 1e6)} MB chunks, "
               f"{fmt_ratio(t_best / floor)} the floor, and with a {order} order {binds} bind.")
    fig = _FIGURE(mb, t_chain, t_tree, f"pipelined {fanout}-ary tree", floor, rack, doubling, chunk_mb, here)
    return View(f"Broadcast {sig(size_gb)} GB to {fmt_int(workers)} receivers", rows, fig, caption=caption,
                note=f"{binds} bind", values={"floor_s": floor, "chain_s": here, "tree_s": tree_here,
                                              "rack_s": rack, "best_chunks": best})


# ---- I059 fleet-weight-loading: the three bounds, naive pull against a striped, pipelined broadcast ----

_LOAD_LABELS = ("pull: node read", "pull: rack uplink", "pull: storage egress",
                "broadcast: node link", "broadcast: rack uplink", "broadcast: storage egress", "broadcast: pipelined")


def _build_load(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    y = np.arange(len(_LOAD_LABELS))[::-1]
    colors = ["C3", "C3", "C3", "C0", "C0", "C0", "C2"]
    a.bars = ax.barh(y, np.ones(len(y)), color=colors, height=0.6)
    ax.set_yticks(y, _LOAD_LABELS)
    figures.log_scale(ax, "x")
    ax.set_xlabel("seconds (log)")
    ax.grid(True, axis="x")
    return a


def _draw_load(a, values) -> None:
    for bar, v in zip(a.bars, values, strict=True):
        bar.set_width(v)
    a.ax.set_xlim(0.5 * min(values), 2.0 * max(values))


_LOAD_FIGURE = figures.LiveFigure(6.0, 3.0, _build_load, _draw_load)


@explorer(
    "fleet.fleet_load",
    size_gb=FloatRange(1.0, 2000.0, 1.0, label="weights per replica (GB)"),
    replicas=IntRange(1, 2000, label="replicas"),
    shards=IntRange(1, 8, label="nodes per replica"),
    read_gb_s=FloatRange(0.1, 20.0, 0.1, label="one node's store read (GB/s)"),
    link_gbps=FloatRange(10.0, 3200.0, 10.0, label="node link for peer copies (Gbit/s)"),
    egress_gb_s=FloatRange(1.0, 1000.0, 1.0, label="store egress, all readers (GB/s)"),
    rack_nodes=IntRange(1, 18, label="nodes per rack"),
    uplink_gbps=FloatRange(10.0, 3200.0, 10.0, label="rack uplink (Gbit/s)"),
    chunk_mb=FloatRange(1.0, 4096.0, 1.0, label="chunk (MB)"),
)
def fleet_load_view(size_gb: float, replicas: int, shards: int, read_gb_s: float, link_gbps: float,
                    egress_gb_s: float, rack_nodes: int, uplink_gbps: float, chunk_mb: float) -> View:
    """I059: the three bounds of a fleet load when every node pulls its own copy and when one copy is read
    once and passed node to node, and the time the striped pipelined chains take."""
    from lib.registry import assumptions

    shard = size_gb * 1e9 / shards
    if chunk_mb * 1e6 > shard:
        raise ValueError(f"the chunk ({sig(chunk_mb)} MB) is larger than one node's shard ({sig(shard / 1e9)} GB)")
    chunks = bc.chunk_count(shard, chunk_mb * 1e6)
    fl = bc.fleet_load(shard, replicas, read_gb_s * 1e9, link_gbps * 1e9 / 8, egress_gb_s * 1e9, rack_nodes,
                       uplink_gbps * 1e9 / 8, chunks, assumptions.value("fleet.broadcast_chunk_overhead_s"), shards)
    values = [fl.naive.node_link_s, fl.naive.rack_uplink_s, fl.naive.storage_s, fl.broadcast.node_link_s,
              fl.broadcast.rack_uplink_s, fl.broadcast.storage_s, fl.broadcast_s]
    rows = [("read from the store, every node pulls", f"{sig(fl.store_bytes_naive / 1e12)} TB"),
            ("pull: time (binds)", f"{fmt_duration(fl.naive_s)} ({fl.naive.binding})"),
            ("broadcast: tightest bound", f"{fmt_duration(fl.broadcast.floor_s)} ({fl.broadcast.binding})"),
            ("striped chains", f"{fl.heads} heads, {sig(fl.chain_rate_bytes_s / 1e9)} GB/s per node"),
            ("broadcast: pipelined", f"{fmt_duration(fl.broadcast_s)} ({fmt_ratio(fl.broadcast_s / fl.broadcast.floor_s)} "
                                     "the tightest bound)"),
            ("speed-up over the pull", fmt_ratio(fl.naive_s / fl.broadcast_s))]
    caption = (f"The three bounds of loading {fmt_int(replicas)} replicas of {sig(size_gb)} GB (log seconds): pulling "
               f"every copy, {fl.naive.binding} binds at {fmt_duration(fl.naive_s)}; reading one copy and passing it "
               f"node to node, {fl.broadcast.binding} binds and the pipelined chains take {fmt_duration(fl.broadcast_s)}.")
    fig = _LOAD_FIGURE(values)
    return View(f"Loading {fmt_int(replicas)} replicas of {sig(size_gb)} GB", rows, fig, caption=caption,
                note=f"pull: {fl.naive.binding} binds; broadcast: {fl.broadcast.binding} binds",
                values={"naive_s": fl.naive_s, "broadcast_s": fl.broadcast_s, "bound_s": fl.broadcast.floor_s})
