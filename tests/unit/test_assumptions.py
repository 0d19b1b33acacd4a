"""The one reader of data/assumptions.yaml."""

import pytest

from lib.registry import assumptions


def test_values_ranges_and_sources():
    assert assumptions.value("decode_step.gemv_bandwidth_efficiency") == 0.85
    assert assumptions.value_range("decode_step.gemv_bandwidth_efficiency") == (0.8, 0.9)
    assert "gpt-fast" in assumptions.source("anchors.hbm_streaming_gpt_fast")
    assert assumptions.source("decode_step.launch_gap_us").startswith("assumption:")
    assert assumptions.resolve(0.5, "prefill.prefill_mfu") == 0.5
    assert assumptions.resolve(None, "prefill.prefill_mfu") == assumptions.value("prefill.prefill_mfu")


def test_every_entry_has_a_source_or_an_argued_assumption():
    doc = assumptions._doc()

    def walk(node, path):
        if isinstance(node, dict) and ("value" in node or "base_us" in node or "us" in node):
            assert node.get("src") or node.get("assumption") or node.get("note"), path
            for s in node.get("src", []) if isinstance(node.get("src"), list) else []:
                assert s in doc["sources"], f"{path}: source id {s!r} not under sources"
            return
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")

    for section, node in doc.items():
        if section != "sources":
            walk(node, section)


@pytest.mark.parametrize("path, match", [
    ("decode_step.nothing", "decode_step has no 'nothing'"),
    ("nowhere.x", "the top level has no 'nowhere'"),
    ("collectives.nvlink", "has no single value"),
])
def test_bad_paths_name_what_exists(path, match):
    with pytest.raises(ValueError, match=match):
        assumptions.value(path)
