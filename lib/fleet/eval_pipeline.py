"""An eval pipeline as a batch inference job (N059 eval-pipeline).

* :func:`eval_sizes`: prompts per eval for a suite (log-normal around a mean: a few huge evals, many
  small ones), seeded.
* :func:`run_cost`: one checkpoint's run: prompts, tokens, replica-seconds per prompt from
  :func:`lib.fleet.capacity.request_cost` at the batch the KV pool holds (offline: no TPOT target),
  GPU-hours, dollars (:func:`lib.fleet.capacity.gpu_hour_usd`) and the ideal turnaround on ``n_gpus``.
* Sharding (:func:`makespan`): tasks (whole evals, or chunks of ``chunk`` prompts from
  :func:`chunked`) placed on replicas naively (round-robin in suite order) or by longest processing
  time first (LPT: largest task to the least-loaded replica; Graham 1969: within 4/3 - 1/(3m) of the
  optimum); :func:`makespan_lower_bound` is max(total / m, largest task).
* :class:`ContentCache` and :func:`simulate_cache`: results keyed by a hash of everything that
  determines them. Generations are keyed on (checkpoint digest, prompt, sampling settings, engine and
  harness versions), so they hit only when a checkpoint is run again (a scoring fix, added evals, a
  retried shard); judge calls are keyed on (judge, prompt, output), so they also hit across
  checkpoints whenever two checkpoints answer a prompt identically. :func:`cache_hit_rates` is the
  closed form the simulation is checked against.
* :func:`min_detectable_delta`: the smallest accuracy change a paired rerun can believe at ``n``
  prompts, the reproducibility floor.

SI units: seconds, US dollars, tokens.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["ContentCache", "RunCost", "cache_hit_rates", "chunked", "eval_sizes", "makespan", "makespan_chunked_lpt",
           "makespan_lower_bound", "min_detectable_delta", "run_cost", "simulate_cache"]


def eval_sizes(n_evals: int, mean_prompts: float, sigma: float, seed: int, max_prompts: int = 1_000_000):
    """Prompts per eval: a log-normal with mean ``mean_prompts`` and log-spread ``sigma``, rounded,
    at least 1 and at most ``max_prompts`` (int64 array of ``n_evals``)."""
    import numpy as np

    n = integer("n_evals", n_evals, 1)
    mean = real("mean_prompts", mean_prompts, 1)
    s = real("sigma", sigma, 0, 3)
    rng = np.random.default_rng(integer("seed", seed, 0))
    x = rng.lognormal(math.log(mean) - s * s / 2, s, n)
    return np.clip(np.rint(x), 1, integer("max_prompts", max_prompts, 1)).astype(np.int64)


@dataclass(frozen=True)
class RunCost:
    """One checkpoint's run on ``n_gpus`` (see :func:`run_cost`)."""

    prompts: int
    input_tokens: int
    output_tokens: int
    batch: int
    replica_s_per_prompt: float
    gpus_per_replica: int
    replicas: int
    usd_per_gpu_hour: float

    @property
    def gpu_hours(self) -> float:
        """prompts x replica_s x GPUs per replica / 3600 (busy time; idle shard tails are extra)."""
        return self.prompts * self.replica_s_per_prompt * self.gpus_per_replica / 3600.0

    @property
    def usd(self) -> float:
        return self.gpu_hours * self.usd_per_gpu_hour

    @property
    def ideal_turnaround_s(self) -> float:
        """Perfectly balanced: prompts x replica_s / replicas."""
        return self.prompts * self.replica_s_per_prompt / self.replicas


def run_cost(dep, prompts: int, prompt_len: int, output_len: int, n_gpus: int) -> RunCost:
    """Price one run of ``prompts`` prompts of ``prompt_len`` + ``output_len`` tokens on ``n_gpus``
    GPUs as replicas of ``dep``, each decoding at the batch its KV pool holds at the longest context
    (:func:`lib.fleet.capacity.request_cost` with ``batch=``)."""
    from lib.fleet.capacity import gpu_hour_usd, request_cost

    n = integer("prompts", prompts, 1)
    g = integer("n_gpus", n_gpus, 1)
    replicas = g // dep.gpus_per_replica
    if replicas < 1:
        raise ValueError(f"n_gpus = {g} holds no replica of {dep.label} ({dep.gpus_per_replica} GPUs each)")
    b = dep.budget.max_sequences(integer("prompt_len", prompt_len, 1) + integer("output_len", output_len, 1))
    if b < 1:
        raise ValueError(f"{dep.label} holds no sequence of {prompt_len + output_len} tokens")
    cost = request_cost(dep, prompt_len, output_len, batch=b)
    return RunCost(n, n * prompt_len, n * output_len, b, cost.replica_s, dep.gpus_per_replica, replicas,
                   gpu_hour_usd(dep.chip))


def chunked(sizes, chunk: int) -> list[int]:
    """Split each task of ``sizes`` prompts into chunks of at most ``chunk`` prompts."""
    c = integer("chunk", chunk, 1)
    out: list[int] = []
    for s in sizes:
        s = int(s)
        out += [c] * (s // c) + ([s % c] if s % c else [])
    return out


def makespan(sizes, machines: int, policy: str) -> tuple[float, list[float]]:
    """(the largest machine load, every machine's load) placing tasks of ``sizes`` on ``machines``.
    ``policy``: "naive" (task i to machine i mod m, in the given order) or "lpt" (largest first, each
    to the least-loaded machine)."""
    m = integer("machines", machines, 1)
    if policy == "naive":
        loads = [0.0] * m
        for i, s in enumerate(sizes):
            loads[i % m] += float(s)
        return max(loads), loads
    if policy != "lpt":
        raise ValueError(f"policy must be 'naive' or 'lpt', got {policy!r}")
    heap = [(0.0, k) for k in range(m)]
    for s in sorted((float(x) for x in sizes), reverse=True):
        load, k = heapq.heappop(heap)
        heapq.heappush(heap, (load + s, k))
    loads = [0.0] * m
    for load, k in heap:
        loads[k] = load
    return max(loads), loads


def makespan_chunked_lpt(sizes, chunk: int, machines: int) -> float:
    """:func:`makespan` of ``chunked(sizes, chunk)`` under LPT without listing the chunks: LPT places
    the F full chunks first, evenly (ties go to the least-loaded machine), so every machine holds
    floor(F / m) or one more; then the remainders (each below ``chunk``), largest first, on a heap."""
    c = integer("chunk", chunk, 1)
    m = integer("machines", machines, 1)
    full = sum(int(s) // c for s in sizes)
    loads = [float((full // m + (1 if k < full % m else 0)) * c) for k in range(m)]
    heap = [(load, k) for k, load in enumerate(loads)]
    heapq.heapify(heap)
    for r in sorted((int(s) % c for s in sizes if int(s) % c), reverse=True):
        load, k = heapq.heappop(heap)
        heapq.heappush(heap, (load + r, k))
    return max(load for load, _ in heap)


def makespan_lower_bound(sizes, machines: int) -> float:
    """No placement beats max(total / m, largest task)."""
    m = integer("machines", machines, 1)
    sizes = [float(s) for s in sizes]
    return max(sum(sizes) / m, max(sizes, default=0.0))


class ContentCache:
    """A content-addressed result store: the key is SHA-256 of the canonical JSON of every input."""

    def __init__(self):
        self.store: dict[str, object] = {}
        self.hits = self.misses = 0

    @staticmethod
    def key(**inputs) -> str:
        return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def get_or_compute(self, compute, **inputs):
        k = self.key(**inputs)
        if k in self.store:
            self.hits += 1
            return self.store[k]
        self.misses += 1
        value = self.store[k] = compute()
        return value

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def cache_hit_rates(checkpoints: int, triggers: int, changed: float, same_output: float) -> tuple[float, float]:
    """Expected (generation, judge) hit rates over ``checkpoints`` x ``triggers`` runs of a suite.

    Each checkpoint's first run misses every generation (the key holds the checkpoint); each of its
    ``triggers - 1`` reruns changes a fraction ``changed`` of the prompts (new or edited evals) and
    hits the rest. The judge, keyed on the output, hits the same reruns, and on a checkpoint's first
    run also the prompts whose output is identical to the previous checkpoint's (``same_output``):
    gen = (K - 1)(1 - c) / K, judge = gen + (C - 1) s / (C K)."""
    c_n = integer("checkpoints", checkpoints, 1)
    k = integer("triggers", triggers, 1)
    c = real("changed", changed, 0, 1)
    s = real("same_output", same_output, 0, 1)
    gen = (k - 1) * (1 - c) / k
    return gen, gen + (c_n - 1) * s / (c_n * k)


def simulate_cache(n_prompts: int, checkpoints: int, triggers: int, changed: float, same_output: float,
                   seed: int) -> tuple[float, float]:
    """Run the suite through two :class:`ContentCache` stages and return their hit rates.

    Prompts are ids; a rerun replaces a ``changed`` fraction with new ids. A checkpoint's output for a
    prompt equals the previous checkpoint's with probability ``same_output`` (else it is new); the
    judge's key is (prompt, output)."""
    import numpy as np

    rng = np.random.default_rng(integer("seed", seed, 0))
    n = integer("n_prompts", n_prompts, 1)
    prompts = list(range(n))
    next_id = n
    gen, judge = ContentCache(), ContentCache()
    prev_out: dict[int, str] = {}
    for ckpt in range(integer("checkpoints", checkpoints, 1)):
        outs: dict[int, str] = {}
        for trig in range(integer("triggers", triggers, 1)):
            if trig > 0:
                for i in np.flatnonzero(rng.random(n) < changed):
                    prompts[i] = next_id
                    next_id += 1
            for p in prompts:
                if p not in outs:
                    same = p in prev_out and rng.random() < same_output
                    outs[p] = prev_out[p] if same else f"out-{ckpt}-{p}"
                out = gen.get_or_compute(lambda p=p, outs=outs: outs[p], checkpoint=ckpt, prompt=p, temperature=0.0)
                judge.get_or_compute(lambda: 1, judge="judge-v1", prompt=p, output=out)
        prev_out = outs
    return gen.hit_rate, judge.hit_rate


def min_detectable_delta(accuracy: float, n: int, z: float = 1.96, paired_noise: float = 1.0) -> float:
    """Smallest accuracy change two runs of an ``n``-prompt eval can tell from noise at ``z``:
    z sqrt(2 p (1 - p) / n) x ``paired_noise`` (1: independent runs; below 1 when the two runs
    share prompts and most answers agree, which pairing exploits)."""
    p = real("accuracy", accuracy, 0, 1, low_open=True, high_open=True)
    return real("z", z, 0, low_open=True) * math.sqrt(2 * p * (1 - p) / integer("n", n, 1)) * \
        real("paired_noise", paired_noise, 0, 1, low_open=True)
