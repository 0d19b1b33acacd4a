"""Where greedy outputs stop being bitwise equal, measured with torch on this machine's CPU.

:func:`row_alone_vs_batch` multiplies one row by a weight matrix alone and as row 0 of larger
batches and counts the output elements whose bits differ (a BLAS picks its kernel, a GEMV for one
row and a blocked GEMM for several, from the shape). :func:`toy_greedy` runs a seeded recurrent
toy language model greedily with row 0 alone or inside a batch of other sequences, and
:func:`first_divergence` finds the first step whose logits differ in any bit and the first step
whose token differs. torch is imported inside the functions (``import lib`` stays light), and the
measurements run on one CPU thread (:func:`one_thread`): small matmuls gain nothing from more, and on a
shared machine the thread hand-offs cost fifty times the arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["Divergence", "RowMeasurement", "first_divergence", "one_thread", "row_alone_vs_batch", "torch_version",
           "toy_greedy"]

_DTYPES = ("fp32", "bf16")


@contextlib.contextmanager
def one_thread():
    """Run torch on one CPU thread inside the block, restoring the previous thread count after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_version() -> str:
    """The installed torch version, the CPU kernel capability it runs and the threads the measurements
    use (``2.x+cpu, CPU capability AVX2, 1 thread``)."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"
    return f"{torch.__version__}, CPU capability {cap}, 1 thread"


def _torch_dtype(dtype: str):
    import torch

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    return torch.float32 if dtype == "fp32" else torch.bfloat16


@dataclass(frozen=True)
class RowMeasurement:
    """Row 0 of x @ w computed alone and inside each batch: output elements whose bits differ and the
    largest absolute difference (n elements per row)."""

    batches: tuple[int, ...]
    differing: tuple[int, ...]
    max_abs: tuple[float, ...]
    n: int
    dtype: str

    @property
    def invariant(self) -> bool:
        """True when row 0 came out bitwise equal at every batch size."""
        return not any(self.differing)


def row_alone_vs_batch(k: int, n: int, batches, dtype: str = "fp32", seed: int = 0) -> RowMeasurement:
    """x[0:1] @ w against (x[:b] @ w)[0] for each b in ``batches``, with torch on this CPU: x (max b, k)
    and w (k, n) seeded N(0, 1) and N(0, 1/k) in ``dtype``. Counts the elements whose bits differ."""
    import torch

    kk, nn = integer("k", k, 1, 65_536), integer("n", n, 1, 65_536)
    bs = tuple(integer("batch", int(b), 2, 4096) for b in batches)
    if not bs:
        raise ValueError("batches must list at least one batch size >= 2")
    dt = _torch_dtype(dtype)
    g = torch.Generator().manual_seed(integer("seed", seed, 0))
    x = torch.randn(max(bs), kk, generator=g).to(dt)
    w = (torch.randn(kk, nn, generator=g) / kk**0.5).to(dt)
    diff, mx = [], []
    with one_thread():
        alone = x[:1] @ w
        for b in bs:
            row = (x[:b] @ w)[:1]
            diff.append(int((row != alone).sum()))
            mx.append(float((row.float() - alone.float()).abs().max()))
    return RowMeasurement(bs, tuple(diff), tuple(mx), nn, dtype)


@functools.lru_cache(maxsize=32)
def toy_greedy(batch: int, steps: int, d: int = 256, vocab: int = 1000, gain: float = 2.0, seed: int = 0,
               first_token: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decoding of a seeded recurrent toy LM in float32 with torch on this CPU; row 0 is the
    customer's request, rows 1.. other requests (random first tokens) sharing each step's matmuls:

        h_t = tanh(E[token_{t-1}] + h_{t-1} U),  logits_t = h_t W,  token_t = argmax logits_t

    E (vocab, d) ~ N(0, 1), U (d, d) ~ N(0, gain^2 / d) (gain > 1: small differences grow, as they do
    through a deep model's layers), W (d, vocab) ~ N(0, 16 / d). Returns row 0's tokens (steps,) and
    logits (steps, vocab) as read-only numpy arrays (cached; ``toy_greedy.__wrapped__`` recomputes)."""
    import torch

    b = integer("batch", batch, 1, 1024)
    t_steps = integer("steps", steps, 1, 10_000)
    dd, v = integer("d", d, 2, 4096), integer("vocab", vocab, 2, 100_000)
    gn = real("gain", gain, 0, 10, low_open=True)
    tok0 = integer("first_token", first_token, 0, v - 1)
    g = torch.Generator().manual_seed(integer("seed", seed, 0))
    emb = torch.randn(v, dd, generator=g)
    rec = torch.randn(dd, dd, generator=g) * (gn / dd**0.5)
    head = torch.randn(dd, v, generator=g) * (4.0 / dd**0.5)
    others = torch.randint(0, v, (1024,), generator=g)  # the same other requests whatever the batch
    toks = torch.cat([torch.tensor([tok0]), others[: b - 1]])
    h = torch.zeros(b, dd)
    out_tok = np.empty(t_steps, dtype=np.int64)
    out_logits = np.empty((t_steps, v), dtype=np.float32)
    with torch.no_grad(), one_thread():
        for t in range(t_steps):
            h = torch.tanh(emb[toks] + h @ rec)
            logits = h @ head
            toks = logits.argmax(1)
            out_tok[t] = int(toks[0])
            out_logits[t] = logits[0].numpy()
    out_tok.flags.writeable = False
    out_logits.flags.writeable = False
    return out_tok, out_logits


@dataclass(frozen=True)
class Divergence:
    """Two greedy runs of one request compared step by step: the first step whose logits differ in any
    bit, the first step whose token differs (None: never in these steps), and the largest logit
    difference before the token flip."""

    first_bits: int | None
    first_token: int | None
    max_diff_before_flip: float
    steps: int


def first_divergence(tokens_a, logits_a, tokens_b, logits_b) -> Divergence:
    """Compare two runs (:func:`toy_greedy` outputs) bitwise, step by step."""
    ta, tb = np.asarray(tokens_a), np.asarray(tokens_b)
    la, lb = np.asarray(logits_a, np.float32), np.asarray(logits_b, np.float32)
    if ta.shape != tb.shape or la.shape != lb.shape or la.shape[0] != ta.shape[0]:
        raise ValueError(f"the two runs must have the same steps and vocabulary, got {ta.shape}/{la.shape} and "
                         f"{tb.shape}/{lb.shape}")
    bits = np.flatnonzero((la.view(np.uint32) != lb.view(np.uint32)).any(axis=1))
    toks = np.flatnonzero(ta != tb)
    first_tok = int(toks[0]) if toks.size else None
    upto = first_tok if first_tok is not None else ta.shape[0]
    before = float(np.abs(la[:upto].astype(np.float64) - lb[:upto]).max()) if upto else 0.0
    return Divergence(int(bits[0]) if bits.size else None, first_tok, before, int(ta.shape[0]))
