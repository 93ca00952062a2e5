"""The runtime under every kernel: it knows no weight family.

* :mod:`.launcher` — the one launcher: a plan of launches, validated, then
  enqueued or bound;
* :mod:`.prebound` — one ``cuLaunchKernel`` per launch, arguments packed once;
* :mod:`.interop` — device arrays (numba, CuPy, torch) and streams in, results out;
* :mod:`.dev` — device helpers (bf16/fp32 conversion, vector loads, MMA).

A family's code is reached through its :class:`~q2gemv.dispatch.registry.FamilySpec`
(:func:`q2gemv.dispatch.registry.family`); no module here imports a family package
(``tests/test_import_graph.py`` enforces it).
"""
