"""Scheduler policies: how each step's batch is built, what is admitted, who is preempted.

A :class:`Policy` is a validated record of the choices an engine makes (vLLM's names in
brackets where they exist):

* ``batching``: ``"continuous"`` (finished sequences leave and queued ones join every step) or
  ``"static"`` (a batch is formed when the engine is free, runs until its longest member ends,
  and members that finish early keep their slot as padding).
* ``max_running`` [max_num_seqs] and ``token_budget`` [max_num_batched_tokens]: the sequences
  and tokens one step may hold; None takes the deployment's values from the cost.
* ``step_mix``: ``"decode_first"`` (every running decode gets its token, then prefill chunks
  fill what is left of the budget: Sarathi / vLLM V1) or ``"prefill_first"`` (a step that can
  prefill does only that and the decodes wait: vLLM V0 without chunked prefill).
* ``chunked_prefill`` [enable_chunked_prefill] and ``long_prefill_cap``
  [long_prefill_token_threshold]: whether a prompt may be split across steps, and the most
  prefill tokens one request gets per step.
* ``order``: ``"fcfs"`` (arrival) or ``"spf"`` (shortest prompt first: the half of the job
  length a server knows); ``use_priority``: order by class first (lower class = sooner).
* ``kv_share_cap``: {class: fraction} the most of the KV pool a class may hold.
* ``preemption``: ``"recompute"`` (free the victim's blocks; it re-prefills prompt + generated
  tokens) or ``"swap"`` (copy its blocks to host memory over the host link and back; a
  victim still prefilling has generated nothing and is recomputed); ``swap_space_blocks``
  bounds the host copy (None: unbounded; full: recompute instead).
* ``admission``: ``"greedy"`` (blocks for the tokens scheduled, grown as it decodes; may
  preempt) or ``"reserve"`` (blocks for prompt + max_tokens reserved at admission, refunded at
  completion: never preempts); ``watermark``: fraction of the pool an admission must leave free.
* Overload: ``queue_limit`` (an arrival finding that many waiting is rejected: 429) and
  ``max_queue_wait_s`` (a request not started within it is dropped: its client has gone).
* ``batch_timeout_s`` (static only): the batcher fires when ``max_running`` requests wait or
  the oldest has waited this long.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lib.inputs import fraction, integer, real

__all__ = ["Policy"]

BATCHING = ("continuous", "static")
STEP_MIX = ("decode_first", "prefill_first")
ORDERS = ("fcfs", "spf")
PREEMPTION = ("recompute", "swap")
ADMISSION = ("greedy", "reserve")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


@dataclass(frozen=True)
class Policy:
    """The scheduler's choices (see the module doc); validated when built."""

    batching: str = "continuous"
    max_running: int | None = None
    token_budget: int | None = None
    step_mix: str = "decode_first"
    chunked_prefill: bool = True
    long_prefill_cap: int | None = None
    order: str = "fcfs"
    use_priority: bool = False
    kv_share_cap: tuple | dict | None = None
    preemption: str = "recompute"
    swap_space_blocks: int | None = None
    admission: str = "greedy"
    watermark: float = 0.0
    queue_limit: int | None = None
    max_queue_wait_s: float | None = None
    batch_timeout_s: float = 0.0

    def __post_init__(self) -> None:
        _choice("batching", self.batching, BATCHING)
        _choice("step_mix", self.step_mix, STEP_MIX)
        _choice("order", self.order, ORDERS)
        _choice("preemption", self.preemption, PREEMPTION)
        _choice("admission", self.admission, ADMISSION)
        for name in ("max_running", "token_budget", "long_prefill_cap"):
            if getattr(self, name) is not None:
                integer(name, getattr(self, name), 1)
        if self.swap_space_blocks is not None:
            integer("swap_space_blocks", self.swap_space_blocks, 0, unit="blocks")
        if self.queue_limit is not None:
            integer("queue_limit", self.queue_limit, 0, unit="requests")
        if self.max_queue_wait_s is not None:
            real("max_queue_wait_s", self.max_queue_wait_s, 0, unit="seconds")
        real("batch_timeout_s", self.batch_timeout_s, 0, unit="seconds")
        fraction("watermark", self.watermark)
        for name in ("chunked_prefill", "use_priority"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if (self.max_running is not None and self.token_budget is not None
                and self.token_budget < self.max_running):
            raise ValueError(
                f"token_budget={self.token_budget} must be >= max_running={self.max_running}: "
                "every running decode needs one token of each step (vLLM's rule)"
            )
        if self.kv_share_cap is not None:
            items = self.kv_share_cap.items() if isinstance(self.kv_share_cap, dict) else self.kv_share_cap
            caps = tuple(sorted((integer("kv_share_cap class", c, 0),
                                 fraction("kv_share_cap fraction", f, allow_zero=False))
                                for c, f in items))
            object.__setattr__(self, "kv_share_cap", caps or None)

    @property
    def caps(self) -> dict[int, float]:
        """{priority class: largest fraction of the KV pool it may hold}."""
        return dict(self.kv_share_cap or ())

    def replace(self, **changes) -> Policy:
        """A validated copy with some fields changed: ``policy.replace(order="spf")``."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Policy field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)
