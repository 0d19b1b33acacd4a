"""Explorers for the FlashAttention section's coding questions: SDPA from scratch and its numerics
(W01), attention over a KV cache (I086) and split-KV decode attention (I094).

Each view calls :mod:`lib.attention` (and the registry) only; the figures are persistent
matplotlib figures (:class:`lib.book.figures.LiveFigure`) updated in place."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.attention import naive as nv
from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.registry import hardware, models
from lib.units import fmt_pct, sig

# ---- W01: SDPA's probabilities under a mask, and what the numerics do to them -----------------

SDPA_MASKS = ("none", "causal", "causal chunk at the end of the keys", "causal, offset -n_q/4",
              "sliding window n_k/4", "left padding n_k/4 + causal", "random 30%")
INPUT_DTYPES = ("fp32", "fp16", "bf16")
ACC_DTYPES = {"fp32": np.float32, "fp16": np.float16}


def sdpa_mask(kind: str, n_q: int, n_k: int) -> np.ndarray | None:
    """The (n_q, n_k) boolean mask (True = may attend) the SDPA explorer draws for ``kind``.

    causal: query i sees keys j <= i (torch's is_causal); chunk at the end: j <= (n_k - n_q) + i;
    offset -n_q/4: the first floor(n_q/4) rows see nothing; sliding window w = max(1, n_k // 4):
    i - w < j <= i; left padding p = n_k // 4 (n_q = n_k expected, else rows align to the end):
    keys j >= p and j <= (n_k - n_q) + i, so padding rows see nothing; random: kept with
    probability 0.3 (seed 0)."""
    if kind not in SDPA_MASKS:
        raise ValueError(f"mask must be one of {', '.join(SDPA_MASKS)}, got {kind!r}")
    if kind == "none":
        return None
    if kind == "causal":
        return nv.causal_mask(n_q, n_k, 0)
    if kind == "causal chunk at the end of the keys":
        if n_k < n_q:
            raise ValueError(f"a chunk of {n_q} queries at the end of {n_k} keys needs n_k >= n_q")
        return nv.causal_mask(n_q, n_k, n_k - n_q)
    if kind == "causal, offset -n_q/4":
        return nv.causal_mask(n_q, n_k, -(n_q // 4))
    if kind == "sliding window n_k/4":
        return nv.sliding_window_mask(n_q, n_k, max(1, n_k // 4))
    if kind == "left padding n_k/4 + causal":
        offset = max(n_k - n_q, 0)
        pad = nv.padding_mask([n_k - n_k // 4], n_k, left=True)[0, 0]
        return nv.causal_mask(n_q, n_k, offset) & pad
    return np.random.default_rng(0).random((n_q, n_k)) < 0.3


def _heat_build(fig) -> SimpleNamespace:
    from matplotlib.patches import Patch

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.86, bottom=0.24, top=0.93)
    a = SimpleNamespace(ax=ax)
    a.image = ax.imshow(np.zeros((2, 2, 4)), interpolation="none", aspect="auto", label="probability")
    import matplotlib as mpl

    a.cbar = fig.colorbar(mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, 1), cmap="viridis"), ax=ax,
                          fraction=0.05, pad=0.02)
    a.cbar.set_label("probability p_ij (colour)")
    a.cbar.set_ticks([0.0, 0.5, 1.0])
    from matplotlib import ticker

    for axis in (ax.xaxis, ax.yaxis):  # few integer ticks: tick layout is most of a draw
        axis.set_major_locator(ticker.MaxNLocator(6, integer=True))
    a.masked = Patch(color="#d0d0d0", label="masked key (p = 0)")
    a.nan = Patch(color="#e41a1c", label="NaN")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    return a


def _heat_draw(a: SimpleNamespace, p: np.ndarray, allowed: np.ndarray, title: str) -> None:
    import matplotlib as mpl

    rgba = mpl.colormaps["viridis"](np.nan_to_num(np.clip(p, 0, 1), nan=0.0))
    rgba[~allowed] = mpl.colors.to_rgba("#d0d0d0")
    rgba[np.isnan(p)] = mpl.colors.to_rgba("#e41a1c")
    a.image.set_data(rgba)
    n_q, n_k = p.shape
    a.image.set_extent((-0.5, n_k - 0.5, n_q - 0.5, -0.5))
    a.ax.set_xlim(-0.5, n_k - 0.5)
    a.ax.set_ylim(n_q - 0.5, -0.5)
    a.ax.set_title(title)
    a.nan.set_visible(bool(np.isnan(p).any()))
    a.masked.set_visible(not allowed.all())
    figures.legend(a.ax, [a.masked, a.nan], loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=7,
                   frameon=False)


_HEAT_FIGURE = figures.LiveFigure(5.6, 3.9, _heat_build, _heat_draw)


@explorer(
    "flashattention.sdpa_numerics",
    mask=Choice(SDPA_MASKS),
    n_q=IntRange(1, 64, label="queries"),
    n_k=IntRange(1, 64, label="keys"),
    head_dim=IntRange(1, 256, log=True, label="head_dim"),
    score_scale=FloatRange(0.1, 1000.0, 0.1, label="q multiplier (score size)"),
    input_dtype=Choice(INPUT_DTYPES, label="inputs"),
    acc_dtype=Choice(tuple(ACC_DTYPES), label="scores and softmax in"),
    guard=Choice((True, False), label="guard rows with no key"),
    subtract_max=Choice((True, False), label="subtract the row max"),
)
def sdpa_numerics(mask: str, n_q: int, n_k: int, head_dim: int, score_scale: float, input_dtype: str,
                  acc_dtype: str, guard: bool, subtract_max: bool) -> View:
    """W01: softmax(q k^T / sqrt(d)) of one head under a mask (lib.attention.naive), drawn as a heatmap,
    with the rows that have no key, the NaN rows and the error against float64 on the same inputs."""
    allowed2 = sdpa_mask(mask, n_q, n_k)
    allowed = np.ones((n_q, n_k), bool) if allowed2 is None else allowed2
    rng = np.random.default_rng(0)
    q = nv.round_to_dtype(rng.standard_normal((1, 1, n_q, head_dim)) * score_scale, input_dtype)
    k = nv.round_to_dtype(rng.standard_normal((1, 1, n_k, head_dim)), input_dtype)
    v = nv.round_to_dtype(rng.standard_normal((1, 1, n_k, head_dim)), input_dtype)
    acc = ACC_DTYPES[acc_dtype]
    kw = {"guard_masked_rows": guard, "subtract_max": subtract_max}
    p = nv.attention_probabilities(q, k, allowed2, acc_dtype=acc, **kw)[0, 0].astype(np.float64)
    out = nv.naive_attention(q, k, v, allowed2, acc_dtype=acc, **kw).astype(np.float64)
    exact = nv.naive_attention(q, k, v, allowed2, acc_dtype=np.float64)
    scores = (q[0, 0].astype(np.float64) @ k[0, 0].astype(np.float64).T) / np.sqrt(head_dim)
    no_key = ~allowed.any(axis=1)
    nan_rows = np.isnan(out[0, 0]).any(axis=1)
    finite = ~nan_rows
    err = float(np.abs(out[0, 0][finite] - exact[0, 0][finite]).max()) if finite.any() else float("nan")
    top = float(np.abs(scores[allowed]).max()) if allowed.any() else 0.0
    usable = allowed.any(axis=1) & ~np.isnan(p).any(axis=1)  # rows with a key and no NaN
    row_max = np.where(allowed, p, 0.0)[usable].max(axis=1) if usable.any() else np.array([])
    saturation = float(row_max.mean()) if row_max.size else float("nan")
    if no_key.any():
        rows_give = ("NaN" if np.isnan(out[0, 0][no_key]).any() else
                     "0" if (out[0, 0][no_key] == 0).all() else "a non-zero average")
    else:
        rows_give = "(no such row)"
    fig = _HEAT_FIGURE(p, allowed, f"P = softmax(QK^T/sqrt({head_dim})), {input_dtype} inputs, {acc_dtype} softmax")
    rows = [("rows with no allowed key", f"{int(no_key.sum())} of {n_q}"),
            ("those rows return", rows_give),
            ("rows with NaN", f"{int(nan_rows.sum())} of {n_q}"),
            ("largest |score| (allowed keys)", sig(top)),
            ("mean top probability per row", "n/a" if saturation != saturation else sig(saturation)),
            ("max |error| vs float64 (finite rows)", "n/a" if err != err else sig(err, 2))]
    note = ("Grey cells are masked keys, red cells NaN. Turn the guard off with a mask that empties rows to see "
            "-inf - (-inf); raise the q multiplier with the max subtraction off to see exp overflow; fp16 "
            "scores lose precision as they grow.")
    caption = (f"Each cell is the probability query i gives key j (colour scale on the right); grey cells are masked "
               f"keys, red cells NaN. {int(no_key.sum())} of {n_q} rows have no allowed key"
               + (f" and return {rows_give}" if no_key.any() else "") + f"; {int(nan_rows.sum())} rows hold a NaN.")
    return View(f"SDPA of one head: {mask}, {n_q} x {n_k}", rows, fig, note, caption=caption,
                values={"no_key_rows": float(no_key.sum()), "nan_rows": float(nan_rows.sum()), "error": err,
                        "largest_score": top, "saturation": saturation})


# ---- I086: the causal mask of a chunk of new queries at the end of a KV cache -------------------

KV_MASKS = ("bottom-right: j <= past + i (correct)", "top-left: j <= i (torch is_causal)",
            "no causal mask inside the chunk", "query excludes its own key: j < past + i")
_PAIR_COLOURS = ("#eeeeee", "#4daf4a", "#e41a1c", "#ff7f00")  # hidden, sees, leaked future key, missing key
_PAIR_LABELS = ("future key, hidden (correct)", "key it must see, seen", "future key it sees (leak)",
                "key it must see, hidden")


def chunk_mask(convention: str, cached: int, chunk: int) -> np.ndarray:
    """(chunk, cached + chunk) booleans a cached-attention step uses under ``convention``
    (:data:`KV_MASKS`): query i of the chunk sits at absolute position cached + i."""
    n_k = cached + chunk
    if convention == KV_MASKS[0]:
        return nv.causal_mask(chunk, n_k, cached)
    if convention == KV_MASKS[1]:
        return nv.causal_mask(chunk, n_k, 0)
    if convention == KV_MASKS[2]:
        return np.ones((chunk, n_k), bool)
    if convention == KV_MASKS[3]:
        return nv.causal_mask(chunk, n_k, cached - 1)
    raise ValueError(f"convention must be one of {', '.join(KV_MASKS)}, got {convention!r}")


def _pairs_build(fig) -> SimpleNamespace:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.92)
    a = SimpleNamespace(ax=ax)
    a.image = ax.imshow(np.zeros((2, 2)), cmap=ListedColormap(_PAIR_COLOURS), vmin=-0.5, vmax=3.5,
                        interpolation="none", aspect="auto")
    a.patches = [Patch(color=c, label=lab) for c, lab in zip(_PAIR_COLOURS, _PAIR_LABELS, strict=True)]
    a.edge = ax.axvline(0, color="black", lw=1.5, ls="--", label="end of the cache (new keys to the right)")
    ax.set_xlabel("key position j")
    ax.set_ylabel("chunk query i (position past + i)")
    from matplotlib import ticker

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(ticker.MaxNLocator(6, integer=True))
    return a


def _pairs_draw(a: SimpleNamespace, kinds: np.ndarray, cached: int, title: str) -> None:
    a.image.set_data(kinds)
    n_q, n_k = kinds.shape
    a.image.set_extent((-0.5, n_k - 0.5, n_q - 0.5, -0.5))
    a.ax.set_xlim(-0.5, n_k - 0.5)
    a.ax.set_ylim(n_q - 0.5, -0.5)
    a.edge.set_xdata([cached - 0.5, cached - 0.5])
    a.edge.set_visible(cached > 0)
    a.ax.set_title(title)
    present = [p for kind, p in enumerate(a.patches) if (kinds == kind).any()]
    for kind, p in enumerate(a.patches):
        p.set_visible(bool((kinds == kind).any()))
    figures.legend(a.ax, [*present, a.edge], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7,
                   frameon=False)


_PAIRS_FIGURE = figures.LiveFigure(5.6, 3.8, _pairs_build, _pairs_draw)


@explorer(
    "flashattention.kv_cache_mask",
    cached=IntRange(0, 48, label="cached tokens (past_len)"),
    chunk=IntRange(1, 24, label="new tokens in the chunk"),
    convention=Choice(KV_MASKS, label="mask"),
)
def kv_cache_mask(cached: int, chunk: int, convention: str) -> View:
    """I086: which (query, key) pairs a chunk at the end of a cache sees under a mask convention, against
    the right one, and the output error against full recomputation (lib.attention.kv_cache)."""
    from lib.attention import kv_cache
    from lib.attention.traffic import visible_pairs

    right = chunk_mask(KV_MASKS[0], cached, chunk)
    used = chunk_mask(convention, cached, chunk)
    kinds = np.where(right, np.where(used, 1, 3), np.where(used, 2, 0)).astype(float)
    n_k = cached + chunk
    rng = np.random.default_rng(0)
    q_all, k_all, v_all = (rng.standard_normal((1, 1, n_k, 16)) for _ in range(3))
    want = kv_cache.full_recompute(q_all, k_all, v_all, chunk, acc_dtype=np.float64)
    got = nv.naive_attention(q_all[:, :, cached:], k_all, v_all, used, acc_dtype=np.float64)
    err = float(np.abs(got - want).max())
    leaked, missing = int((kinds == 2).sum()), int((kinds == 3).sum())
    must = visible_pairs(chunk, n_k, causal=True, query_offset=cached)
    fig = _PAIRS_FIGURE(kinds, cached, f"{chunk} new queries after {cached} cached tokens")
    rows = [("keys in the cache after the step", str(n_k)),
            ("pairs the chunk must see", f"{must:,}"),
            ("pairs this mask lets it see", f"{int(used.sum()):,}"),
            ("future keys leaked", f"{leaked:,}"),
            ("keys it must see but cannot", f"{missing:,}"),
            ("max |error| vs full recomputation", sig(err, 2) if err > 1e-12 else "0 (exact)")]
    note = ("Rows are the chunk's queries, columns every key after the step; the dashed line is where the cache "
            "ended. Green is right, red a future key seen, orange a key it should see but does not.")
    verdict = ("sees every key it must and no future key, so it matches full recomputation" if not leaked and not missing
               else f"leaks {leaked:,} future keys (red) and hides {missing:,} keys it must see (orange): an error of "
                    f"{sig(err, 2)} against full recomputation")
    caption = (f"Rows are the chunk's {chunk} queries, columns every key after the step"
               + (", the chunk's own keys right of the dashed line" if cached else "")
               + f"; green marks a key it must see and does. This mask {verdict}.")
    return View(f"Cached attention mask: {convention}", rows, fig, note, caption=caption,
                values={"must": float(must), "allowed": float(used.sum()), "leaked": float(leaked),
                        "missing": float(missing), "error": err})


# ---- I094: split-KV decode occupancy -------------------------------------------------------------

MAX_SPLITS = 64
GQA_MODELS = tuple(m for m in models.model_names() if not models.model(m).is_mla)  # MLA: one latent, not KV heads


def _waves_build(fig) -> SimpleNamespace:
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.3, top=0.92)
    a = SimpleNamespace(ax=ax)
    x = np.arange(1, MAX_SPLITS + 1)
    a.bars = ax.bar(x, np.zeros(MAX_SPLITS), 0.8, color="#9ecae1", label="SM busy fraction at S splits")
    a.chosen = ax.bar([1], [0], 0.8, color="#e41a1c", label="chosen S")
    a.heuristic, = ax.plot([], [], "v", color="black", ms=6, label="FlashAttention-2's pick")
    ax.set_xlim(0.3, MAX_SPLITS + 0.7)
    ax.set_ylim(0, 1.12)
    ax.set_xlabel("splits S of the keys (thread blocks = batch x KV heads x S)")
    ax.set_ylabel("SM busy fraction")
    from matplotlib import ticker

    ax.xaxis.set_major_locator(ticker.MaxNLocator(8, integer=True))
    ax.yaxis.set_major_locator(ticker.MultipleLocator(0.25))
    return a


def _waves_draw(a: SimpleNamespace, busy: np.ndarray, chosen: int, heuristic: int, title: str) -> None:
    for rect, h in zip(a.bars, busy, strict=True):
        rect.set_height(h)
    a.chosen[0].set_x(chosen - 0.4)
    a.chosen[0].set_height(busy[chosen - 1])
    a.chosen[0].set_label(f"chosen S = {chosen}")
    a.chosen[0].set_visible(True)
    a.chosen.set_label(f"chosen S = {chosen}")
    shown = heuristic <= MAX_SPLITS
    a.heuristic.set_data([heuristic] if shown else [], [busy[heuristic - 1] + 0.05] if shown else [])
    a.heuristic.set_visible(shown)
    a.heuristic.set_label(f"FlashAttention-2's pick (S = {heuristic})")
    a.ax.set_title(title)
    figures.legend(a.ax, [a.bars, a.chosen, a.heuristic], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3,
                   fontsize=7, frameon=False)


_WAVES_FIGURE = figures.LiveFigure(6.0, 3.4, _waves_build, _waves_draw)


@explorer(
    "flashattention.split_kv_occupancy",
    model=Choice(GQA_MODELS),
    gpu=Choice(tuple(hardware.gpu_names())),
    tp=IntRange(1, 8, log=True, label="tensor parallel"),
    batch=IntRange(1, 256, log=True),
    context=IntRange(128, 1048576, log=True, label="context tokens"),
    num_splits=IntRange(1, MAX_SPLITS, label="splits S"),
)
def split_kv_occupancy(model: str, gpu: str, tp: int, batch: int, context: int, num_splits: int) -> View:
    """I094: thread blocks of a decode attention launch (batch x KV heads per GPU x splits) against the
    GPU's SMs (lib.attention.split_kv.decode_occupancy), for every split count, and the split count
    FlashAttention-2's heuristic picks (decode_num_splits)."""
    from lib.attention import split_kv as sk

    m = models.model(model)
    m.check_context(context)
    heads = models.model(model).kv_heads_per_rank(tp)
    sms = hardware.gpu(gpu).compute_units
    occ = [sk.decode_occupancy(batch, heads, s, sm_count=sms) for s in range(1, MAX_SPLITS + 1)]
    busy = np.array([o.sm_busy_fraction for o in occ])
    picked = sk.decode_num_splits(batch, heads, context, m.head_dim, sm_count=sms)
    this = occ[num_splits - 1]
    picked_occ = sk.decode_occupancy(batch, heads, picked, sm_count=sms)
    fig = _WAVES_FIGURE(busy, num_splits, picked, f"{model} TP{tp} on {gpu}: batch {batch}, {context:,} tokens")
    rows = [("KV heads per GPU", str(heads)),
            ("SMs", str(sms)),
            ("thread blocks, no split", f"{batch * heads:,} ({sig(100 * occ[0].sm_busy_fraction, 2)}% of SMs busy)"),
            (f"thread blocks at S = {num_splits}", f"{this.thread_blocks:,} in {this.waves} wave(s)"),
            ("SM busy fraction", f"{sig(100 * this.sm_busy_fraction, 3)}%"),
            ("keys per split", f"{-(-context // num_splits):,}"),
            ("FlashAttention-2 picks", f"S = {picked} ({sig(100 * picked_occ.sm_busy_fraction, 3)}% busy, "
                                       f"{picked_occ.waves} wave(s))")]
    note = ("Bars: the fraction of SM slots doing work (blocks / (waves x SMs)) at each split count; a count that "
            "overshoots a whole wave by a few blocks drops to about half. The red bar is the chosen S.")
    caption = (f"Each bar is the share of SM slots doing work when the keys are split S ways (batch {batch} x {heads} KV heads "
               f"x S thread blocks on {sms} SMs); a count just past a whole wave drops to about half. The chosen "
               f"S = {num_splits} (red) keeps {fmt_pct(this.sm_busy_fraction)} busy; FlashAttention-2 picks S = {picked} "
               f"(triangle), {fmt_pct(picked_occ.sm_busy_fraction)}.")
    return View(f"Split-KV decode occupancy: {model}, {gpu}", rows, fig, note, caption=caption,
                values={"heads": float(heads), "sms": float(sms), "busy": this.sm_busy_fraction,
                        "busy_unsplit": occ[0].sm_busy_fraction, "picked": float(picked),
                        "waves": float(this.waves)})
