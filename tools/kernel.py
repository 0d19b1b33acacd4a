"""How the tools run notebook kernels (./book execute, ./book variant, the tests): manager, timeouts.

Why not nbclient's default: its asyncio client waits for a reply with one zmq poll as long as the
cell timeout. ZeroMQ signals readiness through an edge-triggered file descriptor, and now and then
the event loop misses the edge: the reply sits in the socket and the poll only notices it when it
times out (pyzmq then polls once more and finds it). With a 240 s cell timeout that was a 240 s
stall in an explorer cell every few dozen runs; with no timeout, papermill's default, it hung CI
for good. Polling in short slices bounds a missed wakeup to one slice and changes nothing else.
"""

from __future__ import annotations

from queue import Empty
from time import monotonic

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Type, default

POLL_SLICE_S = 0.5  # the longest a missed zmq wakeup can delay a message
KERNEL_START_S = 120  # a kernel that has not answered by then is not coming
CELL_TIMEOUT_S = 240  # the slowest cell of any notebook takes a few seconds; this only stops hangs
# What a stalled or dead kernel raises (nbclient's CellTimeoutError, DeadKernelError, a kernel
# that never started), as opposed to a cell that fails.
KERNEL_FAULTS = (TimeoutError, RuntimeError)


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
