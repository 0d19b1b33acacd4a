"""The mini serving engine (I063): unit cases, property tests, the simulator as oracle, the grader.

The oracle is :func:`lib.scheduling.simulate` under ``Policy(chunked_prefill=True,
preemption="recompute", order="fcfs", admission="greedy")`` (its defaults) with
``LinearCost(fixed_s=1)``: every step costs one second, so the simulator's clock counts steps
and an arrival at second k is an arrival before step k. Where the two engines' semantics
coincide they must agree exactly, and these quantities are compared:

* each non-idle step: its index (the simulator's start time), how many decodes it ran, its
  prefill chunks as (rid, tokens, position), and the KV blocks in use while it ran;
* each request: status (finished vs refused/rejected), preemptions, recomputed tokens, the step
  of its first token and of its last (the simulator's times are the step's end: index + 1), hence
  the completion order; and the run's length (the simulator's end time = the step count).

Why they agree: both build a step the same way (decodes first; running prefills in admission
order with min(left to prefill, budget left); admissions FCFS with recompute victims first, none
in a step that preempted, an admission that does not fit waits), both preempt the request admitted
last when a running request's KV cannot grow, and both refuse a request whose prompt +
max_tokens - 1 tokens exceed the pool. The mini engine finds "cannot grow" by asking the
allocator (OutOfBlocks) token by token; the simulator counts blocks ahead; the victims are the same
because each preemption frees the youngest's blocks until the need is met either way.

What cannot agree, and is not compared: token ids and EOS (the simulator has lengths only, so it
is given each request's output length from the model's continuation: EOS becomes a known output
length); arrivals in seconds under a real step cost (the mini engine has no clock: it counts
steps, and only a cost of one second per step maps one onto the other); and idle steps (the
simulator jumps over them, the mini engine records them empty, so only non-idle steps are paired).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache.allocator import BlockAllocator
from lib.scheduling import LinearCost, Policy, simulate
from lib.scheduling.mini_engine import (
    FakeModel,
    Job,
    MiniEngine,
    StepRecord,
    make_jobs,
    prefill_split,
    recompute_seconds,
    replay,
    serve,
    sim_requests,
    step_seconds,
)
from lib.scheduling.mini_engine_practice import (
    TEXT,
    VARIANTS,
    check,
    describe,
    run,
    skeleton,
    variant,
)


class CountingAllocator(BlockAllocator):
    """The real allocator, counting blocks taken off and put back on the free list."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.taken = self.returned = 0

    def _take_blocks(self, count):
        blocks = super()._take_blocks(count)
        self.taken += len(blocks)
        return blocks

    def free(self, seq_id):
        released = super().free(seq_id)
        self.returned += len(released)
        return released


@st.composite
def programs(draw, max_requests=9):
    """(jobs, num_blocks, block_size, budget, max_running, model): tight pools, EOS often."""
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    max_running = draw(st.integers(1, 6))
    budget = draw(st.integers(max_running, 48))
    model = FakeModel(draw(st.integers(0, 1000)), draw(st.sampled_from([6, 50, 1000])), eos=draw(st.sampled_from([None, 0])))
    n = draw(st.integers(1, max_requests))
    jobs = []
    for rid in range(n):
        p = draw(st.integers(1, 40))
        jobs.append(Job(rid, tuple(draw(st.lists(st.integers(1, model.vocab - 1), min_size=p, max_size=p))),
                        draw(st.integers(1, 14)), draw(st.sampled_from([0, 0, 0, 1, 3, 8, 20]))))
    need = max(-(-(len(j.prompt) + j.max_tokens - 1) // bs) for j in jobs)
    blocks = draw(st.integers(max(1, need // 2), 3 * need))  # some requests may not fit at all
    return jobs, blocks, bs, budget, max_running, model


def _served(prog, alloc_cls=BlockAllocator):
    jobs, blocks, bs, budget, max_running, model = prog
    alloc = alloc_cls(blocks, bs)
    return serve(jobs, alloc, model, budget, max_running), alloc


# ---- unit cases ------------------------------------------------------------------------------------


def test_fake_model_is_a_pure_function_and_stops_at_eos():
    m = FakeModel(seed=3, vocab=7, eos=0)
    assert m.next_token([1, 2, 3]) == m.next_token((1, 2, 3)) == FakeModel(3, 7, 0).next_token([1, 2, 3])
    assert FakeModel(seed=4, vocab=1000).next_token([1, 2, 3]) != FakeModel(seed=5, vocab=1000).next_token([1, 2, 3])
    out = m.continuation([5, 6], 200)
    assert out[-1] == 0 and 0 not in out[:-1] and len(out) < 200  # EOS ends it (p = 1/7 per token)
    assert FakeModel(vocab=1000).continuation([5], 12) == FakeModel(vocab=1000).continuation([5], 30)[:12]
    for bad in (dict(vocab=1), dict(eos=7, vocab=7), dict(seed=-1)):
        with pytest.raises(ValueError):
            FakeModel(**bad)


def test_a_long_prompt_is_chunked_under_the_budget_then_decoded():
    model = FakeModel(vocab=1000)
    got = []
    eng = MiniEngine(BlockAllocator(16, 4), model, token_budget=8, max_running=4)
    assert eng.submit(0, list(range(1, 21)), 3, got.append) == "waiting"
    steps = [eng.step() for _ in range(5)]
    assert [s.chunks for s in steps[:3]] == [((0, 8, 0),), ((0, 8, 8),), ((0, 4, 16),)]
    assert [s.decodes for s in steps] == [(), (), (), (0,), (0,)]
    assert got == model.continuation(list(range(1, 21)), 3)
    assert eng.status(0) == "finished" and eng.seqs[0].reason == "length" and eng.seqs[0].first_token == 2
    assert eng.alloc.num_free_blocks == 16 and not eng.alloc.seq_ids()


def test_decodes_come_first_and_prefill_gets_what_is_left():
    model = FakeModel(vocab=1000)
    eng = MiniEngine(BlockAllocator(64, 4), model, token_budget=8, max_running=4)
    eng.submit(0, [1, 2], 5)
    eng.submit(1, [3, 4], 5)
    eng.step()  # both prefilled in one step
    eng.submit(2, list(range(1, 31)), 2)
    rec = eng.step()
    assert rec.decodes == (0, 1) and rec.chunks == ((2, 6, 0),) and rec.tokens == 8
    assert rec.context_tokens == 3 + 3  # each decode reads its prompt + its first token


def test_refusal_is_exactly_the_pool_capacity():
    model = FakeModel(vocab=1000)
    eng = MiniEngine(BlockAllocator(4, 4), model, token_budget=8, max_running=2)
    assert eng.submit(0, list(range(1, 11)), 7) == "waiting"  # 10 + 7 - 1 = 16 KV tokens = the pool
    assert eng.submit(1, list(range(1, 11)), 8) == "refused"  # 17: can never finish
    assert "17 KV tokens" in eng.seqs[1].reason and "holds 16" in eng.seqs[1].reason
    assert eng.submit(2, [], 3) == "refused"  # an empty prompt has nothing to prefill
    while eng.running or eng.waiting:
        eng.step()
    assert eng.status(0) == "finished" and eng.seqs[0].preemptions == 0
    with pytest.raises(ValueError, match="already submitted"):
        eng.submit(0, [1], 1)


def test_without_refusal_a_too_long_request_preempts_itself_forever():
    model = FakeModel(vocab=1000)
    job = Job(0, tuple(range(1, 11)), 8)  # needs 17 KV tokens, the pool holds 16
    with pytest.raises(RuntimeError, match="not finished"):
        serve([job], BlockAllocator(4, 4), model, 8, 2, max_steps=300, engine_cls=variant("no_refusal"))
    assert serve([job], BlockAllocator(4, 4), model, 8, 2).seqs[0].status == "refused"


def test_a_dry_pool_preempts_the_youngest_and_the_stream_continues():
    model = FakeModel(vocab=1000)
    jobs = [Job(r, (1 + r, 2 + r, 3 + r), 6) for r in range(3)]
    srv = serve(jobs, BlockAllocator(6, 2), model, 16, 4)
    victims = [v for s in srv.steps for v in s.preempted]
    assert victims and victims[0] == 2  # admitted last
    for j in jobs:
        assert srv.streams[j.rid] == model.continuation(j.prompt, j.max_tokens)
    assert sum(s.recomputed for s in srv.seqs) > 0
    assert srv.engine.alloc.num_free_blocks == 6


def test_validation():
    with pytest.raises(ValueError, match="token_budget"):
        MiniEngine(BlockAllocator(4, 4), FakeModel(), token_budget=2, max_running=4)
    with pytest.raises(ValueError, match="max_tokens"):
        MiniEngine(BlockAllocator(4, 4), FakeModel(), 8, 2).submit(0, [1], 0)


def test_make_jobs_is_seeded():
    from lib.scheduling import Uniform, Workload

    wl = Workload(prompt=Uniform(4, 9), output=Uniform(2, 5), arrival="burst", n_requests=6)
    a, b = make_jobs(wl, 3, 50, arrival_gap_steps=2), make_jobs(wl, 3, 50, arrival_gap_steps=2)
    assert a == b and a != make_jobs(wl, 4, 50, 2)
    assert [j.arrival_step for j in a] == [0, 2, 4, 6, 8, 10]
    assert all(4 <= len(j.prompt) <= 9 and 2 <= j.max_tokens <= 5 and 0 < min(j.prompt) for j in a)


# ---- properties ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(programs())
def test_budget_conservation_streams_and_no_starvation(prog):
    jobs, blocks, bs, budget, max_running, model = prog
    srv, alloc = _served(prog, CountingAllocator)
    for rec in srv.steps:
        assert rec.tokens <= budget, "token budget exceeded"
        assert rec.used_blocks <= blocks and rec.running <= max_running
    assert alloc.taken == alloc.returned, "blocks allocated != blocks freed"
    assert alloc.num_free_blocks == blocks and not alloc.seq_ids()
    for j in jobs:
        s = srv.engine.seqs[j.rid]
        fits = len(j.prompt) + j.max_tokens - 1 <= blocks * bs
        assert s.status == ("finished" if fits else "refused"), "a request that fits must finish (no starvation)"
        if fits:  # the exact continuation, across any number of preemptions
            assert srv.streams[j.rid] == model.continuation(j.prompt, j.max_tokens)
            assert s.reason == ("eos" if srv.streams[j.rid][-1] == model.eos else "length")
        else:
            assert srv.streams[j.rid] == []


@settings(max_examples=200, deadline=None)
@given(programs(max_requests=7))
def test_every_rule_of_the_grader_holds_for_the_reference(prog):
    """The practice grader's step-by-step rules (leaks, youngest victim, victims before newcomers,
    decodes first, KV contents, budget) as a property of the reference, on hypothesis programs."""
    jobs, blocks, bs, budget, max_running, model = prog
    vocab = model.vocab
    ops = [("config", blocks, bs, budget, max_running, vocab)]
    ops += [("request", len(j.prompt), j.max_tokens, j.arrival_step) for j in jobs]
    run(MiniEngine, ops)


def test_the_properties_see_preemption_and_eos():
    """The strategies above do exercise preemption, EOS and refusal (else the properties prove little)."""
    rng = random.Random(0)
    pre = eos = refused = 0
    for _ in range(200):
        bs, mr = rng.choice([1, 2, 4]), rng.randint(1, 4)
        model = FakeModel(rng.randint(0, 99), rng.choice([6, 1000]), eos=0)
        jobs = [Job(r, tuple(rng.randint(1, model.vocab - 1) for _ in range(rng.randint(1, 30))), rng.randint(1, 12))
                for r in range(rng.randint(2, 7))]
        need = max(-(-(len(j.prompt) + j.max_tokens - 1) // bs) for j in jobs)
        srv = serve(jobs, BlockAllocator(rng.randint(max(1, need // 2), 2 * need), bs), model, rng.randint(mr, 24), mr)
        pre += sum(s.preemptions for s in srv.seqs)
        eos += sum(s.reason == "eos" for s in srv.seqs)
        refused += sum(s.status == "refused" for s in srv.seqs)
    assert pre > 50 and eos > 20 and refused > 5


# ---- the oracle: lib.scheduling.simulate --------------------------------------------------------


def _simulated(prog):
    jobs, blocks, bs, budget, max_running, model = prog
    cost = LinearCost(1.0, kv_blocks=blocks, block_size=bs, max_running=max_running, token_budget=budget)
    return simulate(sim_requests(jobs, model), Policy(token_budget=budget, max_running=max_running), cost)


@settings(max_examples=300, deadline=None)
@given(programs())
def test_matches_the_simulator_step_by_step(prog):
    jobs, blocks, *_ = prog
    srv, _ = _served(prog)
    res = _simulated(prog)
    tl = res.timeline
    want = [(int(t), int(d), tuple(ch), blocks - int(f))
            for t, d, ch, f in zip(tl.start_s, tl.decode_tokens, tl.chunks, tl.free_blocks, strict=True)]
    got = [(r.index, len(r.decodes), r.chunks, r.used_blocks) for r in srv.steps if r.tokens]
    assert got == want
    assert res.end_s == len(srv.steps)
    assert all(float(t).is_integer() for t in tl.start_s)
    for rec, s in zip(res.requests, srv.seqs, strict=True):
        assert (rec.status == "finished") == (s.status == "finished")
        assert (rec.status == "rejected") == (s.status == "refused")
        assert rec.preemptions == s.preemptions
        assert rec.recomputed_tokens == s.recomputed
        if s.status == "finished":
            assert rec.first_token_s == s.first_token + 1 and rec.finish_s == s.finished_at + 1
            assert rec.generated == len(srv.streams[s.rid])
    order = sorted((s.finished_at, s.rid) for s in srv.seqs if s.status == "finished")
    sim_order = sorted((r.finish_s, r.rid) for r in res.requests if r.status == "finished")
    assert [r for _, r in order] == [r for _, r in sim_order]


def test_the_oracle_sees_preemptions():
    model = FakeModel(vocab=1000)
    jobs = [Job(r, (1 + r, 2 + r, 3 + r), 6) for r in range(3)] + [Job(3, (5, 6), 2, 4)]
    prog = (jobs, 6, 2, 16, 4, model)
    srv, _ = _served(prog)
    res = _simulated(prog)
    assert sum(s.preemptions for s in srv.seqs) == res.counters["preemptions"] >= 1


@pytest.mark.parametrize("cost_kind", ["linear", "step_cost"])
def test_step_seconds_price_as_the_simulator_does(cost_kind):
    """With every request arriving at once, the step sequence does not depend on time, so the
    simulator's step durations under any cost equal :func:`step_seconds` of the mini engine's steps."""
    from lib.perf.deployment import Deployment
    from lib.scheduling import Uniform, Workload, step_cost

    if cost_kind == "linear":
        cost = LinearCost(0.004, 2e-4, 3e-7, 5e-5, kv_blocks=48, block_size=16, max_running=8, token_budget=128)
    else:
        cost = step_cost(Deployment("llama-3.1-8b", "h100-sxm"))
    model = FakeModel(seed=1, vocab=512, eos=0)
    jobs = make_jobs(Workload(prompt=Uniform(16, 200), output=Uniform(8, 80), arrival="burst", n_requests=14), 2, 512)
    srv = serve(jobs, BlockAllocator(48, 16), model, 128, 8)
    res = simulate(sim_requests(jobs, model), Policy(token_budget=128, max_running=8), cost, kv_blocks=48,
                   block_size=16)
    assert sum(s.preemptions for s in srv.seqs) > 0
    got = [t for t, r in zip(step_seconds(srv.steps, cost), srv.steps, strict=True) if r.tokens]
    assert got == pytest.approx(list(res.timeline.duration_s), rel=1e-12)
    assert sum(got) == pytest.approx(res.end_s, rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(programs())
def test_replay_reads_the_records_back(prog):
    """Recomputed tokens read back from the records equal the engine's own count; new prefill
    tokens are the prompts plus one per preemption of a request that had streamed a token; every
    preemption resumes after it happened."""
    jobs, blocks, bs, *_ = prog
    srv, _ = _served(prog)
    redo, events = replay(srv.steps)
    split = prefill_split(srv.steps)
    assert sum(map(sum, redo)) == sum(b for _, b in split) == sum(s.recomputed for s in srv.seqs)
    assert len(events) == sum(s.preemptions for s in srv.seqs)
    assert all(e.resumed is not None and e.resumed > e.step and e.lost >= 0 for e in events)
    served = [j for j in jobs if srv.engine.seqs[j.rid].status == "finished"]
    assert sum(a for a, _ in split) >= sum(len(j.prompt) for j in served)
    assert sum(a for a, _ in split) <= sum(len(j.prompt) for j in served) + len(events)


def test_recompute_seconds_prices_only_the_recomputed_part():
    model = FakeModel(vocab=1000)
    jobs = [Job(r, tuple(range(1 + r, 9 + r)), 10) for r in range(4)]
    srv = serve(jobs, BlockAllocator(10, 2), model, 16, 4)
    per_token = 1e-3
    cost = LinearCost(0.01, per_prefill_token_s=per_token, kv_blocks=10, block_size=2)
    assert srv.recomputed > 0
    assert recompute_seconds(srv.steps, cost) == pytest.approx(per_token * srv.recomputed)
    assert recompute_seconds(serve(jobs, BlockAllocator(64, 2), model, 16, 4).steps, cost) == 0


def test_the_explorer_and_its_ample_schedule():
    """The explorer's ample schedule (the simulator) equals the mini engine on that pool, and its
    view answers for the defaults with a figure."""
    from lib.book import widgets
    from lib.explorers import scheduling_engine as se

    jobs = se.workload_jobs(12)
    cost = LinearCost(0.005, 1e-4, 1e-7, 2e-5, kv_blocks=64, block_size=16)
    pair = se.run_pair(jobs, 40, 128, cost=cost)
    model = FakeModel(se.SEED, se.VOCAB, eos=0)
    big = serve(jobs, BlockAllocator(se.ample_blocks(jobs, se.BLOCK_SIZE), se.BLOCK_SIZE), model, 128, se.MAX_RUNNING)
    assert big.preemptions == pair.ample.preemptions == 0
    assert pair.ample.steps == len(big.steps) and pair.ample.used == [r.used_blocks for r in big.steps]
    assert pair.ample_s == pytest.approx(step_seconds(big.steps, cost), rel=1e-12)
    assert pair.dry.preemptions > 0 and len(pair.dry.steps) > pair.ample.steps
    view = widgets.render("scheduling.mini_engine", num_blocks=96, token_budget=256, n_requests=24)
    assert isinstance(view, widgets.View) and view.figure is not None and view.values["preemptions"] > 0
    tiny = widgets.render("scheduling.mini_engine", num_blocks=8, token_budget=16, n_requests=4)
    assert isinstance(tiny, widgets.View)  # a pool smaller than some requests: they are refused


def test_step_record_tokens():
    rec = StepRecord(0, (1, 2), ((3, 5, 0), (4, 2, 8)), (), (), 3, 10, 4, 0)
    assert rec.tokens == 9


# ---- the practice grader -------------------------------------------------------------------------


def test_practice_reference_passes():
    report = check(MiniEngine)
    assert report.passed, report.failure


def test_practice_reference_passes_many_random_programs():
    assert check(MiniEngine, num_random=400, seed=7).passed


KEYWORD = {
    "leak_on_preempt": "leaked",
    "budget_ignores_decodes": "over the token budget",
    "recompute_off_by_one": "sent twice",
    "restart_from_prompt": "started over",
    "victim_to_back": "newer work",
    "no_refusal": "refuse it at submit",
    "oldest_victim": "preempt the youngest",
}


@pytest.mark.parametrize("name", VARIANTS)
def test_practice_every_defect_fails_on_its_own_rule(name):
    report = check(variant(name))
    assert report.status == "failed", name
    assert "shrunk" in report.failure and KEYWORD[name] in report.failure, report.failure
    assert name in TEXT


@pytest.mark.parametrize("name", VARIANTS)
def test_random_programs_alone_catch_every_defect(name):
    from lib.scheduling.mini_engine_practice import cases

    caught = 0
    for case in cases(num_random=120, seed=1)[8:]:
        try:
            run(variant(name), case.ops)
        except AssertionError:
            caught += 1
    assert caught >= 3, f"{name}: the random programs alone catch it {caught} times"


def test_practice_skeleton_not_implemented_and_describe():
    assert check(skeleton).status == "not implemented"
    text = describe([("config", 5, 4, 6, 2, 1000), ("request", 2, 12, 3), ("request", 14, 2, 0)])
    assert "holds 20 KV tokens" in text and text.index("rid=1") < text.index("rid=0")
    with pytest.raises(ValueError):
        variant("nonsense")
    with pytest.raises(ValueError):
        check(3)


def test_practice_names_a_sequence_id_that_is_not_the_request_id():
    class Renamed:
        """The real allocator behind sequence ids ("seq", rid): a ledger the grader cannot map."""

        def __init__(self, alloc):
            self._a = alloc
            self.num_blocks, self.block_size = alloc.num_blocks, alloc.block_size

        def __getattr__(self, name):
            method = getattr(self._a, name)
            if name in ("allocate", "append_token", "free", "num_tokens", "tokens"):
                return lambda rid, *args: method(("seq", rid), *args)
            return method

    class Engine(MiniEngine):
        def __init__(self, alloc, model, token_budget, max_running):
            super().__init__(Renamed(alloc), model, token_budget, max_running)

    report = check(Engine, num_random=0)
    assert report.status == "failed" and "no submitted request id" in report.failure
