"""Practice mode for coding questions: grade any implementation of an interface.

A coding notebook gives the candidate a skeleton (the interface, docstrings, ``raise
NotImplementedError``) and a cell ``check(MyThing)``. The question's grader (in the lib module of
its topic) builds :class:`Case` programs and calls :func:`grade` with a *factory*: anything that
builds a fresh implementation (the class itself, or a lambda), never a subclass of the reference.
Each case runs on a fresh object; a case fails when its runner raises ``AssertionError`` (what an
oracle or a property found) or any unexpected exception. The first failing case is shrunk to the
fewest operations that still fail (:func:`shrink`) and shown as the operations plus what went wrong.
The defective drafts a grader must fail are edits of the reference's own source
(:mod:`lib.book.drafts`).
"""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One graded program: a name (which property or scenario) and its operations."""

    name: str
    ops: tuple


@dataclass(frozen=True)
class PracticeReport:
    """What :func:`grade` found; shows as a few lines of text (and HTML in a notebook)."""

    question: str
    status: str  # "passed" | "failed" | "not implemented"
    cases_run: int
    cases_total: int
    failure: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __repr__(self) -> str:
        if self.status == "not implemented":
            return (f"{self.question}: not implemented yet ({self.failure}). Fill in the skeleton above and "
                    "run this cell again.")
        if self.passed:
            return f"{self.question}: passed all {self.cases_total} graded cases."
        return (f"{self.question}: failed after {self.cases_run} of {self.cases_total} cases.\n"
                f"{self.failure}")

    def _repr_html_(self) -> str:
        color = {"passed": "#060", "failed": "#b00"}.get(self.status, "#555")
        return f'<pre style="color:{color}">{html.escape(repr(self))}</pre>'


def shrink(ops: Sequence, fails: Callable[[list], bool]) -> list:
    """The shortest sub-list of ``ops`` (in order) found that still ``fails``: delta debugging.

    Removes halves, quarters, ... down to single operations while the program keeps failing;
    ``fails`` must be deterministic. The result fails and no single operation can be removed.
    """
    ops = list(ops)
    chunk = max(1, len(ops) // 2)
    while ops:
        i, removed = 0, False
        while i < len(ops):
            trial = ops[:i] + ops[i + chunk:]
            if trial != ops and fails(trial):
                ops, removed = trial, True
            else:
                i += chunk
        if chunk == 1 and not removed:
            return ops
        chunk = max(1, chunk // 2) if not removed else chunk
    return ops


def _failure(run: Callable, factory: Callable, ops: list) -> str | None:
    """What goes wrong running ``ops`` on a fresh implementation, or None."""
    try:
        run(factory(), ops)
    except NotImplementedError:
        raise
    except AssertionError as err:
        return str(err) or "an assertion failed"
    except Exception as err:  # the candidate's own bug: report it, do not crash the grader
        frame = traceback.extract_tb(err.__traceback__)[-1]
        return f"{type(err).__name__}: {err} (at line {frame.lineno}: {frame.line})"
    return None


def grade(question: str, factory: Callable, cases: Sequence[Case], run: Callable,
          describe: Callable[[Sequence], str] = lambda ops: "\n".join(f"  {op}" for op in ops)) -> PracticeReport:
    """Run every case with ``run(factory(), ops)``; report the first failure, shrunk.

    ``run`` raises AssertionError naming the broken property; ``describe`` prints operations.
    A NotImplementedError anywhere reports the skeleton as not implemented yet.
    """
    if not callable(factory):
        raise ValueError(f"check() takes a class or a factory that builds one, got {factory!r}")
    for n, case in enumerate(cases, 1):
        try:
            problem = _failure(run, factory, list(case.ops))
            if problem is None:
                continue

            def fails(ops):
                nonlocal problem
                found = _failure(run, factory, ops)
                if found is not None:
                    problem = found  # shrink keeps the last failing trial: report what it did
                return found is not None

            small = shrink(case.ops, fails)
        except NotImplementedError as err:
            where = traceback.extract_tb(err.__traceback__)[-1].name
            return PracticeReport(question, "not implemented", n - 1, len(cases), f"`{where}` raises NotImplementedError")
        return PracticeReport(question, "failed", n, len(cases),
                              f"First failing case ({case.name}), shrunk to {len(small)} operation(s):\n"
                              f"{describe(small)}\nWhat went wrong: {problem}")
    return PracticeReport(question, "passed", len(cases), len(cases))
