"""A target's model on another device or dtype for the length of one audit, then restored.

``nn.Module.to`` replaces each parameter's data and each buffer by a moved or cast tensor;
holding on to the originals and putting them back restores the model exactly (a cast back
from bfloat16 would not), with the same parameter objects as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attnaudit.targets.target import Seq2SeqTarget, resolve_device, resolve_dtype


@contextmanager
def placed(target: Seq2SeqTarget, device: str | torch.device | None = None,
           dtype: str | torch.dtype | None = None) -> Iterator[Seq2SeqTarget]:
    """``target`` with its model moved to ``device`` and its floating tensors cast to
    ``dtype`` inside the block, batches following the model; afterwards every parameter,
    gradient and buffer is the tensor it was before (also when the block raises).
    Nothing is changed when both are None."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if device is None and dtype is None:
        yield target
        return
    model = target.model
    params = [(p, p.data, p.grad) for p in model.parameters()]
    buffers = [(module, name, buffer) for module in model.modules()
               for name, buffer in module._buffers.items() if buffer is not None]
    try:
        model.to(device=device, dtype=dtype)
        yield target.with_options(device=device) if device is not None else target
    finally:
        for param, data, grad in params:
            param.data = data
            param.grad = grad
        for module, name, buffer in buffers:
            module._buffers[name] = buffer
