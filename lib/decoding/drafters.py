"""Drafters: prompt lookup (n-gram matching, no model, no training) and the cost of an EAGLE head.

Prompt lookup (Saxena 2023; vLLM's ``ngram`` speculator, knobs ``prompt_lookup_min`` /
``prompt_lookup_max`` / ``num_speculative_tokens``): take the last n tokens of the sequence
(prompt plus output so far), find an earlier occurrence of those n tokens, and propose the k tokens
that followed it. :func:`prompt_lookup_propose` is vLLM's rule: the longest n in [min_n, max_n]
with a match, and among matches of that length the earliest one. :func:`lookup_trace` replays a
greedy generation whose output is known (a deterministic target: greedy verification emits exactly
the target's own tokens), step by step: what was drafted, how many the target accepted, and the one
token it adds. :func:`lookup_cost` prices that trace on a deployment with the book's speculative
step (:func:`lib.decoding.speculative.speculative_step` with :func:`free_drafter`).

Token ids come from :class:`lib.decoding.tokenizer.WordTokenizer` (words with a leading space, punctuation runs, whitespace;
or characters): deterministic, round-trips exactly, enough to show where n-grams match.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from lib.inputs import integer, real

__all__ = [
    "eagle_head_drafter",
    "eagle_head_model",
    "eagle_head_params",
    "eagle_head_step",
    "matching_acceptance",
    "LookupCost",
    "LookupStep",
    "LookupTrace",
    "lookup_cost",
    "lookup_trace",
    "prompt_lookup_propose",
]


# ---- the proposer ------------------------------------------------------------------------------


def _check_ngram_sizes(min_n: int, max_n: int) -> tuple[int, int]:
    lo = integer("min_n", min_n, 1, 16, unit="tokens")
    hi = integer("max_n", max_n, 1, 16, unit="tokens")
    if hi < lo:
        raise ValueError(f"max_n must be >= min_n ({lo}); got {hi}")
    return lo, hi


def prompt_lookup_match(tokens: Sequence[int], min_n: int = 1, max_n: int = 3) -> tuple[int, int] | None:
    """The n-gram match prompt lookup uses: ``(n, end)`` where ``tokens[end - n:end]`` equals the
    last n tokens, ``end < len(tokens)`` (an earlier occurrence, overlaps allowed), n the largest
    in [min_n, max_n] that has one, and ``end`` the earliest of its occurrences; None if none."""
    lo, hi = _check_ngram_sizes(min_n, max_n)
    t = list(tokens)
    size = len(t)
    for n in range(min(hi, size - 1), lo - 1, -1):
        suffix = t[size - n:]
        for start in range(0, size - n):
            if t[start:start + n] == suffix:
                return n, start + n
    return None


def prompt_lookup_propose(tokens: Sequence[int], draft_tokens: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Up to ``draft_tokens`` (k) tokens that followed the match of :func:`prompt_lookup_match`
    (fewer when the sequence ends first; none without a match). vLLM's ``NgramProposer`` rule:
    longest n-gram, then earliest occurrence."""
    k = integer("draft_tokens", draft_tokens, 0, 64, unit="tokens")
    match = prompt_lookup_match(tokens, min_n, max_n)
    if match is None or k == 0:
        return []
    _, end = match
    return list(tokens[end:end + k])


class _NgramIndex:
    """The sequence so far and, for every n-gram (n <= max_n) ending before its last token, the end
    of its earliest occurrence: :func:`prompt_lookup_match` in O(max_n) per query instead of a scan
    (the tests hold the two equal)."""

    def __init__(self, max_n: int):
        self.max_n, self.seq, self.first = max_n, [], {}

    def extend(self, tokens) -> None:
        for t in tokens:
            end = len(self.seq)  # n-grams ending here now end before the last token
            for n in range(1, min(self.max_n, end) + 1):
                self.first.setdefault(tuple(self.seq[end - n:end]), end)
            self.seq.append(t)

    def match(self, min_n: int, max_n: int) -> tuple[int, int] | None:
        size = len(self.seq)
        for n in range(min(max_n, size - 1), min_n - 1, -1):
            end = self.first.get(tuple(self.seq[size - n:]))
            if end is not None:
                return n, end
        return None


# ---- replaying a generation ---------------------------------------------------------------------


@dataclass(frozen=True)
class LookupStep:
    """One verification step: the output position it starts at, the n-gram that matched (0: none)
    and where its earliest occurrence ends in prompt + output (-1: none), the drafted tokens, how
    many the target accepted, and the tokens the step emitted (accepted plus the target's own next
    token)."""

    position: int
    ngram: int
    source: int
    draft: tuple[int, ...]
    accepted: int
    emitted: tuple[int, ...]


@dataclass(frozen=True)
class LookupTrace:
    """A whole generation under prompt lookup with greedy verification."""

    steps: tuple[LookupStep, ...]
    output_tokens: int
    draft_tokens: int  # k, the most tokens one step may draft
    min_n: int
    max_n: int

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(len(s.draft) for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens (vLLM's acceptance rate); 0 when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per verification step (1 without speculation)."""
        return self.output_tokens / self.n_steps

    @property
    def proposal_rate(self) -> float:
        """Fraction of steps that drafted at least one token (and so paid a wider verify pass)."""
        return sum(bool(s.draft) for s in self.steps) / self.n_steps

    def draft_lengths(self) -> dict[int, int]:
        """{tokens drafted in a step: number of steps}."""
        out: dict[int, int] = {}
        for s in self.steps:
            out[len(s.draft)] = out.get(len(s.draft), 0) + 1
        return dict(sorted(out.items()))


def lookup_trace(prompt: Sequence[int], output: Sequence[int], draft_tokens: int, min_n: int = 1,
                 max_n: int = 3) -> LookupTrace:
    """Replay the generation of ``output`` after ``prompt`` with prompt lookup and greedy
    verification. ``output`` is what the target emits token by token (at temperature 0 speculation
    is lossless, so the output is the same with or without it). Each step drafts with
    :func:`prompt_lookup_propose` on prompt + output so far, accepts the longest prefix of the draft
    that agrees with the output, and emits it plus the target's next token (the correction or the
    bonus token); the last step is cut at the end of ``output`` (the request's EOS)."""
    k = integer("draft_tokens", draft_tokens, 0, 64, unit="tokens")
    lo, hi = _check_ngram_sizes(min_n, max_n)
    prompt, output = list(prompt), list(output)
    if not output:
        raise ValueError("output must hold at least one token")
    steps, pos = [], 0
    index = _NgramIndex(hi)
    index.extend(prompt)
    while pos < len(output):
        match = index.match(lo, hi) if k else None
        draft = index.seq[match[1]:match[1] + k] if match else []
        acc = 0
        while acc < len(draft) and pos + acc < len(output) and draft[acc] == output[pos + acc]:
            acc += 1
        emitted = output[pos:min(pos + acc + 1, len(output))]
        steps.append(LookupStep(pos, *(match or (0, -1)), tuple(draft), acc, tuple(emitted)))
        index.extend(emitted)
        pos += len(emitted)
    return LookupTrace(tuple(steps), len(output), k, lo, hi)


# ---- what a trace costs on a deployment -----------------------------------------------------------


@dataclass(frozen=True)
class LookupCost:
    """A trace priced on a deployment for ``batch`` copies of the request: seconds with prompt
    lookup (every step's draft cost plus its verify pass) and without (one plain step per token)."""

    batch: int
    spec_s: float
    plain_s: float
    output_tokens: int
    verify_overhead: float  # the widest verify pass of the trace over a plain step

    @property
    def speedup(self) -> float:
        """Plain time over time with prompt lookup (< 1: it slows the replica down)."""
        return self.plain_s / self.spec_s


def lookup_cost(dep, trace: LookupTrace, batch: int = 1, context: int = 0, host_s_per_token: float = 0.0,
                assume=None) -> LookupCost:
    """Price ``trace`` with :func:`lib.decoding.speculative.speculative_step` for a batch of
    ``batch`` copies of the request (every sequence drafts what the trace drafted): a step that
    drafted d tokens costs ``speculative_step(dep, free_drafter(token_s=host_s_per_token), d, ...)``
    (the verify pass at d + 1 query tokens per sequence plus d host-side lookups); plain decoding
    costs one plain step per output token. Step times at one ``context`` (a fixed length: the
    error is the trace's own length of context). Seconds."""
    from lib.decoding.speculative import free_drafter, speculative_step

    if not isinstance(trace, LookupTrace):
        raise ValueError(f"trace must be a LookupTrace (lookup_trace(...)); got {type(trace).__name__}")
    b = integer("batch", batch, 1, unit="sequences")
    host = real("host_s_per_token", host_s_per_token, 0.0, unit="seconds")
    drafter = free_drafter(token_s=host)
    by_len = {d: speculative_step(dep, drafter, d, 0.0, b, context, assume)
              for d in {len(s.draft) for s in trace.steps} | {0}}
    spec = sum(by_len[len(s.draft)].step_s for s in trace.steps)
    plain = by_len[0].plain_step_s * trace.output_tokens
    widest = max(s.verify_overhead for s in by_len.values())
    return LookupCost(b, spec, plain, trace.output_tokens, widest)


# ---- the two requests the notebook traces ---------------------------------------------------------

FUNCTION = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    out = []
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

CHAT_PROMPT = "Any ideas for a rainy Sunday afternoon at home with two kids, aged six and nine?\n"

CHAT_REPLY = (
    "Here are a few that work well at those ages. Build a blanket fort in the living room and "
    "let them read or watch a film inside it. Bake something simple together, such as muffins or "
    "pizza, and give each child a job. Set up a treasure hunt with clues hidden around the house; "
    "the older one can write clues for the younger one. Try a board game tournament with a small "
    "prize, or a puzzle you finish as a family. If they need to move, clear some space for a dance "
    "contest or an obstacle course made of cushions. Finally, a craft project with paper, tape and "
    "old boxes can keep both busy for an hour or more.\n"
)


def rename_request(old: str = "total", new: str = "running_sum", code: str = FUNCTION) -> tuple[str, str]:
    """(prompt, reply) of a code-rename request: the prompt asks to rename identifier ``old`` to
    ``new`` in ``code`` and reply with the code only; the reply is ``code`` with every whole-word
    ``old`` replaced (what a competent target emits)."""
    for name, value in (("old", old), ("new", new)):
        if not (isinstance(value, str) and value.isidentifier()):
            raise ValueError(f"{name} must be a Python identifier; got {value!r}")
    if old == new:
        raise ValueError(f"new must differ from old; both are {old!r}")
    if not re.search(rf"\b{old}\b", code):
        raise ValueError(f"old must occur in the code as a whole word; {old!r} does not")
    prompt = f"Rename the variable {old} to {new} in this function. Reply with the code only.\n\n{code}\n"
    return prompt, re.sub(rf"\b{old}\b", new, code)


# ---- the EAGLE head as a Drafter -------------------------------------------------------------------


def eagle_head_model(target, fc_inputs: int = 2):
    """The EAGLE draft head of ``target`` (a model name or :class:`~lib.registry.models.Model`) as a
    one-layer model of the target's shape: one decoder layer (the target's attention and MLP
    sizes), the target's embedding and LM head (shared, not trained), and EAGLE's input projection
    ``fc``: [feature, next-token embedding] (``fc_inputs`` = 2 vectors of hidden size h; EAGLE-3
    fuses 3 feature vectors, 3) -> h, ``fc_inputs * h^2`` weights. The fc is priced as extra MLP
    width, ``fc_inputs * h / 3`` (a SwiGLU MLP holds 3 h weights per unit of width): same bytes and
    FLOPs per token, so the book's step model prices the head with no new kernel. Dense models only."""
    from lib.registry.models import model

    m = model(target)
    if m.is_moe or m.is_mla or m.mlp != "swiglu":
        raise ValueError(f"target must be a dense SwiGLU model (the EAGLE head copies its layer shape); got {m.key}")
    n = integer("fc_inputs", fc_inputs, 1, 4, unit="hidden-size vectors")
    return dataclasses.replace(m, key=f"{m.key}-eagle-head", num_layers=1,
                               intermediate_size=m.intermediate_size + round(n * m.hidden_size / 3),
                               published=MappingProxyType({}))


def eagle_head_params(target, fc_inputs: int = 2) -> int:
    """Trained parameters of the EAGLE head: one decoder layer plus the fc (embedding and LM head
    are the target's own). EAGLE's LLaMA2-Chat 70B head (same layer shape as Llama 3.1 70B): 0.99B."""
    h = eagle_head_model(target, fc_inputs)
    return h.params_total - h.params_embedding - h.params_lm_head - h._norm_params()


@functools.cache
def _head_deployment_class():
    """A :class:`~lib.perf.deployment.Deployment` whose ``mdl`` is a given model rather than the
    registry's entry for its name (built once; lib.perf is imported only when needed)."""
    from lib.perf.deployment import Deployment

    @dataclasses.dataclass(frozen=True)
    class HeadDeployment(Deployment):
        head: object = None

        @property
        def mdl(self):
            return self.head

        @property
        def label(self) -> str:
            return f"EAGLE head of {super().label}"

    return HeadDeployment


@functools.cache
def _head_deployment(target_dep, fc_inputs: int):
    """``target_dep`` with its model swapped for its EAGLE head (same GPUs, TP, dtypes): a
    Deployment that :func:`lib.perf.step.decode_step` prices as is."""
    from lib.perf.deployment import Deployment

    fields = {f.name: getattr(target_dep, f.name) for f in dataclasses.fields(Deployment)}
    return _head_deployment_class()(**fields, head=eagle_head_model(target_dep.mdl, fc_inputs))


def eagle_head_drafter(target_dep, fc_inputs: int = 2, assume=None):
    """The EAGLE head of ``target_dep``'s model, on the target's own GPUs, as a
    :class:`~lib.decoding.speculative.Drafter` of kind ``head``: each drafted token is one
    :func:`lib.perf.step.decode_step` of :func:`eagle_head_model` at the same batch and context
    (one layer, its own one-layer KV cache, the full LM head, the TP all-reduces). ``assume``: step
    assumptions (pass the same to :func:`~lib.decoding.speculative.model_drafter` to compare)."""
    from lib.decoding.speculative import Drafter
    from lib.perf.deployment import require
    from lib.perf.step import decode_step

    require(target_dep)
    dep = _head_deployment(target_dep, integer("fc_inputs", fc_inputs, 1, 4))
    return Drafter(dep.label, "head", lambda b, c: decode_step(dep, b, c, assume).total_s)


def eagle_head_step(target_dep, batch: int = 1, context: int = 0, fc_inputs: int = 2, assume=None):
    """The :class:`~lib.perf.step.DecodeStep` of one EAGLE-head forward (its buckets: weights, KV,
    all-reduces ...), as :func:`eagle_head_drafter` prices it."""
    from lib.perf.deployment import require
    from lib.perf.step import decode_step

    require(target_dep)
    return decode_step(_head_deployment(target_dep, integer("fc_inputs", fc_inputs, 1, 4)), batch, context, assume)


def matching_acceptance(dep, drafter, draft_tokens: int, tokens_per_s: float, batch: int = 1, context: int = 0,
                        assume=None) -> float:
    """The per-token acceptance ``drafter`` needs for :func:`~lib.decoding.speculative.speculative_step`
    to reach ``tokens_per_s`` (replica output tokens per second) at this batch and context:
    bisection on a (throughput rises with a). ``math.inf`` when even a = 1 falls short; 0 when a = 0
    already reaches it."""
    import math

    from lib.decoding.speculative import speculative_step

    goal = real("tokens_per_s", tokens_per_s, 0, low_open=True, unit="tokens/s")

    def rate(a):
        return speculative_step(dep, drafter, draft_tokens, a, batch, context, assume).tokens_per_s

    if rate(1.0) < goal:
        return math.inf
    if rate(0.0) >= goal:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rate(mid) < goal else (lo, mid)
    return hi
