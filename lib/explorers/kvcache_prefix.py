"""Explorers for the prefix-caching questions of the KV-cache section: the radix cache stepped
operation by operation (I090), hit rates and savings by workload (N027), chained hashes under
collisions (I092), head- vs tail-first eviction and stranded bytes (I014), and recompute vs
fetch by storage tier (I013)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, Text, View, explorer
from lib.kvcache import block_hash as bh
from lib.kvcache import (
    chain_hashes,
    cyclic_prefix_workload,
    cyclic_steady_state,
    shared_prefix_workload,
    simulate,
)
from lib.kvcache import prefix_hits as ph
from lib.kvcache import radix_scenarios as rs
from lib.kvcache import recompute_fetch as rf
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import GB, fmt_bandwidth, fmt_bytes, fmt_count, fmt_int, fmt_pct, fmt_time, sig

MODELS = tuple(models.model_names())
GPUS = tuple(hardware.gpu_names())
TPS = (1, 2, 4, 8)
KV_DTYPES = ("bf16", "fp8")
NBSP = "\u00a0"
MAX_SLOTS = 64  # the radix explorer's largest pool


def _bw(x: float) -> str:
    return "none suffices" if not math.isfinite(x) else fmt_bandwidth(x)


# ---- I090 -------------------------------------------------------------------------------------


#: Typed radix programs the fuzz tests and the sweep draw (any text in the parser's syntax runs).
RADIX_PROGRAMS = (
    "",
    "insert 1 2 3 4 5; lock 1; insert 1 2 3 7 8; evict 10; unlock 1; evict 10",
    "insert 1 2; lock 1; insert 1 2 3; lock 3; unlock 1; unlock 1",
    "insert 1 2 3 4 5 6; insert 1 2 3 7 8; match 1 2 9; insert 4 4",
)


@explorer(
    "kvcache.radix_steps",
    scenario=Choice(rs.RADIX_SCENARIOS),
    step=IntRange(0, 64, label="step"),
    num_slots=IntRange(4, MAX_SLOTS, label="KV slots in the pool"),
    program=Text(RADIX_PROGRAMS, max_chars=2000, label="program (typed ops; empty: the scenario)"),
)
def radix_steps(scenario: str, step: int, num_slots: int, program: str = "") -> View:
    """I090: replay a scripted scenario, or a typed program (:func:`rs.parse_radix_program`), on a
    RadixCache and show the tree after ``step`` ops."""
    if program.strip():
        description, ops = "typed program", rs.parse_radix_program(program)
    else:
        description, ops = rs.radix_scenario(scenario)
    steps = rs.replay_radix(ops, num_slots, upto=step)
    last = steps[-1]
    rows = [
        ("scenario", description),
        ("step", f"{last.index} of {len(ops)}" + (" (last)" if step > len(ops) else "")),
        ("operation", last.op),
        ("result", last.result),
        (
            "cached / free / pinned tokens",
            f"{last.num_cached} / {last.num_free} / {last.num_pinned}",
        ),
    ]
    for line in last.tree:
        rows.append(("tree", line.replace(" ", NBSP)))
    fig = _SLOTS_FIGURE(last.slot_state)
    caption = (f"Each cell is one KV slot of the pool after step {last.index}: {last.num_cached} hold cached tokens "
               f"({last.num_pinned} of them pinned by a lock, which eviction must skip) and {last.num_free} are free.")
    return View(
        f"RadixCache, scenario {scenario!r}, after step {last.index}",
        rows,
        fig,
        caption=caption,
        values={
            "num_cached": last.num_cached,
            "num_free": last.num_free,
            "num_pinned": last.num_pinned,
        },
    )


# ---- N027 -------------------------------------------------------------------------------------

_SCALE = 32  # trace tokens per simulated symbol in the explorer (hit rates are scale-free)


@explorer(
    "kvcache.prefix_hit_rates",
    workload=Choice(ph.WORKLOADS),
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice(TPS, label="tensor parallel"),
    system_prompt_tokens=IntRange(0, 8192, label="system prompt tokens"),
    capacity_pct=FloatRange(0.05, 1.0, 0.05, label="cache capacity (fraction of unique tokens)"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="prefill MFU"),
)
def prefix_hit_rates(
    workload: str,
    model: str,
    gpu: str,
    tp: int,
    system_prompt_tokens: int,
    capacity_pct: float,
    mfu: float,
) -> View:
    """N027: hit rate of four workloads through a RadixCache, and what the hits save."""
    m, g = models.model(model), hardware.gpu(gpu)
    sys_units = -(-system_prompt_tokens // _SCALE)
    turn_units = 256 // _SCALE
    rates, chosen = {}, None
    for kind in ph.WORKLOADS:
        trace = ph.workload_trace(
            kind,
            num_requests=48,
            system_prompt_tokens=sys_units,
            turn_tokens=turn_units,
            num_turns=4,
            vocab_size=1_000_000,
            seed=0,
        )
        unbounded = ph.simulate_radix_hits(trace, token_scale=_SCALE)
        slots = max(
            max(len(r) for r in trace), int(capacity_pct * unbounded.unique_tokens / _SCALE)
        )
        bounded = ph.simulate_radix_hits(trace, slots, token_scale=_SCALE)
        rates[kind] = bounded.hit_rate
        if kind == workload:
            chosen, chosen_unbounded = bounded, unbounded
    sav = ph.prefill_savings(m, chosen.prompt_tokens, chosen.hit_tokens)
    dep = Deployment(m, g, tp=tp)
    saved_s = sum(  # each hit's prefix recompute, riding with the request's new tokens (prefill_time)
        rf.recompute_time_s(dep, min(h, n - 1), suffix_len=n - min(h, n - 1), mfu=mfu)
        for n, h in zip(chosen.prompt_tokens, chosen.hit_tokens, strict=True)
        if n > 1 and h > 0
    )
    kv = m.kv_bytes_per_token("bf16")
    rows = [
        ("requests / prompt tokens", f"48 / {fmt_count(chosen.total_tokens)}"),
        ("hit rate (unbounded cache)", fmt_pct(chosen_unbounded.hit_rate)),
        ("hit rate at this capacity", fmt_pct(chosen.hit_rate)),
        ("evicted tokens", fmt_count(chosen.evicted_tokens)),
        ("KV without sharing (all prompts)", fmt_bytes(chosen.total_tokens * kv)),
        ("KV in the radix tree (unique)", fmt_bytes(chosen_unbounded.unique_tokens * kv)),
        ("prefill FLOPs saved", fmt_pct(sav.fraction_saved)),
        ("prefill time saved on this replica", fmt_time(saved_s)),
        (
            "radix nodes vs cached tokens",
            f"{chosen_unbounded.num_nodes} vs {fmt_count(chosen_unbounded.unique_tokens)}",
        ),
    ]
    fig = _HITS_FIGURE(rates, workload)
    caption = (f"Token hit rate of each workload through the same RadixCache, sized to {fmt_pct(capacity_pct)} of its "
               f"unique tokens; the highlighted bar, {workload.replace('_', ' ')}, hits {fmt_pct(chosen.hit_rate)}, "
               f"which saves {fmt_pct(sav.fraction_saved)} of its prefill FLOPs.")
    return View(
        f"{workload} through a RadixCache at {fmt_pct(capacity_pct)} capacity ({m.key}, {g.key} x{tp})",
        rows,
        fig,
        caption=caption,
        note=f"Traces simulated at {_SCALE} tokens per symbol (48 requests, 256 tokens per turn).",
        values={
            "hit_rate": chosen.hit_rate,
            "hit_rate_unbounded": chosen_unbounded.hit_rate,
            "fraction_saved": sav.fraction_saved,
            **{f"rate_{k}": v for k, v in rates.items()},
        },
    )


# ---- I092 -------------------------------------------------------------------------------------


@explorer(
    "kvcache.chained_hash_collisions",
    hash_bits=IntRange(4, 64, label="hash bits"),
    verify_on_hit=Choice((True, False), label="verify on hit"),
    eviction_order=Choice(("tail_first", "head_first"), label="eviction order"),
    num_blocks=IntRange(24, 256, label="blocks in the pool"),
    num_requests=IntRange(10, 120, label="requests"),
    seed=IntRange(0, 99, label="seed"),
)
def chained_hash_collisions(
    hash_bits: int,
    verify_on_hit: bool,
    eviction_order: str,
    num_blocks: int,
    num_requests: int,
    seed: int,
) -> View:
    """I092: a chained-hash block cache with a (possibly weak) hash, verified or not."""
    work = shared_prefix_workload([8, 4, 6], num_requests, 16, suffix_blocks=2, seed=seed)
    hash_fn = bh.truncated_hash(hash_bits)
    runs = {
        v: bh.run_block_cache(
            work.requests,
            num_blocks=num_blocks,
            block_size=16,
            hash_fn=hash_fn,
            verify_on_hit=v,
            eviction_order=eviction_order,
            running=2,
        )
        for v in (True, False)
    }
    run = runs[verify_on_hit]
    other = runs[not verify_on_hit]
    distinct = len({b for r in work.requests for b in chain_hashes(r, 16)})
    rows = [
        ("distinct blocks named by the trace", f"{distinct}"),
        (
            "birthday P(some collision)",
            fmt_pct(bh.birthday_collision_probability(distinct, hash_bits)),
        ),
        ("hit rate", fmt_pct(run.hit_rate)),
        ("requests handed wrong KV", f"{run.wrong_kv_requests} of {num_requests}"),
        ("max stranded blocks", f"{run.max_stranded_blocks}"),
        (
            f"with verify_on_hit={not verify_on_hit}",
            f"hit {fmt_pct(other.hit_rate)}, wrong KV {other.wrong_kv_requests}",
        ),
    ]
    if run.first_violation:
        rows.append(("first wrong hit", run.first_violation))
    fig = _COLLISIONS_FIGURE(runs[True].wrong_kv_requests, runs[False].wrong_kv_requests)
    caption = (f"How many of {num_requests} requests get another prefix's KV with a {hash_bits}-bit chained hash: "
               f"{runs[True].wrong_kv_requests} when each hit is checked against the stored tokens, "
               f"{runs[False].wrong_kv_requests} when it is not (birthday odds of any collision: "
               f"{fmt_pct(bh.birthday_collision_probability(distinct, hash_bits))}).")
    return View(
        f"Chained hashes, {hash_bits}-bit, verify_on_hit={verify_on_hit}, {eviction_order}",
        rows,
        fig,
        caption=caption,
        values={
            "wrong": run.wrong_kv_requests,
            "hit_rate": run.hit_rate,
            "wrong_verified": runs[True].wrong_kv_requests,
            "wrong_unverified": runs[False].wrong_kv_requests,
        },
    )


# ---- I014 -------------------------------------------------------------------------------------


@explorer(
    "kvcache.eviction_stranding",
    model=Choice(MODELS),
    kv_dtype=Choice(KV_DTYPES, label="KV dtype"),
    block_size=Choice((16, 32, 64), label="tokens per block"),
    num_prefixes=IntRange(2, 8, label="prefixes P"),
    prefix_blocks=IntRange(1, 48, label="blocks per prefix n"),
    capacity_blocks=IntRange(1, 384, label="cache capacity C (blocks)"),
)
def eviction_stranding(
    model: str,
    kv_dtype: str,
    block_size: int,
    num_prefixes: int,
    prefix_blocks: int,
    capacity_blocks: int,
) -> View:
    """I014: cyclic prefixes through a block cache, head-first vs tail-first, against the closed form."""
    m = models.model(model)
    block_bytes = int(bh.kv_block_bytes(m, block_size, kv_dtype))
    work = cyclic_prefix_workload(num_prefixes, prefix_blocks, 2 * num_prefixes + 2, block_size)
    rows, values = [("KV bytes per block", fmt_bytes(block_bytes, "MB"))], {}
    stranded = {}
    for policy in ("head_first", "tail_first"):
        sim = simulate(policy, capacity_blocks, work, block_bytes)
        closed = cyclic_steady_state(
            policy, capacity_blocks, num_prefixes, prefix_blocks, block_bytes
        )
        skip = closed.warmup_requests
        rows.append(
            (
                f"{policy}: hit rate sim / closed form",
                f"{fmt_pct(sim.hit_rate(skip))} / {fmt_pct(closed.hit_rate)}",
            )
        )
        rows.append(
            (
                f"{policy}: stranded sim / closed form",
                f"{fmt_bytes(sim.stranded_bytes[-1])} / {fmt_bytes(closed.stranded_bytes)}",
            )
        )
        stranded[policy] = np.array(sim.stranded_bytes) / GB
        values[f"{policy}_stranded"] = sim.stranded_bytes[-1]
        values[f"{policy}_closed"] = closed.stranded_bytes
    fig = _STRANDING_FIGURE(stranded)
    caption = (f"Stranded KV (blocks still cached but unreachable, because an earlier block of their chain was evicted) "
               f"as {num_prefixes} prefixes of {prefix_blocks} blocks cycle through {capacity_blocks} blocks: head-first "
               f"ends at {fmt_bytes(values['head_first_stranded'])}, tail-first at "
               f"{fmt_bytes(values['tail_first_stranded'])}.")
    return View(
        f"{num_prefixes} prefixes of {prefix_blocks} blocks, capacity {capacity_blocks} blocks ({m.key})",
        rows,
        fig,
        note="Closed form: head-first strands (C mod n) blocks and never hits; tail-first strands 0 and hits clip(C-(P-1)n, 0, n)/n.",
        caption=caption,
        values=values,
    )


# ---- I013 -------------------------------------------------------------------------------------


@explorer(
    "kvcache.recompute_vs_fetch",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice(TPS, label="tensor parallel"),
    prefix_tokens=IntRange(16, 131072, label="prefix tokens", log=True),
    suffix_tokens=IntRange(0, 4096, label="new tokens in the same pass"),
    mfu=FloatRange(0.1, 1.0, 0.05, label="prefill MFU"),
    kv_dtype=Choice(KV_DTYPES, label="KV dtype"),
)
def recompute_vs_fetch(
    model: str, gpu: str, tp: int, prefix_tokens: int, suffix_tokens: int, mfu: float, kv_dtype: str
) -> View:
    """I013: recompute a prefix or fetch its KV from each storage tier; break-even bandwidth."""
    m, g = models.model(model), hardware.gpu(gpu)
    dep = Deployment(m, g, tp=tp, kv_dtype=kv_dtype)
    tiers = rf.available_tiers(g)
    kw = dict(suffix_len=suffix_tokens, mfu=mfu)
    rec = rf.recompute_time_s(dep, prefix_tokens, **kw)
    rows = [
        ("recompute FLOPs per KV byte", sig(rf.flops_per_kv_byte(m, prefix_tokens, kv_dtype))),
        ("recompute time (prefill_time)", fmt_time(rec) if rec > 0 else "0 (rides in a memory-bound pass)"),
        (
            "break-even bandwidth, no latency",
            _bw(rf.breakeven_bandwidth(dep, prefix_tokens, **kw)),
        ),
    ]
    values = {"recompute_s": rec}
    for t in tiers:
        r = rf.compare_recompute_fetch(dep, prefix_tokens, t, **kw)
        verdict = (
            f"fetch wins {sig(r.speedup, 2)}x"
            if r.winner == "fetch"
            else ("recompute wins" + (f" {sig(1 / r.speedup, 2)}x" if r.speedup > 0 else ""))
        )
        rows.append(
            (f"{t.key} ({fmt_bandwidth(t.bandwidth)}/GPU)", f"{fmt_time(r.fetch_s)}: {verdict}")
        )
        values[f"fetch_{t.key}"] = r.fetch_s
    grid = np.unique(np.geomspace(16, 131072, 28).astype(int))
    rec_ms = [rf.recompute_time_s(dep, int(p), **kw) * 1e3 for p in grid]
    fetch_ms = {t.key: [rf.fetch_time_s(m, int(p), t, tp=tp, kv_dtype=kv_dtype) * 1e3 for p in grid] for t in tiers}
    fig = _FETCH_FIGURE(grid, rec_ms, fetch_ms, prefix_tokens)
    options = {"recomputing": rec, **{f"fetching from {t.key.replace('_', ' ')}": values[f"fetch_{t.key}"] for t in tiers}}
    fastest = min(options, key=options.get)
    verdict = ("recomputing is free: it rides in a memory-bound pass" if rec <= 0 else
               f"{fastest} is fastest, {fmt_time(options[fastest])}")
    caption = (f"Recomputing the prefix (black) against fetching its KV from each storage tier; where a tier's line is "
               f"below the black one, fetching wins. At {fmt_int(prefix_tokens)} prefix tokens (dotted) {verdict}.")
    return View(
        f"Recompute vs fetch: {m.key} on {g.key} x{tp}, {prefix_tokens} prefix tokens",
        rows,
        fig,
        caption=caption,
        values=values,
    )


# ---- figures (one persistent matplotlib figure per explorer, lib.book.figures) -----------------


def _margins(fig, bottom: float = 0.18) -> None:
    fig.subplots_adjust(bottom=bottom, left=0.11, right=0.97, top=0.95)


_SLOT_COLORS = {"free": "#dddddd", "cached": "#6baed6", "pinned": "#e6550d"}


def _slots_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Patch, Rectangle

    _margins(fig, bottom=0.45)
    fig.subplots_adjust(right=0.78)
    ax = fig.add_subplot()
    slots = [ax.add_patch(Rectangle((i, 0), 0.92, 1, lw=0)) for i in range(MAX_SLOTS)]
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("KV slot")
    kinds = [Patch(color=c, label=state) for state, c in _SLOT_COLORS.items()]
    ax.legend(handles=kinds, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return SimpleNamespace(ax=ax, slots=slots)


def _slots_draw(a: SimpleNamespace, slot_state: list[str]) -> None:
    for i, rect in enumerate(a.slots):
        rect.set_visible(i < len(slot_state))
        if i < len(slot_state):
            rect.set_facecolor(_SLOT_COLORS[slot_state[i]])
    a.ax.set_xlim(0, len(slot_state))


_SLOTS_FIGURE = figures.LiveFigure(6.0, 1.0, _slots_build, _slots_draw)


def _hits_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Patch

    _margins(fig)
    ax = fig.add_subplot()
    n = len(ph.WORKLOADS)
    bars = ax.bar(range(n), np.zeros(n))
    ax.set_xticks(range(n), [k.replace("_", "\n") for k in ph.WORKLOADS], fontsize=8)
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 100)
    kinds = [Patch(color="#e6550d", label="this workload"), Patch(color="#6baed6", label="the others")]
    ax.legend(handles=kinds, fontsize=7, loc="upper left")
    return SimpleNamespace(ax=ax, bars=bars)


def _hits_draw(a: SimpleNamespace, rates: dict, workload: str) -> None:
    for bar, kind in zip(a.bars, ph.WORKLOADS, strict=True):
        bar.set_height(100 * rates[kind])
        bar.set_color("#e6550d" if kind == workload else "#6baed6")


_HITS_FIGURE = figures.LiveFigure(6.0, 2.8, _hits_build, _hits_draw)


def _collisions_build(fig) -> SimpleNamespace:
    _margins(fig)
    ax = fig.add_subplot()
    bars = ax.bar([0, 1], [0, 0], color=["#31a354", "#de2d26"])
    ax.set_xticks([0, 1], ["verified", "unverified"])
    ax.set_ylabel("requests given wrong KV")
    return SimpleNamespace(ax=ax, bars=bars)


def _collisions_draw(a: SimpleNamespace, wrong_verified: int, wrong_unverified: int) -> None:
    for bar, h in zip(a.bars, (wrong_verified, wrong_unverified), strict=True):
        bar.set_height(h)
    a.ax.set_ylim(0, 1.05 * max(wrong_verified, wrong_unverified, 1))


_COLLISIONS_FIGURE = figures.LiveFigure(6.0, 2.8, _collisions_build, _collisions_draw)


def _stranding_build(fig) -> SimpleNamespace:
    _margins(fig)
    ax = fig.add_subplot()
    lines = {policy: ax.step([], [], where="post", color=color, label=policy)[0]
             for policy, color in (("head_first", "#de2d26"), ("tail_first", "#31a354"))}
    ax.set_xlabel("request")
    ax.set_ylabel("stranded KV (GB)")
    ax.legend(handles=list(lines.values()), fontsize=8)
    return SimpleNamespace(ax=ax, lines=lines)


def _stranding_draw(a: SimpleNamespace, stranded: dict) -> None:
    for policy, ys in stranded.items():
        a.lines[policy].set_data(np.arange(len(ys)), ys)
    top = max(float(np.max(ys)) for ys in stranded.values())
    a.ax.set_xlim(-0.2, max(len(ys) for ys in stranded.values()) - 0.8)
    a.ax.set_ylim(0, 1.05 * top if top > 0 else 1.0)  # nothing stranded: show 0 at the bottom


_STRANDING_FIGURE = figures.LiveFigure(6.0, 2.8, _stranding_build, _stranding_draw)


def _fetch_build(fig) -> SimpleNamespace:
    _margins(fig)
    ax = fig.add_subplot()
    figures.log_scale(ax)
    a = SimpleNamespace(ax=ax)
    a.recompute, = ax.plot([], [], color="black", lw=2, label="recompute")
    # a line (and a colour) per storage tier; the tiers a GPU lacks are hidden
    a.tiers = {key: ax.plot([], [], lw=1, label=key)[0] for key in rf.tier_names()}
    a.prefix = ax.axvline(1.0, color="grey", ls=":", label="this prefix")
    ax.set_xlabel("prefix tokens")
    ax.set_ylabel("ms")
    return a


def _fetch_draw(a: SimpleNamespace, grid, recompute_ms, fetch_ms: dict, prefix_tokens: int) -> None:
    a.recompute.set_data(grid, [t if t > 0 else np.nan for t in recompute_ms])
    for key, line in a.tiers.items():
        line.set_visible(key in fetch_ms)
        line.set_data(grid, fetch_ms.get(key, np.full(len(grid), np.nan)))
    a.prefix.set_xdata([prefix_tokens, prefix_tokens])
    a.ax.relim(visible_only=True)
    a.ax.autoscale_view()
    figures.legend(a.ax, [a.recompute, *a.tiers.values(), a.prefix], fontsize=7, ncol=2)


_FETCH_FIGURE = figures.LiveFigure(6.0, 2.8, _fetch_build, _fetch_draw)
