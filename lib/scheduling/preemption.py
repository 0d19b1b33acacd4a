"""What one preemption costs: recompute the victim or swap its KV over the host link (I016).

Both prices come from their one home, :mod:`lib.kvcache.recompute_fetch`: recomputing a victim
that holds ``V`` cached tokens (prompt + generated) is the prefill of ``V`` tokens
(:func:`~lib.kvcache.recompute_fetch.recompute_time_s`), alone or riding in a pass with ``D``
decode tokens that runs anyway (prefill_time(V + D) - prefill_time(D): about free while that pass
stays memory-bound); swapping moves the victim's KV shard (each GPU its own) over the host link
once out and once back in (:func:`~lib.kvcache.recompute_fetch.fetch_time_s` on the
``host_dram`` tier, the same price :meth:`lib.scheduling.cost.StepCost.swap_s` charges inside the
simulator). SI units: seconds, bytes, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer
from lib.search import smallest_true

__all__ = ["PreemptionPrice", "preemption_price", "swap_recompute_crossover"]


@dataclass(frozen=True)
class PreemptionPrice:
    """One victim's preemption, priced both ways (seconds; bytes)."""

    victim_tokens: int
    decodes: int
    recompute_s: float  # its prefill alone
    recompute_riding_s: float  # its prefill added to a pass of ``decodes`` decode tokens
    swap_out_s: float  # its KV shard to host memory, per GPU in parallel
    swap_in_s: float  # and back
    kv_bytes: float  # the KV it holds, whole replica
    kv_bytes_per_gpu: float  # what one GPU copies (its shard)

    @property
    def swap_round_trip_s(self) -> float:
        """swap_out + swap_in, seconds."""
        return self.swap_out_s + self.swap_in_s


def preemption_price(dep, victim_tokens: int, decodes: int = 0) -> PreemptionPrice:
    """Recompute vs swap for one victim holding ``victim_tokens`` cached tokens on replica ``dep``.

    recompute = prefill_time(V); riding = prefill_time(V + D) - prefill_time(D) (D = ``decodes``;
    equal to recompute when D = 0); swap one way = latency + V x kv_bytes_per_token x shard / W
    (W: the host link's achieved bytes/s per GPU); kv_bytes = V x kv_bytes_per_token.
    """
    from lib.kvcache.recompute_fetch import fetch_time_s, recompute_time_s, storage_tier
    from lib.perf.deployment import require
    from lib.perf.roofline import kv_shard_fraction

    dep = require(dep)
    v = integer("victim_tokens", victim_tokens, 1, unit="tokens")
    d = integer("decodes", decodes, 0)
    m = dep.mdl
    tier = storage_tier("host_dram", dep.chip)
    swap = fetch_time_s(m, v, tier, tp=dep.tp, kv_dtype=dep.kv_dtype)
    kv = v * m.kv_bytes_per_token(dep.kv_dtype)
    return PreemptionPrice(v, d, recompute_time_s(dep, v), recompute_time_s(dep, v, suffix_len=d), swap, swap,
                           kv, kv * kv_shard_fraction(m, dep.tp))


def swap_recompute_crossover(dep, decodes: int = 0, *, riding: bool = True, high: int = 1 << 20) -> int:
    """The smallest victim (tokens) whose swap round trip costs less than its recompute (riding
    with ``decodes`` decode tokens when ``riding``, else alone); ``high + 1`` when none up to ``high``.

    Bisection on :func:`preemption_price`: a recompute grows at least linearly in the victim's
    tokens (faster once attention counts) from a floor near zero (riding) or the weight read
    (alone), a swap linearly from its latency, so the comparison flips once.
    """
    hi = integer("high", high, 1, unit="tokens")

    def swap_wins(v: int) -> bool:
        p = preemption_price(dep, v, decodes)
        return p.swap_round_trip_s < (p.recompute_riding_s if riding else p.recompute_s)

    if not swap_wins(hi):
        return hi + 1
    if swap_wins(1):
        return 1
    return smallest_true(swap_wins, 2, hi - 1)  # not swap_wins(1), swap_wins(hi)
