"""Explorer for the mini serving engine (I063): a paged KV pool running dry, step by step.

:func:`workload_jobs` is the question's default workload (the notebook's parameters default to its
constants); :func:`run_pair` serves it with the chosen pool and with a pool the workload never
fills, both on :class:`lib.scheduling.mini_engine.MiniEngine`, and prices both runs with the book's
step model (:func:`lib.scheduling.cost.step_cost`). The figure is one persistent matplotlib figure
updated in place: KV blocks in use per step, and each step's batch (decode tokens, new prefill
tokens, recomputed prefill tokens) against the token budget.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import IntRange, View, explorer
from lib.units import fmt_pct, fmt_ratio, fmt_time

BLOCK_SIZE = 16  # tokens per KV block
MAX_RUNNING = 16  # requests per step at most
PROMPT_TOKENS = (32, 256)  # uniform prompt lengths, tokens
MAX_TOKENS = (16, 128)  # uniform max_tokens per request
ARRIVAL_GAP = 2  # steps between arrivals
VOCAB = 512  # the fake model's vocabulary (EOS = token 0: about 1 token in 512)
SEED = 0
MODEL = "llama-3.1-8b"  # the step model that prices steps
GPU = "h100-sxm"


def workload_jobs(n_requests: int, prompt_tokens=PROMPT_TOKENS, max_tokens=MAX_TOKENS, arrival_gap: int = ARRIVAL_GAP,
                  vocab: int = VOCAB, seed: int = SEED) -> list:
    """``n_requests`` jobs: prompt lengths and max_tokens uniform in the given (low, high) ranges,
    one arrival every ``arrival_gap`` steps, prompt ids and lengths seeded
    (:func:`lib.scheduling.mini_engine.make_jobs` over a :class:`lib.scheduling.Workload`)."""
    from lib.scheduling import Uniform, Workload
    from lib.scheduling.mini_engine import make_jobs

    wl = Workload(prompt=Uniform(*prompt_tokens), output=Uniform(*max_tokens), arrival="burst", n_requests=n_requests)
    return make_jobs(wl, seed, vocab, arrival_gap)


def ample_blocks(jobs, block_size: int) -> int:
    """A pool that holds every job's worst case at once: sum of ceil((prompt + max_tokens - 1) /
    block_size) (:func:`lib.kvcache.paged_waste.blocks_for_tokens`), so it never runs dry."""
    from lib.kvcache.paged_waste import blocks_for_tokens

    return sum(blocks_for_tokens(len(j.prompt) + j.max_tokens - 1, block_size) for j in jobs)


def run_pair(jobs, num_blocks: int, token_budget: int, *, block_size: int = BLOCK_SIZE,
             max_running: int = MAX_RUNNING, vocab: int = VOCAB, seed: int = SEED, cost=None) -> SimpleNamespace:
    """Serve ``jobs`` with :class:`~lib.scheduling.mini_engine.MiniEngine` on a pool of
    ``num_blocks`` blocks (``dry``: a :class:`~lib.scheduling.mini_engine.Served`) and schedule the
    requests it did not refuse on :func:`ample_blocks` (``ample``: ``steps``, ``used`` blocks per step, ``seconds`` per step,
    ``decodes`` per step, ``peak``). The ample schedule comes from :func:`lib.scheduling.simulate` with a cost of one
    second per step, which makes the mini engine's decisions step for step (the unit tests hold the
    two to each other) at a fraction of the cost: it needs no token ids, only each request's output
    length, read from the dry run's streams. Every step is priced with ``cost`` (None: ``step_cost``
    of MODEL on GPU): :func:`~lib.scheduling.mini_engine.step_seconds` and
    :func:`~lib.scheduling.mini_engine.timeline_seconds`, both ``cost.step_s`` per step."""
    from lib.kvcache.allocator import BlockAllocator
    from lib.scheduling import LinearCost, Policy, simulate
    from lib.scheduling.mini_engine import FakeModel, serve, step_seconds, timeline_seconds
    from lib.scheduling.workloads import Request

    if cost is None:
        from lib.perf.deployment import Deployment
        from lib.scheduling.cost import step_cost

        cost = step_cost(Deployment(MODEL, GPU))
    model = FakeModel(seed, vocab, eos=0)
    dry = serve(jobs, BlockAllocator(num_blocks, block_size), model, token_budget, max_running)
    served = [j for j in jobs if dry.engine.status(j.rid) != "refused"]  # the same work on both pools
    reqs = [Request(k, float(j.arrival_step), len(j.prompt), len(dry.streams[j.rid]), 0, j.max_tokens)
            for k, j in enumerate(served)]
    big = max(1, ample_blocks(served, block_size))
    res = simulate(reqs, Policy(token_budget=token_budget, max_running=max_running),
                   LinearCost(1.0, kv_blocks=big, block_size=block_size, max_running=max_running,
                              token_budget=token_budget))
    tl = res.timeline
    n = int(round(res.end_s))
    used, decodes, seconds = [0] * n, [0] * n, [0.0] * n  # idle steps: nothing in use, no time
    for t, d, free, sec in zip(tl.start_s, tl.decode_tokens, tl.free_blocks, timeline_seconds(tl, cost), strict=True):
        k = int(round(t))
        used[k], decodes[k], seconds[k] = big - int(free), int(d), sec
    ample = SimpleNamespace(steps=n, used=used, decodes=decodes, seconds=seconds, peak=max(used, default=0),
                            preemptions=res.counters["preemptions"])
    return SimpleNamespace(dry=dry, ample=ample, dry_s=step_seconds(dry.steps, cost), ample_s=seconds, cost=cost)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.97, hspace=0.12)
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    a = SimpleNamespace(top=top, bottom=bottom)
    a.ample = top.stairs([0], [0, 1], color="grey", lw=1, ls="--", label="blocks in use, ample pool")
    a.used = top.stairs([0], [0, 1], color="C0", lw=1.6, label="blocks in use")
    a.pool, = top.plot([], [], color="k", lw=1, label="pool size")
    a.pre, = top.plot([], [], "x", color="C3", ms=6, mew=1.6, label="preemption")
    top.set_ylabel("KV blocks")
    top.tick_params(labelbottom=False)
    top.grid(True, axis="y")  # horizontal lines only: each grid line costs drawing time
    a.dec = bottom.stairs([0], [0, 1], baseline=0, fill=True, color="C0", alpha=0.8, label="decode tokens")
    a.new = bottom.stairs([0], [0, 1], baseline=[0], fill=True, color="C2", alpha=0.8, label="prefill tokens (new)")
    a.redo = bottom.stairs([0], [0, 1], baseline=[0], fill=True, color="C3", alpha=0.9,
                           label="prefill tokens (recomputed)")
    a.budget, = bottom.plot([], [], color="k", lw=1, ls=":", label="token budget")
    bottom.set_xlabel("engine step")
    bottom.set_ylabel("tokens in the step")
    from matplotlib.ticker import MaxNLocator

    for ax in (top, bottom):  # few ticks: tick drawing is most of a redraw
        ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(4, integer=True))
    figures.legend(top, [a.used, a.ample, a.pool, a.pre], loc="upper right", fontsize=7)  # the same series always
    figures.legend(bottom, [a.dec, a.new, a.redo, a.budget], loc="upper right", fontsize=7)
    return a


def _draw(a, used, ample, pool, pre_x, pre_y, dec, new, redo, budget) -> None:
    import numpy as np

    n = max(len(used), len(ample), 1)
    edges = np.arange(len(used) + 1)
    a.used.set_data(used, edges)
    a.ample.set_data(ample, np.arange(len(ample) + 1))
    a.pool.set_data([0, n], [pool, pool])
    a.pre.set_data(pre_x, pre_y)
    a.top.set_xlim(0, n)
    a.top.set_ylim(0, 1.08 * max(pool, max(ample, default=0), max(used, default=0)))
    d, w = np.asarray(dec, float), np.asarray(new, float)
    a.dec.set_data(d, edges, baseline=0)
    a.new.set_data(d + w, edges, baseline=d)
    a.redo.set_data(d + w + np.asarray(redo, float), edges, baseline=d + w)
    a.budget.set_data([0, n], [budget, budget])
    a.bottom.set_xlim(0, n)
    a.bottom.set_ylim(0, 1.3 * budget)  # room for the legend above the budget line


_FIGURE = figures.LiveFigure(6.4, 4.6, _build, _draw)


def occupancy_figure(served, num_blocks: int, token_budget: int, ample_used=(), split=None):
    """The explorer's figure for one run (``served``), with the blocks an ample pool would use;
    ``split``: :func:`lib.scheduling.mini_engine.prefill_split` of its steps (None: computed here)."""
    from lib.scheduling.mini_engine import prefill_split

    steps = served.steps
    split = prefill_split(steps) if split is None else split
    pre = [(r.index + 0.5, r.used_blocks) for r in steps if r.preempted]
    return _FIGURE([r.used_blocks for r in steps], list(ample_used),
                   num_blocks, [x for x, _ in pre], [y for _, y in pre], [len(r.decodes) for r in steps],
                   [s[0] for s in split], [s[1] for s in split], token_budget)


@explorer(
    "scheduling.mini_engine",
    num_blocks=IntRange(8, 1024, log=True, label="KV pool (blocks of 16 tokens)"),
    token_budget=IntRange(16, 2048, log=True, label="token budget per step"),
    n_requests=IntRange(4, 24, label="requests (one every 2 steps)"),
)
def mini_engine(num_blocks: int, token_budget: int, n_requests: int) -> View:
    """I063: the mini engine on a pool that may run dry, against a pool it never fills."""
    from lib.scheduling.mini_engine import prefill_split

    jobs = workload_jobs(n_requests)
    r = run_pair(jobs, num_blocks, token_budget)
    dry, ample = r.dry, r.ample
    split = prefill_split(dry.steps)
    prefill = sum(a + b for a, b in split)
    redo = sum(b for _, b in split)
    fig = occupancy_figure(dry, num_blocks, token_budget, ample.used, split)
    t_dry, t_ample = sum(r.dry_s), sum(r.ample_s)
    rows = [("steps (this pool / ample pool)", f"{len(dry.steps):,} / {ample.steps:,}"),
            ("preemptions (requests preempted)", f"{dry.preemptions:,} ({sum(s.preemptions > 0 for s in dry.seqs)})"),
            ("prefill tokens recomputed", f"{redo:,} of {prefill:,} ({fmt_pct(redo / prefill if prefill else 0.0)})"),
            ("peak blocks (this pool / ample pool)", f"{dry.peak_blocks:,} / {ample.peak:,}"),
            ("finished / refused", f"{dry.count('finished'):,} / {dry.count('refused'):,}"),
            (f"time on {MODEL} / {GPU}", f"{fmt_time(t_dry)} vs {fmt_time(t_ample)} "
                                         f"({fmt_ratio(t_dry / t_ample if t_ample else 1.0)})")]
    note = ("Top: KV blocks in use each step (blue) against the pool (black); the dashed grey line is the same "
            "workload on a pool it never fills, and each red x a preemption. Bottom: each step's batch, decodes "
            "first, then new prefill, then recomputed prefill (red, the price of the dry pool), under the budget.")
    caption = (f"Top: KV blocks in use each step against the pool of {num_blocks:,} blocks (black), the same workload on an "
               f"ample pool dashed; bottom: each step's tokens under the budget of {token_budget:,}. This pool preempts "
               f"{dry.preemptions:,} times and recomputes {redo:,} prefill tokens, taking {len(dry.steps):,} steps "
               f"against {ample.steps:,}.")
    return View(f"Mini engine: {n_requests} requests, {num_blocks:,}-block pool, {token_budget:,}-token budget",
                rows, fig, note=note, caption=caption, values={"steps": len(dry.steps), "ample_steps": ample.steps,
                                              "preemptions": dry.preemptions, "recomputed": redo,
                                              "time_s": t_dry, "ample_time_s": t_ample})
