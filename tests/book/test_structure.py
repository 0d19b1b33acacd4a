"""Every notebook follows the book's anatomy, and _toc.yml agrees with the files on disk."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import pytest

from lib.book.glue import cited_names, store_citations
from tools.notebooks import (
    DIFFICULTIES,
    KINDS,
    ROOT,
    load_bank,
    notebook_paths,
    read_info,
    section_folders,
    toc_files,
)
from tools.variants import checks_passed

SECTIONS = ["## The question", "## Try it first", "## Parameters", "## Worked answer", "## Explore",
            "## Where it breaks", "## Interviewer's notes", "## Checks", "## Related"]
NOTEBOOKS = notebook_paths()
IDS = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS]


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks under chapters/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_metadata_matches_bank_slug_and_section(path):
    info = read_info(path)
    assert info.slug == path.stem, f"metadata slug {info.slug!r} != file name {path.stem!r}"
    assert section_folders().get(info.section) == path.parent, f"section {info.section!r} != folder {path.parent.name}"
    assert info.kind in KINDS and info.difficulty in DIFFICULTIES and info.minutes > 0
    bank = load_bank()
    if bank is None:
        pytest.skip("question bank (../shared/question-bank.yaml) not beside the repo")
    entry = {q["id"]: q for q in bank["questions"]}.get(info.id)
    assert entry is not None, f"{info.id} is not in the question bank"
    assert (entry["slug"], entry["section"]) == (info.slug, info.section), f"{info.id} slug/section differ from the bank"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_anatomy(path):
    nb = _nb(path)
    cells = nb["cells"]
    md = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    positions = [md.find("\n" + s + "\n") if not md.startswith(s) else 0 for s in SECTIONS]
    missing = [s for s, p in zip(SECTIONS, positions, strict=True) if p < 0]
    assert not missing, f"missing sections: {missing}"
    assert positions == sorted(positions), "sections are out of order"
    assert _src(cells[0]).startswith("# "), "first cell must be the title"
    code = [c for c in cells if c["cell_type"] == "code"]
    params = [c for c in code if "parameters" in _tags(c)]
    assert len(params) == 1, "exactly one code cell tagged 'parameters'"
    assert any("self_check(" in _src(c) for c in code), "no self-check cell"
    explorers = [c for c in code if "explore(" in _src(c)]
    assert explorers, "no explorer cell"
    assert all("nbval-ignore-output" in _tags(c) for c in explorers), "explorer cells need nbval-ignore-output"
    for cell in cells:
        if cell["cell_type"] == "markdown" and _src(cell).lstrip().startswith(
                ("## Worked answer", "## Where it breaks", "## Interviewer's notes", "## Checks")):
            assert cell["metadata"].get("jp-MarkdownHeadingCollapsed"), \
                f"{_src(cell).splitlines()[0]!r} must open collapsed in JupyterLab (run ./book execute)"
    checks = code[-1]
    assert "remove-cell" in _tags(checks), "the last code cell is the checks cell, tagged remove-cell"
    src = _src(checks)
    assert re.search(r"\bChecks\(headlines=\(?[\"']", src), "the checks cell builds Checks(headlines=(...)) (lib.book.verify)"
    assert re.search(r"\.done\(\)\s*$", src), "the checks cell ends with checks.done()"
    assert re.search(r"\.(anchor|independent)\(", src), "the checks cell needs an anchor or an independent method"


def _glued_names(cells: list[dict]) -> set[str]:
    """Names the stored outputs glued (myst-nb records each under metadata.scrapbook.name)."""
    return {out.get("metadata", {}).get("scrapbook", {}).get("name")
            for c in cells if c["cell_type"] == "code" for out in c.get("outputs", [])} - {None}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_glue_defined_and_cited(path):
    cells = _nb(path)["cells"]
    prose = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    assert "{glue:" not in prose, "cite glued texts as {eval}`glued.NAME` (JupyterLab cannot render {glue:text})"
    cited = set(cited_names(prose))
    defined = _glued_names(cells)
    assert cited, "prose cites no glued number"
    assert not cited - defined, f"cited but never glued: {sorted(cited - defined)}"
    assert not defined - cited, f"glued but never cited: {sorted(defined - cited)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_citations_stored_for_jupyterlab(path):
    """Each markdown cell stores the texts its citations show (so Lab shows numbers before a run),
    equal to the glued texts of the stored run; and the notebook imports ``glued`` itself."""
    nb = _nb(path)
    want = copy.deepcopy(nb)
    store_citations(want)
    for have_cell, want_cell in zip(nb["cells"], want["cells"], strict=True):
        assert have_cell["metadata"].get("user_expressions") == want_cell["metadata"].get("user_expressions"), (
            f"stale citation texts in markdown cell {_src(have_cell)[:60]!r}: run ./book execute")
    imports = [c for c in nb["cells"] if c["cell_type"] == "code" and re.search(
        r"from lib\.book\.glue import [^\n]*\bglued\b", _src(c))]
    assert imports, "the notebook never imports glued (from lib.book.glue import glue, glued)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_outputs_stored_without_errors(path):
    nb = _nb(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "unexecuted code cells: run ./book execute"
    for c in code:
        for out in c.get("outputs", []):
            assert out["output_type"] != "error", f"error output in cell: {_src(c)[:80]}"
            assert "Traceback" not in "".join(out.get("text", "")), "traceback printed in a cell"
    assert "widgets" in nb["metadata"], "widget state not stored: run ./book execute"
    assert checks_passed(nb), "the checks cell did not print its passing summary: run ./book execute"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_cell_ends_in_a_bare_glue_or_semicolon(path):
    # nbval does not honour a trailing ";", so such a cell shows a raw value under nbval only.
    for cell in _nb(path)["cells"]:
        lines = [ln for ln in _src(cell).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if cell["cell_type"] != "code" or not lines:
            continue
        last = lines[-1].rstrip()
        assert not last.endswith(";"), f"cell ends with ';': {last}"
        assert not re.match(r"glue\(", last), f"cell ends with a bare glue(...): {last} (end with show(...))"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_code_reads_glued_text_not_the_widget(path):
    # glued.NAME is a live widget for the prose; code that tests a glued sentence reads lib.book.glue.text(NAME).
    for cell in _nb(path)["cells"]:
        if cell["cell_type"] == "code":
            hit = re.search(r"(str|repr|format)\(glued\.\w+|f\"[^\"]*\{glued\.\w+", _src(cell))
            assert not hit, f"code reads a glue widget: {hit.group(0)!r}; use lib.book.glue.text(name)"


FIGURE_MIMES = ("image/svg+xml", "image/png")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_static_figures_have_a_caption(path):
    """A static figure (a code cell whose stored outputs hold an SVG or PNG, not an explorer cell tagged
    nbval-ignore-output) is followed by a markdown cell starting with ``*Figure.*``: the sentence that
    says what to look at in it (an explorer's figure carries its caption in its View)."""
    cells = _nb(path)["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or "nbval-ignore-output" in _tags(cell):
            continue
        if not any(mime in out.get("data", {}) for out in cell.get("outputs", []) for mime in FIGURE_MIMES):
            continue
        following = cells[i + 1] if i + 1 < len(cells) else None
        assert following is not None and following["cell_type"] == "markdown" and \
            _src(following).lstrip().startswith("*Figure.*"), (
                f"the figure of the code cell {_src(cell)[:80]!r} needs a caption right after it: a markdown cell "
                "starting with '*Figure.*' and saying what to look at")


def test_toc_and_files_agree():
    listed = set(toc_files())
    on_disk = {p.relative_to(ROOT).with_suffix("").as_posix() for p in NOTEBOOKS}
    on_disk |= {p.relative_to(ROOT).with_suffix("").as_posix() for p in (ROOT / "chapters").glob("*/index.md")}
    assert not on_disk - listed, f"in chapters/ but not in _toc.yml: {sorted(on_disk - listed)}"
    assert not {f for f in listed if f.startswith("chapters/")} - on_disk, "in _toc.yml but missing on disk"


def test_each_notebook_id_is_unique():
    ids = [read_info(p).id for p in NOTEBOOKS]
    assert len(ids) == len(set(ids)), "two notebooks claim the same question id"


def test_interviewer_indexes_are_current():
    from tools.indexes import main

    assert main(["--check"]) == 0, "a generated page is stale (the indexes, intro.md's section list or a reading order): run python -m tools.indexes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_glue_name_is_glued_once(path):
    """The book build refuses a glue key stored twice; say which, before the build does."""
    names = [out.get("metadata", {}).get("scrapbook", {}).get("name")
             for c in _nb(path)["cells"] if c["cell_type"] == "code" for out in c.get("outputs", [])]
    names = [n for n in names if n is not None]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"glued more than once: {dupes}"


# ---- declared domains and variants -----------------------------------------------------------


def _parameter_names(cell: dict) -> list[str]:
    names = []
    for node in ast.parse(_src(cell)).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                names += [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def _explore_inputs(code: list[dict]) -> tuple[str | None, dict[str, str]]:
    """The explorer a notebook starts and {explorer input: parameter} for inputs passed a bare parameter."""
    for cell in code:
        for node in ast.walk(ast.parse(_src(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "explore":
                passed = {k.arg: k.value.id for k in node.keywords if isinstance(k.value, ast.Name)}
                return node.args[0].value, passed
    return None, {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_domain_declared_and_one_with_the_explorer(path):
    from lib.book.domain import notebook_domain
    from lib.book.widgets import get
    from tools.variants import defaults

    nb = _nb(path)
    meta = nb["metadata"]["interview"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    params = next(c for c in code if "parameters" in _tags(c))
    names = _parameter_names(params)
    tuples = [n for n in ast.parse(_src(params)).body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Tuple)]
    assert not tuples, "one assignment per line in the parameters cell: papermill cannot inject `A, B = ...`"
    domain = notebook_domain(path.stem)
    assert sorted(domain) == sorted(names), \
        f"interview.domain must declare exactly the parameters: missing {sorted(set(names) - set(domain))}, " \
        f"extra {sorted(set(domain) - set(names))}"
    import papermill

    unseen = sorted(set(names) - set(papermill.inspect_notebook(str(path))))
    assert not unseen, f"papermill cannot parse the parameter line(s) of {unseen} (a comment with = or <= ?)"
    values = defaults(path)
    outside = {n: values[n] for n in names if n in values and not domain[n].valid(values[n])}
    assert not outside, f"defaults outside the declared domain: {outside}"
    following = code[code.index(params) + 1]
    assert f'accept_parameters("{path.stem}", globals())' in _src(following), \
        "the cell after the parameters must call accept_parameters(<slug>, globals())"
    name, passed = _explore_inputs(code)
    assert meta.get("explorer") == name, f"interview.explorer must name the explorer the page starts ({name})"
    exp = get(name)
    for arg, param in passed.items():
        if param in domain:
            assert domain[param].within(exp.domains[arg]), \
                f"{param}'s domain is wider than explorer input {arg!r} ({exp.domains[arg].describe()}): " \
                f"declare it \"explorer:{arg}\" or narrow it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_two_variants_inside_the_domain(path):
    from lib.book.domain import declared_variants, notebook_domain
    from tools.variants import defaults

    variants = declared_variants(path.stem)
    assert len(variants) >= 2, "interview.variants needs at least two parameter sets far from the defaults"
    domain, base = notebook_domain(path.stem), defaults(path)
    for v in variants:
        assert set(v) <= set(domain), f"variant {v} sets undeclared parameters"
        bad = {k: x for k, x in v.items() if not domain[k].valid(x)}
        assert not bad, f"variant {v}: outside the domain: {bad}"
        assert any(base.get(k) != x for k, x in v.items()), f"variant {v} is the defaults"
    assert len({json.dumps(v, sort_keys=True) for v in variants}) == len(variants), "duplicate variants"
