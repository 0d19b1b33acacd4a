"""lib.numerics.accumulation: running sums held in bf16 against torch's bfloat16 (the oracle), the
swamping rule, the seeded readout and the bisection that finds the op holding its state in bf16."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import accumulation as acc


def test_bf16_counter_stalls_at_256_like_torch():
    ones = np.ones(1000, np.float32)
    got = acc.running_sum(ones, "bf16")
    assert got[255] == 256 and got[-1] == 256 and got[254] == 255
    torch = pytest.importorskip("torch")
    t = torch.zeros((), dtype=torch.bfloat16)
    seq = []
    for _ in range(1000):
        t += 1  # an in-place add into a bf16 tensor: computed in float, stored in bf16
        seq.append(float(t))
    assert seq == got.tolist()


def test_bf16_running_sum_matches_torch_on_random_increments():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = (rng.lognormal(-3, 1.5, (600, 3)) * rng.choice([-1, 1], (600, 3))).astype(np.float32)
    got = acc.running_sum(x, "bf16")
    t = torch.zeros(3, dtype=torch.bfloat16)
    want = np.empty_like(x)
    for i in range(600):
        t += torch.from_numpy(x[i])
        want[i] = t.float().numpy()
    assert (got == want).all()


def test_fp32_running_sum_is_sequential_float32():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(500).astype(np.float32)
    s, want = np.float32(0), []
    for v in x:
        s = np.float32(s + v)
        want.append(s)
    assert acc.running_sum(x, "fp32").tolist() == want


def test_kahan_bf16_keeps_a_total_but_not_a_counter():
    ones = np.ones(2000, np.float32)
    kahan = acc.running_sum(ones, "kahan_bf16")
    assert abs(kahan[-1] - 2000) <= 4  # the total keeps up with the count (to within one bf16 step at 2000)
    assert (kahan != np.arange(1, 2001)).sum() > 100  # but many intermediate values are wrong
    w = np.random.default_rng(3).lognormal(-5, 1, 5000).astype(np.float32)
    exact = math.fsum(w.astype(np.float64))
    assert abs(acc.running_sum(w, "kahan_bf16")[-1] / exact - 1) < 0.02
    assert abs(acc.running_sum(w, "bf16")[-1] / exact - 1) > 0.2


@given(st.sampled_from(["bf16", "fp16", "fp32"]), st.integers(-12, 12))
def test_swamping_total_for_powers_of_two(dtype, e):
    a = 2.0**e
    total = acc.swamping_total(a, dtype)
    assert total == 2.0 ** (acc.significant_bits(dtype) + e)
    if dtype == "fp32":
        f = np.float32
        assert f(total) + f(a) == f(total) and f(total / 2) + f(a) != f(total / 2)
    if dtype == "fp16":
        f = np.float16
        if total < 65504:
            assert f(total) + f(a) == f(total) and f(total / 2) + f(a) != f(total / 2)


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-3, 1e3))
def test_bf16_sum_stalls_by_the_swamping_total(a):
    """Adding a repeatedly in bf16 stalls no later than swamping_total(a) (from there a < ulp / 2)."""
    n = int(2 * acc.swamping_total(a, "bf16") / a) + 10
    s = acc.running_sum(np.full(n, a, np.float32), "bf16")
    assert s[-1] <= acc.swamping_total(a, "bf16") * (1 + 2**-7)
    assert s[-1] == s[-2]


def test_readout_is_exact_without_bf16_and_each_state_bug_grows():
    p = acc.pooling_problem(2048, seed=0)
    ref = acc.pooled_outputs(p)
    # float64 re-implementation of the all-fp32 readout
    ang = np.arange(2048)[:, None] * p.inv_freq.astype(np.float64)[None, :]
    k = p.k.astype(np.float64)
    kr = np.concatenate([k[:, :32] * np.cos(ang) - k[:, 32:] * np.sin(ang), k[:, :32] * np.sin(ang) + k[:, 32:] * np.cos(ang)], 1)
    s = kr @ p.q.astype(np.float64) * p.scale
    w = np.exp(s - s.max())
    o = np.cumsum(w[:, None] * p.v, axis=0) / np.cumsum(w)[:, None]
    assert acc.relative_error(ref, o).max() < 1e-4
    for op in acc.STATE_OPS:
        dep = {"kv_cache": "bf16", "output": "bf16", op: "bf16"}
        err = acc.relative_error(acc.pooled_outputs(p, dep), ref)
        assert acc.growth(err, 128, 2048)[2] > 2, op
        culprit, steps = acc.bisect_dtype(p, dep, 128, 2048, reference=ref)
        assert culprit == op and len(steps) == 3
        fixed = acc.relative_error(acc.pooled_outputs(p, dep | {op: "fp32"}), ref)
        assert acc.growth(fixed, 128, 2048)[2] < 2
    assert acc.relative_error(acc.pooled_outputs(p, {"position": "bf16"}), ref)[:256].max() < 1e-6  # exact to 256


def test_cached_and_uncached_passes_agree():
    p = acc.pooling_problem(300, d=8, seed=4)
    q = acc.PoolingProblem(p.q, p.k, p.v, p.inv_freq, p.scale)  # no key: not cached
    dep = {"denominator": "bf16", "output": "bf16"}
    assert (acc.pooled_outputs(p, dep) == acc.pooled_outputs(q, dep)).all()
    assert acc.error_curve(p, dep, [1, 300]).shape == (2,)


def test_bad_inputs_are_refused():
    p = acc.pooling_problem(64, d=4)
    with pytest.raises(ValueError, match="op must be"):
        acc.pooled_outputs(p, {"attention": "bf16"})
    with pytest.raises(ValueError, match="dtype of scores"):
        acc.pooled_outputs(p, {"scores": "kahan_bf16"})
    with pytest.raises(ValueError, match="state"):
        acc.running_sum([1.0], "fp8")
    with pytest.raises(ValueError, match="does not grow"):
        acc.bisect_dtype(p, {}, 8, 64)
    with pytest.raises(ValueError, match="d must be even"):
        acc.pooling_problem(64, d=5)
    with pytest.raises(ValueError, match="lengths"):
        acc.error_curve(p, None, [0, 10])
    with pytest.raises(ValueError, match="increment"):
        acc.swamping_total(0.0, "bf16")


@pytest.mark.parametrize("state", ["bf16", "kahan_bf16"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_one_lane_fast_path_equals_the_array_path(state, scale):
    """A single lane runs over Python floats; two identical lanes take the numpy path: same bits."""
    w = (np.random.default_rng(7).random(3000) * scale).astype(np.float32)
    one = acc.running_sum(w, state)
    two = acc.running_sum(np.stack([w, w], axis=1), state)[:, 0]
    assert (one.view(np.uint32) == two.view(np.uint32)).all()


def _plain_running_sum(x: np.ndarray, state: str) -> np.ndarray:
    """The definition, one element at a time: float32 adds, each result rounded by bf16_round."""
    from lib.numerics.formats import bf16_round

    def r(v):
        return bf16_round(np.float32(v))[0]

    out = np.empty_like(x)
    for lane in range(x.shape[1]):
        s = c = np.float32(0)
        for i in range(x.shape[0]):
            if state == "bf16":
                s = r(s + x[i, lane])
            else:
                y = r(x[i, lane] - c)
                t = r(s + y)
                c = r(r(t - s) - y)
                s = t
            out[i, lane] = s
    return out


def _increments(rng, kind: str, n: int, lanes: int) -> np.ndarray:
    sign = rng.choice([-1.0, 1.0], (n, lanes))
    if kind == "lognormal":
        return (rng.lognormal(-3, 2, (n, lanes)) * sign).astype(np.float32)
    if kind == "ties":  # multiples of 1/8 around a drifting total: many exact bf16 ties
        return (rng.integers(1, 64, (n, lanes)) / 8 * sign).astype(np.float32)
    if kind == "zeros":
        x = rng.standard_normal((n, lanes)).astype(np.float32)
        x[rng.random((n, lanes)) < 0.3] = 0
        return x
    if kind == "tiny":  # subnormal increments: the split cannot vouch, the plain loop runs
        return (rng.random((n, lanes)) * 2.0**-130 * sign).astype(np.float32)
    if kind == "huge":  # totals past 2^112 and float32's range: overflow, inf, then NaN
        return (rng.random((n, lanes)) * 3e37).astype(np.float32)
    raise AssertionError(kind)


@pytest.mark.parametrize("state", ["bf16", "kahan_bf16"])
@pytest.mark.parametrize("kind", ["lognormal", "ties", "zeros", "tiny", "huge"])
def test_lane_running_sum_equals_the_plain_definition(state, kind):
    """The vectorised lanes (Veltkamp's split, in place) give the bits of the element-by-element definition;
    where the split cannot vouch (subnormal or overflowing values) the fallback must give them too."""
    rng = np.random.default_rng(sum(map(ord, state + kind)))
    x = _increments(rng, kind, 300, 4)
    with np.errstate(over="ignore", invalid="ignore"):
        got = acc.running_sum(x, state)
        want = _plain_running_sum(x, state)
        fast = acc._split_running_sum(x, state)
    assert (got.view(np.uint32) == want.view(np.uint32)).all()
    assert (fast is None) == (kind in ("tiny", "huge"))  # each case exercises the path it claims to


def test_split_rounding_equals_bf16_round_on_random_bit_patterns():
    """One step of the bf16 sum from zero is bf16(x): the split, on a million random normal floats below 2^100
    in magnitude (every exponent, ties included), equals bf16_round bit for bit."""
    from lib.numerics.formats import bf16_round

    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    bits[: 1 << 16] = (bits[: 1 << 16] & 0xFFFF0000) | 0x8000  # exact ties: round to the even neighbour
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) >= 2.0**-100) & (np.abs(x) < 2.0**100)]
    row = x[None, :]
    assert acc._split_running_sum(row, "bf16") is not None
    assert (acc.running_sum(row, "bf16")[0].view(np.uint32) == bf16_round(x).view(np.uint32)).all()
