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

KV blocks are counted by :class:`KVPool` (free blocks and blocks per sequence, all-or-nothing
grows: the engine never needs block ids; the paged allocator that hands them out is
:class:`lib.kvcache.allocator.BlockAllocator`). Decodes are tracked lazily (a running decode's
generated count is a function of a global decode-step counter; finishes and block boundaries are
heap events), so a step costs O(events), not O(batch). Between events the batch does not change:
a run of steps that can only decode is priced and recorded step by step without rebuilding the
batch (:meth:`_Engine._decode_run`, tested equal to building every step), and the timeline keeps
such a run as one segment. 10,000 requests simulate in well under a second. The engine draws no
random numbers: the same requests and policy give the same result.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Sequence

from lib.inputs import integer, real
from lib.kvcache.allocator import OutOfBlocks
from lib.scheduling.metrics import RequestRecord, SimResult, Timeline
from lib.scheduling.policies import Policy
from lib.scheduling.workloads import Request, Workload

__all__ = ["KVPool", "simulate"]

WAITING, PREFILL, DECODE, SWAPPED, DONE, DROPPED = range(6)
# the timeline columns a step shares with the steps of its segment (a decode run: all but the context,
# which grows by decode_tokens a step); start, duration and free blocks are recorded per step
_SEGMENT = ("decode_tokens", "prefill_tokens", "padding", "running", "waiting", "swapped", "preemptions",
            "swap_s", "context_tokens")
_SEG_ROW = [("steps", "i8"), *((k, "f8" if k == "swap_s" else "i8") for k in _SEGMENT), ("context_step", "i8")]


class KVPool:
    """The replica's paged KV pool, kept as counts: ``num_blocks`` blocks of ``block_size`` tokens.

    The simulator never reads a block's id or its contents; it asks how many blocks are free and
    how many each sequence holds. So the pool keeps exactly that: ``free`` (blocks on the free
    list) and the blocks each live sequence holds, and grows or frees a sequence in O(1) instead
    of handing out block ids one by one. Which blocks a sequence holds, refcounts and
    copy-on-write are the paged allocator's (:class:`lib.kvcache.allocator.BlockAllocator`,
    built and tested in the KV-cache section); this pool follows its rules: every grow is all or
    nothing (:class:`~lib.kvcache.allocator.OutOfBlocks`, nothing changed) and releasing a
    sequence that holds nothing is an error, so no block is freed twice. Counters ``allocated``
    and ``freed`` feed the conservation checks (``allocated - freed = num_blocks - free``, and
    ``sequences`` is 0 once every request has left).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = integer("kv_blocks", num_blocks, 1, unit="blocks")
        self.block_size = integer("block_size", block_size, 1, unit="tokens")
        self.free = self.num_blocks  # blocks on the free list
        self._held: dict = {}  # sequence id -> blocks it holds (>= 1)
        self.allocated = 0
        self.freed = 0

    @property
    def sequences(self) -> int:
        """Live sequences (holding at least one block)."""
        return len(self._held)

    def held(self, rid) -> int:
        """Blocks sequence ``rid`` holds (0 if none)."""
        return self._held.get(rid, 0)

    def blocks_for(self, tokens: int) -> int:
        """ceil(tokens / block_size): blocks that hold ``tokens`` KV entries."""
        return -(-tokens // self.block_size)

    def grow(self, rid, held: int, n: int) -> None:
        """Give sequence ``rid`` (holding ``held`` blocks, 0 for a new one) ``n`` >= 1 more, all or
        nothing: :class:`OutOfBlocks` when fewer than ``n`` are free; ``ValueError`` when ``held``
        is not what the pool says ``rid`` holds (the caller's books and the pool's disagree)."""
        have = self._held.get(rid, 0)
        if have != held:
            raise ValueError(f"grow: sequence {rid!r} holds {have} blocks, the caller says {held}")
        if n < 1:
            raise ValueError(f"grow: n must be >= 1 block, got {n}")
        if n > self.free:
            raise OutOfBlocks(f"grow: {n} blocks asked, {self.free} free (the caller must make room)")
        self._held[rid] = have + n
        self.free -= n
        self.allocated += n

    def release(self, rid) -> int:
        """Free every block of ``rid``; returns how many went back to the free list."""
        n = self._held.pop(rid, 0)
        if not n:
            raise ValueError(f"release: sequence {rid!r} holds no blocks (never grown or already released)")
        self.free += n
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
        # the timeline: per step its start, duration and free blocks; the other columns by segment,
        # (steps, *_SEGMENT values of its first step, context growth a step): one for a general step,
        # one for each run of decode-only steps
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.frees: list[int] = []
        self.segments: list[tuple] = []
        self.tl_chunks: list[tuple] = []
        self.tick_step: list[int] = []  # the step that ran each decode tick
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

    def _serve_block_needs(self, preempt: bool = True) -> bool:
        """Give every decode whose next token starts a block (a need due by tick T) its block, in
        (tick, rid) order; needs of preempted decodes leave stale entries: skipped. A need with no
        room preempts (:meth:`_make_room`); with ``preempt=False`` it is left due instead and the
        call returns False (nothing preempted). The common case, room, is :meth:`_grow` then
        :meth:`_push_need` written out (a decode-heavy run serves about one need a step)."""
        heap, T, pool, pop = self.need_heap, self.T, self.pool, heapq.heappop
        caps, class_blocks, peak, bs = self.cap_blocks, self.class_blocks, self.class_peak, pool.block_size
        while heap and heap[0][0] <= T:
            _, rid, epoch, live = heap[0]
            if epoch != live.epoch or live.state != DECODE:
                pop(heap)
                continue
            cls = live.prio
            if pool.free < 1 or (caps and cls in caps and class_blocks.get(cls, 0) + 1 > caps[cls]):
                if not preempt:
                    return False
                pop(heap)
                if self._make_room(live, 1):
                    self._grow(live, 1)
                    self._push_need(live)
                continue
            held = live.held
            pool.grow(rid, held, 1)
            live.held = held = held + 1
            n = class_blocks[cls] = class_blocks[cls] + 1
            if n > peak[cls]:
                peak[cls] = n
            # its next need (as _push_need) replaces this one in one sift; entries are distinct and
            # totally ordered by (tick, rid, epoch), so the order they come out in is the same
            tick = held * bs - live.base + 1
            if tick < live.finish_tick:
                heapq.heapreplace(heap, (tick if tick > T else T, rid, epoch, live))
            else:
                pop(heap)
        return True

    # ---- preemption ------------------------------------------------------------------------
    def _make_room(self, live: _Live, n: int) -> bool:
        """Preempt until ``n`` blocks are free for running ``live`` (and its class stays under
        its share); False when ``live`` itself was the victim."""
        if not self.cap_blocks and self.pool.free >= n:
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
            if self.swapped and not self.preempted_now:
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
        self.starts.append(self.now)
        self.durations.append(dt)
        self.frees.append(self.pool.free)
        self.segments.append((1, d, prefill, pads, len(self.running), len(self.waiting), len(self.swapped),
                              self.preempted_now, self.swap_time, ctx, 0))
        self.now += dt
        if d:
            self.batch_decoding = self.static
            self.tick_step.append(len(self.starts) - 1)
            self.T += 1
            self._decodes_done()
        for live, c in chunks:
            live.computed += c
            if live.computed == live.target:
                self._prefill_done(live)
        if self.static:
            self._batch_over()
        return True

    def _batch_over(self) -> None:
        """Static: once nothing decodes or prefills, the batch is over: its padding members'
        blocks go back and the next batch may fire."""
        if not self.D and not self.prefilling:
            if self.pads:
                for live in self.pads:
                    self._release(live)
                self.pads, self.pad_ctx = [], 0
            self.batch_decoding = False

    # ---- the fast path: steps that can only decode ---------------------------------------------------
    def _decode_only(self) -> bool:
        """The next step can run nothing but decodes: some decode runs, nobody is prefilling, and
        no admission or swap-in can happen (nobody waits or swapped, or the running set is full,
        or a static batch is decoding). Block needs may still preempt (:meth:`_decode_run` hands
        such a step to :meth:`_step`)."""
        if not self.D or self.prefilling:
            return False
        full = len(self.running) >= self.max_running
        if self.waiting and not (full or self.batch_decoding):
            return False
        return full or not self.swapped

    def _decode_run(self, steps: int) -> tuple[int, bool]:
        """Run decode-only steps (while :meth:`_decode_only` holds) exactly as :meth:`_step` would,
        without rebuilding the step each time: the batch (D decodes, padding, counts) stays the
        same until an event, so each step only serves its block needs, is priced and recorded.
        Stops at the step boundary where something else can happen: a request arrives, a decode
        finishes (that step runs here, its completions included), a block need finds no room
        without preempting (that step is left to :meth:`_step`), ``max_steps`` or ``horizon_s``.
        Returns (steps run in total, whether any ran here)."""
        self.preempted_now, self.swap_time = 0, 0.0
        pool, needs, finishes = self.pool, self.need_heap, self.finish_heap
        step_s, start, duration, free = self.cost.step_s, self.starts.append, self.durations.append, self.frees.append
        d, pads, pad_ctx, S = self.D, len(self.pads), self.pad_ctx, self.S
        dp = d + pads  # sequences in each step's batch
        running, waiting, swapped = len(self.running), len(self.waiting), len(self.swapped)
        lives, i = self.lives, self.next_arrival
        wake = lives[i].req.arrival_s if i < len(lives) else math.inf
        stop = math.inf if self.max_steps is None else self.max_steps
        horizon = math.inf if self.horizon_s is None else self.horizon_s
        serve = self._serve_block_needs
        T0 = T = self.T
        now, ran = self.now, False
        while True:
            if needs and needs[0][0] <= T:
                self.T = T
                if not serve(False):
                    break  # a need must preempt: the general step takes this step from here
            dt = step_s(dp, S + d * T + pad_ctx, ()) + 0.0  # cached tokens as in _step
            start(now)
            duration(dt)
            free(pool.free)
            now += dt
            T += 1
            steps += 1
            ran = True
            if (finishes and finishes[0][0] <= T) or wake <= now or steps >= stop or now >= horizon:
                break
        self.T, self.now = T, now
        if ran:  # the run's segment: one row per tick T0..T-1, every one a decode tick
            k = T - T0
            first = len(self.starts) - k
            self.segments.append((k, d, 0, pads, running, waiting, swapped, 0, 0.0, S + d * T0 + pad_ctx, d))
            self.tl_chunks.extend([()] * k)
            self.tick_step.extend(range(first, first + k))
            self.batch_decoding = static = self.static
            if finishes and finishes[0][0] <= T:  # (or a stale entry, which it skips)
                self._decodes_done()
                if static:
                    self._batch_over()
        return steps, ran

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
            if self._decode_only():
                steps, ran = self._decode_run(steps)
                if ran:
                    continue
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

        seg = np.fromiter(self.segments, dtype=_SEG_ROW, count=len(self.segments))
        n = seg["steps"]
        cols = {k: np.repeat(seg[k], n) for k in _SEGMENT}
        step_in_seg = np.arange(len(self.starts)) - np.repeat(np.cumsum(n) - n, n)
        cols["context_tokens"] += np.repeat(seg["context_step"], n) * step_in_seg
        timeline = Timeline(start_s=np.array(self.starts, dtype=float), duration_s=np.array(self.durations, dtype=float),
                            free_blocks=np.array(self.frees, dtype=np.int64), **cols, chunks=tuple(self.tl_chunks))
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
            live_sequences_end=self.pool.sequences,
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
    # The run allocates ~10 small tuples a step and makes no reference cycles; the cyclic collector,
    # which those allocations trigger, would scan every object of the caller's process (a kernel
    # holding figures) again and again for nothing, so it is paused for the run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return engine.run()
    finally:
        if collecting:
            gc.enable()
