"""Validity: is this a valid weighted retrieval computation?

- :mod:`~attnaudit.validity.pipeline`: the audit run (target -> capture -> analysers);
- :mod:`~attnaudit.validity.rules`: the key rule declared per site role, and the rows that
  count;
- :mod:`~attnaudit.validity.analysers`: the analysers every check reads, and the default
  tolerances;
- :mod:`~attnaudit.validity.sites`: per-site facts (the sites table);
- :mod:`~attnaudit.validity.timing`: the timed passes (the performance table);
- :mod:`~attnaudit.validity.result`: :class:`~attnaudit.validity.result.ValidityAudit`;
- :mod:`~attnaudit.validity.findings`: the per-site findings read off it;
- :mod:`~attnaudit.validity.gate`: the gate that judges them.
"""
