"""lib.fleet.broadcast: closed forms of weight distribution against a chunk-level schedule, and a
slow event-by-event oracle of that schedule."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import broadcast as bc

S, B = 500e9, 10e9 / 8  # the question's 500 GB over 10 Gbit/s


def slow_schedule(children, size, link, chunks, overhead=0.0):
    """Send by send: every sender works through its (chunk, child) sends in chunk-major order; of all
    senders' next sends, the one that can start earliest happens next. Independent of simulate's
    cumulative-maximum form."""
    n = len(children)
    tau = size / (chunks * link) + overhead
    have = [[math.inf] * chunks for _ in range(n)]
    have[0] = [0.0] * chunks
    free = [0.0] * n
    nxt = [0] * n
    while True:
        options = []
        for p, kids in enumerate(children):
            if kids and nxt[p] < chunks * len(kids):
                c, _ = divmod(nxt[p], len(kids))
                options.append((max(have[p][c], free[p]), p))
        options = [o for o in options if o[0] < math.inf]
        if not options:
            break
        start, p = min(options)
        c, j = divmod(nxt[p], len(children[p]))
        free[p] = start + tau
        have[children[p][j]][c] = start + tau
        nxt[p] += 1
    return np.array([0.0] + [max(h) for h in have[1:]])


def random_tree(n, rng):
    """A random tree on nodes 0..n (0 the source), children in random order."""
    children = [[] for _ in range(n + 1)]
    for i in range(1, n + 1):
        children[rng.randrange(i)].append(i)
    for kids in children:
        rng.shuffle(kids)
    return children


def test_question_numbers():
    assert bc.link_floor_s(S, B) == pytest.approx(400.0)
    assert bc.naive_s(S, 1000, B) == pytest.approx(4.0e5)
    assert bc.doubling_s(S, 1000, B) == pytest.approx(10 * 400.0)  # ceil(log2 1001) = 10 rounds
    assert bc.doubling_s(S, 1, B) == pytest.approx(400.0)
    assert bc.doubling_s(S, 3, B) == pytest.approx(800.0)  # 2 rounds reach 3 receivers


def test_chain_formula_by_hand():
    # (C - 1 + N) tau: 7,813 chunks of 64 MB down 1,000 receivers with 1 ms per chunk
    c = bc.chunk_count(S, 64e6)
    assert c == 7813
    tau = S / (c * B) + 1e-3
    assert bc.pipelined_s(S, 1000, B, c, 1, 1e-3) == pytest.approx((c - 1 + 1000) * tau)
    assert bc.pipelined_s(S, 1, B, 1) == pytest.approx(400.0)


def test_tree_depth():
    assert bc.tree_depth(1000, 2) == 9  # 2 + 4 + ... + 512 = 1022 >= 1000
    assert bc.tree_depth(1022, 2) == 9 and bc.tree_depth(1023, 2) == 10
    assert bc.tree_depth(7, 1) == 7
    assert bc.tree_depth(3, 3) == 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 40), st.floats(0, 0.05))
def test_simulated_chain_equals_closed_form(n, chunks, overhead):
    sim = bc.simulate(bc.chain(n), S, B, chunks, overhead)
    assert sim.max() == pytest.approx(bc.pipelined_s(S, n, B, chunks, 1, overhead), rel=1e-12)
    # each receiver one chunk time after its predecessor
    assert np.allclose(np.diff(sim[1:]), S / (chunks * B) + overhead)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80), st.integers(2, 5), st.integers(1, 30), st.floats(0, 0.05))
def test_simulated_tree_within_its_bound(n, k, chunks, overhead):
    sim = bc.simulate(bc.kary_tree(n, k), S, B, chunks, overhead).max()
    form = bc.pipelined_s(S, n, B, chunks, k, overhead)
    tau = S / (chunks * B) + overhead
    assert sim <= form * (1 + 1e-12)
    assert sim >= form - k * bc.tree_depth(n, k) * tau - 1e-6


@pytest.mark.parametrize("k,levels", [(2, 3), (3, 2), (4, 3)])
def test_complete_tree_is_exact(k, levels):
    n = sum(k ** i for i in range(1, levels + 1))
    for chunks in (1, 7, 50):
        assert bc.simulate(bc.kary_tree(n, k), S, B, chunks, 1e-3).max() == pytest.approx(
            bc.pipelined_s(S, n, B, chunks, k, 1e-3), rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.floats(0, 0.02), st.integers(0, 10**6))
def test_simulate_matches_event_by_event_oracle(n, chunks, overhead, seed):
    children = random_tree(n, random.Random(seed))
    fast = bc.simulate(children, S, B, chunks, overhead)
    slow = slow_schedule(children, S, B, chunks, overhead)
    assert np.allclose(fast, slow, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 100, 1000])
def test_binomial_tree_is_doubling(n):
    assert bc.simulate(bc.binomial_tree(n), S, B, 1).max() == pytest.approx(bc.doubling_s(S, n, B))


def test_star_is_naive():
    assert bc.simulate(bc.kary_tree(50, 50), S, B, 1).max() == pytest.approx(bc.naive_s(S, 50, B))


def test_no_tree_beats_the_floor():
    rng = random.Random(3)
    for _ in range(20):
        children = random_tree(rng.randrange(1, 50), rng)
        assert bc.simulate(children, S, B, rng.randrange(1, 30)).min(initial=math.inf, where=np.arange(len(children)) > 0) \
            >= bc.link_floor_s(S, B) * (1 - 1e-12)


@pytest.mark.parametrize("n,k,a", [(1000, 1, 1e-3), (1000, 2, 1e-3), (64, 1, 5e-3), (5000, 1, 1e-4), (30, 3, 0.01)])
def test_best_chunks_beats_a_scan(n, k, a):
    best = bc.best_chunks(S, n, B, k, a)
    t = bc.pipelined_s(S, n, B, best, k, a)
    for c in np.unique(np.geomspace(1, 200_000, 300).astype(int)):
        assert t <= bc.pipelined_s(S, n, B, int(c), k, a) * (1 + 1e-12)


def test_best_chunks_edges():
    assert bc.best_chunks(S, 10, B, 1, 0.0) == int(S // 1e6)  # no overhead: the cap
    assert bc.best_chunks(S, 1, B, 1, 1e-3) == 1  # one hop: no pipeline to fill


def test_rack_aware_chain_crosses_each_uplink_once():
    racks = bc.rack_of_receivers(1000, 32, aware=True)
    inb, outb = bc.rack_uplink_bytes(bc.chain(1000), racks, S)
    assert inb.max() == S and outb.max() == S
    assert bc.rack_uplink_s(bc.chain(1000), racks, S, 100e9 / 8) == pytest.approx(40.0)


def test_random_order_matches_its_expectation():
    n, r = 1024, 32
    means = []
    for seed in range(20):
        inb, _ = bc.rack_uplink_bytes(bc.chain(n), bc.rack_of_receivers(n, r, aware=False, seed=seed), S)
        means.append(inb.mean() / S)
    assert np.mean(means) == pytest.approx(bc.random_rack_in_bytes(S, n, r) / S, rel=0.02)


def test_fleet_load_bounds_binding():
    bounds = bc.fleet_load_bounds(S, 50e9, 1.0, 12.5e9, 125.0, 100e9)
    assert bounds.storage_s == pytest.approx(625.0) and bounds.binding == "the storage egress"
    assert bounds.floor_s == pytest.approx(625.0)
    assert bc.fleet_load_bounds(S, 1e9, 1.0, 12.5e9, 1.0, 100e9).binding == "the per-node link"


@pytest.mark.parametrize("call", [
    lambda: bc.link_floor_s(0, B),
    lambda: bc.link_floor_s(S, -1),
    lambda: bc.naive_s(S, 0, B),
    lambda: bc.pipelined_s(S, 10, B, 0),
    lambda: bc.pipelined_s(S, 10, B, 5, fanout=0),
    lambda: bc.pipelined_s(S, 10, B, 5, chunk_overhead_s=-1),
    lambda: bc.chunk_count(S, 0),
    lambda: bc.simulate([[1], [0]], S, B, 1),
    lambda: bc.simulate([[1], [], [1]], S, B, 1),
    lambda: bc.simulate([[], [2], []], S, B, 1),
    lambda: bc.rack_uplink_bytes(bc.chain(3), [0, 0], S),
    lambda: bc.random_rack_in_bytes(S, 10, 11),
])
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()


def test_fleet_load_default_numbers():
    # 125 replicas of a 406 GB one-node model: 2 GB/s per-node read, 12.5 GB/s NIC, 50 GB/s store, 4 nodes per 25 GB/s rack
    fl = bc.fleet_load(406e9, 125, 2e9, 12.5e9, 50e9, 4, 25e9, 6344, 1e-3)
    assert fl.store_bytes_naive == pytest.approx(125 * 406e9)
    assert fl.naive_s == pytest.approx(125 * 406e9 / 50e9) and fl.naive.binding == "the storage egress"
    assert fl.broadcast.floor_s == pytest.approx(406e9 / 12.5e9) and fl.broadcast.binding == "the per-node link"
    assert fl.heads == 7 and fl.chain_rate_bytes_s == pytest.approx(12.5e9)
    assert fl.broadcast.floor_s <= fl.broadcast_s < 1.3 * fl.broadcast.floor_s


@settings(max_examples=60, deadline=None)
@given(st.floats(1e9, 2e12), st.integers(1, 500), st.floats(1e8, 2e10), st.floats(1e9, 4e11), st.floats(1e9, 1e12),
       st.integers(1, 18), st.floats(1e9, 4e11), st.integers(1, 5000), st.integers(1, 4))
def test_fleet_load_properties(shard, replicas, read, link, egress, rack, up, chunks, shards):
    fl = bc.fleet_load(shard, replicas, read, link, egress, rack, up, chunks, 1e-3, shards)
    # the broadcast never beats its bounds, and its store traffic bound never exceeds the pull's
    assert fl.broadcast_s >= fl.broadcast.floor_s * (1 - 1e-9)
    assert fl.broadcast.storage_s <= fl.naive.storage_s * (1 + 1e-12)
    assert fl.heads * read >= fl.chain_rate_bytes_s * (1 - 1e-12)
    # the chains run at the smallest pipe share unless the heads are capped by the replicas
    target = min(link, up / min(rack, shards), egress / shards)
    if fl.heads < replicas:
        assert fl.chain_rate_bytes_s == pytest.approx(target)


def test_fleet_load_stripe_chain_simulated():
    fl = bc.fleet_load(100e9, 40, 2e9, 12.5e9, 50e9, 4, 25e9, 2000, 1e-3)
    sim = bc.simulate(bc.chain(40), 100e9 / fl.heads, fl.chain_rate_bytes_s / fl.heads, fl.chunks, 1e-3).max()
    assert sim == pytest.approx(fl.broadcast_s, rel=1e-12)


def test_fleet_load_pull_edge_cases():
    # a node's store read arrives over its own link: a read faster than the link counts at the link
    fl = bc.fleet_load(100e9, 10, 20e9, 12.5e9, 1e12, 4, 1e12, 100, 0.0)
    assert fl.naive.node_link_s == pytest.approx(100e9 / 12.5e9)
    # a rack holds no more nodes than the fleet: one replica of 2 nodes puts 2 shards on its rack's uplink
    fl = bc.fleet_load(100e9, 1, 2e9, 12.5e9, 50e9, 18, 25e9, 100, 0.0, shards=2)
    assert fl.naive.rack_uplink_s == pytest.approx(2 * 100e9 / 25e9)
