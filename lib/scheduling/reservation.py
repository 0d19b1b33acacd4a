"""Admission by token reservation, with refunds and fail-fast (I091): the reference implementation.

A request declares ``prompt_tokens`` and ``max_tokens``; what it really costs (prompt + generated)
is known only when it finishes, anywhere between a few tokens and its declared worst case. The
controller keeps a bucket of ``capacity`` KV tokens and:

* **reserves at admission** the worst case ``need = prompt_tokens + max_tokens``; a request is
  admitted only while ``need <= free``, so the sum of live reservations never exceeds the capacity
  and therefore neither does the KV the admitted requests really write (each writes at most its
  reservation: the engine stops it at ``max_tokens``). That is the bound: admitted work never runs
  out of KV, so nothing is ever preempted;
* **refunds at completion** (or cancellation) the whole reservation, whatever was used, and
  admits from the queue again;
* **fails fast**: a request whose ``need`` exceeds the whole capacity can never be admitted and is
  rejected at submission, instead of sitting at the head of the queue forever;
* queues the rest in **FIFO** order: the head waits until it fits and nobody passes it, so a large
  request is never starved by a stream of small ones (the price: head-of-line blocking).

``complete`` and ``cancel`` return the ids admitted as a consequence, in order. Misuse raises
ValueError and changes nothing: a duplicate live id, completing a request that is not running,
reporting more tokens used than reserved. SI units: tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from lib.inputs import integer

__all__ = ["ADMITTED", "QUEUED", "REJECTED", "ReservationAdmission", "reservation_tradeoff"]

ADMITTED, QUEUED, REJECTED = "admitted", "queued", "rejected"


class ReservationAdmission:
    """A bucket of ``capacity`` KV tokens admitting requests by their worst case (module doc)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = integer("capacity", capacity, 1, unit="tokens")
        self._running: dict[Hashable, int] = {}  # rid -> reserved tokens
        self._queue: OrderedDict[Hashable, int] = OrderedDict()  # rid -> tokens it will reserve, FIFO
        self._free = self.capacity
        self.refunded = 0  # tokens reserved but never used, summed over completions

    # ---- what callers read -----------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        """capacity - sum of live reservations."""
        return self._free

    @property
    def reserved_tokens(self) -> int:
        """Sum of the running requests' reservations (<= capacity, always)."""
        return self.capacity - self._free

    def running(self) -> list:
        """Ids holding a reservation, in admission order."""
        return list(self._running)

    def queued(self) -> list:
        """Ids waiting, head first."""
        return list(self._queue)

    # ---- operations --------------------------------------------------------------------------
    def submit(self, rid: Hashable, prompt_tokens: int, max_tokens: int) -> str:
        """Admit ``rid`` now (reserve prompt + max_tokens), queue it, or reject it when that worst
        case exceeds the whole capacity. Returns ``"admitted"``, ``"queued"`` or ``"rejected"``."""
        p = integer("prompt_tokens", prompt_tokens, 1, unit="tokens")
        m = integer("max_tokens", max_tokens, 1, unit="tokens")
        if rid in self._running or rid in self._queue:
            raise ValueError(f"request {rid!r} is already live (running or queued): ids must be unique while live")
        need = p + m
        if need > self.capacity:
            return REJECTED  # fail fast: it could never be admitted
        if not self._queue and need <= self._free:
            self._reserve(rid, need)
            return ADMITTED
        self._queue[rid] = need
        return QUEUED

    def complete(self, rid: Hashable, used_tokens: int) -> list:
        """``rid`` finished having written ``used_tokens`` (prompt + generated, at most its
        reservation): refund the unused part, release the reservation, admit from the queue.
        Returns the ids admitted now, in order."""
        if rid not in self._running:
            raise ValueError(f"request {rid!r} is not running (never admitted, still queued, or already done)")
        used = integer("used_tokens", used_tokens, 0, unit="tokens")
        held = self._running[rid]
        if used > held:
            raise ValueError(f"request {rid!r} reports {used} tokens used but reserved {held}: it ran past its "
                             "max_tokens, which the engine must stop")
        del self._running[rid]
        self._free += held
        self.refunded += held - used
        return self._pump()

    def cancel(self, rid: Hashable) -> list:
        """The client went away: drop ``rid`` from the queue, or release its whole reservation if
        it was running. Returns the ids admitted as a result (a cancelled head unblocks the queue)."""
        if rid in self._queue:
            del self._queue[rid]
        elif rid in self._running:
            self._free += self._running.pop(rid)
        else:
            raise ValueError(f"request {rid!r} is not live")
        return self._pump()

    # ---- internals ---------------------------------------------------------------------------
    def _reserve(self, rid: Hashable, need: int) -> None:
        self._running[rid] = need
        self._free -= need

    def _pump(self) -> list:
        """Admit from the head while the head fits (FIFO: nobody passes a head that does not)."""
        admitted = []
        while self._queue:
            rid, need = next(iter(self._queue.items()))
            if need > self._free:
                break
            del self._queue[rid]
            self._reserve(rid, need)
            admitted.append(rid)
        return admitted


def reservation_tradeoff(pool_tokens: int, prompts, outputs, max_tokens) -> dict:
    """For each declared ``max_tokens`` M (array), over sampled ``prompts`` and uncapped ``outputs``
    (tokens): the fraction of requests cut off (O > M), the fraction of reserved tokens never written
    1 - E[P + min(O, M)] / E[P + M], and the concurrency a reservation bucket of ``pool_tokens`` allows,
    pool / E[P + M], against greedy admission's pool / E[P + min(O, M) / 2] (a request's mean holding).
    Returns numpy arrays, one value per M: ``cut``, ``idle``, ``reserve_conc``, ``greedy_conc``."""
    import numpy as np

    integer("pool_tokens", pool_tokens, 1, unit="tokens")
    p = np.asarray(prompts, dtype=float)[None, :]
    o = np.asarray(outputs, dtype=float)[None, :]
    m = np.asarray(max_tokens, dtype=float)[:, None]
    real = p + np.minimum(o, m)
    reserved = p + m
    return {
        "cut": (o > m).mean(axis=1),
        "idle": 1 - real.mean(axis=1) / reserved.mean(axis=1),
        "reserve_conc": pool_tokens / reserved.mean(axis=1),
        "greedy_conc": pool_tokens / (p + np.minimum(o, m) / 2).mean(axis=1),
    }
