"""``manifest.json``: what is needed to reproduce one attention map of the report.

Hashes are defined so that anyone can recompute them without attnaudit:

- ``model.sha256``: sha256 over the state_dict in sorted name order; for each entry the
  UTF-8 name, then ``dtype`` and ``shape`` as text (``"torch.float32 (128, 32)"``), then the
  tensor's raw bytes (contiguous, CPU, native byte order).
- ``data.sha256``: sha256 over the audited source texts in order, each UTF-8 encoded and
  followed by ``"\\n"``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Iterable, Mapping, Sequence
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


def state_dict_sha256(model: nn.Module) -> str:
    """The model content hash described in the module docstring."""
    digest = hashlib.sha256()
    _hash_state(model, digest)
    return digest.hexdigest()


def _hash_state(model: nn.Module, digest: Any, limit: int | None = None) -> int:
    """Feed ``model``'s sorted state dict to ``digest`` (name, ``dtype shape``, raw bytes),
    stopping after the tensor that reaches ``limit`` bytes (None: every one); the bytes fed."""
    state = model.state_dict()
    fed = 0
    for name in sorted(state):
        tensor = cpu_state(model, name, state[name]).contiguous()
        digest.update(name.encode("utf-8"))
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)  # no copy
        fed += tensor.numel() * tensor.element_size()
        if limit is not None and fed >= limit:
            break
    return fed


def hash_seconds(model: nn.Module) -> float:
    """An estimate of :func:`state_dict_sha256`'s seconds on ``model``: its state's bytes at
    the rate of hashing its first tensors up to :data:`HASH_SAMPLE_BYTES` (read from where
    they are, as the hash reads them)."""
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    started = time.perf_counter()
    fed = _hash_state(model, hashlib.sha256(), HASH_SAMPLE_BYTES)
    return (time.perf_counter() - started) * total / max(fed, 1)


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
            "hash_recipe": "sha256 over sorted state_dict: name, 'dtype shape', raw bytes",
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
