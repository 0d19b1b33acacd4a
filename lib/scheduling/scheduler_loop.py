"""The scheduler loop of one engine step, standalone (I088): three queues, one token budget.

:func:`schedule_step` is the decision a continuous-batching engine takes once per step, small
enough to write at a whiteboard; :func:`advance` applies a step's decisions (the model side:
tokens written, blocks held, requests finished) and :func:`run_loop` alternates the two until
every request has finished. The engine of :mod:`lib.scheduling.engine` makes the same decisions
under ``Policy(chunked_prefill=True, preemption="recompute", order="fcfs")`` (the unit tests
hold the two to each other step by step); this module is the readable version.

A :class:`Seq` is a request inside the scheduler: ``prefill_left`` tokens still to prefill (0:
it decodes), ``context`` tokens whose KV sits in the pool, ``output_left`` tokens still to emit,
``blocks`` KV blocks held. A :class:`SchedState` holds three queues, each a tuple in its order:
``waiting`` (never started, FCFS), ``running`` (admission order) and ``preempted`` (victims that
lost their blocks, FCFS by ``rid``), plus the free blocks of the pool. The rules, in order:

1. **Decodes first.** Every running decode gets one token of the budget, in running order; one
   whose next token crosses a block boundary needs ``ceil((context + 1) / block_size) -
   blocks`` more blocks; while the pool is short, the newest running request is preempted
   (possibly the one asking, which then does not decode).
2. **Running prefills next**, in running order: a chunk ``min(prefill_left, left)``; a chunk
   short of blocks preempts the newest running request the same way.
3. **Admissions last, and only if nobody was preempted this step**: first the preempted queue
   (a victim resumes before any new request, so it cannot starve), then waiting, each while
   tokens are left and fewer than ``max_running`` run; the head's first chunk ``min(
   prefill_left, left)`` must fit the free blocks, else admission stops (no skipping).

A preempted request loses its KV (recompute): it re-prefills ``context + prefill_left`` tokens
if it was prefilling, ``context + 1`` (prompt and generated tokens) if it was decoding; the
step that completes a prefill emits a token. SI units do not arise: tokens and blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from lib.inputs import integer

__all__ = ["Seq", "SchedState", "Step", "schedule_step", "advance", "check_invariants", "initial_state",
           "run_loop", "blocks_for"]


def blocks_for(tokens: int, block_size: int) -> int:
    """ceil(tokens / block_size): KV blocks that hold ``tokens`` tokens."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class Seq:
    """A request inside the scheduler (tokens and blocks; see the module doc)."""

    rid: int
    prefill_left: int
    output_left: int
    context: int = 0
    blocks: int = 0

    @property
    def decoding(self) -> bool:
        """Prefill done: each step it gets one token."""
        return self.prefill_left == 0


@dataclass(frozen=True)
class SchedState:
    """Three queues (tuples of :class:`Seq`), the free blocks and the pool's geometry."""

    waiting: tuple = ()
    running: tuple = ()
    preempted: tuple = ()
    free_blocks: int = 0
    block_size: int = 16
    max_running: int = 256


@dataclass(frozen=True)
class Step:
    """One step's decisions: the decodes (rids), prefill chunks ((rid, tokens), in order,
    resumed and admitted ones included), the rids preempted, resumed (from the preempted
    queue) and admitted (from waiting)."""

    decodes: tuple = ()
    chunks: tuple = ()
    preempted: tuple = ()
    resumed: tuple = ()
    admitted: tuple = ()
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", len(self.decodes) + sum(c for _, c in self.chunks))


def initial_state(requests: Sequence[tuple[int, int]], num_blocks: int, block_size: int = 16,
                  max_running: int = 256) -> SchedState:
    """All ``requests`` ((prompt_len, output_len) each, rid = index) waiting in an empty pool."""
    integer("num_blocks", num_blocks, 1, unit="blocks")
    integer("block_size", block_size, 1, unit="tokens")
    integer("max_running", max_running, 1)
    seqs = []
    for rid, (p, o) in enumerate(requests):
        seqs.append(Seq(rid, integer("prompt_len", p, 1), integer("output_len", o, 1)))
    return SchedState(tuple(seqs), (), (), num_blocks, block_size, max_running)


def schedule_step(state: SchedState, budget: int) -> Step:
    """The reference scheduler loop: decodes, then running prefills, then resumes and admissions
    (module doc), never more than ``budget`` tokens. Does not mutate ``state``."""
    integer("budget", budget, state.max_running)
    free, bs = state.free_blocks, state.block_size
    running = list(state.running)  # shrinks from the end as victims go
    held = {s.rid: s.blocks for s in running}
    decodes, chunks, preempted = [], [], []
    left = budget

    def make_room(seq: Seq, need: int) -> bool:
        nonlocal free
        while free < need:
            victim = running.pop()  # the newest running request
            preempted.append(victim.rid)
            free += held[victim.rid]
            if victim.rid == seq.rid:
                return False
        return True

    for phase in ("decode", "prefill"):
        if phase == "prefill":
            decodes = [r for r in decodes if r not in preempted]
            left = budget - len(decodes)  # what the decodes leave
        for seq in list(running):
            if seq not in running or seq.decoding != (phase == "decode") or left <= 0:
                continue
            c = 1 if seq.decoding else min(seq.prefill_left, left)
            need = blocks_for(seq.context + c, bs) - seq.blocks
            if need > 0:
                if not make_room(seq, need):
                    continue
                free -= need
                held[seq.rid] += need
            if seq.decoding:
                decodes.append(seq.rid)
            else:
                chunks.append((seq.rid, c))
                left -= c
    decodes = [r for r in decodes if r not in preempted]  # a prefill's make_room may take a decode
    chunks = [(r, c) for r, c in chunks if r not in preempted]
    resumed, admitted = [], []
    if not preempted:
        n_running = len(running)
        for queue, taken in ((state.preempted, resumed), (state.waiting, admitted)):
            for seq in queue:
                if left <= 0 or n_running >= state.max_running:
                    break
                c = min(seq.prefill_left, left)
                need = blocks_for(c, bs)
                if need > free:
                    break
                free -= need
                taken.append(seq.rid)
                chunks.append((seq.rid, c))
                left -= c
                n_running += 1
            else:
                continue
            break
    return Step(tuple(decodes), tuple(chunks), tuple(preempted), tuple(resumed), tuple(admitted))


def _victim(seq: Seq) -> Seq:
    redo = seq.context + (seq.prefill_left if not seq.decoding else 1)
    return replace(seq, prefill_left=redo, context=0, blocks=0)


def check_invariants(state: SchedState, budget: int, step: Step) -> None:
    """The properties any correct step satisfies; AssertionError naming the first one broken.

    Budget: tokens <= budget. Decodes first: every running decode that was not preempted gets a
    token. Queues: a rid is decided at most once per role, decisions name only rids of the right
    queue, nobody is admitted or resumed in a step that preempted, a victim was running, no
    resume is skipped for an admission. Chunks: positive, at most the tokens left to prefill.
    """
    if step.tokens > budget:
        raise AssertionError(f"the step schedules {step.tokens} tokens, over the budget of {budget}")
    running = {s.rid: s for s in state.running}
    waiting = {s.rid: s for s in state.waiting}
    pre = {s.rid: s for s in state.preempted}
    victims = set(step.preempted)
    if len(victims) != len(step.preempted) or not victims <= running.keys():
        raise AssertionError(f"preempted {list(step.preempted)}: each victim must be a running request, once")
    for rid, s in running.items():
        if s.decoding and rid not in victims and rid not in step.decodes:
            raise AssertionError(f"running decode {rid} got no token (decodes come first: each gets one)")
    if not set(step.decodes) <= {r for r, s in running.items() if s.decoding} or len(set(step.decodes)) != len(step.decodes):
        raise AssertionError(f"decodes {list(step.decodes)}: only running decodes, once each")
    if victims & set(step.decodes):
        raise AssertionError(f"request {sorted(victims & set(step.decodes))[0]} is both preempted and decoded")
    chunk_rids = [r for r, _ in step.chunks]
    if len(set(chunk_rids)) != len(chunk_rids):
        raise AssertionError(f"chunks {list(step.chunks)}: one chunk per request per step")
    for rid, c in step.chunks:
        seq = running.get(rid) or waiting.get(rid) or pre.get(rid)
        if seq is None or rid in victims or (rid in running and seq.decoding):
            raise AssertionError(f"chunk for request {rid}: not a prefilling request of any queue (or preempted)")
        if not 0 < c <= seq.prefill_left:
            raise AssertionError(f"chunk ({rid}, {c}): must be 1..{seq.prefill_left} tokens (what is left to prefill)")
    if (step.resumed or step.admitted) and step.preempted:
        raise AssertionError("admitted or resumed a request in a step that preempted one")
    if not set(step.resumed) <= pre.keys() or not set(step.admitted) <= waiting.keys():
        raise AssertionError("resumed must come from the preempted queue and admitted from waiting")
    if set(step.resumed) | set(step.admitted) != {r for r in chunk_rids if r not in running}:
        raise AssertionError("every resumed or admitted request gets a chunk, and only those outside running")
    if step.admitted and len(step.resumed) < len(state.preempted):
        raise AssertionError(f"admitted {list(step.admitted)} from waiting while preempted request "
                             f"{state.preempted[len(step.resumed)].rid} did not resume (a victim goes first)")
    if len(state.running) - len(victims) + len(step.resumed) + len(step.admitted) > state.max_running:
        raise AssertionError(f"more than max_running={state.max_running} requests running")


def advance(state: SchedState, step: Step) -> tuple[SchedState, tuple[int, ...]]:
    """Apply ``step`` to ``state``: victims lose their blocks and join the preempted queue (rid
    order); admitted and resumed requests join running; chunks and decodes write their tokens and
    take the blocks they need (ValueError if the pool is short: an over-allocating step); a
    completed prefill emits a token. Returns the new state and the rids that finished."""
    bs, free = state.block_size, state.free_blocks
    by_rid = {s.rid: s for s in (*state.waiting, *state.running, *state.preempted)}
    victims = set(step.preempted)
    running = [s for s in state.running if s.rid not in victims]
    free += sum(s.blocks for s in state.running if s.rid in victims)
    preempted = sorted([s for s in state.preempted if s.rid not in step.resumed]
                       + [_victim(s) for s in state.running if s.rid in victims], key=lambda s: s.rid)
    new = [by_rid[r] for r in (*step.resumed, *step.admitted)]
    running += new
    waiting = [s for s in state.waiting if s.rid not in step.admitted]
    chunk = dict(step.chunks)
    finished = []
    out = []
    for s in running:
        c = 1 if s.rid in step.decodes else chunk.get(s.rid, 0)
        if c == 0:
            out.append(s)
            continue
        need = max(0, blocks_for(s.context + c, bs) - s.blocks)
        if need > free:
            raise ValueError(f"request {s.rid} needs {need} block(s), {free} free: the step over-allocates the pool")
        free -= need
        emits = 1 if s.decoding or c == s.prefill_left else 0
        s = replace(s, context=s.context + c, blocks=s.blocks + need,
                    prefill_left=s.prefill_left - (0 if s.decoding else c), output_left=s.output_left - emits)
        if s.output_left == 0:
            finished.append(s)
        else:
            out.append(s)
    free += sum(s.blocks for s in finished)  # a finished request frees its blocks after the step
    finished = [s.rid for s in finished]
    return SchedState(tuple(waiting), tuple(out), tuple(preempted), free, bs, state.max_running), tuple(finished)


def run_loop(requests: Sequence[tuple[int, int]], budget: int, num_blocks: int, block_size: int = 16,
             max_running: int = 256, schedule: Callable[[SchedState, int], Step] = schedule_step,
             max_steps: int = 100_000, check: bool = True) -> list[tuple[SchedState, Step]]:
    """Run ``schedule`` and :func:`advance` until every request finishes: [(state before, step)].

    ``check``: assert :func:`check_invariants` at every step. A request whose prompt + output
    can never fit the pool, or a step that schedules nothing with work left, raises ValueError.
    """
    state = initial_state(requests, num_blocks, block_size, max_running)
    integer("budget", budget, max_running)
    for p, o in requests:
        if blocks_for(p + o - 1, block_size) > num_blocks:
            raise ValueError(f"a request of {p} + {o} tokens needs more than the pool's {num_blocks} blocks")
    trace = []
    for _ in range(integer("max_steps", max_steps, 1)):
        if not (state.waiting or state.running or state.preempted):
            return trace
        step = schedule(state, budget)
        if check:
            check_invariants(state, budget, step)
        if step.tokens == 0 and not step.preempted:
            raise ValueError("the scheduler made no progress with work left (a stall)")
        trace.append((state, step))
        state, _ = advance(state, step)
    raise ValueError(f"not finished after max_steps={max_steps} steps")
