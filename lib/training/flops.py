"""Training FLOPs, MFU and the fleet equation: how much compute a run is, and how long and how
many GPUs it takes.

* Model FLOPs per token (what MFU counts): forward + backward = 3 x the forward pass, the
  forward being ``Model.flops_per_token`` (2N over the matmul parameters, LM head included,
  plus the attention score and value matmuls). PaLM and Megatron count attention at the full
  sequence length (``attention="full"``); a causal mask does half of it (``"causal"``).
  The headline rule drops attention: C = 6 N D (:func:`six_n_d`).
* Hardware FLOPs add what activation recomputation re-runs (one more forward under full
  recompute; only the attention core under selective): HFU can be gamed by recompute, MFU not.
* The fleet equation: time = C / (GPUs x dense peak x MFU); solved for GPUs, it sizes the fleet;
  x price per GPU-hour, it prices a token.

SI units: FLOP, FLOP/s, seconds, US dollars.
"""

from __future__ import annotations

import math

from lib.inputs import fraction, integer, real
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu
from lib.registry.models import Model, model

__all__ = [
    "ATTENTION_CONVENTIONS", "RECOMPUTE", "default_mfu", "eval_time_fraction",
    "fleet_margin", "gpus_for_deadline", "hardware_flops_per_token", "mfu", "model_flops_per_token",
    "next_power_of_two", "six_n_d", "training_flops", "training_time_s",
    "training_tokens_per_s", "usd_per_flop", "usd_per_training_token",
]

ATTENTION_CONVENTIONS = ("full", "causal")
RECOMPUTE = ("none", "selective", "full")
DAY_S = 86400.0


def _context(m: Model, seq_len: int, attention: str) -> float:
    if attention not in ATTENTION_CONVENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_CONVENTIONS)}; got {attention!r}")
    s = integer("seq_len", seq_len, 1, unit="tokens")
    return float(s) if attention == "full" else (s + 1) / 2.0


def model_flops_per_token(mdl: str | Model, seq_len: int, attention: str = "full") -> float:
    """Training FLOPs per token that MFU counts: 3 x (2N + attention matmuls at the context),
    context = ``seq_len`` (``"full"``, PaLM's 6N + 12 L H Q T) or the causal mean (s + 1) / 2."""
    m = model(mdl)
    c = _context(m, seq_len, attention)
    return 3.0 * (m.weight_flops_per_token() + m.attention_flops_per_token(1) * c)


def hardware_flops_per_token(mdl: str | Model, seq_len: int, recompute: str = "none",
                             attention: str = "full") -> float:
    """FLOPs per token the GPUs execute: model FLOPs plus the recomputed forward: full recompute
    re-runs the whole forward (4 forwards in all), selective only the attention matmuls."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {recompute!r}")
    m = model(mdl)
    c = _context(m, seq_len, attention)
    forward = m.weight_flops_per_token() + m.attention_flops_per_token(1) * c
    extra = {"none": 0.0, "selective": m.attention_flops_per_token(1) * c, "full": forward}[recompute]
    return 3.0 * forward + extra


def six_n_d(params: float, tokens: float) -> float:
    """The headline training compute C = 6 N D, FLOP (attention and recompute left out)."""
    return 6.0 * real("params", params, 0, low_open=True) * real("tokens", tokens, 0, low_open=True)


def training_flops(mdl: str | Model, tokens: float, seq_len: int, attention: str = "full") -> float:
    """Model FLOPs of a run over ``tokens`` training tokens: tokens x :func:`model_flops_per_token`."""
    return real("tokens", tokens, 0, low_open=True) * model_flops_per_token(mdl, seq_len, attention)


def default_mfu(given: float | None = None) -> float:
    """``given``, else the Llama 3 405B pre-training MFU at 8K sequences (``training.mfu_llama3_8k``)."""
    v = assumptions.resolve(given, "training.mfu_llama3_8k")
    return fraction("mfu", v, allow_zero=False)


def _peak(chip: str | GPU, dtype: str) -> float:
    return gpu(chip).peak_flops(dtype)


def mfu(tokens_per_s: float, mdl: str | Model, seq_len: int, n_gpus: int, chip: str | GPU,
        dtype: str = "bf16", attention: str = "full") -> float:
    """Model FLOPs utilization: tokens/s x model FLOPs per token / (GPUs x dense peak in ``dtype``)."""
    rate = real("tokens_per_s", tokens_per_s, 0)
    n = integer("n_gpus", n_gpus, 1)
    return rate * model_flops_per_token(mdl, seq_len, attention) / (n * _peak(chip, dtype))


def training_tokens_per_s(mdl: str | Model, seq_len: int, n_gpus: int, chip: str | GPU,
                          mfu: float | None = None, dtype: str = "bf16", attention: str = "full") -> float:
    """Tokens per second a fleet trains: GPUs x peak x MFU / model FLOPs per token (the fleet
    equation per second; the data loader must deliver this rate)."""
    n = integer("n_gpus", n_gpus, 1)
    return n * _peak(chip, dtype) * default_mfu(mfu) / model_flops_per_token(mdl, seq_len, attention)


def training_time_s(total_flops: float, n_gpus: int, chip: str | GPU, mfu: float | None = None,
                    dtype: str = "bf16") -> float:
    """The fleet equation: seconds = C / (GPUs x dense peak x MFU) (pure compute: no failures,
    restarts or evaluation pauses)."""
    c = real("total_flops", total_flops, 0, low_open=True)
    n = integer("n_gpus", n_gpus, 1)
    return c / (n * _peak(chip, dtype) * default_mfu(mfu))


def gpus_for_deadline(total_flops: float, deadline_s: float, chip: str | GPU, mfu: float | None = None,
                      dtype: str = "bf16") -> float:
    """GPUs that finish C FLOPs in ``deadline_s`` at ``mfu``: C / (deadline x peak x MFU), as a
    real number (round it up, or to the allocation granularity, yourself)."""
    c = real("total_flops", total_flops, 0, low_open=True)
    t = real("deadline_s", deadline_s, 0, low_open=True, unit="seconds")
    return c / (t * _peak(chip, dtype) * default_mfu(mfu))


def next_power_of_two(x: float) -> int:
    """The smallest power of two >= ``x`` (x > 0): how job schedulers and parallel layouts round a fleet."""
    x = real("x", x, 0, low_open=True)
    return 1 << max(0, math.ceil(math.log2(x)))


def usd_per_training_token(mdl: str | Model, seq_len: int, chip: str | GPU, mfu: float | None = None,
                           usd_per_gpu_hour: float | None = None, dtype: str = "bf16",
                           attention: str = "full") -> float:
    """Dollars per trained token: :func:`usd_per_flop` x model FLOPs per token. The price defaults
    to ``serving_memory.gpu_hour_usd`` (the book's one GPU-hour price)."""
    return usd_per_flop(chip, mfu, usd_per_gpu_hour, dtype) * model_flops_per_token(mdl, seq_len, attention)


# ---- the margin on a fleet, and the price of a FLOP (N038, N041); stragglers: lib.training.stragglers -------------------------------------


def eval_time_fraction(eval_tokens: float, train_tokens_between: float, relative_speed: float = 1.0) -> float:
    """Fraction of wall time spent evaluating: ``eval_tokens`` forward-only tokens (1/3 of a training
    token's FLOPs) every ``train_tokens_between`` training tokens, evaluation running at
    ``relative_speed`` x the training FLOP rate: e / (e + K) with e = E / (3 x speed)."""
    e = real("eval_tokens", eval_tokens, 0)
    k = real("train_tokens_between", train_tokens_between, 0, low_open=True)
    v = real("relative_speed", relative_speed, 0, low_open=True)
    if v > 1.5:
        raise ValueError(f"relative_speed must be at most 1.5 (evaluation FLOP rate / training FLOP rate), got {v!r}")
    cost = e / (3.0 * v)
    return cost / (cost + k)


def fleet_margin(lost_fractions) -> float:
    """Extra GPUs, as a fraction of the compute-only count, that give back the wall time lost to
    independent causes that each take a fraction f_i of it: 1 / prod(1 - f_i) - 1."""
    keep = 1.0
    for i, f in enumerate(lost_fractions):
        v = real(f"lost_fractions[{i}]", f, 0)
        if v >= 1:
            raise ValueError(f"lost_fractions[{i}] must be below 1 (a fraction of wall time), got {f!r}")
        keep *= 1.0 - v
    return 1.0 / keep - 1.0


def usd_per_flop(chip: str | GPU, mfu: float | None = None, usd_per_gpu_hour: float | None = None,
                 dtype: str = "bf16") -> float:
    """Dollars per useful (model) FLOP: price per GPU-second / (dense peak x MFU). The price defaults
    to ``serving_memory.gpu_hour_usd``."""
    from lib.perf.memory import gpu_hour_cost

    return gpu_hour_cost(1, usd_per_gpu_hour) / 3600.0 / (_peak(chip, dtype) * default_mfu(mfu))
