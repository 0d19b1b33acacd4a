"""lib.training.checkpoint: checkpoint bytes, the burst plan, retention, resharding, lineage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import checkpoint as ck
from lib.training.state import state_breakdown_per_param, state_bytes_total


def test_checkpoint_is_the_state_without_gradients():
    params = 70.6e9
    per = state_breakdown_per_param()
    assert ck.checkpoint_bytes_per_param() == 14.0
    assert ck.checkpoint_bytes(params) == pytest.approx(state_bytes_total(params) - params * per["gradients"])
    assert ck.checkpoint_bytes("llama-3.1-70b") == pytest.approx(0.988e12, rel=1e-3)  # "a terabyte"


def test_storage_plan_burst_and_drain():
    p = ck.storage_plan(1e12, 1024, 1800.0, 60.0)
    assert p.burst_bandwidth == pytest.approx(1e12 / 60)
    assert p.average_bandwidth == pytest.approx(1e12 / 1800)
    assert p.peak_to_average == pytest.approx(30.0)
    assert p.drain_bandwidth == pytest.approx(1e12 / 1740)
    assert p.nodes == 128 and p.bytes_per_node == pytest.approx(1e12 / 128)
    with pytest.raises(ValueError, match="burst_s"):
        ck.storage_plan(1e12, 1024, 60.0, 60.0)
    assert ck.drives_for(16.5e9, 6.6e9) == 3
    assert ck.drives_for(13.2e9, 6.6e9) == 2


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 400), last=st.integers(1, 10), every=st.integers(1, 50))
def test_retention_count_and_online_property(n, last, every):
    kept = ck.retained(n, last, every)
    assert len(kept) == ck.retained_count(n, last, every)
    # Brute force: the last `last` and every `every`-th, by set arithmetic.
    assert set(kept) == set(range(max(0, n - last), n)) | {i for i in range(n) if (i + 1) % every == 0}
    # Online: what is kept after one more save was kept before (or is the new one).
    assert set(ck.retained(n + 1, last, every)) <= set(kept) | {n}


def test_shard_bounds_match_numpy_array_split():
    for length in (0, 1, 7, 512, 1000):
        for n in (1, 3, 256, 512):
            got = [b - a for a, b in ck.shard_bounds(length, n)]
            want = [len(x) for x in np.array_split(np.arange(length), n)]
            assert got == want


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 40), dim=st.integers(0, 1),
       n_old=st.integers(1, 64), n_new=st.integers(1, 64), seed=st.integers(0, 1000))
def test_save_with_one_layout_load_with_another(rows, cols, dim, n_old, n_new, seed):
    rng = np.random.default_rng(seed)
    t = {"a": rng.standard_normal((rows, cols)).astype(np.float32), "b": rng.integers(0, 9, size=rows + 3)}
    shards, meta = ck.save_sharded(t, n_old, {"a": dim})
    new, read = ck.load_resharded(shards, meta, n_new)
    # Oracle: numpy's own split of the original tensors onto the new ranks.
    for r, (want_a, want_b) in enumerate(zip(np.array_split(t["a"], n_new, axis=dim), np.array_split(t["b"], n_new), strict=True)):
        np.testing.assert_array_equal(new[r]["a"], want_a)
        np.testing.assert_array_equal(new[r]["b"], want_b)
        assert read[r] == want_a.nbytes + want_b.nbytes  # reads exactly its own bytes, nothing more
    assert sum(read) == t["a"].nbytes + t["b"].nbytes


def test_512_onto_256_reads_two_files_each():
    plan = ck.reshard_plan(512 * 1000, 512, 256)
    assert all(len(p) == 2 for p in plan)
    assert [p[0][0] for p in plan] == list(range(0, 512, 2))
    uneven = ck.reshard_plan(1000, 3, 2)
    assert [[q[0] for q in p] for p in uneven] == [[0, 1], [1, 2]]


def test_save_sharded_rejects_a_bad_dim():
    with pytest.raises(ValueError, match="dims"):
        ck.save_sharded({"a": np.zeros((2, 2))}, 2, {"a": 2})


def test_manifest_detects_tampering_and_chains():
    rng = np.random.default_rng(1)
    t = {"w": rng.standard_normal((64, 8)).astype(np.float32)}
    shards, meta = ck.save_sharded(t, 4)
    m1 = ck.manifest(100, shards, meta, None, {"data_position": 1000})
    assert ck.verify_manifest(m1, shards) == []
    bad = [dict(s) for s in shards]
    bad[2] = {"w": bad[2]["w"].copy()}
    bad[2]["w"][0, 0] += 1.0
    assert ck.verify_manifest(m1, bad) == ["shard 2: w differs from the manifest"]
    m2 = ck.manifest(200, shards, meta, m1["id"], {"data_position": 2000})
    m3 = ck.manifest(300, shards, meta, m2["id"], {"data_position": 3000})
    assert m2["id"] != ck.manifest(200, shards, meta, m1["id"], {"data_position": 2001})["id"]
    ms = {m["id"]: m for m in (m1, m2, m3)}
    assert ck.lineage(ms, m3["id"]) == [m3["id"], m2["id"], m1["id"]]
    with pytest.raises(ValueError, match="broken"):
        ck.lineage({m3["id"]: m3}, m3["id"])
    forged = dict(m1, step=101)
    assert ck.verify_manifest(forged, shards) == ["the manifest's id does not match its contents"]
