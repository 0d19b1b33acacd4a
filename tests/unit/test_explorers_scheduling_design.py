"""The batching-system explorer (lib.explorers.scheduling_design) shows what lib computes: its batch
limits against lib.scheduling.replica, its steady state against Little's law on the step model,
its refusals, and the page's anatomy figure."""

from __future__ import annotations

import math
from xml.etree import ElementTree

import pytest

from lib.book import widgets
from lib.explorers import scheduling_design as sd
from lib.scheduling.batching import length_mean, resident_kv_tokens
from lib.scheduling.replica import batch_limits
from lib.scheduling.resident import resident_sequences

R70 = "llama-3.1-70b on 8x h100-sxm"
KW = dict(replica=R70, tpot_target_s=0.04, rate=8.0, prompt_median=1024, output_median=256, spread=0.8)


def test_every_replica_builds_and_its_label_says_what_it_holds():
    for label, (model, gpu, tp) in sd.REPLICAS.items():
        dep = sd.deployment_of(label)
        assert (dep.model, dep.gpu, dep.tp) == (model, gpu, tp)
        assert label == f"{model} on {tp}x {gpu}"
        assert sd.replica_cost(label).dep == dep
    with pytest.raises(ValueError, match="replica must be one of"):
        sd.deployment_of("gpt-5 on 1x h100-sxm")
    with pytest.raises(ValueError, match="replica must be one of"):
        sd.replica_cost("gpt-5 on 1x h100-sxm")


def test_the_view_reports_lib_numbers():
    view = widgets.render("scheduling.system_design", **KW)
    assert isinstance(view, widgets.View)
    cost = sd.replica_cost(R70)
    prompt, output, max_tokens = sd.workload_lengths(cost.dep, 1024, 256, 0.8)
    assert max_tokens == 4 * 256 and prompt.cap == 8 * 1024
    context = round(resident_kv_tokens(round(length_mean(prompt)), output))
    lim = batch_limits(cost.dep, context, 0.04, cost=cost)
    assert view.values["context"] == context
    assert (view.values["by_tpot"], view.values["by_kv"], view.values["limit"]) == (lim.by_tpot, lim.by_kv, lim.limit)
    state = resident_sequences(cost, 8.0, round(length_mean(prompt)), round(length_mean(output)), mean_context=context)
    assert view.values["resident"] == pytest.approx(state.resident, rel=1e-12)
    # the short run sees the batch below the limit, and a p95 TPOT above the decode step of its batch
    assert 1 < view.values["mean_running"] < lim.limit
    assert view.values["p95_tpot_s"] > cost.decode_s(1, context)
    assert "set by the TPOT target" in view.table_text()
    ElementTree.fromstring(view.svg())


def test_a_light_load_is_not_simulated_and_an_impossible_target_is_refused():
    light = widgets.render("scheduling.system_design", **(KW | dict(rate=0.5, output_median=1024)))
    assert isinstance(light, widgets.View) and "not simulated here" in light.table_text()
    assert math.isnan(light.values["p95_tpot_s"])
    refused = widgets.render("scheduling.system_design", **(KW | dict(tpot_target_s=0.01)))
    assert isinstance(refused, widgets.ErrorView) and "relax the target" in refused.message


def test_an_overloaded_rate_still_answers():
    view = widgets.render("scheduling.system_design", **(KW | dict(rate=40.0)))
    assert isinstance(view, widgets.View)
    assert view.values["resident"] == math.inf
    assert dict(view.rows)["steady state at this rate (Little's law)"].startswith("none:")
    assert view.values["p95_tpot_s"] > 0.04 and "misses the target" in view.table_text()


def test_workload_lengths_fit_the_window():
    dep = sd.deployment_of("mixtral-8x7b on 2x h200")
    prompt, _, max_tokens = sd.workload_lengths(dep, 8192, 1024, 0.5)
    assert prompt.cap + max_tokens <= dep.mdl.max_position_embeddings
    with pytest.raises(ValueError, match="window"):
        sd.workload_lengths(dep, 30_000, 1024, 0.5)


def test_the_anatomy_figure_names_every_component():
    svg = sd.anatomy_figure().svg()
    ElementTree.fromstring(svg)
    for name, _, _ in sd.COMPONENTS:
        assert name in svg
    assert "KV pool" in svg
