"""Hugging Face models: which attention backends capture can see.

HF's ``sdpa`` backend calls ``F.scaled_dot_product_attention`` and ``eager`` calls
``F.softmax``; both are captured by the generic adapters, and the kind comes from the
attention module's own ``is_cross_attention``. Other backends (flash, flex, paged) run
kernels that never expose weights, so capture refuses them instead of returning nothing.
Nothing here imports transformers.
"""

from __future__ import annotations

from torch import nn

from attnaudit.errors import CaptureError

CAPTURABLE_BACKENDS = ("eager", "sdpa")


def check_backends(named_modules: list[tuple[str, nn.Module]]) -> None:
    """Raise :class:`CaptureError` if a module's HF config selects an uncapturable backend."""
    for path, module in named_modules:
        config = getattr(module, "config", None)
        backend = getattr(config, "_attn_implementation", None)
        if isinstance(backend, str) and backend not in CAPTURABLE_BACKENDS:
            raise CaptureError(
                f"{type(module).__name__} at {path or '<root>'!r} uses the {backend!r} attention "
                f"backend, whose kernels never expose weights; attnaudit captures "
                f"{' and '.join(CAPTURABLE_BACKENDS)}: load the model with "
                "attn_implementation='sdpa' (the default) or 'eager'"
            )
