"""Every notebook also runs, checks included, with parameters other than its defaults (papermill).

Each notebook's ``interview.variants`` metadata may list parameter sets to try; otherwise a model
and a GPU different from the defaults are substituted when the parameters cell has them.

A cell that fails is a failure. A kernel that hangs or dies (an infrastructure fault, not a wrong
number) gets one fresh kernel before the test fails, and the retry is reported as a warning. A run
far slower than usual is reported too, split into time in cells and time outside them (kernel start
and shutdown), so a stall in CI says where it was.
"""

from __future__ import annotations

import ast
import json
import time
import warnings

import pytest

from tools.kernel import is_kernel_fault
from tools.notebooks import ROOT, notebook_paths
from tools.variant import render

ALT_MODELS = ("qwen2.5-72b", "llama-3.1-8b")
ALT_GPUS = ("h200", "b200")
SLOW_RUN_S = 60  # every notebook runs in seconds; past this the run's timing is reported


def _parameters(nb: dict) -> dict:
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    values = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return values


def _variant(nb: dict) -> dict:
    declared = nb["metadata"].get("interview", {}).get("variants")
    if declared:
        return declared[0]
    params, out = _parameters(nb), {}
    if isinstance(params.get("MODEL"), str):
        out["MODEL"] = next(m for m in ALT_MODELS if m != params["MODEL"])
    if isinstance(params.get("GPU"), str):
        out["GPU"] = next(g for g in ALT_GPUS if g != params["GPU"])
    return out


CASES = []
for path in notebook_paths():
    variant = _variant(json.loads(path.read_text(encoding="utf-8")))
    if variant:
        CASES.append(pytest.param(path, variant, id=f"{path.stem}-{'-'.join(map(str, variant.values()))}"))


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_notebook_passes_its_checks_with_other_parameters(path, variant, tmp_path):
    out = tmp_path / path.name
    start = time.perf_counter()
    try:
        render(path, out, variant)
    except Exception as fault:
        if not is_kernel_fault(fault):
            raise
        warnings.warn(f"{path.name} with {variant}: kernel fault ({type(fault).__name__}: {fault}); "
                      "retrying once in a fresh kernel", stacklevel=1)
        start = time.perf_counter()
        render(path, out, variant)
    wall = time.perf_counter() - start
    nb = json.loads(out.read_text(encoding="utf-8"))
    if wall > SLOW_RUN_S:
        cells = [(c["metadata"].get("papermill", {}).get("duration") or 0.0, i) for i, c in enumerate(nb["cells"])]
        slowest, index = max(cells)
        warnings.warn(f"{path.name} with {variant} took {wall:.0f} s: {sum(d for d, _ in cells):.0f} s in cells "
                      f"(slowest: cell {index}, {slowest:.0f} s), the rest starting and stopping the kernel",
                      stacklevel=1)
    checks = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    text = "".join("".join(o.get("text", "")) for o in checks.get("outputs", []))
    assert "all checks passed" in text, f"{path.relative_to(ROOT)} with {variant}: checks did not pass"
