"""lib.book.domain (declared domains, refusals) and lib.book.verify (labelled checks)."""

from __future__ import annotations

import random

import pytest

from lib.book import domain as d
from lib.book.verify import Checks


def test_parse_each_spec_kind():
    explorer = {"model": d.Choice(("a", "b")), "tp": d.IntRange(1, 8, log=True)}
    assert d.parse("explorer", explorer, "MODEL") is explorer["model"]
    assert d.parse("explorer:tp", explorer, "TENSOR") is explorer["tp"]
    assert d.parse({"int": [1, 4], "log": True}) == d.IntRange(1, 4, log=True)
    assert d.parse({"real": [0, 1], "or_none": True}).valid(None)
    assert d.parse({"bool": True}).valid(False) and not d.parse({"bool": True}).valid(0)
    lst = d.parse({"list": {"int": [1, 9]}, "len": [1, 3]})
    assert lst.valid([1, 2]) and lst.valid((9,)) and not lst.valid([]) and not lst.valid([1, 2, 3, 4])
    assert "qwen2.5-72b" in d.parse({"choice": "models"}).options
    moe = d.parse({"choice": "models", "kind": "moe"}).options
    assert "mixtral-8x7b" in moe and "llama-3.1-70b" not in moe
    assert "mi300x" in d.parse({"choice": "gpus"}).options
    with pytest.raises(ValueError, match="no input 'batch'"):
        d.parse("explorer", explorer, "BATCH")
    with pytest.raises(ValueError, match="unknown keys"):
        d.parse({"int": [1, 2], "logg": True}, name="X")


def test_domains_refuse_lookalike_types():
    assert not d.IntRange(0, 9).valid(True) and not d.IntRange(0, 9).valid(4.0)
    assert not d.Choice((1, 2)).valid(True)
    assert d.Choice((12.5, 25.0)).valid(25) and not d.Choice((12.5, 25.0)).valid(True)
    assert not d.Choice((1, 2)).valid(2.0)  # an int option stays an int
    assert not d.FloatRange(0, 1).valid(float("nan"))


def test_samples_are_valid_and_within_is_a_subset_test():
    rng = random.Random(0)
    doms = [d.Choice(("x", "y")), d.IntRange(1, 64, log=True), d.IntRange(3, 9), d.FloatRange(0.1, 0.9),
            d.Flag(), d.ListOf(d.IntRange(1, 5), 1, 4), d.OrNone(d.FloatRange(0, 1))]
    for dom in doms:
        assert all(dom.valid(dom.sample(rng)) for _ in range(50)), dom
    assert d.Choice(("x",)).within(d.Choice(("x", "y"))) and not d.Choice(("z",)).within(d.Choice(("x",)))
    assert d.IntRange(2, 4).within(d.IntRange(1, 8)) and not d.IntRange(2, 16).within(d.IntRange(1, 8))


def test_distinct_lists_never_repeat_an_item():
    rng = random.Random(1)
    gens = d.parse({"list": {"choice": ["a100", "h100", "h200", "b200"]}, "len": [2, 4], "distinct": True})
    draws = [gens.sample(rng) for _ in range(200)]
    assert all(gens.valid(x) and len(set(x)) == len(x) for x in draws)
    assert not gens.valid(["h100", "h100"]) and gens.valid(["h100", "h200"])
    assert "distinct" in gens.describe()
    plain = d.parse({"list": {"choice": ["a100", "h100", "h200", "b200"]}, "len": [2, 4]})
    assert plain.valid(["h100", "h100"]) and gens.within(plain) and not plain.within(gens)
    reals = d.ListOf(d.FloatRange(0.0, 1.0), 2, 3, distinct=True)
    assert all(reals.valid(reals.sample(rng)) for _ in range(50))
    with pytest.raises(ValueError, match="'distinct' must be true or false"):
        d.parse({"list": {"int": [1, 4]}, "distinct": "yes"}, name="X")


def test_accept_parameters_names_every_bad_value(monkeypatch):
    monkeypatch.setattr(d, "notebook_domain", lambda slug: {"TP": d.IntRange(1, 8), "GPU": d.Choice(("h100",))})
    d.accept_parameters("x", {"TP": 2, "GPU": "h100"})
    with pytest.raises(d.ParameterError) as err:
        d.accept_parameters("x", {"TP": 16})
    message = str(err.value)
    assert "TP must be an integer from 1 to 8; got 16" in message and "GPU is not set" in message
    assert err.value._render_traceback_()[0].endswith(message)  # IPython shows the message, no traceback


def test_refusing_turns_value_errors_into_parameter_errors():
    with pytest.raises(d.ParameterError, match="does not answer for these parameters: tp must divide"):
        with d.refusing():
            raise ValueError("tp must divide 8 KV heads")
    with pytest.raises(KeyError):
        with d.refusing():
            raise KeyError("a bug is not a refusal")


def test_every_notebook_domain_parses():
    from tools.notebooks import notebook_paths

    for path in notebook_paths():
        assert d.notebook_domain(path.stem), path.stem


def test_checks_pass_and_count_kinds(capsys):
    c = Checks(headlines=("floor",))
    c.anchor("floor vs datasheet", 5.19, 5.2, source="NVIDIA", rel_tol=0.01, covers="floor")
    c.anchor("only at defaults", 1, 2, source="paper", applies=False)
    c.independent("second method", 2.0, 2.0 + 1e-12, method="brute force")
    c.internal("sum adds up", True)
    c.prose("'FP8 halves the floor' holds", True)
    line = c.done()
    assert line.startswith("all 4 checks passed (1 published anchors, 1 independent methods, "
                           "1 internal consistency, 1 prose claims)")
    assert "1 anchor(s) for the published setup skipped" in line and "headlines covered: floor" in line
    assert capsys.readouterr().out.strip() == line


def test_checks_fail_loudly():
    c = Checks(headlines=("floor", "total"))
    c.anchor("floor", 5.0, 6.0, source="x", rel_tol=0.01, covers="floor")
    c.internal("identity", False)
    c.independent("nan never passes", float("nan"), 1.0, method="m")
    with pytest.raises(AssertionError) as err:
        c.done()
    text = str(err.value)
    assert "[anchor] floor: got 5" in text and "[internal] identity" in text and "nan never passes" in text
    assert "headline 'total' has no anchor or independent check that ran" in text
    assert "headline 'floor'" in text  # its only check failed


def test_internal_checks_alone_do_not_pass():
    c = Checks()
    c.internal("identity", True)
    with pytest.raises(AssertionError, match="no anchor or independent check ran"):
        c.done()
    with pytest.raises(ValueError, match="not headlines"):
        Checks(headlines=("a",)).independent("x", 1, 1, method="m", covers="b")
    with pytest.raises(ValueError, match="needs its source"):
        Checks().anchor("x", 1, 1, source="")


# ---- lib.book.practice --------------------------------------------------------------------

from lib.book.practice import Case, grade, shrink  # noqa: E402


class _Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)

    def pop(self):
        return self.items.pop()


class _BuggyStack(_Stack):
    def pop(self):  # wrong once there are three items
        return self.items.pop(0) if len(self.items) >= 3 else self.items.pop()


class _Skeleton:
    def push(self, x):
        raise NotImplementedError


def _run_stack(stack, ops):
    model = []
    for op, *arg in ops:
        if op == "push":
            stack.push(arg[0])
            model.append(arg[0])
        elif model:
            got, want = stack.pop(), model.pop()
            assert got == want, f"pop returned {got}, expected {want}"


CASES = [Case("mixed", tuple([("push", i) for i in range(6)] + [("pop",)] * 6))]


def test_grade_reports_pass_not_implemented_and_a_shrunk_failure():
    assert grade("stack", _Stack, CASES, _run_stack).passed
    todo = grade("stack", _Skeleton, CASES, _run_stack)
    assert todo.status == "not implemented" and "`push`" in repr(todo)
    bad = grade("stack", _BuggyStack, CASES, _run_stack)
    assert bad.status == "failed" and "shrunk to 4 operation(s)" in bad.failure, bad.failure
    assert "pop returned 3, expected 5" in bad.failure
    crash = grade("stack", lambda: None, CASES, _run_stack)
    assert crash.status == "failed" and "AttributeError" in crash.failure


def test_shrink_is_one_minimal():
    def fails(ops):
        return 3 in ops and 7 in ops

    assert shrink(list(range(10)), fails) == [3, 7]
    with pytest.raises(ValueError, match="class or a factory"):
        grade("x", 3, CASES, _run_stack)


def test_explore_refuses_a_start_outside_its_domain_with_a_message():
    from lib.book.widgets import ErrorView, explore

    start = dict(gpu="h100-sxm", dtype="bf16", m=1, m_prefill=4096, n=8, k=8)
    assert not isinstance(explore("roofline.ridge_point", **start), ErrorView)
    for arg, bad in (("dtype", "int3"), ("m", 10**6), ("gpu", "tpu-v5")):
        view = explore("roofline.ridge_point", **{**start, arg: bad})
        assert isinstance(view, ErrorView) and repr(bad) in view.message, (arg, view)


def test_text_domain_and_a_typed_program_in_the_explorer():
    from lib.book.widgets import ErrorView, render

    dom = d.parse({"text": 50})
    assert dom.valid("allocate(seq=0, tokens=[0])") and not dom.valid("x" * 51) and not dom.valid(3)
    base = dict(allocator="BlockAllocator (correct)", num_blocks=3, block_size=2, prompt_tokens=3,
                op1="allocate A", op2="-", op3="-", op4="-", op5="-", op6="-")
    view = render("kvcache.block_allocator_ops", **base, program="allocate(seq=0, tokens=[0, 1, 2]); "
                  "append(seq=0, token=3); append(seq=0, token=4); append(seq=0, token=5); append(seq=0, token=6)")
    assert dict(view.rows)["program"] == "partial: 4 of 5 ops took effect"
    bad = render("kvcache.block_allocator_ops", **base, program="allocat(seq=0)")
    assert isinstance(bad, ErrorView) and "op must look like" in bad.message
