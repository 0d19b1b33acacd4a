"""N047 code-sandbox-isolation: technologies from data, sessions to hosts, first-fit packing, GPU slices."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import sandbox as sb


def test_techs_come_from_the_assumptions_with_sources():
    from lib.registry import assumptions

    fc = sb.tech("firecracker")
    assert fc.start_s == 0.125 and not fc.has_gpu  # Agache et al., NSDI 2020
    assert assumptions.value("fleet.sandbox_tech.firecracker.overhead_mib") <= 5
    assert "NSDI 2020" in assumptions.source("fleet.sandbox_tech.firecracker")
    assert sb.tech("vm").has_gpu and sb.tech("container").overhead_bytes < sb.tech("vm").overhead_bytes
    with pytest.raises(ValueError, match="tech must be"):
        sb.tech("docker")


def test_hosts_for_50k_sessions():
    t = sb.tech("firecracker")
    h = sb.hosts_for_sessions(50000, t, 256 * sb.MIB, 512 * sb.GIB, 0.9, 0.25, 128, 8.0)
    per = math.floor(512 * sb.GIB * 0.9 / (256 * sb.MIB + t.overhead_bytes))
    assert h["per_host"] == per and h["binds"] == "memory" and h["hosts"] == math.ceil(50000 / per)
    with pytest.raises(ValueError, match="does not fit"):
        sb.hosts_for_sessions(10, t, 64 * sb.GIB, 16 * sb.GIB, 0.9, 0.25, 128, 8.0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), wl=st.integers(16, 8192), host=st.integers(16, 1024), vcpu=st.floats(0.05, 8),
       cores=st.integers(4, 256), oc=st.floats(1, 16), name=st.sampled_from(sb.TECHS))
def test_first_fit_equals_whole_sessions_per_host(n, wl, host, vcpu, cores, oc, name):
    t = sb.tech(name)
    args = (wl * sb.MIB, host * sb.GIB, 0.9, vcpu, cores, oc)
    try:
        h = sb.hosts_for_sessions(n, t, *args)
    except ValueError:
        return
    assert sb.first_fit_hosts(n, t, *args) == h["hosts"]


def test_gpu_hosts():
    assert sb.gpu_hosts(1000, 8, 7) == {"per_host": 56, "hosts": 18}
    assert sb.gpu_hosts(0, 8, 7)["hosts"] == 0


def test_a_session_that_exactly_fills_the_vcpus_fits():
    """7 cores x 4.817... overcommit / 4.817... vCPUs is 7 sessions, though the float ratio lands just under 7
    (found by the property test above: the count said 2 hosts, first fit 1)."""
    x = 4.817245120044302
    args = (16 * sb.MIB, 16 * sb.GIB, 0.9, x, 7, x)
    assert sb.hosts_for_sessions(7, sb.tech("container"), *args)["hosts"] == sb.first_fit_hosts(7, sb.tech("container"), *args) == 1

