"""Derived tables: results of lib functions stored under ``data/derived/`` (not sourced facts).

Some explorers need, on their first draw of an input, a result that takes lib over a hundred milliseconds
to compute (a walk of a 128K-token vocabulary from every automaton state, say) although they only ever ask
for a dozen argument sets. A derived table stores the function's result for those arguments, one JSON file per
table, written by :func:`rebuild` (``./book derive``). The file names the function and its arguments;
``tests/unit/test_derived.py`` recomputes every stored entry and fails, saying ``./book derive``, when a
change to lib moves a number. Only explorers read the store (:func:`lookup`, which computes what is not
stored); a notebook's own cells call lib directly.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lib.registry.data import DATA_DIR, unknown_name

DERIVED_DIR = DATA_DIR / "derived"


@dataclass(frozen=True)
class Table:
    """One derived table: ``function`` (``module:name``) called with ``arguments`` (names, in order) for every
    key that ``keys`` (``module:name`` of a function returning tuples of argument values) gives."""

    name: str
    function: str
    arguments: tuple[str, ...]
    keys: str
    about: str

    @property
    def path(self) -> Path:
        return DERIVED_DIR / f"{self.name}.json"


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("grammar_document_steps", "lib.decoding.grammar:document_steps", ("schema", "vocab_size", "seed"),
          "lib.explorers.decoding_grammar:stored_keys",
          "per decode step of each schema's example document: the naive and precompiled mask's transitions, for "
          "the schemas and vocabularies the decoding.grammar_mask explorer offers"),
)}


def table(name: str) -> Table:
    """The :class:`Table` called ``name``; ValueError naming the tables otherwise."""
    if name not in TABLES:
        raise unknown_name("derived table", name, sorted(TABLES))
    return TABLES[name]


def _resolve(ref: str) -> Callable:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def builder(name: str) -> Callable:
    """The lib function whose results table ``name`` stores."""
    return _resolve(table(name).function)


def keys(name: str) -> list[tuple]:
    """The argument tuples table ``name`` stores, in the order ``rebuild`` writes them."""
    return [tuple(k) for k in _resolve(table(name).keys)()]


def _check_key(t: Table, key) -> tuple:
    if not isinstance(key, tuple) or len(key) != len(t.arguments):
        raise ValueError(f"key of derived table {t.name!r} must be a tuple of {len(t.arguments)} values "
                         f"({', '.join(t.arguments)}), got {key!r}")
    return key


@functools.cache
def _entries(name: str) -> dict[tuple, object]:
    """The stored entries of table ``name`` by key (read once per process; empty when the file is missing)."""
    path = table(name).path
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {tuple(e["key"]): e["value"] for e in doc["entries"]}


def stored(name: str, key: tuple):
    """The stored value of table ``name`` at ``key`` (argument values in the table's order), or None when that
    key is not stored. Treat it as read-only: it is shared by every caller."""
    return _entries(name).get(_check_key(table(name), key))


def lookup(name: str, key: tuple):
    """The stored value at ``key``, or else the table's function computed now with those arguments."""
    value = stored(name, key)
    return builder(name)(*key) if value is None else value


def document(name: str) -> dict:
    """The JSON document of table ``name`` computed now: what the file holds after :func:`rebuild`. Raises
    ValueError when a value does not survive a JSON round trip unchanged (tuples, numpy numbers)."""
    t, fn = table(name), builder(name)
    entries = []
    for key in keys(name):
        value = fn(*_check_key(t, key))
        if json.loads(json.dumps(value)) != value:
            raise ValueError(f"derived table {name!r}: {t.function}{key} must return plain JSON values (dict, list, "
                             "str, int, float, bool, None)")
        entries.append({"key": list(key), "value": value})
    return {"table": name, "about": t.about, "function": t.function.replace(":", "."),
            "arguments": list(t.arguments), "rebuild": f"./book derive {name}", "entries": entries}


def rebuild(name: str) -> Path:
    """Recompute table ``name`` and write ``data/derived/<name>.json`` (sorted keys, no timestamps, so the same
    lib gives the same bytes); returns the path."""
    doc = document(name)
    path = table(name).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    _entries.cache_clear()
    return path
