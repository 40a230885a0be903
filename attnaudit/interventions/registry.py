"""The registry of intervention protocols: the one list the suite, its progress plan, its
metadata, the checklist and the protocol contract test read.

The built-in intervention protocols (:mod:`attnaudit.interventions.protocols`) register when
:mod:`attnaudit.interventions` is imported; the attribution protocol registers from
:mod:`attnaudit.auditing.attribution_protocol`, which may import attribution. A new protocol
is one :class:`~attnaudit.interventions.protocol.InterventionProtocol` subclass and one
``@register_protocol`` line.
"""

from __future__ import annotations

from typing import TypeVar

from attnaudit.errors import InterventionError
from attnaudit.interventions.protocol import InterventionProtocol

P = TypeVar("P", bound=InterventionProtocol | type[InterventionProtocol])

_REGISTERED: dict[str, InterventionProtocol] = {}


def register_protocol(protocol: P) -> P:
    """Register ``protocol`` (an instance, or a class, which is instantiated with no
    arguments: usable as a class decorator) and return it unchanged. The suite runs the
    registered protocols in registration order, each after the ones it names in ``after``."""
    instance = protocol() if isinstance(protocol, type) else protocol
    if not isinstance(instance, InterventionProtocol):
        raise InterventionError(f"register_protocol takes an InterventionProtocol, got "
                                f"{type(instance).__name__}")
    if instance.name in _REGISTERED:
        raise InterventionError(f"a protocol named {instance.name!r} is registered already; "
                                "choose another name or unregister_protocol() it first")
    _REGISTERED[instance.name] = instance
    return protocol


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
