"""lib.decoding.quantized: which distribution speculative sampling keeps under FP8. The pass-level
enumeration against the prefix-level one and against sampling; the exact cases exact, the two leaks
non-zero and gone with their fixes."""

import numpy as np
import pytest

from lib.decoding import quantized as dq
from lib.decoding import verify as dv


@pytest.fixture(scope="module")
def setup():
    m = dq.ToyFP8Model(vocab=3, d=8, outlier_scale=30.0, seed=2)
    o = dq.ToyFP8Model(vocab=3, d=8, outlier_scale=30.0, seed=3)
    return m, (lambda c: 0.7 * m.decode(c) + 0.3 * o.decode(c)), (1, 2, 0)


def test_pass_enumeration_equals_prefix_enumeration_when_rows_depend_on_the_prefix_only(setup):
    m, draft, pr = setup
    a = dq.pass_step_distribution(lambda xs: m.verify_pass(pr, xs), lambda pre: draft(pr + pre), 2)
    b = dv.step_distribution(lambda pre: m.decode(pr + pre), lambda pre: draft(pr + pre), 2)
    assert dv.total_variation(a, b) < 1e-12


def test_exact_cases_are_exact_and_leaks_are_not(setup):
    m, draft, pr = setup
    bf16 = dq.stream_of(m.decode, 3, 3, pr)
    fp8 = dq.stream_of(lambda c: m.decode(c, fp8_linear=True), 3, 3, pr)
    kv = dq.stream_of(lambda c: m.decode(c, fp8_kv=True), 3, 3, pr)
    fp8_draft = dq.pass_stream_distribution(lambda c, xs: m.verify_pass(c, xs), lambda c: m.decode(c, fp8_linear=True),
                                            2, 3, pr)
    assert dv.total_variation(fp8_draft, bf16) < 1e-12
    per_token = dq.pass_stream_distribution(lambda c, xs: m.verify_pass(c, xs, fp8_linear=True, per_token=True),
                                            draft, 2, 3, pr)
    assert dv.total_variation(per_token, fp8) < 1e-12 and dv.total_variation(per_token, bf16) > 1e-6
    tensor = dq.pass_stream_distribution(lambda c, xs: m.verify_pass(c, xs, fp8_linear=True), draft, 2, 3, pr)
    assert dv.total_variation(tensor, fp8) > 1e-6
    leak = dq.pass_stream_distribution(lambda c, xs: m.verify_pass(c, xs, fp8_kv=True), draft, 2, 3, pr)
    assert dv.total_variation(leak, kv) > 1e-6


def test_pass_step_distribution_against_the_sampled_batch_verifier(setup):
    m, draft, pr = setup
    rng = np.random.default_rng(0)
    n = 30_000
    x1 = dv.inverse_cdf(np.broadcast_to(draft(pr), (n, 3)), rng.random(n))
    x2 = np.array([int(dv.inverse_cdf(draft(pr + (int(a),)), u)) for a, u in zip(x1, rng.random(n), strict=True)])
    drafts = np.stack([x1, x2], axis=1)
    P = np.stack([m.verify_pass(pr, tuple(x), fp8_linear=True) for x in drafts.tolist()])
    Q = np.stack([[draft(pr), draft(pr + (int(x[0]),))] for x in drafts.tolist()])
    out = dv.rejection_verify(P, Q, drafts, np.full(n, 2), rng)
    counts: dict = {}
    for b in range(n):
        counts[out.emitted(b)] = counts.get(out.emitted(b), 0) + 1
    exact = dq.pass_step_distribution(lambda xs: m.verify_pass(pr, xs, fp8_linear=True), lambda pre: draft(pr + pre), 2)
    stat, crit = dv.chi_square_test([counts], [exact])
    assert stat < crit


def test_per_token_pass_rows_equal_decode_and_bad_inputs():
    m = dq.ToyFP8Model(vocab=4, d=8, seed=0)
    rows = m.verify_pass((1, 2), (3, 0), fp8_linear=True, per_token=True)
    for j, xs in enumerate([(), (3,), (3, 0)]):
        assert np.allclose(rows[j], m.decode((1, 2) + xs, fp8_linear=True), atol=1e-12)
    with pytest.raises(ValueError, match="vocab"):
        dq.ToyFP8Model(vocab=1)
    with pytest.raises(ValueError, match="context"):
        m.decode(())
