"""Explorers for the scheduling section's queueing questions: Little's law on a batching engine,
the utilization a latency target allows, overload and rejection, bounded work queues.

Each view calls lib only: :mod:`lib.scheduling.resident` (N = lambda W(N) on the book's step
model), :mod:`lib.scheduling.queueing` (M/M/1 and M/G/1 closed forms), :func:`lib.scheduling.simulate`
and the step costs of :mod:`lib.scheduling.cost`, the memory budget (:mod:`lib.perf.memory`).
Figures are matplotlib, one persistent figure per explorer updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.scheduling.overload import POLICIES, compare_policies
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

#: Replicas the explorers offer, by their Deployment label: building a step cost calls the decode
#: step model about 70 times (0.05-0.15 s), so the explorers build these once, on their first call,
#: and every later update stays inside the 100 ms budget.
DEPLOYMENTS = {
    "llama-3.1-8b bf16 on 1x h100-sxm (TP1)": dict(model="llama-3.1-8b", gpu="h100-sxm"),
    "llama-3.1-70b bf16 on 4x h100-sxm (TP4)": dict(model="llama-3.1-70b", gpu="h100-sxm", tp=4),
    "llama-3.1-70b fp8 on 2x h200 (TP2)": dict(model="llama-3.1-70b", gpu="h200", tp=2, weight_dtype="fp8",
                                               kv_dtype="fp8"),
    "mixtral-8x7b fp8 on 1x mi300x (TP1)": dict(model="mixtral-8x7b", gpu="mi300x", weight_dtype="fp8",
                                                kv_dtype="fp8"),
    "llama-3.1-8b bf16 on 1x l4 (TP1)": dict(model="llama-3.1-8b", gpu="l4"),
}
_COSTS: dict = {}


def deployment(label: str):
    """The :class:`~lib.perf.deployment.Deployment` behind one of :data:`DEPLOYMENTS`' labels."""
    from lib.perf.deployment import Deployment

    if label not in DEPLOYMENTS:
        raise ValueError(f"deployment must be one of {', '.join(DEPLOYMENTS)}; got {label!r}")
    return Deployment(**DEPLOYMENTS[label])


def _cost(label: str):
    """The step cost of a preset; the first call builds all of them (a few tenths of a second)."""
    if not _COSTS:
        from lib.scheduling.cost import step_cost

        for name in DEPLOYMENTS:
            _COSTS[name] = step_cost(deployment(name))
    if label not in _COSTS:
        raise ValueError(f"deployment must be one of {', '.join(DEPLOYMENTS)}; got {label!r}")
    return _COSTS[label]


# ---- I021: Little's law with a duration that depends on the answer ---------------------------


def _little_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve, = ax.plot([], [], lw=2, label="λ W(N): residents the duration implies")
    a.diag, = ax.plot([], [], color="grey", ls="--", lw=1, label="diagonal: λ W(N) = N")
    a.naive, = ax.plot([], [], "s", color="C1", ms=6, label="naive: λ × W alone")
    a.fixed, = ax.plot([], [], "o", color="C3", ms=7, label="fixed point")
    a.steps, = ax.plot([], [], color="C1", lw=0.8, alpha=0.7, label="iteration N → λ W(N)")
    a.cap = ax.axvline(1.0, color="C2", ls=":", lw=1.2, label="KV pool holds this many")
    ax.set_xlabel("resident sequences N")
    ax.set_ylabel("λ W(N)")
    ax.grid(True)
    return a


def _little_draw(a: SimpleNamespace, xs, ys, naive, fixed, trace, cap, xmax, ymax) -> None:
    a.curve.set_data(xs, ys)
    a.diag.set_data([0, xmax], [0, xmax])
    a.naive.set_data([naive], [naive])
    a.fixed.set_data([fixed] if fixed is not None else [], [fixed] if fixed is not None else [])
    a.fixed.set_visible(fixed is not None)
    sx, sy = [], []
    for n, w in trace:  # cobweb: (N, N) -> (N, g(N)) -> (g(N), g(N))
        sx += [n, n, w]
        sy += [n, w, w]
    a.steps.set_data(sx, sy)
    a.cap.set_xdata([cap, cap])
    a.cap.set_visible(cap <= xmax)
    a.ax.set_xlim(0, xmax)
    a.ax.set_ylim(0, ymax)
    figures.legend(a.ax, [a.curve, a.diag, a.naive, a.steps, a.fixed, a.cap], loc="upper left", fontsize=7)


_LITTLE_FIGURE = figures.LiveFigure(6.0, 3.2, _little_build, _little_draw)


@explorer(
    "scheduling.littles_law",
    deployment=Choice(tuple(DEPLOYMENTS), label="replica"),
    rate=FloatRange(0.1, 50.0, step=0.1, label="arrivals (requests/s)"),
    prompt_tokens=IntRange(16, 32768, log=True, label="prompt tokens"),
    output_tokens=IntRange(2, 4096, log=True, label="output tokens"),
)
def littles_law(deployment: str, rate: float, prompt_tokens: int, output_tokens: int) -> View:
    """I021: N = lambda W(N) on the book's step model, drawn as the map N -> lambda W(N) against the diagonal."""
    from lib.perf import memory
    from lib.scheduling.resident import resident_sequences, resident_time_s

    cost = _cost(deployment)
    dep = cost.dep
    dep.mdl.check_context(prompt_tokens + output_tokens)
    state = resident_sequences(cost, rate, prompt_tokens, output_tokens, trace_steps=5)
    ctx = int(round(state.mean_context))
    cap = dep.budget.max_concurrency(ctx)  # pool tokens / context
    per_seq = memory.kv_bytes_per_sequence(dep.mdl, ctx, dep.kv_dtype)
    naive = state.naive_resident
    xmax = max(1.5 * state.resident if state.stable else 3 * naive, 1.3 * naive, 4.0)
    xmax = min(xmax, cost.max_running - 1)
    xs = [xmax * i / 80 for i in range(81)]
    ys = [rate * resident_time_s(cost, rate, prompt_tokens, output_tokens, x) for x in xs]
    finite = [y for y in ys if math.isfinite(y)]
    ymax = max(1.1 * xmax, 1.05 * max(finite, default=xmax))
    ymax = min(ymax, 3 * xmax)
    fig = _LITTLE_FIGURE([x for x, y in zip(xs, ys, strict=True) if math.isfinite(y)], finite,
                         naive, state.resident if state.stable else None,
                         [(n, rate * w) for n, w in state.trace if math.isfinite(w)], cap, xmax, ymax)
    rows = [("request alone: W", f"{fmt_time(state.naive_sojourn_s)} (prefill {fmt_time(state.alone_ttft_s)}, "
                                 f"then {output_tokens - 1} steps of {fmt_time(state.alone_step_s)})"),
            ("naive residents λ × W alone", sig(naive))]
    if state.stable:
        rows += [("fixed point N = λ W(N)", f"{sig(state.resident)} ({sig(state.resident / naive)}x the naive answer)"),
                 ("time resident W", fmt_time(state.sojourn_s)),
                 ("decode step at that batch", f"{fmt_time(state.decode_step_s)} (TPOT {fmt_time(state.tpot_s)})"),
                 ("KV held", f"{fmt_bytes(state.resident * per_seq)} at {ctx:,} tokens each"),
                 ("KV pool holds", f"{cap:,.0f} such sequences ({fmt_pct(state.resident / cap)} used)")]
        verdict = (" but it lies past the dotted pool line: the pool binds first and the rest wait in the queue"
                   if state.resident > cap else "")
        note = (f"Where the curve crosses the diagonal is the answer{verdict}; the orange steps are the "
                "iteration from the naive square. Raise the rate and the crossing moves right, then vanishes.")
    else:
        rows += [("fixed point", f"none: {state.why}"), ("KV pool holds", f"{cap:,.0f} sequences of {ctx:,} tokens")]
        note = ("The curve stays above the diagonal: no steady state. The naive square still exists, which is "
                "the trap; the queue grows until the pool or max_num_seqs stops the batch.")
    if state.stable:
        where = (f"Here it does at {sig(state.resident)} sequences, {sig(state.resident / naive)}x the naive λ W of "
                 f"{sig(naive)} (square)" + (f", past the {sig(cap)} the KV pool holds (dotted): the pool binds first."
                                             if state.resident > cap else "."))
    else:
        where = f"Here it never does: no steady state, though the naive square ({sig(naive)}) still looks like one."
    caption = ("The curve is λ W(N), the residents implied by the time a request spends when N run together; the "
               f"answer is where it crosses the diagonal. {where}")
    return View(f"Little's law on {dep.label}: {sig(rate)} requests/s, {prompt_tokens:,} + {output_tokens:,} tokens",
                rows, fig, note=note, caption=caption,
                values={"naive": naive, "resident": state.resident, "cap": cap, "kv_bytes": state.resident * per_seq})


# ---- I024: the utilization a p99 target allows ---------------------------------------------------


def _util_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax, "y")
    a = SimpleNamespace(ax=ax)
    a.mm1, = ax.plot([], [], lw=1.5, label="M/M/1: ln(100) E[S] / (1 - ρ)")
    a.mg1, = ax.plot([], [], lw=1.5, ls="--", label="two-moment: × (1 + C²) / 2")
    a.path, = ax.plot([], [], "o", ms=4, color="C3", label="exact queue, 20,000 sampled prompts")
    a.target = ax.axhline(1.0, color="grey", lw=1, label="p99 target")
    a.rho_mm1 = ax.axvline(0.7, color="C0", ls=":", lw=1.2)
    a.rho_mg1 = ax.axvline(0.5, color="C1", ls=":", lw=1.2)
    a.rho_path = ax.axvline(0.4, color="C3", ls=":", lw=1.2)
    ax.set_xlim(0, 1)
    ax.set_xlabel("utilization of the prefill server ρ = λ E[S]")
    ax.set_ylabel("p99 time to first token (s)")
    ax.grid(True)
    return a


def _util_draw(a: SimpleNamespace, xs, mm1, mg1, px, py, target, rhos) -> None:
    a.mm1.set_data(xs, mm1)
    a.mg1.set_data(xs, mg1)
    a.path.set_data(px, py)
    a.target.set_ydata([target, target])
    for line, rho, name in zip((a.rho_mm1, a.rho_mg1, a.rho_path), rhos, ("M/M/1", "two-moment", "exact queue"),
                               strict=True):
        line.set_xdata([rho, rho])
        line.set_visible(rho > 0)
        line.set_label(f"ρ allowed, {name}: {fmt_pct(rho)}")
    ys = [y for y in list(mm1) + list(mg1) + list(py) if y > 0 and math.isfinite(y)]
    a.ax.set_ylim(min(ys + [target]) * 0.7, max(target * 6, min(max(ys), target * 30)))
    figures.legend(a.ax, [a.mm1, a.mg1, a.path, a.target, a.rho_mm1, a.rho_mg1, a.rho_path], loc="upper left",
                   fontsize=7, ncol=2)


_UTIL_FIGURE = figures.LiveFigure(6.0, 3.4, _util_build, _util_draw)


@explorer(
    "scheduling.utilization_rule",
    deployment=Choice(tuple(DEPLOYMENTS), label="replica"),
    prompt_tokens=IntRange(64, 16384, log=True, label="mean prompt tokens"),
    prompt_sigma=FloatRange(0.0, 1.5, step=0.05, label="prompt spread σ (lognormal)"),
    ttft_p99_s=FloatRange(0.2, 20.0, step=0.1, label="p99 TTFT target (s)"),
)
def utilization_rule(deployment: str, prompt_tokens: int, prompt_sigma: float, ttft_p99_s: float) -> View:
    """I024: the utilization a p99 TTFT target allows, M/M/1 vs two-moment vs the exact queue."""
    import numpy as np

    from lib.scheduling import queueing as qu
    from lib.scheduling.utilization import prompt_service_s, service_table
    from lib.scheduling.workloads import LogNormal

    cost = _cost(deployment)
    dep = cost.dep
    dep.mdl.check_context(prompt_tokens)
    s_mean = prompt_service_s(cost, prompt_tokens)
    rho_mm1 = qu.utilization_for_sojourn_quantile(s_mean, ttft_p99_s)
    dist = LogNormal(prompt_tokens * math.exp(-prompt_sigma**2 / 2), prompt_sigma,
                     cap=dep.mdl.max_position_embeddings - 1)
    table = service_table(cost, dist, points=1201)  # prefill times on quadrature nodes, priced once
    moments = table.moments()  # E[S], C^2 over the prompt distribution
    es, c2 = moments.mean_s, moments.scv
    svc = table.price(dist.sample(np.random.default_rng(0), 20_000))  # a sample path of 20,000 requests
    rho_mg1 = qu.utilization_for_sojourn_quantile(es, ttft_p99_s, scv=c2)
    rho_path = qu.sample_path_utilization(svc, ttft_p99_s, seed=1, rel_tol=2e-3)
    xs = [i / 100 for i in range(1, 98)]
    mm1 = [qu.sojourn_quantile_approx_s(x / s_mean, s_mean, 1.0) for x in xs]
    mg1 = [qu.sojourn_quantile_approx_s(x / es, es, c2) for x in xs]
    gaps = np.random.default_rng(1).exponential(1.0, len(svc))
    es_path = float(svc.mean())
    px = [0.1 * i for i in range(1, 10)]
    py = [float(np.quantile(qu.lindley_waits(np.cumsum(gaps * es_path / x), svc) + svc, 0.99)) for x in px]
    fig = _UTIL_FIGURE(xs, mm1, mg1, px, py, ttft_p99_s, (rho_mm1, rho_mg1, rho_path))

    def allowed(rho: float) -> str:
        return fmt_pct(rho) if rho > 0 else "none: even an idle replica misses the target"

    rows = [("prefill of the mean prompt S", fmt_time(s_mean)),
            ("target / S", f"{sig(ttft_p99_s / s_mean)} prefills"),
            ("ρ allowed, M/M/1", allowed(rho_mm1)),
            ("prefill time of these prompts: mean, C²", f"{fmt_time(es)}, {sig(c2)}"),
            ("ρ allowed, two-moment formula", allowed(rho_mg1)),
            ("ρ allowed, exact queue (Lindley)", allowed(rho_path)),
            ("p99 prefill of one prompt alone", fmt_time(float(np.quantile(svc, 0.99))))]
    caption = (f"The p99 time to first token against the prefill server's utilization: M/M/1, the two-moment formula "
               f"and the exact queue (points). Each meets the {fmt_time(ttft_p99_s)} target (grey) at the utilization it "
               f"allows (dotted): {allowed(rho_mm1)}, {allowed(rho_mg1)} and {allowed(rho_path)}.")
    return View(f"p99 TTFT {sig(ttft_p99_s)} s on {dep.label}, prompts {prompt_tokens:,} tokens (mean), σ {prompt_sigma:g}",
                rows, fig, caption=caption,
                note=("Each curve is the p99 time to first token against utilization; where it crosses the grey target "
                      "(the dotted line of its colour) is the utilization allowed. Widen the prompt spread and the dashed curve and the red points "
                      "lift off the M/M/1 line: variance, not the mean, eats the headroom; the red points (one sampled path, "
                      "Lindley's recursion) sit above the dashed curve when the tail is heavy."),
                values={"rho_mm1": rho_mm1, "rho_mg1": rho_mg1, "rho_path": rho_path, "scv": c2})


# ---- I027: a spike, the queue it leaves, and what rejection and retries do -----------------------

def _spike_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    a = SimpleNamespace(ax=ax, ax2=ax2)
    a.base, = ax.plot([], [], color="grey", lw=1.5, label="accept all: wait of a new arrival")
    a.pol, = ax.plot([], [], color="C0", lw=2, label="this policy: wait of a new arrival")
    a.offered, = ax2.plot([], [], color="C1", lw=1, ls="--", label="this policy: attempts per second (right)")
    a.timeout = ax.axhline(1.0, color="C3", ls=":", lw=1.2, label="client timeout")
    a.end = ax.axvline(0.0, color="k", lw=0.8, alpha=0.5, label="spike ends")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("wait (s)")
    ax2.set_ylabel("attempts per second")
    ax.grid(True)
    return a


def _spike_draw(a: SimpleNamespace, t, base_wait, pol_wait, offered, timeout, end, xmax) -> None:
    a.base.set_data(t, base_wait)
    a.pol.set_data(t, pol_wait)
    a.offered.set_data(t, offered)
    a.timeout.set_ydata([timeout, timeout])
    a.end.set_xdata([end, end])
    a.ax.set_xlim(0, xmax)
    a.ax.set_ylim(0, max(max(base_wait), max(pol_wait), timeout) * 1.1)
    a.ax2.set_ylim(0, max(offered) * 1.15)
    figures.legend(a.ax, [a.base, a.pol, a.offered, a.timeout, a.end], loc="upper right", fontsize=7)


_SPIKE_FIGURE = figures.LiveFigure(6.0, 3.2, _spike_build, _spike_draw)


@explorer(
    "scheduling.overload_spike",
    capacity=FloatRange(1.0, 200.0, step=0.1, label="capacity (requests/s)"),
    base_load=FloatRange(0.1, 0.9, step=0.05, label="usual traffic ÷ capacity"),
    spike_load=FloatRange(1.1, 3.0, step=0.05, label="spike traffic ÷ capacity"),
    spike_s=FloatRange(10.0, 180.0, step=5.0, label="spike length (s)"),
    timeout_s=FloatRange(1.0, 60.0, step=1.0, label="client timeout (s)"),
    policy=Choice(POLICIES, label="overload policy"),
)
def overload_spike(capacity: float, base_load: float, spike_load: float, spike_s: float, timeout_s: float,
                   policy: str) -> View:
    """I027: the fluid queue of one spike, accepting everything vs bounding it (429) and retries."""
    runs = compare_policies(capacity, base_load * capacity, spike_load * capacity, spike_s, timeout_s, steps=600,
                            policies=tuple(dict.fromkeys(("accept all", policy))))
    run, allin, end = runs[policy], runs["accept all"], runs["spike_end_s"]
    every = slice(None, None, 4)  # 150 points a line: enough for the eye, cheap to render
    busy = [x for x in (allin.last_time("backlog"), run.last_time("backlog"), run.last_time("rejected"))
            if not math.isnan(x)]
    xmax = min(float(run.t[-1]), max(busy, default=end) + 30.0)
    fig = _SPIKE_FIGURE(run.t[every], allin.wait_s[every], run.wait_s[every], run.offered[every], timeout_s, end, xmax)
    closed = runs["closed_form"]
    dead_until = run.last_time("dead")
    rows = [("backlog at the spike's end (accept all)", f"{sig(closed.backlog_peak)} requests"),
            ("longest wait (accept all)", fmt_time(closed.wait_peak_s)),
            ("drain after the spike (accept all)", fmt_time(closed.drain_s)),
            ("dead requests served (accept all)",
             f"{sig(closed.dead_requests)}, the last starting {fmt_time(closed.dead_served_until_s)} after the spike"
             if closed.dead_requests > 0 else "none: the longest wait is within the timeout"),
            ("this policy: dead requests served", sig(run.total("dead")) if run.total("dead") >= 0.5 else "none"),
            ("this policy: 429 responses", sig(run.total("rejected"))),
            ("this policy: attempts per second, peak", sig(float(run.offered.max()))),
            ("this policy: clients served", f"{sig(run.total('served'))} of {sig(allin.total('served'))}"),
            ("queue bound, Retry-After, jitter", f"{sig(runs['bound'])} requests, {fmt_time(runs['retry_after_s'])}, "
                                                 f"{fmt_time(runs['jitter_s'])}")]
    note = ("Grey: every request accepted; where it is above the red timeout, arrivals are dead before they are "
            "served, and it stays there after the black spike end. "
            + ("" if policy == "accept all" else
               "Blue: this policy's wait; dashed: the attempts per second reaching it, where eager retries pile up.")
            + ("" if math.isnan(dead_until) or policy == "accept all" else
               f" This policy still serves dead requests until {fmt_time(max(dead_until - end, 0))} after the spike."))
    caption = (f"The wait a new arrival would see over time. Accepting everything (grey) it peaks at "
               f"{fmt_time(closed.wait_peak_s)} against the {fmt_time(timeout_s)} client timeout (red)"
               + (f", so {sig(closed.dead_requests)} requests are served after their client has gone." if
                  closed.dead_requests > 0 else ", so every request is served in time.")
               + ("" if policy == "accept all" else
                  f" With '{policy}' (blue; its attempts per second dashed), "
                  f"{sig(run.total('dead')) if run.total('dead') >= 0.5 else 'none'} are, and "
                  f"{sig(run.total('rejected'))} get a 429."))
    return View(f"one spike of {sig(spike_load)}x capacity for {sig(spike_s)} s on {sig(base_load)}x, "
                f"capacity {sig(capacity)} requests/s", rows, fig, note=note, caption=caption,
                values={"dead_all": allin.total("dead"), "dead": run.total("dead"), "rejected": run.total("rejected")})


# ---- N071: how small the bound of a work queue must be -------------------------------------------


def _bound_build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.wait, = ax.plot([], [], lw=2, label="wait of an item that finds the queue full")
    a.timeout = ax.axhline(1.0, color="C3", ls=":", lw=1.2, label="client timeout")
    a.best = ax.axvline(1.0, color="C2", ls="--", lw=1.2, label="largest bound within the timeout")
    a.this, = ax.plot([], [], "o", color="C1", ms=7, label="this bound")
    ax.set_xlabel("queue bound (items)")
    ax.set_ylabel("seconds")
    ax.grid(True)
    return a


def _bound_draw(a: SimpleNamespace, xs, ys, timeout, best, bound, wait) -> None:
    a.wait.set_data(xs, ys)
    a.timeout.set_ydata([timeout, timeout])
    a.best.set_xdata([max(best, 1), max(best, 1)])
    a.best.set_visible(best >= 1)
    a.this.set_data([bound], [wait])
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(min(ys[0], timeout) / 2, max(ys[-1], timeout) * 2)
    figures.legend(a.ax, [a.wait, a.timeout, a.best, a.this], loc="upper left", fontsize=7)


_BOUND_FIGURE = figures.LiveFigure(6.0, 3.0, _bound_build, _bound_draw)


@explorer(
    "scheduling.work_queue",
    workers=IntRange(1, 64, label="workers"),
    service_ms=FloatRange(1.0, 5000.0, step=1.0, label="service time per item (ms)"),
    timeout_s=FloatRange(0.1, 120.0, step=0.1, label="client timeout (s)"),
    bound=IntRange(1, 1 << 20, log=True, label="queue bound (items)"),
)
def work_queue(workers: int, service_ms: float, timeout_s: float, bound: int) -> View:
    """N071: the wait a full bounded queue imposes (bound x service / workers) against a timeout."""
    from lib.scheduling.work_queue import max_bound, queue_wait_s

    s = service_ms / 1000
    best = max_bound(workers, s, timeout_s)
    wait = queue_wait_s(bound, workers, s)
    top = max(4 * bound, 4 * max(best, 1), 16)
    xs = [2 ** (i / 4) for i in range(0, int(4 * math.log2(top)) + 1)]
    ys = [queue_wait_s(1, workers, s) * x for x in xs]
    fig = _BOUND_FIGURE(xs, ys, timeout_s, best, bound, wait)
    verdict = ("within the timeout: a full queue pushes back before its items go stale" if wait <= timeout_s else
               f"{sig(wait / timeout_s)}x the timeout: by the time the queue is full enough to push back, its "
               "items are stale")
    rows = [("drain rate of the workers", f"{sig(workers / s)} items/s"),
            ("largest bound within the timeout", f"{best:,} items" if best else "none: one item already waits too long"),
            ("this bound's full-queue wait", f"{fmt_time(wait)}: {verdict}")]
    largest = (f"the green line is the largest bound within the {fmt_time(timeout_s)} timeout, {fmt_int(best)} items"
               if best else f"no bound keeps it within the {fmt_time(timeout_s)} timeout")
    caption = (f"An item behind a full queue waits bound x service / workers (blue); {largest}. This bound of "
               f"{fmt_int(bound)} (dot) makes it wait {fmt_time(wait)}, "
               + ("within the timeout." if wait <= timeout_s else f"{sig(wait / timeout_s)}x the timeout."))
    return View(f"{workers} workers at {sig(service_ms)} ms an item, {sig(timeout_s)} s timeout", rows, fig,
                caption=caption,
                note=("The line is Little's law for the queue: an item behind a full queue waits bound x service / "
                      "workers. Left of the green line the bound pushes back in time; right of it the queue "
                      "accepts work its clients will have abandoned."),
                values={"max_bound": best, "wait": wait})
