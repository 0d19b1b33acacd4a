"""Practice mode for the verifiers: the rejection-sampling verifier (I089) and the greedy prefix
match (I047). Skeletons, graders for any implementation, and drafts with one classic defect each.

**Rejection sampling.** The candidate writes ``verify(target_probs, draft_probs, drafted,
num_drafted, rng)`` with the conventions of :mod:`lib.decoding.verify` and returns ``(tokens,
num_accepted)`` (or a result with those attributes). A case is a list of row *groups*
``("group", num_drafted, rows, seed)``: each group has its own per-position target and draft
distributions on a ``VOCAB``-token vocabulary (drawn from ``seed``), its drafts drawn from the draft
distributions, and ``rows`` copies; the groups are stacked into one ragged batch (padded with PAD,
junk distributions past each group's drafts) and shuffled. Checked, per row: the shapes, the
padding, ``0 <= num_accepted <= num_drafted``, the accepted tokens equal the drafts, exactly
``num_accepted + 1`` tokens emitted, the last one possible at its position; then, per group, the
counts of each emitted sequence against the exact distribution (:func:`~lib.decoding.verify.step_distribution`)
by the seeded chi-square test (:func:`~lib.decoding.verify.chi_square_test`, level ``ALPHA``).
Special groups: ``("equal", num_drafted, rows, seed)`` (draft = target: every draft accepted) and
``("disjoint", num_drafted, rows, seed)`` (the draft puts all its mass on a token the target gives 0:
rejected at once, the token drawn from the target).

**Greedy.** ``verify(target_argmax, drafted, num_drafted)`` returns ``(tokens, num_accepted,
kv_rollback)``; a case is groups ``("greedy", num_drafted, rows, seed, match_prob)``, checked row by
row against a plain loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade

from .sampling import softmax
from .verify import (
    PAD,
    chi_square_statistic,
    critical_value,
    greedy_verify,
    inverse_cdf,
    rejection_verify,
    step_distribution,
)

__all__ = ["ALPHA", "GREEDY_VARIANTS", "group_distribution", "QUESTION", "QUESTION_GREEDY", "VARIANTS", "batch", "cases", "check",
           "check_greedy", "greedy_cases", "greedy_skeleton", "greedy_variant", "skeleton", "variant"]

QUESTION = "rejection-sampling verifier (I089)"
QUESTION_GREEDY = "greedy verification (I047)"
VOCAB = 4
ALPHA = 1e-3  # the level of the grader's chi-square test: a correct verifier fails one case in 1,000
SIMS = 20_000  # multinomial samples behind each critical value (the 0.999 quantile from 20 above it)
ROWS = 4000  # rows per random group


def skeleton(target_probs, draft_probs, drafted, num_drafted, rng):
    """Verify a ragged batch of drafts by rejection sampling.

    target_probs (B, K+1, V): the target's distribution at each position (K+1: the bonus position);
    draft_probs (B, K, V): the distribution each drafted token was drawn from; drafted (B, K) token
    ids, row b's first num_drafted[b] are real, the rest PAD (-1); rng: a numpy Generator.
    Return (tokens, num_accepted): tokens (B, K+1) holds row b's accepted drafts then one token of
    the target's (residual after a rejection, bonus after full acceptance), PAD after them."""
    raise NotImplementedError


def greedy_skeleton(target_argmax, drafted, num_drafted):
    """Greedy verification of a ragged batch: target_argmax (B, K+1), drafted (B, K) padded with -1.
    Return (tokens, num_accepted, kv_rollback): tokens (B, K+1) the emitted tokens padded with -1,
    kv_rollback (B,) the KV slots the verification pass wrote that are now invalid."""
    raise NotImplementedError


# ---- drafts: the reference with one classic mistake each --------------------------------------------

_DRAFTS = {
    "residual not renormalised": (
        "the residual max(0, p - q) sampled without dividing by its sum: inverse-CDF sampling puts the missing "
        "mass on the last token",
        [("residual = np.where(mass > 0, residual / np.where(mass > 0, mass, 1.0), p_next)  # mass 0 only if p == q",
          "residual = np.where(mass > 0, residual, p_next)")]),
    "residual = p": (
        "after a rejection the token is drawn from p instead of norm(max(0, p - q)): tokens the draft over-proposes "
        "get counted twice",
        [("residual = np.maximum(p_next - q_next, 0.0)", "residual = p_next.copy()")]),
    "bonus token dropped": (
        "no bonus token when every draft is accepted: a wasted target position each such step",
        [("tokens[rows, accepted] = y", "tokens[rows[rejected], accepted[rejected]] = y[rejected]")]),
    "accept only if p >= q": (
        "a draft accepted exactly when p(x) >= q(x), never with probability p/q",
        [("accept = (u * qx < px) & valid  # u < p/q: probability min(1, p/q)", "accept = (qx <= px) & valid")]),
    "padding verified": (
        "the padded columns treated as drafts: the pad id -1 indexes the last vocabulary entry",
        [("valid = pos[None, :] < n[:, None]  # the padded columns are not drafts",
          "valid = np.ones((B, K), dtype=bool)")]),
    "acceptance uniform reused": (
        "the uniform that decided the last accept test reused to sample the final token: after a rejection it "
        "lies above p/q, so the residual is sampled from the top of its CDF only",
        [("y = inverse_cdf(final, rng.random(B))", "y = inverse_cdf(final, u[rows, np.minimum(accepted, K - 1)])")]),
}
VARIANTS = tuple(_DRAFTS)

_GREEDY_DRAFTS = {
    "matches counted, not the prefix": (
        "the number of matching positions, not the length of the matching prefix",
        [("accepted = np.cumprod(match, axis=1).sum(axis=1)  # length of the matching prefix",
          "accepted = match.sum(axis=1)")]),
    "off by one position": (
        "draft j compared with the target's token at position j + 1",
        [("match = (d == t[:, :K]) & (pos[None, :K] < n[:, None])  # padded columns never match",
          "match = (d == t[:, 1:]) & (pos[None, :K] < n[:, None])")]),
    "bonus token dropped": (
        "no bonus token when every draft matched",
        [("tokens = np.where(pos[None, :] <= accepted[:, None], t, PAD)  # drafts == target on the prefix",
          "tokens = np.where(pos[None, :] <= accepted[:, None], t, PAD)\n"
          "tokens[np.flatnonzero(accepted == n), accepted[accepted == n]] = PAD")]),
    "rejected slot kept": (
        "one KV slot too few rolled back after a rejection: the slot at the correction's position still holds the "
        "rejected draft's keys and values",
        [("rollback = n - accepted  # KV of the rejected drafts; the emitted token's KV is written next pass",
          "rollback = np.maximum(n - accepted - 1, 0)")]),
}
GREEDY_VARIANTS = tuple(_GREEDY_DRAFTS)


def _wrap(func):
    def impl(*args):
        r = func(*args)
        return r.tokens, r.num_accepted

    return impl


def _wrap_greedy(func):
    def impl(*args):
        r = func(*args)
        return r.tokens, r.num_accepted, r.kv_rollback

    return impl


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft (one of ``VARIANTS``), with the candidate's interface."""
    if name == "reference":
        return _wrap(rejection_verify)
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return _wrap(edited(rejection_verify, _DRAFTS[name][1], name=name))


def greedy_variant(name: str) -> Callable:
    """The greedy reference (``"reference"``) or a draft (one of ``GREEDY_VARIANTS``)."""
    if name == "reference":
        return _wrap_greedy(greedy_verify)
    if name not in _GREEDY_DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(GREEDY_VARIANTS)}, got {name!r}")
    return _wrap_greedy(edited(greedy_verify, _GREEDY_DRAFTS[name][1], name=name))


# ---- the rejection-sampling grader ---------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _group_tables(kind: str, num_drafted: int, seed: int, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position target (k_max + 1, V) and draft (k_max, V) distributions of one group; the
    positions past its drafts hold junk a correct verifier never reads."""
    rng = np.random.default_rng(seed)
    p = softmax(rng.standard_normal((k_max + 1, VOCAB)) * 1.5)
    q = softmax(np.log(p[:k_max] + 1e-300) + rng.standard_normal((k_max, VOCAB)) * 1.0)
    if kind == "equal":
        q = p[:k_max].copy()
    elif kind == "disjoint":
        q = np.zeros((k_max, VOCAB))
        q[:, 0] = 1.0
        p[:, 0] = 0.0
        p /= p.sum(axis=1, keepdims=True)
    junk = softmax(rng.standard_normal((k_max + 1, VOCAB)) * 3.0)
    p[num_drafted + 1:] = junk[num_drafted + 1:]
    q[num_drafted:] = junk[num_drafted:k_max]
    for a in (p, q):
        a.setflags(write=False)
    return p, q


def batch(ops: Sequence) -> dict:
    """The ragged batch of a case (module doc): arrays, each row's group, and the seed of the rng."""
    groups = [op for op in ops if op[0] in ("group", "equal", "disjoint")]
    k_max = max([1] + [op[1] for op in groups])
    ps, qs, ds, ns, owner = [], [], [], [], []
    for g, (kind, nd, rows, seed) in enumerate(groups):
        p, q = _group_tables(kind, nd, seed, k_max)
        rng = np.random.default_rng(seed + 10_000)
        d = np.full((rows, k_max), PAD, dtype=np.int64)
        d[:, :nd] = inverse_cdf(np.broadcast_to(q[:nd], (rows, nd, VOCAB)), rng.random((rows, nd)))
        ps.append(np.broadcast_to(p, (rows, *p.shape)))
        qs.append(np.broadcast_to(q, (rows, *q.shape)))
        ds.append(d)
        ns.append(np.full(rows, nd, dtype=np.int64))
        owner.append(np.full(rows, g))
    perm = np.random.default_rng(len(groups) + 7 * k_max).permutation(sum(len(n) for n in ns))
    return {"p": np.concatenate(ps)[perm], "q": np.concatenate(qs)[perm], "drafted": np.concatenate(ds)[perm],
            "num_drafted": np.concatenate(ns)[perm], "group": np.concatenate(owner)[perm], "groups": groups,
            "k_max": k_max}


@functools.lru_cache(maxsize=256)
def _expected(kind: str, nd: int, seed: int, k_max: int) -> dict:
    p, q = _group_tables(kind, nd, seed, k_max)
    return step_distribution(lambda pre: p[len(pre)], lambda pre: q[len(pre)], nd)


def _unpack(result, names: tuple) -> tuple:
    if all(hasattr(result, n) for n in names):
        return tuple(getattr(result, n) for n in names)
    if isinstance(result, tuple) and len(result) == len(names):
        return result
    raise AssertionError(f"verify must return ({', '.join(names)}), got {type(result).__name__}")


def run(impl: Callable, ops: Sequence, *, seed: int = 0) -> None:
    """Run ``impl`` on the case's batch; AssertionError naming the first broken property."""
    if not ops:
        return  # an empty batch cannot fail (the shrinker tries it)
    b = batch(ops)
    B, K = b["drafted"].shape
    tokens, acc = _unpack(impl(b["p"].copy(), b["q"].copy(), b["drafted"].copy(), b["num_drafted"].copy(),
                               np.random.default_rng(seed)), ("tokens", "num_accepted"))
    tokens, acc = np.asarray(tokens), np.asarray(acc)
    if tokens.shape != (B, K + 1) or acc.shape != (B,):
        raise AssertionError(f"tokens must be (batch, max_draft + 1) = {(B, K + 1)} and num_accepted ({B},); got "
                             f"{tokens.shape} and {acc.shape}")
    nd = b["num_drafted"]
    cols = np.arange(K + 1)
    acc_c = np.clip(acc, 0, K)
    bad_count = (acc < 0) | (acc > nd)
    bad_prefix = ((cols[None, :K] < acc_c[:, None]) & (tokens[:, :K] != b["drafted"])).any(axis=1)
    bad_emitted = ((tokens != PAD).sum(axis=1) != acc_c + 1) | ((cols[None, :] > acc_c[:, None]) & (tokens != PAD)).any(1)
    last = tokens[np.arange(B), acc_c]
    p_last = b["p"][np.arange(B), acc_c]
    inside = (last >= 0) & (last < p_last.shape[1])
    bad_token = ~inside | (np.take_along_axis(p_last, np.where(inside, last, 0)[:, None], axis=1)[:, 0] == 0)
    for r in np.flatnonzero(bad_count | bad_prefix | bad_emitted | bad_token)[:1]:
        n, a, row = int(nd[r]), int(acc[r]), tokens[r]
        where = f"row {r} (drafted {b['drafted'][r, :n].tolist()}, num_drafted {n})"
        if bad_count[r]:
            raise AssertionError(f"{where}: num_accepted = {a}, outside 0..num_drafted")
        if bad_prefix[r]:
            raise AssertionError(f"{where}: the first {a} tokens must be the accepted drafts, got {row[:a].tolist()}")
        if bad_emitted[r]:
            raise AssertionError(f"{where}: {a} accepted, so {a + 1} tokens must be emitted (the accepted drafts, then "
                                 f"one token of the target's) followed by PAD; got {row.tolist()}")
        raise AssertionError(f"{where}: emitted token {row[a]} at position {a}, which the target gives probability "
                             f"0 there (p = {np.round(p_last[r], 3).tolist()})")
    for g, (kind, n, _rows, _seed) in enumerate(b["groups"]):
        mine = b["group"] == g
        if kind == "equal" and (acc[mine] != n).any():
            raise AssertionError(f"draft = target (group {g}, num_drafted {n}): every draft must be accepted "
                                 f"(min(1, p/q) = 1), but some rows accepted {sorted(set(acc[mine].tolist()))}")
        if kind == "disjoint" and n and (acc[mine] != 0).any():
            raise AssertionError(f"the target gives the drafted token probability 0 (group {g}): it must be rejected "
                                 f"at position 0, but rows accepted {sorted(set(acc[mine].tolist()))}")
    stat_groups = [(g, op) for g, op in enumerate(b["groups"]) if op[0] == "group"]
    if not stat_groups:
        return
    counts = []
    for g, _ in stat_groups:
        mine = b["group"] == g
        seqs, n_seen = np.unique(np.column_stack([acc[mine], tokens[mine]]), axis=0, return_counts=True)
        counts.append({tuple(int(t) for t in row[1: row[0] + 2]): int(c) for row, c in zip(seqs, n_seen, strict=True)})
    key = tuple((op[0], op[1], op[3], K) for _, op in stat_groups)
    exp = [_expected(*k) for k in key]
    stats = [chi_square_statistic(c, e)[0] for c, e in zip(counts, exp, strict=True)]
    crit = _critical_sized(key, tuple(op[2] for _, op in stat_groups))
    if sum(stats) > crit:
        worst = int(np.argmax(stats))
        g, op = stat_groups[worst]
        e, c = exp[worst], counts[worst]
        n = sum(c.values())
        top = sorted(e, key=lambda s: -abs(c.get(s, 0) - n * e[s]))[:3]
        diffs = ", ".join(f"{list(s)}: {c.get(s, 0)} seen vs {n * e[s]:.0f} expected" for s in top)
        raise AssertionError(f"the emitted sequences are not distributed as the lossless verifier's (chi-square "
                             f"{sum(stats):.4g} > {crit:.4g}, the 1 - {ALPHA:g} quantile under a correct verifier); "
                             f"largest gaps in group {g} (num_drafted {op[1]}, {n} rows): {diffs}")


@functools.lru_cache(maxsize=64)
def _critical_sized(key: tuple, sizes: tuple) -> float:
    """The critical value of the test for these groups and sizes (seeded, cached)."""
    return critical_value([_expected(*k) for k in key], list(sizes), ALPHA, SIMS, 0)


def describe(ops: Sequence) -> str:
    lines = []
    for op in ops:
        kind, n, rows, seed = op
        what = {"group": "random target and draft", "equal": "draft = target",
                "disjoint": "draft's token has target probability 0"}[kind]
        lines.append(f"  {rows} rows drafting {n} token(s): {what} (seed {seed})")
    return "\n".join(lines)


def cases() -> list[Case]:
    """The graded batches: the deterministic edge cases first (cheap), then the statistical ones."""
    return [
        Case("draft = target accepts everything", (("equal", 3, 50, 1),)),
        Case("a zero-probability draft is rejected", (("disjoint", 2, 50, 2),)),
        Case("no drafts: one token from the target", (("group", 0, ROWS, 3),)),
        Case("ragged batch: 3, 1 and 0 drafts, padded", (("group", 3, 50, 4), ("group", 1, 50, 5),
                                                          ("equal", 0, 20, 6), ("disjoint", 2, 20, 7))),
        Case("distribution: three drafts", (("group", 3, ROWS, 8),)),
        Case("distribution: ragged 2 and 1", (("group", 2, ROWS, 9), ("group", 1, ROWS, 10))),
    ]


def check(candidate: Callable) -> PracticeReport:
    """Grade any ``verify(target_probs, draft_probs, drafted, num_drafted, rng)``; the report shows the
    first failing batch, shrunk to the fewest row groups."""
    return grade(QUESTION, lambda: candidate, cases(), lambda impl, ops: run(impl, ops), describe)


# ---- the greedy grader -------------------------------------------------------------------------------


def _greedy_batch(ops: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k_max = max([1] + [op[1] for op in ops])
    ts, ds, ns = [], [], []
    for _, nd, rows, seed, match in ops:
        rng = np.random.default_rng(seed)
        t = rng.integers(0, 5, (rows, k_max + 1))
        d = np.where(rng.random((rows, k_max)) < match, t[:, :k_max], (t[:, :k_max] + 1 + rng.integers(0, 4, (rows, k_max))) % 5)
        d[:, nd:] = PAD
        ts.append(t)
        ds.append(d)
        ns.append(np.full(rows, nd))
    return np.concatenate(ts), np.concatenate(ds), np.concatenate(ns)


def _greedy_oracle(t: np.ndarray, d: np.ndarray, n: int) -> tuple[list, int, int]:
    """One row, as a loop: walk the drafts while they equal the target's argmax."""
    a = 0
    while a < n and d[a] == t[a]:
        a += 1
    return [int(x) for x in t[: a + 1]], a, n - a


def run_greedy(impl: Callable, ops: Sequence) -> None:
    """Run a greedy verifier on the case's batch and compare each row with the loop oracle."""
    if not ops:
        return
    t, d, n = _greedy_batch(ops)
    tokens, acc, roll = _unpack(impl(t.copy(), d.copy(), n.copy()), ("tokens", "num_accepted", "kv_rollback"))
    tokens, acc, roll = np.asarray(tokens), np.asarray(acc), np.asarray(roll)
    if tokens.shape != t.shape:
        raise AssertionError(f"tokens must have shape (batch, max_draft + 1) = {t.shape}, got {tokens.shape}")
    for r in range(len(n)):
        want, a, rb = _greedy_oracle(t[r], d[r], int(n[r]))
        got = [int(x) for x in tokens[r] if x != PAD]
        where = f"row {r}: target argmax {t[r].tolist()}, drafted {d[r, :n[r]].tolist()}"
        if int(acc[r]) != a:
            raise AssertionError(f"{where}: {a} drafts match as a prefix, got num_accepted = {int(acc[r])}")
        if got != want or (tokens[r, a + 1:] != PAD).any():
            raise AssertionError(f"{where}: must emit {want} (the matched prefix, then the target's token at position "
                                 f"{a}), got {tokens[r].tolist()}")
        if int(roll[r]) != rb:
            raise AssertionError(f"{where}: the pass wrote KV for the {int(n[r])} drafts and {a} were accepted, so {rb} "
                                 f"slot(s) must be rolled back, got {int(roll[r])}")


def greedy_cases() -> list[Case]:
    return [
        Case("every draft matches: the bonus token", (("greedy", 3, 4, 1, 1.0),)),
        Case("first draft wrong", (("greedy", 3, 4, 2, 0.0),)),
        Case("no drafts", (("greedy", 0, 3, 3, 0.5),)),
        Case("ragged batch, random matches", (("greedy", 4, 30, 4, 0.7), ("greedy", 2, 30, 5, 0.7),
                                               ("greedy", 1, 30, 6, 0.5))),
    ]


def _describe_greedy(ops: Sequence) -> str:
    return "\n".join(f"  {rows} rows drafting {n} token(s), each matching with probability {m:g} (seed {s})"
                     for _, n, rows, s, m in ops)


def check_greedy(candidate: Callable) -> PracticeReport:
    """Grade any ``verify(target_argmax, drafted, num_drafted) -> (tokens, num_accepted, kv_rollback)``."""
    return grade(QUESTION_GREEDY, lambda: candidate, greedy_cases(), run_greedy, _describe_greedy)


def group_distribution(num_drafted: int, seed: int, rule=None) -> dict:
    """The exact one-step output distribution of a grader group ``("group", num_drafted, rows, seed)``
    (its own maximum draft length) under ``rule`` (default: the lossless one): what the grader's
    chi-square test compares a candidate with, and what a biased rule would produce instead."""
    from .verify import REFERENCE_RULE

    p, q = _group_tables("group", num_drafted, seed, max(1, num_drafted))
    return step_distribution(lambda pre: p[len(pre)], lambda pre: q[len(pre)], num_drafted, rule or REFERENCE_RULE)


# ---- the bookkeeping grader (I098) ---------------------------------------------------------------------

QUESTION_BOOKKEEPING = "token-count bookkeeping (I098)"
BOOK_VOCAB = 20
BOOK_EOS = 0


def _mix(*values: int) -> int:
    """A deterministic 63-bit hash of integers (Python's str hash changes between processes)."""
    h = 1469598103934665603
    for v in values:
        h = ((h ^ (int(v) & 0xFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def toy_target(seed: int, eos_share: float = 0.05):
    """A deterministic toy target: the greedy next token after a context, EOS with probability about
    ``eos_share`` per position (seeded hash of the context)."""
    def next_token(ctx: tuple) -> int:
        r = np.random.default_rng(_mix(seed, *ctx))
        return BOOK_EOS if r.random() < eos_share else int(r.integers(1, BOOK_VOCAB))
    return next_token


def toy_drafter(next_token, seed: int, match: float):
    """A drafter that proposes the target's token with probability ``match`` (seeded), else another one."""
    def draft(ctx: tuple) -> int:
        r = np.random.default_rng(_mix(seed, 7919, *ctx))
        t = next_token(ctx)
        return t if r.random() < match else (t + 1 + int(r.integers(0, BOOK_VOCAB - 1))) % BOOK_VOCAB
    return draft


def bookkeeping_skeleton(state, drafted, target):
    """One speculative step on a SpecState (lib.decoding.bookkeeping): drafted (k tokens), target (the
    target's greedy tokens at the k + 1 positions). Return the new SpecState (dataclasses.replace)."""
    raise NotImplementedError


_BOOK_DRAFTS = {
    "EOS inside the run ignored": (
        "the accepted run appended whole, tokens after an EOS included",
        [("kept = kept[: kept.index(state.eos) + 1]  # the EOS ends the output; tokens after it are dropped",
          "kept = kept")]),
    "no output cap": (
        "the accepted run appended whole past max_tokens",
        [("kept = candidates[:room]", "kept = candidates")]),
    "no KV rollback": (
        "every slot the pass wrote kept as valid KV, rejected drafts included",
        [("target_kv = L + min(n, len(kept))  # fed tokens still in the sequence", "target_kv = L + k")]),
    "emitted = accepted + 1 always": (
        "the emitted counter bumped by accepted + 1 even when an EOS or the cap cut the run",
        [("emitted=state.emitted + len(kept),", "emitted=state.emitted + n + 1,")]),
    "drafter KV counts its last draft": (
        "the drafter's KV taken to include its k-th draft, which it never fed: after full acceptance it skips "
        "two tokens instead of catching up on them",
        [("draft_kv = min(L + k - 1, target_kv) if k else state.draft_kv",
          "draft_kv = min(L + k, target_kv) if k else state.draft_kv")]),
}
BOOKKEEPING_VARIANTS = tuple(_BOOK_DRAFTS)


def bookkeeping_variant(name: str) -> Callable:
    """The reference step (``"reference"``) or a draft (one of ``BOOKKEEPING_VARIANTS``)."""
    from .bookkeeping import advance

    if name == "reference":
        return advance
    if name not in _BOOK_DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(BOOKKEEPING_VARIANTS)}, got {name!r}")
    return edited(advance, _BOOK_DRAFTS[name][1], name=name)


_FIELDS = ("output", "finished", "target_kv", "draft_kv", "accepted", "emitted", "target_computed",
           "draft_computed", "rolled_back")


def _book_program(ops: Sequence) -> tuple:
    cfg = next((op for op in ops if op[0] == "config"), ("config", 5, 12, 0, 0.7))
    return (*cfg, [op[1] for op in ops if op[0] == "k"] or [3])


def _describe_book(ops: Sequence) -> str:
    _, prompt_len, max_tokens, seed, match, lengths = _book_program(ops)
    return (f"  prompt of {prompt_len} tokens, max_tokens {max_tokens}, toy target seed {seed} (EOS = {BOOK_EOS}), "
            f"drafter right with probability {match:g}\n  draft lengths per step: {lengths} (the last repeats)")


def run_bookkeeping(step: Callable, ops: Sequence) -> None:
    """ops: ("config", prompt_len, max_tokens, seed, match) then ("k", draft_length) per step; the
    candidate and the reference are driven through the same steps and compared field by field."""
    from .bookkeeping import run_program, start, violations

    _, prompt_len, max_tokens, seed, match, lengths = _book_program(ops)
    target = toy_target(seed)
    drafter = toy_drafter(target, seed, match)
    prompt = tuple(range(1, prompt_len + 1))
    first = target(prompt)
    ref = run_program(target, drafter, prompt, first, max_tokens, BOOK_EOS, lengths)
    state = start(prompt_len, first, max_tokens, BOOK_EOS)
    for i, tr in enumerate(ref):
        before = state
        state = step(state, tr.drafted, tr.target)
        where = (f"step {i + 1}: sequence length {before.seq_len}, output so far {list(before.output)}, drafted "
                 f"{list(tr.drafted)}, target tokens {list(tr.target)} ({tr.accepted} accepted)")
        for f in _FIELDS:
            got, want = getattr(state, f), getattr(tr.state, f)
            if got != want:
                problems = violations(before, state, tr.accepted)
                raise AssertionError(f"{where}: {f} = {got!r}, expected {want!r}"
                                     + (f"; broken invariant: {problems[0]}" if problems else ""))


def bookkeeping_cases() -> list[Case]:
    return [
        Case("rejection, then full acceptance", (("config", 5, 40, 1, 0.7), ("k", 3), ("k", 4), ("k", 2))),
        Case("EOS inside the accepted run", (("config", 4, 200, 7, 0.95), ("k", 6))),
        Case("output cap mid-run", (("config", 3, 10, 2, 0.95), ("k", 4))),
        Case("no drafts, then drafts", (("config", 2, 30, 5, 0.5), ("k", 0), ("k", 0), ("k", 3))),
    ]


def check_bookkeeping(candidate: Callable) -> PracticeReport:
    """Grade any ``step(state, drafted, target) -> SpecState`` against the reference on seeded programs."""
    return grade(QUESTION_BOOKKEEPING, lambda: candidate, bookkeeping_cases(), run_bookkeeping, _describe_book)
