"""Auditing: one audit of a target, from capture to the :class:`~attnaudit.auditing.result.Audit`.

- :mod:`~attnaudit.validity.pipeline`: the validity pipeline (capture, declared key rules,
  streaming analysers, findings; :mod:`attnaudit.validity` lists its modules);
- :mod:`~attnaudit.runtime.measurement`: wall time, peak memory, capture size;
- :mod:`~attnaudit.analysis.example_maps`: the kept examples' attention, labelled;
- :mod:`~attnaudit.targets.placement`: a model on another device or dtype for one audit,
  restored exactly afterwards;
- :mod:`~attnaudit.auditing.result`: the :class:`Audit` result and its views (report, gate,
  figures, notebook summary, loading a saved report);
- :mod:`~attnaudit.auditing.orchestration`: :func:`attnaudit.audit`, which runs them all.

Nothing is imported here: the validity pipeline sits below the checklist, report and gate,
while the result and the orchestration sit above them (``attnaudit.audit`` and
``attnaudit.Audit`` are the entry points).
"""
