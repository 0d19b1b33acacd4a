"""lib.kernels.tiled_gemm (N009): the reference tiled GEMM, its defects, the bound and the test design.

The vectorized emulation is checked against a slow kernel written here that walks the grid program by
program and K tile by K tile with explicit pointer arithmetic, and against float64 oracles (numpy,
math.fsum, torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention.naive import round_to_dtype
from lib.kernels import tiled_gemm as tg
from lib.kernels import tiled_gemm_practice as tp

CONFIGS = [tg.TileConfig(), tg.TileConfig(tile_m=32, tile_n=64, tile_k=16), tg.TileConfig(tile_m=16, tile_n=16, tile_k=8)]


def slow_kernel(a, b, dtype, config, defect=None):
    """The kernel as a GPU runs it: for each program id, its output tile; for each K tile, masked loads
    through flat pointers, the MMA (exact, rounded to fp32), the accumulator; then the store."""
    m, k = a.shape
    n = b.shape[1]
    tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
    a = round_to_dtype(a.astype(np.float32), dtype).astype(np.float64)
    b = round_to_dtype(b.astype(np.float32), dtype).astype(np.float64)
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    gm, gn = -(-m // tm), -(-n // tn)
    out = np.zeros((m, n), np.float32)
    steps = k // tk if defect == "k_tail" else -(-k // tk)
    for pid in range(gm * gn):
        pm, pn = (pid // gm, pid % gm) if defect == "grid_map" else (pid // gn, pid % gn)
        rows = pm * tm + np.arange(tm)
        cols = pn * tn + np.arange(tn)
        acc = np.zeros((tm, tn), np.float32)
        a_off = rows[:, None] * k + np.arange(tk)[None, :]  # pointers of A's first K tile
        b_off = np.arange(tk)[:, None] * n + cols[None, :]
        for kt in range(steps):
            ks = kt * tk + np.arange(tk)
            a_mask = (rows[:, None] < m) & (ks[None, :] < k)
            b_mask = (ks[:, None] < k) & (cols[None, :] < n)
            if defect == "k_offset":  # a flat pointer that ran past the allocation reads nothing
                b_mask &= b_off < b_flat.size
            at = np.where(a_mask, a_flat[np.where(a_mask, a_off, 0)], 0.0)
            bt = np.where(b_mask, b_flat[np.where(b_mask, b_off, 0)], 0.0)
            acc = acc + (at @ bt).astype(np.float32)
            if defect == "low_precision_acc":
                acc = round_to_dtype(acc, dtype)
            a_off = a_off + tk
            b_off = b_off + (tk if defect == "k_offset" else tk * n)  # the defect: stride of N, not of K
        c = round_to_dtype(acc, dtype)
        ok_r, ok_c = rows < m, cols < n
        if ok_r.any() and ok_c.any():
            out[np.ix_(rows[ok_r], cols[ok_c])] = c[np.ix_(ok_r, ok_c)]
    return out


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("defect", [None, "k_offset", "k_tail", "grid_map", "low_precision_acc"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_vectorized_kernel_equals_the_tile_walking_kernel(config, defect, dtype):
    for m, n, k in [(config.tile_m, config.tile_n, config.tile_k), (3 * config.tile_m // 2 + 1, 3 * config.tile_n + 5,
                    5 * config.tile_k + 3), (1, 2 * config.tile_n + 1, 9 * config.tile_k), (2 * config.tile_m, 3, 7)]:
        a, b = tg.random_inputs(m, n, k, dtype, seed=m + n + k)
        got = tg.tiled_gemm(a, b, dtype, config=config, defect=defect)
        want = slow_kernel(a, b, dtype, config, defect)
        np.testing.assert_array_equal(got, want, err_msg=f"{defect} {dtype} {(m, n, k)}")


def test_oracles_agree_numpy_fsum_torch():
    torch = pytest.importorskip("torch")
    a, b = tg.random_inputs(37, 29, 301, "bf16", seed=4)
    exact = tg.oracle(a, b)
    via_torch = (torch.from_numpy(a.astype(np.float64)) @ torch.from_numpy(b.astype(np.float64))).numpy()
    np.testing.assert_allclose(exact, via_torch, rtol=0, atol=1e-11)
    for i, j in [(0, 0), (5, 7), (36, 28)]:
        assert math.isclose(exact[i, j], math.fsum(float(x) * float(y) for x, y in zip(a[i], b[:, j], strict=True)), abs_tol=1e-11)


def test_correct_kernel_within_its_bound_against_torch_oracle():
    torch = pytest.importorskip("torch")
    for dtype, (m, n, k) in [("bf16", (70, 45, 1000)), ("fp16", (33, 65, 2049))]:
        a, b = tg.random_inputs(m, n, k, dtype, seed=11)
        c = tg.tiled_gemm(a, b, dtype)
        ref = (torch.from_numpy(a).double() @ torch.from_numpy(b).double()).numpy()
        assert (tg.error_ratio(c, ref, tg.tolerance(a, b, dtype, 32)) <= 1).all()


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 700), dtype=st.sampled_from(tg.STORAGE_DTYPES),
       cfg=st.sampled_from(CONFIGS), scale=st.sampled_from([1e-3, 1.0, 30.0]), seed=st.integers(0, 10**6))
def test_the_bound_never_fails_a_correct_kernel(m, n, k, dtype, cfg, scale, seed):
    rng = np.random.default_rng(seed)
    a = round_to_dtype(rng.standard_normal((m, k)) * scale, dtype)
    b = round_to_dtype(rng.standard_normal((k, n)), dtype)
    c = tg.tiled_gemm(a, b, dtype, config=cfg)
    assert (tg.error_ratio(c, tg.oracle(a, b), tg.tolerance(a, b, dtype, cfg.tile_k)) <= 1).all()


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", tg.STORAGE_DTYPES)
def test_every_defect_is_bitwise_invisible_in_one_tile(config, dtype):
    a, b = tg.random_inputs(config.tile_m, config.tile_n, config.tile_k, dtype, seed=2)
    ref = tg.tiled_gemm(a, b, dtype, config=config)
    for d in tg.DEFECTS:
        for run in range(4):
            assert np.array_equal(tg.tiled_gemm(a, b, dtype, config=config, defect=d, run=run).view(np.uint32),
                                  ref.view(np.uint32)), d


def test_correct_and_deterministic_defects_repeat_bitwise_races_do_not():
    a, b = tg.random_inputs(161, 147, 785, "bf16", seed=0)
    for d in (None, *tg.DEFECTS):
        c0, c1 = tg.tiled_gemm(a, b, defect=d, run=0), tg.tiled_gemm(a, b, defect=d, run=1)
        same = np.array_equal(c0.view(np.uint32), c1.view(np.uint32))
        assert same == (tg.CANDIDATE.get(d) != "race"), d
        assert np.array_equal(c0, tg.tiled_gemm(a.copy(), b.copy(), defect=d, run=0)), d  # the memo is by value


def test_races_that_cannot_fire_are_exact():
    a, b = tg.random_inputs(100, 70, 500, "bf16", seed=3)
    ref = tg.tiled_gemm(a, b)
    for p in (0.0, 1.0):  # no late warp, or no early one: nobody overwrites anybody
        cfg = tg.TileConfig(late_fraction=p)
        assert np.array_equal(tg.tiled_gemm(a, b, config=cfg, defect="missing_barrier", run=5), ref)
    assert np.array_equal(tg.tiled_gemm(a, b, config=tg.TileConfig(split_k=1), defect="split_k_order", run=5), ref)


def test_k_tail_exact_on_tile_multiples_and_drops_exactly_the_remainder():
    a, b = tg.random_inputs(50, 40, 320, "bf16", seed=5)
    assert np.array_equal(tg.tiled_gemm(a, b, defect="k_tail"), tg.tiled_gemm(a, b))
    a, b = tg.random_inputs(50, 40, 337, "bf16", seed=5)
    np.testing.assert_array_equal(tg.tiled_gemm(a, b, defect="k_tail"), tg.tiled_gemm(a[:, :320], b[:320]))
    a, b = tg.random_inputs(5, 6, 20, "bf16", seed=5)  # K < tile_k: the loop never runs
    assert not tg.tiled_gemm(a, b, defect="k_tail").any()


def test_grid_map_closed_form_brute_force_and_zero_tiles():
    for gm in range(1, 13):
        for gn in range(1, 13):
            hit = {(pid // gm, pid % gm) for pid in range(gm * gn)}
            assert tg.grid_map_unwritten(gm, gn) == sum((i, j) not in hit for i in range(gm) for j in range(gn))
    cfg = tg.TileConfig(tile_m=16, tile_n=16, tile_k=16)
    a, b = tg.random_inputs(16 * 2, 16 * 5, 40, "bf16", seed=1)
    c = tg.tiled_gemm(a, b, config=cfg, defect="grid_map")
    zero = sum(not c[i * 16:(i + 1) * 16, j * 16:(j + 1) * 16].any() for i in range(2) for j in range(5))
    assert zero == tg.grid_map_unwritten(2, 5) == 6


def test_race_probability_matches_launch_frequency():
    cfg = tg.TileConfig(tile_m=16, tile_n=16, tile_k=16, late_fraction=0.1)
    a, b = tg.random_inputs(16, 16, 48, "bf16", seed=9)  # one CTA, three K tiles: two racy steps
    good = tg.tiled_gemm(a, b, config=cfg)
    trials = 600
    clean = sum(np.array_equal(tg.tiled_gemm(a, b, config=cfg, defect="missing_barrier", run=r), good)
                for r in range(trials)) / trials
    p = tg.race_clean_probability(0.1, 4, 1, 3)
    assert abs(clean - p) < 4 * math.sqrt(p * (1 - p) / trials)


@pytest.mark.parametrize("n_tiles", [8, 32, 128])
def test_low_precision_accumulator_follows_the_random_walk_law(n_tiles):
    ratio = tg.accumulator_error_ratio("bf16", k=32 * n_tiles, tile_k=32, seed=1)
    assert ratio == pytest.approx(tg.accumulator_ratio_closed_form(n_tiles), rel=0.25)


def test_sweep_prefixes_equal_fresh_problems_and_signatures():
    cfg = tg.TileConfig(tile_m=32, tile_n=16, tile_k=16)
    counts = [1, 2, 4, 8, 16]
    sweeps = tg.sweep_many([None, *tg.DEFECTS], counts, m=40, n=40, config=cfg, runs=3, seed=2)
    a, b = tg.random_inputs(40, 40, 16 * 16, "bf16", 2)
    for d, sw in sweeps.items():
        for r in range(3):
            for i, t in enumerate(counts):
                k = t * 16
                c = tg.tiled_gemm(a[:, :k], b[:k], config=cfg, defect=d, run=r)
                assert sw.errors[r, i] == pytest.approx(tg.relative_error(c, tg.oracle(a[:, :k], b[:k])), rel=1e-9)
    want = {None: "none", "k_tail": "none", "k_offset": "step", "grid_map": "output_tiles",
            "low_precision_acc": "growth", "missing_barrier": "race", "split_k_order": "race"}
    assert {d: tg.signature(sw) for d, sw in sweeps.items()} == want


def test_design_catches_every_defect_and_passes_the_correct_kernel():
    for cfg, dtype in [(CONFIGS[0], "bf16"), (CONFIGS[1], "fp16")]:
        design = tg.design_for(cfg, 16, seed=1)
        cache: dict = {}
        assert tg.run_design(tg.make_kernel(None, dtype, cfg), design, cache=cache).passed
        for d in tg.DEFECTS:
            assert not tg.run_design(tg.make_kernel(d, dtype, cfg), design, cache=cache).passed, (d, dtype)


def test_each_ablation_lets_its_defect_through():
    kernels = [tg.make_kernel(None)] + [tg.make_kernel(d) for d in tg.DEFECTS]
    v = tg.run_matrix(kernels, tg.ablation())
    missed = {name: {d for d in tg.DEFECTS if v[(name, d)].passed} for name in tg.ABLATIONS}
    assert missed == {tg.ABLATIONS[0]: set(tg.DEFECTS), tg.ABLATIONS[1]: {"k_tail"}, tg.ABLATIONS[2]: {"grid_map"},
                      tg.ABLATIONS[3]: {"k_offset", "k_tail", "grid_map", "low_precision_acc"}, tg.ABLATIONS[4]: set()}
    assert all(v[(name, "correct")].passed for name in tg.ablation())


def test_error_pattern_shapes():
    a, b = tg.random_inputs(161, 147, 785, "bf16", 0)
    exact, tol = tg.oracle(a, b), tg.tolerance(a, b)
    gm = tg.error_pattern(tg.tiled_gemm(a, b, defect="grid_map"), exact, tol)
    assert gm.tile_fill > 0.99 and gm.share_tiles == pytest.approx(6 / 15)
    ok = tg.error_pattern(tg.tiled_gemm(a, b), exact, tol)
    assert ok.share_elements == 0 and ok.share_tiles == 0


def test_quiet_fp32_split_k_flips_few_stored_elements():
    fp32, stored = tg.split_k_fp32_flips(161, 147, 785)
    assert fp32 > 0.1 and 0 < stored < 1e-3


def test_torch_assert_close_defaults_are_torchs():
    torch = pytest.importorskip("torch")
    from torch.testing._comparison import _DTYPE_PRECISIONS

    assert tg.TORCH_ASSERT_CLOSE_DEFAULTS["bf16"] == _DTYPE_PRECISIONS[torch.bfloat16]
    assert tg.TORCH_ASSERT_CLOSE_DEFAULTS["fp16"] == _DTYPE_PRECISIONS[torch.float16]


def test_bad_inputs_are_refused():
    a, b = tg.random_inputs(4, 4, 4)
    with pytest.raises(ValueError, match="dtype"):
        tg.tiled_gemm(a, b, "fp8")
    with pytest.raises(ValueError, match="defect"):
        tg.tiled_gemm(a, b, defect="typo")
    with pytest.raises(ValueError, match="matching K"):
        tg.tiled_gemm(a, b[:3])
    with pytest.raises(ValueError, match="warps must divide"):
        tg.TileConfig(tile_m=30)
    with pytest.raises(ValueError, match="late_fraction"):
        tg.TileConfig(late_fraction=2)
    with pytest.raises(ValueError, match="finite"):
        tg.tiled_gemm(a * np.nan, b)
    with pytest.raises(ValueError, match="1 and 2 K tiles"):
        tg.signature(tg.sweep_k_tiles(None, [4, 8], m=8, n=8))


# ---- the practice grader -----------------------------------------------------------------------------

def test_grader_passes_the_reference_and_fails_every_draft():
    assert tp.check(tp.Reference).passed
    for name in tp.VARIANTS:
        report = tp.check(tp.variant(name))
        assert report.status == "failed", name


def test_grader_refuses_trivial_tests_and_reports_the_skeleton():
    class Never:
        def test(self, kernel):
            return None

    class Always:
        def test(self, kernel):
            raise AssertionError("no")

    class Skeleton:
        def test(self, kernel):
            raise NotImplementedError

    assert "passes the kernel with a defect" in tp.check(Never).failure
    assert "rejects the correct kernel" in tp.check(Always).failure
    assert tp.check(Skeleton).status == "not implemented"


def test_grader_hides_the_defect():
    k = tp.OpaqueKernel(tg.make_kernel("k_offset"))
    assert not hasattr(k, "defect") and (k.tile_m, k.tile_n, k.tile_k, k.dtype) == (64, 32, 32, "bf16")
