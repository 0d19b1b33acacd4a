"""One quantity, one value: every glue that lib.perf.scenarios.GLUED declares as a reference
quantity (decode step, floor, TTFT, KV capacity, collective cost of a reference scenario) states
the value the one model computes, to the precision the page shows."""

import json

import pytest

from lib.perf import scenarios
from tools.notebooks import notebook_paths

BY_SLUG = {p.stem: p for p in notebook_paths()}
SLUGS = sorted({g.slug for g in scenarios.GLUED})


def test_declarations_name_real_notebooks_and_cover_the_reference_scenarios():
    assert len(scenarios.GLUED) >= 20, "too few glues declared to hold the book to one model"
    assert not set(SLUGS) - set(BY_SLUG), f"declared for missing notebooks: {set(SLUGS) - set(BY_SLUG)}"
    kinds = {g.kind for g in scenarios.GLUED}
    assert {"decode_step_s", "ttft_s", "max_concurrency"} <= kinds
    assert len({g.scenario for g in scenarios.GLUED}) >= 3


@pytest.mark.parametrize("slug", SLUGS)
def test_glued_values_agree_with_the_one_model(slug):
    nb = json.loads(BY_SLUG[slug].read_text(encoding="utf-8"))
    problems = scenarios.inconsistencies(nb, slug)
    assert not problems, "\n".join(problems)
