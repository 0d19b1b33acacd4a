"""Explorers for tenant quotas: a request's share of a replica's KV pool (I068 multi-tenant-quotas) and
the fair-share ordering of a shared cluster (N046 gpu-quota-policy, N066 research-cluster-fair-share).

Views call :mod:`lib.fleet.tenancy` and :mod:`lib.fleet.quotas` only. One persistent matplotlib figure
per explorer, updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_pct, sig

_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "llama-3.1-405b", "mixtral-8x7b")
_GPUS = ("h100-sxm", "h200", "b200", "a100-sxm")


def _build_kv(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.share = ax.plot([1.0], [0.1], color="C0", lw=1.8, label="one request's share of the KV pool")[0]
    a.cap = ax.axhline(0.25, color="C3", ls="--", lw=1.2, label="the tenant's KV share cap")
    a.dot = ax.plot([1.0], [0.1], "o", color="C0", ms=6, label="this prompt")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("prompt + output tokens")
    ax.set_ylabel("share of the replica's KV pool")
    ax.grid(True)
    return a


def _draw_kv(a, xs, shares, cap, x, share) -> None:
    a.share.set_data(xs, shares)
    a.cap.set_ydata([cap, cap])
    a.dot.set_data([x], [share])
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(min(float(shares[0]), cap) / 2, max(1.5, 1.5 * share))
    figures.legend(a.ax, [a.share, a.cap, a.dot], loc="upper left")


_KV = figures.LiveFigure(6.0, 3.2, _build_kv, _draw_kv)


@explorer(
    "fleet.kv_share",
    model=Choice(_MODELS, label="model"),
    gpu=Choice(_GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    weight_dtype=Choice(("bf16", "fp8"), label="weights"),
    kv_dtype=Choice(("bf16", "fp8"), label="KV cache"),
    prompt_k=IntRange(1, 128, label="prompt (thousand tokens)"),
    kv_cap_pct=IntRange(5, 100, label="tenant's KV cap (%)"),
)
def kv_share(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str, prompt_k: int,
             kv_cap_pct: int) -> View:
    """I068: one request's peak KV against the replica's pool (``dep.budget.token_capacity``), and how many
    such requests one tenant may hold under a KV share cap."""
    from lib.perf.deployment import deployment
    from lib.perf.memory import kv_bytes_per_sequence

    dep = deployment(model, gpu, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    pool = int(dep.budget.token_capacity)
    if pool < 1:
        raise ValueError(f"{dep.label} leaves no KV pool: use more GPUs or FP8 weights")
    n = prompt_k * 1000 + 500
    dep.mdl.check_context(n, "prompt + 500 output tokens")
    cap = kv_cap_pct / 100
    share = n / pool
    xs = np.logspace(3, np.log10(max(n, 128_500)), 60)
    shares = xs / pool
    held = int(np.floor(cap * pool / n + 1e-9))
    rows = [("KV pool of the replica", f"{fmt_int(pool)} tokens ({fmt_bytes(pool * dep.mdl.kv_bytes_per_token(kv_dtype), 'GB')})"),
            ("this request's KV", fmt_bytes(kv_bytes_per_sequence(dep.mdl, n, kv_dtype), "GB")),
            ("its share of the pool", fmt_pct(share)),
            ("such requests per replica", sig(pool / n)),
            (f"held at once under a {kv_cap_pct}% cap", fmt_int(held))]
    caption = (f"On {dep.label}, a request of {fmt_int(n)} tokens holds {fmt_pct(share)} of the KV pool "
               f"(dot); the share grows linearly with length, and a {kv_cap_pct}% cap (dashed) lets one tenant "
               f"hold {fmt_int(held)} of them at once.")
    fig = _KV(xs, shares, cap, n, share)
    return View(f"KV share: {fmt_int(n)} tokens on {dep.label}", rows, fig, caption=caption,
                values={"share": share, "pool": pool, "held": held})


def _build_fq(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.fifo = ax.plot([1.0], [0.5], color="C3", lw=1.6, drawstyle="steps-post", label="one FIFO queue")[0]
    a.sfq = ax.plot([1.0], [0.5], color="C0", lw=1.8, drawstyle="steps-post", label="weighted fair queue (SFQ)")[0]
    a.gps = ax.plot([1.0], [0.5], color="0.4", lw=1.2, ls=":", drawstyle="steps-post", label="fluid ideal (GPS)")[0]
    a.slo = ax.axvline(1.0, color="C2", ls="--", lw=1.0, label="TTFT target")
    figures.log_scale(ax, "x")
    ax.set_xlabel("light tenant's time to first token (s)")
    ax.set_ylabel("fraction of its requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw_fq(a, curves, slo) -> None:
    lo, hi = math.inf, 0.0
    for art, xs in ((a.fifo, curves["fifo"]), (a.sfq, curves["sfq"]), (a.gps, curves["gps"])):
        xs = np.sort(xs)
        art.set_data(xs, np.arange(1, len(xs) + 1) / len(xs))
        lo, hi = min(lo, float(xs[0])), max(hi, float(xs[-1]))
    a.slo.set_xdata([slo, slo])
    a.ax.set_xlim(min(lo, slo) / 1.5, max(hi, slo) * 1.5)
    figures.legend(a.ax, [a.fifo, a.sfq, a.gps, a.slo], loc="lower right")


_FQ = figures.LiveFigure(6.0, 3.2, _build_fq, _draw_fq)


@explorer(
    "fleet.fair_queue",
    model=Choice(_MODELS, label="model"),
    gpu=Choice(_GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="tensor parallel"),
    heavy_prompt_k=IntRange(1, 128, label="heavy prompt (thousand tokens)"),
    heavy_burst=IntRange(1, 16, label="heavy prompts at once"),
    light_rate=FloatRange(0.5, 20.0, 0.5, label="light requests/s"),
    heavy_weight=FloatRange(0.25, 4.0, 0.25, label="heavy tenant's weight"),
    ttft_slo_s=FloatRange(0.1, 10.0, 0.1, label="TTFT target (s)"),
)
def fair_queue(model: str, gpu: str, tp: int, heavy_prompt_k: int, heavy_burst: int, light_rate: float,
               heavy_weight: float, ttft_slo_s: float) -> View:
    """W05 / I068: a light tenant's TTFT (1,000-token prompts, 30 s of Poisson arrivals) behind a heavy
    tenant's burst, with prefill chunks ordered FIFO, by a weighted fair queue, and by the fluid ideal."""
    from lib.fleet import tenancy as tn
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    dep.mdl.check_context(heavy_prompt_k * 1000, "heavy prompt")
    run = tn.fairness_run(dep, heavy_prompt_k * 1000, heavy_burst, 1000, light_rate, 30.0, 0,
                          {"heavy": heavy_weight, "light": 1.0})
    tt = run["ttft"]
    rows = [(f"{k} p50 / p99", f"{sig(np.percentile(tt[k], 50))} s / {sig(np.percentile(tt[k], 99))} s")
            for k in ("fifo", "sfq", "gps")]
    rows.append(("light requests within target", f"FIFO {fmt_pct(float(np.mean(tt['fifo'] <= ttft_slo_s)))}, "
                                                 f"fair queue {fmt_pct(float(np.mean(tt['sfq'] <= ttft_slo_s)))}"))
    caption = (f"TTFT of the light tenant's {fmt_int(len(tt['sfq']))} requests behind {heavy_burst} prompts of "
               f"{heavy_prompt_k}K tokens on {dep.label}: one FIFO queue (red) puts them behind the whole burst "
               f"(p99 {sig(np.percentile(tt['fifo'], 99))} s); a weighted fair queue (blue) interleaves prefill chunks "
               f"(p99 {sig(np.percentile(tt['sfq'], 99))} s), near the fluid ideal (dotted).")
    fig = _FQ({k: tt[k] for k in ("fifo", "sfq", "gps")}, ttft_slo_s)
    return View(f"Fair queuing on {dep.label}", rows, fig, caption=caption,
                values={"fifo_p99": float(np.percentile(tt["fifo"], 99)), "sfq_p99": float(np.percentile(tt["sfq"], 99))})


def _build_pool(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.static = ax.plot([1.0], [0.5], color="C3", lw=1.8, label="static quotas, each sized for its own peak")[0]
    a.pooled = ax.plot([1.0], [0.5], color="C0", lw=1.8, label="one pool sized for the same peak of the total")[0]
    a.dot = ax.plot([1.0], [0.5], "o", color="k", ms=5, label="this many teams")[0]
    figures.log_scale(ax, "x", base=2)
    ax.set_xlabel("teams sharing the cluster")
    ax.set_ylabel("mean utilization of the GPUs bought")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw_pool(a, ks, st, po, k, pk) -> None:
    a.static.set_data(ks, st)
    a.pooled.set_data(ks, po)
    a.dot.set_data([k], [pk])
    a.ax.set_xlim(ks[0], ks[-1])
    figures.legend(a.ax, [a.static, a.pooled, a.dot], loc="lower right")


_POOL = figures.LiveFigure(6.0, 3.2, _build_pool, _draw_pool)


@explorer(
    "fleet.pooling",
    teams=IntRange(1, 64, label="teams"),
    cv=FloatRange(0.05, 2.0, 0.05, label="demand std / mean (per team)"),
    z=FloatRange(0.0, 3.0, 0.05, label="peak sized at mean + z std"),
)
def pooling_view(teams: int, cv: float, z: float) -> View:
    """N046 / N066: equal teams with independent demand: utilization when each team's quota is sized for
    its own mean + z std, against one pool sized for the same z on the total."""
    from lib.fleet import quotas as q

    ks = np.unique(np.round(np.logspace(0, np.log10(64), 40)).astype(int))
    st = np.array([q.pooling([1.0] * int(k), [cv] * int(k), z).static_utilization for k in ks])
    po = np.array([q.pooling([1.0] * int(k), [cv] * int(k), z).pooled_utilization for k in ks])
    p = q.pooling([1.0] * teams, [cv] * teams, z)
    rows = [("static quotas: utilization", fmt_pct(p.static_utilization)),
            ("one pool: utilization", fmt_pct(p.pooled_utilization)),
            ("GPUs pooling saves", fmt_pct(p.saved))]
    caption = (f"{teams} equal teams with demand std {sig(cv)} x mean, sized at mean + {sig(z)} std: static quotas run at "
               f"{fmt_pct(p.static_utilization)} whatever the team count (red), one pool at "
               f"{fmt_pct(p.pooled_utilization)} (blue)"
               + (", climbing with the team count as independent peaks stop coinciding." if p.saved > 1e-9 else
                  ": no gain here (one team, or no headroom above the mean)."))
    fig = _POOL(ks, st, po, teams, p.pooled_utilization)
    return View(f"Pooling {teams} teams", rows, fig, caption=caption,
                values={"static": p.static_utilization, "pooled": p.pooled_utilization})


def decay_curve(usage_share: float, fair_share: float, half_life_days: float, days: np.ndarray) -> np.ndarray:
    """The fair-share factor 2^(-U/S) of a team that stops after a burst left it at ``usage_share`` of the
    decayed usage, the others' usage steady (the model of :func:`lib.fleet.quotas.recovery_days`)."""
    x = usage_share * 2.0 ** (-days / half_life_days)
    return 2.0 ** (-(x / (x + 1 - usage_share)) / fair_share)


def _build_decay(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve = ax.plot([0.0], [0.5], color="C0", lw=1.8, label="fair-share factor with decay")[0]
    a.half = ax.axhline(0.5, color="0.4", ls=":", lw=1.0, label="0.5: usage equal to the share")
    a.dot = ax.plot([0.0], [0.5], "o", color="C3", ms=6, label="back to its share")[0]
    ax.set_xlabel("days since the burst ended")
    ax.set_ylabel("fair-share factor 2^(-U/S)")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw_decay(a, ts, fs, t_rec) -> None:
    a.curve.set_data(ts, fs)
    a.dot.set_data([t_rec], [0.5])
    a.ax.set_xlim(0, ts[-1])
    figures.legend(a.ax, [a.curve, a.half, a.dot], loc="lower right")


_DECAY = figures.LiveFigure(6.0, 3.2, _build_decay, _draw_decay)


@explorer(
    "fleet.decay",
    usage_pct=IntRange(1, 99, label="team's share of decayed usage after its burst (%)"),
    share_pct=IntRange(1, 99, label="team's share of the shares (%)"),
    half_life_days=FloatRange(0.5, 60.0, 0.5, label="usage half-life (days)"),
)
def decay_view(usage_pct: int, share_pct: int, half_life_days: float) -> View:
    """N066: how fast a burst stops costing a team priority once it stops, for a usage half-life."""
    from lib.fleet import quotas as q

    u, s = usage_pct / 100, share_pct / 100
    t_rec = q.recovery_days(u, s, half_life_days)
    ts = np.linspace(0.0, max(4 * half_life_days, 1.5 * t_rec, 1.0), 120)
    fs = decay_curve(u, s, half_life_days, ts)
    rows = [("factor right after the burst", sig(float(fs[0]))),
            ("days until back to its share", sig(t_rec)),
            ("usage weight after one half-life", "50%")]
    caption = (f"A team at {usage_pct}% of the decayed usage with a {share_pct}% share starts at a factor of "
               f"{sig(float(fs[0]))}; "
               + (f"with a {sig(half_life_days)}-day half-life it is back to 0.5 (its share) after {sig(t_rec)} days "
                  "of not running (red dot)." if t_rec > 0 else
                  "it is already below its share, so it borrows ahead of the teams above theirs."))
    fig = _DECAY(ts, fs, t_rec)
    return View(f"Decay: half-life {sig(half_life_days)} days", rows, fig, caption=caption,
                values={"recovery_days": t_rec, "f0": float(fs[0])})
