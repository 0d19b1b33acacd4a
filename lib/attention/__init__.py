"""Attention as reference code (numpy, explicit accumulation dtype), each tested against torch:
naive, online softmax, tiled forward/backward, KV cache, split-KV decode, and the HBM-traffic model.

Modules (import them explicitly; this package imports none of them, and none imports torch):
:mod:`.naive` (masked SDPA, GQA, the fully-masked-row guard, dtype rounding), :mod:`.online_softmax`
(the streaming (m, l) recurrence and its read count), :mod:`.tiled` (FlashAttention-style forward,
log-sum-exp, causal tile map, the -inf - (-inf) NaN), :mod:`.backward` (recomputation from the LSE,
D = rowsum(dO * O), memory saved), :mod:`.kv_cache` (+ :mod:`.kv_cache_practice`), :mod:`.split_kv`
(flash-decoding LSE merge, occupancy; + :mod:`.split_kv_practice`), :mod:`.sdpa_practice` (the
grader for attention written from scratch), :mod:`.traffic` (HBM bytes of naive vs tiled attention,
with an L2 term) and :mod:`.softmax_traffic` (its score reads/writes per softmax kernel),
:mod:`.utilization` (exponentials vs tensor-core FLOPs: why FA2 stops short of peak, what FA3
hides), :mod:`.context_parallel` (a long prompt's prefill split over context-parallel groups). Shapes are (batch, heads, seq, head_dim) throughout.
"""
