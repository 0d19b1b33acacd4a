"""Explorer for needle retrieval against the maximum of N distractor logits (I078
long-context-quantization-failure). Calls :mod:`lib.numerics.needle` only; one persistent figure."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.numerics import needle
from lib.units import fmt_int, fmt_pct, sig


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.exact = ax.plot([1.0], [1.0], color="C0", lw=1.8, label="full margin")[0]
    a.quant = ax.plot([1.0], [1.0], color="C3", lw=1.8, ls="--", label="after quantization")[0]
    a.ctx = ax.axvline(1000, color="0.3", ls=":", lw=1.2, label="served context")
    figures.log_scale(ax, "x")
    ax.set_xlabel("distractor tokens N")
    ax.set_ylabel("P(needle beats every distractor)")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw(a, ns, exact, quant, context) -> None:
    a.exact.set_data(ns, exact)
    a.quant.set_data(ns, quant)
    a.ctx.set_xdata([context, context])
    a.ax.set_xlim(ns[0], ns[-1])
    figures.legend(a.ax, [a.exact, a.quant, a.ctx], fontsize=7, loc="lower left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "numerics.needle",
    margin=FloatRange(2.0, 8.0, 0.1, label="needle margin (distractor sd)"),
    kept_pct=FloatRange(30.0, 100.0, 1.0, label="margin kept after quantization (%)"),
    noise=FloatRange(0.0, 1.0, 0.01, label="logit noise from quantization (sd)"),
    context=IntRange(1024, 1048576, label="served context (tokens)"),
)
def needle_view(margin: float, kept_pct: float, noise: float, context: int) -> View:
    """I078: retrieval probability against N Gaussian distractors, with the full margin and with the
    margin a quantization scheme leaves (clipping) plus its logit noise."""
    mq = margin * kept_pct / 100.0
    ns = np.logspace(1, 6.3, 60)
    exact = needle.retrieval_curve(margin, ns)
    quant = needle.retrieval_curve(mq, ns, noise)
    p_e = needle.retrieval_probability(margin, context)
    p_q = needle.retrieval_probability(mq, context, noise)
    n_e, n_q = needle.critical_context(margin), needle.critical_context(mq, noise)
    rows = [("largest distractor (median)", f"{sig(needle.gaussian_max_median(context), 3)} sd"),
            ("sqrt(2 ln N)", f"{sig(needle.sqrt_2_ln(context), 3)} sd"),
            ("retrieval, full margin", fmt_pct(p_e)),
            ("retrieval, after quantization", fmt_pct(p_q)),
            ("half-failure length, full margin", "beyond 1e15" if math.isinf(n_e) else fmt_int(n_e)),
            ("half-failure length, quantized", "beyond 1e15" if math.isinf(n_q) else fmt_int(n_q))]
    caption = (f"Probability that a needle {sig(margin, 2)} sd above the distractors' mean beats all N of them (solid), and "
               f"after quantization keeps {sig(kept_pct, 3)}% of the margin and adds {sig(noise, 2)} sd of noise (dashed); "
               f"both are flat at short N and fall where the largest distractor, about sqrt(2 ln N) sd, reaches the margin.")
    fig = _FIGURE(ns, exact, quant, float(context))
    return View(f"Needle at {sig(margin, 2)} sd, {fmt_int(context)} tokens", rows, fig, caption=caption,
                note="retrieval holds" if p_q >= 0.9 else "retrieval fails at this length",
                values={"p_exact": p_e, "p_quant": p_q, "n_half_quant": n_q})
