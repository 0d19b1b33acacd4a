"""lib.fleet.parallel_tp: each TP degree's GPU-seconds per request, and the searches for where TP8 wins."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity
from lib.fleet import parallel_tp as pt
from lib.perf.deployment import deployment
from lib.perf.throughput import step_s


@pytest.fixture(scope="module")
def dep70():
    return deployment("llama-3.1-70b", "h100-sxm", tp=8)


def test_options_are_request_cost_times_gpus(dep70):
    opts = pt.tp_options(dep70, 2048, 512, 0.03)
    assert sorted(opts) == [1, 2, 4, 8]
    assert not opts[1].serves and "tp=1" in opts[1].reason  # 140 GB of BF16 weights do not fit one H100
    for n in (2, 4, 8):
        c = capacity.request_cost(dep70.replace(tp=n), 2048, 512, 0.03)
        assert opts[n].gpu_s == pytest.approx(c.replica_s * n, rel=1e-12)
    assert math.isinf(opts[1].gpu_s)


def test_cheapest_is_the_minimum_and_ties_go_small(dep70):
    opts = pt.tp_options(dep70, 2048, 512, 0.03)
    best = pt.cheapest(opts)
    assert best.gpu_s == min(o.gpu_s for o in opts.values())
    twin = {4: pt.TPOption(4, opts[4].cost), 8: pt.TPOption(8, opts[4].cost)}
    assert pt.cheapest(twin).tp == 4
    assert pt.cheapest({1: opts[1]}) is None


def test_tightest_target_is_one_sequence_step(dep70):
    assert pt.tightest_tpot_s(dep70, 4, 2048, 512) == step_s(dep70.replace(tp=4), 1, 2560)
    with pytest.raises(ValueError):
        pt.tp_options(dep70, 2048, 512, 0.0)  # a zero target is refused, not priced


def _brute_loosest(dep, p, o, tp, hi, n=80):
    lo = pt.tightest_tpot_s(dep, tp, p, o) * (1 + 1e-9)
    grid = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    wins = [t for t in grid if pt.cheapest(pt.tp_options(dep, p, o, t)).tp == tp]
    return max(wins) if wins else None, grid[1] / grid[0]


def test_loosest_target_where_tp8_wins_against_a_brute_force_grid(dep70):
    got = pt.loosest_tpot_where_cheapest(dep70, 2048, 512, 8, hi_s=0.1)
    brute, step = _brute_loosest(dep70, 2048, 512, 8, 0.1)
    assert got is not None and brute is not None
    assert got == pytest.approx(brute, rel=step - 1 + 1e-3)
    assert pt.cheapest(pt.tp_options(dep70, 2048, 512, got * 0.999)).tp == 8
    assert pt.cheapest(pt.tp_options(dep70, 2048, 512, got * 1.01)).tp != 8


def test_loosest_target_is_the_last_win_when_integer_batches_make_the_wins_ragged():
    # Llama 3.1 8B in FP8: near the floors TP8 and TP4 trade the lead as each batch steps up by one, so the wins are
    # several short runs; the answer is the last of them, and no target on a fine grid beyond it is a TP8 win.
    dep = deployment("llama-3.1-8b", "h100-sxm", tp=8, weight_dtype="fp8", compute_dtype="fp8")
    got = pt.loosest_tpot_where_cheapest(dep, 2048, 512, 8, hi_s=0.2)
    floor = pt.tightest_tpot_s(dep, 8, 2048, 512)
    fine = [floor * (0.2 / floor) ** (i / 2000) for i in range(2001)]
    wins = [t for t in fine if pt.cheapest(pt.tp_options(dep, 2048, 512, t)).tp == 8]
    assert any(pt.cheapest(pt.tp_options(dep, 2048, 512, t)).tp != 8 for t in fine if t < got)  # ragged
    assert pt.cheapest(pt.tp_options(dep, 2048, 512, got)).tp == 8
    assert got == pytest.approx(max(wins), rel=2e-3)


def test_shortest_prompt_where_tp8_wins_is_a_boundary(dep70):
    p = pt.shortest_prompt_where_cheapest(dep70, 512, 0.03, 8)
    assert p is not None
    assert pt.cheapest(pt.tp_options(dep70, p, 512, 0.03)).tp == 8
    below = max(128, p - max(1, p // 200) - 1)
    assert pt.cheapest(pt.tp_options(dep70, below, 512, 0.03)).tp != 8


def test_small_model_never_wins_on_context():
    dep = deployment("llama-3.1-8b", "h100-sxm")
    assert pt.shortest_prompt_where_cheapest(dep, 512, 0.03, 8, points=8) is None


@settings(max_examples=15, deadline=None)
@given(t=st.floats(0.012, 0.2))
def test_cheapest_meets_the_target(dep70, t):
    best = pt.cheapest(pt.tp_options(dep70, 2048, 512, t))
    if best is not None:
        assert best.cost.decode_step_s <= t * (1 + 1e-9) or best.cost.limits.binding != "the TPOT target"
        assert best.cost.batch >= 1


@pytest.mark.parametrize("model,prompt,output", [("llama-3.1-70b", 2048, 512), ("llama-3.1-8b", 300, 40),
                                                 ("llama-3.1-70b", 60000, 2000)])
def test_gpu_s_by_target_is_tp_options_at_each_target(model, prompt, output):
    """The curve skips pricing a degree once its KV pool or max_num_seqs sets the batch: every point must
    still equal tp_options at that target, bit for bit (targets from below the tightest to 200 ms)."""
    dep = deployment(model, "h100-sxm", tp=8)
    lo = min(pt.tightest_tpot_s(dep, n, prompt, output) for n in (2, 4, 8))
    targets = [lo * 0.8 * (0.25 / lo) ** (i / 15) for i in range(16)]
    got = pt.gpu_s_by_target(dep, prompt, output, targets)
    settled = 0
    for i, t in enumerate(targets):
        opts = pt.tp_options(dep, prompt, output, t)
        assert list(got) == list(opts)
        for n, o in opts.items():
            assert got[n][i] == o.gpu_s, (n, t)
            settled += o.serves and o.cost.limits.binding != "the TPOT target"
    assert settled > 0  # the shortcut is exercised
    with pytest.raises(ValueError, match="ascending"):
        pt.gpu_s_by_target(dep, prompt, output, [0.05, 0.02])
