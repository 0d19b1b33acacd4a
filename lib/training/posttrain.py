"""Post-training cost: RL with a rollout engine (actor / learner split) and DPO without one.

RL (PPO / GRPO, on-policy): every step the actors *generate* rollouts (a decode workload, priced
by the book's decode step :func:`lib.perf.step.decode_step` through :mod:`lib.perf.throughput`
and :func:`lib.perf.prefill.prefill_time`), the learner *trains* on them (a training workload,
:func:`lib.training.step.training_step`), and the new weights go back to every actor replica
(:func:`lib.perf.collectives.collective`). Synchronous on-policy training runs the three in
sequence, so each pool idles while the other works.

* Generation: ``prompts x group`` rollouts with long-tailed response lengths (exponential at
  evenly spaced quantiles, capped; deterministic), spread over the actor replicas. Each replica
  batches continuously up to the sequences its KV pool holds at prompt + the longest response;
  its decode-step time at the batch then running is integrated over the decode steps until its
  last sequence ends (the batch decays in the tail while the other GPUs of the step wait).
* Weight sync: each actor GPU needs its TP shard (weights / actor TP); a pipelined broadcast
  moves every byte once over each receiving GPU's NIC, the bytes of a ring all-gather of the
  shard over the replicas plus the learner (one rank per node).
* The learner trains on every prompt + response token, packed into ``seq_len`` sequences.

DPO: a policy plus a frozen reference and a fixed set of (prompt, chosen, rejected) pairs. Per pair
the policy runs forward and backward on both responses, the reference forward only; precomputing
the reference log-probabilities once over the dataset removes the reference from the training
loop (its weights from memory, its forwards from every epoch) at the cost of one forward pass.

SI units: seconds, bytes, FLOP, tokens.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.registry.models import Model, model
from lib.training import flops

__all__ = ["DPOCost", "RLStep", "dpo_cost", "generation_s", "reference_precompute_s", "response_lengths", "rl_step",
           "weight_sync_s"]


def response_lengths(n: int, mean: float, cap: int) -> np.ndarray:
    """``n`` response lengths (tokens, integers >= 1): an exponential distribution of mean
    ``mean`` at the quantiles (i + 0.5) / n, capped at ``cap`` (so the realised mean is a little
    lower). Deterministic: the same inputs give the same lengths."""
    n = integer("n", n, 1)
    mean = real("mean", mean, 1, unit="tokens")
    cap = integer("cap", cap, 1, unit="tokens")
    q = (np.arange(n) + 0.5) / n
    return np.clip(np.ceil(-mean * np.log1p(-q)), 1, cap).astype(int)


def _slot_loads(lengths: np.ndarray, slots: int) -> np.ndarray:
    """Decode steps each of ``slots`` KV slots is busy: the sequences assigned longest first to
    the slot that frees up first (continuous batching; LPT list scheduling)."""
    loads = np.zeros(slots)
    for x in np.sort(lengths)[::-1]:
        i = int(np.argmin(loads))
        loads[i] += x
    return loads


@functools.lru_cache(maxsize=4096)
def _step_at(dep, batch: int, context: int) -> float:
    from lib.perf.throughput import step_s_at

    return step_s_at(dep, float(batch), context)


def generation_s(dep, prompt_len: int, lengths: np.ndarray, prompts: int | None = None,
                 grid: int = 96) -> tuple[float, float, float]:
    """One actor replica generating ``lengths`` (one response each) after ``prompt_len``-token
    prompts: (seconds, mean batch, KV slots). Slots = the sequences the KV pool holds at
    prompt + the longest response (at most the rollouts); batch(t) = slots still busy at decode
    step t; time = prefill of ``prompts`` distinct prompts (default: one per rollout; GRPO's group
    shares one) + the integral over t of the decode step at batch(t) and the mean context (prompt +
    half the mean response, to 64 tokens), the step taken at six batches and linear between them."""
    from lib.perf.prefill import prefill_time
    from lib.perf.throughput import kv_batch_ceiling

    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.min() < 1:
        raise ValueError("lengths must be a non-empty list of response lengths >= 1 token")
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    longest = int(lengths.max())
    ctx_max = p + longest
    dep.mdl.check_context(ctx_max)
    cap = kv_batch_ceiling(dep, ctx_max)
    if cap < 1:
        raise ValueError(f"{dep.label} cannot hold one sequence of {ctx_max:,} tokens in its KV pool")
    slots = int(min(math.floor(cap), lengths.size))
    loads = np.sort(_slot_loads(lengths, slots))
    total = float(loads[-1])
    # integrate on a grid of decode steps: batch(t) = slots with load > t
    edges = np.linspace(0.0, total, grid + 1)
    mid = (edges[:-1] + edges[1:]) / 2
    batch = slots - np.searchsorted(loads, mid, side="right")
    ctx = 64 * max(1, round((p + float(lengths.mean()) / 2) / 64))  # the mean context, to 64 tokens
    # the decode step at six batches, linear between them (the step model is piecewise linear in the batch)
    anchors = sorted({1, max(1, slots // 8), max(1, slots // 4), max(1, slots // 2), max(1, 3 * slots // 4), slots})
    steps = np.interp(np.maximum(batch, 1), anchors, [_step_at(dep, b, ctx) for b in anchors])
    decode = float(np.sum(steps * np.diff(edges)))
    n_prompts = lengths.size if prompts is None else integer("prompts", prompts, 1)
    prefill = prefill_time(dep, p, n_prompts).time_s
    mean_batch = float(lengths.sum()) / total
    return decode + prefill, mean_batch, float(slots)


def weight_sync_s(mdl: str | Model, chip, actor_tp: int, actor_replicas: int, dtype: str = "bf16") -> float:
    """Seconds to push new weights (``dtype``) from the learner to ``actor_replicas`` replicas of
    ``actor_tp`` GPUs, every GPU on its own NIC: a ring all-gather of one TP shard
    (weights / actor_tp) over the replicas + the learner, one rank per node
    (:func:`lib.perf.collectives.collective`); the shards travel in parallel."""
    from lib.perf.collectives import collective

    m = model(mdl)
    tp = integer("actor_tp", actor_tp, 1)
    r = integer("actor_replicas", actor_replicas, 1)
    shard = m.weight_bytes(dtype) / tp
    return collective("all_gather", shard, r + 1, chip, nodes_gpus=1).time_s


@dataclass(frozen=True)
class RLStep:
    """One synchronous on-policy RL step (seconds) and what each pool does in it."""

    generation_s: float
    sync_s: float
    train_s: float
    actor_gpus: int
    learner_gpus: int
    tokens_generated: float
    tokens_trained: float
    mean_batch: float  # mean decode batch per actor replica over its generation
    slots: float  # KV slots per actor replica
    generated_flops_per_token: float  # 2N + attention, one forward
    trained_flops_per_token: float  # 6N + attention, forward + backward
    learner_mfu: float
    learner: object = None  # the learner's TrainingStep (its layout and buckets)
    lengths: object = None  # every rollout's response length (tokens)

    @property
    def step_s(self) -> float:
        """Synchronous on-policy: generate, then sync, then train."""
        return self.generation_s + self.sync_s + self.train_s

    @property
    def actor_gpu_s_per_token(self) -> float:
        return self.actor_gpus * self.generation_s / self.tokens_generated

    @property
    def learner_gpu_s_per_token(self) -> float:
        return self.learner_gpus * self.train_s / self.tokens_trained

    @property
    def balanced_ratio(self) -> float:
        """Actor GPUs per learner GPU at which both pools take the same time per step: actor
        GPU-seconds per step / learner GPU-seconds per step."""
        return self.actor_gpus * self.generation_s / (self.learner_gpus * self.train_s)

    @property
    def idle_fraction(self) -> float:
        """GPU-time of the step during which a GPU waits for the other pool or the sync."""
        total = (self.actor_gpus + self.learner_gpus) * self.step_s
        busy = self.actor_gpus * self.generation_s + self.learner_gpus * self.train_s
        return 1.0 - busy / total

    @property
    def async_step_s(self) -> float:
        """One-step-stale (asynchronous) pipeline: the pools overlap; the step is the slower one."""
        return max(self.generation_s, self.train_s + self.sync_s)


def rl_step(mdl: str, gpu: str, actor_tp: int, actor_replicas: int, learner_tp: int, learner_pp: int,
            learner_dp: int, prompts: int, group: int, prompt_len: int, response_mean: float, response_cap: int,
            seq_len: int = 8192, weight_dtype: str = "bf16") -> RLStep:
    """Price one on-policy RL step: ``prompts x group`` rollouts split evenly over the actor
    replicas (:func:`generation_s`), the weight sync (:func:`weight_sync_s`) and a learner step on
    every prompt + response token packed into ``seq_len`` sequences
    (:func:`lib.training.step.training_step`, ZeRO-1). Refuses a learner that does not fit."""
    from lib.perf.deployment import deployment
    from lib.training.step import TrainingLayout, training_memory, training_step

    m = model(mdl)
    r = integer("actor_replicas", actor_replicas, 1)
    n = integer("prompts", prompts, 1) * integer("group", group, 1)
    if n < r:
        raise ValueError(f"{n:,} rollouts cannot keep {r} actor replicas busy: raise prompts x group or lower replicas")
    dep = deployment(m, gpu, tp=actor_tp, weight_dtype=weight_dtype)
    lengths = response_lengths(n, response_mean, response_cap)
    # round-robin over the lengths sorted longest first: replica 0 gets the longest of every round,
    # the most work, and the step waits for it
    first = np.sort(lengths)[::-1][0::r]
    gen, mean_batch, slots = generation_s(dep, prompt_len, first, prompts=math.ceil(prompts / r))
    tokens_trained = float(n * prompt_len + lengths.sum())
    seqs = math.ceil(tokens_trained / seq_len)
    mb = max(1, math.ceil(seqs / learner_dp))
    lay = TrainingLayout(m, gpu, tp=learner_tp, pp=learner_pp, dp=learner_dp, seq_len=seq_len, micro_batches=mb,
                         zero_stage=1)
    mem = training_memory(lay)
    if mem["headroom"] < 0:
        raise ValueError(f"the learner {lay.label} needs {mem['total'] / 1e9:.1f} GB per GPU, more than the "
                         f"{mem['capacity'] / 1e9:.1f} GB visible: raise its tp, pp or dp")
    st = training_step(lay)
    # the learner's step trains mb x dp x seq_len tokens (the padding of the last sequence included)
    train = st.step_s
    sync = weight_sync_s(m, gpu, actor_tp, r, weight_dtype)
    ctx = int(round(prompt_len + float(lengths.mean()) / 2))
    return RLStep(gen, sync, train, actor_tp * r, lay.n_gpus, float(lengths.sum()), tokens_trained, mean_batch, slots,
                  m.flops_per_token(ctx), flops.model_flops_per_token(m, seq_len), st.mfu, st, lengths)


@dataclass(frozen=True)
class DPOCost:
    """DPO on a layout, per preference pair and per GPU (see :func:`dpo_cost`)."""

    policy_flops: float  # per pair: forward + backward on chosen and rejected
    reference_flops: float  # per pair: forward on chosen and rejected
    tokens: int  # per pair: tokens the policy trains on (the prompt counted once per response)
    state_bytes: float  # per GPU: weights, gradients, master, optimizer (training_memory)
    activation_bytes: float
    reference_bytes: float  # per GPU: the frozen reference's weights, sharded like the policy's
    capacity: float
    pairs_per_step: int
    policy_step_s: float  # the policy's training step (training_step)
    reference_step_s: float  # the reference's forward over the same step's pairs
    n_gpus: int
    mfu: float  # of the policy step alone

    @property
    def flops_in_loop(self) -> float:
        """FLOPs per pair with the reference in the loop."""
        return self.policy_flops + self.reference_flops

    @property
    def reference_share(self) -> float:
        return self.reference_flops / self.flops_in_loop

    @property
    def memory_in_loop(self) -> float:
        return self.state_bytes + self.activation_bytes + self.reference_bytes

    @property
    def memory_precomputed(self) -> float:
        return self.state_bytes + self.activation_bytes

    @property
    def step_in_loop_s(self) -> float:
        return self.policy_step_s + self.reference_step_s

    def epoch_s(self, pairs: int, reference_in_loop: bool = True) -> float:
        """Seconds for one pass over ``pairs`` pairs (whole steps)."""
        steps = math.ceil(integer("pairs", pairs, 1) / self.pairs_per_step)
        return steps * (self.step_in_loop_s if reference_in_loop else self.policy_step_s)


def dpo_cost(mdl: str, gpu: str, prompt_len: int, response_len: int, tp: int = 8, pp: int = 1, dp: int = 8,
             zero_stage: int = 1, micro_batches: int = 8, weight_dtype: str = "bf16") -> DPOCost:
    """DPO's cost on a layout where a micro-batch is one (prompt, chosen, rejected) pair, two
    sequences of ``prompt_len + response_len`` tokens:

    * FLOPs per pair: the policy's training FLOPs on both sequences
      (:func:`lib.training.flops.model_flops_per_token`, 3 x forward), the reference's forward
      (one third of it);
    * time: the policy's step (:func:`lib.training.step.training_step`, ``dp x micro_batches``
      pairs) and the reference's forward over the same pairs: a third of the step's matmul and
      memory-bound kernel time (recompute left out), the forward's half of the exposed TP
      collectives and a third of the pipeline bubble (no backward, optimizer or gradient reduction);
    * memory per GPU: the policy's training state and activations
      (:func:`lib.training.step.training_memory`) and the reference's weights, sharded like the
      policy's (:func:`lib.training.state.state_bytes_per_gpu`; ZeRO-3 shards them over dp too)."""
    from lib.registry.dtypes import bytes_per_element
    from lib.training import state
    from lib.training.step import TrainingLayout, training_memory, training_step

    m = model(mdl)
    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    r = integer("response_len", response_len, 1, unit="tokens")
    seq = p + r
    per_token = flops.model_flops_per_token(m, seq)
    tokens = 2 * seq
    policy = per_token * tokens
    reference = policy / 3.0
    lay = TrainingLayout(m, gpu, tp=tp, pp=pp, dp=dp, seq_len=seq, micro_batch=2, micro_batches=micro_batches,
                         zero_stage=zero_stage)
    mem = training_memory(lay)
    act = mem["activations"]
    st_bytes = mem["total"] - act
    ref = state.state_bytes_per_gpu(m, tp, pp, dp, 3 if zero_stage == 3 else 0)["weights"]
    ref *= bytes_per_element(weight_dtype) / bytes_per_element("bf16")
    st = training_step(lay)
    useful = (st.matmul_s - st.recompute_s) / st.matmul_s  # recompute re-runs forwards a frozen model never needs
    ref_s = (st.matmul_s + st.nonmatmul_s) * useful / 3.0 + st.tp_exposed_s / 2.0 + st.bubble_s / 3.0
    return DPOCost(policy, reference, tokens, st_bytes, act, ref, mem["capacity"], dp * micro_batches, st.step_s,
                   ref_s, lay.n_gpus, st.mfu)


def reference_precompute_s(mdl: str, gpu: str, pairs: int, seq_len: int, tp: int = 8, replicas: int = 1,
                           batch: int = 16) -> float:
    """Seconds to compute the reference's log-probabilities of ``pairs`` pairs (two sequences of
    ``seq_len`` each) once, as prefill on ``replicas`` inference replicas of ``tp`` GPUs
    (:func:`lib.perf.prefill.prefill_time`, ``batch`` sequences a pass). What it stores is two
    numbers per pair: the summed log-probabilities of the chosen and the rejected response."""
    from lib.perf.deployment import deployment
    from lib.perf.prefill import prefill_time

    n = 2 * integer("pairs", pairs, 1)
    b = integer("batch", batch, 1)
    r = integer("replicas", replicas, 1)
    dep = deployment(mdl, gpu, tp=tp)
    passes = math.ceil(n / (b * r))
    return passes * prefill_time(dep, integer("seq_len", seq_len, 1, unit="tokens"), b).time_s
