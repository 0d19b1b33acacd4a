"""Practice mode for the radix prefix cache (I090, N027): the reference passes the graders, every
defective variant fails, and the predictive model agrees with the reference on random programs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import OutOfSlots, RadixCache
from lib.kvcache import radix_practice as rp


def test_reference_passes_the_radix_grader():
    report = rp.check_radix_cache(rp.radix_variant("reference"))
    assert report.passed, report


@pytest.mark.parametrize("variant", rp.RADIX_VARIANTS)
def test_every_defective_radix_cache_fails(variant):
    report = rp.check_radix_cache(rp.radix_variant(variant))
    assert report.status == "failed", f"{variant} passed the grader"
    assert "shrunk to" in report.failure


def test_the_extra_unlock_regression_is_graded():
    case = next(c for c in rp.radix_cases(0) if c.name.startswith("unlock twice"))
    with pytest.raises(AssertionError, match="no lock"):
        rp.run_radix_program(rp.radix_variant("unlock_any_locked"), case.ops)
    rp.run_radix_program(RadixCache, case.ops)  # the reference refuses the second unlock


def test_a_skeleton_is_reported_as_not_implemented():
    class Skeleton:
        def __init__(self, num_slots):
            pass

        def match_prefix(self, tokens):
            raise NotImplementedError

        def insert(self, tokens):
            raise NotImplementedError

    report = rp.check_radix_cache(Skeleton)
    assert report.status == "not implemented"


def test_a_candidate_returning_pairs_is_accepted():
    class Pairs:
        def __init__(self, n):
            self.c = RadixCache(n)

        def match_prefix(self, t):
            m = self.c.match_prefix(t)
            return m.slots, m.node

        def insert(self, t):
            m = self.c.insert(t)
            return list(m.slots), m.node

        def lock(self, node):
            self.c.lock(node)

        def unlock(self, node):
            self.c.unlock(node)

        def evict(self, n):
            return self.c.evict(n)

        @property
        def num_free_slots(self):
            return self.c.num_free_slots

    assert rp.check_radix_cache(Pairs, num_random=30).passed


ops = st.lists(st.tuples(st.sampled_from(["insert", "match", "evict", "lock", "unlock"]),
                         st.lists(st.integers(0, 2), min_size=1, max_size=6), st.integers(0, 40)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(program=ops, slots=st.integers(4, 14))
def test_model_predicts_the_reference(program, slots):
    """The model (no tree, no slots) predicts match lengths, evictions and refusals of RadixCache."""
    cache, model = RadixCache(slots), rp.RadixModel(slots)
    handles = []
    for kind, tokens, n in program:
        if kind == "match":
            m = cache.match_prefix(tokens)
            assert m.num_tokens == model.walk(tokens)
        elif kind == "insert":
            try:
                want = model.insert(tokens)
            except OutOfSlots:
                with pytest.raises(OutOfSlots):
                    cache.insert(tokens)
                continue
            got = cache.insert(tokens)
            handles.append((got.node, model.handle(tuple(tokens))))
            assert len(got.slots) == len(tokens) and want <= len(tokens)
        elif kind == "evict":
            assert cache.evict(n % 8) == model.evict(n % 8)
        elif handles:
            node, handle = handles[n % len(handles)]
            refused = []
            for target in (model, cache):
                try:
                    getattr(target, kind)(handle if target is model else node)
                    refused.append(False)
                except ValueError:
                    refused.append(True)
            assert refused[0] == refused[1]
        assert cache.num_cached_tokens == model.num_cached
        assert sorted(cache.cached_sequences()) == sorted(
            p for p in model.tick if not any(q[:-1] == p for q in model.tick if len(q) == len(p) + 1))


def test_reference_passes_the_hit_counter_grader():
    assert rp.check_hit_counter(rp.hit_counter_variant("reference")).passed


@pytest.mark.parametrize("variant", rp.HIT_COUNTER_VARIANTS)
def test_every_defective_hit_counter_fails(variant):
    assert rp.check_hit_counter(rp.hit_counter_variant(variant)).status == "failed"


def test_variant_names_are_checked():
    with pytest.raises(ValueError, match="variant"):
        rp.radix_variant("typo")
    with pytest.raises(ValueError, match="variant"):
        rp.hit_counter_variant("typo")


def test_typed_radix_programs_parse_and_replay():
    from lib.kvcache.radix_scenarios import RadixOp, parse_radix_program, replay_radix

    ops = parse_radix_program("insert 1 2; lock 1\nmatch 1, 2; unlock 1; evict 4")
    assert ops == [RadixOp("insert", (1, 2)), RadixOp("lock", ref=1), RadixOp("match", (1, 2)),
                   RadixOp("unlock", ref=1), RadixOp("evict", count=4)]
    steps = replay_radix(parse_radix_program("insert 1 2; lock 1; insert 1 2 3; lock 3; unlock 1; unlock 1"), 16)
    assert steps[5].result.startswith("unlocked") and steps[6].result.startswith("ValueError")
    for bad in ("", "insert", "insert a b", "lock 0", "evict 1 2", "splice 1"):
        with pytest.raises(ValueError):
            parse_radix_program(bad)
