"""The registry of intervention protocols: the one list the suite, its progress plan, its
metadata, the checklist and the protocol contract test read.

The built-in intervention protocols (:mod:`attnaudit.interventions.protocols`) register when
:mod:`attnaudit.interventions` is imported; the attribution protocol registers from
:mod:`attnaudit.auditing.attribution_protocol`, which may import attribution. A new protocol
is one :class:`~attnaudit.interventions.protocol.InterventionProtocol` subclass and one
``@register_protocol`` line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from attnaudit.errors import InterventionError
from attnaudit.interventions.protocol import (
    BATCH,
    BOTH_MODES,
    EVERY_ROW,
    SUBSET,
    InterventionProtocol,
)

P = TypeVar("P", bound=InterventionProtocol | type[InterventionProtocol])

_REGISTERED: dict[str, InterventionProtocol] = {}
SCOPES = (EVERY_ROW, SUBSET, BATCH)


def register_protocol(protocol: P) -> P:
    """Register ``protocol`` (an instance, or a class, which is instantiated with no
    arguments: usable as a class decorator) and return it unchanged. The suite runs the
    registered protocols in registration order, each after the ones it names in ``after``."""
    if isinstance(protocol, type):
        if not issubclass(protocol, InterventionProtocol):
            raise InterventionError(f"register_protocol takes an InterventionProtocol, got "
                                    f"the class {protocol.__name__}")
        try:
            instance = protocol()
        except TypeError as exc:  # abstract methods left, or arguments its __init__ needs
            raise InterventionError(f"register_protocol cannot make a {protocol.__name__} "
                                    f"with no arguments ({exc}); register an instance, or "
                                    "implement run()") from None
    else:
        instance = protocol
    if not isinstance(instance, InterventionProtocol):
        raise InterventionError(f"register_protocol takes an InterventionProtocol, got "
                                f"{type(instance).__name__}")
    _check_declarations(instance)
    if instance.name in _REGISTERED:
        raise InterventionError(f"a protocol named {instance.name!r} is registered already; "
                                "choose another name or unregister_protocol() it first")
    _REGISTERED[instance.name] = instance
    return protocol


def _check_declarations(protocol: InterventionProtocol) -> None:
    """An :class:`InterventionError` naming the first class attribute the suite cannot
    read: ``name``, ``columns``, ``scope``, ``modes``, ``after``, ``row_tables``."""
    kind = type(protocol).__name__
    name = getattr(protocol, "name", None)
    if not isinstance(name, str) or not name:
        raise InterventionError(f"protocol {kind} must set name to a non-empty str, got "
                                f"{name!r}")
    columns = getattr(protocol, "columns", None)
    if not isinstance(columns, Mapping) or not all(
            isinstance(table, str) and isinstance(cols, tuple)
            and all(isinstance(c, str) for c in cols) for table, cols in columns.items()):
        raise InterventionError(f"protocol {name!r}: columns must map table names to tuples "
                                f"of column names, got {columns!r}")
    if protocol.scope not in SCOPES:
        raise InterventionError(f"protocol {name!r}: scope must be one of "
                                f"{', '.join(map(repr, SCOPES))}, got {protocol.scope!r}")
    if not isinstance(protocol.modes, (set, frozenset)) or not protocol.modes <= BOTH_MODES:
        raise InterventionError(f"protocol {name!r}: modes must be a set among "
                                f"{', '.join(sorted(BOTH_MODES))}, got {protocol.modes!r}")
    for attribute in ("after", "row_tables"):
        value = getattr(protocol, attribute)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise InterventionError(f"protocol {name!r}: {attribute} must be a tuple of "
                                    f"names, got {value!r}")


def unregister_protocol(name: str) -> InterventionProtocol:
    """Remove the protocol registered as ``name`` and return it."""
    if name not in _REGISTERED:
        raise InterventionError(f"no protocol named {name!r} is registered; registered: "
                                f"{list(_REGISTERED)}")
    return _REGISTERED.pop(name)


def registered_protocols() -> tuple[InterventionProtocol, ...]:
    """Every registered protocol in run order: registration order, except that a protocol
    comes after each registered one it names in ``after``."""
    ordered: list[InterventionProtocol] = []
    placed: set[str] = set()

    def place(protocol: InterventionProtocol, waiting: tuple[str, ...]) -> None:
        if protocol.name in placed:
            return
        if protocol.name in waiting:
            raise InterventionError(f"protocols wait on each other: "
                                    f"{' -> '.join((*waiting, protocol.name))}")
        for name in protocol.after:
            if name in _REGISTERED:
                place(_REGISTERED[name], (*waiting, protocol.name))
        ordered.append(protocol)
        placed.add(protocol.name)

    for protocol in list(_REGISTERED.values()):
        place(protocol, ())
    return tuple(ordered)
