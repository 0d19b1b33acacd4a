"""Shared derivations and reference implementations for the LLM-inference interview book.

Import submodules explicitly (``from lib import roofline, models``); this package imports
nothing heavy at import time (no torch, matplotlib or triton), so ``import lib`` stays fast.
SI units throughout: bytes, seconds, FLOP, FLOP/s. Formatting lives in :mod:`lib.units`.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
