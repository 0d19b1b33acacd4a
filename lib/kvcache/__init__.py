"""KV-cache reference implementations: paged block allocator, prefix caches, eviction studies.

* :mod:`.allocator`: paged block allocator with refcounts and copy-on-write (vLLM-style).
* :mod:`.defective`: a deliberately broken allocator, ownership/content oracles, and a
  hypothesis-driven search that shrinks a failing operation sequence.
* :mod:`.radix`: radix-tree prefix cache with pinning and LRU leaf eviction (SGLang-style).
* :mod:`.chained_hash`: block prefix caching by chained hashes, verified on hit (vLLM APC-style).
* :mod:`.eviction`: head-first vs tail-first eviction and the bytes it strands.
* :mod:`.workloads`: seeded multi-turn chat and branching agent traces.
* :mod:`.paged_waste`: paged-KV waste and block size; :mod:`.block_sharing`: sharing counts and
  copy-on-write replays; :mod:`.allocator_grading`: the allocator grader and its oracles.
* :mod:`.recompute_fetch`: recompute a prefix (lib.perf.prefill.prefill_time) or fetch its KV
  from a storage tier: the one home of the break-even; :mod:`.tiering`: HBM/DRAM/SSD tiers, wear.
* :mod:`.prefix_hits`: prefix-cache hit rates on traces and the prefill they save.
* :mod:`.radix_scenarios`: radix-tree rendering, scripted scenarios, oracle, defective caches.
* :mod:`.block_hash`: block-hash cache tools: provenance oracle, weak hashes, collisions.
* :mod:`.long_context`: where a long-context replica breaks (capacity, TTFT, scheduler), chunk steps.
* Practice graders (any implementation through a factory, with predictive models as oracles):
  :mod:`.allocator_practice` (paged allocator, copy-on-write sharing, the defect hunt's fix),
  :mod:`.radix_practice` (radix prefix cache, hit counter), :mod:`.block_hash_practice`
  (chained-hash block cache).

Importing this package pulls in numpy only; hypothesis is imported lazily by
:func:`find_minimal_failure`.
"""

from .allocator import BlockAllocator, CopyEvent, NaiveCowAllocator, OutOfBlocks
from .chained_hash import CacheAllocation, PrefixBlockCache, chain_hashes, hash_block
from .defective import (
    DefectiveAllocator,
    Op,
    content_oracle,
    find_minimal_failure,
    first_violation,
    ownership_oracle,
)
from .eviction import (
    EvictionSimulation,
    PrefixWorkload,
    SteadyState,
    cyclic_prefix_workload,
    cyclic_steady_state,
    shared_prefix_workload,
    simulate,
)
from .radix import OutOfSlots, PrefixMatch, RadixCache, RadixNode
from .workloads import branching_agent_trace, multi_turn_chat_trace

__all__ = [
    "BlockAllocator",
    "CacheAllocation",
    "CopyEvent",
    "DefectiveAllocator",
    "EvictionSimulation",
    "NaiveCowAllocator",
    "Op",
    "OutOfBlocks",
    "OutOfSlots",
    "PrefixBlockCache",
    "PrefixMatch",
    "PrefixWorkload",
    "RadixCache",
    "RadixNode",
    "SteadyState",
    "branching_agent_trace",
    "chain_hashes",
    "content_oracle",
    "cyclic_prefix_workload",
    "cyclic_steady_state",
    "find_minimal_failure",
    "first_violation",
    "hash_block",
    "multi_turn_chat_trace",
    "ownership_oracle",
    "shared_prefix_workload",
    "simulate",
]
