"""Explorer for the RAG fleet (N058 rag-fleet).

The view calls :mod:`lib.fleet.rag` (encoder fleets from tokens and pairs, the sharded index, the answer tier
through :mod:`lib.fleet.sizing_chain`, the latency budget). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.units import fmt_int, fmt_pct, fmt_time, sig

LLM_GPUS = ("b200", "h200", "h100-sxm", "mi300x", "gb200")
ENCODER_GPUS = ("h100-sxm", "l4", "l40s", "a100-sxm", "b200")


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.llm = ax.plot([0.0], [0.0], color="C0", lw=1.8, label="answer-model nodes")[0]
    a.rer = ax.plot([0.0], [0.0], color="C3", lw=1.4, ls="--", label="reranker GPUs / 8")[0]
    a.idx = ax.plot([0.0], [0.0], color="C2", lw=1.2, ls=":", label="index hosts")[0]
    a.here = ax.plot([0.0], [0.0], "o", color="C1", ms=6, label="this hit rate")[0]
    ax.set_xlabel("answer-cache hit rate (%)")
    ax.set_ylabel("nodes")
    ax.grid(True)
    return a


def _draw(a, xs, llm, rer, idx, x, here) -> None:
    a.llm.set_data(xs, llm)
    a.rer.set_data(xs, rer)
    a.idx.set_data(xs, idx)
    a.here.set_data([x], [here])
    a.ax.set_xlim(xs[0], xs[-1])
    a.ax.set_ylim(0, max(float(np.max(llm)), float(np.max(rer)), float(np.max(idx))) * 1.08 + 1)
    figures.legend(a.ax, [a.llm, a.rer, a.idx, a.here], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)
HIT_SWEEP_PCT = tuple(float(x) for x in range(0, 96, 5))


@explorer(
    "fleet.rag",
    gpu=Choice(LLM_GPUS, label="answer-model GPU"),
    tp=Choice((1, 2, 4, 8), label="TP"),
    dtype=Choice(("fp8", "bf16"), label="weights and KV"),
    encoder_gpu=Choice(ENCODER_GPUS, label="embedder / reranker GPU"),
    rate=FloatRange(100.0, 50_000.0, 100.0, label="queries/s"),
    hit_pct=FloatRange(0.0, 95.0, 1.0, label="answer-cache hit rate (%)"),
    candidates=IntRange(5, 200, label="pairs reranked per query"),
    pair_tokens=IntRange(64, 1024, log=True, label="tokens per pair"),
    prompt_len=IntRange(256, 16_384, log=True, label="answer prompt (tokens)"),
    output_len=IntRange(16, 2048, log=True, label="answer (tokens)"),
    ttft_budget_ms=FloatRange(200.0, 5000.0, 50.0, label="p99 TTFT budget (ms)"),
)
def rag(gpu: str, tp: int, dtype: str, encoder_gpu: str, rate: float, hit_pct: float, candidates: int, pair_tokens: int,
        prompt_len: int, output_len: int, ttft_budget_ms: float) -> View:
    """N058: the four tiers of a RAG fleet against the answer-cache hit rate, and the latency budget."""
    from lib.fleet.rag import encoder_fleet, hit_rate_for_nodes, index_fleet, rag_fleet
    from lib.fleet.sizing_chain import serving_deployment

    dep = serving_deployment("llama-3.1-70b", gpu, tp, dtype)
    cached = min(500, prompt_len // 4)
    f = rag_fleet(dep, rate, hit_pct / 100.0, 32, candidates, pair_tokens, prompt_len, cached, output_len, 0.05,
                  ttft_budget_ms / 1e3, 1e9, 1000.0, encoder_gpu)
    whole = f.llm.at_rate(rate)
    xs = np.array(HIT_SWEEP_PCT)
    llm = np.array([whole.at_rate(rate * (1 - x / 100)).nodes for x in xs], float)
    rer = np.array([encoder_fleet("reranker", rate * (1 - x / 100) * candidates * pair_tokens, pair_tokens,
                                  encoder_gpu).gpus / 8 for x in xs])
    idx = np.array([index_fleet(rate * (1 - x / 100), 1e9, 1000.0).hosts for x in xs], float)
    h60 = hit_rate_for_nodes(f, max(1, round(llm[0] * 0.3)))
    rows = [("answer replica", dep.label),
            *((name, fmt_time(s)) for name, s in f.stages),
            ("left for the answer model's TTFT", fmt_time(f.llm_ttft_s)),
            ("embedder GPUs", fmt_int(f.embedder.gpus)),
            ("index", f"{fmt_int(f.index.shards)} shards x {fmt_int(f.index.replicas_per_shard)} replicas"),
            ("reranker GPUs", f"{fmt_int(f.reranker.gpus)} for {sig(f.pairs_per_s)} pairs/s"),
            ("answer tier", f"{fmt_int(f.llm.replicas)} replicas, {fmt_int(f.llm_nodes)} nodes ({f.llm.binding} binds)"),
            ("hit rate for 30% of the no-cache nodes", fmt_pct(h60)),
            ("GPU dollars per hour", f"${sig(f.usd_per_hour)}")]
    caption = (f"Nodes of each tier against the answer-cache hit rate at {sig(rate)} queries/s: the answer model falls "
               f"from {fmt_int(llm[0])} nodes with no cache to {fmt_int(f.llm_nodes)} at {sig(hit_pct)}%.")
    fig = _FIGURE(xs, llm, rer, idx, hit_pct, float(f.llm_nodes))
    return View(f"RAG fleet at {sig(rate)} queries/s", rows, fig, caption=caption,
                note=f"answer tier {fmt_int(f.llm_nodes)} nodes", values={"llm_nodes": f.llm_nodes,
                                                                         "reranker_gpus": f.reranker.gpus})


__all__ = ["ENCODER_GPUS", "HIT_SWEEP_PCT", "LLM_GPUS", "rag"]
