"""Every check of the book, in order; exits non-zero if any step fails (all steps still run).

1. lint (ruff) over lib, tools, tests and the notebooks
2. lib unit and property tests (pytest tests/unit)
3. strict nbval over every notebook (outputs compared; volatile text sanitized)
4. the book build with warnings as errors, from stored outputs
5. book tests: structure of every notebook, _toc.yml vs files, offline HTML, other parameters
6. browser tests: the built book and JupyterLab in Debian's Chromium (Playwright)

Each step has a wall-clock limit (several times what it takes on a 2-core machine): a step that
hangs is killed with everything it started, reported as timed out, and the next step still runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from tools.kernel import CELL_TIMEOUT_S
from tools.notebooks import ROOT

PY = sys.executable


def steps() -> list[tuple[str, list[str], int]]:
    """(name, command, limit in seconds) for each step, in order."""
    pytest = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return [
        ("lint", [PY, "-m", "ruff", "check", "lib", "tools", "tests", "chapters", "_ext"], 120),
        ("lib tests", pytest + ["tests/unit", "-n", "2", "--durations=5"], 900),
        ("nbval (strict)", pytest + ["--nbval", "chapters", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
                                     "--nbval-cell-timeout", str(CELL_TIMEOUT_S), "-n", "2", "--dist", "loadfile", "--durations=5"], 900),
        ("book build", [str(ROOT / ".venv" / "bin" / "jupyter-book"), "build", ".", "-W", "-n",
                        "--keep-going", "--quiet"], 900),
        ("book tests", pytest + ["tests/book", "-n", "2", "--durations=5"], 900),
        ("browser tests", pytest + ["tests/browser", "--durations=5"], 900),
    ]


def step_env() -> dict:
    """The environment every step runs in: headless matplotlib, the CI hypothesis profile."""
    return {**os.environ, "MPLBACKEND": "Agg", "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}


def run_step(cmd: list[str], env: dict, limit_s: int) -> int:
    """Run ``cmd`` in its own process group; past ``limit_s`` kill the whole group and return 124."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        print(f"\n!!! timed out after {limit_s} s: killing the step and everything it started", flush=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124


def clean_build() -> None:
    """Remove the built book so the build step builds every page (an incremental build would skip its checks)."""
    shutil.rmtree(ROOT / "_build" / "html", ignore_errors=True)
    shutil.rmtree(ROOT / "_build" / ".doctrees", ignore_errors=True)


def main() -> int:
    os.chdir(ROOT)
    env = step_env()
    clean_build()
    results = []
    for name, cmd, limit_s in steps():
        print(f"\n=== {name}: {' '.join(cmd[2:] if cmd[0] == PY else cmd)}", flush=True)
        start = time.perf_counter()
        code = run_step(cmd, env, limit_s)
        results.append((name, code, time.perf_counter() - start))
    print("\n=== summary")
    for name, code, seconds in results:
        status = "ok  " if code == 0 else "TIME" if code == 124 else "FAIL"
        print(f"  {status}  {name:<16} {seconds:6.1f} s")
    failed = [n for n, c, _ in results if c != 0]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
