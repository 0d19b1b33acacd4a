"""Reference scenarios and the consistency check, including a test that the check can fail."""

import pytest

from lib.perf import scenarios as sc


def _nb(**glued):
    """A minimal notebook whose stored outputs glue ``name=text``."""
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k}},
             "data": {"application/papermill.record/text/plain": v}} for k, v in glued.items()]
    return {"cells": [{"cell_type": "code", "outputs": outs, "source": ""}]}


def test_every_scenario_builds_and_every_quantity_is_positive():
    for name in sc.SCENARIOS:
        for kind, args in (("decode_step_s", {}), ("decode_floor_s", {}), ("ttft_s", {"prompt_len": 2048}),
                           ("kv_blocks", {}), ("kv_cache_bytes", {}), ("max_concurrency", {"context": 8192}),
                           ("max_sequences", {"context": 8192}), ("allreduce_s", {"message_bytes": 16384})):
            v = sc.quantity(kind, name, **args)
            assert v >= 0, (name, kind)


@pytest.mark.parametrize("text, value, half", [
    ("11.9 ms", 11.9e-3, 0.05e-3), ("8,192", 8192, 0.5), ("15.0 µs", 15e-6, 0.05e-6),
    ("1.99", 1.99, 0.005), ("141 GB", 141e9, 0.5e9), ("4.77 MiB", 4.77 * 2**20, 0.005 * 2**20),
])
def test_parse_glued(text, value, half):
    v, h = sc.parse_glued(text)
    assert v == pytest.approx(value) and h == pytest.approx(half)


def test_parse_rejects_text_that_is_not_a_number():
    with pytest.raises(ValueError, match="not a number"):
        sc.parse_glued("NVLink")
    with pytest.raises(ValueError, match="unit"):
        sc.parse_glued("3 parsecs")


def test_the_check_passes_the_model_and_fails_another_formula():
    """Test of the test: a notebook glueing the one model's step passes; one that glues the
    same quantity computed its own way (memory time + compute time, the old throughput line)
    fails with a message that names the glue and both values."""
    decl = (sc.Glued("nb", "step_ms", "decode_step_s", "llama70b-h100x8", {"batch": 1, "context": 0}),)
    want = sc.quantity("decode_step_s", "llama70b-h100x8", batch=1, context=0)
    good = _nb(step_ms=f"{want * 1e3:.3g} ms")
    assert sc.inconsistencies(good, "nb", decl) == []
    bad = _nb(step_ms=f"{want * 1.1e3:.3g} ms")
    problems = sc.inconsistencies(bad, "nb", decl)
    assert len(problems) == 1 and "step_ms" in problems[0] and "decode_step_s" in problems[0]
    missing = sc.inconsistencies(_nb(), "nb", decl)
    assert "not glued" in missing[0]


def test_capacity_check_fails_a_datasheet_capacity():
    """The old roofline capacity (datasheet GB x 0.9 - weights) disagrees with the memory budget."""
    from lib.perf.roofline import weight_bytes_streamed  # noqa: F401 (the old path's ingredients)
    from lib.registry.hardware import gpu
    from lib.registry.models import model

    dep = sc.scenario("llama70b-h100x8")
    m = model("llama-3.1-70b")
    naive_tokens = (0.9 * gpu("h100-sxm").memory_bytes - m.weight_bytes("bf16") / 8) / (
        m.kv_bytes_per_token("bf16") / 8)
    naive_seqs = naive_tokens / 8192
    decl = (sc.Glued("nb", "seqs", "max_concurrency", "llama70b-h100x8", {"context": 8192}),)
    assert sc.inconsistencies(_nb(seqs=f"{naive_seqs:.3g}"), "nb", decl)
    assert not sc.inconsistencies(_nb(seqs=f"{dep.budget.max_concurrency(8192):.3g}"), "nb", decl)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="scenario must be one of"):
        sc.scenario("llama-on-a-toaster")
    with pytest.raises(ValueError, match="kind must be one of"):
        sc.quantity("tokens_per_joule", "llama70b-h100x8")


def test_quantity_names_missing_and_unknown_arguments():
    with pytest.raises(ValueError, match="required: prompt_len"):
        sc.quantity("ttft_s", "llama70b-h100x8")
    with pytest.raises(ValueError, match="contxt"):
        sc.quantity("decode_step_s", "llama70b-h100x8", contxt=4096)


def test_number_after_reads_a_number_inside_a_glued_sentence():
    from lib.perf.scenarios import number_after, parse_glued

    assert number_after("its 15.1 µs, mostly latency", "its ") == "15.1 µs"
    assert number_after("165,816 blocks per GPU", "") == "165,816"
    assert parse_glued(number_after("cut the capacity to 37.4 sequences", "capacity to ")) == (37.4, 0.05)
    with pytest.raises(ValueError, match="no number follows"):
        number_after("no figure here", "its ")
