"""Time to first token across the boxes of a serving system: which clock measures what, and the
budget a TTFT SLO leaves each part (I066, N064).

A request crosses four boxes: the **client**, the **gateway** (auth, rate limits, parsing,
tokenization), the **router** and the **engine** (queue, then prefill; the first output token is
sampled from the prefill's last logits). :class:`TTFTParts` holds the time each part adds:

==================  ==========================================================================
``connect_s``       new connection only: TCP (1 RTT) + TLS (``fleet.tls_handshake_rtts`` RTTs)
``upload_s``        half a round trip + the request body (prompt x bytes/token) over the uplink
``gateway_s``       the gateway's own work (``fleet.gateway_processing_s``)
``routing_s``       the router's decision and the hops to the engine (``fleet.routing_s``)
``queue_s``         waiting in the engine's queue for earlier prefills
``step_wait_s``     waiting for the running engine step to end (iteration-level scheduling)
``prefill_s``       :func:`lib.perf.prefill.prefill_time` (the book's one prefill model)
``downlink_s``      half a round trip back to the client
==================  ==========================================================================

and the clocks that people call "TTFT" start and stop at different boxes:

* ``engine_prefill_s``: scheduled -> first token (what an engine's per-request trace shows);
* ``engine_s``: arrival at the engine -> first token (vLLM's ``time_to_first_token`` metric);
* ``gateway_clock_s``: request received at the gateway -> first event written to the client;
* ``client_s``: the client's send -> first token on screen (warm connection, or cold with
  ``connect_s``).

:func:`prompt_len_for_budget` inverts the prefill model: the longest prompt whose prefill fits what a
budget leaves (a p-quantile TTFT SLO in utilization is
:func:`lib.scheduling.queueing.utilization_for_sojourn_quantile`, or exactly on a sample path
:func:`lib.scheduling.queueing.sample_path_utilization`).
:func:`admit_fcfs` is admission control on a FCFS prefill queue: a request whose predicted TTFT
(the work queued ahead of it plus its own prefill) exceeds the budget is rejected at arrival.
SI units: seconds, bytes, bits per second for the uplink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from lib.inputs import integer, real
from lib.registry import assumptions
from lib.search import largest_true

__all__ = ["CLOCKS", "TTFTParts", "admit_fcfs", "prompt_len_for_budget", "ttft_parts"]

#: (name, label, first part it includes, last part it includes)
CLOCKS = (
    ("engine_prefill_s", "engine, from scheduling", "prefill_s", "prefill_s"),
    ("engine_s", "engine, from arrival", "queue_s", "prefill_s"),
    ("gateway_clock_s", "gateway", "gateway_s", "prefill_s"),
    ("client_s", "client", "connect_s", "downlink_s"),
)


@dataclass(frozen=True)
class TTFTParts:
    """Seconds each part of the path adds to the first token (module docstring)."""

    connect_s: float
    upload_s: float
    gateway_s: float
    routing_s: float
    queue_s: float
    step_wait_s: float
    prefill_s: float
    downlink_s: float

    @property
    def engine_prefill_s(self) -> float:
        return self.prefill_s

    @property
    def engine_s(self) -> float:
        return self.queue_s + self.step_wait_s + self.prefill_s

    @property
    def gateway_clock_s(self) -> float:
        return self.gateway_s + self.routing_s + self.engine_s

    @property
    def client_s(self) -> float:
        return self.connect_s + self.upload_s + self.gateway_clock_s + self.downlink_s

    def parts(self) -> list[tuple[str, float]]:
        """(part name, seconds) in path order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def ttft_parts(dep, prompt_len: int, *, rtt_s: float | None = None, warm: bool = True, queue_s: float = 0.0,
               step_wait_s: float = 0.0, gateway_s: float | None = None, routing_s: float | None = None,
               uplink_bps: float | None = None, bytes_per_token: float | None = None,
               tls_rtts: float | None = None, prefill_s: float | None = None) -> TTFTParts:
    """The parts of one request's TTFT on deployment ``dep`` for a ``prompt_len``-token prompt. None
    inputs come from ``data/assumptions.yaml`` (``fleet.client_rtt_s``, ``fleet.gateway_processing_s``,
    ``fleet.routing_s``, ``fleet.client_uplink_bps``, ``fleet.prompt_bytes_per_token``,
    ``fleet.tls_handshake_rtts``); ``prefill_s`` None: ``prefill_time(dep, prompt_len).time_s``.
    ``warm`` False adds a new connection's handshakes."""
    from lib.perf.prefill import prefill_time

    p = integer("prompt_len", prompt_len, 1, unit="tokens")
    rtt = real("rtt_s", assumptions.resolve(rtt_s, "fleet.client_rtt_s"), 0, unit="seconds")
    gw = real("gateway_s", assumptions.resolve(gateway_s, "fleet.gateway_processing_s"), 0, unit="seconds")
    rt = real("routing_s", assumptions.resolve(routing_s, "fleet.routing_s"), 0, unit="seconds")
    up = real("uplink_bps", assumptions.resolve(uplink_bps, "fleet.client_uplink_bps"), 0, low_open=True,
              unit="bits/s")
    bpt = real("bytes_per_token", assumptions.resolve(bytes_per_token, "fleet.prompt_bytes_per_token"), 0,
               low_open=True, unit="bytes")
    tls = real("tls_rtts", assumptions.resolve(tls_rtts, "fleet.tls_handshake_rtts"), 0, unit="round trips")
    q = real("queue_s", queue_s, 0, unit="seconds")
    sw = real("step_wait_s", step_wait_s, 0, unit="seconds")
    if not isinstance(warm, bool):
        raise ValueError(f"warm must be True or False, got {warm!r}")
    pf = prefill_time(dep, p).time_s if prefill_s is None else real("prefill_s", prefill_s, 0, unit="seconds")
    connect = 0.0 if warm else (1 + tls) * rtt
    upload = rtt / 2 + p * bpt * 8 / up
    return TTFTParts(connect, upload, gw, rt, q, sw, pf, rtt / 2)


def prompt_len_for_budget(dep, budget_s: float, fixed_s: float = 0.0, max_len: int | None = None,
                          per_token_s: float = 0.0, cached_fraction: float = 0.0) -> int:
    """Longest prompt P (tokens) with ``prefill(P) + P x per_token_s <= budget_s - fixed_s``, where
    ``prefill(P)`` is :func:`lib.perf.prefill.prefill_time` (``cached_fraction`` 0) or, with the first
    ``floor(cached_fraction x P)`` tokens in a prefix cache, :func:`lib.fleet.capacity.prefill_s` (the new
    tokens' chunk, attending to the cached ones); ``per_token_s`` prices what else grows with the prompt, such
    as its upload. Bisection on whole tokens; 0 if not even one token fits. Capped at ``max_len`` (default:
    the model's context length)."""
    from lib.fleet.capacity import prefill_s
    from lib.inputs import fraction
    from lib.perf.prefill import prefill_time

    left = real("budget_s", budget_s, 0, low_open=True, unit="seconds") - real("fixed_s", fixed_s, 0, unit="seconds")
    per = real("per_token_s", per_token_s, 0, unit="seconds per token")
    hi = integer("max_len", max_len if max_len is not None else dep.mdl.max_position_embeddings, 1, unit="tokens")
    cf = fraction("cached_fraction", cached_fraction)
    if cf >= 1:
        raise ValueError(f"cached_fraction must be below 1 (the last prompt token is always computed), got {cf!r}")

    def fits(n: int) -> bool:
        t = prefill_time(dep, n).time_s if cf == 0 else prefill_s(dep, n, min(int(cf * n), n - 1))
        return t + n * per <= left

    if left <= 0 or not fits(1):
        return 0
    if fits(hi):
        return hi
    return largest_true(fits, 2, hi - 1)  # fits(1); hi does not


def admit_fcfs(arrivals_s, services_s, budget_s: float):
    """Admission control on one FCFS prefill queue: each arrival is admitted iff the work queued ahead of it
    plus its own service fits ``budget_s``; rejected requests add no work. Returns (admitted mask, the
    admitted requests' queue + service times; nan where rejected), numpy arrays. ``budget_s`` inf: admit all
    (then the times equal :func:`lib.scheduling.queueing.lindley_waits` + service)."""
    import numpy as np

    a = np.asarray(arrivals_s, dtype=float)
    s = np.asarray(services_s, dtype=float)
    if a.ndim != 1 or a.shape != s.shape or not len(a) or np.any(np.diff(a) < 0) or np.any(s < 0):
        raise ValueError("arrivals_s (sorted) and services_s (>= 0) must be non-empty 1-D sequences of one length")
    b = float(budget_s)
    if math.isnan(b) or b <= 0:
        raise ValueError(f"budget_s must be > 0 seconds (inf: admit everything), got {budget_s!r}")
    admitted = np.zeros(len(a), dtype=bool)
    ttft = np.full(len(a), math.nan)
    free_at = -math.inf  # when the server finishes the admitted work
    for i in range(len(a)):
        start = max(free_at, a[i])
        if start - a[i] + s[i] <= b:
            admitted[i] = True
            free_at = start + s[i]
            ttft[i] = free_at - a[i]
    return admitted, ttft
