"""Targets named on the command line: ``package.module:factory`` or ``file.py:factory``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from attnaudit.errors import AttnauditError, TargetError
from attnaudit.targets.contract import Seq2SeqTarget


def load_target(spec: str | None) -> Seq2SeqTarget:
    """``package.module:factory`` or ``path/to/file.py:factory`` -> the factory's target.

    None loads the bundled date model (``examples.date.target:make_target``), which ships
    with the source checkout.
    """
    if spec is None:
        checkout = Path(__file__).resolve().parents[2]
        if not (checkout / "examples" / "date" / "date_attention.pt").exists():
            raise TargetError("the bundled date model ships with the source checkout "
                              "(examples/date/); install attnaudit from a clone with "
                              "`pip install -e .`, or name a TARGET")
        if str(checkout) not in sys.path:
            sys.path.insert(0, str(checkout))
        spec = "examples.date.target:make_target"
    where, sep, factory_name = spec.rpartition(":")
    if not sep or not where or not factory_name:
        raise TargetError(f"TARGET must look like package.module:factory or file.py:factory, "
                          f"got {spec!r}")
    module = _import_target_module(where)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise TargetError(f"{where} has no callable {factory_name!r}")
    try:
        target = factory()
    except AttnauditError:
        raise
    except Exception as exc:
        raise TargetError(f"{spec} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(target, Seq2SeqTarget):
        raise TargetError(f"{spec} returned {type(target).__name__}, not a Seq2SeqTarget")
    return target


def _import_target_module(where: str) -> Any:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target file not found: {path}")
        module_spec = importlib.util.spec_from_file_location(f"attnaudit_target_{path.stem}",
                                                             path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_spec.name]
            raise TargetError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
        return module
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise TargetError(f"cannot import target module {where!r}: {exc}") from exc
    except Exception as exc:
        raise TargetError(f"importing target module {where!r} failed: "
                          f"{type(exc).__name__}: {exc}") from exc
