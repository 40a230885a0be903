"""The one capture that is active, shared by every adapter's patched function.

Patched functions read :data:`ACTIVE.capture` on every call; when it is None they fall
through to the original at the cost of one attribute read. ``ACTIVE.views`` holds the
block of prompt views the running pass is in (:func:`attnaudit.capturing.views.prompt_views`),
or None.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from attnaudit.capturing.protocol import ActiveCapture
from attnaudit.errors import CaptureError


class _Active:
    capture: ActiveCapture | None = None
    views: Any = None  # a views.PromptViews (views imports this module)


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


def refuse_tracing() -> None:
    """Raise :class:`CaptureError` when the attention call is being traced or compiled: a
    graph built now would record only this call, or bake an edit in for good."""
    if torch.jit.is_tracing():
        raise CaptureError(
            "torch.jit.trace ran inside attnaudit.capture: the traced graph would keep this "
            "capture's patches (and any edit) after the `with` block; trace outside the "
            "capture, and capture the original nn.Module"
        )
    if "torch._dynamo" in sys.modules and torch.compiler.is_compiling():
        raise CaptureError(
            "torch.compile / torch.export traced attention inside attnaudit.capture; capture "
            "runs compiled models eagerly, so export outside the capture"
        )


def compiled_code_runs_eagerly(stack: ExitStack) -> None:
    """Until ``stack`` closes, ``torch.compile``d models run their Python code eagerly, so
    capture sees (and edits) their attention; compiled graphs are kept for afterwards.

    Nothing can have been compiled unless the compiler was imported, so it is not imported
    here for nothing.
    """
    if "torch._dynamo" not in sys.modules:
        return
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:  # torch < 2.6
        stack.enter_context(sys.modules["torch._dynamo"].config.patch(disable=True))
        return
    stack.enter_context(set_stance("force_eager"))
