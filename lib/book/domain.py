"""Input domains: what a notebook, and the explorer it starts, answer for.

One set of domain types serves both. An explorer declares the domain of each of its inputs in
Python (:func:`lib.book.widgets.explorer`); a notebook declares the domain of each of its
parameters in its metadata (``interview.domain``, JSON), and a parameter that feeds the explorer
points at the explorer's declaration instead of repeating it (``"explorer"``), so the page and its
controls cannot disagree. The cell after the parameters calls :func:`accept_parameters`, which
refuses a value outside the domain with one clear message (a :class:`ParameterError`, shown
without a traceback); :func:`refusing` turns lib's own refusal of a combination (a model that
does not fit, a TP degree that does not divide the heads) into the same message.

JSON spec of one parameter (``interview.domain[NAME]``)::

    "explorer"                       the domain of the explorer input ``name.lower()``
    "explorer:<input>"               the domain of that explorer input
    {"choice": [..]}                 one of the listed values
    {"choice": "models" | "gpus"}    any model / GPU in data/ (add "kind": "moe" | "mla" | "dense")
    {"int": [low, high]}             an integer in [low, high] ("log": true: the sweep draws powers of two)
    {"real": [low, high]}            a number in [low, high]
    {"bool": true}                   True or False
    {"text": <max characters>}       free text (a typed program); the sweep leaves it at its default
    {"list": <spec>, "len": [a, b]}  a list or tuple of a..b items, each in <spec> (add "distinct": true
                                     when no item may repeat, e.g. GPU generations to compare)
    any dict spec + "or_none": true  None is allowed too (None: lib takes the value from data/)
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ---- domain types ------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One of a fixed list of options (a dropdown). An int matches a float option of the same value
    (25 for 25.0, as FloatRange accepts it); a bool never matches a number."""

    options: tuple
    label: str = ""

    def valid(self, value) -> bool:
        return any(value == o and (type(value) is type(o) or (type(value) is int and type(o) is float))
                   for o in self.options)

    def describe(self) -> str:
        return "one of " + ", ".join(map(repr, self.options))

    def sample(self, rng) -> object:
        """A random valid value (``rng`` is a ``random.Random``)."""
        return rng.choice(self.options)

    def within(self, other) -> bool:
        """Every value of this domain is valid in ``other``."""
        return all(other.valid(o) for o in self.options)


@dataclass(frozen=True)
class IntRange:
    """An integer in [low, high] (a slider; ``log=True`` steps through powers of two)."""

    low: int
    high: int
    label: str = ""
    log: bool = False

    def valid(self, value) -> bool:
        return type(value) is int and self.low <= value <= self.high

    def describe(self) -> str:
        return f"an integer from {self.low} to {self.high}"

    def powers_of_two(self) -> list[int]:
        """The values a log slider offers: powers of two inside [low, high] (or low itself)."""
        return [2**i for i in range(64) if self.low <= 2**i <= self.high] or [self.low]

    def sample(self, rng) -> int:
        """A random valid value (``rng`` is a ``random.Random``): a power of two on a log slider;
        log-uniform on a range spanning two decades or more from a positive low (lengths and counts
        vary by magnitude: uniform draws from 16 to 65,536 would almost never be short); else uniform."""
        if self.log:
            return rng.choice(self.powers_of_two())
        if self.low > 0 and self.high >= 100 * self.low:
            return min(self.high, max(self.low, round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))))
        return rng.randint(self.low, self.high)

    def within(self, other) -> bool:
        return isinstance(other, IntRange | FloatRange) and other.low <= self.low and self.high <= other.high


@dataclass(frozen=True)
class FloatRange:
    """A real number in [low, high] (a slider)."""

    low: float
    high: float
    step: float = 0.01
    label: str = ""

    def valid(self, value) -> bool:
        return type(value) in (int, float) and math.isfinite(value) and self.low <= value <= self.high

    def describe(self) -> str:
        return f"a number from {self.low} to {self.high}"

    def sample(self, rng) -> float:
        """A random valid value (``rng`` is a ``random.Random``): log-uniform on a range spanning two
        decades or more from a positive low (rates, times), else uniform."""
        if self.low > 0 and self.high >= 100 * self.low:
            return min(self.high, max(self.low, math.exp(rng.uniform(math.log(self.low), math.log(self.high)))))
        return rng.uniform(self.low, self.high)

    def within(self, other) -> bool:
        return isinstance(other, FloatRange) and other.low <= self.low and self.high <= other.high


@dataclass(frozen=True)
class Flag:
    """True or False."""

    label: str = ""

    def valid(self, value) -> bool:
        return type(value) is bool

    def describe(self) -> str:
        return "True or False"

    def sample(self, rng) -> bool:
        return rng.random() < 0.5

    def within(self, other) -> bool:
        return isinstance(other, Flag)


@dataclass(frozen=True)
class Text:
    """Free text of at most ``max_chars`` characters (a text box): a typed program, a token list.

    ``examples`` are what the sweep and the fuzz tests draw; the function behind it parses the
    text and raises ValueError (shown as a message) on anything it cannot read.
    """

    examples: tuple
    max_chars: int = 2000
    label: str = ""

    def valid(self, value) -> bool:
        return type(value) is str and len(value) <= self.max_chars

    def describe(self) -> str:
        return f"text of at most {self.max_chars} characters"

    def sample(self, rng) -> str:
        return rng.choice(self.examples)

    def within(self, other) -> bool:
        return isinstance(other, Text) and self.max_chars <= other.max_chars


@dataclass(frozen=True)
class ListOf:
    """A list (or tuple) of ``min_len`` to ``max_len`` items, each in ``item``; with ``distinct``, no item
    twice."""

    item: object
    min_len: int = 1
    max_len: int = 16
    distinct: bool = False

    def valid(self, value) -> bool:
        return (isinstance(value, list | tuple) and self.min_len <= len(value) <= self.max_len
                and all(self.item.valid(v) for v in value)
                and not (self.distinct and len({repr(v) for v in value}) < len(value)))

    def describe(self) -> str:
        return (f"a list of {self.min_len} to {self.max_len} {'distinct ' if self.distinct else ''}items, "
                f"each {self.item.describe()}")

    def sample(self, rng) -> list:
        n = rng.randint(self.min_len, min(self.max_len, self.min_len + 3))
        if self.distinct and isinstance(self.item, Choice):
            values = rng.sample(list(self.item.options), min(n, len(self.item.options)))
        else:
            values = []
            for _ in range(100 * n):  # distinct: redraw repeats (a continuous domain rarely repeats)
                if len(values) == n:
                    break
                v = self.item.sample(rng)
                if not (self.distinct and repr(v) in {repr(x) for x in values}):
                    values.append(v)
        return sorted(values) if all(isinstance(v, int | float) for v in values) else values

    def within(self, other) -> bool:
        return (isinstance(other, ListOf) and other.min_len <= self.min_len and self.max_len <= other.max_len
                and self.item.within(other.item) and (self.distinct or not other.distinct))


@dataclass(frozen=True)
class OrNone:
    """None (lib then takes the value from data/), or a value of ``inner``."""

    inner: object

    def valid(self, value) -> bool:
        return value is None or self.inner.valid(value)

    def describe(self) -> str:
        return f"None or {self.inner.describe()}"

    def sample(self, rng):
        return None if rng.random() < 0.5 else self.inner.sample(rng)

    def within(self, other) -> bool:
        return isinstance(other, OrNone) and self.inner.within(other.inner)


Domain = Choice | IntRange | FloatRange | Flag | Text | ListOf | OrNone


def _registry_choice(kind: str, where: str | None) -> Choice:
    if kind == "gpus":
        from lib.registry import hardware

        if where:
            raise ValueError('"kind" filters models only')
        return Choice(tuple(hardware.gpu_names()))
    if kind != "models":
        raise ValueError(f'a registry choice must be "models" or "gpus", got {kind!r}')
    from lib.registry import models

    names = models.model_names()
    if where is None:
        return Choice(tuple(names))
    tests = {"moe": lambda m: m.is_moe, "mla": lambda m: m.is_mla,
             "dense": lambda m: not m.is_moe}
    if where not in tests:
        raise ValueError(f'"kind" must be one of {sorted(tests)}, got {where!r}')
    return Choice(tuple(n for n in names if tests[where](models.model(n))))


def parse(spec, explorer_domains: dict | None = None, name: str = "") -> Domain:
    """The :data:`Domain` a JSON ``spec`` describes (see the module docstring).

    ``explorer_domains`` (input -> domain) resolves ``"explorer"`` references; ``name`` is the
    parameter's name, for ``"explorer"`` without an input and for messages.
    """
    if isinstance(spec, str):
        if not spec.startswith("explorer"):
            raise ValueError(f"{name}: a string spec must be 'explorer' or 'explorer:<input>', got {spec!r}")
        arg = spec.partition(":")[2] or name.lower()
        if explorer_domains is None or arg not in explorer_domains:
            raise ValueError(f"{name}: the explorer has no input {arg!r}")
        return explorer_domains[arg]
    if not isinstance(spec, dict):
        raise ValueError(f"{name}: a spec must be a string or an object, got {spec!r}")
    spec = dict(spec)
    or_none = spec.pop("or_none", False)
    if "choice" in spec:
        options = spec.pop("choice")
        dom = (_registry_choice(options, spec.pop("kind", None)) if isinstance(options, str)
               else Choice(tuple(options)))
    elif "int" in spec:
        low, high = spec.pop("int")
        dom = IntRange(low, high, log=spec.pop("log", False))
    elif "real" in spec:
        low, high = spec.pop("real")
        dom = FloatRange(float(low), float(high))
    elif "text" in spec:
        dom = Text((), spec.pop("text"))
    elif "bool" in spec:
        spec.pop("bool")
        dom = Flag()
    elif "list" in spec:
        item = parse(spec.pop("list"), explorer_domains, name)
        low, high = spec.pop("len", (1, 16))
        distinct = spec.pop("distinct", False)
        if not isinstance(distinct, bool):
            raise ValueError(f"{name}: 'distinct' must be true or false, got {distinct!r}")
        dom = ListOf(item, low, high, distinct)
    else:
        raise ValueError(f"{name}: unknown spec {spec!r}")
    if spec:
        raise ValueError(f"{name}: unknown keys {sorted(spec)} in its spec")
    return OrNone(dom) if or_none else dom


# ---- a notebook's declared domain --------------------------------------------------------


def notebook_path(slug: str) -> Path:
    """The chapter notebook called ``slug``."""
    found = sorted((ROOT / "chapters").glob(f"*/{slug}.ipynb"))
    if len(found) != 1:
        raise ValueError(f"no single chapter notebook is called {slug!r} (found {len(found)})")
    return found[0]


@cache
def notebook_metadata(slug: str) -> dict:
    """The ``interview`` metadata of chapter notebook ``slug`` (question id, domain, variants, hint...)."""
    return json.loads(notebook_path(slug).read_text(encoding="utf-8"))["metadata"].get("interview", {})


def notebook_domain(slug: str) -> dict[str, Domain]:
    """Parameter name -> :data:`Domain`, from the notebook's ``interview.domain`` metadata."""
    meta = notebook_metadata(slug)
    if "domain" not in meta:
        raise ValueError(f"{slug}: the notebook declares no interview.domain")
    explorer_domains = None
    if meta.get("explorer"):
        from lib.book.widgets import get

        explorer_domains = get(meta["explorer"]).domains
    return {name: parse(spec, explorer_domains, name) for name, spec in meta["domain"].items()}


def declared_variants(slug: str) -> list[dict]:
    """The parameter sets the notebook is tested with besides its defaults (``interview.variants``)."""
    return list(notebook_metadata(slug).get("variants", []))


class ParameterError(ValueError):
    """A parameter outside what the page answers for. IPython shows only the message."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mParameterError\x1b[0m: {self}"]


def accept_parameters(slug: str, namespace: dict) -> None:
    """Check every parameter of notebook ``slug`` (read from ``namespace``) against its domain.

    Raises :class:`ParameterError` naming every value outside it, with what is allowed.
    """
    problems = []
    for name, dom in notebook_domain(slug).items():
        if name not in namespace:
            problems.append(f"{name} is not set (the parameters cell defines it)")
        elif not dom.valid(namespace[name]):
            problems.append(f"{name} must be {dom.describe()}; got {namespace[name]!r}")
    if problems:
        raise ParameterError("this page does not answer for these parameters: " + "; ".join(problems)
                             + ". (The page's domain is declared in its metadata, interview.domain.)")


@contextlib.contextmanager
def refusing(what: str = "these parameters"):
    """Turn lib's refusal (a ValueError) of a combination of parameters into a :class:`ParameterError`.

    ``with refusing(): dep = Deployment(MODEL, GPU, tp=TP)`` stops the page at the parameters with
    lib's message (which names the input and what is allowed), instead of a traceback.
    """
    try:
        yield
    except ParameterError:
        raise
    except ValueError as err:
        raise ParameterError(f"this page does not answer for {what}: {err}") from None
