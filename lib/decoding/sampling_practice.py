"""Practice mode for the sampling questions: skeletons, graders for any implementation, the classic drafts.

**N073, the sampling function.** The candidate writes ``sample(logits, temperature, top_k, top_p,
size, rng)``: ``logits`` a float32 row (V,), ``size`` draws returned as integer token ids, in
the order temperature, top-k (every token >= the k-th largest logit; 0 disables), then top-p on
the renormalised top-k distribution (the smallest set of top tokens holding >= p; 1 disables);
temperature 0 is greedy (the lowest id among the largest logits). :func:`check_sampler` grades it
against the exact distribution :func:`lib.decoding.sampling.sampling_probs` (same order): a draw
of a token whose probability is 0 fails at once (an exact test), and the counts must pass
Pearson's chi-square at ``ALPHA`` (:func:`lib.decoding.sampling.chi_square_gof`). A case is a
program of settings (shrunk by dropping settings, so the report names the fewest knobs that
expose the bug):

- ``("logits", values)``: the row (default :data:`SIX`);
- ``("random_logits", vocab, scale, seed)``: a row of ``scale`` x standard normals;
- ``("shift", c)``: add ``c`` to every logit (the distribution does not move; a naive exp overflows);
- ``("mask", ids)``: those tokens get -inf (a grammar mask); ``("temperature", t)``, ``("top_k", k)``,
  ``("top_p", p)``, ``("draws", n)``, ``("seed", s)``.

``SAMPLER_VARIANTS`` are edits of :func:`reference_sample` (:mod:`lib.book.drafts`), one classic
mistake each; the tests hold the grader to failing every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade
from lib.decoding import sampling as s
from lib.inputs import integer

__all__ = ["ALPHA", "SAMPLER_ORDER", "SAMPLER_VARIANTS", "SIX", "check_sampler", "reference_sample",
           "sampler_case", "sampler_cases", "sampler_variant", "skeleton_sample"]

SAMPLER_QUESTION = "sampling function (N073)"
SAMPLER_ORDER = ("temperature", "top_k", "top_p")
SIX = (3.0, 2.4, 2.0, 1.2, 0.5, -1.0)  # six logits: the book's running example
ALPHA = 1e-4  # a chi-square p-value below this fails the case
DRAWS = 20_000


def skeleton_sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, size: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` token ids from softmax(logits / T) restricted by top-k, then top-p (on the
    renormalised top-k distribution). ``logits``: float32 (V,), -inf = masked. T = 0: greedy (the
    lowest id among the largest logits). top_k = 0 and top_p = 1 disable their filter."""
    raise NotImplementedError


def reference_sample(logits, temperature, top_k, top_p, size, rng):
    """Temperature, top-k, top-p, then one vectorised draw; float32 arithmetic as on the GPU."""
    z = np.asarray(logits, dtype=np.float32)
    if temperature == 0:  # greedy: the T -> 0 limit; no division by zero
        return np.full(size, int(np.argmax(z)))
    z = z / np.float32(temperature)  # temperature first: every filter sees the distribution we sample
    if 0 < top_k < z.size:  # keep every token at least as large as the k-th largest
        kth = np.sort(z)[z.size - top_k]
        z = np.where(z >= kth, z, np.float32(-np.inf))
    e = np.exp(z - z.max())  # the max subtracted: every exponent <= 0, nothing overflows
    p = e / e.sum()
    if top_p < 1:  # the smallest set of top tokens holding >= top_p of the top-k mass
        order = np.argsort(-p, kind="stable")
        above = np.cumsum(p[order]) - p[order]  # mass ranked strictly above each token
        p[order[above >= top_p]] = 0
    p = p.astype(np.float64)
    return rng.choice(z.size, size=size, p=p / p.sum())


_SAMPLER_DRAFTS = {
    "divides by a zero temperature": (
        "no greedy branch: z / 0 gives +-inf and NaN, and the draw fails or lands anywhere",
        [("if temperature == 0:  # greedy: the T -> 0 limit; no division by zero\n"
          "return np.full(size, int(np.argmax(z)))", "")]),
    "exp without subtracting the max": (
        "exp(z) overflows float32 above 88.72: inf / inf = NaN",
        [("e = np.exp(z - z.max())  # the max subtracted: every exponent <= 0, nothing overflows", "e = np.exp(z)")]),
    "top-p before temperature": (
        "top-p measured on the T = 1 distribution, temperature applied after: the kept set is not the one "
        "the sampled distribution implies",
        [("z = z / np.float32(temperature)  # temperature first: every filter sees the distribution we sample", ""),
         ("p = p.astype(np.float64)",
          "z = np.where(p > 0, z / np.float32(temperature), np.float32(-np.inf))\n"
          "e = np.exp(z - z.max())\n"
          "p = (e / e.sum()).astype(np.float64)")]),
    "top-p drops the token that crosses p": (
        "an inclusive cumulative sum: the token that takes the mass past p is dropped, and a top token "
        "holding >= p alone leaves nothing",
        [("above = np.cumsum(p[order]) - p[order]  # mass ranked strictly above each token",
          "above = np.cumsum(p[order])")]),
    "temperature multiplies": (
        "z x T instead of z / T: sharper where it should be flatter, a bias only a statistical test sees",
        [("z = z / np.float32(temperature)  # temperature first: every filter sees the distribution we sample",
          "z = z * np.float32(temperature)")]),
}
SAMPLER_VARIANTS = tuple(_SAMPLER_DRAFTS)
"""Defective drafts the sampler grader must fail (tests hold it to that)."""


def sampler_variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft with one classic mistake (one of ``SAMPLER_VARIANTS``)."""
    if name == "reference":
        return reference_sample
    if name not in _SAMPLER_DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(SAMPLER_VARIANTS)}, got {name!r}")
    return edited(reference_sample, _SAMPLER_DRAFTS[name][1], name=name)


def sampler_draft_defect(name: str) -> str:
    """The one-line description of a draft's mistake."""
    return _SAMPLER_DRAFTS[name][0]


# ---- the grader ---------------------------------------------------------------------------------------


def sampler_case(ops: Sequence) -> dict:
    """The inputs a case program describes (module docstring): logits (float32), knobs, draws, seed."""
    cfg = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "draws": DRAWS, "seed": 0}
    z = np.array(SIX)
    for op in ops:
        if op[0] == "logits":
            z = np.array(op[1], dtype=np.float64)
        elif op[0] == "random_logits":
            z = np.random.default_rng(op[3]).standard_normal(op[1]) * op[2]
    for op in ops:
        if op[0] == "shift":
            z = z + op[1]
        elif op[0] == "mask":
            z = z.copy()
            z[list(op[1])] = -np.inf
        elif op[0] in cfg:
            cfg[op[0]] = op[1]
        elif op[0] not in ("logits", "random_logits"):
            raise ValueError(f"unknown operation {op!r}")
    cfg["logits"] = z.astype(np.float32)
    return cfg


def _sampler_run(impl: Callable, ops: Sequence) -> None:
    c = sampler_case(ops)
    z = c["logits"]
    want = s.sampling_probs(z, c["temperature"], c["top_k"], c["top_p"], order=SAMPLER_ORDER)
    with np.errstate(all="ignore"):
        got = impl(z.copy(), c["temperature"], c["top_k"], c["top_p"], c["draws"], np.random.default_rng(c["seed"]))
    got = np.asarray(got)
    if got.shape != (c["draws"],) or not np.issubdtype(got.dtype, np.integer):
        raise AssertionError(f"sample must return {c['draws']} integer token ids, got shape {got.shape}, dtype {got.dtype}")
    if got.min() < 0 or got.max() >= z.size:
        raise AssertionError(f"a token id outside [0, {z.size}): {int(got.min())}..{int(got.max())}")
    kept = np.flatnonzero(want > 0)
    if c["temperature"] == 0 and not (got == kept[0]).all():
        raise AssertionError(f"temperature 0 must always return token {kept[0]} (the largest logit), got "
                             f"{np.unique(got)[:6].tolist()}")
    test = s.chi_square_gof(got, want)
    if test.impossible:
        bad = sorted(set(got[want[got] == 0].tolist()))
        raise AssertionError(f"drew token(s) {bad[:5]} ({test.impossible} of {test.draws} draws), whose probability is 0: "
                             f"the tokens that can be sampled are {kept[:12].tolist()}")
    if test.p_value < ALPHA:
        counts = np.bincount(got, minlength=z.size) / got.size
        worst = np.argsort(-np.abs(counts - want))[:3]
        detail = ", ".join(f"token {i}: drawn {counts[i]:.4f}, exact {want[i]:.4f}" for i in worst)
        raise AssertionError(f"the draws do not follow the exact distribution: chi-square {test.statistic:.1f} on "
                             f"{test.dof} dof, p-value {test.p_value:.2g} < {ALPHA:g} ({detail})")


def sampler_cases(num_random: int = 6, seed: int = 0) -> list[Case]:
    """The graded programs: scripted cases for each knob, each classic overflow and the knob order,
    then ``num_random`` seeded random programs (large vocabularies, every knob at once)."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("six logits, T = 1, no filter", (("logits", SIX),)),
        Case("temperature 0.6", (("temperature", 0.6),)),
        Case("temperature 1.6", (("temperature", 1.6),)),
        Case("temperature 0: greedy", (("temperature", 0.0),)),
        Case("top-k 3", (("top_k", 3),)),
        Case("top-p 0.8 at T = 0.5 (the order of temperature and top-p matters)",
             (("temperature", 0.5), ("top_p", 0.8))),
        Case("top-p 0.5: the top token alone holds more", (("top_p", 0.5),)),
        Case("top-k 4 then top-p 0.7 on the renormalised four", (("top_k", 4), ("top_p", 0.7), ("temperature", 1.3))),
        Case("logits shifted by +100 (a naive exp overflows float32)", (("shift", 100.0),)),
        Case("T = 0.25 on logits near 25 (logit / T passes 88.7)", (("shift", 22.0), ("temperature", 0.25))),
        Case("a grammar mask (-inf) on tokens 0 and 2", (("mask", (0, 2)), ("temperature", 0.8))),
    ]
    randoms = []
    for t in range(num_random):
        ops = [("random_logits", int(rng.choice([50, 1000, 32_000])), float(rng.choice([1.0, 3.0])), 500 + t),
               ("temperature", float(rng.choice([0.3, 0.7, 1.0, 1.5]))), ("top_k", int(rng.choice([0, 5, 40]))),
               ("top_p", float(rng.choice([1.0, 0.9, 0.6]))), ("seed", 900 + t)]
        randoms.append(Case(f"random program {t}", tuple(ops)))
    return scripted + randoms


def _sampler_describe(ops: Sequence) -> str:
    c = sampler_case(ops)
    z = c["logits"]
    row = (f"{np.array2string(z, precision=3, separator=', ')}" if z.size <= 8
           else f"{z.size} logits (max {float(z[np.isfinite(z)].max()):.3g})")
    return "\n".join([f"  logits = {row} (float32)",
                      f"  sample(logits, temperature={c['temperature']:g}, top_k={c['top_k']}, top_p={c['top_p']:g}, "
                      f"size={c['draws']}, rng=np.random.default_rng({c['seed']}))"])


def check_sampler(candidate: Callable, num_random: int = 6, seed: int = 0) -> PracticeReport:
    """Grade any ``sample(logits, temperature, top_k, top_p, size, rng)`` against the exact distribution."""
    if not callable(candidate):
        raise ValueError(f"check_sampler() takes a function sample(...), got {candidate!r}")
    return grade(SAMPLER_QUESTION, lambda: candidate, sampler_cases(num_random, seed), _sampler_run, _sampler_describe)


# ==== I087: top-p at its edges ===========================================================================
#
# The candidate writes ``top_p_keep(logits, top_p, temperature) -> bool mask (V,)``: the tokens top-p keeps
# from softmax(logits / T). The rule (lib.decoding.sampling.top_p_filter): token i is kept iff the mass of
# the tokens strictly more probable than i is < top_p, so a tie group is kept whole or not at all and the
# set does not depend on how the sort orders ties; top_p = 1 keeps every unmasked token whatever a float
# sum says; T = 0 keeps the tie group of the largest logit; -inf (masked) tokens are never kept.
# :func:`check_top_p` grades any implementation: against the float64 oracle (decisions within
# ``EDGE_TOL`` of the boundary are free, but a tie group must still agree with itself), and the same
# call on the vocabulary reversed and shuffled must keep the same tokens. A case is a program:
#
# - ``("row", values)`` or ``("random", vocab, scale, seed)``: the logits (float32);
# - ``("ties", value, n)``: append n tokens with logit ``value``; ``("mask", ids)``: those become -inf;
# - ``("top_p", p)``, ``("temperature", t)``; ``("shuffle", seed)``: one more permutation to check.

TOP_P_QUESTION = "top-p edge cases (I087)"
EDGE_TOL = 1e-5  # decisions whose mass-above is this close to p may go either way (float32 vs float64)
LLAMA3_VOCAB = 128_256


def skeleton_top_p_keep(logits: np.ndarray, top_p: float, temperature: float) -> np.ndarray:
    """The tokens top-p keeps (a bool mask over the vocabulary) from softmax(logits / temperature):
    the smallest set of top tokens holding >= top_p, never splitting a tie group, so the set does not
    depend on the order of the vocabulary. top_p = 1: every unmasked token. temperature = 0: the tie
    group of the largest logit. logits: float32 (V,), -inf = masked (never kept)."""
    raise NotImplementedError


def reference_top_p_keep(logits, top_p, temperature):
    """Tie groups kept whole, p = 1 and T = 0 decided before any arithmetic; float32 as on the GPU."""
    z = np.asarray(logits, dtype=np.float32)
    live = np.isfinite(z)  # -inf: masked (a grammar), never kept
    if temperature == 0:  # greedy: the tie group of the largest logit, no division by zero
        return z == z.max()
    if top_p >= 1:  # everything unmasked: no float sum gets a say
        return live
    scaled = z / np.float32(temperature)
    values = np.sort(scaled)[::-1]  # the sorted values: the same numbers for any vocabulary order
    e = np.exp(values - values[0])
    p = e / e.sum()
    above = np.cumsum(p) - p  # mass ranked above each position
    first = np.searchsorted(-values, -values, side="left")  # the first position of each tie group
    kept = above[first] < top_p  # a tie group is in or out as a whole
    return live & (scaled >= values[kept].min())


_TOP_P_DRAFTS = {
    "stable sort splits a tie group": (
        "the cut made per sorted position: a tie group straddling p is split, and which of its tokens survive "
        "depends on their order in the vocabulary",
        [("kept = above[first] < top_p  # a tie group is in or out as a whole\n"
          "return live & (scaled >= values[kept].min())",
          "keep = np.zeros(z.size, dtype=bool)\n"
          "keep[np.argsort(-scaled, kind=\"stable\")[above < top_p]] = True\n"
          "return live & keep")]),
    "argmax of cumsum >= p": (
        "the cut at the first position where a float32 cumsum reaches p: at p = 1 on a large vocabulary the "
        "sum can fall short of 1, argmax of an all-False array is 0, and one token is kept",
        [("if top_p >= 1:  # everything unmasked: no float sum gets a say\nreturn live", ""),
         ("kept = above[first] < top_p  # a tie group is in or out as a whole\n"
          "return live & (scaled >= values[kept].min())",
          "cut = np.argmax(np.cumsum(p) >= top_p)  # the first position where the mass reaches p\n"
          "return live & (scaled >= values[cut])")]),
    "no p = 1 short-circuit": (
        "p = 1 left to the float32 sum: where the cumsum overshoots 1 before the last token, the tail is dropped",
        [("if top_p >= 1:  # everything unmasked: no float sum gets a say\nreturn live", "")]),
    "divides by a zero temperature": (
        "no greedy branch: z / 0 is +-inf or NaN and the kept set is garbage or an exception",
        [("if temperature == 0:  # greedy: the tie group of the largest logit, no division by zero\n"
          "return z == z.max()", "")]),
    "keeps masked tokens at p = 1": (
        "p = 1 returns every token, including those a grammar masked with -inf",
        [("return live\n", "return np.ones(z.size, dtype=bool)\n")]),
}
TOP_P_VARIANTS = tuple(_TOP_P_DRAFTS)
"""Defective top-p drafts the grader must fail (tests hold it to that)."""


def top_p_variant(name: str) -> Callable:
    """The reference (``"reference"``) or a top-p draft with one classic mistake (one of ``TOP_P_VARIANTS``)."""
    if name == "reference":
        return reference_top_p_keep
    if name not in _TOP_P_DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(TOP_P_VARIANTS)}, got {name!r}")
    return edited(reference_top_p_keep, _TOP_P_DRAFTS[name][1], name=name)


def top_p_draft_defect(name: str) -> str:
    """The one-line description of a top-p draft's mistake."""
    return _TOP_P_DRAFTS[name][0]


def top_p_case(ops: Sequence) -> dict:
    """The inputs a top-p case program describes: logits (float32), top_p, temperature, extra shuffles."""
    cfg = {"top_p": 0.9, "temperature": 1.0, "shuffles": []}
    z = np.array([2.0, 1.0, 1.0, 1.0, 0.0])
    for op in ops:
        if op[0] == "row":
            z = np.array(op[1], dtype=np.float64)
        elif op[0] == "random":
            z = np.random.default_rng(op[3]).standard_normal(op[1]) * op[2]
    for op in ops:
        if op[0] == "ties":
            z = np.concatenate([z, np.full(op[2], float(op[1]))])
        elif op[0] == "mask":
            z = z.copy()
            z[[i % z.size for i in op[1]]] = -np.inf
        elif op[0] in ("top_p", "temperature"):
            cfg[op[0]] = op[1]
        elif op[0] == "shuffle":
            cfg["shuffles"].append(op[1])
        elif op[0] not in ("row", "random"):
            raise ValueError(f"unknown operation {op!r}")
    if not np.isfinite(z).any():
        z[0] = 0.0
    cfg["logits"] = z.astype(np.float32)
    return cfg


def top_p_oracle(z: np.ndarray, top_p: float, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(kept mask, mass strictly above each token / p's scale) by :func:`lib.decoding.sampling.filter_logits`
    in float64; the second array is NaN where the decision is exact (T = 0, p = 1, masked)."""
    kept = np.isfinite(s.filter_logits(z, temperature, top_p=top_p, order=("temperature", "top_p")))
    margin = np.full(z.size, np.nan)
    if temperature > 0 and top_p < 1:
        zz = np.asarray(z, np.float64)
        probs = s.softmax(zz, temperature)
        order = np.argsort(-zz, kind="stable")
        above = np.concatenate(([0.0], np.cumsum(probs[order])[:-1]))
        first = np.searchsorted(-zz[order], -zz[order], side="left")  # mass strictly above each tie group
        margin[order] = above[first] - top_p
        margin[~np.isfinite(zz)] = np.nan
    return kept, margin


def _top_p_run(impl: Callable, ops: Sequence) -> None:
    c = top_p_case(ops)
    z, p, t = c["logits"], c["top_p"], c["temperature"]
    want, margin = top_p_oracle(z, p, t)
    free = np.abs(margin) <= EDGE_TOL  # NaN compares False: exact decisions are never free

    def call(x):
        with np.errstate(all="ignore"):
            got = np.asarray(impl(x.copy(), p, t))
        if got.shape != x.shape or got.dtype != bool:
            raise AssertionError(f"top_p_keep must return a bool mask of shape {x.shape}, got {got.dtype} {got.shape}")
        return got

    got = call(z)
    wrong = np.flatnonzero((got != want) & ~free)
    if wrong.size:
        i = int(wrong[0])
        zz = np.asarray(z, np.float64)
        what = "kept" if got[i] else "dropped"
        extra = ""
        if np.isneginf(zz[i]):
            extra = " (it is masked: -inf)"
        elif not np.isnan(margin[i]):
            extra = f" (mass of the tokens more probable than it: {margin[i] + p:.6g}, p = {p:g})"
        raise AssertionError(f"token {i} (logit {zz[i]:g}) {what}, should be {'kept' if want[i] else 'dropped'}{extra}; "
                             f"kept {int(got.sum())} tokens, expected {int(want.sum())}")
    values, group_of = np.unique(z, return_inverse=True)
    kept_in, size = np.bincount(group_of, weights=got, minlength=values.size), np.bincount(group_of, minlength=values.size)
    split = np.flatnonzero((kept_in > 0) & (kept_in < size))
    if split.size:
        g = int(split[0])
        raise AssertionError(f"the tie group at logit {float(values[g]):g} ({int(size[g])} tokens) was split: "
                             f"{int(kept_in[g])} kept")
    perms = [("reversed", np.arange(z.size)[::-1])] + [
        (f"shuffled (seed {sd})", np.random.default_rng(sd).permutation(z.size)) for sd in [0, *c["shuffles"]]]
    for name, perm in perms:
        back = np.empty(z.size, dtype=bool)
        back[perm] = call(z[perm])
        if not (back == got).all():
            i = int(np.flatnonzero(back != got)[0])
            raise AssertionError(f"the kept set depends on the order of the vocabulary: with it {name}, token {i} "
                                 f"(logit {float(z[i]):g}) is {'kept' if back[i] else 'dropped'}, in the original order "
                                 f"{'kept' if got[i] else 'dropped'}")


def top_p_cases(num_random: int = 8, seed: int = 0) -> list[Case]:
    """The graded programs: ties at and above the boundary, p = 1 on Llama 3's vocabulary (float32 sums
    short of 1 and past it), temperature 0 with a tied maximum, masks, then random programs."""
    num_random = integer("num_random", num_random, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scripted = [
        Case("no ties: [3, 2, 1, 0], p = 0.8", (("row", (3.0, 2.0, 1.0, 0.0)), ("top_p", 0.8))),
        Case("a tie group straddling p: [2, 1, 1, 1, 0], p = 0.5", (("row", (2.0,)), ("ties", 1.0, 3), ("ties", 0.0, 1),
                                                                     ("top_p", 0.5))),
        Case("every token tied: 8 x 0.0, p = 0.3", (("row", ()), ("ties", 0.0, 8), ("top_p", 0.3))),
        Case("a tied top pair, p = 0.2", (("row", (5.0, 5.0, 1.0, 0.5)), ("top_p", 0.2))),
        Case("ties at T = 0.5, p = 0.7", (("row", (1.0, 1.0, 0.5, 0.5, 0.5, -1.0)), ("temperature", 0.5), ("top_p", 0.7))),
        Case(f"p = 1 on {LLAMA3_VOCAB:,} tokens (float32 cumsum short of 1)", (("random", LLAMA3_VOCAB, 3.0, 0),
                                                                             ("top_p", 1.0))),
        Case(f"p = 1 on {LLAMA3_VOCAB:,} tokens (float32 cumsum past 1)", (("random", LLAMA3_VOCAB, 1.0, 2),
                                                                          ("top_p", 1.0))),
        Case("temperature 0 with a tied maximum", (("row", (3.0, 1.0, 3.0, 2.0)), ("temperature", 0.0), ("top_p", 0.5))),
        Case("masked tokens at p = 1", (("row", (2.0, 1.0, 0.0, -1.0)), ("mask", (1, 3)), ("top_p", 1.0))),
        Case("masked tokens at p = 0.95", (("row", (2.0, 1.0, 0.0, -1.0)), ("mask", (0,)), ("top_p", 0.95))),
    ]
    randoms = []
    for t in range(num_random):
        vals = tuple(float(x) for x in rng.integers(-3, 4, int(rng.integers(3, 40))) / 2)  # coarse values: many ties
        randoms.append(Case(f"random program {t}", (("row", vals), ("top_p", float(rng.choice([0.3, 0.5, 0.8, 0.95, 1.0]))),
                                                    ("temperature", float(rng.choice([0.0, 0.5, 1.0, 2.0]))),
                                                    ("shuffle", 100 + t))))
    return scripted + randoms


def _top_p_describe(ops: Sequence) -> str:
    c = top_p_case(ops)
    z = c["logits"]
    row = (np.array2string(z, precision=3, separator=", ") if z.size <= 12
           else f"{z.size:,} logits (std {float(np.std(z[np.isfinite(z)])):.2g})")
    return f"  logits = {row} (float32)\n  top_p_keep(logits, top_p={c['top_p']:g}, temperature={c['temperature']:g})"


def check_top_p(candidate: Callable, num_random: int = 8, seed: int = 0) -> PracticeReport:
    """Grade any ``top_p_keep(logits, top_p, temperature) -> bool mask`` (the I087 rule above)."""
    if not callable(candidate):
        raise ValueError(f"check_top_p() takes a function top_p_keep(logits, top_p, temperature), got {candidate!r}")
    return grade(TOP_P_QUESTION, lambda: candidate, top_p_cases(num_random, seed), _top_p_run, _top_p_describe)
