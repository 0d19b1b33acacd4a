"""View functions behind the notebooks' explorers, one module per section.

Each function is pure (inputs in, :class:`lib.book.widgets.View` out), registered with
:func:`lib.book.widgets.explorer`, and raises ValueError with a clear message on bad input.
"""
