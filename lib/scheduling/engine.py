"""A discrete-event simulator of one serving replica: :func:`simulate`.

Time advances one engine step at a time. Each step the scheduler, following a
:class:`~lib.scheduling.policies.Policy`:

1. moves requests that have arrived into the waiting queue (or rejects them: queue full, or a
   request whose declared worst case can never fit the pool);
2. gives every running decode its next token (``decode_first``), growing its KV by one block
   when it crosses a block boundary; when the pool is dry it preempts the newest, least urgent
   running request (recompute: its blocks are freed and it re-prefills prompt + generated
   tokens later; swap: its blocks are copied to host memory over the host link and back);
3. brings swapped requests back if nothing was preempted this step;
4. fills the rest of the token budget with prefill chunks: first the running requests still
   prefilling, then new admissions from the waiting queue (FCFS or shortest prompt first, by
   class when asked), each admitted only if its first chunk's blocks fit (or, with ``reserve``
   admission, its whole prompt + max_tokens) and its class stays under its KV share;
5. is priced by the cost (:mod:`lib.scheduling.cost`: the book's step models) plus any swap
   copies, and the clock moves on; a prefill that completes emits a token, decodes that reach
   their output length finish and free their blocks.

With ``step_mix="prefill_first"`` a step that can prefill runs no decodes (they wait). Static
batching admits only into an empty engine (when ``max_running`` wait or the oldest has waited
``batch_timeout_s``), reserves each member's whole KV, prefills before it decodes, and keeps
finished members as padding (in the step's batch for pricing, and in their blocks) until its
longest member ends.

KV blocks are reserved and freed by the real paged allocator
(:class:`lib.kvcache.allocator.BlockAllocator`) through :class:`KVPool`. Decodes are tracked
lazily (a running decode's generated count is a function of a global decode-step counter;
finishes and block boundaries are heap events), so a step costs O(events), not O(batch): 10,000
requests simulate in about a second. The engine draws no random numbers: the same requests and
policy give the same result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from lib.inputs import integer, real
from lib.kvcache.allocator import BlockAllocator
from lib.scheduling.metrics import RequestRecord, SimResult, Timeline
from lib.scheduling.policies import Policy
from lib.scheduling.workloads import Request, Workload

__all__ = ["KVPool", "simulate"]

WAITING, PREFILL, DECODE, SWAPPED, DONE, DROPPED = range(6)
_TIMELINE = ("start_s", "duration_s", "decode_tokens", "prefill_tokens", "padding", "running",
             "waiting", "swapped", "free_blocks", "preemptions", "swap_s", "context_tokens")


class KVPool:
    """The replica's paged KV pool: ``num_blocks`` blocks of ``block_size`` tokens.

    The bookkeeping is :class:`lib.kvcache.allocator.BlockAllocator`'s own (free list,
    refcounts, block tables, all-or-nothing allocation). The simulator never needs per-token
    slots, so each allocator slot stands for one KV block: the allocator is built with
    ``block_size=1`` and a sequence's allocator "tokens" are its blocks (payload: the block's
    index in the sequence). Counters ``allocated`` and ``freed`` feed the conservation checks.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = integer("kv_blocks", num_blocks, 1, unit="blocks")
        self.block_size = integer("block_size", block_size, 1, unit="tokens")
        self.alloc = BlockAllocator(self.num_blocks, 1)
        self.allocated = 0
        self.freed = 0

    @property
    def free(self) -> int:
        """Free blocks."""
        return self.alloc.num_free_blocks

    def blocks_for(self, tokens: int) -> int:
        """ceil(tokens / block_size): blocks that hold ``tokens`` KV entries."""
        return -(-tokens // self.block_size)

    def grow(self, rid: int, held: int, n: int) -> None:
        """Give sequence ``rid`` (holding ``held`` blocks) ``n`` more, all or nothing."""
        alloc = self.alloc
        if held == 0:
            alloc.allocate(rid, range(n))  # all or nothing (OutOfBlocks)
        elif n == 1:
            alloc.append_token(rid, held)  # all or nothing (OutOfBlocks)
        else:
            if n > alloc.num_free_blocks:
                raise ValueError(f"grow: {n} blocks asked, {self.free} free (the caller must make room)")
            alloc.append_tokens(rid, range(held, held + n))
        self.allocated += n

    def release(self, rid: int) -> int:
        """Free every block of ``rid``; returns how many went back to the free list."""
        n = len(self.alloc.free(rid))
        self.freed += n
        return n


class _Live:
    """A request inside the engine (mutable state; the record is built at the end)."""

    __slots__ = ("req", "rid", "P", "O", "cap", "prio", "state", "computed", "target", "generated",
                 "held", "admit_seq", "epoch", "base", "t0", "g0", "finish_tick", "first_sched",
                 "first_token", "finish", "departure", "status", "reason", "preemptions",
                 "recomputed", "swaps", "swapped_blocks", "refunded", "emits", "resumed", "prefills")

    def __init__(self, req: Request) -> None:
        self.req, self.rid = req, req.rid
        self.P, self.O, self.cap, self.prio = req.prompt_len, req.output_len, req.max_tokens, req.priority
        self.state = WAITING
        self.computed = 0  # tokens whose KV the current prefill has written
        self.target = self.P  # tokens the prefill must write (prompt, or prompt + generated)
        self.generated = 0
        self.held = 0  # blocks held in the pool
        self.admit_seq = -1
        self.epoch = 0  # bumps when it leaves the decode set: stale heap entries are skipped
        self.base = self.t0 = self.g0 = self.finish_tick = 0
        self.first_sched = self.first_token = self.finish = self.departure = math.nan
        self.status, self.reason = "unfinished", ""
        self.preemptions = self.recomputed = self.swaps = self.swapped_blocks = self.refunded = 0
        self.emits: list[tuple] = []  # (time,) for a prefill's token, (tick0, tick1) for a decode run
        self.resumed = False  # back in the queue after a recompute preemption
        self.prefills = 0  # prefill passes completed (1 + re-prefills after recompute)

    def record(self) -> RequestRecord:
        r = self.req
        return RequestRecord(r.rid, r.arrival_s, r.prompt_len, r.output_len, r.priority, r.max_tokens,
                             self.status, self.reason, self.first_sched, self.first_token, self.finish,
                             self.departure, self.generated, self.preemptions, self.recomputed,
                             self.swaps, self.refunded, self.prefills)


class _Engine:
    def __init__(self, requests: Sequence[Request], policy: Policy, cost, kv_blocks: int,
                 block_size: int, max_steps: int | None, horizon_s: float | None) -> None:
        self.pol, self.cost = policy, cost
        self.static = policy.batching == "static"
        self.reserve = policy.admission == "reserve" or self.static
        self.prefill_first = policy.step_mix == "prefill_first" or self.static
        self.max_running = policy.max_running or cost.max_running
        self.budget = policy.token_budget or cost.token_budget
        if self.budget < self.max_running:
            raise ValueError(f"token_budget={self.budget} must be >= max_running={self.max_running}: "
                             "every running decode needs one token of each step")
        top = getattr(cost, "max_batch", None)
        if top is not None and self.max_running > top:
            raise ValueError(f"max_running={self.max_running} exceeds the cost table's max_batch={top}: "
                             "build the cost with step_cost(dep, max_batch=...)")
        self.pool = KVPool(kv_blocks, block_size)
        self.wm_blocks = math.floor(policy.watermark * self.pool.num_blocks)
        self.cap_blocks = {c: math.floor(f * self.pool.num_blocks) for c, f in policy.caps.items()}
        self.class_blocks: dict[int, int] = {}  # blocks held per priority class
        self.class_peak: dict[int, int] = {}
        self.chunk_cap = policy.long_prefill_cap or self.budget
        self.max_steps, self.horizon_s = max_steps, horizon_s
        self.lives = [_Live(r) for r in requests]
        self.next_arrival = 0
        self.waiting: list = []  # heap of (key, live)
        self.running: dict[int, _Live] = {}  # PREFILL and DECODE, in admission order
        self.prefilling: dict[int, _Live] = {}
        self.swapped: list = []  # heap of ((class, admit_seq), live)
        self.swapped_blocks = 0
        self.pads: list[_Live] = []  # static: finished members still in the batch
        self.pad_ctx = 0
        self.D = 0  # running decodes
        self.S = 0  # sum of their bases: cached tokens of decode i at tick T = base_i + T
        self.T = 0  # decode ticks so far (steps that ran decodes)
        self.finish_heap: list = []  # (tick, rid, epoch, live)
        self.need_heap: list = []  # (tick, rid, epoch, live): needs a block before tick's step
        self.now = 0.0
        self.admitted = 0
        self.rows: list[tuple] = []  # one per step, in _TIMELINE order
        self.tl_chunks: list[tuple] = []
        self.step_end: list[float] = []
        self.tick_step: list[int] = []
        self.preempted_now = 0
        self.swap_time = 0.0
        # static: the batch fired with batch_quota members (those waiting then, up to max_running);
        # they join over as many prefill steps as the token budget needs, then it decodes
        self.batch_quota = self.batch_admitted = 0
        self.batch_decoding = False

    # ---- bookkeeping ---------------------------------------------------------------------
    def _key(self, live: _Live) -> tuple:
        cls = live.prio if self.pol.use_priority else 0
        if self.pol.order == "spf":
            return (cls, not live.resumed, live.target, live.req.arrival_s, live.rid)
        return (cls, not live.resumed, live.req.arrival_s, live.rid)

    def _grow(self, live: _Live, n: int) -> None:
        self.pool.grow(live.rid, live.held, n)
        live.held += n
        held = self.class_blocks[live.prio] = self.class_blocks.get(live.prio, 0) + n
        if held > self.class_peak.get(live.prio, 0):
            self.class_peak[live.prio] = held

    def _release(self, live: _Live) -> None:
        if live.held:
            self.pool.release(live.rid)
            self.class_blocks[live.prio] -= live.held
            live.held = 0

    def _drop(self, live: _Live, status: str, reason: str, at: float) -> None:
        live.state, live.status, live.reason, live.departure = DROPPED, status, reason, at

    def _never_fits(self, live: _Live) -> bool:
        """The declared worst case (prompt + max_tokens - 1 cached tokens) exceeds what the pool
        (less the watermark) or the class's share can ever hold, or, without chunked prefill,
        the prompt exceeds the token budget."""
        need = self.pool.blocks_for(live.P + live.cap - 1)
        limit = min(self.pool.num_blocks - self.wm_blocks, self.cap_blocks.get(live.prio, math.inf))
        return need > limit or (not self.pol.chunked_prefill and live.P > self.budget)

    # ---- arrivals --------------------------------------------------------------------------
    def _arrivals(self) -> None:
        lives, limit = self.lives, self.pol.queue_limit
        while self.next_arrival < len(lives) and lives[self.next_arrival].req.arrival_s <= self.now:
            live = lives[self.next_arrival]
            self.next_arrival += 1
            if self._never_fits(live):
                self._drop(live, "rejected", "never_fits", live.req.arrival_s)
            elif limit is not None and len(self.waiting) >= limit:
                self._drop(live, "rejected", "queue_full", live.req.arrival_s)
            else:
                heapq.heappush(self.waiting, (self._key(live), live))

    # ---- decodes ---------------------------------------------------------------------------
    def _join_decode(self, live: _Live) -> None:
        """Start (or resume) decoding at tick T: token g0 + 1 comes out of this tick's step."""
        live.state = DECODE
        live.epoch += 1
        live.g0, live.t0 = live.generated, self.T
        live.base = live.P + live.g0 - self.T  # cached tokens while step T runs: P + g0
        live.finish_tick = self.T + live.O - live.g0
        self.S += live.base
        self.D += 1
        heapq.heappush(self.finish_heap, (live.finish_tick, live.rid, live.epoch, live))
        self._push_need(live)

    def _push_need(self, live: _Live) -> None:
        tick = live.held * self.pool.block_size - live.base + 1  # first tick past its blocks
        if tick < live.finish_tick:
            heapq.heappush(self.need_heap, (max(tick, self.T), live.rid, live.epoch, live))

    def _leave_decode(self, live: _Live) -> None:
        live.generated = live.g0 + self.T - live.t0
        if self.T > live.t0:
            live.emits.append((live.t0, self.T))
        live.epoch += 1
        self.S -= live.base
        self.D -= 1

    def _serve_block_needs(self) -> None:
        heap, T, pop = self.need_heap, self.T, heapq.heappop
        while heap and heap[0][0] <= T:  # needs of preempted decodes leave stale entries: skipped
            _, _, epoch, live = pop(heap)
            if epoch == live.epoch and live.state == DECODE and self._make_room(live, 1):
                self._grow(live, 1)
                self._push_need(live)

    # ---- preemption ------------------------------------------------------------------------
    def _make_room(self, live: _Live, n: int) -> bool:
        """Preempt until ``n`` blocks are free for running ``live`` (and its class stays under
        its share); False when ``live`` itself was the victim."""
        if not self.cap_blocks and self.pool.alloc.num_free_blocks >= n:
            return True  # the common case
        cap = self.cap_blocks.get(live.prio)
        while True:
            pool_short = self.pool.free < n
            cap_short = cap is not None and self.class_blocks.get(live.prio, 0) + n > cap
            if not (pool_short or cap_short):
                return True
            victim = self._victim(None if pool_short else live.prio)
            self._preempt(victim)
            if victim is live:
                return False

    def _victim(self, cls: int | None) -> _Live:
        """The running request of the least urgent class admitted last (within ``cls`` if given)."""
        urgent = self.pol.use_priority
        return max((v for v in self.running.values() if cls is None or v.prio == cls),
                   key=lambda v: (v.prio if urgent else 0, v.admit_seq))

    def _preempt(self, v: _Live) -> None:
        self.preempted_now += 1
        v.preemptions += 1
        was_decoding = v.state == DECODE
        if was_decoding:
            self._leave_decode(v)
        else:
            del self.prefilling[v.rid]
        del self.running[v.rid]
        room = self.pol.swap_space_blocks
        if (self.pol.preemption == "swap" and was_decoding
                and (room is None or self.swapped_blocks + v.held <= room)):
            self.swap_time += self.cost.swap_s(v.held * self.pool.block_size)
            v.swapped_blocks = v.held
            self.swapped_blocks += v.held
            v.swaps += 1
            self._release(v)
            v.state = SWAPPED
            heapq.heappush(self.swapped, ((v.prio if self.pol.use_priority else 0, v.admit_seq), v))
            return
        v.recomputed += (v.P + v.generated - 1) if was_decoding else v.computed
        self._release(v)
        v.computed, v.target = 0, v.P + v.generated
        v.state, v.resumed = WAITING, True
        heapq.heappush(self.waiting, (self._key(v), v))

    def _swap_in(self) -> None:
        while self.swapped and len(self.running) < self.max_running:
            _, v = self.swapped[0]
            need = self.pool.blocks_for(v.P + v.generated)  # its KV + this step's write
            cap = self.cap_blocks.get(v.prio)
            if (self.pool.free - need < self.wm_blocks
                    or (cap is not None and self.class_blocks.get(v.prio, 0) + need > cap)):
                return
            heapq.heappop(self.swapped)
            self._grow(v, need)
            self.swap_time += self.cost.swap_s(v.swapped_blocks * self.pool.block_size)
            self.swapped_blocks -= v.swapped_blocks
            v.swapped_blocks = 0
            self.running[v.rid] = v
            self._join_decode(v)

    # ---- prefills and admission ---------------------------------------------------------------
    def _gate_open(self) -> bool:
        """Continuous: always. Static: the batch fires (engine empty) once max_running requests
        wait or the oldest has waited batch_timeout_s (the batcher cannot know that no more will
        come); it takes the min(waiting, max_running) requests waiting then, admitted over as
        many prefill steps as the token budget needs, and admits nobody once it decodes."""
        if not self.static:
            return True
        if self.batch_decoding:
            return False
        if self.running or self.pads:
            return self.batch_admitted < self.batch_quota  # the batch fired: its members still join
        if len(self.waiting) >= self.max_running or self.now >= self._static_fire_time():
            self.batch_quota, self.batch_admitted = min(len(self.waiting), self.max_running), 0
            return True
        return False

    def _static_fire_time(self) -> float:
        return min(v.req.arrival_s for _, v in self.waiting) + self.pol.batch_timeout_s

    def _schedule_prefills(self, chunks: list, left: int) -> None:
        if not self.prefilling and not self.waiting:
            return
        for live in list(self.prefilling.values()):
            if left <= 0:
                break
            if live.state != PREFILL:  # preempted by an earlier one in this loop
                continue
            c = min(live.target - live.computed, left, self.chunk_cap)
            need = self.pool.blocks_for(live.computed + c) - live.held
            if need > 0:
                if not self._make_room(live, need):
                    continue
                self._grow(live, need)
            chunks.append((live, c))
            left -= c
        if self.preempted_now:  # a victim may have had a chunk already: drop it, admit nobody
            chunks[:] = [(live, c) for live, c in chunks if live.state == PREFILL]
            return
        if not self._gate_open():
            return
        skipped = []
        max_wait = self.pol.max_queue_wait_s
        while (self.waiting and left > 0 and len(self.running) < self.max_running
               and (not self.static or self.batch_admitted < self.batch_quota)):
            key, live = self.waiting[0]
            if (max_wait is not None and not live.resumed
                    and self.now - live.req.arrival_s > max_wait):
                heapq.heappop(self.waiting)
                self._drop(live, "expired", "max_queue_wait", self.now)
                continue
            todo = live.target - live.computed
            if self.pol.chunked_prefill or live.resumed:
                c = min(todo, left, self.chunk_cap)
            elif todo <= left:
                c = todo
            else:
                break
            need = (self.pool.blocks_for(live.P + live.cap - 1) if self.reserve
                    else self.pool.blocks_for(c))
            cap = self.cap_blocks.get(live.prio)
            if cap is not None and self.class_blocks.get(live.prio, 0) + need > cap:
                skipped.append(heapq.heappop(self.waiting))  # its class is full: others may pass
                continue
            if self.pool.free - need < self.wm_blocks:
                break
            heapq.heappop(self.waiting)
            live.state = PREFILL
            live.admit_seq = self.admitted
            self.admitted += 1
            self.batch_admitted += 1
            if math.isnan(live.first_sched):
                live.first_sched = self.now
            self.running[live.rid] = live
            self.prefilling[live.rid] = live
            self._grow(live, need)
            chunks.append((live, c))
            left -= c
        for item in skipped:
            heapq.heappush(self.waiting, item)

    # ---- completions ----------------------------------------------------------------------------
    def _finish(self, live: _Live) -> None:
        live.state, live.status = DONE, "finished"
        live.generated = live.O
        live.finish = live.departure = self.now
        del self.running[live.rid]
        if self.reserve:
            live.refunded = live.held - self.pool.blocks_for(live.P + live.O - 1)
        if self.static:
            self.pads.append(live)  # keeps its slot and blocks until the batch ends
            self.pad_ctx += live.P + live.O - 1
        else:
            self._release(live)

    def _prefill_done(self, live: _Live) -> None:
        del self.prefilling[live.rid]
        live.prefills += 1
        live.generated = live.target - live.P + 1
        if math.isnan(live.first_token):
            live.first_token = self.now
        live.emits.append((self.now,))
        if live.generated >= live.O:
            self._finish(live)
        else:
            self._join_decode(live)

    def _decodes_done(self) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.T:
            _, _, epoch, live = heapq.heappop(heap)
            if epoch == live.epoch and live.state == DECODE:
                self._leave_decode(live)
                self._finish(live)

    # ---- the loop ---------------------------------------------------------------------------------
    def _step(self) -> bool:
        """Build, price and run one step; False when nothing could run."""
        self.preempted_now, self.swap_time = 0, 0.0
        chunks: list = []
        decodes = True
        if self.prefill_first:
            self._schedule_prefills(chunks, self.budget)
            decodes = not chunks
        if decodes:
            self._serve_block_needs()
            if not self.preempted_now:
                self._swap_in()
            if not self.prefill_first:
                self._schedule_prefills(chunks, self.budget - self.D)
        d = self.D if decodes else 0
        if not d and not chunks:
            return False
        pads = len(self.pads) if d else 0
        ctx = self.S + d * self.T + self.pad_ctx if d else 0  # cached tokens the decodes read
        if chunks:
            spec = [(c, live.computed) for live, c in chunks]
            prefill = sum(c for c, _ in spec)
            self.tl_chunks.append(tuple((live.rid, c, live.computed) for live, c in chunks))
        else:
            spec, prefill = (), 0
            self.tl_chunks.append(())
        dt = self.cost.step_s(d + pads, ctx, spec) + self.swap_time
        self.rows.append((self.now, dt, d, prefill, pads, len(self.running), len(self.waiting),
                          len(self.swapped), self.pool.alloc.num_free_blocks, self.preempted_now,
                          self.swap_time, ctx))
        self.now += dt
        self.step_end.append(self.now)
        if d:
            self.batch_decoding = self.static
            self.tick_step.append(len(self.step_end) - 1)
            self.T += 1
            self._decodes_done()
        for live, c in chunks:
            live.computed += c
            if live.computed == live.target:
                self._prefill_done(live)
        if self.static and not self.D and not self.prefilling and self.pads:
            for live in self.pads:  # the batch is over: its members' blocks go back
                self._release(live)
            self.pads, self.pad_ctx = [], 0
        if self.static and not self.D and not self.prefilling and not self.pads:
            self.batch_decoding = False  # the batch is over (or never decoded): the next may fire
        return True

    def _idle(self) -> bool:
        """Nothing ran: jump to the next event; False when the run is over."""
        if self.preempted_now:
            return True  # the step only preempted; build the next one now
        wake = self.lives[self.next_arrival].req.arrival_s if self.next_arrival < len(self.lives) else math.inf
        if self.static and self.waiting and not self.running:
            fire = self._static_fire_time()
            if fire > self.now:
                wake = min(wake, fire)
        if wake < math.inf:
            self.now = max(self.now, wake)
            return True
        if self.waiting and not self.running:  # safety net: what is left can never be admitted
            _, live = heapq.heappop(self.waiting)
            self._drop(live, "rejected", "never_fits", self.now)
            return True
        if self.swapped or self.running or self.waiting:
            raise RuntimeError("scheduler stalled with work left (a bug): "
                               f"{len(self.waiting)} waiting, {len(self.running)} running, "
                               f"{len(self.swapped)} swapped")
        return False

    def run(self) -> SimResult:
        steps, complete = 0, True
        while True:
            self._arrivals()
            if self.max_steps is not None and steps >= self.max_steps:
                complete = False
                break
            if self.horizon_s is not None and self.now >= self.horizon_s:
                complete = False
                break
            if self._step():
                steps += 1
            elif not self._idle():
                break
        return self._result(complete)

    def _result(self, complete: bool) -> SimResult:
        self.lives.sort(key=lambda v: v.rid)
        for live in self.lives:
            if live.state == DECODE:
                self._leave_decode(live)
            if live.status == "unfinished":
                live.departure = self.now
        import numpy as np

        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(_TIMELINE)
        arrays = {k: np.asarray(v, dtype=float if k in ("start_s", "duration_s", "swap_s") else np.int64)
                  for k, v in zip(_TIMELINE, cols, strict=True)}
        timeline = Timeline(**arrays, chunks=tuple(self.tl_chunks))
        counts = {s: 0 for s in ("finished", "rejected", "expired", "unfinished")}
        for live in self.lives:
            counts[live.status] += 1
        counters = dict(
            counts,
            preemptions=sum(v.preemptions for v in self.lives),
            blocks_allocated=self.pool.allocated,
            blocks_freed=self.pool.freed,
            free_blocks_end=self.pool.free,
            kv_blocks=self.pool.num_blocks,
            block_size=self.pool.block_size,
            live_sequences_end=len(self.pool.alloc.seq_ids()),
            max_running=self.max_running,
            token_budget=self.budget,
            decode_ticks=self.T,
            class_blocks_peak=dict(sorted(self.class_peak.items())),
            class_blocks_cap=dict(sorted(self.cap_blocks.items())),
        )
        return SimResult([v.record() for v in self.lives], timeline, end_s=self.now,
                         emits=[v.emits for v in self.lives], tick_step=self.tick_step,
                         counters=counters, policy=self.pol, cost=self.cost, complete=complete)


def simulate(workload: Workload | Sequence[Request], policy: Policy | None = None, cost=None, *,
             seed: int = 0, kv_blocks: int | None = None, block_size: int | None = None,
             max_steps: int | None = None, horizon_s: float | None = None) -> SimResult:
    """Simulate one replica serving ``workload`` under ``policy``, steps priced by ``cost``.

    ``workload``: a :class:`~lib.scheduling.workloads.Workload` (drawn with ``seed``) or a
    sequence of :class:`~lib.scheduling.workloads.Request` (ids 0..n-1 in any order).
    ``cost``: a :class:`~lib.scheduling.cost.StepCost` (``step_cost(dep)``), a
    :class:`~lib.perf.deployment.Deployment` (its cached StepCost), or an analytic
    :class:`~lib.scheduling.cost.LinearCost` / :class:`~lib.scheduling.cost.FunctionCost`.
    ``kv_blocks`` and ``block_size`` (None: the cost's, i.e. ``dep.budget.num_blocks`` and
    ``dep.block_size``) size the pool; the policy's ``max_running`` and ``token_budget``
    default to the cost's too. ``max_steps`` / ``horizon_s`` stop the run early (records of
    requests still inside say ``unfinished``). Returns a
    :class:`~lib.scheduling.metrics.SimResult`. Deterministic: the engine draws nothing.
    """
    from lib.perf.deployment import Deployment
    from lib.scheduling.cost import step_cost

    if isinstance(workload, Workload):
        requests = workload.generate(seed)
    else:
        requests = tuple(workload)
        if not all(isinstance(r, Request) for r in requests):
            raise ValueError("workload must be a Workload or a sequence of Request")
        if sorted(r.rid for r in requests) != list(range(len(requests))):
            raise ValueError("request ids must be 0..n-1, each once (use workloads.trace or mix)")
    requests = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
    policy = Policy() if policy is None else policy
    if not isinstance(policy, Policy):
        raise ValueError(f"policy must be a Policy, got {type(policy).__name__}")
    if isinstance(cost, Deployment):
        cost = step_cost(cost)
    if cost is None or not callable(getattr(cost, "step_s", None)) or not callable(getattr(cost, "swap_s", None)):
        raise ValueError("cost must offer step_s and swap_s: step_cost(dep), a Deployment, LinearCost or FunctionCost")
    kv_blocks = cost.kv_blocks if kv_blocks is None else kv_blocks
    block_size = cost.block_size if block_size is None else block_size
    if max_steps is not None:
        integer("max_steps", max_steps, 0)
    if horizon_s is not None:
        real("horizon_s", horizon_s, 0, unit="seconds")
    engine = _Engine(requests, policy, cost, kv_blocks, block_size, max_steps, horizon_s)
    return engine.run()
