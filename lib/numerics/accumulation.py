"""Running sums held in a narrow dtype, and a small forward pass that holds one in the wrong place.

A total kept in bf16 (8 significant bits) stops taking an increment once the increment is at most
half an ulp of the total: counting by ones stalls at 2^8 = 256 (ulp(256) = 2; 256 + 1 ties to even,
256). :func:`running_sum` keeps a total in fp32, bf16 or Kahan-compensated bf16;
:func:`pooled_outputs` is a seeded single-query attention readout over a token stream (a position
counter feeding RoPE, scores, a softmax denominator and a value accumulator, each op's dtype
chosen), and :func:`bisect_dtype` finds the op whose dtype makes the error grow with length by
halving the suspect set. Every bf16 rounding goes through :func:`lib.numerics.formats.bf16_round`
(its scalar twin for one lane; for many lanes Veltkamp's split, in place, where it gives the same bits:
:func:`_split_running_sum`). numpy only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import integer, real

from .formats import bf16_round, bf16_round_scalar

__all__ = ["OPS", "STATE_DTYPES", "STATE_OPS", "BisectStep", "PoolingProblem", "bisect_dtype", "error_curve",
           "growth", "pooled_outputs", "pooling_problem", "relative_error", "running_sum", "significant_bits",
           "swamping_total"]

# the forward pass's ops, in the order they run; each can round (or hold its state) in fp32 or bf16
OPS = ("kv_cache", "position", "rope_angle", "scores", "probs", "denominator", "accumulator", "output")
STATE_OPS = ("position", "denominator", "accumulator")  # the running sums among them
STATE_DTYPES = ("fp32", "bf16", "kahan_bf16", "fp64")
_SIGNIFICANT_BITS = {"fp8": 4, "bf16": 8, "fp16": 11, "fp32": 24, "fp64": 53}


def significant_bits(dtype: str) -> int:
    """Significant bits p of ``dtype`` (the implicit leading one included): fp8 (E4M3) 4, bf16 8,
    fp16 11, fp32 24, fp64 53. A normal value x has ulp(x) = 2^(floor(log2 x) - p + 1)."""
    if dtype not in _SIGNIFICANT_BITS:
        raise ValueError(f"dtype must be one of {', '.join(_SIGNIFICANT_BITS)}, got {dtype!r}")
    return _SIGNIFICANT_BITS[dtype]


def swamping_total(increment: float, dtype: str) -> float:
    """The total from which adding ``increment`` no longer changes it: 2^p * increment for a
    power-of-two increment (there the increment is exactly half an ulp and the tie goes to the even
    neighbour, the total itself). bf16 counting by ones: 2^8 = 256; fp16: 2048; fp32: 2^24 =
    16,777,216. For any other positive increment a, the same formula with a rounded up to a power of
    two: 2^(p + ceil(log2 a)), past which a < ulp / 2 is rounded away (it may stall up to 2x sooner)."""
    a = real("increment", increment, 0, low_open=True)
    return float(2.0 ** (significant_bits(dtype) + math.ceil(math.log2(a))))


def _state_name(state: str) -> str:
    if state not in STATE_DTYPES:
        raise ValueError(f"state must be one of {', '.join(STATE_DTYPES)}, got {state!r}")
    return state


def running_sum(x, state: str = "fp32") -> np.ndarray:
    """Running totals of ``x`` along axis 0 (float32 increments), the total held in ``state``:

    - ``fp32``: t_i = fl32(t_{i-1} + x_i), one float32 rounding per add (numpy's sequential accumulate);
    - ``bf16``: t_i = bf16(t_{i-1} + x_i): the add in float32, the total stored back in bf16 (what an
      in-place add into a bf16 tensor does);
    - ``kahan_bf16``: Kahan's compensated sum with the total and the compensation both stored in bf16
      (y = x - c, t = s + y, c = (t - s) - y, each rounded to bf16): the lost low bits are carried to
      the next add; error about 2u + n u^2 of sum |x| (u = 2^-8) instead of n u;
    - ``fp64``: float64, the near-exact reference.

    Returns an array of x's shape (float32; float64 for fp64)."""
    st = _state_name(state)
    a = np.asarray(x, dtype=np.float64 if st == "fp64" else np.float32)
    if a.ndim < 1 or a.shape[0] < 1:
        raise ValueError(f"x must have at least one element along axis 0, got shape {a.shape}")
    flat = a.reshape(a.shape[0], -1)  # lanes side by side, one add per step for all of them
    if st in ("fp32", "fp64"):  # a sequential accumulate either way; along the contiguous axis it is faster
        if flat.shape[1] == 1:
            return np.cumsum(a, axis=0, dtype=a.dtype)
        lanes = np.cumsum(np.ascontiguousarray(flat.T), axis=1, dtype=a.dtype)
        return np.ascontiguousarray(lanes.T).reshape(a.shape)
    if flat.shape[1] == 1:
        try:
            return np.array(_scalar_running_sum(flat[:, 0].tolist(), st), np.float32).reshape(a.shape)
        except OverflowError:  # a total past float32's range: the array path saturates like numpy
            pass
    fast = _split_running_sum(flat, st)
    return (fast if fast is not None else _lane_running_sum(flat, st)).reshape(a.shape)


def _lane_running_sum(flat: np.ndarray, state: str) -> np.ndarray:
    """:func:`running_sum` of (steps, lanes) float32 in bf16 or kahan_bf16, one :func:`bf16_round` per op:
    the definition, used where :func:`_split_running_sum` cannot vouch for its bits."""
    out = np.empty_like(flat)
    s = np.zeros(flat.shape[1], np.float32)
    if state == "bf16":
        for i in range(flat.shape[0]):
            s = bf16_round(s + flat[i])
            out[i] = s
        return out
    c = np.zeros_like(s)
    for i in range(flat.shape[0]):
        y = bf16_round(flat[i] - c)
        t = bf16_round(s + y)
        c = bf16_round(bf16_round(t - s) - y)
        s = t
        out[i] = s
    return out


_SPLIT = np.float32(2**16 + 1)  # Veltkamp's splitter for 24 - 16 = 8 significant bits
_SPLIT_MIN = 2.0**-100  # smallest nonzero |x| for which no intermediate of the sum is subnormal


def _split_running_sum(flat: np.ndarray, state: str) -> np.ndarray | None:
    """:func:`_lane_running_sum`, bit for bit, in about a third of the time; None where it cannot vouch.

    Each bf16 rounding is Veltkamp's split in float32, hi = z - (z - v) with z = v (2^16 + 1): three
    in-place ufuncs on preallocated lanes instead of :func:`bf16_round`'s fresh arrays; every step keeps
    each lane's order of operations. The split equals ``bf16_round`` (nearest, ties to even) on zero and
    on every normal float32 below 2^112 in magnitude (all 2^32 bit patterns were compared); it differs on
    subnormals and gives NaN above. So: inputs finite, each zero or at least 2^-100 in magnitude (every
    intermediate is then a multiple of 2^-123: zero or normal), and no NaN in the result (an overflow
    would leave one); otherwise None."""
    a = np.abs(flat)
    if not (np.isfinite(a).all() and ((a == 0) | (a >= _SPLIT_MIN)).all()):
        return None
    n, lanes = flat.shape
    out = np.empty_like(flat)
    prev = np.zeros(lanes, np.float32)
    z = np.empty(lanes, np.float32)
    k = _SPLIT
    mul, sub, add = np.multiply, np.subtract, np.add

    def to_bf16(v):  # v = bf16(v) in place: z = v (2^16 + 1); v = z - (z - v)
        mul(v, k, z)
        sub(z, v, v)
        sub(z, v, v)

    with np.errstate(over="ignore", invalid="ignore"):
        if state == "bf16":  # t = bf16(s + x)
            for x, t in zip(flat, out, strict=True):
                add(prev, x, t)
                to_bf16(t)
                prev = t
        else:  # y = bf16(x - c); t = bf16(s + y); c = bf16(bf16(t - s) - y)
            c = np.zeros(lanes, np.float32)
            y = np.empty(lanes, np.float32)
            for x, t in zip(flat, out, strict=True):
                sub(x, c, y)
                to_bf16(y)
                add(prev, y, t)
                to_bf16(t)
                sub(t, prev, c)
                to_bf16(c)
                sub(c, y, c)
                to_bf16(c)
                prev = t
    return None if np.isnan(out).any() else out


def _scalar_running_sum(xs: list[float], state: str) -> list[float]:
    """:func:`running_sum` of one lane in Python floats: each float32 add is the double sum rounded to
    float32 (correct: binary64 has more than 2 x 24 + 2 bits, so the double rounding is innocuous), then
    :func:`bf16_round_scalar`; equal bit for bit to the array path, tens of times faster per step."""
    r, s, out = bf16_round_scalar, 0.0, []
    if state == "bf16":
        for v in xs:
            s = r(s + v)
            out.append(s)
        return out
    c = 0.0
    for v in xs:
        y = r(v - c)
        t = r(s + y)
        c = r(r(t - s) - y)
        s = t
        out.append(s)
    return out


@dataclass(frozen=True)
class PoolingProblem:
    """A seeded token stream for one attention readout: a query q (d,), keys k and values v (n, d),
    the RoPE inverse frequencies (d/2,) and the score scale. ``key``: the arguments of
    :func:`pooling_problem` that built it (its forward passes are cached under it), or None."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    inv_freq: np.ndarray
    scale: float
    key: tuple | None = field(default=None, compare=False)

    @property
    def length(self) -> int:
        return self.k.shape[0]


def pooling_problem(length: int, d: int = 64, score_std: float = 2.0, value_mean: float = 1.0,
                    rope_base: float = 10_000.0, seed: int = 0) -> PoolingProblem:
    """q, k ~ N(0, 1) in d dimensions, v ~ N(value_mean, 1), scores q.k * scale with scale =
    score_std / sqrt(d) (score standard deviation ``score_std``), RoPE inverse frequencies
    base^(-2i/d), i < d/2. float32 arrays, read-only (cached: the same arguments give the same arrays)."""
    n = integer("length", length, 2, 1 << 20, unit="tokens")
    dd = integer("d", d, 2, 1024)
    if dd % 2:
        raise ValueError(f"d must be even (RoPE rotates pairs), got {dd}")
    sd = real("score_std", score_std, 0, 20, low_open=True)
    vm = real("value_mean", value_mean, -100, 100)
    base = real("rope_base", rope_base, 2, 1e9)
    return _pooling_problem(n, dd, sd, vm, base, integer("seed", seed, 0))


@functools.lru_cache(maxsize=4)
def _pooling_problem(n: int, dd: int, sd: float, vm: float, base: float, seed: int) -> PoolingProblem:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(dd).astype(np.float32)
    k = rng.standard_normal((n, dd)).astype(np.float32)
    v = (rng.standard_normal((n, dd)) + vm).astype(np.float32)
    inv_freq = (base ** (-np.arange(0, dd, 2) / dd)).astype(np.float32)
    for a in (q, k, v, inv_freq):
        a.flags.writeable = False
    return PoolingProblem(q, k, v, inv_freq, sd / math.sqrt(dd), (n, dd, sd, vm, base, int(seed)))


def _dtypes(dtypes: Mapping[str, str] | None) -> dict[str, str]:
    dt = dict.fromkeys(OPS, "fp32")
    for op, dtype in (dtypes or {}).items():
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
        allowed = STATE_DTYPES[:3] if op in STATE_OPS else ("fp32", "bf16")
        if dtype not in allowed:
            raise ValueError(f"the dtype of {op} must be one of {', '.join(allowed)}, got {dtype!r}")
        dt[op] = dtype
    return dt


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_round(x) if dtype == "bf16" else np.asarray(x, np.float32)


def pooled_outputs(problem: PoolingProblem, dtypes: Mapping[str, str] | None = None) -> np.ndarray:
    """The readout o_t after each token t of the stream, every op in the dtype ``dtypes`` gives it
    (default fp32; ops in :data:`OPS`):

    k, v stored (kv_cache); position p_t = p_{t-1} + 1 from p_0 = 0, a running sum (position);
    angles p_t * inv_freq (rope_angle); k rotated by them; s_t = q . k_t * scale (scores);
    w_t = exp(s_t - max_s s) (probs; a two-pass softmax: the max first); l_t = sum w (denominator)
    and a_t = sum w v (accumulator), running sums; o_t = a_t / l_t (output). Returns (n, d) float64,
    read-only (a problem built by :func:`pooling_problem` caches its passes)."""
    dt = _dtypes(dtypes)
    if problem.key is not None:
        return _cached_outputs(problem.key, tuple(sorted(dt.items())))
    return _outputs(problem, dt)


@functools.lru_cache(maxsize=16)
def _cached_outputs(key: tuple, dt_items: tuple) -> np.ndarray:
    n, d, sd, vm, base, seed = key
    return _outputs(pooling_problem(n, d, sd, vm, base, seed), dict(dt_items))


_STAGES: dict = {}  # (problem key, stage, dtypes) -> read-only arrays; passes that differ late share the rest
_STAGES_KEPT = 12


def _stage(problem: PoolingProblem, name: str, dts: tuple, compute):
    """``compute()``, remembered under (``problem.key``, ``name``, ``dts``) when the problem has a key (the
    dtypes of every op the stage depends on are in ``dts``, so a pass reuses what another computed
    identically); the oldest entries go past :data:`_STAGES_KEPT`."""
    if problem.key is None:
        return compute()
    k = (problem.key, name, dts)
    hit = _STAGES.get(k)
    if hit is None:
        hit = compute()
        for a in hit if isinstance(hit, tuple) else (hit,):
            a.flags.writeable = False
        while len(_STAGES) >= _STAGES_KEPT:
            del _STAGES[next(iter(_STAGES))]
        _STAGES[k] = hit
    return hit


@functools.lru_cache(maxsize=16)
def _positions(n: int, state: str) -> np.ndarray:
    """The position counter p_t = p_{t-1} + 1 from p_0 = 0 for t < n, held in ``state``: the same for every
    problem of that length, so counted once (read-only)."""
    steps = np.ones(n, np.float32)
    steps[0] = 0.0
    pos = running_sum(steps, state)
    pos.flags.writeable = False
    return pos


def _weights(problem: PoolingProblem, dt: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """(w, v): the softmax numerators exp(s_t - max s) and the stored values (ops kv_cache to probs)."""
    n = problem.length
    k = _cast(problem.k, dt["kv_cache"])
    v = _cast(problem.v, dt["kv_cache"])
    pos = _positions(n, dt["position"])
    angle = _cast(pos[:, None] * problem.inv_freq[None, :], dt["rope_angle"])
    cos, sin = np.cos(angle), np.sin(angle)
    half = k.shape[1] // 2
    k1, k2 = k[:, :half], k[:, half:]
    k_rot = np.concatenate([k1 * cos - k2 * sin, k1 * sin + k2 * cos], axis=1)
    s = _cast((k_rot @ problem.q) * np.float32(problem.scale), dt["scores"])
    w = _cast(np.exp(s - s.max()), dt["probs"])
    return w, v


def _outputs(problem: PoolingProblem, dt: dict[str, str]) -> np.ndarray:
    front = tuple(dt[op] for op in OPS[:5])  # kv_cache .. probs
    w, v = _stage(problem, "weights", front, lambda: _weights(problem, dt))
    den = _stage(problem, "denominator", (*front, dt["denominator"]), lambda: running_sum(w, dt["denominator"]))
    acc = _stage(problem, "accumulator", (*front, dt["accumulator"]),
                 lambda: running_sum(w[:, None] * v, dt["accumulator"]))
    out = _cast(acc / den[:, None], dt["output"]).astype(np.float64)
    out.flags.writeable = False
    return out


def relative_error(outputs: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """||o_t - ref_t|| / ||ref_t|| for each prefix length t (rows)."""
    o, r = np.asarray(outputs, np.float64), np.asarray(reference, np.float64)
    if o.shape != r.shape:
        raise ValueError(f"outputs and reference must have one shape, got {o.shape} and {r.shape}")
    return np.linalg.norm(o - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-300)


def error_curve(problem: PoolingProblem, dtypes: Mapping[str, str] | None, lengths,
                reference: np.ndarray | None = None) -> np.ndarray:
    """The relative error of the readout at each context length in ``lengths`` (tokens, 1..n) against
    the all-fp32 forward pass (``reference``: its outputs, if already computed)."""
    ls = np.asarray(lengths)
    if ls.ndim != 1 or ls.size == 0 or ls.min() < 1 or ls.max() > problem.length:
        raise ValueError(f"lengths must lie in [1, {problem.length}] tokens, got {lengths!r}")
    ref = pooled_outputs(problem) if reference is None else reference
    return relative_error(pooled_outputs(problem, dtypes), ref)[ls.astype(int) - 1]


def _window_rms(err: np.ndarray, length: int) -> float:
    """RMS of the error over the prefix lengths (length/2, length]: one length is a noisy sample."""
    lo = max(0, length // 2)
    return float(np.sqrt(np.mean(err[lo:length] ** 2)))


def growth(err: np.ndarray, short_len: int, long_len: int) -> tuple[float, float, float]:
    """(error near short_len, error near long_len, their ratio): each the RMS of the per-length error
    over (L/2, L]. A ratio near 1 is a flat error (a per-element rounding); a state losing
    increments makes it grow."""
    s, lg = _window_rms(err, short_len), _window_rms(err, long_len)
    return s, lg, lg / max(s, 1e-300)


@dataclass(frozen=True)
class BisectStep:
    """One bisection step: the suspects, the half upcast to fp32, the errors near the short and long
    lengths with that half upcast, their ratio, and whether the growth went away."""

    suspects: tuple[str, ...]
    upcast: tuple[str, ...]
    err_short: float
    err_long: float
    ratio: float
    fixed: bool


def bisect_dtype(problem: PoolingProblem, deployed: Mapping[str, str], short_len: int, long_len: int,
                 growth_limit: float = 2.0, reference: np.ndarray | None = None) -> tuple[str, list[BisectStep]]:
    """Find the op whose dtype makes the error grow with context length by halving the suspect set.

    Suspects: every op in :data:`OPS`, in forward order. Each step runs the deployed forward pass with
    the first half of the suspects upcast to fp32 and compares it with the all-fp32 reference near
    ``short_len`` and ``long_len``: if the long/short error ratio falls to ``growth_limit`` or below,
    the culprit is in that half, otherwise in the other. ceil(log2 8) = 3 runs for 8 ops. Raises
    ValueError if the deployed pass does not grow at all (nothing to bisect)."""
    n = problem.length
    sl = integer("short_len", short_len, 2, n, unit="tokens")
    ll = integer("long_len", long_len, 2 * sl, n, unit="tokens")
    lim = real("growth_limit", growth_limit, 1, low_open=True)
    dep = _dtypes(deployed)
    ref = pooled_outputs(problem) if reference is None else reference
    _, _, r0 = growth(relative_error(pooled_outputs(problem, dep), ref), sl, ll)
    if r0 <= lim:
        raise ValueError(f"the deployed pass's error does not grow (long/short ratio {r0:.3g} <= growth_limit "
                         f"{lim:g}): nothing to bisect")
    suspects = OPS
    steps: list[BisectStep] = []
    while len(suspects) > 1:
        half = suspects[: len(suspects) // 2]
        trial = dep | dict.fromkeys(half, "fp32")
        es, el, ratio = growth(relative_error(pooled_outputs(problem, trial), ref), sl, ll)
        fixed = ratio <= lim
        steps.append(BisectStep(suspects, half, es, el, ratio, fixed))
        suspects = half if fixed else suspects[len(half):]
    return suspects[0], steps
