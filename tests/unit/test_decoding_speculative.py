"""lib.decoding.speculative: the closed forms (against Monte Carlo), and the speculative step on the
book's step model (decode_step with query_tokens: a verification pass over k + 1 tokens)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import speculative as sp
from lib.perf.deployment import deployment
from lib.perf.step import decode_step

TARGET = deployment("llama-3.1-70b", "h100-sxm", tp=8)
DRAFT = deployment("llama-3.2-1b", "h100-sxm", tp=8)


def test_speculative_known_value():
    # Leviathan et al. 2023 eq. 1: (1 - 0.8^5) / 0.2 = 3.3616
    assert math.isclose(sp.speculative_tokens_per_step(0.8, 4), 3.3616, rel_tol=1e-12)
    assert sp.speculative_tokens_per_step(1.0, 4) == 5 and sp.speculative_tokens_per_step(0.0, 4) == 1
    assert math.isclose(sp.speculative_speedup(0.8, 4, 0.05), 3.3616 / 1.2, rel_tol=1e-12)


@given(st.floats(0.0, 0.99), st.integers(0, 8))
def test_speculative_closed_form_against_monte_carlo(alpha, gamma):
    sim = sp.simulate_speculative_tokens_per_step(alpha, gamma, steps=20000, seed=5)
    closed = sp.speculative_tokens_per_step(alpha, gamma)
    stderr = max(sim.std(ddof=1), 0.5) / math.sqrt(len(sim))
    assert abs(sim.mean() - closed) <= 5 * stderr


@given(st.floats(1.01, 4.0), st.integers(1, 8), st.floats(0.0, 0.2))
def test_acceptance_needed_inverts_the_speedup(target, gamma, cost):
    a = sp.acceptance_needed(target, gamma, cost)
    if math.isinf(a):
        assert sp.speculative_speedup(1.0, gamma, cost) < target
    elif a > 0:
        assert math.isclose(sp.speculative_speedup(a, gamma, cost), target, rel_tol=1e-9)


# ---- the verification pass in the step model --------------------------------------------------------


def test_one_query_token_is_the_plain_step():
    a, b = decode_step(TARGET, 16, 2048), decode_step(TARGET, 16, 2048, query_tokens=1)
    assert a.buckets == b.buckets and b.query_tokens == 1


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 8, 64, 256]), st.sampled_from([0, 512, 8192]), st.integers(2, 9))
def test_a_verify_pass_sits_between_one_token_and_as_many_sequences(batch, context, q):
    """q query tokens per sequence read the weights and each cache once: never cheaper than the
    plain step, never dearer than q times as many sequences (which read q times the KV), and the
    weight floor does not move."""
    one = decode_step(TARGET, batch, context)
    verify = decode_step(TARGET, batch, context, query_tokens=q)
    wide = decode_step(TARGET, batch * q, context + q - 1)
    assert one.total_s <= verify.total_s <= wide.total_s + 1e-15
    assert verify["weights"] == one["weights"] and verify["kv_cache"] == one["kv_cache"]


def test_the_verify_pass_is_free_at_batch_one_and_not_at_large_batch():
    """Leviathan et al.'s premise (verification costs one target step) holds while batch x (k + 1)
    tokens are far below the ridge (about 300 FLOP/B on an H100: a few hundred tokens)."""
    small = decode_step(TARGET, 1, 2048, query_tokens=5).total_s / decode_step(TARGET, 1, 2048).total_s
    large = decode_step(TARGET, 256, 2048, query_tokens=5).total_s / decode_step(TARGET, 256, 2048).total_s
    assert small < 1.01 and large > 1.5


def test_query_tokens_validated():
    with pytest.raises(ValueError, match="query_tokens"):
        decode_step(TARGET, 1, 0, query_tokens=0)
    with pytest.raises(ValueError, match="context \\+ query_tokens - 1"):
        decode_step(TARGET, 1, TARGET.mdl.max_position_embeddings, query_tokens=2)


# ---- the speculative step ---------------------------------------------------------------------------------


def test_zero_draft_tokens_is_plain_decoding():
    s = sp.speculative_step(TARGET, sp.model_drafter(DRAFT), 0, 0.8, batch=4, context=1024)
    assert s.speedup == 1.0 and s.draft_s == 0 and s.tokens_per_step == 1


def test_batch_one_matches_the_closed_form():
    """At batch 1 the verify pass costs a plain step (to 1%), so the step model's speedup is
    Leviathan's closed form with c = one draft forward / one target step."""
    drafter = sp.model_drafter(DRAFT)
    s = sp.speculative_step(TARGET, drafter, 4, 0.8, batch=1, context=1024)
    c = drafter.token_s(1, 1024) / s.plain_step_s
    assert s.speedup == pytest.approx(sp.speculative_speedup(0.8, 4, c), rel=0.01)
    assert s.speedup < sp.speculative_tokens_per_step(0.8, 4)  # the draft is not free


def test_speedup_falls_with_batch_and_turns_into_a_slowdown():
    drafter = sp.model_drafter(DRAFT)
    ups = [sp.speculative_step(TARGET, drafter, 4, 0.7, batch=b, context=2048).speedup for b in (1, 16, 64, 256, 512)]
    assert all(x > y for x, y in zip(ups, ups[1:], strict=False))
    assert ups[0] > 1.5 and ups[-1] < 1.0


def test_best_draft_tokens_is_the_argmax_and_turns_off():
    drafter = sp.free_drafter()
    best = sp.best_draft_tokens(TARGET, drafter, 0.8, batch=1, context=1024)
    every = [sp.speculative_step(TARGET, drafter, k, 0.8, 1, 1024).tokens_per_s for k in range(13)]
    assert best.tokens_per_s == max(every) and best.draft_tokens > 0
    off = sp.best_draft_tokens(TARGET, sp.model_drafter(DRAFT), 0.3, batch=512, context=2048)
    assert off.draft_tokens == 0 and off.speedup == 1.0


def test_inputs_validated():
    with pytest.raises(ValueError, match="drafter must be a Drafter"):
        sp.speculative_step(TARGET, "llama-3.2-1b", 4, 0.8)
    with pytest.raises(ValueError, match="acceptance"):
        sp.speculative_step(TARGET, sp.free_drafter(), 4, 1.5)
    with pytest.raises(ValueError, match="drafter kind"):
        sp.Drafter("x", "oracle", lambda b, c: 0.0)


# ---- where speculation runs out of spare compute (break-even batch, ridge, draft-length table) -------------


def test_verify_free_tokens_is_the_ridge_in_tokens():
    """BF16 weights: T* = (P / W) x matmul_eff / gemv_eff (the ridge point in FLOP/B, two bytes a weight)."""
    from lib.perf.step import step_assumptions

    a = step_assumptions()
    want = TARGET.chip.ridge_point("bf16") * a.matmul_efficiency / a.gemv_efficiency
    assert sp.verify_free_tokens(TARGET) == pytest.approx(want, rel=1e-12)
    fp8 = TARGET.replace(weight_dtype="fp8", compute_dtype="fp8")
    assert sp.verify_free_tokens(fp8) == pytest.approx(  # twice the FLOP/s over half the bytes
        fp8.chip.ridge_point("fp8") / 2 * a.matmul_efficiency / a.gemv_efficiency, rel=1e-12)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 6), st.sampled_from([512, 2048, 8192]))
def test_verify_ridge_batch_matches_a_scan_of_the_step_model(k, context):
    """Oracle: the first batch whose step (decode_step at k + 1 query tokens) shows compute excess, found by
    scanning every batch; at these contexts only the GEMMs can turn compute-bound (attention reads
    8 x (k + 1) FLOP per KV byte at most), so the step's own bucket is the same test."""
    got = sp.verify_ridge_batch(TARGET, k, context)
    scan = next(b for b in range(1, 400) if decode_step(TARGET, b, context, query_tokens=k + 1)["compute_excess"] > 0)
    assert got == scan
    # and the closed form T* / (k + 1), to one sequence
    assert abs(got - sp.verify_free_tokens(TARGET) / (k + 1)) <= 1.0


def test_break_even_batch_is_where_the_speedup_crosses_one():
    drafter = sp.model_drafter(DRAFT)
    b = sp.break_even_batch(TARGET, drafter, 4, 0.7, 512)
    lo, hi = math.floor(b), math.ceil(b)
    up = [sp.speculative_step(TARGET, drafter, 4, 0.7, n, 512).speedup for n in (lo, hi)]
    assert up[0] > 1 >= up[1]
    # brute force: every batch below pays, the first one at or above does not
    scan = next(n for n in range(1, 1024) if sp.speculative_step(TARGET, drafter, 4, 0.7, n, 512).speedup <= 1)
    assert scan == hi


def test_break_even_batch_edges():
    drafter = sp.model_drafter(DRAFT)
    assert sp.break_even_batch(TARGET, drafter, 4, 0.0, 512) == 1.0  # nothing accepted: never pays
    assert math.isinf(sp.break_even_batch(TARGET, drafter, 4, 0.8, 8192))  # the shared KV read keeps it paying
    with pytest.raises(ValueError, match="draft_tokens"):
        sp.break_even_batch(TARGET, drafter, 0, 0.8)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 8), st.floats(0.0, 0.3), st.floats(10.0, 1000.0))
def test_break_even_estimate_solves_its_own_model(a, k, c, t_star):
    """At the closed form's batch, E / (max(1, B (k + 1) / T*) + k c) = 1 (when some batch pays)."""
    b = sp.break_even_batch_estimate(a, k, c, t_star)
    e = sp.speculative_tokens_per_step(a, k)
    if b == 0:
        assert e <= 1 + k * c + 1e-12
    else:
        assert b <= t_star * (1 + 1e-12)
        assert e / (max(1.0, b * (k + 1) / t_star) + k * c) == pytest.approx(1.0, rel=1e-9)


def test_break_even_estimate_is_close_to_the_step_model_at_short_context():
    """With little KV to read the step is mostly weights: the closed form lands within 25% of the step model."""
    drafter = sp.model_drafter(DRAFT)
    s = sp.speculative_step(TARGET, drafter, 4, 0.7, 1, 0)
    est = sp.break_even_batch_estimate(0.7, 4, drafter.token_s(1, 0) / s.plain_step_s, sp.verify_free_tokens(TARGET))
    assert est == pytest.approx(sp.break_even_batch(TARGET, drafter, 4, 0.7, 0), rel=0.25)


def test_draft_length_table_is_the_argmax_per_bucket_and_shrinks_with_batch():
    drafter = sp.model_drafter(DRAFT)
    edges = [1, 8, 32, 128, 1024]
    table = sp.draft_length_table(TARGET, drafter, 0.7, edges, 512)
    for edge, row in zip(edges, table, strict=True):
        every = [sp.speculative_step(TARGET, drafter, k, 0.7, edge, 512).tokens_per_s for k in range(9)]
        assert row.batch == edge and row.tokens_per_s == max(every)
    ks = [r.draft_tokens for r in table]
    assert ks == sorted(ks, reverse=True) and ks[0] > 0 and ks[-1] == 0
    with pytest.raises(ValueError, match="batch_buckets"):
        sp.draft_length_table(TARGET, drafter, 0.8, [8, 4])
