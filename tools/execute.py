"""Re-execute notebooks in place, storing outputs and widget state the way nbval and the book expect.

    ./book execute                      all notebooks
    ./book execute chapters/01-roofline/ridge-point.ipynb [...]   the ones named (paths or slugs)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from lib.book.glue import store_citations
from tools.kernel import CELL_TIMEOUT_S, KernelManager
from tools.notebooks import ROOT, notebook_paths

KERNEL = "python3"
# Headings JupyterLab opens collapsed, so an interviewer can share the screen without the answer.
COLLAPSED_HEADINGS = ("## Worked answer", "## Explore", "## Where it breaks", "## Interviewer's notes", "## Checks")


def fold_answers(nb) -> None:
    """Mark the answer headings collapsed for JupyterLab (cell metadata jp-MarkdownHeadingCollapsed)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith(COLLAPSED_HEADINGS):
            cell.metadata["jp-MarkdownHeadingCollapsed"] = True


def resolve(names: list[str]) -> list[Path]:
    """Paths or bare slugs -> notebook paths (a clear error for anything unknown)."""
    if not names:
        return notebook_paths()
    by_slug = {p.stem: p for p in notebook_paths()}
    out = []
    for name in names:
        p = Path(name)
        if p.suffix == ".ipynb" and (ROOT / p).is_file():
            out.append((ROOT / p).resolve())
        elif p.is_file():
            out.append(p.resolve())
        elif name in by_slug:
            out.append(by_slug[name])
        else:
            raise SystemExit(f"no notebook {name!r}: give a path or one of the slugs {sorted(by_slug)}")
    return out


def execute(path: Path, timeout: int = CELL_TIMEOUT_S) -> float:
    """Run every cell of ``path`` in a fresh kernel in its folder and write it back; seconds taken."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3 (ipykernel)", "language": "python"}
    fold_answers(nb)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, kernel_manager_class=KernelManager,
                            store_widget_state=True, record_timing=False, shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    store_citations(nb)
    nb.metadata.pop("papermill", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    paths = resolve(argv)
    for p in paths:
        seconds = execute(p)
        print(f"executed {p.relative_to(ROOT)} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
