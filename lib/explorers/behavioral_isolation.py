"""Explorer for reporting an isolation gap (N091 reporting-an-isolation-gap).

The view calls :mod:`lib.judgment.isolation` only: the TTFT gap a shared prefix cache opens (cold
against warm prefill, :func:`lib.fleet.capacity.prefill_s`) and the probes that tell a hit from a
miss under jitter, as the cached prefix grows. One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.judgment import isolation
from lib.units import fmt_int, fmt_pct, sig

CAP = 1e6  # probes beyond this are drawn at the top of the axis


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.audit = ax.plot([16, 32], [1, 1], color="C0", lw=1.8, label="audit: samples per arm (1% false alarm, 99% power)")[0]
    a.probe = ax.plot([16, 32], [1, 1], color="C3", lw=1.8, ls="--", label="attacker: averaged probes for 1% error")[0]
    a.here = ax.plot([16], [1], "o", color="C0", ms=6)[0]
    a.one = ax.axhline(1.0, color="0.4", ls=":", lw=1.0)
    figures.log_scale(ax, "both")
    ax.set_xlabel("cached prefix (tokens)")
    ax.set_ylabel("probes needed")
    ax.grid(True)
    return a


def _draw(a, xs, audit, probe, x0, y0) -> None:
    a.audit.set_data(xs, audit)
    a.probe.set_data(xs, probe)
    a.here.set_data([x0], [y0])
    a.ax.set_xlim(xs[0], xs[-1])
    top = max(10.0, min(CAP, float(np.nanmax(np.concatenate([audit, probe]))) * 2))
    a.ax.set_ylim(0.1, top)
    figures.legend(a.ax, [a.audit, a.probe], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


def _count(x: float) -> str:
    return "never (no gap)" if not math.isfinite(x) else fmt_int(max(1, math.ceil(x - 1e-9)))


@explorer(
    "behavioral.isolation_timing",
    model=Choice(("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "a100-sxm", "b200"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    prefix_len=IntRange(16, 16384, log=True, label="cached prefix (tokens)"),
    suffix_len=IntRange(1, 512, label="new tokens after it"),
    jitter_ms=FloatRange(1.0, 200.0, 1.0, label="TTFT jitter, sd (ms)"),
)
def isolation_timing(model: str, gpu: str, tp: int, prefix_len: int, suffix_len: int, jitter_ms: float) -> View:
    """N091: the TTFT gap of a cross-tenant prefix hit and the probes that read it under jitter."""
    from lib.perf.deployment import deployment

    sigma = jitter_ms * 1e-3
    dep = deployment(model, gpu, tp=tp)
    ch = isolation.timing_channel(dep, prefix_len, suffix_len)
    hi = min(16384, dep.mdl.max_position_embeddings - suffix_len)
    if hi < 16:
        raise ValueError(f"{model} holds {dep.mdl.max_position_embeddings} tokens: fewer new tokens, please")
    xs = np.unique(np.round(np.geomspace(16, hi, 28)).astype(int))
    deltas = np.array([isolation.timing_channel(dep, int(x), suffix_len).delta_s for x in xs])
    audit = np.array([min(CAP, isolation.audit_pairs(d, sigma)) for d in deltas])
    probe = np.array([min(CAP, isolation.probes_for_error(d, sigma, 0.01)) for d in deltas])
    n_audit = isolation.audit_pairs(ch.delta_s, sigma)
    rows = [("deployment", dep.label),
            ("cold prefill", f"{sig(ch.cold_s * 1e3)} ms"),
            ("warm prefill (prefix cached)", f"{sig(ch.warm_s * 1e3)} ms"),
            ("timing gap", f"{sig(ch.delta_s * 1e3)} ms"),
            ("one probe misreads hit/miss", fmt_pct(isolation.probe_error(ch.delta_s, sigma))),
            ("audit samples per arm", _count(n_audit)),
            ("averaged probes for 1% error", _count(isolation.probes_for_error(ch.delta_s, sigma, 0.01)))]
    caption = (f"Probes that tell a cross-tenant hit from a miss against the cached prefix length (log-log), "
               f"{dep.label}, {sig(jitter_ms)} ms jitter: a {fmt_int(prefix_len)}-token prefix opens a "
               f"{sig(ch.delta_s * 1e3)} ms gap and the audit needs {_count(n_audit)} "
               f"sample{'' if _count(n_audit) == '1' else 's'} per arm; short prefixes, "
               "whose prefill is bound by the weight read, leave almost no gap.")
    fig = _FIGURE(xs.astype(float), audit, probe, float(prefix_len), min(CAP, n_audit))
    return View(f"Prefix-cache timing channel: {fmt_int(prefix_len)} cached tokens", rows, fig, caption=caption,
                note="wide open" if isolation.probe_error(ch.delta_s, sigma) < 0.05 else "narrow, not closed",
                values={"delta_s": ch.delta_s, "audit_pairs": n_audit})
