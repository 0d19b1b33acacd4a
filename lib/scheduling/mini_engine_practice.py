"""Practice mode for the mini serving engine (I063): a grader for any engine, and defective drafts.

The candidate writes a class built as ``Engine(alloc, model, token_budget, max_running)`` with
``submit(rid, prompt, max_tokens, on_token) -> status``, ``step()`` and ``status(rid)`` (one of
``"waiting"``, ``"running"``, ``"finished"``, ``"refused"``), the rules of
:mod:`lib.scheduling.mini_engine`. ``alloc`` is the real :class:`~lib.kvcache.allocator.BlockAllocator`
(the engine's one KV ledger; the sequence id is the request id) and ``model`` a
:class:`~lib.scheduling.mini_engine.FakeModel`, so the grader knows every stream in advance.

:func:`run` replays a program step by step and watches the allocator (every ``allocate``,
``append_token`` and ``free``) and the callbacks, never the engine's own counters. After every
step it asserts, in this order:

* **refusal**: ``submit`` answers ``"refused"`` exactly for a request whose prompt + max_tokens - 1
  KV tokens exceed the pool (``num_blocks x block_size``): anything else either refuses work that
  fits or admits a request that will preempt itself forever;
* **streams**: every callback token is the model's next token for that request, in order, none
  twice, none after the last (a recompute must continue the stream, not restart or repeat it);
* **budget**: the KV tokens the step wrote for work that ran (writes of a request preempted in the
  same step do not count) are at most ``token_budget``;
* **decodes first**: every request that was decoding gets its token unless it was preempted;
* **youngest victim**: a preempted request is the one admitted last among those holding KV;
* **no starvation**: no request is admitted for the first time while a preempted one still waits;
* **the ledger**: the requests holding KV are exactly those whose status is ``"running"`` (a
  preempted or finished request that still holds blocks has leaked them), at most
  ``max_running``, and each one's KV holds a prefix of its prompt + streamed tokens;
* **progress**: every request that fits finishes within a step bound, and the pool ends empty.

A program is ``("config", num_blocks, block_size, token_budget, max_running, vocab)`` (first op,
default :data:`DEFAULT_CONFIG`; EOS is token 0) then ``("request", prompt_len, max_tokens,
arrival_step)`` ops, rid = position among the requests. :data:`VARIANTS` are drafts with one
classic defect each; every one must fail (the unit tests say so).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer
from lib.kvcache.allocator import BlockAllocator, read_sequence

from .mini_engine import FakeModel, MiniEngine

__all__ = ["DEFAULT_CONFIG", "QUESTION", "VARIANTS", "cases", "check", "describe", "prompt_tokens", "run",
           "skeleton", "variant"]

QUESTION = "the mini serving engine (I063)"
DEFAULT_CONFIG = ("config", 12, 4, 16, 4, 64)  # num_blocks, block_size, token_budget, max_running, vocab


class skeleton:  # noqa: N801 - named like the function skeletons of the other practice modules
    """The interface with nothing filled in (what the notebook's skeleton looks like)."""

    def __init__(self, alloc, model, token_budget: int, max_running: int) -> None:
        self.alloc, self.model, self.budget, self.max_running = alloc, model, token_budget, max_running

    def submit(self, rid: int, prompt, max_tokens: int, on_token) -> str:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def status(self, rid: int) -> str:
        raise NotImplementedError


# ---- defective drafts: the reference with one mistake each --------------------------------------

VARIANTS = ("leak_on_preempt", "budget_ignores_decodes", "recompute_off_by_one", "restart_from_prompt",
            "victim_to_back", "no_refusal", "oldest_victim")
"""Defective engines the grader must fail."""

TEXT = {
    "leak_on_preempt": "a victim still prefilling keeps its blocks when preempted (a leak)",
    "budget_ignores_decodes": "prefill chunks sized from the whole budget, ignoring the decodes' tokens",
    "recompute_off_by_one": "a recompute re-prefills only the tokens that had KV, then samples the last token again",
    "restart_from_prompt": "a recompute restarts the request from its prompt and streams every token again",
    "victim_to_back": "a preempted request goes to the back of the waiting queue (it can starve)",
    "no_refusal": "a request larger than the whole pool is admitted (it preempts itself forever)",
    "oldest_victim": "the oldest running request is preempted instead of the youngest",
}


# Each draft is MiniEngine's own methods with its mistake edited into their source (lib.book.drafts):
# the edits are the whole difference.
_REFUSAL = ('''if not s.prompt or len(s.prompt) + max_tokens - 1 > capacity:
s.status = "refused"
s.reason = f"needs up to {len(s.prompt) + max_tokens - 1:,} KV tokens; the pool holds {capacity:,}"
return s.status''', "")
_EDITS = {
    "leak_on_preempt": {"_preempt": [("self.alloc.free(s.rid)",
                                      "if not s.todo:  # the mistake: a prefilling victim keeps its blocks\n"
                                      "    self.alloc.free(s.rid)")]},
    "budget_ignores_decodes": {"step": [("left = self.budget - len(decodes)",
                                         "left = self.budget  # the mistake: the decodes' tokens are not taken off")]},
    "recompute_off_by_one": {"_preempt": [("s.status, s.todo = \"waiting\", len(s.tokens)",
                                           "s.status, s.todo = \"waiting\", len(s.tokens)\n"
                                           "if s.out:  # the mistake: only the tokens that had KV; the last is sampled again\n"
                                           "    s.todo -= 1")]},
    "restart_from_prompt": {"_preempt": [("s.status, s.todo = \"waiting\", len(s.tokens)",
                                          "s.status, s.todo = \"waiting\", len(s.tokens)\n"
                                          "s.out, s.todo = [], len(s.prompt)  # the mistake: the stream starts over")]},
    "victim_to_back": {"_preempt": [("self.waiting.sort(key=lambda q: (q.preemptions == 0, q.order))", "")]},
    "no_refusal": {"submit": [_REFUSAL]},
    "oldest_victim": {"_write": [("victim = self.running[-1]", "victim = self.running[0]  # the mistake: the oldest")]},
}
_DRAFTS = {name: edited_class(MiniEngine, f"MiniEngine_{name}", TEXT[name], **edits) for name, edits in _EDITS.items()}


def variant(name: str) -> type:
    """The reference (``"reference"``: :class:`MiniEngine`) or a defective draft (:data:`VARIANTS`)."""
    if name == "reference":
        return MiniEngine
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    return _DRAFTS[name]


# ---- the grader ----------------------------------------------------------------------------------


class _WatchedAllocator(BlockAllocator):
    """The real allocator, logging each successful allocate / append_token / free of a step."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.log: list[tuple] = []

    def allocate(self, seq_id, tokens):
        tokens = list(tokens)
        table = super().allocate(seq_id, tokens)
        self.log.append(("allocate", seq_id, len(tokens), ()))
        return table

    def append_token(self, seq_id, token):
        event = super().append_token(seq_id, token)
        self.log.append(("append", seq_id, 1, ()))
        return event

    def free(self, seq_id):
        live = tuple(self.seq_ids())
        released = super().free(seq_id)
        self.log.append(("free", seq_id, 0, live))
        return released


def prompt_tokens(rid: int, length: int, vocab: int) -> list[int]:
    """The prompt of request ``rid`` in a graded program: ids in 1..vocab-1 (never EOS = 0)."""
    return [1 + (31 * rid + 17 * i + (i * i) % 7) % (vocab - 1) for i in range(length)]


def _split(ops: Sequence) -> tuple[tuple, list]:
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    return cfg, [op[1:] for op in ops if op[0] == "request"]


def describe(ops: Sequence) -> str:
    """The (shrunk) program, as the engine sees it."""
    (_, nb, bs, budget, mr, vocab), reqs = _split(ops)
    lines = [f"  Engine(BlockAllocator(num_blocks={nb}, block_size={bs}), FakeModel(vocab={vocab}, eos=0), "
             f"token_budget={budget}, max_running={mr})  # the pool holds {nb * bs} KV tokens"]
    order = sorted(range(len(reqs)), key=lambda rid: (reqs[rid][2], rid))  # by arrival, then rid
    lines += [f"  before step {reqs[rid][2]}: submit(rid={rid}, prompt of {reqs[rid][0]} tokens, "
              f"max_tokens={reqs[rid][1]})" for rid in order]
    return "\n".join(lines)


def run(factory: Callable, ops: Sequence) -> None:
    """Replay the program on ``factory(alloc, model, token_budget, max_running)``; AssertionError
    naming the first broken rule (module doc), with the step it broke at."""
    (_, nb, bs, budget, mr, vocab), reqs = _split(ops)
    if not reqs:
        return
    alloc = _WatchedAllocator(nb, bs)
    model = FakeModel(0, vocab, eos=0)
    engine = factory(alloc, model, budget, mr)
    prompts = [prompt_tokens(rid, p, vocab) for rid, (p, _, _) in enumerate(reqs)]
    want = [model.continuation(prompts[rid], m) for rid, (_, m, _) in enumerate(reqs)]
    fits = [p + m - 1 <= nb * bs for p, m, _ in reqs]
    streams: dict[int, list[int]] = {}
    admitted: dict[int, int] = {}  # rid -> the number of its latest admission (0, 1, 2, ...)
    waiting_victims: list[int] = []
    decoding: set[int] = set()  # holding KV and streamed since its latest admission
    preempted_total = [0] * len(reqs)
    last_arrival = max(a for _, _, a in reqs)
    bound = last_arrival + 10 * sum(p + m for p, m, _ in reqs) + 50
    for k in range(bound):
        for rid, (p, m, a) in enumerate(reqs):
            if a != k:
                continue
            streams[rid] = []
            got = engine.submit(rid, list(prompts[rid]), m, streams[rid].append)
            if fits[rid] and got == "refused":
                raise AssertionError(f"step {k}: submit refused request {rid} (prompt {p} + max_tokens {m} needs at "
                                     f"most {p + m - 1} KV tokens; the pool holds {nb * bs}): it fits, so queue it")
            if not fits[rid] and got != "refused":
                raise AssertionError(f"step {k}: submit answered {got!r} for request {rid}, whose prompt {p} + "
                                     f"max_tokens {m} can need {p + m - 1} KV tokens, more than the whole pool "
                                     f"({nb * bs}): admitted, it ends up alone and preempts itself forever; "
                                     "refuse it at submit with status 'refused'")
        if k > last_arrival and all(len(streams[r]) == len(want[r]) for r in range(len(reqs)) if fits[r]):
            break
        before = {r: len(s) for r, s in streams.items()}
        alloc.log.clear()
        engine.step()
        where = f"step {k}"
        # streams: the model's continuation, in order, nothing twice, nothing after the end
        for r, s in streams.items():
            if s != want[r][:len(s)]:
                i = next((i for i in range(len(s)) if i >= len(want[r]) or s[i] != want[r][i]), len(s))
                if i >= len(want[r]):
                    raise AssertionError(f"{where}: request {r} streamed a token after its last one ({len(want[r])} "
                                         "tokens: EOS or max_tokens)")
                again = " (the token before it again: sent twice?)" if i and s[i] == want[r][i - 1] else ""
                restart = " (its stream started over)" if i and s[i] == want[r][0] else ""
                raise AssertionError(f"{where}: request {r}'s token #{i + 1} on the stream is {s[i]}, the model's is "
                                     f"{want[r][i]}{again or restart}; it had been preempted {preempted_total[r]} "
                                     "time(s): a recompute must continue the stream where it stopped")
        emitted = {r for r in streams if len(streams[r]) > before.get(r, 0)}
        done = {r for r in streams if len(streams[r]) == len(want[r])}
        # walk the allocator's log: admissions, preemptions, and the tokens that ran
        written: dict[int, int] = {}
        for op, r, n, live in alloc.log:
            if op in ("allocate", "append"):
                written[r] = written.get(r, 0) + n
            if op == "allocate":
                if r not in waiting_victims and waiting_victims:
                    raise AssertionError(f"{where}: request {r} was admitted for the first time while preempted "
                                         f"request {waiting_victims[0]} still waited: a victim must resume before "
                                         "newer work, or under steady arrivals it can wait forever")
                if r in waiting_victims:
                    waiting_victims.remove(r)
                admitted[r] = max(admitted.values(), default=-1) + 1
                decoding.discard(r)
            if op == "free" and r not in done:
                youngest = max(live, key=lambda x: admitted.get(x, -1))
                if youngest != r:
                    raise AssertionError(f"{where}: preempted request {r}, but request {youngest} was admitted "
                                         "after it: preempt the youngest (least KV lost; the oldest always "
                                         "progresses, so nothing livelocks)")
                written.pop(r, None)  # its tokens this step did not run
                waiting_victims.append(r)
                preempted_total[r] += 1
                decoding.discard(r)
        ran = sum(written.values())
        if ran > budget:
            raise AssertionError(f"{where}: the step wrote KV for {ran} tokens that ran, over the token budget of "
                                 f"{budget} (decodes take one token each first; prefill chunks get what is left)")
        starved = sorted(r for r in decoding if r not in emitted and r not in waiting_victims)
        if starved:
            raise AssertionError(f"{where}: request {starved[0]} was decoding and got no token (nor was it "
                                 "preempted): decodes come first, one token each")
        # the ledger: who holds KV, and what it holds
        holding = set(alloc.seq_ids())
        strangers = sorted((x for x in holding if x not in streams), key=repr)
        if strangers:
            raise AssertionError(f"{where}: the pool holds sequence {strangers[0]!r}, which is no submitted request id: "
                                 "use the request id as the allocator's sequence id")
        for r in streams:
            st = engine.status(r)
            if (r in holding) != (st == "running"):
                if r in holding:
                    raise AssertionError(f"{where}: request {r} is {st!r} but still holds "
                                         f"{len(alloc.block_table(r))} KV block(s): blocks leaked (free them when a "
                                         "request is preempted or finishes)")
                raise AssertionError(f"{where}: request {r} is 'running' but holds no KV in the pool")
            if (r in done) != (st == "finished") and fits[r]:
                raise AssertionError(f"{where}: request {r} has streamed {len(streams[r])} of {len(want[r])} tokens "
                                     f"and its status is {st!r}")
        if len(holding) > mr:
            raise AssertionError(f"{where}: {len(holding)} requests hold KV, more than max_running = {mr}")
        for r in holding:
            kv = read_sequence(alloc, r, alloc.num_tokens(r))
            full = prompts[r] + streams[r]
            if kv != full[:len(kv)] or len(kv) > len(full):
                raise AssertionError(f"{where}: request {r}'s KV holds {kv[:12]}..., not a prefix of its prompt + "
                                     "streamed tokens")
        decoding = {r for r in decoding | emitted if r in holding}
    else:
        raise AssertionError(f"not finished after {bound} steps (a livelock or a deadlock): "
                             f"{len(alloc.seq_ids())} requests hold {alloc.num_used_blocks} of {nb} blocks")
    if alloc.seq_ids() or alloc.num_free_blocks != nb:
        raise AssertionError(f"every request finished, yet {nb - alloc.num_free_blocks} block(s) are still "
                             f"allocated (sequences {alloc.seq_ids()}): blocks leaked")


def _random_program(rng: random.Random) -> tuple:
    bs = rng.choice([1, 2, 4, 8])
    mr = rng.randint(1, 5)
    budget = rng.randint(mr, 24)
    vocab = rng.choice([6, 12, 64, 1000])  # small vocabularies hit EOS often
    reqs = [(rng.randint(1, 30), rng.randint(1, 12), rng.choice([0, 0, rng.randint(0, 12)]))
            for _ in range(rng.randint(1, 7))]
    need = max(-(-(p + m - 1) // bs) for p, m, _ in reqs)
    blocks = rng.randint(max(1, need // 2) if rng.random() < 0.15 else need, 2 * need)  # tight: preemption
    return (("config", blocks, bs, budget, mr, vocab), *(("request", *r) for r in reqs))


def cases(num_random: int = 60, seed: int = 0) -> list[Case]:
    """Scripted scenarios, then ``num_random`` seeded random programs (tight pools, small vocabularies)."""
    num_random = integer("num_random", num_random, 0)
    rng = random.Random(integer("seed", seed, 0))
    scripted = [
        Case("one request: its prompt prefilled in chunks, then decoded", (("config", 12, 4, 8, 4, 1000),
                                                                         ("request", 20, 6, 0))),
        Case("EOS ends a stream before max_tokens", (("config", 40, 4, 16, 4, 6), ("request", 5, 12, 0),
                                                     ("request", 7, 12, 0), ("request", 3, 12, 1))),
        Case("the pool runs dry: the youngest is preempted, resumes first, streams on",
             (("config", 6, 2, 16, 4, 1000), ("request", 3, 6, 0), ("request", 3, 6, 0), ("request", 3, 4, 0),
              ("request", 2, 2, 0))),
        Case("a victim still prefilling when the pool runs dry", (("config", 5, 4, 6, 2, 1000),
                                                                 ("request", 2, 12, 0), ("request", 14, 2, 1))),
        Case("decodes take their tokens before a long prompt's chunk", (("config", 40, 4, 8, 4, 1000),
                                                                       ("request", 3, 8, 0), ("request", 30, 2, 1))),
        Case("a request larger than the pool is refused, the rest served", (("config", 4, 4, 8, 2, 1000),
                                                                            ("request", 10, 8, 0),
                                                                            ("request", 4, 4, 0))),
        Case("newcomers keep arriving while a victim waits", (("config", 6, 2, 16, 3, 1000), ("request", 3, 6, 0),
                                                              ("request", 3, 6, 0), ("request", 2, 3, 2),
                                                              ("request", 2, 3, 3), ("request", 2, 3, 4))),
        Case("max_running caps admission", (("config", 40, 4, 32, 2, 1000), ("request", 2, 3, 0),
                                            ("request", 2, 3, 0), ("request", 2, 3, 0))),
    ]
    return scripted + [Case(f"random program {k}", _random_program(rng)) for k in range(num_random)]


def check(candidate_cls: Callable, num_random: int = 60, seed: int = 0) -> PracticeReport:
    """Grade any engine class built as ``candidate_cls(alloc, model, token_budget, max_running)``."""
    if not callable(candidate_cls):
        raise ValueError(f"check() takes the engine class, got {candidate_cls!r}")
    return grade(QUESTION, lambda: candidate_cls, cases(num_random, seed), run, describe)
