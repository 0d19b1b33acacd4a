"""The streaming path (lib.scheduling.streaming): the recurrences against a tick-by-tick state
machine, the invariants every design keeps, and the claims the design question makes.

The oracle, :func:`brute`, is a different algorithm: integer time, explicit connection queues,
buffers, a FIFO and a step loop that blocks, advanced one tick at a time with reads and writes
settled to a fixed point within each tick. With integer step and read intervals both must give
the same times.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling.streaming import stream


def brute(step: int, n_tok: int, gaps: list, mode: str, sock: int, buf: int | None = None,
          on_full: str = "drop", max_pause: int | None = None, horizon: int = 4000) -> dict:
    """Tick-by-tick simulation. ``gaps[i]``: ticks between reads (0: instant; None: never reads).
    Returns {'gen', 'send', 'read': (n, n_tok) arrays of ticks (inf: not by the horizon),
    'dropped': (n,), 'ends': [step ends]}."""
    n = len(gaps)
    gen, send, read = (np.full((n, n_tok), math.inf) for _ in range(3))
    dropped = np.full(n, math.inf)
    sockets = [deque() for _ in range(n)]
    buffers = [deque() for _ in range(n)]
    last_read = [None] * n
    fifo: deque = deque()
    ends: list = []
    made = [0] * n  # tokens generated per stream
    alive = [True] * n
    included = [False] * n
    last_inc_end = [0] * n  # end of the last step that made a token of the stream (pause start)
    paused_since = [None] * n
    # inline loop state
    state, step_end, k, pointer = "compute", step, 0, 0

    def settle(t: int) -> None:
        nonlocal pointer, state, step_end, k
        changed = True
        while changed:
            changed = False
            for i in range(n):  # clients read
                g = gaps[i]
                while sockets[i] and g is not None and (last_read[i] is None or t >= last_read[i] + g):
                    j = sockets[i].popleft()
                    read[i, j] = t
                    last_read[i] = t
                    changed = True
                    if g > 0:
                        break
            if mode == "inline" and state == "write":
                while pointer < n and len(sockets[pointer]) < sock:
                    sockets[pointer].append(k)
                    send[pointer, k] = t
                    pointer += 1
                    changed = True
                if pointer == n:
                    k += 1
                    state, step_end = "compute", t + step
                    changed = True
            elif mode == "shared":
                while fifo and len(sockets[fifo[0][0]]) < sock:
                    i, j = fifo.popleft()
                    sockets[i].append(j)
                    send[i, j] = t
                    changed = True
            elif mode == "per_stream":
                for i in range(n):
                    while buffers[i] and len(sockets[i]) < sock:
                        j = buffers[i].popleft()
                        sockets[i].append(j)
                        send[i, j] = t
                        changed = True

    for t in range(horizon + 1):
        settle(t)
        if mode == "inline":
            if state == "compute" and t == step_end and k < n_tok:
                ends.append(t)
                gen[:, k] = t
                state, pointer = "write", 0
        elif mode == "shared":
            if t % step == 0 and 0 < t <= n_tok * step:
                kk = t // step - 1
                ends.append(t)
                for i in range(n):
                    gen[i, kk] = t
                    fifo.append((i, kk))
        else:
            if t % step == 0 and t > 0 and any(included):  # a step ends: included streams make a token
                for i in range(n):
                    if not included[i]:
                        continue
                    if on_full == "drop" and buf is not None and len(buffers[i]) >= buf:
                        alive[i] = False
                        dropped[i] = t
                        buffers[i].clear()
                        continue
                    gen[i, made[i]] = t
                    buffers[i].append(made[i])
                    made[i] += 1
                    last_inc_end[i] = t
            settle(t)
            if max_pause is not None:
                for i in range(n):
                    if alive[i] and paused_since[i] is not None and t - paused_since[i] >= max_pause:
                        alive[i] = False
                        dropped[i] = paused_since[i] + max_pause
                        buffers[i].clear()
            if t % step == 0:  # a step starts: who is in it
                for i in range(n):
                    room = buf is None or len(buffers[i]) < buf or on_full == "drop"
                    included[i] = alive[i] and made[i] < n_tok and room
                    if alive[i] and made[i] < n_tok and not room:
                        if paused_since[i] is None:
                            paused_since[i] = last_inc_end[i]
                    elif included[i]:
                        paused_since[i] = None
        settle(t)
    return {"gen": gen, "send": send, "read": read, "dropped": dropped, "ends": np.asarray(ends, dtype=float)}


def _as_rates(gaps):
    return [math.inf if g == 0 else 0.0 if g is None else 1.0 / g for g in gaps]


def _close(got, want, name):
    got = np.where(got <= HORIZON + 1e-6, got, math.inf)  # what the tick simulation cannot see yet
    assert np.array_equal(np.isinf(got), np.isinf(want)), f"{name}: which events happen differs\n{got}\n{want}"
    assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=0, atol=1e-6), \
        f"{name} differs\n{got}\n{want}"


def _same(run, ref):
    _close(run.generated_s, ref["gen"], "generated")
    _close(run.sent_s, ref["send"], "sent")
    _close(run.read_s, ref["read"], "read")
    _close(run.dropped_s, ref["dropped"], "dropped")


HORIZON = 600


GAPS = st.lists(st.sampled_from([0, 0, 1, 2, 3, 5, 9, None]), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(step=st.integers(1, 4), n_tok=st.integers(1, 14), gaps=GAPS, sock=st.integers(1, 4),
       mode=st.sampled_from(["inline", "shared"]))
def test_inline_and_shared_match_the_tick_simulation(step, n_tok, gaps, sock, mode):
    run = stream(float(step), n_tok, _as_rates(gaps), mode=mode, socket_tokens=sock)
    _same(run, brute(step, n_tok, gaps, mode, sock, horizon=HORIZON))


@settings(max_examples=80, deadline=None)
@given(step=st.integers(1, 4), n_tok=st.integers(1, 14), gaps=GAPS, sock=st.integers(1, 4),
       buf=st.one_of(st.none(), st.integers(1, 4)), on_full=st.sampled_from(["drop", "pause"]),
       max_pause=st.one_of(st.none(), st.integers(1, 12)))
def test_per_stream_matches_the_tick_simulation(step, n_tok, gaps, sock, buf, on_full, max_pause):
    if on_full == "drop":
        max_pause = None
    run = stream(float(step), n_tok, _as_rates(gaps), mode="per_stream", socket_tokens=sock, buffer_tokens=buf,
                 on_full=on_full, max_pause_s=None if max_pause is None else float(max_pause))
    _same(run, brute(step, n_tok, gaps, "per_stream", sock, buf, on_full, max_pause, horizon=HORIZON))


# ---- invariants -----------------------------------------------------------------------------------

RATES = st.lists(st.sampled_from([0.0, 0.5, 2.0, 7.0, 30.0, 200.0, math.inf]), min_size=1, max_size=5)


def _occupancy_ok(run):
    """Connections never hold more than socket_tokens unread events; reads follow sends and keep
    the client's spacing; sends follow generation and keep each stream's order."""
    s = run.socket_tokens
    for i in range(run.streams):
        sent, rd, gen = run.sent_s[i], run.read_s[i], run.generated_s[i]
        ok = np.isfinite(sent)
        assert (sent[ok] >= gen[ok] - 1e-12).all()
        assert (np.diff(sent[ok]) >= -1e-12).all()
        r = rd[np.isfinite(rd)]
        assert (rd[np.isfinite(rd)] >= sent[np.isfinite(rd)] - 1e-12).all()
        if run.read_rates[i] > 0 and len(r) > 1:
            assert (np.diff(r) >= 1 / run.read_rates[i] - 1e-9).all()
        for j in np.flatnonzero(ok):  # at the moment token j is written, at most s - 1 others are unread
            unread = np.sum((sent[:j] <= sent[j]) & (rd[:j] > sent[j]))
            assert unread <= s - 1


@settings(max_examples=40, deadline=None)
@given(rates=RATES, n_tok=st.integers(1, 40), sock=st.integers(1, 8),
       mode=st.sampled_from(["inline", "shared", "per_stream"]), buf=st.integers(1, 8),
       on_full=st.sampled_from(["drop", "pause"]))
def test_connections_and_order_are_respected(rates, n_tok, sock, mode, buf, on_full):
    run = stream(0.03, n_tok, rates, mode=mode, socket_tokens=sock, buffer_tokens=buf, on_full=on_full)
    _occupancy_ok(run)
    if mode == "per_stream":
        held = [run.buffered_tokens(t) for t in np.unique(run.generated_s[np.isfinite(run.generated_s)])]
        assert max(held, default=0) <= buf * run.streams
        assert run.engine_stall_s == pytest.approx(0.0, abs=1e-9)
    if mode == "inline":
        ends = run.step_ends_s[np.isfinite(run.step_ends_s)]
        assert (np.diff(np.concatenate([[0.0], ends])) >= 0.03 - 1e-12).all()  # a step never gets shorter


@settings(max_examples=40, deadline=None)
@given(rates=st.lists(st.sampled_from([0.5, 2.0, 30.0, math.inf]), min_size=2, max_size=5),
       other=st.sampled_from([0.0, 0.3, 1.0, 5.0, math.inf]), n_tok=st.integers(2, 60),
       on_full=st.sampled_from(["drop", "pause"]), buf=st.one_of(st.none(), st.integers(1, 16)))
def test_per_stream_isolates_every_stream_from_the_others_clients(rates, other, n_tok, on_full, buf):
    """The bounded design stalls none: changing one client's rate changes no other stream's times."""
    a = stream(0.02, n_tok, rates, socket_tokens=4, buffer_tokens=buf, on_full=on_full)
    b = stream(0.02, n_tok, [other, *rates[1:]], socket_tokens=4, buffer_tokens=buf, on_full=on_full)
    for arr in ("generated_s", "sent_s", "read_s"):
        assert np.array_equal(getattr(a, arr)[1:], getattr(b, arr)[1:])


@pytest.mark.parametrize("mode", ["inline", "shared"])
def test_one_slow_client_drags_every_stream_to_its_read_interval(mode):
    """Once the slow connection is full, every stream's tokens arrive at the slow client's pace
    (inline: the loop waits; shared: the sender waits), about 1 / rate apart."""
    step, slow, sock, n = 0.03, 4.0, 16, 300
    run = stream(step, n, [slow] + [math.inf] * 7, mode=mode, socket_tokens=sock)
    fast = run.read_s[1]
    tail = np.diff(fast[n // 2:])
    assert np.mean(tail) == pytest.approx(1 / slow, rel=1e-6)
    assert run.max_gap_s()[1:].min() == pytest.approx(1 / slow, rel=1e-6)
    if mode == "inline":
        assert run.mean_step_interval_s > 5 * step and run.engine_stall_s > 0
        assert run.peak_buffered_tokens <= run.streams
    else:
        assert run.mean_step_interval_s == pytest.approx(step) and run.engine_stall_s == pytest.approx(0.0, abs=1e-9)
        # the FIFO grows by (streams - 1) x (1/step - slow) tokens per second once the sender waits
        assert run.peak_buffered_tokens > 0.5 * run.streams * n


def test_a_stopped_client_stops_the_inline_loop_forever_and_nobody_else_per_stream():
    rates = [0.0] + [math.inf] * 3
    inline = stream(0.02, 50, rates, mode="inline", socket_tokens=8)
    assert inline.status == ("stuck",) * 4
    assert math.isinf(inline.engine_stall_s)
    assert list(inline.delivered) == [0, 8, 8, 8]  # the ninth write to the stopped client never returns
    per = stream(0.02, 50, rates, socket_tokens=8, buffer_tokens=4, on_full="drop")
    assert per.status == ("dropped", "finished", "finished", "finished")
    assert per.dropped_s[0] == pytest.approx(0.02 * (8 + 4 + 1))  # the put of token 12 finds 4 buffered
    paused = stream(0.02, 50, rates, socket_tokens=8, buffer_tokens=4, on_full="pause")
    assert paused.status[0] == "stuck" and paused.status[1:] == ("finished",) * 3
    timed = stream(0.02, 50, rates, socket_tokens=8, buffer_tokens=4, on_full="pause", max_pause_s=1.0)
    assert timed.status[0] == "dropped" and timed.dropped_s[0] == pytest.approx(0.02 * 12 + 1.0)


def test_drop_time_matches_the_fluid_closed_form():
    """Drop: the stream's connection and buffer hold S + Q tokens more than its client has read;
    with tokens made every T and read at r < 1/T, the excess reaches S + Q near t = (S + Q) / (1/T - r)."""
    step, slow, sock, buf = 0.035, 2.0, 256, 64
    run = stream(step, 2000, [slow, math.inf], socket_tokens=sock, buffer_tokens=buf, on_full="drop")
    fluid = (sock + buf) / (1 / step - slow)
    assert run.dropped_s[0] == pytest.approx(fluid, rel=0.02)
    assert run.delivered[0] <= sock + slow * run.dropped_s[0] + 1 + sock  # what it read, plus the socket's rest
    assert run.status[1] == "finished" and run.delivered_tpot_s()[1] == pytest.approx(step)


def test_unbounded_per_stream_buffer_grows_at_the_rate_difference():
    step, slow, sock, n = 0.02, 5.0, 16, 400
    run = stream(step, n, [slow], socket_tokens=sock, buffer_tokens=None)
    t_end = n * step
    assert run.peak_buffered_tokens == pytest.approx(n - sock - slow * t_end, abs=2)
    assert run.status == ("finished",)


def test_pause_gives_the_slow_client_its_own_rate_and_holds_it_longer():
    step, slow = 0.03, 5.0
    run = stream(step, 200, [slow, math.inf], socket_tokens=8, buffer_tokens=4, on_full="pause")
    assert run.status == ("finished", "finished")
    assert run.delivered_tpot_s()[0] == pytest.approx(1 / slow, rel=0.02)
    assert run.delivered_tpot_s()[1] == pytest.approx(step)
    assert run.peak_buffered_tokens <= 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(step_s=0.0), "step_s"),
    (dict(tokens=0), "tokens"),
    (dict(read_rates=[]), "read_rates"),
    (dict(read_rates=[-1.0]), "read_rates"),
    (dict(read_rates=["fast"]), "read_rates"),
    (dict(mode="async"), "mode"),
    (dict(socket_tokens=0), "socket_tokens"),
    (dict(buffer_tokens=0), "buffer_tokens"),
    (dict(on_full="block"), "on_full"),
    (dict(max_pause_s=0.0), "max_pause_s"),
])
def test_bad_inputs_are_refused_with_a_message(kwargs, match):
    args = dict(step_s=0.03, tokens=10, read_rates=[1.0])
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stream(args.pop("step_s"), args.pop("tokens"), args.pop("read_rates"), **args)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), n_tok=st.integers(1, 300), sock=st.integers(1, 64), step=st.floats(0.001, 0.2))
def test_a_loop_whose_clients_keep_up_never_waits(n, n_tok, sock, step):
    """Inline with clients that read as fast as the loop writes: not one wait, exactly (no rounding)."""
    run = stream(step, n_tok, [1.0 / step] * n, mode="inline", socket_tokens=sock)
    assert run.engine_stall_s == 0.0 and not run.loop_waits_s.any()
    assert run.status == ("finished",) * n
