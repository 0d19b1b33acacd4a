"""Practice mode for GRPO's loss (W09): the skeleton, a grader for any implementation, and drafts
with one classic defect each.

The candidate writes a class with the interface of :class:`lib.training.grpo.GRPO`:
``Candidate(group_size, clip_eps, kl_coef, aggregation)`` with ``advantages(rewards)`` and
``loss(logp_new, logp_old, logp_ref, rewards, mask)`` (torch tensors, float64). A case is a
``("config", group_size, clip_eps, kl_coef, aggregation, setting)`` operation (a default one when
shrinking removes it) and ``("group", seed, rewards, lengths)`` operations, one per prompt: the
group's rewards and its answers' lengths in tokens. The batch stacks the groups, pads every answer
to the longest plus two positions, and fills the padding with junk log-probabilities.

The oracle is :func:`lib.training.grpo.loss_and_grad`: the same formulas in numpy, token by token,
with the gradient in closed form. Checked per case: the advantages (finite, zero-sum per group,
equal to the oracle's), the loss and the autograd gradient with respect to ``logp_new`` (equal to
the oracle's), no gradient into ``logp_old``, and the loss unchanged when the padding's junk
changes. ``setting`` is ``"on_policy"`` (the first inner step: logp_old is the same forward's
output, attached to the graph, every ratio 1, the gradient minus the advantage times the token's
weight) or ``"off_policy"`` (a later inner step: logp_old differs, ratios spread past the clip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .grpo import GRPO, advantages_numpy, loss_and_grad

__all__ = ["DEFAULT_CONFIG", "QUESTION", "VARIANTS", "Skeleton", "batch", "cases", "check", "run", "variant"]

QUESTION = "GRPO loss (W09)"
DEFAULT_CONFIG = ("config", 4, 0.2, 0.0, "sequence", "off_policy")
LOSS_RTOL = 1e-7
GRAD_ATOL = 1e-9  # gradients are O(1 / tokens); float64 autograd agrees with the oracle to ~1e-16


class Skeleton:
    """GRPO's loss. Rows of a batch are answers; the group_size answers of one prompt are consecutive.

    Candidate(group_size, clip_eps=0.2, kl_coef=0.0, aggregation="sequence"):
      aggregation "sequence": mean over each answer's valid tokens, then over answers;
                  "token": sum over all valid tokens / their number;
                  "constant": sum over all valid tokens / (batch x padded length).
    """

    def __init__(self, group_size, clip_eps=0.2, kl_coef=0.0, aggregation="sequence"):
        self.group_size, self.clip_eps, self.kl_coef, self.aggregation = group_size, clip_eps, kl_coef, aggregation

    def advantages(self, rewards):
        """rewards (B,) float64 tensor -> (B,) advantages: (r - group mean) / (group sample std + 1e-4)."""
        raise NotImplementedError

    def loss(self, logp_new, logp_old, logp_ref, rewards, mask):
        """logp_new, logp_old, logp_ref (B, T) float64: log-probs of the sampled tokens under the policy
        being trained, the policy that sampled them (may be attached to the graph: treat it as a
        constant) and the frozen reference; rewards (B,); mask (B, T) 1.0 on real tokens, 0.0 on padding.
        Return the scalar loss: the PPO-clipped surrogate with ratio exp(new - old), plus kl_coef times
        the k3 estimate exp(ref - new) - (ref - new) - 1, aggregated as configured."""
        raise NotImplementedError


# ---- drafts: the reference with one classic mistake each --------------------------------------------

_DRAFTS = {
    "ratio from the reference model": (
        "the importance ratio built from the frozen reference's log-probs instead of the sampling policy's",
        "loss", [("ratio = torch.exp(logp_new - logp_old.detach())", "ratio = torch.exp(logp_new - logp_ref.detach())")]),
    "old log-probs not detached": (
        "logp_old left in the graph: on the first inner step it is logp_new itself, the ratio is exp(0) whatever "
        "the parameters, and the policy gradient cancels",
        "loss", [("ratio = torch.exp(logp_new - logp_old.detach())", "ratio = torch.exp(logp_new - logp_old)")]),
    "missing exp": (
        "the ratio taken as the log difference itself",
        "loss", [("ratio = torch.exp(logp_new - logp_old.detach())", "ratio = logp_new - logp_old.detach()")]),
    "padding unmasked": (
        "every position of the padded batch counted, padding included",
        "loss", [("m = torch.as_tensor(mask, dtype=logp_new.dtype)", "m = torch.ones_like(logp_new)")]),
    "advantages over the batch": (
        "rewards normalised by the whole batch's mean and std instead of each prompt's group",
        "advantages", [("groups = r.view(-1, self.group_size)", "groups = r.view(1, -1)")]),
    "clip on the wrong side": (
        "the optimistic max of the clipped and unclipped objectives instead of the pessimistic min",
        "loss", [("per_token = -torch.min(unclipped, clipped)  # pessimistic: the smaller objective",
                  "per_token = -torch.max(unclipped, clipped)")]),
    "no std epsilon": (
        "the advantage divided by the group's std with no epsilon: a group whose answers all scored the same "
        "gives 0 / 0",
        "advantages", [("return ((groups - mean) / (std + self.eps)).view(-1)", "return ((groups - mean) / std).view(-1)")]),
    "k3 reversed": (
        "the k3 estimator written with new - ref instead of ref - new: a biased estimate of KL(new || ref) "
        "whose gradient has the wrong magnitude",
        "loss", [("d = logp_ref.detach() - logp_new", "d = logp_new - logp_ref.detach()")]),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference class (``"reference"``) or a draft (one of ``VARIANTS``)."""
    if name == "reference":
        return GRPO
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, method, edits = _DRAFTS[name]
    return edited_class(GRPO, name.replace(" ", "_"), doc, **{method: edits})


# ---- the grader ---------------------------------------------------------------------------------------


def _config(ops: Sequence) -> tuple:
    return next((op for op in ops if op[0] == "config"), DEFAULT_CONFIG)


def batch(ops: Sequence, junk_seed: int = 0) -> dict:
    """The padded batch of a case (module doc) as numpy arrays; ``junk_seed`` draws the padding's junk."""
    _, group_size, clip_eps, kl_coef, aggregation, setting = _config(ops)
    groups = [op for op in ops if op[0] == "group"]
    lengths = [n for op in groups for n in op[3]]
    T = max(lengths) + 2
    B = len(lengths)
    new, old, ref = (np.empty((B, T)) for _ in range(3))
    row = 0
    for _, seed, _rewards, lens in groups:
        rng = np.random.default_rng(seed)
        for _n in lens:
            new[row] = np.log(rng.uniform(0.05, 1.0, T))
            old[row] = new[row] + (rng.normal(0.0, 0.3, T) if setting == "off_policy" else 0.0)
            ref[row] = new[row] + rng.normal(0.0, 0.3, T)
            row += 1
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.float64)
    junk = np.random.default_rng(10_000 + junk_seed)
    for a in (new, old, ref):
        a[mask == 0] = junk.uniform(-9.0, 3.0, int((mask == 0).sum()))
    rewards = np.array([x for op in groups for x in op[2]], dtype=np.float64)
    return {"new": new, "old": old, "ref": ref, "mask": mask, "rewards": rewards, "group_size": group_size,
            "clip_eps": clip_eps, "kl_coef": kl_coef, "aggregation": aggregation, "setting": setting}


def evaluate(cls: type, b: dict) -> dict:
    """Run a class on batch ``b``: its advantages, loss, gradient into logp_new and into logp_old."""
    import torch

    impl = cls(b["group_size"], clip_eps=b["clip_eps"], kl_coef=b["kl_coef"], aggregation=b["aggregation"])
    adv = impl.advantages(torch.tensor(b["rewards"]))
    new = torch.tensor(b["new"], requires_grad=True)
    if b["setting"] == "on_policy":
        old_leaf = None
        old = new * 1.0  # the same forward's output, still in the graph (as on the first inner step)
    else:
        old_leaf = torch.tensor(b["old"], requires_grad=True)
        old = old_leaf
    loss = impl.loss(new, old, torch.tensor(b["ref"]), torch.tensor(b["rewards"]), torch.tensor(b["mask"]))
    loss = torch.as_tensor(loss)
    if loss.ndim != 0:
        raise AssertionError(f"loss must be a scalar tensor, got shape {tuple(loss.shape)}")
    if loss.requires_grad:
        loss.backward()
    grad = new.grad.numpy().copy() if new.grad is not None else np.zeros_like(b["new"])
    old_grad = None if old_leaf is None or old_leaf.grad is None else old_leaf.grad.numpy().copy()
    return {"adv": torch.as_tensor(adv).detach().numpy().astype(np.float64), "loss": float(loss.detach()),
            "grad": grad, "old_grad": old_grad}


def _where(b: dict, i: int, t: int | None = None) -> str:
    g = i // b["group_size"]
    s = f"answer {i} (group {g}, rewards {b['rewards'][g * b['group_size']:(g + 1) * b['group_size']].tolist()}"
    s += f", {int(b['mask'][i].sum())} tokens)"
    if t is not None:
        s += f", token {t} (ratio {np.exp(b['new'][i, t] - b['old'][i, t]):.4g})"
    return s


def run(cls: type, ops: Sequence) -> None:
    """Grade ``cls`` on one case; AssertionError naming the first broken property."""
    if not any(op[0] == "group" for op in ops):
        return  # an empty batch cannot fail (the shrinker tries it)
    b = batch(ops)
    g = b["group_size"]
    want_adv = advantages_numpy(b["rewards"], g)
    want_loss, want_grad = loss_and_grad(b["new"], b["old"], b["ref"], b["rewards"], b["mask"], g, b["clip_eps"],
                                         b["kl_coef"], b["aggregation"])
    got = evaluate(cls, b)
    adv = got["adv"]
    if adv.shape != want_adv.shape:
        raise AssertionError(f"advantages must have one entry per answer {want_adv.shape}, got {adv.shape}")
    if not np.isfinite(adv).all():
        i = int(np.flatnonzero(~np.isfinite(adv))[0])
        raise AssertionError(f"advantage of {_where(b, i)} is {adv[i]}: a group whose answers all scored the same has "
                             "std 0, and its advantages must be 0 (add an epsilon to the std), not 0 / 0")
    sums = adv.reshape(-1, g).sum(axis=1)
    if np.abs(sums).max() > 1e-6:
        k = int(np.argmax(np.abs(sums)))
        raise AssertionError(f"the advantages of group {k} (rewards {b['rewards'][k * g:(k + 1) * g].tolist()}) sum to "
                             f"{sums[k]:.4g}, not 0: each group must be centred on its own mean "
                             f"(got {np.round(adv[k * g:(k + 1) * g], 4).tolist()})")
    if not np.allclose(adv, want_adv, rtol=1e-6, atol=1e-9):
        i = int(np.argmax(np.abs(adv - want_adv)))
        raise AssertionError(f"advantage of {_where(b, i)} is {adv[i]:.6g}, expected {want_adv[i]:.6g} "
                             "((r - group mean) / (group sample std + 1e-4))")
    if got["old_grad"] is not None and np.abs(got["old_grad"]).max() > 0:
        raise AssertionError("gradient flows into logp_old: the sampling policy's log-probs are a constant (detach "
                             "them); on the first inner step they are logp_new itself and the policy gradient cancels")
    pad = b["mask"] == 0
    if np.abs(got["grad"][pad]).max(initial=0.0) > 0:
        i, t = map(int, np.argwhere(pad & (got["grad"] != 0))[0])
        raise AssertionError(f"padding position {t} of {_where(b, i)} gets gradient {got['grad'][i, t]:.4g}: padded "
                             "tokens must contribute nothing")
    if not np.isclose(got["loss"], want_loss, rtol=LOSS_RTOL, atol=1e-12):
        raise AssertionError(f"loss = {got['loss']:.8g}, expected {want_loss:.8g} ({b['setting']}, clip "
                             f"{b['clip_eps']}, kl_coef {b['kl_coef']}, aggregation {b['aggregation']})")
    diff = np.abs(got["grad"] - want_grad)
    if diff.max() > GRAD_ATOL:
        i, t = np.unravel_index(int(np.argmax(diff)), diff.shape)
        zero = " (the whole gradient is 0)" if not np.abs(got["grad"]).any() else ""
        raise AssertionError(f"d loss / d logp_new at {_where(b, int(i), int(t))} is {got['grad'][i, t]:.6g}, expected "
                             f"{want_grad[i, t]:.6g}{zero} ({b['setting']}, aggregation {b['aggregation']})")
    other = evaluate(cls, batch(ops, junk_seed=1))
    if not np.isclose(other["loss"], got["loss"], rtol=1e-12, atol=1e-15):
        raise AssertionError(f"the loss moved from {got['loss']:.8g} to {other['loss']:.8g} when only the padding's "
                             "log-probs changed: mask the padded tokens")


def _describe(ops: Sequence) -> str:
    _, g, c, k, agg, setting = _config(ops)
    lines = [f"  config: group_size {g}, clip_eps {c}, kl_coef {k}, aggregation {agg!r}, {setting}"]
    lines += [f"  group (seed {op[1]}): rewards {list(op[2])}, answer lengths {list(op[3])}" for op in ops
              if op[0] == "group"]
    return "\n".join(lines)


def cases() -> list[Case]:
    """The graded cases: on- and off-policy steps, every aggregation, a KL term, a zero-std group,
    groups of different difficulty (so batch and group normalisation differ) and ragged lengths."""
    mixed = (("group", 1, (1.0, 0.0, 0.0, 1.0), (3, 7, 2, 5)), ("group", 2, (1.0, 1.0, 1.0, 0.0), (6, 4, 8, 1)),
             ("group", 3, (0.0, 0.2, 0.9, 0.4), (2, 2, 9, 5)))
    zero_std = ("group", 4, (1.0, 1.0, 1.0, 1.0), (4, 3, 6, 2))
    return [
        Case("on-policy step: ratio 1, gradient = -advantage x token weight",
             (("config", 4, 0.2, 0.0, "sequence", "on_policy"), *mixed)),
        Case("off-policy step, ratios past the clip", (("config", 4, 0.2, 0.0, "sequence", "off_policy"), *mixed)),
        Case("a group whose answers all scored the same", (("config", 4, 0.2, 0.0, "token", "off_policy"), mixed[0],
                                                            zero_std)),
        Case("KL to the reference (k3)", (("config", 4, 0.2, 0.1, "sequence", "off_policy"), *mixed)),
        Case("per-token mean over the batch (DAPO)", (("config", 4, 0.2, 0.0, "token", "off_policy"), *mixed)),
        Case("constant normaliser (Dr. GRPO), on-policy with KL",
             (("config", 4, 0.28, 0.05, "constant", "on_policy"), *mixed)),
        Case("groups of two, tight clip", (("config", 2, 0.1, 0.02, "sequence", "off_policy"),
                                           ("group", 5, (0.0, 1.0), (5, 1)), ("group", 6, (0.3, 0.3), (2, 7)),
                                           ("group", 7, (2.0, -1.0), (4, 4)))),
    ]


def check(candidate: Callable) -> PracticeReport:
    """Grade any class with the Skeleton's interface against the numpy oracle on every case."""
    return grade(QUESTION, lambda: candidate, cases(), run, _describe)
