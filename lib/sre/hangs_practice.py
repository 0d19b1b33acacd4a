"""Practice mode for the hang analysis (N051): given every rank's flight-recorder dump, name the cause and
the rank.

The candidate writes ``analyse(dumps)``: ``dumps`` a list with one :class:`lib.sre.hangs.Dump` per rank
(None for a rank that left none; a dump's ``entries`` are :class:`~lib.sre.hangs.Entry` with ``seq``,
``op``, ``sizes``, ``state``), returning ``(cause, rank)``: cause one of ``dead``, ``stuck``,
``conditional``, ``mismatch``, ``link`` (every rank inside the same collective, none completes; rank None)
or ``none`` (nothing stuck; rank None). The oracle is the simulator's injected truth
(:func:`lib.sre.hangs.simulate_hang`). A case is a list of scenarios, so a failure shrinks to the one
scenario that shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lib.book.drafts import edited
from lib.book.practice import Case, PracticeReport, grade

from .hangs import find_missing_rank, simulate_hang

__all__ = ["QUESTION", "VARIANTS", "cases", "check", "reference", "run", "skeleton", "variant"]

QUESTION = "Which rank is missing, and why (N051)"


def skeleton(dumps):
    """dumps: one Dump per rank (None if the rank left none), each with .entries (oldest first), every
    entry with .seq, .op, .sizes, .state ('scheduled' | 'started' | 'completed'). Return (cause, rank):
    cause in 'dead', 'stuck', 'conditional', 'mismatch', 'link', 'none'; rank None for 'link' and 'none'."""
    raise NotImplementedError


def reference(dumps):
    """The reference: :func:`lib.sre.hangs.find_missing_rank` as (cause, rank)."""
    f = find_missing_rank(dumps)
    return f.cause, f.rank


_DRAFTS = {
    "ranks without a dump dropped": (
        "the dumps that exist are analysed as if they were all the ranks: the dead rank vanishes and the ranks "
        "after it are renumbered",
        [("missing = [r for r, d in enumerate(dumps) if d is None]", "missing = []\ndumps = present")]),
    "op compared, sizes ignored": (
        "ranks compared by op name only: two reduce-scatters of other sizes look alike, so an order or shape "
        "mismatch reads as a transport hang",
        [("return None if e is None else e.key", "return None if e is None else e.op")]),
    "entries counted, not sequence ids": (
        "the rank with fewer entries is taken as behind: once the ring buffers are full every rank holds the "
        "same number of entries and the stuck rank is never found",
        [("behind = [r for r in range(len(dumps)) if last[r] < g]",
          "behind = [r for r in range(len(dumps)) if len(by_rank[r]) < max(len(m) for m in by_rank)]")]),
    "matched by buffer position": (
        "entries matched by their position in each rank's ring buffer instead of their sequence id: right while "
        "no buffer has wrapped, wrong once a rank with more or fewer collectives has dropped other old entries",
        [("by_rank = [{e.seq: e for e in d.entries} for d in dumps]",
          "by_rank = [dict(enumerate(d.entries)) for d in dumps]")]),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or a draft (one of ``VARIANTS``), with the candidate's interface."""
    if name == "reference":
        return reference
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    draft = edited(find_missing_rank, _DRAFTS[name][1], name=name)

    def analyse(dumps):
        f = draft(dumps)
        return f.cause, f.rank

    return analyse


def _scenario(cause, n, bad, hang_step=3, buffer_entries=2000, seed=0) -> tuple:
    return ("scenario", cause, n, bad, hang_step, buffer_entries, seed)


def run(impl: Callable, ops: Sequence) -> None:
    """Simulate each scenario of ``ops`` and compare ``impl``'s (cause, rank) with the injected truth."""
    for _, cause, n, bad, hang_step, buf, seed in ops:
        sim = simulate_hang(n, cause, bad, hang_step=hang_step, buffer_entries=buf, seed=seed)
        got = impl(list(sim.dumps))
        try:
            got_cause, got_rank = got
        except (TypeError, ValueError) as err:
            raise AssertionError(f"return (cause, rank); got {got!r}") from err
        if (got_cause, got_rank) != (cause, sim.rank):
            truth = f"{cause} on rank {sim.rank}" if sim.rank is not None else f"{cause} (no rank to name)"
            raise AssertionError(f"{n} ranks, injected {truth}: you said {got_cause} on rank {got_rank}")


def cases() -> list[Case]:
    """Each cause alone on small groups (the first and last rank), then with full ring buffers, then many."""
    causes = ("dead", "stuck", "conditional", "mismatch")
    return [
        Case("each cause, 4 ranks, rank 2", tuple(_scenario(c, 4, 2) for c in causes)),
        Case("each cause on rank 0 and on the last rank", tuple(_scenario(c, 5, b) for c in causes for b in (0, 4))),
        Case("nothing stuck, or the transport", (_scenario("none", 4, 0), _scenario("link", 6, 1))),
        Case("full ring buffers (8 entries)", tuple(_scenario(c, 6, 3, hang_step=6, buffer_entries=8, seed=2)
                                                    for c in causes + ("link",))),
        Case("a dead rank in the middle of 32", (_scenario("dead", 32, 13, seed=3),)),
        Case("64 ranks, every cause, seeds", tuple(_scenario(c, 64, (7 * i + 5) % 64, hang_step=i, seed=i)
                                                   for i, c in enumerate(causes * 2))),
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {n} ranks: {cause} injected on rank {bad} at step {hs}, ring buffer {buf} entries, seed {seed}"
                     for _, cause, n, bad, hs, buf, seed in ops) or "  (no scenario)"


def check(candidate: Callable) -> PracticeReport:
    """Grade any ``analyse(dumps) -> (cause, rank)``; the report shows the first failing scenario."""
    return grade(QUESTION, lambda: candidate, cases(), run, describe)
