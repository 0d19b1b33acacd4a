"""Explorers for the agent session platform (N065 agent-session-platform).

Views call :mod:`lib.fleet.agent_sessions` only (which prices recompute and the host-DRAM fetch with
:mod:`lib.kvcache.recompute_fetch`). One persistent figure.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_duration, fmt_int, fmt_pct, sig


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.hold = ax.plot([1], [1], color="C3", lw=2, label="hold the KV in HBM")[0]
    a.rec = ax.plot([1], [1], color="C1", lw=1.8, ls="--", label="drop it, recompute")[0]
    a.fetch = ax.plot([1], [1], color="C0", lw=1.6, ls=":", label="offload to DRAM (seconds added, no replica time)")[0]
    a.even = ax.axvline(1.0, color="0.5", lw=1, ls="-.")
    a.here = ax.plot([1], [1], "o", color="k", ms=6, label="this tool call")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("tool call (seconds)")
    ax.set_ylabel("replica-seconds per tool call")
    ax.grid(True)
    return a


def _draw(a, ts, hold, rec, fetch, even, t0, y0) -> None:
    a.hold.set_data(ts, hold)
    a.rec.set_data(ts, np.full_like(ts, rec))
    a.fetch.set_data(ts, np.full_like(ts, fetch))
    a.even.set_xdata([even, even])
    a.here.set_data([t0], [y0])
    a.ax.set_xlim(ts[0], ts[-1])
    lo = min(float(hold.min()), fetch, rec) / 2
    hi = max(float(hold.max()), rec) * 2
    a.ax.set_ylim(lo, hi)
    figures.legend(a.ax, [a.hold, a.rec, a.fetch, a.here], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.agent_kv",
    model=Choice(("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "a100-sxm", "b200"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    context=IntRange(100, 128000, label="context at the tool call (tokens)"),
    new_tokens=IntRange(0, 32000, label="tool result tokens"),
    tool_s=FloatRange(0.1, 3600.0, 0.1, label="tool call (s)"),
)
def agent_kv_view(model: str, gpu: str, tp: int, context: int, new_tokens: int, tool_s: float) -> View:
    """N065: keep a session's KV in HBM across a tool call, offload it to host DRAM, or recompute it:
    replica-seconds each costs against the tool's duration, and the break-even duration."""
    from lib.fleet import agent_sessions as ag
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    x = ag.kv_across_tool(dep, context, new_tokens, tool_s)
    even = x.recompute_s / x.pool_share
    ts = np.geomspace(0.1, 3600.0, 60)
    hold = x.pool_share * ts
    rows = [("KV of the context", fmt_bytes(x.kv_bytes, "GB")),
            ("share of the KV pool", fmt_pct(x.pool_share)),
            ("hold in HBM", f"{sig(x.hold_replica_s, 3)} replica-s"),
            ("recompute", f"{sig(x.recompute_s, 3)} replica-s, and as much latency"),
            ("offload to host DRAM", f"{fmt_duration(x.fetch_s)} added, no replica time"),
            ("holding wins below", fmt_duration(even)),
            ("cheapest here", x.cheapest)]
    caption = (f"Replica-seconds one {sig(tool_s)} s tool call costs at {fmt_int(x.context)} tokens on {dep.label}: holding "
               f"the KV grows with the call ({fmt_pct(x.pool_share)} of the pool per second) and passes the "
               f"{sig(x.recompute_s, 3)} s recompute at {fmt_duration(even)}; a host-DRAM offload adds "
               f"{fmt_duration(x.fetch_s)} and costs no replica time.")
    fig = _FIGURE(ts, hold, x.recompute_s, x.fetch_s, even, tool_s, max(x.hold_replica_s, 1e-9))
    return View("KV across a tool call: hold, offload or recompute", rows, fig, caption=caption,
                values={"hold": x.hold_replica_s, "recompute": x.recompute_s, "fetch": x.fetch_s, "even": even})


# ---- N047 code-sandbox-isolation: 50,000 sessions to hosts, per technology ------------------------------


def _build_sb(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.bar([0, 1, 2, 3], [1, 1, 1, 1], color=["C2", "C0", "C1", "C3"])
    ax.set_xticks([0, 1, 2, 3])
    ax.set_xticklabels(["container", "gVisor", "Firecracker", "full VM"])
    ax.set_ylabel("hosts")
    ax.grid(True, axis="y")
    a.labels = [ax.text(i, 1, "", ha="center", va="bottom", fontsize=7) for i in range(4)]
    return a


def _draw_sb(a, hosts, notes) -> None:
    for bar, h, lab, note in zip(a.bars, hosts, a.labels, notes, strict=True):
        bar.set_height(h)
        lab.set_position((bar.get_x() + bar.get_width() / 2, h))
        lab.set_text(note)
    a.ax.set_ylim(0, max(hosts) * 1.2)


_SB_FIGURE = figures.LiveFigure(6.0, 3.2, _build_sb, _draw_sb)


@explorer(
    "fleet.sandbox",
    sessions=IntRange(1, 1000000, label="concurrent sessions"),
    workload_mib=IntRange(16, 65536, label="workload memory per session (MiB)"),
    host_gib=IntRange(16, 8192, label="host memory (GiB)"),
    usable_pct=FloatRange(50.0, 100.0, 1.0, label="usable host memory (%)"),
    vcpus=FloatRange(0.05, 64.0, 0.05, label="vCPUs per session"),
    host_cores=IntRange(4, 1024, label="host cores"),
    overcommit=FloatRange(1.0, 32.0, 0.5, label="CPU overcommit"),
)
def sandbox_view(sessions: int, workload_mib: int, host_gib: int, usable_pct: float, vcpus: float, host_cores: int,
                 overcommit: float) -> View:
    """N047: hosts for ``sessions`` sandboxes with each isolation technology, and what binds."""
    from lib.fleet import sandbox as sb

    hosts, notes, rows = [], [], []
    for name in sb.TECHS:
        t = sb.tech(name)
        h = sb.hosts_for_sessions(sessions, t, workload_mib * sb.MIB, host_gib * sb.GIB, usable_pct / 100, vcpus,
                                  host_cores, overcommit)
        hosts.append(h["hosts"])
        notes.append(f"{fmt_int(h['hosts'])} ({h['binds']})")
        rows.append((name, f"{fmt_int(h['hosts'])} hosts, {fmt_int(h['per_host'])} per host ({h['binds']} binds), "
                           f"start {fmt_duration(t.start_s)}, +{sig(t.overhead_bytes / sb.MIB, 3)} MiB"))
    caption = (f"Hosts for {fmt_int(sessions)} sandboxes of {fmt_int(workload_mib)} MiB and {sig(vcpus)} vCPUs on "
               f"{fmt_int(host_gib)} GiB, {host_cores}-core hosts: container {fmt_int(hosts[0])}, gVisor {fmt_int(hosts[1])}, "
               f"Firecracker {fmt_int(hosts[2])}, full VM {fmt_int(hosts[3])}.")
    fig = _SB_FIGURE(hosts, notes)
    return View("Sessions to hosts, by isolation technology", rows, fig, caption=caption,
                values={name: float(h) for name, h in zip(sb.TECHS, hosts, strict=True)})
