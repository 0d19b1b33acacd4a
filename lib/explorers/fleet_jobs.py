"""Explorers for the job API (N075 job-api).

Views call :mod:`lib.fleet.job_api` only: the offset walk's repeats and skips (its closed form) and
the duplicate jobs a retried POST makes without an idempotency key. One persistent figure.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import job_api
from lib.units import fmt_int, fmt_pct, sig


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.rep = ax.plot([0], [0], color="C3", lw=1.8, label="offset: repeats (inserts > deletes)")[0]
    a.skip = ax.plot([0], [0], color="C1", lw=1.8, ls="--", label="offset: skips (deletes > inserts)")[0]
    a.key = ax.plot([0], [0], color="C0", lw=2.2, label="keyset cursor: none")[0]
    a.here = ax.plot([0], [0], "o", color="k", ms=6, label="these inputs")[0]
    ax.set_xlabel("net rows shifted per page boundary (inserts - deletes)")
    ax.set_ylabel("jobs repeated or skipped in one walk")
    ax.grid(True)
    return a


def _draw(a, xs, rep, skip, x0, y0) -> None:
    a.rep.set_data(xs[xs >= 0], rep[xs >= 0])
    a.skip.set_data(xs[xs <= 0], skip[xs <= 0])
    a.key.set_data(xs, np.zeros_like(xs))
    a.here.set_data([x0], [y0])
    top = max(1.0, float(max(rep.max(), skip.max())) * 1.08)
    a.ax.set_xlim(float(xs[0]) - 0.5, float(xs[-1]) + 0.5)
    a.ax.set_ylim(-0.03 * top, top)
    figures.legend(a.ax, [a.rep, a.skip, a.key, a.here], fontsize=7, loc="upper center")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.job_api",
    jobs=IntRange(1, 20000, label="jobs in the list"),
    page=IntRange(1, 200, label="page size"),
    inserts=IntRange(0, 199, label="inserts per page read"),
    deletes=IntRange(0, 200, label="deletes per page read"),
    p_lost_pct=FloatRange(0.0, 50.0, 0.1, label="responses lost (%)"),
    retries=IntRange(0, 10, label="client retries"),
)
def job_api_view(jobs: int, page: int, inserts: int, deletes: int, p_lost_pct: float, retries: int) -> View:
    """N075: what a walk over ``jobs`` newest-first rows repeats or skips by offset while rows are
    inserted and deleted between page reads (the keyset cursor: none), and the duplicate jobs per
    submission a retried POST makes without an idempotency key."""
    if inserts >= page:
        raise ValueError(f"inserts per page ({inserts}) must be below the page size ({page}): otherwise an offset "
                         "walk never reaches the end")
    if deletes > page:
        raise ValueError(f"deletes per page ({deletes}) must be at most the page size ({page})")
    if p_lost_pct >= 50.0 + 1e-12:
        raise ValueError("responses lost must be below 50%")
    here = job_api.offset_anomalies_closed_form(jobs, page, inserts, deletes)
    s0 = inserts - deletes
    xs = np.arange(-page, page)
    rep = np.array([job_api.offset_anomalies_closed_form(jobs, page, int(x), 0) if x >= 0 else 0 for x in xs], float)
    skip = np.array([job_api.offset_anomalies_closed_form(jobs, page, 0, int(-x)) if x <= 0 else 0 for x in xs], float)
    dup = job_api.expected_duplicates(p_lost_pct / 100.0, retries)
    kind = "repeats" if s0 > 0 else "skips" if s0 < 0 else "repeats or skips"
    rows = [("net shift per boundary", f"{s0:+d} rows"),
            (f"offset walk: {kind}", fmt_int(here)),
            ("keyset cursor: repeats, skips", "0, 0"),
            ("extra jobs per submission, no key", sig(dup, 3)),
            ("extra jobs per 1,000 submissions", sig(1000 * dup, 3)),
            ("with an idempotency key", "0")]
    caption = (f"Jobs an offset walk over {fmt_int(jobs)} rows in pages of {page} repeats (right) or skips (left) "
               f"against the net rows inserted minus deleted between page reads; here {s0:+d} gives "
               f"{fmt_int(here)} {kind}, the keyset cursor none. Lost responses at {fmt_pct(p_lost_pct / 100)} with "
               f"{retries} retries add {sig(1000 * dup, 3)} duplicate jobs per 1,000 submissions without a key.")
    fig = _FIGURE(xs.astype(float), rep, skip, float(s0), float(here))
    return View("Offset versus keyset pagination, and retries without a key", rows, fig, caption=caption,
                values={"anomalies": here, "duplicates_per_submit": dup})


# ---- W07 llm-job-service: retries, backoff and dead letters ----------------------------------------------


def _build_retry(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.exp = ax.step([0], [1], where="post", color="C0", lw=2, label="capped exponential backoff")[0]
    a.fixed = ax.step([0], [1], where="post", color="C3", lw=1.6, ls="--", label="fixed interval")[0]
    a.outage = ax.axvline(1.0, color="0.4", ls=":", lw=1.2, label="outage ends")
    ax.set_xlabel("seconds since the first failure")
    ax.set_ylabel("tries made by one job")
    ax.grid(True)
    return a


def _draw_retry(a, t_exp, n_exp, t_fix, n_fix, outage, xmax, ymax) -> None:
    a.exp.set_data(t_exp, n_exp)
    a.fixed.set_data(t_fix, n_fix)
    a.outage.set_xdata([outage, outage])
    a.ax.set_xlim(0, xmax)
    a.ax.set_ylim(0, ymax)
    figures.legend(a.ax, [a.exp, a.fixed, a.outage], fontsize=7, loc="lower right")


_RETRY_FIGURE = figures.LiveFigure(6.0, 3.2, _build_retry, _draw_retry)


@explorer(
    "fleet.job_service",
    fail_pct=FloatRange(0.0, 50.0, 0.1, label="tries that fail (%)"),
    attempts=IntRange(1, 20, label="tries before the dead-letter queue"),
    base_s=FloatRange(0.1, 60.0, 0.1, label="first backoff (s)"),
    cap_s=FloatRange(1.0, 3600.0, 1.0, label="backoff cap (s)"),
    outage_s=FloatRange(1.0, 7200.0, 1.0, label="outage (s)"),
    fixed_s=FloatRange(0.1, 600.0, 0.1, label="fixed retry interval (s)"),
)
def job_service_view(fail_pct: float, attempts: int, base_s: float, cap_s: float, outage_s: float,
                     fixed_s: float) -> View:
    """W07: a job's tries against time under capped exponential backoff and a fixed interval, the
    dead-letter probability and mean tries for independent failures, and whether the schedule
    outlives an outage."""
    from lib.fleet import job_service as js

    if cap_s < base_s:
        raise ValueError(f"the backoff cap ({sig(cap_s)} s) must be at least the first backoff ({sig(base_s)} s)")
    if fail_pct >= 50.0 + 1e-12:
        raise ValueError("tries that fail must be below 50%")
    f = fail_pct / 100.0
    waits = js.backoff_schedule(base_s, cap_s, attempts)
    t_exp = np.concatenate([[0.0], np.cumsum(waits)])
    t_fix = fixed_s * np.arange(attempts, dtype=float)
    n_exp, n_fix = js.attempts_during_outage(outage_s, base_s, cap_s, fixed_s, attempts)
    span_exp, span_fix = float(t_exp[-1]), float(t_fix[-1])
    xmax = max(outage_s, span_exp, span_fix) * 1.1
    ys = np.arange(1, attempts + 1, dtype=float)
    rows = [("dead-letter probability (independent failures)", f"{sig(js.dead_letter_probability(f, attempts), 3)}"),
            ("mean tries per job", sig(js.expected_attempts(f, attempts), 4)),
            ("tries during the outage: backoff, fixed", f"{n_exp}, {n_fix}"),
            ("last try after: backoff, fixed", f"{sig(span_exp)} s, {sig(span_fix)} s"),
            ("a job that fails at the outage's start", "survives it (backoff)" if span_exp >= outage_s else
             "dead-letters before it ends (backoff)")]
    caption = (f"Tries one job makes against time: capped exponential backoff from {sig(base_s)} s to {sig(cap_s)} s "
               f"(solid) tries {n_exp} times in a {sig(outage_s)} s outage and its last try comes at {sig(span_exp)} s; "
               f"a fixed {sig(fixed_s)} s interval (dashed) tries {n_fix} times and gives up at {sig(span_fix)} s.")
    fig = _RETRY_FIGURE(np.append(t_exp, xmax), np.append(ys, ys[-1]), np.append(t_fix, xmax), np.append(ys, ys[-1]),
                        outage_s, xmax, attempts + 0.5)
    return View("Retries, backoff and the dead-letter queue", rows, fig, caption=caption,
                values={"n_exp": n_exp, "n_fixed": n_fix, "p_dlq": js.dead_letter_probability(f, attempts)})


# ---- N059 eval-pipeline: turnaround against GPUs, and the sharding that keeps them busy ------------------


def _build_eval(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.naive = ax.plot([1], [1], color="C3", lw=1.4, ls="--", label="whole evals, round-robin")[0]
    a.lpt = ax.plot([1], [1], color="C1", lw=1.6, label="whole evals, LPT")[0]
    a.chunk = ax.plot([1], [1], color="C0", lw=2.2, label="chunks, LPT")[0]
    a.here = ax.plot([1], [1], "o", color="k", ms=6, label="these GPUs")[0]
    figures.log_scale(ax, "both")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("turnaround per checkpoint (hours)")
    ax.grid(True)
    return a


def _draw_eval(a, gs, naive, lpt, chunk, g0, h0) -> None:
    a.naive.set_data(gs, naive)
    a.lpt.set_data(gs, lpt)
    a.chunk.set_data(gs, chunk)
    a.here.set_data([g0], [h0])
    a.ax.set_xlim(gs[0], gs[-1])
    lo, hi = float(min(chunk.min(), h0)), float(max(naive.max(), h0))
    a.ax.set_ylim(lo / 1.5, hi * 1.5)
    figures.legend(a.ax, [a.naive, a.lpt, a.chunk, a.here], fontsize=7, loc="upper right")


_EVAL_FIGURE = figures.LiveFigure(6.0, 3.2, _build_eval, _draw_eval)


def eval_turnaround(sizes, replicas: int, replica_s_per_prompt: float, start_s: float, chunk: int) -> dict:
    """Hours per checkpoint on ``replicas`` replicas for the three placements: makespan (prompts) x
    replica-seconds per prompt, plus one replica start; and the balanced lower bound."""
    from lib.fleet import eval_pipeline as ep

    out = {"naive": ep.makespan(sizes, replicas, "naive")[0], "lpt": ep.makespan(sizes, replicas, "lpt")[0],
           "chunk": ep.makespan_chunked_lpt(sizes, chunk, replicas),
           "bound": max(float(sum(int(s) for s in sizes)) / replicas, float(min(chunk, max(int(s) for s in sizes))))}
    return {k: (v * replica_s_per_prompt + start_s) / 3600 for k, v in out.items()}


@explorer(
    "fleet.eval_pipeline",
    model=Choice(("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "a100-sxm", "b200"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    n_evals=IntRange(10, 5000, label="evals"),
    mean_prompts=IntRange(10, 50000, label="mean prompts per eval"),
    sigma=FloatRange(0.0, 2.5, 0.05, label="spread of eval sizes (log)"),
    prompt_len=IntRange(16, 16384, label="prompt tokens"),
    output_len=IntRange(1, 4096, label="output tokens"),
    n_gpus=IntRange(1, 4096, label="GPUs"),
    chunk=IntRange(16, 100000, label="chunk (prompts)"),
    seed=IntRange(0, 10000, label="seed of the eval sizes"),
)
def eval_pipeline_view(model: str, gpu: str, tp: int, n_evals: int, mean_prompts: int, sigma: float,
                       prompt_len: int, output_len: int, n_gpus: int, chunk: int, seed: int = 0) -> View:
    """N059: one checkpoint's suite as a batch job: prompts, GPU-hours, dollars and the turnaround
    against GPUs for round-robin whole evals, LPT whole evals and LPT chunks."""
    from lib.fleet import eval_pipeline as ep
    from lib.fleet.capacity import replica_start_s
    from lib.perf.deployment import deployment

    dep = deployment(model, gpu, tp=tp)
    dep.mdl.check_context(prompt_len + output_len, "prompt_len + output_len")
    sizes = ep.eval_sizes(n_evals, float(mean_prompts), sigma, seed=seed)
    run = ep.run_cost(dep, int(sizes.sum()), prompt_len, output_len, n_gpus)
    start = replica_start_s(dep).total_s
    here = eval_turnaround(sizes, run.replicas, run.replica_s_per_prompt, start, chunk)
    top = max(n_gpus, 8 * tp)
    gs = np.unique(np.geomspace(tp, max(top * 4, tp * 2), 10).astype(int) // tp * tp)
    gs = gs[gs >= tp]
    curves = {k: [] for k in ("naive", "lpt", "chunk")}
    for g in gs:
        t = eval_turnaround(sizes, int(g) // tp, run.replica_s_per_prompt, start, chunk)
        for k in curves:
            curves[k].append(t[k])
    rows = [("prompts per checkpoint", fmt_int(run.prompts)),
            ("tokens in, out", f"{sig(run.input_tokens / 1e9, 3)} B, {sig(run.output_tokens / 1e9, 3)} B"),
            ("batch (KV pool)", fmt_int(run.batch)),
            ("GPU-hours, cost", f"{sig(run.gpu_hours, 3)} h, ${sig(run.usd, 3)}"),
            (f"turnaround on {n_gpus} GPUs: chunks LPT", f"{sig(here['chunk'], 3)} h"),
            ("whole evals LPT, round-robin", f"{sig(here['lpt'], 3)} h, {sig(here['naive'], 3)} h")]
    balanced_h = (run.prompts / run.replicas * run.replica_s_per_prompt + start) / 3600
    near = here["chunk"] <= 1.1 * balanced_h
    caption = (f"Hours per checkpoint against GPUs (log-log) for {fmt_int(run.prompts)} prompts on {dep.label} "
               f"replicas: chunks of {chunk} placed largest-first (solid) "
               + ("stay near the balanced time, " if near else
                  f"take {sig(here['chunk'] / balanced_h, 3)}× the balanced time here (too coarse for these replicas), ")
               + f"{sig(here['chunk'], 3)} h on {n_gpus} GPUs; whole evals round-robin take {sig(here['naive'], 3)} h.")
    fig = _EVAL_FIGURE(gs.astype(float), np.array(curves["naive"]), np.array(curves["lpt"]), np.array(curves["chunk"]),
                       float(n_gpus), float(here["chunk"]))
    return View("The eval suite as a batch job", rows, fig, caption=caption,
                values={"chunk_h": here["chunk"], "lpt_h": here["lpt"], "naive_h": here["naive"],
                        "gpu_hours": run.gpu_hours})
