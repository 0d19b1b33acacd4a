"""Explorer for allocated versus utilized GPUs (N049): the gap each cause owns and what its policy
recovers, from the closed form of the fleet (:func:`lib.sre.allocation.expected_gap`).

Views call lib only; the figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, sig

ROWS = (("notebook", "idle notebooks", "reclaim"), ("placeholder", "placeholders", "preempt"),
        ("loader_bound", "input-bound run", "loader"), ("training", "healthy training", None))


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.24, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    ys = list(range(len(ROWS)))
    a = SimpleNamespace(ax=ax)
    a.owned = ax.barh(ys, [1.0] * len(ys), color="0.8", label="gap the cause owns")
    a.recov = ax.barh(ys, [0.5] * len(ys), color="C2", label="recovered by its policy")
    ax.set_yticks(ys, [r[1] for r in ROWS], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("points of the fleet")
    ax.grid(True, axis="x")
    return a


def _draw(a, owned, recovered) -> None:
    for bar, v in zip(a.owned, owned, strict=True):
        bar.set_width(v)
    for bar, v in zip(a.recov, recovered, strict=True):
        bar.set_width(v)
    a.ax.set_xlim(0, max(max(owned), 1.0) * 1.1)
    figures.legend(a.ax, [a.owned, a.recov], loc="lower right", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "sre.allocation_gap",
    free_gpus=IntRange(0, 16384, label="GPUs not allocated"),
    training_gpus=IntRange(0, 16384, label="GPUs of healthy training"),
    loader_gpus=IntRange(0, 16384, label="GPUs of the loader-bound run"),
    notebook_gpus=IntRange(0, 16384, label="GPUs held by notebooks"),
    placeholder_gpus=IntRange(0, 16384, label="GPUs held by placeholders"),
    loader_tensor=FloatRange(0.01, 0.5, 0.01, label="loader-bound run's tensor-active"),
    notebook_active=FloatRange(0.01, 0.9, 0.01, label="fraction of minutes a notebook works"),
    idle_min=IntRange(0, 240, label="idle reclaim after (minutes)"),
    backfill=FloatRange(0.0, 1.0, 0.05, label="placeholder time backfilled"),
)
def allocation_gap(free_gpus: int, training_gpus: int, loader_gpus: int, notebook_gpus: int, placeholder_gpus: int,
                   loader_tensor: float, notebook_active: float, idle_min: int, backfill: float) -> View:
    """N049: allocated, utilized, the gap per cause and the points each policy recovers."""
    from lib.sre.allocation import Profile, expected_gap

    fleet_gpus = free_gpus + training_gpus + loader_gpus + notebook_gpus + placeholder_gpus
    if fleet_gpus < 1:
        raise ValueError("the fleet needs at least one GPU: every count is 0")
    prof = Profile(loader_tensor=loader_tensor, notebook_active=notebook_active)
    r = expected_gap({"training": training_gpus, "loader_bound": loader_gpus, "notebook": notebook_gpus,
                      "placeholder": placeholder_gpus}, fleet_gpus, prof, idle_min, backfill)
    owned = [r["owned_pts"][k] for k, _, _ in ROWS]
    rec = [r["recovered_pts"][pol] if pol else 0.0 for _, _, pol in ROWS]
    fig = _FIGURE(owned, rec)
    total_rec = sum(rec)
    rows = [("allocated", fmt_pct(r["allocated"])), ("utilized (SM-active)", fmt_pct(r["utilized"])),
            ("gap", f"{sig(r['gap_pts'])} points"), ("recovered by the three fixes", f"{sig(total_rec)} points")]
    rows += [(f"{label}: owns / recovered", f"{sig(o)} / {sig(x)} points") for (_, label, _), o, x
             in zip(ROWS, owned, rec, strict=True)]
    big = max(range(len(ROWS)), key=lambda i: owned[i])
    caption = (f"Of a {sig(r['gap_pts'])}-point gap ({fmt_pct(r['allocated'])} allocated, {fmt_pct(r['utilized'])} "
               f"SM-active), {ROWS[big][1]} own the most ({sig(owned[big])} points, grey); the green parts, "
               f"{sig(total_rec)} points in all, are what idle reclaim, preemptible placeholders and loader fixes "
               "recover.")
    return View(f"Allocated {fmt_pct(r['allocated'])}, utilized {fmt_pct(r['utilized'])}", rows, fig,
                caption=caption, values={"gap_pts": r["gap_pts"], "recovered_pts": total_rec})
