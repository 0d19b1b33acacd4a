"""Paged block allocator: unit tests, a stateful property test, and the naive CoW variants."""

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from lib.kvcache import (
    BlockAllocator,
    CopyEvent,
    NaiveCowAllocator,
    OutOfBlocks,
    content_oracle,
    ownership_oracle,
)


def snapshot(allocator):
    """Everything observable about an allocator, for all-or-nothing checks."""
    return (
        allocator.free_block_ids(),
        [allocator.refcount(b) for b in range(allocator.num_blocks)],
        {s: allocator.block_table(s) for s in allocator.seq_ids()},
        {s: allocator.tokens(s) for s in allocator.seq_ids()},
    )


# --------------------------------------------------------------------------- unit tests
@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 4), (4, 2.0), (True, 4)])
def test_rejects_bad_sizes(num_blocks, block_size):
    with pytest.raises(ValueError, match=r"(num_blocks|block_size) must be an integer >= 1"):
        BlockAllocator(num_blocks, block_size)


def test_allocate_takes_ceil_blocks_and_reads_back():
    allocator = BlockAllocator(num_blocks=4, block_size=2)
    assert allocator.allocate("a", [7, 8, 9]) == [0, 1]
    assert allocator.num_free_blocks == 2
    assert allocator.num_used_blocks == 2
    assert allocator.tokens("a") == [7, 8, 9]
    assert allocator.num_tokens("a") == 3
    assert allocator.allocate("empty", []) == []
    assert allocator.tokens("empty") == []


def test_allocate_rejects_duplicate_id_and_bad_tokens():
    allocator = BlockAllocator(4, 2)
    allocator.allocate(0, [1])
    with pytest.raises(ValueError, match="already allocated"):
        allocator.allocate(0, [2])
    with pytest.raises(ValueError, match=r"token must be an integer >= 0"):
        allocator.allocate(1, [1, -3])
    with pytest.raises(ValueError, match=r"token must be an integer >= 0"):
        allocator.append_token(0, 1.5)


def test_out_of_blocks_is_a_value_error_and_changes_nothing():
    allocator = BlockAllocator(4, 2)
    allocator.allocate(0, [1, 2, 3])  # 2 blocks
    before = snapshot(allocator)
    with pytest.raises(OutOfBlocks, match="need 3 free blocks, only 2 free"):
        allocator.allocate(1, [0] * 5)
    assert isinstance(OutOfBlocks(), ValueError)
    assert snapshot(allocator) == before
    assert 1 not in allocator.seq_ids()


def test_append_allocates_only_at_block_boundaries():
    allocator = BlockAllocator(4, 2)
    allocator.allocate(0, [1])
    assert allocator.append_token(0, 2) is None  # fills block 0
    assert allocator.num_free_blocks == 3
    assert allocator.append_token(0, 3) is None  # needs block 1
    assert allocator.block_table(0) == [0, 1]
    assert allocator.tokens(0) == [1, 2, 3]


def test_fork_shares_blocks_without_copying():
    allocator = BlockAllocator(4, 2)
    allocator.allocate("p", [1, 2, 3])
    allocator.fork("p", "c")
    assert allocator.block_table("c") == allocator.block_table("p") == [0, 1]
    assert [allocator.refcount(b) for b in (0, 1)] == [2, 2]
    assert allocator.num_free_blocks == 2
    assert allocator.tokens("c") == [1, 2, 3]
    with pytest.raises(ValueError, match="already allocated"):
        allocator.fork("p", "c")
    with pytest.raises(ValueError, match="not allocated"):
        allocator.fork("ghost", "d")


def test_write_to_shared_partial_block_copies_first():
    allocator = BlockAllocator(4, 2)
    allocator.allocate("p", [1, 2, 3])  # blocks [0, 1], block 1 half full
    allocator.fork("p", "c")
    event = allocator.append_token("c", 40)
    assert event == CopyEvent("c", src_block=1, dst_block=2)
    assert allocator.copy_events == [event]
    assert allocator.block_table("c") == [0, 2]
    assert allocator.block_table("p") == [0, 1]
    assert [allocator.refcount(b) for b in (0, 1, 2)] == [2, 1, 1]
    assert allocator.tokens("c") == [1, 2, 3, 40]
    assert allocator.tokens("p") == [1, 2, 3]
    # The parent is now the only owner of block 1: it writes in place, no copy.
    assert allocator.append_token("p", 50) is None
    assert allocator.tokens("p") == [1, 2, 3, 50]
    assert allocator.tokens("c") == [1, 2, 3, 40]


def test_full_shared_block_needs_no_copy():
    allocator = BlockAllocator(4, 2)
    allocator.allocate("p", [1, 2])
    allocator.fork("p", "c")
    assert allocator.append_token("c", 3) is None
    assert allocator.block_table("c") == [0, 1]
    assert allocator.refcount(0) == 2


def test_copy_on_write_out_of_blocks_changes_nothing():
    allocator = BlockAllocator(2, 2)
    allocator.allocate("p", [1, 2, 3])  # both blocks
    allocator.fork("p", "c")
    before = snapshot(allocator)
    with pytest.raises(OutOfBlocks):
        allocator.append_token("c", 9)
    assert snapshot(allocator) == before


def test_free_returns_blocks_at_refcount_zero_only_once():
    allocator = BlockAllocator(4, 2)
    allocator.allocate("p", [1, 2, 3])
    allocator.fork("p", "c")
    allocator.append_token("c", 4)  # c copies block 1 -> block 2
    assert allocator.free("p") == [1]  # block 0 still held by c
    assert allocator.refcount(0) == 1
    assert sorted(allocator.free("c")) == [0, 2]
    assert allocator.num_free_blocks == 4
    assert allocator.num_used_blocks == 0
    with pytest.raises(ValueError, match="already freed"):
        allocator.free("c")
    assert sorted(allocator.free_block_ids()) == [0, 1, 2, 3]


def test_introspection_validates_inputs():
    allocator = BlockAllocator(2, 2)
    with pytest.raises(ValueError, match=r"block must be an integer in \[0, 1\]"):
        allocator.refcount(2)
    with pytest.raises(ValueError, match="not allocated"):
        allocator.tokens("nobody")


def test_naive_write_in_place_lets_a_sibling_see_the_other_token():
    allocator = NaiveCowAllocator(4, 2, mistake="write_in_place")
    allocator.allocate("p", [1])
    allocator.fork("p", "c")
    allocator.append_token("p", 2)
    allocator.append_token("c", 3)  # overwrites the slot p wrote
    assert allocator.tokens("p") == [1, 3]
    assert content_oracle(allocator, {"p": [1, 2], "c": [1, 3]}) == [
        "sequence 'p' reads [1, 3], wrote [1, 2]"
    ]


def test_naive_forget_decref_leaks_the_source_block():
    allocator = NaiveCowAllocator(4, 2, mistake="forget_decref")
    allocator.allocate("p", [1])
    allocator.fork("p", "c")
    allocator.append_token("p", 2)
    allocator.free("p")
    allocator.free("c")
    assert allocator.refcount(0) == 1  # nobody holds it, it never comes back
    assert allocator.num_free_blocks == 3
    assert ownership_oracle(allocator, {}) == ["block 0 has refcount 1 but 0 block tables hold it"]


def test_naive_rejects_unknown_mistake():
    with pytest.raises(ValueError, match="mistake must be"):
        NaiveCowAllocator(4, 2, mistake="off_by_one")


# --------------------------------------------------------------------------- stateful property test
class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/fork/append/free against a shadow model of plain lists."""

    make_allocator = staticmethod(lambda: BlockAllocator(num_blocks=6, block_size=2))

    def __init__(self):
        super().__init__()
        self.allocator = self.make_allocator()
        self.shadow = {}

    @rule(seq=st.integers(0, 3), tokens=st.lists(st.integers(0, 9), max_size=8))
    def allocate(self, seq, tokens):
        if seq in self.shadow:
            with pytest.raises(ValueError, match="already allocated"):
                self.allocator.allocate(seq, tokens)
            return
        needed = -(-len(tokens) // self.allocator.block_size)
        free_before, before = self.allocator.num_free_blocks, snapshot(self.allocator)
        if needed > free_before:
            with pytest.raises(OutOfBlocks):
                self.allocator.allocate(seq, tokens)
            assert snapshot(self.allocator) == before
            return
        self.allocator.allocate(seq, tokens)
        self.shadow[seq] = list(tokens)
        assert self.allocator.num_free_blocks == free_before - needed

    @rule(parent=st.integers(0, 3), child=st.integers(0, 3))
    def fork(self, parent, child):
        if parent not in self.shadow or child in self.shadow:
            with pytest.raises(ValueError):
                self.allocator.fork(parent, child)
            return
        free_before = self.allocator.num_free_blocks
        self.allocator.fork(parent, child)
        self.shadow[child] = list(self.shadow[parent])
        assert self.allocator.num_free_blocks == free_before

    @rule(seq=st.integers(0, 3), token=st.integers(0, 9))
    def append(self, seq, token):
        if seq not in self.shadow:
            with pytest.raises(ValueError, match="not allocated"):
                self.allocator.append_token(seq, token)
            return
        table = self.allocator.block_table(seq)
        at_boundary = len(self.shadow[seq]) % self.allocator.block_size == 0
        shared_partial = not at_boundary and self.allocator.refcount(table[-1]) > 1
        free_before, before = self.allocator.num_free_blocks, snapshot(self.allocator)
        if (at_boundary or shared_partial) and free_before == 0:
            with pytest.raises(OutOfBlocks):
                self.allocator.append_token(seq, token)
            assert snapshot(self.allocator) == before
            return
        others = {s: self.allocator.tokens(s) for s in self.shadow if s != seq}
        event = self.allocator.append_token(seq, token)
        self.shadow[seq].append(token)
        if shared_partial:
            assert event is not None and event.src_block == table[-1]
            assert self.allocator.block_table(seq)[-1] == event.dst_block != event.src_block
        else:
            assert event is None
        assert self.allocator.num_free_blocks == free_before - (at_boundary or shared_partial)
        assert {s: self.allocator.tokens(s) for s in others} == others  # nobody else changed

    @rule(seq=st.integers(0, 3))
    def free(self, seq):
        if seq not in self.shadow:
            with pytest.raises(ValueError, match="not allocated"):
                self.allocator.free(seq)
            return
        table = self.allocator.block_table(seq)
        expected = sorted(b for b in table if self.allocator.refcount(b) == 1)
        free_before = self.allocator.num_free_blocks
        assert sorted(self.allocator.free(seq)) == expected
        del self.shadow[seq]
        assert self.allocator.num_free_blocks == free_before + len(expected)

    @invariant()
    def blocks_are_accounted_for(self):
        assert ownership_oracle(self.allocator, self.shadow) == []

    @invariant()
    def every_sequence_reads_what_it_wrote(self):
        assert content_oracle(self.allocator, self.shadow) == []


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(stateful_step_count=30)


@pytest.mark.parametrize("mistake", ["write_in_place", "forget_decref"])
def test_stateful_machine_catches_naive_copy_on_write(mistake):
    class NaiveMachine(AllocatorMachine):
        make_allocator = staticmethod(lambda: NaiveCowAllocator(6, 2, mistake=mistake))

    # No shrinking: we only need to know that some program fails. A failed `pytest.raises`
    # inside a rule (e.g. "expected OutOfBlocks" when no copy was needed) is a failure too.
    fast = settings(max_examples=1000, stateful_step_count=30, phases=[Phase.generate])
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        run_state_machine_as_test(NaiveMachine, settings=fast)


def _state(a):
    return ({s: a.block_table(s) for s in a.seq_ids()}, {s: a.tokens(s) for s in a.seq_ids()},
            sorted(a.free_block_ids()), [(e.seq_id, e.src_block, e.dst_block) for e in a.copy_events])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 9), st.integers(0, 12), st.booleans(), st.integers(4, 12))
def test_append_tokens_equals_one_append_per_token(block_size, prompt, extra, shared, num_blocks):
    """Oracle: append_tokens(seq, ts) leaves the same tables, payloads, free list and copy events as
    append_token for each t; when those would run out of blocks it raises having changed nothing."""
    def build():
        a = BlockAllocator(num_blocks, block_size)
        try:
            a.allocate("p", range(prompt))
            if shared:
                a.fork("p", "c")
        except OutOfBlocks:
            return None
        return a

    bulk, one = build(), build()
    if bulk is None:
        return
    before = _state(bulk)
    new = list(range(100, 100 + extra))
    try:
        for t in new:
            one.append_token("p", t)
        failed = False
    except OutOfBlocks:
        failed = True
    if failed:
        with pytest.raises(OutOfBlocks):
            bulk.append_tokens("p", new)
        assert _state(bulk) == before
    else:
        bulk.append_tokens("p", new)
        assert _state(bulk) == _state(one)
