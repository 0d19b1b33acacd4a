"""Explorers for constrained decoding (I051, I062, I052): what a grammar's token mask costs per
decode step, naive against precompiled (:mod:`lib.decoding.grammar`), priced by counted transitions.

Views call lib only; each figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.units import fmt_bytes, fmt_int, fmt_pct, fmt_time, sig

SCHEMA_NAMES = ("person", "tool_call", "enum_only")
VOCAB_MODELS = ("llama-3.1-8b", "qwen2.5-72b", "llama-2-7b", "gpt3-175b")


def stored_keys() -> list[tuple[str, int, int]]:
    """The (schema, vocab_size, seed) arguments of :func:`lib.decoding.grammar.document_steps` this explorer
    can ask for: the table ``grammar_document_steps`` of :mod:`lib.registry.derived` stores them."""
    from lib.registry.models import model as get_model

    vocabs = sorted({get_model(m).vocab_size for m in VOCAB_MODELS})
    return [(s, v, 0) for s in SCHEMA_NAMES for v in vocabs]


def _priced(steps: dict, vocab: int, transition_ns: float) -> dict:
    """The counts of :func:`lib.decoding.grammar.document_steps` priced by :func:`lib.decoding.grammar.mask_time_s`."""
    from lib.decoding import grammar as g

    def price(t) -> float:
        return g.mask_time_s(float(t), vocab, transition_ns)

    return {"steps": steps, "vocab": vocab, "pieces": steps["pieces"],
            "naive_s": np.array([price(t) for t in steps["transitions"]]),
            "trie_s": np.array([price(t) for t in steps["trie"]]),
            "pre_s": np.array([price(t) for t in steps["runtime_trie"]]),
            "worst_naive_s": price(steps["worst_transitions"]), "worst_pre_s": price(steps["worst_runtime_trie"]),
            "bitmask_bytes": g.bitmask_bytes(vocab)}


def mask_steps(schema: str, model: str, transition_ns: float, stored: bool = False) -> dict:
    """Per decode step of the schema's example document (its canonical toy tokens): the naive mask,
    the naive mask over a trie, and XGrammar's precompiled mask (cached part + run-time checks of the
    context-dependent tokens over a trie), each priced by :func:`lib.decoding.grammar.mask_time_s`;
    seconds. Also the pieces, the worst state and the bitmask bytes (``steps``: the counts of
    :func:`lib.decoding.grammar.document_steps`). Computed through lib, with ``costs`` the whole
    :class:`lib.decoding.grammar.SchemaCosts`; with ``stored`` (the explorer), the counts come from the
    derived table ``grammar_document_steps`` (:mod:`lib.registry.derived`) where it holds them, and
    ``costs`` is left out."""
    from lib.decoding import grammar as g
    from lib.registry import derived
    from lib.registry.models import model as get_model

    vocab = get_model(model).vocab_size
    if stored:
        return _priced(derived.lookup("grammar_document_steps", (schema, vocab, 0)), vocab, transition_ns)
    return {"costs": g.schema_costs(schema, vocab), **_priced(g.document_steps(schema, vocab), vocab, transition_ns)}


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.98, bottom=0.30, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.naive, = ax.step([], [], where="mid", lw=2, color="C3", label="naive: walk every token")
    a.trie, = ax.step([], [], where="mid", lw=1.5, color="C1", label="naive over a token trie")
    a.pre, = ax.step([], [], where="mid", lw=2, color="C0", label="precompiled (XGrammar split)")
    ax.set_ylabel("mask time per request (µs)")
    figures.log_scale(ax, "y")
    ax.grid(True, axis="y")
    return a


def _draw(a, pieces, naive_us, trie_us, pre_us) -> None:
    x = np.arange(len(pieces))
    a.naive.set_data(x, naive_us)
    a.trie.set_data(x, trie_us)
    a.pre.set_data(x, pre_us)
    a.ax.set_xticks(x)
    a.ax.set_xticklabels([repr(p)[1:-1] for p in pieces], rotation=60, fontsize=7, ha="right")
    a.ax.set_xlim(-0.5, len(pieces) - 0.5)
    a.ax.set_ylim(0.5 * min(pre_us), 2 * max(naive_us))
    figures.legend(a.ax, [a.naive, a.trie, a.pre], loc="center right", fontsize=7)


_FIGURE = figures.LiveFigure(6.4, 3.4, _build, _draw)


@explorer(
    "decoding.grammar_mask",
    schema=Choice(SCHEMA_NAMES, label="schema"),
    model=Choice(VOCAB_MODELS, label="vocabulary of"),
    transition_ns=FloatRange(1.0, 100.0, 1.0, label="ns per byte transition"),
)
def grammar_mask(schema: str, model: str, transition_ns: float) -> View:
    """I051: the token mask at every decode step of one document, naive against precompiled."""
    r = mask_steps(schema, model, transition_ns, stored=True)
    d = r["steps"]
    us = 1e6
    fig = _FIGURE(r["pieces"], r["naive_s"] * us, r["trie_s"] * us, r["pre_s"] * us)
    rows = [("vocabulary", f"{fmt_int(r['vocab'])} tokens (toy, built like {model}'s)"),
            ("bitmask per request per step", fmt_bytes(r["bitmask_bytes"], "KiB")),
            ("automaton states", fmt_int(d["states"])),
            ("naive mask, worst state (in a string)", f"{fmt_int(d['worst_transitions'])} transitions, "
                                                       f"{fmt_time(r['worst_naive_s'])}"),
            ("naive mask, mean over the document", fmt_time(float(np.mean(r["naive_s"])))),
            ("context-dependent tokens, worst state", f"{fmt_int(d['worst_dependent'])} "
                                                       f"({fmt_pct(d['worst_dependent'] / r['vocab'])} of the vocabulary)"),
            ("precompiled mask, same state", fmt_time(r["worst_pre_s"])),
            ("speed-up at that state", f"{sig(r['worst_naive_s'] / r['worst_pre_s'])}x")]
    caption = (f"Mask time per request at each of the {len(r['pieces'])} decode steps of {d['document']}: the naive walk "
               f"(red) costs {fmt_time(float(np.min(r['naive_s'])))} to {fmt_time(float(np.max(r['naive_s'])))} per step, "
               f"the precompiled mask (blue) {fmt_time(float(np.min(r['pre_s'])))} to {fmt_time(float(np.max(r['pre_s'])))}.")
    note = ("Every naive step looks at every token at least once; inside a string almost every token is walked to "
            "its end. The precompiled mask only walks the few tokens that can leave the current rule.")
    return View(f"Token mask per step: {schema} on a {fmt_int(r['vocab'])}-token vocabulary", rows, fig, note=note,
                caption=caption, values={"worst_naive_s": r["worst_naive_s"], "worst_pre_s": r["worst_pre_s"]})


# ---- I062: where the mask is computed, against the forward pass ----------------------------------

OVERLAP_MODELS = ("llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b")
OVERLAP_GPUS = ("h100-sxm", "h200", "a100-sxm", "l4")
MASK_KINDS = ("precompiled", "naive")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def mask_per_request_s(schema: str, vocab_size: int, kind: str, transition_ns: float | None = None) -> float:
    """Mean host time of one request's mask over the decode steps of the schema's example document:
    :func:`lib.decoding.grammar.mask_time_s` of the run-time transitions (``precompiled``: the
    context-dependent tokens over a trie; ``naive``: every token), seconds."""
    from lib.decoding import grammar as g

    if kind not in MASK_KINDS:
        raise ValueError(f"kind must be one of {MASK_KINDS}, got {kind!r}")
    c = g.schema_costs(schema, vocab_size)
    work = c.runtime_trie if kind == "precompiled" else c.transitions
    return float(np.mean([g.mask_time_s(int(work[q]), vocab_size, transition_ns) for q in c.trace]))


def overlap_curve(model: str, gpu: str, context: int, mask_s: float, threads: int, batches=BATCHES) -> dict:
    """Per batch size: the forward (``decode_step`` total minus its host time), the host time, and the
    step with masks for each placement (:func:`lib.decoding.grammar.masked_step`), seconds."""
    from lib.decoding import grammar as g
    from lib.perf.deployment import deployment
    from lib.perf.step import decode_step

    dep = deployment(model, gpu)
    dep.mdl.check_context(context + 1)
    out = {"dep": dep, "batches": list(batches), "forward_s": [], "host_s": [],
           **{p: [] for p in g.PLACEMENTS}}
    for b in batches:
        s = decode_step(dep, b, context)
        f = s.total_s - s.host_s
        out["forward_s"].append(f)
        out["host_s"].append(s.host_s)
        for p in g.PLACEMENTS:
            out[p].append(g.masked_step(f, s.host_s, mask_s, b, p, threads if p == "pool" else 1, 1,
                                        dep.mdl.vocab_size))
    return out


def _build_overlap(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.98, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.serial, = ax.plot([], [], "o-", lw=2, ms=3, color="C3", label="serial on the scheduler thread")
    a.sched, = ax.plot([], [], "o-", lw=2, ms=3, color="C1", label="overlapped, scheduler thread")
    a.pool, = ax.plot([], [], "o-", lw=2, ms=3, color="C0", label="overlapped, worker pool")
    a.base, = ax.plot([], [], "--", lw=1.2, color="grey", label="no grammar")
    ax.set_xlabel("batch (requests, all structured)")
    ax.set_ylabel("step time (ms)")
    figures.log_scale(ax, "both", base=2)
    ax.grid(True)
    return a


def _draw_overlap(a, batches, serial_ms, sched_ms, pool_ms, base_ms) -> None:
    a.serial.set_data(batches, serial_ms)
    a.sched.set_data(batches, sched_ms)
    a.pool.set_data(batches, pool_ms)
    a.base.set_data(batches, base_ms)
    a.ax.set_xlim(batches[0], batches[-1])
    a.ax.set_ylim(0.8 * min(base_ms), 1.25 * max(serial_ms))
    figures.legend(a.ax, [a.serial, a.sched, a.pool, a.base], loc="upper left", fontsize=7)


_OVERLAP = figures.LiveFigure(6.2, 3.3, _build_overlap, _draw_overlap)


@explorer(
    "decoding.mask_overlap",
    model=Choice(OVERLAP_MODELS, label="model"),
    gpu=Choice(OVERLAP_GPUS, label="GPU"),
    schema=Choice(SCHEMA_NAMES, label="schema"),
    mask=Choice(MASK_KINDS, label="mask"),
    threads=Choice((2, 4, 8, 16), label="pool threads"),
)
def mask_overlap(model: str, gpu: str, schema: str, mask: str, threads: int) -> View:
    """I062: the step time with grammar masks per placement, against the batch size."""
    from lib.registry.models import model as get_model

    m = mask_per_request_s(schema, get_model(model).vocab_size, mask)
    r = overlap_curve(model, gpu, 1024, m, threads)
    ms = 1e3
    base = [(f + h) * ms for f, h in zip(r["forward_s"], r["host_s"], strict=True)]
    ser = [x.step_s * ms for x in r["serial"]]
    sch = [x.step_s * ms for x in r["scheduler"]]
    pool = [x.step_s * ms for x in r["pool"]]
    fig = _OVERLAP(r["batches"], ser, sch, pool, base)
    hidden = [b for b, x in zip(r["batches"], r["scheduler"], strict=True) if x.mask_s <= x.forward_s]
    last = hidden[-1] if hidden else None
    rows = [("mask per request (mean over the document)", fmt_time(m)),
            ("forward at batch 64", fmt_time(r["forward_s"][BATCHES.index(64)])),
            ("largest batch the scheduler thread hides", f"{last:,}" if last else "none"),
            ("slowdown at batch 256: serial / scheduler / pool",
             " / ".join(f"{sig(r[p][BATCHES.index(256)].slowdown)}x" for p in ("serial", "scheduler", "pool")))]
    caption = (f"Step time of {r['dep'].label} at 1,024 tokens of context with every request constrained by the "
               f"{schema} schema ({mask} mask, {fmt_time(m)} per request): serial (red) against overlapped on the "
               f"scheduler thread (orange) and on {threads} threads (blue); dashed, no grammar.")
    return View(f"Mask placement vs batch: {model} on {gpu}", rows, fig, caption=caption,
                note="Overlapped masks cost nothing while their CPU time fits inside the forward pass; past that, "
                     "the step waits for the CPU.",
                values={"mask_s": m, "serial_256": r["serial"][BATCHES.index(256)].step_s})


# ---- I052: one schema in production ---------------------------------------------------------------------------


def production_numbers(schema: str, model: str, gpu: str, batch: int, context: int = 1024,
                       transition_ns: float | None = None) -> dict:
    """The numbers I052 puts together for one schema: the compile (walking the vocabulary from every state,
    token by token and over a trie), the decode step at ``batch``, the mean precompiled mask per request,
    and jump-forward decoding of the example document without and with token healing. Seconds."""
    from lib.decoding import grammar as g
    from lib.decoding.tokenizer import toy_tokenizer
    from lib.perf.deployment import deployment
    from lib.perf.step import decode_step

    dep = deployment(model, gpu)
    dep.mdl.check_context(context + 64)
    vocab = dep.mdl.vocab_size
    c = g.schema_costs(schema, vocab)
    ns = transition_ns
    step = decode_step(dep, batch, context)
    tok = toy_tokenizer(vocab)
    jf = g.jump_forward(c.dfa, tok, c.document)
    healed = g.jump_forward(c.dfa, tok, c.document, heal=True)
    return {"dep": dep, "costs": c, "tok": tok, "step": step, "vocab": vocab,
            "compile_s": g.mask_time_s(int(c.transitions.sum()), vocab, ns) + (c.states - 1) * g.mask_time_s(0, vocab, ns),
            "compile_trie_s": g.mask_time_s(int(c.trie.sum()), vocab, ns) + (c.states - 1) * g.mask_time_s(0, vocab, ns),
            "mask_s": mask_per_request_s(schema, vocab, "precompiled", ns), "jf": jf, "healed": healed}


def _build_prod(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.36, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.barh(range(4), [1, 1, 1, 1], color=["C7", "C3", "C0", "C2"])
    a.labels = [ax.text(0, i, "", va="center", fontsize=7) for i in range(4)]
    ax.set_yticks(range(4))
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds")
    ax.grid(True, axis="x")
    return a


def _draw_prod(a, names, values_ms) -> None:
    for bar, lab, v in zip(a.bars, a.labels, values_ms, strict=True):
        bar.set_width(v)
        lab.set_x(v)
        lab.set_text(f" {sig(v)}")
    a.ax.set_yticklabels(names, fontsize=7)
    a.ax.set_xlim(0, 1.25 * max(values_ms))


_PROD = figures.LiveFigure(6.2, 2.8, _build_prod, _draw_prod)


@explorer(
    "decoding.structured_output",
    schema=Choice(SCHEMA_NAMES, label="schema"),
    model=Choice(OVERLAP_MODELS, label="model"),
    gpu=Choice(OVERLAP_GPUS, label="GPU"),
    batch=Choice(BATCHES, label="batch"),
)
def structured_output(schema: str, model: str, gpu: str, batch: int) -> View:
    """I052: one schema's compile, mask and jump-forward numbers against the step time."""
    r = production_numbers(schema, model, gpu, batch)
    s = r["step"].total_s
    jf, healed = r["jf"], r["healed"]
    n = len(jf.canonical)
    names = ["compile on the scheduler thread (one stall)", f"document, {n} sampled tokens",
             f"jump-forward, {jf.model_steps} sampled", f"jump-forward + healing, {healed.model_steps} sampled"]
    vals = [r["compile_s"] * 1e3, n * s * 1e3, jf.model_steps * s * 1e3, healed.model_steps * s * 1e3]
    fig = _PROD(names, vals)
    rows = [("decode step at this batch", fmt_time(s)),
            ("compile, token by token / over a trie", f"{fmt_time(r['compile_s'])} / {fmt_time(r['compile_trie_s'])}"),
            ("precompiled mask per request, batch total", f"{fmt_time(r['mask_s'])}, {fmt_time(batch * r['mask_s'])}"),
            ("jump-forward tokens off the canonical tokenization", f"{jf.off_canonical} of {len(jf.pieces)}"),
            ("with token healing", f"{healed.off_canonical} of {len(healed.pieces)}")]
    caption = (f"For the {schema} schema on {model} / {gpu} at batch {batch}: one compile on the scheduler thread "
               f"({fmt_time(r['compile_s'])}) against the time to decode the example document plainly "
               f"({fmt_time(n * s)}), with jump-forward ({fmt_time(jf.model_steps * s)}) and with healing "
               f"({fmt_time(healed.model_steps * s)}).")
    return View(f"Structured output in production: {schema}", rows, fig, caption=caption,
                note="A compile on the scheduler thread stalls every running request; jump-forward saves decode steps "
                     "but, without healing, feeds the model token splits it never saw.",
                values={"compile_s": r["compile_s"], "off_canonical": jf.off_canonical})
