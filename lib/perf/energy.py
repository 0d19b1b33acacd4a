"""Energy per generated token: power over throughput, and the power assumptions behind it.

    J/token = P / X       (watts over tokens/s)

X moves with batch size along the modelled decode step (:func:`lib.perf.step.decode_step`, read
through :mod:`lib.perf.throughput`: tens of times between batch 1 and a full batch); P is pinned between a memory-bound floor and the TDP cap.
Power figures that are not datasheet facts (idle and decode-floor fractions of TDP, server
overhead, PUE, HBM energy per bit) come from ``data/assumptions.yaml`` (``power``).
SI units: watts, joules, tokens/s, bytes/s.
"""

from __future__ import annotations

import numpy as np

from lib.inputs import fraction, real
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.perf.step import StepAssumptions
from lib.registry import assumptions
from lib.registry.hardware import GPU, gpu


def assumed(path: str) -> float:
    """One number of the ``power`` section of ``data/assumptions.yaml`` by dotted path
    (``"server.pue"``), read through :mod:`lib.registry.assumptions`."""
    return float(assumptions.value("power." + path))


def resolve(path: str, given: float | None = None) -> float:
    """``given`` when set, else the value at ``path`` in assumptions.yaml (power): how a notebook
    parameter left ``None`` takes its data value (e.g. ``resolve("server.pue", PUE)``)."""
    return float(assumptions.resolve(given, "power." + path))


def joules_per_token(power_w, tokens_per_s):
    """Energy per token, J: power (W) / throughput (tokens/s). Scalars or arrays."""
    p = np.asarray(power_w, dtype=float)
    x = np.asarray(tokens_per_s, dtype=float)
    if np.any(~np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"power_w must be finite and >= 0 watts, got {power_w!r}")
    if np.any(~np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"tokens_per_s must be finite and > 0, got {tokens_per_s!r}")
    out = p / x
    return float(out) if out.ndim == 0 else out


def board_power_w(chip: str | GPU, load: float, floor_fraction: float | None = None) -> float:
    """Board power of one GPU at ``load`` in [0, 1]: TDP x (f + (1 - f) x load), capped at TDP.

    f = ``floor_fraction`` (default: decode_floor_fraction_of_tdp, the memory-bound decode
    floor). load 0 is a batch-1 decode, load 1 a saturated GPU held at its TDP cap.
    """
    g = gpu(chip)
    f = fraction(
        "floor_fraction",
        assumed("gpu_power.decode_floor_fraction_of_tdp")
        if floor_fraction is None
        else floor_fraction,
    )
    u = fraction("load", load)
    return g.tdp_w * (f + (1 - f) * u)


def _batches(batch) -> np.ndarray:
    b = np.atleast_1d(np.asarray(batch, dtype=float))
    if b.size == 0 or np.any(b < 1) or np.any(~np.isfinite(b)) or np.any(b != np.floor(b)):
        raise ValueError(f"batch must be an integer >= 1 (or an array of them), got {batch!r}")
    return b.astype(int)


def decode_load(dep: Deployment, context: int, batch, assume: StepAssumptions | None = None):
    """Load proxy in [0, 1]: how far throughput has climbed from batch 1 towards its ceiling,
    (X(B) - X(1)) / (ceiling - X(1)) on the modelled step (:mod:`lib.perf.throughput`);
    0 at batch 1, -> 1 as B -> infinity."""
    bs = _batches(batch)
    x1 = tput.tokens_per_s(dep, 1, context, assume)
    ceil = tput.throughput_ceiling(dep, context, assume)
    x = np.array([tput.tokens_per_s(dep, int(b), context, assume) for b in bs])
    out = np.clip((x - x1) / (ceil - x1), 0.0, 1.0)
    return float(out[0]) if np.ndim(batch) == 0 else out


def decode_energy(
    dep: Deployment, context: int, batch, floor_fraction: float | None = None,
    assume: StepAssumptions | None = None,
) -> dict[str, np.ndarray | float]:
    """Throughput, power and J/token of one decode replica of ``dep`` at ``batch``.

    X = B / t(B) (the modelled step, tokens/s of the replica); P = GPUs per replica x
    board_power_w(load(B)); J/token = P / X. Returns {'tokens_per_s', 'power_w', 'j_per_token',
    'load'}.
    """
    bs = _batches(batch)
    x = np.array([tput.tokens_per_s(dep, int(b), context, assume) for b in bs])
    x1 = tput.tokens_per_s(dep, 1, context, assume)
    ceil = tput.throughput_ceiling(dep, context, assume)
    loads = np.clip((x - x1) / (ceil - x1), 0.0, 1.0)
    power = dep.gpus_per_replica * np.array(
        [board_power_w(dep.chip, u, floor_fraction) for u in loads])
    j = joules_per_token(power, x)
    scalar = np.ndim(batch) == 0
    pick = (lambda a: float(np.asarray(a).reshape(-1)[0])) if scalar else (lambda a: np.asarray(a))
    return {
        "tokens_per_s": pick(x),
        "power_w": pick(power),
        "j_per_token": pick(j),
        "load": pick(loads),
    }


def wall_factor(server_overhead: float | None = None, pue: float | None = None) -> float:
    """Multiplier from GPU board energy to facility energy: server overhead x PUE.

    Default server overhead = DGX H100 max system power / (8 x 700 W); default PUE from data.
    """
    if server_overhead is None:
        server_overhead = assumed("server.dgx_h100_system_max_w") / (8 * gpu("h100-sxm").tdp_w)
    if pue is None:
        pue = assumed("server.pue")
    for name, v in (("server_overhead", server_overhead), ("pue", pue)):
        real(name, v, 1)
    return server_overhead * pue


def kwh_per_million_tokens(j_per_token: float) -> float:
    """kWh per 1e6 tokens: J/token x 1e6 / 3.6e6."""
    real("j_per_token", j_per_token, 0)
    return j_per_token * 1e6 / 3.6e6


def hbm_power_w(bytes_per_s: float, pj_per_bit: float | None = None) -> float:
    """Power to stream ``bytes_per_s`` from HBM: bytes/s x 8 x energy per bit (default from data)."""
    e = assumed("hbm.energy_pj_per_bit") if pj_per_bit is None else pj_per_bit
    real("bytes_per_s", bytes_per_s, 0)
    real("pj_per_bit", e, 0, low_open=True)
    return bytes_per_s * 8 * e * 1e-12


def weight_read_energy_j(weight_bytes: float, pj_per_bit: float | None = None) -> float:
    """Joules to read ``weight_bytes`` once from HBM (a physics floor on batch-1 J/token)."""
    return hbm_power_w(weight_bytes, pj_per_bit)  # bytes x 8 x pJ/bit: same product, 1 s
