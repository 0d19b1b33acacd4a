"""Overload arithmetic (lib.scheduling.overload): the closed form of one spike against the fluid
integration, conservation and the bound, retries, and both against the engine simulator."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling import LinearCost, Policy, Workload, simulate
from lib.scheduling.overload import fluid_queue, spike_closed_form, spike_schedule


@settings(max_examples=15, deadline=None)
@given(mu=st.floats(2, 50), base=st.floats(0.2, 0.8), spike=st.floats(1.1, 2.5), d=st.floats(10, 90),
       tau=st.floats(1, 60))
def test_closed_form_equals_the_fluid_integration(mu, base, spike, d, tau):
    lam0, lams = base * mu, spike * mu
    c = spike_closed_form(mu, lam0, lams, d, tau)
    dt = 0.1
    run = fluid_queue(spike_schedule(lam0, lams, d, 10.0, c.drain_s + 60), mu, timeout_s=tau, dt=dt)
    end = 10.0 + d
    # the grid resolves times to a step or two; counts to a step's worth of service
    assert run.backlog.max() == pytest.approx(c.backlog_peak, rel=0.01, abs=mu * dt)
    assert run.last_time("backlog", above=mu * dt) - end == pytest.approx(c.drain_s, rel=0.01, abs=3 * dt)
    assert run.total("dead") == pytest.approx(c.dead_requests, rel=0.02, abs=mu * 3 * dt)
    if c.dead_requests > mu:
        assert run.last_time("dead") - end == pytest.approx(c.dead_served_until_s, rel=0.01, abs=3 * dt)
    # every arrival is served once: nothing is lost without a bound
    assert run.total("served") == pytest.approx(run.total("offered"), rel=1e-9)


def test_no_dead_requests_when_the_peak_wait_is_within_the_timeout():
    c = spike_closed_form(10.0, 7.0, 12.0, 30.0, 10.0)  # backlog 60, peak wait 6 s
    assert c.wait_peak_s == pytest.approx(6.0) and c.dead_requests == 0 and c.dead_served_until_s == 0


@settings(max_examples=30, deadline=None)
@given(mu=st.floats(2, 30), spike=st.floats(1.2, 4.0), limit=st.floats(1, 200), tau=st.floats(1, 30))
def test_the_bound_holds_and_requests_are_conserved(mu, spike, limit, tau):
    run = fluid_queue(spike_schedule(0.5 * mu, spike * mu, 60, 10, 200), mu, timeout_s=tau, queue_limit=limit,
                      dt=0.1)
    assert run.backlog.max() <= limit + 1e-9
    left = run.backlog[-1]
    assert run.total("offered") == pytest.approx(run.total("served") + run.total("rejected") + left, rel=1e-9)
    if limit <= mu * tau:  # a bound of capacity x timeout keeps every wait within the timeout
        assert run.total("dead") == pytest.approx(0.0, abs=1e-9)


def test_retries_come_back_and_every_client_is_accounted_for():
    sched = spike_schedule(6.0, 14.0, 60, 20, 300)
    clients = sum(d * r for d, r in sched)
    once = fluid_queue(sched, 8.6, timeout_s=10, queue_limit=86)
    again = fluid_queue(sched, 8.6, timeout_s=10, queue_limit=86, retry_after_s=10, retry_jitter_s=60,
                        max_attempts=10)
    assert once.total("offered") == pytest.approx(clients)
    assert again.total("offered") > clients  # retries are extra attempts
    assert again.total("served") > once.total("served")
    # each client is served once or gives up after its last attempt: served <= clients
    assert again.total("served") <= clients + 1e-6
    eager = fluid_queue(sched, 8.6, timeout_s=10, queue_limit=86, retry_after_s=1, max_attempts=10)
    assert eager.offered.max() > 3 * again.offered.max()  # the retry storm
    assert eager.total("rejected") > again.total("rejected")


def test_fluid_against_the_engine_with_a_fixed_service_time():
    # batch 1, one step of 1 / mu per request: a server of capacity mu, Poisson arrivals with a spike
    mu = 10.0
    cost = LinearCost(fixed_s=1 / mu, max_running=1, token_budget=4096)
    sched = spike_schedule(6.0, 16.0, 60, 30, 120)
    c = spike_closed_form(mu, 6.0, 16.0, 60, 5.0)
    res = simulate(Workload(prompt=16, output=1, rate_schedule=sched, n_requests=None), Policy(), cost, seed=3)
    tl = res.timeline
    k = int(np.searchsorted(tl.start_s, 90.0))
    assert tl.waiting[k] == pytest.approx(c.backlog_peak, rel=0.2)
    dead = sum(r.ttft_s > 5.0 for r in res.requests)
    assert dead == pytest.approx(c.dead_requests, rel=0.2)
    bounded = simulate(Workload(prompt=16, output=1, rate_schedule=sched, n_requests=None),
                       Policy(queue_limit=int(mu * 5)), cost, seed=3)
    # the fluid fed the arrivals this seed drew (Poisson counts differ from the rates by a few %)
    arr = np.array([r.arrival_s for r in bounded.requests])
    edges = np.cumsum([0.0] + [d for d, _ in sched])
    drawn = tuple((d, float(((arr >= a) & (arr < a + d)).sum()) / d) for (d, _), a in zip(sched, edges, strict=False))
    fluid = fluid_queue(drawn, mu, timeout_s=5.0, queue_limit=mu * 5)
    rejected = sum(r.status == "rejected" for r in bounded.requests)
    assert rejected == pytest.approx(fluid.total("rejected"), rel=0.2)


def test_validation():
    with pytest.raises(ValueError, match="base_rate"):
        spike_closed_form(10, 12, 15, 60, 5)
    with pytest.raises(ValueError, match="spike_rate"):
        spike_closed_form(10, 5, 9, 60, 5)
    with pytest.raises(ValueError, match="schedule"):
        fluid_queue((), 10, timeout_s=5)
    with pytest.raises(ValueError, match="name"):
        fluid_queue(((10, 1),), 10, timeout_s=5).total("backlog")
