"""A mini serving engine (I063): admit, chunk, preempt, sample and stream in one readable class.

:class:`MiniEngine` is what a candidate can write in an interview. Each :meth:`~MiniEngine.step`
spends at most ``token_budget`` tokens on at most ``max_running`` requests:

1. **Decodes first.** Every running request whose prefill is done feeds its last sampled token
   (one token of the budget, one KV slot).
2. **Running prefills next**, in admission order, each a chunk of ``min(tokens left to prefill,
   budget left)``: a prompt longer than the budget is prefilled over several steps.
3. **Admissions last**, first come first served with preempted requests at the front, while
   budget and ``max_running`` allow and the first chunk's blocks are free; nobody is admitted in a
   step that had to preempt, and an admission never preempts anyone (it waits).
4. **Sample and stream.** The model reads each request's KV back from the pool and samples one
   token for every request whose KV now holds all of its tokens (a decode, or a prefill whose last
   chunk ran). The token goes to the request's ``on_token`` callback at once; the request finishes
   on EOS or at ``max_tokens`` and frees its blocks.

**Where the KV accounting lives: in the allocator, and only there.** The engine never counts
blocks. It writes each token's KV in the step that computes it through
:class:`lib.kvcache.allocator.BlockAllocator` (``allocate`` for an admission's first chunk,
``append_token`` after that; both all or nothing) and calls ``free`` when a request finishes or
is preempted. Whether something fits is the allocator's answer (:class:`OutOfBlocks`), not a
second count kept by the scheduler that could drift from it.

**When the pool runs dry** a running request's write raises ``OutOfBlocks``: the engine preempts
the **youngest** running request (admitted last) and retries, by **recompute**: the victim's blocks
are freed, it goes to the front of the waiting queue, and once readmitted it prefills its prompt
plus every token it already streamed, then samples the next one. Its stream continues where it
stopped; nothing is sent twice. Why the youngest: it holds the least KV (least work thrown away),
and the oldest running request can then never be a victim unless it runs alone, when the whole
pool is its own; so the oldest always progresses and every request finishes (no livelock). Why
preempt instead of refusing at admission: reserving each request's worst case (prompt +
``max_tokens``) never preempts but runs fewer requests at once and holds blocks a request that
stops at EOS never uses; preemption runs more and pays recompute only when the pool really runs
dry. **A request that alone exceeds the pool** (prompt + ``max_tokens`` - 1 KV tokens, more than
``num_blocks x block_size``) is refused at :meth:`~MiniEngine.submit` with status ``"refused"``
and a reason: admitted, it would end up alone, unable to grow, preempting itself forever (a
livelock that looks like a deadlock from outside).

The model is :class:`FakeModel`: the next token is a pure function of the request's tokens so far
and a seed, so a test knows every stream in advance (:meth:`FakeModel.continuation`). The engine
counts steps and tokens, not seconds; :func:`step_seconds` prices its steps with a cost of
:mod:`lib.scheduling.cost` (``step_cost(dep)`` or ``LinearCost``), as :func:`lib.scheduling.simulate`
does. With ``LinearCost(fixed_s=1)`` and arrivals at whole steps, :func:`lib.scheduling.simulate`
under ``Policy(chunked_prefill=True, preemption="recompute", order="fcfs")`` makes the same
decisions step by step (the unit tests hold the two to each other).
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lib.inputs import integer
from lib.kvcache.allocator import BlockAllocator, OutOfBlocks

__all__ = ["FakeModel", "Job", "MiniEngine", "Preemption", "Seq", "Served", "StepRecord", "make_jobs", "prefill_split",
           "recompute_seconds", "replay", "serve", "sim_requests", "step_seconds", "timeline_seconds"]


@dataclass(frozen=True)
class FakeModel:
    """A deterministic stand-in for forward pass + sampling: ``next_token(tokens) = crc32(tokens,
    seed) mod vocab``. ``eos`` (None: never) ends a stream; with ``vocab`` V each token is EOS
    with probability about 1 / V."""

    seed: int = 0
    vocab: int = 32_000
    eos: int | None = None

    def __post_init__(self) -> None:
        integer("seed", self.seed, 0, 2**32 - 1)
        integer("vocab", self.vocab, 2)
        if self.eos is not None:
            integer("eos", self.eos, 0, self.vocab - 1, unit="(a token id below vocab)")

    def next_token(self, tokens: Sequence[int]) -> int:
        """The token that follows ``tokens`` (the prompt and everything sampled so far)."""
        return zlib.crc32(array("q", tokens).tobytes(), self.seed) % self.vocab

    def continuation(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """What a correct engine streams for ``prompt``: up to ``max_tokens`` tokens, EOS included."""
        tokens, out = list(prompt), []
        while len(out) < max_tokens and (not out or out[-1] != self.eos):
            out.append(self.next_token(tokens))
            tokens.append(out[-1])
        return out


@dataclass(eq=False)
class Seq:
    """A request inside the engine. ``todo``: tokens left to prefill (0: it decodes)."""

    rid: int
    prompt: tuple[int, ...]
    max_tokens: int
    on_token: Callable[[int], object] | None
    order: int  # submission order: first come, first served
    submitted: int  # the engine's step count at submission
    out: list[int] = field(default_factory=list)  # tokens streamed so far
    todo: int = 0
    status: str = "waiting"  # waiting | running | finished | refused
    reason: str = ""  # finished: "eos" or "length"; refused: why
    first_token: int | None = None  # step index that streamed the first token
    finished_at: int | None = None  # step index that streamed the last token
    preemptions: int = 0
    recomputed: int = 0  # KV tokens thrown away by preemptions (computed again later)

    @property
    def tokens(self) -> list[int]:
        """The prompt and every token streamed so far: what the KV must end up holding."""
        return [*self.prompt, *self.out]


@dataclass(frozen=True)
class StepRecord:
    """One step: decodes (rids), prefill chunks ``(rid, tokens, position)``, the rids preempted
    and finished, KV blocks in use while it ran, the KV tokens its decodes read, queue lengths."""

    index: int
    decodes: tuple[int, ...]
    chunks: tuple[tuple[int, int, int], ...]
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    used_blocks: int
    context_tokens: int
    running: int
    waiting: int

    @property
    def tokens(self) -> int:
        """Tokens this step computed: one per decode plus every chunk's."""
        return len(self.decodes) + sum(c for _, c, _ in self.chunks)


class MiniEngine:
    """The engine of the module doc, on ``alloc`` (its one KV ledger) and ``model``."""

    def __init__(self, alloc: BlockAllocator, model: FakeModel, token_budget: int, max_running: int) -> None:
        self.alloc, self.model = alloc, model
        self.max_running = integer("max_running", max_running, 1)
        self.budget = integer("token_budget", token_budget, self.max_running, unit="tokens (>= max_running)")
        self.seqs: dict[int, Seq] = {}
        self.waiting: list[Seq] = []  # preempted first, then by submission
        self.running: list[Seq] = []  # in admission order: the youngest is last
        self.steps = 0
        self._written: dict[int, int] = {}  # KV tokens written this step, per rid

    def submit(self, rid: int, prompt: Sequence[int], max_tokens: int,
               on_token: Callable[[int], object] | None = None) -> str:
        """Queue a request; returns ``"waiting"``, or ``"refused"`` if it can never fit the pool."""
        if rid in self.seqs:
            raise ValueError(f"rid {rid} was already submitted")
        s = Seq(rid, tuple(prompt), integer("max_tokens", max_tokens, 1), on_token, len(self.seqs), self.steps)
        self.seqs[rid] = s
        capacity = self.alloc.num_blocks * self.alloc.block_size
        if not s.prompt or len(s.prompt) + max_tokens - 1 > capacity:
            s.status = "refused"
            s.reason = f"needs up to {len(s.prompt) + max_tokens - 1:,} KV tokens; the pool holds {capacity:,}"
            return s.status
        s.todo = len(s.prompt)
        self.waiting.append(s)
        return s.status

    def status(self, rid: int) -> str:
        """waiting, running, finished or refused."""
        return self.seqs[rid].status

    def step(self) -> StepRecord:
        """Build and run one step (module doc); an idle step (nothing to run) is recorded too."""
        self._written = {}
        victims: list[Seq] = []
        decodes = [s for s in list(self.running)  # 1. decodes first
                   if s.todo == 0 and s.status == "running" and self._write(s, 1, victims)]
        left = self.budget - len(decodes)
        chunks = []
        for s in list(self.running):  # 2. running prefills, in admission order
            if s.todo and s.status == "running" and left > 0:
                c = min(s.todo, left)
                if self._write(s, c, victims):
                    chunks.append((s, c, self.alloc.num_tokens(s.rid) - c))
                    left -= c
        decodes = [s for s in decodes if s.status == "running"]  # a later write may have preempted it
        chunks = [ch for ch in chunks if ch[0].status == "running"]
        while not victims and self.waiting and left > 0 and len(self.running) < self.max_running:
            s = self.waiting[0]  # 3. admissions: the head of the queue, if its first chunk fits
            c = min(s.todo, left)
            try:
                self.alloc.allocate(s.rid, s.tokens[:c])
            except OutOfBlocks:
                break  # it waits; admitting never preempts
            self.waiting.pop(0)
            self.running.append(s)
            s.status, self._written[s.rid] = "running", c
            chunks.append((s, c, 0))
            left -= c
        used = self.alloc.num_blocks - self.alloc.num_free_blocks
        context = sum(self.alloc.num_tokens(s.rid) for s in decodes)
        for s, c, _ in chunks:
            s.todo -= c
        finished = []
        for s in decodes + [s for s, _, _ in chunks if s.todo == 0]:  # 4. sample and stream
            token = self.model.next_token(self.alloc.tokens(s.rid))  # the model reads the KV cache
            s.out.append(token)
            if s.first_token is None:
                s.first_token = self.steps
            if s.on_token is not None:
                s.on_token(token)
            if token == self.model.eos or len(s.out) == s.max_tokens:
                self.alloc.free(s.rid)
                self.running.remove(s)
                s.status, s.reason, s.finished_at = "finished", "eos" if token == self.model.eos else "length", self.steps
                finished.append(s.rid)
        record = StepRecord(self.steps, tuple(s.rid for s in decodes), tuple((s.rid, c, p) for s, c, p in chunks),
                            tuple(v.rid for v in victims), tuple(finished), used, context, len(self.running),
                            len(self.waiting))
        self.steps += 1
        return record

    def _write(self, s: Seq, n: int, victims: list[Seq]) -> bool:
        """Write the KV of ``s``'s next ``n`` tokens; while the pool is dry, preempt the youngest
        running request and retry. False if ``s`` itself was the victim."""
        pos = self.alloc.num_tokens(s.rid)
        for token in s.tokens[pos:pos + n]:
            while True:
                try:
                    self.alloc.append_token(s.rid, token)
                    break
                except OutOfBlocks:
                    victim = self.running[-1]
                    self._preempt(victim)
                    victims.append(victim)
                    if victim is s:
                        return False
            self._written[s.rid] = self._written.get(s.rid, 0) + 1
        return True

    def _preempt(self, s: Seq) -> None:
        """Recompute: free every block of ``s``; it waits at the front and later prefills all its tokens."""
        s.recomputed += self.alloc.num_tokens(s.rid) - self._written.pop(s.rid, 0)  # this step's writes never ran
        self.alloc.free(s.rid)
        self.running.remove(s)
        s.status, s.todo = "waiting", len(s.tokens)
        s.preemptions += 1
        self.waiting.append(s)
        self.waiting.sort(key=lambda q: (q.preemptions == 0, q.order))


# ---- driving it: workloads, a replay loop, prices, and the simulator's view ------------------------


@dataclass(frozen=True)
class Job:
    """A request to replay: prompt token ids, ``max_tokens``, and the step it arrives at."""

    rid: int
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0


@dataclass
class Served:
    """What :func:`serve` returns: the engine (its ``seqs`` hold each request's record), one
    :class:`StepRecord` per step, and each request's stream as its callback received it."""

    engine: MiniEngine
    steps: list[StepRecord]
    streams: dict[int, list[int]]

    @property
    def seqs(self) -> list[Seq]:
        """Every request's record, by rid."""
        return [self.engine.seqs[r] for r in sorted(self.engine.seqs)]

    @property
    def preemptions(self) -> int:
        """Preemptions over the run."""
        return sum(s.preemptions for s in self.engine.seqs.values())

    @property
    def recomputed(self) -> int:
        """KV tokens thrown away by preemptions and computed again."""
        return sum(s.recomputed for s in self.engine.seqs.values())

    @property
    def peak_blocks(self) -> int:
        """Most KV blocks in use during one step."""
        return max((r.used_blocks for r in self.steps), default=0)

    def count(self, status: str) -> int:
        """Requests that ended with ``status`` (finished or refused)."""
        return sum(s.status == status for s in self.engine.seqs.values())


@dataclass(frozen=True)
class Preemption:
    """One preemption: request ``rid`` lost ``lost`` KV tokens (what it held at the start of
    ``step``) and was readmitted at step ``resumed`` (None: never)."""

    rid: int
    step: int
    lost: int
    resumed: int | None


def replay(steps: Sequence[StepRecord]) -> tuple[list[list[int]], list[Preemption]]:
    """Read a run's records back: for each step, the recomputed tokens of each of its chunks (the
    part below the request's high-water mark, the most KV a preemption ever threw away), and
    every :class:`Preemption`. Bookkeeping over the records only: no engine, no allocator."""
    kv: dict[int, int] = {}  # KV tokens each request holds after each step
    mark: dict[int, int] = {}
    events: list[Preemption] = []
    open_: dict[int, int] = {}  # rid -> index in events of its preemption not yet resumed
    redo = []
    for r in steps:
        redo.append([max(0, min(pos + c, mark.get(rid, 0)) - pos) for rid, c, pos in r.chunks])
        for rid, _, pos in r.chunks:
            if pos == 0 and rid in open_:
                e = events[open_.pop(rid)]
                events[events.index(e)] = Preemption(e.rid, e.step, e.lost, r.index)
        for rid in r.preempted:
            open_[rid] = len(events)
            events.append(Preemption(rid, r.index, kv.get(rid, 0), None))
            mark[rid], kv[rid] = max(mark.get(rid, 0), kv.get(rid, 0)), 0
        for rid in r.decodes:
            kv[rid] = kv.get(rid, 0) + 1
        for rid, c, _ in r.chunks:
            kv[rid] = kv.get(rid, 0) + c
    return redo, events


def prefill_split(steps: Sequence[StepRecord]) -> list[tuple[int, int]]:
    """Each step's prefill tokens as (new, recomputed) (:func:`replay`). The recomputed column sums
    to the requests' ``recomputed`` counts; the new one to the prompts plus one token per
    preemption of a decoding request (its last streamed token, whose KV was never written, is fed
    by the re-prefill instead of a decode)."""
    redo, _ = replay(steps)
    return [(sum(c for _, c, _ in r.chunks) - sum(x), sum(x)) for r, x in zip(steps, redo, strict=True)]


def recompute_seconds(steps: Sequence[StepRecord], cost) -> float:
    """Seconds the recomputed prefill added, priced by ``cost``: the sum over steps of
    ``cost.step_s`` with every chunk minus the same step with each chunk's recomputed part
    removed (a chunk ``(c, p)`` with ``x`` recomputed tokens becomes ``(c - x, p + x)``)."""
    redo, _ = replay(steps)
    total = 0.0
    for r, xs in zip(steps, redo, strict=True):
        if not any(xs):
            continue
        full = [(c, p) for _, c, p in r.chunks]
        kept = [(c - x, p + x) for (_, c, p), x in zip(r.chunks, xs, strict=True) if c > x]
        total += cost.step_s(len(r.decodes), r.context_tokens, full) - cost.step_s(len(r.decodes), r.context_tokens,
                                                                                     kept)
    return total


def make_jobs(workload, seed: int, vocab: int, arrival_gap_steps: int = 0) -> list[Job]:
    """Jobs from a :class:`lib.scheduling.workloads.Workload` (its prompt and output lengths drawn
    with ``seed``; the output length is the job's ``max_tokens``), prompt token ids drawn from
    ``1..vocab-1`` with the same seed, job ``k`` arriving at step ``k x arrival_gap_steps``."""
    import numpy as np

    integer("arrival_gap_steps", arrival_gap_steps, 0, unit="steps")
    reqs = sorted(workload.generate(seed), key=lambda r: r.rid)
    rng = np.random.default_rng([integer("seed", seed, 0), 1])
    return [Job(r.rid, tuple(int(t) for t in rng.integers(1, integer("vocab", vocab, 2), r.prompt_len)),
                r.output_len, k * arrival_gap_steps) for k, r in enumerate(reqs)]


def serve(jobs: Sequence[Job], alloc: BlockAllocator, model: FakeModel, token_budget: int, max_running: int,
          *, max_steps: int = 1_000_000, engine_cls=MiniEngine) -> Served:
    """Replay ``jobs`` (each submitted at the start of its ``arrival_step``) until every request
    has finished or been refused. Raises RuntimeError after ``max_steps`` steps."""
    engine = engine_cls(alloc, model, token_budget, max_running)
    streams: dict[int, list[int]] = {}
    todo = sorted(jobs, key=lambda j: (j.arrival_step, j.rid))
    steps, k = [], 0
    while True:
        while k < len(todo) and todo[k].arrival_step <= engine.steps:
            j = todo[k]
            streams[j.rid] = []
            engine.submit(j.rid, j.prompt, j.max_tokens, streams[j.rid].append)
            k += 1
        if k == len(todo) and not engine.waiting and not engine.running:
            break
        if len(steps) >= max_steps:
            raise RuntimeError(f"not finished after max_steps={max_steps} steps: {len(engine.running)} running, "
                               f"{len(engine.waiting)} waiting")
        steps.append(engine.step())
    return Served(engine, steps, streams)


def step_seconds(steps: Sequence[StepRecord], cost) -> list[float]:
    """Each step's duration, seconds: ``cost.step_s(decodes, context_tokens, [(chunk, position)])``
    with a cost of :mod:`lib.scheduling.cost` (``step_cost(dep)`` or ``LinearCost``); 0 when idle."""
    return [cost.step_s(len(r.decodes), r.context_tokens, [(c, p) for _, c, p in r.chunks]) for r in steps]


def timeline_seconds(timeline, cost) -> list[float]:
    """Each step of a :func:`lib.scheduling.simulate` run's timeline priced by ``cost`` the same
    way (:func:`step_seconds`): to price a schedule simulated with ``LinearCost(fixed_s=1)``
    (steps as seconds) on a real step model afterwards."""
    return [cost.step_s(int(d), int(ctx), [(c, p) for _, c, p in ch])
            for d, ctx, ch in zip(timeline.decode_tokens, timeline.context_tokens, timeline.chunks, strict=True)]


def sim_requests(jobs: Sequence[Job], model: FakeModel) -> list:
    """The same jobs as :class:`lib.scheduling.workloads.Request` for :func:`lib.scheduling.simulate`:
    arrival at ``arrival_step`` seconds (pair with ``LinearCost(fixed_s=1)``), output length the
    model's continuation (it stops at EOS), ``max_tokens`` the declared cap."""
    from lib.scheduling.workloads import Request

    return [Request(j.rid, float(j.arrival_step), len(j.prompt), len(model.continuation(j.prompt, j.max_tokens)),
                    0, j.max_tokens) for j in jobs]
