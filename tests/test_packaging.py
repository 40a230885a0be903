"""What ``pip install attnaudit`` brings and what its extras add: capture runs on torch alone,
the core (analysers, interventions, the validity pipeline) without any extra, and the
command line or ``attnaudit.audit`` without one of the extras' packages says in one line
what to install. A missing package is simulated with ``sys.modules[name] = None`` in a fresh
interpreter, which makes its import fail as if it were not installed."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from attnaudit.cli.extras import EXTRA_PACKAGES, INSTALL_ALL

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
OWN_EXTRAS = ("attribution", "report", "hf")  # all, bench and dev name these or tools


def _name(requirement: str) -> str:
    """The distribution name of a requirement string, lower case (all of ours import under
    that name)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300)


def _blocking(*names: str) -> str:
    return "import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in sorted(names))


def test_the_one_line_knows_every_package_an_extra_adds_and_no_core_one():
    extras = PYPROJECT["project"]["optional-dependencies"]
    added = {_name(r) for extra in OWN_EXTRAS for r in extras[extra]} - {"attnaudit"}
    assert added == EXTRA_PACKAGES
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert core == {"torch", "numpy", "pandas", "tqdm"}
    assert extras["all"] == ["attnaudit[report,hf]"]
    assert "attnaudit[attribution]" in extras["report"]
    assert "attnaudit[all]" in extras["dev"]


def test_capture_needs_torch_alone():
    code = _blocking(*EXTRA_PACKAGES, "numpy", "pandas", "tqdm") + (
        "import torch\nimport attnaudit\n"
        "model = torch.nn.MultiheadAttention(8, 2, batch_first=True)\n"
        "x = torch.randn(2, 3, 8)\n"
        "with torch.no_grad(), attnaudit.capture(model) as cap:\n"
        "    model(x, x, x)\n"
        "print(cap.sites, tuple(cap.records[cap.sites[0]].weights.shape))\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['forward:self'] (2, 2, 3, 3)"


def test_the_core_layers_import_without_any_extra():
    code = _blocking(*EXTRA_PACKAGES) + (
        "import attnaudit.analysis, attnaudit.interventions, attnaudit.testing\n"
        "import attnaudit.validity.pipeline, attnaudit.targets.loading\n"
        "print('ok')\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("package", ["captum", "seaborn", "scipy"])
def test_the_command_line_without_an_extra_says_what_to_install_in_one_line(package):
    code = _blocking(package) + (
        "from attnaudit.cli import main\nraise SystemExit(main(['demo']))\n")
    result = _python(code)
    assert result.returncode == 2
    assert result.stderr == (f"attnaudit: error: the attnaudit command needs {package}, "
                             f"which is not installed: {INSTALL_ALL}\n")
    assert result.stdout == ""


@pytest.mark.parametrize("name", ["audit", "Audit", "show"])
def test_audit_without_an_extra_says_what_to_install(name):
    code = _blocking("captum") + f"import attnaudit\nattnaudit.{name}\n"
    result = _python(code)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"ModuleNotFoundError: attnaudit.{name} needs captum, which is not installed: "
        f"{INSTALL_ALL}")
    assert "During handling" not in result.stderr  # the bare import error is not chained


def test_a_missing_module_of_attnaudit_itself_is_not_blamed_on_an_extra():
    code = _blocking("attnaudit.auditing.orchestration") + "import attnaudit\nattnaudit.audit\n"
    result = _python(code)
    assert result.returncode == 1
    assert "attnaudit[all]" not in result.stderr
    assert "attnaudit.auditing.orchestration" in result.stderr.strip().splitlines()[-1]


def test_the_reports_templates_and_explorer_files_are_package_data():
    """The page's template and the attention explorer's script and style are read from the
    installed package: each file must match a package-data pattern to be in the wheel."""
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["attnaudit.report"]
    folder = ROOT / "attnaudit" / "report"
    files = [path.relative_to(folder).as_posix() for sub in ("templates", "static")
             for path in sorted((folder / sub).iterdir())]
    assert any(f.endswith(".js") for f in files) and any(f.endswith(".css") for f in files)
    assert [f for f in files if not any(fnmatch(f, p) for p in patterns)] == []
