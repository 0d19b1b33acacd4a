"""The boxes between an API call and a GPU, and the sizing chain that puts numbers on them (N056).

* :data:`BOXES`: seven boxes, each with its one job, its one characteristic failure and the quantity
  that sizes it.
* :func:`request_rate`: the request rate ``concurrent users`` make, by Little's law on a user's
  cycle: a user is either waiting for an answer (``response_s``) or thinking (``think_s``), so
  ``rate = users / (think_s + response_s)`` (:func:`lib.scheduling.queueing.littles_law` with
  ``L = users``, ``W = think_s + response_s``). With ``think_s = 0`` every user always has a
  request in flight: the worst case a drawing that says "2,000 concurrent" sometimes means.
* :func:`queue_depth_for_ttft`: how many requests may wait for a replica's prefill ahead of a new
  one while its TTFT stays within a budget (prefills run one after another: ``k`` waiting ahead cost
  ``k x prefill_s``).
* :func:`sizing_chain`: users -> rate -> requests in flight -> replicas -> GPUs -> dollars. Every
  replica count and price comes from :mod:`lib.fleet.capacity` (``request_cost``, ``fleet_for_load``,
  ``gpu_hour_usd``): ``rate x replica_s / utilization``. The requests in flight per replica
  against the batch the TPOT target and KV pool allow (:attr:`SizingChain.slot_use`) says how full
  the decode batch actually runs: below 1 whenever a replica spends part of its time on prefill, so
  the decode slots never bind before the replica-seconds do in this model.

SI units: seconds, requests per second, tokens, bytes, US dollars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["BOXES", "Box", "SizingChain", "queue_depth_for_ttft", "request_rate", "sizing_chain"]


@dataclass(frozen=True)
class Box:
    """One box of the drawing: its name, its one job, its characteristic failure, and what sizes it."""

    name: str
    job: str
    failure: str
    sized_by: str


BOXES: tuple[Box, ...] = (
    Box("client stream", "holds the HTTP/SSE stream and delivers tokens as they are made",
        "a client that disconnects or reads slowly keeps its sequence decoding and its KV held",
        "open streams = requests in flight (Little's law)"),
    Box("API gateway", "authenticates, meters and rate-limits tenants",
        "limits counted in requests while cost is in tokens: one long-prompt tenant starves the rest",
        "requests/s and prompt + output tokens/s"),
    Box("router", "picks a replica for each request (least outstanding tokens, prefix affinity)",
        "round-robin over unequal requests or stale load signals: one replica queues while others idle",
        "the replica count it spreads over"),
    Box("admission queue", "holds requests a replica cannot start yet, and sheds (429) past a bound",
        "an unbounded queue: under overload every request waits and TTFT grows without limit",
        "the depth a TTFT budget allows: budget / prefill time"),
    Box("engine scheduler", "forms each step's batch (continuous batching, chunked prefill)",
        "KV pool full: preemption and recompute thrash, or a long prefill that stalls every decode",
        "the batch the TPOT target and the KV pool allow"),
    Box("model executor", "runs the forward pass across the replica's tensor-parallel GPUs",
        "one rank slow or hung stalls the whole group at its next collective",
        "GPUs per replica, prefill time (the TTFT floor) and the decode step"),
    Box("GPU memory", "holds the weights and every running sequence's KV cache",
        "a context longer than planned: out of KV, preemptions, or an out-of-memory crash",
        "weights per GPU, KV bytes per sequence, sequences the pool holds"),
)


def request_rate(users: float, think_s: float, response_s: float) -> float:
    """Requests/s that ``users`` closed-loop users make: Little's law on the user cycle,
    ``users / (think_s + response_s)``."""
    from lib.scheduling.queueing import littles_law

    n = real("users", users, 0, low_open=True, unit="users")
    z = real("think_s", think_s, 0, unit="seconds")
    w = real("response_s", response_s, 0, low_open=True, unit="seconds")
    return littles_law(L=n, W=z + w)


def queue_depth_for_ttft(prefill_s: float, ttft_budget_s: float) -> int:
    """Requests that may wait ahead of a new one on a replica with its TTFT still within
    ``ttft_budget_s``: ``floor(budget / prefill_s) - 1`` (its own prefill takes one slot);
    -1 when even an empty queue misses the budget."""
    p = real("prefill_s", prefill_s, 0, low_open=True, unit="seconds")
    b = real("ttft_budget_s", ttft_budget_s, 0, low_open=True, unit="seconds")
    return math.floor(b / p + 1e-9) - 1


@dataclass(frozen=True)
class SizingChain:
    """The chain users -> rate -> in flight -> replicas -> GPUs -> dollars (module doc)."""

    users: float
    think_s: float
    cost: object  # lib.fleet.capacity.RequestCost
    response_s: float  # one request's time in the system with no queue: prefill + O x decode step
    rate: float  # requests/s
    in_flight: float  # requests in the system (Little's law: rate x response_s)
    fleet: object  # lib.fleet.capacity.FleetSize by replica-seconds
    usd_per_gpu_hour: float
    ttft_budget_s: float
    queue_depth: int  # per replica, from the TTFT budget

    @property
    def replicas(self) -> int:
        """Whole replicas (:attr:`lib.fleet.capacity.FleetSize.replicas`)."""
        return self.fleet.replicas

    @property
    def gpus(self) -> int:
        """replicas x GPUs per replica."""
        return self.replicas * self.cost.dep.gpus_per_replica

    @property
    def usd_per_hour(self) -> float:
        """GPUs x the chip's price per GPU-hour."""
        return self.gpus * self.usd_per_gpu_hour

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens/s the gateway admits: rate x P."""
        return self.rate * self.cost.prompt_len

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens/s the streams carry: rate x O."""
        return self.rate * self.cost.output_len

    @property
    def per_replica_rate(self) -> float:
        """Requests/s each whole replica takes."""
        return self.rate / self.replicas

    @property
    def per_replica_in_flight(self) -> float:
        """Requests in flight per whole replica (compare with the batch it may run)."""
        return self.in_flight / self.replicas

    @property
    def slot_use(self) -> float:
        """Requests in flight per replica / the batch the TPOT target and KV pool allow."""
        return self.per_replica_in_flight / self.cost.batch


def sizing_chain(dep, users: float, think_s: float, prompt_len: int, output_len: int, tpot_target_s: float,
                 ttft_budget_s: float, utilization: float | None = None,
                 usd_per_gpu_hour: float | None = None) -> SizingChain:
    """Users to replicas for one deployment (module doc). ``utilization`` None: the planned ceiling
    (:func:`lib.fleet.capacity.default_utilization`); the price is the chip's
    (:func:`lib.fleet.capacity.gpu_hour_usd`) unless ``usd_per_gpu_hour`` is given."""
    from lib.fleet.capacity import fleet_for_load, gpu_hour_usd, request_cost
    from lib.scheduling.queueing import littles_law

    integer("prompt_len", prompt_len, 1, unit="tokens")
    integer("output_len", output_len, 1, unit="tokens")
    cost = request_cost(dep, prompt_len, output_len, tpot_target_s)
    response = cost.prefill_s + cost.output_len * cost.decode_step_s
    rate = request_rate(users, think_s, response)
    in_flight = littles_law(arrival_rate=rate, W=response)
    fleet = fleet_for_load(rate, cost, utilization)
    return SizingChain(float(users), float(think_s), cost, response, rate, in_flight, fleet,
                       gpu_hour_usd(cost.dep.chip, usd_per_gpu_hour), float(ttft_budget_s),
                       queue_depth_for_ttft(cost.prefill_s, ttft_budget_s))
