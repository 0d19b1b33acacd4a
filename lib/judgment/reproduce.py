"""Reproducing a published number with the book's models, and the filter a claim has to pass first.

* :func:`claim_check`: a per-user decode claim ("X tokens/s for a model on N GPUs") against its bandwidth
  ceiling (:func:`lib.perf.datasheet.per_user_decode_ceiling`) and the unstated conditions that would lift
  the ceiling to it (:func:`lib.perf.datasheet.headline_scenarios`).
* :func:`published_decode`: gpt-fast's published batch-1 decode table (``judgment.gpt_fast_published`` in
  ``data/assumptions.yaml``, with its source).
* :func:`reproduce_decode`: one published batch-1 decode rate against three levels of the book's model:
  the datasheet bandwidth floor, the same floor at the publisher's own measured streaming bandwidth
  (``anchors.hbm_streaming_gpt_fast``), and the modelled decode step (:func:`lib.perf.throughput.tokens_per_s`,
  which adds the KV read, per-kernel costs, launch gaps, sampling and the tensor-parallel all-reduces). The
  gap between each level and the next is what explains the distance from datasheet to measurement.

SI units: tokens/s, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real
from lib.perf import datasheet, throughput
from lib.perf.deployment import deployment
from lib.registry import assumptions


@dataclass(frozen=True)
class ClaimCheck:
    """A per-user decode claim against its ceiling, and the named conditions whose ceiling reaches it."""

    claim_tokens_per_s: float
    ceiling_tokens_per_s: float
    lifting: tuple[str, ...]  # scenarios (lib.perf.datasheet.headline_scenarios) that reach the claim

    @property
    def passes(self) -> bool:
        """The claim is below the plain bandwidth ceiling: possible as stated."""
        return self.claim_tokens_per_s <= self.ceiling_tokens_per_s


def claim_check(claim_tokens_per_s: float, model: str, chip: str, n_gpus: int, context: int = 0) -> ClaimCheck:
    """Filter a claim: per-user ceiling in BF16 on ``n_gpus`` x ``chip`` and the scenarios that lift it
    past ``claim_tokens_per_s`` (per-user ones first; an aggregate over a batch is a different claim)."""
    c = real("claim_tokens_per_s", claim_tokens_per_s, 0, low_open=True)
    n = integer("n_gpus", n_gpus, 1, 64)
    ceiling = datasheet.per_user_decode_ceiling(model, chip, n_gpus=n, context=context)
    lifting = tuple(s.name for s in datasheet.headline_scenarios(c, model, chip, n_gpus=n, context=context)
                    if s.meets(c) and "aggregate" not in s.name)
    return ClaimCheck(c, ceiling, lifting)


def published_decode() -> dict[tuple[str, int], float]:
    """gpt-fast's table: {(model, tp): tokens/s} from ``judgment.gpt_fast_published``."""
    table = assumptions.entry("judgment.gpt_fast_published")
    out = {}
    for mdl, rows in table.items():
        if not isinstance(rows, dict):
            continue
        for key, e in rows.items():
            out[(mdl, int(str(key).removeprefix("tp")))] = float(e["value"])
    return out


@dataclass(frozen=True)
class Reproduction:
    """A published decode rate against the model's three levels (tokens/s)."""

    model: str
    chip: str
    tp: int
    published: float
    floor_datasheet: float  # weights + KV over datasheet bandwidth
    floor_measured: float  # the same at the publisher's measured streaming bandwidth
    modelled: float  # the book's decode step

    @property
    def gap(self) -> float:
        """modelled / published - 1 (signed)."""
        return self.modelled / self.published - 1

    @property
    def explained_by_bandwidth(self) -> float:
        """Factor from the datasheet floor to the measured-bandwidth floor."""
        return self.floor_datasheet / self.floor_measured

    @property
    def explained_by_step(self) -> float:
        """Factor from the measured-bandwidth floor to the modelled step (overheads the floor leaves out)."""
        return self.floor_measured / self.modelled


def reproduce_decode(model: str, chip: str, tp: int, published_tokens_per_s: float, context: int = 128,
                     streaming_fraction: float | None = None) -> Reproduction:
    """See the module docstring. ``streaming_fraction`` defaults to ``anchors.hbm_streaming_gpt_fast``
    (1,700 of 2,039 GB/s, the gpt-fast README's own measurement)."""
    pub = real("published_tokens_per_s", published_tokens_per_s, 0, low_open=True)
    frac = real("streaming_fraction", assumptions.resolve(streaming_fraction, "anchors.hbm_streaming_gpt_fast"), 0, 1,
                low_open=True)
    dep = deployment(model, chip, tp=tp)
    floor = datasheet.per_user_decode_ceiling(model, chip, n_gpus=tp, context=context)
    return Reproduction(model, chip, tp, pub, floor, floor * frac, throughput.tokens_per_s(dep, 1, context))


def gpt_fast_table(context: int = 128, streaming_fraction: float | None = None) -> list[Reproduction]:
    """Every row of :func:`published_decode` on the A100 SXM it was measured on (80 GB, power-limited)."""
    return [reproduce_decode(m, "a100-sxm", tp, v, context, streaming_fraction)
            for (m, tp), v in sorted(published_decode().items())]


def worst_gap(rows: list[Reproduction]) -> Reproduction:
    """The row whose modelled rate is furthest from the published one (in |log ratio|)."""
    return max(rows, key=lambda r: abs(math.log(r.modelled / r.published)))
