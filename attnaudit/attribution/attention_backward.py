"""The kernel a gradient pass's ``F.scaled_dot_product_attention`` calls run on.

On CPU, the fused (flash) kernel is fast forward but slow backward: on the
Llama-3.2-1B-shaped benchmark model (bf16, 101 keys, 64-wide heads) its backward took 12 ms
per call against 1.1 ms forward, a quarter of a saliency pass. PyTorch's math backend computes
the same attention from plain operations (scores, softmax, weighted read), whose backward is a
few small matrix products; it keeps the call's weights (B, H, L, S) for the backward pass
where the fused kernel keeps (B, H, L). So within :func:`small_attention_on_math` a call runs
on the math backend when it is on CPU, something needs its gradient, and its weights take no
more room than four of its queries (B, H, L, E): S <= ``MATH_KEYS_PER_WIDTH`` x E, the key
length against the head width. Longer calls, calls without gradients and calls on other
devices (whose fused backward kernels are fast) keep PyTorch's own choice. The two backends
compute the same function; their gradients differ by rounding (in bf16 both are about 5 %
from a float32 pass on that model, alike).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from attnaudit.capturing.sdpa import ORIGINAL_SDPA

MATH_KEYS_PER_WIDTH = 4


def runs_on_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether a gradient pass runs this call (query (..., L, E), key (..., S, E)) on the
    math backend: on CPU, with a tensor that needs its gradient, and S <= 4 E."""
    return (
        query.device.type == "cpu"
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
        and key.shape[-2] <= MATH_KEYS_PER_WIDTH * query.shape[-1]
    )


class _SmallAttentionOnMath(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is ORIGINAL_SDPA:
            tensors = [*args[:3], *(kwargs[k] for k in ("query", "key", "value") if k in kwargs)]
            if len(tensors) == 3 and runs_on_math(*tensors):
                with sdpa_kernel(SDPBackend.MATH):
                    return func(*args, **kwargs)
        return func(*args, **kwargs)


@contextmanager
def small_attention_on_math() -> Iterator[None]:
    """Within the block, the attention calls :func:`runs_on_math` picks run on PyTorch's
    math backend (module docstring); every other call runs as it would."""
    with _SmallAttentionOnMath():
        yield
