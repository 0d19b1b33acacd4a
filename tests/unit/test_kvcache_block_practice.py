"""Practice mode for chained block hashes (I092): the reference passes the grader, every defective
variant fails, and the predictive model agrees with the reference cache on random programs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import OutOfBlocks, PrefixBlockCache
from lib.kvcache import block_hash_practice as bp


def test_reference_passes():
    report = bp.check_block_cache(bp.block_cache_variant("reference"))
    assert report.passed, report


@pytest.mark.parametrize("variant", bp.BLOCK_CACHE_VARIANTS)
def test_every_defective_variant_fails(variant):
    report = bp.check_block_cache(bp.block_cache_variant(variant))
    assert report.status == "failed", f"{variant} passed"
    assert "shrunk to" in report.failure


def test_tokens_only_verification_is_caught_by_provenance_not_payloads():
    report = bp.check_block_cache(bp.block_cache_variant("verifies_tokens_only"))
    assert "computed from a different prefix" in report.failure


def test_skeleton_is_not_implemented():
    class Skeleton:
        def __init__(self, num_blocks, block_size, hash_fn):
            pass

        def allocate(self, request_id, tokens):
            raise NotImplementedError

    assert bp.check_block_cache(Skeleton).status == "not implemented"


programs = st.lists(st.tuples(st.booleans(), st.sampled_from(bp.PREFIXES),
                              st.lists(st.integers(0, 5), max_size=4), st.integers(0, 5)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(program=programs, num_blocks=st.integers(4, 14))
def test_model_predicts_the_reference_hits(program, num_blocks):
    cache, model = PrefixBlockCache(num_blocks, 2), bp.BlockCacheModel(num_blocks, 2)
    running = []
    for rid, (start, prefix, tail, pick) in enumerate(program):
        if start or not running:
            tokens = prefix + tuple(tail)
            try:
                want = model.allocate(rid, tokens)
            except OutOfBlocks:
                with pytest.raises(OutOfBlocks):
                    cache.allocate(rid, tokens)
                continue
            assert cache.allocate(rid, tokens).num_hit_blocks == want
            running.append(rid)
        else:
            done = running.pop(pick % len(running))
            cache.free(done)
            model.finish(done)
        assert cache.num_free_blocks == len(model.free)
        assert cache.num_cached_blocks == len(model.cached)


def test_variant_names_are_checked():
    with pytest.raises(ValueError, match="variant"):
        bp.block_cache_variant("typo")
