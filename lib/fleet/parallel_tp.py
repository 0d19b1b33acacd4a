"""Which tensor-parallel degree a fleet should run: GPU-seconds per request at a TPOT target.

Nothing here prices a step or a prefill: each option is :func:`lib.fleet.capacity.request_cost`
on ``dep.replace(tp=n)`` (the step model, the prefill model and the KV pool of that layout), so a
degree's cost per request is

    gpu_s(n) = replica_s(n) x n        (replica-seconds x GPUs per replica)

and a fleet's GPUs for a load are ``rate x gpu_s(n) / utilization``
(:func:`lib.fleet.capacity.fleet_for_load`). A degree that cannot serve the workload (the weights
do not fit, one sequence's step misses the target, the KV pool holds no sequence of that length)
is an option with ``cost=None`` and the reason.

* :func:`tp_options`: every degree's cost; :func:`cheapest`: the fewest GPU-seconds (ties go to
  the smaller degree); :func:`gpu_s_by_target`: each degree's GPU-seconds over a range of targets;
* :func:`tightest_tpot_s`: the tightest TPOT target degree ``n`` can meet at all: its one-sequence
  step at the longest context;
* :func:`loosest_tpot_where_cheapest`: the loosest TPOT target at which degree ``n`` is the
  cheapest option (scan on a log grid, a fine scan of the last gap, then bisection on the last change);
* :func:`shortest_prompt_where_cheapest`: the shortest prompt at which ``n`` is the cheapest.

SI units: seconds, tokens.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["TPOption", "cheapest", "gpu_s_by_target", "loosest_tpot_where_cheapest", "shortest_prompt_where_cheapest",
           "tightest_tpot_s", "tp_options"]


@dataclass(frozen=True)
class TPOption:
    """One TP degree for a workload: its :class:`~lib.fleet.capacity.RequestCost` (None when the
    degree cannot serve it, with ``reason``)."""

    tp: int
    cost: object
    reason: str = ""

    @property
    def serves(self) -> bool:
        return self.cost is not None

    @property
    def gpu_s(self) -> float:
        """GPU-seconds per request: replica_s x GPUs per replica (inf when it cannot serve)."""
        return self.cost.replica_s * self.cost.dep.gpus_per_replica if self.cost is not None else math.inf


def _degrees(dep, degrees) -> list[int]:
    from lib.perf.collectives import gpus_per_node
    from lib.perf.tp_scaling import candidate_degrees

    if degrees is None:
        from lib.perf.deployment import tp_shards

        return [n for n in candidate_degrees(dep, gpus_per_node(chip=dep.chip)) if tp_shards(dep.mdl, n)]
    out = sorted({integer("tp", n, 1) for n in degrees})
    if not out:
        raise ValueError("degrees must list at least one TP degree")
    return out


@functools.lru_cache(maxsize=256)
def _at_tp(dep, tp: int):
    """``dep.replace(tp=tp)``, remembered: a curve asks for the same degrees of the same deployment at
    every target, and each new Deployment would rebuild its memory budget. Deployments are frozen."""
    return dep.replace(tp=tp)


def tp_options(dep, prompt_len: int, output_len: int, tpot_target_s: float, degrees=None) -> dict[int, TPOption]:
    """{tp: TPOption} for each degree (default: the degrees up to a node that shard the heads)."""
    from lib.fleet.capacity import request_cost
    from lib.perf.deployment import require

    dep = require(dep)
    real("tpot_target_s", tpot_target_s, 0, low_open=True, unit="seconds")
    out = {}
    for n in _degrees(dep, degrees):
        try:
            out[n] = TPOption(n, request_cost(_at_tp(dep, n), prompt_len, output_len, tpot_target_s))
        except ValueError as exc:
            msg = str(exc)
            if msg.startswith(("prompt_len", "output_len", "tpot_target_s")):
                raise
            out[n] = TPOption(n, None, msg)
    return out


def gpu_s_by_target(dep, prompt_len: int, output_len: int, targets_s, degrees=None) -> dict[int, list[float]]:
    """{tp: GPU-seconds per request at each TPOT target of ``targets_s`` (seconds, ascending)}, each
    :attr:`TPOption.gpu_s` of :func:`tp_options` at that target (inf where the degree cannot serve).

    A degree whose batch is set by its KV pool or ``max_num_seqs`` at some target keeps that batch,
    hence that cost, at every looser target: the batch the TPOT target allows only grows with the
    target (the decode step grows with the batch), so the degree is not priced again."""
    ts = [real("targets_s", t, 0, low_open=True, unit="seconds") for t in targets_s]
    if any(b < a for a, b in zip(ts, ts[1:], strict=False)):
        raise ValueError("targets_s must be in ascending order")
    out = {n: [] for n in _degrees(dep, degrees)}
    settled = {}  # degree -> gpu_s once the KV pool or max_num_seqs binds
    for t in ts:
        todo = [n for n in out if n not in settled]
        opts = tp_options(dep, prompt_len, output_len, t, todo) if todo else {}
        for n in out:
            if n in settled:
                out[n].append(settled[n])
                continue
            o = opts[n]
            out[n].append(o.gpu_s)
            lim = o.cost.limits if o.serves else None
            if lim is not None and o.cost.batch == int(min(lim.by_kv, lim.by_engine)):
                settled[n] = o.gpu_s
    return out


def cheapest(options: dict[int, TPOption]) -> TPOption | None:
    """The option with the fewest GPU-seconds per request (ties: the smaller degree); None if none serves."""
    serving = [o for o in options.values() if o.serves]
    return min(serving, key=lambda o: (o.gpu_s, o.tp)) if serving else None


def tightest_tpot_s(dep, tp: int, prompt_len: int, output_len: int) -> float:
    """The tightest TPOT target ``tp`` can meet: the one-sequence decode step at P + O (seconds);
    ValueError when ``tp`` cannot deploy the model."""
    from lib.perf.throughput import step_s

    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 1, unit="tokens")
    return step_s(_at_tp(dep, integer("tp", tp, 1)), 1, p + o)


def _wins(dep, p, o, t, tp, degrees) -> bool:
    best = cheapest(tp_options(dep, p, o, t, degrees))
    return best is not None and best.tp == tp


def loosest_tpot_where_cheapest(dep, prompt_len: int, output_len: int, tp: int, degrees=None,
                                hi_s: float = 0.2, points: int = 40, rel_tol: float = 1e-3) -> float | None:
    """The loosest TPOT target (seconds, up to ``hi_s``) at which ``tp`` is the cheapest degree:
    scan a log grid from ``tp``'s tightest target to ``hi_s``, take the loosest grid point where it
    wins, then scan the gap to the next grid point at ratio ``1 + rel_tol`` and bisect after the loosest
    win there. The wins need not be one interval: batches are integers, so near a degree's floor each
    step up of a rival's batch can hand it the lead and the next step of ``tp``'s own batch take it back;
    this is the supremum of the wins (to ``rel_tol``), not the end of the first run of them. ``hi_s``
    when it wins there; None when it wins nowhere on the grid."""
    lo = tightest_tpot_s(dep, tp, prompt_len, output_len) * (1 + 1e-9)
    hi = real("hi_s", hi_s, 0, low_open=True, unit="seconds")
    if lo >= hi:
        return None
    n = integer("points", points, 2)
    grid = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    wins = [_wins(dep, prompt_len, output_len, t, tp, degrees) for t in grid]
    if not any(wins):
        return None
    last = max(i for i, w in enumerate(wins) if w)
    if last == n - 1:
        return hi
    a, b = grid[last], grid[last + 1]
    k = math.ceil(math.log(b / a) / math.log1p(rel_tol))  # steps of ratio <= 1 + rel_tol across the gap
    fine = [a * (b / a) ** (i / k) for i in range(k + 1)]
    won = [i for i, t in enumerate(fine[1:-1], 1) if _wins(dep, prompt_len, output_len, t, tp, degrees)]
    if won:
        a, b = fine[won[-1]], fine[won[-1] + 1]
    while b / a - 1 > rel_tol:
        m = math.sqrt(a * b)
        a, b = (m, b) if _wins(dep, prompt_len, output_len, m, tp, degrees) else (a, m)
    return a


def shortest_prompt_where_cheapest(dep, output_len: int, tpot_target_s: float, tp: int, degrees=None,
                                   lo: int = 128, points: int = 24) -> int | None:
    """The shortest prompt (tokens, from ``lo`` to the model's window minus the output) at which
    ``tp`` is the cheapest degree at ``tpot_target_s``: scan a log grid, bisect on the first win.
    None when it wins nowhere on the grid."""
    o = integer("output_len", output_len, 1, unit="tokens")
    window = dep.mdl.max_position_embeddings - o
    lo = integer("lo", lo, 1)
    if window <= lo:
        return None
    n = integer("points", points, 2)
    grid = sorted({round(lo * (window / lo) ** (i / (n - 1))) for i in range(n)})
    wins = [_wins(dep, p, o, tpot_target_s, tp, degrees) for p in grid]
    if not any(wins):
        return None
    first = min(i for i, w in enumerate(wins) if w)
    if first == 0:
        return grid[0]
    a, b = grid[first - 1], grid[first]  # a loses, b wins
    while b - a > max(1, a // 200):
        m = (a + b) // 2
        a, b = (a, m) if _wins(dep, m, o, tpot_target_s, tp, degrees) else (m, b)
    return b
