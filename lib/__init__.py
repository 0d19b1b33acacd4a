"""Shared derivations and reference implementations for the LLM-inference interview book.

Packages, by domain: :mod:`lib.registry` (GPUs, models, dtypes and the one assumptions file,
loaded from ``data/``); :mod:`lib.perf` (the performance model: the Deployment record, roofline
bounds, the decode step, prefill, memory capacity, collectives, energy, and their views);
:mod:`lib.kvcache` (paged allocator, prefix caches, tiering); :mod:`lib.attention` (attention
as reference code: naive, online softmax, tiled forward/backward, KV cache, split-KV, HBM traffic);
:mod:`lib.scheduling` (the discrete-event simulator of one serving replica and queueing closed
forms); :mod:`lib.numerics` (number formats); :mod:`lib.book` (glue, self-check, widgets, figures); :mod:`lib.explorers` (the views
behind the notebooks' widgets). Three small modules serve all of them: :mod:`lib.units` (unit
constants and every piece of formatting), :mod:`lib.inputs` (input validation) and :mod:`lib.search`
(the integer bisection behind every "largest batch that fits").

Import submodules explicitly (``from lib.perf import step``); this package imports nothing heavy
at import time (no torch, matplotlib or triton), so ``import lib`` stays fast. SI units
throughout: bytes, seconds, FLOP, FLOP/s.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
