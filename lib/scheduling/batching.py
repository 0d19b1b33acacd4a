"""Batching in closed form: what continuous batching gains over static batches, and how many
prefill tokens a step carries before it slows its decodes (the token budget on the roofline).

**The gain is a statistic of the output lengths.** A static batch of ``B`` requests decodes
until its longest member ends, ``max(L_1..L_B)`` steps, and every slot stays held (a finished
member is padding). Continuous batching refills a slot the step it frees, so a request holds
a slot for its own ``L`` steps. In the decode-bound, saturated limit (a step costs the same
with padding as with live sequences, prefill time negligible) the throughput ratio is::

    gain(B) = E[max(L_1..L_B)] / E[L],     E[max] = sum_{k >= 0} (1 - F(k)^B)

(``F`` the CDF of the output length on the positive integers), and the static batch's slot
efficiency (useful slot-steps over held slot-steps) is ``1 / gain``. Constant lengths give 1;
for the integer exponential (:class:`~lib.scheduling.workloads.Geometric`) ``E[max]`` is close
to ``E[L] H_B`` (``H_B`` the harmonic number, about ``ln B + 0.577``); a heavy tail
(:class:`~lib.scheduling.workloads.LogNormal`) gives more. The CDF of each length distribution
of :mod:`lib.scheduling.workloads` is :func:`length_sf` (as the samplers draw: LogNormal
rounded, clipped to 1 and its cap).

**Free prefill tokens.** A mixed step of ``D`` decodes and a prefill chunk of ``T`` tokens
costs ``A(C) + max(dec(D, 0), pass(T + D))`` (:mod:`lib.scheduling.cost`): while the chunk's
GEMMs hide under the decode step's weight read and overheads, it costs nothing extra.
:func:`free_prefill_tokens` is the largest such ``T``: the real knee of the step against its
tokens, the modelled counterpart of the datasheet ridge
(:func:`lib.perf.prefill.weight_read_crossover_tokens`). :func:`prefill_tokens_within` is the
largest chunk a step-time (TPOT) target allows. Both read the one step model through a cost.
:func:`saturated_tokens_per_s` reads a simulated run's throughput while requests wait.

**Goodput.** Every sequence of a decode batch waits for the same step, so the time per output
token of all of them is the step time t(B): past the batch whose step meets a TPOT target, every
request misses at once. :func:`batch_where_doubling_gains` finds the batch at which doubling
adds only a given fraction of throughput (a third: where the fixed and per-sequence costs of the
step are equal); :func:`closed_loop_goodput` reads an offline simulation as a closed loop of
``max_running`` clients and returns the tokens per second of requests within an SLO.

SI units: tokens, seconds.
"""

from __future__ import annotations

import math

import numpy as np

from lib.inputs import integer, real
from lib.scheduling.workloads import Bimodal, Constant, Empirical, Geometric, LogNormal, Uniform
from lib.search import largest_true, smallest_true

__all__ = [
    "batch_where_doubling_gains",
    "closed_loop_goodput",
    "continuous_gain",
    "expected_max_length",
    "free_prefill_tokens",
    "length_mean",
    "length_sf",
    "prefill_tokens_within",
    "resident_kv_tokens",
    "saturated_tokens_per_s",
    "static_slot_efficiency",
]

#: Lengths summed term by term up to here when a distribution has an unbounded tail; beyond it
#: the sum is a midpoint-rule integral on a logarithmic grid (terms vary on a scale of k there).
EXACT_TOKENS = 4096
#: Largest finite support summed term by term (a larger Uniform, Constant or cap is refused).
MAX_SUPPORT = 1 << 24


_ERFC = np.vectorize(math.erfc, otypes=[float])  # the standard library's complementary error function, elementwise


def _components(dist, weight: float = 1.0) -> list:
    """(weight, component) pairs of a (possibly nested) Bimodal mixture; anything else is itself."""
    if isinstance(dist, int) and not isinstance(dist, bool):
        dist = Constant(dist)
    if isinstance(dist, Bimodal):
        return (_components(dist.short, weight * (1 - dist.p_long))
                + _components(dist.long, weight * dist.p_long))
    if not isinstance(dist, Constant | Uniform | Geometric | LogNormal | Empirical):
        raise ValueError(
            "dist must be a length distribution of lib.scheduling.workloads (Constant, Uniform, Geometric, "
            f"LogNormal, Bimodal, Empirical) or a positive int; got {dist!r}"
        )
    return [(weight, dist)]


def _support_max(d) -> float:
    """Largest value the component draws (math.inf for an unbounded tail)."""
    if isinstance(d, Constant):
        return d.value
    if isinstance(d, Uniform):
        return d.high
    if isinstance(d, Empirical):
        return max(d.values)
    if isinstance(d, LogNormal):
        if d.sigma == 0:
            return min(max(1, round(d.median)), d.cap or math.inf)
        return d.cap or math.inf
    return math.inf  # Geometric


def _sf_component(d, x: np.ndarray) -> np.ndarray:
    """P(X > x) of one component at x >= 0 (exact at integers; smooth in between for the tails)."""
    if isinstance(d, Constant):
        return (x < d.value).astype(float)
    if isinstance(d, Uniform):
        n = d.high - d.low + 1
        return np.clip((d.high - np.floor(x)) / n, 0.0, 1.0)
    if isinstance(d, Empirical):
        vals = np.sort(np.asarray(d.values, dtype=float))
        return 1.0 - np.searchsorted(vals, x, side="right") / len(vals)
    if isinstance(d, Geometric):  # P(X > k) = (1 - p)^k, p = 1 / mean
        q = 1.0 - 1.0 / d.mean_tokens
        return np.where(x < 1, 1.0, q ** np.maximum(x, 0.0)) if q > 0 else (x < 1).astype(float)
    # LogNormal: X = clip(rint(Y), 1, cap), ln Y ~ N(ln median, sigma^2): P(X > k) = P(Y >= k + 1/2)
    if d.sigma == 0:
        return (x < _support_max(d)).astype(float)
    with np.errstate(over="ignore", divide="ignore"):  # a tiny sigma: z is +-inf, erfc is 0 or 2
        z = (np.log(np.maximum(x, 0.0) + 0.5) - math.log(d.median)) / d.sigma
    out = np.where(x < 1, 1.0, 0.5 * _ERFC(z / math.sqrt(2.0)))
    if d.cap is not None:
        out = np.where(x >= d.cap, 0.0, out)
    return out


def length_sf(dist, k) -> np.ndarray:
    """P(L > k): the survival function of a length distribution at ``k`` (tokens, array-like, >= 0).

    Exact at integers as the sampler draws: Constant 1[k < v]; Uniform (b - k) / (b - a + 1)
    clipped to [0, 1]; Geometric (1 - p)^k; LogNormal P(Y >= k + 1/2) = erfc(z / sqrt 2) / 2,
    z = (ln(k + 1/2) - ln median) / sigma, with 1 below k = 1 and 0 from the cap on; Empirical
    the share of values > k; Bimodal the mixture of its parts. The CDF is 1 - this.
    """
    x = np.asarray(k, dtype=float)
    if np.any(~np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"k must be finite lengths >= 0 tokens; got {k!r}")
    return sum(w * _sf_component(d, x) for w, d in _components(dist))


def _series(dist, terms, name: str) -> float:
    """sum_{k >= 0} terms(k) for a term built from the survival function of ``dist``: term by term
    over the finite support, or to :data:`EXACT_TOKENS` and then a midpoint-rule integral on a
    logarithmic grid (1024 trapezoids per doubling) for an unbounded tail, until the terms vanish."""
    comps = _components(dist)
    bounded = [_support_max(d) for _, d in comps if math.isfinite(_support_max(d))]
    unbounded = len(bounded) < len(comps)
    top = max(bounded, default=0)
    if top > MAX_SUPPORT:
        raise ValueError(f"lengths up to {top:,} tokens: {name} sums at most {MAX_SUPPORT:,}")
    k_exact = int(max(top, EXACT_TOKENS) if unbounded else top)
    total = float(terms(np.arange(k_exact, dtype=float)).sum())
    if not unbounded:
        return total
    # tail: sum_{k >= K} h(k) ~ integral from K - 1/2 of h(x) dx, h decreasing
    x0 = k_exact - 0.5
    ratio = 2.0 ** (1 / 1024)
    while True:
        xs = x0 * ratio ** np.arange(1025)
        h = terms(xs)
        total += float(np.sum((h[1:] + h[:-1]) * np.diff(xs)) / 2)
        if h[-1] * xs[-1] <= 1e-12 * total:
            return total
        x0 = xs[-1]
        if x0 > 1e30:
            raise ValueError(f"the tail of {dist!r} is too heavy to sum ({name} diverges numerically)")


def expected_max_length(dist, batch: int) -> float:
    """E[max(L_1..L_B)] of ``batch`` independent draws, tokens: sum_{k >= 0} (1 - (1 - P(L > k))^B).

    Summed term by term over the finite support (up to :data:`MAX_SUPPORT` tokens); an unbounded
    tail (Geometric, LogNormal without a cap) is summed term by term to :data:`EXACT_TOKENS`,
    then integrated with the midpoint rule on a logarithmic grid until the terms vanish
    (relative error below 1e-6). ``batch=1`` gives the mean, E[L] (:func:`length_mean`).
    """
    b = integer("batch", batch, 1, unit="sequences")

    def terms(x: np.ndarray) -> np.ndarray:
        s = np.clip(length_sf(dist, x), 0.0, 1.0)
        with np.errstate(divide="ignore"):
            return -np.expm1(b * np.log1p(-s))  # 1 - (1 - s)^B without cancellation

    return _series(dist, terms, "expected_max_length")


def resident_kv_tokens(prompt_len: int, dist) -> float:
    """Mean KV tokens a decoding sequence holds, averaged over the decode steps of all sequences
    (the pool's view of a steady continuous batch), tokens:

        P + E[L (L + 1) / 2] / E[L] = P + sum_k (k + 1) P(L > k) / sum_k P(L > k).

    A sequence with L output tokens holds P + g tokens at its g-th decode step (g = 1..L), and a
    long reply stays in the batch for more steps, so the average is length-biased: P + (E[L^2] +
    E[L]) / (2 E[L]), above P + E[L] / 2 whenever the lengths vary. Sums as :func:`expected_max_length`."""
    p = integer("prompt_len", prompt_len, 0, unit="tokens")
    half_sq = _series(dist, lambda x: (x + 1) * np.clip(length_sf(dist, x), 0.0, 1.0), "resident_kv_tokens")
    return p + half_sq / length_mean(dist)


def length_mean(dist) -> float:
    """E[L] as the sampler draws it (rounding and caps included), tokens: expected_max_length(dist, 1)."""
    return expected_max_length(dist, 1)


def static_slot_efficiency(dist, batch: int) -> float:
    """Useful share of a static batch's slot-steps: E[L] / E[max(L_1..L_B)] (1 for equal lengths)."""
    return length_mean(dist) / expected_max_length(dist, batch)


def continuous_gain(dist, batch: int) -> float:
    """Decode-bound, saturated throughput of continuous over static batching at batch ``B``:
    E[max(L_1..L_B)] / E[L] (module doc; equal step cost with or without padding, prefill
    neglected: the simulator prices both)."""
    return 1.0 / static_slot_efficiency(dist, batch)


# ---- the token budget against the step model ----------------------------------------------------


def _check_decodes(cost, decode_seqs: int, context_tokens: float) -> tuple[int, float]:
    if not callable(getattr(cost, "step_s", None)):
        raise ValueError("cost must offer step_s: step_cost(dep), LinearCost or FunctionCost")
    d = integer("decode_seqs", decode_seqs, 1, unit="sequences")
    c = real("context_tokens", context_tokens, 0, unit="tokens")
    return d, c


def _largest(ok, top: int = 1 << 22) -> int:
    """Largest integer T in [0, top] with ok(T) (ok monotone: true, then false; ok(0) taken as true
    without a call, ok(top) called first)."""
    if ok(top):
        return top
    return largest_true(ok, 1, top - 1)


def free_prefill_tokens(cost, decode_seqs: int, context_tokens: float = 0.0, position: int = 0) -> int:
    """Largest prefill chunk T (tokens, at ``position`` in its prompt) that a step of
    ``decode_seqs`` decodes holding ``context_tokens`` cached tokens carries at no extra time:
    step(D, C, [(T, position)]) <= step(D, C) (bisection on ``cost.step_s``; 0 if none)."""
    d, c = _check_decodes(cost, decode_seqs, context_tokens)
    p = integer("position", position, 0, unit="tokens")
    alone = cost.step_s(d, c)
    return _largest(lambda t: t == 0 or cost.step_s(d, c, [(t, p)]) <= alone * (1 + 1e-12))


def prefill_tokens_within(cost, decode_seqs: int, context_tokens: float, max_step_s: float,
                          position: int = 0) -> int:
    """Largest prefill chunk T (tokens) a step of ``decode_seqs`` decodes can carry and still
    last at most ``max_step_s`` (a TPOT target for the decodes sharing it): bisection on
    ``cost.step_s``. Raises ValueError when the decodes alone exceed the target."""
    d, c = _check_decodes(cost, decode_seqs, context_tokens)
    target = real("max_step_s", max_step_s, 0, low_open=True, unit="seconds")
    p = integer("position", position, 0, unit="tokens")
    alone = cost.step_s(d, c)
    if alone > target:
        raise ValueError(f"{d} decodes alone take {alone * 1e3:.3g} ms per step, above max_step_s = "
                         f"{target * 1e3:.3g} ms: no chunk fits (fewer decodes or a looser target)")
    return _largest(lambda t: t == 0 or cost.step_s(d, c, [(t, p)]) <= target)


# ---- a run's throughput while it is saturated ---------------------------------------------------------


def saturated_tokens_per_s(res) -> float:
    """Output tokens per second of a simulation while requests wait (every slot has work): tokens
    emitted from the start of the first step to the end of the last step built with a non-empty
    queue, over that span. Excludes the final drain of an offline run, which a server with a
    steady stream never reaches. Raises ValueError for a run whose queue was never non-empty."""
    tl = res.timeline
    busy = np.flatnonzero(tl.waiting > 0)
    if not len(busy):
        raise ValueError("the run never had requests waiting: no saturated window to measure")
    t0, t1 = float(tl.start_s[0]), float(tl.end_s[busy[-1]])
    emitted = sum(int(np.count_nonzero(res.token_times(r.rid) <= t1 + 1e-12)) for r in res.requests
                  if r.first_token_s == r.first_token_s)  # requests that produced a token
    return emitted / (t1 - t0)


# ---- goodput: the batch users feel --------------------------------------------------------------------


def batch_where_doubling_gains(dep, context: int, ratio: float = 4 / 3, assume=None) -> int:
    """Smallest batch B whose doubling raises decode throughput by at most ``ratio``:
    X(2B) / X(B) = 2 t(B) / t(2B) <= ratio, with X(B) = B / t(B) the modelled decode step's
    throughput (:func:`lib.perf.throughput.tokens_per_s`). For a straight step t = a + c B the
    ratio is 2 (a + c B) / (a + 2 c B), which is 4/3 exactly at B = a / c, where the fixed and the
    per-sequence costs are equal; the ratio falls from 2 towards 1 as B grows (bisection)."""
    from lib.perf import throughput as tput

    context = integer("context", context, 0, unit="tokens")
    r = real("ratio", ratio, 1, 2, low_open=True, high_open=True)

    def gain(b: int) -> float:
        return tput.tokens_per_s(dep, 2 * b, context, assume) / tput.tokens_per_s(dep, b, context, assume)

    if gain(1) <= r:
        return 1
    hi = 2
    while gain(hi) > r:
        hi *= 2
        if hi > 1 << 22:
            raise ValueError(f"no batch up to {1 << 22:,} where doubling gains at most {r:g}x")
    return smallest_true(lambda b: not (gain(b) > r), hi // 2 + 1, hi - 1)  # gain(hi // 2) > r >= gain(hi)


def closed_loop_goodput(res, slo) -> tuple[float, float]:
    """(goodput in output tokens/s, share of requests within the SLO) of an offline run read as a
    closed loop: ``max_running`` clients, each sending its next request when the last one ends.

    A backlogged run admits a request the step a slot frees, which is when a closed-loop client
    would have sent it, so the service is the same; only the wait in the backlog is an artefact
    of the offline queue. The TTFT a client feels is therefore first token - first scheduled; a
    request counts when that and its TPOT meet ``slo`` (:class:`lib.scheduling.SLO`). Tokens are
    those emitted by such requests up to the end of the last step built with requests waiting,
    over that window (as :func:`saturated_tokens_per_s`); the share is over the requests that
    started in the window."""
    from lib.scheduling.metrics import SLO

    if not isinstance(slo, SLO):
        raise ValueError(f"slo must be an SLO(ttft_s, tpot_s), got {slo!r}")
    tl = res.timeline
    busy = np.flatnonzero(tl.waiting > 0)
    if not len(busy):
        raise ValueError("the run never had requests waiting: it is not a closed loop at max_running")
    t0, t1 = float(tl.start_s[0]), float(tl.end_s[busy[-1]])
    good_tokens, met, started = 0, 0, 0
    for r in res.requests:
        if not r.first_scheduled_s <= t1:  # nan (never scheduled) or after the window
            continue
        started += 1
        ok = (r.status == "finished" and r.first_token_s - r.first_scheduled_s <= slo.ttft_s
              and (r.output_len == 1 or r.tpot_s <= slo.tpot_s))
        if ok:
            met += 1
            good_tokens += int(np.count_nonzero(res.token_times(r.rid) <= t1 + 1e-12))
    return good_tokens / (t1 - t0), met / started
