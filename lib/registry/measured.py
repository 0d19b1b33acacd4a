"""The one reader of ``data/measured-<gpu>.yaml``: facts measured on a GPU lent to this project.

Each file holds one run of ``tools/device/measure_h200.py`` (raw numbers in the units its keys name), a
``how`` paragraph (machine, versions, timing method, what was not measured) and a ``sections`` map saying how
each section was measured. Pages cite :func:`source`; a value is read by its dotted path.
"""

from __future__ import annotations

from lib.registry.data import DATA_DIR, load_yaml, unknown_name


def measured_gpus() -> list[str]:
    """Registry names of the GPUs with a measurement file (``data/measured-<name>.yaml``)."""
    return sorted(p.stem.removeprefix("measured-") for p in DATA_DIR.glob("measured-*.yaml"))


def measurements(gpu: str = "h200") -> dict:
    """The whole measurement file of ``gpu`` (a registry name, e.g. ``"h200"``)."""
    if gpu not in measured_gpus():
        raise unknown_name("measured GPU", gpu, measured_gpus())
    return load_yaml(f"measured-{gpu}.yaml")


def measured(path: str, gpu: str = "h200"):
    """One measured value by dotted path, e.g. ``measured("properties.persistingL2CacheMaxSize")``."""
    node = measurements(gpu)
    for i, key in enumerate(path.split(".")):
        if not isinstance(node, dict) or key not in node:
            where = ".".join(path.split(".")[:i]) or "the top level"
            valid = list(node) if isinstance(node, dict) else []
            raise ValueError(f"no measured value {path!r} for {gpu}: {key!r} is not under {where} "
                             f"(there: {', '.join(valid)})")
        node = node[key]
    return node


def source(gpu: str = "h200") -> str:
    """One line naming the measurement: machine, date and file."""
    doc = measurements(gpu)
    return (f"measured on one {doc['properties']['name']} lent to this project, {doc['started'][:10]} "
            f"(data/measured-{gpu}.yaml, tools/device/measure_h200.py)")
