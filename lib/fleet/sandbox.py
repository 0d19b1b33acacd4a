"""Code sandboxes: containers, gVisor, Firecracker microVMs and full VMs, priced per session (N047).

Each technology (:func:`tech`, figures in ``data/assumptions.yaml`` ``fleet.sandbox_tech``, with their
sources) has a start time, a memory overhead beyond the workload (the VMM, the Sentry, a guest
kernel) and a GPU path. :func:`session_bytes` is a session's memory; :func:`hosts_for_sessions` turns a
session count into hosts, bound by memory or by CPU, with whole sessions per host
(:func:`sessions_per_host`); :func:`first_fit_hosts` packs sessions one by one (the independent check).
:func:`gpu_hosts` sizes the GPU tier: sessions that need a GPU get a MIG slice inside a VM.

SI units: bytes, seconds. MiB = 2^20 bytes, GiB = 2^30 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.inputs import fraction, integer, real
from lib.registry import assumptions

__all__ = ["MIB", "GIB", "TECHS", "Tech", "first_fit_hosts", "gpu_hosts", "hosts_for_sessions", "session_bytes",
           "sessions_per_host", "tech"]

MIB = 2 ** 20
GIB = 2 ** 30
TECHS = ("container", "gvisor", "firecracker", "vm")
BOUNDARY = {"container": "shared host kernel (namespaces, cgroups, seccomp)",
            "gvisor": "user-space kernel (Sentry) in front of a filtered host kernel",
            "firecracker": "hardware virtualization, minimal VMM (KVM)",
            "vm": "hardware virtualization, full device model"}


@dataclass(frozen=True)
class Tech:
    """One isolation technology: start time (s), memory overhead per sandbox (bytes), GPU path."""

    name: str
    start_s: float
    overhead_bytes: float
    gpu: str
    boundary: str

    @property
    def has_gpu(self) -> bool:
        return not self.gpu.startswith("none")


def tech(name: str) -> Tech:
    """The technology ``name`` (one of :data:`TECHS`) from ``fleet.sandbox_tech``; Firecracker's
    overhead includes its guest kernel."""
    if name not in TECHS:
        raise ValueError(f"tech must be one of {', '.join(TECHS)}, got {name!r}")
    e = assumptions.entry(f"fleet.sandbox_tech.{name}")
    over = e["overhead_mib"]["value"] + (e["guest_kernel_mib"]["value"] if "guest_kernel_mib" in e else 0)
    return Tech(name, float(e["start_s"]["value"]), over * MIB, e["gpu"], BOUNDARY[name])


def session_bytes(t: Tech, workload_bytes: float) -> float:
    """Memory one session holds: the workload's resident memory plus the sandbox's overhead."""
    return real("workload_bytes", workload_bytes, 0, low_open=True, unit="bytes") + t.overhead_bytes


def sessions_per_host(t: Tech, workload_bytes: float, host_bytes: float, usable: float, vcpus: float,
                      host_cores: int, overcommit: float) -> tuple[int, str]:
    """Whole sessions one host holds, and which resource binds: floor(usable host memory / session
    bytes) against floor(cores x overcommit / vCPUs per session)."""
    mem = math.floor(real("host_bytes", host_bytes, 0, low_open=True) * fraction("usable", usable, allow_zero=False)
                     / session_bytes(t, workload_bytes))
    # a session that exactly fills the last vCPUs fits (the 1e-9 vCPU slack first_fit_hosts allows), though
    # cores x overcommit / vCPUs may land a rounding error below that whole number
    cpu = math.floor((integer("host_cores", host_cores, 1) * real("overcommit", overcommit, 0, low_open=True) + 1e-9)
                     / real("vcpus", vcpus, 0, low_open=True))
    return (mem, "memory") if mem <= cpu else (cpu, "CPU")


def hosts_for_sessions(sessions: int, t: Tech, workload_bytes: float, host_bytes: float, usable: float, vcpus: float,
                       host_cores: int, overcommit: float) -> dict:
    """Hosts for ``sessions`` sandboxes: ceil(sessions / sessions_per_host), and the exact fraction."""
    n = integer("sessions", sessions, 1)
    per, binds = sessions_per_host(t, workload_bytes, host_bytes, usable, vcpus, host_cores, overcommit)
    if per < 1:
        raise ValueError(f"one {t.name} session ({session_bytes(t, workload_bytes) / GIB:.3g} GiB, {vcpus} vCPUs) does "
                         "not fit a host: raise the host's memory or cores")
    return {"per_host": per, "binds": binds, "hosts": math.ceil(n / per), "exact": n / per}


def first_fit_hosts(sessions: int, t: Tech, workload_bytes: float, host_bytes: float, usable: float, vcpus: float,
                    host_cores: int, overcommit: float) -> int:
    """Place sessions one at a time on the first host with room for both its memory and its vCPUs,
    opening a host when none has room; the number of hosts opened."""
    need_m, need_c = session_bytes(t, workload_bytes), vcpus
    cap_m, cap_c = host_bytes * usable, host_cores * overcommit
    if need_m > cap_m or need_c > cap_c:
        raise ValueError("one session does not fit a host")
    hosts = 0
    free_m = free_c = 0.0  # the open host; identical sessions fill hosts in order, so first fit keeps one open
    for _ in range(integer("sessions", sessions, 1)):
        if free_m < need_m or free_c < need_c - 1e-9:
            hosts += 1
            free_m, free_c = cap_m, cap_c
        free_m -= need_m
        free_c -= need_c
    return hosts


def gpu_hosts(gpu_sessions: int, gpus_per_host: int, slices_per_gpu: int) -> dict:
    """Hosts for sessions that each need a GPU slice in a VM: ceil(sessions / (GPUs x slices))."""
    n = integer("gpu_sessions", gpu_sessions, 0)
    per = integer("gpus_per_host", gpus_per_host, 1) * integer("slices_per_gpu", slices_per_gpu, 1)
    return {"per_host": per, "hosts": math.ceil(n / per)}
