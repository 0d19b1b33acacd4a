"""Reference scenarios and the quantities the book states about them, computed once.

A notebook that glues, say, the decode step of Llama 3.1 70B on 8xH100 at batch 1 must glue
the value :func:`quantity` computes here, whatever page it is on. ``GLUED`` declares which glued
names of which notebooks are which quantity of which scenario; ``tests/book/test_consistency.py``
reads the stored glue text of each and compares it with :func:`quantity` at the precision shown.
A notebook that computes one of these quantities its own way fails that test.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from lib.book.glue import glued_texts
from lib.perf.deployment import Deployment

SCENARIOS = {
    "llama70b-h100x8": dict(model="llama-3.1-70b", gpu="h100-sxm", tp=8),
    "llama70b-h200x8": dict(model="llama-3.1-70b", gpu="h200", tp=8),
    "llama70b-h100x4": dict(model="llama-3.1-70b", gpu="h100-sxm", tp=4),
    "deepseekv3-fp8-h200x8": dict(model="deepseek-v3", gpu="h200", tp=8, weight_dtype="fp8",
                                  kv_dtype="fp8", compute_dtype="fp8"),
    "llama8b-l40s": dict(model="llama-3.1-8b", gpu="l40s", tp=1),
    "qwen72b-mi300x8": dict(model="qwen2.5-72b", gpu="mi300x", tp=8),
}
QUANTITIES = ("decode_step_s", "decode_floor_s", "weight_floor_s", "ttft_s", "kv_blocks", "kv_cache_bytes",
              "max_concurrency", "max_sequences", "allreduce_s")


@functools.cache
def scenario(name: str) -> Deployment:
    """The Deployment of a reference scenario (``SCENARIOS`` keys)."""
    if name not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}; got {name!r}")
    return Deployment(**SCENARIOS[name])


def quantity(kind: str, name: str, **args) -> float:
    """One quantity of one scenario, SI units, from the one model of that quantity.

    decode_step_s / decode_floor_s (weights and KV at datasheet bandwidth) / weight_floor_s
    (batch, context): lib.perf.step.decode_step; ttft_s
    (prompt_len, batch): lib.perf.prefill.prefill_time; kv_blocks, kv_cache_bytes,
    max_concurrency / max_sequences (context): the memory budget; allreduce_s (message_bytes):
    lib.perf.collectives over the scenario's TP group.
    """
    from lib.perf import collectives, prefill, step

    step_args = ({"batch", "context"}, set())
    signature = {  # kind -> (allowed, required) keyword arguments
        "decode_step_s": step_args, "decode_floor_s": step_args, "weight_floor_s": step_args,
        "ttft_s": ({"prompt_len", "batch"}, {"prompt_len"}),
        "kv_blocks": (set(), set()), "kv_cache_bytes": (set(), set()),
        "max_concurrency": ({"context"}, {"context"}), "max_sequences": ({"context"}, {"context"}),
        "allreduce_s": ({"message_bytes"}, {"message_bytes"}),
    }
    if kind not in signature:
        raise ValueError(f"kind must be one of {', '.join(QUANTITIES)}; got {kind!r}")
    allowed, required = signature[kind]
    if required - set(args) or set(args) - allowed:
        raise ValueError(f"{kind} takes {', '.join(sorted(allowed)) or 'no arguments'} (required: "
                         f"{', '.join(sorted(required)) or 'none'}); got {sorted(args)}")
    dep = scenario(name)
    if kind in ("decode_step_s", "decode_floor_s", "weight_floor_s"):
        s = step.decode_step(dep, args.get("batch", 1), args.get("context", 0))
        return {"decode_step_s": s.total_s, "decode_floor_s": s.floor_s, "weight_floor_s": s["weights"]}[kind]
    if kind == "ttft_s":
        return prefill.prefill_time(dep, args["prompt_len"], args.get("batch", 1)).time_s
    if kind == "kv_blocks":
        return float(dep.budget.num_blocks)
    if kind == "kv_cache_bytes":
        return dep.budget.kv_cache_bytes
    if kind == "max_concurrency":
        return dep.budget.max_concurrency(args["context"])
    if kind == "max_sequences":
        return float(dep.budget.max_sequences(args["context"]))
    return collectives.all_reduce_s(args["message_bytes"], dep.tp, dep.chip)  # allreduce_s


# ---- reading a glued text back as a number --------------------------------------------------

_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9,
          "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40}
_NUMBER = re.compile(r"^\s*([-+]?[0-9][0-9,]*(?:\.[0-9]+)?)\s*([A-Za-zµ]*)\s*$")


def parse_glued(text: str) -> tuple[float, float]:
    """(value in SI, half a unit of the last digit shown, in SI) of a glued text like '11.9 ms'."""
    m = _NUMBER.match(text)
    if not m:
        raise ValueError(f"glued text {text!r} is not a number with an optional unit")
    digits, unit = m.group(1).replace(",", ""), m.group(2)
    if unit not in _UNITS:
        raise ValueError(f"unit {unit!r} of {text!r} is not one of {', '.join(u for u in _UNITS if u)}")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    scale = _UNITS[unit]
    return float(digits) * scale, 0.5 * 10.0**-decimals * scale


_LEADING = re.compile(r"\s*([-+]?[0-9][0-9,]*(?:\.[0-9]+)?)\s*([A-Za-zµ]*)")


def number_after(text: str, marker: str) -> str:
    """The number (with its unit, when it has one of :data:`_UNITS`) that follows ``marker`` in a
    glued sentence, as a text :func:`parse_glued` reads: ``number_after('its 15.1 µs, mostly', 'its ')``."""
    at = text.find(marker)
    m = _LEADING.match(text, at + len(marker)) if at >= 0 else None
    if not m:
        raise ValueError(f"no number follows {marker!r} in glued text {text!r}")
    return f"{m.group(1)} {m.group(2) if m.group(2) in _UNITS else ''}".strip()


@dataclass(frozen=True)
class Glued:
    """A declaration: glue ``name`` of notebook ``slug`` states ``kind`` of ``scenario``; in a
    glued sentence, as the number right after the text ``after``."""

    slug: str
    name: str
    kind: str
    scenario: str
    args: dict = field(default_factory=dict)
    after: str | None = None

    def expected(self) -> float:
        return quantity(self.kind, self.scenario, **self.args)


def agrees(text: str, expected: float) -> bool:
    """Whether a glued text states ``expected`` to the precision it shows."""
    value, half_ulp = parse_glued(text)
    return math.isclose(value, expected, rel_tol=1e-9, abs_tol=half_ulp * 1.0001)


def _g(slug: str, name: str, kind: str, scenario: str, after: str | None = None, **args) -> Glued:
    return Glued(slug, name, kind, scenario, args, after)


_L70 = "llama70b-h100x8"
GLUED: tuple[Glued, ...] = (
    # the decode step and its floor
    _g("batch1-gap-suspects", "floor", "weight_floor_s", _L70, batch=1, context=4096),
    _g("batch1-gap-suspects", "modelled", "decode_step_s", _L70, batch=1, context=4096),
    _g("batch1-gap-suspects", "graph_step", "decode_step_s", _L70, batch=1, context=4096),
    _g("decode-weight-floor", "floor", "weight_floor_s", _L70, batch=1, context=4096),
    _g("decode-weight-floor", "t_graph", "decode_step_s", _L70, batch=1, context=4096),
    _g("decode-weight-floor", "t_total", "decode_step_s", _L70, batch=1, context=4096),
    _g("decode-weight-floor", "t_b64", "decode_step_s", _L70, batch=64, context=4096),
    _g("joules-per-token", "t1", "decode_step_s", _L70, batch=1, context=4096),
    _g("throughput-knee", "t1", "decode_step_s", _L70, batch=1, context=4096),
    _g("tp8-decode-step", "t_total", "decode_step_s", _L70, batch=1, context=2048),
    _g("tp8-decode-step", "t_b64", "decode_step_s", _L70, batch=64, context=2048),
    _g("mbu-definition-pitfalls", "dense_step", "decode_step_s", _L70, batch=32, context=16384),
    _g("diagnosing-60-percent-mbu", "t_model", "decode_step_s", "llama70b-h100x4", batch=32,
       context=4096),
    # time to first token (prefill)
    _g("prefill-decode-crossover-ttft", "ttft", "ttft_s", _L70, prompt_len=2000),
    _g("prefill-decode-crossover-ttft", "ttft_long", "ttft_s", _L70, prompt_len=32768),
    _g("prefill-floor", "ttft_hi", "ttft_s", _L70, prompt_len=8192),
    _g("prefill-floor", "fu_32k", "ttft_s", _L70, after="", prompt_len=32768),
    _g("joules-per-token", "t_prefill", "ttft_s", _L70, prompt_len=4096),
    _g("recompute-vs-fetch-prefix", "t_rec", "ttft_s", _L70, prompt_len=8192),
    _g("kv-tiering-hbm-dram-ssd", "t_rec", "ttft_s", _L70, prompt_len=32768),
    _g("long-context-serving", "prefill_short", "ttft_s", _L70, prompt_len=4096),
    _g("long-context-serving", "prefill_s", "ttft_s", _L70, prompt_len=131072),
    # KV capacity (the memory budget)
    _g("kv-capacity-memory-budget", "blocks", "kv_blocks", _L70),
    _g("kv-capacity-memory-budget", "other_answer", "kv_blocks", "llama70b-h200x8", after=""),
    _g("kv-capacity-memory-budget", "kv_pool", "kv_cache_bytes", _L70),
    _g("kv-capacity-memory-budget", "max_conc", "max_concurrency", _L70, context=8192),
    _g("kv-capacity-memory-budget", "max_seqs", "max_sequences", _L70, context=8192),
    _g("prefix-eviction-stranding", "pool_blocks", "kv_blocks", _L70),
    _g("throughput-knee", "b_max", "max_concurrency", _L70, context=4096),
    _g("throughput-knee", "reserve_sentence", "max_concurrency", _L70, after="cut the KV capacity to ",
       context=32768),
    _g("throughput-knee", "fu_gpu", "max_concurrency", "llama70b-h200x8", after="KV capacity ", context=4096),
    _g("joules-per-token", "b_max", "max_concurrency", _L70, context=4096),
    _g("decode-intensity-70b", "bmax0", "max_concurrency", _L70, context=4096),
    _g("decode-intensity-70b", "bmax1", "max_concurrency", _L70, context=8192),
    _g("decode-intensity-70b", "bmax2", "max_concurrency", _L70, context=32768),
    _g("fp8-kv-cache-scales", "fit_bf16", "max_concurrency", _L70, context=131072),
    _g("where-roofline-breaks", "long_wall", "max_concurrency", _L70, after="still holds ", context=32768),
    # collectives
    _g("ffn-cost-model", "dec_comm_words", "allreduce_s", _L70, after="its ", message_bytes=16384),
)


def inconsistencies(nb: dict, slug: str, declared: tuple[Glued, ...] | None = None) -> list[str]:
    """Each declared glue of notebook ``slug`` whose stored text disagrees with :func:`quantity`
    (or is missing), as one line: which glue, what it says, what the one model says."""
    texts = glued_texts(nb)
    problems = []
    for g in GLUED if declared is None else declared:
        if g.slug != slug:
            continue
        if g.name not in texts:
            problems.append(f"{slug}: glue {g.name!r} is declared ({g.kind} of {g.scenario}) but not glued")
            continue
        want = g.expected()
        text = texts[g.name] if g.after is None else number_after(texts[g.name], g.after)
        if not agrees(text, want):
            problems.append(
                f"{slug}: glue {g.name!r} says {text} but {g.kind} of {g.scenario} "
                f"{g.args or ''} is {want:.6g} (SI) in the one model"
            )
    return problems
