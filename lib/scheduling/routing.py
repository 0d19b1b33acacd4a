"""The launch-to-completion contract of one engine step (I097): output row i belongs to the request
that sat in slot i when the step was launched, and to nobody else.

A step takes the running requests (a dict ``{rid: tokens}`` in admission order), puts them in the
order of a sort policy (``"fcfs"`` keeps admission order; ``"longest_first"`` and
``"shortest_first"`` sort by length, stably, so that padded micro-batches waste little), packs them
(:func:`pack`: ``"padded"`` micro-batches of ``micro_batch`` rows, each as wide as its longest row,
or ``"ragged"``: one flat array with offsets) and launches. The model returns one row per slot.
While the step runs the scheduler moves on: requests finish, are aborted or preempted (they leave
``running``) and new ones are admitted (appended). Completion must route row i to the request of
slot i *at launch*.

**The fake model** (:class:`FakeLM`): the next token is ``crc32(tokens, salt(seed)) mod vocab`` of
the request's own tokens, a pure function of them, so a misrouted row is detectable: the output has
the right shape and every id is valid, but the token is not the continuation of the request that
receives it. Beside the tokens the model echoes, per row, the request id shipped with the batch and
a checksum of the tokens it actually read (:func:`checksum`), and the launch's step number.

**The bug** (:data:`ROUTES`, each a function ``(launch, out, running) -> [(row, rid), ...]``):
completions that scatter rows by a list other than the launch's slots: ``"presort"`` (the admission
order, before the sort), ``"running_index"`` (the running list at completion, which drops and
admissions have shifted), ``"filter_zip"`` (the launched requests still running, zipped with the
rows: one drop shifts every later row by one). At launch, :func:`launch_presort_indices` makes the
packing's twin of the bug: the batch holds the sorted rows, but the positions the sampler reads come
from the pre-sort lengths.

**The repair**: :func:`launch` freezes a manifest, one :class:`Slot` (request id, length, checksum of
its tokens) per slot; :func:`complete` refuses an output that does not match it
(:class:`RoutingError`, a ValueError naming the check and the slot, raised before anything changes):
the launch id, the number of rows, the echoed ids, the token ids and the echoed checksums; it
discards the rows of requests that left, checks each destination (its id, length and checksum are
the slot's) and only then appends row i to slot i's request. :class:`StepRouter` wraps the two as
the reference of the practice question.

Closed forms for one step (:func:`expected_misrouted`) are checked against :func:`simulate`;
:func:`scenario` replays one step with chosen lengths, drops and arrivals; :func:`fault_check` says
which runtime check refuses each fault and what the fault does when nothing checks.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from lib.inputs import fraction, integer

__all__ = ["CHECKS", "FAULTS", "MICRO_BATCH", "PACKINGS", "PAD_ID", "PROMPTS", "ROUTES", "SORTS", "VOCAB", "Batch",
           "Completion", "FakeLM", "FaultResult", "Launch", "Output", "RoutingError", "RoutingRun", "Slot", "StepRecord",
           "StepRouter", "checksum", "complete", "corrupt", "expected_misrouted", "fault_check", "launch",
           "launch_presort_indices", "pack", "padding_share", "prompt_tokens", "scenario", "simulate", "sort_order",
           "verify_output", "verify_plan"]

SORTS = ("fcfs", "longest_first", "shortest_first")
PACKINGS = ("padded", "ragged")
PROMPTS = ("varied", "equal", "sorted")
PAD_ID = 0
VOCAB = 32_000
MICRO_BATCH = 8
#: The runtime checks of :func:`complete`, in the order they run.
CHECKS = ("launch id", "shape", "echoed ids", "token ids", "echoed checksums", "destination id",
          "destination length", "destination checksum")


def _bytes(tokens) -> bytes:
    if isinstance(tokens, np.ndarray):
        return tokens.astype(np.int64, copy=False).tobytes()
    return array("q", tokens).tobytes()  # the same int64 bytes as numpy's, faster for a list


def checksum(tokens: Sequence[int]) -> int:
    """CRC-32 of a token sequence (its int64 bytes), 0 <= value < 2**32: the manifest records it per
    slot and the model echoes it per row. Unequal sequences collide with probability about 2**-32."""
    return zlib.crc32(_bytes(tokens))


def prompt_tokens(rid: int, length: int, vocab: int = VOCAB) -> list[int]:
    """A deterministic prompt of ``length`` tokens for request ``rid`` (ids in 1 .. vocab-1)."""
    rid = integer("rid", rid, 0)
    length = integer("length", length, 1, unit="tokens")
    x = np.arange(length, dtype=np.uint64) + np.uint64((rid << 24) + (length << 48) & (2**64 - 1))
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):  # splitmix64's mixer
        x = (x ^ (x >> np.uint64(shift))) * np.uint64(mult)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(integer("vocab", vocab, 2) - 1) + np.uint64(1)).astype(np.int64).tolist()


# ---- the fake model ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Batch:
    """What one step launches. ``tokens`` is the flat buffer the model reads; slot i's row is
    ``tokens[starts[i] : last[i] + 1]`` and the sampler reads position ``last[i]``. ``rids`` is the
    request id shipped with each slot (the model echoes it), ``widths`` the width of each padded
    micro-batch (empty for ragged packing). Arrays are read-only."""

    step: int
    packing: str
    rids: np.ndarray
    tokens: np.ndarray
    starts: np.ndarray
    last: np.ndarray
    lengths: np.ndarray
    widths: tuple[int, ...] = ()

    @property
    def slots(self) -> int:
        return len(self.rids)

    @property
    def padding_tokens(self) -> int:
        """Buffer positions that hold no request's token (padded micro-batches only)."""
        return int(self.tokens.size - self.lengths.sum())

    @property
    def padding_share(self) -> float:
        """padding_tokens / buffer size: the share of the step's compute spent on padding."""
        return self.padding_tokens / self.tokens.size


@dataclass(frozen=True, eq=False)
class Output:
    """What the model returns for a batch: one row per slot. ``tokens[i]`` is the sampled token of
    row i; ``rids[i]`` and ``checksums[i]`` echo the id shipped with slot i and the checksum of the
    tokens the model read for it; ``step`` echoes the launch's step number."""

    step: int
    tokens: np.ndarray
    rids: np.ndarray
    checksums: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.tokens)


def _frozen(a) -> np.ndarray:
    a = np.array(a, dtype=np.int64)
    a.flags.writeable = False
    return a


@dataclass(frozen=True)
class FakeLM:
    """A deterministic stand-in for a forward pass and greedy sampling.

    ``next_token(tokens) = crc32(tokens, salt) mod vocab`` with ``salt`` from ``seed``: a pure function
    of one request's tokens, so a token that reaches the wrong request is provably not its
    continuation (the chance that two requests' continuations coincide is 1 / vocab)."""

    seed: int = 0
    vocab: int = VOCAB

    def __post_init__(self) -> None:
        integer("seed", self.seed, 0, 2**32 - 1)
        integer("vocab", self.vocab, 2)

    @property
    def _salt(self) -> int:
        return (0x9E3779B9 * (self.seed + 1)) & 0xFFFFFFFF

    def next_token(self, tokens: Sequence[int]) -> int:
        """The token that follows ``tokens`` (a request's prompt and everything generated so far)."""
        return zlib.crc32(_bytes(tokens), self._salt) % self.vocab

    def continuation(self, tokens: Sequence[int], n: int) -> list[int]:
        """The next ``n`` tokens a correct engine appends to ``tokens``."""
        toks, out = list(tokens), []
        for _ in range(integer("n", n, 0)):
            out.append(self.next_token(toks))
            toks.append(out[-1])
        return out

    def forward(self, batch: Batch) -> Output:
        """One row per slot: the next token of the tokens the slot's row holds up to the position
        the sampler reads, the id shipped with the slot, and the checksum of what was read.
        ValueError for a malformed batch (offsets outside the buffer, arrays of unequal length)."""
        n = len(batch.rids)
        if not (len(batch.starts) == len(batch.last) == len(batch.lengths) == n) or n == 0:
            raise ValueError(f"malformed batch: {n} ids, {len(batch.starts)} starts, {len(batch.last)} last "
                             f"positions, {len(batch.lengths)} lengths (one each per slot, at least one slot)")
        size = batch.tokens.size
        if n and (batch.starts.min() < 0 or (batch.last < batch.starts).any() or batch.last.max() >= size):
            raise ValueError(f"malformed batch: a row's [start, last] lies outside the {size}-token buffer")
        salt, buf = self._salt, batch.tokens
        rows, sums = [], []
        for s, e in zip(batch.starts.tolist(), batch.last.tolist(), strict=True):
            data = buf[s:e + 1].tobytes()
            rows.append(zlib.crc32(data, salt) % self.vocab)
            sums.append(zlib.crc32(data))
        return Output(batch.step, _frozen(rows), _frozen(batch.rids), _frozen(sums))


# ---- packing and launch -----------------------------------------------------------------------


def sort_order(lengths: Sequence[int], sort: str) -> list[int]:
    """Admission indices in batch order: ``"fcfs"`` keeps them; ``"longest_first"`` and
    ``"shortest_first"`` sort by length, stably (equal lengths keep admission order)."""
    n = range(len(lengths))
    if sort == "fcfs":
        return list(n)
    if sort == "longest_first":
        return sorted(n, key=lambda i: -lengths[i])
    if sort == "shortest_first":
        return sorted(n, key=lambda i: lengths[i])
    raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")


def pack(rids: Sequence[int], token_lists: Sequence[Sequence[int]], packing: str, *, micro_batch: int = MICRO_BATCH,
         step: int = 0) -> Batch:
    """Pack requests, already in batch order, into one buffer.

    ``"padded"``: micro-batches of ``micro_batch`` rows; each row is as wide as the longest row of
    its micro-batch (pad id 0 after the request's tokens), so the buffer holds
    :math:`\\sum_g m_g \\max_{i \\in g} L_i` tokens. ``"ragged"``: the rows back to back,
    :math:`\\sum_i L_i` tokens, slot i starting at the cumulative length of the slots before it.
    Either way the sampler reads slot i at ``last[i] = starts[i] + L_i - 1``."""
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
    mb = integer("micro_batch", micro_batch, 1)
    if len(rids) != len(token_lists) or not rids:
        raise ValueError(f"pack needs one token list per request id and at least one request; got {len(rids)} ids "
                         f"and {len(token_lists)} token lists")
    ids = [integer("rid", r, 0) for r in rids]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a request can hold one slot only; ids {ids}")
    lengths = np.array([len(t) for t in token_lists], dtype=np.int64)
    if lengths.min() < 1:
        raise ValueError("every request needs at least one token")
    widths: tuple[int, ...] = ()
    if packing == "ragged":
        cu = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
        starts = cu[:-1]
    else:
        parts, starts_l, w_l, off = [], [], [], 0
        for g in range(0, len(ids), mb):
            group = token_lists[g:g + mb]
            w = int(lengths[g:g + mb].max())
            block = np.full((len(group), w), PAD_ID, dtype=np.int64)
            for r, t in enumerate(group):
                block[r, :len(t)] = t
                starts_l.append(off + r * w)
            parts.append(block.ravel())
            w_l.append(w)
            off += block.size
        tokens, starts, widths = np.concatenate(parts), np.array(starts_l, dtype=np.int64), tuple(w_l)
    return Batch(integer("step", step, 0), packing, _frozen(ids), _frozen(tokens), _frozen(starts),
                 _frozen(starts + lengths - 1), _frozen(lengths), widths)


def padding_share(lengths: Sequence[int], sort: str, micro_batch: int = MICRO_BATCH) -> float:
    r"""Share of a padded buffer that is padding when requests of these ``lengths`` (admission order)
    are put in ``sort`` order and packed in micro-batches of ``micro_batch`` rows:
    :math:`1 - \sum_i L_i / \sum_g m_g \max_{i \in g} L_i`. Sorting by length puts like lengths in
    one micro-batch; that is the reason engines reorder a batch at all."""
    order = sort_order(list(lengths), sort)
    rows = [[PAD_ID] * integer("length", lengths[i], 1) for i in order]
    return pack(list(range(len(rows))), rows, "padded", micro_batch=micro_batch).padding_share


@dataclass(frozen=True)
class Slot:
    """One manifest entry: the request in a slot at launch, its length and the checksum of its tokens."""

    rid: int
    length: int
    checksum: int


@dataclass(frozen=True, eq=False)
class Launch:
    """A launched step: the batch, the frozen slot -> request manifest, and the admission (pre-sort)
    order of the same requests (which only a buggy completion reads)."""

    step: int
    sort: str
    packing: str
    batch: Batch
    manifest: tuple[Slot, ...]
    presort: tuple[int, ...]

    @property
    def slot_rids(self) -> tuple[int, ...]:
        return tuple(s.rid for s in self.manifest)


def launch(running: Mapping[int, Sequence[int]], sort: str = "longest_first", packing: str = "padded", *,
           micro_batch: int = MICRO_BATCH, step: int = 0, order: Sequence[int] | None = None) -> Launch:
    """Launch one step over every running request (``{rid: tokens}`` in admission order): batch order
    from ``sort`` (or ``order``, any permutation of admission indices), packed by ``packing``, and
    the manifest ``Slot(rid, len, checksum)`` per slot, frozen at this moment."""
    rids = [integer("rid", r, 0) for r in running]
    if not rids:
        raise ValueError("nothing is running: a step needs at least one request")
    token_lists = [running[r] for r in rids]
    if order is None:
        idx = sort_order([len(t) for t in token_lists], sort)
    else:
        idx = [integer("order index", i, 0, len(rids) - 1) for i in order]
        if sorted(idx) != list(range(len(rids))):
            raise ValueError(f"order must be a permutation of 0..{len(rids) - 1}, got {list(order)}")
    slot_rids = [rids[i] for i in idx]
    batch = pack(slot_rids, [token_lists[i] for i in idx], packing, micro_batch=micro_batch, step=step)
    manifest = tuple(Slot(r, len(running[r]), checksum(running[r])) for r in slot_rids)
    return Launch(batch.step, sort if order is None else "given", packing, batch, manifest, tuple(rids))


def launch_presort_indices(running: Mapping[int, Sequence[int]], sort: str = "longest_first",
                           packing: str = "padded", *, micro_batch: int = MICRO_BATCH, step: int = 0) -> Launch:
    """The packing's twin of the routing bug: the buffer holds the rows in batch order, but each row's
    offsets come from the lengths in admission (pre-sort) order, so the sampler reads slot i at the
    position where the i-th request *before the sort* would end. The manifest is right; the model's
    echoed checksums are not. With equal lengths (or no reordering) the offsets coincide and the bug
    hides."""
    good = launch(running, sort, packing, micro_batch=micro_batch, step=step)
    b = good.batch
    pre = np.array([len(running[r]) for r in good.presort], dtype=np.int64)
    if packing == "ragged":
        cu = np.concatenate([[0], np.cumsum(pre)])
        starts, last = cu[:-1], cu[1:] - 1
    else:
        starts = np.array(b.starts)
        last = np.minimum(starts + pre - 1, b.tokens.size - 1)
    return replace(good, batch=replace(b, starts=_frozen(starts), last=_frozen(last)))


# ---- completion: the routes, the checks, the repaired contract ------------------------------------


class RoutingError(ValueError):
    """A completion refused an output: ``check`` (one of :data:`CHECKS`) failed at ``slot`` (None when
    the check is about the whole output). Nothing was appended."""

    def __init__(self, check: str, slot: int | None, message: str):
        super().__init__(f"{check} check failed: {message}")
        self.check, self.slot = check, slot


def _route_manifest(lnch: Launch, out: Output, running: Mapping) -> list[tuple[int, int]]:
    """Row i -> the request of slot i at launch, if it is still running (the fix)."""
    return [(i, s.rid) for i, s in enumerate(lnch.manifest) if s.rid in running]


def _route_presort(lnch: Launch, out: Output, running: Mapping) -> list[tuple[int, int]]:
    """Row i -> the i-th launched request in admission order (the order before the sort)."""
    return [(i, rid) for i, rid in enumerate(lnch.presort) if rid in running]


def _route_running_index(lnch: Launch, out: Output, running: Mapping) -> list[tuple[int, int]]:
    """Row i -> the i-th request of the running list at completion (drops and admissions shifted it)."""
    now = list(running)
    return [(i, now[i]) for i in range(min(out.rows, len(now)))]


def _route_filter_zip(lnch: Launch, out: Output, running: Mapping) -> list[tuple[int, int]]:
    """Rows zipped with the launched requests that are still running: after a drop every later row
    lands one request early."""
    live = [s.rid for s in lnch.manifest if s.rid in running]
    return list(enumerate(live[:out.rows]))


#: name -> route(launch, out, running) -> [(row, rid)]: "manifest" is the fix, the others the bug.
ROUTES: dict[str, Callable[[Launch, Output, Mapping], list[tuple[int, int]]]] = {
    "manifest": _route_manifest,
    "presort": _route_presort,
    "running_index": _route_running_index,
    "filter_zip": _route_filter_zip,
}


def verify_output(lnch: Launch, out: Output, vocab: int = VOCAB) -> None:
    """Refuse an output that is not the output of this launch: launch id, shape (one row per slot),
    echoed ids equal the manifest's slot by slot, every token id in [0, vocab), echoed checksums equal
    the manifest's. Raises :class:`RoutingError` naming the first check that fails."""
    m = lnch.manifest
    if int(out.step) != lnch.step:
        raise RoutingError("launch id", None, f"the output answers step {int(out.step)}, this launch is step "
                           f"{lnch.step}: a stale or misdelivered output")
    if not (len(out.tokens) == len(out.rids) == len(out.checksums) == len(m)):
        raise RoutingError("shape", None, f"{len(out.tokens)} rows for {len(m)} slots")
    for i, s in enumerate(m):
        if int(out.rids[i]) != s.rid:
            raise RoutingError("echoed ids", i, f"row {i} echoes request {int(out.rids[i])}, but slot {i} held request "
                               f"{s.rid} at launch")
    for i, t in enumerate(out.tokens.tolist()):
        if not 0 <= t < vocab:
            raise RoutingError("token ids", i, f"row {i} holds token id {t}, outside the vocabulary [0, {vocab})")
    for i, s in enumerate(m):
        if int(out.checksums[i]) != s.checksum:
            raise RoutingError("echoed checksums", i, f"row {i} was computed from tokens with checksum "
                               f"{int(out.checksums[i]):08x}, but slot {i} launched request {s.rid} with {s.checksum:08x}: "
                               "the model read other tokens for this slot")


def verify_plan(lnch: Launch, out: Output, plan: Sequence[tuple[int, int]], running: Mapping) -> None:
    """Refuse a routing plan that would append a row to a request other than its slot's: the
    destination's id must be the row's echoed id, its length the slot's launch length (else this
    output was applied before) and its checksum the row's echoed checksum."""
    for row, rid in plan:
        if rid != int(out.rids[row]):
            raise RoutingError("destination id", row, f"row {row} belongs to request {int(out.rids[row])} but would be "
                               f"appended to request {rid}")
        toks = running[rid]
        if len(toks) != lnch.manifest[row].length:
            raise RoutingError("destination length", row, f"request {rid} holds {len(toks)} tokens, row {row} was "
                               f"computed from {lnch.manifest[row].length}: this output was applied before")
        if checksum(toks) != int(out.checksums[row]):
            raise RoutingError("destination checksum", row, f"request {rid}'s tokens are not the ones row {row} was "
                               "computed from")


@dataclass(frozen=True)
class Completion:
    """What :func:`complete` did: ``applied`` (row, rid) pairs, ``discarded`` rows (their request left)."""

    applied: tuple[tuple[int, int], ...]
    discarded: tuple[int, ...]


def complete(lnch: Launch, out: Output, running: MutableMapping[int, list[int]], *, route: str = "manifest",
             checks: bool = True, vocab: int = VOCAB) -> Completion:
    """Append each row's token to a request of ``running`` (mutated in place) by ``route``.

    The repaired contract is the default: ``route="manifest"`` (row i to slot i's request at launch,
    dropped if it left) with ``checks=True`` (:func:`verify_output`, then :func:`verify_plan`; a
    failure raises :class:`RoutingError` before anything is appended). ``checks=False`` with another
    route reproduces the bug; rows the plan names that the output lacks are skipped."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if checks:
        verify_output(lnch, out, vocab)
    plan = ROUTES[route](lnch, out, running)
    if checks:
        verify_plan(lnch, out, plan, running)
    applied = [(row, rid) for row, rid in plan if row < out.rows]
    for row, rid in applied:
        running[rid].append(int(out.tokens[row]))
    used = {row for row, _ in applied}
    return Completion(tuple(applied), tuple(i for i in range(len(lnch.manifest)) if i not in used))


class StepRouter:
    """The reference answer of the practice question: ``launch(running)`` freezes the manifest and
    numbers the step; ``complete(record, out, running)`` checks the output against it and routes by it."""

    def __init__(self, sort: str = "longest_first", packing: str = "padded", vocab: int = VOCAB, *,
                 micro_batch: int = MICRO_BATCH):
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
        if packing not in PACKINGS:
            raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
        self.sort, self.packing, self.vocab = sort, packing, integer("vocab", vocab, 2)
        self.micro_batch = integer("micro_batch", micro_batch, 1)
        self.steps = 0

    def launch(self, running: Mapping[int, Sequence[int]]) -> Launch:
        record = launch(running, self.sort, self.packing, micro_batch=self.micro_batch, step=self.steps)
        self.steps += 1
        return record

    def complete(self, record: Launch, out: Output, running: MutableMapping[int, list[int]]) -> None:
        complete(record, out, running, vocab=self.vocab)


def corrupt(out: Output, kind: str, *, vocab: int = VOCAB, other: Output | None = None) -> Output:
    """A damaged output, for the checks: ``"swapped_rows"`` (rows 0 and last swapped, echoes and all),
    ``"short_output"`` (the last row missing), ``"phantom_row"`` (one extra row, as from batch-size
    padding for a captured graph), ``"bad_token"`` (the last row holds id ``vocab``), ``"stale_output"``
    (``other``, another launch's output, delivered instead)."""
    t, r, c = (np.array(a) for a in (out.tokens, out.rids, out.checksums))
    if kind == "swapped_rows":
        if len(t) < 2:
            raise ValueError("swapping rows needs at least two rows")
        for a in (t, r, c):
            a[[0, -1]] = a[[-1, 0]]
    elif kind == "short_output":
        t, r, c = t[:-1], r[:-1], c[:-1]
    elif kind == "phantom_row":
        t, r, c = np.append(t, PAD_ID), np.append(r, -1), np.append(c, 0)
    elif kind == "bad_token":
        t[-1] = vocab
    elif kind == "stale_output":
        if other is None:
            raise ValueError("a stale output needs the other launch's output (other=...)")
        return other
    else:
        raise ValueError(f"kind must be swapped_rows, short_output, phantom_row, bad_token or stale_output, got {kind!r}")
    return Output(out.step, _frozen(t), _frozen(r), _frozen(c))


# ---- one step, many steps, closed forms ----------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """One simulated step: ``misrouted`` lists (row, destination rid, owner rid) for every row that
    reached a request other than its slot's; ``corrupted`` the requests running at completion whose
    tokens differ from what the repaired completion gives; ``bystanders`` how many of those were not
    in the batch at all (admitted mid-step); ``refused_by`` the first check of the repaired contract
    that refuses this completion (None: it passes them all) and ``refusal`` its message."""

    step: int
    launched: int
    dropped: tuple[int, ...]
    admitted: tuple[int, ...]
    live: int
    misrouted: tuple[tuple[int, int, int], ...]
    corrupted: tuple[int, ...]
    bystanders: int
    launch: Launch
    applied: tuple[tuple[int, int], ...]
    running_after: tuple[int, ...]
    refused_by: str | None = None
    refusal: str = ""

    @property
    def corrupted_share(self) -> float:
        """corrupted / requests running at completion."""
        return len(self.corrupted) / self.live if self.live else 0.0


def _step(lnch: Launch, model: FakeLM, running: dict, dropped: Sequence[int], admitted: Mapping[int, list[int]],
          route: str, vocab: int) -> StepRecord:
    """Run the model on ``lnch``, apply the drops and admissions, complete by ``route`` without checks
    and compare with the repaired completion of the same state; record which check of the repaired
    contract would have refused this completion (a refusal appends nothing, so the guarded attempt
    runs first on the real state and the unguarded one only after a refusal)."""
    out = model.forward(lnch.batch)
    for rid in dropped:
        del running[rid]
    running.update({rid: list(t) for rid, t in admitted.items()})
    truth = {rid: list(t) for rid, t in running.items()}
    complete(lnch, out, truth, checks=False, vocab=vocab)  # the fix on a genuine output (its checks pass: tested)
    try:
        done = complete(lnch, out, running, route=route, checks=True, vocab=vocab)
        refused = (None, "")
    except RoutingError as err:
        refused = (err.check, str(err))
        done = complete(lnch, out, running, route=route, checks=False, vocab=vocab)
    owner = lnch.slot_rids
    mis = tuple((row, rid, owner[row]) for row, rid in done.applied if rid != owner[row])
    bad = tuple(rid for rid in running if running[rid] != truth[rid])
    launched = set(owner)
    return StepRecord(lnch.step, len(owner), tuple(dropped), tuple(admitted), len(running), mis, bad,
                      sum(rid not in launched for rid in bad), lnch, done.applied, tuple(running), *refused)


def _lengths(n: int, prompts: str, sort: str, lo: int, hi: int, rng: random.Random) -> list[int]:
    if prompts == "equal":
        return [(lo + hi) // 2] * n
    ls = [rng.randint(lo, hi) for _ in range(n)]
    if prompts == "sorted":  # arriving in the policy's own order: sorting changes nothing
        ls.sort(reverse=sort != "shortest_first")
    return ls


@dataclass(frozen=True)
class RoutingRun:
    """What :func:`simulate` returns: the inputs, one :class:`StepRecord` per step, the requests whose
    stream went wrong at least once (``diverged``, from the step-by-step comparison with the fix), and
    every request's final stream as (rid, prompt length, tokens) for :meth:`wrong_streams`."""

    route: str
    sort: str
    packing: str
    batch: int
    drop_prob: float
    records: tuple[StepRecord, ...]
    diverged: tuple[int, ...]
    requests: int
    streams: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    model: FakeLM = FakeLM()

    @property
    def mean_corrupted_share(self) -> float:
        """Mean over completed steps of corrupted requests / requests running at completion."""
        return sum(r.corrupted_share for r in self.records) / len(self.records)

    @property
    def initial_prompts(self) -> list[int]:
        """Prompt lengths of the first batch, in admission order."""
        return [n for rid, n, _ in self.streams if rid < self.batch]

    def wrong_streams(self) -> tuple[int, ...]:
        """Requests whose generated tokens are not the model's continuation of their own prompt,
        found by replaying each prompt through :meth:`FakeLM.continuation` (a second method for
        ``diverged``)."""
        return tuple(rid for rid, n, toks in self.streams
                     if list(toks[n:]) != self.model.continuation(toks[:n], len(toks) - n))

    @property
    def first_refusal(self) -> tuple[int, str, str] | None:
        """(step, check, message) of the first step the repaired contract's checks refuse, or None."""
        return next(((r.step, r.refused_by, r.refusal) for r in self.records if r.refused_by), None)

    @property
    def corrupted_total(self) -> int:
        return sum(len(r.corrupted) for r in self.records)

    @property
    def misrouted_total(self) -> int:
        return sum(len(r.misrouted) for r in self.records)

    @property
    def steps_with_corruption(self) -> int:
        return sum(bool(r.corrupted) for r in self.records)

    @property
    def padding_share(self) -> float:
        """Padding share of all the launched buffers together."""
        pad = sum(r.launch.batch.padding_tokens for r in self.records)
        return pad / sum(r.launch.batch.tokens.size for r in self.records)


def simulate(batch: int = 32, *, route: str = "manifest", sort: str = "longest_first", packing: str = "padded",
             micro_batch: int = MICRO_BATCH, drop_prob: float = 0.02, steps: int = 20, prompt_min: int = 16,
             prompt_max: int = 512, prompts: str = "varied", seed: int = 0, vocab: int = VOCAB) -> RoutingRun:
    """``steps`` decode steps of ``batch`` running requests. In each step every launched request leaves
    mid-step with probability ``drop_prob`` (finished, aborted or preempted) and one new request is
    admitted in its place (so ``batch`` requests run at every completion); the completion routes by
    ``route`` without checks and is compared with the repaired one on the same state.
    Prompt lengths are uniform in [prompt_min, prompt_max] (``"varied"``), all the midpoint
    (``"equal"``), or varied but admitted already in the sort's order (``"sorted"``; later arrivals
    are varied). Each step also records which runtime check would have refused its completion.
    Deterministic in ``seed``."""
    n = integer("batch", batch, 1)
    p = fraction("drop_prob", drop_prob)
    steps = integer("steps", steps, 1)
    lo = integer("prompt_min", prompt_min, 1, unit="tokens")
    hi = integer("prompt_max", prompt_max, lo, unit="tokens (at least prompt_min)")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if prompts not in PROMPTS:
        raise ValueError(f"prompts must be one of {', '.join(PROMPTS)}, got {prompts!r}")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    rng = random.Random(integer("seed", seed, 0))
    model = FakeLM(seed, vocab)
    running = {rid: prompt_tokens(rid, L, vocab) for rid, L in enumerate(_lengths(n, prompts, sort, lo, hi, rng))}
    streams = {rid: (len(t), t) for rid, t in running.items()}  # the same lists: they keep growing
    next_rid, records, diverged = n, [], set()
    for k in range(steps):
        lnch = launch(running, sort, packing, micro_batch=micro_batch, step=k)
        dropped = [rid for rid in running if rng.random() < p]
        new = {}
        for L in _lengths(len(dropped), "equal" if prompts == "equal" else "varied", sort, lo, hi, rng):
            new[next_rid] = prompt_tokens(next_rid, L, vocab)
            next_rid += 1
        rec = _step(lnch, model, running, dropped, new, route, vocab)
        streams.update({rid: (len(new[rid]), running[rid]) for rid in new})
        diverged.update(rec.corrupted)
        records.append(rec)
    return RoutingRun(route, sort, packing, n, p, tuple(records), tuple(sorted(diverged)), next_rid,
                      tuple((rid, k, tuple(t)) for rid, (k, t) in streams.items()), model)


def scenario(lengths: Sequence[int], *, sort: str, route: str, packing: str = "padded", drop: Sequence[int] = (),
             arrivals: int = 0, micro_batch: int = MICRO_BATCH, seed: int = 0, vocab: int = VOCAB) -> StepRecord:
    """One step over requests 0..n-1 with these prompt ``lengths`` (admission order): requests at the
    admission indices ``drop`` leave mid-step and ``arrivals`` new ones (of the first request's length)
    are admitted; completion by ``route`` without checks."""
    if not lengths:
        raise ValueError("lengths must name at least one request")
    running = {rid: prompt_tokens(rid, integer("length", L, 1), vocab) for rid, L in enumerate(lengths)}
    gone = [integer("drop index", i, 0, len(lengths) - 1) for i in drop]
    new = {len(lengths) + j: prompt_tokens(len(lengths) + j, lengths[0], vocab)
           for j in range(integer("arrivals", arrivals, 0))}
    lnch = launch(running, sort, packing, micro_batch=micro_batch)
    return _step(lnch, FakeLM(seed, vocab), running, sorted(set(gone)), new, route, vocab)


def expected_misrouted(route: str, batch: int, drop_prob: float, sort: str = "longest_first") -> float:
    """Expected rows that reach the wrong request in one step of ``batch`` requests, each leaving
    mid-step with probability p and replaced by one admission (lengths i.i.d. and distinct, so a
    length sort is a uniformly random permutation of admission order):

    * ``manifest``: 0;
    * ``presort``: :math:`(1-p)(B-1)` under a sort (a random permutation has one fixed point on
      average; the row of a request that left is skipped); 0 under ``fcfs``;
    * ``filter_zip`` (any sort): :math:`(1-p)\\sum_{k=0}^{B-1}\\left(1-(1-p)^k\\right)`: the survivor
      in slot k gets the row of slot k - d, right only if none of the k slots before it left;
    * ``running_index`` under ``fcfs``: the same plus :math:`Bp`, the rows that land on the
      admitted requests; under a sort it has no closed form (ValueError: simulate it)."""
    b = integer("batch", batch, 1)
    p = fraction("drop_prob", drop_prob)
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    shift = (1 - p) * sum(1 - (1 - p) ** k for k in range(b))
    if route == "manifest":
        return 0.0
    if route == "presort":
        return 0.0 if sort == "fcfs" else (1 - p) * (b - 1)
    if route == "filter_zip":
        return shift
    if route == "running_index":
        if sort != "fcfs":
            raise ValueError("running_index under a sort has no closed form here: simulate it")
        return shift + b * p
    raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")


# ---- which check catches which fault ----------------------------------------------------------------

#: fault -> what goes wrong.
FAULTS = {
    "presort": "completion scatters rows by the pre-sort (admission) order",
    "running_index": "completion sends row i to the i-th request running at completion",
    "filter_zip": "completion zips the rows with the launched requests still running",
    "index_presort": "the sampler reads each row at offsets from the pre-sort lengths",
    "swapped_rows": "the worker returns two rows swapped",
    "short_output": "the output is one row short",
    "phantom_row": "the output has an extra (graph-padding) row",
    "bad_token": "a row holds a token id outside the vocabulary",
    "stale_output": "the previous step's output is delivered for this step",
    "replayed_output": "a completion is delivered and applied twice",
}


@dataclass(frozen=True)
class FaultResult:
    """``corrupted``: requests whose tokens go wrong when nothing checks; ``check``: the first
    check of :func:`complete` that refuses the fault (None: none does), ``message`` its words."""

    fault: str
    what: str
    corrupted: int
    check: str | None
    message: str


def fault_check(fault: str, lengths: Sequence[int], *, sort: str = "longest_first", packing: str = "padded",
                drop: Sequence[int] = (), micro_batch: int = MICRO_BATCH, seed: int = 0,
                vocab: int = VOCAB) -> FaultResult:
    """Inject ``fault`` (a key of :data:`FAULTS`) into one step over requests with these prompt
    ``lengths`` (after one clean step, whose launch and output the stale and replay faults reuse;
    requests at admission indices ``drop`` leave mid-step), then complete it twice on copies of the
    same state: without checks (how many requests go wrong) and with the repaired contract's checks
    (which one refuses it)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    model = FakeLM(seed, vocab)
    running = {rid: prompt_tokens(rid, integer("length", L, 1), vocab) for rid, L in enumerate(lengths)}
    if not running:
        raise ValueError("lengths must name at least one request")
    prev = launch(running, sort, packing, micro_batch=micro_batch, step=0)
    prev_out = model.forward(prev.batch)
    complete(prev, prev_out, running, vocab=vocab)
    lnch = launch(running, sort, packing, micro_batch=micro_batch, step=1)
    out = model.forward(lnch.batch)
    bad_launch, route = lnch, "manifest"
    if fault in ("presort", "running_index", "filter_zip"):
        route = fault
    elif fault == "index_presort":
        bad_launch = launch_presort_indices(running, sort, packing, micro_batch=micro_batch, step=1)
    gone = {list(running)[integer("drop index", i, 0, len(running) - 1)] for i in drop}
    for rid in gone:
        del running[rid]
    truth = {rid: list(t) for rid, t in running.items()}
    complete(lnch, out, truth, vocab=vocab)
    if fault == "replayed_output":
        deliver = (prev, prev_out)
    elif fault == "index_presort":
        deliver = (bad_launch, model.forward(bad_launch.batch))
    elif fault in ("swapped_rows", "short_output", "phantom_row", "bad_token", "stale_output"):
        if fault == "swapped_rows" and len(lengths) < 2:
            raise ValueError("swapped_rows needs at least two requests")
        deliver = (lnch, corrupt(out, fault, vocab=vocab, other=prev_out))
    else:
        deliver = (lnch, out)
    unchecked = {rid: list(t) for rid, t in running.items()}
    if fault == "replayed_output":  # the step's own output first, then the old one again
        complete(lnch, out, unchecked, checks=False, vocab=vocab)
        base = {rid: list(t) for rid, t in unchecked.items()}
    else:
        base = None
    complete(*deliver, unchecked, route=route, checks=False, vocab=vocab)
    wrong = sum(unchecked[rid] != truth[rid] for rid in running)
    checked = {rid: list(t) for rid, t in (base or running).items()}
    try:
        complete(*deliver, checked, route=route, checks=True, vocab=vocab)
        check, message = None, "accepted"
    except RoutingError as err:
        check, message = err.check, str(err)
        if checked != (base or running):
            raise AssertionError("a refused completion changed the state") from err
    return FaultResult(fault, FAULTS[fault], wrong, check, message)
