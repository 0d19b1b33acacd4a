"""Explorers for hung collectives (N051, N077): simulated flight-recorder dumps of N ranks with one cause
injected and the analysis that names it (:func:`lib.sre.hangs.simulate_hang`,
:func:`~lib.sre.hangs.find_missing_rank`); the time each triage method takes on N ranks
(:func:`~lib.sre.hangs.triage_time_s`); the counters a hang reads (:func:`~lib.sre.hangs.hang_counters`).
One persistent figure per explorer, updated in place."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware as hw
from lib.sre import hangs as h
from lib.units import fmt_int, fmt_time

CAUSE_CHOICES = tuple(h.CAUSES) + ("link", "none")


@functools.lru_cache(maxsize=32)
def _sim(cause: str, n_ranks: int, bad_rank: int, buffer_entries: int, seed: int):
    sim = h.simulate_hang(n_ranks, cause, min(bad_rank, n_ranks - 1), hang_step=3, buffer_entries=buffer_entries,
                          seed=seed)
    return sim, h.find_missing_rank(sim.dumps)


def _build(fig) -> SimpleNamespace:
    ax = fig.subplots()
    a = SimpleNamespace(ax=ax)
    a.done = ax.plot([], [], "o", ms=3, color="0.55", label="last completed")[0]
    a.entered = ax.plot([], [], "^", ms=4, color="C0", label="last entered")[0]
    a.named = ax.plot([], [], "o", ms=11, mfc="none", mec="C3", mew=1.5, label="named by the analysis")[0]
    a.hang = ax.axhline(0, color="C3", ls=":", lw=1, label="first collective not completed")
    ax.set_xlabel("rank")
    ax.set_ylabel("collective sequence id")
    ax.grid(True)
    ax.locator_params(nbins=5)
    ax.legend(fontsize=6, loc="lower right")
    return a


MAX_POINTS = 300  # ranks drawn per series (every k-th, plus the named one): the SVG stays small


def _stride(n: int) -> int:
    return max(1, -(-n // MAX_POINTS))


def _draw(a, sim, finding) -> None:
    n = len(sim.dumps)
    done = np.array([max((e.seq for e in d.entries if e.state == "completed"), default=-1) if d else np.nan
                     for d in sim.dumps], dtype=float)
    entered = np.array([d.entries[-1].seq if d and d.entries else np.nan for d in sim.dumps], dtype=float)
    x = np.union1d(np.arange(0, n, _stride(n)), [finding.rank] if finding.rank is not None else [])
    x = x.astype(int)
    a.done.set_data(x, done[x])
    a.entered.set_data(x, entered[x])
    r = finding.rank
    if r is not None:
        y = entered[r] if np.isfinite(entered[r]) else (done[np.isfinite(done)].max() if np.isfinite(done).any() else 0)
        a.named.set_data([r], [y])
    else:
        a.named.set_data([], [])
    a.hang.set_ydata([finding.seq, finding.seq])
    a.hang.set_visible(finding.seq >= 0)
    vals = np.concatenate([done[np.isfinite(done)], entered[np.isfinite(entered)], [max(finding.seq, 0)]])
    lo, hi = float(vals.min()), float(vals.max())
    a.ax.set_ylim(lo - 1.5, hi + 1.5)
    a.ax.set_xlim(-1, n)


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "sre.flight_recorder",
    cause=Choice(CAUSE_CHOICES, label="injected cause"),
    n_ranks=IntRange(3, 512, label="ranks"),
    bad_rank=IntRange(0, 511, label="affected rank (capped at ranks - 1)"),
    buffer_entries=IntRange(3, 2000, label="ring-buffer entries per rank"),
    gpus_per_host=IntRange(1, 8, label="GPUs per host"),
    seed=IntRange(0, 1000),
)
def flight_recorder(cause: str, n_ranks: int, bad_rank: int, buffer_entries: int, gpus_per_host: int = 8,
                    seed: int = 0) -> View:
    """N051: every rank's last completed and last entered collective, the rank the analysis names, and
    the time each triage method takes on this many ranks."""
    sim, f = _sim(cause, n_ranks, bad_rank, buffer_entries, seed)
    right = (f.cause, f.rank) == (cause, sim.rank)
    rows = [("injected", f"{cause}" + (f" on rank {sim.rank}" if sim.rank is not None else "")),
            ("analysis says", f"{f.cause}" + (f" on rank {f.rank}" if f.rank is not None else "") +
             (" (right)" if right else " (WRONG)")),
            ("evidence", f.evidence)]
    for m in h.TRIAGE_METHODS:
        rows.append((f"time to the rank: {m}", fmt_time(h.triage_time_s(m, n_ranks, gpus_per_host))))
    who = f"rank {f.rank}" if f.rank is not None else "no rank"
    if f.seq < 0:
        caption = f"All {fmt_int(n_ranks)} ranks completed every collective they entered: nothing is stuck."
    else:
        k = _stride(n_ranks)
        shown = "" if k == 1 else f" (one rank in {k} drawn, and the named one)"
        caption = (f"Each rank's last completed (grey) and last entered (blue) collective across {fmt_int(n_ranks)} "
                   f"ranks{shown}; the first collective not completed is {f.seq} (dotted), and the analysis names {who} "
                   f"({f.cause}).")
    return View("Which rank is missing: flight-recorder dumps", rows, _FIGURE(sim, f), caption=caption,
                values={"right": float(right), "hang_seq": float(f.seq)})


def _build_counters(fig) -> SimpleNamespace:
    ax = fig.subplots()
    a = SimpleNamespace(ax=ax)
    x = np.arange(4)
    a.healthy = ax.bar(x - 0.2, [0, 0, 0, 0], width=0.4, color="0.6", label="healthy training step")
    a.hung = ax.bar(x + 0.2, [0, 0, 0, 0], width=0.4, color="C3", label="hung in a collective")
    ax.set_xticks(x, ["utilization", "SM active", "tensor active", "power / TDP"], fontsize=7)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("fraction")
    ax.grid(True, axis="y")
    ax.legend(fontsize=6, loc="upper right")
    return a


def _draw_counters(a, healthy, hung) -> None:
    for bars, vals in ((a.healthy, healthy), (a.hung, hung)):
        for b, v in zip(bars, vals, strict=True):
            b.set_height(v)


_COUNTERS = figures.LiveFigure(5.0, 2.6, _build_counters, _draw_counters)


@explorer(
    "sre.hang_counters",
    gpu=Choice(tuple(hw.gpu_names())),
    nccl_ctas=IntRange(1, 58, label="blocks the hung NCCL kernel keeps resident"),
    healthy_mfu=FloatRange(0.1, 0.8, label="healthy MFU (a floor on tensor activity)"),
)
def hang_counters_view(gpu: str, nccl_ctas: int, healthy_mfu: float) -> View:
    """N077: what utilization, SM activity, tensor activity and power read during a hang against a healthy
    step: utilization is the same, everything that measures work collapses."""
    from lib.perf.energy import board_power_w

    c = h.hang_counters(gpu, nccl_ctas)
    tdp = hw.gpu(gpu).tdp_w
    healthy = [1.0, 1.0, healthy_mfu, board_power_w(gpu, 1.0) / tdp]
    hung = [c["utilization"], c["sm_active"], c["tensor_active"], c["power_fraction"]]
    rows = [("utilization (a kernel resident)", f"{healthy[0]:.0%} healthy, {hung[0]:.0%} hung"),
            ("SM active", f"near 100% healthy, {hung[1]:.1%} hung ({nccl_ctas} of {c['sms']} SMs)"),
            ("tensor active", f"at least {healthy[2]:.0%} healthy, {hung[2]:.0%} hung"),
            ("power", f"{healthy[3] * tdp:.0f} W healthy, {c['power_w']:.0f} W hung (TDP {tdp:.0f} W)")]
    caption = (f"On {gpu}, utilization reads {hung[0]:.0%} both while training and while hung; SM activity falls to "
               f"{hung[1]:.1%}, tensor activity to {hung[2]:.0%} and power to {hung[3]:.0%} of TDP.")
    return View("A hang at full utilization: which counters tell", rows, _COUNTERS(healthy, hung), caption=caption,
                values={"sm_active": c["sm_active"], "power_w": c["power_w"]})
