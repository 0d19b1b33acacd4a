"""lib.fleet.disaggregation: a prompt's KV hand-off, against hand arithmetic and a brute-force pipeline."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import disaggregation as d
from lib.perf.collectives import send
from lib.perf.deployment import deployment
from lib.registry import assumptions

NET_EFF = assumptions.value("collectives.network.bus_efficiency")
NET_LAT = assumptions.value("collectives.network.allreduce_latency_us") * 1e-6


@pytest.fixture(scope="module")
def dep70():
    return deployment("llama-3.1-70b", "h100-sxm", tp=8)


def test_kv_bytes_of_an_8k_prompt_by_hand(dep70):
    # 80 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 327,680 B per token; x 8192 = 2.68 GB
    assert d.kv_bytes(dep70, 8192) == 80 * 2 * 8 * 128 * 2 * 8192
    assert d.kv_bytes(dep70.replace(kv_dtype="fp8"), 8192) == 80 * 2 * 8 * 128 * 8192


def test_kv_bytes_is_the_memory_models_sequence_kv(dep70):
    from lib.perf.memory import kv_bytes_per_sequence

    for dep in (dep70, dep70.replace(kv_dtype="fp8")):
        assert d.kv_bytes(dep, 3000) == kv_bytes_per_sequence(dep.mdl, 3000, dep.kv_dtype)
    with pytest.raises(ValueError, match="prompt_len"):
        d.kv_bytes(dep70, 0)


def test_bulk_transfer_by_hand(dep70):
    # 8 lanes, each 1/8 of the bytes over one 400 Gb/s NIC (50 GB/s) at the network bus efficiency
    t = d.kv_transfer(dep70, 8192)
    per_lane = 80 * 2 * 8 * 128 * 2 * 8192 / 8
    assert t.lanes == 8 and t.messages == 1
    assert t.time_s == pytest.approx(NET_LAT + per_lane / (50e9 * NET_EFF), rel=1e-12)
    assert d.kv_transfer_s(dep70, 8192) == t.time_s
    assert t.time_s == send(per_lane, "h100-sxm", across_nodes=True).time_s


def test_block_hand_off_pays_one_latency_per_block(dep70):
    t = d.kv_transfer(dep70, 8192, granularity="block")
    blocks = -(-8192 // dep70.block_size)
    assert t.messages == 80 * blocks * 2
    assert t.latency_s == pytest.approx(t.messages * NET_LAT, rel=1e-12)
    # same bytes as bulk: the bandwidth part does not change, only the latency part
    assert t.bandwidth_s == pytest.approx(d.kv_transfer(dep70, 8192).bandwidth_s, rel=1e-9)


def test_lanes_are_the_smaller_replica(dep70):
    dec = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    assert d.kv_transfer(dep70, 4096, dec).lanes == 4
    assert d.kv_transfer(dec, 4096, dep70).lanes == 4


def test_bad_inputs_raise(dep70):
    with pytest.raises(ValueError, match="granularity"):
        d.kv_transfer(dep70, 100, granularity="page")
    with pytest.raises(ValueError, match="prompt_len"):
        d.kv_transfer(dep70, 0)
    with pytest.raises(ValueError, match="same model"):
        d.kv_transfer(dep70, 100, deployment("llama-3.1-8b", "h100-sxm"))
    with pytest.raises(ValueError, match="dep must be"):
        d.kv_transfer("llama", 100)


def _pipeline_brute_force(prefill_s, tau, layers):
    """Oracle: simulate layer l's send starting when both layer l is computed and the link is free."""
    link_free, per_layer = 0.0, prefill_s / layers
    for layer in range(1, layers + 1):
        start = max(layer * per_layer, link_free)
        link_free = start + tau
    return link_free - prefill_s


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 131072), prefill_s=st.floats(1e-4, 10))
def test_layerwise_exposure_matches_a_simulated_pipeline(dep70, p, prefill_s):
    t = d.kv_transfer(dep70, p, granularity="layer")
    tau = t.time_s / t.layers
    assert t.exposed_s(prefill_s) == pytest.approx(_pipeline_brute_force(prefill_s, tau, t.layers), rel=1e-9, abs=1e-12)
    assert tau <= t.exposed_s(prefill_s) + 1e-15 <= t.time_s + 1e-12


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 65536), q=st.integers(1, 65536))
def test_time_grows_with_the_prompt_and_with_the_message_count(dep70, p, q):
    lo, hi = sorted((p, q))
    assert d.kv_transfer_s(dep70, lo) <= d.kv_transfer_s(dep70, hi)
    bulk, layer, block = (d.kv_transfer_s(dep70, p, granularity=g) for g in d.GRANULARITIES)
    assert bulk <= layer <= block


# ---- colocated vs disaggregated capacity -------------------------------------------------------


@pytest.mark.parametrize("prompt,output", [(4096, 256), (1024, 512)])
def test_colocated_capacity_against_the_simulator(dep70, prompt, output):
    """Oracle: the discrete-event simulator with chunked prefill, at saturation, with the step's token budget."""
    import math

    from lib.scheduling.cost import step_cost
    from lib.scheduling.policies import Policy
    from lib.scheduling.replica import steady_run
    from lib.scheduling.workloads import Constant

    c = d.colocated_capacity(dep70, prompt, output, 0.03, 1.0)
    assert c.feasible and c.step_s <= 0.03 * (1 + 1e-9)
    pol = Policy(token_budget=round(c.decodes + c.chunk_tokens), max_running=math.ceil(c.decodes) + 1)
    n = max(100, 3 * math.ceil(c.decodes))
    run = steady_run(step_cost(dep70), Constant(prompt), Constant(output), 1.3 * c.rate, policy=pol, seed=2,
                     n_measured=n, n_warmup=n, n_cooldown=n // 2)
    assert run.tokens_per_s / output == pytest.approx(c.rate, rel=0.1)
    assert run.metrics.itl.p50 == pytest.approx(0.03, rel=0.1)


def test_colocated_capacity_when_the_kv_pool_binds(dep70):
    """Short prompts, long answers, a loose TPOT: the pool fills before the step reaches T, so the steady step is
    shorter than T and the rate is the pool's decodes over O steady steps (Little), not over O steps of T."""
    c = d.colocated_capacity(dep70, 256, 4096, 0.06, 0.1)
    assert c.feasible and c.binding == "the KV pool" and c.step_s < 0.06
    cap = dep70.budget.token_capacity
    assert c.decodes * (256 + 4096) + 256 == pytest.approx(cap, rel=1e-3)
    assert c.rate == pytest.approx(c.decodes / (4096 * c.step_s), rel=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.integers(256, 8192), st.integers(16, 2048), st.floats(0.02, 0.1))
def test_colocated_rate_is_decodes_over_output_steps(dep70, prompt, output, tpot):
    c = d.colocated_capacity(dep70, prompt, output, tpot, 2.0)
    if c.feasible:
        assert c.step_s <= tpot * (1 + 1e-9)
        assert c.rate == pytest.approx(c.decodes / (output * c.step_s), rel=1e-6)


def test_colocation_refuses_a_chunk_that_overruns_the_step(dep70):
    c = d.colocated_capacity(dep70, 32768, 256, 0.03, 0.5)
    assert not c.feasible and "over the 30 ms target" in c.reason and c.gpu_s == float("inf")


def test_longest_colocated_prompt_is_a_boundary(dep70):
    p = d.longest_colocated_prompt(dep70, 256, 0.03, 1.0)
    assert d.colocated_capacity(dep70, p, 256, 0.03, 1.0).feasible
    assert not d.colocated_capacity(dep70, p + 1, 256, 0.03, 1.0).feasible
    q = d.longest_disaggregated_prompt(dep70, dep70, 256, 0.03, 1.0)
    assert q >= p
    assert d.disaggregated_capacity(dep70, dep70, q, 256, 0.03).ttft_s <= 1.0
    assert d.disaggregated_capacity(dep70, dep70, q + 1, 256, 0.03).ttft_s > 1.0


def test_disaggregated_pieces_and_pool_sizes(dep70):
    from lib.perf.prefill import prefill_time
    from lib.perf.throughput import step_s

    x = d.disaggregated_capacity(dep70, dep70, 4096, 256, 0.03)
    assert x.prefill_s == prefill_time(dep70, 4096).time_s
    assert x.decode_rate == pytest.approx(x.batch / (256 * step_s(dep70, x.batch, 4096 + 128)))
    assert x.gpu_s == pytest.approx(8 * x.prefill_s + 8 / x.decode_rate)
    c = d.colocated_capacity(dep70, 4096, 256, 0.03, 1.0)
    sizes = d.pool_sizes(10.0, c, x, 0.7)
    assert sizes.prefill.exact == pytest.approx(10.0 * x.prefill_s / 0.7)
    assert sizes.decode.exact == pytest.approx(10.0 / x.decode_rate / 0.7)
    assert sizes.colocated.exact == pytest.approx(10.0 / c.rate / 0.7)
    assert sizes.prefill.gpus == 8 * sizes.prefill.replicas and sizes.decode.gpus == 8 * sizes.decode.replicas
    assert sizes.disaggregated_gpus == sizes.prefill.gpus + sizes.decode.gpus
    assert 0 < x.nic_utilization < 1 and 0 < x.decode_share < 1


def test_link_budget_by_hand(dep70):
    x = d.disaggregated_capacity(dep70, dep70, 8192, 256, 0.05)
    lb = d.link_budget(x)
    per_nic = 50e9 * NET_EFF
    assert lb.sender_nic_rate == pytest.approx(8 * per_nic / x.transfer.bytes_total, rel=1e-12)
    assert lb.sender_nic_utilization == pytest.approx(x.transfer.bytes_total / x.prefill_s / (8 * per_nic), rel=1e-12)
    assert lb.sender_held_bytes == pytest.approx(x.transfer.time_s * x.transfer.bytes_total / x.prefill_s)
    assert lb.receiver_rate == min(lb.receiver_kv_rate, lb.receiver_tpot_rate, lb.receiver_nic_rate)
    # 70B at 8k: the decode replica's memory gives out far below its NICs
    assert lb.receiver_binding == "KV memory" and lb.receiver_nic_utilization < 0.5
    assert lb.fan_in == pytest.approx(lb.receiver_rate * x.prefill_s)
    with pytest.raises(ValueError, match="Disaggregated"):
        d.link_budget("nope")


@pytest.mark.parametrize("granularity", ["layer", "bulk"])
def test_disaggregated_within_is_capacity_meeting_both_targets(dep70, granularity):
    """disaggregated_within checks the TTFT before the decode side's batch search; it must return
    disaggregated_capacity exactly when that meets both targets, and None otherwise."""
    seen = set()
    for p in (512, 4096, 30000, 120000):
        for tpot, ttft in ((0.01, 0.3), (0.03, 1.0), (0.1, 5.0), (0.008, 10.0)):
            full = d.disaggregated_capacity(dep70, dep70, p, 256, tpot, granularity=granularity)
            got = d.disaggregated_within(dep70, dep70, p, 256, tpot, ttft, granularity=granularity)
            ok = full.batch >= 1 and full.ttft_s <= ttft
            seen.add(ok)
            assert (got == full) if ok else got is None, (p, tpot, ttft)
    assert seen == {True, False}
    with pytest.raises(ValueError, match="ttft_s"):
        d.disaggregated_within(dep70, dep70, 512, 256, 0.03, 0.0)
