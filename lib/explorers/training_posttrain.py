"""Explorers for post-training cost (N019, N020): the actor / learner split of on-policy RL and
DPO's memory and FLOPs (:mod:`lib.training.posttrain`).

Views call lib only; each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_ratio, fmt_time, sig

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "llama-3.1-405b")
GPUS = ("h100-sxm", "h200", "b200", "a100-sxm", "mi300x")


_ROWS = ("async learner", "async actors", "on-policy learner", "on-policy actors")


def _build_rl(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.2, right=0.98, bottom=0.2, top=0.96)
    ax = fig.add_subplot()
    rows = {}
    for y, name in enumerate(_ROWS):
        busy = ax.broken_barh([], (y + 0.1, 0.8), facecolors="C0" if "actors" in name else "C2")
        sync = ax.broken_barh([], (y + 0.1, 0.8), facecolors="C1")
        idle = ax.broken_barh([], (y + 0.35, 0.3), facecolors="C3")
        rows[name] = (busy, sync, idle, y)
    ax.set_yticks([0.5, 1.5, 2.5, 3.5], list(rows))
    ax.set_ylim(0, 4)
    ax.set_xlabel("time (s), two steps")
    ax.grid(True, axis="x")
    return SimpleNamespace(ax=ax, rows=rows)


def _boxes(spans, y0: float, h: float) -> list:
    return [[(x0, y0), (x0, y0 + h), (x0 + w, y0 + h), (x0 + w, y0)] for x0, w in spans if w > 0]


def _draw_rl(a, gen, sync, train) -> None:
    step = gen + sync + train
    a_step = max(gen, train + sync)
    spans = {
        "on-policy actors": ([(0, gen), (step, gen)], [(gen, sync), (step + gen, sync)],
                             [(gen + sync, train), (step + gen + sync, train)]),
        "on-policy learner": ([(gen + sync, train), (step + gen + sync, train)], [],
                              [(0, gen + sync), (step, gen + sync)]),
        "async actors": ([(0, gen), (a_step, gen)], [], [(gen, a_step - gen), (a_step + gen, a_step - gen)]),
        "async learner": ([(0, train), (a_step, train)], [(train, sync), (a_step + train, sync)],
                          [(train + sync, a_step - train - sync), (a_step + train + sync, a_step - train - sync)]),
    }
    for name, (busy, sy, idle) in spans.items():
        b, s, i, y = a.rows[name]
        b.set_verts(_boxes(busy, y + 0.1, 0.8))
        s.set_verts(_boxes(sy, y + 0.1, 0.8))
        i.set_verts(_boxes(idle, y + 0.35, 0.3))
    a.ax.set_xlim(0, 2 * step * 1.01)


_RL = figures.LiveFigure(7.0, 2.4, _build_rl, _draw_rl)


@explorer(
    "training.rl_split",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    actor_tp=Choice((1, 2, 4, 8), label="actor TP"),
    actor_replicas=IntRange(1, 64, label="actor replicas", log=True),
    learner_tp=Choice((1, 2, 4, 8), label="learner TP"),
    learner_pp=IntRange(1, 16, label="learner PP"),
    learner_dp=IntRange(1, 64, label="learner DP", log=True),
    prompts=IntRange(16, 1024, label="prompts per step", log=True),
    group=IntRange(1, 32, label="samples per prompt", log=True),
    prompt_len=IntRange(128, 4096, label="prompt tokens", log=True),
    response_mean=FloatRange(256, 16384, 64, label="mean response tokens"),
    response_cap=IntRange(1024, 32768, label="max response tokens", log=True),
)
def rl_split(model: str, gpu: str, actor_tp: int, actor_replicas: int, learner_tp: int, learner_pp: int,
             learner_dp: int, prompts: int, group: int, prompt_len: int, response_mean: float,
             response_cap: int) -> View:
    """N019: one on-policy RL step: generation on the actors, the weight sync, training on the learner."""
    from lib.training.posttrain import rl_step

    s = rl_step(model, gpu, actor_tp, actor_replicas, learner_tp, learner_pp, learner_dp, prompts, group, prompt_len,
                response_mean, response_cap)
    rows = [("actors", f"{fmt_int(s.actor_gpus)} GPUs ({actor_replicas} x TP{actor_tp}): generation "
                       f"{fmt_time(s.generation_s)}, mean batch {sig(s.mean_batch)} of {sig(s.slots)} KV slots"),
            ("learner", f"{fmt_int(s.learner_gpus)} GPUs: training {fmt_time(s.train_s)} (MFU {fmt_pct(s.learner_mfu)})"),
            ("weight sync", fmt_time(s.sync_s)),
            ("GPU-seconds per token", f"generated {sig(s.actor_gpu_s_per_token * 1e3)} ms, trained "
                                      f"{sig(s.learner_gpu_s_per_token * 1e3)} ms"),
            ("balanced actor : learner GPUs", fmt_ratio(s.balanced_ratio)),
            ("on-policy step", f"{fmt_time(s.step_s)}, {fmt_pct(s.idle_fraction)} of GPU time idle"),
            ("one-step-stale step", fmt_time(s.async_step_s))]
    caption = (f"Two RL steps: on-policy (top two rows) the actors (blue) generate for {fmt_time(s.generation_s)}, the "
               f"weights sync (orange, {fmt_time(s.sync_s)}), the learner (green) trains for {fmt_time(s.train_s)}, and "
               f"each pool idles (red) while the other works: {fmt_pct(s.idle_fraction)} of GPU time. One step stale "
               f"(bottom rows) the pools overlap and the step is {fmt_time(s.async_step_s)}.")
    title = f"{model} RL on {gpu}: {fmt_int(s.actor_gpus)} actor + {fmt_int(s.learner_gpus)} learner GPUs"
    fig = _RL(s.generation_s, s.sync_s, s.train_s)
    return View(title, rows, fig, caption=caption,
                values={"generation_s": s.generation_s, "train_s": s.train_s, "sync_s": s.sync_s,
                        "ratio": s.balanced_ratio, "idle": s.idle_fraction})


# ---- N020: DPO ---------------------------------------------------------------------------------------


def dpo_plan(model: str, gpu: str, tp: int, pp: int, dp: int, zero_stage: int, micro_batches: int, prompt_len: int,
             response_len: int, pairs: int, epochs: int):
    """DPO's cost (:func:`lib.training.posttrain.dpo_cost`), the hours of a run with the reference in
    the loop or precomputed once on the same GPUs as inference replicas, and whether each fits."""
    from lib.training.posttrain import dpo_cost, reference_precompute_s

    c = dpo_cost(model, gpu, prompt_len, response_len, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage,
                 micro_batches=micro_batches)
    in_loop = epochs * c.epoch_s(pairs)
    from lib.perf.deployment import deployment

    pre_tp = tp  # the precompute's replicas: the policy's TP, doubled until the weights leave room for a KV cache
    while True:
        try:
            deployment(model, gpu, tp=pre_tp)
            break
        except ValueError:
            if 2 * pre_tp > c.n_gpus:
                raise
            pre_tp *= 2
    replicas = max(1, c.n_gpus // pre_tp)
    pre = reference_precompute_s(model, gpu, pairs, prompt_len + response_len, tp=pre_tp, replicas=replicas)
    precomputed = pre + epochs * c.epoch_s(pairs, reference_in_loop=False)
    return SimpleNamespace(cost=c, in_loop_s=in_loop, precompute_s=pre, precomputed_s=precomputed, precompute_tp=pre_tp,
                           precompute_replicas=replicas,
                           fits_in_loop=c.memory_in_loop <= c.capacity, fits_precomputed=c.memory_precomputed <= c.capacity)


def _build_dpo(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.14, top=0.96, wspace=0.45)
    ax1 = fig.add_subplot(1, 2, 1)
    x = [0, 1]
    state = ax1.bar(x, [0, 0], color="C0", label="training state")
    act = ax1.bar(x, [0, 0], color="C2", label="activations")
    ref = ax1.bar(x, [0, 0], color="C1", label="reference weights")
    cap = ax1.axhline(80, color="C3", ls="--", lw=1, label="visible memory")
    ax1.set_xticks(x, ["in the loop", "precomputed"])
    ax1.set_ylabel("GB per GPU")
    ax2 = fig.add_subplot(1, 2, 2)
    pol = ax2.bar(x, [0, 0], color="C0", label="policy steps")
    rf = ax2.bar(x, [0, 0], color="C1", label="reference forwards")
    ax2.set_xticks(x, ["in the loop", "precomputed"])
    ax2.set_ylabel("hours for the run")
    return SimpleNamespace(ax1=ax1, ax2=ax2, state=state, act=act, ref=ref, cap=cap, pol=pol, rf=rf)


def _draw_dpo(a, state, act, ref, cap, policy_h, ref_h) -> None:
    for i in range(2):
        a.state[i].set_height(state)
        a.act[i].set_y(state)
        a.act[i].set_height(act)
        a.ref[i].set_y(state + act)
        a.ref[i].set_height(ref[i])
        a.pol[i].set_height(policy_h)
        a.rf[i].set_y(policy_h)
        a.rf[i].set_height(ref_h[i])
    a.cap.set_ydata([cap, cap])
    a.ax1.set_ylim(0, max(cap, state + act + max(ref)) * 1.1)
    a.ax2.set_ylim(0, (policy_h + max(ref_h)) * 1.1 or 1.0)


_DPO = figures.LiveFigure(7.0, 2.6, _build_dpo, _draw_dpo)


@explorer(
    "training.dpo_cost",
    model=Choice(MODELS, label="model"),
    gpu=Choice(GPUS, label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    pp=IntRange(1, 16, label="PP"),
    dp=IntRange(1, 128, label="DP", log=True),
    zero_stage=Choice((0, 1, 2, 3), label="ZeRO stage"),
    micro_batches=IntRange(1, 64, label="pairs per DP rank per step", log=True),
    prompt_len=IntRange(64, 8192, label="prompt tokens", log=True),
    response_len=IntRange(64, 8192, label="response tokens", log=True),
    pairs=IntRange(1000, 1_000_000, label="preference pairs"),
    epochs=IntRange(1, 5, label="epochs"),
)
def dpo_cost_view(model: str, gpu: str, tp: int, pp: int, dp: int, zero_stage: int, micro_batches: int,
                  prompt_len: int, response_len: int, pairs: int, epochs: int) -> View:
    """N020: DPO's memory per GPU and run time, with the reference in the loop or precomputed."""
    r = dpo_plan(model, gpu, tp, pp, dp, zero_stage, micro_batches, prompt_len, response_len, pairs, epochs)
    c = r.cost
    gb = 1e9
    rows = [("FLOPs per pair", f"policy {sig(c.policy_flops / 1e12)} TFLOP, reference {sig(c.reference_flops / 1e12)} "
                               f"TFLOP ({fmt_pct(c.reference_share)} of the loop)"),
            ("memory per GPU, reference in the loop",
             f"{fmt_bytes(c.memory_in_loop, 'GB')} of {fmt_bytes(c.capacity, 'GB')}"
             + ("" if r.fits_in_loop else ": does not fit")),
            ("memory per GPU, precomputed", f"{fmt_bytes(c.memory_precomputed, 'GB')}"
             + ("" if r.fits_precomputed else ": does not fit")),
            ("step", f"policy {fmt_time(c.policy_step_s)} + reference {fmt_time(c.reference_step_s)} "
                     f"({c.pairs_per_step} pairs, policy MFU {fmt_pct(c.mfu)})"),
            ("run, reference in the loop", f"{sig(r.in_loop_s / 3600)} h"),
            ("run, precomputed", f"{sig(r.precomputed_s / 3600)} h ({sig(r.precompute_s / 3600)} h of it the precompute)")]
    caption = (f"Left: memory per GPU (training state blue, activations green, reference weights orange) against the "
               f"{fmt_bytes(c.capacity, 'GB')} visible (red): the reference adds {fmt_bytes(c.reference_bytes, 'GB')}. "
               f"Right: hours for {fmt_int(pairs)} pairs over {epochs} epoch(s): {sig(r.in_loop_s / 3600)} h with the "
               f"reference in the loop, {sig(r.precomputed_s / 3600)} h precomputed (policy steps blue, reference "
               "forwards or their precompute orange).")
    title = f"DPO of {model} on {fmt_int(c.n_gpus)} x {gpu}"
    policy_h = epochs * c.epoch_s(pairs, reference_in_loop=False) / 3600
    ref_h = (r.in_loop_s / 3600 - policy_h, r.precompute_s / 3600)
    fig = _DPO(c.state_bytes / gb, c.activation_bytes / gb, (c.reference_bytes / gb, 0.0), c.capacity / gb, policy_h,
               ref_h)
    return View(title, rows, fig, caption=caption,
                values={"in_loop_s": r.in_loop_s, "precomputed_s": r.precomputed_s, "reference_bytes": c.reference_bytes})
