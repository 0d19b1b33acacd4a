"""Locate and load the sourced yaml facts under the repository's ``data/`` folder."""

from __future__ import annotations

import functools
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


@functools.cache
def load_yaml(name: str) -> dict:
    """Parse ``data/<name>`` once per process (yaml is imported here, not at ``import lib``)."""
    import yaml

    path = DATA_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: lib reads its facts from the repo's data/ folder")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml parses these files ten times faster
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)  # noqa: S506 - a safe loader (C or pure Python), never the full one


def unknown_name(kind: str, name: str, valid: list[str]) -> ValueError:
    """The ValueError every registry lookup raises: what was asked and what exists."""
    return ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(valid)}")
