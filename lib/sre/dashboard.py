"""An inference dashboard of eight panels in the order an incident unfolds (I082), computed from a
simulated run, and the two panels that check each other with Little's law.

:data:`PANELS`: each panel's question, what it plots and the action it decides. :func:`panel_values`
computes every panel over a time window of a :class:`~lib.scheduling.metrics.SimResult`.
:func:`cross_checks` holds two identities a dashboard's own numbers must satisfy:

* in-flight requests = arrival rate x mean time in system (``L = lambda W``,
  :func:`lib.scheduling.queueing.littles_law`; the in-flight panel integrates the engine's own
  waiting + running counts, ``SimResult.littles_law().L_timeline``);
* output tokens/s = running sequences / TPOT (Little's law again, for tokens: each running sequence
  holds one token "in flight" for one TPOT).

A metric built wrong breaks one of them: a latency histogram that starts at the first schedule (missing
the queue) makes ``lambda W`` fall short of the in-flight count, and a token counter incremented twice
doubles tokens/s against running / TPOT. SI units: seconds, requests, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import real

__all__ = ["PANELS", "Panel", "cross_checks", "incident_run", "panel_values"]


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    question: str
    plots: str
    action: str


PANELS = (
    Panel("burn", "SLO burn rate", "Are users hurt, and how fast is the budget going?",
          "bad fraction over the SLO's budget, 5 min and 1 h windows (lib.sre.slo)",
          "page or not; how urgent (hours to exhaustion)"),
    Panel("traffic", "Requests and errors", "Is it demand or failure?",
          "arrivals/s, rejected and failed requests/s",
          "a demand spike: scale or shed; a failure: roll back the last change"),
    Panel("inflight", "In-flight requests", "Is work piling up?",
          "waiting + running requests (the engine's counts)",
          "waiting grows: add replicas or admit less; cross-checks lambda x W"),
    Panel("ttft", "TTFT p50 / p99", "Is the wait before the first token the problem?",
          "time to first token quantiles (from arrival)",
          "queue or prefill: scale out, cap prompt length, chunk prefills"),
    Panel("tpot", "TPOT p50 / p99", "Is decoding slower per token?",
          "time per output token quantiles",
          "lower the running-sequence cap, or find the slow replica"),
    Panel("tokens", "Output tokens/s", "Is the fleet doing the work it should?",
          "tokens emitted per second",
          "below running / TPOT: a counting bug; flat under rising demand: at capacity"),
    Panel("kv", "KV cache use and preemptions", "Is memory the limit?",
          "used KV blocks / pool, preemptions/s",
          "preemptions: lower max running, raise the pool, cap context"),
    Panel("replica", "Per-replica step time", "Is it one replica?",
          "step time p50 / p99 by replica against the fleet",
          "drain and replace the outlier"),
)


def _in(t, t0, t1):
    return (t >= t0) & (t < t1)


def panel_values(res, t0: float, t1: float, slo, target: float) -> dict:
    """Every panel over the requests that arrived and the steps that started in [t0, t1) of ``res`` (a
    SimResult), under ``slo`` (a :class:`lib.scheduling.SLO`) with ``target`` its good fraction."""
    from lib.sre.slo import burn_rate

    a = real("t0", t0, 0, unit="seconds")
    b = real("t1", t1, a, low_open=True, unit="seconds")
    span = b - a
    recs = [r for r in res.requests if a <= r.arrival_s < b]
    fin = [r for r in recs if r.status == "finished"]
    bad = sum(not slo.met(r) for r in recs)
    bad_frac = bad / len(recs) if recs else math.nan
    tl = res.timeline
    st = _in(tl.start_s, a, b)
    dur = tl.duration_s[st]
    busy = float(dur.sum())
    times, off = res._tokens()
    toks = int(_in(times, a, b).sum())
    pool = res.cost.kv_blocks if hasattr(res.cost, "kv_blocks") else math.nan
    used = 1 - tl.free_blocks[st] / pool if len(dur) else np.array([math.nan])

    def q(x, p):
        return float(np.quantile(x, p)) if len(x) else math.nan

    ttft = [r.ttft_s for r in fin]
    tpot = [r.tpot_s for r in fin if r.output_len > 1]
    return {
        "bad_fraction": bad_frac,
        "burn": burn_rate(bad_frac, target) if recs else math.nan,
        "arrivals_per_s": len(recs) / span,
        "rejected_per_s": sum(r.status == "rejected" for r in recs) / span,
        "waiting": float((tl.waiting[st] * dur).sum() / busy) if busy else math.nan,
        "running": float((tl.running[st] * dur).sum() / busy) if busy else math.nan,
        "ttft_p50": q(ttft, 0.5), "ttft_p99": q(ttft, 0.99),
        "tpot_p50": q(tpot, 0.5), "tpot_p99": q(tpot, 0.99),
        "tokens_per_s": toks / span,
        "kv_used": float((used * dur).sum() / busy) if busy else math.nan,
        "preemptions_per_s": float(tl.preemptions[st].sum() / span),
        "step_p50": q(dur, 0.5), "step_p99": q(dur, 0.99),
    }


def cross_checks(res, *, latency_from_schedule: bool = False, token_count_factor: float = 1.0,
                 tolerance: float = 0.05) -> dict:
    """The two Little's-law checks over the whole run of ``res``.

    ``latency_from_schedule``: the latency panel's histogram starts at the first schedule instead of
    the arrival (a metric missing the queue); ``token_count_factor``: what the token counter counts per
    token (2: incremented twice). Returns, for each check, the panel's value, the value the other
    panels imply and whether they agree within ``tolerance``: ``in_flight_error`` = |lambda W / L - 1|
    (relative to the in-flight gauge), ``tokens_error`` = |tokens/s / (running / TPOT) - 1|."""
    from lib.scheduling.queueing import littles_law

    real("tolerance", tolerance, 0, 1, low_open=True)
    real("token_count_factor", token_count_factor, 0, low_open=True)
    lc = res.littles_law()
    recs = res.requests
    soj = np.array([r.sojourn_s for r in recs])
    if latency_from_schedule:
        soj = soj - np.array([0.0 if math.isnan(r.queue_s) else r.queue_s for r in recs])
    w = float(soj.mean())
    l_pred = littles_law(arrival_rate=lc.arrival_rate, W=w)
    m = res.metrics()
    tokens_per_s = m.output_tokens_per_s * token_count_factor
    implied = m.mean_running / m.tpot.mean
    e1 = abs(l_pred / lc.L_timeline - 1)  # lambda W against the gauge: a missing queue share s gives exactly s
    e2 = abs(tokens_per_s / implied - 1)  # the counter against running / TPOT: a double count gives about 1
    return {"L_panel": lc.L_timeline, "arrival_rate": lc.arrival_rate, "W": w, "L_implied": l_pred,
            "in_flight_ok": e1 <= tolerance, "in_flight_error": e1,
            "tokens_panel": tokens_per_s, "running": m.mean_running, "tpot": m.tpot.mean,
            "tokens_implied": implied, "tokens_ok": e2 <= tolerance, "tokens_error": e2}


def incident_run(model: str = "llama-3.1-8b", gpu: str = "h100-sxm", *, max_running: int = 32,
                 prompt_median: int = 1000, output_median: int = 200, base_rate: float = 6.0,
                 spike_rate: float = 12.0, phase_s: float = 40.0, seed: int = 0):
    """The page's incident: one replica, ``base_rate`` requests/s for ``phase_s``, ``spike_rate`` for
    ``phase_s``, ``base_rate`` again (lognormal lengths, sigma 0.5, capped at 4x the medians),
    continuous batching with ``max_running`` sequences, steps from the book's step model."""
    from lib.scheduling import Policy, simulate
    from lib.scheduling.cost import step_cost
    from lib.scheduling.workloads import LogNormal, Workload

    real("phase_s", phase_s, 5.0, 3600.0, unit="seconds")
    from lib.perf.throughput import smallest_fitting_deployment

    dep = smallest_fitting_deployment(model, gpu)
    wl = Workload(prompt=LogNormal(prompt_median, 0.5, cap=4 * prompt_median),
                  output=LogNormal(output_median, 0.5, cap=4 * output_median),
                  rate_schedule=((phase_s, base_rate), (phase_s, spike_rate), (phase_s, base_rate)), n_requests=None)
    return simulate(wl, Policy(max_running=max_running), step_cost(dep, max_batch=max_running), seed=seed)
