"""Explorer for the batching-system design question (N057): one replica from the batch its TPOT
target and KV pool allow to what it earns under a workload.

``scheduling.system_design`` calls lib only: :func:`lib.scheduling.replica.batch_limits` (the
decode step model against the target, the KV pool of the memory budget, ``max_num_seqs``),
:func:`lib.scheduling.resident.resident_sequences` (Little's law on the step model: the steady
state's batch and mean TPOT) and :func:`lib.scheduling.replica.steady_run` (a short simulation
read after a warm-up: tokens per second and p95 TPOT). A replica's step-cost table takes 0.02-0.06 s
to build, so the explorer offers a few named replicas (:data:`REPLICAS`) and builds every table on
its first update; later updates simulate about 200 requests and redraw one persistent figure.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_time, fmt_unit, sig

#: The replicas the explorer offers: label -> (model, GPU, tensor-parallel degree), BF16.
REPLICAS = {
    "llama-3.1-70b on 8x h100-sxm": ("llama-3.1-70b", "h100-sxm", 8),
    "llama-3.1-70b on 4x h200": ("llama-3.1-70b", "h200", 4),
    "llama-3.1-8b on 1x h100-sxm": ("llama-3.1-8b", "h100-sxm", 1),
    "llama-3.1-8b on 1x l40s": ("llama-3.1-8b", "l40s", 1),
    "qwen2.5-72b on 4x mi300x": ("qwen2.5-72b", "mi300x", 4),
    "mixtral-8x7b on 2x h200": ("mixtral-8x7b", "h200", 2),
}
#: Prompts are capped at this multiple of their median, replies (``max_tokens``) at REPLY_CAP times theirs.
PROMPT_CAP, REPLY_CAP = 8, 4
#: The short simulation behind each update: about this many engine steps in steady state (a step costs
#: the simulator 20-50 us; the run is stopped at three times as many), at most MAX_REQUESTS requests
#: (40% warm-up, 40% measured, 20% cool-down), and no run with fewer than MIN_REQUESTS (a load so
#: light that each request mostly runs alone).
STEP_BUDGET, MAX_REQUESTS, MIN_REQUESTS = 900, 200, 60
#: A short run whose measured requests mostly did not finish within the step budget reports nothing.
MIN_FINISHED = 20
#: The short simulation keeps its pool in blocks of this many tokens (the same tokens in all):
#: 16 times fewer allocator operations than 16-token blocks, a sequence rounds up to 256 tokens.
SIM_BLOCK = 256

_WARM: dict = {}


def deployment_of(label: str):
    """The :class:`~lib.perf.deployment.Deployment` of one of :data:`REPLICAS`."""
    from lib.perf.deployment import Deployment

    if label not in REPLICAS:
        raise ValueError(f"replica must be one of {', '.join(REPLICAS)}; got {label!r}")
    model, gpu, tp = REPLICAS[label]
    return Deployment(model, gpu, tp=tp)


def replica_cost(label: str):
    """The replica's step costs (:func:`lib.scheduling.step_cost`, the table up to ``max_num_seqs``);
    the first call builds every replica's table (kept here)."""
    from lib.scheduling import step_cost

    if label not in REPLICAS:
        raise ValueError(f"replica must be one of {', '.join(REPLICAS)}; got {label!r}")
    if not _WARM:
        for name in REPLICAS:
            _WARM[name] = step_cost(deployment_of(name))
    return _WARM[label]


def workload_lengths(dep, prompt_median: int, output_median: int, spread: float):
    """(prompt, output, max_tokens): log-normal lengths with these medians and sigma, prompts capped
    at PROMPT_CAP x their median and replies at max_tokens = REPLY_CAP x theirs, both within the
    model's context window (ValueError when the window cannot hold a median prompt and max_tokens)."""
    from lib.scheduling import LogNormal

    window = dep.mdl.max_position_embeddings
    max_tokens = REPLY_CAP * output_median
    prompt_cap = min(PROMPT_CAP * prompt_median, window - max_tokens)
    if prompt_cap < prompt_median:
        raise ValueError(f"{dep.model}'s {window:,}-token window cannot hold a {prompt_median:,}-token prompt and "
                         f"max_tokens = {max_tokens:,}: shorten them")
    return (LogNormal(prompt_median, spread, cap=prompt_cap), LogNormal(output_median, spread, cap=max_tokens),
            max_tokens)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.15, top=0.95)
    ax = fig.add_subplot()
    figures.log_scale(ax, "both")
    a = SimpleNamespace(ax=ax)
    a.step, = ax.plot([], [], lw=2, color="C0", label="decode step t(B): every user's time per token")
    a.target = ax.axhline(1.0, color="grey", lw=1.2, label="TPOT target")
    a.tpot = ax.axvline(1.0, color="C0", ls=":", lw=1.2)
    a.kv = ax.axvline(1.0, color="C2", ls="--", lw=1.2)
    a.engine = ax.axvline(1.0, color="black", ls="-.", lw=0.8)
    a.model, = ax.plot([], [], "s", color="C1", ms=6)
    a.sim, = ax.plot([], [], "o", color="C3", ms=7)
    ax.set_xlabel("sequences in the batch")
    ax.set_ylabel("time per output token (s)")
    ax.grid(True)
    return a


def _draw(a, bs, steps, target, b_tpot, b_kv, b_engine, model_pt, sim_pt) -> None:
    a.step.set_data(bs, steps)
    a.target.set_ydata([target, target])
    for line, b, label in ((a.tpot, b_tpot, f"the target allows {sig(b_tpot) if math.isfinite(b_tpot) else 'more'}"),
                           (a.kv, b_kv, f"the KV pool holds {sig(b_kv)}"),
                           (a.engine, b_engine, f"max_num_seqs = {b_engine:,}")):
        shown = math.isfinite(b) and b >= 1
        line.set_xdata([b, b] if shown else [1, 1])
        line.set_visible(shown)
        line.set_label(label)
    for mark, pt, label in ((a.model, model_pt, "steady state (Little's law): mean TPOT"),
                            (a.sim, sim_pt, "simulated: p95 TPOT at the mean batch")):
        ok = pt is not None and all(math.isfinite(v) and v > 0 for v in pt)
        mark.set_data([pt[0]] if ok else [], [pt[1]] if ok else [])
        mark.set_visible(ok)
        mark.set_label(label)
    ys = [y for y in list(steps) + [target] + [p[1] for p in (model_pt, sim_pt) if p is not None]
          if math.isfinite(y) and y > 0]
    a.ax.set_xlim(1, bs[-1])
    a.ax.set_ylim(0.7 * min(ys), 1.5 * max(ys))
    figures.legend(a.ax, [a.step, a.target, a.tpot, a.kv, a.engine, a.model, a.sim], fontsize=6.5,
                   loc="upper left")


_FIGURE = figures.LiveFigure(6.2, 3.4, _build, _draw)


@explorer(
    "scheduling.system_design",
    replica=Choice(tuple(REPLICAS), label="replica"),
    tpot_target_s=FloatRange(0.01, 0.2, 0.005, label="p95 TPOT target (s)"),
    rate=FloatRange(0.5, 40.0, 0.1, label="arrivals (requests/s)"),
    prompt_median=IntRange(64, 8192, log=True, label="prompt median (tokens)"),
    output_median=IntRange(16, 1024, log=True, label="reply median (tokens)"),
    spread=FloatRange(0.0, 1.2, 0.1, label="length spread (sigma of ln)"),
)
def system_design(replica: str, tpot_target_s: float, rate: float, prompt_median: int, output_median: int,
                  spread: float) -> View:
    """N057: the batch limit from the TPOT target and from the KV pool, and the tokens/s and p95 TPOT
    the replica earns at this arrival rate."""
    from lib.scheduling import SLO, Policy
    from lib.scheduling.batching import length_mean, resident_kv_tokens
    from lib.scheduling.replica import batch_limits, steady_run
    from lib.scheduling.resident import resident_sequences

    cost = replica_cost(replica)
    dep = cost.dep
    prompt, output, max_tokens = workload_lengths(dep, prompt_median, output_median, spread)
    p_mean, o_mean = length_mean(prompt), length_mean(output)
    context = round(resident_kv_tokens(round(p_mean), output))
    lim = batch_limits(dep, context, tpot_target_s, cost=cost)  # read off the replica's decode table
    if lim.limit < 1:
        raise ValueError(f"one sequence's decode step on {replica} already takes "
                         f"{fmt_time(cost.decode_s(1, context))}, above the {fmt_time(tpot_target_s)} target: "
                         "relax the target or pick a faster replica")
    state = resident_sequences(cost, rate, round(p_mean), max(2, round(o_mean)), mean_context=context)
    # a run of n requests takes about n (E[O] / running + E[P] / token budget) steps: size it to the budget
    running = min(state.resident, lim.limit) if state.stable else lim.limit
    n = min(MAX_REQUESTS, int(STEP_BUDGET / (o_mean / max(1.0, running) + p_mean / cost.token_budget)))
    run, why = None, ("so light a load that each request mostly runs alone, and a steady run would take too long "
                      "for a widget")
    if n >= MIN_REQUESTS:
        try:
            run = steady_run(cost, prompt, output, rate, n_measured=2 * n // 5, n_warmup=2 * n // 5,
                             n_cooldown=n - 4 * (n // 5), policy=Policy(max_running=lim.limit),
                             max_tokens=max_tokens, slo=SLO(tpot_s=tpot_target_s), max_steps=3 * STEP_BUDGET,
                             block_size=SIM_BLOCK)
        except ValueError:  # the step budget ran out during the warm-up
            why = f"the warm-up alone takes more than {3 * STEP_BUDGET:,} steps"
    bs = np.unique(np.geomspace(1, cost.max_batch, 40).astype(int))
    steps = [cost.decode_s(int(b), int(b) * context) for b in bs]
    if run is not None and run.metrics.finished < MIN_FINISHED:
        why = (f"only {run.metrics.finished} measured requests finished within {3 * STEP_BUDGET:,} steps: the rate "
               "overloads the replica (the queue grows without end)")
        run = None
    model_pt = (state.resident, state.tpot_s) if state.stable else None
    sim_pt = (run.mean_running, run.metrics.tpot.p95) if run is not None else None
    fig = _FIGURE(bs, steps, tpot_target_s, lim.by_tpot, lim.by_kv, lim.by_engine, model_pt, sim_pt)
    steady = (f"{sig(state.resident)} running, mean TPOT {fmt_time(state.tpot_s)}, "
              f"{fmt_unit(rate * o_mean, 'tokens/s')}" if state.stable else f"none: {state.why}")
    rows = [
        ("cached tokens per running sequence (mean)", f"{context:,}"),
        ("batch the TPOT target allows (decode steps)",
         sig(lim.by_tpot) if math.isfinite(lim.by_tpot) else f"more than {cost.max_batch:,}"),
        ("batch the KV pool holds", sig(lim.by_kv)),
        ("batch limit (max_num_seqs set here)", f"{lim.limit:,}, set by {lim.binding}"),
        ("decode ceiling at the limit", fmt_unit(lim.limit / lim.step_at_limit_s, "tokens/s")),
        ("steady state at this rate (Little's law)", steady),
    ]
    if run is not None:
        m = run.metrics
        meets = "meets" if m.tpot.p95 <= tpot_target_s else "misses"
        rows += [(f"simulated ({len(run.result.requests)} requests, {m.n_requests} measured)",
                  f"{fmt_unit(run.tokens_per_s, 'tokens/s')}, {sig(run.mean_running)} running"),
                 ("simulated p95 TPOT", f"{fmt_time(m.tpot.p95)} ({meets} the target; "
                                        f"{fmt_pct(m.goodput_requests_per_s / m.requests_per_s)} of the finished "
                                        "requests within it)")]
    else:
        rows += [("simulated p95 TPOT", f"not simulated here: {why}")]
    note = ("The blue curve is the decode step, which every sequence of the batch waits for: where it crosses the "
            "target is the most sequences the target allows, the green dashed line is where the KV pool ends, and "
            "the smaller one is the batch limit. The dots are where this workload actually runs at this rate: "
            "above the curve by what the prompts add to each step, and left of the limit unless the rate "
            "saturates the replica. The simulation is short (sized to answer at once): use the notebook's longer "
            "runs for a number to quote.")
    allows = (f"crosses the TPOT target of {fmt_time(tpot_target_s)} at {sig(lim.by_tpot)} sequences"
              if math.isfinite(lim.by_tpot) else f"stays under the TPOT target of {fmt_time(tpot_target_s)}")
    marks = [name for name, pt in (("the square is the steady state at this rate (Little's law)", model_pt),
                                   ("the circle is the short simulation's p95 TPOT", sim_pt)) if pt is not None]
    caption = (f"The decode step (blue) {allows} and the KV pool ends at {sig(lim.by_kv)}, so the batch limit is "
               f"{lim.limit:,}, set by {lim.binding}. "
               + (f"{'; '.join(marks)[0].upper()}{'; '.join(marks)[1:]}." if marks else
                  "At this rate the replica reaches no steady state, so no point is drawn."))
    return View(f"{replica}: {sig(rate)} requests/s, prompts ~{prompt_median:,}, replies ~{output_median:,} tokens",
                rows, fig, note, caption=caption,
                values={"context": context, "by_tpot": lim.by_tpot, "by_kv": lim.by_kv, "limit": lim.limit,
                        "tokens_per_s": run.tokens_per_s if run else math.nan,
                        "p95_tpot_s": run.metrics.tpot.p95 if run else math.nan,
                        "mean_running": run.mean_running if run else math.nan,
                        "resident": state.resident if state.stable else math.inf})


# ---- the page's static figure: the system's components --------------------------------------------

#: The components of the batching system, in the order a token passes them: (name, what it decides,
#: its knobs). The anatomy figure draws them; the page's tables give each its numbers.
COMPONENTS = (
    ("admission queue", "who waits, who is refused", "bound, max wait, rate limit"),
    ("scheduler", "each step's batch", "max_num_seqs, token budget"),
    ("GPU step", "one token per sequence", "model, GPUs, dtype: t(B)"),
    ("sampler", "the next token ids", "on the step's host path"),
    ("detokenizer", "token ids to text", "off the step loop"),
    ("per-stream buffers", "what a slow client may hold", "bound, on full: drop or pause"),
)


def anatomy_figure():
    """The batching system as a diagram (a :class:`lib.book.figures.Drawing`): clients, then
    :data:`COMPONENTS` in order, the KV pool beside the scheduler, and the two feedback paths
    (the pool's free blocks and the stream buffers' room back to the scheduler)."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    with figures.style():
        fig = figures.new_figure(7.2, 3.1)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, 100)
        ax.set_ylim(0, 47)
        ax.axis("off")
        w, h = 21.0, 10.5
        top, bottom = 27.0, 2.5
        xs = (2.0, 27.0, 52.0, 77.0)
        boxes = {"clients": (xs[0], top), "admission queue": (xs[1], top), "scheduler": (xs[2], top),
                 "GPU step": (xs[3], top), "sampler": (xs[3], bottom), "detokenizer": (xs[2], bottom),
                 "per-stream buffers": (xs[1], bottom), "clients (SSE)": (xs[0], bottom)}
        text = {name: (what, knobs) for name, what, knobs in COMPONENTS}
        text["clients"] = ("send requests", "prompt, max_tokens")
        text["clients (SSE)"] = ("read the stream", "at their own speed")
        colors = {"clients": "#eeeeee", "clients (SSE)": "#eeeeee", "GPU step": "#dbe6f4", "sampler": "#dbe6f4"}
        for name, (x, y) in boxes.items():
            ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.4,rounding_size=1.2",
                                        fc=colors.get(name, "#f6f1e4"), ec="#555555", lw=0.9))
            what, knobs = text[name]
            ax.text(x + w / 2, y + h - 2.4, name, ha="center", va="center", fontsize=8.5, weight="bold")
            ax.text(x + w / 2, y + h / 2 - 0.6, what, ha="center", va="center", fontsize=6.8)
            ax.text(x + w / 2, y + 1.9, knobs, ha="center", va="center", fontsize=6.3, color="#8a3b12",
                    style="italic")
        ax.add_patch(FancyBboxPatch((xs[2] + 2.5, 42.3), w - 5.0, 3.0, boxstyle="round,pad=0.3",
                                    fc="#e4f1e4", ec="#555555", lw=0.9))
        ax.text(xs[2] + w / 2, 43.8, "KV pool: blocks", ha="center", va="center", fontsize=7.2, weight="bold")

        def arrow(a, b, style="-|>", ls="-", color="#333333", rad=0.0):
            ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=10, lw=1.0, ls=ls, color=color,
                                         connectionstyle=f"arc3,rad={rad}"))

        mid_t, mid_b = top + h / 2, bottom + h / 2
        for x0, x1 in ((xs[0], xs[1]), (xs[1], xs[2]), (xs[2], xs[3])):
            arrow((x0 + w + 0.6, mid_t), (x1 - 0.6, mid_t))
        arrow((xs[3] + w / 2, top - 0.6), (xs[3] + w / 2, bottom + h + 0.6))
        for x0, x1 in ((xs[3], xs[2]), (xs[2], xs[1]), (xs[1], xs[0])):
            arrow((x0 - 0.6, mid_b), (x1 + w + 0.6, mid_b))
        arrow((xs[2] + w / 2, top + h + 0.5), (xs[2] + w / 2, 41.9), style="<|-|>", color="#2d6a2d")
        ax.text(xs[2] + w / 2 + 1.2, top + h + 2.4, "free blocks: admit or preempt", fontsize=6.3,
                color="#2d6a2d", va="center")
        arrow((xs[1] + w * 0.75, bottom + h + 0.6), (xs[2] + w * 0.25, top - 0.6), ls="--", color="#8a3b12", rad=-0.2)
        ax.text(xs[1] + w + 1.0, 20.0, "buffer full: drop or\npause that sequence", fontsize=6.3,
                color="#8a3b12", ha="left", va="center")
        ax.text(xs[0] + w / 2, 20.0, "the step loop never\nwaits on a client", fontsize=6.6, ha="center",
                va="center", color="#555555")
    return figures.show(fig)
