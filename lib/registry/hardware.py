"""Accelerators as immutable typed records in SI units, loaded from ``data/hardware.yaml``.

``gpu("h100-sxm").peak_flops("bf16")`` is the DENSE tensor-core peak in FLOP/s (datasheet
sparse figures halved); ``memory_bandwidth`` is bytes/s; ``scaleup_bandwidth`` is the NVLink
(or Infinity Fabric per-peer) bandwidth per direction in bytes/s. The optional on-chip figures
(``smem_per_sm_bytes``, ``sfu_ops_per_sm_clock``, ``tensor_clock_hz``, ``compute_capability``) are None where
``data/hardware.yaml`` has no source for them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lib.registry.data import load_yaml, unknown_name
from lib.units import GB, TB, TFLOPS, KiB, MiB


@dataclass(frozen=True)
class GPU:
    """One accelerator. All quantities SI: FLOP/s, bytes, bytes/s, watts."""

    key: str
    name: str
    vendor: str
    arch: str
    peak_flops_by_dtype: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth: float
    scaleup_bandwidth: float | None
    scaleout_bandwidth: float | None
    scaleup_domain_gpus: int | None  # GPUs the scale-up link joins, when not a whole 8-GPU board
    l2_bytes: float
    compute_units: int
    tdp_w: float
    sources: Mapping[str, str]
    smem_per_sm_bytes: float | None = None  # shared memory one SM (AMD: CU) gives its blocks, bytes
    sfu_ops_per_sm_clock: float | None = None  # special-function (exp2 ...) results per SM per clock
    tensor_clock_hz: float | None = None  # the clock the dense tensor-core peak is computed at
    compute_capability: str | None = None  # NVIDIA's "9.0" etc. (lib.kernels.sm reads its per-SM limits); None on AMD

    def __hash__(self) -> int:
        """Hashable although its mappings are not (caches key on a GPU, e.g. a what-if
        ``dataclasses.replace(gpu("h100-sxm"), scaleout_bandwidth=...)``): the scalar fields."""
        return hash((self.key, self.name, self.memory_bytes, self.memory_bandwidth, self.scaleup_bandwidth,
                     self.scaleout_bandwidth, tuple(sorted(self.peak_flops_by_dtype.items()))))

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for matmuls in ``dtype`` (raises if the chip has no such unit)."""
        try:
            return self.peak_flops_by_dtype[dtype]
        except KeyError:
            raise ValueError(
                f"{self.name} has no {dtype!r} tensor-core peak; available: "
                f"{', '.join(self.peak_flops_by_dtype)}"
            ) from None

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Critical arithmetic intensity in FLOP/byte: peak FLOP/s / memory bytes/s."""
        return self.peak_flops(dtype) / self.memory_bandwidth

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes this chip has a tensor-core (or vector, for fp32) peak for."""
        return tuple(self.peak_flops_by_dtype)


def _value(entry: dict | None, scale: float) -> float | None:
    if entry is None or entry.get("value") is None:
        return None
    return float(entry["value"]) * scale


def _source(entry: dict, sources: dict) -> str:
    ids = entry.get("src", [])
    text = "; ".join(sources.get(i, i) for i in ids) or "no source listed"
    return f"{text} [{entry.get('check', 'unverified')}]"


def _build(key: str, raw: dict, sources: dict) -> GPU:
    peaks = {dt: float(e["value"]) * TFLOPS for dt, e in raw["peak_dense_tflops"].items()}
    nic = raw.get("scaleout_nic_gbit")
    fields = {
        "memory_bytes": raw["memory_gb"],
        "memory_bandwidth": raw["memory_bandwidth_tbps"],
        **{f"peak_{dt}": e for dt, e in raw["peak_dense_tflops"].items()},
        **{k: raw[k] for k in ("smem_per_sm_kib", "sfu_ops_per_sm_clock", "tensor_clock_mhz") if raw.get(k)},
    }
    units = raw.get("sm_count") or raw.get("cu_count")
    return GPU(
        key=key,
        name=raw["name"],
        vendor=raw["vendor"],
        arch=raw["arch"],
        peak_flops_by_dtype=MappingProxyType(peaks),
        memory_bytes=_value(raw["memory_gb"], GB),
        memory_bandwidth=_value(raw["memory_bandwidth_tbps"], TB),
        scaleup_bandwidth=_value(raw.get("scaleup_unidirectional_gbps"), GB),
        scaleout_bandwidth=_value(nic, GB / 8),
        scaleup_domain_gpus=(int(raw["scaleup_domain_gpus"]["value"])
                             if raw.get("scaleup_domain_gpus") else None),
        l2_bytes=_value(raw["l2_mb"], MiB),  # vendors print cache sizes in binary MB: 50 MB = 52,428,800 bytes
        compute_units=int(units["value"]),
        tdp_w=_value(raw["tdp_w"], 1.0),
        sources=MappingProxyType({k: _source(v, sources) for k, v in fields.items()}),
        smem_per_sm_bytes=_value(raw.get("smem_per_sm_kib"), KiB),
        sfu_ops_per_sm_clock=_value(raw.get("sfu_ops_per_sm_clock"), 1.0),
        tensor_clock_hz=_value(raw.get("tensor_clock_mhz"), 1e6),
        compute_capability=str(raw["compute_capability"]["value"]) if raw.get("compute_capability") else None,
    )


@functools.cache
def _registry() -> Mapping[str, GPU]:
    doc = load_yaml("hardware.yaml")
    return MappingProxyType({k: _build(k, v, doc["sources"]) for k, v in doc["gpus"].items()})


def gpu_names() -> list[str]:
    """Keys accepted by :func:`gpu`, in the order of ``data/hardware.yaml``."""
    return list(_registry())


def gpu(name: str | GPU) -> GPU:
    """Look up an accelerator by key (``"h100-sxm"``); a GPU passes through unchanged."""
    if isinstance(name, GPU):
        return name
    try:
        return _registry()[name]
    except KeyError:
        raise unknown_name("GPU", name, gpu_names()) from None
