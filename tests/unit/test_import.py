"""`import lib` stays light: no torch, matplotlib, triton or ipywidgets at import time.

(The 150 ms budget itself is measured by the benchmark command, not by a timed test.)
"""

import subprocess
import sys

HEAVY = ("torch", "matplotlib", "triton", "ipywidgets")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in out.split()}


def test_import_lib_loads_nothing_heavy():
    loaded = _loaded_after("import lib")
    assert not loaded & set(HEAVY + ("numpy", "yaml")), loaded & set(HEAVY + ("numpy", "yaml"))


def test_core_modules_defer_plotting_and_widgets():
    loaded = _loaded_after("import lib.perf.roofline, lib.registry.models, lib.registry.hardware, lib.book.widgets, lib.book.check, lib.units")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_every_lib_package_is_installed():
    """pyproject.toml lists its packages explicitly: a new lib subpackage missing there imports from
    the repository (editable install) but not from an installed copy (a hub image)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "lib").rglob("__init__.py")}
    assert found == listed, f"missing from pyproject.toml: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
