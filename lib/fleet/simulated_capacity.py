"""A replica's capacity measured in the serving simulator: the independent method the sizing pages
check :func:`lib.fleet.capacity.request_cost` against.

* :func:`saturated_rate`: requests/s one replica completes while requests always wait, read off the
  continuous-batching simulator (:func:`lib.scheduling.replica.steady_run`, chunked prefill, steps
  priced by :func:`lib.scheduling.cost.step_cost`). Poisson arrivals at ``OVERLOAD / replica_s``
  keep the queue growing; the engine runs at most ``cost.batch`` sequences (the batch the sizing
  allowed); rate = output tokens/s over the measured window / ``O``.
* :func:`simulated_bounds`: what those runs allow the model's replica-seconds, in each direction.

The capacity model is phase-separated: each prompt pays its own pass over the weights, while the
simulator folds prompt chunks into decode steps that read the weights anyway. Two bounds follow,
each one-sided in its known direction (a symmetric band would hide which way the model errs):

* **below**: the simulator completes at least ``(1 - SIM_BELOW_MODEL) / replica_s``. Mostly it
  completes 1-1.1x the model's rate (dense models, prompts of 200+ tokens; up to 1.3x with prompts
  of a few dozen tokens, 1.7-2.3x for Mixtral 8x7B with 50-200 token prompts), but with decode
  batches of several hundred sequences and 200-400 token prompts it completes up to 6.5% less
  (Llama 3.1 8B on an H100, 200-token prompts, batch 724: 0.936x, the same over seeds), and one run's
  window reads +-3% (:data:`SIM_BELOW_MODEL` = 8%). The model's replica count is therefore at least
  the simulator's less 8%: never more optimistic than that.
* **above**: no engine completes requests faster than it decodes them at the batch, so the
  simulator completes at most ``(1 + WINDOW_NOISE) / decode_s``: the model's decode replica-seconds
  may not exceed the simulator's whole replica-seconds per request. This bound is structural (it
  holds for any model and prompt length); it says nothing of the prefill, whose own checks are its
  FLOP count and the prefill model's anchors.

A run arriving at ``OVERLOAD x max_rate`` saturates the replica whenever the simulator completes
less than that; where it completes more, the run reads the arrival rate, which only loosens both
bounds (the true rate is higher still).

The simulator has no prefix cache: it prefills the whole ``cost.prompt_len``. For a request whose
prompt is partly cached, :func:`simulated_bounds` runs it twice, once with the whole prompt (more work
than the warm request) and once with only the uncached tokens (less work: no cached keys attended to
or read); the lower bound uses the second, the upper the first.

SI units: requests per second, seconds, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer

__all__ = ["OVERLOAD", "SIM_BELOW_MODEL", "WINDOW_NOISE", "SimulatedBounds", "saturated_rate", "simulated_bounds"]

WINDOW_NOISE = 0.03  # one run's spread over seeds (a window of about 2.7 turnovers of the batch)
SIM_BELOW_MODEL = 0.08  # the most a run may read below 1 / replica_s: 6.5% measured (module doc) + the window noise
OVERLOAD = 1.5  # arrivals per second / max_rate in a saturated run


def saturated_rate(cost, *, seed: int = 0) -> float:
    """Requests/s one replica of ``cost.dep`` completes when saturated, in the simulator (module doc).

    Arrivals: Poisson at ``OVERLOAD x cost.max_rate``; prompts of ``cost.prompt_len`` (cold); outputs
    uniform in ``O +- O/2`` (constant outputs finish in synchronized waves that make a window noisy; the
    spread stays within the model's position limit); ``max(150, 2 B)`` warm-up requests, then
    ``max(300, 4 B)`` measured ones (about 2.7 turnovers of the batch ``B``: the run's cost grows with
    ``O``, not with ``B``). Returns output tokens/s in the window / O."""
    from lib.fleet.capacity import RequestCost
    from lib.scheduling.cost import step_cost
    from lib.scheduling.policies import Policy
    from lib.scheduling.replica import steady_run
    from lib.scheduling.workloads import Constant, Uniform

    if not isinstance(cost, RequestCost):
        raise ValueError(f"cost must be a RequestCost (lib.fleet.capacity.request_cost), got {type(cost).__name__}")
    o, b = cost.output_len, cost.batch
    room = cost.dep.mdl.max_position_embeddings - cost.prompt_len - o
    spread = max(0, min(o // 2, room))
    outputs = Constant(o) if spread == 0 else Uniform(o - spread, o + spread)
    run = steady_run(step_cost(cost.dep), Constant(cost.prompt_len), outputs, OVERLOAD * cost.max_rate,
                     policy=Policy(max_running=b), n_measured=max(300, 4 * b), n_warmup=max(150, 2 * b),
                     n_cooldown=max(50, b // 4), seed=integer("seed", seed, 0))
    return run.tokens_per_s / o


@dataclass(frozen=True)
class SimulatedBounds:
    """What the simulator allows the capacity model of one request (:func:`simulated_bounds`).

    ``cold_rate``: saturated requests/s with the whole prompt prefilled (at least the warm request's
    work); ``short_rate``: with only the ``P - h`` uncached tokens as the prompt (at most its work: no
    cached keys attended to in prefill or read in decode); equal when nothing is cached."""

    cold_rate: float
    short_rate: float

    @property
    def low_s(self) -> float:
        """Fewest replica-seconds per request the model may charge: (1 - SIM_BELOW_MODEL) / short_rate."""
        return (1 - SIM_BELOW_MODEL) / self.short_rate

    @property
    def decode_high_s(self) -> float:
        """Most decode replica-seconds per request the model may charge: (1 + WINDOW_NOISE) / cold_rate."""
        return (1 + WINDOW_NOISE) / self.cold_rate

    def holds(self, cost) -> bool:
        """``cost.replica_s >= low_s`` and ``cost.decode_s <= decode_high_s`` (module doc)."""
        from lib.fleet.capacity import RequestCost

        if not isinstance(cost, RequestCost):
            raise ValueError(f"cost must be a RequestCost (lib.fleet.capacity.request_cost), got {type(cost).__name__}")
        return self.low_s <= cost.replica_s and cost.decode_s <= self.decode_high_s


def simulated_bounds(cost, cached_len: int = 0, *, seed: int = 0) -> SimulatedBounds:
    """The bounds the simulator puts on ``cost`` (a request whose first ``cached_len`` prompt tokens a
    prefix cache holds), from at most two saturated runs at ``cost.batch`` (:func:`saturated_rate`): the
    whole prompt prefilled, and only its uncached tokens; with ``cached_len = 0`` one run gives both."""
    from lib.fleet.capacity import RequestCost, request_cost

    if not isinstance(cost, RequestCost):
        raise ValueError(f"cost must be a RequestCost (lib.fleet.capacity.request_cost), got {type(cost).__name__}")
    h = integer("cached_len", cached_len, 0, cost.prompt_len - 1, unit="tokens")
    cold = saturated_rate(request_cost(cost.dep, cost.prompt_len, cost.output_len, batch=cost.batch), seed=seed)
    short = cold if h == 0 else saturated_rate(request_cost(cost.dep, cost.prompt_len - h, cost.output_len,
                                                            batch=cost.batch), seed=seed)
    return SimulatedBounds(cold, short)
