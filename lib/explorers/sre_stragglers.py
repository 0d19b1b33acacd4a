"""Explorer for the straggler detector (N074): per-rank robust z-scores on the sender's clock and on the
collector's receive clock, against the threshold a false-positive budget gives
(:func:`lib.sre.straggler_detector.simulate_reports`, :func:`~lib.sre.straggler_detector.z_threshold`,
:class:`~lib.sre.straggler_detector.Detector`). One persistent figure, updated in place."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.registry import assumptions
from lib.sre import straggler_detector as sd
from lib.training.stragglers import robust_z
from lib.units import fmt_int, sig


@functools.lru_cache(maxsize=32)
def _reports(n_ranks: int, window: int, step_s: float, cv: float, slow_rank: int, slow_factor: float, skew_ms: float,
             seed: int):
    slow = {min(slow_rank, n_ranks - 1): slow_factor} if slow_factor != 1.0 else {}
    jitter_s = assumptions.value("sre.report_delay_jitter_us") * 1e-6
    return sd.simulate_reports(n_ranks, window, step_s, cv, slow=slow, skew_s=skew_ms * 1e-3, delay_jitter_s=jitter_s,
                               seed=seed)


def _build(fig) -> SimpleNamespace:
    ax = fig.subplots()
    a = SimpleNamespace(ax=ax)
    a.sent = ax.plot([], [], ".", ms=3, color="C1", alpha=0.6, label="sender's clock")[0]
    a.recv = ax.plot([], [], ".", ms=3, color="C0", label="collector's receive time")[0]
    a.slow = ax.plot([], [], "o", ms=9, mfc="none", mec="C3", mew=1.4, label="the injected straggler")[0]
    a.thr = ax.axhline(0, color="C3", ls="--", lw=1, label="threshold")
    ax.set_xlabel("rank")
    ax.set_ylabel("robust z of the window's mean")
    ax.grid(True)
    ax.locator_params(nbins=5)
    ax.legend(fontsize=6, loc="upper left")
    return a


MAX_POINTS = 300  # ranks drawn per series (every k-th, plus any above the threshold): SVG text stays small


def shown_ranks(z_sent, z_recv, thr) -> np.ndarray:
    """Every k-th rank (at most MAX_POINTS) plus every rank above the threshold on either clock."""
    n = len(z_recv)
    k = max(1, -(-n // MAX_POINTS))
    keep = np.zeros(n, dtype=bool)
    keep[::k] = True
    keep |= (z_sent > thr) | (z_recv > thr)
    return np.flatnonzero(keep)


def _draw(a, z_sent, z_recv, slow_rank, thr) -> None:
    x = shown_ranks(z_sent, z_recv, thr)
    a.sent.set_data(x, z_sent[x])
    a.recv.set_data(x, z_recv[x])
    if slow_rank is None:
        a.slow.set_data([], [])
    else:
        a.slow.set_data([slow_rank], [z_recv[slow_rank]])
    a.thr.set_ydata([thr, thr])
    vals = np.concatenate([z_sent, z_recv, [thr]])
    lo, hi = float(np.min(vals)), float(np.max(vals))
    a.ax.set_ylim(lo - 0.05 * (hi - lo + 1), hi + 0.1 * (hi - lo + 1))
    a.ax.set_xlim(-1, len(z_recv))


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "sre.straggler_clock",
    n_ranks=IntRange(8, 2048, label="ranks", log=True),
    skew_ms=FloatRange(0.0, 50.0, label="host clock skew, sd (ms)"),
    slow_factor=FloatRange(1.0, 1.1, label="straggler slowdown"),
    window=IntRange(1, 30, label="steps per window"),
    fp_per_day=FloatRange(0.01, 100.0, label="false positives a day"),
    step_s=FloatRange(0.1, 30.0, label="step time (s)"),
    cv=FloatRange(0.0005, 0.05, label="healthy jitter (cv)"),
    slow_rank=IntRange(0, 2047, label="the straggler (capped at ranks - 1)"),
    seed=IntRange(0, 1000),
)
def straggler_clock(n_ranks: int, skew_ms: float, slow_factor: float, window: int, fp_per_day: float,
                    step_s: float = 1.0, cv: float = 0.002, slow_rank: int = 100, seed: int = 0) -> View:
    """N074: the same window scored on the sender's timestamps and on the collector's receive times."""
    slow_rank = min(slow_rank, n_ranks - 1)
    r = _reports(n_ranks, window, step_s, cv, slow_rank, slow_factor, skew_ms, seed)
    thr = sd.z_threshold(fp_per_day, n_ranks, step_s, window)
    det = sd.Detector()
    on_recv = det.detect(r, thr)
    on_sent = det.detect({"received_s": r["sent_s"]}, thr)
    z_recv = robust_z(r["received_s"].mean(axis=0))
    z_sent = robust_z(r["sent_s"].mean(axis=0))
    truth = [slow_rank] if slow_factor != 1.0 else []

    def verdict(found):
        if found == truth:
            return f"names rank {slow_rank}, right" if truth else "names no rank, right"
        miss = [k for k in truth if k not in found]
        extra = [k for k in found if k not in truth]
        return " and ".join(([f"misses rank {miss[0]}"] if miss else []) +
                            ([f"reports {fmt_int(len(extra))} healthy rank{'s' if len(extra) > 1 else ''}"] if extra else []))

    late_ms = (slow_factor - 1) * step_s * 1e3
    rows = [("threshold (z)", sig(thr)),
            ("straggler's lateness", f"{sig(late_ms)} ms" if truth else "none injected"),
            ("host clock skew (sd)", f"{sig(skew_ms)} ms"),
            ("on the collector's receive time", verdict(on_recv)),
            ("on the sender's clock", verdict(on_sent))]
    k = max(1, -(-n_ranks // MAX_POINTS))
    shown = "" if k == 1 else f" (one rank in {k} drawn, and any above the threshold)"
    caption = (f"Robust z of each of {fmt_int(n_ranks)} ranks' mean over {window} steps{shown}: on the receive clock (blue) "
               f"the detector {verdict(on_recv)}; on the sender's clock (orange), skewed by {sig(skew_ms)} ms, "
               f"it {verdict(on_sent)}; threshold {sig(thr)} for {sig(fp_per_day)} false positives a day.")
    return View("A straggler detector: which clock", rows, _FIGURE(z_sent, z_recv, slow_rank if truth else None, thr),
                caption=caption, values={"threshold": thr, "recv_right": float(on_recv == truth),
                                         "sent_right": float(on_sent == truth)})
