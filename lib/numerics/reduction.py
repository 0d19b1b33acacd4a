"""Reduction order as a source of different bits: the same dot products summed in two orders
(a kernel that walks K in one accumulator against a split-K kernel chosen for another batch shape),
the greedy tokens that flip when the logits differ in the last bits, and seeded near-tie inputs
that make the flips visible. numpy only, float32 accumulation one rounding per term.

For batch invariance (chapters/10-numerics): :func:`split_sum` sums in any split, :func:`layered_logits`
runs a seeded bf16 residual stack with every reduction in one split, :func:`logits_two_orders` and
:func:`flip_rate_vs_gap` give the share of greedy tokens that flip between two splits at a given top-two gap
(:func:`flip_rate_expected`: the same share in closed form, over the head's random columns),
:func:`divergence_probability` turns a per-token flip chance into
the chance a completion differs, and :func:`kernel_choice` / :func:`batch_invariant_cost` read which
split-K a tiled GEMM picks at each batch size and what one fixed configuration costs
(:mod:`lib.kernels.gemm_waves`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

from .formats import bf16_round

__all__ = ["BatchInvariantCost", "KernelChoice", "TwoOrderStack", "argmax_flips", "batch_invariant_cost",
           "divergence_probability", "flip_rate_expected", "flip_rate_vs_gap", "kernel_choice", "layered_hidden",
           "layered_logits", "logits_two_orders", "near_tie_problem", "split_sum", "stack_two_orders", "sum_two_orders",
           "tokens_to_divergence"]


def sum_two_orders(h: np.ndarray, w: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
    """h @ w in float32 twice: one accumulator over the inner index in order (a kernel that walks K),
    and ``split`` contiguous partial sums added at the end (a split-K kernel for another shape):
    ``(split_sum(h, w, 1), split_sum(h, w, split))`` (:func:`split_sum`, the one implementation)."""
    return split_sum(h, w, 1), split_sum(h, w, split)


def argmax_flips(hidden, weight, split: int, output_bf16: bool = True, upstream=None) -> dict:
    """Greedy tokens from the same logits computed in two reduction orders (:func:`sum_two_orders`):
    the plain decode step's kernel and the verification pass's (another batch shape, another split).

    logits = hidden @ weight, float32 accumulation, rounded to bfloat16 when ``output_bf16`` (a BF16
    lm_head writes BF16 logits). With ``upstream`` (a (d_in, d) matrix) the hidden state is itself
    computed as bf16(hidden @ upstream) in the same two orders first, so a rounding difference
    upstream reaches the logits amplified (one BF16 ulp is 2^-8 of the value). Returns the rows whose
    argmax differs ('flips'), the share of rows whose logits differ at all, the top-two gap of each
    row (first order) and the number of rows whose top two are exactly tied (first order).
    """
    h = np.asarray(hidden, dtype=np.float32)
    w = np.asarray(weight, dtype=np.float32)
    if upstream is not None:
        u = np.asarray(upstream, dtype=np.float32)
        if u.ndim != 2 or h.ndim != 2 or h.shape[1] != u.shape[0]:
            raise ValueError(f"hidden (rows, d_in) and upstream (d_in, d) must agree on d_in, got {h.shape}, {u.shape}")
        s = integer("split", split, 2, h.shape[1])
        a, b = (bf16_round(x) for x in sum_two_orders(h, u, s))
    else:
        a = b = h
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0]:
        raise ValueError(f"hidden (rows, d) and weight (d, vocab) must agree on d, got {a.shape} and {w.shape}")
    s = integer("split", split, 2, a.shape[1])
    first, _ = sum_two_orders(a, w, s)
    _, second = sum_two_orders(b, w, s)
    if output_bf16:
        first, second = bf16_round(first), bf16_round(second)
    top2 = np.sort(first, axis=1)[:, -2:]
    return {
        "flips": np.flatnonzero(first.argmax(1) != second.argmax(1)),
        "differ_share": float(np.mean((first != second).any(axis=1))),
        "gap": (top2[:, 1] - top2[:, 0]).astype(np.float64),
        "ties": int(np.sum(top2[:, 1] == top2[:, 0])),
    }


def near_tie_problem(rows: int, d: int, vocab: int, tie_gap: float, logit_std: float = 4.0, seed: int = 0):
    """Seeded inputs whose logits have near-ties: x (rows, d) ~ N(0, 1), an upstream layer
    w1 (d, d) ~ N(0, 1/d) (so h = x @ w1 has unit variance), and an lm_head w2 (d, vocab) whose
    logits have std ``logit_std``, with the columns in pairs: column 2j+1 = column 2j + tie_gap * n_j,
    n_j ~ N(0, 1/d), so each token has a twin whose logit differs by N(0, tie_gap^2): the top token's
    twin is usually the runner-up (a near-synonym). float32 arrays (x, w1, w2)."""
    r = integer("rows", rows, 1)
    dd = integer("d", d, 2)
    v = integer("vocab", vocab, 2)
    real("tie_gap", tie_gap, 0)
    real("logit_std", logit_std, 0, low_open=True)
    rng = np.random.default_rng(integer("seed", seed, 0))
    x = rng.standard_normal((r, dd))
    w1 = rng.standard_normal((dd, dd)) / math.sqrt(dd)
    w2 = rng.standard_normal((dd, v)) * logit_std / math.sqrt(dd)
    twins = w2[:, 0 : v - 1 : 2] + tie_gap * rng.standard_normal((dd, v // 2)) / math.sqrt(dd)
    w2[:, 1::2] = twins[:, : w2[:, 1::2].shape[1]]
    return x.astype(np.float32), w1.astype(np.float32), w2.astype(np.float32)


def split_sum(h, w, split: int) -> np.ndarray:
    """h @ w in float32 with the inner index cut into ``split`` contiguous pieces (numpy.array_split's
    pieces), each summed in order in one float32 accumulator that starts at +0 (one rounding per
    product and one per addition), then the partial sums added in order: split = 1 is one accumulator
    walking K. The loop runs over K with each step vectorized over (rows, n): memory stays at one
    (rows, n) accumulator (a cumsum over a (rows, d, n) tensor gives the same bits 10-60x slower)."""
    a = np.asarray(h, dtype=np.float32)
    b = np.asarray(w, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"h (rows, d) and w (d, n) must agree on d, got {a.shape} and {b.shape}")
    s = integer("split", split, 1, a.shape[1])
    total = None
    for idx in np.array_split(np.arange(a.shape[1]), s):
        part = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for i in idx:  # float32 += float32 product: one rounding per term, in this order
            part += a[:, i : i + 1] * b[i]
        if total is None:
            total = part
        else:
            total += part
    return total


def layered_hidden(x, layers, split: int) -> np.ndarray:
    """Final hidden state of a bf16 residual stack with every reduction in one ``split``
    (:func:`split_sum`): h_0 = bf16(x); h_{l+1} = bf16(h_l + bf16(h_l @ W_l)); float32 array (rows, d)."""
    h = bf16_round(np.asarray(x, dtype=np.float32))
    for w in layers:
        h = bf16_round(h + bf16_round(split_sum(h, w, split)))
    return h


def layered_logits(x, layers, head, split: int, output_bf16: bool = False) -> np.ndarray:
    """Logits of a bf16 residual stack with every reduction in one ``split``: logits =
    :func:`layered_hidden` @ head (float32, rounded to bf16 when ``output_bf16``). Two splits give two
    bit patterns of the same model: the kernel a batch size picks is the only difference."""
    out = split_sum(layered_hidden(x, layers, split), head, split)
    return bf16_round(out) if output_bf16 else out


@dataclass(frozen=True)
class TwoOrderStack:
    """One seeded model run in two reduction orders, stopped before the lm_head: the final bf16 hidden
    states of each order (rows, d), the head (d, vocab) whose entries are i.i.d. N(0, ``head_std``^2),
    and the two splits. :meth:`logits` applies the head in each order."""

    hidden_a: np.ndarray
    hidden_b: np.ndarray
    head: np.ndarray
    head_std: float
    split_a: int
    split_b: int

    def logits(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 logits hidden @ head, each order's hidden state in its own split (:func:`split_sum`)."""
        return split_sum(self.hidden_a, self.head, self.split_a), split_sum(self.hidden_b, self.head, self.split_b)


def stack_two_orders(split_a: int, split_b: int, layers: int = 4, rows: int = 400, d: int = 64, vocab: int = 64,
                     logit_std: float = 4.0, seed: int = 0) -> TwoOrderStack:
    """The seeded bf16 residual stack of :func:`logits_two_orders` run in ``split_a`` and in ``split_b``
    (:func:`layered_hidden`): x and the first layer from :func:`near_tie_problem`, the other
    ``layers`` - 1 layers N(0, 1/(d layers)), an lm_head of independent N(0, logit_std^2 / d) entries
    (drawn after the layers, so independent of the hidden states)."""
    n_layers = integer("layers", layers, 1, 64)
    x, w1, _ = near_tie_problem(rows, d, 2, 0.0, logit_std, seed)
    dd = x.shape[1]
    sa, sb = integer("split_a", split_a, 1, dd), integer("split_b", split_b, 1, dd)
    rng = np.random.default_rng(integer("seed", seed, 0) + 1)
    ws = [w1 / np.float32(math.sqrt(n_layers))] + [
        (rng.standard_normal((dd, dd)) / math.sqrt(dd * n_layers)).astype(np.float32) for _ in range(n_layers - 1)]
    head_std = float(logit_std) / math.sqrt(dd)
    head = (rng.standard_normal((dd, integer("vocab", vocab, 2))) * head_std).astype(np.float32)
    return TwoOrderStack(layered_hidden(x, ws, sa), layered_hidden(x, ws, sb), head, head_std, sa, sb)


def logits_two_orders(split_a: int, split_b: int, layers: int = 4, rows: int = 400, d: int = 64, vocab: int = 64,
                      logit_std: float = 4.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One seeded model's float32 logits computed twice, every reduction in ``split_a`` and then in
    ``split_b`` (:func:`stack_two_orders` then its head; the bits of :func:`layered_logits`). The
    difference b - a is what a change of batch (of kernel) does to the logits."""
    return stack_two_orders(split_a, split_b, layers, rows, d, vocab, logit_std, seed).logits()


def flip_rate_vs_gap(first, second, gaps) -> np.ndarray:
    """The share of rows whose greedy token flips between two computations of the logits when the top
    two (in ``first``) are a planted ``gap`` apart: move the runner-up to top - gap in both (the same
    fp32 bias), and it wins in ``second`` when its change exceeds the top token's by more than the gap:
    F(g) = mean[(b_2 - a_2) - (b_1 - a_1) > g]. One value per gap (gaps >= 0, logit units)."""
    a = np.asarray(first, dtype=np.float64)
    b = np.asarray(second, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[1] < 2:
        raise ValueError(f"first and second must be (rows, vocab >= 2) logits of one shape, got {a.shape}, {b.shape}")
    g = np.asarray(gaps, dtype=np.float64)
    if np.any(~np.isfinite(g)) or np.any(g < 0):
        raise ValueError(f"gaps must be finite and >= 0, got {gaps!r}")
    order = np.argsort(-a, axis=1, kind="stable")
    rows = np.arange(a.shape[0])
    i1, i2 = order[:, 0], order[:, 1]
    swing = (b[rows, i2] - a[rows, i2]) - (b[rows, i1] - a[rows, i1])
    return (swing[None, :] > g.reshape(-1, 1)).mean(axis=1).reshape(g.shape)


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def flip_rate_expected(stack: TwoOrderStack, gaps) -> tuple[np.ndarray, np.ndarray]:
    """The flip rate of :func:`flip_rate_vs_gap` in closed form: its expectation over the lm_head's random
    columns, given each row's measured change of hidden state. Row r's swing is
    dh_r . (w_2 - w_1) + e_r, with dh_r = h_b - h_a (bf16 flips upstream) and e_r the float32 rounding
    of the head GEMM in the two orders (measured on h_a). Split dh_r = alpha_r h_a + dh_perp (alpha_r =
    dh_r . h_a / |h_a|^2): choosing the top two fixes only h_a . w_j, so the part of w_2 - w_1 orthogonal
    to h_a stays N(0, 2 head_std^2) per direction, and
    P_r(g) = Q((g + alpha_r delta_r - e_r) / (sqrt(2) head_std |dh_perp,r|)), Q(z) = erfc(z / sqrt 2) / 2,
    delta_r = h_a . (w_1 - w_2) the top-two gap (the top two of the first order's logits; rows with dh_r = 0: 1[e_r > g]).
    Returns (rate per gap = mean_r P_r, standard deviation of the count of flipped rows =
    sqrt(sum_r P_r (1 - P_r)), the Poisson-binomial spread a sampled count has about rows * rate)."""
    if not isinstance(stack, TwoOrderStack):
        raise ValueError(f"stack must be a TwoOrderStack (from stack_two_orders), got {type(stack).__name__}")
    g = np.asarray(gaps, dtype=np.float64)
    if g.ndim > 1 or np.any(~np.isfinite(g)) or np.any(g < 0):
        raise ValueError(f"gaps must be finite and >= 0, got {gaps!r}")
    ha = stack.hidden_a.astype(np.float64)
    dh = stack.hidden_b.astype(np.float64) - ha
    w = stack.head.astype(np.float64)
    fa, fb = (x.astype(np.float64) for x in (split_sum(stack.hidden_a, stack.head, stack.split_a),
                                            split_sum(stack.hidden_a, stack.head, stack.split_b)))
    order = np.argsort(-fa, axis=1, kind="stable")  # the top two as flip_rate_vs_gap picks them
    rows = np.arange(ha.shape[0])
    i1, i2 = order[:, 0], order[:, 1]
    delta = np.einsum("rd,dr->r", ha, w[:, i1] - w[:, i2])  # h_a . (w_1 - w_2), exact
    e = (fb[rows, i2] - fa[rows, i2]) - (fb[rows, i1] - fa[rows, i1])
    norm2 = np.maximum(np.sum(ha * ha, axis=1), np.finfo(float).tiny)
    alpha = np.sum(dh * ha, axis=1) / norm2
    spread = math.sqrt(2.0) * stack.head_std * np.linalg.norm(dh - alpha[:, None] * ha, axis=1)
    thr = g.reshape(-1, 1) + alpha * delta - e
    moved = spread > 0
    z = np.where(moved, thr / np.where(moved, spread, 1.0), 0.0)
    p = np.where(moved, np.asarray(_ERFC(z / math.sqrt(2.0)), dtype=np.float64) / 2.0, (thr < 0).astype(np.float64))
    rate, sd = p.mean(axis=1), np.sqrt(np.sum(p * (1.0 - p), axis=1))
    return rate.reshape(g.shape), sd.reshape(g.shape)


def divergence_probability(p_token, tokens):
    """The chance a greedy completion of ``tokens`` tokens differs somewhere between two runs when each
    token flips independently with probability ``p_token``: 1 - (1 - p)^n (computed as
    -expm1(n log1p(-p)) so tiny p keep their digits). Arrays broadcast."""
    p = np.asarray(p_token, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.float64)
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"p_token must lie in [0, 1], got {p_token!r}")
    if np.any(~np.isfinite(n)) or np.any(n < 0):
        raise ValueError(f"tokens must be >= 0, got {tokens!r}")
    out = -np.expm1(n * np.log1p(-np.minimum(p, 1 - 1e-16))) if np.all(p < 1) else 1.0 - (1.0 - p) ** n
    return float(out) if np.ndim(out) == 0 else out


def tokens_to_divergence(p_token: float, probability: float = 0.5) -> float:
    """The completion length at which two runs differ with ``probability``: log(1 - P) / log(1 - p)
    (inf when p = 0)."""
    p = real("p_token", p_token, 0, 1, high_open=True)
    q = real("probability", probability, 0, 1, low_open=True, high_open=True)
    return math.inf if p == 0 else math.log1p(-q) / math.log1p(-p)


@dataclass(frozen=True)
class KernelChoice:
    """The GEMM configuration a shape-driven heuristic picks at batch m: tile shape, split-K pieces of
    the leftover tiles, and the time (seconds) under :func:`lib.kernels.gemm_waves.split_leftover`."""

    m: int
    tile: str
    splits: int
    time_s: float


def kernel_choice(m: int, n: int, k: int, chip, dtype: str = "bf16", tile: str | None = None) -> KernelChoice:
    """The fastest (tile, split-K) for C[m, n] = A[m, k] B[k, n] on ``chip`` (``tile`` fixes the tile):
    what an autotuned library picks for this batch size. Its reduction order along K is set by the
    split, so two batch sizes with different splits give different bits for the same row."""
    from lib.kernels import gemm_waves as gw

    tiles = gw.TILE_SHAPES if tile is None else (tile,)
    best = min((gw.split_leftover(m, n, k, chip, t, dtype) for t in tiles), key=lambda r: (r.time_s, r.splits))
    return KernelChoice(int(m), best.base.tile, best.splits, best.time_s)


@dataclass(frozen=True)
class BatchInvariantCost:
    """Per batch size: the heuristic's choice, and the time of one fixed configuration (``tile``, no
    split-K: one reduction order whatever the batch), chosen to minimize the summed time over
    ``batches``."""

    batches: tuple[int, ...]
    best: tuple[KernelChoice, ...]
    tile: str
    invariant_s: tuple[float, ...]

    @property
    def ratio(self) -> np.ndarray:
        """invariant / best time at each batch size (>= 1)."""
        return np.array(self.invariant_s) / np.array([c.time_s for c in self.best])

    @property
    def orders(self) -> int:
        """Distinct split-K counts the heuristic uses over the batches: distinct reduction orders."""
        return len({c.splits for c in self.best})


def batch_invariant_cost(n: int, k: int, chip, batches, dtype: str = "bf16") -> BatchInvariantCost:
    """:func:`kernel_choice` at each batch size against one batch-invariant configuration: the tile
    shape that, without split-K, minimizes the summed time over ``batches``."""
    from lib.kernels import gemm_waves as gw

    ms = tuple(integer("batch", int(b) if isinstance(b, np.integer) else b, 1, 10**6) for b in batches)
    if not ms:
        raise ValueError("batches must list at least one batch size")
    best = tuple(kernel_choice(m, n, k, chip, dtype) for m in ms)
    fixed = {t: tuple(gw.split_leftover(m, n, k, chip, t, dtype, splits=1).time_s for m in ms) for t in gw.TILE_SHAPES}
    tile = min(fixed, key=lambda t: (sum(fixed[t]), gw.TILE_SHAPES.index(t)))
    return BatchInvariantCost(ms, best, tile, fixed[tile])
