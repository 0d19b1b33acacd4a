"""lib.registry.measured: the one reader of data/measured-<gpu>.yaml."""

import pytest

from lib.registry import hardware
from lib.registry.measured import measured, measured_gpus, measurements, source


def test_every_measured_gpu_is_a_registry_gpu_and_matches_its_sm_count():
    assert measured_gpus(), "no measurement file under data/"
    for name in measured_gpus():
        doc = measurements(name)
        assert doc["how"] and doc["sections"], f"{name}: the file must say how it was measured"
        assert doc["properties"]["multi_processor_count"] == hardware.gpu(name).compute_units


def test_every_measured_section_says_how_it_was_measured():
    for name in measured_gpus():
        doc = measurements(name)
        timed = [k for k, v in doc.items() if isinstance(v, dict) and k not in ("sections", "section_seconds")]
        missing = [k for k in timed if k not in doc["sections"]]
        assert not missing, f"{name}: sections without a method: {missing}"
        assert not [k for k in timed if "error" in doc[k]], f"{name}: a section that failed was stored"


def test_dotted_lookup_and_its_errors():
    assert measured("properties.l2CacheSize") == 62914560
    with pytest.raises(ValueError, match="not under properties"):
        measured("properties.no_such_key")
    with pytest.raises(ValueError, match="unknown measured GPU"):
        measurements("no-such-gpu")
    assert "H200" in source("h200") and "2026-12-04" in source("h200")


def test_measured_gemms_were_correct_before_they_were_timed():
    steps = measured("sgemm_steps")
    for name, row in steps.items():
        limit = 1e-2 if name == "cublas_bf16" else 1e-5
        assert row["rel_err"] < limit, name
    for row in measured("triton_tiles.rows"):
        assert row["rel_err"] < 1e-2, row["tile"]
