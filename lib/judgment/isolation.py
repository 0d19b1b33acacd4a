"""Cross-tenant isolation gaps in GPU serving, priced, and the test that keeps the fix (N091).

* **The timing channel of a shared prefix cache** (:func:`timing_channel`): a prompt whose first
  ``h`` tokens another tenant's request left in the cache prefills only its ``P - h`` new tokens.
  Cold and warm prefill are :func:`lib.fleet.capacity.prefill_s` (the book's one warm-prefill
  model); the channel is their difference ``delta``. Only full blocks are cached, so ``h`` is the
  prefix rounded down to the block size.
* **Telling hit from miss under jitter.** With TTFT = mean + N(0, sigma^2) noise:
  one probe read against the midpoint threshold errs with probability ``Phi(-delta / (2 sigma))``
  (:func:`probe_error`; ``n`` averaged probes: ``Phi(-sqrt(n) delta / (2 sigma))``), so an error of
  ``eps`` takes ``n = (2 z_{1-eps} sigma / delta)^2`` probes (:func:`probes_for_error`). The audit
  that proves the gap (hit arm: a prefix the victim tenant sent; miss arm: a fresh prefix) is a
  one-sided two-sample test of the mean difference, ``n = 2 (z_{1-alpha} + z_{power})^2 (sigma /
  delta)^2`` pairs per arm (:func:`audit_pairs`), power ``Phi(delta / (sigma sqrt(2/n)) - z_{1-alpha})``
  (:func:`audit_power`). :func:`simulate_audit` runs that protocol through a real
  :class:`TenantPrefixCache` and seeded jitter: the oracle of both closed forms.
* **The floor of the jitter** (:func:`step_alignment_sd`): a probe that arrives at a uniform time
  waits for the running decode step, ``U(0, t_step)``: standard deviation ``t_step / sqrt(12)``.
* **The fix and its test.** :class:`TenantPrefixCache` keys blocks by tenant: a salt enters the
  first block's hash, and the chain carries it to every later block (vLLM's ``cache_salt``, source
  ``vllm_cache_salt`` in data/assumptions.yaml; stale GPU memory across processes: ``leftoverlocals``).
  :func:`regression_test` fails a cache that lets tenant B hit tenant A's blocks, and fails a
  "fix" that stops tenant A from hitting its own.
* **Stale memory and offload tiers**: :func:`freed_kv_bytes_per_s` (the KV a replica frees a second,
  what scrubbing must zero), :func:`scrub_share` (the HBM time zeroing it takes) and
  :func:`tier_residency_s` (how long a copy survives in an offload tier that takes those bytes).

SI units: seconds, bytes, requests per second.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from lib.inputs import integer, real
from lib.kvcache.chained_hash import PrefixBlockCache, hash_block

__all__ = ["AuditSimulation", "TenantPrefixCache", "TimingChannel", "audit_pairs", "audit_power",
           "freed_kv_bytes_per_s", "probe_error", "probes_for_error", "regression_test", "salted_hash",
           "scrub_share", "simulate_audit", "step_alignment_sd", "tier_residency_s", "timing_channel"]

_N = NormalDist()


# ---- the timing channel ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingChannel:
    """Cold and warm prefill of a ``prompt_len`` prompt whose first ``cached_len`` tokens may be cached."""

    prompt_len: int
    cached_len: int
    cold_s: float
    warm_s: float

    @property
    def delta_s(self) -> float:
        """cold - warm: what a hit saves, and what an observer of TTFT sees."""
        return self.cold_s - self.warm_s


def timing_channel(dep, prefix_len: int, suffix_len: int, block_size: int = 16, *,
                   mfu: float | None = None) -> TimingChannel:
    """The channel of a ``prefix_len``-token cached prefix followed by ``suffix_len`` new tokens
    (module doc): cold ``prefill_s(P)``, warm ``prefill_s(P, h)`` with ``h`` the prefix's full blocks."""
    from lib.fleet.capacity import prefill_s

    pre = integer("prefix_len", prefix_len, 1, unit="tokens")
    suf = integer("suffix_len", suffix_len, 1, unit="tokens")
    bs = integer("block_size", block_size, 1, unit="tokens")
    p = pre + suf
    h = pre // bs * bs
    cold = prefill_s(dep, p, mfu=mfu)
    warm = prefill_s(dep, p, h, mfu=mfu) if h > 0 else cold
    return TimingChannel(p, h, cold, warm)


def step_alignment_sd(dep, batch: int, context: int) -> float:
    """Standard deviation of the wait for the running decode step, ``t_step / sqrt(12)``
    (:func:`lib.perf.throughput.step_s` at ``batch`` and ``context``): the jitter a probe meets even
    next to the server."""
    from lib.perf.throughput import step_s

    return step_s(dep, integer("batch", batch, 1), integer("context", context, 1, unit="tokens")) / math.sqrt(12.0)


def _delta_sigma(delta_s: float, sigma_s: float) -> tuple[float, float]:
    d = real("delta_s", delta_s, 0, unit="seconds")
    s = real("sigma_s", sigma_s, 0, low_open=True, unit="seconds")
    return d, s


def probe_error(delta_s: float, sigma_s: float, probes: int = 1) -> float:
    """Error of the midpoint threshold on the mean of ``probes`` TTFTs: Phi(-sqrt(n) delta / (2 sigma))."""
    d, s = _delta_sigma(delta_s, sigma_s)
    n = integer("probes", probes, 1)
    return _N.cdf(-math.sqrt(n) * d / (2.0 * s))


def probes_for_error(delta_s: float, sigma_s: float, error: float) -> float:
    """Averaged probes for a hit/miss error of ``error``: (2 z_{1-error} sigma / delta)^2 (inf when
    delta = 0: no number of probes tells them apart). A fraction: round up for a count."""
    d, s = _delta_sigma(delta_s, sigma_s)
    e = real("error", error, 0, 0.5, low_open=True, high_open=True, unit="(probability, below 0.5)")
    if d == 0.0:
        return math.inf
    return (2.0 * _N.inv_cdf(1.0 - e) * s / d) ** 2


def _alpha_power(alpha: float, power: float) -> tuple[float, float]:
    a = real("alpha", alpha, 0, 0.5, low_open=True, unit="(false-alarm probability, below 0.5)")
    pw = real("power", power, 0.5, 1, high_open=True, unit="(detection probability, 0.5 to below 1)")
    return a, pw


def audit_pairs(delta_s: float, sigma_s: float, alpha: float = 0.01, power: float = 0.99) -> float:
    """Samples per arm of the one-sided two-sample audit: 2 (z_{1-alpha} + z_{power})^2 (sigma / delta)^2."""
    d, s = _delta_sigma(delta_s, sigma_s)
    a, pw = _alpha_power(alpha, power)
    if d == 0.0:
        return math.inf
    return 2.0 * (_N.inv_cdf(1.0 - a) + _N.inv_cdf(pw)) ** 2 * (s / d) ** 2


def audit_power(pairs: int, delta_s: float, sigma_s: float, alpha: float = 0.01) -> float:
    """Power of the audit with ``pairs`` samples per arm: Phi(delta / (sigma sqrt(2 / n)) - z_{1-alpha})."""
    d, s = _delta_sigma(delta_s, sigma_s)
    n = integer("pairs", pairs, 1)
    a, _ = _alpha_power(alpha, 0.8)
    return _N.cdf(d / (s * math.sqrt(2.0 / n)) - _N.inv_cdf(1.0 - a))


# ---- the fix: a cache keyed by tenant ---------------------------------------------------------------


def _salt_root(tenant: Hashable) -> int:
    return int.from_bytes(hashlib.sha256(repr(("tenant-salt", tenant)).encode()).digest()[:8], "big")


def salted_hash(tenant: Hashable) -> Callable[[int | None, tuple[int, ...]], int]:
    """A block hash whose first block chains from the tenant's salt instead of None; later blocks
    chain from it, so every hash of the prefix carries the tenant."""
    root = _salt_root(tenant)

    def fn(parent_hash: int | None, block_tokens: tuple[int, ...]) -> int:
        return hash_block(root if parent_hash is None else parent_hash, block_tokens)

    return fn


class TenantPrefixCache:
    """A :class:`~lib.kvcache.chained_hash.PrefixBlockCache` shared by tenants. ``salted=False``
    keys blocks by tokens alone (any tenant hits any other's prefix); ``salted=True`` keys them by
    tenant and tokens (:func:`salted_hash`)."""

    def __init__(self, num_blocks: int, block_size: int, *, salted: bool) -> None:
        if not isinstance(salted, bool):
            raise ValueError(f"salted must be True or False, got {salted!r}")
        self.salted = salted
        self.cache = PrefixBlockCache(num_blocks, block_size)
        self._owner: dict[Hashable, Hashable] = {}

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.cache.block_size

    def _use(self, tenant: Hashable) -> None:
        self.cache.hash_fn = salted_hash(tenant) if self.salted else hash_block

    def allocate(self, tenant: Hashable, request_id: Hashable, tokens: Sequence[int]) -> int:
        """Run ``tokens`` for ``tenant``; return the prompt tokens served from the cache."""
        self._use(tenant)
        alloc = self.cache.allocate((tenant, request_id), tokens)
        self._owner[request_id] = tenant
        return alloc.num_hit_tokens

    def free(self, request_id: Hashable) -> None:
        """Finish a request (its blocks stay cached)."""
        if request_id not in self._owner:
            raise ValueError(f"request_id {request_id!r} is not running")
        self.cache.free((self._owner.pop(request_id), request_id))

    def match_prefix(self, tenant: Hashable, tokens: Sequence[int]) -> int:
        """Tokens ``tenant`` would find cached for ``tokens`` now (no side effects)."""
        self._use(tenant)
        return self.cache.match_prefix(tokens)


def regression_test(make_cache: Callable[[], object], prefix_len: int = 256, seed: int = 0) -> str:
    """The test that keeps the fix: tenant A runs a prompt; tenant B must find none of it cached,
    and tenant A must still find its full blocks (a "fix" that turns caching off fails too).
    ``make_cache()`` builds a fresh cache with ``allocate(tenant, id, tokens)``, ``free(id)``,
    ``match_prefix(tenant, tokens)``, ``block_size``. Raises AssertionError naming what leaked."""
    n = integer("prefix_len", prefix_len, 1, unit="tokens")
    cache = make_cache()
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, 128_000, n)]
    cache.allocate("tenant-a", "a1", tokens)
    cache.free("a1")
    leaked = cache.match_prefix("tenant-b", tokens)
    assert leaked == 0, (f"tenant B finds {leaked} of tenant A's {n} prompt tokens cached: a cross-tenant hit, "
                         "measurable as a faster TTFT")
    own = cache.match_prefix("tenant-a", tokens)
    full = n // cache.block_size * cache.block_size
    assert own == full, f"tenant A finds {own} of its own {full} cacheable tokens: the fix turned caching off"
    return f"passed: tenant B hits 0 tokens, tenant A still hits its {full}"


# ---- the audit, simulated -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditSimulation:
    """The audit run through a cache and seeded jitter: per-arm cached tokens, mean TTFTs, the
    empirical power (share of trials that reject 'no caching across tenants') and the closed form."""

    salted: bool
    pairs: int
    trials: int
    hit_arm_cached: tuple[int, ...]
    miss_arm_cached: tuple[int, ...]
    hit_arm_mean_s: float
    miss_arm_mean_s: float
    power: float
    power_closed_form: float
    mean_gap_s: float  # simulated mean(miss) - mean(hit), pooled over trials


def _random_tokens(rng, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 128_000, n)]


@lru_cache(maxsize=64)
def _protocol(prefix_len: int, suffix_len: int, pairs: int, block_size: int, salted: bool, seed: int):
    """Cached tokens each probe of each arm finds, on a real cache: victim sends prefix + its own
    question, the attacker then sends prefix + another question (hit arm); a fresh prefix (miss arm)."""
    rng = np.random.default_rng(seed)
    per = -(-(prefix_len + suffix_len) // block_size)
    cache = TenantPrefixCache(4 * pairs * per + 4, block_size, salted=salted)
    hit, miss = [], []
    for i in range(pairs):
        prefix = _random_tokens(rng, prefix_len)
        cache.allocate("victim", f"v{i}", prefix + _random_tokens(rng, suffix_len))
        cache.free(f"v{i}")
        hit.append(cache.allocate("attacker", f"h{i}", prefix + _random_tokens(rng, suffix_len)))
        cache.free(f"h{i}")
        miss.append(cache.allocate("attacker", f"m{i}", _random_tokens(rng, prefix_len + suffix_len)))
        cache.free(f"m{i}")
    return tuple(hit), tuple(miss)


def simulate_audit(dep, prefix_len: int, suffix_len: int, sigma_s: float, pairs: int, *, alpha: float = 0.01,
                   salted: bool = False, trials: int = 400, block_size: int = 16, seed: int = 0,
                   mfu: float | None = None) -> AuditSimulation:
    """The audit of the module doc: the cache decides what each probe finds cached, each TTFT is
    ``prefill_s(P, cached) + N(0, sigma^2)``; reject when the miss arm's mean exceeds the hit arm's by
    more than z_{1-alpha} sigma sqrt(2/n). ``power``: the share of ``trials`` that reject."""
    from lib.fleet.capacity import prefill_s

    pre = integer("prefix_len", prefix_len, 1, unit="tokens")
    suf = integer("suffix_len", suffix_len, 1, unit="tokens")
    s = real("sigma_s", sigma_s, 0, low_open=True, unit="seconds")
    n = integer("pairs", pairs, 2, 400)
    t = integer("trials", trials, 10, 20_000)
    bs = integer("block_size", block_size, 1, unit="tokens")
    a, _ = _alpha_power(alpha, 0.8)
    hit, miss = _protocol(pre, suf, n, bs, bool(salted), integer("seed", seed, 0))
    p = pre + suf
    cost = {c: prefill_s(dep, p, min(c, p - 1), mfu=mfu) for c in set(hit) | set(miss)}
    mu_hit = np.array([cost[c] for c in hit])
    mu_miss = np.array([cost[c] for c in miss])
    rng = np.random.default_rng(seed + 1)
    t_hit = mu_hit + s * rng.standard_normal((t, n))
    t_miss = mu_miss + s * rng.standard_normal((t, n))
    gap = t_miss.mean(axis=1) - t_hit.mean(axis=1)
    reject = gap > _N.inv_cdf(1.0 - a) * s * math.sqrt(2.0 / n)
    delta = float(mu_miss.mean() - mu_hit.mean())
    closed = audit_power(n, max(delta, 0.0), s, a)
    return AuditSimulation(bool(salted), n, t, hit, miss, float(mu_hit.mean()), float(mu_miss.mean()),
                           float(reject.mean()), closed, float(gap.mean()))


# ---- stale memory and offload tiers ----------------------------------------------------------------


def freed_kv_bytes_per_s(dep, rate: float, prompt_len: int, output_len: int) -> float:
    """KV bytes a replica frees a second at ``rate`` requests/s: rate x (P + O) x KV bytes per token
    (:meth:`Model.kv_bytes_per_token` in the deployment's KV dtype). Blocks are reused without
    zeroing, so this is also what a scrub on free must zero."""
    from lib.perf.deployment import require

    d = require(dep)
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    o = integer("output_len", output_len, 0, unit="tokens")
    return lam * (p + o) * d.mdl.kv_bytes_per_token(d.kv_dtype)


def scrub_share(dep, rate: float, prompt_len: int, output_len: int) -> float:
    """Share of the replica's HBM time that zeroing every freed block takes: freed bytes/s over the
    replica's GPUs' memory bandwidth (each GPU zeroes its own shard; a write-only pass)."""
    from lib.perf.deployment import require

    d = require(dep)
    return freed_kv_bytes_per_s(d, rate, prompt_len, output_len) / (d.gpus_per_replica * d.chip.memory_bandwidth)


def tier_residency_s(tier_bytes: float, write_bytes_per_s: float) -> float:
    """How long a block survives in an offload tier of ``tier_bytes`` that takes ``write_bytes_per_s``
    of evicted KV (FIFO/LRU turnover): tier_bytes / write rate."""
    b = real("tier_bytes", tier_bytes, 0, low_open=True, unit="bytes")
    w = real("write_bytes_per_s", write_bytes_per_s, 0, low_open=True, unit="bytes/s")
    return b / w
