"""lib.training.layout: per-axis traffic re-priced against the step model, placement costs, the
fleet layout, FSDP's ridge, and the one-matmul accounting (numpy oracle for the splits)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.collectives import collective, send
from lib.training import layout as L
from lib.training.step import TrainingLayout, training_memory, training_step

LAY = TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, pp=4, dp=2, micro_batches=16)


def _row(lay, axis):
    return next(r for r in L.axis_traffic(lay) if r.axis == axis)


def test_tp_row_reprices_to_the_step_models_time():
    r, s = _row(LAY, "TP"), training_step(LAY)
    one = collective("all_reduce", r.message_bytes, 8, "h100-sxm", nodes_gpus=8).time_s
    assert math.isclose(one * r.calls, s.tp_s, rel_tol=1e-12)
    assert r.calls == 4 * 20 * 16  # 4 per layer, 80 / 4 layers per stage, 16 micro-batches
    assert r.message_bytes == 8192 * 8192 * 2  # one sequence's activations, bf16
    assert math.isclose(r.wire_bytes, 2 * 7 / 8 * r.message_bytes * r.calls)
    assert r.link == "NVLink" and r.exposed_s == s.tp_exposed_s


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_dp_row_reprices_to_the_step_models_time(zero):
    lay = TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, pp=1, dp=4, micro_batches=4, zero_stage=zero)
    r, s = _row(lay, "DP"), training_step(lay)
    grads = 70553706496 / 8 * 2
    assert math.isclose(r.message_bytes, grads, rel_tol=1e-12)
    if zero == 0:
        want = collective("all_reduce", grads, 4, "h100-sxm", nodes_gpus=1).time_s
    else:
        rs = collective("reduce_scatter", grads, 4, "h100-sxm", nodes_gpus=1).time_s
        ag = collective("all_gather", grads, 4, "h100-sxm", nodes_gpus=1).time_s
        want = (rs + 2 * ag) * 4 if zero == 3 else rs + ag  # ZeRO 3: every micro-batch
    assert math.isclose(r.time_s, s.dp_s, rel_tol=1e-12) and math.isclose(want, s.dp_s, rel_tol=1e-12)
    assert r.link == "network"


def test_pp_row_is_every_boundary_send():
    r = _row(LAY, "PP")
    hop = send(8192 * 8192 * 2 / 8, "h100-sxm", across_nodes=True)
    assert r.calls == 2 * 16 and math.isclose(r.time_s, hop.time_s * 32)
    assert r.exposed_s == training_step(LAY).p2p_exposed_s


def test_axis_time_on_matches_the_placed_link_and_orders_the_links():
    s = training_step(LAY)
    assert math.isclose(L.axis_time_on(LAY, "TP", "nvlink"), s.tp_s, rel_tol=1e-12)
    assert math.isclose(L.axis_time_on(LAY, "DP", "network"), s.dp_s, rel_tol=1e-12)
    for axis in ("TP", "PP", "DP"):
        assert L.axis_time_on(LAY, axis, "network") > L.axis_time_on(LAY, axis, "nvlink")
    assert L.axis_time_on(LAY, "CP", "network") == 0.0
    # TP over the network is what the step model charges when no two GPUs share a node
    assert math.isclose(L.axis_time_on(LAY, "TP", "network"), training_step(LAY.replace(node_gpus=1)).tp_s,
                        rel_tol=1e-12)


def test_axis_time_on_refuses_bad_inputs():
    with pytest.raises(ValueError, match="axis"):
        L.axis_time_on(LAY, "XP", "nvlink")
    with pytest.raises(ValueError, match="link"):
        L.axis_time_on(LAY, "TP", "pcie")
    big = TrainingLayout("llama-3.1-70b", "h100-sxm", tp=16, dp=2)
    with pytest.raises(ValueError, match="does not fit one node"):
        L.axis_time_on(big, "TP", "nvlink")
    with pytest.raises(ValueError, match="TrainingLayout"):
        L.axis_traffic("TP8")


def test_fleet_layout_is_the_shallowest_pipeline_that_fits():
    lay = L.fleet_layout("llama-3.1-70b", "h100-sxm", 2048, 16e6, zero_stage=0)
    assert lay.tp == 8 and lay.n_gpus == 2048 and training_memory(lay)["headroom"] >= 0
    assert lay.pp > 1
    shallower = lay.replace(pp=lay.pp // 2, dp=lay.dp * 2, micro_batches=max(1, round(16e6 / 8192 / (lay.dp * 2))))
    assert training_memory(shallower)["headroom"] < 0
    with pytest.raises(ValueError, match="multiple of tp"):
        L.fleet_layout("llama-3.1-70b", "h100-sxm", 12, 16e6, tp=8)
    with pytest.raises(ValueError, match="does not fit"):
        L.fleet_layout("llama-3.1-405b", "h100-sxm", 8, 1e6, zero_stage=0)


def test_fsdp_hiding_tokens_is_where_the_step_model_hides_the_gathers():
    fsdp, pipe = L.fsdp_vs_pipeline("llama-3.1-70b", "h100-sxm", 2048, 16e6, micro_batch=1)
    assert fsdp.zero_stage == 3 and fsdp.pp == 1 and pipe.zero_stage == 0 and pipe.pp > 1
    t = L.fsdp_hiding_tokens(fsdp)
    # closed form from the datasheet: (n-1)/n x 989e12 x 0.78 / (50e9 x 0.8 x 0.8)
    n = fsdp.dp
    assert math.isclose(t, (n - 1) / n * 989e12 * 0.78 / (50e9 * 0.8 * 0.8), rel_tol=1e-3)
    # above the napkin ridge the step model leaves no gather exposed (it hides under more than matmuls)
    seqs = math.ceil(1.2 * t / 8192)
    big = fsdp.replace(micro_batch=seqs, micro_batches=2, seq_len=8192)
    assert training_step(big).dp_exposed_s == 0.0
    # far below it, most of the traffic is exposed
    small = fsdp.replace(seq_len=1024, micro_batches=16)
    s = training_step(small)
    assert s.dp_exposed_s > 0.5 * s.dp_s
    with pytest.raises(ValueError, match="dp x cp"):
        L.fsdp_hiding_tokens(TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8))


def test_matmul_tensors_at_65536_cubed():
    gib = 2 ** 30
    fwd = L.matmul_tensor_bytes(65536, 65536, 65536, training=False)
    assert fwd["X"] == fwd["W"] == fwd["Y"] == 8 * gib and fwd["total"] == 24 * gib
    tr = L.matmul_tensor_bytes(65536, 65536, 65536)
    # + dY, dX (8 GiB each) + W's gradient 8, master 16, Adam 32 GiB
    assert tr["total"] == (24 + 16 + 8 + 16 + 32) * gib
    fp32 = L.matmul_tensor_bytes(64, 64, 64, "fp32")
    assert fp32["gradients"] == 64 * 64 * 4 and fp32["master"] == 0 and fp32["optimizer"] == 64 * 64 * 8
    with pytest.raises(ValueError, match="m must be"):
        L.matmul_tensor_bytes(0, 4, 4)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 64), k=st.integers(1, 16), n=st.integers(1, 16), t=st.sampled_from([1, 2, 4, 8]),
       split=st.sampled_from(["data", "column", "row"]), training=st.booleans())
def test_split_shards_add_up_to_the_whole(m, k, n, t, split, training):
    m, k, n = m * t, k * t, n * t
    whole = L.matmul_tensor_bytes(m, k, n, training=training)
    part = L.matmul_split_bytes(m, k, n, t, split, training=training)
    state = {"gradients", "master", "optimizer"}
    cut = {"data": {"X", "Y", "dY", "dX"}, "column": {"W", "Y", "dY"} | state, "row": {"X", "W", "dX"} | state}[split]
    for name, b in whole.items():
        if name == "total":
            continue
        assert math.isclose(part[name] * (t if name in cut else 1), b)
    assert part["total"] <= whole["total"]
    expect = {"data": k * n * 2 if training else 0, "column": m * k * 2 if training else 0, "row": m * n * 2}[split]
    assert part["allreduce_bytes"] == (expect if t > 1 else 0)


def test_split_refuses_bad_inputs():
    with pytest.raises(ValueError, match="split must be"):
        L.matmul_split_bytes(8, 8, 8, 2, "diagonal")
    with pytest.raises(ValueError, match="must divide n"):
        L.matmul_split_bytes(8, 8, 9, 2, "column")
    with pytest.raises(ValueError, match="must divide k"):
        L.matmul_split_bytes(8, 9, 8, 2, "row")
    with pytest.raises(ValueError, match="must divide m"):
        L.matmul_split_bytes(9, 8, 8, 2, "data")


@pytest.mark.parametrize("t", [2, 4, 8])
def test_numpy_oracle_column_and_row_splits_equal_the_whole_product(t):
    rng = np.random.default_rng(0)
    m, k, n = 16, 32, 64
    x, w = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    y = x @ w
    col = np.concatenate([x @ ws for ws in np.split(w, t, axis=1)], axis=1)  # all-gather of Y's columns
    row = sum(xs @ ws for xs, ws in zip(np.split(x, t, axis=1), np.split(w, t, axis=0), strict=True))  # all-reduce
    assert np.allclose(col, y, rtol=1e-12, atol=1e-12) and np.allclose(row, y, rtol=1e-12, atol=1e-11)
    # backward of the column split: partial dX = dY_i W_i^T, summed (all-reduce) = dY W^T
    dy = rng.standard_normal((m, n))
    dx = sum(dys @ ws.T for dys, ws in zip(np.split(dy, t, axis=1), np.split(w, t, axis=1), strict=True))
    assert np.allclose(dx, dy @ w.T, atol=1e-11)


def test_cp_and_ep_rows_match_the_step_model():
    cp = TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, cp=2, dp=2, seq_len=32768, micro_batches=2)
    r, s = _row(cp, "CP"), training_step(cp)
    assert r.kind == "send" and math.isclose(r.time_s, s.cp_s) and r.exposed_s == s.cp_exposed_s
    assert r.calls == 1 * 80 * 2 * 3  # (cp - 1) hops x layers x micro-batches x 3 (forward, and twice backward)
    ep = TrainingLayout("mixtral-8x7b", "h100-sxm", tp=2, dp=4, ep=4, micro_batches=2)
    r, s = _row(ep, "EP"), training_step(ep)
    assert r.kind == "all_to_all" and math.isclose(r.time_s, s.ep_s) and r.calls == 4 * 32 * 2


def test_tp_overlap_for_share_matches_the_algebra():
    lay = TrainingLayout("llama-3.1-70b", "h100-sxm", tp=8, dp=8, micro_batches=8)
    s = training_step(lay)
    ov = L.tp_overlap_for_share(lay, 0.08)
    t, step = s.tp_s, s.step_s  # pp = 1: step(o) = step - o T, exposed = (1 - o) T
    assert math.isclose(ov, (t - 0.08 * step) / (t * 0.92), rel_tol=1e-9)
    assert L.tp_overlap_for_share(lay, 0.99) is None  # already under 99% with no overlap
    assert L.tp_overlap_for_share(lay.replace(tp=1, dp=64), 0.08) is None
    with pytest.raises(ValueError, match="share"):
        L.tp_overlap_for_share(lay, 1.5)
