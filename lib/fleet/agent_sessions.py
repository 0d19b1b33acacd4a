"""An agent session platform: the session state machine, KV across tool calls, sandboxes, checkpoints (N065).

A session alternates a model step (prefill the tool's result, decode a short tool call) with a tool
call that runs ``tool_s`` seconds in the session's sandbox, ``steps`` times; the context grows by the
step's new tokens each time. Across each tool call the session's KV can be

* **held** in HBM: it occupies ``context / token_capacity`` of the replica's KV pool for the tool's
  duration, which (when the KV pool is what limits the batch) is that share of a replica:
  ``hold = context / capacity x tool_s`` replica-seconds;
* **offloaded** to host DRAM and fetched back: :func:`lib.kvcache.recompute_fetch.fetch_time_s` over
  the ``host_dram`` tier (a DMA that occupies no compute; it adds its time to the next step);
* **dropped** and recomputed: :func:`lib.kvcache.recompute_fetch.recompute_time_s` of the context with
  the new tokens riding in the same pass (a whole replica for that time).

Holding beats recomputing for tool calls shorter than ``recompute_s x capacity / context``
(:func:`hold_breakeven_tool_s`). :func:`session_kv_costs` sums the three over a whole session and
:func:`simulate_session` replays it step by step (the independent check). :data:`TRANSITIONS` is the
session state machine; :func:`warm_pool` sizes pre-started sandboxes by Little's law;
:func:`lost_work_s` is the expected work a crash loses with a checkpoint per step or none.

SI units: seconds, bytes, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["STATES", "TRANSITIONS", "KvAcrossTool", "SessionShape", "hold_breakeven_tool_s", "kv_across_tool",
           "lost_work_s", "session_kv_costs", "simulate_session", "warm_pool"]

STATES = ("created", "starting", "thinking", "tool_running", "suspended", "resuming", "done", "failed")
TRANSITIONS = {
    "created": ("starting", "failed"),
    "starting": ("thinking", "failed"),  # sandbox ready (cold start or taken from the warm pool)
    "thinking": ("tool_running", "done", "failed"),  # the model emitted a tool call, or the answer
    "tool_running": ("thinking", "suspended", "failed"),  # the tool returned; or the session went idle
    "suspended": ("resuming", "failed"),  # KV offloaded or dropped, sandbox snapshotted
    "resuming": ("thinking", "failed"),  # sandbox restored, KV fetched or recomputed
    "done": (),
    "failed": (),
}


@dataclass(frozen=True)
class SessionShape:
    """A session: ``steps`` of (prefill ``new_tokens``, decode ``output_tokens``, run a tool ``tool_s``),
    starting from a ``system_tokens`` prompt."""

    steps: int
    system_tokens: int
    new_tokens: int
    output_tokens: int
    tool_s: float

    def context_at(self, k: int) -> int:
        """Context when tool call k (from 0) starts: system + (k + 1) x (new + output)."""
        return self.system_tokens + (k + 1) * (self.new_tokens + self.output_tokens)


@dataclass(frozen=True)
class KvAcrossTool:
    """One tool call at ``context`` tokens: the replica-seconds and added latency of each option."""

    context: int
    kv_bytes: float
    pool_share: float  # context / token_capacity
    hold_replica_s: float
    recompute_s: float
    fetch_s: float  # host DRAM -> HBM

    @property
    def cheapest(self) -> str:
        costs = {"hold in HBM": self.hold_replica_s, "recompute": self.recompute_s, "offload to host DRAM": 0.0}
        return min(costs, key=costs.get)


def kv_across_tool(dep, context: int, new_tokens: int, tool_s: float) -> KvAcrossTool:
    """The three options for one tool call of ``tool_s`` seconds at ``context`` tokens (module doc)."""
    from lib.kvcache.recompute_fetch import fetch_time_s, recompute_time_s, storage_tier
    from lib.perf.memory import kv_bytes_per_sequence

    c = dep.mdl.check_context(integer("context", context, 1) + integer("new_tokens", new_tokens, 0),
                              "context + new_tokens") - new_tokens
    t = real("tool_s", tool_s, 0, unit="s")
    cap = dep.budget.token_capacity
    if c > cap:
        raise ValueError(f"context = {c:,} tokens exceeds the {cap:,.0f}-token KV pool of {dep.label}")
    share = c / cap
    return KvAcrossTool(c, kv_bytes_per_sequence(dep.mdl, c, dep.kv_dtype), share, share * t,
                        recompute_time_s(dep, c, suffix_len=new_tokens),
                        fetch_time_s(dep.mdl, c, storage_tier("host_dram", dep.chip), tp=dep.tp, kv_dtype=dep.kv_dtype))


def hold_breakeven_tool_s(dep, context: int, new_tokens: int) -> float:
    """Tool duration below which holding the KV in HBM costs fewer replica-seconds than recomputing
    it: recompute_s x token_capacity / context."""
    k = kv_across_tool(dep, context, new_tokens, 0.0)
    return k.recompute_s / k.pool_share


def session_kv_costs(dep, shape: SessionShape) -> dict:
    """Replica-seconds over the whole session for each option, and the latency they add, by closed
    sums over the tool calls (every step but the last ends in a tool call)."""
    hold = recompute = fetch = 0.0
    for k in range(shape.steps - 1):
        x = kv_across_tool(dep, shape.context_at(k), shape.new_tokens, shape.tool_s)
        hold += x.hold_replica_s
        recompute += x.recompute_s
        fetch += x.fetch_s
    return {"hold_replica_s": hold, "recompute_replica_s": recompute, "offload_added_s": fetch,
            "recompute_added_s": recompute}


def simulate_session(dep, shape: SessionShape, policy: str) -> dict:
    """Replay a session step by step under ``policy`` ("hold", "recompute", "offload"): a clock, the
    KV tokens resident in HBM sampled each second of every tool call, and the replica time spent on
    recompute. Returns replica-seconds charged and seconds added to the session."""
    if policy not in ("hold", "recompute", "offload"):
        raise ValueError(f"policy must be 'hold', 'recompute' or 'offload', got {policy!r}")
    from lib.kvcache.recompute_fetch import fetch_time_s, recompute_time_s, storage_tier

    cap = dep.budget.token_capacity
    tier = storage_tier("host_dram", dep.chip)
    resident = shape.system_tokens
    charged = added = 0.0
    for k in range(shape.steps):
        resident += shape.new_tokens + shape.output_tokens  # the step's prefill and decode
        if k == shape.steps - 1:
            break
        if policy == "hold":  # integrate the pool share held over the tool call, one slice per second
            n = max(1, int(shape.tool_s))
            charged += sum(resident / cap * (shape.tool_s / n) for _ in range(n))
        elif policy == "recompute":
            cost = recompute_time_s(dep, resident, suffix_len=shape.new_tokens)
            charged += cost
            added += cost
        else:
            added += fetch_time_s(dep.mdl, resident, tier, tp=dep.tp, kv_dtype=dep.kv_dtype)
    return {"replica_s": charged, "added_s": added, "final_context": resident}


def warm_pool(start_rate: float, cold_start_s: float, quantile: float = 0.999) -> dict:
    """Sandboxes to keep pre-started so a session almost never waits for a cold start. Sessions
    arriving as a Poisson stream keep on average start_rate x cold_start_s sandboxes starting (Little's
    law); the pool is the ``quantile`` of that Poisson count, the smallest n with P(N <= n) >= quantile
    (summed exactly in log space around the mean)."""
    import math

    lam = real("start_rate", start_rate, 0, low_open=True, unit="sessions/s")
    s = real("cold_start_s", cold_start_s, 0, low_open=True, unit="s")
    q = real("quantile", quantile, 0, 1, low_open=True, high_open=True)
    mean = lam * s
    lo = max(0, int(mean - 12 * math.sqrt(mean) - 12))  # below this the mass is negligible (< 1e-30)
    cdf, n = 0.0, lo
    while True:
        cdf += math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
        if cdf >= q:
            return {"mean_starting": mean, "pool": n}
        n += 1


def lost_work_s(step_s: float, steps: int, checkpoint_each_step: bool) -> float:
    """Expected work a crash at a uniform time loses: half a step with a checkpoint after every step,
    half the session without one."""
    s = real("step_s", step_s, 0, low_open=True, unit="s")
    n = integer("steps", steps, 1)
    return s / 2 if checkpoint_each_step else n * s / 2
