"""lib.training.grpo: the torch reference against the numpy oracle (loss and closed-form gradient),
the oracle against finite differences, the invariants (zero-sum advantages per group, on-policy
gradient = -A x weight, padding changes nothing), and the grader: the reference passes, every draft fails."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import grpo as G
from lib.training import grpo_practice as gp


def _batch(seed, groups, group_size, setting="off_policy", spread=0.3):
    rng = np.random.default_rng(seed)
    B = groups * group_size
    lengths = rng.integers(1, 9, B)
    T = int(lengths.max()) + 2
    new = np.log(rng.uniform(0.05, 1.0, (B, T)))
    old = new + (rng.normal(0, spread, (B, T)) if setting == "off_policy" else 0.0)
    ref = new + rng.normal(0, 0.3, (B, T))
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    rewards = rng.integers(0, 3, B).astype(float) / 2
    return new, old, ref, rewards, mask


def _torch(cls, new, old, ref, rewards, mask, **cfg):
    impl = cls(**cfg)
    t_new = torch.tensor(new, requires_grad=True)
    loss = impl.loss(t_new, torch.tensor(old), torch.tensor(ref), torch.tensor(rewards), torch.tensor(mask))
    loss.backward()
    return float(loss.detach()), t_new.grad.numpy()


configs = st.fixed_dictionaries({
    "group_size": st.integers(2, 5), "clip_eps": st.sampled_from([0.1, 0.2, 0.28]),
    "kl_coef": st.sampled_from([0.0, 0.04, 0.3]), "aggregation": st.sampled_from(G.AGGREGATIONS)})


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), configs, st.sampled_from(["on_policy", "off_policy"]))
def test_torch_reference_matches_the_numpy_oracle(seed, groups, cfg, setting):
    args = _batch(seed, groups, cfg["group_size"], setting)
    loss, grad = _torch(G.GRPO, *args, **cfg)
    want_loss, want_grad = G.loss_and_grad(*args, **cfg)
    assert loss == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), configs)
def test_oracle_gradient_matches_finite_differences(seed, groups, cfg):
    new, old, ref, rewards, mask = _batch(seed, groups, cfg["group_size"])
    _, grad = G.loss_and_grad(new, old, ref, rewards, mask, **cfg)
    h = 1e-6
    c = cfg["clip_eps"]
    rng = np.random.default_rng(seed)
    for i, t in zip(rng.integers(0, new.shape[0], 6), rng.integers(0, new.shape[1], 6), strict=True):
        rho = np.exp(new[i, t] - old[i, t])
        if min(abs(rho - (1 - c)), abs(rho - (1 + c))) < 1e-4:
            continue  # a kink of the clip: no derivative there
        up, down = new.copy(), new.copy()
        up[i, t] += h
        down[i, t] -= h
        fd = (G.loss_and_grad(up, old, ref, rewards, mask, **cfg)[0]
              - G.loss_and_grad(down, old, ref, rewards, mask, **cfg)[0]) / (2 * h)
        assert fd == pytest.approx(grad[i, t], abs=1e-7)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=6), st.integers(1, 4),
       st.floats(0.1, 10), st.floats(-3, 3), st.integers(0, 1000))
def test_advantages_zero_sum_affine_invariant_and_permutation_equivariant(group, n_groups, scale, shift, seed):
    g = len(group)
    rewards = np.array(group * n_groups)
    adv = G.GRPO(g).advantages(torch.tensor(rewards)).numpy()
    assert np.isfinite(adv).all()
    assert np.abs(adv.reshape(-1, g).sum(axis=1)).max() < 1e-9
    np.testing.assert_allclose(adv, G.advantages_numpy(rewards, g), atol=1e-9)
    std = np.std(group, ddof=1)
    if std * min(scale, 1.0) > 0.1:  # where the epsilon is negligible, the advantage ignores the reward's unit and origin
        np.testing.assert_allclose(G.advantages_numpy(rewards * scale + shift, g), adv, rtol=3e-3, atol=3e-3)
    if std > 1e-3:
        assert np.abs(adv.reshape(-1, g).std(axis=1, ddof=1) - std / (std + G.STD_EPS)).max() < 1e-9
    else:
        assert np.abs(adv).max() <= 1e-3 / G.STD_EPS
    perm = np.random.default_rng(seed).permutation(g)
    np.testing.assert_allclose(G.advantages_numpy(np.array(group)[perm], g), adv[:g][perm], atol=1e-12)


def test_zero_std_group_gives_zero_advantage_and_no_gradient():
    new, old, ref, _, mask = _batch(3, 2, 4, "on_policy")
    rewards = np.array([1.0, 1, 1, 1, 0, 1, 0, 0])
    adv = G.advantages_numpy(rewards, 4)
    assert (adv[:4] == 0).all() and np.abs(adv[4:]).min() > 0.4
    _, grad = G.loss_and_grad(new, old, ref, rewards, mask, 4)
    assert (grad[:4] == 0).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(2, 5), st.sampled_from(G.AGGREGATIONS))
def test_on_policy_gradient_is_minus_advantage_times_weight(seed, groups, g, aggregation):
    new, old, ref, rewards, mask = _batch(seed, groups, g, "on_policy")
    _, grad = _torch(G.GRPO, new, new, ref, rewards, mask, group_size=g, aggregation=aggregation)
    want = -G.advantages_numpy(rewards, g)[:, None] * G.token_weights(mask, aggregation)
    np.testing.assert_allclose(grad, want, atol=1e-14)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), configs)
def test_padding_changes_nothing(seed, groups, cfg):
    new, old, ref, rewards, mask = _batch(seed, groups, cfg["group_size"])
    loss, grad = _torch(G.GRPO, new, old, ref, rewards, mask, **cfg)
    junk = np.random.default_rng(seed + 1).uniform(-20, 5, new.shape)
    pad = mask == 0
    new2, old2, ref2 = (np.where(pad, junk, a) for a in (new, old, ref))
    loss2, grad2 = _torch(G.GRPO, new2, old2, ref2, rewards, mask, **cfg)
    assert loss2 == pytest.approx(loss, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(grad2, grad, atol=1e-15)
    assert (grad2[pad] == 0).all()


def test_sequence_mean_weights_long_answers_less_per_token():
    mask = np.zeros((2, 100))
    mask[0, :10] = 1
    mask[1, :100] = 1
    w = G.token_weights(mask, "sequence")
    assert w[0, 0] / w[1, 0] == pytest.approx(10.0)
    assert G.token_weights(mask, "token")[0, 0] == G.token_weights(mask, "token")[1, 0]
    for agg in G.AGGREGATIONS:
        assert G.token_weights(mask, agg)[mask == 0].sum() == 0


def test_reference_passes_the_grader():
    assert gp.check(gp.variant("reference")).passed


@pytest.mark.parametrize("name", gp.VARIANTS)
def test_every_draft_is_caught(name):
    report = gp.check(gp.variant(name))
    assert report.status == "failed", name


def test_skeleton_reports_not_implemented():
    assert gp.check(gp.Skeleton).status == "not implemented"


@pytest.mark.parametrize("kwargs, match", [
    ({"group_size": 1}, "group_size"), ({"group_size": 4, "clip_eps": 0.0}, "clip_eps"),
    ({"group_size": 4, "kl_coef": -1.0}, "kl_coef"), ({"group_size": 4, "aggregation": "mean"}, "aggregation"),
])
def test_invalid_config_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        G.GRPO(**kwargs)


def test_rewards_must_fill_whole_groups():
    with pytest.raises(ValueError, match="rewards"):
        G.GRPO(4).advantages(torch.zeros(6))
    with pytest.raises(ValueError, match="variant"):
        gp.variant("nope")


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 16), st.integers(0, 16), st.integers(1, 64), st.integers(64, 2048),
       st.sampled_from(G.AGGREGATIONS))
def test_token_push_is_minus_the_on_policy_gradient(g, correct, shortest, longest, aggregation):
    correct = min(correct, g)
    rewards, lengths = G.length_spread_group(g, correct, shortest, longest)
    per_token, per_answer = G.token_push(rewards, lengths, g, aggregation)
    T = int(lengths.max())
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    new = np.log(np.random.default_rng(g).uniform(0.05, 1.0, (g, T)))
    _, grad = _torch(G.GRPO, new, new, new, rewards, mask, group_size=g, aggregation=aggregation)
    np.testing.assert_allclose(-grad.sum(axis=1), per_answer, atol=1e-14)
    np.testing.assert_allclose(-grad[:, 0], per_token, atol=1e-14)
    if aggregation == "sequence" and 0 < correct < g - 1:
        wrong = rewards == 0
        assert per_token[wrong][0] / per_token[wrong][-1] == pytest.approx(longest / shortest, rel=1e-9)


def test_explorer_length_bias_view():
    from lib.book.widgets import render

    view = render("training.grpo_length_bias", group_size=8, correct=2, shortest=16, longest=1024)
    assert view.values["short_over_long_wrong"] == pytest.approx(64.0)
    flat = render("training.grpo_length_bias", group_size=8, correct=8, shortest=16, longest=1024)
    assert "teaches nothing" in flat.caption
