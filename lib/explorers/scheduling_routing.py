"""Explorer for the batch-routing bug (I097): one batch's rows routed back to their requests by the
repaired completion or by a buggy one, the requests that end up with another request's token, and
the runtime check that would refuse the step (lib.scheduling.routing.simulate).

The view calls lib only; the routing diagram is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.scheduling.routing import PROMPTS, ROUTES, SORTS, simulate
from lib.units import fmt_pct

STEPS = 10  # decode steps behind the explorer's per-step averages
MAX_LABELS = 12  # tick labels per column; a larger batch labels every k-th slot (labels dominate the draw)


def _build(fig) -> SimpleNamespace:
    from matplotlib.collections import LineCollection

    fig.subplots_adjust(left=0.15, right=0.88, bottom=0.07, top=0.8)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, right=ax.twinx())
    a.good = LineCollection([], colors="#2a9d4a", linewidths=1.1, label="row to the request of its slot")
    a.bad = LineCollection([], colors="#d62728", linewidths=1.5, label="row to another request")
    a.want = LineCollection([], colors="#999", linewidths=0.9, linestyles="--", label="where that row belongs")
    ax.add_collection(a.want)
    ax.add_collection(a.good)
    ax.add_collection(a.bad)
    a.nodes, = ax.plot([], [], "o", color="#444", ms=3.2, label="slot at launch / request at completion")
    a.gone, = ax.plot([], [], "x", color="#777", ms=6, mew=1.4, label="slot whose request left mid-step")
    a.new, = ax.plot([], [], "s", color="#ff7f0e", ms=4.5, label="request admitted mid-step")
    ax.set_xlim(-0.04, 1.04)
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["slots at launch", "requests at completion"])
    ax.tick_params(axis="y", labelsize=6.5, length=0)
    a.right.tick_params(axis="y", labelsize=6.5, length=0)
    for side in ("top", "bottom"):
        ax.spines[side].set_visible(False)
        a.right.spines[side].set_visible(False)
    return a


def _draw(a, slots, requests, good, bad, want, gone, new) -> None:
    """``slots``/``requests``: labels top to bottom; ``good``/``bad``: (slot index, request index) pairs
    the completion applied; ``want``: where each misrouted row belonged (if its request still runs);
    ``gone``: slot indices whose request left mid-step; ``new``: request indices admitted mid-step."""
    n = max(len(slots), len(requests))
    a.good.set_segments([[(0, -i), (1, -j)] for i, j in good])
    a.bad.set_segments([[(0, -i), (1, -j)] for i, j in bad])
    a.want.set_segments([[(0, -i), (1, -j)] for i, j in want])
    a.nodes.set_data([0] * len(slots) + [1] * len(requests), [-i for i in range(len(slots))] + [-j for j in range(len(requests))])
    a.gone.set_data([0] * len(gone), [-i for i in gone])
    a.new.set_data([1] * len(new), [-j for j in new])
    every = max(1, math.ceil(n / MAX_LABELS))
    for axis, labels in ((a.ax, slots), (a.right, requests)):
        ticks = list(range(0, len(labels), every))
        axis.set_ylim(-n + 0.4, 0.6)
        axis.set_yticks([-i for i in ticks], [labels[i] for i in ticks])
    a.good.set_visible(bool(good))
    a.bad.set_visible(bool(bad))
    a.want.set_visible(bool(want))
    a.gone.set_visible(bool(gone))
    a.new.set_visible(bool(new))
    figures.legend(a.ax, [a.good, a.bad, a.want, a.nodes, a.gone, a.new], loc="lower center",
                   bbox_to_anchor=(0.5, 1.01), ncol=2, fontsize=6.8, frameon=False)


_FIGURE = figures.LiveFigure(6.2, 4.4, _build, _draw)


@explorer(
    "scheduling.routing",
    batch=IntRange(2, 64, label="requests in the batch"),
    sort=Choice(SORTS, label="batch order"),
    drop_prob=FloatRange(0.0, 0.5, 0.01, label="chance a request leaves mid-step"),
    seed=IntRange(0, 999, label="seed"),
    completion=Choice(tuple(ROUTES), label="completion (manifest: the fix)"),
    prompts=Choice(PROMPTS, label="prompt lengths"),
)
def routing(batch: int, sort: str, drop_prob: float, seed: int, completion: str, prompts: str) -> View:
    """I097: the first step's rows routed back by ``completion``; corrupted requests over ten steps;
    the check of the repaired contract that would refuse the step."""
    run = simulate(batch, route=completion, sort=sort, drop_prob=drop_prob, steps=STEPS, prompts=prompts, seed=seed)
    first = run.records[0]
    owner = first.launch.slot_rids
    where = {rid: j for j, rid in enumerate(first.running_after)}
    pairs = [(row, where[rid]) for row, rid in first.applied]
    good = [(i, j) for i, j in pairs if first.running_after[j] == owner[i]]
    bad = [(i, j) for i, j in pairs if first.running_after[j] != owner[i]]
    want = [(i, where[owner[i]]) for i, _ in bad if owner[i] in where]
    gone = [i for i, rid in enumerate(owner) if rid in first.dropped]
    new = [where[rid] for rid in first.admitted]
    fig = _FIGURE([f"slot {i}: r{rid}" for i, rid in enumerate(owner)],
                  [f"r{rid}" for rid in first.running_after], good, bad, want, gone, new)
    if first.misrouted:
        row, dest, src = first.misrouted[0]
        example = f"request {dest} received request {src}'s token (row {row})"
    else:
        example = "none: every row reached the request of its slot"
    if run.first_refusal is None:
        caught = f"all {STEPS} steps accepted (nothing to refuse)"
    else:
        k, check, _ = run.first_refusal
        caught = f"step {k + 1} refused by the {check} check"
    rows = [
        ("rows to another request, step 1", f"{len(first.misrouted)} of {first.launched}"),
        ("requests corrupted, step 1", f"{len(first.corrupted)} of {first.live} ({fmt_pct(first.corrupted_share)})"),
        (f"mean share corrupted per step ({STEPS} steps)", fmt_pct(run.mean_corrupted_share)),
        ("steps with a corrupted request", f"{run.steps_with_corruption} of {STEPS}"),
        ("streams that went wrong", f"{len(run.diverged)} of {run.requests} requests"),
        ("first misroute", example),
        ("with the runtime checks", caught),
        ("padding in the padded buffers", fmt_pct(run.padding_share)),
    ]
    note = ("Left: the slots in launch order (the sort's order); right: the requests running when the step "
            "completes. A red line is a row that reached another request (right shape, valid id, wrong "
            "continuation), the dashed grey line where it belonged; the fix draws only green lines. Set the prompt lengths to equal, or the order to fcfs, and the sort bug (presort) "
            "disappears; set the drop chance to 0 and the shift bugs (filter_zip, running_index under fcfs) do.")
    caption = (f"Each line joins a slot at launch (left) to the request its row is applied to at completion (right): "
               f"green reaches the slot's own request, red another one (dashed grey: where it belonged). In step 1, "
               f"{len(first.misrouted)} of {first.launched} rows reach another request.")
    return View(f"{completion} completion, {sort}, batch {batch}, drop chance {fmt_pct(drop_prob)}", rows, fig, note,
                caption=caption,
                values={"misrouted": len(first.misrouted), "corrupted": len(first.corrupted),
                        "mean_share": run.mean_corrupted_share, "diverged": len(run.diverged),
                        "refused": run.first_refusal is not None})
