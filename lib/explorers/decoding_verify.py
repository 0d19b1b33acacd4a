"""Explorers for verification in speculative decoding: the rejection-sampling verifier's exact output
distribution under a lossless or a biased rule (I089).

Calls lib only: :class:`lib.decoding.verify.ToyModel`, :func:`~lib.decoding.verify.stream_distribution`,
:func:`~lib.decoding.verify.target_stream_distribution`, :func:`~lib.decoding.verify.step_distribution`.
One persistent figure per explorer, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.decoding import verify as dv
from lib.numerics import reduction
from lib.units import fmt_pct, sig

RULES = ("lossless", *dv.BIASED_RULES)
STREAM_TOKENS = 2  # the explorer shows the distribution of the first two output tokens


def rule_named(name: str) -> dv.Rule:
    """The lossless rule or one of the biased ones, by name."""
    if name == "lossless":
        return dv.REFERENCE_RULE
    if name not in dv.BIASED_RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {name!r}")
    return dv.BIASED_RULES[name]


@functools.lru_cache(maxsize=64)
def rule_summary(vocab: int, draft_tokens: int, draft_noise: float, seed: int, rule: str,
                 stream_tokens: int = STREAM_TOKENS) -> dict:
    """Exact numbers of one rule on the seeded toy model: the output-stream distribution against the
    target's, total-variation distance, first-position acceptance, mean tokens emitted per step."""
    m = dv.ToyModel(vocab=vocab, draft_noise=draft_noise, seed=seed)
    r = rule_named(rule)
    got = dv.stream_distribution(m.target, m.draft, draft_tokens, stream_tokens, r)
    want = dv.target_stream_distribution(m.target, vocab, stream_tokens)
    step = dv.step_distribution(m.target, m.draft, draft_tokens, r)
    p0, q0 = m.target(()), m.draft(())
    return {
        "got": got,
        "want": want,
        "tv": dv.total_variation(got, want),
        "accept_first": float(np.sum(q0 * r.accept(p0, q0))),
        "tokens_per_step": sum(len(s) * pr for s, pr in step.items()),
    }


MAX_BARS = 25  # vocab 5, two tokens


def _build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    x = np.arange(MAX_BARS)
    a.want = ax.bar(x - 0.2, np.zeros(MAX_BARS), width=0.4, color="C0", label="target's own distribution")
    a.got = ax.bar(x + 0.2, np.zeros(MAX_BARS), width=0.4, color="C3", label="verifier's output")
    ax.set_xlabel("first two output tokens")
    ax.set_ylabel("probability")
    ax.grid(True, axis="y")
    return a


def _draw(a, labels, want, got) -> None:
    n = len(labels)
    for bars, vals in ((a.want, want), (a.got, got)):
        for i, bar in enumerate(bars):
            bar.set_visible(i < n)
            bar.set_height(vals[i] if i < n else 0.0)
    a.ax.set_xticks(np.arange(n), labels, rotation=90, fontsize=6)
    a.ax.set_xlim(-0.7, n - 0.3)
    a.ax.set_ylim(0, 1.15 * max(max(want), max(got)))
    figures.legend(a.ax, [a.want, a.got], loc="upper right", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "decoding.rejection_verifier",
    vocab=IntRange(2, 5, label="vocabulary"),
    draft_tokens=IntRange(1, 3, label="drafted tokens k"),
    draft_noise=FloatRange(0.0, 3.0, 0.1, label="draft logit noise"),
    seed=IntRange(0, 999),
    rule=Choice(RULES, label="verifier"),
)
def rejection_verifier(vocab: int, draft_tokens: int, draft_noise: float, seed: int, rule: str) -> View:
    """I089: the exact distribution of the first two output tokens under a verifier rule vs the target's."""
    s = rule_summary(vocab, draft_tokens, draft_noise, seed, rule)
    keys = sorted(s["want"])
    want = [s["want"][k] for k in keys]
    got = [s["got"].get(k, 0.0) for k in keys]
    fig = _FIGURE(["".join(map(str, k)) for k in keys], want, got)
    verdict = "identical to the target's (lossless)" if s["tv"] < 1e-9 else f"off by a total variation of {sig(s['tv'])}"
    rows = [
        ("total variation, first two tokens vs target", sig(s["tv"])),
        ("acceptance of the first draft", fmt_pct(s["accept_first"])),
        ("tokens emitted per step", sig(s["tokens_per_step"])),
    ]
    caption = (f"Blue is the target's own distribution of the first two tokens, red the verifier's output under the "
               f"{rule} rule: {verdict}. The first draft is accepted {fmt_pct(s['accept_first'])} of the time and a "
               f"step emits {sig(s['tokens_per_step'])} tokens on average.")
    return View("Exact output distribution of the verifier", rows, fig, caption=caption,
                values={"tv": s["tv"], "accept_first": s["accept_first"], "tokens_per_step": s["tokens_per_step"]})


FLIP_ROWS = 200
FLIP_VOCAB = 128
_GAP_BINS = np.arange(-9.0, 0.51, 0.5)


@functools.lru_cache(maxsize=32)
def flip_summary(log10_gap: float, split: int, hidden: int, seed: int, rows: int = FLIP_ROWS,
                 vocab: int = FLIP_VOCAB) -> dict:
    """I047: greedy argmax flips between two float32 reduction orders on seeded near-tie logits
    (:func:`lib.numerics.reduction.near_tie_problem`, :func:`lib.numerics.reduction.argmax_flips`)."""
    x, w1, w2 = reduction.near_tie_problem(rows, hidden, vocab, 10.0 ** log10_gap, 4.0, seed)
    h = x @ w1
    r = reduction.argmax_flips(h, w2, split, output_bf16=False)
    exact = np.sort(h.astype(np.float64) @ w2.astype(np.float64), axis=1)[:, -2:]
    gap = exact[:, 1] - exact[:, 0]
    return {"flips": len(r["flips"]), "flip_share": len(r["flips"]) / rows, "gap": gap,
            "flip_gap": gap[r["flips"]], "median_gap": float(np.median(gap)),
            "max_flip_gap": float(gap[r["flips"]].max()) if len(r["flips"]) else 0.0}


def _flip_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.all = ax.stairs(np.zeros(len(_GAP_BINS) - 1), _GAP_BINS, color="C0", label="all rows")
    a.flip = ax.stairs(np.zeros(len(_GAP_BINS) - 1), _GAP_BINS, color="C3", fill=True, alpha=0.6,
                       label="rows whose argmax flips")
    ax.set_xlabel("log10 of the top-two logit gap (exact)")
    ax.set_ylabel("rows")
    ax.grid(True)
    return a


def _flip_draw(a, all_counts, flip_counts) -> None:
    a.all.set_data(all_counts)
    a.flip.set_data(flip_counts)
    a.ax.set_ylim(0, 1.1 * max(1, max(all_counts)))
    figures.legend(a.ax, [a.all, a.flip], loc="upper left", fontsize=7)


_FLIP_FIGURE = figures.LiveFigure(6.0, 3.0, _flip_build, _flip_draw)


@explorer(
    "decoding.greedy_flips",
    log10_gap=FloatRange(-7.0, -2.0, 0.25, label="log10 twin-token gap"),
    split=IntRange(2, 16, label="split-K of the other shape"),
    hidden=IntRange(32, 128, label="hidden size"),
    seed=IntRange(0, 999),
)
def greedy_flips(log10_gap: float, split: int, hidden: int, seed: int) -> View:
    """I047: how often the greedy token differs when the same logits are reduced in another order."""
    s = flip_summary(log10_gap, split, hidden, seed)
    lg = np.log10(np.maximum(s["gap"], 1e-12))
    all_counts = np.histogram(np.clip(lg, _GAP_BINS[0], _GAP_BINS[-1]), _GAP_BINS)[0]
    flip_counts = np.histogram(np.clip(np.log10(np.maximum(s["flip_gap"], 1e-12)), _GAP_BINS[0], _GAP_BINS[-1]),
                               _GAP_BINS)[0]
    fig = _FLIP_FIGURE(all_counts, flip_counts)
    rows = [
        ("rows whose greedy token flips", f"{s['flips']} of {FLIP_ROWS} ({fmt_pct(s['flip_share'])})"),
        ("median top-two gap", sig(s["median_gap"])),
        ("largest gap that flipped", sig(s["max_flip_gap"]) if s["flips"] else "none flipped"),
    ]
    where = (f"{s['flips']} flip, all at gaps of at most {sig(s['max_flip_gap'])}, where float32 rounding of a "
             f"{hidden}-term sum reaches" if s["flips"] else "none flips: no gap is as small as float32 rounding")
    caption = (f"Top-two logit gaps of {FLIP_ROWS} seeded rows (blue) and the rows whose argmax differs between one "
               f"float32 accumulator and a {split}-way split-K (red): {where}.")
    return View("Greedy token flips from the reduction order", rows, fig, caption=caption,
                values={"flips": s["flips"], "max_flip_gap": s["max_flip_gap"]})


MAX_DRAFT = 8
_STATUS_COLORS = {"valid": "C2", "rolled back": "C3", "not written": "0.85"}


def one_step(seq_len: int, draft_tokens: int, accepted: int, eos_at: int, room: int, step=None):
    """I098: one greedy speculative step built to the given outcome, through ``step`` (default
    :func:`lib.decoding.bookkeeping.advance`; a grader draft to see what it does): ``accepted`` drafts
    match, the target's token at position ``eos_at`` (1-based among the step's candidate tokens; 0: none)
    is EOS, ``room`` output tokens are left before max_tokens. Returns (state before, state after)."""
    from lib.decoding import bookkeeping as bk

    if not 0 <= accepted <= draft_tokens:
        raise ValueError(f"accepted must be in 0..drafted tokens ({draft_tokens}), got {accepted}")
    if not 0 <= eos_at <= accepted + 1:
        raise ValueError(f"eos_at must be 0 (no EOS) or a candidate position 1..accepted + 1 = {accepted + 1}, "
                         f"got {eos_at}")
    drafted = list(range(1, draft_tokens + 1))
    target = drafted[:accepted] + [99] + list(range(50, 50 + draft_tokens - accepted))
    target = target[: draft_tokens + 1]
    if eos_at:
        target[eos_at - 1] = 0
        if eos_at <= accepted:
            drafted[eos_at - 1] = 0
    if accepted == draft_tokens:
        target[-1] = 0 if eos_at == accepted + 1 else 98
    before = bk.SpecState(seq_len - 1, 1 + room, 0, output=(5,), target_kv=seq_len - 1, draft_kv=seq_len - 1,
                          emitted=1)
    return before, (step or bk.advance)(before, tuple(drafted), tuple(target))


def _book_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.bar(np.arange(MAX_DRAFT + 1), np.ones(MAX_DRAFT + 1), color="0.85", edgecolor="k")
    a.texts = [ax.text(i, 0.5, "", ha="center", va="center", fontsize=7) for i in range(MAX_DRAFT + 1)]
    handles = [ax.bar([0], [0], color=c, label=s)[0] for s, c in _STATUS_COLORS.items()]
    a.handles = handles
    ax.set_yticks([])
    ax.set_ylim(0, 1.5)
    ax.set_xlabel("KV slot written by the verification pass (position)")
    return a


def _book_draw(a, positions, status, labels) -> None:
    for i, (bar, txt) in enumerate(zip(a.bars, a.texts, strict=True)):
        shown = i < len(positions)
        bar.set_visible(shown)
        txt.set_visible(shown)
        if shown:
            bar.set_color(_STATUS_COLORS[status[i]])
            bar.set_edgecolor("k")
            txt.set_text(labels[i])
    a.ax.set_xticks(np.arange(len(positions)), [str(p) for p in positions], fontsize=7)
    a.ax.set_xlim(-0.6, max(len(positions), 2) - 0.4)
    figures.legend(a.ax, a.handles, loc="upper right", fontsize=7, ncol=3)


_BOOK_FIGURE = figures.LiveFigure(6.0, 2.4, _book_build, _book_draw)


@explorer(
    "decoding.bookkeeping",
    seq_len=IntRange(2, 131072, label="sequence length before the step"),
    draft_tokens=IntRange(0, MAX_DRAFT, label="drafted tokens k"),
    accepted=IntRange(0, MAX_DRAFT, label="drafts accepted n"),
    eos_at=IntRange(0, MAX_DRAFT + 1, label="EOS at candidate (0: none)"),
    room=IntRange(1, 16, label="output tokens left before max_tokens"),
)
def bookkeeping(seq_len: int, draft_tokens: int, accepted: int, eos_at: int, room: int) -> View:
    """I098: the counts and KV slots of one speculative step with a rejection, EOS or cap."""
    before, after = one_step(seq_len, draft_tokens, accepted, eos_at, room)
    L = before.seq_len
    positions = list(range(L - 1, L + draft_tokens))
    status = ["valid" if p < after.target_kv else "rolled back" for p in positions]
    fed = ["last"] + [f"d{j + 1}" for j in range(draft_tokens)]
    fig = _BOOK_FIGURE(positions, status, fed)
    emitted = after.emitted - before.emitted
    nxt = (f"feeds position {after.next_input_position}, reads KV [0, {after.target_kv})" if not after.finished
           else f"none: finished ({after.finished})")
    rows = [
        ("drafted / accepted / emitted", f"{draft_tokens} / {accepted} / {emitted}"),
        ("target positions computed", str(draft_tokens + 1)),
        ("sequence length after", str(after.seq_len)),
        ("target KV valid / rolled back", f"{after.target_kv} / {after.rolled_back}"),
        ("drafter KV valid", str(after.draft_kv)),
        ("next target pass", nxt),
    ]
    caption = (f"The pass wrote {draft_tokens + 1} KV slots (positions {L - 1} to {L + draft_tokens - 1}): green stay "
               f"valid, red are rolled back ({after.rolled_back}). The step emitted {emitted} token(s) for {accepted} "
               f"accepted; next pass: {nxt}.")
    return View("One speculative step's bookkeeping", rows, fig, caption=caption,
                values={"emitted": emitted, "target_kv": after.target_kv, "rolled_back": after.rolled_back})


QUANT_CASES = ("BF16 draft and target", "FP8 self-draft", "FP8 target, per-token scales",
               "FP8 target, per-tensor scales", "FP8 KV, in-pass K/V at BF16")


@functools.lru_cache(maxsize=64)
def quantization_case(vocab: int, hidden: int, outlier_scale: float, draft_tokens: int, draft_mix: float, seed: int,
                      setup: str, stream_tokens: int = 2) -> dict:
    """I053: the exact distribution of the first ``stream_tokens`` output tokens under one FP8 ``setup``
    (one of ``QUANT_CASES``; :mod:`lib.decoding.quantized`), the distribution it should preserve
    (``own``) and the BF16 model's, with both total-variation distances."""
    from lib.decoding import quantized as dq

    if setup not in QUANT_CASES:
        raise ValueError(f"setup must be one of {', '.join(QUANT_CASES)}, got {setup!r}")
    m = _quant_model(vocab, hidden, outlier_scale, seed)
    other = _quant_model(vocab, hidden, outlier_scale, seed + 1)

    def small(c):
        return draft_mix * m.decode(c) + (1 - draft_mix) * other.decode(c)

    n, k = stream_tokens, draft_tokens
    pr = tuple(i % vocab for i in (1, 2, 3))  # a short prompt: its K/V sit in the cache
    flags, draft, own_flags = {
        QUANT_CASES[0]: ({}, small, {}),
        QUANT_CASES[1]: ({}, lambda c: m.decode(c, fp8_linear=True), {}),
        QUANT_CASES[2]: ({"fp8_linear": True, "per_token": True}, small, {"fp8_linear": True}),
        QUANT_CASES[3]: ({"fp8_linear": True}, small, {"fp8_linear": True}),
        QUANT_CASES[4]: ({"fp8_kv": True}, small, {"fp8_kv": True}),
    }[setup]
    got = dq.pass_stream_distribution(lambda c, xs: m.verify_pass(c, xs, **flags), draft, k, n, pr)
    own = dq.stream_of(lambda c: m.decode(c, **own_flags), vocab, n, pr)
    bf16 = dq.stream_of(m.decode, vocab, n, pr)
    p0 = m.decode(pr)
    return {"got": got, "own": own, "bf16": bf16, "tv_own": dv.total_variation(got, own),
            "tv_bf16": dv.total_variation(got, bf16), "accept": float(np.minimum(p0, draft(pr)).sum())}


@functools.lru_cache(maxsize=16)
def _quant_model(vocab: int, hidden: int, outlier_scale: float, seed: int):
    from lib.decoding import quantized as dq

    return dq.ToyFP8Model(vocab=vocab, d=hidden, outlier_scale=outlier_scale, seed=seed)


def quantization_summary(vocab: int, hidden: int, outlier_scale: float, draft_tokens: int, draft_mix: float,
                         seed: int, stream_tokens: int = 2) -> dict:
    """I053: :func:`quantization_case` for every setup: total-variation distances from the distribution
    each should keep and from the BF16 model's, and the first-position acceptance of the BF16 and the
    FP8 self-draft and of the small drafter."""
    cases = {c: quantization_case(vocab, hidden, outlier_scale, draft_tokens, draft_mix, seed, c, stream_tokens)
             for c in QUANT_CASES}
    p0 = _quant_model(vocab, hidden, outlier_scale, seed).decode(tuple(i % vocab for i in (1, 2, 3)))
    return {"tv_own": {c: r["tv_own"] for c, r in cases.items()},
            "tv_bf16": {c: r["tv_bf16"] for c, r in cases.items()},
            "accept_bf16_self": float(np.minimum(p0, p0).sum()),  # the BF16 target as its own drafter
            "accept_fp8_self": cases[QUANT_CASES[1]]["accept"],
            "accept_small": cases[QUANT_CASES[0]]["accept"]}


def _quant_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    x = np.arange(MAX_QUANT_BARS)
    a.bf16 = ax.bar(x - 0.27, np.zeros(len(x)), width=0.27, color="0.6", label="BF16 model")
    a.own = ax.bar(x, np.zeros(len(x)), width=0.27, color="C0", label="what the setup should keep")
    a.got = ax.bar(x + 0.27, np.zeros(len(x)), width=0.27, color="C3", label="speculative output")
    ax.set_xlabel("first two output tokens")
    ax.set_ylabel("probability")
    ax.grid(True, axis="y")
    return a


def _quant_draw(a, labels, bf16, own, got) -> None:
    n = len(labels)
    for bars, vals in ((a.bf16, bf16), (a.own, own), (a.got, got)):
        for i, bar in enumerate(bars):
            bar.set_visible(i < n)
            bar.set_height(vals[i] if i < n else 0.0)
    a.ax.set_xticks(np.arange(n), labels, rotation=90, fontsize=6)
    a.ax.set_xlim(-0.7, n - 0.3)
    a.ax.set_ylim(0, 1.15 * max(max(bf16), max(own), max(got)))
    figures.legend(a.ax, [a.bf16, a.own, a.got], loc="upper right", fontsize=7)


MAX_QUANT_BARS = 16
_QUANT_FIGURE = figures.LiveFigure(6.0, 3.0, _quant_build, _quant_draw)


@explorer(
    "decoding.fp8_losslessness",
    vocab=IntRange(3, 4, label="vocabulary"),
    hidden=IntRange(8, 32, label="hidden size"),
    outlier_scale=FloatRange(1.0, 100.0, 1.0, label="outlier activation scale"),
    draft_tokens=IntRange(1, 2, label="drafted tokens k"),
    draft_mix=FloatRange(0.5, 1.0, 0.05, label="drafter: share of the target"),
    seed=IntRange(0, 999),
    setup=Choice(QUANT_CASES, label="deployment"),
)
def fp8_losslessness(vocab: int, hidden: int, outlier_scale: float, draft_tokens: int, draft_mix: float,
                     seed: int, setup: str) -> View:
    """I053: which distribution speculative sampling keeps under one FP8 deployment choice."""
    s = quantization_case(vocab, hidden, outlier_scale, draft_tokens, draft_mix, seed, setup)
    keys = sorted(s["bf16"])
    fig = _QUANT_FIGURE(["".join(map(str, k)) for k in keys], [s["bf16"][k] for k in keys],
                        [s["own"].get(k, 0.0) for k in keys], [s["got"].get(k, 0.0) for k in keys])
    exact = s["tv_own"] < 1e-12
    rows = [
        ("total variation vs what it should keep", sig(s["tv_own"], 2)),
        ("total variation vs the BF16 model", sig(s["tv_bf16"], 2)),
        ("acceptance of the first draft", fmt_pct(s["accept"])),
    ]
    verdict = "exact (float rounding only)" if exact else f"off by {sig(s['tv_own'], 2)} in total variation"
    caption = (f"{setup}: the speculative output (red) against the distribution this setup should keep (blue) is "
               f"{verdict}; the BF16 model's (grey) is {sig(s['tv_bf16'], 2)} away.")
    return View("Speculative sampling under FP8: which distribution is kept", rows, fig, caption=caption,
                values={"tv_own": s["tv_own"], "tv_bf16": s["tv_bf16"], "accept": s["accept"]})
