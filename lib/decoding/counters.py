"""Acceptance from production counters: vLLM's speculative-decoding Prometheus counters, windows
between two snapshots, counter resets, and what an EOS in the middle of a draft does to them.

vLLM (v1) exports, per engine, monotonically increasing counters (Prometheus text adds ``_total``):

=============================================  ============================================================
``vllm:spec_decode_num_drafts``                request-steps that verified a draft (one per request per step)
``vllm:spec_decode_num_draft_tokens``          drafted tokens sent to verification
``vllm:spec_decode_num_accepted_tokens``       drafted tokens the target accepted
``vllm:spec_decode_num_accepted_tokens_per_pos``  the same, by draft position (label ``position``)
``vllm:generation_tokens``                     output tokens returned to requests
``vllm:request_success``                       finished requests
``vllm:num_requests_running``                  gauge: requests running at the scrape
``process_start_time_seconds``                 when the process started (a restart changes it)
=============================================  ============================================================

The scheduler counts accepted tokens as ``len(sampled) - 1`` *before* the stop check trims the
tokens after an EOS (or the max_tokens limit), so a request that ends in the middle of an accepted
run has accepted tokens no user saw. A counter is only meaningful as a difference between two
snapshots of one process: a restart resets every counter to zero, which shows as a decrease, or, once
the new process has counted past the old value, as nothing at all unless the start time is compared.

:func:`window` takes two :class:`Snapshot` s and returns a :class:`Window` (clean, or rejected with
the reason); :func:`acceptance` turns the clean windows' summed deltas into the rates (acceptance rate
= accepted / drafted; mean acceptance length = 1 + accepted / drafts; per-position rates = accepted
at position j / drafts); :func:`request_steps` infers how many request-steps produced the output
tokens, with the EOS correction. :func:`simulate_counters` is a small engine that produces snapshot
streams with known truth (requests, acceptance, EOS, restarts) for the tests and the notebook.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = [
    "QUESTION",
    "VARIANTS",
    "VLLM_NAMES",
    "Acceptance",
    "Snapshot",
    "Window",
    "acceptance",
    "acceptance_from_length",
    "check",
    "request_steps",
    "simulate_counters",
    "summarize",
    "variant",
    "window",
    "windows",
]

#: Snapshot field -> the Prometheus series vLLM exports.
VLLM_NAMES = {
    "num_drafts": "vllm:spec_decode_num_drafts_total",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "accepted_per_pos": 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}',
    "generation_tokens": "vllm:generation_tokens_total",
    "finished_requests": "vllm:request_success_total",
    "running_requests": "vllm:num_requests_running",
    "start_time_s": "process_start_time_seconds",
}
_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "generation_tokens", "finished_requests")


@dataclass(frozen=True)
class Snapshot:
    """One scrape of one engine's counters at ``time_s`` (seconds); ``running_requests`` is the
    gauge of requests in flight; ``start_time_s`` the process start time (None when not scraped)."""

    time_s: float
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    generation_tokens: int
    finished_requests: int
    running_requests: int = 0
    start_time_s: float | None = None

    def __post_init__(self) -> None:
        real("time_s", self.time_s)
        for name in (*_COUNTERS, "running_requests"):
            integer(name, getattr(self, name), 0)
        object.__setattr__(self, "accepted_per_pos", tuple(integer("accepted_per_pos", int(x), 0)
                                                            for x in self.accepted_per_pos))


@dataclass(frozen=True)
class Window:
    """The counter increments between two snapshots, or why the window was rejected (``reason``
    non-empty: a counter reset inside it). Deltas are zero in a rejected window."""

    start_s: float
    end_s: float
    reason: str = ""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    generation_tokens: int = 0
    finished_requests: int = 0
    admitted_requests: int = 0  # finished + the change in running requests: whose first token fell inside

    @property
    def clean(self) -> bool:
        return not self.reason


def window(a: Snapshot, b: Snapshot, check_start_time: bool = True) -> Window:
    """The window from snapshot ``a`` to the later ``b``. Rejected when the process restarted in
    between: its start time changed (``check_start_time``, when both snapshots carry it) or any
    counter, or any per-position count, went down."""
    if not (isinstance(a, Snapshot) and isinstance(b, Snapshot)):
        raise ValueError("a and b must be Snapshots")
    if b.time_s <= a.time_s:
        raise ValueError(f"b must be later than a; got times {a.time_s} and {b.time_s}")
    if check_start_time and a.start_time_s is not None and b.start_time_s is not None \
            and a.start_time_s != b.start_time_s:
        return Window(a.time_s, b.time_s, f"process restarted (start time {a.start_time_s:g} -> {b.start_time_s:g})")
    fell = [n for n in _COUNTERS if getattr(b, n) < getattr(a, n)]
    width = max(len(a.accepted_per_pos), len(b.accepted_per_pos))
    pa = a.accepted_per_pos + (0,) * (width - len(a.accepted_per_pos))
    pb = b.accepted_per_pos + (0,) * (width - len(b.accepted_per_pos))
    if any(y < x for x, y in zip(pa, pb, strict=True)):
        fell.append("accepted_per_pos")
    if fell:
        return Window(a.time_s, b.time_s, f"counter reset: {', '.join(fell)} decreased")
    return Window(a.time_s, b.time_s, "", *(getattr(b, n) - getattr(a, n) for n in _COUNTERS[:3]),
                  tuple(y - x for x, y in zip(pa, pb, strict=True)),
                  *(getattr(b, n) - getattr(a, n) for n in _COUNTERS[3:]),
                  b.finished_requests - a.finished_requests + b.running_requests - a.running_requests)


def windows(snapshots: Sequence[Snapshot], check_start_time: bool = True) -> list[Window]:
    """The windows between consecutive snapshots (:func:`window` each)."""
    snaps = list(snapshots)
    if len(snaps) < 2:
        raise ValueError(f"snapshots must hold at least two snapshots; got {len(snaps)}")
    return [window(a, b, check_start_time) for a, b in zip(snaps, snaps[1:], strict=False)]


@dataclass(frozen=True)
class Acceptance:
    """Rates from summed clean windows. ``acceptance_rate``: accepted / drafted tokens;
    ``mean_acceptance_length``: tokens per verified draft, 1 + accepted / drafts (vLLM's
    definition: counts accepted tokens an EOS later discarded); ``per_position``: accepted at
    position j / drafts; ``draft_tokens_per_draft``: the mean k."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    windows_used: int
    windows_rejected: int

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan

    @property
    def per_position(self) -> tuple[float, ...]:
        return tuple(x / self.num_drafts for x in self.accepted_per_pos) if self.num_drafts else ()

    @property
    def draft_tokens_per_draft(self) -> float:
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else math.nan


def acceptance(wins: Sequence[Window]) -> Acceptance:
    """Sum the clean windows' deltas, then take ratios (a ratio of sums, never a mean of
    per-window ratios, which would weight a quiet window like a busy one)."""
    wins = list(wins)
    if not all(isinstance(w, Window) for w in wins):
        raise ValueError("wins must be Windows (window(...) or windows(...))")
    clean = [w for w in wins if w.clean]
    width = max((len(w.accepted_per_pos) for w in clean), default=0)
    per = [sum(w.accepted_per_pos[j] if j < len(w.accepted_per_pos) else 0 for w in clean) for j in range(width)]
    return Acceptance(sum(w.num_drafts for w in clean), sum(w.num_draft_tokens for w in clean),
                      sum(w.num_accepted_tokens for w in clean), tuple(per), len(clean), len(wins) - len(clean))


@dataclass(frozen=True)
class RequestSteps:
    """Request-steps (one request verified once) behind a window's output tokens: the naive count
    ``generation - first tokens - accepted`` and the interval after the EOS correction (each
    finished request may have thrown away up to k tokens after its EOS)."""

    naive: int
    low: int
    high: int
    counted: int  # num_drafts: request-steps that verified a draft, counted directly


def request_steps(w: Window, draft_tokens: int) -> RequestSteps:
    """Infer request-steps from a clean window. Every request-step emits its accepted tokens plus
    one of the target's, except that a request ending at an EOS (or max_tokens) inside an accepted
    run drops the accepted tokens after it, which the counter already counted; every request's first
    token comes from its prefill, with no draft. So

        generation = first + steps + accepted - dropped,   0 <= dropped <= k x finished

    and steps = generation - first - accepted + dropped lies in [naive, naive + k x finished]
    (dropped: the tokens a finishing step produced past the EOS, its own token included). First
    tokens are the requests admitted in the window: finished plus the change of the running gauge
    (requests are conserved). Steps without a draft (a lookup that found nothing) count as steps
    here and not in num_drafts."""
    if not isinstance(w, Window) or not w.clean:
        raise ValueError("w must be a clean Window (a reset-contaminated window has no meaningful deltas)")
    k = integer("draft_tokens", draft_tokens, 1, 64, unit="tokens")
    naive = w.generation_tokens - w.admitted_requests - w.num_accepted_tokens
    return RequestSteps(naive, naive, naive + k * w.finished_requests, w.num_drafts)


def acceptance_from_length(mean_length: float, draft_tokens: int) -> float:
    """The i.i.d. per-token acceptance a whose expected tokens per step (Leviathan eq. 1,
    :func:`lib.decoding.speculative.speculative_tokens_per_step`) equals ``mean_length`` with k
    drafted tokens: the inverse of (1 - a^(k+1)) / (1 - a), by bisection (it rises with a). 0 at
    length 1, 1 at length k + 1."""
    from lib.decoding.speculative import speculative_tokens_per_step

    k = integer("draft_tokens", draft_tokens, 1, 64, unit="tokens")
    tau = real("mean_length", mean_length, 1.0, k + 1.0, unit=f"tokens per step (1 to k + 1 = {k + 1})")
    if tau in (1.0, k + 1.0):  # the ends exactly: bisection would stop a rounding error short of them
        return 0.0 if tau == 1.0 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if speculative_tokens_per_step(mid, k) < tau else (lo, mid)
    return 0.5 * (lo + hi)


# ---- a small engine with known truth -------------------------------------------------------------


@dataclass
class CounterStream:
    """What :func:`simulate_counters` returns: the snapshots, and for each window between two
    consecutive snapshots the true activity (None where a restart lies inside it)."""

    snapshots: list[Snapshot]
    truth: list[dict | None]
    restarts_at: list[int] = field(default_factory=list)  # snapshot indices right after a restart


def simulate_counters(steps: int = 600, batch: int = 8, draft_tokens: int = 4,
                      acceptance_rate: float | Sequence[float] = 0.7, mean_output_tokens: int = 60,
                      scrape_every: int = 50, restarts: Sequence[int] = (), seed: int = 0,
                      scrape_at: Sequence[int] | None = None) -> CounterStream:
    """An engine running ``batch`` requests at a time for ``steps`` steps. A new request's prefill
    emits its first token; then each step drafts k tokens for each running request, accepts each
    in turn with probability ``acceptance_rate`` until the first rejection, and emits the accepted
    tokens plus one (vLLM's counters: accepted counted before the stop check). A request ends when it
    reaches its length (1 + geometric, mean ``mean_output_tokens``; its last token is the EOS),
    dropping whatever the step produced past it. Snapshots every ``scrape_every`` steps (or after the
    steps listed in ``scrape_at``), and after the last step (time = step index, seconds). At each
    step in ``restarts`` the process restarts: counters to zero, a new start time, running requests
    lost; ``acceptance_rate`` may list one rate per process (a redeploy that
    changed the drafter), the last one repeating."""
    n = integer("steps", steps, 1)
    b = integer("batch", batch, 1)
    k = integer("draft_tokens", draft_tokens, 1, 16, unit="tokens")
    rates = [acceptance_rate] if isinstance(acceptance_rate, int | float) else list(acceptance_rate)
    if not rates:
        raise ValueError("acceptance_rate must be a rate or a non-empty list of rates")
    rates = [fraction("acceptance_rate", r) for r in rates]
    mean_len = integer("mean_output_tokens", mean_output_tokens, 2)
    every = integer("scrape_every", scrape_every, 1)
    scrapes = ({t for t in range(every, n + 1, every)} if scrape_at is None else
               {integer("scrape step", int(t), 1, n) for t in scrape_at}) | {n}
    resets = sorted({integer("restart step", int(r), 1, n - 1) for r in restarts})
    rng = np.random.default_rng(seed)
    # per step: drafts, draft tokens, accepted, generation, finished, dropped, first tokens, then k positions
    cols = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "generation_tokens", "finished_requests",
            "dropped", "first_tokens")
    delta = np.zeros((n, len(cols) + k), dtype=np.int64)
    running = np.zeros(n, dtype=np.int64)  # requests in flight after each step
    left = np.zeros(0, dtype=np.int64)  # tokens each running request still has to emit
    positions = np.arange(k)
    process = 0
    for t in range(n):
        if t in resets:
            left, process = np.zeros(0, dtype=np.int64), process + 1
        a = rates[min(process, len(rates) - 1)]
        row = delta[t]
        new = b - len(left)
        if new:  # admit and prefill: each new request emits its first token
            left = np.concatenate([left, rng.geometric(1.0 / mean_len, size=new)])  # tokens after the first
            row[3] += new
            row[6] += new
        # accepted drafts: successes before the first failure, at most k
        accepted = np.minimum(rng.geometric(1.0 - a, size=b) - 1, k) if a < 1 else np.full(b, k)
        emitted = np.minimum(accepted + 1, left)
        done = emitted == left
        row[0] += b
        row[1] += k * b
        row[2] += accepted.sum()
        row[3] += emitted.sum()
        row[4] += done.sum()
        row[5] += (accepted + 1 - emitted).sum()
        row[len(cols):] += (accepted[:, None] > positions[None, :]).sum(axis=0)
        left = (left - emitted)[~done]
        running[t] = len(left)
    # counters: cumulative sums that restart from zero at every restart
    starts = [0, *resets]
    counters = np.zeros_like(delta)
    for lo, hi in zip(starts, [*resets, n], strict=True):
        counters[lo:hi] = np.cumsum(delta[lo:hi], axis=0)
    start_times = np.zeros(n)
    for r in resets:
        start_times[r:] = r + 0.5
    scrape_steps = sorted(scrapes)

    def snap(t):  # after step t - 1 (t = 0: the fresh process)
        if t == 0:
            return Snapshot(0.0, 0, 0, 0, (0,) * k, 0, 0, 0, 0.0)
        c = counters[t - 1]
        return Snapshot(float(t), int(c[0]), int(c[1]), int(c[2]), tuple(int(x) for x in c[len(cols):]), int(c[3]),
                        int(c[4]), int(running[t - 1]), float(start_times[t - 1]))

    snaps, truth, restarts_at, prev = [snap(0)], [], [], 0
    for t in scrape_steps:
        snaps.append(snap(t))
        if any(prev <= r < t for r in resets):  # a restart happened during the window's steps
            truth.append(None)
            restarts_at.append(len(snaps) - 1)
        else:
            d = delta[prev:t].sum(axis=0)
            truth.append({**{name: int(d[i]) for i, name in enumerate(cols)},
                          "accepted_per_pos": [int(x) for x in d[len(cols):]]})
        prev = t
    return CounterStream(snaps, truth, restarts_at)


# ---- practice: summarize a scrape, graded against the engine's truth -------------------------------

QUESTION = "acceptance from counter snapshots (I050)"


def summarize(snapshots: Sequence[Snapshot]) -> dict:
    """The reference answer of the practice question: over the clean windows between consecutive
    snapshots, ``{"acceptance_rate", "mean_acceptance_length", "per_position"}`` (NaN and () when no
    clean window drafted anything)."""
    acc = acceptance(windows(snapshots))
    return {"acceptance_rate": acc.acceptance_rate, "mean_acceptance_length": acc.mean_acceptance_length,
            "per_position": acc.per_position}


class Skeleton:
    """Write ``summarize(snapshots) -> dict`` (a function, not a class): the keys of
    :func:`summarize`, from the clean windows only."""


_STREAMS = {
    "steady engine": dict(steps=400, scrape_every=50, seed=1),
    "a restart that shows as a drop": dict(steps=500, scrape_every=50, restarts=(230,), acceptance_rate=(0.7, 0.5),
                                           seed=2),
    "a redeploy whose counters regrow before the next scrape": dict(
        steps=600, scrape_every=100, restarts=(250, 310), acceptance_rate=(0.6, 0.6, 0.85), seed=3),
    "short answers: EOS in the middle of accepted runs": dict(steps=300, scrape_every=30, mean_output_tokens=3,
                                                             acceptance_rate=0.85, seed=4),
    "windows of different lengths at different acceptance": dict(
        steps=600, scrape_at=(20, 150, 170, 400, 420), restarts=(160,), acceptance_rate=(0.9, 0.4), seed=5),
}


@functools.cache
def _stream(name: str) -> CounterStream:
    return simulate_counters(**_STREAMS[name])


def _expected(stream: CounterStream, kept: Sequence[int]) -> dict:
    """The truth over the clean windows between the kept snapshots (a merged window is clean when
    no restart lies inside it)."""
    drafts = tokens = accepted = 0
    per: list[int] = []
    for i, j in zip(kept, kept[1:], strict=False):
        parts = stream.truth[i:j]
        if any(p is None for p in parts):
            continue
        for p in parts:
            drafts, tokens, accepted = drafts + p["num_drafts"], tokens + p["num_draft_tokens"], \
                accepted + p["num_accepted_tokens"]
            per = [x + y for x, y in itertools.zip_longest(per, p["accepted_per_pos"], fillvalue=0)]
    return {"acceptance_rate": accepted / tokens if tokens else math.nan,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else math.nan,
            "per_position": tuple(x / drafts for x in per) if drafts else ()}


def _close(got, want) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return isinstance(got, int | float) and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


def run(candidate, ops: Sequence) -> None:
    """``ops``: ``("stream", name)`` then ``("snapshot", i)`` for the snapshots the scrape kept;
    raise AssertionError naming the first key that differs from the engine's truth."""
    ops = list(ops)
    if not ops or ops[0][0] != "stream":
        return  # no stream: nothing to grade (the shrinker keeps the stream)
    name = ops[0][1]
    kept = sorted({op[1] for op in ops[1:]})
    if len(kept) < 2:
        return  # no window: nothing to grade
    stream = _stream(name)
    got = candidate([stream.snapshots[i] for i in kept])
    want = _expected(stream, kept)
    if not isinstance(got, dict):
        raise AssertionError(f"summarize must return a dict with keys {sorted(want)}; got {type(got).__name__}")
    for key in ("acceptance_rate", "mean_acceptance_length"):
        if not _close(got.get(key), want[key]):
            raise AssertionError(f"{key}: got {got.get(key)!r}, the engine's truth over the clean windows is "
                                 f"{want[key]!r}")
    per = tuple(got.get("per_position", ()))
    width = max(len(per), len(want["per_position"]))
    pad = lambda xs: tuple(xs) + (0.0,) * (width - len(xs))  # noqa: E731
    if not all(_close(x, y) for x, y in zip(pad(per), pad(want["per_position"]), strict=True)):
        raise AssertionError(f"per_position: got {per}, truth {want['per_position']}")


def _describe(ops: Sequence) -> str:
    ops = list(ops)
    if not ops or ops[0][0] != "stream":
        return "  (no stream)"
    stream = _stream(ops[0][1])
    lines = [f"  stream: {ops[0][1]} ({_STREAMS[ops[0][1]]})"]
    for _, i in ops[1:]:
        s = stream.snapshots[i]
        lines.append(f"  t={s.time_s:g}s start={s.start_time_s:g} drafts={s.num_drafts} draft_tokens={s.num_draft_tokens} "
                     f"accepted={s.num_accepted_tokens} generation={s.generation_tokens}")
    return "\n".join(lines)


def cases() -> list:
    """One program per stream of :data:`_STREAMS`: every snapshot kept."""
    from lib.book.practice import Case

    return [Case(name, (("stream", name), *(("snapshot", i) for i in range(len(_stream(name).snapshots)))))
            for name in _STREAMS]


def check(candidate):
    """Grade any ``summarize(snapshots) -> dict`` against the simulated engine's truth; prints the
    first failing scrape, shrunk to the fewest snapshots that still fail."""
    from lib.book.practice import grade

    if not callable(candidate):
        raise ValueError(f"check() takes a function summarize(snapshots) -> dict, got {candidate!r}")
    return grade(QUESTION, lambda: candidate, cases(), run, describe=_describe)


def _summary_of(wins) -> dict:
    acc = acceptance(wins)
    return {"acceptance_rate": acc.acceptance_rate, "mean_acceptance_length": acc.mean_acceptance_length,
            "per_position": acc.per_position}


def _pairs(snapshots):
    snaps = list(snapshots)
    return zip(snaps, snaps[1:], strict=False)


def _no_reset_check(snapshots):
    """Every window counts, a reset's negative deltas included (``end - start`` of each pair)."""
    from lib.book.drafts import edited

    raw = edited(window, [("fell = [n for n in _COUNTERS if getattr(b, n) < getattr(a, n)]", "fell = []"),
                          ("fell.append(\"accepted_per_pos\")", "pass"),
                          ("and a.start_time_s != b.start_time_s:", "and False:")], name="no reset check")
    return _summary_of([raw(a, b) for a, b in _pairs(snapshots)])


def _decrease_only(snapshots):
    """A reset is detected only when a counter goes down (no start-time check)."""
    return _summary_of([window(a, b, check_start_time=False) for a, b in _pairs(snapshots)])


def _mean_of_ratios(snapshots):
    """The mean of the clean windows' own ratios: a quiet window weighs as much as a busy one."""
    clean = [w for w in windows(snapshots) if w.clean and w.num_drafts]
    if not clean:
        return {"acceptance_rate": math.nan, "mean_acceptance_length": math.nan, "per_position": ()}
    per_window = [_summary_of([w]) for w in clean]
    width = max(len(s["per_position"]) for s in per_window)
    return {key: sum(s[key] for s in per_window) / len(per_window) for key in ("acceptance_rate",
                                                                            "mean_acceptance_length")} | {
        "per_position": tuple(sum(s["per_position"][j] if j < len(s["per_position"]) else 0.0 for s in per_window)
                              / len(per_window) for j in range(width))}


def _no_bonus_token(snapshots):
    """Mean acceptance length as accepted / drafts: forgets the token the target adds every step."""
    out = summarize(snapshots)
    return out | {"mean_acceptance_length": out["mean_acceptance_length"] - 1}


def _from_generated_tokens(snapshots):
    """Accepted tokens inferred from output tokens (generation - first tokens - drafts): blind to the
    tokens an EOS threw away, which the counter did count."""
    clean = [w for w in windows(snapshots) if w.clean]
    drafts = sum(w.num_drafts for w in clean)
    tokens = sum(w.num_draft_tokens for w in clean)
    accepted = sum(w.generation_tokens - w.admitted_requests - w.num_drafts for w in clean)
    out = summarize(snapshots)
    return out | {"acceptance_rate": accepted / tokens if tokens else math.nan,
                  "mean_acceptance_length": 1 + accepted / drafts if drafts else math.nan}


VARIANTS = {
    "no reset check": _no_reset_check,
    "resets detected by a drop only": _decrease_only,
    "mean of per-window ratios": _mean_of_ratios,
    "mean length without the bonus token": _no_bonus_token,
    "accepted inferred from output tokens": _from_generated_tokens,
}


def variant(name: str):
    """The reference (``"reference"``) or the defective draft ``name`` (one of :data:`VARIANTS`)."""
    if name == "reference":
        return summarize
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}; got {name!r}")
    return VARIANTS[name]
