"""Collective-communication cost models (alpha-beta): a latency per call plus bytes over bandwidth."""

from __future__ import annotations


def ring_allreduce_bytes_per_gpu(message_bytes: float, n_gpus: int) -> float:
    """Bytes each GPU sends in a ring all-reduce: 2 (n - 1) / n x message bytes."""
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes}")
    return 2.0 * (n_gpus - 1) / n_gpus * message_bytes


def ring_allreduce_time_s(message_bytes: float, n_gpus: int, link_bandwidth: float,
                          latency_s: float = 0.0) -> float:
    """Time of one ring all-reduce, seconds: latency + 2 (n - 1) / n x bytes / link bytes/s.

    ``link_bandwidth`` is per direction (NVLink: 450e9 on H100). One GPU: no communication.
    """
    if n_gpus == 1:
        return 0.0
    if link_bandwidth is None or link_bandwidth <= 0:
        raise ValueError("link_bandwidth must be > 0 bytes/s for n_gpus > 1 (this GPU has no scale-up link)")
    if latency_s < 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s}")
    return latency_s + ring_allreduce_bytes_per_gpu(message_bytes, n_gpus) / link_bandwidth
