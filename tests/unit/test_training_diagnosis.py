"""lib.training.diagnosis: every injected fault is named by the ordered checks and the healthy run is
not flagged (several seeds and rank counts); the dynamic loss scaler against a brute-force replay and
real fp16 numbers; the simulated run's logs are self-consistent."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import diagnosis as D


@pytest.mark.parametrize("fault", D.FAULTS)
@pytest.mark.parametrize("seed, ranks", [(0, 4), (1, 2), (2, 8)])
def test_each_fault_is_named_and_the_healthy_run_is_not_flagged(fault, seed, ranks):
    m = D.simulate(D.RunConfig(fault=fault, seed=seed, ranks=ranks))
    d = D.diagnose(m)
    assert d.fault == fault, (fault, d.readings)
    if fault == "healthy":
        assert not any(d.fired.values()), d.readings


@pytest.mark.parametrize("fault", D.FAULTS[1:])
def test_before_the_fault_the_run_looks_healthy(fault):
    """The faults act from fault_step on: a window that ends before it sees a healthy run."""
    m = D.simulate(D.RunConfig(fault=fault, fault_step=150))
    short = D.RunMetrics(**{**m.__dict__, **{k: getattr(m, k)[:150] for k in (
        "step", "lr", "loss", "heldout", "grad_norm", "rank_grad_norm", "loss_scale", "skipped", "unique_samples",
        "sample_ids")}})
    assert D.diagnose(short).fault == "healthy"


def test_a_frozen_step_counter_also_trips_the_data_check_so_it_goes_first():
    d = D.diagnose(D.simulate(D.RunConfig(fault="step_stuck")))
    assert d.fired["step counter"] and d.fired["data repetition"] and d.first == "step counter"


def test_lr_zero_and_collapse_freeze_the_weights_but_dead_rank_does_not():
    healthy = D.simulate(D.RunConfig())
    for fault in ("lr_zero", "scale_collapse"):
        m = D.simulate(D.RunConfig(fault=fault))
        assert np.ptp(m.heldout[m.config.fault_step:]) == 0.0
    dead = D.simulate(D.RunConfig(fault="dead_rank"))
    assert dead.heldout[-1] < dead.heldout[dead.config.fault_step] and dead.heldout[-1] > healthy.heldout[-1] - 0.05


def test_repeated_data_overfits_one_batch():
    m = D.simulate(D.RunConfig(fault="data_repeat"))
    f = m.config.fault_step
    assert m.loss[-1] < 0.2 * m.loss[f - 1] and m.heldout[-1] > m.heldout[f - 1]
    assert m.unique_samples[-1] == m.unique_samples[f]


def _replay(flags, interval, init=2.0 ** 16):
    """An independent replay of the scaler rule: count the clean run since the last change."""
    scale, run, out = init, 0, []
    for inf in flags:
        out.append(scale)
        if inf:
            scale, run = scale / 2, 0
        else:
            run += 1
            if run % interval == 0:
                scale, run = scale * 2, 0
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=200), st.integers(1, 20))
def test_loss_scaler_matches_a_replay(flags, interval):
    s = D.LossScaler(growth_interval=interval)
    seen = []
    for inf in flags:
        seen.append(s.scale)
        assert s.update(inf) == inf
    assert seen == _replay(flags, interval)


def test_scaler_collapse_reaches_zero_in_fp32():
    s = D.LossScaler()
    k = 0
    while s.scale > 0:
        s.update(True)
        k += 1
    assert k == 16 + 149 + 1  # 2^16 halves to 2^-149 (fp32's smallest subnormal), one more rounds to 0


def test_fp16_numbers():
    assert D.FP16_MAX == 65504.0 and D.FP16_MIN_NORMAL == 2.0 ** -14 and D.FP16_MIN_SUBNORMAL == 2.0 ** -24
    g16, inf = D.fp16_scaled(np.array([1.0]), 2.0 ** 16)  # 65536 > 65504: rounds to inf
    assert inf and np.isinf(g16[0])
    g16, inf = D.fp16_scaled(np.array([0.999]), 2.0 ** 16)
    assert not inf and g16[0] == np.float16(0.999 * 65536)
    assert D.underflow_fraction(np.array([1e-8, 1e-3]), 1.0) == 0.5
    assert D.underflow_fraction(np.array([1e-8, 1e-3]), 2.0 ** 16) == 0.0


@pytest.mark.parametrize("fault", D.FAULTS)
def test_logs_are_consistent(fault):
    m = D.simulate(D.RunConfig(fault=fault, growth_interval=20))
    for t in range(len(m.step) - 1):
        if m.skipped[t]:
            assert m.loss_scale[t + 1] == np.float32(m.loss_scale[t] / 2)
        else:
            assert m.loss_scale[t + 1] in (m.loss_scale[t], m.loss_scale[t] * 2)
    assert np.all(np.diff(m.unique_samples) >= 0) and m.unique_samples[-1] <= D.CORPUS
    assert (m.grad_norm[m.skipped] == np.inf).all() or fault == "healthy"
    assert m.heldout_floor < m.heldout.min() + 0.05 and m.heldout_start == pytest.approx(np.log(D.CLASSES))


def test_deterministic():
    a = D.simulate.__wrapped__(D.RunConfig(seed=3))
    b = D.simulate.__wrapped__(D.RunConfig(seed=3))
    assert np.array_equal(a.loss, b.loss) and np.array_equal(a.heldout, b.heldout)


@pytest.mark.parametrize("kwargs, match", [
    ({"fault": "gremlins"}, "fault"), ({"ranks": 0}, "ranks"), ({"fault": "dead_rank", "ranks": 1}, "ranks"),
    ({"fault_step": 300}, "fault_step"), ({"steps": 5}, "steps"), ({"rank_batch": 0}, "rank_batch"),
])
def test_invalid_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.RunConfig(**kwargs)


def test_diagnose_window_is_validated():
    with pytest.raises(ValueError, match="window"):
        D.diagnose(D.simulate(D.RunConfig()), window=10_000)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 8), st.integers(20, 150), st.integers(10, 200), st.integers(0, 99), st.integers(10, 50))
def test_every_fault_is_named_across_the_pages_domain(ranks, fault_step, growth_interval, seed, window):
    """The loss-plateau page's whole parameter domain: each fault named, the healthy run not flagged."""
    for fault in D.FAULTS:
        m = D.simulate(D.RunConfig(fault=fault, ranks=ranks, fault_step=fault_step, growth_interval=growth_interval,
                                   seed=seed))
        assert D.diagnose(m, window=window).fault == fault, (fault, D.diagnose(m, window=window).readings)


def test_explorer_names_the_fault():
    from lib.book.widgets import render

    for fault in D.FAULTS:
        view = render("training.loss_plateau", fault=fault, ranks=4, fault_step=100, growth_interval=50, seed=0)
        assert view.values["named_right"] == 1.0, fault
        assert view.caption
