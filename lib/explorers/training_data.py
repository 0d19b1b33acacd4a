"""Explorers for the data-pipeline questions (N060, N044, N045, N043): where a pre-training
corpus spends its CPU (:mod:`lib.training.data_pipeline`), tokenizer core-days, and the MinHash
LSH candidate curve (:mod:`lib.training.dedup`).

Views call lib only; each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_unit, sig

VOCABS = (32_000, 32_768, 50_257, 65_536, 128_256, 129_280, 152_064, 262_144)


def pipeline_table(tokens_t: float, vocab_size: int, deadline_days: float, minhash_hashes: int,
                   chars_per_token: float) -> dict:
    """The pipeline's stage loads for ``tokens_t`` trillion training tokens: raw crawl bytes, each
    stage's bytes in / out, core-days and cores to finish in ``deadline_days``."""
    from lib.training import data_pipeline as dp

    stages = dp.pipeline_stages(vocab_size, minhash_hashes=minhash_hashes, chars_per_token=chars_per_token)
    raw = dp.raw_bytes_for_tokens(tokens_t * 1e12, stages, chars_per_token=chars_per_token)
    loads = dp.pipeline_loads(raw, stages)
    return {"raw": raw, "loads": loads, "deadline_s": deadline_days * dp.DAY_S}


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.3, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    bars = ax.barh(range(5), [1.0] * 5, color="C0")
    ax.set_yticks(range(5))
    ax.invert_yaxis()
    ax.set_xlabel("CPU core-days (log scale)")
    figures.log_scale(ax, "x")
    ax.grid(True, axis="x")
    return SimpleNamespace(ax=ax, bars=bars)


def _draw(a, labels, core_days, top) -> None:
    for i, (bar, v) in enumerate(zip(a.bars, core_days, strict=True)):
        bar.set_width(v)
        bar.set_color("C3" if i in top else "C0")
    a.ax.set_yticks(range(len(labels)), labels, fontsize=7)
    lo, hi = min(core_days), max(core_days)
    a.ax.set_xlim(lo / 3, hi * 3)


_FIGURE = figures.LiveFigure(6.0, 2.8, _build, _draw)


@explorer(
    "training.data_pipeline",
    tokens_t=FloatRange(0.1, 100.0, 0.1, label="training tokens (trillions)"),
    vocab_size=Choice(VOCABS, label="vocabulary size"),
    deadline_days=FloatRange(1.0, 90.0, 1.0, label="deadline (days)"),
    minhash_hashes=IntRange(1, 20000, label="MinHash hashes per document"),
    chars_per_token=FloatRange(2.5, 6.0, 0.01, label="characters per token"),
)
def data_pipeline(tokens_t: float, vocab_size: int, deadline_days: float, minhash_hashes: int,
                  chars_per_token: float) -> View:
    """N060: the CPU core-days each stage of the data pipeline costs, and the cores for a deadline."""
    r = pipeline_table(tokens_t, vocab_size, deadline_days, minhash_hashes, chars_per_token)
    loads, dl = r["loads"], r["deadline_s"]
    order = sorted(range(len(loads)), key=lambda i: -loads[i].core_s)
    top = set(order[:2])
    total = sum(ld.core_s for ld in loads)
    rows = [("raw crawl to read", fmt_bytes(r["raw"], "TB")),
            ("token shards written", fmt_bytes(loads[-1].bytes_out, "TB"))]
    rows += [(ld.stage.label, f"{fmt_bytes(ld.bytes_in, 'TB')} in, {sig(ld.core_days)} core-days, "
              f"{fmt_int(ld.cores_for(dl))} cores") for ld in loads]
    a, b = loads[order[0]], loads[order[1]]
    share = (a.core_s + b.core_s) / total
    caption = (f"CPU core-days per stage for {sig(tokens_t)}T tokens (log scale). The two largest (red), "
               f"{a.stage.label} ({sig(a.core_days)}) and {b.stage.label} ({sig(b.core_days)}), are "
               f"{sig(100 * share)}% of the {sig(total / 86400)} core-days.")
    fig = _FIGURE([ld.stage.label for ld in loads], [ld.core_days for ld in loads], top)
    return View(f"Data pipeline for {sig(tokens_t)}T tokens in {sig(deadline_days)} days",
                rows, fig, caption=caption,
                note=f"cores for the whole pipeline in the deadline: {fmt_unit(total / dl, 'cores')}",
                values={"raw_bytes": r["raw"], "total_core_s": total})


def tokenize_job_numbers(model_name: str, gpu_name: str, n_gpus: int, seq_len: int, mfu: float, tokens_t: float,
                         chars_per_token: float, core_mb_s: float, batch_cores: int) -> dict:
    """N044's numbers: text bytes, tokenizer core-days and wall-clock on ``batch_cores`` cores, shard
    bytes, and what tokenizing on the fly would cost the training job (its token rate from the fleet
    equation x bytes per token / the per-core rate)."""
    from lib.inputs import integer, real
    from lib.registry.models import model
    from lib.training import data_pipeline as dp
    from lib.training.flops import training_tokens_per_s

    m = model(model_name)
    tokens = real("tokens_t", tokens_t, 0, low_open=True) * 1e12
    rate = real("core_mb_s", core_mb_s, 0, low_open=True, unit="MB/s") * 1e6
    cores = integer("batch_cores", batch_cores, 1)
    bpt = dp.bytes_per_token(chars_per_token)
    text = tokens * bpt
    core_days = dp.tokenizer_core_days(text, rate)
    train = training_tokens_per_s(m, seq_len, n_gpus, gpu_name, mfu)
    return {"tokens": tokens, "vocab": m.vocab_size, "token_bytes": dp.token_bytes(m.vocab_size), "text_bytes": text,
            "core_days": core_days, "wall_s": core_days * dp.DAY_S / cores,
            "shard_bytes": dp.shard_bytes(tokens, m.vocab_size), "train_tokens_per_s": train,
            "train_text_bytes_per_s": train * bpt, "onfly_cores": train * bpt / rate, "epochs_per_run": 1,
            "read_bytes_per_s": dp.loader_bytes_per_s(train, m.vocab_size)}


def wall_text(seconds: float) -> str:
    """A wall-clock duration in minutes, hours or days, whichever reads best."""
    if seconds < 3600:
        return f"{sig(seconds / 60)} minutes"
    if seconds < 48 * 3600:
        return f"{sig(seconds / 3600)} hours"
    return f"{sig(seconds / 86400)} days"


def _build_tok(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.line, = ax.plot([], [], lw=2, color="C0", label="batch job wall-clock")
    a.mark, = ax.plot([], [], "o", color="C3", ms=7, label="chosen cores")
    a.onfly = ax.axvline(1.0, color="grey", ls="--", lw=1.2, label="cores to tokenize on the fly")
    ax.set_xlabel("CPU cores")
    ax.set_ylabel("wall-clock (hours)")
    figures.log_scale(ax, "both")
    ax.grid(True)
    return a


def _draw_tok(a, cores, hours, at_cores, at_hours, onfly) -> None:
    a.line.set_data(cores, hours)
    a.mark.set_data([at_cores], [at_hours])
    a.onfly.set_xdata([onfly, onfly])
    lo_x, hi_x = min(cores[0], onfly) / 2, max(cores[-1], onfly) * 2
    a.ax.set_xlim(lo_x, hi_x)
    a.ax.set_ylim(min(hours[-1], at_hours) / 3, max(hours[0], at_hours) * 3)
    figures.legend(a.ax, [a.line, a.mark, a.onfly], loc="upper right", fontsize=7)


_TOK_FIGURE = figures.LiveFigure(6.0, 3.0, _build_tok, _draw_tok)


@explorer(
    "training.tokenize_job",
    tokens_t=FloatRange(0.1, 100.0, 0.1, label="tokens (trillions)"),
    chars_per_token=FloatRange(2.5, 6.0, 0.01, label="characters per token"),
    core_mb_s=FloatRange(0.05, 20.0, 0.05, label="tokenizer MB/s per core"),
    batch_cores=IntRange(16, 65536, log=True, label="cores of the batch job"),
    train_mtok_s=FloatRange(0.0001, 1000.0, 0.0001, label="training job's million tokens/s"),
)
def tokenize_job(tokens_t: float, chars_per_token: float, core_mb_s: float, batch_cores: int,
                 train_mtok_s: float) -> View:
    """N044: the tokenization batch job's wall-clock against its cores, and the cores on the fly."""
    from lib.training import data_pipeline as dp

    text = tokens_t * 1e12 * dp.bytes_per_token(chars_per_token)
    core_days = dp.tokenizer_core_days(text, core_mb_s * 1e6)
    cores = [float(2**k) for k in range(4, 17)]
    hours = [core_days * 24 / c for c in cores]
    at_hours = core_days * 24 / batch_cores
    onfly = train_mtok_s * 1e6 * dp.bytes_per_token(chars_per_token) / (core_mb_s * 1e6)
    fig = _TOK_FIGURE(cores, hours, batch_cores, at_hours, onfly)
    rows = [("text to tokenize", fmt_bytes(text, "TB")), ("core-days", sig(core_days)),
            (f"wall-clock on {batch_cores:,} cores", wall_text(at_hours * 3600)),
            ("cores to tokenize on the fly", sig(onfly))]
    caption = (f"Wall-clock of tokenizing {sig(tokens_t)}T tokens against the cores (blue; {sig(core_days)} "
               f"core-days at {sig(core_mb_s)} MB/s a core): {wall_text(at_hours * 3600)} on {batch_cores:,} cores "
               f"(red). The dashed line, {sig(onfly)} cores, is what tokenizing on the fly at the training job's "
               f"{sig(train_mtok_s)} million tokens/s would take.")
    return View(f"Tokenizing {sig(tokens_t)}T tokens", rows, fig, caption=caption,
                values={"core_days": core_days, "onfly_cores": onfly})


def _build_lsh(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve, = ax.plot([], [], lw=2, color="C0", label="P(candidate) = 1 - (1 - s^r)^b")
    a.thr = ax.axvline(0.5, color="C3", ls="--", lw=1.2, label="duplicate threshold")
    a.turn = ax.axvline(0.5, color="grey", ls=":", lw=1.2, label="(1/b)^(1/r)")
    a.mark, = ax.plot([], [], "o", color="C3", ms=6)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("Jaccard similarity s of a pair")
    ax.set_ylabel("probability the pair is a candidate")
    ax.grid(True)
    return a


def _draw_lsh(a, s, p, threshold, p_thr, turn) -> None:
    a.curve.set_data(s, p)
    a.thr.set_xdata([threshold, threshold])
    a.turn.set_xdata([turn, turn])
    a.mark.set_data([threshold], [p_thr])
    figures.legend(a.ax, [a.curve, a.thr, a.turn], loc="upper left", fontsize=7)


_LSH_FIGURE = figures.LiveFigure(6.0, 3.0, _build_lsh, _draw_lsh)


@explorer(
    "training.lsh_curve",
    bands=IntRange(1, 1000, label="bands b"),
    rows=IntRange(1, 40, label="rows per band r"),
    threshold=FloatRange(0.3, 0.99, 0.01, label="duplicate threshold (Jaccard)"),
)
def lsh_curve(bands: int, rows: int, threshold: float) -> View:
    """N045: the LSH S-curve for b bands of r rows, and what it does at the threshold."""
    import numpy as np

    from lib.training import dedup as dd

    s = np.linspace(0.0, 1.0, 201)
    p = dd.candidate_probability(s, rows, bands)
    p_thr = dd.candidate_probability(threshold, rows, bands)
    p_half = dd.candidate_probability(0.5, rows, bands)
    turn = dd.lsh_threshold(rows, bands)
    fig = _LSH_FIGURE(s, p, threshold, p_thr, turn)
    rows_out = [("hashes per document", f"{bands * rows:,} ({bands} bands x {rows} rows)"),
                ("signature per document", fmt_bytes(dd.signature_bytes(1, bands * rows), "KB")),
                ("curve turns at (1/b)^(1/r)", sig(turn)),
                (f"P(candidate) at s = {sig(threshold)}", sig(p_thr)),
                (f"missed at s = {sig(threshold)}", f"{sig(100 * (1 - p_thr))}%"),
                ("P(candidate) at s = 0.5", sig(p_half))]
    caption = (f"Probability that a pair becomes a candidate against its Jaccard similarity, {bands} bands of {rows} "
               f"rows: the curve turns near {sig(turn)} (dotted); at the threshold {sig(threshold)} (dashed) it is "
               f"{sig(p_thr)}, and a pair at 0.5 is a candidate with probability {sig(p_half)}.")
    return View(f"LSH banding: {bands} x {rows}", rows_out, fig, caption=caption,
                values={"p_threshold": p_thr, "p_half": p_half, "turn": turn})


LOADER_MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b")
LOADER_GPUS = ("h100-sxm", "h200", "a100-sxm", "l4")


def loader_numbers(model_name: str, gpu_name: str, seq_len: int, micro_batch: int, mfu: float, tokenized: bool,
                   storage: str, batched_reads: bool, workers: int, pinned: bool) -> dict:
    """N043's numbers: one GPU's training rate (the fleet equation per GPU), its step for one
    micro-batch, and the loader's sinks, stall and fix ladder for the configuration."""
    from lib.training import data_pipeline as dp
    from lib.training.flops import training_tokens_per_s

    per_gpu = training_tokens_per_s(model_name, seq_len, 8, gpu_name, mfu) / 8
    step_s = micro_batch * seq_len / per_gpu
    cfg = dp.LoaderConfig(tokenized=tokenized, storage=storage, batched_reads=batched_reads, workers=workers,
                          pinned=pinned)
    ladder = dp.loader_fix_ladder(cfg, gpu_name, micro_batch, seq_len, step_s)
    return {"per_gpu": per_gpu, "step_s": step_s, "cfg": cfg, "now": ladder[0][2], "ladder": ladder}


def _build_loader(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.16, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.barh(range(4), [1.0] * 4, color="C0", label="loader work per step")
    a.step = ax.axvline(1.0, color="C3", ls="--", lw=1.2, label="the step it must keep up with")
    ax.set_yticks(range(4))
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step, one GPU (log scale)")
    figures.log_scale(ax, "x")
    ax.grid(True, axis="x")
    return a


def _draw_loader(a, labels, ms, step_ms) -> None:
    floor = max(min(ms), 1e-4)
    for bar, v in zip(a.bars, ms, strict=True):
        bar.set_width(max(v, floor / 10))
    a.ax.set_yticks(range(len(labels)), labels, fontsize=7)
    a.step.set_xdata([step_ms, step_ms])
    a.ax.set_xlim(floor / 20, max(max(ms), step_ms) * 3)
    figures.legend(a.ax, [a.bars, a.step], loc="lower right", fontsize=7)


_LOADER_FIGURE = figures.LiveFigure(6.0, 2.8, _build_loader, _draw_loader)


@explorer(
    "training.loader",
    model=Choice(LOADER_MODELS, label="model"),
    gpu=Choice(LOADER_GPUS, label="GPU"),
    seq_len=IntRange(512, 32768, log=True, label="sequence (tokens)"),
    micro_batch=IntRange(1, 64, log=True, label="sequences per GPU per step"),
    mfu=FloatRange(0.1, 0.7, 0.01, label="MFU"),
    tokenized=Choice((False, True), label="pre-tokenized shards"),
    storage=Choice(("network_storage", "local_nvme"), label="storage"),
    batched_reads=Choice((False, True), label="one read per batch"),
    workers=IntRange(0, 16, label="loader workers per GPU"),
    pinned=Choice((False, True), label="pinned + non_blocking"),
)
def loader(model: str, gpu: str, seq_len: int, micro_batch: int, mfu: float, tokenized: bool, storage: str,
           batched_reads: bool, workers: int, pinned: bool) -> View:
    """N043: the text loader's four sinks per step against the step, and the stall they leave."""
    r = loader_numbers(model, gpu, seq_len, micro_batch, mfu, tokenized, storage, batched_reads, workers, pinned)
    now = r["now"]
    labels = ["tokenize + parse", "read", "python per sample", "host-to-device copy"]
    ms = [1e3 * now.sinks[k] for k in ("tokenize", "read", "python", "copy")]
    fig = _LOADER_FIGURE(labels, ms, 1e3 * r["step_s"])
    rows = [("training rate per GPU", f"{fmt_int(r['per_gpu'])} tokens/s"),
            ("step (one micro-batch)", f"{sig(1e3 * r['step_s'])} ms"),
            *[(lab, f"{sig(v)} ms") for lab, v in zip(labels, ms, strict=True)],
            ("stall the step sees", f"{sig(1e3 * now.exposed_s)} ms"),
            ("GPU busy", f"{sig(100 * now.busy_fraction)}%")]
    caption = (f"Loader time per step on one GPU by sink (log scale) against the {sig(1e3 * r['step_s'])} ms step "
               f"(dashed): the step waits {sig(1e3 * now.exposed_s)} ms for data, so the GPU is busy "
               f"{sig(100 * now.busy_fraction)}% of the time.")
    return View(f"Text loader: {model} on {gpu}, {micro_batch} x {seq_len:,} tokens per step", rows, fig,
                caption=caption, values={"exposed_s": now.exposed_s, "step_s": r["step_s"]})
