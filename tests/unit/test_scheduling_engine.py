"""The serving-replica simulator: exact single-request oracles, policy behaviours, and property
tests of its invariants (token budget, KV conservation, resumption after preemption, no
starvation, determinism)."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.kvcache.allocator import OutOfBlocks
from lib.perf.deployment import Deployment
from lib.scheduling import (
    SLO,
    Constant,
    KVPool,
    LinearCost,
    LogNormal,
    Policy,
    Request,
    Workload,
    mix,
    simulate,
    step_cost,
    trace,
)
from lib.scheduling import engine as engine_module

DEP = Deployment("llama-3.1-8b", "h100-sxm")


def check_invariants(res):
    """What every run must satisfy; returns the result for chaining."""
    tl, c = res.timeline, res.counters
    assert (tl.decode_tokens + tl.prefill_tokens <= c["token_budget"]).all(), "token budget exceeded"
    assert (tl.running <= c["max_running"]).all()
    assert (tl.duration_s > 0).all()
    assert (tl.free_blocks >= 0).all() and (tl.free_blocks <= c["kv_blocks"]).all()
    assert np.all(np.diff(tl.start_s) > 0)
    for cls, cap in c["class_blocks_cap"].items():
        assert c["class_blocks_peak"].get(cls, 0) <= cap, "a class exceeded its KV share"
    if res.complete:  # conservation: everything handed out came back
        assert c["blocks_allocated"] == c["blocks_freed"]
        assert c["free_blocks_end"] == c["kv_blocks"]
        assert c["live_sequences_end"] == 0
        assert c["unfinished"] == 0
        assert c["finished"] + c["rejected"] + c["expired"] == len(res.requests)
    # token conservation: every decode token of the timeline is a token some request emitted
    # (its other tokens come out of its prefill passes), and every prefill token is its prompt
    # or KV that a recompute preemption discarded (re-prefilled: discarded + 1 per pass)
    assert tl.decode_tokens.sum() == sum(r.generated - r.prefills for r in res.requests)
    prefilled = {}
    for chunks in tl.chunks:
        for rid, n, _ in chunks:
            prefilled[rid] = prefilled.get(rid, 0) + n
    for r in res.requests:
        if r.status != "finished":
            continue
        t = res.token_times(r.rid)
        assert len(t) == r.output_len == r.generated, "a request produced the wrong number of tokens"
        assert np.all(np.diff(t) > 0)
        assert t[0] == r.first_token_s and t[-1] == pytest.approx(r.finish_s, abs=1e-9)
        assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
        assert prefilled[r.rid] == r.prompt_len + r.recomputed_tokens + (r.prefills - 1)
        if r.preemptions == 0:
            assert r.prefills == 1 and r.recomputed_tokens == 0
    return res


# ---- exact oracles on tiny cases -------------------------------------------------------------


def test_single_request_steps_are_the_step_models():
    cost = step_cost(DEP)
    p, o = 1000, 6
    res = check_invariants(simulate([Request(0, 0.0, p, o)], Policy(), cost))
    t = res.token_times(0)
    assert t[0] == pytest.approx(cost.step_s(0, 0, [(p, 0)]), rel=1e-12)
    # decode g (g = 1..o-1) reads p + g cached tokens
    want = [cost.step_s(1, p + g) for g in range(1, o)]
    assert np.diff(t) == pytest.approx(want, rel=1e-12)


def test_long_prompt_is_chunked_by_the_budget():
    cost = step_cost(DEP)
    budget = DEP.max_num_batched_tokens
    p = 2 * budget + 1000
    res = simulate([Request(0, 0.0, p, 2)], Policy(), cost)
    assert [ch for ch in res.timeline.chunks if ch] == [
        ((0, budget, 0),), ((0, budget, budget),), ((0, 1000, 2 * budget),)]
    want = sum(cost.step_s(0, 0, [(c, pos)]) for c, pos in [(budget, 0), (budget, budget), (1000, 2 * budget)])
    assert res.requests[0].ttft_s == pytest.approx(want, rel=1e-12)


def test_a_prefill_joining_running_decodes_is_one_mixed_step():
    cost = step_cost(DEP)
    reqs = [Request(0, 0.0, 500, 50), Request(1, 0.05, 300, 5)]
    res = check_invariants(simulate(reqs, Policy(), cost))
    tl = res.timeline
    k = next(i for i, ch in enumerate(tl.chunks) if ch and ch[0][0] == 1)
    assert tl.decode_tokens[k] == 1 and tl.prefill_tokens[k] == 300
    assert tl.duration_s[k] == pytest.approx(cost.step_s(1, tl.context_tokens[k], [(300, 0)]), rel=1e-12)
    assert tl.duration_s[k] > cost.step_s(1, tl.context_tokens[k])  # the decode's gap grows


def test_prefill_first_stalls_decodes_and_decode_first_does_not():
    cost = step_cost(DEP)
    reqs = [Request(0, 0.0, 200, 40), Request(1, 0.05, 8000, 2)]
    stalled = simulate(reqs, Policy(step_mix="prefill_first"), cost)
    mixed = simulate(reqs, Policy(step_mix="decode_first"), cost)
    k = next(i for i, ch in enumerate(stalled.timeline.chunks) if ch and ch[0][0] == 1)
    assert stalled.timeline.decode_tokens[k] == 0
    assert mixed.timeline.decode_tokens[next(i for i, ch in enumerate(mixed.timeline.chunks)
                                             if ch and ch[0][0] == 1)] == 1
    assert stalled.max_gaps()[0] > mixed.max_gaps()[0] * 0.99


def test_static_batch_waits_for_its_longest_member():
    cost = LinearCost(fixed_s=0.1, max_running=4, token_budget=4096)
    reqs = trace([(0.0, 10, 1), (0.0, 10, 5), (0.0, 10, 2), (0.0, 10, 3), (0.01, 10, 1)])
    res = check_invariants(simulate(reqs, Policy(batching="static"), cost, kv_blocks=64))
    r = res.requests
    # one prefill step, then 4 decode steps for the 5-token member; the fifth waits for all that
    assert [x.finish_s for x in r[:4]] == pytest.approx([0.1, 0.5, 0.2, 0.3])
    assert r[4].first_scheduled_s == pytest.approx(0.5)
    assert list(res.timeline.padding[:5]) == [0, 1, 2, 3, 3]  # finished members keep their slot


def test_fixed_cost_batcher_fires_on_size_or_timeout():
    cost = LinearCost(fixed_s=0.1, max_running=8, token_budget=8192)
    # 3 arrive together; a 0.05 s window passes before the batch fires with fewer than 8
    reqs = trace([(0.0, 10, 1), (0.01, 10, 1), (0.02, 10, 1)])
    res = simulate(reqs, Policy(batching="static", batch_timeout_s=0.05), cost, kv_blocks=64)
    assert [x.first_scheduled_s for x in res.requests] == pytest.approx([0.05] * 3)
    assert [x.e2e_s for x in res.requests] == pytest.approx([0.15, 0.14, 0.13])
    full = trace([(0.001 * i, 10, 1) for i in range(8)])
    res = simulate(full, Policy(batching="static", batch_timeout_s=10.0), cost, kv_blocks=64)
    assert res.requests[0].first_scheduled_s == pytest.approx(0.007)  # fired on size


def test_recompute_victim_reprefills_prompt_plus_generated():
    cost = LinearCost(per_seq_s=0.01, per_prefill_token_s=1e-4, max_running=4, token_budget=256)
    reqs = trace([(0.0, 32, 40), (0.0, 32, 40)])
    # 2 x (32 + 40) tokens need 2 x 5 blocks of 16 at the end; 8 blocks force a preemption
    res = check_invariants(simulate(reqs, Policy(), cost, kv_blocks=8, block_size=16))
    victim = res.requests[1]
    assert victim.preemptions >= 1 and victim.recomputed_tokens > 0
    chunks = [ch for step in res.timeline.chunks for ch in step if ch[0] == 1]
    assert chunks[0] == (1, 32, 0) and chunks[1][1] > 32  # prompt + generated re-prefilled
    assert victim.generated == 40


def test_swap_victim_comes_back_with_its_kv_and_pays_the_host_link():
    cost = LinearCost(per_seq_s=0.01, per_prefill_token_s=1e-4, swap_s_per_token=1e-5,
                      max_running=4, token_budget=256)
    reqs = trace([(0.0, 32, 40), (0.0, 32, 40)])
    res = check_invariants(simulate(reqs, Policy(preemption="swap"), cost, kv_blocks=8, block_size=16))
    victim = res.requests[1]
    assert victim.swaps >= 1 and victim.recomputed_tokens == 0
    assert res.timeline.swap_s.sum() > 0
    assert sum(ch[1] for step in res.timeline.chunks for ch in step if ch[0] == 1) == 32


def test_reserve_admission_never_preempts_and_refunds():
    cost = LinearCost(per_seq_s=0.01, per_prefill_token_s=1e-4, max_running=8, token_budget=512)
    reqs = tuple(Request(i, 0.01 * i, 40, 10 + i, max_tokens=64) for i in range(12))
    res = check_invariants(simulate(reqs, Policy(admission="reserve"), cost, kv_blocks=24, block_size=16))
    assert res.counters["preemptions"] == 0
    for r in res.requests:  # reserved ceil((40 + 63) / 16) = 7 blocks, used ceil((40 + o - 1) / 16)
        assert r.refunded_blocks == 7 - math.ceil((40 + r.output_len - 1) / 16)
    greedy = check_invariants(simulate(reqs, Policy(), cost, kv_blocks=24, block_size=16))
    assert greedy.requests[-1].finish_s <= res.requests[-1].finish_s  # reserving costs concurrency


def test_fail_fast_queue_limit_and_expiry():
    cost = LinearCost(fixed_s=0.5, max_running=1, token_budget=64)
    reqs = trace([(0.0, 10, 1), (0.0, 10, 1), (0.0, 10, 1), (0.0, 1000, 1), (0.1, 10, 1)])
    res = check_invariants(simulate(reqs, Policy(queue_limit=2, chunked_prefill=False), cost, kv_blocks=4,
                                    block_size=16))
    assert [r.reason for r in res.requests] == ["", "", "queue_full", "never_fits", ""]
    res = check_invariants(simulate(reqs[:3], Policy(max_queue_wait_s=0.6), cost, kv_blocks=4, block_size=16))
    assert [r.status for r in res.requests] == ["finished", "finished", "expired"]


def test_kv_share_cap_bounds_a_class_and_lets_others_pass():
    cost = LinearCost(per_seq_s=0.01, per_prefill_token_s=1e-5, max_running=16, token_budget=4096)
    batch = Workload(prompt=200, output=100, rate=50.0, n_requests=20, priority=1)
    chat = Workload(prompt=50, output=20, rate=20.0, n_requests=20, priority=0)
    reqs = mix([batch, chat], seed=0)
    capped = check_invariants(simulate(reqs, Policy(use_priority=True, kv_share_cap={1: 0.25}), cost,
                                       kv_blocks=160, block_size=16))
    free = check_invariants(simulate(reqs, Policy(use_priority=True), cost, kv_blocks=160, block_size=16))
    assert capped.counters["class_blocks_peak"][1] <= 40 < free.counters["class_blocks_peak"][1]
    assert capped.metrics(priority=0).ttft.p99 <= free.metrics(priority=0).ttft.p99


def test_spf_serves_short_prompts_first():
    cost = LinearCost(per_prefill_token_s=1e-3, max_running=1, token_budget=1 << 14)
    reqs = trace([(0.0, 100, 1), (0.01, 5000, 1)] + [(0.02, 50, 1)] * 5)
    fcfs = simulate(reqs, Policy(chunked_prefill=False), cost, kv_blocks=64, block_size=256)
    spf = simulate(reqs, Policy(chunked_prefill=False, order="spf"), cost, kv_blocks=64, block_size=256)
    short = [2, 3, 4, 5, 6]
    assert max(spf.requests[i].ttft_s for i in short) < min(fcfs.requests[i].ttft_s for i in short)


def test_deterministic_given_seed_and_sensitive_to_it():
    w = Workload(prompt=LogNormal(300, 1.0, cap=4000), output=LogNormal(80, 1.0, cap=1000), rate=30.0,
                 n_requests=400)
    a = simulate(w, Policy(preemption="swap"), DEP, seed=7, kv_blocks=1500)
    b = simulate(w, Policy(preemption="swap"), DEP, seed=7, kv_blocks=1500)
    c = simulate(w, Policy(preemption="swap"), DEP, seed=8, kv_blocks=1500)
    assert a.requests == b.requests
    assert np.array_equal(a.timeline.duration_s, b.timeline.duration_s)
    assert a.requests != c.requests


def test_metrics_and_goodput():
    w = Workload(prompt=Constant(500), output=Constant(100), rate=20.0, n_requests=300)
    res = check_invariants(simulate(w, Policy(), DEP))
    m = res.metrics(SLO(ttft_s=10.0, tpot_s=1.0))
    assert m.finished == 300 and m.slo_attainment == 1.0
    assert m.goodput_requests_per_s == pytest.approx(m.requests_per_s)
    strict = res.metrics(SLO(ttft_s=1e-6))
    assert strict.goodput_requests_per_s == 0 and strict.slo_attainment == 0
    assert m.itl.n == 300 * 99
    assert m.tpot.mean == pytest.approx(res.array("tpot_s").mean())


def test_validation_messages():
    with pytest.raises(ValueError, match="batching must be one of continuous, static"):
        Policy(batching="dynamic")
    with pytest.raises(ValueError, match="token_budget=8 must be >= max_running=16"):
        Policy(max_running=16, token_budget=8)
    with pytest.raises(ValueError, match="kv_share_cap fraction must be a number in"):
        Policy(kv_share_cap={1: 1.5})
    with pytest.raises(ValueError, match="unknown Policy field"):
        Policy().replace(bogus=1)
    with pytest.raises(ValueError, match="cost must offer step_s and swap_s"):
        simulate([Request(0, 0.0, 1, 1)], Policy(), None)
    with pytest.raises(ValueError, match="request ids must be 0..n-1"):
        simulate([Request(3, 0.0, 1, 1)], Policy(), LinearCost(fixed_s=1))
    with pytest.raises(ValueError, match="max_running=2048 exceeds the cost table's max_batch"):
        simulate([Request(0, 0.0, 1, 1)], Policy(max_running=2048, token_budget=4096), DEP)
    with pytest.raises(ValueError, match="kv_blocks must be an integer >= 1"):
        simulate([Request(0, 0.0, 1, 1)], Policy(), LinearCost(fixed_s=1), kv_blocks=0)


def test_max_steps_stops_early_and_says_so():
    w = Workload(prompt=500, output=200, rate=50.0, n_requests=200)
    res = simulate(w, Policy(), DEP, max_steps=50)
    assert not res.complete and len(res.timeline) == 50
    assert res.counters["unfinished"] > 0
    check_invariants(res)


# ---- the KV pool (counts) ----------------------------------------------------------------------


def test_kv_pool_conserves_blocks_and_grows_all_or_nothing():
    pool = KVPool(10, 16)
    assert (pool.free, pool.sequences, pool.blocks_for(33)) == (10, 0, 3)
    pool.grow("a", 0, 4)
    pool.grow("a", 4, 1)
    pool.grow("b", 0, 3)
    assert (pool.free, pool.held("a"), pool.held("b"), pool.sequences) == (2, 5, 3, 2)
    with pytest.raises(OutOfBlocks, match="3 blocks asked, 2 free"):
        pool.grow("b", 3, 3)
    with pytest.raises(OutOfBlocks):
        pool.grow("c", 0, 3)
    assert (pool.free, pool.held("b"), pool.held("c"), pool.sequences, pool.allocated) == (2, 3, 0, 2, 8)
    with pytest.raises(ValueError, match="holds 5 blocks, the caller says 4"):
        pool.grow("a", 4, 1)  # the caller's count and the pool's disagree
    with pytest.raises(ValueError, match="n must be >= 1"):
        pool.grow("a", 5, 0)
    assert pool.release("a") == 5
    with pytest.raises(ValueError, match="holds no blocks"):
        pool.release("a")  # a block is never freed twice
    assert pool.allocated - pool.freed == pool.num_blocks - pool.free == pool.held("b") == 3
    assert pool.release("b") == 3 and (pool.free, pool.sequences, pool.freed) == (10, 0, 8)


def test_kv_pool_admits_what_the_paged_allocator_admits():
    """Sequences of ``tokens`` tokens until the pool refuses: the count the real paged allocator
    (lib.kvcache.allocator) gives for the same pool, block by block."""
    from lib.kvcache.allocator import BlockAllocator

    for blocks, size, tokens in ((100, 16, 40), (64, 4, 17), (7, 16, 16)):
        pool, alloc = KVPool(blocks, size), BlockAllocator(blocks, size)
        n_pool = n_alloc = 0
        while pool.free >= pool.blocks_for(tokens):
            pool.grow(n_pool, 0, pool.blocks_for(tokens))
            n_pool += 1
        while True:
            try:
                alloc.allocate(n_alloc, range(tokens))
            except OutOfBlocks:
                break
            n_alloc += 1
        assert n_pool == n_alloc and pool.free == alloc.num_free_blocks


def test_simulate_restores_the_garbage_collector():
    import gc

    reqs = [Request(0, 0.0, 10, 5)]
    assert gc.isenabled()
    simulate(reqs, Policy(), LinearCost(fixed_s=0.01))
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(reqs, Policy(), LinearCost(fixed_s=0.01))
        assert not gc.isenabled()
    finally:
        gc.enable()


# ---- property tests ----------------------------------------------------------------------------

requests_st = st.lists(
    st.tuples(st.floats(0, 0.3), st.integers(1, 120), st.integers(1, 150), st.integers(0, 1),
              st.sampled_from([0, 0, 10, 40])),
    min_size=1, max_size=30,
).map(lambda rows: trace([(t, p, o, c, o + extra) for t, p, o, c, extra in rows]))

policy_st = st.builds(
    Policy,
    batching=st.sampled_from(["continuous", "continuous", "continuous", "static"]),
    max_running=st.integers(1, 8),
    token_budget=st.sampled_from([8, 64, 256, 512]),
    step_mix=st.sampled_from(["decode_first", "prefill_first"]),
    chunked_prefill=st.sampled_from([True, True, False]),
    long_prefill_cap=st.sampled_from([None, None, 16]),
    order=st.sampled_from(["fcfs", "spf"]),
    use_priority=st.booleans(),
    kv_share_cap=st.sampled_from([None, None, {1: 0.5}]),
    preemption=st.sampled_from(["recompute", "swap"]),
    swap_space_blocks=st.sampled_from([None, None, 0, 8]),
    admission=st.sampled_from(["greedy", "greedy", "reserve"]),
    watermark=st.sampled_from([0.0, 0.0, 0.05]),
    queue_limit=st.sampled_from([None, None, None, 3]),
    max_queue_wait_s=st.sampled_from([None, None, None, 0.02]),
    batch_timeout_s=st.sampled_from([0.0, 0.05]),
)

COST = LinearCost(fixed_s=0.002, per_seq_s=0.001, per_context_token_s=1e-6, per_prefill_token_s=2e-5,
                  swap_s_per_token=1e-6, max_running=8, token_budget=512)


@st.composite
def scenario(draw):
    """Requests, a policy, and a pool of one to two times the largest request's worst case (so
    most requests fit and the pool binds: preemptions, swaps and refusals all happen)."""
    reqs = draw(requests_st)
    block_size = draw(st.sampled_from([4, 16]))
    top = max(math.ceil((r.prompt_len + r.max_tokens - 1) / block_size) for r in reqs)
    kv_blocks = draw(st.integers(top, 2 * top))
    return reqs, draw(policy_st), kv_blocks, block_size


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenario())
def test_invariants_hold_for_any_policy(case):
    reqs, pol, kv_blocks, block_size = case
    res = simulate(reqs, pol, COST, kv_blocks=kv_blocks, block_size=block_size, max_steps=200_000)
    assert res.complete, "the run did not end (livelock)"
    check_invariants(res)


@settings(max_examples=60, deadline=None)
@given(reqs=requests_st, kv_blocks=st.integers(8, 60), preemption=st.sampled_from(["recompute", "swap"]))
def test_fcfs_with_finite_load_serves_everyone(reqs, kv_blocks, preemption):
    """No starvation: with no rejection rule, every request that can fit the pool finishes."""
    res = check_invariants(simulate(reqs, Policy(preemption=preemption), COST, kv_blocks=kv_blocks,
                                    block_size=16, max_steps=200_000))
    assert res.complete
    for r in res.requests:
        fits = math.ceil((r.prompt_len + r.max_tokens - 1) / 16) <= kv_blocks
        assert r.status == ("finished" if fits else "rejected")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), kv_blocks=st.integers(200, 3000),
       policy=st.sampled_from([Policy(), Policy(preemption="swap"), Policy(admission="reserve"),
                               Policy(step_mix="prefill_first", chunked_prefill=False, token_budget=16384),
                               Policy(order="spf", long_prefill_cap=1024, max_running=64)]))
def test_invariants_on_the_real_step_model(seed, kv_blocks, policy):
    w = Workload(prompt=LogNormal(800, 1.0, cap=12000), output=LogNormal(100, 1.0, cap=1500), rate=40.0,
                 n_requests=60)
    res = simulate(w, policy, DEP, seed=seed, kv_blocks=kv_blocks, max_steps=200_000)
    assert res.complete
    check_invariants(res)


def assert_same_result(a, b):
    """Two runs agree exactly: records, every timeline column, token times, counters."""
    assert a.requests == b.requests  # (nan fields are the same math.nan object)
    for name in ("start_s", "duration_s", "decode_tokens", "prefill_tokens", "padding", "running", "waiting",
                 "swapped", "free_blocks", "preemptions", "swap_s", "context_tokens"):
        x, y = getattr(a.timeline, name), getattr(b.timeline, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.timeline.chunks == b.timeline.chunks
    assert a.counters == b.counters and a.end_s == b.end_s and a.complete == b.complete
    assert np.array_equal(a._tokens()[0], b._tokens()[0]) and np.array_equal(a._tokens()[1], b._tokens()[1])


def simulate_counting_runs(*args, **kw):
    """simulate(*args, **kw) and how many of its steps the decode runs made."""
    made = []
    run = engine_module._Engine._decode_run

    def counted(self, steps):
        total, ran = run(self, steps)
        made.append(total - steps)
        return total, ran

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module._Engine, "_decode_run", counted)
        res = simulate(*args, **kw)
    return res, sum(made)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenario(), max_steps=st.sampled_from([200_000, 200_000, 5, 60]),
       horizon_s=st.sampled_from([None, None, 0.05]))
def test_decode_runs_are_the_general_step(case, max_steps, horizon_s):
    """The engine's fast path (runs of decode-only steps, _decode_run) gives exactly what building
    every step with the general _step gives."""
    reqs, pol, kv_blocks, block_size = case
    kw = dict(kv_blocks=kv_blocks, block_size=block_size, max_steps=max_steps, horizon_s=horizon_s)
    fast = simulate(reqs, pol, COST, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module._Engine, "_decode_only", lambda self: False)
        slow = simulate(reqs, pol, COST, **kw)
    assert len(slow.timeline) == len(fast.timeline)
    assert_same_result(fast, slow)
    if fast.complete:
        check_invariants(fast)


@pytest.mark.parametrize("policy", [Policy(), Policy(preemption="swap"), Policy(use_priority=True, kv_share_cap={1: 0.3}),
                                    Policy(batching="static", max_running=16), Policy(step_mix="prefill_first")])
def test_decode_runs_are_the_general_step_on_the_step_model(policy):
    w = mix([Workload(prompt=LogNormal(600, 0.8, cap=6000), output=LogNormal(120, 0.7, cap=800), rate=25.0,
                      n_requests=80),
             Workload(prompt=LogNormal(300, 0.5), output=LogNormal(60, 0.5), rate=10.0, n_requests=30, priority=1)])
    fast, in_runs = simulate_counting_runs(w, policy, DEP, kv_blocks=900)
    assert in_runs > len(fast.timeline) / 2  # most steps came out of decode runs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module._Engine, "_decode_only", lambda self: False)
        slow = simulate(w, policy, DEP, kv_blocks=900)
    assert_same_result(fast, slow)

