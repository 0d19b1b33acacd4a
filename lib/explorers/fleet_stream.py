"""Explorers for the streaming path of a server (I061, I093): what the client sees, token by token,
when the output is decoded per token, by the offset window, and with stop-string holdback
(:mod:`lib.fleet.detokenizer`, :mod:`lib.fleet.stop_strings`).

Views call lib only; the figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, Text, View, explorer

TEXT_EXAMPLES = ("Total: 5 € 😀 ### ignored", "Hello world", "日本語のテキスト€", "a€b€c 😀😀 END x", "tail ##")
STOP_EXAMPLES = ("###", "", "END|😀😀", "€ END|\nUser:", "##")
MAX_TOKENS = 256  # the most tokens the token-stream figure draws (one bar slot per token)


def parse_stops(stops: str) -> tuple[str, ...]:
    """Stop strings typed as one text, separated by '|' ('' : none)."""
    if not isinstance(stops, str):
        raise ValueError(f"stops must be text (stop strings separated by '|'), got {stops!r}")
    return tuple(s for s in stops.split("|") if s)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.naive, = ax.step([], [], where="post", lw=1.2, ls="--", color="C3", label="each token decoded alone")
    a.window, = ax.step([], [], where="post", lw=2, color="C0", label="offset window")
    a.stop, = ax.step([], [], where="post", lw=1.5, color="C2", label="offset window + stop holdback")
    a.held = ax.bar(range(MAX_TOKENS), [0] * MAX_TOKENS, width=0.8, color="C1", alpha=0.5, label="held for a possible stop")
    a.total, = ax.plot([], [], lw=1, ls=":", color="grey", label="characters in the text")
    ax.set_xlabel("tokens generated")
    ax.set_ylabel("characters on the client")
    ax.grid(True)
    return a


def _draw(a, r) -> None:
    n = len(r["pieces"])
    xs = list(range(1, n + 1))
    a.naive.set_data(xs, r["naive_sent"])
    a.window.set_data(xs, r["window_sent"])
    a.stop.set_data(xs, r["stop_sent"])
    for k, bar in enumerate(a.held):
        bar.set_x(k + 1 - 0.4)
        bar.set_height(r["held"][k] if k < n else 0)
        bar.set_visible(k < n and r["held"][k] > 0)
    a.total.set_data([0.5, n + 0.5], [r["n_chars"]] * 2)
    a.ax.set_xlim(0.5, n + 0.5)
    a.ax.set_ylim(0, max(r["naive_sent"][-1], r["n_chars"]) * 1.1 + 1)
    figures.legend(a.ax, [a.naive, a.window, a.stop, a.held, a.total], loc="upper left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "fleet.token_stream",
    text=Text(TEXT_EXAMPLES, 200, label="generated text"),
    stops=Text(STOP_EXAMPLES, 40, label="stop strings (separated by |)"),
)
def token_stream(text: str, stops: str) -> View:
    """I061/I093: characters on the client per token, three ways of streaming, with the holdback."""
    from lib.fleet.stop_strings import trace

    r = trace(text, parse_stops(stops))
    n = len(r["pieces"])
    if n > MAX_TOKENS:
        raise ValueError(f"the text is {n:,} tokens; the explorer draws at most {MAX_TOKENS} (shorten it)")
    fig = _FIGURE(r)
    split = sum(1 for p in r["replacements"] if p)
    bad = sum(r["replacements"])
    rows = [("tokens", f"{n:,}"), ("tokens that hold part of a character", f"{split:,}"),
            ("replacement characters sent, per-token decoding", f"{bad:,}"),
            ("most characters held for a stop", f"{max(r['held']):,}"),
            ("stop matched at token", "no stop" if r["stop_at"] is None else f"{r['stop_at'] + 1:,}"),
            ("client receives", repr(r["stop_text"]))]
    caption = (f"Per-token decoding (dashed red) sends {bad:,} replacement character(s) for the {split:,} token(s) that "
               f"split a character; the offset window (blue) waits for each character to complete and ends with the "
               f"exact text. " + ("No stop string matches." if r["stop_at"] is None else
                                   f"With holdback (green) the client never sees the stop, which completes at token "
                                   f"{r['stop_at'] + 1:,}; orange bars are the characters held for it."))
    return View("What the client sees, token by token", rows, fig, caption=caption,
                values={"tokens": n, "replacements": bad, "held_max": max(r["held"])})


# ---- I099: one connection's bytes under a budget --------------------------------------------------

def _build_bp(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.ref, = ax.plot([], [], lw=2, color="C0", label="budget counts the pending write")
    a.draft, = ax.plot([], [], lw=1.2, ls="--", color="C3", label="budget counts the queue only")
    a.budget, = ax.plot([], [], lw=1, ls=":", color="grey", label="budget")
    a.cancel, = ax.plot([], [], "o", color="C0", ms=6, label="cancelled (engine request aborted)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("bytes held by the connection (KiB)")
    ax.grid(True)
    return a


def _draw_bp(a, ref, draft, budget_kib, t_end) -> None:
    a.ref.set_data(ref.held_s, [b / 1024 for b in ref.held_bytes])
    a.draft.set_data(draft.held_s, [b / 1024 for b in draft.held_bytes])
    a.budget.set_data([0, t_end], [budget_kib, budget_kib])
    if ref.reason is not None and ref.held_s:
        a.cancel.set_data([ref.cancel_s], [ref.held_bytes[-1] / 1024])
        a.cancel.set_visible(True)
    else:
        a.cancel.set_data([], [])
        a.cancel.set_visible(False)
    a.ax.set_xlim(0, t_end)
    top = max([budget_kib, *(b / 1024 for b in ref.held_bytes), *(b / 1024 for b in draft.held_bytes)])
    a.ax.set_ylim(0, top * 1.15 + 1e-9)
    figures.legend(a.ax, [a.ref, a.draft, a.budget, a.cancel], loc="upper left", fontsize=7)


_FIGURE_BP = figures.LiveFigure(6.0, 3.0, _build_bp, _draw_bp)


@explorer(
    "fleet.backpressure",
    budget_kib=FloatRange(1.0, 4096.0, 1.0, label="byte budget per connection (KiB)"),
    socket_kib=FloatRange(0.0, 4096.0, 1.0, label="socket buffer (KiB)"),
    read_rate=FloatRange(0.0, 1000.0, 0.5, label="client read rate (tokens/s)"),
    step_ms=FloatRange(2.0, 500.0, 1.0, label="engine step (ms)"),
    tokens=IntRange(16, 4096, label="reply length (tokens)"),
)
def backpressure(budget_kib: float, socket_kib: float, read_rate: float, step_ms: float, tokens: int) -> View:
    """I099: bytes one connection holds over time, with the budget counting the pending write or not."""
    from lib.fleet.backpressure import simulate_connection, sse_event_bytes
    from lib.fleet.backpressure_practice import variant
    from lib.units import fmt_bytes, fmt_time

    ev = sse_event_bytes()
    budget, sock, step = int(budget_kib * 1024), int(socket_kib * 1024), step_ms / 1000
    if budget < ev:
        raise ValueError(f"the budget ({budget:,} B) must hold at least one event ({ev} B)")
    args = (budget, ev, tokens, step, read_rate * ev, sock)
    ref = simulate_connection(*args)
    draft = simulate_connection(*args, buffer_cls=variant("pending write not counted"))
    fig = _FIGURE_BP(ref, draft, budget_kib, tokens * step)
    rows = [("event size", f"{ev} B"), ("peak held, pending counted", fmt_bytes(ref.peak_held, "KiB")),
            ("peak held, queue only", fmt_bytes(draft.peak_held, "KiB")),
            ("stream cancelled at", "never" if ref.reason is None else f"{fmt_time(ref.cancel_s)} ({ref.reason})"),
            ("tokens generated", f"{ref.generated:,} of {tokens:,}")]
    caption = ((f"A client reading {read_rate:g} tokens/s against one every {step_ms:g} ms: the budget that counts the "
                f"pending write holds at most {fmt_bytes(ref.peak_held, 'KiB')} and cancels the request at "
                f"{fmt_time(ref.cancel_s)}; counting only the queue lets the connection hold "
                f"{fmt_bytes(draft.peak_held, 'KiB')}.") if ref.reason else
               ((f"The client keeps up ({read_rate:g} tokens/s read, {1000 / step_ms:.3g} made)" if read_rate * step >= 1
                 else "The reply ends before the socket and the budget fill")
                + f": nothing overflows, the connection holds at most {fmt_bytes(ref.peak_held, 'KiB')} of its "
                  f"{budget_kib:g} KiB budget."))
    return View("One connection under a byte budget", rows, fig, caption=caption,
                values={"peak_ref": ref.peak_held, "peak_draft": draft.peak_held, "cancel_s": ref.cancel_s})
