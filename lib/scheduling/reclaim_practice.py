"""Practice mode for deferred reclamation with request-id reuse (I096): a model, a grader, drafts.

:class:`ReclaimModel` states what :class:`lib.scheduling.reclaim.RequestTable` must do without page
numbers: incarnations numbered in admission order, tickets mapped to the incarnation they were
launched for, and a page count per incarnation released when it is disconnected and has no step in
flight. :func:`check` grades ANY implementation of the interface (``factory(num_pages)`` with
``admit``, ``launch``, ``complete``, ``disconnect`` and ``free_pages``) on scripted scenarios and
seeded random programs that reuse a handful of ids, deliver completions late, twice, and after a
disconnect. After every operation it checks:

* **no stale output**: a completion streams ``(rid, token)`` exactly when the incarnation its ticket
  was launched for is still live, and never twice;
* **no page freed under a running step, none freed for someone else**: every page ``admit`` hands
  out is held by no other incarnation that is live or still has a step in flight (the grader tracks
  which incarnation holds each page from the implementation's own answers);
* ``free_pages`` equals the model's count, and misuse (launching for an id that is not live,
  disconnecting twice, admitting a live id) raises ValueError and changes nothing.

Programs are ``("pool", n)``, ``("admit", rid, pages)``, ``("launch", rid)``, ``("complete", k)``
(deliver the completion of the k-th launch), ``("dup", k)`` (deliver it again) and
``("disconnect", rid)``. The first failing program is shrunk (:func:`lib.book.practice.grade`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .reclaim import RequestTable

__all__ = ["RECLAIM_VARIANTS", "ReclaimModel", "check", "parse_program", "reclaim_cases", "reclaim_variant",
           "replay", "run_program"]

DEFAULT_PAGES = 8


class ReclaimModel:
    """The specification, in counts (module doc)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = integer("num_pages", num_pages, 1)
        self.live: dict = {}  # rid -> incarnation number
        self.inc: dict = {}  # incarnation -> dict(rid, pages, inflight, alive, freed)
        self.tickets: dict = {}  # launch number k -> incarnation (pending); done launches in self.done
        self.done: set = set()
        self.launches = 0

    @property
    def free(self) -> int:
        return self.num_pages - sum(i["pages"] for i in self.inc.values() if not i["freed"])

    def admit(self, rid, pages: int):
        if rid in self.live:
            raise ValueError("live id")
        if pages > self.free:
            return None
        n = len(self.inc)
        self.inc[n] = dict(rid=rid, pages=pages, inflight=0, alive=True, freed=False)
        self.live[rid] = n
        return n

    def launch(self, rid) -> int:
        if rid not in self.live:
            raise ValueError("not live")
        self.launches += 1
        self.tickets[self.launches] = self.live[rid]
        self.inc[self.live[rid]]["inflight"] += 1
        return self.launches

    def complete(self, k: int, token):
        if k in self.done:
            return None
        n = self.tickets.pop(k)
        self.done.add(k)
        i = self.inc[n]
        i["inflight"] -= 1
        if i["alive"]:
            return (i["rid"], token)
        if i["inflight"] == 0:
            i["freed"] = True
        return None

    def disconnect(self, rid) -> None:
        if rid not in self.live:
            raise ValueError("not live")
        i = self.inc[self.live.pop(rid)]
        i["alive"] = False
        if i["inflight"] == 0:
            i["freed"] = True


def _free_of(obj):
    got = getattr(obj, "free_pages", None)
    return got() if callable(got) else got


def _describe(ops: Sequence) -> str:
    lines, launches = [], 0
    if not ops or ops[0][0] != "pool":
        lines.append(f"  table = factory(num_pages={DEFAULT_PAGES})")
    for op in ops:
        kind = op[0]
        if kind == "pool":
            lines.append(f"  table = factory(num_pages={op[1]})")
        elif kind == "admit":
            lines.append(f"  table.admit({op[1]!r}, {op[2]})")
        elif kind == "launch":
            launches += 1
            lines.append(f"  t{launches} = table.launch({op[1]!r})")
        elif kind == "complete":
            lines.append(f"  table.complete(t{op[1]}, 'tok{op[1]}')")
        elif kind == "dup":
            lines.append(f"  table.complete(t{op[1]}, 'tok{op[1]}')   # delivered again")
        else:
            lines.append(f"  table.disconnect({op[1]!r})")
    return "\n".join(lines)


def run_program(factory: Callable[[int], object], ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(num_pages)`` beside a :class:`ReclaimModel`; raise AssertionError
    at the first stale output, page handed out under a running step or for someone else, count
    mismatch or accepted misuse (a leading ``("pool", n)`` sets the pool)."""
    ops = list(ops)
    num_pages = ops[0][1] if ops and ops[0][0] == "pool" else DEFAULT_PAGES
    table, model = factory(num_pages), ReclaimModel(num_pages)
    tickets: dict = {}  # launch number -> the implementation's ticket
    owner: dict = {}  # page -> incarnation holding it (from the implementation's answers)
    launch_no = 0

    def who(n):
        i = model.inc[n]
        state = "live" if i["alive"] else f"disconnected, {i['inflight']} step(s) still in flight"
        return f"incarnation {n} of {i['rid']!r} ({state})"

    for step, op in enumerate((op for op in ops if op[0] != "pool"), 1):
        kind = op[0]
        if kind in ("complete", "dup"):
            k = op[1]
            if k not in tickets:
                continue  # that launch was refused or shrunk away
            token = f"tok{k}"
            was_done = k in model.done
            n_inc = model.tickets.get(k)
            want = model.complete(k, token)
            got = table.complete(tickets[k], token)
            got = tuple(got) if got is not None else None
            if got != want:
                if want is None and got is not None:
                    if was_done:
                        why = "that completion was already delivered once: a duplicate must change nothing"
                    else:
                        rid = model.inc[n_inc]["rid"]
                        why = (f"t{k} was launched for {rid!r}, which has disconnected"
                               + (f", and {rid!r} now names a new request: stale output to the wrong client"
                                  if rid in model.live else ": nobody is listening"))
                    raise AssertionError(f"step {step}: complete(t{k}) streamed {got!r}, but {why}")
                hint = (f": t{k}'s request {want[0]!r} is live; did another request's completion end it or free its "
                        "pages?" if want is not None and got is None else
                        " (stream the token to the live request the ticket was launched for)")
                raise AssertionError(f"step {step}: complete(t{k}) returned {got!r}; expected {want!r}{hint}")
            for page, n in list(owner.items()):
                if model.inc[n]["freed"]:
                    del owner[page]
        else:
            rid = op[1]
            args = op[1:]
            try:
                want = getattr(model, kind)(*args)
                refused = None
            except ValueError as err:
                want, refused = None, err
            try:
                got = getattr(table, kind)(*args)
            except ValueError as err:
                if refused is None:
                    raise AssertionError(f"step {step}: {kind}({rid!r}) raised ValueError ({err}) on a valid call") from None
                got = None
            else:
                if refused is not None:
                    raise AssertionError(f"step {step}: {kind}({rid!r}) was accepted, but it must raise ValueError "
                                         f"({refused}) and change nothing")
            if refused is None:
                if kind == "admit":
                    if (got is None) != (want is None):
                        raise AssertionError(f"step {step}: admit({rid!r}, {op[2]}) returned {got!r}; "
                                             + (f"{model.free + (op[2] if want is not None else 0)} pages were free"
                                                if want is not None else
                                                f"only {model.free} pages are free, so it must return None"))
                    if got is not None:
                        pages = list(got)
                        if len(pages) != op[2] or len(set(pages)) != len(pages):
                            raise AssertionError(f"step {step}: admit returned {pages} for {op[2]} pages")
                        for p in pages:
                            if not (isinstance(p, int) and 0 <= p < num_pages):
                                raise AssertionError(f"step {step}: page {p!r} is outside the pool 0..{num_pages - 1}")
                            if p in owner:
                                raise AssertionError(f"step {step}: admit({rid!r}) was given page {p}, which still "
                                                     f"belongs to {who(owner[p])}: freed too early, or freed for the "
                                                     "wrong request")
                        for p in pages:
                            owner[p] = want
                elif kind == "launch":
                    launch_no += 1
                    tickets[launch_no] = got
                elif kind == "disconnect":
                    for page, n in list(owner.items()):
                        if model.inc[n]["freed"]:
                            del owner[page]
        free = _free_of(table)
        if free is not None and free != model.free:
            held = {n: i["pages"] for n, i in model.inc.items() if not i["freed"]}
            raise AssertionError(f"after step {step}: free_pages is {free}; the incarnations still holding pages "
                                 f"(live, or with a step in flight) hold {sum(held.values())} of {num_pages}, "
                                 f"leaving {model.free}")


def _random_program(rng: random.Random, num_ops: int, num_pages: int) -> list:
    model = ReclaimModel(num_pages)
    ops: list = []
    ids = ("a", "b", "c")
    for _ in range(num_ops):
        r = rng.random()
        live = list(model.live)
        pending = list(model.tickets)
        if r < 0.25:
            rid = rng.choice(ids)
            op = ("admit", rid, rng.randint(1, max(1, num_pages // 2)))
        elif r < 0.5 and live:
            op = ("launch", rng.choice(live))
        elif r < 0.72 and pending:
            op = ("complete", rng.choice(pending))
        elif r < 0.8 and model.done:
            op = ("dup", rng.choice(sorted(model.done)))
        elif r < 0.95 and live:
            op = ("disconnect", rng.choice(live))
        else:
            op = (rng.choice(("launch", "disconnect")), rng.choice(ids))  # maybe not live: must be refused
        try:
            if op[0] in ("complete", "dup"):
                model.complete(op[1], "x")
            else:
                getattr(model, op[0])(*op[1:])
        except ValueError:
            pass
        ops.append(op)
    return ops


def reclaim_cases(num_random: int = 150, *, seed: int = 0) -> list[Case]:
    """Scripted scenarios (late completion after id reuse, duplicate delivery, disconnect with a step
    in flight, pages reused too early, misuse) and ``num_random`` seeded random programs over the ids
    a, b, c on pools of 3 to 10 pages."""
    n = integer("num_random", num_random, 0)
    pool = ("pool", 4)
    cases = [
        Case("a late completion after the id is reused", (
            pool, ("admit", "a", 2), ("launch", "a"), ("disconnect", "a"), ("admit", "a", 2), ("launch", "a"),
            ("complete", 1), ("complete", 2))),
        Case("pages wait for the step in flight", (
            pool, ("admit", "a", 3), ("launch", "a"), ("disconnect", "a"), ("admit", "b", 2), ("complete", 1),
            ("admit", "c", 3))),
        Case("a duplicate completion changes nothing", (
            pool, ("admit", "a", 2), ("launch", "a"), ("complete", 1), ("dup", 1), ("launch", "a"), ("dup", 1),
            ("complete", 2))),
        Case("a late completion frees its own pages, not the new request's", (
            pool, ("admit", "a", 2), ("launch", "a"), ("disconnect", "a"), ("admit", "a", 2), ("complete", 1),
            ("admit", "b", 2), ("admit", "c", 1))),
        Case("a disconnected request streams nothing", (
            pool, ("admit", "a", 1), ("launch", "a"), ("launch", "a"), ("disconnect", "a"), ("complete", 2),
            ("complete", 1), ("admit", "b", 4))),
        Case("misuse is refused", (
            pool, ("launch", "a"), ("admit", "a", 1), ("admit", "a", 1), ("disconnect", "a"), ("disconnect", "a"),
            ("launch", "a"), ("admit", "a", 4))),
    ]
    rng = random.Random(seed)
    for k in range(n):
        pages = rng.randint(3, 10)
        cases.append(Case(f"random program {k}", (("pool", pages), *_random_program(rng, rng.randint(6, 30), pages))))
    return cases


def check(factory: Callable[[int], object], *, num_random: int = 150, seed: int = 0) -> PracticeReport:
    """Grade any request table: ``factory(num_pages)`` builds one with ``admit(rid, n) -> pages | None``,
    ``launch(rid) -> ticket``, ``complete(ticket, token) -> (rid, token) | None``, ``disconnect(rid)``
    and ``free_pages``; misuse raises ValueError. The first failing case is shown shrunk."""
    return grade("deferred reclamation with id reuse", lambda: factory, reclaim_cases(num_random, seed=seed),
                 run_program, describe=_describe)


# ---- a typed program, for the explorer ------------------------------------------------------------------


def parse_program(text: str) -> list:
    """``"admit a 2; launch a; disconnect a; admit a 2; complete 1; dup 1"`` -> operations
    (``complete k`` / ``dup k`` name the k-th launch). ValueError naming the bad part."""
    if not isinstance(text, str):
        raise ValueError(f"program must be text, got {text!r}")
    ops = []
    for part in (p.strip() for p in text.replace("\n", ";").split(";")):
        if not part:
            continue
        words = part.split()
        kind = words[0].lower()
        try:
            if kind == "admit" and len(words) == 3:
                ops.append(("admit", words[1], integer("pages", int(words[2]), 1)))
            elif kind in ("launch", "disconnect") and len(words) == 2:
                ops.append((kind, words[1]))
            elif kind in ("complete", "dup") and len(words) == 2:
                ops.append((kind, integer("launch number", int(words[1]), 1)))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"cannot read {part!r}: use 'admit ID PAGES', 'launch ID', 'complete K', 'dup K' or "
                             "'disconnect ID' (K: the K-th launch), separated by ';'") from None
    if not ops:
        raise ValueError("the program is empty")
    return ops


def replay(factory: Callable[[int], object], num_pages: int, ops: Sequence) -> list[tuple[str, str]]:
    """Run ``ops`` on ``factory(num_pages)`` and say what each did (no grading): rows of (operation,
    outcome), ending with the free pages and the first problem the grader would report, if any."""
    table = factory(num_pages)
    tickets, rows = {}, []
    for op in ops:
        kind = op[0]
        try:
            if kind == "admit":
                out = table.admit(op[1], op[2])
                text = "no room (None)" if out is None else f"pages {list(out)}"
                label = f"admit {op[1]} {op[2]}"
            elif kind == "launch":
                t = table.launch(op[1])
                tickets[len(tickets) + 1] = t
                text, label = f"ticket t{len(tickets)}", f"launch {op[1]}"
            elif kind in ("complete", "dup"):
                label = f"{kind} t{op[1]}"
                if op[1] not in tickets:
                    text = "no such launch"
                else:
                    out = table.complete(tickets[op[1]], f"tok{op[1]}")
                    text = "dropped" if out is None else f"streams {out[1]!r} to {out[0]!r}"
            else:
                table.disconnect(op[1])
                text, label = "ended", f"disconnect {op[1]}"
        except ValueError as err:
            label, text = " ".join(map(str, op)), f"refused: {err}"
        rows.append((label, f"{text}  (free pages {_free_of(table)})"))
    try:
        run_program(factory, [("pool", num_pages), *ops])
        verdict = "the grader finds nothing wrong with this program"
    except AssertionError as err:
        verdict = f"the grader says: {err}"
    rows.append(("verdict", verdict))
    return rows


# ---- defective drafts (each must fail the grader): the reference with one mistake each ---------------
# A draft is either the reference's methods with the mistake edited into their source (edited_class:
# the edits are the whole difference) or a subclass that wraps the reference's methods.


class _StreamsById(RequestTable):
    """Routes a completion by its request id: after id reuse the old token reaches the new client."""

    def complete(self, ticket, token):
        inc = self._inflight.get(ticket)
        out = super().complete(ticket, token)
        if out is None and inc is not None and inc.rid in self._live:
            return (inc.rid, token)
        return out


class _StreamsAfterDisconnect(RequestTable):
    """Streams an in-flight step's token to a client that has gone."""

    def complete(self, ticket, token):
        inc = self._inflight.get(ticket)
        out = super().complete(ticket, token)
        if out is None and inc is not None and not inc.alive and ticket not in self._inflight:
            return (inc.rid, token)
        return out


_DRAFTS = {
    "frees_on_disconnect": edited_class(
        RequestTable, "_FreesOnDisconnect", "Frees the pages at disconnect, with a step still writing them.",
        disconnect=[("if inc.inflight == 0:\nself._release(inc)", "self._release(inc)")]),
    "streams_by_id": _StreamsById,
    "frees_by_id": edited_class(
        RequestTable, "_FreesById", "The late completion of a disconnected request frees whatever the id holds now.",
        complete=[("self._release(inc)",
                   "current = self._live.pop(inc.rid, None)  # the id's request now: a new one if it was reused\n"
                   "if current is not None:\n"
                   "    current.alive = False\n"
                   "    inc = current\n"
                   "self._release(inc)")]),
    "no_dedupe": edited_class(
        RequestTable, "_NoDedupe", "Keeps every ticket: a duplicate delivery streams again and counts the step twice.",
        complete=[("inc = self._inflight.pop(ticket, None)", "inc = self._inflight.get(ticket)")]),
    "leaks_on_disconnect": edited_class(
        RequestTable, "_LeaksOnDisconnect",
        "Forgets deferred reclamation: a request disconnected with a step in flight never frees its pages.",
        complete=[("if inc.inflight == 0:\nself.deferred_pages += len(inc.pages)\nself._release(inc)", "")]),
    "streams_after_disconnect": _StreamsAfterDisconnect,
}
RECLAIM_VARIANTS = tuple(_DRAFTS)


def reclaim_variant(name: str) -> Callable[[int], RequestTable]:
    """A factory for the reference (``"reference"``) or a draft with one defect (``RECLAIM_VARIANTS``)."""
    if name == "reference":
        return RequestTable
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(RECLAIM_VARIANTS)}, got {name!r}")
    return _DRAFTS[name]
