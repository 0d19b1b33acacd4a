"""The tools' kernel manager: polls in short slices, honours the caller's timeout, runs notebooks."""

from __future__ import annotations

import asyncio
from queue import Empty

import nbformat
import pytest
from jupyter_client.channels import AsyncZMQSocketChannel
from nbclient import NotebookClient

from tools import kernel
from tools.execute import KERNEL


def _fake_poll(monkeypatch, ready_after: int) -> list[float]:
    """Replace the parent channel's get_msg: Empty ``ready_after`` times, then a message."""
    asked: list[float] = []

    async def get_msg(self, timeout=None):
        asked.append(timeout)
        if len(asked) > ready_after:
            return {"msg_type": "execute_reply"}
        await asyncio.sleep(0)
        raise Empty

    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", get_msg)
    return asked


def _channel() -> kernel.SlicedPollChannel:
    return kernel.SlicedPollChannel.__new__(kernel.SlicedPollChannel)


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_every_poll_is_one_short_slice(monkeypatch, timeout):
    asked = _fake_poll(monkeypatch, ready_after=5)
    msg = asyncio.run(_channel().get_msg(timeout=timeout))
    assert msg == {"msg_type": "execute_reply"}
    assert len(asked) == 6
    assert all(0 <= t <= kernel.POLL_SLICE_S for t in asked)


def test_the_callers_timeout_still_raises_empty(monkeypatch):
    asked = _fake_poll(monkeypatch, ready_after=10**9)
    monkeypatch.setattr(kernel, "POLL_SLICE_S", 0.0)  # no real waiting in the test
    monkeypatch.setattr(kernel, "monotonic", iter(range(0, 10**6, 1)).__next__)  # 1 s per call
    with pytest.raises(Empty):
        asyncio.run(_channel().get_msg(timeout=3.0))
    assert 1 <= len(asked) <= 4


def test_nbclient_runs_a_notebook_through_it():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    seen = []
    client = NotebookClient(nb, timeout=60, kernel_name=KERNEL, kernel_manager_class=kernel.KernelManager,
                            on_cell_executed=lambda **_: seen.append((type(client.km), type(client.kc))))
    client.execute()
    assert seen == [(kernel.KernelManager, kernel.SlicedPollClient)]
    assert nb.cells[0].outputs[0]["text"] == "42\n"


def test_only_kernel_faults_earn_a_retry():
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from tools.kernel import is_kernel_fault

    assert is_kernel_fault(CellTimeoutError("cell timed out"))
    assert is_kernel_fault(DeadKernelError("kernel died"))
    assert is_kernel_fault(RuntimeError("Kernel didn't respond in 120 seconds"))
    assert is_kernel_fault(RuntimeError("Kernel died before replying to kernel_info"))
    # a notebook's own failures are not retried
    assert not is_kernel_fault(RuntimeError("some other runtime error"))
    assert not is_kernel_fault(ValueError("tp=3 cannot shard"))
    assert not is_kernel_fault(TimeoutError("a timeout raised by the notebook's code"))


def test_shared_kernel_resets_between_notebooks(tmp_path):
    """The variant runner reuses one kernel: the second notebook must not see the first one's
    names or glued texts, and it runs in its own folder."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from tools.variant import SharedKernel

    def notebook(folder, *sources):
        folder.mkdir()
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell("X = 1", metadata={"tags": ["parameters"]})]
        nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
        path = folder / "n.ipynb"
        nbformat.write(nb, path)
        return path

    first = notebook(tmp_path / "a", "import numpy as np\nfrom lib.book.glue import glue\nglue('g', 'x')\nprint(X)")
    second = notebook(tmp_path / "b", "import os\nprint(os.getcwd())", "from lib.book.glue import show\nshow('g')")
    third = notebook(tmp_path / "c", "np.zeros(1)")
    kernel = SharedKernel()
    try:
        kernel.render(first, tmp_path / "out1.ipynb", {"X": 7})
        printed = "".join(o.get("text", "") for o in nbformat.read(tmp_path / "out1.ipynb", 4).cells[-1].outputs)
        assert printed.strip() == "7"  # the injected X
        with pytest.raises(CellExecutionError, match="not glued yet"):
            kernel.render(second, tmp_path / "out2.ipynb", {})
        cwd = nbformat.read(tmp_path / "out2.ipynb", 4).cells[2].outputs[0]["text"].strip()
        assert cwd == str(tmp_path / "b")
        with pytest.raises(CellExecutionError, match="NameError"):
            kernel.render(third, tmp_path / "out3.ipynb", {})
    finally:
        kernel.close()
