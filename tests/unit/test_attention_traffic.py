"""HBM-traffic model of attention (N004, I030): hand counts for small cases, the briefs' anchors
(134 MB per 8K head, about 2x for the textbook tiled count, about 65x with L2 reuse), Theorem 2's
growth, brute-force pair counts; and ``import lib.attention.*`` loads no torch."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import naive as nv
from lib.attention import traffic as tr
from lib.registry.hardware import gpu


def test_score_matrix_of_an_8k_head_is_134_mb():
    assert tr.score_matrix_bytes(8192) == 8192**2 * 2 == 134_217_728


def test_naive_hand_count_small_case():
    t = tr.naive_traffic(4, 2, "fp16")  # N = 4, d = 2, 2 bytes
    # reads: Q, K, V = 3 x 8 elements; S read by softmax, P read by PV = 2 x 16; writes: S, P = 32, O = 8
    assert t.read_bytes == (24 + 32) * 2 and t.write_bytes == (32 + 8) * 2
    assert t.score_bytes == 64 * 2 and t.total_bytes == 96 * 2
    three_pass = tr.naive_traffic(4, 2, "fp16", score_reads=3)
    assert three_pass.read_bytes - t.read_bytes == 16 * 2


def test_tiled_hand_counts_small_case():
    fa2 = tr.tiled_traffic(8, 2, 4, 4, "fp16")  # Tr = 2 query blocks, each reads all of K and V
    assert fa2.read_bytes == (16 + 2 * 2 * 16) * 2 and fa2.write_bytes == 16 * 2 + 8 * 4 and fa2.kv_passes == 2
    fa1 = tr.tiled_traffic(8, 2, 4, 4, "fp16", schedule="fa1", stats_dtype="fp16")  # Tc = 2 key blocks
    # reads: K, V once (32) + per key block Q and O (2 x 16) and m, l (2 x 8); writes: (Tc + 1) x (O + m + l)
    assert fa1.read_bytes == (32 + 2 * (32 + 16)) * 2 and fa1.write_bytes == 3 * (16 + 16) * 2
    assert tr.flash_block_sizes(2, 64, "fp16") == (2, 4)  # M = 32 elements: Bc = ceil(32 / 8) = 4, Br = min(4, d)


def test_the_briefs_anchors_at_8k_on_h100():
    naive = tr.naive_traffic(8192, 128, "fp16")
    textbook = tr.tiled_traffic(8192, 128, 128, 128, "fp16")
    assert naive.total_bytes / textbook.total_bytes == pytest.approx(2.0, abs=0.01)  # "only 2x better"
    assert textbook.kv_passes == 64
    l2 = tr.tiled_traffic_l2(8192, 128, 128, 128, "fp16", gpu="h100-sxm", batch_heads=64)
    assert l2.kv_passes == 1 and l2.kv_resident
    compulsory = tr.compulsory_traffic(8192, 128, "fp16")
    assert l2.total_bytes == compulsory.total_bytes
    assert naive.total_bytes / l2.total_bytes == pytest.approx(65, rel=0.01)  # "65x lower"
    assert l2.l2_hit_rate == pytest.approx(63 / 64)
    assert l2.l2_usable_bytes == 0.5 * gpu("h100-sxm").l2_bytes


def test_l2_model_regimes():
    kw = dict(block_q=128, block_k=128, dtype="fp16", l2_bytes=50e6, sm_count=132, batch_heads=64)
    long = tr.tiled_traffic_l2(131072, 128, **kw)  # 64 MB of K/V per head: not resident; 1024 tiles, 8 waves
    assert not long.kv_resident and long.waves_per_head == 8 and long.kv_passes == 8
    no_share = tr.tiled_traffic_l2(131072, 128, lockstep=False, **kw)
    assert no_share.kv_passes == no_share.textbook_kv_passes == 1024
    assert no_share.total_bytes == pytest.approx(tr.tiled_traffic(131072, 128, 128, 128, "fp16").total_bytes)
    one_wave = tr.tiled_traffic_l2(8192, 128, lockstep=False, **kw)  # resident: L2 alone gives one pass
    assert one_wave.kv_resident and one_wave.kv_passes == 1
    tiny_l2 = tr.tiled_traffic_l2(8192, 128, **{**kw, "l2_bytes": 1e6}, lockstep=False)
    assert tiny_l2.kv_passes == 64


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 64), st.integers(1, 64))
def test_ordering_and_growth(n, d, br, bc):
    naive = tr.naive_hbm_bytes(n, d)
    tiled = tr.tiled_hbm_bytes(n, d, br, bc)
    floor = tr.compulsory_traffic(n, d).total_bytes
    l2 = tr.tiled_traffic_l2(n, d, br, bc, l2_bytes=50e6, sm_count=132).total_bytes
    assert floor <= l2 <= tiled + 1e-6
    assert tr.tiled_traffic(n, d, br, bc, causal=True).total_bytes <= tiled
    # naive = the floor (without the LSE) plus four passes over the N x N scores
    assert naive == pytest.approx(floor - 4 * n + 4 * n * n * 2)


def test_theorem2_orders():
    a = tr.theorem2_orders(4096, 128, 100e3, "fp16")
    b = tr.theorem2_orders(8192, 128, 100e3, "fp16")
    assert b["tiled"] / a["tiled"] == 4.0 and b["naive"] / a["naive"] == pytest.approx(4, rel=0.05)
    assert a["tiled"] == 4096**2 * 128**2 / 50e3


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 40), st.booleans())
def test_visible_pairs_and_flops_by_brute_force(nq, nk, offset, causal):
    want = int(nv.causal_mask(nq, nk, offset).sum()) if causal else nq * nk
    assert tr.visible_pairs(nq, nk, causal, offset) == want
    assert tr.attention_flops(nq, 8, nk, causal=causal) == 2 * tr.visible_pairs(nq, nk, causal) * 16


def test_causal_fa2_reads_follow_the_tile_map():
    from lib.attention.tiled import causal_tile_map, tile_counts

    n, d, b = 1000, 64, 128
    t = tr.tiled_traffic(n, d, b, b, "fp16", causal=True)
    tiles = causal_tile_map(n, n, b, b)
    rows = sum(min(n, (j + 1) * b) - j * b for i in range(tiles.shape[0]) for j in range(tiles.shape[1]) if tiles[i, j])
    assert t.k_bytes == rows * d * 2
    assert tile_counts(tiles)["computed"] == 36  # 8 x 9 / 2


def test_bad_inputs():
    with pytest.raises(ValueError, match="n_q"):
        tr.naive_traffic(0, 64)
    with pytest.raises(ValueError, match="schedule"):
        tr.tiled_traffic(8, 4, schedule="fa3")
    with pytest.raises(ValueError, match="l2_bytes"):
        tr.tiled_traffic_l2(8, 4)
    with pytest.raises(ValueError, match="l2_usable_fraction"):
        tr.tiled_traffic_l2(8, 4, gpu="h100-sxm", l2_usable_fraction=0)
    with pytest.raises(ValueError, match="dtype"):
        tr.score_matrix_bytes(8, dtype="half")


def test_importing_lib_attention_loads_no_torch():
    mods = ", ".join(f"lib.attention.{m}" for m in ("naive", "online_softmax", "tiled", "backward", "kv_cache",
                                                    "kv_cache_practice", "split_kv", "split_kv_practice", "traffic"))
    code = f"import sys, lib.attention, {mods}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {name.split(".")[0] for name in out.split()}
    assert not loaded & {"torch", "matplotlib", "triton", "hypothesis"}
    light = subprocess.run([sys.executable, "-c", "import sys, lib.attention; print('numpy' in sys.modules)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert light == "False"  # the package itself imports nothing


def test_tiled_model_vs_numbers_are_float():
    assert isinstance(tr.naive_hbm_bytes(16, 4), float) and np.isfinite(tr.tiled_hbm_bytes(16, 4))
