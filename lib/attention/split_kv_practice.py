"""Practice mode for split-KV decode attention (I094): a skeleton, a grader, the classic bugs.

The candidate implements :class:`Skeleton`: ``partial(q, k, v)`` attends q (B, Hq, 1, d) over one
chunk of keys k, v (B, Hkv, n, d) (n may be 0) and returns (o, lse): o (B, Hq, 1, d) normalized
over the chunk, lse (B, Hq, 1) its log-sum-exp (-inf and o = 0 for an empty chunk);
``merge(outs, lses)`` combines S partials into the output of attention over all keys.
:func:`check` grades any factory (class or lambda; never a subclass of the reference) through
:func:`lib.book.practice.grade`.

The oracle is :mod:`lib.attention.split_kv` and :func:`lib.attention.naive.naive_attention` in
float64: each partial against attention over that chunk alone; ``merge`` is fed the ORACLE's
partials (so a merge bug is reported as a merge bug) and compared with unsplit attention over all
keys. A case is a program:

- ``("config", batch, n_q_heads, n_kv_heads, head_dim, q_scale, seed)``: first op, optional
  (default ``DEFAULT_CONFIG``); q = q_scale x standard normals drawn from ``seed``; a large
  ``q_scale`` makes scores in the thousands, where exp without a max subtraction overflows;
- ``("chunk", n, seed)``: the next split: n keys (n = 0: an empty split) with k then v standard
  normals drawn from ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .naive import naive_attention
from .split_kv import merge_partials, partial_attention

__all__ = [
    "DEFAULT_CONFIG",
    "QUESTION",
    "VARIANTS",
    "Reference",
    "Skeleton",
    "cases",
    "check",
    "describe",
    "run",
    "variant",
]

QUESTION = "split-KV decode attention (I094)"
DEFAULT_CONFIG = ("config", 1, 4, 2, 8, 1.0, 0)
TOLERANCE = 1e-4  # relative and absolute, against the float64 oracle


class Skeleton:
    """Split-KV (flash-decoding) attention: partials over key chunks, merged exactly."""

    def partial(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Attention of q (B, Hq, 1, d) over one chunk k, v (B, Hkv, n, d), n >= 0, scale 1/sqrt(d),
        query head h reading KV head h // (Hq / Hkv). Return (o (B, Hq, 1, d) normalized over the
        chunk, lse (B, Hq, 1) = log sum_j exp(s_j)); an empty chunk gives o = 0 and lse = -inf."""
        raise NotImplementedError

    def merge(self, outs: list[np.ndarray], lses: list[np.ndarray]) -> np.ndarray:
        """Combine S partial (o, lse) pairs into attention over all their keys (B, Hq, 1, d)."""
        raise NotImplementedError


class Reference:
    """The book's implementation (:mod:`lib.attention.split_kv`) behind the practice interface."""

    def partial(self, q, k, v):
        return partial_attention(q, k, v, acc_dtype=np.float64)

    def merge(self, outs, lses):
        return merge_partials(outs, lses)[0]


# ---- defective variants ----------------------------------------------------------------------


class _Variant(Reference):
    mistake = ""

    def partial(self, q, k, v):
        g = q.shape[1] // k.shape[1]
        heads = np.arange(q.shape[1]) % k.shape[1] if self.mistake == "interleaved_gqa" else np.arange(q.shape[1]) // g
        kk, vv = k[:, heads], v[:, heads]
        s = q @ np.swapaxes(kk, -1, -2) / np.sqrt(q.shape[-1])
        with np.errstate(all="ignore"):
            if k.shape[2] == 0:
                if self.mistake == "empty_split_nan":
                    return np.zeros(q.shape) / 0.0, np.full(q.shape[:3], -np.inf)
                if self.mistake == "empty_lse_zero":
                    return np.zeros(q.shape), np.zeros(q.shape[:3])
                return np.zeros(q.shape), np.full(q.shape[:3], -np.inf)
            if self.mistake == "no_max_lse":
                e = np.exp(s)
                return e @ vv / e.sum(-1, keepdims=True), np.log(e.sum(-1))
            m = s.max(-1, keepdims=True)
            e = np.exp(s - m)
            o = e @ vv
            if self.mistake != "unnormalized_partial":
                o = o / e.sum(-1, keepdims=True)
            return o, m[..., 0] + np.log(e.sum(-1))

    def merge(self, outs, lses):
        o, lse = np.stack(outs), np.stack(lses)
        with np.errstate(all="ignore"):
            if self.mistake == "average_partials":
                return o.mean(0)
            if self.mistake == "merge_without_max":
                w = np.exp(lse)
                total = w.sum(0)[..., None]
                return np.where(total > 0, (w[..., None] * o).sum(0) / np.where(total > 0, total, 1), 0.0)
            m = lse.max(0)
            w = np.exp(lse - m)
            if self.mistake == "empty_split_nan":
                return (w[..., None] * o).sum(0) / w.sum(0)[..., None]  # 0 x NaN = NaN
            num = np.where((w > 0)[..., None], w[..., None] * o, 0.0).sum(0)
            if self.mistake == "merge_no_renormalize":
                return num
            total = w.sum(0)[..., None]
            return np.where(total > 0, num / np.where(total > 0, total, 1), 0.0)


VARIANTS = ("no_max_lse", "merge_without_max", "empty_split_nan", "empty_lse_zero", "average_partials",
            "unnormalized_partial", "interleaved_gqa", "merge_no_renormalize")
"""Defective implementations the grader must fail (tests hold it to that)."""


def variant(name: str) -> Callable:
    """A factory for the reference (``"reference"``) or a defective implementation (``VARIANTS``)."""
    if name == "reference":
        return Reference
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return type(f"SplitKV_{name}", (_Variant,), {"mistake": name})


# ---- the grader ------------------------------------------------------------------------------


def _data(ops: Sequence) -> tuple[tuple, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    _, batch, hq, hkv, d, q_scale, seed = cfg
    q = np.random.default_rng(seed).standard_normal((batch, hq, 1, d)) * q_scale
    chunks = []
    for op in ops:
        if op[0] == "chunk":
            rng = np.random.default_rng(op[2])
            chunks.append((rng.standard_normal((batch, hkv, op[1], d)), rng.standard_normal((batch, hkv, op[1], d))))
    return cfg, q, chunks


def _close(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise agreement: equal infinities count as equal, NaN never does."""
    same_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    with np.errstate(invalid="ignore"):
        return same_inf | np.isclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)


def run(impl, ops: Sequence) -> None:
    """Grade ``impl`` on one program: each partial against its chunk alone, then ``merge`` of the
    oracle's partials against unsplit attention. AssertionError names the first difference."""
    _, q, chunks = _data(ops)
    if not chunks:
        return
    ref_outs, ref_lses = [], []
    for c, (k, v) in enumerate(chunks, 1):
        want_o, want_l = partial_attention(q, k, v, acc_dtype=np.float64)
        ref_outs.append(want_o), ref_lses.append(want_l)
        result = impl.partial(q.copy(), k.copy(), v.copy())
        try:
            got_o, got_l = (np.asarray(x, dtype=np.float64) for x in result)
        except (TypeError, ValueError):
            raise AssertionError(f"partial must return (o, lse), got {type(result).__name__}") from None
        what = f"split {c} ({k.shape[2]} keys{': empty' if k.shape[2] == 0 else ''})"
        if got_l.shape != want_l.shape or got_o.shape != want_o.shape:
            raise AssertionError(f"partial over {what} returned o {got_o.shape} and lse {got_l.shape}; "
                                 f"expected {want_o.shape} and {want_l.shape}")
        bad = ~_close(got_l, want_l)
        if bad.any():
            b, h, _ = (int(x) for x in np.argwhere(bad)[0])
            raise AssertionError(f"partial over {what}: lse of batch {b}, query head {h} is {float(got_l[b, h, 0]):.6g}; "
                                 f"log sum exp of the chunk's scores is {float(want_l[b, h, 0]):.6g}"
                                 + (" (an empty split must have lse = -inf, weight exp(-inf) = 0)" if k.shape[2] == 0 else ""))
        bad = ~_close(got_o, want_o)
        if bad.any():
            b, h, _, _ = (int(x) for x in np.argwhere(bad)[0])
            raise AssertionError(f"partial over {what}: o of batch {b}, query head {h} is off (first values "
                                 f"{np.round(got_o[b, h, 0, :3], 4).tolist()}, expected "
                                 f"{np.round(want_o[b, h, 0, :3], 4).tolist()})"
                                 + (": an empty split must give o = 0, not 0/0" if k.shape[2] == 0 else
                                    ": o must be normalized over its own chunk"))
    k_all = np.concatenate([k for k, _ in chunks], axis=2)
    v_all = np.concatenate([v for _, v in chunks], axis=2)
    want = naive_attention(q, k_all, v_all, acc_dtype=np.float64)
    got = np.asarray(impl.merge([o.copy() for o in ref_outs], [lse.copy() for lse in ref_lses]), dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"merge returned shape {got.shape}, expected {want.shape}")
    bad = ~_close(got, want)
    if bad.any():
        b, h, _, _ = (int(x) for x in np.argwhere(bad)[0])
        lses = [float(lse[b, h, 0]) for lse in ref_lses]
        raise AssertionError(f"merge of the exact partials (lse per split {np.round(lses, 3).tolist()}) differs from "
                             f"attention over all {k_all.shape[2]} keys at batch {b}, query head {h}: got "
                             f"{np.round(got[b, h, 0, :3], 4).tolist()}, expected {np.round(want[b, h, 0, :3], 4).tolist()}")


def _random_program(rng: np.random.Generator, k: int) -> tuple:
    hkv, group = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2, 4]))
    cfg = ("config", int(rng.integers(1, 3)), hkv * group, hkv, int(rng.choice([4, 8])),
           float(rng.choice([1.0, 1.0, 30.0, 1000.0])), 10_000 + k)
    chunks = [("chunk", 0 if rng.random() < 0.25 else int(rng.integers(1, 7)), 100 * k + c)
              for c in range(int(rng.integers(1, 6)))]
    return (cfg, *chunks)


def cases(num_random: int = 24, seed: int = 0) -> list[Case]:
    """Scripted programs (equal, uneven, empty, all-empty splits, huge scores, GQA, one split),
    then ``num_random`` seeded random programs."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("two equal splits", (DEFAULT_CONFIG, ("chunk", 4, 1), ("chunk", 4, 2))),
        Case("uneven splits", (DEFAULT_CONFIG, ("chunk", 1, 3), ("chunk", 7, 4), ("chunk", 3, 5))),
        Case("a split with no keys", (DEFAULT_CONFIG, ("chunk", 3, 6), ("chunk", 0, 7), ("chunk", 2, 8))),
        Case("every split empty", (DEFAULT_CONFIG, ("chunk", 0, 9), ("chunk", 0, 10))),
        Case("scores in the thousands", (("config", 1, 2, 1, 8, 1000.0, 1), ("chunk", 3, 11), ("chunk", 4, 12))),
        Case("GQA, group of 4, batch 2", (("config", 2, 8, 2, 8, 1.0, 2), ("chunk", 5, 13), ("chunk", 2, 14))),
        Case("one split is plain attention", (("config", 1, 2, 2, 4, 1.0, 3), ("chunk", 6, 15))),
    ]
    return scripted + [Case(f"random program {k}", _random_program(rng, k)) for k in range(num_random)]


def describe(ops: Sequence) -> str:
    """The (shrunk) program: the configuration and the splits, one a line."""
    cfg, _, chunks = _data(ops)
    lines = [f"  batch={cfg[1]}, n_q_heads={cfg[2]}, n_kv_heads={cfg[3]}, head_dim={cfg[4]}; "
             f"q = {cfg[5]:g} x standard normals (seed {cfg[6]})"]
    lines += [f"  split {c}: {op[1]} keys (k, v seed {op[2]})" for c, op in
              enumerate((op for op in ops if op[0] == "chunk"), 1)]
    return "\n".join(lines)


def check(factory: Callable, num_random: int = 24, seed: int = 0) -> PracticeReport:
    """Grade any implementation of the :class:`Skeleton` interface (a class or a zero-argument factory)."""
    return grade(QUESTION, factory, cases(num_random, seed), run, describe)
