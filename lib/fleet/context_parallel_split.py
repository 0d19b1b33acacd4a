"""How a long prompt is split across context-parallel ranks, and what the causal mask does to the split.

With a causal mask, token t attends to the t + 1 keys before and at it, so a rank's attention work
is the sum of (t + 1) over the tokens it owns. Three ways to hand out T tokens to ``cp`` ranks:

* ``contiguous``: rank i owns the i-th of cp equal runs. The last rank's queries see the whole
  prompt, the first's only their own run: rank i's pairs are c (i c) + c (c + 1) / 2 with
  c = T / cp, so the busiest rank does (2 cp - 1) / cp of the mean (about twice) and every ring
  step waits for it;
* ``zigzag``: 2 cp equal runs; rank i owns runs i and 2 cp - 1 - i (one early, one late), and
  every rank gets h^2 (2 cp - 1) + h (h + 1) pairs with h = T / (2 cp): equal;
* ``striped``: rank r owns the tokens t = r (mod cp); rank r's pairs are cp n (n - 1) / 2 +
  n (r + 1) with n = T / cp: equal up to n (cp - 1) pairs.

:func:`pairs_per_rank` computes these from run boundaries (sums of arithmetic series; exact for any
T, not only multiples of cp); :func:`owners` gives the rank of each token, which the tests count by
brute force. :func:`split_prefill` applies a split's imbalance to the book's ring-attention model,
:func:`lib.attention.context_parallel.ring_prefill` (which assumes a balanced split): the attention
FLOPs of the step are set by the busiest rank, the weight FLOPs are not.

Integers are token and pair counts; seconds for times.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer
from lib.search import smallest_true

__all__ = ["SCHEMES", "SplitPrefill", "imbalance", "owners", "pairs_per_rank", "shortest_hidden_context", "split_prefill"]

SCHEMES = ("contiguous", "zigzag", "striped")


def _check(context: int, cp: int, scheme: str) -> tuple[int, int]:
    t = integer("context", context, 1, unit="tokens")
    n = integer("cp", cp, 1)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    runs = 2 * n if scheme == "zigzag" else n
    if t < runs:
        raise ValueError(f"context = {t} tokens cannot fill the {runs} runs of a {scheme} split over cp = {n}")
    return t, n


def _bounds(t: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` near-equal runs of t tokens (the first t mod parts runs one longer)."""
    q, r = divmod(t, parts)
    out, x = [0], 0
    for k in range(parts):
        x += q + (1 if k < r else 0)
        out.append(x)
    return out


def _run_pairs(a: int, b: int) -> int:
    """sum_{t=a}^{b-1} (t + 1): the causal pairs of the queries a..b-1."""
    return (b * (b + 1) - a * (a + 1)) // 2


def pairs_per_rank(context: int, cp: int, scheme: str = "zigzag") -> list[int]:
    """Causal (query, key) pairs each rank computes, from the run boundaries (module doc)."""
    t, n = _check(context, cp, scheme)
    if scheme == "contiguous":
        b = _bounds(t, n)
        return [_run_pairs(b[i], b[i + 1]) for i in range(n)]
    if scheme == "zigzag":
        b = _bounds(t, 2 * n)
        return [_run_pairs(b[i], b[i + 1]) + _run_pairs(b[2 * n - 1 - i], b[2 * n - i]) for i in range(n)]
    out = []
    for r in range(n):  # tokens r, r + n, r + 2n, ...: k = 0..m-1 with t_k = r + k n
        m = (t - r + n - 1) // n
        out.append(n * m * (m - 1) // 2 + m * (r + 1))
    return out


def owners(context: int, cp: int, scheme: str = "zigzag"):
    """The rank owning each token (an int64 numpy array of length ``context``)."""
    import numpy as np

    t, n = _check(context, cp, scheme)
    idx = np.arange(t)
    if scheme == "striped":
        return idx % n
    parts = 2 * n if scheme == "zigzag" else n
    run = np.searchsorted(np.asarray(_bounds(t, parts)[1:]), idx, side="right")
    if scheme == "contiguous":
        return run
    return np.where(run < n, run, 2 * n - 1 - run)


def imbalance(context: int, cp: int, scheme: str = "zigzag") -> float:
    """max over ranks / mean of the pairs: 1 is perfect balance."""
    p = pairs_per_rank(context, cp, scheme)
    return max(p) * len(p) / sum(p)


@dataclass(frozen=True)
class SplitPrefill:
    """A ring prefill (:class:`~lib.attention.context_parallel.RingPrefill`, balanced) and the same
    prefill under ``scheme``: the attention FLOPs stretched by the busiest rank's ``imbalance``."""

    ring: object
    scheme: str
    imbalance: float
    weight_flops: float
    attention_flops: float

    @property
    def compute_s(self) -> float:
        """The busiest rank's compute: balanced compute x (W + A x imbalance) / (W + A)."""
        w, a = self.weight_flops, self.attention_flops
        return self.ring.compute_s * (w + a * self.imbalance) / (w + a)

    @property
    def ttft_s(self) -> float:
        """max(compute, weight read) + all-reduces + exposed ring time (the ring model's TTFT with this compute)."""
        r = self.ring
        return max(self.compute_s, r.weight_read_s) + r.allreduce_s + r.exposed_ring_s


def split_prefill(mdl, chip, context: int, cp: int, tp: int, scheme: str = "zigzag", **ring_kw) -> SplitPrefill:
    """:func:`lib.attention.context_parallel.ring_prefill` with the causal imbalance of ``scheme``."""
    from lib.attention.context_parallel import ring_prefill
    from lib.perf.prefill import default_mfu, prefill_estimate

    ring = ring_prefill(mdl, chip, context, cp, tp, **ring_kw)
    est = prefill_estimate(mdl, chip, context, tp, default_mfu(ring_kw.get("mfu")),
                           ring_kw.get("weight_dtype", "bf16"), ring_kw.get("compute_dtype", "bf16"),
                           ring_kw.get("kv_dtype", "bf16"))
    return SplitPrefill(ring, scheme, imbalance(context, cp, scheme), est.flops_weights, est.flops_attention)


def shortest_hidden_context(mdl, chip, cp: int, tp: int, **ring_kw) -> int | None:
    """The shortest context (tokens, up to the model's window) at which every ring hop's KV send
    fits under the attention it overlaps (``RingPrefill.ring_hidden``): bisection, since the send
    grows as T / cp and the hop's attention as (T / cp)^2. None when it never hides in the window."""
    from lib.attention.context_parallel import ring_prefill
    from lib.registry.models import model

    n = integer("cp", cp, 2)
    top = model(mdl).max_position_embeddings

    def hidden(t: int) -> bool:
        return ring_prefill(mdl, chip, t, n, tp, **ring_kw).ring_hidden

    if not hidden(top):
        return None
    if hidden(n):  # the smallest valid context
        return n
    return smallest_true(hidden, n + 1, top - 1)  # not hidden(n), hidden(top)
