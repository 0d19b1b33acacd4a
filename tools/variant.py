"""Render a notebook with other parameters into an executed copy (papermill).

    ./book variant decode-weight-floor -p GPU h200 -p WEIGHT_DTYPE fp8
    ./book variant chapters/01-roofline/ridge-point.ipynb -p GPU b200 -o /tmp/ridge-b200.ipynb

Values are parsed as Python literals when they can be (8, 0.5, True), else kept as text. The
copy lands in variants/ (ignored by git) unless -o is given; open it in JupyterLab.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

from tools.execute import KERNEL, resolve
from tools.kernel import CELL_TIMEOUT_S, KERNEL_START_S, KernelManager, is_kernel_fault
from tools.notebooks import ROOT


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def render(src: Path, out: Path, params: dict) -> None:
    """Execute ``src`` with ``params`` injected (papermill) into ``out``, in ``src``'s folder.

    Raises papermill.PapermillExecutionError when a cell fails, nbclient's CellTimeoutError when a
    cell hangs, and RuntimeError when the kernel does not start or dies.
    """
    import papermill

    papermill.execute_notebook(str(src), str(out), parameters=params, kernel_name=KERNEL,
                               cwd=str(src.parent), progress_bar=False, log_output=False,
                               start_timeout=KERNEL_START_S, execution_timeout=CELL_TIMEOUT_S,
                               kernel_manager_class=KernelManager)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="./book variant", description=__doc__.split("\n")[0])
    ap.add_argument("notebook", help="path or slug")
    ap.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("-o", "--output", help="where to write the executed copy")
    args = ap.parse_args(argv)
    import papermill

    (src,) = resolve([args.notebook])
    params = {name: _value(value) for name, value in args.param}
    tag = "-".join(f"{k}={v}" for k, v in params.items()) or "defaults"
    out = Path(args.output) if args.output else ROOT / "variants" / f"{src.stem}--{re.sub(r'[^A-Za-z0-9=._-]', '_', tag)}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        render(src, out, params)
    except papermill.PapermillExecutionError as err:
        print(f"the notebook failed with {params}: {err.ename}: {err.evalue}\n(partial output in {out})")
        return 1
    except Exception as err:
        if not is_kernel_fault(err):
            raise
        print(f"the kernel stalled or died ({type(err).__name__}: {err}); run it again\n(partial output in {out})")
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
