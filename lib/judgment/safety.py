"""Safety as infrastructure (N080), and the log volume an isolation report counts (N091).

* :func:`logged_bytes_per_day`: the text a request log keeps a day: ``rate x 86,400 x (P + O) x
  bytes per token + rate x 86,400 x record overhead`` (bytes per token of text:
  :func:`lib.training.data_pipeline.bytes_per_token`, the book's one text-per-token figure), and
  the bytes held at a retention of ``retention_days`` (the daily volume times the days kept).

* :func:`drain_s`: the bound on a drain, max output x TPOT; :func:`shrinking_drain_s`: the expected
  drain when the batch shrinks as requests finish, ``(M / B) sum_{b=1}^{B} step_s(b)``.

SI units: bytes, seconds, requests per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import integer, real
from lib.registry import assumptions

__all__ = ["Drain", "LogVolume", "StopPath", "WeightExposure", "drain_s", "logged_bytes_per_day", "shrinking_drain_s",
           "stop_paths", "weight_exposure"]

DAY_S = 86_400.0


@dataclass(frozen=True)
class LogVolume:
    """Bytes a day a request log keeps, and the bytes held at the retention."""

    rate: float
    prompt_len: int
    output_len: int
    bytes_per_token: float
    record_overhead_bytes: float
    retention_days: float

    @property
    def requests_per_day(self) -> float:
        """rate x 86,400."""
        return self.rate * DAY_S

    @property
    def bytes_per_request(self) -> float:
        """(P + O) x bytes per token + the record's fixed fields."""
        return (self.prompt_len + self.output_len) * self.bytes_per_token + self.record_overhead_bytes

    @property
    def bytes_per_day(self) -> float:
        """requests a day x bytes per request."""
        return self.requests_per_day * self.bytes_per_request

    @property
    def bytes_held(self) -> float:
        """bytes a day x retention days: what a reader with access to the store can read at any time."""
        return self.bytes_per_day * self.retention_days


def logged_bytes_per_day(rate: float, prompt_len: int, output_len: int, retention_days: float = 30.0, *,
                         record_overhead_bytes: float | None = None, bytes_per_token: float | None = None) -> LogVolume:
    """Prompt and completion text logged at ``rate`` requests/s (module doc). ``bytes_per_token``
    None: :func:`lib.training.data_pipeline.bytes_per_token` (characters per token x bytes per
    character); ``record_overhead_bytes`` None: ``judgment.log_record_overhead_bytes`` (ids, timestamps,
    tenant, model, token counts as JSON)."""
    from lib.training.data_pipeline import bytes_per_token as text_bytes_per_token

    lam = real("rate", rate, 0, unit="requests/s")
    p = integer("prompt_len", prompt_len, 0, unit="tokens")
    o = integer("output_len", output_len, 0, unit="tokens")
    keep = real("retention_days", retention_days, 0, unit="days")
    over = real("record_overhead_bytes", assumptions.resolve(record_overhead_bytes, "judgment.log_record_overhead_bytes"),
                0, unit="bytes")
    bpt = text_bytes_per_token() if bytes_per_token is None else real("bytes_per_token", bytes_per_token, 0,
                                                                     low_open=True, unit="bytes")
    return LogVolume(lam, p, o, bpt, over, keep)


# ---- who can read the weights --------------------------------------------------------------------


@dataclass(frozen=True)
class WeightExposure:
    """Where plaintext weights sit and who can read them: hosts that load them (serving and eval
    nodes, each readable by anyone with root there), stored copies, and the principals with access."""

    serving_nodes: int
    eval_nodes: int
    storage_copies: int
    people_with_root: int
    roles_with_read: int

    @property
    def hosts(self) -> int:
        """Nodes holding the weights in GPU and host memory: serving + eval."""
        return self.serving_nodes + self.eval_nodes

    @property
    def places(self) -> int:
        """Every copy an attacker could read: hosts + stored copies."""
        return self.hosts + self.storage_copies

    @property
    def principals(self) -> int:
        """People and service roles that can read at least one copy today."""
        return self.people_with_root + self.roles_with_read


def weight_exposure(serving_gpus: int, eval_gpus: int, gpus_per_node: int, storage_copies: int,
                    people_with_root: int, roles_with_read: int) -> WeightExposure:
    """The access paths to the weights, counted: ceil(GPUs / GPUs per node) nodes for serving and for
    eval, the stored copies (checkpoint, release, backups, regional mirrors) and the principals."""
    g = integer("gpus_per_node", gpus_per_node, 1)
    s = integer("serving_gpus", serving_gpus, 0)
    e = integer("eval_gpus", eval_gpus, 0)
    return WeightExposure(-(-s // g), -(-e // g), integer("storage_copies", storage_copies, 0),
                          integer("people_with_root", people_with_root, 0), integer("roles_with_read", roles_with_read, 0))


# ---- how fast a deployment stops ---------------------------------------------------------------------


@dataclass(frozen=True)
class StopPath:
    """One way of stopping a deployment: detection, propagation, drain (seconds), the tokens still
    generated after the decision, and the time to undo it."""

    name: str
    detect_s: float
    propagate_s: float
    drain_s: float
    tokens_after_decision: float
    resume_s: float

    @property
    def total_s(self) -> float:
        """detect + propagate + drain: from the behaviour starting to the last token served."""
        return self.detect_s + self.propagate_s + self.drain_s


def drain_s(max_output_tokens: int, tpot_s: float) -> float:
    """The longest in-flight generation still to run: max output tokens x TPOT (a request admitted
    just before the stop may generate its whole cap)."""
    m = integer("max_output_tokens", max_output_tokens, 1, unit="tokens")
    return m * real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")


@dataclass(frozen=True)
class Drain:
    """A drain of ``batch`` in-flight requests with up to ``max_output`` tokens left: the bound (the
    batch stays full) and the expectation when it shrinks as requests finish."""

    batch: int
    max_output: int
    bound_s: float
    expected_s: float


def shrinking_drain_s(dep, batch: int, max_output_tokens: int, context: int) -> Drain:
    """Expected drain after admission stops: ``batch`` requests in flight, one with the whole cap
    ``M`` left (admitted just before the stop), the others' remaining tokens uniform on [0, M].
    Sorted, the B gaps between successive finishes each have mean M / B, and during the k-th gap
    B - k + 1 requests decode, so E[T] = (M / B) sum_{b=1}^{B} step_s(b, context)
    (:func:`lib.perf.throughput.step_s`; the context is held at ``context``). Bound: M x step_s(B)."""
    from lib.perf.throughput import step_s

    b = integer("batch", batch, 1)
    m = integer("max_output_tokens", max_output_tokens, 1, unit="tokens")
    ctx = integer("context", context, 1, unit="tokens")
    steps = [step_s(dep, k, ctx) for k in range(1, b + 1)]
    return Drain(b, m, m * steps[-1], m / b * sum(steps))


def stop_paths(rate: float, output_len: int, max_output_tokens: int, tpot_s: float, detect_s: float,
               flag_push_s: float, orchestrator_s: float, restart_s: float) -> tuple[StopPath, ...]:
    """Three ways to stop serving a model at ``rate`` requests/s of ``output_len``-token answers:

    * router kill switch, abort: the flag reaches the routers (``flag_push_s``), in-flight streams
      are cut at the next step (drain = one TPOT); undo: push the flag back;
    * router kill switch, drain: in-flight requests finish (drain = max output x TPOT);
    * scale replicas to zero: the orchestrator's update reaches the pods (``orchestrator_s``),
      graceful termination drains them; undo: start replicas again (``restart_s``).

    Tokens after the decision: the fleet's output tokens/s (rate x O) during propagation, then the
    in-flight requests' remaining tokens when they drain (rate x O x TPOT in flight, by Little's law,
    each with O/2 left on average) or one token each when aborted."""
    lam = real("rate", rate, 0, low_open=True, unit="requests/s")
    o = integer("output_len", output_len, 1, unit="tokens")
    t = real("tpot_s", tpot_s, 0, low_open=True, unit="seconds")
    d = real("detect_s", detect_s, 0, unit="seconds")
    f = real("flag_push_s", flag_push_s, 0, unit="seconds")
    k = real("orchestrator_s", orchestrator_s, 0, unit="seconds")
    r = real("restart_s", restart_s, 0, unit="seconds")
    drain = drain_s(max_output_tokens, t)
    in_flight = lam * o * t
    out_rate = lam * o
    return (StopPath("router kill switch, abort in-flight", d, f, t, out_rate * f + in_flight, f),
            StopPath("router kill switch, let in-flight finish", d, f, drain, out_rate * f + in_flight * o / 2, f),
            StopPath("scale replicas to zero", d, k, drain, out_rate * k + in_flight * o / 2, r))
