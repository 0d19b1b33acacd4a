"""Chained-hash block prefix cache: hits, eviction order, stranding, and hash collisions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import OutOfBlocks, PrefixBlockCache, chain_hashes, hash_block


def weak_hash(parent_hash, block_tokens):
    """A deliberately bad hash: ignores the parent and only looks at the token sum mod 3."""
    return sum(block_tokens) % 3


# --------------------------------------------------------------------------- hashing
def test_chain_hashes_cover_full_blocks_and_whole_prefixes():
    hashes = chain_hashes([1, 2, 3, 4, 5], block_size=2)
    assert len(hashes) == 2  # the partial block (5,) is not hashed
    assert hashes[0] == hash_block(None, (1, 2))
    assert hashes[1] == hash_block(hashes[0], (3, 4))
    assert chain_hashes([1, 2, 3, 4, 9, 9], 2)[:2] == hashes  # a shared prefix shares hashes
    # Same block tokens after a different prefix: different hash.
    assert chain_hashes([7, 7, 3, 4], 2)[1] != hashes[1]
    assert chain_hashes([], 2) == [] and chain_hashes([1], 2) == []
    assert hash_block(None, (1, 2)) == hash_block(None, (1, 2))  # stable, not salted
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        chain_hashes([1, 2], 0)


# --------------------------------------------------------------------------- hits and misses
def test_shared_prefix_hits_after_free_and_reads_back_its_tokens():
    cache = PrefixBlockCache(num_blocks=8, block_size=2)
    first = cache.allocate("a", [1, 2, 3, 4, 5, 6, 7])  # 3 full blocks + 1 partial
    assert first.num_hit_blocks == 0 and first.block_ids == (0, 1, 2, 3)
    cache.free("a")
    assert cache.num_free_blocks == 8 and cache.num_cached_blocks == 3
    assert cache.match_prefix([1, 2, 3, 4, 9, 9]) == 4
    second = cache.allocate("b", [1, 2, 3, 4, 9, 9])
    assert second.num_hit_blocks == 2 and second.num_hit_tokens == 4
    assert second.block_ids[:2] == (0, 1)
    assert cache.read_tokens("b") == [1, 2, 3, 4, 9, 9]
    assert cache.match_prefix([9, 9]) == 0  # (9, 9) is cached only after (1, 2, 3, 4)


def test_running_requests_share_blocks_by_refcount():
    cache = PrefixBlockCache(8, 2)
    cache.allocate("a", [1, 2, 3, 4])
    shared = cache.allocate("b", [1, 2, 3, 4, 5, 6])
    assert shared.num_hit_blocks == 2
    assert [cache.refcount(b) for b in (0, 1)] == [2, 2]
    cache.free("a")
    assert cache.refcount(0) == 1 and 0 not in cache.eviction_queue()
    cache.free("b")
    assert cache.refcount(0) == 0 and 0 in cache.eviction_queue()


def test_full_match_of_a_block_aligned_prompt():
    cache = PrefixBlockCache(4, 2)
    cache.allocate("a", [1, 2, 3, 4])
    cache.free("a")
    assert cache.allocate("b", [1, 2, 3, 4]).num_hit_blocks == 2


# --------------------------------------------------------------------------- eviction order
def chain_then_pressure(eviction_order, pressure_blocks):
    """Cache one 4-block chain, free it, then make an unrelated request evict some blocks."""
    cache = PrefixBlockCache(num_blocks=4, block_size=2, eviction_order=eviction_order)
    cache.allocate("chain", [1, 2, 3, 4, 5, 6, 7, 8])
    cache.free("chain")
    cache.allocate("other", list(range(100, 100 + 2 * pressure_blocks)))
    return cache


def test_tail_first_evicts_deepest_blocks_and_keeps_the_prefix_hittable():
    cache = PrefixBlockCache(4, 2)
    cache.allocate("chain", [1, 2, 3, 4, 5, 6, 7, 8])
    cache.free("chain")
    assert cache.eviction_queue() == [3, 2, 1, 0]  # tail at the front
    cache = chain_then_pressure("tail_first", pressure_blocks=1)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]) == 6  # lost only the last block
    assert cache.stranded_blocks() == []


def test_head_first_eviction_strands_the_rest_of_the_chain():
    cache = chain_then_pressure("head_first", pressure_blocks=1)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]) == 0  # nothing reachable
    assert cache.stranded_blocks() == [1, 2, 3]  # n - 1 = 3 blocks resident but useless
    assert cache.num_cached_blocks == 4  # 3 stranded + the new request's block
    # Re-requesting the chain recomputes it; the stale blocks are evicted or displaced.
    cache.free("other")
    cache.allocate("again", [1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.stranded_blocks() == []


def test_blocks_without_cached_content_are_reused_first():
    cache = PrefixBlockCache(4, 2)
    cache.allocate("a", [1, 2, 3])  # block 1 holds the partial (3,): not cacheable
    cache.free("a")
    assert cache.eviction_queue()[0] == 1
    assert cache.block_hash(1) is None and cache.block_hash(0) is not None


def test_out_of_blocks_is_all_or_nothing():
    cache = PrefixBlockCache(3, 2)
    cache.allocate("a", [1, 2, 3, 4])
    cache.free("a")
    cache.allocate("b", [9, 9])  # holds one block
    before = (cache.eviction_queue(), cache.num_cached_blocks, cache.match_prefix([1, 2, 3, 4]))
    with pytest.raises(OutOfBlocks, match="needs 3 fresh blocks, only 2 can be taken"):
        cache.allocate("c", [5, 6, 7, 8, 9, 10])
    assert (
        cache.eviction_queue(),
        cache.num_cached_blocks,
        cache.match_prefix([1, 2, 3, 4]),
    ) == before
    # A hit on a free cached block does not count as a block it can take.
    with pytest.raises(OutOfBlocks, match="needs 2 fresh blocks, only 1 can be taken"):
        cache.allocate("d", [1, 2, 7, 7, 8, 8])


# --------------------------------------------------------------------------- collisions
def test_weak_hash_collision_is_a_miss_when_verified():
    cache = PrefixBlockCache(8, 2, hash_fn=weak_hash, verify_on_hit=True)
    cache.allocate("a", [1, 2, 3, 4])
    cache.free("a")
    assert chain_hashes([2, 1, 4, 3], 2, weak_hash) == chain_hashes([1, 2, 3, 4], 2, weak_hash)
    victim = cache.allocate("b", [2, 1, 4, 3])  # every block hash collides with a's
    assert victim.num_hit_blocks == 0
    assert cache.read_tokens("b") == [2, 1, 4, 3]


def test_weak_hash_collision_hands_wrong_kv_when_unverified():
    cache = PrefixBlockCache(8, 2, hash_fn=weak_hash, verify_on_hit=False)
    cache.allocate("a", [1, 2, 3, 4])
    cache.free("a")
    victim = cache.allocate("b", [2, 1, 4, 3])
    assert victim.num_hit_blocks == 2
    assert cache.read_tokens("b") == [1, 2, 3, 4]  # b attends over a's KV: silently wrong


def test_verification_checks_the_parent_not_just_the_block_tokens():
    # (3, 4) is cached twice over: after (1, 2) and after (5, 6). A weak hash that ignores the
    # parent maps both to one entry, whose KV was computed after (5, 6).
    cache = PrefixBlockCache(8, 2, hash_fn=weak_hash, verify_on_hit=True)
    cache.allocate("a", [1, 2, 3, 4])
    cache.free("a")
    cache.allocate("b", [5, 6, 3, 4])  # (5, 6) misses; its (3, 4) displaces a's (3, 4)
    cache.free("b")
    assert cache.allocate("c", [1, 2, 3, 4]).num_hit_blocks == 1  # stops at the wrong parent
    unverified = PrefixBlockCache(8, 2, hash_fn=weak_hash, verify_on_hit=False)
    unverified.allocate("a", [1, 2, 3, 4])
    unverified.free("a")
    unverified.allocate("b", [5, 6, 3, 4])
    unverified.free("b")
    assert unverified.allocate("c", [1, 2, 3, 4]).num_hit_blocks == 2  # KV from the wrong prefix


# --------------------------------------------------------------------------- validation
def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks must be an integer >= 1"):
        PrefixBlockCache(0, 2)
    with pytest.raises(ValueError, match="eviction_order must be"):
        PrefixBlockCache(4, 2, eviction_order="random")
    with pytest.raises(ValueError, match="hash_fn must be callable"):
        PrefixBlockCache(4, 2, hash_fn=17)
    cache = PrefixBlockCache(4, 2)
    cache.allocate("a", [1])
    with pytest.raises(ValueError, match="already running"):
        cache.allocate("a", [1])
    with pytest.raises(ValueError, match=r"token must be an integer >= 0"):
        cache.allocate("b", [1, -1])
    with pytest.raises(ValueError, match="not running"):
        cache.free("b")
    with pytest.raises(ValueError, match=r"block must be an integer in \[0, 3\]"):
        cache.refcount(4)


# --------------------------------------------------------------------------- properties
# (7, 7, 3, 4, 5, 6) repeats blocks 1-2 of the first prefix after another block 0: same tokens,
# different KV, the case a provenance oracle must tell apart.
PREFIXES = [(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 7, 8), (9, 9, 1, 2), (2, 1, 4, 3, 6, 5), (7, 7, 3, 4, 5, 6)]
requests = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 9), max_size=5)).map(
    lambda pair: pair[0] + tuple(pair[1])
)
programs = st.lists(st.tuples(st.booleans(), requests, st.integers(0, 3)), max_size=30)


def run_program(cache, program):
    """Interpret (start?, tokens, pick) triples: start a request or finish a running one."""
    running = {}
    for next_id, (start, tokens, pick) in enumerate(program):
        if start or not running:
            try:
                cache.allocate(next_id, tokens)
            except OutOfBlocks:
                continue
            running[next_id] = tokens
        else:
            done = sorted(running)[pick % len(running)]
            cache.free(done)
            del running[done]
        yield running


def check_accounting(cache, running):
    held = [b for r in running for b in cache.block_table(r)]
    for block in range(cache.num_blocks):
        assert cache.refcount(block) == held.count(block)
        assert (block in cache.eviction_queue()) == (cache.refcount(block) == 0)
    assert len(cache.eviction_queue()) == len(set(cache.eviction_queue()))


def run_under_provenance(cache, program):
    """run_program through KVProvenanceOracle: it records the exact prefix each block's KV was
    computed from, so it sees a block with the right tokens computed after a wrong prefix."""
    from lib.kvcache.block_hash import KVProvenanceOracle

    oracle = KVProvenanceOracle(cache)
    running = {}
    for next_id, (start, tokens, pick) in enumerate(program):
        if start or not running:
            try:
                oracle.allocate(next_id, tokens)
            except OutOfBlocks:
                continue
            running[next_id] = tokens
        else:
            done = sorted(running)[pick % len(running)]
            oracle.free(done)
            del running[done]
        yield oracle, running


@settings(max_examples=200, deadline=None)
@given(
    program=programs,
    num_blocks=st.integers(6, 16),
    order=st.sampled_from(["tail_first", "head_first"]),
)
def test_verified_cache_never_returns_wrong_kv_even_with_a_weak_hash(program, num_blocks, order):
    cache = PrefixBlockCache(num_blocks, 2, hash_fn=weak_hash, eviction_order=order)
    for oracle, running in run_under_provenance(cache, program):
        assert not oracle.violations, oracle.violations[0]
        for request_id, tokens in running.items():
            assert cache.read_tokens(request_id) == list(tokens)
        check_accounting(cache, running)


def test_the_provenance_property_catches_what_payloads_cannot():
    """A cache that verifies a hit's tokens but not the block it was computed after serves right
    tokens with wrong KV: the payload comparison passes, the provenance property fails."""
    from hypothesis import HealthCheck, Phase, find

    from lib.kvcache.block_hash_practice import block_cache_variant

    make = block_cache_variant("verifies_tokens_only")

    def wrong_kv(program):
        cache = make(12, 2, weak_hash)
        return any(oracle.violations for oracle, _ in run_under_provenance(cache, program))

    # the same strategy and example budget as the property above, without shrinking
    bad = find(programs, wrong_kv, settings=settings(max_examples=200, database=None, phases=[Phase.generate],
                                                     suppress_health_check=list(HealthCheck)))
    payload_cache = make(12, 2, weak_hash)
    for running in run_program(payload_cache, bad):
        for request_id, tokens in running.items():
            assert payload_cache.read_tokens(request_id) == list(tokens)  # payloads look right


@settings(max_examples=100)
@given(program=programs, num_blocks=st.integers(6, 16))
def test_tail_first_never_strands_a_block(program, num_blocks):
    cache = PrefixBlockCache(num_blocks, 2, eviction_order="tail_first")
    for running in run_program(cache, program):
        assert cache.stranded_blocks() == []
        for request_id, tokens in running.items():
            assert cache.read_tokens(request_id) == list(tokens)


@settings(max_examples=100)
@given(program=programs)
def test_hits_equal_brute_force_longest_shared_block_prefix_without_eviction(program):
    """With room for everything, a request hits exactly the longest block-aligned prefix it
    shares with any earlier request (brute force over all of them)."""
    cache = PrefixBlockCache(200, 2)
    seen = []
    for next_id, (_, tokens, _) in enumerate(program):
        full = len(tokens) // 2
        expected = 0
        for earlier in seen:
            blocks = 0
            while (
                blocks < min(full, len(earlier) // 2)
                and tokens[: 2 * blocks + 2] == earlier[: 2 * blocks + 2]
            ):
                blocks += 1
            expected = max(expected, blocks)
        assert cache.allocate(next_id, tokens).num_hit_blocks == expected
        cache.free(next_id)
        seen.append(tokens)
