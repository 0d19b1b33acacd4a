"""Sampling: from a row of logits to the distribution the next token is drawn from.

:func:`softmax` is the one temperature softmax of the book (max subtracted first, so no logit
overflows; temperature 0 is greedy: all mass on the largest logit, ties to the lowest token id).
"""

from __future__ import annotations

import numpy as np

from lib.inputs import real

__all__ = ["softmax"]


def softmax(logits, temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the last axis, float64: exp((z - max z) / T) / sum, which cannot overflow.
    T = 0 is the greedy limit: probability 1 on argmax z (the lowest index among ties).
    ``logits``: array (..., V) of finite values or -inf (masked); each row needs a finite entry."""
    t = real("temperature", temperature, 0.0, unit="")
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ValueError("logits must have a last axis of at least one token")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("logits must be finite or -inf (masked); got NaN or +inf")
    top = z.max(axis=-1, keepdims=True)
    if np.isneginf(top).any():
        raise ValueError("every row of logits needs at least one finite (unmasked) entry")
    if t == 0:
        out = np.zeros_like(z)
        np.put_along_axis(out, z.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    e = np.exp((z - top) / t)
    return e / e.sum(axis=-1, keepdims=True)
