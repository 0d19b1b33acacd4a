"""The defective allocator: each seeded defect is caught by one oracle and shrunk to a few ops."""

import pytest

from lib.kvcache import (
    BlockAllocator,
    DefectiveAllocator,
    Op,
    OutOfBlocks,
    content_oracle,
    find_minimal_failure,
    first_violation,
    ownership_oracle,
)

LEAKY = dict(leak_on_failed_allocation=True)
ALIASING = dict(alias_copied_payload=True)

# The op sequences hypothesis shrinks the two defects to (seed 0, a 4-block x 4-token pool).
LEAK_PROGRAM = [Op("allocate", 0, tuple(range(5))), Op("allocate", 1, tuple(range(9)))]
ALIAS_PROGRAM = [
    Op("allocate", 0, (0,)),
    Op("fork", 0, 1),
    Op("append", 0, 0),
    Op("append", 1, 1),
]


def test_leak_defect_breaks_block_accounting_but_not_content():
    allocator = DefectiveAllocator(4, 4, **LEAKY)
    allocator.allocate(0, range(5))  # 2 blocks
    with pytest.raises(OutOfBlocks):
        allocator.allocate(1, range(9))  # needs 3, takes the 2 free ones, then fails
    assert allocator.num_free_blocks == 0
    assert allocator.num_used_blocks == 2
    assert allocator.num_free_blocks + allocator.num_used_blocks < allocator.num_blocks
    shadow = {0: list(range(5))}
    assert ownership_oracle(allocator, shadow) == [
        "block 2 is neither free nor owned (leaked)",
        "block 3 is neither free nor owned (leaked)",
        "free 0 + used 2 = 2 != 4 blocks",
    ]
    assert content_oracle(allocator, shadow) == []


def test_alias_defect_breaks_content_but_not_block_accounting():
    allocator = DefectiveAllocator(4, 4, **ALIASING)
    shadow = {}
    for op in ALIAS_PROGRAM:
        op.apply(allocator, shadow)
    assert allocator.block_table(0) != allocator.block_table(1)  # tables say "copied"...
    assert allocator.tokens(0) == [0, 1]  # ...but 1's write shows up in 0
    assert shadow == {0: [0, 0], 1: [0, 1]}
    assert ownership_oracle(allocator, shadow) == []
    assert content_oracle(allocator, shadow) == ["sequence 0 reads [0, 1], wrote [0, 0]"]


def test_flags_off_is_the_correct_allocator():
    for program in (LEAK_PROGRAM, ALIAS_PROGRAM):
        for oracle in (ownership_oracle, content_oracle):
            assert first_violation(DefectiveAllocator(4, 4), program, oracle) is None
            assert first_violation(BlockAllocator(4, 4), program, oracle) is None


def test_first_violation_reports_the_op_index():
    found = first_violation(DefectiveAllocator(4, 4, **ALIASING), ALIAS_PROGRAM, content_oracle)
    assert found == (3, ["sequence 0 reads [0, 1], wrote [0, 0]"])


def test_ownership_oracle_can_see_a_double_free():
    allocator = BlockAllocator(4, 4)
    allocator._free.append(allocator._free[-1])  # simulate a buggy free pushing block 0 twice
    assert "blocks [0] are on the free list twice (double free)" in ownership_oracle(allocator, {})


def test_op_rejects_unknown_kind_and_invalid_state():
    with pytest.raises(ValueError, match="kind must be"):
        Op("resize", 0).apply(BlockAllocator(2, 2), {})
    with pytest.raises(ValueError, match="not allocated"):
        Op("free", 0).apply(BlockAllocator(2, 2), {0: []})
    assert str(Op("fork", 0, 1)) == "fork(parent=0, child=1)"


def test_shrinks_leak_with_ownership_oracle():
    found = find_minimal_failure(lambda: DefectiveAllocator(4, 4, **LEAKY), ownership_oracle)
    assert found == [str(op) for op in LEAK_PROGRAM]
    assert found == [
        "allocate(seq=0, tokens=[0, 1, 2, 3, 4])",
        "allocate(seq=1, tokens=[0, 1, 2, 3, 4, 5, 6, 7, 8])",
    ]


def test_shrinks_aliasing_with_content_oracle():
    found = find_minimal_failure(lambda: DefectiveAllocator(4, 4, **ALIASING), content_oracle)
    assert found == [str(op) for op in ALIAS_PROGRAM]


@pytest.mark.parametrize(
    "flags, oracle",
    [
        (LEAKY, content_oracle),  # a leak never changes what anyone reads
        (ALIASING, ownership_oracle),  # aliasing keeps tables and refcounts right
        ({}, ownership_oracle),
        ({}, content_oracle),
    ],
    ids=["leak-vs-content", "alias-vs-ownership", "fixed-ownership", "fixed-content"],
)
def test_oracle_finds_nothing(flags, oracle):
    assert find_minimal_failure(lambda: DefectiveAllocator(4, 4, **flags), oracle) is None


def test_find_minimal_failure_validates_inputs():
    with pytest.raises(ValueError, match="max_ops must be an integer >= 1"):
        find_minimal_failure(lambda: BlockAllocator(2, 2), content_oracle, max_ops=0)
    with pytest.raises(ValueError, match="variant_factory must return an allocator"):
        find_minimal_failure(lambda: object(), content_oracle)
