"""Explorers: ipywidgets controls bound to one pure lib function that returns a :class:`View`.

A view function lives in ``lib/explorers/<section>.py`` and registers itself with
:func:`explorer`, declaring the domain of each input (:class:`~lib.book.domain.Choice`,
:class:`~lib.book.domain.IntRange`, :class:`~lib.book.domain.FloatRange`); a notebook's declared
domain points at these declarations (:mod:`lib.book.domain`). Tests and the benchmark find every explorer through :func:`registry`.
In a notebook, ``explore("roofline.decode_floor", model=MODEL, ...)`` shows the controls and
the view; a ``ValueError`` from the function is shown as a plain message, never a traceback.
ipywidgets is imported only when used; figures are matplotlib, one persistent figure per explorer
updated in place and rendered to SVG (:mod:`lib.book.figures`), fast enough to redraw on every change.
"""

from __future__ import annotations

import html
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lib.book.domain import Choice, Domain, FloatRange, IntRange, Text  # noqa: F401  (explorers import them from here)

# ---- what a view function returns -----------------------------------------------------


@dataclass
class View:
    """A small table (label, value) and an optional figure (a :class:`lib.book.figures.Drawing`:
    anything with ``svg()``) with its caption (one sentence saying what to look at; required with a
    figure), and a one-line note."""

    title: str
    rows: list[tuple[str, str]]
    figure: Any = None
    note: str = ""
    values: dict[str, float] = field(default_factory=dict)  # raw numbers, for tests
    caption: str = ""

    def svg(self) -> str:
        """The figure as inline SVG text ('' when there is none)."""
        return "" if self.figure is None else self.figure.svg()

    def table_text(self) -> str:
        width = max((len(k) for k, _ in self.rows), default=0)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows)

    def __repr__(self) -> str:
        return f"{self.title}\n{self.table_text()}" + (f"\n{self.note}" if self.note else "")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>"
                       for k, v in self.rows)
        cap = f'<figcaption>{html.escape(self.caption)}</figcaption>' if self.caption else ""
        pic = (f'<figure class="explorer-figure"><div role="img" aria-label="{html.escape(self.caption or self.title)}">'
               f'{self.svg()}</div>{cap}</figure>' if self.figure else "")
        note = f"<p><i>{html.escape(self.note)}</i></p>" if self.note else ""
        return (f'<div class="explorer-view"><b>{html.escape(self.title)}</b>'
                f'<table class="explorer-table">{rows}</table>{note}{pic}</div>')


@dataclass
class ErrorView:
    """What the reader sees when inputs are invalid: the ValueError's message, no traceback."""

    message: str

    def __repr__(self) -> str:
        return f"Invalid input: {self.message}"

    def _repr_html_(self) -> str:
        return f'<div class="explorer-error" style="color:#b00">Invalid input: {html.escape(self.message)}</div>'


# ---- registry --------------------------------------------------------------------------


@dataclass(frozen=True)
class Explorer:
    name: str
    func: Callable[..., View]
    domains: dict[str, Domain]


_REGISTRY: dict[str, Explorer] = {}


def explorer(name: str, **domains: Domain) -> Callable:
    """Decorator: register ``func`` as explorer ``name`` with the domain of each argument."""

    def wrap(func: Callable[..., View]) -> Callable[..., View]:
        if name in _REGISTRY and _REGISTRY[name].func.__qualname__ != func.__qualname__:
            raise ValueError(f"explorer {name!r} is registered twice")
        _REGISTRY[name] = Explorer(name, func, dict(domains))
        func.explorer_name = name
        return func

    return wrap


def registry() -> dict[str, Explorer]:
    """Every registered explorer (imports each module of ``lib.explorers`` first)."""
    import lib.explorers

    for info in pkgutil.iter_modules(lib.explorers.__path__):
        importlib.import_module(f"lib.explorers.{info.name}")
    return dict(_REGISTRY)


def section_modules(section: str) -> list[str]:
    """The modules of ``lib.explorers`` that hold explorers named ``section.*``: ``section`` itself
    and ``section_*`` (tests hold every explorer to this naming)."""
    import lib.explorers

    return [f"lib.explorers.{info.name}" for info in pkgutil.iter_modules(lib.explorers.__path__)
            if info.name == section or info.name.startswith(section + "_")]


def get(name: str) -> Explorer:
    """One explorer by name, with a clear error listing the valid names. Imports only the modules
    of its section (a page pays for its own explorers, not the book's hundred)."""
    if name not in _REGISTRY:
        for module in section_modules(str(name).split(".", 1)[0]):
            importlib.import_module(module)
    if name not in _REGISTRY:
        reg = registry()
        if name not in reg:
            raise ValueError(f"unknown explorer {name!r}; valid names: {', '.join(sorted(reg))}")
    return _REGISTRY[name]


def render(name: str, **kwargs) -> View | ErrorView:
    """Call explorer ``name``; a ValueError becomes an :class:`ErrorView` with its message."""
    exp = get(name)
    unknown = set(kwargs) - set(exp.domains)
    if unknown:
        return ErrorView(f"unknown input(s) {sorted(unknown)}; allowed: {sorted(exp.domains)}")
    for arg, value in kwargs.items():
        domain = exp.domains[arg]
        if not domain.valid(value):
            return ErrorView(f"{domain.label or arg} must be {domain.describe()}; got {value!r}")
    try:
        return exp.func(**kwargs)
    except ValueError as err:
        return ErrorView(str(err))


# ---- the ipywidgets front end ------------------------------------------------------------


def _widget(arg: str, domain: Domain, value):
    import ipywidgets as w

    label = domain.label or arg
    style = {"description_width": "initial"}
    layout = w.Layout(width="420px")
    if isinstance(domain, Choice):
        return w.Dropdown(options=list(domain.options), value=value, description=label,
                          style=style, layout=layout)
    if isinstance(domain, Text):
        return w.Textarea(value=value, description=label, style=style, continuous_update=False,
                          layout=w.Layout(width="640px", height="5em"))
    if isinstance(domain, IntRange) and domain.log:
        options = sorted(set(domain.powers_of_two()) | {value})  # keep the notebook's exact value
        return w.SelectionSlider(options=options, value=value, description=label, style=style,
                                 layout=layout, continuous_update=False)
    if isinstance(domain, IntRange):
        return w.BoundedIntText(value=value, min=domain.low, max=domain.high, description=label,
                                style=style, layout=layout)
    return w.BoundedFloatText(value=value, min=domain.low, max=domain.high, step=domain.step,
                              description=label, style=style, layout=layout)


def explore(name: str, **initial):
    """Controls for explorer ``name`` starting at ``initial`` (the notebook's parameters), and its view."""
    import ipywidgets as w
    from IPython.display import display

    exp = get(name)
    missing = set(exp.domains) - set(initial)
    if missing:
        raise ValueError(f"explore({name!r}) needs initial values for {sorted(missing)}")
    outside = [f"{dom.label or arg} must be {dom.describe()}; got {initial[arg]!r}"
               for arg, dom in exp.domains.items() if not dom.valid(initial[arg])]
    if outside:  # no control can show this value: say so rather than clamp it or raise a TraitError
        return ErrorView("the explorer cannot start from this page's parameters: " + "; ".join(outside))
    controls = {arg: _widget(arg, dom, initial[arg]) for arg, dom in exp.domains.items()}
    out = w.Output()

    def update(_change=None):
        view = render(name, **{arg: c.value for arg, c in controls.items()})
        with out:
            out.clear_output(wait=True)
            display(view)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return w.VBox([w.HTML(f"<b>Explore:</b> <code>{html.escape(name)}</code>"),
                   w.VBox(list(controls.values())), out])
