"""A notebook's checks cell: labelled assertions that can fail, and a one-line summary.

Each assertion says what kind of evidence it is:

- ``anchor``: the page's number against a published figure (the source is named);
- ``independent``: against a second method that does not share the first's formula;
- ``internal``: a consistency identity (two views of one computation agree, a sum adds up).
  Useful, but it cannot catch a wrong model, so it never counts as evidence for a headline;
- ``prose``: a sentence of the page whose truth depends on the inputs (a verdict, a winner, a
  comparison word) holds for these inputs.

``Checks(headlines=(...))`` names the glue keys of the numbers that answer the question; each
must be covered (``covers=``) by an anchor or independent check that ran. An anchor that applies
only to the published setup passes ``applies=False`` elsewhere and is reported as skipped, so
under other inputs an independent method has to carry the headline. :meth:`Checks.done` raises
an ``AssertionError`` listing every failure, or prints one line of counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

KINDS = ("anchor", "independent", "internal", "prose")
_PLURAL = {"anchor": "published anchors", "independent": "independent methods",
           "internal": "internal consistency", "prose": "prose claims"}


@dataclass(frozen=True)
class Result:
    kind: str
    claim: str
    ok: bool
    detail: str
    covers: tuple[str, ...]


def _compare(got, want, rel_tol: float, abs_tol: float) -> tuple[bool, str]:
    numeric = all(isinstance(v, Real) and not isinstance(v, bool) for v in (got, want))
    if numeric:
        ok = math.isfinite(got) and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
        return ok, f"got {got:.6g}, expected {want:.6g} (rel_tol {rel_tol:g}, abs_tol {abs_tol:g})"
    return got == want, f"got {got!r}, expected {want!r}"


class Checks:
    """Collects labelled checks; :meth:`done` reports them (see the module docstring)."""

    def __init__(self, headlines=()):
        if isinstance(headlines, str):
            headlines = (headlines,)
        self.headlines = tuple(headlines)
        self.results: list[Result] = []
        self.skipped: list[str] = []

    def _add(self, kind, claim, ok, detail, covers):
        covers = (covers,) if isinstance(covers, str) else tuple(covers)
        unknown = [c for c in covers if c not in self.headlines]
        if unknown:
            raise ValueError(f"check {claim!r} covers {unknown}, which are not headlines {list(self.headlines)}")
        self.results.append(Result(kind, claim, bool(ok), detail, covers))

    def anchor(self, claim: str, got, want, *, source: str, rel_tol: float = 1e-9, abs_tol: float = 0.0,
               covers=(), applies: bool = True) -> None:
        """``got`` agrees with the published ``want`` (``source`` names where it is published)."""
        if not source:
            raise ValueError(f"anchor {claim!r} needs its source")
        if not applies:
            self.skipped.append(claim)
            return
        ok, detail = _compare(got, want, rel_tol, abs_tol)
        self._add("anchor", claim, ok, f"{detail}; source: {source}", covers)

    def independent(self, claim: str, got, want, *, method: str, rel_tol: float = 1e-9,
                    abs_tol: float = 0.0, covers=()) -> None:
        """``got`` agrees with ``want`` computed by a second ``method`` (say which)."""
        if not method:
            raise ValueError(f"independent check {claim!r} needs its method")
        ok, detail = _compare(got, want, rel_tol, abs_tol)
        self._add("independent", claim, ok, f"{detail}; method: {method}", covers)

    def internal(self, claim: str, ok: bool) -> None:
        """A consistency identity holds (never evidence for a headline)."""
        self._add("internal", claim, ok, "", ())

    def prose(self, claim: str, ok: bool) -> None:
        """A sentence of the page that depends on the inputs is true for these inputs."""
        self._add("prose", claim, ok, "", ())

    def done(self) -> str:
        """Raise listing the failures and uncovered headlines, or print and return the summary."""
        problems = [f"[{r.kind}] {r.claim}" + (f": {r.detail}" if r.detail else "")
                    for r in self.results if not r.ok]
        covered = {h for r in self.results if r.ok and r.kind in ("anchor", "independent") for h in r.covers}
        problems += [f"headline {h!r} has no anchor or independent check that ran" for h in self.headlines
                     if h not in covered]
        if not any(r.kind in ("anchor", "independent") for r in self.results):
            problems.append("no anchor or independent check ran: internal checks alone cannot fail on a wrong model")
        if problems:
            raise AssertionError(f"{len(problems)} check(s) failed:\n- " + "\n- ".join(problems))
        counts = ", ".join(f"{sum(r.kind == k for r in self.results)} {_PLURAL[k]}" for k in KINDS
                           if any(r.kind == k for r in self.results))
        line = f"all {len(self.results)} checks passed ({counts})"
        if self.skipped:
            line += f"; {len(self.skipped)} anchor(s) for the published setup skipped under these inputs"
        if self.headlines:
            line += "; headlines covered: " + ", ".join(self.headlines)
        print(line)
        return line
