"""Losslessness under quantization (I053): which distribution speculative sampling preserves when the
draft or the target runs in FP8, and two FP8 effects that make the target's distribution depend on
the drafts without touching the rejection rule.

The rule (:mod:`lib.decoding.verify`) preserves the distribution p the verification pass computes.
Exactness against "the model" needs that p to be the one a plain decode step would compute for the
same prefix. Two FP8 deployment details break that:

* **dynamic per-tensor activation scales** (vLLM ``--quantization fp8``: activation min/max computed
  every forward pass, one scale per tensor): the scale of the verification pass is the amax over its
  k + 1 tokens, drafts included, while a decode step's is its own token's, so p at position j depends
  on every draft of the pass, even later ones;
* **FP8 KV cache, in-pass tokens at full precision**: a multi-token (prefill-like) pass attends to the
  K/V it just computed at BF16 and to earlier tokens read back from the FP8 cache, so position j sees
  the drafts before it unquantized where a decode step would have read them from FP8.

:class:`ToyFP8Model` is a seeded one-layer attention model on a small vocabulary (numpy, FP8 through
:mod:`lib.numerics.fp8`); :func:`pass_step_distribution` and :func:`pass_stream_distribution`
enumerate the verifier's exact output when the target's distributions come from a whole pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lib.decoding.sampling import softmax
from lib.decoding.verify import REFERENCE_RULE
from lib.inputs import integer, real
from lib.numerics.fp8 import amax_scale, fake_quantize

__all__ = ["ToyFP8Model", "pass_step_distribution", "pass_stream_distribution", "stream_of"]

MODES = ("bf16", "fp8")


@dataclass(frozen=True)
class ToyFP8Model:
    """A one-layer attention LM over ``vocab`` tokens, hidden size ``d``, seeded.

    Token t has an embedding e_t (one channel of a few tokens scaled by ``outlier_scale``: the
    massive activations that set a per-tensor amax); a context c_1..c_n gives keys K_i = e_{c_i} Wk
    + r_i, values V_i = e_{c_i} Wv (r_i a position code), the query of its last token q = e_{c_n} Wq,
    h = e_{c_n} + softmax(K q / sqrt d) V, and logits = h Wo * ``logit_scale`` / sqrt(d).

    FP8 (``fp8_linear``): the output projection runs W8A8 with a per-tensor weight scale and a
    per-tensor activation scale that is the amax over the rows of the pass (dynamic). FP8 KV
    (``fp8_kv``): K and V of tokens not computed in this pass are read back from an E4M3 cache with
    static per-tensor scales (the amax over the whole vocabulary's K / V, calibrated once).
    """

    vocab: int = 4
    d: int = 16
    outlier_scale: float = 30.0
    logit_scale: float = 3.0
    seed: int = 0

    def __post_init__(self):
        integer("vocab", self.vocab, 2, 16)
        integer("d", self.d, 4, 256)
        real("outlier_scale", self.outlier_scale, 1.0)
        real("logit_scale", self.logit_scale, 0, low_open=True)
        rng = np.random.default_rng(integer("seed", self.seed, 0))
        d = self.d
        e = rng.standard_normal((self.vocab, d))
        e[: max(1, self.vocab // 4), 0] *= self.outlier_scale  # a few tokens carry a massive activation
        w = {name: rng.standard_normal((d, d)) / math.sqrt(d) for name in ("q", "k", "v")}
        wo = rng.standard_normal((d, self.vocab))
        pos = rng.standard_normal((64, d)) * 0.5
        k_table = (e @ w["k"])[:, None, :] + pos[None, :, :]  # K of token t at position i (mod 64)
        v_table = e @ w["v"]
        k_scale, v_scale = amax_scale(k_table), amax_scale(v_table)  # static, calibrated once
        object.__setattr__(self, "_p", {"e": e, "w": w, "wo": wo, "k": k_table, "v": v_table,
                                        "kq": fake_quantize(k_table, k_scale), "vq": fake_quantize(v_table, v_scale),
                                        "wo_q": fake_quantize(wo, amax_scale(wo))})
        object.__setattr__(self, "_memo", {})

    def _hidden(self, context: tuple, fresh: int, fp8_kv: bool) -> np.ndarray:
        """h of the last token of ``context``; its last ``fresh`` tokens were computed in this pass."""
        p = self._p
        ids = np.asarray(context, dtype=np.int64)
        n = len(ids)
        if n == 0:
            raise ValueError("context must hold at least one token")
        pos = np.arange(n) % 64
        cached = np.arange(n) < n - fresh if fp8_kv else np.zeros(n, dtype=bool)  # read back from the FP8 cache
        k = np.where(cached[:, None], p["kq"][ids, pos], p["k"][ids, pos])
        v = np.where(cached[:, None], p["vq"][ids], p["v"][ids])
        q = p["e"][ids[-1]] @ p["w"]["q"]
        a = softmax(k @ q / math.sqrt(self.d))
        return p["e"][ids[-1]] + a @ v

    def _logits(self, h: np.ndarray, fp8_linear: bool, per_token: bool = False) -> np.ndarray:
        p = self._p
        scale = self.logit_scale / math.sqrt(self.d)
        if not fp8_linear:
            return h @ p["wo"] * scale
        # dynamic activation scale: one per tensor (the amax over every row of the pass) or one per row
        hq = fake_quantize(h, amax_scale(h, axis=1) if per_token else amax_scale(h))
        return hq @ p["wo_q"] * scale

    def decode(self, context: tuple, fp8_linear: bool = False, fp8_kv: bool = False) -> np.ndarray:
        """The next-token distribution of a plain decode step after ``context`` (a pass of one token)."""
        key = ("d", tuple(context), fp8_linear, fp8_kv)
        if key not in self._memo:
            h = self._hidden(tuple(context), 1, fp8_kv)
            self._memo[key] = softmax(self._logits(h[None, :], fp8_linear))[0]
        return self._memo[key]

    def verify_pass(self, context: tuple, drafts: tuple, fp8_linear: bool = False, fp8_kv: bool = False,
                    per_token: bool = False) -> np.ndarray:
        """The (k + 1, V) distributions of one verification pass over the last token of ``context`` and
        the k ``drafts``: row j is the distribution after context + drafts[:j], computed in this pass
        (dynamic activation scale over all k + 1 rows, or per row with ``per_token``; the pass's tokens'
        K/V unquantized)."""
        ctx = tuple(context)
        key = ("v", ctx, tuple(drafts), fp8_linear, fp8_kv, per_token)
        if key not in self._memo:
            hs = np.stack([self._hidden(ctx + tuple(drafts[:j]), j + 1, fp8_kv) for j in range(len(drafts) + 1)])
            self._memo[key] = softmax(self._logits(hs, fp8_linear, per_token))
        return self._memo[key]


def pass_step_distribution(target_pass: Callable, draft: Callable, num_drafted: int) -> dict:
    """Exact distribution of one step's emitted tokens when the target's distributions come from a
    whole pass: ``target_pass(drafts)`` -> (k + 1, V) for the full draft tuple (row j may depend on
    every draft, not only drafts[:j]); ``draft(prefix)`` -> q after the drafted prefix. Enumerates the
    V^k draft tuples with their probability, then the lossless rule's accept / residual / bonus."""
    k = integer("num_drafted", num_drafted, 0)
    out: dict = {}

    def add(seq, pr):
        if pr > 0:
            out[seq] = out.get(seq, 0.0) + pr

    def drafts_from(prefix: tuple, pr: float):
        if len(prefix) == k:
            yield prefix, pr
            return
        q = np.asarray(draft(prefix))
        for x in np.flatnonzero(q):
            yield from drafts_from(prefix + (int(x),), pr * q[x])

    for xs, pr in drafts_from((), 1.0):
        P = np.asarray(target_pass(xs))
        alive = pr  # probability of these drafts and of every earlier one accepted
        for j in range(k):
            q = np.asarray(draft(xs[:j]))
            a = float(REFERENCE_RULE.accept(P[j], q)[xs[j]])
            if a < 1:
                r = REFERENCE_RULE.residual(P[j], q)
                for y in np.flatnonzero(r):
                    add(xs[:j] + (int(y),), alive * (1 - a) * r[y])
            alive *= a
            if alive == 0:
                break
        else:
            for y in np.flatnonzero(P[k]):
                add(xs + (int(y),), alive * P[k][y])
    return out


def pass_stream_distribution(target_pass: Callable, draft: Callable, draft_tokens: int, num_tokens: int,
                             prompt: tuple = (0,)) -> dict:
    """Exact distribution of the first ``num_tokens`` output tokens after ``prompt`` under speculative
    steps of ``draft_tokens`` drafts: ``target_pass(context, drafts)`` -> (k + 1, V), ``draft(context)``
    -> q. {token tuple: probability}."""
    k = integer("draft_tokens", draft_tokens, 0)
    n = integer("num_tokens", num_tokens, 1)
    out: dict = {}

    def walk(emitted: tuple, pr: float):
        if len(emitted) >= n:
            out[emitted[:n]] = out.get(emitted[:n], 0.0) + pr
            return
        ctx = prompt + emitted
        step = pass_step_distribution(lambda xs: target_pass(ctx, xs), lambda pre: draft(ctx + pre), k)
        for seq, p in step.items():
            walk(emitted + seq, pr * p)

    walk((), 1.0)
    return out


def stream_of(next_dist: Callable, vocab: int, num_tokens: int, prompt: tuple = (0,)) -> dict:
    """The distribution of the first ``num_tokens`` tokens of plain sampling from ``next_dist(context)``
    after ``prompt``: prod_i p(y_i | prompt, y_<i)."""
    n = integer("num_tokens", num_tokens, 1)
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in out.items():
            p = next_dist(prompt + seq)
            for y in range(vocab):
                if p[y] > 0:
                    nxt[seq + (y,)] = pr * float(p[y])
        out = nxt
    return out
