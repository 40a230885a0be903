"""A target's model on a device and in a dtype: names checked (:func:`resolve_device`,
:func:`resolve_dtype`), moved for good (:func:`place`), or for the length of one audit and
then restored (:func:`placed`).

For :func:`placed`: ``nn.Module.to`` replaces each parameter's data and each buffer by a
moved or cast tensor; holding on to the originals and putting them back restores the model
exactly (a cast back from bfloat16 would not), with the same parameter objects as before.

A model placed by accelerate (``from_pretrained(..., device_map=...)``, with CPU or disk
offload) holds offloaded parameters on the meta device and moves them in for each call
through a hook on each module: its parameters do not say where it computes, so
:func:`execution_device` reads the hook, and such a model is never moved, cast or copied
(:func:`is_dispatched`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

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
    except (RuntimeError, ValueError, TypeError) as exc:
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


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed ``model`` (a device map, or alignment hooks on modules)."""
    return getattr(model, "hf_device_map", None) is not None or any(
        hasattr(module, "_hf_hook") for module in model.modules())


def execution_device(module: nn.Module) -> torch.device | None:
    """Where ``module`` computes: the execution device of accelerate's hook on it (its
    parameters may be meta, offloaded to CPU or disk), else its first parameter's device;
    None for a module without parameters or hook."""
    hook = getattr(module, "_hf_hook", None)
    for one in getattr(hook, "hooks", (hook,)):  # a SequentialHook holds several
        where = getattr(one, "execution_device", None)
        if where is not None:
            return torch.device("cuda", where) if isinstance(where, int) else torch.device(where)
    param = next(module.parameters(), None)
    return None if param is None else param.device


def input_device(model: nn.Module) -> torch.device:
    """Where ``model``'s input ids go: its input embedding's execution device (the first
    device of an accelerate placement), else the model's; the CPU for a model with
    neither parameters nor hooks."""
    embeddings = getattr(model, "get_input_embeddings", None)
    for module in (embeddings() if callable(embeddings) else None, model):
        where = None if module is None else execution_device(module)
        if where is not None:
            return where
    return torch.device("cpu")


@contextmanager
def onloaded(module: nn.Module) -> Iterator[None]:
    """Within the block, ``module``'s own parameters hold their data on its execution
    device, also where accelerate offloaded them to CPU or disk (meta outside its calls);
    a module without an offloading hook is left as it is."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None or not getattr(hook, "offload", False):
        yield
        return
    from accelerate.utils import align_module_device  # present: it placed the module

    with align_module_device(module):
        yield


def cpu_state(model: nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``model.state_dict()[name]`` (``tensor``) on the CPU, its data read from where
    accelerate offloaded it when the state dict holds a meta placeholder."""
    if tensor.device.type == "meta":
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        with onloaded(module):
            return getattr(module, attr).detach().cpu()
    return tensor.detach().cpu()


def refuse_dispatched(model: nn.Module) -> None:
    """A TargetError for moving, casting or copying a model accelerate placed: its
    offloaded parameters have no data to move, and its hooks would bring the weights back
    to their own devices."""
    if is_dispatched(model):
        raise TargetError("the model was placed by accelerate (device_map): it runs where "
                          "it was placed; leave device and dtype unset, or load it with "
                          "the torch_dtype and device_map you want")


def place(target: Seq2SeqTarget, device: str | torch.device | None = None,
          dtype: str | torch.dtype | None = None) -> Seq2SeqTarget:
    """``target`` with its model moved to ``device`` and cast to the floating ``dtype`` (in
    place: the model is the target's own) and its batches following the model's device."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if device is None and dtype is None:
        return target
    refuse_dispatched(target.model)
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
    refuse_dispatched(model)
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
