"""Hung collectives: a hang is a collective that one rank never entered (or entered differently).

* **The flight recorder** (PyTorch's NCCL flight recorder, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0): each rank
  keeps a ring buffer of its last B collectives, each an :class:`Entry` (its ``collective_seq_id``, the op,
  the input sizes, the state scheduled / started / completed), dumped on the watchdog's timeout
  (``TORCH_NCCL_DUMP_ON_TIMEOUT``). :func:`simulate_hang` produces those dumps for N ranks with one cause
  injected (:data:`CAUSES`); :func:`find_missing_rank` reads them and names the cause and the rank.
* **The analysis**: collectives complete in sequence order, so the first sequence id that did not complete
  (G) is the hang. A rank whose last entered id is below G never arrived (dead if it left no dump, stuck
  outside the collective if it did); if every rank entered G, compare (op, sizes) at G and G + 1 across
  ranks: the odd rank either runs one collective more or fewer (a conditional collective) or has the
  same collectives in another order or shape (a mismatch); if they all agree, the collective itself is
  stuck in the transport and the recorder cannot name a rank.
* **Without it** (:func:`triage_time_s`): the watchdog's timeout, stacks from every rank with py-spy
  (grouped or read one by one), or a rerun with ``NCCL_DEBUG=INFO``: the time each takes on N ranks.
* **The reproducer** (:class:`ThreadGroup`, :func:`run_training`): threads as ranks over an all-reduce
  whose every wait has a timeout, a training loop whose logging branch calls a collective on rank 0 only
  (it hangs at the first logging step) and the fix that gates the printing, not the collective.
* **Counters during a hang** (:func:`hang_counters`): utilization counts a resident kernel, not work.

SI units: seconds, bytes; sizes are element counts.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["CAUSES", "Dump", "Entry", "Finding", "HangSim", "ThreadGroup", "TrainResult", "collective_program",
           "CollectiveTimeout", "GRAD_ELEMENTS", "TRIAGE_METHODS", "find_missing_rank", "group_dumps", "hang_counters", "run_training", "simulate_hang", "triage_time_s"]

STATES = ("scheduled", "started", "completed")

CAUSES = {
    "dead": ("a dead rank (process crashed, node lost, GPU fell off the bus)",
             "no dump from that rank; every other rank waits in the same collective",
             "the rank's own log and dmesg / Xid on its node; replace the node and restart from the checkpoint"),
    "stuck": ("a rank stuck outside the collective (a data-loader read, storage, a host-side wait)",
              "its dump ends with completed entries below the sequence id everyone else entered",
              "py-spy dump on that one rank shows the wait; fix or time out the I/O"),
    "conditional": ("a rank on another code path (a collective inside a branch only some ranks take)",
                    "at the hang's sequence id it runs another op; its next entry is the one the others are in",
                    "make the collective unconditional (every rank joins) and gate only the side effect"),
    "mismatch": ("collectives in another order or with other shapes on one rank",
                 "every rank entered the sequence id, but one rank's (op, sizes) there differ from the others'",
                 "fix the order (deterministic bucket order, same module traversal) or the shape on that rank"),
}
EXTRA_CAUSES = ("none", "link")  # no hang; every rank inside a matching collective that never completes


@dataclass(frozen=True)
class Entry:
    """One flight-recorder entry: ``seq`` the collective sequence id on this rank's process group, ``op``,
    ``sizes`` (input element counts), ``state`` (scheduled, started or completed), ``t_s`` when enqueued."""

    seq: int
    op: str
    sizes: tuple
    state: str
    t_s: float

    @property
    def key(self) -> tuple:
        return (self.op, self.sizes)


@dataclass(frozen=True)
class Dump:
    """What one rank writes on the timeout: its last ring-buffer entries (oldest first) and where its
    Python thread is (the innermost frames of a stack dump)."""

    rank: int
    entries: tuple
    stack: str


@dataclass(frozen=True)
class HangSim:
    """A simulated hang: the dumps (None for a rank that left none), the injected truth, the first sequence
    id that never completed (-1: none) and each rank's full program length."""

    dumps: tuple
    cause: str
    rank: int | None
    hang_seq: int
    issued: tuple


@dataclass(frozen=True)
class Finding:
    """What the analysis concludes: the cause (a key of :data:`CAUSES`, ``link`` or ``none``), the rank
    (None when it cannot name one), the sequence id of the hang and one line of evidence."""

    cause: str
    rank: int | None
    seq: int
    evidence: str


def collective_program(step: int, bucket_sizes, log_every: int = 0) -> list[tuple[str, tuple]]:
    """The collectives of one data-parallel step, in issue order: an all-gather of the parameters
    (FSDP-style, size the sum of the buckets), one reduce-scatter per gradient bucket (sizes in elements),
    and on logging steps (``step % log_every == 0``, ``log_every`` > 0) an all-reduce of the loss (1 element)."""
    step = integer("step", step, 0)
    sizes = [integer("bucket size", s, 1) for s in bucket_sizes]
    if not sizes:
        raise ValueError("bucket_sizes must hold at least one bucket")
    ops = [("allgather", (sum(sizes),))] + [("reduce_scatter", (s,)) for s in sizes]
    if integer("log_every", log_every, 0) and step % log_every == 0:
        ops.append(("allreduce", (1,)))
    return ops


def _bucket_sizes(buckets: int, seed: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while len(sizes) < buckets:  # distinct sizes, so an order swap is visible in the sizes
        s = int(rng.integers(1, 64)) * 1_048_576 // 4
        if s not in sizes:
            sizes.append(s)
    return sizes


def simulate_hang(n_ranks: int, cause: str, bad_rank: int = 0, hang_step: int = 5, buckets: int = 4,
                  buffer_entries: int = 2000, step_s: float = 1.0, seed: int = 0) -> HangSim:
    """N ranks run ``hang_step`` healthy steps of :func:`collective_program`; at step ``hang_step`` the
    ``cause`` (a key of :data:`CAUSES`, ``link`` or ``none``) hits ``bad_rank``:

    * ``dead``: the rank dies before the step's first collective and leaves no dump;
    * ``stuck``: it blocks before the step's first collective (a data-loader read) and dumps what it has;
    * ``conditional``: it calls one extra all-reduce (1 element) before the step's collectives;
    * ``mismatch``: it issues its first two gradient buckets in swapped order;
    * ``link``: every rank issues the same collectives, but the first of the step never completes.

    Every other rank issues the whole step (the host runs ahead of the GPU) and blocks at its end.
    Collectives complete in order while every rank has issued a matching one; the first that does not is
    ``started`` on each rank that issued it, the later ones ``scheduled``. Each dump keeps the last
    ``buffer_entries`` entries (the ring buffer). Enqueue times: step k starts at k x ``step_s`` with a
    seeded jitter per rank."""
    import numpy as np

    n = integer("n_ranks", n_ranks, 2, 1_000_000)
    if cause not in CAUSES and cause not in EXTRA_CAUSES:
        raise ValueError(f"cause must be one of {', '.join(list(CAUSES) + list(EXTRA_CAUSES))}, got {cause!r}")
    bad = integer("bad_rank", bad_rank, 0, n - 1)
    hs = integer("hang_step", hang_step, 0, 100_000)
    nb = integer("buckets", buckets, 2, 64)
    buf = integer("buffer_entries", buffer_entries, 1)
    step_s = real("step_s", step_s, 0, low_open=True, unit="seconds")
    sizes = _bucket_sizes(nb, seed)
    healthy = [op for k in range(hs) for op in collective_program(k, sizes)]
    last = collective_program(hs, sizes)
    programs = []
    for r in range(n):
        prog = list(healthy)
        if r != bad or cause in ("none", "link"):
            prog += last
        elif cause == "conditional":
            prog += [("allreduce", (1,))] + last
        elif cause == "mismatch":
            prog += [last[0], last[2], last[1]] + last[3:]
        programs.append(prog)  # dead and stuck: nothing of the last step
    # the first sequence id that does not complete: the first where ranks disagree or one has not issued it
    total = max(len(p) for p in programs)
    g = next((s for s in range(total)
              if any(len(p) <= s for p in programs) or len({p[s] for p in programs}) > 1), total)
    if cause == "link":
        g = len(healthy)
    hang_seq = -1 if (cause == "none" and g == total) else g
    rng = np.random.default_rng(seed + 1)
    per_step = len(collective_program(1, sizes))  # non-logging steps: 1 + buckets
    dumps = []
    for r, prog in enumerate(programs):
        jitter = rng.normal(0.0, 0.01 * step_s, len(prog))
        entries = []
        for s, (op, sz) in enumerate(prog):
            state = "completed" if hang_seq < 0 or s < hang_seq else ("started" if s == hang_seq else "scheduled")
            t = (s // per_step) * step_s + (s % per_step) * step_s / (per_step + 1) + abs(float(jitter[s]))
            entries.append(Entry(s, op, sz, state, round(t, 6)))
        if r == bad and cause == "dead":
            dumps.append(None)
            continue
        if r == bad and cause == "stuck":
            stack = "train.py:step > next(loader) > dataset.__getitem__ > read (waiting on storage)"
        elif hang_seq >= 0 and len(prog) > hang_seq:
            stack = f"train.py:step > optimizer barrier > work.wait (collective {hang_seq}, {prog[hang_seq][0]})"
        else:
            stack = "train.py:step > forward"
        dumps.append(Dump(r, tuple(entries[-buf:]), stack))
    return HangSim(tuple(dumps), cause, None if cause in EXTRA_CAUSES else bad, hang_seq,
                   tuple(len(p) for p in programs))


def find_missing_rank(dumps) -> Finding:
    """Name the cause and the rank of a hang from every rank's flight-recorder dump (None: no dump).

    1. A rank with no dump is dead (its peers' dumps say where they wait).
    2. G = the lowest sequence id not completed on any rank. If most ranks' last entered id is below G
       (they finished and issued nothing more), the rank that entered G ran an extra collective: conditional.
       Otherwise a rank whose last entered id is below G never arrived: the one with the lowest
       last-entered id is stuck outside the collective.
    3. Every rank entered G: the majority (op, sizes) at G and G + 1; the odd rank r ran an extra
       collective (r's G + 1 is the majority's G) or skipped one (r's G is the majority's G + 1): a
       conditional collective; its G and G + 1 swapped, or other sizes: a mismatch.
    4. All agree at G: the transport (``link``), no rank named. Nothing pending: ``none``.
    Entries are matched by sequence id, never by their position in the ring buffer."""
    dumps = list(dumps)
    if len(dumps) < 2:
        raise ValueError(f"dumps must hold one entry per rank (at least 2 ranks), got {len(dumps)}")
    present = [d for d in dumps if d is not None]
    pending = [e.seq for d in present for e in d.entries if e.state != "completed"]
    missing = [r for r, d in enumerate(dumps) if d is None]
    g = min(pending) if pending else -1
    if missing:
        return Finding("dead", missing[0], g, f"rank {missing[0]} left no dump; the others wait at collective {g}")
    if not pending:
        return Finding("none", None, -1, "every entry completed: no collective is stuck")
    by_rank = [{e.seq: e for e in d.entries} for d in dumps]
    last = [max(m) if m else -1 for m in by_rank]
    behind = [r for r in range(len(dumps)) if last[r] < g]
    if 2 * len(behind) > len(dumps):  # most ranks entered nothing past G: the few that did ran an extra collective
        r = next(k for k in range(len(dumps)) if k not in set(behind))
        return Finding("conditional", r, g, f"rank {r} entered collective {g} ({by_rank[r][g].op}) that "
                                            f"{len(behind)} of {len(dumps)} ranks never issued (only it took a branch)")
    if behind:
        r = min(behind, key=lambda k: (last[k], k))
        return Finding("stuck", r, g, f"rank {r} last entered collective {last[r]}, the others entered {g}; "
                                      f"its stack: {dumps[r].stack}")

    def key(r, s):
        e = by_rank[r].get(s)
        return None if e is None else e.key

    def majority(s):
        keys = [key(r, s) for r in range(len(dumps)) if key(r, s) is not None]
        return Counter(keys).most_common(1)[0][0] if keys else None

    m0, m1 = majority(g), majority(g + 1)
    odd = [r for r in range(len(dumps)) if key(r, g) != m0]
    if not odd:
        return Finding("link", None, g, f"every rank entered collective {g} with the same op and sizes and none "
                                        "completed: the transport (a link, a NIC, a switch), not a missing rank")
    r = odd[0]
    k0, k1 = key(r, g), key(r, g + 1)
    if k0 == m1 and k1 == m0:
        return Finding("mismatch", r, g, f"rank {r} issued collectives {g} and {g + 1} in the other order: "
                                         f"{k0} where the others have {m0}")
    if k1 == m0 or k0 == m1:
        extra = k1 == m0
        return Finding("conditional", r, g, f"rank {r} " + ("called an extra" if extra else "skipped a")
                       + f" collective at {g}: {k0 if extra else m0} ({'only it' if extra else 'the others'} took a branch)")
    return Finding("mismatch", r, g, f"rank {r} has {k0} at collective {g} where the others have {m0}")


def triage_time_s(method: str, n_ranks: int, gpus_per_host: int = 8, timeout_s: float | None = None,
                  assume: dict | None = None) -> float:
    """Seconds from the hang to knowing the missing rank, on ``n_ranks`` ranks (hosts of ``gpus_per_host``):

    * ``flight recorder``: the timeout T (the dump's trigger) + collecting N x B entries x bytes per entry
      at the collection rate + parsing N x B entries at the parse rate; ``flight recorder, dumped at the
      alert``: the same with the dump requested at a no-progress alert A instead of the timeout;
    * ``py-spy, grouped``: a no-progress alert A (the stacks must be taken before the timeout kills the
      processes) + ceil(hosts / fanout) rounds of (ssh + gpus_per_host x one py-spy dump) + reading the
      distinct stack groups (about 3: the waiters, the odd rank, the rest) at R seconds each;
    * ``py-spy, one by one``: the same dumps, then reading all N stacks at R seconds each;
    * ``NCCL_DEBUG rerun``: relaunch (reschedule + init) + the replay from the last checkpoint to the hang
      (half the checkpoint interval on average) + T + the same ssh rounds to gather the logs.
    ``timeout_s`` defaults to the NCCL watchdog's (``training.restart_detect_minutes``); ``assume``
    overrides the ``sre.*`` triage assumptions by their short names (fr_buffer_entries, fr_entry_bytes,
    fr_parse_entries_per_s, dump_collect_gb_s, pyspy_dump_s, ssh_fanout, ssh_round_s, stack_group_read_s,
    progress_alert_s, checkpoint_interval_min)."""
    from lib.registry import assumptions

    n = integer("n_ranks", n_ranks, 1)
    gph = integer("gpus_per_host", gpus_per_host, 1, 72)
    t_wd = 60.0 * assumptions.value("training.restart_detect_minutes") if timeout_s is None else \
        real("timeout_s", timeout_s, 0, low_open=True, unit="seconds")
    a = {k: assumptions.value(f"sre.{k}") for k in TRIAGE_KEYS}
    for k, v in (assume or {}).items():
        if k not in a:
            raise ValueError(f"assume keys must be among {', '.join(TRIAGE_KEYS)}, got {k!r}")
        a[k] = real(k, v, 0, low_open=True)
    hosts = math.ceil(n / gph)
    rounds = math.ceil(hosts / a["ssh_fanout"])
    gather = rounds * (a["ssh_round_s"] + gph * a["pyspy_dump_s"])
    if method in ("flight recorder", "flight recorder, dumped at the alert"):
        entries = n * a["fr_buffer_entries"]
        trigger = t_wd if method == "flight recorder" else a["progress_alert_s"]
        return trigger + entries * a["fr_entry_bytes"] / (a["dump_collect_gb_s"] * 1e9) + entries / a["fr_parse_entries_per_s"]
    if method == "py-spy, grouped":
        return a["progress_alert_s"] + gather + min(3, n) * a["stack_group_read_s"]
    if method == "py-spy, one by one":
        return a["progress_alert_s"] + gather + n * a["stack_group_read_s"]
    if method == "NCCL_DEBUG rerun":
        relaunch = 60.0 * (assumptions.value("training.restart_reschedule_minutes")
                           + assumptions.value("training.restart_init_minutes"))
        return relaunch + 30.0 * a["checkpoint_interval_min"] + t_wd + rounds * a["ssh_round_s"]
    raise ValueError(f"method must be one of {', '.join(TRIAGE_METHODS)}, got {method!r}")


TRIAGE_KEYS = ("fr_buffer_entries", "fr_entry_bytes", "fr_parse_entries_per_s", "dump_collect_gb_s", "pyspy_dump_s",
               "ssh_fanout", "ssh_round_s", "stack_group_read_s", "progress_alert_s", "checkpoint_interval_min")
TRIAGE_METHODS = ("flight recorder", "flight recorder, dumped at the alert", "py-spy, grouped", "py-spy, one by one", "NCCL_DEBUG rerun")


# ---- the reproducer: threads as ranks, every wait with a timeout ---------------------------------------------


class CollectiveTimeout(RuntimeError):
    """A rank waited longer than the group's timeout inside a collective (the watchdog's error)."""


class ThreadGroup:
    """An all-reduce (sum of vectors) among ``world`` threads, matched by each rank's call count (its
    sequence id), like NCCL's in-order collectives. It completes when every rank has called the same
    sequence id with the same size; a rank waits at most ``timeout_s`` for that, then raises
    :class:`CollectiveTimeout` (and so does every other waiter): it never blocks forever. Calls whose sizes
    differ at one sequence id never complete (NCCL's ring would wait for bytes never sent)."""

    def __init__(self, world: int, timeout_s: float = 1.0):
        self.world = integer("world", world, 1, 256)
        self.timeout_s = real("timeout_s", timeout_s, 0, 2.0, low_open=True, unit="seconds")
        self._cv = threading.Condition()
        self._seq = [0] * self.world
        self._vals: dict[int, dict[int, tuple]] = {}
        self.entered: list[list[tuple]] = [[] for _ in range(self.world)]  # per rank: (sequence id, size)
        self.aborted = False

    def all_reduce(self, rank: int, values) -> list[float]:
        vec = tuple(float(v) for v in values)
        with self._cv:
            s = self._seq[rank]
            self._seq[rank] += 1
            self.entered[rank].append((s, len(vec)))
            slot = self._vals.setdefault(s, {})
            slot[rank] = vec
            self._cv.notify_all()

            def done():
                return len(slot) == self.world and len({len(v) for v in slot.values()}) == 1

            self._cv.wait_for(lambda: done() or self.aborted, timeout=self.timeout_s)
            if not done():
                self.aborted = True  # the watchdog tears the group down: every waiter fails
                self._cv.notify_all()
                sizes = sorted({len(v) for v in slot.values()})
                raise CollectiveTimeout(f"collective {s} did not complete within {self.timeout_s:g} s: "
                                        f"{len(slot)} of {self.world} ranks arrived"
                                        + (f", with sizes {sizes}" if len(sizes) > 1 else ""))
            return [sum(col) for col in zip(*slot.values(), strict=True)]


@dataclass(frozen=True)
class TrainResult:
    """The outcome of :func:`run_training`: the steps each rank finished, the lowest rank's error (or ''), each
    rank's entered sequence ids, the losses rank 0 printed (step, mean loss) and the wall time."""

    finished: tuple
    error: str
    entered: tuple
    printed: tuple
    wall_s: float

    @property
    def hung(self) -> bool:
        return bool(self.error)


GRAD_ELEMENTS = 4  # the toy gradient's size: anything but 1, so it differs from the loss's


def run_training(world: int, steps: int, log_every: int, fixed: bool, timeout_s: float = 0.5,
                 seed: int = 0) -> TrainResult:
    """Threads as data-parallel ranks: each step every rank all-reduces its gradient (a vector of
    ``GRAD_ELEMENTS``); on logging steps (``step % log_every == 0``, from step 1) the loss is logged.

    * buggy (``fixed`` False): ``if rank == 0 and step % log_every == 0: all_reduce(loss)`` — rank 0
      alone enters a collective (1 element) at the sequence id where the others enter the next step's
      gradient all-reduce: the sizes differ, nothing completes, and the group times out at step ``log_every``;
    * fixed: on logging steps every rank joins the loss all-reduce; only rank 0 prints.
    Every wait has ``timeout_s`` (<= 2 s); the threads are joined with a timeout too."""
    import time

    import numpy as np

    w = integer("world", world, 2, 64)
    n_steps = integer("steps", steps, 1, 10_000)
    le = integer("log_every", log_every, 1, 10_000)
    grp = ThreadGroup(w, timeout_s)
    finished = [0] * w
    printed: list[tuple[int, float]] = []
    errors: list[str] = []
    losses = np.random.default_rng(seed).uniform(1.0, 3.0, (n_steps + 1, w))

    def rank_main(rank: int) -> None:
        try:
            for step in range(1, n_steps + 1):
                grp.all_reduce(rank, [losses[step, rank] * 0.1] * GRAD_ELEMENTS)  # the gradient all-reduce
                loss = float(losses[step, rank])
                if fixed:
                    if step % le == 0:
                        total = grp.all_reduce(rank, [loss])[0]  # every rank joins
                        if rank == 0:
                            printed.append((step, total / w))
                elif rank == 0 and step % le == 0:
                    total = grp.all_reduce(rank, [loss])[0]  # the bug: only rank 0 reaches this collective
                    printed.append((step, total / w))
                finished[rank] = step
        except CollectiveTimeout as err:
            errors.append(f"rank {rank}: {err}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=grp.timeout_s * 4 + 5.0)
    wall = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        errors.append("a rank thread did not finish within its join timeout")
    return TrainResult(tuple(finished), min(errors, key=lambda e: int(e.split(":")[0][5:])) if errors else "", tuple(tuple(e) for e in grp.entered),
                       tuple(printed), wall)


def group_dumps(entered) -> tuple:
    """Flight-recorder dumps from a :class:`ThreadGroup`'s per-rank ``entered`` lists of (sequence id, size):
    every call is an all-reduce of that size; sequence ids below the first one where a rank is missing or
    the sizes differ are completed, that one is started (a blocking host issues nothing after it)."""
    ranks = [list(e) for e in entered]
    if len(ranks) < 2:
        raise ValueError(f"entered must hold at least 2 ranks, got {len(ranks)}")
    total = max((len(e) for e in ranks), default=0)
    g = next((s for s in range(total) if any(len(e) <= s for e in ranks) or len({e[s][1] for e in ranks}) > 1), total)
    dumps = []
    for r, e in enumerate(ranks):
        entries = tuple(Entry(seq, "allreduce", (size,), "completed" if seq < g else "started", 0.0) for seq, size in e)
        dumps.append(Dump(r, entries, "work.wait" if len(e) > g else "returned"))
    return tuple(dumps)


def hang_counters(chip: str, nccl_ctas: int, idle_w: float | None = None, spin_w_per_sm: float | None = None) -> dict:
    """What the usual counters read while every healthy rank's GPU spins in a collective waiting for a peer:
    ``utilization`` (nvidia-smi's: the fraction of sample periods in which a kernel was resident) 1.0;
    ``sm_active`` (DCGM's fraction of SMs with a resident warp) = nccl_ctas / SMs, the NCCL kernel's blocks
    polling a flag; ``tensor_active`` 0 (no matmul); power = idle + SMs spinning x watts per spinning SM
    (assumptions ``power.gpu_power.idle_fraction_of_tdp`` and ``sre.spin_w_per_sm``), as a fraction of TDP too."""
    from lib.perf.energy import assumed
    from lib.registry import assumptions
    from lib.registry.hardware import gpu

    g = gpu(chip)
    sms = int(g.compute_units)
    ctas = integer("nccl_ctas", nccl_ctas, 1, sms)
    idle = g.tdp_w * assumed("gpu_power.idle_fraction_of_tdp") if idle_w is None else \
        real("idle_w", idle_w, 0, unit="W")
    per_sm = assumptions.value("sre.spin_w_per_sm") if spin_w_per_sm is None else real("spin_w_per_sm", spin_w_per_sm, 0)
    power = min(g.tdp_w, idle + ctas * per_sm)
    return {"utilization": 1.0, "sm_active": ctas / sms, "tensor_active": 0.0, "power_w": power,
            "power_fraction": power / g.tdp_w, "sms": sms}
