"""lib.registry.data: every data file parses the same with libyaml's loader as with the pure-Python one."""

import pytest
import yaml

from lib.registry.data import DATA_DIR, load_yaml


@pytest.mark.parametrize("path", sorted(DATA_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_the_fast_loader_reads_what_the_safe_loader_reads(path):
    assert load_yaml(path.name) == yaml.safe_load(path.read_text(encoding="utf-8"))


def test_libyaml_is_there():
    """The pinned PyYAML wheel ships libyaml: the data files then load in about 70 ms, not 600."""
    assert hasattr(yaml, "CSafeLoader")
