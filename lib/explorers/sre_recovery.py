"""Explorer for disaster recovery of a months-long training run (N067).

:func:`dr_plan` prices four strategies with :func:`lib.sre.disaster_recovery.assess`: the
checkpoint's bytes (:func:`lib.training.checkpoint.checkpoint_bytes`), its copy over the
inter-site link (:func:`lib.sre.disaster_recovery.replication_s`), the restore into the second
cluster and the local checkpoint interval (:func:`lib.explorers.training_reliability.checkpoint_modes`
via :func:`lib.explorers.sre_goodput._fleet`), the second cluster's speed from the step model on its
own layout, and the ``sre.*`` / ``training.restart_*`` assumptions. One persistent figure.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.explorers.sre_goodput import TRAINING_GPUS, TRAINING_MODELS
from lib.registry import models
from lib.units import fmt_int, fmt_pct, fmt_time, sig

STRATEGIES = ("no off-site copy", "cold", "warm", "hot")


@functools.lru_cache(maxsize=64)
def dr_plan(model: str, gpu: str, n_gpus: int, run_days: float, link_gbps: float, replicate_min: float,
            standby_fraction: float, outage_days: float, site_loss_per_year: float) -> SimpleNamespace:
    """The four strategies for ``model`` on ``n_gpus`` ``gpu``s over ``run_days``, the building out for
    ``outage_days``:

    * no off-site copy: checkpoints only in the building, no second site;
    * cold: a daily full copy off-site, nothing staged, GPUs provisioned after the loss
      (``sre.gpu_provision_days``) at ``standby_fraction`` of the job's size;
    * warm: a copy every ``replicate_min`` (at least the copy's lag and the local checkpoint interval), data
      and images staged, a standby
      cluster of ``standby_fraction`` kept warm (``sre.standby_overhead``);
    * hot: every local checkpoint copied (the sharded write's Young interval, at least the lag), a
      full-size standby.
    Returns SimpleNamespace(results: name -> DRResult, p_loss, ckpt_bytes, lag_s, data_bytes, ...)."""
    from lib.explorers.sre_goodput import BATCH_TOKENS, _fleet
    from lib.registry import assumptions as a
    from lib.sre import disaster_recovery as dr
    from lib.training import reliability as rel
    from lib.training.checkpoint import checkpoint_bytes
    from lib.training.data_pipeline import shard_bytes

    lay, step, write = _fleet(model, gpu, n_gpus)
    ckpt = checkpoint_bytes(model)
    link = link_gbps * 1e9 / 8.0
    lag = dr.replication_s(ckpt, link)
    tokens = BATCH_TOKENS / step.step_s * run_days * dr.DAY_S
    data = shard_bytes(tokens, models.model(model).vocab_size)
    stage = dr.replication_s(data, link)
    n2 = max(1, int(round(standby_fraction * n_gpus)))
    try:
        lay2, step2, _ = _fleet(model, gpu, n2)
        speed2 = min(1.0, step.step_s / step2.step_s) if standby_fraction > 0 else 0.0
    except ValueError:  # the model does not fit the second cluster: it cannot carry the run
        lay2, step2, speed2 = None, None, 0.0
    from lib.kvcache.recompute_fetch import storage_tier

    share = storage_tier("network_storage", gpu).bandwidth
    cap = float(a.value("training.checkpoint_storage_tbps")) * 1e12
    restore = {k: rel.checkpoint_transfer_s(ckpt, max(1, m), share, cap) for k, m in (("second", n2), ("full", n_gpus))}
    reform = (a.value("training.restart_reschedule_minutes") + a.value("training.restart_init_minutes")) * 60.0
    detect = a.value("sre.site_detect_minutes") * 60.0
    decide = a.value("sre.dr_decide_hours") * 3600.0
    provision = a.value("sre.gpu_provision_days") * dr.DAY_S
    overhead = a.value("sre.standby_overhead")
    hot_every = max(write.interval_s, lag)
    strategies = {
        "no off-site copy": dr.Strategy("no off-site copy", None, False, 0.0),
        "cold": dr.Strategy("cold", max(dr.DAY_S, lag), False, 0.0),
        # a copy is of a local checkpoint: no more often than they are taken (nor than the link allows)
        "warm": dr.Strategy("warm", max(replicate_min * 60.0, hot_every), True, standby_fraction, overhead),
        "hot": dr.Strategy("hot", hot_every, True, 1.0, overhead),
    }
    results = {}
    for name, s in strategies.items():
        full = name == "hot"
        results[name] = dr.assess(
            s, n_gpus, run_days, outage_days, lag_s=0.0 if s.replicate_every_s is None else lag, detect_s=detect,
            decide_s=decide, stage_s=stage, provision_s=provision, restore_s=restore["full" if full else "second"],
            reform_s=reform, second_speed=1.0 if full else speed2)  # with no copy, the found GPUs restart the run
    p = min(1.0, site_loss_per_year * run_days / 365.0)
    return SimpleNamespace(results=results, p_loss=p, ckpt_bytes=ckpt, lag_s=lag, data_bytes=data, stage_s=stage,
                           tokens=tokens, n2=n2, speed2=speed2, layout=lay, layout2=lay2, step=step, step2=step2,
                           restore=restore, hot_every_s=hot_every, link=link)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.18, top=0.95)
    ax = fig.add_subplot()
    y = list(range(len(STRATEGIES)))
    a = SimpleNamespace(ax=ax)
    a.warm = ax.barh(y, [1.0] * len(y), color="C0", label="warm state over the run")
    a.risk = ax.barh(y, [1.0] * len(y), color="C3", label="expected loss (chance x loss)")
    ax.set_yticks(y, STRATEGIES, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GPU-days")
    ax.grid(True, axis="x")
    return a


def _draw(a, warm, risk) -> None:
    for i, (bw, br) in enumerate(zip(a.warm, a.risk, strict=True)):
        bw.set_width(warm[i])
        br.set_x(warm[i])
        br.set_width(risk[i])
    a.ax.set_xlim(0, max(w + r for w, r in zip(warm, risk, strict=True)) * 1.08 or 1.0)
    figures.legend(a.ax, [a.warm, a.risk], fontsize=7, loc="lower right")


_FIGURE = figures.LiveFigure(6.0, 2.6, _build, _draw)


@explorer(
    "sre.disaster_recovery",
    model=Choice(TRAINING_MODELS),
    gpu=Choice(TRAINING_GPUS),
    n_gpus=IntRange(512, 65536, log=True, label="GPUs of the run"),
    run_days=FloatRange(7.0, 180.0, 1.0, label="run length (days)"),
    link_gbps=FloatRange(10.0, 3200.0, 10.0, label="inter-site link (Gb/s)"),
    replicate_min=FloatRange(5.0, 1440.0, 5.0, label="warm: copy off-site every (minutes)"),
    standby_fraction=FloatRange(0.05, 1.0, 0.05, label="warm: standby cluster (fraction of the run's GPUs)"),
    outage_days=FloatRange(1.0, 180.0, 1.0, label="building out for (days)"),
    site_loss_per_year=FloatRange(0.001, 0.2, 0.001, label="chance of losing the building per year"),
)
def disaster_recovery_view(model: str, gpu: str, n_gpus: int, run_days: float, link_gbps: float, replicate_min: float,
                           standby_fraction: float, outage_days: float, site_loss_per_year: float) -> View:
    """N067: recovery point, recovery time and the GPU-day bill of four strategies."""
    d = dr_plan(model, gpu, n_gpus, run_days, link_gbps, replicate_min, standby_fraction, outage_days,
                site_loss_per_year)
    rows = [("checkpoint, off-site copy", f"{sig(d.ckpt_bytes / 1e12)} TB in {fmt_time(d.lag_s)}"),
            ("chance of losing the building during the run", fmt_pct(d.p_loss))]
    for name in STRATEGIES:
        r = d.results[name]
        rows.append((name, f"RPO {fmt_time(r.rpo_mean_s)}, RTO {fmt_time(r.rto.total_s)}, loss "
                           f"{fmt_int(r.loss_gpu_days)} GPU-days, warm {fmt_int(r.warm_gpu_days)}, expected "
                           f"{fmt_int(r.expected_gpu_days(d.p_loss))}"))
    best = min(STRATEGIES, key=lambda k: d.results[k].expected_gpu_days(d.p_loss))
    warm = [d.results[k].warm_gpu_days for k in STRATEGIES]
    risk = [d.p_loss * d.results[k].loss_gpu_days for k in STRATEGIES]
    fig = _FIGURE(warm, risk)
    caption = (f"GPU-days each strategy costs over a {sig(run_days)}-day run: its warm state (blue) plus a "
               f"{fmt_pct(d.p_loss)} chance of losing the building times what that loss costs (red); the cheapest "
               f"in expectation is {best}.")
    return View(f"Disaster recovery: {model} on {n_gpus:,} x {gpu}", rows, fig, caption=caption,
                values={f"expected_{k.replace(' ', '_').replace('-', '_')}": d.results[k].expected_gpu_days(d.p_loss)
                        for k in STRATEGIES})
