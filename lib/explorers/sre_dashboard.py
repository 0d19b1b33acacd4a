"""Explorer for the inference dashboard (I082): the two panels that check each other, window by window,
through a load spike, with a metric built right or wrong (:mod:`lib.sre.dashboard`)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.units import fmt_pct, sig

BROKEN = ("none", "latency without the queue", "tokens counted twice")


def _apart(e: float) -> str:
    return "identical" if e < 1e-9 else f"{fmt_pct(e)} apart"
WINDOW_S = 10.0


@functools.lru_cache(maxsize=16)
def _run(spike_rate: float, model: str, gpu: str, max_running: int, prompt_median: int, output_median: int,
         base_rate: float, phase_s: float, seed: int):
    from lib.sre.dashboard import incident_run

    return incident_run(model, gpu, max_running=max_running, prompt_median=prompt_median, output_median=output_median,
                        base_rate=base_rate, spike_rate=spike_rate, phase_s=phase_s, seed=seed)


@functools.lru_cache(maxsize=32)
def window_series(res, broken: str, window_s: float = WINDOW_S) -> SimpleNamespace:
    """Per window: in-flight requests (the engine's waiting + running, time-averaged), arrival rate x the
    mean latency of the requests that arrived in it, tokens/s counted, and running / mean TPOT.

    Steps (start times) and requests (arrivals) are in time order, so each window's steps and requests
    are index ranges (``np.searchsorted``), and so are the tokens once sorted by time; a window with no
    step or no arrival is left out."""
    tl = res.timeline
    end = float(tl.start_s[-1] + tl.duration_s[-1])
    edges = np.arange(0.0, end + window_s, window_s)
    order = np.argsort([r.arrival_s for r in res.requests], kind="stable")  # (rid order already is, for the page)
    recs = [res.requests[i] for i in order]
    arr = np.array([r.arrival_s for r in recs])
    soj = np.array([r.sojourn_s for r in recs])
    if broken == "latency without the queue":
        soj = soj - np.array([r.queue_s for r in recs])
    tpot = np.array([r.tpot_s if r.output_len > 1 else np.nan for r in recs])
    times, _ = res._tokens()
    factor = 2.0 if broken == "tokens counted twice" else 1.0
    step_at = np.searchsorted(tl.start_s, edges, "left")  # steps of window j: step_at[j]:step_at[j + 1]
    req_at = np.searchsorted(arr, edges, "left")
    tokens = np.diff(np.searchsorted(np.sort(times), edges, "left"))  # tokens with edges[j] <= t < edges[j + 1]
    inflight = tl.waiting + tl.running
    out = SimpleNamespace(t=[], L=[], lw=[], tok=[], impl=[])
    for j in np.flatnonzero((step_at[1:] > step_at[:-1]) & (req_at[1:] > req_at[:-1])):
        st, inr = slice(step_at[j], step_at[j + 1]), slice(req_at[j], req_at[j + 1])
        d = tl.duration_s[st]
        out.t.append((edges[j] + edges[j + 1]) / 2)
        out.L.append(float((inflight[st] * d).sum() / d.sum()))
        out.lw.append((req_at[j + 1] - req_at[j]) / window_s * float(soj[inr].mean()))
        out.tok.append(factor * tokens[j] / window_s)
        running = float((tl.running[st] * d).sum() / d.sum())
        out.impl.append(running / float(np.nanmean(tpot[inr])))
    return SimpleNamespace(**{k: np.asarray(v) for k, v in vars(out).items()})


@functools.lru_cache(maxsize=32)
def _checks(res, broken: str) -> dict:
    from lib.sre.dashboard import cross_checks

    return cross_checks(res, latency_from_schedule=broken == "latency without the queue",
                        token_count_factor=2.0 if broken == "tokens counted twice" else 1.0)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.14, top=0.95, wspace=0.3)
    a1, a2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a = SimpleNamespace(a1=a1, a2=a2)
    a.L = a1.plot([0.0], [0.0], color="C0", lw=1.8, label="in flight (engine)")[0]
    a.lw = a1.plot([0.0], [0.0], color="C3", lw=1.2, ls="--", label="arrivals/s x latency")[0]
    a.tok = a2.plot([0.0], [0.0], color="C0", lw=1.8, label="tokens/s (counter)")[0]
    a.impl = a2.plot([0.0], [0.0], color="C3", lw=1.2, ls="--", label="running / TPOT")[0]
    from matplotlib.ticker import MaxNLocator

    for ax, unit in ((a1, "requests"), (a2, "tokens/s")):
        ax.xaxis.set_major_locator(MaxNLocator(5))  # fewer tick labels to lay out on every update
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.set_xlabel("time (s)")
        ax.set_ylabel(unit)
        ax.grid(True)
    figures.legend(a1, [a.L, a.lw], fontsize=7, loc="upper left")
    figures.legend(a2, [a.tok, a.impl], fontsize=7, loc="upper left")
    return a


def _draw(a, s) -> None:
    a.L.set_data(s.t, s.L)
    a.lw.set_data(s.t, s.lw)
    a.tok.set_data(s.t, s.tok)
    a.impl.set_data(s.t, s.impl)
    for ax, ys in ((a.a1, np.concatenate([s.L, s.lw])), (a.a2, np.concatenate([s.tok, s.impl]))):
        ax.set_xlim(0.0, float(s.t[-1]) + WINDOW_S / 2)
        ax.set_ylim(0.0, float(np.nanmax(ys)) * 1.1 + 1e-9)


_FIGURE = figures.LiveFigure(7.0, 3.0, _build, _draw)


@explorer(
    "sre.dashboard_checks",
    spike_rate=FloatRange(6.0, 16.0, 0.5, label="spike arrivals/s"),
    broken=Choice(BROKEN),
)
def dashboard_checks(spike_rate: float, broken: str, *, model: str = "llama-3.1-8b", gpu: str = "h100-sxm",
                     max_running: int = 32, prompt_median: int = 1000, output_median: int = 200, base_rate: float = 6.0,
                     phase_s: float = 40.0, seed: int = 0) -> View:
    """I082: the in-flight panel against arrivals x latency and the tokens/s panel against running / TPOT,
    per window, through a spike; keyword-only inputs are the page's other parameters."""
    if broken not in BROKEN:
        raise ValueError(f"broken must be one of {', '.join(BROKEN)}, got {broken!r}")
    res = _run(float(spike_rate), model, gpu, int(max_running), int(prompt_median), int(output_median), float(base_rate),
               float(phase_s), int(seed))
    s = window_series(res, broken)
    cc = _checks(res, broken)
    rows = [("in flight vs arrivals x latency (whole run)",
             f"{sig(cc['L_panel'])} vs {sig(cc['L_implied'])} ({_apart(cc['in_flight_error'])}, "
             f"{'agree' if cc['in_flight_ok'] else 'DISAGREE'})"),
            ("tokens/s vs running / TPOT (whole run)",
             f"{sig(cc['tokens_panel'])} vs {sig(cc['tokens_implied'])} ({_apart(cc['tokens_error'])}, "
             f"{'agree' if cc['tokens_ok'] else 'DISAGREE'})"),
            ("peak in flight", sig(float(s.L.max())))]
    bad = [n for n, ok in (("in flight", cc["in_flight_ok"]), ("tokens/s", cc["tokens_ok"])) if not ok]
    caption = (f"Left: requests in flight against arrivals/s x mean latency per {WINDOW_S:g} s window; right: tokens/s "
               f"against running / TPOT. With {broken if broken != 'none' else 'every metric built right'}, "
               + (f"the {' and '.join(bad)} check{'s' if len(bad) > 1 else ''} fail{'' if len(bad) > 1 else 's'}."
                  if bad else "both checks agree over the run."))
    fig = _FIGURE(s)
    return View(f"Dashboard cross-checks: spike to {sig(spike_rate)} requests/s", rows, fig, caption=caption,
                values={"in_flight_error": cc["in_flight_error"], "tokens_error": cc["tokens_error"]})
