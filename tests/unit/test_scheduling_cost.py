"""Step costs: the table reproduces the book's step models (decode_step, prefill_time,
prefill_chunk_step_s, fetch_time_s) within stated tolerances; analytic costs do what they say."""

import math
import random

import pytest

from lib.kvcache.long_context import prefill_chunk_step_s
from lib.kvcache.recompute_fetch import fetch_time_s, storage_tier
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.perf.step import decode_step, step_assumptions
from lib.scheduling.cost import REL_TOL, FunctionCost, LinearCost, StepCost, exact_step_s, step_cost

# Tolerances (relative): decode steps with CUDA graphs are interpolated in the batch between
# grid points refined until each midpoint is within REL_TOL (1e-3); the context term is exactly
# linear. Eager launch hiding makes the step non-separable: a 2-D table, within 2%. Prefill
# passes are exact at grid tokens and linear between: within 1e-3.
DECODE_TOL = 2 * REL_TOL
EAGER_TOL = 0.02
EXACT = 1e-9

DEPS = {
    "8b-h100": Deployment("llama-3.1-8b", "h100-sxm"),
    "70b-tp8": Deployment("llama-3.1-70b", "h100-sxm", tp=8),
    "mixtral-tp2": Deployment("mixtral-8x7b", "h100-sxm", tp=2),
}


@pytest.fixture(scope="module", params=sorted(DEPS))
def dep_cost(request):
    dep = DEPS[request.param]
    return dep, step_cost(dep)


def test_decode_table_matches_decode_step(dep_cost):
    dep, cost = dep_cost
    rng = random.Random(1)
    for _ in range(25):
        d = rng.randint(1, cost.max_batch)
        c = rng.randint(0, 30000)
        want = decode_step(dep, d, c).total_s
        assert cost.step_s(d, d * c) == pytest.approx(want, rel=DECODE_TOL), (d, c)
        assert cost.decode_s(d, d * c) == cost.step_s(d, d * c)


def test_whole_prompt_prefill_is_prefill_time_plus_host(dep_cost):
    dep, cost = dep_cost
    host = step_assumptions().sampling_s + step_assumptions().scheduler_s
    for p in (1, 16, 64, 100, 777, 4096, 8192, 32768, 100_000):
        want = prefill_time(dep, p).time_s + host
        got = cost.step_s(0, 0, [(p, 0)])
        tol = EXACT if p <= 64 else 1e-3  # exact on the dense part of the token grid
        assert got == pytest.approx(want, rel=tol), p


def test_chunk_step_is_prefill_chunk_step_s_plus_host(dep_cost):
    dep, cost = dep_cost
    rng = random.Random(2)
    for _ in range(20):
        c, p, other = rng.randint(1, 8192), rng.randint(0, 60000), rng.randint(0, 64)
        want = prefill_chunk_step_s(dep, c, p, other) + cost.host_s
        # `other` tokens as decodes without cache: differs from the chunk step by their own
        # self-attention pair (a / R each), far below the tolerance
        got = cost.pass_s(other, [(c, p)])
        assert got == pytest.approx(want, rel=1e-3), (c, p, other)


def test_mixed_step_matches_exact_definition(dep_cost):
    dep, cost = dep_cost
    rng = random.Random(3)
    for _ in range(20):
        d = rng.randint(0, min(256, cost.max_batch))
        c = rng.randint(0, 20000)
        chunks = [(rng.randint(1, 3000), rng.randint(0, 30000)) for _ in range(rng.randint(1, 3))]
        want = exact_step_s(dep, d, c, chunks)
        assert cost.step_s(d, d * c, chunks) == pytest.approx(want, rel=DECODE_TOL), (d, c, chunks)


def test_mixed_step_is_never_faster_than_its_parts(dep_cost):
    dep, cost = dep_cost
    for d, c, chunk in [(1, 100, 1), (32, 2000, 64), (200, 500, 2048), (64, 8000, 8000)]:
        mixed = cost.step_s(d, d * c, [(chunk, 0)])
        assert mixed >= cost.step_s(d, d * c) - 1e-15
        assert mixed >= cost.step_s(0, 0, [(chunk, 0)]) - 1e-15
        # adding prefill tokens never makes a step faster
        assert cost.step_s(d, d * c, [(chunk + 100, 0)]) >= mixed


def test_chunk_compute_coefficients_read_back_from_the_model():
    from lib.kvcache.long_context import prefill_chunk_compute_s

    dep = DEPS["70b-tp8"]
    cost = step_cost(dep)
    rng = random.Random(4)
    for _ in range(30):
        c, p = rng.randint(1, 16384), rng.randint(0, 120000)
        want = prefill_chunk_compute_s(dep.mdl, dep.chip, c, p, dep.tp, cost.mfu, dep.compute_dtype)
        assert cost.chunk_compute_s(c, p) == pytest.approx(want, rel=1e-9)


def test_eager_deployment_uses_a_two_dimensional_table():
    dep = Deployment("llama-3.1-8b", "h100-sxm", cuda_graphs=False, max_num_seqs=256)
    cost = StepCost(dep)
    assert math.isnan(cost.attention_s_per_token)
    rng = random.Random(5)
    for _ in range(15):
        d, c = rng.randint(1, 256), rng.randint(0, 30000)
        assert cost.step_s(d, d * c) == pytest.approx(decode_step(dep, d, c).total_s, rel=EAGER_TOL)


def test_swap_is_the_host_link_fetch():
    dep = DEPS["70b-tp8"]
    cost = step_cost(dep)
    tier = storage_tier("host_dram", dep.chip)
    for tokens in (16, 1000, 65536):
        assert cost.swap_s(tokens) == fetch_time_s(dep.mdl, tokens, tier, tp=8, kv_dtype=dep.kv_dtype)
    assert cost.swap_s(0) == 0.0


def test_defaults_come_from_the_deployment():
    dep = DEPS["8b-h100"]
    cost = step_cost(dep)
    assert cost.kv_blocks == dep.budget.num_blocks
    assert cost.block_size == dep.block_size
    assert cost.token_budget == dep.max_num_batched_tokens
    assert cost.max_running == dep.max_num_seqs
    assert step_cost(dep) is cost  # cached
    with pytest.raises(ValueError, match="exceeds the table's max_batch"):
        StepCost(dep, max_batch=8).step_s(9, 0)
    with pytest.raises(ValueError, match="dep must be a lib.perf.deployment.Deployment"):
        step_cost("llama-3.1-8b")


def test_linear_and_function_costs():
    lin = LinearCost(fixed_s=0.1, per_seq_s=0.01, per_context_token_s=1e-6, per_prefill_token_s=1e-4,
                     swap_s_per_token=1e-7)
    assert lin.step_s(0, 0) == 0.0
    assert lin.step_s(3, 1000, [(100, 0), (50, 7)]) == pytest.approx(0.1 + 0.03 + 1e-3 + 0.015)
    assert lin.swap_s(1000) == pytest.approx(1e-4)
    fixed = LinearCost(fixed_s=0.1)
    assert fixed.step_s(1, 0) == fixed.step_s(256, 10**6, [(8000, 0)]) == 0.1
    fc = FunctionCost(lambda d, ctx, chunks: 0.01 + 0.001 * d + 1e-5 * sum(c for c, _ in chunks))
    assert fc.step_s(2, 0, [(100, 0)]) == pytest.approx(0.013)
    with pytest.raises(ValueError, match="fn must return a finite number"):
        FunctionCost(lambda d, ctx, chunks: -1.0).step_s(1, 0)
    with pytest.raises(ValueError, match="fn must be callable"):
        FunctionCost(3)
    with pytest.raises(ValueError, match="needs fixed_s, per_seq_s or per_prefill_token_s > 0"):
        LinearCost()
    with pytest.raises(ValueError, match="fixed_s must be a finite number >= 0"):
        LinearCost(fixed_s=-1)
    with pytest.raises(ValueError, match="token_budget must be an integer >= 256"):
        LinearCost(fixed_s=1, token_budget=100)


def test_exact_step_validates():
    dep = DEPS["8b-h100"]
    with pytest.raises(ValueError, match="a step needs decode_seqs >= 1 or at least one chunk"):
        exact_step_s(dep, 0, 0)
    with pytest.raises(ValueError, match="chunk tokens must be an integer >= 1"):
        exact_step_s(dep, 1, 0, [(0, 0)])
