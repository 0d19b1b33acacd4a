"""Token and KV bookkeeping of one sequence through speculative steps (I098): accepted, emitted and
computed tokens are different counts, and an EOS or an output cap can cut a step's accepted run.

A :class:`SpecState` is one sequence after prefill and some verification steps. Conventions:

* the sequence is the prompt plus ``output``; its length is L = prompt_len + len(output); the target's
  KV holds ``target_kv`` positions and, while the sequence runs, exactly L - 1: the last token has
  not been through the model (the next pass feeds it at position L - 1 and may read [0, L - 1));
* a step drafts k tokens; the drafter first catches up on the tokens it has not seen (L - draft_kv,
  ending with the last token) and then feeds k - 1 of its own drafts (the k-th is never fed), so its
  KV reaches L + k - 1; the target's pass feeds the last token and the k drafts (k + 1 positions,
  written at [L - 1, L + k));
* greedy verification (:func:`lib.decoding.verify.greedy_verify`) accepts n drafts; the step's
  candidate tokens are the target's tokens at positions 0..n (n + 1 of them); an EOS among them ends
  the output after the EOS, and the output cap ``max_tokens`` ends it after max_tokens tokens;
* target KV stays valid for the positions of tokens that are in the sequence and were fed:
  L + min(n, kept) after the step (kept = tokens appended); the rest of the k + 1 written slots are
  rolled back. The drafter's KV stays valid up to min(L + k - 1, that).

Counters (cumulative, the prefill's first token included in ``emitted``): ``drafted`` (sum of k),
``accepted`` (sum of n, as verified, before any EOS or cap), ``emitted`` (tokens appended),
``target_computed`` (positions the target scored: k + 1 per step), ``draft_computed`` (positions the
drafter fed), ``rolled_back`` (target KV slots written and then invalidated). Invariants (tested):
emitted = len(output); a step emits accepted + 1 tokens unless it ends the sequence (then between
1 and accepted + 1); while running target_kv = L - 1; target_computed = drafted + steps =
(target_kv - prompt_len) + rolled_back; the output equals plain greedy decoding of the target.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lib.inputs import integer

from .verify import greedy_verify

__all__ = ["SpecState", "StepTrace", "advance", "greedy_reference", "run_program", "start", "violations"]


@dataclass(frozen=True)
class SpecState:
    """One sequence's bookkeeping (module doc)."""

    prompt_len: int
    max_tokens: int
    eos: int
    output: tuple = ()
    target_kv: int = 0
    draft_kv: int = 0
    finished: str = ""  # "" while running, "eos" or "length" once done
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    target_computed: int = 0
    draft_computed: int = 0
    rolled_back: int = 0

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence: prompt plus output."""
        return self.prompt_len + len(self.output)

    @property
    def next_input_position(self) -> int | None:
        """Position of the token the next target pass feeds first (None once finished)."""
        return None if self.finished else self.seq_len - 1


def start(prompt_len: int, first_token: int, max_tokens: int, eos: int) -> SpecState:
    """The state after prefill: the prompt's KV written (prompt_len positions, target and drafter),
    the first output token sampled from the prefill's last logits (not fed yet)."""
    p = integer("prompt_len", prompt_len, 1)
    m = integer("max_tokens", max_tokens, 1)
    t = integer("first_token", first_token, 0)
    e = integer("eos", eos, 0)
    done = "eos" if t == e else ("length" if m == 1 else "")
    return SpecState(p, m, e, (t,), target_kv=p, draft_kv=p, finished=done, emitted=1, target_computed=0)


def advance(state: SpecState, drafted, target) -> SpecState:
    """One speculative step: ``drafted`` (k tokens) and the target's greedy tokens at the k + 1
    positions of the verification pass (``target``). Returns the new state (module doc)."""
    if state.finished:
        raise ValueError(f"the sequence already finished ({state.finished}): no further step")
    d = [int(x) for x in drafted]
    t = [int(x) for x in target]
    k = len(d)
    if len(t) != k + 1:
        raise ValueError(f"target must hold k + 1 = {k + 1} tokens (one per position of the pass), got {len(t)}")
    L = state.seq_len
    r = greedy_verify(np.array([t]), np.array(d, dtype=np.int64).reshape(1, k), [k])
    n = int(r.num_accepted[0])
    candidates = t[: n + 1]  # accepted drafts (equal to the target there), then the correction or bonus
    room = state.max_tokens - len(state.output)
    kept = candidates[:room]
    finished = ""
    if state.eos in kept:
        kept = kept[: kept.index(state.eos) + 1]  # the EOS ends the output; tokens after it are dropped
        finished = "eos"
    elif len(kept) == room:
        finished = "length"
    target_kv = L + min(n, len(kept))  # fed tokens still in the sequence
    draft_fed = (L - state.draft_kv) + (k - 1) if k else 0
    draft_kv = min(L + k - 1, target_kv) if k else state.draft_kv
    return replace(
        state,
        output=state.output + tuple(kept),
        target_kv=target_kv,
        draft_kv=draft_kv,
        finished=finished,
        steps=state.steps + 1,
        drafted=state.drafted + k,
        accepted=state.accepted + n,
        emitted=state.emitted + len(kept),
        target_computed=state.target_computed + k + 1,
        draft_computed=state.draft_computed + draft_fed,
        rolled_back=state.rolled_back + (L + k) - target_kv,
    )


def violations(before: SpecState, after: SpecState, accepted_step: int) -> list[str]:
    """The invariants of the module doc that ``after`` breaks (empty: none)."""
    out = []
    emitted_step = after.emitted - before.emitted
    if after.emitted != len(after.output):
        out.append(f"emitted counter {after.emitted} != tokens in the output {len(after.output)}")
    if not after.finished and emitted_step != accepted_step + 1:
        out.append(f"a step that does not end the sequence emits accepted + 1 = {accepted_step + 1}, got {emitted_step}")
    if after.finished and not 1 <= emitted_step <= accepted_step + 1:
        out.append(f"a final step emits 1 to accepted + 1 = {accepted_step + 1} tokens, got {emitted_step}")
    if len(after.output) > after.max_tokens:
        out.append(f"{len(after.output)} output tokens, above max_tokens = {after.max_tokens}")
    if after.eos in after.output[:-1]:
        out.append("an EOS inside the output (only the last token may be EOS)")
    if not after.finished and after.target_kv != after.seq_len - 1:
        out.append(f"running with target KV {after.target_kv} != sequence length - 1 = {after.seq_len - 1}: the next "
                   "pass would read slots that are not the sequence's tokens")
    if after.target_computed != after.drafted + after.steps:
        out.append(f"target computed {after.target_computed} != drafted + steps = {after.drafted + after.steps}")
    if after.target_computed != after.target_kv - after.prompt_len + after.rolled_back:
        out.append(f"target computed {after.target_computed} != valid KV gained {after.target_kv - after.prompt_len} "
                   f"+ rolled back {after.rolled_back}")
    if after.draft_kv > after.target_kv:
        out.append(f"drafter KV {after.draft_kv} ahead of the target's {after.target_kv}")
    return out


@dataclass(frozen=True)
class StepTrace:
    """One step of :func:`run_program`: the inputs, the accepted count and the state after it."""

    drafted: tuple
    target: tuple
    accepted: int
    state: SpecState


def greedy_reference(next_token, prompt: tuple, first_token: int, max_tokens: int, eos: int) -> tuple:
    """Plain greedy decoding of the target: ``next_token(context)`` until EOS or max_tokens."""
    out = [first_token]
    while out[-1] != eos and len(out) < max_tokens:
        out.append(int(next_token(prompt + tuple(out))))
    return tuple(out)


def run_program(next_token, draft_token, prompt: tuple, first_token: int, max_tokens: int, eos: int,
                draft_lengths, step=advance, max_steps: int | None = None) -> list[StepTrace]:
    """Drive ``step`` (the reference :func:`advance`, or a candidate's) with a target ``next_token(context)``
    and a drafter ``draft_token(context)``, drafting ``draft_lengths[i]`` tokens at step i (the last
    length repeats) until the sequence finishes, or after ``max_steps`` steps (None: no limit; a fixed
    number of steps ends a run without cutting its last step, as an EOS or max_tokens would). The
    verification pass's tokens are the target's greedy tokens after each drafted prefix."""
    limit = None if max_steps is None else integer("max_steps", max_steps, 1)
    state = start(len(prompt), first_token, max_tokens, eos)
    trace, i = [], 0
    lengths = list(draft_lengths) or [0]
    while not state.finished and (limit is None or i < limit):
        k = lengths[min(i, len(lengths) - 1)]
        ctx = prompt + state.output
        d: list = []
        for _ in range(k):
            d.append(int(draft_token(ctx + tuple(d))))
        t = tuple(int(next_token(ctx + tuple(d[:j]))) for j in range(k + 1))
        n = int(greedy_verify(np.array([t]), np.array(d, dtype=np.int64).reshape(1, k), [k]).num_accepted[0])
        state = step(state, tuple(d), t)
        trace.append(StepTrace(tuple(d), t, n, state))
        i += 1
        if i > 10 * max_tokens + 10:
            raise ValueError("the step function never finishes the sequence")
    return trace
