"""The one reader of ``data/assumptions.yaml``: every modelling number that is not a datasheet fact.

Entries are addressed by a dotted path (``"decode_step.launch_gap_us"``,
``"collectives.nvlink.ring_ll"``). :func:`value` returns the entry's ``value`` as written (units
as its key says; callers convert to SI); :func:`value_range` its ``(low, high)``; :func:`source`
the sources or the argued assumption behind it.
"""

from __future__ import annotations

from lib.registry.data import load_yaml

FILE = "assumptions.yaml"


def _doc() -> dict:
    return load_yaml(FILE)


def entry(path: str) -> dict:
    """The entry at a dotted ``path``; ValueError naming the valid keys at the level that failed."""
    node = _doc()
    walked = []
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node or part == "sources":
            valid = sorted(k for k in node if k != "sources") if isinstance(node, dict) else []
            where = ".".join(walked) or "the top level"
            raise ValueError(
                f"unknown assumption {path!r}: {where} has no {part!r}; valid: {', '.join(valid)}"
            )
        node = node[part]
        walked.append(part)
    if not isinstance(node, dict):
        raise ValueError(f"{path!r} is a field of an entry, not an entry")
    return node


def section(name: str) -> dict:
    """A top-level section of the file as a dict, with the file's ``sources`` beside it (for the
    domain readers that walk their own layout: ``serving_memory``, ``storage``, ``power``)."""
    doc = _doc()
    if name not in doc or name == "sources":
        valid = ", ".join(k for k in doc if k != "sources")
        raise ValueError(f"unknown assumptions section {name!r}; valid: {valid}")
    return {**doc[name], "sources": doc["sources"]}


def value(path: str):
    """``entry(path)["value"]``, in the unit the entry states."""
    e = entry(path)
    if "value" not in e:
        raise ValueError(f"assumption {path!r} has no single value; its fields: {', '.join(e)}")
    return e["value"]


def resolve(given, path: str):
    """``given`` unless it is None, else :func:`value` (the one place a None parameter is resolved)."""
    return value(path) if given is None else given


def value_range(path: str) -> tuple[float, float]:
    """(low, high) of an entry; (value, value) when it states no range."""
    e = entry(path)
    if "value" not in e:
        raise ValueError(f"assumption {path!r} has no single value; its fields: {', '.join(e)}")
    v = e["value"]
    return e.get("low", v), e.get("high", v)


def source(path: str) -> str:
    """The source texts behind an entry, or 'assumption: ...' with its reasoning."""
    e = entry(path)
    srcs = _doc()["sources"]
    refs = [srcs.get(s, s) for s in e.get("src", [])]
    if "assumption" in e:
        refs.insert(0, "assumption: " + " ".join(str(e["assumption"]).split()))
    return "; ".join(refs) or "no source listed"
