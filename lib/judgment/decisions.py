"""Deciding under uncertainty: the expected cost of deciding now against waiting for the evidence,
the confidence bar that reversibility sets, and how often a sound decision still ends badly
(N088 deciding-under-uncertainty).

A change (FP8 KV cache, a new serving engine) is good with probability ``p``. Its evidence (a
judged sample, an A/B, a canary) needs ``w`` weeks to arrive, whether gathered before adopting or
from production after. Two choices:

* **decide now** and check in when the evidence arrives: if the change is bad (probability
  ``1 - p``) it does harm ``h`` a week until the check-in, then costs ``R`` to reverse:
  ``cost_now = (1 - p) (R + h w)``;
* **wait** for the evidence, adopting only if it is good: if the change is good (probability ``p``)
  the ``w`` weeks of its value ``D`` a week are lost: ``cost_wait = p D w``.

Deciding now wins when ``cost_now < cost_wait``, that is when ``p`` exceeds the **evidence
threshold** ``p* = (R + h w) / (R + h w + D w)``: a cheap reversal (small ``R``) lowers the bar, an
expensive one raises it toward 1. Either way a decision taken at confidence ``p`` turns out badly
``1 - p`` of the time: the outcome grades the luck, the expected cost grades the decision.

:func:`reversal_cost_usd` prices a reversal (engineer-weeks at ``judgment.engineer_week_usd`` plus
the capacity a rolling restart takes out, :func:`restart_gpu_hours`); :func:`evidence_days` is how
long a judged sample takes to show a regression (:func:`lib.sre.canary.requests_needed`, the book's
one sample-size model); the check-in date is :func:`lib.judgment.plans.evidence_date`.
:func:`simulate_decisions` draws outcomes (seeded) for the Monte Carlo side of the checks.

Units: US dollars, weeks (7 calendar days), probabilities in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.registry import assumptions

__all__ = ["Decision", "bad_outcomes", "decide", "engineer_week_usd", "evidence_days", "restart_gpu_hours",
           "reversal_cost_usd", "simulate_decisions", "threshold"]


@dataclass(frozen=True)
class Decision:
    """One decision priced both ways (module doc). USD and weeks."""

    p_good: float
    value_per_week_usd: float
    harm_per_week_usd: float
    reversal_usd: float
    evidence_weeks: float

    @property
    def cost_if_wrong_usd(self) -> float:
        """What a bad change costs when adopted now: R + h w (harm until the check-in, then the reversal)."""
        return self.reversal_usd + self.harm_per_week_usd * self.evidence_weeks

    @property
    def delay_cost_usd(self) -> float:
        """What waiting costs when the change is good: D w."""
        return self.value_per_week_usd * self.evidence_weeks

    @property
    def cost_now_usd(self) -> float:
        """Expected cost of deciding now: (1 - p)(R + h w)."""
        return (1 - self.p_good) * self.cost_if_wrong_usd

    @property
    def cost_wait_usd(self) -> float:
        """Expected cost of waiting for the evidence: p D w."""
        return self.p_good * self.delay_cost_usd

    @property
    def threshold(self) -> float:
        """The confidence above which deciding now costs less: (R + h w) / (R + h w + D w)."""
        return threshold(self.reversal_usd, self.harm_per_week_usd, self.value_per_week_usd, self.evidence_weeks)

    @property
    def decide_now(self) -> bool:
        """Deciding now costs less in expectation (a tie waits)."""
        return self.cost_now_usd < self.cost_wait_usd

    @property
    def advantage_usd(self) -> float:
        """Expected saving of the better choice over the other: |cost_now - cost_wait|."""
        return abs(self.cost_now_usd - self.cost_wait_usd)

    @property
    def bad_outcome_probability(self) -> float:
        """Probability that deciding now turns out badly (the change was bad): 1 - p."""
        return 1 - self.p_good


def decide(p_good: float, value_per_week_usd: float, harm_per_week_usd: float, reversal_usd: float,
           evidence_weeks: float) -> Decision:
    """A validated :class:`Decision`: confidence ``p_good`` in [0, 1], the change's value a week when good
    (> 0), its harm a week when bad (>= 0), the reversal's cost (>= 0) and the weeks until the evidence
    arrives (> 0)."""
    return Decision(fraction("p_good", p_good),
                    real("value_per_week_usd", value_per_week_usd, 0, low_open=True, unit="USD per week"),
                    real("harm_per_week_usd", harm_per_week_usd, 0, unit="USD per week"),
                    real("reversal_usd", reversal_usd, 0, unit="USD"),
                    real("evidence_weeks", evidence_weeks, 0, low_open=True, unit="weeks"))


def threshold(reversal_usd: float, harm_per_week_usd: float, value_per_week_usd: float, evidence_weeks: float) -> float:
    """The evidence threshold p* = (R + h w) / (R + h w + D w): deciding now and waiting cost the same there."""
    r = real("reversal_usd", reversal_usd, 0, unit="USD")
    h = real("harm_per_week_usd", harm_per_week_usd, 0, unit="USD per week")
    d = real("value_per_week_usd", value_per_week_usd, 0, low_open=True, unit="USD per week")
    w = real("evidence_weeks", evidence_weeks, 0, low_open=True, unit="weeks")
    wrong = r + h * w
    return wrong / (wrong + d * w)


def engineer_week_usd(value: float | None = None) -> float:
    """US dollars of one engineer-week, fully loaded (``judgment.engineer_week_usd``), or ``value``."""
    return real("engineer_week_usd", assumptions.resolve(value, "judgment.engineer_week_usd"), 0, low_open=True,
                unit="USD per engineer-week")


def restart_gpu_hours(replicas: int, gpus_per_replica: int, start_s: float) -> float:
    """GPU-hours a rolling restart takes out of service: each replica is down for its start time,
    replicas x GPUs per replica x start_s / 3600."""
    n = integer("replicas", replicas, 0, unit="replicas")
    g = integer("gpus_per_replica", gpus_per_replica, 1)
    return n * g * real("start_s", start_s, 0, unit="seconds") / 3600.0


def reversal_cost_usd(engineer_weeks: float, restart_gpu_hours: float = 0.0, usd_per_gpu_hour: float = 0.0,
                      engineer_week: float | None = None) -> float:
    """What undoing a change costs: engineer-weeks x the engineer-week price + the restart's GPU-hours
    x the GPU-hour price."""
    e = real("engineer_weeks", engineer_weeks, 0, unit="engineer-weeks")
    gh = real("restart_gpu_hours", restart_gpu_hours, 0, unit="GPU-hours")
    usd = real("usd_per_gpu_hour", usd_per_gpu_hour, 0, unit="USD per GPU-hour")
    return e * engineer_week_usd(engineer_week) + gh * usd


def evidence_days(p0: float, p1: float, judged_per_day: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Calendar days for a judged sample to catch a regression from bad-answer rate ``p0`` to ``p1``:
    :func:`lib.sre.canary.requests_needed` (one-sided, against the known baseline) / ``judged_per_day``."""
    from lib.sre import canary

    per_day = real("judged_per_day", judged_per_day, 0, low_open=True, unit="judged requests per day")
    return canary.requests_needed(p0, p1, alpha, power) / per_day


@dataclass(frozen=True)
class BadOutcomes:
    """Decisions taken at confidence ``p``: how many of ``n`` are expected to end badly, and the chance
    that at least one does."""

    n: int
    p_good: float

    @property
    def expected_bad(self) -> float:
        return self.n * (1 - self.p_good)

    @property
    def at_least_one(self) -> float:
        return 1 - self.p_good ** self.n


def bad_outcomes(n_decisions: int, p_good: float) -> BadOutcomes:
    """:class:`BadOutcomes` of ``n_decisions`` independent decisions, each good with probability ``p_good``."""
    return BadOutcomes(integer("n_decisions", n_decisions, 1, unit="decisions"), fraction("p_good", p_good))


@dataclass(frozen=True)
class SimulatedDecisions:
    good: np.ndarray  # bool per decision: the change turned out good
    cost_now_usd: np.ndarray  # realized cost of deciding now, per decision
    cost_wait_usd: np.ndarray  # realized cost of waiting, per decision


def simulate_decisions(case: Decision, n: int, seed: int = 0) -> SimulatedDecisions:
    """``n`` seeded draws of the change's quality (good with probability ``case.p_good``) and the realized
    cost of each choice: deciding now costs R + h w when bad, waiting costs D w when good."""
    if not isinstance(case, Decision):
        raise ValueError(f"case must be a Decision (decide(...)), got {type(case).__name__}")
    k = integer("n", n, 1, unit="decisions")
    rng = np.random.default_rng(integer("seed", seed, 0))
    good = rng.random(k) < case.p_good
    return SimulatedDecisions(good, np.where(good, 0.0, case.cost_if_wrong_usd), np.where(good, case.delay_cost_usd, 0.0))
