"""How the tools run notebook kernels (./book execute, ./book variant, the tests): manager, timeouts.

Why not nbclient's default: its asyncio client waits for a reply with one zmq poll as long as the
cell timeout. ZeroMQ signals readiness through an edge-triggered file descriptor, and now and then
the event loop misses the edge: the reply sits in the socket and the poll only notices it when it
times out (pyzmq then polls once more and finds it). With a 240 s cell timeout that was a 240 s
stall in an explorer cell every few dozen runs; with no timeout, papermill's default, it hung CI
for good. Polling in short slices bounds a missed wakeup to one slice and changes nothing else.
The symptom matches upstream reports: jupyter/nbclient#312 (executing a cell that displays
ipywidgets sometimes blocks) and nteract/papermill#711 (papermill's execute hangs in CI).

jupyter_client is pinned (requirements.txt) because this module subclasses its channel and
client classes (``AsyncZMQSocketChannel.get_msg``, ``AsyncKernelClient`` channel traits): an
upgrade that renames them must be a deliberate change, tested by tests/book/test_kernel.py.
"""

from __future__ import annotations

from queue import Empty
from time import monotonic

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from traitlets import Type, default

POLL_SLICE_S = 0.5  # the longest a missed zmq wakeup can delay a message
KERNEL_START_S = 120  # a kernel that has not answered by then is not coming
CELL_TIMEOUT_S = 240  # the slowest cell of any notebook takes a few seconds; this only stops hangs
# What a stalled or dead kernel raises, as opposed to a cell that fails: nbclient's timeouts and
# dead-kernel errors, and jupyter_client's RuntimeError for a kernel that never started.
KERNEL_FAULTS = (CellTimeoutError, DeadKernelError)
_START_FAILURES = ("Kernel didn't respond", "Kernel died before replying")


def is_kernel_fault(err: BaseException) -> bool:
    """Whether ``err`` is an infrastructure fault (stalled, dead or never-started kernel), which
    earns a retry in a fresh kernel, rather than a failure of the notebook itself."""
    return isinstance(err, KERNEL_FAULTS) or (
        type(err) is RuntimeError and str(err).startswith(_START_FAILURES))


class SlicedPollChannel(AsyncZMQSocketChannel):
    """A kernel channel whose ``get_msg(timeout)`` polls in slices of at most ``POLL_SLICE_S``."""

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else max(0.0, deadline - monotonic())
            try:
                return await super().get_msg(timeout=min(POLL_SLICE_S, left))
            except Empty:
                if deadline is not None and monotonic() >= deadline:
                    raise


class SlicedPollClient(AsyncKernelClient):
    """nbclient's kernel client with :class:`SlicedPollChannel` for the shell and IOPub channels."""

    shell_channel_class = Type(SlicedPollChannel)
    iopub_channel_class = Type(SlicedPollChannel)


class KernelManager(AsyncKernelManager):
    """Pass as ``kernel_manager_class`` to nbclient's NotebookClient or papermill."""

    @default("client_factory")
    def _client_factory_default(self) -> type:
        return SlicedPollClient
