"""Triton, set up to run here: on a machine without a CUDA GPU the kernels run in Triton's
interpreter (``TRITON_INTERPRET=1``, numpy semantics on the CPU), which must be chosen before
``triton`` is imported. A kernel module imports ``triton`` and ``tl`` from here, never directly.

``INTERPRETED`` says which mode the kernels run in: timings in interpreter mode measure Python,
not a GPU, so pages report byte counts and results there, never interpreter timings.
"""

from __future__ import annotations

import os


def _interpret_unless_gpu() -> None:
    if "TRITON_INTERPRET" in os.environ:  # the reader chose
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_unless_gpu()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

__all__ = ["INTERPRETED", "tl", "triton"]
