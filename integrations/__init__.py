"""Framework adapters, importable as ``ckptprof.integrations.<framework>``.

The source lives in the repository's top-level ``integrations/`` folder and is
mapped onto the ``ckptprof.integrations`` package by ``pyproject.toml``
(``[tool.setuptools.package-dir]``), so ``pip install -e .`` and a wheel expose
it the same way. Every adapter records through
:class:`ckptprof.tracing.CheckpointTracer`; none re-implements phases or export.
Frameworks are imported lazily by each adapter module, never here.
"""
