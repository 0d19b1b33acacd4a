"""Where the notebooks and the question bank are, and what each notebook says it answers."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
BANK = Path(os.environ.get("QUESTION_BANK", ROOT.parent / "shared" / "question-bank.yaml"))
KINDS = ("derivation", "design", "coding", "debugging", "behavioral")
DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class NotebookInfo:
    path: Path
    id: str
    section: str
    slug: str
    kind: str
    difficulty: str
    minutes: int
    followups: int

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def notebook_paths() -> list[Path]:
    """Every chapter notebook, sorted (checkpoints and build copies excluded)."""
    return sorted(p for p in CHAPTERS.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def read_info(path: Path) -> NotebookInfo:
    """The ``interview`` block of a notebook's metadata (raises KeyError naming what is missing)."""
    meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    if "interview" not in meta:
        raise KeyError(f"{path}: metadata has no 'interview' block")
    m = meta["interview"]
    return NotebookInfo(path, m["id"], m["section"], m["slug"], m["kind"], m["difficulty"],
                        int(m["minutes"]), int(m.get("followups", 0)))


def section_folders() -> dict[str, Path]:
    """Section key -> chapter folder (``roofline`` -> chapters/01-roofline)."""
    return {p.name.split("-", 1)[1]: p for p in sorted(CHAPTERS.iterdir()) if p.is_dir()}


@functools.cache
def load_bank() -> dict | None:
    """The question bank (sections and questions), or None when ../shared is not beside the repo.
    Parsed once per process (libyaml when present): treat the result as read-only."""
    if not BANK.is_file():
        return None
    import yaml

    return yaml.load(BANK.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def toc_files() -> list[str]:
    """Every ``file:`` entry of _toc.yml, in reading order (paths without suffix)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return files
