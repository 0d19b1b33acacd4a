"""Every check of the book, in order; exits non-zero if any step fails (all steps still run).

1. lint (ruff) over lib, tools, tests and the notebooks
2. lib unit and property tests (pytest tests/unit)
3. strict nbval over every notebook (outputs compared; volatile text sanitized)
4. the book build with warnings as errors, from stored outputs
5. book tests: structure of every notebook, _toc.yml vs files, offline HTML, other parameters
6. browser tests: the built book and JupyterLab in Debian's Chromium (Playwright)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from tools.notebooks import ROOT

PY = sys.executable


def steps() -> list[tuple[str, list[str]]]:
    pytest = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return [
        ("lint", [PY, "-m", "ruff", "check", "lib", "tools", "tests", "chapters", "_ext"]),
        ("lib tests", pytest + ["tests/unit"]),
        ("nbval (strict)", pytest + ["--nbval", "chapters", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
                                     "-n", "2", "--dist", "loadfile"]),
        ("book build", [str(ROOT / ".venv" / "bin" / "jupyter-book"), "build", ".", "-W", "-n",
                        "--keep-going", "--quiet"]),
        ("book tests", pytest + ["tests/book", "-n", "2"]),
        ("browser tests", pytest + ["tests/browser"]),
    ]


def main() -> int:
    os.chdir(ROOT)
    env = {**os.environ, "MPLBACKEND": "Agg", "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    shutil.rmtree(ROOT / "_build" / "html", ignore_errors=True)
    shutil.rmtree(ROOT / "_build" / ".doctrees", ignore_errors=True)
    results = []
    for name, cmd in steps():
        print(f"\n=== {name}: {' '.join(cmd[2:] if cmd[0] == PY else cmd)}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(cmd, env=env)
        results.append((name, code, time.perf_counter() - start))
    print("\n=== summary")
    for name, code, seconds in results:
        print(f"  {'ok  ' if code == 0 else 'FAIL'}  {name:<16} {seconds:6.1f} s")
    failed = [n for n, c, _ in results if c != 0]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
