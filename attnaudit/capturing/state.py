"""The one capture that is active, shared by every adapter's patched function.

Patched functions read :data:`ACTIVE.capture` on every call; when it is None they fall
through to the original at the cost of one attribute read.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnaudit.capturing.recorder import Capture


class _Active:
    capture: Capture | None = None


ACTIVE = _Active()


def patch_attr(stack: ExitStack, owner: Any, name: str, value: Callable[..., Any]) -> None:
    """Set ``owner.name = value`` until ``stack`` closes, restoring exactly what was there."""
    had_own = name in vars(owner)
    old = vars(owner)[name] if had_own else None
    setattr(owner, name, value)

    def restore() -> None:
        if had_own:
            setattr(owner, name, old)
        else:
            delattr(owner, name)

    stack.callback(restore)


def patch_references(stack: ExitStack, namespaces: list[dict[str, Any]],
                     replacements: dict[int, Callable[..., Any]]) -> None:
    """Replace module globals that hold an original function (``from torch.nn.functional
    import scaled_dot_product_attention``) until ``stack`` closes. ``replacements`` maps
    ``id(original)`` to its replacement."""
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            new = replacements.get(id(value))
            if new is not None:
                namespace[name] = new
                stack.callback(namespace.__setitem__, name, value)
