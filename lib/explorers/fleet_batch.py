"""Explorers for filling a chat fleet's idle hours with batch work (I069 batch-api-idle-capacity).

Views call :mod:`lib.fleet.batch_fill` (which sizes the chat fleet with :mod:`lib.fleet.diurnal` and
:func:`lib.fleet.capacity.fleet_for_load`). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, View, explorer
from lib.fleet import batch_fill as bf
from lib.perf.deployment import Deployment
from lib.registry import hardware, models
from lib.units import fmt_int, fmt_pct, sig

MODELS = tuple(m for m in models.model_names() if not models.model(m).is_mla and models.model(m).num_experts in (0, None))
GPUS = tuple(hardware.gpu_names())


@functools.lru_cache(maxsize=32)
def _day(model, gpu, tp, mean_rate, peak_to_trough, chat_prompt, chat_output, batch_prompt, batch_output, tpot_ms):
    dep = Deployment(model, gpu, tp=tp)
    return bf.day_of_batch(dep, chat_prompt, chat_output, tpot_ms / 1e3, mean_rate, peak_to_trough, batch_prompt, batch_output)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.88, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    chat = ax.plot([0.0], [0.0], color="C0", lw=1.8, label="chat (requests/s, left)")[0]
    ax2 = ax.twinx()
    mixed = ax2.step([0.0], [0.0], where="post", color="C1", lw=1.6, label="batch, mixed (right)")[0]
    drained = ax2.step([0.0], [0.0], where="post", color="C2", lw=1.6, ls="--", label="batch, drained (right)")[0]
    ax.set_xlabel("hour of day")
    ax.set_ylabel("chat requests/s")
    ax2.set_ylabel("batch requests/s")
    ax.set_xlim(0, 24)
    ax.grid(True)
    return SimpleNamespace(ax=ax, ax2=ax2, chat=chat, mixed=mixed, drained=drained)


def _draw(a, hours, chat, mixed, drained) -> None:
    h = np.append(hours, 24.0)
    a.chat.set_data(hours + 0.5 * (hours[1] - hours[0]), chat)
    a.mixed.set_data(h, np.append(mixed, mixed[-1]))
    a.drained.set_data(h, np.append(drained, drained[-1]))
    a.ax.set_ylim(0, max(chat) * 1.15)
    a.ax2.set_ylim(0, max(max(mixed), max(drained), 1e-9) * 1.15)
    figures.legend(a.ax, [a.chat, a.mixed, a.drained], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "fleet.batch_fill",
    model=Choice(MODELS),
    gpu=Choice(GPUS),
    tp=Choice((1, 2, 4, 8), label="TP"),
    mean_rate=FloatRange(0.5, 500.0, 0.5, label="chat mean (requests/s)"),
    peak_to_trough=FloatRange(1.0, 10.0, 0.1, label="chat peak / trough"),
    chat_prompt=IntRange(64, 8192, label="chat prompt (tokens)", log=True),
    chat_output=IntRange(16, 2048, label="chat output (tokens)", log=True),
    batch_prompt=IntRange(512, 65536, label="batch prompt (tokens)", log=True),
    batch_output=IntRange(64, 4096, label="batch output (tokens)", log=True),
    tpot_ms=FloatRange(20.0, 200.0, 1.0, label="chat TPOT target (ms)"),
)
def batch_fill(model: str, gpu: str, tp: int, mean_rate: float, peak_to_trough: float, chat_prompt: int, chat_output: int,
               batch_prompt: int, batch_output: int, tpot_ms: float) -> View:
    """I069: the day's chat on a fleet sized for its peak, and the batch it absorbs mixed or drained."""
    d = _day(model, gpu, tp, mean_rate, peak_to_trough, chat_prompt, chat_output, batch_prompt, batch_output, tpot_ms)
    f = d.fleet
    rows = [("chat fleet (sized for the peak)", f"{fmt_int(f.replicas)} replicas, {fmt_pct(f.busy_fraction)} busy over the day"),
            ("idle replica-hours a day", sig(f.idle_replica_h)),
            ("batch-only replica", f"{sig(d.dedicated.cost.max_rate)} requests/s, batch {sig(d.dedicated.kv_batch)} set by "
                                   f"{d.dedicated.binding} (compute-bound at {sig(d.dedicated.compute_bound_batch)})"),
            ("batch a day, mixed beside chat", fmt_int(d.mixed_requests)),
            ("batch a day, drained replicas", fmt_int(d.drained_requests))]
    caption = ("Chat requests/s over the day (left axis) and the batch requests/s the fleet absorbs (right axis), mixed "
               "into every replica's steps within the chat TPOT target or run on whole replicas the chat does not need; "
               + (f"here mixing absorbs {sig(d.mixed_requests / d.drained_requests)}× the drained design's batch."
                  if d.drained_requests > 0 else "here the chat never frees a whole replica, so only mixing absorbs batch."))
    fig = _FIGURE(np.asarray(d.hours), np.asarray(d.chat_rate), np.asarray(d.mixed_rate), np.asarray(d.drained_rate))
    return View(f"Batch in a chat fleet: {model} TP{tp} on {gpu}", rows, fig, caption=caption,
                values={"mixed": d.mixed_requests, "drained": d.drained_requests})
