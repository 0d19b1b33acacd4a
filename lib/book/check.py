"""The candidate's self-check: type an estimate, get a verdict against the computed answer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import real
from lib.units import sig


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`self_check`; shows as one line of text."""

    ok: bool | None
    message: str

    def __repr__(self) -> str:
        return self.message


def page_hint(page: str) -> str:
    """The hint notebook ``page`` keeps for a missed estimate (metadata ``interview.self_check_hint``):
    kept out of the cell a reader sees before trying, shown only after a wrong estimate."""
    from lib.book.domain import notebook_metadata

    hint = notebook_metadata(page).get("self_check_hint")
    if not isinstance(hint, str) or not hint.strip():
        raise ValueError(f"{page}: the notebook keeps no interview.self_check_hint in its metadata")
    return hint


def self_check(estimate: float | None, answer: float, unit: str = "", rel_tol: float = 0.25,
               hint: str = "", page: str | None = None) -> Verdict:
    """Compare ``estimate`` with ``answer``: within ``rel_tol`` (relative) passes.

    None means "not tried yet". A miss reports the direction and factor, and the hint (``hint``,
    or the one notebook ``page`` keeps in its metadata, see :func:`page_hint`), but not the
    answer, so the candidate can try again.
    """
    if page is not None:
        if hint:
            raise ValueError("give hint or page, not both")
        hint = page_hint(page)
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    if real("answer", answer) == 0:
        raise ValueError(f"answer must be a finite non-zero number, got {answer!r}")
    if estimate is None:
        return Verdict(None, f"Type your estimate (in {unit or 'the asked unit'}) into the variable above and re-run this cell.")
    if not (isinstance(estimate, int | float) and math.isfinite(estimate)):
        return Verdict(False, f"Your estimate must be a number, got {estimate!r}.")
    ratio = estimate / answer
    if abs(ratio - 1) <= rel_tol:
        return Verdict(True, f"Within {sig(100 * rel_tol, 2)}%: the worked answer is {sig(answer)} {unit}. Well done.".replace("  ", " "))
    if ratio <= 0:
        return Verdict(False, "Wrong sign or zero: the answer is positive." + (f" Hint: {hint}" if hint else ""))
    direction = f"{sig(ratio, 2)}x too high" if ratio > 1 else f"{sig(1 / ratio, 2)}x too low"
    return Verdict(False, f"Not yet: your estimate is {direction}." + (f" Hint: {hint}" if hint else ""))
