"""Radix prefix cache: unit tests, and random/trace workloads against a brute-force model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import (
    OutOfSlots,
    RadixCache,
    branching_agent_trace,
    multi_turn_chat_trace,
)


# --------------------------------------------------------------------------- brute-force model
class BruteForceModel:
    """Every cached prefix (as a tuple) -> the KV slot of its last token. No tree."""

    def __init__(self, num_slots):
        self.num_slots = num_slots
        self.slot_of = {}
        self.pinned = {}  # prefix -> number of locks covering it
        self.num_evicted = 0

    def longest_cached_prefix(self, tokens):
        length = 0
        while length < len(tokens) and tuple(tokens[: length + 1]) in self.slot_of:
            length += 1
        return length

    def expected_slots(self, tokens, length):
        return tuple(self.slot_of[tuple(tokens[: i + 1])] for i in range(length))

    def record_insert(self, tokens, slots):
        assert len(slots) == len(tokens)
        new_slots = []
        for i, slot in enumerate(slots):
            prefix = tuple(tokens[: i + 1])
            if prefix in self.slot_of:
                assert self.slot_of[prefix] == slot, "a cached prefix moved to another slot"
            else:
                self.slot_of[prefix] = slot
                new_slots.append(slot)
        assert len(set(self.slot_of.values())) == len(self.slot_of), "one slot holds two tokens"

    def lock(self, tokens, length):
        for i in range(1, length + 1):
            self.pinned[tuple(tokens[:i])] = self.pinned.get(tuple(tokens[:i]), 0) + 1

    def unlock(self, tokens, length):
        for i in range(1, length + 1):
            prefix = tuple(tokens[:i])
            self.pinned[prefix] -= 1
            if not self.pinned[prefix]:
                del self.pinned[prefix]

    def adopt_survivors(self, cache):
        """Check the cache evicted only unpinned prefixes, then drop them from the model."""
        removed = set(self.slot_of) - cached_prefixes(cache)
        assert not removed & set(self.pinned), "a pinned token was evicted"
        for prefix in removed:
            del self.slot_of[prefix]
        return removed


def cached_prefixes(cache):
    return {seq[:i] for seq in cache.cached_sequences() for i in range(1, len(seq) + 1)}


def check_invariants(cache, model):
    assert cached_prefixes(cache) == set(model.slot_of)
    edge_lengths = sum(len(node.tokens) for node in cache.nodes())
    assert cache.num_cached_tokens == edge_lengths == len(model.slot_of)
    free = cache.free_slots()
    assert len(free) == len(set(free)), "a slot was freed twice"
    assert not set(free) & set(model.slot_of.values()), "a cached token's slot is on the free list"
    assert cache.num_free_slots + cache.num_cached_tokens == cache.num_slots
    assert cache.num_pinned_tokens == len(model.pinned)
    for node in cache.nodes():
        assert len(node.tokens) == len(node.slots) > 0
        assert node.parent.children[node.tokens[0]] is node


def insert_and_check(cache, model, tokens):
    """Insert ``tokens``; check what it evicted and the slots it reports against the model."""
    result = cache.insert(tokens)
    evicted = model.adopt_survivors(cache)
    assert not any(tuple(tokens[: len(p)]) == p for p in evicted), "evicted its own prefix"
    model.record_insert(tokens, result.slots)
    assert result.num_tokens == len(tokens)
    model.num_evicted += len(evicted)
    return result


# --------------------------------------------------------------------------- unit tests
def test_match_and_insert_share_prefix_slots():
    cache = RadixCache(num_slots=16)
    first = cache.insert([1, 2, 3, 4])
    assert first.slots == (0, 1, 2, 3)
    assert cache.match_prefix([1, 2, 3, 4, 5]).slots == (0, 1, 2, 3)
    assert cache.match_prefix([9]).num_tokens == 0
    assert cache.match_prefix([]).num_tokens == 0
    second = cache.insert([1, 2, 7, 8, 9])  # splits the (1, 2, 3, 4) edge after 2 tokens
    assert second.slots == (0, 1, 4, 5, 6)
    assert cache.num_cached_tokens == 7
    assert cache.cached_sequences() == [(1, 2, 3, 4), (1, 2, 7, 8, 9)]
    assert sorted(node.tokens for node in cache.nodes()) == [(1, 2), (3, 4), (7, 8, 9)]


def test_match_ending_inside_an_edge_splits_it():
    cache = RadixCache(8)
    cache.insert([1, 2, 3, 4])
    match = cache.match_prefix([1, 2, 3])
    assert match.num_tokens == 3 and match.node.tokens == (1, 2, 3)
    assert [child.tokens for child in match.node.children.values()] == [(4,)]


def test_split_keeps_handles_and_locks_valid():
    cache = RadixCache(8)
    leaf = cache.insert([1, 2, 3, 4]).node
    cache.lock(leaf)
    cache.insert([1, 2, 7])  # splits the locked edge
    assert leaf.tokens == (3, 4) and leaf.parent.tokens == (1, 2)
    assert leaf.lock_count == leaf.parent.lock_count == 1
    assert cache.num_pinned_tokens == 4
    cache.unlock(leaf)
    assert cache.num_pinned_tokens == 0


def test_evicts_least_recently_used_leaf_first():
    cache = RadixCache(16)
    cache.insert([1, 2, 3])  # clock 1
    cache.insert([4, 5, 6])  # clock 2
    cache.match_prefix([1, 2, 3])  # clock 3: (4, 5, 6) is now the oldest leaf
    assert cache.evict(1) == 3  # frees the whole edge
    assert cache.cached_sequences() == [(1, 2, 3)]


def test_partial_match_refreshes_only_the_matched_part():
    cache = RadixCache(16)
    cache.insert([1, 2, 3])  # clock 1
    cache.insert([4, 5, 6])  # clock 2
    cache.match_prefix([1, 2])  # clock 3: splits off (3,), which keeps clock 1
    assert cache.evict(1) == 1
    assert cache.cached_sequences() == [(1, 2), (4, 5, 6)]
    assert cache.evict(1) == 3  # (4, 5, 6) at clock 2 is older than (1, 2) at clock 3
    assert cache.cached_sequences() == [(1, 2)]


def test_parent_becomes_a_leaf_when_its_children_go():
    cache = RadixCache(16)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    assert cache.evict(100) == 6
    assert cache.num_cached_tokens == 0
    assert sorted(cache.free_slots()) == list(range(16))
    assert list(cache.nodes()) == []


def test_pinned_tokens_are_never_evicted():
    cache = RadixCache(8)
    running = cache.insert([1, 2, 3])
    cache.lock(running.node)
    cache.insert([1, 2, 9, 9])
    assert cache.evict(8) == 2  # only the unpinned (9, 9) leaf can go
    assert cache.cached_sequences() == [(1, 2, 3)]
    assert cache.match_prefix([1, 2, 3]).slots == running.slots
    cache.unlock(running.node)
    assert cache.evict(8) == 3


def test_insert_evicts_lru_when_full_but_not_its_own_prefix():
    cache = RadixCache(6)
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    cache.match_prefix([1, 2, 3])  # (7, 8) is now the LRU leaf
    result = cache.insert([1, 2, 3, 4, 5])  # needs 2 slots, 1 free: evicts (7, 8)
    assert result.slots[:3] == (0, 1, 2)
    assert cache.cached_sequences() == [(1, 2, 3, 4, 5)]


def test_insert_raises_out_of_slots_when_everything_is_pinned():
    cache = RadixCache(4)
    held = cache.insert([1, 2, 3])
    cache.lock(held.node)
    with pytest.raises(OutOfSlots, match="need 2 free slots"):
        cache.insert([5, 6])
    assert isinstance(OutOfSlots(), ValueError)
    assert cache.cached_sequences() == [(1, 2, 3)]


def test_lock_and_unlock_validate():
    cache = RadixCache(8)
    node = cache.insert([1, 2]).node
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    cache.evict(2)
    with pytest.raises(ValueError, match="live RadixNode"):
        cache.lock(node)
    with pytest.raises(ValueError, match="live RadixNode"):
        cache.lock("node 3")


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_rejects_bad_pool_size(bad):
    with pytest.raises(ValueError, match="num_slots must be an integer >= 1"):
        RadixCache(bad)


def test_rejects_bad_tokens_and_eviction_sizes():
    cache = RadixCache(4)
    with pytest.raises(ValueError, match=r"token must be an integer >= 0"):
        cache.insert([1, -2])
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 0"):
        cache.evict(-1)


# --------------------------------------------------------------------------- random programs
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 2), min_size=1, max_size=7)),
        st.tuples(st.just("match_lock"), st.lists(st.integers(0, 2), max_size=7)),
        st.tuples(st.just("unlock"), st.integers(0, 3)),
        st.tuples(st.just("evict"), st.integers(0, 10)),
    ),
    max_size=25,
)


@settings(max_examples=100)
@given(program=ops, num_slots=st.integers(4, 24))
def test_random_programs_match_brute_force(program, num_slots):
    cache, model = RadixCache(num_slots), BruteForceModel(num_slots)
    held = []  # (tokens, matched length, node) of "running requests"
    for kind, arg in program:
        if kind == "insert":
            try:
                insert_and_check(cache, model, arg)
            except OutOfSlots:
                model.adopt_survivors(cache)  # it may have evicted before giving up
                assert cache.num_free_slots < len(arg) - model.longest_cached_prefix(arg)
        elif kind == "match_lock":
            match = cache.match_prefix(arg)
            length = model.longest_cached_prefix(arg)
            assert match.num_tokens == length
            assert match.slots == model.expected_slots(arg, length)
            if length:
                cache.lock(match.node)
                model.lock(arg, length)
                held.append((arg, length, match.node))
        elif kind == "unlock" and held:
            tokens, length, node = held.pop(arg % len(held))
            cache.unlock(node)
            model.unlock(tokens, length)
        elif kind == "evict":
            evictable = len(model.slot_of) - len(model.pinned)
            freed = cache.evict(arg)
            assert len(model.adopt_survivors(cache)) == freed >= min(arg, evictable)
        check_invariants(cache, model)


# --------------------------------------------------------------------------- seeded traces
def replay_trace(requests, num_slots, concurrency):
    """Run requests through the cache: match + pin while running, insert on finish.

    ``concurrency`` requests are in flight at once (pinned), so eviction must work around them.
    Returns the matched-prefix length of every request and the number of tokens evicted.
    """
    cache, model = RadixCache(num_slots), BruteForceModel(num_slots)
    running, matched = [], []
    for tokens in requests:
        match = cache.match_prefix(tokens)
        length = model.longest_cached_prefix(tokens)
        assert (match.num_tokens, match.slots) == (length, model.expected_slots(tokens, length))
        matched.append(length)
        result = insert_and_check(cache, model, tokens)
        cache.lock(result.node)
        model.lock(tokens, len(tokens))
        running.append((tokens, result))
        if len(running) > concurrency:
            done_tokens, done = running.pop(0)
            cache.unlock(done.node)
            model.unlock(done_tokens, len(done_tokens))
        check_invariants(cache, model)
        for held_tokens, held in running:  # pinned KV is intact
            assert cache.match_prefix(held_tokens).slots == held.slots
    return matched, model.num_evicted


def test_multi_turn_chat_reuses_the_whole_history_when_memory_suffices():
    requests = multi_turn_chat_trace(
        num_conversations=4, num_turns=5, system_prompt_tokens=20, seed=3
    )
    matched, num_evicted = replay_trace(requests, num_slots=4096, concurrency=2)
    assert num_evicted == 0
    seen = set()
    for tokens, length in zip(requests, matched, strict=True):
        if any(tokens[:20] == other[:20] for other in seen):
            assert length >= 20  # the shared system prompt always hits
        previous_turn = len(tokens) - 16  # user 8 + reply 8 tokens per turn
        if tokens[:previous_turn] in seen:
            assert length == previous_turn  # the conversation so far is reused exactly
        seen.add(tokens)
    assert matched[0] == 0
    assert sum(matched) > 0.7 * sum(len(t) for t in requests)


@pytest.mark.parametrize("seed", [0, 1])
def test_multi_turn_chat_under_memory_pressure(seed):
    requests = multi_turn_chat_trace(num_conversations=6, num_turns=6, vocab_size=4, seed=seed)
    matched, num_evicted = replay_trace(requests, num_slots=600, concurrency=3)
    assert num_evicted > 0
    assert sum(matched) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_branching_agent_trace_under_memory_pressure(seed):
    requests = branching_agent_trace(
        num_requests=60, system_prompt_tokens=24, step_tokens=6, vocab_size=3, seed=seed
    )
    matched, num_evicted = replay_trace(requests, num_slots=200, concurrency=4)
    assert num_evicted > 0
    assert all(length >= 24 for length in matched[1:10])  # early on the system prompt is cached


def test_traces_are_seeded():
    assert multi_turn_chat_trace(2, 3, seed=5) == multi_turn_chat_trace(2, 3, seed=5)
    assert multi_turn_chat_trace(2, 3, seed=5) != multi_turn_chat_trace(2, 3, seed=6)
    chat = multi_turn_chat_trace(1, 3, system_prompt_tokens=4, user_tokens=2, reply_tokens=1)
    assert [len(t) for t in chat] == [7, 10, 13]
    assert chat[1][:7] == chat[0] and chat[2][:10] == chat[1]
    agent = branching_agent_trace(10, system_prompt_tokens=5, step_tokens=3, seed=2)
    assert all(t[:5] == agent[0][:5] for t in agent)
    assert all(len(t) % 3 == 5 % 3 for t in agent)
    with pytest.raises(ValueError, match="num_turns must be an integer >= 1"):
        multi_turn_chat_trace(2, 0)
    with pytest.raises(ValueError, match="step_tokens must be an integer >= 1"):
        branching_agent_trace(5, step_tokens=0)


def test_unlocking_a_node_pinned_only_by_a_locked_descendant_is_refused():
    """Regression: insert [1,2] and lock it, insert [1,2,3] and lock it, unlock the first twice.
    The second unlock used to be accepted (the node's count came from the descendant), leaving
    [1,2] at lock count 0 under a still-locked [1,2,3]."""
    cache = RadixCache(8)
    short = cache.insert([1, 2]).node
    cache.lock(short)
    long = cache.insert([1, 2, 3]).node
    cache.lock(long)
    cache.unlock(short)
    with pytest.raises(ValueError, match="comes from locked descendants"):
        cache.unlock(short)
    assert short.lock_count == 1 and long.lock_count == 1  # nothing changed by the refusal
    cache.unlock(long)
    assert short.lock_count == 0 and cache.evict(3) == 3


def test_a_split_keeps_the_locks_with_the_node_that_took_them():
    cache = RadixCache(8)
    node = cache.insert([1, 2, 3, 4]).node
    cache.lock(node)
    cache.insert([1, 2, 9])  # splits [1,2,3,4] into [1,2] + [3,4]
    upper = node.parent
    assert upper.lock_count == 1 and upper.own_locks == 0 and node.own_locks == 1
    with pytest.raises(ValueError, match="comes from locked descendants"):
        cache.unlock(upper)
    cache.unlock(node)
    assert upper.lock_count == 0
