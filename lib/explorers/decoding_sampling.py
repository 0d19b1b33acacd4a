"""Explorers for the sampling questions: the sampling function and its overflow (N073), the order
of the knobs (I046), top-p at its edges (I087) and a calibrated label probability (W08)."""

from __future__ import annotations

import functools
from itertools import permutations
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, Text, View, explorer
from lib.decoding import sampling as s
from lib.units import fmt_int, fmt_pct, sig

SHOWN = 16  # bars drawn: the most likely tokens of the row


@functools.lru_cache(maxsize=16)
def _row(vocab: int, scale: float, seed: int) -> np.ndarray:
    """A row of logits: ``scale`` x standard normals (read-only, shared by every view)."""
    z = np.random.default_rng(seed).standard_normal(vocab) * scale
    z.setflags(write=False)
    return z


def _bars_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    x = np.arange(SHOWN)
    a = SimpleNamespace(ax=ax)
    a.base = ax.bar(x - 0.2, np.zeros(SHOWN), 0.4, color="#bbbbbb", label="softmax(z), T = 1")
    a.final = ax.bar(x + 0.2, np.zeros(SHOWN), 0.4, color="#1f77b4", label="what is sampled")
    ax.set_xticks(x)
    ax.set_xlabel("token rank (by logit)")
    ax.set_ylabel("probability")
    figures.legend(ax, [a.base, a.final], fontsize=7)
    return a


def _bars_draw(a: SimpleNamespace, base: np.ndarray, final: np.ndarray, labels: list[str]) -> None:
    n = len(base)
    for i in range(SHOWN):
        for bars, vals in ((a.base, base), (a.final, final)):
            bars[i].set_height(vals[i] if i < n else 0.0)
            bars[i].set_visible(i < n)
    a.ax.set_xticks(np.arange(SHOWN), [labels[i] if i < n else "" for i in range(SHOWN)])
    a.ax.set_xlim(-0.6, n - 0.4)
    a.ax.set_ylim(0, max(1e-9, float(max(base.max(), final.max()))) * 1.1)


_SAMPLER_FIGURE = figures.LiveFigure(6.0, 2.8, _bars_build, _bars_draw)


@explorer(
    "decoding.sampling_function",
    temperature=FloatRange(0.0, 3.0, 0.05, label="temperature"),
    top_k=IntRange(0, 200, label="top-k (0: off)"),
    top_p=FloatRange(0.05, 1.0, 0.01, label="top-p (1: off)"),
    vocab=IntRange(16, 32768, log=True, label="vocabulary"),
    logit_scale=FloatRange(0.5, 10.0, 0.5, label="logit spread (std)"),
    max_logit=FloatRange(0.0, 120.0, 1.0, label="largest logit"),
    dtype=Choice(("float32", "float16"), label="naive softmax dtype"),
    seed=IntRange(0, 1000),
)
def sampling_function(temperature: float, top_k: int, top_p: float, vocab: int, logit_scale: float,
                      max_logit: float, dtype: str, seed: int) -> View:
    """N073: the distribution after temperature, top-k and top-p, and where a naive exp overflows."""
    z = _row(vocab, logit_scale, seed)
    z = z - z.max() + max_logit
    order = ("temperature", "top_k", "top_p")
    probs = s.sampling_probs(z, temperature, top_k, top_p, order=order)
    base = s.softmax(z)
    rank = np.argsort(-z, kind="stable")[:SHOWN]
    kept = int((probs > 0).sum())
    limit = s.exp_overflow_logit(dtype)
    scaled = np.inf if temperature == 0 else max_logit / temperature
    overflow = temperature > 0 and scaled > limit
    fig = _SAMPLER_FIGURE(base[rank], probs[rank], [str(i) for i in range(len(rank))])
    rows = [
        ("tokens that can be sampled", f"{fmt_int(kept)} of {fmt_int(vocab)}"),
        ("probability of the top token", fmt_pct(float(probs.max()))),
        ("largest logit / T", "greedy (no division)" if temperature == 0 else sig(scaled)),
        (f"naive exp overflows {dtype} above", sig(limit, 5)),
        ("naive softmax (no max subtracted)", "NaN: exp overflows" if overflow else "finite here"),
        ("largest logit it survives at this T", "any" if temperature == 0 else sig(limit * temperature)),
    ]
    caption = (f"Grey: the model's distribution; blue: what the sampler draws from after temperature {sig(temperature)}, "
               f"top-k {top_k} and top-p {sig(top_p)}: {fmt_int(kept)} tokens stay and the top one gets "
               f"{fmt_pct(float(probs.max()))}. A naive {dtype} exp {'overflows' if overflow else 'survives'} here.")
    return View(f"Sampling {fmt_int(vocab)} tokens", rows, fig, caption=caption,
                values={"kept": kept, "top": float(probs.max()), "overflow": float(overflow)})


# ---- I046: the order of the knobs ---------------------------------------------------------------------

THREE = ("temperature", "top_k", "top_p")
ORDERS = {" -> ".join(o): o for o in permutations(THREE)}
EXAMPLE = "3.7, 0.6, 0.0, -0.1, -0.8, -1.0"


def parse_logits(text: str) -> np.ndarray:
    """Logits typed as numbers separated by commas or spaces (2 to 16 of them, each in [-40, 40])."""
    if not isinstance(text, str):
        raise ValueError(f"logits must be text such as '{EXAMPLE}', got {text!r}")
    parts = [t for t in text.replace(",", " ").split() if t]
    try:
        z = np.array([float(t) for t in parts])
    except ValueError:
        raise ValueError(f"logits must be numbers separated by commas, such as '{EXAMPLE}'; got {text!r}") from None
    if not 2 <= z.size <= 16 or not np.isfinite(z).all() or np.abs(z).max() > 40:
        raise ValueError(f"give 2 to 16 finite logits in [-40, 40], such as '{EXAMPLE}'; got {text!r}")
    return z


def order_table(logits, temperature: float, top_k: int, top_p: float, min_p: float = 0.0,
                orders=None) -> list[tuple[str, tuple[int, ...]]]:
    """(order name, kept token ids) for each order (default: every order of the three knobs)."""
    orders = ORDERS if orders is None else orders
    return [(name, tuple(s.kept_tokens(logits, temperature, top_k, top_p, min_p, order=o).tolist()))
            for name, o in orders.items()]


def _ids(kept) -> str:
    return "{" + ", ".join(f"t{i}" for i in kept) + "}"


@explorer(
    "decoding.knob_order",
    logits=Text((EXAMPLE, "3.0, 2.4, 2.0, 1.2, 0.5, -1.0", "1, 1, 1, 0.5, 0, -2"), 200, label="logits"),
    temperature=FloatRange(0.05, 3.0, 0.05, label="temperature"),
    top_k=IntRange(0, 16, label="top-k (0: off)"),
    top_p=FloatRange(0.05, 1.0, 0.01, label="top-p (1: off)"),
    min_p=FloatRange(0.0, 1.0, 0.01, label="min-p (engines only; 0: off)"),
    order=Choice(tuple(ORDERS), label="order drawn"),
)
def knob_order(logits: str, temperature: float, top_k: int, top_p: float, min_p: float, order: str) -> View:
    """I046: a few tokens through the three knobs in every order, and through the engines' chains."""
    z = parse_logits(logits)
    o = ORDERS[order]
    probs = s.sampling_probs(z, temperature, top_k, top_p, order=o)
    table = order_table(z, temperature, top_k, top_p)
    distinct = len({k for _, k in table})
    engines = order_table(z, temperature, top_k, top_p, min_p, s.ENGINE_ORDERS)
    rank = np.argsort(-z, kind="stable")[:SHOWN]
    fig = _SAMPLER_FIGURE(s.softmax(z)[rank], probs[rank], [f"t{i}" for i in rank])
    rows = [(name, _ids(kept)) for name, kept in table]
    rows.append(("distinct kept sets over the 6 orders", str(distinct)))
    rows += [(f"{name} (with min-p {min_p:g})", _ids(kept)) for name, kept in engines]
    caption = (f"Grey: the distribution at T = 1; blue: what the order {order} samples from, "
               f"{_ids(np.flatnonzero(probs > 0))}. Over the six orders of the three knobs the kept set takes "
               f"{distinct} different value{'s' if distinct > 1 else ''}.")
    return View(f"{z.size} tokens, three knobs", rows, fig, caption=caption, values={"distinct": distinct})


# ---- I087: top-p at a tie ------------------------------------------------------------------------------------


@explorer(
    "decoding.top_p_ties",
    n_tied=IntRange(1, 8, label="tokens in the tie group"),
    tie_logit=FloatRange(-4.0, 0.0, 0.1, label="tie group's logit (top token: 0)"),
    top_p=FloatRange(0.05, 1.0, 0.01, label="top-p"),
    temperature=FloatRange(0.0, 3.0, 0.05, label="temperature"),
    shuffles=IntRange(2, 64, label="vocabulary orders tried"),
)
def top_p_ties(n_tied: int, tie_logit: float, top_p: float, temperature: float, shuffles: int) -> View:
    """I087: the order-independent rule against a per-position cut, over shuffled vocabularies."""
    from lib.decoding import sampling_practice as sp

    z = np.array([0.0] + [tie_logit] * n_tied + [-4.5, -5.0, -6.0], dtype=np.float32)
    kept = sp.reference_top_p_keep(z, top_p, temperature)
    draft = sp.top_p_variant("stable sort splits a tie group")
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(shuffles):
        perm = rng.permutation(z.size)
        back = np.empty(z.size, dtype=bool)
        with np.errstate(all="ignore"):
            back[perm] = draft(z[perm], top_p, max(temperature, 1e-3))
        seen.add(tuple(np.flatnonzero(back)))
    probs = s.softmax(z, temperature)
    final = np.where(kept, probs, 0.0)
    final = final / final.sum()
    fig = _SAMPLER_FIGURE(probs, final, ["top"] + [f"tie{i}" for i in range(n_tied)] + ["a", "b", "c"])
    rows = [
        ("kept by the rule (any order)", f"{int(kept.sum())} tokens holding {fmt_pct(float(probs[kept].sum()))}"),
        ("per-position cut: distinct kept sets", f"{len(seen)} over {shuffles} vocabulary orders"),
        ("mass above the tie group", fmt_pct(float(probs[0])) if n_tied else "-"),
    ]
    caption = (f"Grey: softmax at T = {sig(temperature)}; blue: what the order-independent rule samples from "
               f"({int(kept.sum())} tokens). A cut per sorted position gives {len(seen)} different kept "
               f"set{'s' if len(seen) > 1 else ''} as the vocabulary is shuffled.")
    return View("Top-p at a tie", rows, fig, caption=caption, values={"kept": int(kept.sum()), "distinct": len(seen)})


# ---- W08: a calibrated label probability ---------------------------------------------------------------------


def _rel_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    ax.plot([0, 1], [0, 1], color="#999999", lw=1, ls="--", label="perfect calibration")
    a.raw, = ax.plot([], [], "o-", color="#d62728", label="raw sigmoid(score)")
    a.cal, = ax.plot([], [], "s-", color="#1f77b4", label="calibrated")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted P(yes), bin mean")
    ax.set_ylabel("observed share of yes")
    figures.legend(ax, [a.raw, a.cal], fontsize=7, loc="upper left")
    return a


def _rel_draw(a: SimpleNamespace, raw_rows, cal_rows) -> None:
    a.raw.set_data([r[3] for r in raw_rows], [r[4] for r in raw_rows])
    a.cal.set_data([r[3] for r in cal_rows], [r[4] for r in cal_rows])


_REL_FIGURE = figures.LiveFigure(4.8, 3.4, _rel_build, _rel_draw)


@explorer(
    "decoding.label_calibration",
    slope=FloatRange(0.3, 5.0, 0.1, label="model over-confidence (score slope)"),
    bias=FloatRange(-3.0, 3.0, 0.1, label="model's lean to yes (score bias)"),
    n_items=IntRange(200, 8000, label="labelled items"),
    method=Choice(("platt", "temperature"), label="calibration"),
    bins=IntRange(5, 20, label="ECE bins"),
    seed=IntRange(0, 1000),
)
def label_calibration(slope: float, bias: float, n_items: int, method: str, bins: int, seed: int) -> View:
    """W08: raw sigmoid(score) against a fit on half the items, judged on the other half."""
    from lib.decoding import classify as c

    d = c.synthetic_yes_no(n_items, seed, slope=slope, bias=bias, fillers=8)  # few fillers: the score is the same
    score = c.binary_label_score(d.logits, d.yes_ids, d.no_ids)
    half = n_items // 2
    fit = c.fit_platt(score[:half], d.labels[:half], bias=method == "platt")
    raw, cal = c.sigmoid(score[half:]), fit(score[half:])
    y = d.labels[half:]
    e_raw, e_cal = c.expected_calibration_error(raw, y, bins), c.expected_calibration_error(cal, y, bins)
    fig = _REL_FIGURE(c.reliability_table(raw, y, bins), c.reliability_table(cal, y, bins))
    rows = [
        ("ECE raw -> calibrated (held-out half)", f"{fmt_pct(e_raw)} -> {fmt_pct(e_cal)}"),
        ("log-loss raw -> calibrated", f"{sig(c.log_loss(raw, y))} -> {sig(c.log_loss(cal, y))} nats"),
        ("fitted a, b (truth: 1/slope, -bias/slope)", f"{sig(fit.a)}, {sig(fit.b)} ({sig(1 / slope)}, {sig(-bias / slope)})"),
        ("accuracy at 0.5, raw -> calibrated", f"{fmt_pct(float(((raw > 0.5) == y).mean()))} -> "
                                               f"{fmt_pct(float(((cal > 0.5) == y).mean()))}"),
    ]
    caption = (f"Points on the dashed diagonal are calibrated. The raw probabilities (red) sit off it, ECE "
               f"{fmt_pct(e_raw)}; {method} scaling fitted on {half} items brings the held-out ECE to {fmt_pct(e_cal)} (blue).")
    return View("Calibrating P(yes)", rows, fig, caption=caption, values={"ece_raw": e_raw, "ece_cal": e_cal})
