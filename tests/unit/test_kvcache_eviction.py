"""Head-first vs tail-first eviction: simulation against the closed form, and stranded bytes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import (
    PrefixWorkload,
    cyclic_prefix_workload,
    cyclic_steady_state,
    shared_prefix_workload,
    simulate,
)

BLOCK_BYTES = 16 * 2 * 32 * 8 * 128 * 2  # 16 tokens x (K+V) x 32 layers x 8 kv heads x 128 x bf16


def test_cyclic_workload_shape():
    workload = cyclic_prefix_workload(num_prefixes=3, prefix_blocks=2, num_requests=7, block_size=4)
    assert workload.block_size == 4
    assert len(workload.requests) == 7
    assert all(len(r) == 8 for r in workload.requests)
    assert workload.requests[0] == workload.requests[3] == workload.requests[6]
    assert len(set(workload.requests)) == 3
    assert not set(workload.requests[0]) & set(workload.requests[1])  # no accidental sharing


def test_shared_prefix_workload_is_seeded_and_reuses_prefixes():
    a = shared_prefix_workload([4, 2], num_requests=20, block_size=2, suffix_blocks=1, seed=7)
    assert a == shared_prefix_workload([4, 2], 20, 2, suffix_blocks=1, seed=7)
    assert a != shared_prefix_workload([4, 2], 20, 2, suffix_blocks=1, seed=8)
    heads = {r[:4] for r in a.requests}
    assert len(heads) == 2  # every request starts with one of the two prefixes
    assert sorted({len(r) for r in a.requests}) == [6, 10]
    suffixes = [r[-2:] for r in a.requests]
    assert len(set(suffixes)) == 20  # suffixes are never shared


def test_concrete_numbers_of_the_closed_form():
    # P = 3 prefixes of n = 4 blocks, C = 10 blocks: C mod n = 2, C - (P - 1) n = 2.
    head = cyclic_steady_state("head_first", 10, num_prefixes=3, prefix_blocks=4, block_bytes=100)
    tail = cyclic_steady_state("tail_first", 10, num_prefixes=3, prefix_blocks=4, block_bytes=100)
    assert (head.hit_rate, head.stranded_bytes, head.warmup_requests) == (0.0, 200, 3)
    assert (tail.hit_rate, tail.stranded_bytes) == (0.5, 0)
    fits = cyclic_steady_state("head_first", 12, num_prefixes=3, prefix_blocks=4, block_bytes=100)
    assert (fits.hit_rate, fits.stranded_bytes) == (1.0, 0)


def test_simulation_matches_concrete_closed_form():
    workload = cyclic_prefix_workload(
        num_prefixes=3, prefix_blocks=4, num_requests=30, block_size=16
    )
    head = simulate("head_first", 10, workload, BLOCK_BYTES)
    tail = simulate("tail_first", 10, workload, BLOCK_BYTES)
    assert head.stranded_bytes[3:] == (2 * BLOCK_BYTES,) * 27
    assert head.hit_rate() == 0.0
    assert tail.stranded_bytes == (0,) * 30
    assert tail.hit_tokens[3:] == (2 * 16,) * 27  # the two head blocks of the oldest chain
    assert tail.hit_rate(skip_requests=3) == 0.5
    assert head.max_stranded_bytes == 2 * BLOCK_BYTES


@pytest.mark.parametrize("num_prefixes", [1, 2, 3, 5])
@pytest.mark.parametrize("prefix_blocks", [1, 3, 4])
def test_simulation_matches_closed_form_sweep(num_prefixes, prefix_blocks):
    n = prefix_blocks
    for capacity in range(n, num_prefixes * n + n + 2):
        workload = cyclic_prefix_workload(num_prefixes, n, 4 * num_prefixes + 8, block_size=2)
        for policy in ("head_first", "tail_first"):
            expected = cyclic_steady_state(policy, capacity, num_prefixes, n, block_bytes=64)
            result = simulate(policy, capacity, workload, block_bytes=64)
            steady = expected.warmup_requests
            assert result.hit_rate(steady) == pytest.approx(expected.hit_rate)
            assert set(result.stranded_bytes[steady:]) == {expected.stranded_bytes}


@settings(max_examples=60)
@given(
    prefix_blocks=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    suffix_blocks=st.integers(0, 2),
    capacity=st.integers(8, 24),
    seed=st.integers(0, 2**16),
)
def test_tail_first_strands_nothing_on_random_shared_prefix_workloads(
    prefix_blocks, suffix_blocks, capacity, seed
):
    workload = shared_prefix_workload(prefix_blocks, 40, 4, suffix_blocks=suffix_blocks, seed=seed)
    assert simulate("tail_first", capacity, workload, BLOCK_BYTES).max_stranded_bytes == 0


def test_head_first_strands_bytes_on_a_shared_prefix_workload():
    workload = shared_prefix_workload([6, 5, 4], 60, block_size=4, suffix_blocks=1, seed=0)
    head = simulate("head_first", 12, workload, BLOCK_BYTES)
    tail = simulate("tail_first", 12, workload, BLOCK_BYTES)
    assert head.max_stranded_bytes >= 3 * BLOCK_BYTES
    assert tail.max_stranded_bytes == 0
    assert tail.hit_rate() > head.hit_rate()


def test_rejects_bad_arguments():
    workload = cyclic_prefix_workload(2, 2, 4, 2)
    with pytest.raises(ValueError, match="policy must be 'head_first' or 'tail_first'"):
        simulate("lru", 4, workload, 64)
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 1"):
        simulate("head_first", 0, workload, 64)
    with pytest.raises(ValueError, match="workload must be a PrefixWorkload"):
        simulate("head_first", 4, [(1, 2)], 64)
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 3"):
        cyclic_steady_state("head_first", 2, num_prefixes=2, prefix_blocks=3, block_bytes=64)
    with pytest.raises(ValueError, match="prefix_blocks must list at least one"):
        shared_prefix_workload([], 3, 2)
    with pytest.raises(ValueError, match="skip_requests must be an integer >= 0"):
        simulate("tail_first", 4, workload, 64).hit_rate(-1)
    assert PrefixWorkload(2, ()).requests == ()
