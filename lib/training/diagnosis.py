"""A loss that stops moving: a small deterministic training run with injectable faults, the metrics
a real run logs, and the ordered checks that name the fault from those metrics alone.

The run (:func:`simulate`) trains a softmax-regression model (``FEATURES`` inputs, ``CLASSES``
classes, labels from a seeded teacher with label noise) by SGD with momentum on ``ranks``
simulated data-parallel ranks. Each rank reads its own shard of the corpus, computes its gradient
in fp16 under a dynamic loss scaler (:class:`LossScaler`, the arithmetic of torch's GradScaler on
real ``numpy.float16`` numbers), and the ranks' gradients are averaged (the all-reduce). The LR
follows linear warmup then cosine decay. Logged per step: the step counter, LR, training loss,
held-out loss, global and per-rank gradient norms, the loss scale, whether the step was skipped,
and how many distinct samples the run has read.

Faults (``FAULTS``): ``lr_zero`` (the scheduler is never stepped, the LR stays at warmup's
starting value 0), ``data_repeat`` (every rank's loader serves the first batch of its shard
again and again), ``scale_collapse`` (the backward emits an inf every step whatever the scale, so
every step is skipped and the scaler halves without end), ``dead_rank`` (rank 0 contributes zeros
to the all-reduce), ``step_stuck`` (after a resume the step counter is restored but never
advanced: the LR schedule and the data sampler, both keyed by it, freeze).

:func:`diagnose` runs the checks in order (step counter, LR and gradient norm, data repetition,
loss scaler, per-rank gradients) over the last ``window`` steps and names the first that fails.
Dimensionless; steps are optimizer steps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from lib.inputs import integer, real

__all__ = ["CHECKS", "CLASSES", "FAULTS", "FEATURES", "FP16_MAX", "FP16_MIN_NORMAL", "FP16_MIN_SUBNORMAL",
           "Diagnosis", "LossScaler", "RunConfig", "RunMetrics", "diagnose", "distinct_fraction", "fp16_scaled", "simulate",
           "simulate_faults",
           "underflow_fraction"]

FEATURES = 16
CLASSES = 8
CORPUS = 4096  # training samples
HELDOUT = 256
FP16_MAX = float(np.finfo(np.float16).max)  # 65504
FP16_MIN_NORMAL = float(np.finfo(np.float16).tiny)  # 2^-14
FP16_MIN_SUBNORMAL = float(np.float16(2.0 ** -24))  # below half of it, a value rounds to 0
FAULTS = ("healthy", "lr_zero", "data_repeat", "scale_collapse", "dead_rank", "step_stuck")
CHECKS = ("step counter", "learning rate and grad norm", "data repetition", "loss scaler", "per-rank gradients")
FAULT_OF_CHECK = {"step counter": "step_stuck", "learning rate and grad norm": "lr_zero",
                  "data repetition": "data_repeat", "loss scaler": "scale_collapse", "per-rank gradients": "dead_rank"}


# ---- fp16 and the dynamic loss scaler -------------------------------------------------------------


def fp16_scaled(grad, scale: float) -> tuple[np.ndarray, bool]:
    """``grad`` x ``scale`` rounded to fp16, as the backward of a scaled loss produces it, and whether
    it overflowed (any inf or nan: |x| above 65504 rounds to inf). Values under 2^-25 in magnitude
    flush to 0."""
    s = real("scale", scale, 0)
    g = np.asarray(grad, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        g16 = (g * np.float32(s)).astype(np.float16)
    return g16, bool(not np.isfinite(g16).all())


def underflow_fraction(grad, scale: float) -> float:
    """Fraction of the non-zero entries of ``grad`` that become 0 in fp16 after multiplying by ``scale``."""
    g = np.asarray(grad, dtype=np.float32).ravel()
    nz = g != 0
    if not nz.any():
        raise ValueError("grad has no non-zero entry")
    g16, _ = fp16_scaled(g[nz], scale)
    return float(np.mean(g16 == 0))


def _scaler_default(name: str):
    from lib.registry import assumptions

    return assumptions.value(f"training.grad_scaler_{name}")


@dataclass
class LossScaler:
    """Dynamic loss scaling (torch.amp.GradScaler's rule): on an overflow the step is skipped and the
    scale multiplied by ``backoff`` (0.5); after ``growth_interval`` clean steps in a row it is
    multiplied by ``growth`` (2). The scale is an fp32 number, so halving without end reaches 0.
    The initial scale and the growth interval default to PyTorch's (data/assumptions.yaml: 2^16, 2,000)."""

    scale: float = field(default_factory=lambda: float(_scaler_default("init_scale")))
    growth: float = 2.0
    backoff: float = 0.5
    growth_interval: int = field(default_factory=lambda: int(_scaler_default("growth_interval")))
    clean: int = 0

    def __post_init__(self):
        real("scale", self.scale, 0, low_open=True)
        real("growth", self.growth, 1, low_open=True)
        real("backoff", self.backoff, 0, 1, low_open=True, high_open=True)
        integer("growth_interval", self.growth_interval, 1, unit="steps")

    def update(self, found_inf: bool) -> bool:
        """Record one step; return True when it must be skipped (``found_inf``)."""
        if found_inf:
            self.scale = float(np.float32(self.scale * self.backoff))
            self.clean = 0
            return True
        self.clean += 1
        if self.clean == self.growth_interval:
            self.scale = float(np.float32(self.scale * self.growth))
            self.clean = 0
        return False


# ---- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    """One simulated run. ``rank_batch`` samples per rank per step; the run is healthy until
    ``fault_step`` (a resume from a checkpoint, a replaced node, a new data mix) and the fault acts from
    there on; ``growth_interval`` is the scaler's (short, so a few-hundred-step run shows its sawtooth)."""

    fault: str = "healthy"
    steps: int = 200
    ranks: int = 4
    rank_batch: int = 16
    peak_lr: float = 0.5
    warmup: int = 20
    momentum: float = 0.9
    label_noise: float = 0.5
    growth_interval: int = 50
    fault_step: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {self.fault!r}")
        integer("steps", self.steps, 20, 5000, unit="steps")
        integer("ranks", self.ranks, 1, 64)
        integer("rank_batch", self.rank_batch, 1, 256, unit="samples")
        real("peak_lr", self.peak_lr, 0, 10, low_open=True)
        integer("warmup", self.warmup, 0, self.steps - 1, unit="steps (fewer than steps)")
        real("momentum", self.momentum, 0, 1, high_open=True)
        real("label_noise", self.label_noise, 0, 5)
        integer("growth_interval", self.growth_interval, 1, unit="steps")
        integer("fault_step", self.fault_step, 1, self.steps - 1, unit="steps (inside the run)")
        integer("seed", self.seed, 0)
        if self.fault == "dead_rank" and self.ranks < 2:
            raise ValueError("ranks must be at least 2 for the dead_rank fault (one rank sends zeros, another does not)")


@dataclass(frozen=True)
class RunMetrics:
    """What the run logged, one entry per optimizer step (arrays of length ``steps``)."""

    config: RunConfig
    step: np.ndarray  # the logged step counter
    lr: np.ndarray
    loss: np.ndarray  # training loss of the step's global batch
    heldout: np.ndarray  # loss on the held-out set after the step
    grad_norm: np.ndarray  # global gradient norm after the all-reduce, unscaled (inf on an overflow)
    rank_grad_norm: np.ndarray  # (steps, ranks): what each rank contributed, unscaled
    loss_scale: np.ndarray  # the scale used for the step
    skipped: np.ndarray  # bool
    unique_samples: np.ndarray  # distinct training samples read so far
    sample_ids: np.ndarray  # (steps, global batch): which samples each step read
    heldout_floor: float  # held-out loss of the true label distribution (the best a model can do)
    heldout_start: float


def lr_at(step: int, peak: float, warmup: int, steps: int) -> float:
    """Linear warmup from 0 over ``warmup`` steps, then cosine decay to 10% of ``peak`` at ``steps``."""
    if step < warmup:
        return peak * step / warmup
    frac = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _loss(W, x, y) -> float:
    z = x @ W
    z = z - z.max(axis=1, keepdims=True)
    return float(-np.mean(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(axis=1))))


@functools.lru_cache(maxsize=16)
def _corpus(seed: int, label_noise: float):
    rng = np.random.default_rng(seed)
    teacher = rng.normal(0.0, 1.0, (FEATURES, CLASSES))
    x = rng.normal(0.0, 1.0, (CORPUS + HELDOUT, FEATURES)).astype(np.float32)
    logits = x @ teacher + rng.gumbel(0.0, label_noise, (CORPUS + HELDOUT, CLASSES)) if label_noise else x @ teacher
    y = np.argmax(logits, axis=1)
    for a in (x, y, teacher):
        a.setflags(write=False)
    return x, y, teacher


@functools.lru_cache(maxsize=64)
def simulate(config: RunConfig = RunConfig()) -> RunMetrics:
    """Run ``config`` (module doc); deterministic for a seed. Cached: treat the result as read-only."""
    return simulate_faults(replace(config, fault="healthy"), (config.fault,))[config.fault]


@functools.lru_cache(maxsize=32)
def simulate_faults(config: RunConfig, faults: tuple = FAULTS) -> dict:
    """The runs of ``config`` with each of ``faults`` injected (``config.fault`` is ignored), computed in
    lockstep (one vectorised loop for all of them); fault -> :class:`RunMetrics`. Each run is exactly
    what :func:`simulate` returns for it. Cached: treat the results as read-only."""
    if not faults or any(f not in FAULTS for f in faults):
        raise ValueError(f"faults must be a non-empty tuple of {', '.join(FAULTS)}, got {faults!r}")
    c = replace(config, fault="healthy")
    K = len(faults)
    x, y, teacher = _corpus(c.seed, c.label_noise)
    xt, yt, xh, yh = x[:CORPUS], y[:CORPUS], x[CORPUS:], y[CORPUS:]
    shard = CORPUS // c.ranks
    if shard < c.rank_batch:
        raise ValueError(f"ranks x rank_batch must fit the corpus of {CORPUS} samples per rank shard; got "
                         f"{c.ranks} ranks with batches of {c.rank_batch}")
    order = np.random.default_rng(c.seed + 1).permutation(CORPUS)
    n, R, b = c.steps, c.ranks, c.rank_batch
    batches_per_shard = shard // b
    # batch k of every rank's shard: ids (K, R * b), inputs (K, R, b, F) and their transposes, one-hot labels
    batch_ids = order[: shard * R].reshape(R, shard)[:, : batches_per_shard * b].reshape(R, batches_per_shard, b)
    batch_ids = batch_ids.transpose(1, 0, 2).reshape(batches_per_shard, R * b)
    xb_all = xt[batch_ids].reshape(batches_per_shard, R, b, FEATURES).astype(np.float64)
    xbt_all = np.ascontiguousarray(xb_all.transpose(0, 1, 3, 2)) / b
    yb_all = np.eye(CLASSES)[yt[batch_ids]].reshape(batches_per_shard, R, b, CLASSES)
    schedule = [lr_at(k, c.peak_lr, c.warmup, c.steps) for k in range(n + 1)]
    W = np.zeros((K, FEATURES, CLASSES))
    velocity = np.zeros_like(W)
    scalers = [LossScaler(growth_interval=c.growth_interval) for _ in faults]
    step_log, lr_log, scale_log = np.zeros((K, n)), np.zeros((K, n)), np.zeros((K, n))
    skipped = np.zeros((K, n), dtype=bool)
    k_log = np.zeros((K, n), dtype=np.int64)
    sent = np.zeros((n, K, R, FEATURES, CLASSES))  # what each rank put into the all-reduce (fp16 values, scaled)
    weights = np.zeros((n, K, FEATURES, CLASSES))  # the weights each step's batch was evaluated at
    counters = [0] * K
    runs = range(K)
    f16 = np.float16
    kinds = [(f == "lr_zero", f == "data_repeat", f == "scale_collapse", f == "dead_rank", f == "step_stuck")
             for f in faults]
    logs = []  # per step: (counters, lrs, scales, ks, keep), as python lists (cheaper than numpy item writes)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for t in range(n):
            after = t >= c.fault_step
            lrs = [0.0 if after and kinds[r][0] else schedule[counters[r]] for r in runs]
            ks = [(c.fault_step if after and kinds[r][1] else counters[r]) % batches_per_shard for r in runs]
            scales = [sc.scale for sc in scalers]
            weights[t] = W
            # (K, R, b, C) logits: each rank reads the k-th batch of its own shard. Inputs are N(0, 1) and the
            # weights stay far below exp's range, so the softmax needs no max subtraction here
            p = np.exp(xb_all[ks] @ W[:, None])
            p /= p.sum(axis=3, keepdims=True)
            p -= yb_all[ks]
            g16 = sent[t]
            g16[...] = ((xbt_all[ks] @ p) * np.array(scales)[:, None, None, None]).astype(f16)  # fp16 backward
            if after:
                for r in runs:
                    if kinds[r][2]:
                        g16[r, 0, 0, 0] = np.inf  # an op whose backward overflows at any scale
                    if kinds[r][3]:
                        g16[r, 0] = 0.0  # rank 0 sends zeros into the all-reduce
            total = g16.sum(axis=1)  # the all-reduce, (K, F, C)
            sums = total.sum(axis=(1, 2)).tolist()  # inf or nan when any rank overflowed
            keep = [not scalers[r].update(not (scales[r] > 0 and math.isfinite(sums[r]))) for r in runs]
            for r in runs:
                if keep[r]:
                    velocity[r] = c.momentum * velocity[r] + total[r] * (1.0 / (R * scales[r]))
                    W[r] -= lrs[r] * velocity[r]
                if not (after and kinds[r][4]):
                    counters[r] += 1  # a skipped step advances it too (the trainer's global step and the scheduler do)
            logs.append((list(counters), lrs, scales, ks, keep))
    for t, (cnt, lrs, scales, ks, keep) in enumerate(logs):
        step_log[:, t], lr_log[:, t], scale_log[:, t], k_log[:, t] = cnt, lrs, scales, ks
        skipped[:, t] = [not k for k in keep]
    floor = _loss(teacher / c.label_noise, xh, yh) if c.label_noise else 0.0
    start = _loss(np.zeros((FEATURES, CLASSES)), xh, yh)
    out = {}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for r, fault in enumerate(faults):
            kl = k_log[r]
            zt = xb_all[kl] @ weights[:, r, None]  # (n, R, b, C): each step's training logits
            zt -= zt.max(axis=3, keepdims=True)
            loss = np.mean(np.log(np.exp(zt).sum(axis=3)) - (zt * yb_all[kl]).sum(axis=3), axis=(1, 2))
            unscale = np.where(scale_log[r] > 0, scale_log[r], np.nan)
            s_r = sent[:, r]
            rank_norm = np.sqrt((s_r * s_r).sum(axis=(2, 3))) / unscale[:, None]
            rank_norm = np.where(np.isfinite(rank_norm), rank_norm, np.inf)
            grad = s_r.sum(axis=1) / (R * unscale[:, None, None])
            norm = np.sqrt((grad * grad).sum(axis=(1, 2)))
            norm = np.where(np.isfinite(norm), norm, np.inf)
            after = np.concatenate([weights[1:, r], W[r][None]])
            zh = xh @ after.astype(np.float32)  # (n, held-out, C): the held-out logits after each step, fp32
            zh -= zh.max(axis=2, keepdims=True)
            heldout = -np.mean(zh[:, np.arange(HELDOUT), yh] - np.log(np.exp(zh).sum(axis=2)), axis=1)
            heldout = heldout.astype(np.float64)
            ids = batch_ids[kl]
            first = np.full(CORPUS, n)
            np.minimum.at(first, ids, np.arange(n)[:, None])  # the step that first read each sample
            unique = np.cumsum(np.bincount(first, minlength=n + 1)[:n]).astype(float)
            arrays = (step_log[r].copy(), lr_log[r].copy(), loss, heldout, norm, rank_norm, scale_log[r].copy(),
                      skipped[r].copy(), unique, ids)
            for a in arrays:
                a.setflags(write=False)
            out[fault] = RunMetrics(replace(c, fault=fault), *arrays, floor, start)
    return out


# ---- the ordered checks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    """The checks' readings over the window, which fired, and the first that did (the fault named)."""

    readings: dict  # check -> the number it looked at
    fired: dict  # check -> bool
    first: str | None  # the first check that fired, in CHECKS order, or None (healthy)

    @property
    def fault(self) -> str:
        """The fault the first failing check names (``"healthy"`` when none fails)."""
        return "healthy" if self.first is None else FAULT_OF_CHECK[self.first]


def diagnose(m: RunMetrics, window: int = 50, skip_tolerance: float = 0.25, dead_ratio: float = 0.01,
             repeat_ratio: float = 0.5) -> Diagnosis:
    """The checks in order over the last ``window`` steps of ``m``:

    1. step counter: did the logged step advance at all (fires when it did not);
    2. learning rate and grad norm: is the LR 0, or the finite grad norm 0, on every step of the window;
    3. data repetition: are fewer than ``repeat_ratio`` of the samples read in the window distinct
       (out of the reads, or of the corpus when the window reads more than one epoch);
    4. loss scaler: were more than ``skip_tolerance`` of the window's steps skipped for overflow
       (a healthy scaler skips one step per growth interval);
    5. per-rank gradients: is one rank's median gradient norm under ``dead_ratio`` of the others'.
    """
    w = integer("window", window, 2, len(m.step), unit=f"steps (at most the run's {len(m.step)})")
    real("skip_tolerance", skip_tolerance, 0, 1)
    real("dead_ratio", dead_ratio, 0, 1)
    real("repeat_ratio", repeat_ratio, 0, 1)
    sl = slice(len(m.step) - w, None)
    advanced = float(m.step[sl][-1] - m.step[sl][0])
    lr_max = float(np.max(m.lr[sl]))
    finite = m.grad_norm[sl][np.isfinite(m.grad_norm[sl])]
    grad_max = float(finite.max()) if finite.size else math.inf
    read = m.sample_ids[sl].ravel()
    distinct = float(len(np.unique(read)) / min(len(read), CORPUS))
    skipped = float(np.mean(m.skipped[sl]))
    rank_med = np.array([np.median(col[np.isfinite(col)]) if np.isfinite(col).any() else math.inf
                         for col in m.rank_grad_norm[sl].T])
    others = np.array([np.median(np.delete(rank_med, r)) for r in range(len(rank_med))]) if len(rank_med) > 1 \
        else rank_med
    with np.errstate(invalid="ignore"):
        ratios = np.where(others > 0, rank_med / np.where(others > 0, others, 1.0), 1.0)
    weakest = float(np.nanmin(ratios)) if len(rank_med) > 1 and not np.isnan(ratios).all() else 1.0
    readings = {"step counter": advanced, "learning rate and grad norm": min(lr_max, grad_max),
                "data repetition": distinct, "loss scaler": skipped, "per-rank gradients": weakest}
    fired = {"step counter": advanced == 0,
             "learning rate and grad norm": lr_max == 0.0 or grad_max == 0.0,
             "data repetition": distinct < repeat_ratio,
             "loss scaler": skipped > skip_tolerance,
             "per-rank gradients": weakest < dead_ratio}
    first = next((c for c in CHECKS if fired[c]), None)
    return Diagnosis(readings, fired, first)


def distinct_fraction(m: RunMetrics, window: int = 10) -> np.ndarray:
    """Per step, the fraction of the samples read over the last ``window`` steps that are distinct
    (of the reads, or of the corpus when the window reads more than one epoch); 1 for a fresh stream."""
    w = integer("window", window, 1, len(m.step))
    n, B = m.sample_ids.shape
    flat = m.sample_ids.ravel()
    steps = np.repeat(np.arange(n), B)
    order = np.lexsort((steps, flat))  # reads grouped by sample, in step order
    prev = np.full(flat.size, -1)
    same = flat[order][1:] == flat[order][:-1]
    prev[order[1:]] = np.where(same, steps[order][:-1], -1)  # the step that last read the same sample
    prev = prev.reshape(n, B)
    out = np.empty(n)
    for t in range(n):
        a = max(0, t - w + 1)
        # a read counts once: when no earlier read of its sample falls inside the window
        out[t] = np.count_nonzero(prev[a:t + 1] < a) / min((t + 1 - a) * B, CORPUS)
    return out
