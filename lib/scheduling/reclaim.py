"""Deferred reclamation of a request's KV pages, safe under request-id reuse (I096): the reference.

An engine launches a step on the GPU and learns its result later: the step's completion arrives
after the scheduler has moved on. Two things can happen in between. The client disconnects (or the
request finishes) while a step that writes into its KV pages is still in flight, so the pages
cannot be handed to anyone yet; and the router reuses the request id for a brand-new request, so a
late completion that names the id by itself would stream the old request's token to the new client
or free the new request's pages.

:class:`RequestTable` keeps one **incarnation** per admission. Pages, in-flight steps and the
output stream belong to the incarnation, never to the bare id:

* ``admit(rid, n)`` gives a new incarnation ``n`` free pages (None when too few are free);
* ``launch(rid)`` issues a **ticket** for one step of the id's *current* incarnation; the ticket,
  not the id, is what the completion carries back;
* ``complete(ticket, token)`` streams ``(rid, token)`` only if the ticket's incarnation is still
  live; a completion of a disconnected incarnation is dropped, and its last in-flight step frees
  its pages; a ticket completed before is a duplicate delivery and changes nothing;
* ``disconnect(rid)`` ends the current incarnation (a normal finish takes the same path): nothing
  more is streamed and its pages are freed now if no step is in flight, else when the last one
  completes (deferred reclamation). The id is free for reuse at once.

Invariants: a page is never handed out while a step that writes it is in flight; a completion never
streams to, or frees the pages of, another incarnation; a duplicate completion is a no-op; when
nothing is live or in flight every page is free.
"""

from __future__ import annotations

from collections.abc import Hashable

from lib.inputs import integer

__all__ = ["RequestTable"]


class _Incarnation:
    __slots__ = ("alive", "inflight", "pages", "rid")

    def __init__(self, rid: Hashable, pages: list[int]) -> None:
        self.rid, self.pages, self.inflight, self.alive = rid, pages, 0, True


class RequestTable:
    """Requests, their KV pages and their in-flight steps (module doc); ``num_pages`` in the pool."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = integer("num_pages", num_pages, 1, unit="pages")
        self._free = list(range(self.num_pages - 1, -1, -1))  # a stack: page 0 is handed out first
        self._live: dict[Hashable, _Incarnation] = {}  # rid -> its current incarnation
        self._inflight: dict[int, _Incarnation] = {}  # ticket -> the incarnation its step writes
        self._issued = 0  # tickets 0 .. issued - 1 exist
        self.deferred_pages = 0  # pages whose release waited for an in-flight step, summed

    @property
    def free_pages(self) -> int:
        """Pages no incarnation holds."""
        return len(self._free)

    def live(self) -> list:
        """Ids with a live incarnation."""
        return list(self._live)

    def admit(self, rid: Hashable, num_pages: int) -> list[int] | None:
        """A new incarnation of ``rid`` with ``num_pages`` pages (returned), or None when too few are
        free. ValueError if ``rid`` is live (its old incarnation may still be draining: that is fine)."""
        n = integer("num_pages", num_pages, 1, unit="pages")
        if rid in self._live:
            raise ValueError(f"request {rid!r} is live: disconnect it before reusing the id")
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self._live[rid] = _Incarnation(rid, pages)
        return list(pages)

    def launch(self, rid: Hashable) -> int:
        """A ticket for one in-flight step of ``rid``'s current incarnation (ValueError if not live)."""
        inc = self._live.get(rid)
        if inc is None:
            raise ValueError(f"request {rid!r} is not live: nothing to launch")
        ticket = self._issued
        self._issued += 1
        self._inflight[ticket] = inc
        inc.inflight += 1
        return ticket

    def complete(self, ticket: int, token) -> tuple | None:
        """The step of ``ticket`` finished with ``token``: ``(rid, token)`` to stream if its
        incarnation is live, else None (dropped; the last in-flight step of a disconnected
        incarnation frees its pages). A duplicate delivery returns None and changes nothing;
        a ticket never issued raises ValueError."""
        inc = self._inflight.pop(ticket, None)
        if inc is None:
            if isinstance(ticket, int) and 0 <= ticket < self._issued:
                return None  # delivered before: a duplicate
            raise ValueError(f"ticket {ticket!r} was never issued")
        inc.inflight -= 1
        if inc.alive:
            return (inc.rid, token)
        if inc.inflight == 0:
            self.deferred_pages += len(inc.pages)
            self._release(inc)
        return None

    def disconnect(self, rid: Hashable) -> None:
        """End ``rid``'s current incarnation (client gone, or finished): stream nothing more, free its
        pages now or after its last in-flight step. ValueError if ``rid`` is not live."""
        inc = self._live.pop(rid, None)
        if inc is None:
            raise ValueError(f"request {rid!r} is not live")
        inc.alive = False
        if inc.inflight == 0:
            self._release(inc)

    def _release(self, inc: _Incarnation) -> None:
        self._free.extend(reversed(inc.pages))
        inc.pages = []
