"""How a serving bill splits between the prompt and the reply, and the list price built on the cost.

Every dollar comes from :mod:`lib.fleet.capacity` (:func:`~lib.fleet.capacity.request_cost` for the
replica-seconds of each phase, :func:`~lib.fleet.capacity.usd_per_million_tokens` for the cost of a
million tokens of each phase, :func:`~lib.fleet.capacity.gpu_hour_usd` for the chip's price); this
module only asks questions of them.

* :func:`prompt_len_for_share`: the shortest prompt whose prefill is at least a given share of a
  request's replica time (equal to its share of the bill: both phases are priced by the replica-second),
  for a fixed reply length: where "the prompt is two thirds of the bill" starts to hold.
* :func:`cached_len`: the cached prompt tokens of a hit fraction, ``min(round(h P), P - 1)``, for
  :func:`lib.fleet.capacity.request_cost`'s ``cached_len`` (THE warm prefill,
  :func:`lib.fleet.capacity.prefill_s`: the new tokens still read the weights and attend over the prefix).
* :func:`list_price`: cost per million input and output tokens (and blended over the request's mix) and the
  list price at a gross margin: ``list = cost / (1 - margin)``.
* :func:`tornado`: the list price at the low and the high end of each assumption's range, all others held
  at their base value, ranked by the swing: which assumption moves the price most.
  :func:`assumption_ranges` gives the book's ranges (``data/assumptions.yaml`` where one is stated).

SI units: seconds, tokens, US dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["ListPrice", "Swing", "assumption_ranges", "cached_len", "list_price", "prompt_len_for_share", "tornado"]


def prompt_len_for_share(dep, output_len: int, share: float, tpot_target_s: float | None = None, *,
                         batch: int | None = None, mfu: float | None = None) -> int | None:
    """The smallest prompt length ``P`` with ``request_cost(dep, P, output_len, ...).prefill_share >= share``
    (a doubling grid to the first prompt that reaches it, then bisection: the share grows with ``P`` until
    long prompts shrink the batch the KV pool holds). None when no prompt the model's context allows (with
    the reply) reaches ``share``.
    ``tpot_target_s`` / ``batch`` / ``mfu``: as :func:`lib.fleet.capacity.request_cost`."""
    from lib.fleet.capacity import request_cost

    o = integer("output_len", output_len, 1, unit="tokens")
    s = real("share", share, 0, 1, low_open=True, high_open=True)

    def share_at(p: int) -> float | None:
        try:
            return request_cost(dep, p, o, tpot_target_s, batch=batch, mfu=mfu).prefill_share
        except ValueError:
            return None

    hi = int(dep.mdl.max_position_embeddings) - o
    if hi < 1:
        raise ValueError(f"output_len = {o} leaves no room for a prompt in the {dep.mdl.max_position_embeddings}-token context")
    # The share is not monotone over the whole range: a long prompt shrinks the batch the KV pool holds,
    # which makes each reply token dearer. Walk a doubling grid to the first prompt at or above the
    # share, then bisect between it and the grid point before it.
    lo, p = 0, 1
    while p <= hi:
        v = share_at(p)
        if v is not None and v >= s:
            break
        lo, p = p, 2 * p
    else:
        v = share_at(hi)
        if v is None or v < s:
            return None
        p = hi
    if lo == 0:
        return p
    while p - lo > 1:
        mid = (lo + p) // 2
        v = share_at(mid)
        if v is not None and v >= s:
            p = mid
        else:
            lo = mid
    return p


def cached_len(prompt_len: int, cached_fraction: float) -> int:
    """Prompt tokens a prefix cache holds when ``cached_fraction`` of a ``prompt_len``-token prompt hits:
    ``min(round(h P), P - 1)`` (the last prompt token is always computed). Pass it as ``cached_len`` to
    :func:`lib.fleet.capacity.request_cost`, which prices the warm prefill (:func:`lib.fleet.capacity.prefill_s`)."""
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    h = real("cached_fraction", cached_fraction, 0, 1, high_open=True)
    return min(round(h * p), p - 1)


@dataclass(frozen=True)
class ListPrice:
    """Cost and list price per million tokens of each phase. ``cost``: the
    :class:`~lib.fleet.capacity.TokenPrices` it is built on; ``margin``: the gross margin (list = cost / (1 - margin))."""

    cost: object
    margin: float

    @property
    def input_usd_per_m(self) -> float:
        """List price per million input tokens."""
        return self.cost.input_usd_per_m / (1 - self.margin)

    @property
    def output_usd_per_m(self) -> float:
        """List price per million output tokens."""
        return self.cost.output_usd_per_m / (1 - self.margin)

    @property
    def blended_usd_per_m(self) -> float:
        """List price per million tokens of the request's mix: (P input + O output) / (P + O)."""
        p, o = self.cost.prompt_len, self.cost.output_len
        return (p * self.input_usd_per_m + o * self.output_usd_per_m) / (p + o)

    @property
    def output_over_input(self) -> float:
        """How many input tokens one output token is priced as."""
        return self.output_usd_per_m / self.input_usd_per_m


def list_price(dep, prompt_len: int, output_len: int, tpot_target_s: float, *, margin: float,
               usd_per_gpu_hour: float | None = None, utilization: float | None = None, mfu: float | None = None,
               cached_fraction: float = 0.0) -> ListPrice:
    """The list price of each phase: :func:`lib.fleet.capacity.request_cost` (the batch from the TPOT target and
    the KV pool; ``mfu`` the prefill's; ``cached_fraction`` of the prompt a prefix-cache hit, :func:`cached_len`), then
    :func:`lib.fleet.capacity.usd_per_million_tokens` (the chip's GPU-hour price unless ``usd_per_gpu_hour``,
    the planned ``utilization``), divided by ``1 - margin``."""
    from lib.fleet.capacity import request_cost, usd_per_million_tokens

    m = real("margin", margin, 0, 1, high_open=True)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    cost = request_cost(dep, p, output_len, tpot_target_s, mfu=mfu, cached_len=cached_len(p, cached_fraction))
    return ListPrice(usd_per_million_tokens(cost, usd_per_gpu_hour, utilization), m)


@dataclass(frozen=True)
class Swing:
    """One bar of a tornado: assumption ``name`` at its ``low`` and ``high`` end, the list prices there."""

    name: str
    low: object
    high: object
    at_low: ListPrice
    at_high: ListPrice

    def swing(self, which: str = "blended") -> float:
        """|price at high - price at low| of ``which`` price ("input", "output" or "blended"), USD per million."""
        return abs(_pick(self.at_high, which) - _pick(self.at_low, which))


def _pick(lp: ListPrice, which: str) -> float:
    if which not in ("input", "output", "blended"):
        raise ValueError(f"which must be 'input', 'output' or 'blended', got {which!r}")
    return getattr(lp, f"{which}_usd_per_m")


TORNADO_INPUTS = ("usd_per_gpu_hour", "utilization", "mfu", "tpot_target_s", "margin", "cached_fraction",
                  "prompt_len", "output_len")


def tornado(dep, base: dict, ranges: dict, which: str = "blended") -> list[Swing]:
    """The list price (:func:`list_price`) with each assumption of ``ranges`` ({name: (low, high)}) moved to its
    low and its high end while the others stay at ``base`` (keyword arguments of :func:`list_price`: prompt_len,
    output_len, tpot_target_s, margin, and optionally the others), ranked by the swing of ``which`` price,
    largest first. Names: ``TORNADO_INPUTS``. A range whose end the deployment cannot serve (a TPOT target
    no batch meets) raises ValueError naming the assumption."""
    unknown = sorted(set(ranges) - set(TORNADO_INPUTS)) + sorted(set(base) - set(TORNADO_INPUTS))
    if unknown:
        raise ValueError(f"unknown tornado input(s) {unknown}; allowed: {', '.join(TORNADO_INPUTS)}")
    for need in ("prompt_len", "output_len", "tpot_target_s", "margin"):
        if need not in base:
            raise ValueError(f"base must give {need}")
    _pick(list_price(dep, **base), which)  # validates which and the base

    def at(name, v):
        try:
            return list_price(dep, **{**base, name: v})
        except ValueError as e:
            raise ValueError(f"{name} = {v}: {e}") from None

    out = []
    for name, (lo, hi) in ranges.items():
        if isinstance(lo, float) and isinstance(hi, float) and not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"the range of {name} must be finite, got ({lo}, {hi})")
        out.append(Swing(name, lo, hi, at(name, lo), at(name, hi)))
    return sorted(out, key=lambda s: -s.swing(which))


RANGE_LABELS = {"usd_per_gpu_hour": "GPU-hour price", "utilization": "utilization ceiling", "mfu": "prefill MFU",
                "tpot_target_s": "TPOT target", "margin": "gross margin", "cached_fraction": "prefix-cache hits",
                "prompt_len": "prompt length", "output_len": "reply length"}


def assumption_ranges(chip, tpot_target_s: float, output_len: int, *, usd_per_gpu_hour: float | None = None,
                      tpot_factor: float = 2.0, cached_high: float = 0.5, output_factor: float = 2.0) -> dict:
    """{tornado input: (low, high)}: the GPU-hour price of ``chip`` (or ``usd_per_gpu_hour``) times
    ``fleet.gpu_hour_price_factor``'s range; ``fleet.utilization_ceiling``'s range; ``prefill.prefill_mfu`` times
    ``fleet.prefill_mfu_factor``'s range; the TPOT target divided and multiplied by ``tpot_factor``; prefix-cache
    hits from 0 to ``cached_high``; the reply length divided and multiplied by ``output_factor`` (the mix the
    price was set for)."""
    from lib.fleet.capacity import gpu_hour_usd
    from lib.registry import assumptions

    price = gpu_hour_usd(chip, usd_per_gpu_hour)
    t = real("tpot_target_s", tpot_target_s, 0, low_open=True, unit="seconds")
    o = integer("output_len", output_len, 1, unit="tokens")
    tf = real("tpot_factor", tpot_factor, 1, low_open=True)
    of = real("output_factor", output_factor, 1, low_open=True)
    ch = real("cached_high", cached_high, 0, 1, low_open=True, high_open=True)
    f_lo, f_hi = assumptions.value_range("fleet.gpu_hour_price_factor")
    m_lo, m_hi = assumptions.value_range("fleet.prefill_mfu_factor")
    mfu = assumptions.value("prefill.prefill_mfu")
    return {"usd_per_gpu_hour": (price * f_lo, price * f_hi),
            "utilization": assumptions.value_range("fleet.utilization_ceiling"),
            "mfu": (mfu * m_lo, min(1.0, mfu * m_hi)),
            "tpot_target_s": (t / tf, t * tf),
            "cached_fraction": (0.0, ch),
            "output_len": (max(1, round(o / of)), round(o * of))}
