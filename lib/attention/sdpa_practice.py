"""Practice mode for scaled dot-product attention from scratch (W01): a skeleton, a grader, the classic bugs.

The candidate writes one function ``sdpa(q, k, v, mask=None)``: q (B, Hq, Nq, d), k and v
(B, Hkv, Nk, d) with Hq a multiple of Hkv (query head h reads KV head h // (Hq / Hkv)), ``mask``
None or booleans that broadcast to (B, Hq, Nq, Nk) (True = may attend); it returns
O = softmax(Q K^T / sqrt(d), masked) V of shape (B, Hq, Nq, d), computed in at least float32 for
float16 inputs, with 0 for a query that may attend no key (what torch's SDPA returns on the CPU
build; ``torch.softmax`` of an all -inf row is NaN). :func:`check` grades any such function
through :func:`lib.book.practice.grade`; :func:`reference_sdpa` is the whiteboard answer.

The oracle is :func:`lib.attention.naive.naive_attention` in float64 on the same inputs (itself
tested against torch's ``scaled_dot_product_attention`` in tests/unit/test_attention_naive.py).
The tolerance is ``TOLERANCE`` (absolute and relative) plus ``SCORE_TOLERANCE`` x the case's
largest |score|: FP32 rounds a score s to about 6e-8 |s|, and an output moves by at most about
twice the score error times max |v|, so scores in the thousands get a wider band.

A case is a program, shrunk by dropping operations:

- ``("config", batch, n_q_heads, n_kv_heads, n_q, n_k, head_dim, dtype, q_scale, seed)``: first op,
  optional (default ``DEFAULT_CONFIG``); q = q_scale x standard normals, then k and v standard
  normals, all drawn from ``np.random.default_rng(seed)`` and stored in ``dtype`` ("float32" or
  "float16"); a large ``q_scale`` gives scores in the thousands (exp overflows without the max);
- mask operations, combined with AND (no mask operation: ``mask=None``):
  ``("causal", offset)``: query i sees keys j <= offset + i (offset = n_k - n_q: a chunk of new
  queries at the end of a cache; a negative offset leaves the first rows with no key);
  ``("padding", lengths)``: sequence b sees keys j < lengths[b % len(lengths)];
  ``("random", keep, seed)``: each entry kept with probability ``keep``;
  ``("no_keys", row)``: query row (row % n_q) sees no key at all.
  A mask of causal/no_keys operations only is passed as (Nq, Nk); with padding or random it is
  (B, 1, Nq, Nk): the candidate must broadcast both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .naive import causal_mask, naive_attention, padding_mask

__all__ = [
    "DEFAULT_CONFIG",
    "QUESTION",
    "VARIANTS",
    "case_inputs",
    "cases",
    "check",
    "describe",
    "reference_sdpa",
    "run",
    "skeleton",
    "variant",
]

QUESTION = "scaled dot-product attention from scratch (W01)"
DEFAULT_CONFIG = ("config", 1, 2, 2, 4, 6, 8, "float32", 1.0, 0)
TOLERANCE = 1e-4  # absolute and relative, against the float64 oracle (outputs are O(1))
SCORE_TOLERANCE = 1e-6  # per unit of the case's largest |score| (FP32 rounding of the scores)
DTYPES = ("float32", "float16")

def skeleton(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt(d) over the keys the mask allows) v.

    q (B, Hq, Nq, d), k and v (B, Hkv, Nk, d), Hq a multiple of Hkv: query head h reads KV head
    h // (Hq / Hkv). mask: None, or booleans broadcasting to (B, Hq, Nq, Nk), True = may attend.
    Returns (B, Hq, Nq, d), computed in float32 or wider; a query with no allowed key gives 0.
    """
    raise NotImplementedError


def reference_sdpa(q, k, v, mask=None):
    """The whiteboard answer: numpy, FP32 (or wider) accumulation, GQA, the fully-masked-row guard."""
    acc = np.result_type(q, k, v, np.float32)  # FP16 inputs: scores and softmax in FP32
    group = q.shape[1] // k.shape[1]  # GQA: query head h reads KV head h // group
    k = np.repeat(np.asarray(k, acc), group, axis=1)
    v = np.repeat(np.asarray(v, acc), group, axis=1)
    s = np.asarray(q, acc) @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # a row with no key: exp(-inf - 0) = 0, not -inf - (-inf) = NaN
    p = np.exp(s - m)  # every exponent <= 0: nothing overflows
    total = p.sum(axis=-1, keepdims=True)
    return (p / np.where(total > 0, total, 1.0)) @ v  # a row with no key stays 0


# ---- defective variants: each makes one classic mistake -------------------------------------


def _flawed(mistake: str, q, k, v, mask=None) -> np.ndarray:
    """:func:`reference_sdpa` rewritten with one mistake switched on."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    acc = q.dtype if mistake == "input_dtype_accumulation" else np.result_type(q, k, v, np.float32)
    hq, hkv = q.shape[1], k.shape[1]
    heads = np.arange(hq) % hkv if mistake == "interleaved_gqa" else np.arange(hq) // (hq // hkv)
    kk, vv = k[:, heads].astype(acc), v[:, heads].astype(acc)
    d = q.shape[-1]
    scale = {"no_scale": 1.0, "scale_by_d": 1.0 / d}.get(mistake, 1.0 / math.sqrt(d))
    axis = -2 if mistake == "softmax_over_queries" else -1
    with np.errstate(all="ignore"):
        s = (q.astype(acc) @ kk.swapaxes(-1, -2) * acc.type(scale)).astype(acc)
        if mask is not None and mistake != "zero_after_softmax":
            allowed = ~np.asarray(mask) if mistake == "mask_inverted" else mask
            fill = np.finfo(acc).min if mistake == "finfo_min_fill" else -np.inf
            s = np.where(allowed, s, acc.type(fill)).astype(acc)
        if mistake == "no_max_subtraction":
            m = acc.type(0)
        else:
            m = s.max(axis=axis, keepdims=True)
            if mistake != "no_masked_row_guard":
                m = np.where(np.isneginf(m), acc.type(0), m)
        p = np.exp(s - m).astype(acc)
        total = p.sum(axis=axis, keepdims=True, dtype=acc)
        p = (p / np.where(total > 0, total, acc.type(1))).astype(acc)
        if mask is not None and mistake == "zero_after_softmax":
            p = np.where(mask, p, acc.type(0))
        return (p @ vv).astype(acc)


VARIANTS = ("no_masked_row_guard", "finfo_min_fill", "no_max_subtraction", "input_dtype_accumulation",
            "no_scale", "scale_by_d", "interleaved_gqa", "softmax_over_queries", "mask_inverted",
            "zero_after_softmax")
"""Defective implementations the grader must fail (tests hold it to that)."""

_MISTAKE_TEXT = {
    "no_masked_row_guard": "a row with no allowed key left unguarded: its max is -inf and -inf - (-inf) = NaN",
    "finfo_min_fill": "masking with the dtype's most negative finite value instead of -inf: a row with no "
                      "allowed key then averages V uniformly instead of returning 0",
    "no_max_subtraction": "exp(s) without subtracting the row max: exp overflows to inf and inf / inf = NaN",
    "input_dtype_accumulation": "scores and softmax computed in the inputs' float16: each score is rounded to "
                                "11 significant bits",
    "no_scale": "scores not scaled by 1/sqrt(d)",
    "scale_by_d": "scores scaled by 1/d instead of 1/sqrt(d)",
    "interleaved_gqa": "query head h reading KV head h % n_kv_heads instead of h // (n_q_heads / n_kv_heads)",
    "softmax_over_queries": "the softmax taken over the queries (axis -2) instead of the keys",
    "mask_inverted": "the mask read as True = blocked (torch's boolean attn_mask means True = may attend)",
    "zero_after_softmax": "masked probabilities zeroed after the softmax, without renormalizing the row",
}


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a defective implementation (one of ``VARIANTS``)."""
    if name == "reference":
        return reference_sdpa
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")

    def flawed(q, k, v, mask=None):
        return _flawed(name, q, k, v, mask)

    flawed.__name__ = f"sdpa_{name}"
    return flawed


# ---- the grader ------------------------------------------------------------------------------


def _config(ops: Sequence) -> tuple:
    ops = list(ops)
    return ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG


def case_inputs(ops: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(q, k, v, mask) of a case program (module docstring), exactly as the grader passes them."""
    ops = list(ops)
    _, batch, hq, hkv, n_q, n_k, d, dtype, q_scale, seed = _config(ops)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((batch, hq, n_q, d)) * q_scale).astype(dtype)
    k = rng.standard_normal((batch, hkv, n_k, d)).astype(dtype)
    v = rng.standard_normal((batch, hkv, n_k, d)).astype(dtype)
    parts = [op for op in ops if op[0] != "config"]
    if not parts:
        return q, k, v, None
    per_batch = any(op[0] in ("padding", "random") for op in parts)
    mask = np.ones((batch, 1, n_q, n_k) if per_batch else (n_q, n_k), bool)
    for op in parts:
        if op[0] == "causal":
            mask = mask & causal_mask(n_q, n_k, max(op[1], -n_q))
        elif op[0] == "padding":
            lengths = [min(op[1][b % len(op[1])], n_k) for b in range(batch)]
            mask = mask & padding_mask(lengths, n_k)
        elif op[0] == "random":
            mask = mask & (np.random.default_rng(op[2]).random((batch, 1, n_q, n_k)) < op[1])
        elif op[0] == "no_keys":
            row = np.ones((n_q, n_k), bool)
            row[op[1] % n_q] = False
            mask = mask & row
        else:
            raise ValueError(f"unknown operation {op!r}")
    return q, k, v, mask


def _largest_score(q: np.ndarray, k: np.ndarray) -> float:
    group = q.shape[1] // k.shape[1]
    s = q.astype(np.float64) @ np.repeat(k.astype(np.float64), group, axis=1).swapaxes(-1, -2)
    return float(np.abs(s).max() / math.sqrt(q.shape[-1])) if s.size else 0.0


def _close(got: np.ndarray, want: np.ndarray, atol: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isclose(got, want, rtol=TOLERANCE, atol=atol)


def _matching_mistake(q, k, v, mask, got: np.ndarray, atol: float) -> str:
    """Which defective variant, run on the same inputs, gives the candidate's output."""
    for name in VARIANTS:
        try:
            want = np.asarray(_flawed(name, q, k, v, mask), np.float64)
        except Exception:  # noqa: BLE001 - a variant that raises cannot be the match
            continue
        same_nan = np.isnan(want) & np.isnan(got)
        if want.shape == got.shape and (same_nan | _close(got, want, atol)).all():
            return f" It matches {_MISTAKE_TEXT[name]}."
    return ""


def run(impl: Callable, ops: Sequence) -> None:
    """Call ``impl(q, k, v, mask)`` on the case's inputs and compare with the float64 oracle;
    AssertionError naming the first query whose output differs, and why."""
    q, k, v, mask = case_inputs(ops)
    want = naive_attention(q, k, v, mask, acc_dtype=np.float64)
    result = impl(q.copy(), k.copy(), v.copy(), None if mask is None else mask.copy())
    try:
        got = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"sdpa must return an array, got {type(result).__name__}") from None
    if got.shape != want.shape:
        raise AssertionError(f"sdpa returned shape {got.shape}, expected {want.shape} (batch, query heads, "
                             "queries, head_dim)")
    biggest = _largest_score(q, k)
    atol = TOLERANCE + SCORE_TOLERANCE * biggest
    bad = ~_close(got, want, atol)
    if not bad.any():
        return
    b, h, i, _ = (int(x) for x in np.argwhere(bad)[0])
    keys = k.shape[2] if mask is None else int(np.broadcast_to(mask, want.shape[:3] + (k.shape[2],))[b, h, i].sum())
    row = got[b, h, i]
    where = f"batch {b}, query head {h}, query {i}"
    if keys == 0:
        what = (f"{where} may attend no key (its mask row is all False): the answer is 0, what torch's SDPA "
                f"returns, but got {np.round(row[:3], 4).tolist()}")
        if np.isnan(row).any():
            what += "; NaN because the row max is -inf and exp(-inf - (-inf)) = exp(NaN)"
    elif not np.isfinite(row).all():
        what = (f"{where} is {np.round(row[:3], 4).tolist()} where attention over its {keys} key(s) is finite; the "
                f"case's largest |score| is {biggest:.4g} (exp overflows float32 past 88.7)")
    else:
        err = float(np.abs(got - want)[bad].max())
        what = (f"{where} ({keys} allowed key(s)) is {np.round(row[:3], 4).tolist()}, expected "
                f"{np.round(want[b, h, i, :3], 4).tolist()} (max error {err:.3g}, tolerance {atol:.3g} + "
                f"{TOLERANCE:g} relative)")
    raise AssertionError(what + "." + _matching_mistake(q, k, v, mask, got, atol))


def _random_program(rng: np.random.Generator, t: int) -> tuple:
    hkv, group = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2, 4]))
    n_q, n_k = int(rng.integers(1, 9)), int(rng.integers(1, 11))
    cfg = ("config", int(rng.integers(1, 3)), hkv * group, hkv, n_q, n_k, int(rng.choice([4, 8, 16])),
           str(rng.choice(["float32", "float32", "float16"])), float(rng.choice([1.0, 1.0, 1.0, 30.0, 1000.0])),
           20_000 + t)
    parts: list[tuple] = []
    for _ in range(int(rng.integers(0, 4))):
        kind = str(rng.choice(["causal", "padding", "random", "no_keys"]))
        if kind == "causal":
            parts.append(("causal", int(rng.integers(-2, n_k))))
        elif kind == "padding":
            parts.append(("padding", tuple(int(x) for x in rng.integers(0, n_k + 1, 2))))
        elif kind == "random":
            parts.append(("random", float(rng.choice([0.3, 0.7])), 500 + t))
        else:
            parts.append(("no_keys", int(rng.integers(0, n_q))))
    return (cfg, *parts)


def cases(num_random: int = 24, seed: int = 0) -> list[Case]:
    """The graded programs: scripted cases (plain, causal, a chunk at the end of a cache, padding,
    a fully masked row, scores in the thousands, float16 inputs, GQA, MQA), then ``num_random``
    seeded random programs."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("no mask, one KV head per query head", (DEFAULT_CONFIG,)),
        Case("causal, square", (("config", 1, 2, 2, 5, 5, 8, "float32", 1.0, 1), ("causal", 0))),
        Case("causal chunk of 3 queries at the end of 8 keys (query offset 5)",
             (("config", 1, 2, 2, 3, 8, 8, "float32", 1.0, 2), ("causal", 5))),
        Case("right padding, batch 2", (("config", 2, 2, 2, 4, 6, 8, "float32", 1.0, 3), ("padding", (6, 2)))),
        Case("a query row with no key (fully masked)", (("config", 1, 2, 2, 4, 6, 8, "float32", 1.0, 4), ("no_keys", 1))),
        Case("causal with a negative offset: the first rows see no key",
             (("config", 1, 2, 2, 4, 4, 8, "float32", 1.0, 5), ("causal", -2))),
        Case("a sequence of padding only (length 0)", (("config", 2, 2, 2, 3, 5, 8, "float32", 1.0, 6),
                                                       ("padding", (5, 0)))),
        Case("scores in the thousands", (("config", 1, 2, 2, 3, 6, 8, "float32", 1000.0, 7),)),
        Case("float16 inputs (accumulate in float32)", (("config", 1, 2, 2, 6, 16, 16, "float16", 1.0, 8),)),
        Case("float16 inputs, scores in the tens", (("config", 1, 2, 2, 4, 8, 16, "float16", 30.0, 9),)),
        Case("GQA, group of 4, batch 2", (("config", 2, 8, 2, 3, 6, 8, "float32", 1.0, 10), ("causal", 3))),
        Case("MQA (one KV head)", (("config", 1, 4, 1, 3, 5, 8, "float32", 1.0, 11),)),
    ]
    return scripted + [Case(f"random program {t}", _random_program(rng, t)) for t in range(num_random)]


def describe(ops: Sequence) -> str:
    """The (shrunk) program: the inputs, the mask's parts, the call."""
    ops = list(ops)
    _, batch, hq, hkv, n_q, n_k, d, dtype, q_scale, seed = _config(ops)
    lines = [f"  q, k, v = case_inputs(ops): batch={batch}, n_q_heads={hq}, n_kv_heads={hkv}, n_q={n_q}, "
             f"n_k={n_k}, head_dim={d}, {dtype}; q = {q_scale:g} x standard normals, then k, v "
             f"(np.random.default_rng({seed}))"]
    parts = [op for op in ops if op[0] != "config"]
    text = {"causal": lambda op: f"causal with query offset {op[1]} (query i sees keys j <= {op[1]} + i)",
            "padding": lambda op: f"right padding, lengths {list(op[1])} (sequence b sees keys j < length)",
            "random": lambda op: f"random, each entry kept with probability {op[1]} (seed {op[2]})",
            "no_keys": lambda op: f"query {op[1] % n_q} sees no key"}
    lines += [f"  mask part: {text[op[0]](op)}" for op in parts] or ["  mask = None"]
    lines.append("  out = sdpa(q, k, v, mask)")
    return "\n".join(lines)


def check(candidate: Callable, num_random: int = 24, seed: int = 0) -> PracticeReport:
    """Grade any function ``candidate(q, k, v, mask=None)`` against the float64 oracle."""
    if not callable(candidate):
        raise ValueError(f"check() takes a function sdpa(q, k, v, mask=None), got {candidate!r}")
    return grade(QUESTION, lambda: candidate, cases(num_random, seed), run, describe)
