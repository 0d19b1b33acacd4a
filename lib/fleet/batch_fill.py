"""Filling a chat fleet's idle capacity with batch work: how much batch a replica can take beside its chat.

A chat replica of ``dep`` carries ``chat_rate`` requests/s (``P_c`` + ``O_c`` tokens) and must keep
every step within the chat TPOT target ``T``. Batch requests (``P_b`` + ``O_b`` tokens, no latency
target of their own) ride in the same steps. In steady state a step of length ``T`` carries

    D = (lambda_c O_c + lambda_b O_b) T decodes,  C = (lambda_c P_c + lambda_b P_b) T prompt tokens,

priced by the simulator's own mixed step (:func:`lib.scheduling.cost.step_cost`, cached context
summed over both classes, each class's C tokens one chunk at its mean start (P - c) / 2, since a prompt
fed over several steps attends to its part already cached), and the KV pool holds D_c (P_c + O_c) + D_b (P_b + O_b) tokens plus one
prompt of each class being prefilled. :func:`batch_headroom` finds the largest batch rate
``lambda_b`` both allow (bisection) and says which binds: at long batch contexts it is the KV pool,
not the step time (compute and bandwidth): the batch the pool holds is smaller than the batch the
step could run.

* :func:`dedicated_batch` is the other end: a replica running batch only, at the batch its KV pool
  holds (:func:`lib.fleet.capacity.request_cost` with that batch), against the batch at which the
  step would turn compute-bound (:func:`lib.perf.throughput.compute_bound_batch`).
* :func:`day_of_batch`: the batch a fleet sized for its chat peak
  (:func:`lib.fleet.diurnal.fixed_fleet`) absorbs over the day's demand curve
  (:func:`lib.fleet.diurnal.demand`), slot by slot, with the chat spread evenly over the replicas.

SI units: seconds, requests per second, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["BatchDay", "DedicatedBatch", "Headroom", "batch_headroom", "day_of_batch", "dedicated_batch"]


@dataclass(frozen=True)
class Headroom:
    """The batch one chat replica can take (module doc): ``batch_rate`` requests/s, the decodes of
    each class in a step, the step, and what binds ('the KV pool', 'the TPOT target' or
    'max_num_seqs'; 'the chat alone' when the chat leaves no room at all)."""

    chat_rate: float
    batch_rate: float
    chat_decodes: float
    batch_decodes: float
    step_s: float
    binding: str
    kv_share: float  # the batch's share of the KV pool at that rate: its decodes and the one document in prefill

    @property
    def batch_tokens_per_s(self) -> float:
        return self.batch_decodes / self.step_s if self.step_s > 0 else 0.0


def _kv_tokens(dc, db, pc, oc, pb, ob, lam_c, lam_b) -> float:
    return dc * (pc + oc) + db * (pb + ob) + (pc if lam_c > 0 else 0) + (pb if lam_b > 0 else 0)


def batch_headroom(dep, chat_rate: float, chat_prompt: int, chat_output: int, tpot_s: float,
                   batch_prompt: int, batch_output: int) -> Headroom:
    """The largest batch rate one replica of ``dep`` takes beside ``chat_rate`` chat requests/s
    with every step within ``tpot_s`` and the KV pool holding both classes (module doc)."""
    from lib.perf.deployment import require
    from lib.scheduling.cost import step_cost

    dep = require(dep)
    lam_c = real("chat_rate", chat_rate, 0, unit="requests/s")
    pc = integer("chat_prompt", chat_prompt, 1, unit="tokens")
    oc = integer("chat_output", chat_output, 1, unit="tokens")
    pb = integer("batch_prompt", batch_prompt, 1, unit="tokens")
    ob = integer("batch_output", batch_output, 1, unit="tokens")
    dep.mdl.check_context(pc + oc, "chat_prompt + chat_output")
    dep.mdl.check_context(pb + ob, "batch_prompt + batch_output")
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    cost = step_cost(dep)
    cap, seqs = dep.budget.token_capacity, min(dep.max_num_seqs, cost.max_batch)

    def step(d: float, ctx: float, cc: float, cb: float) -> float:
        # each class's prompt tokens of a step as one chunk at its mean start, (P - c) / 2: a prompt fed over
        # several steps attends to its part already cached, so a long prompt's later chunks cost more
        chunk = [(max(1, round(c)), max(0, round((p - c) / 2))) for c, p in ((cc, pc), (cb, pb)) if c >= 0.5]
        lo = math.floor(d)

        def at(n: int) -> float:
            if n == 0:
                return cost.step_s(0, 0, chunk) if chunk else 0.0
            return cost.step_s(n, ctx * n / d, chunk)

        w = d - lo
        return at(lo) if w == 0 else (1 - w) * at(lo) + w * at(lo + 1)

    def state(lam_b: float):
        dc, db = lam_c * oc * t, lam_b * ob * t
        d = dc + db
        if d > seqs - 1:
            return dc, db, math.inf, "max_num_seqs"
        if _kv_tokens(dc, db, pc, oc, pb, ob, lam_c, lam_b) > cap:
            return dc, db, math.inf, "the KV pool"
        if d == 0:
            return dc, db, 0.0, "the TPOT target"
        ctx = dc * (pc + oc / 2) + db * (pb + ob / 2)
        return dc, db, step(d, ctx, lam_c * pc * t, lam_b * pb * t), "the TPOT target"

    dc0, _, s0, why0 = state(0.0)
    if s0 > t:
        return Headroom(lam_c, 0.0, dc0, 0.0, s0, "the chat alone", 0.0)
    if state(1e-9)[2] > t:
        return Headroom(lam_c, 0.0, dc0, 0.0, s0, state(1e-9)[3], 0.0)
    lo, hi = 0.0, 1.0
    while state(hi)[2] <= t:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if state(mid)[2] <= t else (lo, mid)
    dc, db, s, _ = state(lo)
    share = (db * (pb + ob) + (pb if lo > 0 else 0)) / cap  # its decodes plus the document being prefilled (_kv_tokens)
    return Headroom(lam_c, lo, dc, db, s, state(hi)[3], share)


@dataclass(frozen=True)
class DedicatedBatch:
    """A replica running batch only (module doc): its :class:`~lib.fleet.capacity.RequestCost` at
    the KV pool's batch, and the batch at which its decode step would turn compute-bound."""

    cost: object
    kv_batch: float
    compute_bound_batch: float

    @property
    def binding(self) -> str:
        return "the KV pool" if self.kv_batch < self.compute_bound_batch else "compute"


def dedicated_batch(dep, batch_prompt: int, batch_output: int) -> DedicatedBatch:
    """Batch-only replica of ``dep``: request_cost at batch = what the KV pool holds at P + O
    (capped by max_num_seqs), and compute_bound_batch at the mean context."""
    from lib.fleet.capacity import request_cost
    from lib.perf.deployment import require
    from lib.perf.throughput import compute_bound_batch

    dep = require(dep)
    pb = integer("batch_prompt", batch_prompt, 1, unit="tokens")
    ob = integer("batch_output", batch_output, 1, unit="tokens")
    dep.mdl.check_context(pb + ob, "batch_prompt + batch_output")
    held = dep.budget.max_concurrency(pb + ob)
    b = int(min(held, dep.max_num_seqs))
    if b < 1:
        raise ValueError(f"the KV pool of {dep.label} holds {held:.2f} sequences of {pb + ob:,} tokens: no batch fits")
    return DedicatedBatch(request_cost(dep, pb, ob, batch=b), held, compute_bound_batch(dep, pb + ob // 2))


@dataclass(frozen=True)
class BatchDay:
    """A day of a chat fleet sized for its peak, with batch in its idle capacity two ways (module doc):
    ``mixed``: every replica takes :func:`batch_headroom` beside its share of the chat; ``drained``:
    the chat is packed onto the whole replicas it needs (``fleet_for_load``, rounded up) and the rest
    run batch only (:func:`dedicated_batch`). Per slot: fleet requests/s of chat and of batch."""

    fleet: object  # lib.fleet.diurnal.FixedFleet
    chat_cost: object  # the chat RequestCost the fleet was sized with
    dedicated: DedicatedBatch
    hours: tuple
    chat_rate: tuple
    mixed_rate: tuple
    mixed_binding: tuple
    chat_replicas: tuple  # whole replicas the chat needs per slot (drained design)
    drained_rate: tuple
    slot_s: float

    @property
    def mixed_requests(self) -> float:
        """Batch requests a day, mixed."""
        return sum(self.mixed_rate) * self.slot_s

    @property
    def drained_requests(self) -> float:
        """Batch requests a day, drained."""
        return sum(self.drained_rate) * self.slot_s

    @property
    def free_replica_h(self) -> float:
        """Whole replica-hours the chat leaves free (drained design)."""
        return sum(self.fleet.replicas - n for n in self.chat_replicas) * self.slot_s / 3600.0


def day_of_batch(dep, chat_prompt: int, chat_output: int, tpot_s: float, mean_rate: float, peak_to_trough: float,
                 batch_prompt: int, batch_output: int, *, utilization: float | None = None, slots: int = 24,
                 peak_hour: float = 15.0) -> BatchDay:
    """Batch absorbed by a fleet sized for its chat peak (``fixed_fleet`` at ``utilization``), slot by slot,
    mixed and drained (see :class:`BatchDay`); the slot's chat rate is the demand at its middle."""
    from lib.fleet import diurnal
    from lib.fleet.capacity import fleet_for_load, request_cost

    n = integer("slots", slots, 1, 1440)
    chat = request_cost(dep, chat_prompt, chat_output, tpot_s)
    fleet = diurnal.fixed_fleet(chat, mean_rate, peak_to_trough, utilization)
    ded = dedicated_batch(dep, batch_prompt, batch_output)
    slot_s = diurnal.DAY_S / n
    hours, chats, mixed, binds, need, drained = [], [], [], [], [], []
    for k in range(n):
        lam = float(diurnal.demand((k + 0.5) * slot_s, mean_rate, peak_to_trough, peak_hour))
        h = batch_headroom(dep, lam / fleet.replicas, chat_prompt, chat_output, tpot_s, batch_prompt, batch_output)
        whole = min(fleet.replicas, fleet_for_load(lam, chat, utilization).replicas)
        hours.append(k * 24.0 / n)
        chats.append(lam)
        mixed.append(h.batch_rate * fleet.replicas)
        binds.append(h.binding)
        need.append(whole)
        drained.append((fleet.replicas - whole) * ded.cost.max_rate)
    return BatchDay(fleet, chat, ded, tuple(hours), tuple(chats), tuple(mixed), tuple(binds), tuple(need),
                    tuple(drained), slot_s)
