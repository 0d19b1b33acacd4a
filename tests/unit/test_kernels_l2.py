"""lib.kernels.l2: the persisting-L2 carve-out, what a pinned window moves and saves, and the shared
prefix against the cascade kernel. Anchors: the A100 device query and the H200 microbenchmark in
data/assumptions.yaml; an independent line-level LRU simulation with a persisting partition for
the pinning arithmetic."""

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import l2
from lib.perf import memory
from lib.perf import step as stp
from lib.perf.deployment import Deployment
from lib.registry import hardware
from lib.registry.measured import measured


def test_carveout_anchor_and_ratio():
    # A100 device query (NVIDIA developer forum 275542): 31,457,280 of 41,943,040 bytes, the guide's 3/4
    assert l2.persisting_max_bytes("a100-sxm") == 31457280
    assert l2.persisting_max_provenance("a100-sxm") == "printed"
    assert 31457280 / 41943040 == 0.75
    # H200 device query, measured here (data/measured-h200.yaml): 39,321,600 of 62,914,560 bytes, 0.625
    assert l2.persisting_max_bytes("h200") == measured("properties.persistingL2CacheMaxSize")
    assert l2.persisting_max_provenance("h200") == "measured"
    assert l2.access_policy_max_window_bytes("h200") == measured("properties.accessPolicyMaxWindowSize")
    assert l2.access_policy_max_window_bytes("a100-sxm") == 134213632
    assert l2.access_policy_max_window_bytes("b200") is None
    assert hardware.gpu("h200").l2_bytes == measured("properties.l2CacheSize")
    # GPUs with no query: 3/4 of the registry's L2
    for key in ("h100-sxm", "b200", "l4"):
        assert l2.persisting_max_provenance(key) == "ratio"
        assert l2.persisting_max_bytes(key) == pytest.approx(0.75 * hardware.gpu(key).l2_bytes)
        assert l2.persisting_max_bytes(key) < hardware.gpu(key).l2_bytes


def test_l2_bandwidth_sources():
    assert l2.l2_read_bandwidth("h200") == pytest.approx(9.77e12)
    assert l2.l2_bandwidth_grade("h200") == "measured"
    assert l2.l2_bandwidth_grade("h100-sxm") == "assumed"
    assert l2.l2_bandwidth_grade("b200") == "ratio"
    assert l2.l2_read_bandwidth("b200") == pytest.approx(2.0 * hardware.gpu("b200").memory_bandwidth)
    for key in ("a100-sxm", "h100-pcie", "h200", "h100-sxm"):  # every measured L2 beats its HBM
        assert l2.l2_read_bandwidth(key) > hardware.gpu(key).memory_bandwidth


def test_amd_refused():
    with pytest.raises(ValueError, match="NVIDIA GPU of compute capability 8.0"):
        l2.persisting_max_bytes("mi300x")


@pytest.mark.parametrize("window, carve, want", [(10.0, 5.0, 0.5), (5.0, 10.0, 1.0), (7.0, 0.0, 0.0)])
def test_hit_ratio(window, carve, want):
    assert l2.hit_ratio(window, carve) == want


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "x"])
def test_hit_ratio_refuses_bad_windows(bad):
    with pytest.raises(ValueError, match="window_bytes"):
        l2.hit_ratio(bad, 1.0)


def test_pinning_formula():
    carve, W, eta, WL2 = l2.persisting_max_bytes("h200"), 4.8e12, stp.step_assumptions().kv_efficiency, 9.77e12
    p = l2.pinning(1e9, 1, "h200")  # a streamed window: read once, only the carve-out stays resident
    assert p.moved_bytes == pytest.approx(carve)
    assert p.saving_s == pytest.approx(carve * (1 / (eta * W) - 1 / WL2))
    q = l2.pinning(4e6, 8, "h200", windows_per_step=80, resident_across_steps=False)
    assert q.moved_bytes == pytest.approx(80 * 7 * 4e6)
    assert q.hot_bytes_per_step == pytest.approx(80 * 8 * 4e6)
    with pytest.raises(ValueError, match="carveout_bytes"):
        l2.pinning(1e6, 2, "h200", carveout_bytes=2 * carve)


@settings(max_examples=40, deadline=None)
@given(st.floats(1e3, 1e10), st.integers(1, 64), st.integers(1, 128), st.booleans())
def test_pinning_never_moves_more_than_it_reads(window, reads, windows, across):
    p = l2.pinning(window, reads, "h100-sxm", windows_per_step=windows, resident_across_steps=across)
    assert 0 <= p.moved_bytes <= p.hot_bytes_per_step * (1 + 1e-12)
    assert p.resident_bytes <= min(window, p.carveout_bytes) * (1 + 1e-12)
    assert p.saving_s >= 0


def test_shared_prefix_and_cascade():
    dep = Deployment("llama-3.1-70b", "h200", tp=2)
    sp = l2.shared_prefix(dep, 8, 8192)
    per_token = 80 * 2 * 8 * 128 * 2 / 2  # layers x K,V x KV heads x head_dim x BF16 / TP
    assert sp.prefix_bytes == pytest.approx(8192 * per_token)
    assert sp.prefix_bytes_per_layer == pytest.approx(8192 * per_token / 80)
    assert sp.cascade_saved_bytes == pytest.approx(7 * 8192 * per_token)
    # the step model reads each sequence's whole context, prefix included: batch x prefix of it is the prefix
    s = stp.decode_step(dep, 8, 8192)
    assert s.kv_bytes_per_gpu == pytest.approx(sp.naive_read_bytes)
    assert s.kv_bytes_per_gpu == pytest.approx(8 * memory.kv_bytes_per_sequence("llama-3.1-70b", 8192) / 2)
    eta = stp.step_assumptions().kv_efficiency
    assert l2.cascade_saving_s(dep, 8, 8192) == pytest.approx(7 * 8192 * per_token / (eta * 4.8e12))
    pin, how = l2.prefix_pinning(dep, 8, 8192)
    assert how == "one layer at a time"  # the whole prefix is 36x the carve-out, one layer's fits
    assert l2.cascade_saving_s(dep, 8, 8192) > pin.saving_s
    # batch 1: nothing to share; pinning keeps only what stays resident across steps
    assert l2.cascade_saving_s(dep, 1, 8192) == 0.0
    one, how1 = l2.prefix_pinning(dep, 1, 8192)
    assert how1 == "whole prefix" and one.moved_bytes == pytest.approx(l2.persisting_max_bytes("h200"))
    # a prefix that fits whole is pinned whole, across steps
    small, how_s = l2.prefix_pinning(dep, 8, 100)
    assert how_s == "whole prefix" and small.moved_bytes == pytest.approx(8 * 100 * per_token)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"]),
       st.sampled_from(["h100-sxm", "h200", "b200"]), st.sampled_from([1, 2, 4, 8]), st.integers(1, 256),
       st.integers(1, 65536))
def test_cascade_beats_pinning(model, gpu, tp, batch, prefix):
    try:
        dep = Deployment(model, gpu, tp=tp)
    except ValueError:
        return
    prefix = min(prefix, dep.mdl.max_position_embeddings)
    pin, _ = l2.prefix_pinning(dep, batch, prefix)
    cascade = l2.cascade_saving_s(dep, batch, prefix)
    if batch > 1:  # removing a read beats serving it from L2, whatever fits in the carve-out
        assert cascade >= pin.saving_s * (1 - 1e-12) or pin.windows_per_step == 1
    assert pin.saving_s >= 0 and cascade >= 0


def test_lru_keeps():
    assert l2.lru_keeps(10e6, 30e6, "h200")
    assert not l2.lru_keeps(10e6, 60e6, "h200")  # 70 MB of traffic through a 62.9 MB L2


def _simulate(l2_lines, carve_lines, p_lines, s_lines, batch, layers, pinned):
    """Prefix-line misses of an LRU L2 with a persisting partition; sequences read one after another."""
    persist, normal, misses = OrderedDict(), OrderedDict(), 0
    cap_normal = l2_lines - (carve_lines if pinned else 0)
    for lay in range(layers):
        prefix = [("p", lay, i) for i in range(p_lines)]
        hot = set(prefix[:min(p_lines, carve_lines)]) if pinned else set()
        for b in range(batch):
            for line in prefix + [("s", lay, b, i) for i in range(s_lines)]:
                part, cap = (persist, carve_lines) if line in hot else (normal, cap_normal)
                if line in part:
                    part.move_to_end(line)
                    continue
                misses += line[0] == "p"
                part[line] = True
                if len(part) > cap:
                    part.popitem(last=False)
    return misses


@pytest.mark.parametrize("p_lines, s_lines, batch", [(40, 300, 4), (150, 400, 3), (300, 500, 5), (20, 10, 6)])
def test_per_layer_pinning_matches_a_simulated_l2(p_lines, s_lines, batch):
    l2_lines, carve_lines, layers = 267, 200, 3
    sim = _simulate(l2_lines, carve_lines, p_lines, s_lines, batch, layers, False) - _simulate(
        l2_lines, carve_lines, p_lines, s_lines, batch, layers, True)
    p = l2.pinning(float(p_lines), batch, "h200", windows_per_step=layers, resident_across_steps=False,
                   carveout_bytes=float(carve_lines))
    keeps = p_lines + s_lines <= l2_lines  # an unpinned LRU keeps the prefix between sequences
    want = 0 if keeps else p.moved_bytes
    assert sim == pytest.approx(want, abs=1)
