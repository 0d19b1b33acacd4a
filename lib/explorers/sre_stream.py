"""Explorer for the stream timing audit (I084): one simulated stream as the engine made it, as the
client received it (events), and as a per-token spreading would invent it.

Calls :mod:`lib.sre.stream_audit` (recordings from the book's serving simulator, the audit); the
simulation of one setup is cached apart from the flush interval, so moving the flush interval or the request
only coalesces the one stream shown.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.units import fmt_time, sig

N_REQUESTS = 100  # the page's default number of streams


def stream_deployment(model: str, gpu: str):
    """``model`` on ``gpu`` at the smallest tensor-parallel degree that holds it
    (:func:`lib.perf.throughput.smallest_fitting_deployment`)."""
    from lib.perf.throughput import smallest_fitting_deployment

    return smallest_fitting_deployment(model, gpu)


def recordings(model: str, gpu: str, flush_ms: float, launch_median_ms: float, n_requests: int = N_REQUESTS,
               rate: float = 6.0, prompt_median: int = 1000, output_median: int = 200, launch_sigma: float = 0.8,
               net_ms: float = 5.0, seed: int = 0):
    """Seeded recordings for one setup (:func:`lib.sre.stream_audit.simulated_recordings`; lengths
    lognormal with the page's spreads around the given medians); the simulation is cached, the
    recordings are made per flush interval."""
    return _simulation(model, gpu, launch_median_ms, n_requests, rate, prompt_median, output_median, launch_sigma,
                       net_ms, seed).with_flush(flush_ms / 1e3)


@functools.lru_cache(maxsize=32)
def _simulation(model: str, gpu: str, launch_median_ms: float, n_requests: int, rate: float, prompt_median: int,
                output_median: int, launch_sigma: float, net_ms: float, seed: int):
    """The simulated run of one setup (any flush interval; :meth:`SimulatedStreams.with_flush` records it)."""
    from lib.scheduling.workloads import LogNormal
    from lib.sre.stream_audit import default_lengths, simulated_recordings

    p, o = default_lengths()
    return simulated_recordings(stream_deployment(model, gpu), n_requests=n_requests, rate=rate,
                                prompt=LogNormal(prompt_median, p.sigma, cap=p.cap),
                                output=LogNormal(output_median, o.sigma, cap=o.cap),
                                launch_median_s=launch_median_ms / 1e3, launch_sigma=launch_sigma,
                                net_s=net_ms / 1e3, seed=seed)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.engine = ax.plot([0.0], [0.0], color="0.55", lw=1.2, drawstyle="steps-post", label="engine (per token)")[0]
    a.events = ax.plot([0.0], [0.0], color="C0", lw=1.8, drawstyle="steps-post", marker="o", ms=3,
                       label="received events")[0]
    a.spread = ax.plot([0.0], [0.0], color="C3", lw=1.0, ls="--", label="tokens spread over gaps (invented)")[0]
    a.arrival = ax.axvline(0.0, color="C2", ls=":", lw=1.2, label="engine arrival")
    ax.set_xlabel("ms since the client created the request")
    ax.set_ylabel("tokens received")
    ax.grid(True)
    figures.legend(ax, [a.engine, a.events, a.spread, a.arrival], fontsize=7, loc="upper left")
    return a


def _draw(a, eng_t, ev_t, ev_cum, sp_t, sp_cum, arrival_ms) -> None:
    a.engine.set_data(eng_t, np.arange(1, len(eng_t) + 1))
    a.events.set_data(ev_t, ev_cum)
    a.spread.set_data(sp_t, sp_cum)
    a.arrival.set_xdata([arrival_ms, arrival_ms])
    a.ax.set_xlim(0.0, max(float(eng_t[-1]), float(ev_t[-1])) * 1.03)
    a.ax.set_ylim(0.0, float(ev_cum[-1]) * 1.05 + 1)


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "sre.stream_events",
    model=Choice(tuple(models.model_names())),
    gpu=Choice(tuple(hardware.gpu_names())),
    flush_ms=FloatRange(0.0, 200.0, 5.0, label="sender flush interval (ms)"),
    launch_median_ms=FloatRange(1.0, 500.0, 1.0, label="client launch delay, median (ms)"),
    request=IntRange(0, N_REQUESTS - 1, label="request"),
)
def stream_events(model: str, gpu: str, flush_ms: float, launch_median_ms: float, request: int, *,
                  n_requests: int = N_REQUESTS, rate: float = 6.0, prompt_median: int = 1000, output_median: int = 200,
                  launch_sigma: float = 0.8, net_ms: float = 5.0, seed: int = 0) -> View:
    """I084: one stream's tokens against time, engine truth vs received events vs invented spreading.
    The keyword-only inputs (the page's other parameters) are not widgets."""
    from lib.sre.stream_audit import audit

    sim = recordings(model, gpu, float(flush_ms), float(launch_median_ms), int(n_requests), float(rate),
                     int(prompt_median), int(output_median), float(launch_sigma), float(net_ms), int(seed))
    n = len(sim.result.requests)
    if not 0 <= request < n:
        raise ValueError(f"request must be in [0, {n - 1}], got {request!r}")
    rec = sim.recording(request)
    a = audit(rec)
    created = rec.created_s
    eng = (sim.result.token_times(request) + sim.net_s - created) * 1e3
    ev = [e for e in rec.events if e.tokens > 0]
    ev_t = np.array([e.t_s - created for e in ev]) * 1e3
    ev_cum = np.cumsum([e.tokens for e in ev])
    # the invented timeline: each event's tokens spread evenly over the gap before it
    sp_t, prev = [], ev_t[0]
    for t, e in zip(ev_t, ev, strict=True):
        sp_t += list(np.linspace(prev, t, e.tokens + 1)[1:]) if t > prev else [t] * e.tokens
        prev = t
    sp_t = np.array(sp_t)
    spread_max = float(np.max(np.diff(sp_t))) / 1e3 if len(sp_t) > 1 else float("nan")  # seconds
    fig = _FIGURE(eng, ev_t, ev_cum, sp_t, np.arange(1, len(sp_t) + 1), (a.launch_delay_s) * 1e3)
    rows = [("client launch delay", fmt_time(a.launch_delay_s)),
            ("TTFT from engine arrival", fmt_time(a.ttft_s)),
            ("TTFT the client felt", fmt_time(a.client_ttft_s)),
            ("tokens / token events", f"{a.tokens} / {a.token_events} ({sig(a.tokens / a.token_events)} per event)"),
            ("longest gap between events", fmt_time(a.max_gap_s) if a.token_events > 1 else "one event"),
            ("longest gap if spread (invented)", fmt_time(spread_max) if len(sp_t) > 1 else "n/a"),
            ("token-weighted rate", f"{sig(a.rate_tok_s)} tokens/s" if a.rate_tok_s == a.rate_tok_s else "n/a")]
    caption = (f"Request {request}: the engine made {a.tokens} tokens, the client received them in {a.token_events} "
               f"events; the launch delay ({fmt_time(a.launch_delay_s)}) sits before the engine arrival line and "
               "belongs to the client, not to the engine's TTFT.")
    return View(f"Stream audit: {model} on {gpu}, flush {sig(flush_ms)} ms", rows, fig, caption=caption,
                values={"ttft_s": a.ttft_s, "launch_delay_s": a.launch_delay_s, "max_gap_s": a.max_gap_s,
                        "spread_max_gap_s": spread_max, "tokens_per_event": a.tokens / a.token_events})
