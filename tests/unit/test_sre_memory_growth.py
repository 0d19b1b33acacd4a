"""I081: suspects sized from the model, the seeded memory series and the diagnosis that names the leak."""

import math

import numpy as np
import pytest

from lib.perf.memory import memory_budget, nccl_buffer_bytes
from lib.registry.models import model
from lib.sre import memory_growth as mg

SETUPS = [("llama-3.1-70b", "h100-sxm", 4), ("llama-3.1-8b", "h100-sxm", 1), ("qwen2.5-72b", "h200", 2),
          ("llama-3.1-405b", "h200", 8)]


def _budget(m, g, tp):
    kw = {"weight_dtype": "fp8"} if m == "llama-3.1-405b" else {}
    return memory_budget(m, g, tp=tp, **kw)


def test_sizes_by_hand():
    b = memory_budget("llama-3.1-70b", "h100-sxm", tp=4)
    sus = mg.suspects(b, 2048, 256)
    m = model("llama-3.1-70b")
    assert sus["logits row"].size_bytes == m.vocab_size * 4  # FP32 logits, 128,256 entries
    assert sus["logits row"].size_bytes == 513_024
    assert sus["output logprobs"].size_bytes == 256 * 12
    assert sus["prompt hidden state"].size_bytes == 8192 * 2
    assert sus["NCCL communicator"].size_bytes == nccl_buffer_bytes("h100-sxm", 4)
    assert sus["leaked KV blocks"].size_bytes == math.ceil(2304 / 16) * b.block_bytes
    assert sus["prefix-cache metadata"].size_bytes == 128 * mg.host_bytes_per_block()
    assert sus["CUDA graph captures"].size_bytes == 51 * 20 * 2**20


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_suspect_alone_is_named(setup, seed):
    b = _budget(*setup)
    sus = mg.suspects(b, 2048, 256)
    for name, s in sus.items():
        if s.family != mg.NONE and s.size_bytes <= 0:
            with pytest.raises(ValueError, match="nothing to grow"):
                mg.simulate_series(b, name, 1.0, 3, 2048, 256, seed=seed)
            continue
        d = mg.diagnose(mg.simulate_series(b, name, 1.0, 3, 2048, 256, seed=seed), sus)
        assert d.named == name, (setup, name, d.verdicts)
        assert sum(v.startswith("named") for v in d.verdicts.values()) == 1
    clean = mg.diagnose(mg.simulate_series(b, None, 1.0, 3, 2048, 256, seed=seed), sus)
    assert clean.named is None and clean.fit.family == mg.NONE


def test_kv_leak_is_named_when_the_healthy_load_fills_the_pool():
    # 20 requests/s x 10 s = 200 running requests of 144 blocks: more than the pool holds, so the gauge reads
    # 100% with or without a leak; the running requests the engine admits tell the leaked blocks apart
    b = memory_budget("llama-3.1-70b", "h100-sxm", tp=2, weight_dtype="fp8")
    sus = mg.suspects(b, 2048, 256)
    assert 20.0 * 10 * sus["leaked KV blocks"].size_bytes / b.block_bytes > b.num_blocks
    for seed in (0, 1):
        se = mg.simulate_series(b, "leaked KV blocks", 20.0, 3, 2048, 256, seed=seed)
        assert np.all(se.kv_blocks_used <= b.num_blocks)
        assert mg.diagnose(se, sus).named == "leaked KV blocks"
        clean = mg.diagnose(mg.simulate_series(b, None, 20.0, 3, 2048, 256, seed=seed), sus)
        assert clean.named is None


@pytest.mark.parametrize("setup", [("llama-3.1-8b", "b200", 1), ("llama-3.1-405b", "h200", 8)])
def test_a_leak_is_named_when_visible_and_reads_flat_when_not(setup):
    # the page's window domain starts at 1.5 h (a bounded suspect settles with a 30-minute time constant)
    b = _budget(*setup)
    seen = hidden = 0
    for rate, hours, out in [(0.1, 1.5, 16), (0.1, 3, 2048), (1.0, 1.5, 16), (20.0, 1.5, 2048), (1.0, 24, 16)]:
        sus = mg.suspects(b, 256, out)
        for name in mg.SUSPECTS:
            if sus[name].family != mg.NONE and sus[name].size_bytes <= 0:
                continue
            se = mg.simulate_series(b, name, rate, hours, 256, out, seed=1)
            v, named = mg.visibility(se, sus), mg.diagnose(se, sus).named
            if v > 1.5:
                seen += 1
                assert named == name, (setup, rate, hours, name, v, named)
            elif v < 0.67:
                hidden += 1
                assert named is None, (setup, rate, hours, name, v, named)
    assert seen > 10 and hidden > 3
    assert math.isnan(mg.visibility(mg.simulate_series(b, None, 1.0, 2, 256, 16), mg.suspects(b, 256, 16)))


def test_bytes_per_request_recovers_the_injected_size():
    b = memory_budget("llama-3.1-70b", "h100-sxm", tp=4)
    sus = mg.suspects(b, 2048, 256)
    for name in ("logits row", "prompt hidden state", "output logprobs"):
        se = mg.simulate_series(b, name, 2.0, 4, 2048, 256, seed=3)
        fit = mg.growth_fit(se)
        tol = 0.05 if name == "output logprobs" else 0.01  # geometric output lengths add noise
        assert fit.bytes_per_request == pytest.approx(sus[name].size_bytes, rel=tol)


def test_unknown_size_is_not_forced_onto_a_suspect():
    b = memory_budget("llama-3.1-70b", "h100-sxm", tp=4)
    sus = mg.suspects(b, 2048, 256)
    # a tenth of requests keep a logits row: 51 KB a request, 3x the hidden state, 10x short of a row
    d = mg.diagnose(mg.simulate_series(b, "logits row", 1.0, 3, 2048, 256, seed=0, leak_fraction=0.1), sus)
    assert d.fit.family == mg.LINEAR and d.named is None
    assert d.measured_size == pytest.approx(0.1 * sus["logits row"].size_bytes, rel=0.05)


def test_time_to_oom_matches_the_simulated_oom():
    b = memory_budget("llama-3.1-70b", "h100-sxm", tp=4)
    sus = mg.suspects(b, 2048, 256)
    rate = 20.0
    se = mg.simulate_series(b, "logits row", rate, 2, 2048, 256, seed=5, sample_s=10)
    assert se.oom_s is not None
    want = mg.time_to_oom_s(b.headroom_margin_bytes, rate * sus["logits row"].size_bytes)
    assert abs(se.oom_s - want) <= 0.02 * want + 10  # one sample and Poisson noise
    # and the diagnosis on the truncated series still names it
    assert mg.diagnose(se, sus).named == "logits row"


def test_time_to_oom_edges():
    assert mg.time_to_oom_s(1e9, 0.0) == math.inf
    assert mg.time_to_oom_s(-1.0, 5.0) == 0.0
    assert mg.time_to_oom_s(3600e6, 1e6) == 3600


def test_linear_growth_rate_is_the_least_squares_slope():
    b = memory_budget("llama-3.1-8b", "h100-sxm", tp=1)
    se = mg.simulate_series(b, "logits row", 1.5, 2, 1024, 128, seed=9)
    fit = mg.growth_fit(se)
    # oracle: mean per-interval increment over mean interval length
    assert fit.rate_bytes_per_s == pytest.approx(
        float(np.mean(np.diff(se.used_bytes))) / 60.0, rel=0.02)


def test_validation():
    b = memory_budget("llama-3.1-8b", "h100-sxm", tp=1)
    with pytest.raises(ValueError, match="injected"):
        mg.simulate_series(b, "gremlins", 1.0, 1, 100, 10)
    with pytest.raises(ValueError, match="request_rate"):
        mg.simulate_series(b, None, 0.0, 1, 100, 10)
    with pytest.raises(ValueError, match="prompt_tokens"):
        mg.suspects(b, 0, 10)
    with pytest.raises(ValueError, match="request_rate"):
        mg.bytes_per_request(1.0, 0)
