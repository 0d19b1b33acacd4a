"""Benchmark the book against the performance budgets of the design notes; exit 1 when over.

    ./book bench [--samples N] [--skip-notebooks] [--skip-build] [--ci [--fresh-clone]]

Measures: `import lib` (fresh interpreter, best of 5); every registered explorer's update latency
over seeded random valid inputs (p50 and p95, lib compute and figure rendering separately);
every notebook's execution time (serial, one fresh kernel each); the strict nbval run of all of
them exactly as `./book test` runs it (two workers), projected to the 218 questions of the bank:
the budget of the design notes is for that run; and the book build time from stored outputs.
``--ci`` also times every step of ``./book test`` and projects the whole run to 218 notebooks
(every step but lint grows with the notebooks); ``--fresh-clone`` adds the environment set-up of a
fresh clone (``./book setup`` in a temporary clone). Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.notebooks import ROOT, notebook_paths

BUDGET_IMPORT_S = 0.150
BUDGET_EXPLORER_S = 0.100
BUDGET_NOTEBOOK_MEDIAN_S = 3.0  # design notes: median notebook at most 3 s in a fresh kernel
BUDGET_NOTEBOOK_MAX_S = 8.0  # ... none over 8 s
BUDGET_ALL_NOTEBOOKS_S = 360.0  # strict nbval of 218 notebooks under 6 minutes on 2 cores
BUDGET_CI_S = 1800.0  # the whole test command from a fresh clone, projected to 218, under 30 minutes
FIXED_STEPS = ("lint", "setup (fresh clone)")  # the browser step grows by its page checks; the rest in proportion
QUESTIONS_IN_BANK = 218


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_import() -> float:
    best = float("inf")
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import lib; "
                              "print(time.perf_counter() - t)"], capture_output=True, text=True, check=True)
        best = min(best, float(out.stdout))
    return best


def bench_explorers(samples: int, seed: int = 0) -> tuple[float, list[tuple[str, float, float, float, float, float, float]]]:
    """(matplotlib import seconds, rows). Per explorer: the first draw (which builds its persistent
    figure), then over ``samples`` further random inputs that give a view (invalid combinations,
    answered by a message, are skipped) the median compute, the median render (the warm figure
    updated in place and rendered to SVG, as on every widget change in a live session), and p50
    and p95 of their sum; and p95 of this process's CPU time for the same (which other processes
    on the machine barely change, unlike the wall-clock times). Each explorer's figure is freed
    before the next one is measured, as a kernel holds one notebook's explorers, not all of them."""
    from lib.book import figures, widgets

    t = time.perf_counter()
    with figures.style():  # import matplotlib once, outside every explorer's timings
        from matplotlib.backends import backend_svg  # noqa: F401
    t_import = time.perf_counter() - t
    rng = random.Random(seed)
    rows = []
    for name, exp in sorted(widgets.registry().items()):
        gc.collect()  # a live kernel holds one notebook's explorers, not every figure measured so far
        compute, render, cpu, first, lives = [], [], [], None, set()
        for _ in range(samples * 50):
            if len(compute) == samples:
                break
            kwargs = {arg: dom.sample(rng) for arg, dom in exp.domains.items()}
            c0, t0 = time.process_time(), time.perf_counter()
            view = widgets.render(name, **kwargs)
            t1 = time.perf_counter()
            if not isinstance(view, widgets.View):
                continue
            view._repr_html_()
            t2, c2 = time.perf_counter(), time.process_time()
            if view.figure is not None and getattr(view.figure, "live", None) is not None:
                lives.add(view.figure.live)
            if first is None:
                first = t2 - t0
                continue
            compute.append(t1 - t0)
            render.append(t2 - t1)
            cpu.append(c2 - c0)
        for live in lives:  # free this explorer's persistent figure before the next one is measured
            live.reset()
        if not compute:
            raise SystemExit(f"explorer {name}: no random input gave a view; check its domains")
        total = [c + r for c, r in zip(compute, render, strict=True)]
        rows.append((name, first, statistics.median(compute), statistics.median(render), _pct(total, 0.5),
                     _pct(total, 0.95), _pct(cpu, 0.95)))
    return t_import, rows


def bench_notebooks() -> list[tuple[str, float]]:
    import shutil

    from tools.execute import execute

    rows = []
    for path in notebook_paths():
        copy = path.parent / f".bench-{path.name}"  # executed in its own folder, like the original
        shutil.copy(path, copy)
        try:
            rows.append((path.relative_to(ROOT).as_posix(), execute(copy)))
        finally:
            copy.unlink(missing_ok=True)
    return rows


def bench_nbval() -> tuple[float, bool]:
    """(seconds, passed) of the strict nbval step of ./book test, the same command (two workers)."""
    from tools.run_tests import step_env, steps

    (cmd,) = [cmd for name, cmd, _ in steps() if name.startswith("nbval")]
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=step_env())
    if done.returncode != 0:  # say which notebooks failed, not only that the step did
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        print("\n".join(failed or done.stdout.splitlines()[-20:]), file=sys.stderr)
    return time.perf_counter() - t, done.returncode == 0


PER_PAGE_TEST = "test_page_loads_offline_without_errors"  # the browser step's only test that runs once per page


def _per_page_seconds(junit: Path) -> float:
    """Seconds the browser step spent in its per-page checks (the rest, JupyterLab's tests and the browser's
    start, does not grow with the notebooks), from pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    if not junit.is_file():
        return 0.0
    return sum(float(case.get("time", 0)) for case in ET.parse(junit).iter("testcase")
               if case.get("name", "").startswith(PER_PAGE_TEST))


def bench_ci(fresh_clone: bool) -> list[tuple[str, float, bool, float]]:
    """(step, seconds, passed, seconds that grow with the notebooks) for each step of ./book test, run as it
    runs them; with ``fresh_clone``, first the environment set-up of a fresh clone. Set-up and lint are fixed;
    the browser step grows by its per-page checks only; every other step grows in proportion."""
    import shutil
    import tempfile

    from tools.run_tests import clean_build, step_env, steps

    rows = []
    clean_build()  # as ./book test does: the build step builds every page, not only what changed
    if fresh_clone:
        tmp = Path(tempfile.mkdtemp(prefix="book-clone-"))
        try:
            subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "book")], check=True)
            t = time.perf_counter()
            done = subprocess.run([str(tmp / "book" / "book"), "setup"], capture_output=True)
            rows.append(("setup (fresh clone)", time.perf_counter() - t, done.returncode == 0, 0.0))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    junit = Path(tempfile.mkdtemp(prefix="book-bench-")) / "browser.xml"
    for name, cmd, _ in steps():
        browser = name.startswith("browser")
        t = time.perf_counter()
        done = subprocess.run([*cmd, f"--junitxml={junit}"] if browser else cmd, cwd=ROOT, capture_output=True,
                              text=True, env=step_env())
        seconds = time.perf_counter() - t
        growing = 0.0 if name in FIXED_STEPS else _per_page_seconds(junit) if browser else seconds
        rows.append((name, seconds, done.returncode == 0, growing))
        if done.returncode != 0:  # what failed, not only that the step did
            print(f"--- {name} failed:\n" + "\n".join((done.stdout + done.stderr).splitlines()[-15:]), file=sys.stderr)
    return rows


def bench_build() -> float:
    t = time.perf_counter()
    subprocess.run([str(ROOT / ".venv" / "bin" / "jupyter-book"), "build", str(ROOT), "--quiet"], check=True,
                   capture_output=True)
    return time.perf_counter() - t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="./book bench")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--skip-notebooks", action="store_true")
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--ci", action="store_true", help="time every step of ./book test and project it")
    ap.add_argument("--fresh-clone", action="store_true", help="with --ci: include a fresh clone's set-up")
    args = ap.parse_args(argv)
    over = []
    print(f"machine: {platform.node()} {platform.machine()}, {__import__('os').cpu_count()} cores, "
          f"Python {platform.python_version()}")

    t_import = bench_import()
    print(f"\nimport lib: {t_import * 1e3:.1f} ms (budget {BUDGET_IMPORT_S * 1e3:.0f} ms)")
    if t_import > BUDGET_IMPORT_S:
        over.append("import lib")

    t_mpl, explorer_rows = bench_explorers(args.samples)
    print(f"\nexplorer updates (budget {BUDGET_EXPLORER_S * 1e3:.0f} ms p95; matplotlib import, once per kernel: "
          f"{t_mpl * 1e3:.0f} ms; first draw: the call that builds the explorer's persistent figure)")
    print(f"{'explorer':<36}{'first draw':>11}{'compute p50':>12}{'render p50':>11}{'total p50':>10}{'total p95':>10}"
          f"{'cpu p95':>9}")
    for name, first, c50, r50, t50, t95, cpu95 in explorer_rows:
        flag = "  OVER" if t95 > BUDGET_EXPLORER_S else ""
        print(f"{name:<36}{first * 1e3:>9.1f}ms{c50 * 1e3:>10.1f}ms{r50 * 1e3:>9.1f}ms{t50 * 1e3:>8.1f}ms"
              f"{t95 * 1e3:>8.1f}ms{cpu95 * 1e3:>7.1f}ms{flag}")
        if flag:
            over.append(f"explorer {name}")

    if not args.skip_notebooks:
        rows = bench_notebooks()
        print(f"\n{'notebook':<62}{'execute':>9}")
        for rel, seconds in rows:
            flag = "  OVER" if seconds > BUDGET_NOTEBOOK_MAX_S else ""
            print(f"{rel:<62}{seconds:>8.1f}s{flag}")
            if flag:
                over.append(f"notebook {rel} (over {BUDGET_NOTEBOOK_MAX_S:.0f} s)")
        total = sum(s for _, s in rows)
        median = statistics.median(s for _, s in rows)
        print(f"{'total, serial (' + str(len(rows)) + ' notebooks)':<62}{total:>8.1f}s")
        print(f"{'median notebook':<62}{median:>8.1f}s (budget {BUDGET_NOTEBOOK_MEDIAN_S:.0f} s)")
        if median > BUDGET_NOTEBOOK_MEDIAN_S:
            over.append("median notebook")
        nbval_s, passed = bench_nbval()
        projected = nbval_s / max(len(rows), 1) * QUESTIONS_IN_BANK
        print(f"{'strict nbval, 2 workers (' + str(len(rows)) + ' notebooks)':<62}{nbval_s:>8.1f}s"
              f"{'' if passed else '  FAILED'}")
        print(f"{'  projected to ' + str(QUESTIONS_IN_BANK) + ' notebooks':<62}{projected:>8.1f}s "
              f"(budget {BUDGET_ALL_NOTEBOOKS_S:.0f} s)")
        if projected > BUDGET_ALL_NOTEBOOKS_S:
            over.append("nbval of all notebooks (projected)")
        if not passed:
            over.append("nbval failed (run ./book test)")

    if not args.skip_build:
        print(f"\nbook build from stored outputs: {bench_build():.1f} s")

    if args.ci:
        n = len(notebook_paths())
        print(f"\n{'./book test step':<40}{'measured':>10}{'projected to ' + str(QUESTIONS_IN_BANK):>20}")
        total = 0.0
        for name, seconds, passed, growing in bench_ci(args.fresh_clone):
            projected = seconds - growing + growing / n * QUESTIONS_IN_BANK
            total += projected
            print(f"{name:<40}{seconds:>9.0f}s{projected:>19.0f}s{'' if passed else '  FAILED'}")
            if not passed:
                over.append(f"./book test step {name} failed")
        print(f"{'whole run, projected':<40}{'':>10}{total:>19.0f}s (budget {BUDGET_CI_S:.0f} s"
              f"{'' if args.fresh_clone else ', set-up not included: add --fresh-clone'})")
        if total > BUDGET_CI_S:
            over.append("./book test projected to 218 notebooks")

    print("\nover budget: " + (", ".join(over) if over else "nothing"))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
