"""A target's model on a device and in a dtype: names checked (:func:`resolve_device`,
:func:`resolve_dtype`), moved for good (:func:`place`), or for the length of one audit and
then restored (:func:`placed`).

For :func:`placed`: ``nn.Module.to`` replaces each parameter's data and each buffer by a
moved or cast tensor; holding on to the originals and putting them back restores the model
exactly (a cast back from bfloat16 would not), with the same parameter objects as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attnaudit.errors import TargetError
from attnaudit.targets.contract import Seq2SeqTarget

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"meta"`` -> a torch.device (None
    stays None); a clear :class:`TargetError` for anything else."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise TargetError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or "
                          "meta") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise TargetError(f"device {device!r}: CUDA is not available here (this torch "
                              "build or machine has no GPU); use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise TargetError(f"device {device!r}: there are {torch.cuda.device_count()} "
                              f"CUDA device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise TargetError(f"device {device!r}: MPS is not available here; use --device cpu")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype) -> torch dtype."""
    if dtype is None or dtype in DTYPES.values():
        return dtype  # type: ignore[return-value]
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise TargetError(f"unsupported dtype {dtype!r}: use one of {', '.join(DTYPES)}")


def place(target: Seq2SeqTarget, device: str | torch.device | None = None,
          dtype: str | torch.dtype | None = None) -> Seq2SeqTarget:
    """``target`` with its model moved to ``device`` and cast to the floating ``dtype`` (in
    place: the model is the target's own) and its batches following the model's device."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if device is None and dtype is None:
        return target
    target.model.to(device=device, dtype=dtype)
    return target.with_options(device=device) if device is not None else target


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
