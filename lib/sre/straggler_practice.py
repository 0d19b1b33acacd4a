"""Practice mode for the straggler detector (N074): a threshold from a false-positive budget and a
detector on the collector's clock.

The candidate writes a class with two methods:

* ``threshold(fp_per_day, n_ranks, step_s, window)``: the robust z above which a healthy rank is reported
  ``fp_per_day`` times a day on average, with one comparison per rank per window of ``window`` steps of
  ``step_s`` seconds (one-sided normal quantile);
* ``detect(reports, threshold)``: ``reports`` {"sent_s", "received_s"}, arrays (steps, ranks) of the
  sender's timestamp and the collector's receive time; return the ranks whose mean receive time has a
  robust z, (t - median) / (1.4826 x MAD), strictly above ``threshold``, slowest first.

Oracles: for the threshold, the expected false positives a day at the candidate's z computed with
``math.erfc`` (not the quantile function) must equal the budget within 0.1%; for the detector, the
injected stragglers of :func:`lib.sre.straggler_detector.simulate_reports` with margins wide enough that
the right answer is unambiguous, and hand-made times whose z lands exactly on the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .straggler_detector import Detector, comparisons_per_day, simulate_reports

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "run", "variant"]

QUESTION = "A straggler detector (N074)"


class Skeleton:
    """Fill in both methods; check(Skeleton) grades them."""

    def threshold(self, fp_per_day, n_ranks, step_s, window):
        """The robust z above which a healthy rank is reported fp_per_day times a day on average (one
        comparison per rank per window of `window` steps of `step_s` seconds; one-sided normal quantile)."""
        raise NotImplementedError

    def detect(self, reports, threshold):
        """reports: {"sent_s", "received_s"}, arrays (steps, ranks) of seconds. Return the ranks whose mean
        receive time has a robust z, (t - median) / (1.4826 x MAD), strictly above threshold, slowest first."""
        raise NotImplementedError


_DRAFTS = {
    "sender clock": (
        "compares the sender's timestamps: a host whose clock runs ahead looks late every step, and a straggler on a "
        "host whose clock runs behind is hidden",
        {"detect": [('t = np.asarray(reports["received_s"], dtype=float)',
                     't = np.asarray(reports["sent_s"], dtype=float)')]}),
    "mean and SD instead of median and MAD": (
        "a z-score from the mean and the standard deviation: the straggler inflates the SD it is measured against, "
        "so with n ranks no z can exceed sqrt(n - 1) (2.6 for 8 ranks), and a second straggler hides the first",
        {"detect": [("z = robust_z(per_rank)", "z = (per_rank - per_rank.mean()) / per_rank.std()")]}),
    "at the threshold counts": (
        "reports a rank whose z equals the threshold (>= instead of >): the boundary the page chose is strict",
        {"detect": [("hits = [int(r) for r in np.flatnonzero(z > threshold)]",
                     "hits = [int(r) for r in np.flatnonzero(z >= threshold)]")]}),
    "threshold not corrected for the ranks": (
        "alpha = budget / windows a day, forgetting that every rank is compared in every window: the false "
        "positives come n_ranks times as often as budgeted",
        {"threshold": [("alpha = fp_per_day / comparisons_per_day(n_ranks, step_s, window)",
                        "alpha = fp_per_day / comparisons_per_day(1, step_s, window)")]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference class (``"reference"``) or a draft (one of ``VARIANTS``)."""
    if name == "reference":
        return Detector
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(Detector, name.replace(" ", "_"), doc, **methods)


def _fp_at(z: float, n: int, step_s: float, window: int) -> float:
    """Expected false positives a day at threshold z, by erfc (independent of NormalDist.inv_cdf)."""
    return comparisons_per_day(n, step_s, window) * 0.5 * math.erfc(z / math.sqrt(2.0))


def run(impl, ops: Sequence) -> None:
    """Run each operation: ("threshold", fp, n, step_s, window) or ("detect", label, sent, received,
    threshold, expected)."""
    for op in ops:
        if op[0] == "threshold":
            _, fp, n, step_s, window = op
            z = float(impl.threshold(fp, n, step_s, window))
            got = _fp_at(z, n, step_s, window)
            if not math.isclose(got, fp, rel_tol=1e-3):
                raise AssertionError(f"threshold({fp}, {n} ranks, {step_s} s steps, window {window}) = {z:.4f}: at that z, "
                                     f"{got:.4g} healthy reports a day are expected, not {fp}")
        else:
            _, label, sent, received, thr, expected = op
            reports = {"sent_s": np.array(sent, dtype=float), "received_s": np.array(received, dtype=float)}
            got = [int(r) for r in impl.detect(reports, thr)]
            if got != list(expected):
                raise AssertionError(f"{label}: detect(threshold {thr}) returned {got}, expected {list(expected)}")


def _sim_op(label: str, n: int, slow: dict, skew_s: float, window: int, thr: float, seed: int) -> tuple:
    r = simulate_reports(n, window, 1.0, 0.002, slow=slow, skew_s=skew_s, delay_jitter_s=50e-6, seed=seed)
    expected = sorted(slow, key=lambda k: -slow[k])
    return ("detect", label, r["sent_s"].round(9).tolist(), r["received_s"].round(9).tolist(), thr, expected)


def _boundary(extra: float, expected: list) -> tuple:
    """Eight ranks with median 0 and MAD 1 (seconds from the step's start); the last at 4 x 1.4826 + extra, so
    its robust z is exactly 4 when extra is 0."""
    t = [[-1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 4 * 1.4826 + extra]]
    return ("detect", f"a rank at z = 4{' + a little' if extra else ' exactly'}", t, t, 4.0, expected)


def cases() -> list[Case]:
    """The threshold at several budgets and sizes, then the detector: the boundary, skewed clocks, small
    groups, two stragglers."""
    return [
        Case("threshold from the budget", (("threshold", 1.0, 1024, 1.0, 10), ("threshold", 0.1, 16384, 2.0, 30),
                                           ("threshold", 5.0, 64, 0.5, 1), ("threshold", 1.0, 8, 10.0, 100))),
        Case("one clear straggler, clocks in sync", (_sim_op("1 slow rank of 64, no skew", 64, {9: 1.02}, 0.0, 10, 6.0, 1),)),
        Case("exactly at the threshold", (_boundary(0.0, []), _boundary(1e-3, [7]))),
        Case("skewed host clocks", (_sim_op("no straggler, 5 ms clock skew", 256, {}, 5e-3, 10, 6.0, 2),
                                    _sim_op("1 slow rank, 5 ms clock skew", 256, {100: 1.01}, 5e-3, 10, 6.0, 3))),
        Case("few ranks", (_sim_op("1 slow rank of 8", 8, {3: 1.05}, 0.0, 10, 5.0, 4),)),
        Case("two stragglers, the slower one later", (_sim_op("2 slow ranks of 16", 16, {2: 1.03, 11: 1.05}, 0.0, 10, 5.0, 5),)),
    ]


def describe(ops: Sequence) -> str:
    lines = []
    for op in ops:
        if op[0] == "threshold":
            lines.append(f"  threshold(fp_per_day={op[1]}, n_ranks={op[2]}, step_s={op[3]}, window={op[4]})")
        else:
            shape = np.shape(op[3])
            lines.append(f"  detect: {op[1]} ({shape[0]} steps x {shape[1]} ranks), threshold {op[4]}")
    return "\n".join(lines) or "  (nothing)"


def check(candidate: Callable) -> PracticeReport:
    """Grade any class with ``threshold`` and ``detect``; the report shows the first failing operation."""
    return grade(QUESTION, candidate, cases(), run, describe)
