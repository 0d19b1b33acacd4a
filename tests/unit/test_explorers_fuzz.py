"""Every registered explorer, driven over random valid and invalid inputs: no exception escapes.

A view function must return a View for valid inputs or raise ValueError with a message; through
``lib.book.widgets.render`` the reader then sees that message, never a traceback.
"""

from __future__ import annotations

import math
import random
from xml.etree import ElementTree

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lib.book import widgets

REGISTRY = widgets.registry()
NAMES = sorted(REGISTRY)


def _valid(domain):
    if isinstance(domain, widgets.Text):  # the examples, and any text a reader might type
        return st.sampled_from(domain.examples) | st.text(max_size=80)
    if isinstance(domain, widgets.Choice):
        return st.sampled_from(domain.options)
    if isinstance(domain, widgets.IntRange):
        if domain.log:
            return st.sampled_from(domain.powers_of_two())
        return st.integers(domain.low, domain.high)
    return st.floats(domain.low, domain.high, allow_nan=False)


def _invalid(domain):
    if isinstance(domain, widgets.Text):
        return st.sampled_from([None, 0, "x" * (domain.max_chars + 1)])
    if isinstance(domain, widgets.Choice):
        return st.sampled_from(["", "nonsense", None, 0])
    bad = [0, -1, domain.low - 1, domain.high * 1000 + 1, 10**12]
    if isinstance(domain, widgets.FloatRange):
        bad += [math.inf, -math.inf, math.nan]
    return st.sampled_from(bad)


def _check(view):
    assert isinstance(view, widgets.View | widgets.ErrorView), type(view)
    if isinstance(view, widgets.ErrorView):
        assert view.message and "Traceback" not in view.message
    else:
        assert view.rows and all(isinstance(k, str) and isinstance(v, str) for k, v in view.rows)
        repr(view)
        view._repr_html_()  # the figure is drawn too: drawing errors must not escape either
        if view.figure is not None:
            ElementTree.fromstring(view.svg())  # well-formed SVG
            assert view.caption.strip(), "a figure needs its caption: one sentence saying what to look at"


def test_there_are_explorers():
    assert NAMES


def test_each_explorer_lives_in_a_module_of_its_section():
    """widgets.get imports only the section's modules, so ``section.name`` must live in
    lib/explorers/section.py or section_*.py; and a page's explorer costs its section, not the book."""
    for name, exp in REGISTRY.items():
        assert exp.func.__module__ in widgets.section_modules(name.split(".", 1)[0]), (name, exp.func.__module__)
    import subprocess
    import sys

    probe = ("import sys; from lib.book.widgets import get; get('roofline.ridge_point'); "
             "print(sorted(m for m in sys.modules if m.startswith('lib.explorers.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "scheduling" not in out and "lib.explorers.roofline" in out, out


@pytest.mark.parametrize("name", NAMES)
def test_most_random_valid_inputs_give_a_view(name):
    """A message is for inputs that cannot work; a bug caught as ValueError would turn every view into one."""
    rng = random.Random(0)
    exp = REGISTRY[name]
    views = [widgets.render(name, **{arg: dom.sample(rng) for arg, dom in exp.domains.items()}) for _ in range(30)]
    messages = sorted({v.message for v in views if isinstance(v, widgets.ErrorView)})
    assert sum(isinstance(v, widgets.View) for v in views) >= 3, messages[:3]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_valid_inputs_give_a_view_or_a_message(name, data):
    exp = REGISTRY[name]
    kwargs = {arg: data.draw(_valid(dom), label=arg) for arg, dom in exp.domains.items()}
    view = widgets.render(name, **kwargs)
    _check(view)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_invalid_inputs_give_a_message(name, data):
    exp = REGISTRY[name]
    kwargs = {arg: data.draw(_valid(dom), label=arg) for arg, dom in exp.domains.items()}
    bad_arg = data.draw(st.sampled_from(sorted(exp.domains)), label="bad argument")
    kwargs[bad_arg] = data.draw(_invalid(exp.domains[bad_arg]), label="bad value")
    if exp.domains[bad_arg].valid(kwargs[bad_arg]):
        return  # the "invalid" draw happens to be inside the domain
    _check(widgets.render(name, **kwargs))


def test_block_allocator_explorer_reports_a_partial_failure_as_partial():
    """Regression: 3 blocks of 2, a 3-token prompt, then 4 appends: three appends fit (tokens 4-6
    fill blocks 2 and 3), the fourth finds no block. The explorer once said 'nothing changed'."""
    from lib.book import widgets

    view = widgets.render("kvcache.block_allocator_ops", allocator="BlockAllocator (correct)",
                          num_blocks=3, block_size=2, prompt_tokens=3, op1="allocate A",
                          op2="append A x4", op3="-", op4="-", op5="-", op6="-")
    rows = dict(view.rows)
    assert rows["2. append A x4"].startswith("A wrote 3 of 4 (partial)"), rows["2. append A x4"]
    assert "changed nothing" in rows["2. append A x4"]
    assert rows["A: block table"].endswith("(6 tokens)")


@pytest.mark.parametrize("name", NAMES)
def test_model_and_gpu_choices_name_registry_entries(name):
    """A model or GPU a widget offers must be in data/: an option that can only be refused is a bug."""
    from lib.registry.hardware import gpu_names
    from lib.registry.models import model_names

    known = {"model": set(model_names()), "gpu": set(gpu_names())}
    for arg, dom in REGISTRY[name].domains.items():
        kind = next((k for k in known if arg == k or arg.endswith("_" + k)), None)
        if kind and isinstance(dom, widgets.Choice):
            assert set(dom.options) <= known[kind], (arg, sorted(set(dom.options) - known[kind]))
