"""Targets named on the command line: ``package.module:factory`` or ``file.py:factory``."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from attnaudit.errors import AttnauditError, TargetError
from attnaudit.targets.contract import Seq2SeqTarget

BUNDLED_PACKAGE = "attnaudit_examples"
BUNDLED_TARGET = f"{BUNDLED_PACKAGE}.date.target:make_target"


def load_target(spec: str | None) -> Seq2SeqTarget:
    """``package.module:factory`` or ``path/to/file.py:factory`` -> the factory's target.

    None loads the bundled date model (:data:`BUNDLED_TARGET`), which is installed with
    attnaudit as the package ``attnaudit_examples``. A dotted module is looked for in the
    current directory first, then among the installed packages.
    """
    if spec is None:
        require_bundled_examples()
        spec = BUNDLED_TARGET
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


def require_bundled_examples() -> None:
    """Raise TargetError unless the bundled date models (``attnaudit_examples``) import: a
    checkout on ``PYTHONPATH`` alone has the folder ``examples/`` but not that name."""
    if importlib.util.find_spec(BUNDLED_PACKAGE) is None:
        raise TargetError(f"the bundled date models are the package {BUNDLED_PACKAGE}, which "
                          "is not installed: install attnaudit (from a clone: "
                          "`pip install -e .`), or name a TARGET")


def _import_target_module(where: str) -> ModuleType:
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
    try:
        _import_top_level_from_cwd(where.partition(".")[0])
        return importlib.import_module(where)
    except ImportError as exc:
        raise TargetError(f"cannot import target module {where!r}: {exc}") from exc
    except Exception as exc:
        raise TargetError(f"importing target module {where!r} failed: "
                          f"{type(exc).__name__}: {exc}") from exc


def _import_top_level_from_cwd(name: str) -> None:
    """Import the top-level module or package ``name`` from the current directory, as
    ``python -m`` run there would find it, unless it is imported already or the directory
    has none; its submodules then resolve through the package's own ``__path__``."""
    if name in sys.modules:
        return
    spec = importlib.machinery.PathFinder.find_spec(name, [str(Path.cwd())])
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if spec.loader is not None:  # None: a namespace package, nothing to run
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
