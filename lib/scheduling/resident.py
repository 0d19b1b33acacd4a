"""Little's law for a batching engine: how many sequences are resident, solved as a fixed point.

Little's law gives the mean number of sequences resident on the GPU (admitted and not yet
finished: prefilling or decoding) as ``N = lambda W``, with ``lambda`` the admission rate
(requests/s) and ``W`` the time one request stays resident (s). The trap: ``W`` is set by the
step time, and the step time by the batch, which is ``N``. So ``N`` solves

    N = lambda W(N)

a fixed point, not a product. :func:`resident_time_s` is the mean-value model of ``W(N)``, every
step priced by the simulator's cost (``StepCost``: the book's decode and prefill models), with
``P`` prompt and ``O`` output tokens per request, cached context ``c = P + O / 2`` per decoding
sequence (the mean over its decode steps) and a token budget ``B``:

* a resident sequence shares each step with the ``N`` others present on average and itself, so
  its decode steps run ``n = N + 1`` decodes: ``s_dec = step_s(n, n c)``;
* its own prefill runs beside the ``N`` others: ``t_own = sum_j step_s(N, N c, [(x_j, p_j)])``
  over chunks ``x_j <= B - N`` of the prompt at positions ``p_j``;
* the others' prefills arrive at ``lambda`` per second, each ``k`` steps long and costing
  ``t_mix = sum_j step_s(n, n c, [(x_j, p_j)])`` with ``x_j <= B - n``; they take a fraction
  ``lambda t_mix`` of the time (below 1, or there is no steady state);
* steps per second ``r = lambda k + (1 - lambda t_mix) / s_dec``; every step gives each decode
  one token, so

      W(N) = t_own + (O - 1) / r.

``W`` is evaluated at the integers around ``N`` and interpolated linearly. The one-multiplication
answer takes ``W`` of the request alone (its prefill, then ``O - 1`` decode steps at batch 1);
iterating ``N_{k+1} = lambda W(N_k)`` from it climbs monotonically to the smallest fixed point,
if one exists below the engine's cap (``max_running``); :func:`resident_sequences` finds that
point by bracketing and bisection and keeps the first iterates for display.

This is a mean-value model: it ignores the fluctuations of ``N`` (Poisson arrivals make busy
stretches in which more sequences share longer steps), so the simulator's resident count comes
out a few percent higher at moderate load and more near saturation.

SI units: seconds, requests per second; lengths in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["ResidentState", "critical_rate", "mean_decode_context", "rate_for_resident", "resident_sequences",
           "resident_time_s", "time_average"]


def _cost_attr(cost, name: str) -> int:
    value = getattr(cost, name, None)
    if value is None or not callable(getattr(cost, "step_s", None)):
        raise ValueError("cost must be a step cost (step_cost(dep), LinearCost or FunctionCost) "
                         f"with step_s and {name}")
    return int(value)


def _prefill(cost, decodes: int, context: float, prompt_len: int, budget: int) -> tuple[float, int]:
    """(seconds, steps) of one prompt chunked beside ``decodes`` running decodes."""
    room = budget - decodes
    if room < 1:
        return math.inf, 0
    left, pos, t, steps = prompt_len, 0, 0.0, 0
    while left > 0:
        chunk = min(left, room)
        t += cost.step_s(decodes, decodes * context, [(chunk, pos)])
        pos += chunk
        left -= chunk
        steps += 1
    return t, steps


def _parts(cost, rate: float, prompt_len: int, output_len: int, n: int, context: float) -> dict:
    """The pieces of W at an integer count ``n`` of other resident sequences (module doc)."""
    budget, cap = _cost_attr(cost, "token_budget"), _cost_attr(cost, "max_running")
    seen = n + 1
    if seen > cap:
        return {"W": math.inf, "why": f"the batch would pass max_running = {cap}"}
    t_own, _ = _prefill(cost, n, context, prompt_len, budget)
    t_mix, k = _prefill(cost, seen, context, prompt_len, budget)
    s_dec = cost.step_s(seen, seen * context)
    busy = rate * t_mix
    if not math.isfinite(t_own) or not busy < 1:
        return {"W": math.inf, "why": "prefills alone would take all of the engine's time"}
    r = rate * k + (1 - busy) / s_dec
    return {"W": t_own + (output_len - 1) / r, "t_own": t_own, "s_dec": s_dec, "t_mix": t_mix,
            "steps_per_s": r, "prefill_busy": busy, "k": k, "why": ""}


def _check(rate, prompt_len, output_len, context) -> tuple[float, int, int, float]:
    lam = real("arrival_rate", rate, 0, low_open=True, unit="requests/s")
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    c = p + o / 2 if context is None else real("mean_context", context, 1, unit="tokens")
    return lam, p, o, c


def resident_time_s(cost, arrival_rate: float, prompt_len: int, output_len: int, resident: float,
                    *, mean_context: float | None = None) -> float:
    """W(N): mean time (s) a request stays resident when ``resident`` = N sequences are resident
    on average (module doc); ``inf`` when no steady state exists at that N (the batch passes
    ``max_running``, or prefills alone fill the engine). ``mean_context`` (None: P + O / 2) is
    the cached tokens per decoding sequence."""
    lam, p, o, c = _check(arrival_rate, prompt_len, output_len, mean_context)
    n = real("resident", resident, 0)
    lo = math.floor(n)
    w_lo = _parts(cost, lam, p, o, lo, c)["W"]
    if n == lo:
        return w_lo
    w_hi = _parts(cost, lam, p, o, lo + 1, c)["W"]
    if not (math.isfinite(w_lo) and math.isfinite(w_hi)):
        return math.inf
    return w_lo + (w_hi - w_lo) * (n - lo)


@dataclass(frozen=True)
class ResidentState:
    """The solution of N = lambda W(N) for one workload on one engine (module doc).

    ``resident`` N (sequences, mean; ``inf`` when unstable), ``sojourn_s`` W(N), ``ttft_s`` the
    request's own prefill t_own (no queueing), ``tpot_s`` = (W - t_own) / (O - 1), ``batch`` =
    N + 1 the decodes a resident sequence shares its steps with, ``decode_step_s`` s_dec at that
    batch, ``prefill_busy`` the fraction of time in prefill steps, ``naive_resident`` = lambda x
    ``naive_sojourn_s``, the time of the request alone (its prefill ``alone_ttft_s``, then O - 1
    decode steps of ``alone_step_s`` at batch 1; no other traffic), ``prefill_steps`` k (the
    steps one prompt's chunks take beside the others), ``trace`` the first iterates
    (N_k, W(N_k)) from that naive N_0, ``why`` what breaks when unstable ('' otherwise).
    """

    arrival_rate: float
    prompt_len: int
    output_len: int
    mean_context: float
    resident: float
    sojourn_s: float
    ttft_s: float
    tpot_s: float
    batch: float
    decode_step_s: float
    steps_per_s: float
    prefill_busy: float
    naive_resident: float
    naive_sojourn_s: float
    alone_ttft_s: float
    alone_step_s: float
    prefill_steps: int
    trace: tuple
    stable: bool
    why: str = ""


def resident_sequences(cost, arrival_rate: float, prompt_len: int, output_len: int, *,
                       mean_context: float | None = None, trace_steps: int = 6,
                       rel_tol: float = 1e-10) -> ResidentState:
    """Solve N = lambda W(N) (module doc): the mean number of sequences resident on the engine
    priced by ``cost`` when requests of ``prompt_len`` + ``output_len`` tokens arrive at
    ``arrival_rate`` per second, and the step they run at.

    The smallest fixed point, found by bracketing on the integers and bisection; ``trace`` keeps
    the first ``trace_steps`` iterates N_{k+1} = lambda W(N_k) from the naive N_0 = lambda x (the
    request's time alone), which climb monotonically to it. No fixed point below the
    cap: ``stable`` False, ``resident`` inf, and ``why`` says which limit is hit first.
    """
    lam, p, o, c = _check(arrival_rate, prompt_len, output_len, mean_context)
    integer("trace_steps", trace_steps, 1)
    real("rel_tol", rel_tol, 0, low_open=True)
    cap = _cost_attr(cost, "max_running")

    def W(n: float) -> float:
        return resident_time_s(cost, lam, p, o, n, mean_context=c)

    alone_own, _ = _prefill(cost, 0, c, p, _cost_attr(cost, "token_budget"))
    alone_step = cost.step_s(1, c)
    naive_w = alone_own + (o - 1) * alone_step  # the request alone: every step at batch 1
    trace, n = [], lam * naive_w
    for _ in range(trace_steps):
        w = W(n)
        trace.append((n, w))
        if not math.isfinite(w):
            break
        n = lam * w
    # bracket: the first integer m with lambda W(m) <= m (g(N) - N changes sign in [m - 1, m])
    prev, m, why = 0, 0, ""
    while True:
        parts = _parts(cost, lam, p, o, m, c)
        if not math.isfinite(parts["W"]):
            why = parts["why"]
            break
        if lam * parts["W"] <= m:
            break
        prev, m = m, (m + 1 if m < 64 else min(cap, m + max(1, m // 16)))
    if why:
        return ResidentState(lam, p, o, c, math.inf, math.inf, math.nan, math.nan, math.inf, math.nan,
                             math.nan, math.nan, lam * naive_w, naive_w, alone_own, alone_step, 0,
                             tuple(trace), False, why)
    lo, hi = float(prev), float(m)
    if lam * W(lo) <= lo:  # only at m = 0 (cannot happen for W > 0), kept for safety
        hi = lo
    while hi - lo > rel_tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if lam * W(mid) <= mid else (mid, hi)
    n = hi
    w = W(n)
    # the pieces at the fixed point, interpolated like W
    k0 = math.floor(n)
    a, b = _parts(cost, lam, p, o, k0, c), _parts(cost, lam, p, o, k0 + 1, c)
    f = n - k0

    def at(key: str) -> float:
        return a[key] if f == 0 or not math.isfinite(b["W"]) else a[key] + (b[key] - a[key]) * f

    t_own = at("t_own")
    tpot = (w - t_own) / (o - 1) if o > 1 else math.nan
    return ResidentState(lam, p, o, c, lam * w, w, t_own, tpot, n + 1, at("s_dec"), at("steps_per_s"),
                         at("prefill_busy"), lam * naive_w, naive_w, alone_own, alone_step, a["k"], tuple(trace),
                         True, "")


def critical_rate(cost, prompt_len: int, output_len: int, *, mean_context: float | None = None,
                  rel_tol: float = 1e-4) -> float:
    """The largest arrival rate (requests/s) with a steady state in the mean-value model: above
    it N = lambda W(N) has no solution below the cap. Bisection on the rate."""
    _, p, o, c = _check(1.0, prompt_len, output_len, mean_context)
    real("rel_tol", rel_tol, 0, low_open=True)

    def stable(lam: float) -> bool:
        return resident_sequences(cost, lam, p, o, mean_context=c, trace_steps=1, rel_tol=1e-3).stable

    lo, hi = 0.0, 1.0
    while stable(hi):
        lo, hi = hi, 2 * hi
        if hi > 1e9:
            raise ValueError("no rate makes this engine unstable: is the step cost zero?")
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if stable(mid) else (lo, mid)
    return lo


def rate_for_resident(cost, resident: float, prompt_len: int, output_len: int, *,
                      mean_context: float | None = None, rel_tol: float = 1e-6) -> float:
    """The arrival rate (requests/s) at which the fixed point N = lambda W(N) reaches ``resident``
    sequences (bisection; N grows with the rate). ``inf`` when the engine loses its steady state
    first (``resident`` above N at :func:`critical_rate`)."""
    target = real("resident", resident, 0, low_open=True)
    _, p, o, c = _check(1.0, prompt_len, output_len, mean_context)
    top = critical_rate(cost, p, o, mean_context=c)
    if resident_sequences(cost, top, p, o, mean_context=c, trace_steps=1).resident < target:
        return math.inf
    lo, hi = 0.0, top
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        state = resident_sequences(cost, mid, p, o, mean_context=c, trace_steps=1)
        lo, hi = (mid, hi) if state.stable and state.resident < target else (lo, mid)
    return hi


def mean_decode_context(prompt_mean: float, output_mean: float, output_second_moment: float) -> float:
    """Mean cached tokens of a decoding sequence, time-weighted (tokens).

    A request of P + O tokens decodes O - 1 steps at contexts P + 1 .. P + O - 1, so a step picked
    at random finds (P, O independent) E[P] + (E[O^2] - E[O]) / (2 (E[O] - 1)): long replies stay
    longer and are over-represented (length-biased sampling). Constant O: P + O / 2; geometric O
    of mean m: P + m, twice the constant's excess.
    """
    p = real("prompt_mean", prompt_mean, 0, unit="tokens")
    m = real("output_mean", output_mean, 1, low_open=True, unit="tokens")
    m2 = real("output_second_moment", output_second_moment, m * m * (1 - 1e-12), unit="tokens^2 (>= mean^2)")
    return p + (m2 - m) / (2 * (m - 1))


def time_average(result, field, start_s: float, end_s: float) -> float:
    """Time average over [start_s, end_s) of a timeline column of a
    :class:`~lib.scheduling.metrics.SimResult` (``field`` its name: ``running``, ``decode_tokens``,
    ``context_tokens``...; or an array of one value per step), idle time counted as 0:
    sum over steps of value x (overlap of the step with the window) / (end_s - start_s)."""
    import numpy as np

    tl = result.timeline
    if isinstance(field, str):
        if not hasattr(tl, field) or field == "chunks":
            raise ValueError(f"field must be a numeric Timeline column, got {field!r}")
        values = np.asarray(getattr(tl, field), dtype=float)
    else:
        values = np.asarray(field, dtype=float)
        if values.shape != tl.start_s.shape:
            raise ValueError(f"field must name a Timeline column or hold one value per step ({len(tl)}), "
                             f"got shape {values.shape}")
    t0 = real("start_s", start_s, 0, unit="seconds")
    t1 = real("end_s", end_s, t0, low_open=True, unit="seconds")
    start, end = tl.start_s, tl.end_s
    overlap = np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0, None)
    return float((values * overlap).sum() / (t1 - t0))
