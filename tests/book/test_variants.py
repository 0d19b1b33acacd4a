"""Every notebook also runs, checks included, with parameters other than its defaults (papermill's
injection; one kernel per test worker runs them in turn, reset between notebooks).

Each notebook's ``interview.variants`` metadata lists at least two parameter sets inside its
declared domain, far from the defaults (another vendor, an MoE or MLA model, another dtype or TP);
the structure test holds them to that. ``./book variants --sweep`` draws many more outside CI.

A cell that fails is a failure. A kernel that hangs or dies (an infrastructure fault, not a wrong
number) gets one fresh kernel before the test fails, and the retry is reported as a warning. A run
far slower than usual is reported too, split into time in cells and time outside them (kernel start
and shutdown), so a stall in CI says where it was.
"""

from __future__ import annotations

import json
import time
import warnings

import pytest

from lib.book.domain import declared_variants
from tools.kernel import is_kernel_fault
from tools.notebooks import ROOT, notebook_paths
from tools.variant import SharedKernel
from tools.variants import checks_passed

SLOW_RUN_S = 60  # every notebook runs in seconds; past this the run's timing is reported

CASES = [
    pytest.param(path, variant, id=f"{path.stem}-{'-'.join(map(str, variant.values()))}")
    for path in notebook_paths()
    for variant in declared_variants(path.stem)
]


@pytest.fixture(scope="module")
def kernel():
    """One kernel per test worker, shared by its variant runs (tools.variant.SharedKernel)."""
    shared = SharedKernel()
    yield shared
    shared.close()


def _cell_seconds(cell: dict) -> float:
    timing = cell["metadata"].get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    from datetime import datetime

    return (datetime.fromisoformat(end.rstrip("Z")) - datetime.fromisoformat(start.rstrip("Z"))).total_seconds()


@pytest.mark.parametrize(("path", "variant"), CASES)
def test_notebook_passes_its_checks_with_other_parameters(path, variant, tmp_path, kernel):
    out = tmp_path / path.name
    start = time.perf_counter()
    try:
        kernel.render(path, out, variant)
    except Exception as fault:
        if not is_kernel_fault(fault):
            raise
        warnings.warn(f"{path.name} with {variant}: kernel fault ({type(fault).__name__}: {fault}); "
                      "retrying once in a fresh kernel", stacklevel=1)
        start = time.perf_counter()
        kernel.render(path, out, variant)
    wall = time.perf_counter() - start
    nb = json.loads(out.read_text(encoding="utf-8"))
    if wall > SLOW_RUN_S:
        cells = [(_cell_seconds(c), i) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
        slowest, index = max(cells)
        warnings.warn(f"{path.name} with {variant} took {wall:.0f} s: {sum(d for d, _ in cells):.0f} s in cells "
                      f"(slowest: cell {index}, {slowest:.0f} s), the rest in the kernel's start or reset",
                      stacklevel=1)
    injected = "".join(next(c["source"] for c in nb["cells"]
                            if "injected-parameters" in c["metadata"].get("tags", [])))
    missing = [k for k in variant if f"{k} = " not in injected]
    assert not missing, f"papermill did not inject {missing}"
    assert checks_passed(nb), f"{path.relative_to(ROOT)} with {variant}: checks did not pass"
