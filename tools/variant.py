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
                               kernel_manager_class=KernelManager,
                               shutdown_kernel="immediate")  # the outputs are in: no 1 s graceful wait


class SharedKernel:
    """One kernel that executes many notebooks with injected parameters, one after the other.

    Starting a kernel and importing numpy, yaml and lib costs about as much as running a whole
    notebook, so the variant test runs every variant of a worker in one kernel. Before each
    notebook the kernel's namespace is reset (``%reset -f``: a missing import still fails), the
    glue record cleared and the working directory set to the notebook's folder; modules stay
    imported, as they would in a reader's live session. A kernel fault (hung or dead kernel)
    replaces the kernel. Papermill's own parameter injection is used, so the injected cell is the
    same as ``./book variant``'s. The kernel client (its channels) is reused too: starting one and
    waiting for the kernel to answer costs about 0.2 s per notebook.
    """

    RESET = ("%reset -f\nimport os as _os, lib.book.glue as _glue\n_glue.forget()\n"
             "_os.chdir({folder!r})\ndel _os, _glue")

    def __init__(self) -> None:
        self.km = None
        self.kc = None

    def render(self, src: Path, out: Path, params: dict) -> None:
        """Like :func:`render`: execute ``src`` with ``params`` into ``out``; raises nbclient's
        CellExecutionError when a cell fails, and a kernel fault (see tools.kernel) when the kernel
        hangs or dies (after which the next call starts a fresh kernel)."""
        import nbformat
        from nbclient import NotebookClient
        from papermill.iorw import load_notebook_node
        from papermill.parameterize import parameterize_notebook

        nb = parameterize_notebook(load_notebook_node(str(src)), params)
        nb.cells.insert(0, nbformat.v4.new_code_cell(self.RESET.format(folder=str(src.parent))))
        if self.km is None:
            self.km = KernelManager(kernel_name=KERNEL)
        client = NotebookClient(nb, km=self.km, timeout=CELL_TIMEOUT_S, startup_timeout=KERNEL_START_S,
                                kernel_name=KERNEL, record_timing=True,
                                resources={"metadata": {"path": str(src.parent)}})
        client.kc = self.kc  # None on the first notebook: nbclient starts one, kept below
        fault = False
        try:
            client.execute()
        except Exception as err:
            fault = is_kernel_fault(err)
            raise
        finally:
            self.kc = client.kc
            if fault:
                self.close()
            nb.cells.pop(0)
            nbformat.write(nb, out)

    def close(self) -> None:
        """Stop the kernel client's channels and the kernel (if they run)."""
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            from jupyter_client.utils import run_sync

            if self.km.has_kernel:
                run_sync(self.km.shutdown_kernel)(now=True)
            self.km = None


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
