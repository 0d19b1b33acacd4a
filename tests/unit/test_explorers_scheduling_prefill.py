"""The prefill-scheduling explorers (lib.explorers.scheduling_prefill) show what lib computes: each
view's numbers against the lib functions behind it, the replicas it offers, and its refusals."""

import math

import numpy as np
import pytest

from lib.book import widgets
from lib.explorers import scheduling_prefill as sp
from lib.scheduling import Policy
from lib.scheduling import long_prefill as lp

R70 = "llama-3.1-70b on 8x h100-sxm"


def test_every_replica_builds_and_the_labels_say_what_they_hold():
    for label, (model, gpu, tp) in sp.REPLICAS.items():
        dep = sp.deployment_of(label)
        assert (dep.model, dep.gpu, dep.tp) == (model, gpu, tp)
        assert label == f"{model} on {tp}x {gpu}"
        assert sp.replica_cost(label).max_batch == sp.MAX_BATCH
    with pytest.raises(ValueError, match="replica must be one of"):
        sp.deployment_of("gpt-5 on 1x h100-sxm")


@pytest.mark.parametrize("policy", sp.HOL_POLICIES)
def test_head_of_line_view_reports_lib_numbers(policy):
    kw = dict(replica=R70, long_prompt=32768, long_output=64, short_prompt=512, n_short=10, policy=policy,
              token_budget=8192, cap=2048, lead_s=0.0)
    view = widgets.render("scheduling.head_of_line", **kw)
    assert isinstance(view, widgets.View)
    cost = sp.replica_cost(R70)
    window = sp.deployment_of(R70).mdl.max_position_embeddings
    hol = lp.head_of_line(cost, sp.hol_policy(policy, 8192, 2048, window), 32768, 64, 512, 64, 10)
    assert view.values["extra_mean_s"] == pytest.approx(hol.extra_ttft_s.mean(), rel=1e-12)
    assert view.values["long_ttft_s"] == pytest.approx(hol.long_ttft_s, rel=1e-12)
    assert "<svg" in view.svg()


def test_hol_policy_names_map_to_the_intended_policies():
    assert sp.hol_policy("chunked, shortest prompt first", 4096, 512, 131072) == Policy(token_budget=4096, order="spf")
    assert sp.hol_policy("chunked, cap per long prompt", 4096, 512, 131072).long_prefill_cap == 512
    whole = sp.hol_policy("whole prompts, FCFS", 4096, 512, 131072)
    assert (whole.chunked_prefill, whole.step_mix, whole.token_budget) == (False, "prefill_first", 131072)
    with pytest.raises(ValueError, match="policy must be one of"):
        sp.hol_policy("lottery", 4096, 512, 131072)


def test_prefill_damage_view_reports_lib_numbers():
    view = widgets.render("scheduling.prefill_damage", replica=R70, long_prompt=100_000, token_budget=8192, cap=0,
                          rate=3.0, bg_prompt=1024, bg_output=128)
    assert isinstance(view, widgets.View)
    cost = sp.replica_cost(R70)
    warmup = 128 * cost.step_s(1, 1024) + 1.0
    res, rid = lp.long_prompt_run(cost, Policy(token_budget=8192), 100_000, 16, 1024, 128, 3.0, warmup, 4.0)
    d = lp.prefill_damage(res, rid, before_s=min(warmup, 5.0))
    assert view.values["peak_gap_s"] == pytest.approx(d.peak_gap_s, rel=1e-12)
    assert view.values["lockout_s"] == pytest.approx(d.lockout_s, rel=1e-12)
    assert view.values["peak_gap_s"] > 20 * view.values["baseline_gap_s"]


def test_chunk_budget_view_reports_the_window():
    view = widgets.render("scheduling.chunk_budget", replica=R70, prompt_len=20_000, decode_seqs=32, context=1500,
                          ttft_target_s=1.2, tpot_target_s=0.1, token_budget=8192)
    assert isinstance(view, widgets.View)
    w = lp.budget_window(sp.replica_cost(R70), 20_000, 32, 32 * 1500, 1.2, 0.1)
    assert (view.values["low"], view.values["high"]) == (w.min_budget_for_ttft, w.max_budget_for_gap)
    empty = widgets.render("scheduling.chunk_budget", replica=R70, prompt_len=20_000, decode_seqs=32, context=1500,
                           ttft_target_s=0.5, tpot_target_s=0.02, token_budget=8192)
    assert math.isnan(empty.values["low"]) and "empty" in empty.table_text()


@pytest.mark.parametrize("name,kw,match", [
    ("scheduling.head_of_line", dict(replica="mixtral-8x7b on 2x h200", long_prompt=60_000, long_output=64,
                                     short_prompt=512, n_short=4, policy="chunked, FCFS", token_budget=8192,
                                     cap=2048, lead_s=0.0), "context window"),
    ("scheduling.prefill_damage", dict(replica="mixtral-8x7b on 2x h200", long_prompt=100_000, token_budget=8192,
                                       cap=0, rate=2.0, bg_prompt=512, bg_output=64), "context window"),
    ("scheduling.chunk_budget", dict(replica=R70, prompt_len=20_000, decode_seqs=256, context=1500,
                                     ttft_target_s=2.0, tpot_target_s=0.1, token_budget=256), "must exceed"),
])
def test_refusals_are_messages(name, kw, match):
    view = widgets.render(name, **kw)
    assert isinstance(view, widgets.ErrorView) and match in view.message


def test_long_timelines_are_merged_for_drawing_without_losing_tokens_or_peaks():
    n = 3 * sp.MAX_DRAWN_STEPS + 7
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.uniform(0.01, 0.05, n))
    end = start + rng.uniform(0.005, 0.01, n)
    tokens = rng.integers(0, 9000, n)
    edges, (merged,) = sp._merged(start, end, tokens)
    assert len(merged) == sp.MAX_DRAWN_STEPS and len(edges) == sp.MAX_DRAWN_STEPS + 1
    # the duration-weighted token count is kept group by group
    assert (merged * np.add.reduceat(end - start, np.linspace(0, n, sp.MAX_DRAWN_STEPS + 1).astype(int)[:-1])).sum() \
        == pytest.approx((tokens * (end - start)).sum(), rel=1e-12)
    t, y = sp._thinned(end, tokens.astype(float))
    assert len(t) == sp.MAX_DRAWN_STEPS and y.max() == tokens.max()


def test_coupling_view_reports_the_cap_and_the_rate():
    view = widgets.render("scheduling.ttft_tpot_coupling", replica=R70, decode_seqs=32, context=1500,
                          ttft_target_s=2.0, tpot_target_s=0.1, rate=20.0, mean_prompt=2000)
    assert isinstance(view, widgets.View)
    cost = sp.replica_cost(R70)
    c = lp.chunk_cap(cost, 32, 48_000, 0.1, max_chunk=1 << 17)
    mu = c / cost.step_s(32, 48_000, [(c, 0)])
    assert view.values["chunk"] == c and view.values["mu"] == pytest.approx(mu, rel=1e-12)
    assert view.values["w_max"] == pytest.approx(2.0 * mu) and "overloaded" in view.table_text()
    tight = widgets.render("scheduling.ttft_tpot_coupling", replica=R70, decode_seqs=32, context=1500,
                           ttft_target_s=2.0, tpot_target_s=0.005, rate=1.0, mean_prompt=2000)
    assert tight.values["mu"] == 0.0 and "none" in tight.table_text()
