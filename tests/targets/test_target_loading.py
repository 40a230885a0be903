"""load_target's dotted specs: a package or module in the current directory first (as
``python -m`` run there would find it), then the installed packages, without putting the
directory on the import path; the bundled date model from anywhere."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnaudit.errors import TargetError
from attnaudit.targets.loading import BUNDLED_TARGET, load_target

FACTORY = ("from tests.helpers.toys.masking import make_target\n\n"
           "def make():\n    return make_target('correct', name={name!r})\n")
PREFIX = "attnaudit_cwd_"  # names no installed package uses


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory; the modules imported from it are forgotten afterwards. Its
    module ``probe``, never named, stays unimportable: the directory was not put on the
    import path."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / f"{PREFIX}probe.py", "")
    yield tmp_path
    assert importlib.util.find_spec(f"{PREFIX}probe") is None
    for name in [m for m in sys.modules if m.startswith(PREFIX)]:
        del sys.modules[name]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_package_in_the_working_directory_and_its_submodule(cwd):
    _write(cwd / f"{PREFIX}pkg" / "__init__.py", "")
    _write(cwd / f"{PREFIX}pkg" / "targets" / "__init__.py", "")
    _write(cwd / f"{PREFIX}pkg" / "targets" / "toy.py", FACTORY.format(name="from a package"))
    target = load_target(f"{PREFIX}pkg.targets.toy:make")
    assert target.name == "from a package"
    module = sys.modules[f"{PREFIX}pkg.targets.toy"]
    assert Path(module.__file__) == cwd / f"{PREFIX}pkg" / "targets" / "toy.py"


def test_a_namespace_package_and_a_plain_module_in_the_working_directory(cwd):
    _write(cwd / f"{PREFIX}space" / "toy.py", FACTORY.format(name="from a namespace"))
    _write(cwd / f"{PREFIX}module.py", FACTORY.format(name="from a module"))
    assert load_target(f"{PREFIX}space.toy:make").name == "from a namespace"
    assert load_target(f"{PREFIX}module:make").name == "from a module"


def test_a_module_failing_on_import_is_an_error_and_not_left_half_imported(cwd):
    _write(cwd / f"{PREFIX}broken.py", "1 / 0\n")
    for _ in range(2):  # the second try imports it again rather than finding a husk
        with pytest.raises(TargetError, match=f"importing target module '{PREFIX}broken' "
                                              "failed: ZeroDivisionError"):
            load_target(f"{PREFIX}broken:make")
    assert f"{PREFIX}broken" not in sys.modules


def test_a_module_in_neither_place_keeps_its_message(cwd):
    with pytest.raises(TargetError, match=f"cannot import target module '{PREFIX}absent'"):
        load_target(f"{PREFIX}absent:make")


def test_the_bundled_date_model_loads_from_any_directory(cwd):
    assert BUNDLED_TARGET == "attnaudit_examples.date.target:make_target"
    default = load_target(None)
    assert default.name == "date"
    assert type(load_target(BUNDLED_TARGET).model) is type(default.model)
