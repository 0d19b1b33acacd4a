"""lib.registry.derived: every stored entry equals its lib function's result now; a missing key is computed."""

import json

import pytest

from lib.registry import derived

TABLES = sorted(derived.TABLES)


@pytest.mark.parametrize("name", TABLES)
def test_stored_entries_equal_the_lib_function(name):
    t = derived.table(name)
    assert t.path.is_file(), f"{t.path} is missing: run ./book derive {name}"
    doc = json.loads(t.path.read_text(encoding="utf-8"))
    fresh = derived.document(name)  # every key recomputed by the function the file names
    assert doc["function"] == fresh["function"] and doc["arguments"] == fresh["arguments"]
    stored = {tuple(e["key"]): e["value"] for e in doc["entries"]}
    for e in fresh["entries"]:
        key = tuple(e["key"])
        assert key in stored, f"{name}: key {key} is not stored: run ./book derive {name}"
        assert stored[key] == e["value"], f"{name}{key}: lib now computes another value: run ./book derive {name}"
    assert len(stored) == len(fresh["entries"]), f"{name}: stale keys stored: run ./book derive {name}"
    # the file is exactly what rebuild writes (sorted keys, no timestamps)
    assert t.path.read_text(encoding="utf-8") == json.dumps(fresh, sort_keys=True, indent=1) + "\n", \
        f"{name}: file differs from a rebuild: run ./book derive {name}"


def test_stored_and_lookup_read_the_file():
    key = derived.keys("grammar_document_steps")[0]
    value = derived.stored("grammar_document_steps", key)
    assert value is not None and derived.lookup("grammar_document_steps", key) is value  # no recomputation


def test_missing_key_falls_back_to_computing():
    from lib.decoding.grammar import document_steps

    key = ("person", 3_000, 1)  # another vocabulary and seed: not stored
    assert key not in derived.keys("grammar_document_steps")
    assert derived.stored("grammar_document_steps", key) is None
    got = derived.lookup("grammar_document_steps", key)
    assert got == document_steps(*key)
    assert got["transitions"][0] >= 3_000  # a computed walk of the whole 3,000-token vocabulary


def test_explorer_reads_the_store_and_agrees_with_lib():
    from lib.explorers.decoding_grammar import mask_steps

    live = mask_steps("tool_call", "llama-2-7b", 10.0)
    kept = mask_steps("tool_call", "llama-2-7b", 10.0, stored=True)
    assert "costs" in live and "costs" not in kept
    assert kept["steps"] is derived.stored("grammar_document_steps", ("tool_call", 32_000, 0))
    for k in ("naive_s", "trie_s", "pre_s"):
        assert (live[k] == kept[k]).all()
    assert (live["worst_naive_s"], live["worst_pre_s"], live["pieces"]) == \
        (kept["worst_naive_s"], kept["worst_pre_s"], kept["pieces"])


def test_refuses_unknown_tables_and_bad_keys():
    with pytest.raises(ValueError, match="unknown derived table 'nope'; valid names: grammar_document_steps"):
        derived.stored("nope", ("person", 32_000, 0))
    with pytest.raises(ValueError, match=r"tuple of 3 values \(schema, vocab_size, seed\)"):
        derived.stored("grammar_document_steps", ("person", 32_000))
    with pytest.raises(ValueError, match="tuple of 3"):
        derived.stored("grammar_document_steps", ["person", 32_000, 0])


def test_rebuild_refuses_values_json_would_change(monkeypatch):
    monkeypatch.setitem(derived.TABLES, "bad", derived.Table("bad", "builtins:tuple", ("x",), "unused:keys", "test"))
    monkeypatch.setattr(derived, "keys", lambda name: [("abc",)])
    with pytest.raises(ValueError, match="plain JSON values"):
        derived.document("bad")  # tuple("abc") -> ('a', 'b', 'c') becomes a list in JSON
