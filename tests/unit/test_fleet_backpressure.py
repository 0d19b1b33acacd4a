"""Per-connection byte budgets wired to cancellation (lib.fleet.backpressure) and the practice grader."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import backpressure as bp
from lib.fleet import backpressure_practice as pp
from lib.scheduling.streaming import stream

_OP = st.one_of(st.tuples(st.just("offer"), st.integers(1, 300)), st.tuples(st.just("take")),
                st.tuples(st.just("wrote"), st.integers(0, 400)), st.tuples(st.just("disconnect")))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 800), st.lists(_OP, max_size=40))
def test_reference_matches_the_oracle_on_any_program(budget, ops):
    pp.run(bp.ConnectionBuffer, (("config", budget), *ops))  # raises on any difference


def test_sse_event_is_the_openai_chunk():
    ev = bp.sse_event(" the")
    assert ev.startswith(b"data: {") and ev.endswith(b"}\n\n") and b'"delta":{"content":" the"}' in ev
    assert bp.sse_event_bytes() == len(ev)


def test_stopped_client_overflows_after_socket_plus_budget():
    ev, step = 200, 0.01
    run = bp.simulate_connection(10 * ev, ev, 100, step, 0.0, 5 * ev)
    assert run.reason == "overflow" and run.generated == 5 + 10 + 1  # 5 fill the socket, 10 the budget, 1 overflows
    assert run.peak_held == 10 * ev
    assert math.isclose(run.cancel_s, 16 * step)


def test_byte_simulation_agrees_with_the_token_simulation():
    ev, step, rate = 208, 0.02, 3.0
    run = bp.simulate_connection(64 * ev, ev, 800, step, rate * ev, 128 * ev)
    tok = stream(step, 800, [rate, math.inf], socket_tokens=128, buffer_tokens=64, on_full="drop")
    assert abs(run.cancel_s - tok.dropped_s[0]) <= 3 * step


def test_pending_write_draft_exceeds_the_budget_and_reference_never_does():
    ev = bp.sse_event_bytes()
    args = (64 * 1024, ev, 1024, 0.025, 2 * ev, 64 * 1024)
    assert bp.simulate_connection(*args).peak_held <= 64 * 1024
    assert bp.simulate_connection(*args, buffer_cls=pp.variant("pending write not counted")).peak_held > 64 * 1024


def test_disconnect_cancels_once():
    calls = []
    b = bp.ConnectionBuffer(100, calls.append)
    b.offer(b"x" * 50)
    b.disconnect()
    b.disconnect()
    assert calls == ["disconnect"] and b.held_bytes == 0 and not b.offer(b"y")


def test_bad_inputs():
    with pytest.raises(ValueError, match="budget_bytes"):
        bp.ConnectionBuffer(0, print)
    with pytest.raises(ValueError, match="read_bytes_per_s"):
        bp.simulate_connection(100, 10, 10, 0.1, -1.0, 100)
    with pytest.raises(ValueError, match="disconnect_s"):
        bp.simulate_connection(100, 10, 10, 0.1, 1.0, 100, disconnect_s=-1)
    with pytest.raises(ValueError, match="n must be"):
        bp.ConnectionBuffer(100, print).wrote(5)


def test_grader_passes_reference_and_fails_every_draft():
    assert pp.check(pp.variant("reference")).passed
    for name in pp.VARIANTS:
        assert pp.check(pp.variant(name)).status == "failed", name
    assert pp.check(pp.Skeleton).status == "not implemented"


def test_grader_catches_an_off_by_one_budget_and_a_whole_pending_count():
    class OffByOne(pp.variant("reference")):
        def offer(self, event):  # refuses an event that exactly fills the budget
            if not self.cancelled and self.held_bytes + len(event) >= self.budget:
                self._cancel("overflow")
                return False
            return super().offer(event)

    class WholePending(pp.variant("reference")):
        def offer(self, event):  # counts the whole pending write, not its unsent part
            if not self.cancelled and self.queued + len(self.pending) + len(event) > self.budget:
                self._cancel("overflow")
                return False
            return super().offer(event)

    for cls in (OffByOne, WholePending):
        report = pp.check(cls)
        assert report.status == "failed", cls.__name__
