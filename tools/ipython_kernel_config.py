# Kernel start-up for the book's environment (./book copies this file to .venv/etc/ipython/).
# The prose cites numbers as {eval}`glued.NAME`; jupyterlab-myst evaluates those in the kernel
# when a markdown cell is rendered, which for a notebook's question and first steps is before
# any code cell has imported anything. Every notebook still imports `glued` itself.
c = get_config()  # noqa: F821  (provided by IPython when it loads this file)
c.InteractiveShellApp.exec_lines = ["from lib.book.glue import glued"]
