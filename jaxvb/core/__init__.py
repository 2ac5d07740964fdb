"""The engine: ``fit`` and the kernel it runs, the result and its status, the start.

- :mod:`~jaxvb.core.fit`: ``fit`` -- validate once, start, resolve the method, one
  compiled ``lax.scan`` of :func:`~jaxvb.core.kernel.step`, finalize, diagnostics,
  ``check``.
- :mod:`~jaxvb.core.kernel`: the iteration as ``init`` / ``step`` / ``finalize``.
- :mod:`~jaxvb.core.result`: :class:`~jaxvb.Result`, :class:`~jaxvb.Status` and the
  verdicts (``explain``, ``check``).
- :mod:`~jaxvb.core.start`: the Laplace start (``jaxvb.laplace``).
- :mod:`~jaxvb.core.progress`: progress reports from inside the compiled loop.
- :mod:`~jaxvb.core.summary`: the printed summary of a result.

The engine names no family and no method: methods register themselves
(:mod:`jaxvb.methods`) and families meet them through a small protocol.
"""
