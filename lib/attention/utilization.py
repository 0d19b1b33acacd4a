"""Tensor cores against exponentials: the ceiling on attention's fraction of matmul peak.

Every score of attention costs matmul FLOPs on the tensor cores and one exponential on the
special-function unit (SFU, the MUFU pipe). Per score, whole GPU, in seconds:

    t_mma = F / (P x eff)         F = matmul FLOPs per score: 4 d forward (QK^T and PV,
                                  :func:`lib.attention.traffic.attention_flops`), 10 d backward
                                  with recomputation (:func:`lib.attention.backward.backward_flops`);
                                  P = dense tensor peak in ``dtype``; eff = the fraction of that peak
                                  the MMA instruction reaches (Hopper's wgmma: 1; the older mma.sync:
                                  about 2/3, FA3 blog footnote 1 citing arXiv:2402.13499)
    t_exp = 1 / (S x SMs x f)     S = SFU results per SM per clock (16 on A100/H100, CUDA guide),
                                  f = the clock the tensor peak is quoted at (FA3 paper's convention)
    t_alu = a / (P_fp32 / 2)      a = other FP32 softmax instructions per score (max, scale-subtract,
                                  row sum, conversion), an optional estimate (default 0)

The ratio the FA3 paper names is r = t_exp / t_mma at eff = 1 = P / (F S SMs f): per SM per clock,
(P / SMs / f) = 4096 FLOP (H100 dense BF16) against 16 exponentials, 256x, while a forward score
needs 4 x 128 = 512 FLOPs at head dim 128: r = 0.5. Two schedules bound the time per score:

    serialized  t = t_mma + t_exp + t_alu          softmax waits for the GEMMs and they for it
    overlapped  t = max(t_mma, t_exp + t_alu)      the softmax of one warpgroup runs under the
                                                   GEMMs of another (FA3's ping-pong, pipelining)

and utilization = (F / P) / t, the fraction of dense peak the matmul FLOPs reach. These are
ceilings from the arithmetic pipes alone: memory latency, synchronization and tile edges come on
top (the gap to a measured kernel is what they cost). SFU rate and clock come from
``data/hardware.yaml`` (``sfu_ops_per_sm_clock``, ``tensor_clock_mhz``), or are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.registry.hardware import GPU, gpu

__all__ = [
    "PASSES",
    "PUBLISHED_H100",
    "AttentionUtilization",
    "attention_utilization",
    "exp_to_matmul_ratio",
    "fa_schedules",
    "matmul_flops_per_score",
    "mma_sync_penalty_applies",
]

PASSES = ("forward", "backward")

def _published_h100() -> dict[str, tuple[float, str]]:
    from lib.registry import assumptions

    rows = assumptions.entry("anchors.flashattention_h100_tflops")
    return {k: (float(v["value"]), v["note"]) for k, v in rows.items() if isinstance(v, dict)}


#: Published H100 SXM5 attention throughputs (dense FP16/BF16 unless named), TFLOP/s, with their
#: sources: ``data/assumptions.yaml`` ``anchors.flashattention_h100_tflops`` (FA2 and FA3 papers, FA3 blog).
PUBLISHED_H100 = _published_h100()


def matmul_flops_per_score(head_dim: int, pass_: str = "forward") -> float:
    """Tensor-core FLOPs per (query, key) score: 4 d forward, 10 d backward (with recomputation);
    taken from the book's one count of each (attention_flops / backward_flops for one pair)."""
    from lib.attention.backward import backward_flops
    from lib.attention.traffic import attention_flops

    d = integer("head_dim", head_dim, 1)
    if pass_ == "forward":
        return attention_flops(1, d, n_k=1)
    if pass_ == "backward":
        return backward_flops(1, d, n_k=1)
    raise ValueError(f"pass_ must be one of {', '.join(PASSES)}; got {pass_!r}")


def _sfu_rate(g: GPU, sfu_ops_per_sm_clock: float | None, clock_hz: float | None) -> tuple[float, float]:
    sfu = g.sfu_ops_per_sm_clock if sfu_ops_per_sm_clock is None else sfu_ops_per_sm_clock
    clock = g.tensor_clock_hz if clock_hz is None else clock_hz
    if sfu is None or clock is None:
        raise ValueError(
            f"{g.key} has no special-function rate or tensor clock in data/hardware.yaml "
            "(sfu_ops_per_sm_clock, tensor_clock_mhz); pass sfu_ops_per_sm_clock= and clock_hz=, or pick a GPU "
            "that has them (a100-sxm, h100-sxm, h100-pcie, h200)")
    return (real("sfu_ops_per_sm_clock", sfu, 0, low_open=True),
            real("clock_hz", clock, 0, low_open=True, unit="Hz"))


def exp_to_matmul_ratio(chip: str | GPU, dtype: str = "bf16", head_dim: int = 128, pass_: str = "forward",
                        sfu_ops_per_sm_clock: float | None = None, clock_hz: float | None = None) -> float:
    """r = time of the exponentials / time of the matmuls at full tensor rate = P / (F x S x SMs x f).

    H100 SXM BF16, head dim 128, forward: 989.4e12 / (512 x 16 x 132 x 1.83e9) = 0.50 (the FA3 paper's
    '512x more matmul FLOPs ... 256x lower throughput'); FP8 doubles P and so r."""
    return attention_utilization(chip, dtype, head_dim, pass_=pass_, sfu_ops_per_sm_clock=sfu_ops_per_sm_clock,
                                 clock_hz=clock_hz).exp_to_matmul_ratio


@dataclass(frozen=True)
class AttentionUtilization:
    """The pipes' time per score and the utilization ceiling they set (module docstring)."""

    gpu: str
    dtype: str
    head_dim: int
    pass_: str
    overlap: bool
    matmul_flops_per_score: float
    mma_flops_per_sm_clock: float  # P / (SMs x f): 4096 on H100 dense BF16
    sfu_ops_per_sm_clock: float
    mma_efficiency: float
    alu_ops_per_score: float
    mma_s: float  # t_mma at eff = 1, seconds per score (whole GPU)
    exp_s: float
    alu_s: float

    @property
    def exp_to_matmul_ratio(self) -> float:
        """r = t_exp / t_mma at full tensor rate."""
        return self.exp_s / self.mma_s

    @property
    def mma_issue_s(self) -> float:
        """t_mma / eff: the tensor cores' time at the instruction's achievable rate."""
        return self.mma_s / self.mma_efficiency

    @property
    def step_s(self) -> float:
        """Seconds per score: serialized sum, or the overlapped max (module docstring)."""
        if self.overlap:
            return max(self.mma_issue_s, self.exp_s + self.alu_s)
        return self.mma_issue_s + self.exp_s + self.alu_s

    @property
    def utilization(self) -> float:
        """Fraction of dense tensor peak the matmul FLOPs reach: t_mma / step."""
        return self.mma_s / self.step_s

    def breakdown(self) -> dict[str, float]:
        """The step split into fractions that sum to 1: useful matmul at peak, MMA instruction
        loss, exposed exponentials, exposed other ALU work (what an overlap hides is not exposed)."""
        step = self.step_s
        if self.overlap:
            exposed = max(0.0, self.exp_s + self.alu_s - self.mma_issue_s)
            share = exposed / (self.exp_s + self.alu_s) if self.exp_s + self.alu_s else 0.0
            exp_part, alu_part = self.exp_s * share, self.alu_s * share
        else:
            exp_part, alu_part = self.exp_s, self.alu_s
        return {"matmul": self.mma_s / step, "mma_instruction_loss": (self.mma_issue_s - self.mma_s) / step,
                "exponentials": exp_part / step, "other_alu": alu_part / step}


def attention_utilization(chip: str | GPU, dtype: str = "bf16", head_dim: int = 128, *, pass_: str = "forward",
                          overlap: bool = False, mma_efficiency: float = 1.0, alu_ops_per_score: float = 0.0,
                          sfu_ops_per_sm_clock: float | None = None,
                          clock_hz: float | None = None) -> AttentionUtilization:
    """Utilization ceiling of attention's matmuls on ``chip`` (see the module docstring for the formulas).

    ``overlap`` False: softmax and GEMMs take turns (FA2's schedule within a warp); True: the
    exponentials (and ``alu_ops_per_score`` FP32 instructions) run under the GEMMs (FA3).
    ``mma_efficiency``: fraction of the tensor peak the MMA instruction reaches (mma.sync on Hopper
    about 2/3). Raises ValueError for a GPU without the SFU rate or clock, or a dtype without a peak.
    """
    g = gpu(chip)
    d = integer("head_dim", head_dim, 1)
    flops = matmul_flops_per_score(d, pass_)
    peak = g.peak_flops(dtype)
    sfu, clock = _sfu_rate(g, sfu_ops_per_sm_clock, clock_hz)
    eff = fraction("mma_efficiency", mma_efficiency, allow_zero=False)
    alu = real("alu_ops_per_score", alu_ops_per_score, 0)
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be True or False, got {overlap!r}")
    alu_s = alu / (g.peak_flops("fp32") / 2) if alu else 0.0
    return AttentionUtilization(
        g.key, dtype, d, pass_, overlap, flops, peak / (g.compute_units * clock), sfu, eff, alu,
        flops / peak, 1.0 / (sfu * g.compute_units * clock), alu_s)


def mma_sync_penalty_applies(chip: str | GPU) -> bool:
    """Whether FA2's mma.sync falls short of the tensor peak on ``chip``: on Hopper the peak needs
    the asynchronous wgmma (FA3 blog footnote 1); on Ampere and Ada mma.sync is the native path."""
    return gpu(chip).arch.startswith("Hopper")


def fa_schedules(chip: str | GPU, dtype: str = "bf16", head_dim: int = 128, *, pass_: str = "forward",
                 mma_sync_efficiency: float = 2 / 3, alu_ops_per_score: float = 0.0,
                 sfu_ops_per_sm_clock: float | None = None,
                 clock_hz: float | None = None) -> dict[str, AttentionUtilization]:
    """The three schedules the FA2 -> FA3 story compares, each an :func:`attention_utilization`:

    ``fa2``: mma.sync (``mma_sync_efficiency`` of peak on Hopper, 1 elsewhere), softmax serialized;
    ``wgmma``: full-rate MMA, softmax still serialized (FA3's rewrite before any overlap);
    ``fa3``: full-rate MMA with the softmax overlapped (ping-pong and intra-warpgroup pipelining).
    """
    eff = mma_sync_efficiency if mma_sync_penalty_applies(chip) else 1.0
    kw = dict(pass_=pass_, alu_ops_per_score=alu_ops_per_score, sfu_ops_per_sm_clock=sfu_ops_per_sm_clock,
              clock_hz=clock_hz)
    return {"fa2": attention_utilization(chip, dtype, head_dim, mma_efficiency=eff, **kw),
            "wgmma": attention_utilization(chip, dtype, head_dim, **kw),
            "fa3": attention_utilization(chip, dtype, head_dim, overlap=True, **kw)}
