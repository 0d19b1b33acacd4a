"""Defective drafts for the practice graders, written as edits of the reference's own source.

A grader proves its worth by failing drafts that each make one classic mistake. A draft typed out
again beside the reference hides its one difference among lines that only repeat the reference, and
drifts when the reference changes. Here a draft is the reference function (or method) compiled again
from its own source with a few line edits ``(reference lines, draft lines)``: the edits are the
whole difference and read like a diff.

An edit's reference lines must match exactly one run of lines of the function, compared without
their indentation; the draft lines (empty: delete) take the indentation of the first line they
replace and keep their own relative indentation. An edit that matches nowhere, or in two places,
raises ValueError, so a change to the reference cannot silently turn a draft into something else.
The draft runs in the reference's module namespace (the same helpers and constants), and its lines
show in tracebacks under the name ``<draft NAME of QUALNAME>``.
"""

from __future__ import annotations
import __future__

import functools
import inspect
import linecache
import sys
import textwrap
from collections.abc import Callable, Sequence

__all__ = ["edited", "edited_class"]

Edit = tuple[str, str]  # (reference lines, draft lines), each a string of one or more lines


def _apply(lines: list[str], edit: Edit, where: str) -> list[str]:
    old, new = edit
    want = [s.strip() for s in old.strip("\n").splitlines()]
    n = len(want)
    hits = [i for i in range(len(lines) - n + 1) if [s.strip() for s in lines[i:i + n]] == want]
    if len(hits) != 1:
        raise ValueError(f"{where}: the edit's reference lines {old!r} occur {len(hits)} times in the reference; "
                         "an edit must match exactly one place (has the reference changed?)")
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    body = textwrap.dedent(new.strip("\n")).splitlines() if new.strip() else []
    return lines[:i] + [indent + s if s.strip() else "" for s in body] + lines[i + n:]


@functools.cache
def _source(func: Callable) -> tuple[tuple[str, ...], int]:
    """``func``'s lines (dedented) and the number of its first line in its file (read once)."""
    source, first = inspect.getsourcelines(func)
    lines = textwrap.dedent("".join(source)).splitlines()
    if not lines[0].startswith(("def ", "async def ")) or "super()" in "".join(source):
        raise ValueError(f"{func.__qualname__}: drafts edit an undecorated def that does not call super()")
    return tuple(lines), first


def edited(func: Callable, edits: Sequence[Edit], *, name: str) -> Callable:
    """``func`` compiled again from its own source with ``edits`` applied in order (module doc).

    ``name`` names the draft in errors and tracebacks. The result is a plain function (a method's
    draft takes ``self`` like the method); ``func`` must be an undecorated ``def`` that does not
    call ``super()`` without arguments.
    """
    if not inspect.isfunction(func):
        raise ValueError(f"draft {name!r}: edits apply to a function or method, got {func!r}")
    if not edits:
        raise ValueError(f"draft {name!r}: a draft needs at least one edit")
    lines, first = _source(func)
    lines = list(lines)
    where = f"draft {name} of {func.__qualname__}"
    for edit in edits:
        lines = _apply(lines, edit, where)
    filename = f"<{where}>"
    text = "\n" * (first - 1) + "\n".join(lines) + "\n"  # line numbers as in the file, up to the edits
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    code = compile(text, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, func.__globals__, namespace)  # the reference's globals; the draft is bound only here
    draft = namespace[func.__name__]
    draft.__qualname__ = f"{func.__qualname__}[{name}]"
    return draft


def edited_class(base: type, name: str, doc: str, **methods: Sequence[Edit]) -> type:
    """A subclass ``name`` of ``base`` (docstring ``doc``: the defect) whose ``methods`` are
    ``base``'s own, each compiled again with its edits (:func:`edited`)."""
    namespace = {"__doc__": doc, "__module__": sys._getframe(1).f_globals["__name__"]}
    for method, edits in methods.items():
        namespace[method] = edited(getattr(base, method), edits, name=name)
    return type(name, (base,), namespace)
