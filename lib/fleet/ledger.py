"""A serving cost ledger and its audit: a "win" counts only if the total falls and every gate holds.

:func:`price_ledger` prices one configuration serving ``rate`` requests/s of one shape, line by line, in US
dollars per hour, all from :mod:`lib.fleet.capacity` (``request_cost``, ``fleet_for_load``, ``gpu_hour_usd``):

* ``prefill GPUs`` and ``decode GPUs``: each phase's replica-seconds per second / utilization x the replica's
  GPUs x the GPU-hour price (what :func:`~lib.fleet.capacity.usd_per_million_tokens` charges per token);
* ``whole replicas``: the fraction of a replica the fleet rounds up to, paid for and idle;
* ``retries``: a share of requests asked again because the answer was not good enough, each costing a
  whole request again (both phases);
* ``TTFT headroom`` (only when a TTFT target is given to size for): the replicas beyond the utilization
  sizing that keep the prefill queue's TTFT quantile within the target (the capacity unit of
  :func:`lib.fleet.capacity_units.replica_capacity`: at most ``rho_ttft / prefill_s`` requests/s a replica);
* any ``extra`` lines the change brings (a drafter's GPUs, storage, egress), given by the caller.

Beside the dollars it measures the gates: the TPOT (the decode step at the batch the replica runs) and the
TTFT quantile (the prefill queue of each whole replica at its share of the rate,
:func:`lib.fleet.capacity_units.ttft_quantile_s`).

:func:`audit` compares a candidate with the baseline: the saving its proposer claims (their arithmetic), the real
change of the total, the lines that grew (cost moved, not removed), and the gates (quality within a
tolerance, TPOT and TTFT within their targets). A candidate is accepted only if the total falls and every gate
holds; :func:`choose` picks the accepted candidate that saves most. :func:`proposal` builds five classic "wins" and
the arithmetic their proposers bring: a cheaper GPU, an FP8 KV cache (a decoder that runs twice the
sequences), a higher utilization ceiling, truncated prompts, FP8 weights.

SI units: seconds, requests per second; dollars per hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lib.fleet.capacity import whole_replicas
from lib.inputs import integer, real

__all__ = ["PROPOSALS", "Audit", "Ledger", "Proposal", "audit", "choose", "price_ledger", "proposal"]

LINES = ("prefill GPUs", "decode GPUs", "TTFT headroom", "whole replicas", "retries")


@dataclass(frozen=True)
class Ledger:
    """One configuration's dollars per hour by line, and what its gates measure."""

    name: str
    cost: object  # lib.fleet.capacity.RequestCost
    fleet: object  # lib.fleet.capacity.FleetSize at the utilization ceiling
    replicas: int  # whole replicas paid for (the fleet's, or more when sized for a TTFT target)
    usd_per_gpu_hour: float
    lines: dict = field(default_factory=dict)  # line -> USD per hour
    ttft_q: float = 0.99
    ttft_quantile_s: float = math.nan
    quality: float = math.nan  # the eval score the configuration was measured at (higher is better)

    @property
    def total(self) -> float:
        """Sum of the lines, USD per hour."""
        return sum(self.lines.values())

    @property
    def tpot_s(self) -> float:
        """The decode step at the batch the replica runs: the TPOT a client sees."""
        return self.cost.decode_step_s

    def usd_per_million_tokens(self) -> float:
        """total / (tokens per hour) x 1e6, prompt and reply tokens together."""
        tok = self.fleet.rate * (self.cost.prompt_len + self.cost.output_len) * 3600.0
        return self.total / tok * 1e6


def price_ledger(name: str, dep, rate: float, prompt_len: int, output_len: int, *, tpot_target_s: float | None = None,
                 batch: int | None = None, ttft_q: float = 0.99, utilization: float | None = None,
                 usd_per_gpu_hour: float | None = None, retry_share: float = 0.0, quality: float = math.nan,
                 extra: dict | None = None, size_for_ttft_s: float | None = None, seed: int = 0,
                 n_path: int = 100_000) -> Ledger:
    """The ledger of ``dep`` serving ``rate`` requests/s of ``prompt_len`` + ``output_len`` tokens (module doc).
    The batch comes from ``tpot_target_s`` (the largest that meets it) or is ``batch`` as given (a configuration
    that runs a bigger batch than its target allows, the gate then catches it). ``retry_share``: the share of
    requests asked again; ``extra``: {line: USD per hour}; ``quality``: the configuration's eval score;
    ``size_for_ttft_s``: also size the fleet so the prefill queue's ``ttft_q`` quantile meets this target."""
    from lib.fleet.capacity import fleet_for_load, gpu_hour_usd, request_cost
    from lib.fleet.capacity_units import ttft_quantile_s

    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    retry = real("retry_share", retry_share, 0, 1, high_open=True)
    cost = request_cost(dep, prompt_len, output_len, tpot_target_s, batch=batch)
    fleet = fleet_for_load(lam * (1 + retry), cost, utilization)
    price = gpu_hour_usd(cost.dep.chip, usd_per_gpu_hour)
    per_replica_hour = cost.dep.gpus_per_replica * price
    u = fleet.utilization
    q = real("ttft_q", ttft_q, 0, 1, low_open=True, high_open=True)
    exact = fleet.exact
    headroom = 0.0
    if size_for_ttft_s is not None:
        from lib.fleet.sizing_chain import ttft_replicas, ttft_utilization

        t = real("size_for_ttft_s", size_for_ttft_s, 0, low_open=True, unit="seconds")
        rho = ttft_utilization(cost.prefill_s, t, q)
        if rho <= 0:
            raise ValueError(f"{cost.dep.label}: a {prompt_len}-token prefill alone misses the {t * 1e3:.3g} ms TTFT target")
        by_ttft = ttft_replicas(fleet.rate, cost.prefill_s, rho)
        headroom = max(0.0, by_ttft - exact)
        exact = max(exact, by_ttft)
    replicas = whole_replicas(exact)
    lines = {"prefill GPUs": lam * cost.prefill_s / u * per_replica_hour,
             "decode GPUs": lam * cost.decode_s / u * per_replica_hour,
             "TTFT headroom": headroom * per_replica_hour,
             "whole replicas": (replicas - exact) * per_replica_hour,
             "retries": lam * retry * cost.replica_s / u * per_replica_hour}
    for k, v in (extra or {}).items():
        if k in lines:
            raise ValueError(f"extra line {k!r} clashes with a priced line ({', '.join(LINES)})")
        lines[str(k)] = real(f"extra[{k!r}]", v, 0, unit="USD per hour")
    ttft = ttft_quantile_s(cost.prefill_s, fleet.rate / replicas, q, seed=integer("seed", seed, 0),
                           n=integer("n_path", n_path, 100))
    return Ledger(str(name), cost, fleet, replicas, price, lines, q, ttft, float(quality))


@dataclass(frozen=True)
class Audit:
    """The audit of ``candidate`` against ``base`` (module doc)."""

    base: Ledger
    candidate: Ledger
    claim: str  # the proposer's argument, in words
    claimed_saving: float  # the proposer's arithmetic, USD per hour
    quality_tolerance: float
    tpot_target_s: float
    ttft_target_s: float

    @property
    def total_saving(self) -> float:
        """base total - candidate total, USD per hour (negative: the change costs more)."""
        return self.base.total - self.candidate.total

    @property
    def moved_to(self) -> dict:
        """The lines that grew, and by how much (USD per hour): where the claimed saving went."""
        names = set(self.base.lines) | set(self.candidate.lines)
        grew = {k: self.candidate.lines.get(k, 0.0) - self.base.lines.get(k, 0.0) for k in names}
        return {k: v for k, v in sorted(grew.items(), key=lambda kv: -kv[1]) if v > 1e-9}

    @property
    def quality_ok(self) -> bool:
        """The candidate's eval score is at most ``quality_tolerance`` below the base's (nan scores: not measured, fails)."""
        b, c = self.base.quality, self.candidate.quality
        return math.isfinite(b) and math.isfinite(c) and c >= b - self.quality_tolerance - 1e-12

    @property
    def tpot_ok(self) -> bool:
        """The candidate's TPOT meets the target."""
        return self.candidate.tpot_s <= self.tpot_target_s * (1 + 1e-9)

    @property
    def ttft_ok(self) -> bool:
        """The candidate's TTFT quantile meets the target."""
        return self.candidate.ttft_quantile_s <= self.ttft_target_s * (1 + 1e-9)

    @property
    def accepted(self) -> bool:
        """The total falls and every gate holds."""
        return self.total_saving > 0 and self.quality_ok and self.tpot_ok and self.ttft_ok

    @property
    def reasons(self) -> list[str]:
        """Why it is rejected (empty when accepted)."""
        out = []
        if self.total_saving <= 0:
            out.append("the total does not fall: the saving moved to " + (", ".join(self.moved_to) or "nowhere"))
        if not self.quality_ok:
            out.append("the quality gate fails")
        if not self.tpot_ok:
            out.append("the TPOT gate fails")
        if not self.ttft_ok:
            out.append("the TTFT gate fails")
        return out


def audit(base: Ledger, candidate: Ledger, claim: str, claimed_saving: float, *, quality_tolerance: float,
          tpot_target_s: float, ttft_target_s: float) -> Audit:
    """Audit ``candidate`` against ``base``: ``claim`` and ``claimed_saving`` (USD per hour) are the proposer's
    argument and arithmetic; the gates are the quality tolerance (eval points the score may fall), the TPOT target
    and the TTFT target (at the ledgers' quantile)."""
    if not isinstance(base, Ledger) or not isinstance(candidate, Ledger):
        raise ValueError("base and candidate must be Ledger (price_ledger(...))")
    return Audit(base, candidate, str(claim), real("claimed_saving", claimed_saving), real("quality_tolerance", quality_tolerance, 0),
                 real("tpot_target_s", tpot_target_s, 0, low_open=True, unit="seconds"),
                 real("ttft_target_s", ttft_target_s, 0, low_open=True, unit="seconds"))


def choose(audits) -> Audit | None:
    """The accepted audit with the largest total saving, or None when nothing passes."""
    ok = [a for a in audits if isinstance(a, Audit) and a.accepted]
    return max(ok, key=lambda a: a.total_saving) if ok else None


PROPOSALS = ("cheaper GPU", "FP8 KV cache", "higher utilization", "truncate prompts", "FP8 weights")


@dataclass(frozen=True)
class Proposal:
    """A proposed change: its ledger, the proposer's argument and the saving they computed from the base."""

    kind: str
    ledger: Ledger
    claim: str
    claimed_saving: float


def proposal(kind: str, base: Ledger, *, cheap_gpu: str = "a100-sxm", high_utilization: float = 0.9,
             truncate_to: int | None = None, quality: float = math.nan, retry_share: float = 0.0,
             size_for_ttft_s: float | None = None, tpot_target_s: float | None = None, n_path: int = 100_000) -> Proposal:
    """The ledger of proposal ``kind`` (one of :data:`PROPOSALS`) serving the base's rate and request shape, and the
    saving its proposer claims from the base ledger alone:

    * "cheaper GPU": the same TP on ``cheap_gpu``; claim: the whole bill x (1 - its GPU-hour price / the base's);
    * "FP8 KV cache": the KV cache in FP8; claim: the decode line x (1 - base batch / new batch);
    * "higher utilization": the fleet sized to ``high_utilization``; claim: the bill x (1 - u / high);
    * "truncate prompts": prompts cut to ``truncate_to`` tokens (None: half); claim: the prefill line x the share cut;
    * "FP8 weights": weights, KV and matmuls in FP8; claim: half of both GPU lines (twice the FLOP/s, half the bytes).

    ``quality`` / ``retry_share``: the candidate's eval score and its share of requests asked again;
    ``size_for_ttft_s``: size the candidate's fleet for the TTFT target too; ``tpot_target_s``: the base's target."""
    from lib.fleet.capacity import gpu_hour_usd

    if kind not in PROPOSALS:
        raise ValueError(f"kind must be one of {PROPOSALS}, got {kind!r}")
    if not isinstance(base, Ledger):
        raise ValueError("base must be a Ledger (price_ledger(...))")
    dep, c = base.cost.dep, base.cost
    tpot = tpot_target_s if tpot_target_s is not None else c.decode_step_s
    u = base.fleet.utilization
    common = {"tpot_target_s": tpot, "quality": quality, "retry_share": retry_share, "size_for_ttft_s": size_for_ttft_s,
              "utilization": u, "ttft_q": base.ttft_q, "n_path": n_path}
    p, o = c.prompt_len, c.output_len
    if kind == "cheaper GPU":
        new = dep.replace(gpu=cheap_gpu)
        led = price_ledger(kind, new, base.fleet.rate, p, o, **common)
        ratio = gpu_hour_usd(new.chip) / base.usd_per_gpu_hour
        return Proposal(kind, led, f"{cheap_gpu} rents for {ratio:.0%} of {dep.chip.key}'s price", base.total * (1 - ratio))
    if kind == "FP8 KV cache":
        led = price_ledger(kind, dep.replace(kv_dtype="fp8"), base.fleet.rate, p, o, **common)
        cut = 1 - c.batch / led.cost.batch
        return Proposal(kind, led, f"the decoder runs {led.cost.batch} sequences per step instead of {c.batch}",
                        base.lines["decode GPUs"] * cut)
    if kind == "higher utilization":
        hi = real("high_utilization", high_utilization, u, 1, low_open=True)
        led = price_ledger(kind, dep, base.fleet.rate, p, o, **{**common, "utilization": hi})
        return Proposal(kind, led, f"the replicas run {hi:.0%} busy instead of {u:.0%}", base.total * (1 - u / hi))
    if kind == "truncate prompts":
        t = integer("truncate_to", truncate_to if truncate_to is not None else max(1, p // 2), 1, p)
        led = price_ledger(kind, dep, base.fleet.rate, t, o, **common)
        return Proposal(kind, led, f"prompts are cut from {p} to {t} tokens", base.lines["prefill GPUs"] * (1 - t / p))
    new = dep.replace(weight_dtype="fp8", kv_dtype="fp8",
                      compute_dtype="fp8" if "fp8" in dep.chip.dtypes else dep.compute_dtype)
    led = price_ledger(kind, new, base.fleet.rate, p, o, **common)
    return Proposal(kind, led, "FP8 doubles the FLOP/s and halves the bytes",
                    0.5 * (base.lines["prefill GPUs"] + base.lines["decode GPUs"]))
