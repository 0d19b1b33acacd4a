"""Practice mode for attention with a KV cache (I086): a skeleton, a grader, and the classic bugs.

The candidate implements :class:`Skeleton`'s interface: ``__init__(batch, n_q_heads, n_kv_heads,
head_dim, capacity)`` preallocates the cache; ``forward(q, k, v)`` takes one chunk of n new tokens
(q (B, Hq, n, d), k and v (B, Hkv, n, d)), stores k and v, and returns the chunk's attention
output (B, Hq, n, d); ``length`` is the number of cached tokens; a chunk that does not fit raises
ValueError and leaves the cache as it was. :func:`check` grades any factory (the class itself or a
lambda; never a subclass of the reference) through :func:`lib.book.practice.grade`.

Every expected value comes from the oracle :func:`lib.attention.kv_cache.full_recompute`: causal
attention over every token so far, recomputed from scratch in float64, last n rows; nothing is
read back from the candidate except its outputs and ``length``. A case is a program of chunks:

- ``("config", batch, n_q_heads, n_kv_heads, head_dim, capacity)``: first op, optional (default
  ``DEFAULT_CONFIG``); shrinking may drop it;
- ``("chunk", n, seed)``: n new tokens with standard normal q, k, v drawn from ``seed``; if it does
  not fit the remaining capacity the candidate must raise ValueError and keep its length.

When an output is wrong the grader also says which classic mistake it matches (``VARIANTS``:
keys written at the wrong slots, interleaved GQA heads, torch's top-left causal mask, no mask in
the chunk, a query not attending to itself, the length not kept, length moved before the check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .kv_cache import CachedAttention, full_recompute

__all__ = [
    "DEFAULT_CONFIG",
    "QUESTION",
    "VARIANTS",
    "Skeleton",
    "cases",
    "check",
    "describe",
    "run",
    "variant",
]

QUESTION = "attention with a KV cache (I086)"
DEFAULT_CONFIG = ("config", 1, 4, 2, 8, 16)
TOLERANCE = 1e-4  # absolute and relative, against the float64 oracle (outputs are O(1))


class Skeleton:
    """Attention over a preallocated KV cache, one chunk of new tokens at a time."""

    def __init__(self, batch: int, n_q_heads: int, n_kv_heads: int, head_dim: int, capacity: int):
        """Preallocate K and V for ``capacity`` tokens per sequence and KV head; start empty."""
        raise NotImplementedError

    @property
    def length(self) -> int:
        """How many tokens are cached."""
        raise NotImplementedError

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Store the chunk's k, v (B, Hkv, n, d) after the cached tokens; return the attention of
        its queries q (B, Hq, n, d): query i (absolute position length + i) sees keys j <= length + i,
        query head h reads KV head h // (Hq / Hkv). ValueError (cache unchanged) if it does not fit."""
        raise NotImplementedError


# ---- defective variants: each makes one classic mistake -------------------------------------


class _Variant:
    """A cached attention written with explicit loops, one mistake switchable at a time."""

    mistake = ""

    def __init__(self, batch, n_q_heads, n_kv_heads, head_dim, capacity):
        self.hq, self.hkv = n_q_heads, n_kv_heads
        self.k = np.zeros((batch, n_kv_heads, capacity, head_dim))
        self.v = np.zeros((batch, n_kv_heads, capacity, head_dim))
        self._length = 0

    @property
    def length(self):
        return self._length

    def _kv_head(self, h):
        if self.mistake == "interleaved_gqa":
            return h % self.hkv
        return h // (self.hq // self.hkv)

    def _sees(self, i, j, past):
        pos = past + i
        return {"top_left_causal": j <= i, "no_causal_in_chunk": True,
                "excludes_self": j < pos}.get(self.mistake, j <= pos)

    def forward(self, q, k, v):
        n, past = q.shape[2], self._length
        if self.mistake == "length_before_check":
            self._length += n
            self.k[:, :, past:past + n] = k  # numpy raises ValueError when it does not fit
            self.v[:, :, past:past + n] = v
        else:
            if past + n > self.k.shape[2]:
                raise ValueError("does not fit")
            start = 0 if self.mistake == "overwrites_slot_zero" else past
            self.k[:, :, start:start + n] = k
            self.v[:, :, start:start + n] = v
            if self.mistake != "forgets_length":
                self._length += n
        total = past + n
        out = np.zeros(q.shape)
        for b in range(q.shape[0]):
            for h in range(self.hq):
                kh, vh = self.k[b, self._kv_head(h), :total], self.v[b, self._kv_head(h), :total]
                for i in range(n):
                    s = kh @ q[b, h, i] / np.sqrt(q.shape[3])
                    s = np.where([self._sees(i, j, past) for j in range(total)], s, -np.inf)
                    if np.isneginf(s).all():
                        continue
                    p = np.exp(s - s.max())
                    out[b, h, i] = p @ vh / p.sum()
        return out


VARIANTS = ("overwrites_slot_zero", "interleaved_gqa", "top_left_causal", "no_causal_in_chunk",
            "excludes_self", "forgets_length", "length_before_check")
"""Defective implementations the grader must fail (tests hold it to that)."""

_MISTAKE_TEXT = {
    "overwrites_slot_zero": "new keys written at slot 0 instead of after the cached tokens",
    "interleaved_gqa": "query head h reading KV head h % n_kv_heads instead of h // (n_q_heads / n_kv_heads)",
    "top_left_causal": "a top-left causal mask (query i sees keys j <= i, torch's is_causal) instead of "
                       "j <= past_len + i",
    "no_causal_in_chunk": "no causal mask inside the chunk (queries see later tokens of their own chunk)",
    "excludes_self": "a query not attending to its own key (j < past_len + i)",
    "forgets_length": "the length never advancing (each chunk overwrites the last)",
    "length_before_check": "the length advanced before the capacity check",
}


def variant(name: str) -> Callable:
    """A factory for the reference (``"reference"``) or a defective implementation (``VARIANTS``)."""
    if name == "reference":
        return CachedAttention
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return type(f"KVCache_{name}", (_Variant,), {"mistake": name})


# ---- the grader ------------------------------------------------------------------------------


def _chunk(cfg: tuple, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _, batch, hq, hkv, d, _ = cfg
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, hq, n, d)), rng.standard_normal((batch, hkv, n, d)),
            rng.standard_normal((batch, hkv, n, d)))


def _matching_mistake(cfg, history, n, got) -> str:
    """Which defective variant, replayed on the same accepted chunks, gives the candidate's output."""
    for name in VARIANTS:
        impl = variant(name)(*cfg[1:])
        try:
            for q, k, v in history[:-1]:
                impl.forward(q, k, v)
            want = impl.forward(*history[-1])
        except Exception:  # noqa: BLE001 - a variant that refuses differs anyway
            continue
        if want.shape == got.shape and np.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
            return f" It matches {_MISTAKE_TEXT[name]}."
    return ""


def run(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(batch, n_q_heads, n_kv_heads, head_dim, capacity)`` against the
    full-recomputation oracle; AssertionError at the first difference."""
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    capacity = cfg[5]
    impl = factory(*cfg[1:])
    history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    length = 0
    for step, op in enumerate((op for op in ops if op[0] != "config"), 1):
        _, n, seed = op
        q, k, v = _chunk(cfg, n, seed)
        where = f"step {step} (a chunk of {n} token{'s' if n > 1 else ''} after {length} cached, capacity {capacity})"
        if length + n > capacity:
            try:
                impl.forward(q.copy(), k.copy(), v.copy())
            except ValueError:
                got_len = impl.length
                if got_len != length:
                    raise AssertionError(f"{where}: refused the chunk (right) but length is now {got_len}, "
                                         f"not {length}: a refused chunk must leave the cache as it was") from None
                continue
            raise AssertionError(f"{where}: the chunk does not fit ({length} + {n} > {capacity}) but forward "
                                 "accepted it (it should raise ValueError)")
        got = np.asarray(impl.forward(q.copy(), k.copy(), v.copy()))
        history.append((q, k, v))
        length += n
        if got.shape != q.shape:
            raise AssertionError(f"{where}: forward returned shape {got.shape}, expected {q.shape}")
        if impl.length != length:
            raise AssertionError(f"{where}: length is {impl.length} after the step, expected {length}")
        q_all, k_all, v_all = (np.concatenate(t, axis=2) for t in zip(*history, strict=True))
        want = full_recompute(q_all, k_all, v_all, n, acc_dtype=np.float64)
        bad = ~np.isclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
        if bad.any():
            b, h, i, _ = (int(x) for x in np.argwhere(bad)[0])
            err = float(np.nanmax(np.abs(got - want))) if not np.isnan(got).any() else float("nan")
            raise AssertionError(
                f"{where}: output of batch {b}, query head {h}, chunk query {i} (absolute position {length - n + i}) "
                f"differs from causal attention over all {length} tokens recomputed from scratch "
                f"(max error {err:.3g}, tolerance {TOLERANCE:g})." + _matching_mistake(cfg, history, n, got))


def _random_program(rng: np.random.Generator, k: int) -> tuple:
    hkv = int(rng.choice([1, 2, 3]))
    group = int(rng.choice([1, 2, 4]))
    cfg = ("config", int(rng.integers(1, 3)), hkv * group, hkv, int(rng.choice([4, 8])), int(rng.integers(6, 20)))
    ops: list[tuple] = [cfg]
    for t in range(int(rng.integers(2, 7))):
        n = 1 if rng.random() < 0.4 else int(rng.integers(1, 7))
        ops.append(("chunk", n, 1000 * k + t))
    return tuple(ops)


def cases(num_random: int = 20, seed: int = 0) -> list[Case]:
    """The graded programs: scripted scenarios (prefill then decode, chunked prefill, GQA, MQA,
    MHA, capacity) then ``num_random`` seeded random programs."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("prefill then decode", (DEFAULT_CONFIG, ("chunk", 5, 1), ("chunk", 1, 2), ("chunk", 1, 3), ("chunk", 1, 4))),
        Case("chunked prefill", (DEFAULT_CONFIG, ("chunk", 3, 5), ("chunk", 4, 6), ("chunk", 2, 7))),
        Case("GQA, group of 4, batch 2", (("config", 2, 8, 2, 8, 24), ("chunk", 6, 8), ("chunk", 3, 9), ("chunk", 1, 10))),
        Case("MQA (one KV head)", (("config", 1, 4, 1, 4, 12), ("chunk", 4, 11), ("chunk", 2, 12))),
        Case("MHA", (("config", 1, 3, 3, 4, 12), ("chunk", 2, 13), ("chunk", 3, 14))),
        Case("capacity: refuse what does not fit, keep serving", (("config", 1, 2, 1, 4, 8), ("chunk", 5, 15),
                                                                 ("chunk", 4, 16), ("chunk", 3, 17), ("chunk", 1, 18))),
    ]
    return scripted + [Case(f"random program {k}", _random_program(rng, k)) for k in range(num_random)]


def describe(ops: Sequence) -> str:
    """The operations of a (shrunk) case, one a line."""
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    lines = [f"  impl = factory(batch={cfg[1]}, n_q_heads={cfg[2]}, n_kv_heads={cfg[3]}, head_dim={cfg[4]}, "
             f"capacity={cfg[5]})",
             "  (each chunk: q, k, v drawn in that order as standard normals from np.random.default_rng(seed))"]
    for step, op in enumerate((op for op in ops if op[0] != "config"), 1):
        lines.append(f"  step {step}: impl.forward(q, k, v) with a chunk of {op[1]} new token(s), seed {op[2]}")
    return "\n".join(lines)


def check(factory: Callable, num_random: int = 20, seed: int = 0) -> PracticeReport:
    """Grade any implementation of the :class:`Skeleton` interface against full recomputation."""
    if not callable(factory):
        raise ValueError(f"check() takes a class or a factory that builds one, got {factory!r}")
    return grade(QUESTION, lambda: factory, cases(num_random, seed), run, describe)
