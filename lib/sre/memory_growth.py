"""Device memory that grows while the KV pool stays put (I081): suspects priced in bytes, a seeded
memory series with one injected leak, and the diagnosis that names it.

The KV pool is preallocated (``gpu_memory_utilization`` x visible memory minus what the engine
measured, :func:`lib.perf.memory.memory_budget`), so growth of device memory is outside it. What is
fixed comes from the budget (weights, KV pool, activations, sampler, CUDA graphs, NCCL, context);
what can grow is one of the suspects below, each with the size that decides it:

* **per request** (linear in the request count): a logits row kept per request (vocab x 4 B,
  :func:`lib.perf.memory.logits_bytes`), the sampled ids and logprobs of every output token (output
  tokens x (8 + 4) B), the last hidden state of every prompt (d x 2 B).
* **bounded** (grow, then stop): the caching allocator's fragmentation under variable shapes (from
  the budgeted fraction of the transient working set up to the high end of its range,
  :func:`lib.perf.memory.fragmentation_bytes`), lazy CUDA-graph captures (capture sizes x bytes per
  capture, :func:`lib.perf.memory.cuda_graph_bytes` parts).
* **steps in time** (not per request): a new NCCL communicator (:func:`lib.perf.memory.nccl_buffer_bytes`).
* **no device growth** outside the pool: leaked KV blocks (the pool's usage gauge climbs instead)
  and prefix-cache metadata (host memory).

A measured growth rate (bytes/s) over the request rate is bytes per request; the shape of the
series (linear, saturating, steps) picks the family and the size picks the suspect inside it.
Time to OOM is the budget's headroom margin (:attr:`MemoryBudget.headroom_margin_bytes`) over the
growth rate. SI units: bytes, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real
from lib.perf import memory as mem
from lib.registry import assumptions
from lib.registry.models import model
from lib.scheduling.queueing import littles_law

__all__ = [
    "SHAPE_WORDS", "SUSPECTS", "Suspect", "MemorySeries", "Diagnosis", "suspects", "simulate_series", "growth_fit",
    "diagnose", "bytes_per_request", "time_to_oom_s", "host_bytes_per_block", "visibility",
]

MiB = 2**20
TOKEN_ID_BYTES = np.dtype(np.int64).itemsize  # a sampled token id as the engine keeps it (int64)
LOGPROB_BYTES = np.dtype(np.float32).itemsize  # its logprob (fp32)
HIDDEN_BYTES = np.dtype(np.float16).itemsize  # a bf16/fp16 hidden-state value

LINEAR, BOUNDED, STEPS, NONE = "per request", "bounded", "steps in time", "no device growth"
SHAPE_WORDS = {LINEAR: "a steady climb (per request)", BOUNDED: "a climb that settles (bounded)",
               STEPS: "a staircase (steps in time)", NONE: "flat"}

SUSPECTS = (
    "logits row", "output logprobs", "prompt hidden state", "allocator fragmentation",
    "CUDA graph captures", "NCCL communicator", "leaked KV blocks", "prefix-cache metadata",
)


def host_bytes_per_block() -> float:
    """Host bytes of prefix-cache bookkeeping per cached block (``sre.prefix_metadata_bytes_per_block``)."""
    return float(assumptions.value("sre.prefix_metadata_bytes_per_block"))


@dataclass(frozen=True)
class Suspect:
    """One thing that can grow: its family, its size (bytes per request for ``per request``, the
    cap for ``bounded``, the quantum for ``steps in time``, 0 for ``no device growth``), and how."""

    name: str
    family: str
    size_bytes: float
    formula: str
    where: str


def suspects(budget: mem.MemoryBudget, prompt_tokens: int, output_tokens: int) -> dict[str, Suspect]:
    """The eight suspects sized for ``budget``'s model and GPU and one request's lengths, bytes.

    logits row = vocab x 4; output logprobs = output tokens x (8 + 4); prompt hidden state = d x 2;
    allocator fragmentation = (high - budgeted fraction) x (activations + sampler); CUDA graph
    captures = capture sizes x bytes per capture (each size captured late, once); NCCL communicator
    = :func:`lib.perf.memory.nccl_buffer_bytes` of one more communicator; leaked KV blocks =
    blocks a request x block bytes (inside the pool: 0 device bytes outside it); prefix metadata =
    prompt blocks x :func:`host_bytes_per_block` (host memory).
    """
    prompt_tokens = integer("prompt_tokens", prompt_tokens, 1)
    output_tokens = integer("output_tokens", output_tokens, 1)
    m = model(budget.model_key)
    c = budget.components
    transient = c["activations"] + c["sampler"]
    lo_f, hi_f = mem.fact_range("fragmentation_fraction")
    frag_now = mem.fragmentation_bytes(transient)
    frag_cap = mem.fragmentation_bytes(transient, hi_f) - frag_now
    n_sizes = mem.fact("cuda_graph_capture_sizes")
    per_capture = mem.fact("cuda_graph_bytes_per_capture")
    nccl = mem.nccl_buffer_bytes(budget.gpu_key, budget.tp)
    blocks = math.ceil((prompt_tokens + output_tokens) / budget.block_size)
    prompt_blocks = math.ceil(prompt_tokens / budget.block_size)
    rows = [
        Suspect("logits row", LINEAR, mem.logits_bytes(m, 1, "fp32"),
                f"vocab {m.vocab_size:,} x 4 B (FP32), one row kept per request", "device"),
        Suspect("output logprobs", LINEAR, output_tokens * (TOKEN_ID_BYTES + LOGPROB_BYTES),
                f"{output_tokens:,} output tokens x (8 B id + 4 B logprob)", "device"),
        Suspect("prompt hidden state", LINEAR, m.hidden_size * HIDDEN_BYTES,
                f"hidden size {m.hidden_size:,} x 2 B, the last position of each prompt", "device"),
        Suspect("allocator fragmentation", BOUNDED, frag_cap,
                f"({hi_f:g} - {mem.fact('fragmentation_fraction'):g}) x activations + sampler", "device"),
        Suspect("CUDA graph captures", BOUNDED, n_sizes * per_capture,
                f"{n_sizes} capture sizes x {per_capture / MiB:g} MiB, each captured once", "device"),
        Suspect("NCCL communicator", STEPS, nccl,
                f"one more TP{budget.tp} communicator's buffers" if nccl else "no communicator at TP1", "device"),
        Suspect("leaked KV blocks", NONE, blocks * budget.block_bytes,
                f"{blocks} blocks of {budget.block_bytes / MiB:.3g} MiB a request, inside the preallocated pool",
                "KV pool"),
        Suspect("prefix-cache metadata", NONE, prompt_blocks * host_bytes_per_block(),
                f"{prompt_blocks} block hashes a request x {host_bytes_per_block():g} B, in host memory", "host"),
    ]
    return {s.name: s for s in rows}


@dataclass(frozen=True)
class MemorySeries:
    """A device-memory series: sample times (s), bytes in use, cumulative requests, the KV pool's
    blocks in use, the host process's bytes, and the time of the OOM (None when the process
    survived the window; the series stops there)."""

    t_s: np.ndarray
    used_bytes: np.ndarray
    requests: np.ndarray
    kv_blocks_used: np.ndarray
    running: np.ndarray
    host_bytes: np.ndarray
    pool_blocks: int
    block_bytes: float
    capacity_bytes: float
    base_bytes: float
    oom_s: float | None
    injected: str | None


def simulate_series(
    budget: mem.MemoryBudget,
    injected: str | None,
    request_rate: float,
    hours: float,
    prompt_tokens: int,
    output_tokens: int,
    seed: int = 0,
    sample_s: float = 60.0,
    leak_fraction: float = 1.0,
    settle_s: float = 1800.0,
    nccl_period_s: float = 2700.0,
    noise_bytes: float = 0.1 * MiB,
    request_s: float = 10.0,
    host_base_bytes: float = 8 * 2**30,
) -> MemorySeries:
    """Seeded device-memory series with one suspect injected (``injected``; None: no leak).

    Base = every budget component plus the KV pool (:attr:`MemoryBudget.peak_bytes`); requests are
    Poisson at ``request_rate`` per second, output lengths geometric with mean ``output_tokens``.
    Per-request suspects add their size for ``leak_fraction`` of requests (1: every request);
    bounded ones approach their cap as 1 - exp(-t / settle_s) (graph captures as whole captures);
    the NCCL suspect adds one communicator every ``nccl_period_s``. A readout noise of
    ``noise_bytes`` (sd) is added; the series stops at the first sample above the visible memory.
    The KV gauge holds Little's law's rate x ``request_s`` requests (Poisson) of their blocks, at
    most as many as fit beside the leaked blocks (the engine queues the rest), plus the leaked
    blocks (capped at the pool); host memory is ``host_base_bytes`` plus the metadata leak.
    """
    sus = suspects(budget, prompt_tokens, output_tokens)
    if injected is not None and injected not in sus:
        raise ValueError(f"injected must be None or one of {', '.join(SUSPECTS)}, got {injected!r}")
    if s_inj := sus.get(injected):
        if s_inj.family != NONE and s_inj.size_bytes <= 0:
            raise ValueError(f"{injected!r} has nothing to grow at TP{budget.tp}: inject another suspect")
    rate = real("request_rate", request_rate, 0, low_open=True, unit="requests/s")
    hours = real("hours", hours, 0, 240, low_open=True)
    sample_s = real("sample_s", sample_s, 1, 3600)
    real("leak_fraction", leak_fraction, 0, 1, low_open=True)
    real("settle_s", settle_s, 1)
    real("nccl_period_s", nccl_period_s, 1)
    real("request_s", request_s, 0, low_open=True)
    real("host_base_bytes", host_base_bytes, 0)
    rng = np.random.default_rng(seed)
    n = max(2, int(hours * 3600 / sample_s) + 1)
    t = np.arange(n) * sample_s
    counts = rng.poisson(rate * sample_s, size=n)
    counts[0] = 0
    reqs = np.cumsum(counts)
    growth = np.zeros(n)
    s = sus.get(injected) if injected else None
    leaking = rng.binomial(counts, leak_fraction)
    per_req_blocks = sus["leaked KV blocks"].size_bytes / budget.block_bytes
    running = rng.poisson(littles_law(arrival_rate=rate, W=request_s), size=n)
    leaked_blocks = np.cumsum(leaking) * per_req_blocks if injected == "leaked KV blocks" else np.zeros(n)
    leaked_blocks = np.minimum(leaked_blocks, budget.num_blocks)
    # the engine admits only the requests whose blocks fit beside the leaked ones; the rest wait
    running = np.minimum(running, np.floor((budget.num_blocks - leaked_blocks) / per_req_blocks))
    in_flight = running * per_req_blocks
    kv = np.minimum(in_flight + leaked_blocks, budget.num_blocks)
    host = host_base_bytes + (np.cumsum(leaking) * sus["prefix-cache metadata"].size_bytes
                              if injected == "prefix-cache metadata" else 0.0)
    host = host + rng.normal(0.0, noise_bytes, size=n)
    if s is not None and s.family == LINEAR:
        if s.name == "output logprobs":
            draws = rng.geometric(1.0 / output_tokens, size=int(leaking.sum()))
            total_out = np.bincount(np.repeat(np.arange(n), leaking), weights=draws, minlength=n)
            add = total_out * (TOKEN_ID_BYTES + LOGPROB_BYTES)
        else:
            add = leaking * s.size_bytes
        growth = np.cumsum(add)
    elif s is not None and s.name == "allocator fragmentation":
        growth = s.size_bytes * (1.0 - np.exp(-t / settle_s))
    elif s is not None and s.name == "CUDA graph captures":
        n_sizes = mem.fact("cuda_graph_capture_sizes")
        first = np.sort(rng.exponential(settle_s / 3, size=n_sizes))
        growth = np.searchsorted(first, t, side="right") * (s.size_bytes / n_sizes)
    elif s is not None and s.name == "NCCL communicator":
        growth = np.floor(t / nccl_period_s) * s.size_bytes
    base = budget.peak_bytes
    used = base + growth + rng.normal(0.0, noise_bytes, size=n)
    over = np.nonzero(used > budget.visible_bytes)[0]
    oom = None
    if over.size:
        k = int(over[0])
        oom = float(t[k])
        t, used, reqs, kv, host = t[: k + 1], used[: k + 1], reqs[: k + 1], kv[: k + 1], host[: k + 1]
        running = running[: k + 1]
    return MemorySeries(t, used, reqs.astype(float), kv, running.astype(float), host, budget.num_blocks,
                        budget.block_bytes, budget.visible_bytes, base,
                        oom, injected)


def bytes_per_request(growth_bytes_per_s: float, request_rate: float) -> float:
    """Growth rate over request rate: bytes left behind per request (B/s / (requests/s))."""
    real("growth_bytes_per_s", growth_bytes_per_s)
    return growth_bytes_per_s / real("request_rate", request_rate, 0, low_open=True, unit="requests/s")


def time_to_oom_s(margin_bytes: float, growth_bytes_per_s: float) -> float:
    """Seconds until a linear growth eats the headroom margin: margin / rate (inf when it does not grow;
    0 when the margin is already gone)."""
    real("margin_bytes", margin_bytes)
    real("growth_bytes_per_s", growth_bytes_per_s)
    if margin_bytes <= 0:
        return 0.0
    return math.inf if growth_bytes_per_s <= 0 else margin_bytes / growth_bytes_per_s


@dataclass(frozen=True)
class GrowthFit:
    """What the series says: net growth, least-squares rate, rates over the first and last third,
    the share of growth carried by the top tenth of sample intervals, the request rate, and the
    family those imply."""

    growth_bytes: float
    rate_bytes_per_s: float
    early_rate: float
    late_rate: float
    top_share: float
    request_rate: float
    family: str

    @property
    def bytes_per_request(self) -> float:
        return bytes_per_request(self.rate_bytes_per_s, self.request_rate)


MIN_GROWTH = 16 * MiB  # below this over the window, the series is flat
SATURATION = 0.25  # late / early rate below this: it stopped growing
STEP_SHARE = 0.8  # the top tenth of intervals carry this much of the growth: steps


def growth_fit(series: MemorySeries) -> GrowthFit:
    """Rate (least squares, B/s), growth, shape and request rate of a series.

    Family: no device growth when the net growth is under 16 MiB; bounded when the last third grows
    at under a quarter of the first third's rate; steps when the top tenth of intervals carries 80%
    of the growth; else per request.
    """
    t, y = series.t_s, series.used_bytes
    if len(t) < 3:
        raise ValueError("the series needs at least 3 samples")
    rate = float(np.polyfit(t, y, 1)[0])
    growth = float(y[-1] - y[0])
    k = max(2, len(t) // 3)
    early = float(np.polyfit(t[:k], y[:k], 1)[0])
    late = float(np.polyfit(t[-k:], y[-k:], 1)[0])
    inc = np.sort(np.diff(y))[::-1]
    top = float(inc[: max(1, len(inc) // 10)].sum())
    share = top / growth if growth > 0 else 0.0
    req_rate = float((series.requests[-1] - series.requests[0]) / (t[-1] - t[0]))
    if growth < MIN_GROWTH:
        fam = NONE
    elif early > 0 and late < SATURATION * early:
        fam = BOUNDED
    elif share > STEP_SHARE:
        fam = STEPS
    else:
        fam = LINEAR
    return GrowthFit(growth, rate, early, late, share, req_rate, fam)


@dataclass(frozen=True)
class Diagnosis:
    """The device fit, the KV blocks held beyond the running requests' (median of the last third),
    the host growth per request, each suspect's verdict (name -> sentence), the suspect named
    (None: none matches), the measured size it was compared with, and every compared size ratio."""

    fit: GrowthFit
    kv_excess_blocks: float
    host_bytes_per_request: float
    verdicts: dict
    named: str | None
    measured_size: float
    ratios: dict

    @property
    def runner_up_ratio(self) -> float:
        """The second-best suspect's size mismatch (>= 1; inf when only one was compared)."""
        r = sorted(self.ratios.values())
        return r[1] if len(r) > 1 else math.inf


MATCH = 2.0  # a suspect's size must be within this factor of the measured one
KV_EXCESS = 0.05  # blocks held beyond the running requests' above this share of the pool: a leak


def _mismatch(a: float, b: float) -> float:
    if a <= 0 or b <= 0:
        return math.inf
    return max(a / b, b / a)


def diagnose(series: MemorySeries, sus: dict[str, Suspect]) -> Diagnosis:
    """Name the suspect the series points at, and rule out the others with a reason.

    Device memory first: the family comes from :func:`growth_fit`; the size measured is bytes per
    request (per request), the net growth (bounded) or the median of the large jumps (steps); within
    the family the suspect of closest size is named if within a factor of 2. When device memory is
    flat, the two side gauges: KV blocks held beyond running requests x blocks each (over 5% of the
    pool: leaked KV blocks), and host growth per request against the metadata's size.
    """
    fit = growth_fit(series)
    blocks_each = round(sus["leaked KV blocks"].size_bytes / series.block_bytes)
    k = max(1, len(series.t_s) // 3)
    excess = float(np.median(series.kv_blocks_used[-k:] - series.running[-k:] * blocks_each))
    host_rate = float(np.polyfit(series.t_s, series.host_bytes, 1)[0])
    host_growth = host_rate * float(series.t_s[-1] - series.t_s[0])
    host_per_req = host_rate / fit.request_rate if fit.request_rate > 0 else 0.0
    if fit.family == LINEAR:
        measured = fit.bytes_per_request
    elif fit.family == BOUNDED:
        measured = fit.growth_bytes
    elif fit.family == STEPS:
        inc = np.diff(series.used_bytes)
        measured = float(np.median(inc[inc > 0.5 * inc.max()]))
    else:
        measured = 0.0
    ratios, verdicts = {}, {}
    kv_leak = excess > KV_EXCESS * series.pool_blocks
    host_leak = host_growth > MIN_GROWTH
    for s in sus.values():
        if s.name == "leaked KV blocks":
            if kv_leak and fit.family == NONE:
                ratios[s.name] = 1.0
                verdicts[s.name] = (f"named: the pool holds {excess:,.0f} blocks beyond what the running requests "
                                    "need, and device memory stays flat")
            else:
                verdicts[s.name] = ("ruled out: it fills the preallocated pool, not device memory"
                                    + ("" if kv_leak else ", and the pool holds no blocks beyond the running requests'"))
            continue
        if s.name == "prefix-cache metadata":
            if host_leak and fit.family == NONE:
                ratios[s.name] = _mismatch(s.size_bytes, host_per_req)
                verdicts[s.name] = None
            else:
                verdicts[s.name] = ("ruled out: it grows host memory, not device memory"
                                    + ("" if host_leak else ", and host memory is flat"))
            continue
        if fit.family == NONE:
            verdicts[s.name] = "ruled out: device memory is flat"
            continue
        if s.size_bytes <= 0:
            verdicts[s.name] = "ruled out: nothing to grow in this setup"
            continue
        if s.family != fit.family:
            verdicts[s.name] = f"ruled out by shape: its growth is {s.family}, the series' is {fit.family}"
            continue
        ratios[s.name] = _mismatch(s.size_bytes, measured)
    named = None
    if ratios:
        best = min(ratios, key=ratios.get)
        if ratios[best] <= MATCH:
            named = best
    for name, r in ratios.items():
        if verdicts.get(name):
            continue
        ref = host_per_req if name == "prefix-cache metadata" else measured
        if name == named:
            verdicts[name] = f"named: its size is within {r:.2f}x of the measured one"
        else:
            side = "larger" if sus[name].size_bytes > ref else "smaller"
            verdicts[name] = f"ruled out by size: {r:.3g}x {side} than measured"
    if named == "prefix-cache metadata":
        measured = host_per_req
    return Diagnosis(fit, excess, host_per_req, verdicts, named, measured, ratios)


def visibility(series: MemorySeries, sus: dict[str, Suspect]) -> float:
    """The injected suspect's footprint over the window against what :func:`diagnose` can tell from
    noise (> 1: large enough to be named; < 1: it reads as flat; nan: nothing injected).

    Per-request and host suspects: counted requests x size / ``MIN_GROWTH``; leaked KV blocks:
    counted requests x blocks a request / (``KV_EXCESS`` x pool blocks); bounded and steps: the
    series' growth above its known base / ``MIN_GROWTH``. The sizes are the injection's, not fitted.
    """
    if series.injected is None:
        return math.nan
    s = sus[series.injected]
    n = float(series.requests[-1] - series.requests[0])
    if s.name == "leaked KV blocks":
        return n * s.size_bytes / series.block_bytes / (KV_EXCESS * series.pool_blocks)
    if s.family in (LINEAR, NONE):
        return n * s.size_bytes / MIN_GROWTH
    return float(series.used_bytes[-1] - series.base_bytes) / MIN_GROWTH
