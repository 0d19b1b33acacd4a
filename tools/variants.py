"""Run notebooks under many parameter sets drawn from their declared domains (outside CI).

    ./book variants                       every notebook's declared variants (what CI runs)
    ./book variants --sweep 20            20 random draws per notebook from its domain
    ./book variants ridge-point --sweep 50 --seed 3

A draw changes one to three parameters of the defaults to random values from the domain
(``interview.domain``). Each run ends as ``passed`` (the checks cell printed its summary),
``refused`` (the page stopped at its parameters with a ParameterError: a combination the page
says it does not answer, e.g. a model that does not fit) or ``FAILED`` (any other error: a bug).
Exits non-zero when anything failed; failed copies are kept in variants/sweep/.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
from collections import Counter

from lib.book.domain import Text, declared_variants, notebook_domain
from tools.execute import resolve
from tools.kernel import is_kernel_fault
from tools.notebooks import ROOT, notebook_paths
from tools.variant import render

PASSED = re.compile(r"all \d+ checks passed")  # the line lib.book.verify.Checks.done() prints


def checks_passed(nb: dict) -> bool:
    """Whether an executed notebook's checks cell (its last code cell) printed the passing summary."""
    checks = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    return bool(PASSED.search("".join("".join(o.get("text", "")) for o in checks.get("outputs", []))))
OUT = ROOT / "variants" / "sweep"


def defaults(path) -> dict:
    """The parameters cell's values (literals only)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    values = {}
    for node in ast.parse("".join(cell["source"])).body:
        if isinstance(node, ast.Assign):
            for target, value in _pairs(node.targets[0], node.value):
                try:
                    values[target] = ast.literal_eval(value)
                except ValueError:
                    pass
    return values


def _pairs(target, value):
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from _pairs(t, v)


def draw(path, rng: random.Random) -> dict:
    """One to three parameters changed to random values of their domains."""
    domain = notebook_domain(path.stem)
    base = defaults(path)
    names = sorted(n for n, dom in domain.items() if not (isinstance(dom, Text) and not dom.examples))
    changed = {}
    for name in rng.sample(names, min(len(names), rng.randint(1, 3))):
        for _ in range(10):
            value = domain[name].sample(rng)
            if value != base.get(name):
                changed[name] = value
                break
    return changed


def run(path, params: dict, tag: str) -> tuple[str, str]:
    """Execute one variant: ('passed' | 'refused' | 'FAILED', detail)."""
    import papermill

    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{path.stem}--{tag}.ipynb"
    try:
        render(path, out, params)
    except papermill.PapermillExecutionError as err:
        if err.ename == "ParameterError":
            out.unlink(missing_ok=True)
            return "refused", err.evalue
        return "FAILED", f"{err.ename}: {err.evalue} (cell {err.exec_count}; copy in {out.relative_to(ROOT)})"
    except Exception as err:
        if not is_kernel_fault(err):
            raise
        return "FAILED", f"kernel fault: {err}"
    if not checks_passed(json.loads(out.read_text(encoding="utf-8"))):
        return "FAILED", f"the checks cell printed no summary (copy in {out.relative_to(ROOT)})"
    out.unlink()
    return "passed", ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="./book variants", description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", help="paths or slugs (default: all)")
    ap.add_argument("--sweep", type=int, default=0, metavar="N", help="N random draws per notebook")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    paths = resolve(args.notebooks) if args.notebooks else notebook_paths()
    tally: Counter = Counter()
    for path in paths:
        rng = random.Random(f"{args.seed}:{path.stem}")
        runs = ([draw(path, rng) for _ in range(args.sweep)] if args.sweep
                else declared_variants(path.stem))
        for i, params in enumerate(runs):
            outcome, detail = run(path, params, f"{args.seed}-{i}")
            tally[outcome] += 1
            print(f"{outcome:8} {path.stem} {params}" + (f"\n         {detail}" if outcome != "passed" else ""),
                  flush=True)
    print(", ".join(f"{n} {k}" for k, n in sorted(tally.items())))
    return 1 if tally["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
