"""Explorers for rate limits: the token bucket (N069 token-bucket) and per-tenant token limits
(N061 token-rate-limiting).

Views call :mod:`lib.fleet.token_bucket` and :mod:`lib.fleet.rate_limits` only. One persistent
matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.fleet import token_bucket as tb
from lib.units import fmt_int, sig


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.trace = ax.plot([0.0], [0.0], color="C0", lw=1.8, drawstyle="steps-post", label="greedy client, admitted")[0]
    a.bound = ax.plot([0.0], [0.0], color="C3", ls="--", lw=1.2, label="bound: capacity + rate x t")[0]
    a.sustained = ax.plot([0.0], [0.0], color="0.4", ls=":", lw=1.2, label="rate x t (the sustained share)")[0]
    ax.set_xlabel("seconds since the bucket was full")
    ax.set_ylabel("requests admitted")
    ax.grid(True)
    return a


def _draw(a, ts, got, bound, sustained) -> None:
    a.trace.set_data(ts, got)
    a.bound.set_data(ts, bound)
    a.sustained.set_data(ts, sustained)
    a.ax.set_xlim(0, ts[-1])
    a.ax.set_ylim(0, max(bound[-1], got[-1]) * 1.05)
    figures.legend(a.ax, [a.trace, a.bound, a.sustained], loc="upper left")


_BUCKET = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.token_bucket",
    limit_per_min=FloatRange(1.0, 6000.0, 1.0, label="limit (requests per minute)"),
    burst_s=FloatRange(0.1, 120.0, 0.1, label="burst (seconds of rate)"),
    window_s=FloatRange(1.0, 600.0, 1.0, label="window (seconds)"),
)
def token_bucket(limit_per_min: float, burst_s: float, window_s: float) -> View:
    """N069: what a bucket with rate = limit / 60 and capacity = rate x burst_s admits to a greedy
    client over a window, against the bound capacity + rate x t."""
    rate = limit_per_min / 60.0
    capacity = rate * burst_s
    if capacity < 1.0:
        raise ValueError(f"a capacity of {sig(capacity)} tokens (rate {sig(rate)}/s x {sig(burst_s)} s) never holds "
                         "one whole request: raise the limit or the burst")
    # the ideal greedy client calls as each token is due; past 20,000 calls (the update budget) it polls 400 times
    poll = None if rate * window_s <= 20_000 else 400
    ts, got = (np.array(x) for x in tb.greedy_trace(capacity, rate, window_s, calls=poll))
    bound = capacity + rate * ts
    peak_1s = tb.admission_bound(capacity, rate, 1.0)
    rows = [("rate (sustained)", f"{sig(rate)} requests/s"),
            ("capacity (burst)", f"{sig(capacity)} requests"),
            ("most in any 1 s", f"{fmt_int(np.floor(peak_1s))} ({sig(peak_1s / rate)}x the rate)"),
            (f"most in any {sig(window_s)} s", fmt_int(np.floor(tb.admission_bound(capacity, rate, window_s)))),
            ("greedy client got" if poll is None else "client polling 400 times got", fmt_int(got[-1])),
            ("idle time that refills it", f"{sig(capacity / rate)} s")]
    caption = (f"A greedy client's admissions from a full bucket (steps) follow the bound capacity + rate x t "
               f"(dashed) from below: {fmt_int(got[-1])} requests in {sig(window_s)} s, of which the burst is "
               f"{fmt_int(np.floor(capacity))}; over long windows the rate dominates, over short ones the capacity."
               if got[-1] >= np.floor(capacity + rate * window_s + 1e-9) else
               f"A client polling every {sig(window_s / poll)} s from a full bucket (steps) gets {fmt_int(got[-1])} "
               f"requests in {sig(window_s)} s against the bound capacity + rate x t (dashed): between polls the "
               f"bucket sits at its cap of {sig(capacity)} and the refill is lost. Only a client calling as each "
               "token is due reaches the bound.")
    fig = _BUCKET(ts, got, bound, rate * ts)
    return View(f"Token bucket: {sig(rate)}/s, burst {sig(capacity)}", rows, fig, caption=caption,
                values={"rate": rate, "capacity": capacity, "greedy": float(got[-1]),
                        "bound": float(capacity + rate * window_s)})


def _build_sync(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.sync = ax.plot([1.0], [1.0], color="C3", lw=1.8, label="sync: worst over-admission, (G - 1)(C + r S)")[0]
    a.split = ax.plot([1.0], [1.0], color="C2", lw=1.4, ls="--", label="split buckets: a hot gateway's share, r / G")[0]
    a.dot = ax.plot([1.0], [1.0], "o", color="C3", ms=6, label="this sync interval")[0]
    figures.log_scale(ax, "x")
    ax.set_xlabel("sync interval S (seconds)")
    ax.set_ylabel("tokens, as minutes of the limit")
    ax.grid(True)
    return a


def _draw_sync(a, ss, over, split_share, s, over_s) -> None:
    a.sync.set_data(ss, over)
    a.split.set_data(ss, np.full_like(ss, split_share))
    a.dot.set_data([s], [over_s])
    a.ax.set_xlim(ss[0], ss[-1])
    a.ax.set_ylim(0, max(float(over[-1]), split_share) * 1.1 + 1e-9)
    figures.legend(a.ax, [a.sync, a.split, a.dot], loc="upper left")


_SYNC = figures.LiveFigure(6.0, 3.2, _build_sync, _draw_sync)


@explorer(
    "fleet.limit_sync",
    gateways=IntRange(1, 256, label="gateway replicas G"),
    sync_s=FloatRange(0.05, 60.0, 0.05, label="sync interval S (s)"),
    burst_s=FloatRange(1.0, 120.0, 1.0, label="bucket capacity (seconds of rate)"),
    requests_per_s=FloatRange(1.0, 10000.0, 1.0, label="tenant's requests/s"),
)
def limit_sync(gateways: int, sync_s: float, burst_s: float, requests_per_s: float) -> View:
    """N061: a tenant's token bucket shared by G gateways. Sync every S: the worst over-admission
    (G - 1)(C + r S) in minutes of the limit, against split buckets (no over-admission, but a tenant
    whose traffic lands on one gateway gets 1/G) and a central store (one round trip per request)."""
    from lib.fleet import rate_limits as rl
    from lib.registry import assumptions

    rate = 1.0 / 60.0  # one minute of the limit is one unit: the bound scales with the limit
    cap = rate * burst_s
    ss = np.logspace(np.log10(0.05), np.log10(60.0), 60)
    over = np.array([rl.sync_overshoot_bound(rate, cap, gateways, s) for s in ss])
    over_s = rl.sync_overshoot_bound(rate, cap, gateways, sync_s)
    rtt = assumptions.value("fleet.limiter_store_rtt_s")
    rows = [("sync: worst over-admission", f"{sig(over_s)} minutes of the limit"),
            ("sync: store messages", f"{sig(gateways / sync_s)} per second per tenant"),
            ("split: a hot gateway gets", f"{sig(100 / gateways)}% of the limit"),
            ("central: store round trips", f"{fmt_int(requests_per_s)} per second, {sig(rtt * 1e3)} ms each")]
    caption = (f"With {gateways} gateways syncing every {sig(sync_s)} s and a bucket of {sig(burst_s)} s, the sync "
               f"scheme can admit {sig(over_s)} extra minutes of the limit in one interval (red); "
               + ("most of it is the (G - 1) C term, so shrinking the interval helps little unless the capacity each "
                  "gateway may spend between syncs shrinks too. " if burst_s > sync_s else
                  "the interval's refill (G - 1) r S dominates, so a shorter interval cuts it. ")
               + "Split buckets never over-admit but cap a hot gateway at "
               f"{sig(100 / gateways)}% (green).")
    fig = _SYNC(ss, over, 1.0 / gateways, sync_s, over_s)
    return View(f"{gateways} gateways, sync every {sig(sync_s)} s", rows, fig, caption=caption,
                values={"over_min": over_s, "msgs_per_s": gateways / sync_s})
