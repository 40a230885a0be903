"""``manifest.json``: what is needed to reproduce one attention map of the report.

Hashes are defined so that anyone can recompute them without attnaudit:

- ``model.sha256``: sha256 over one UTF-8 line per state_dict entry, in sorted name order:
  the name, ``dtype``, ``shape`` and the hex sha256 of the tensor's raw bytes (contiguous,
  CPU, native byte order), space-separated, then ``"\n"``
  (``"decoder.weight torch.float32 (128, 32) 3f5a...\n"``). Entries that are one tensor
  (tied weights) hash its bytes once, and the tensors in CPU memory are hashed on
  :data:`HASH_THREADS` threads at once (hashlib releases the interpreter lock).
- ``data.sha256``: sha256 over the audited source texts in order, each UTF-8 encoded and
  followed by ``"\\n"``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import platform
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnaudit.targets.placement import cpu_state

LIBRARIES = ("torch", "attnaudit", "transformers", "captum", "numpy", "pandas", "scipy",
             "matplotlib", "seaborn", "jinja2")


HASH_SAMPLE_BYTES = 32 * 2**20  # what hash_seconds times before it scales to the model
HASH_THREADS = min(8, os.cpu_count() or 1)  # tensors in CPU memory hashed at once


def state_dict_sha256(model: nn.Module) -> str:
    """The model content hash described in the module docstring."""
    state = model.state_dict()
    names = sorted(state)
    tensors = _distinct(state)
    resident = [key for key, (_, t) in tensors.items() if _in_memory(t)]
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        running = {key: pool.submit(_tensor_sha256, tensors[key][1]) for key in resident}
        # the others are copied from their device or read from where accelerate offloaded
        # them, one at a time, here
        digests = {key: _tensor_sha256(cpu_state(model, *tensors[key]))
                   for key in tensors if key not in running}
        digests.update({key: future.result() for key, future in running.items()})
    digest = hashlib.sha256()
    for name in names:
        tensor = state[name]
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)} "
                      f"{digests[_tensor_key(name, tensor)]}\n".encode())
    return digest.hexdigest()


def _tensor_key(name: str, tensor: torch.Tensor) -> tuple[Any, ...]:
    """One key per distinct tensor: where its data is (tied weights share it); a tensor
    without data (a meta placeholder) by its name."""
    if tensor.device.type == "meta" or not tensor.numel():
        return (name,)
    return (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape),
            tensor.stride())


def _distinct(state: Mapping[str, torch.Tensor]) -> dict[tuple[Any, ...],
                                                          tuple[str, torch.Tensor]]:
    """Key (:func:`_tensor_key`) -> the first (name, tensor) in sorted name order."""
    distinct: dict[tuple[Any, ...], tuple[str, torch.Tensor]] = {}
    for name in sorted(state):
        distinct.setdefault(_tensor_key(name, state[name]), (name, state[name]))
    return distinct


def _in_memory(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu"


def _tensor_sha256(tensor: torch.Tensor) -> str:
    """The hex sha256 of a CPU tensor's raw bytes (contiguous, native byte order)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()  # no copy


def hash_seconds(model: nn.Module) -> float:
    """An estimate of :func:`state_dict_sha256`'s seconds on ``model``: the rate of hashing
    the first :data:`HASH_SAMPLE_BYTES` of its distinct tensors (read from where they are,
    as the hash reads them), applied to the busiest of :data:`HASH_THREADS` threads that
    share the tensors in CPU memory, largest first, plus the others one after another."""
    tensors = list(_distinct(model.state_dict()).values())
    sizes = [(t.numel() * t.element_size(), _in_memory(t)) for _, t in tensors]
    started, fed = time.perf_counter(), 0
    for name, tensor in tensors:
        if fed >= HASH_SAMPLE_BYTES:
            break
        part = cpu_state(model, name, tensor).reshape(-1)[
            :-(-(HASH_SAMPLE_BYTES - fed) // tensor.element_size())]
        _tensor_sha256(part)
        fed += part.numel() * part.element_size()
    rate = (time.perf_counter() - started) / max(fed, 1)
    threads = [0] * HASH_THREADS
    for size in sorted((size for size, resident in sizes if resident), reverse=True):
        heapq.heapreplace(threads, threads[0] + size)  # onto the least busy thread
    return rate * (max(threads) + sum(size for size, resident in sizes if not resident))


def texts_sha256(texts: Iterable[str]) -> str:
    """The data digest described in the module docstring."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape the numbers (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def build_manifest(model: nn.Module, *, target_name: str, texts: Sequence[str],
                   sites: Sequence[str], seeds: Mapping[str, Any],
                   command_line: Sequence[str] | str | None,
                   options: Mapping[str, Any], hash_model: bool = True) -> dict[str, Any]:
    """The manifest as a JSON-ready dict; ``hash_model=False`` leaves ``model.sha256`` None
    (the gate's cheap run does not read every parameter once more)."""
    return {
        "target": target_name,
        "model": {
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "parameters": sum(p.numel() for p in model.parameters()),
            "sha256": state_dict_sha256(model) if hash_model else None,
            "hash_recipe": "sha256 over sorted state_dict lines 'name dtype shape "
                           "sha256(raw bytes)\\n'",
        },
        "libraries": library_versions(),
        "seeds": dict(seeds),
        "data": {"examples": len(texts), "sha256": texts_sha256(texts),
                 "hash_recipe": "sha256 over source texts, each UTF-8 + newline"},
        "sites": list(sites),
        "options": dict(options),
        "command_line": (command_line if command_line is None or isinstance(command_line, str)
                         else list(command_line)),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_manifest(manifest: Mapping[str, Any], out_dir: Path) -> Path:
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path
