"""The package's layers, read off its source: which modules import which.

Every module belongs to exactly one layer; a module imports only its own layer and the tiers
below it. Imports inside functions and under ``if TYPE_CHECKING:`` count as much as those at
the top of a module: a type-only import is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnaudit
from attnaudit import errors

PACKAGE = Path(__file__).resolve().parents[1] / "attnaudit"

# Bottom to top. Layers in one tier are peers: neither imports the other.
TIERS: list[dict[str, tuple[str, ...]]] = [
    {"base": ("attnaudit.errors", "attnaudit.record", "attnaudit.options")},
    {"capturing": ("attnaudit.capturing",)},
    {"targets": ("attnaudit.targets",)},
    {"analysis": ("attnaudit.analysis",)},
    {"runtime": ("attnaudit.runtime",)},
    {"interventions": ("attnaudit.interventions",),
     "validity": ("attnaudit.validity", "attnaudit.testing"),
     "contributions": ("attnaudit.contributions",)},
    {"attribution": ("attnaudit.attribution",), "checklist": ("attnaudit.checklist",)},
    {"alignments": ("attnaudit.alignments",)},
    {"report": ("attnaudit.report",)},
    {"auditing": ("attnaudit.auditing",)},
    {"cli": ("attnaudit.cli",)},
    {"api": ("attnaudit", "attnaudit.__main__")},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer_of(module: str) -> tuple[int, str]:
    """(tier, layer) of ``module``: the longest prefix that names a layer decides, so
    ``attnaudit`` itself is the API facade and ``attnaudit.capturing.x`` is capturing."""
    best: tuple[int, int, str] | None = None
    for tier, layers in enumerate(TIERS):
        for layer, prefixes in layers.items():
            for prefix in prefixes:
                matches = module == "attnaudit" if prefix == "attnaudit" else \
                    _inside(module, prefix)
                if matches and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), tier, layer)
    assert best is not None, f"{module} belongs to no layer"
    return best[1], best[2]


def _imports(name: str, source: str | None = None) -> set[str]:
    """The attnaudit modules ``name`` imports anywhere in its source (or ``source``), inside
    functions and under ``if TYPE_CHECKING:`` too (a ``from X import Y`` names module X.Y
    when Y is a module, else X)."""
    found: set[str] = set()
    text = MODULES[name].read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES
                          else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _upward(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in graph.items():
        tier, layer = _layer_of(module)
        for other in imported:
            other_tier, other_layer = _layer_of(other)
            if other_tier > tier or (other_tier == tier and other_layer != layer):
                wrong.append(f"{module} ({layer}) imports {other} ({other_layer})")
    return sorted(wrong)


def test_the_walk_sees_the_whole_package():
    walked = {m.name for m in pkgutil.walk_packages(attnaudit.__path__, "attnaudit.")}
    assert walked | {"attnaudit"} == set(MODULES)
    assert "attnaudit.auditing.result" in GRAPH["attnaudit.auditing.orchestration"]


def test_every_module_belongs_to_a_layer_and_no_module_floats_at_the_top():
    for module in MODULES:
        _layer_of(module)
    top = sorted(m for m in MODULES if m.count(".") == 1 and not (PACKAGE / f"{m[10:]}").is_dir())
    assert top == ["attnaudit.__main__", "attnaudit.errors", "attnaudit.options",
                   "attnaudit.record", "attnaudit.testing"]


def test_no_import_cycle_among_attnaudit_modules():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_no_module_imports_a_layer_above_it_or_a_peer_type_only_imports_included():
    assert _upward(GRAPH) == []


def test_the_checks_find_a_planted_cycle_and_a_planted_upward_type_only_import():
    planted = {**GRAPH, "attnaudit.capturing.recorder":
               GRAPH["attnaudit.capturing.recorder"] | {"attnaudit.validity.gate"},
               "attnaudit.validity.gate": GRAPH["attnaudit.validity.gate"]
               | {"attnaudit.capturing.recorder"}}
    assert _cycle(planted) is not None
    assert any("capturing.recorder" in w for w in _upward(planted))
    type_only = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from attnaudit.cli import main\n"
                 "def later() -> None:\n    from attnaudit.validity import gate\n")
    found = _imports("attnaudit.capturing.recorder", type_only)
    assert found == {"attnaudit.cli", "attnaudit.validity.gate"}
    assert len(_upward({**GRAPH, "attnaudit.capturing.recorder": found})) == 2


def test_peers_do_not_import_each_other():
    planted = {**GRAPH, "attnaudit.interventions.runner":
               GRAPH["attnaudit.interventions.runner"] | {"attnaudit.validity.findings"}}
    assert _upward(planted) == [
        "attnaudit.interventions.runner (interventions) imports "
        "attnaudit.validity.findings (validity)"]


def test_every_attnaudit_exception_lives_in_errors():
    for info in pkgutil.walk_packages(attnaudit.__path__, "attnaudit."):
        if not info.name.endswith("__main__"):
            __import__(info.name)
    seen, todo = [], [BaseException]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("attnaudit"):
                seen.append(sub)
    assert errors.AttnauditError in seen and len(seen) > 10
    assert [c for c in seen if c.__module__ != "attnaudit.errors"] == []
    documented = inspect.getdoc(errors) or ""
    for cls in seen:
        assert cls.__name__ in documented, f"{cls.__name__} missing from the hierarchy"


def test_no_sys_path_edits_anywhere():
    root = PACKAGE.parent
    needle = "sys" + ".path"
    offenders = [str(p.relative_to(root)) for folder in
                 ("attnaudit", "tests", "benchmarks", "examples", "scripts")
                 for p in (root / folder).rglob("*.py")
                 if needle in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_only_the_cli_imports_argparse():
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        uses = any((isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names))
                   or (isinstance(n, ast.ImportFrom) and n.module == "argparse")
                   for n in ast.walk(tree))
        assert not uses or _inside(name, "attnaudit.cli"), name


def test_importing_the_gate_report_and_interventions_loads_no_cli_module():
    code = ("import sys, json\nimport attnaudit.validity.gate, attnaudit.report, "
            "attnaudit.interventions, attnaudit.auditing.result\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('attnaudit') "
            "or m == 'argparse')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=PACKAGE.parent)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "attnaudit.report" in loaded and "attnaudit.validity.gate" in loaded
    assert not [m for m in loaded if _inside(m, "attnaudit.cli")], loaded


@pytest.mark.parametrize("light", ["attnaudit.report", "attnaudit.interventions",
                                   "attnaudit.attribution", "captum", "matplotlib"])
def test_import_attnaudit_stays_light_until_an_audit_is_asked_for(light):
    code = ("import sys\nimport attnaudit\n"
            f"assert {light!r} not in sys.modules, '{light} imported'\n"
            "from attnaudit.auditing.orchestration import audit\n"
            "assert attnaudit.audit is audit and 'attnaudit.report' in sys.modules\n"
            "assert {'audit', 'Audit', 'capture'} <= set(dir(attnaudit))\n"
            "try:\n    attnaudit.nothing\nexcept AttributeError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert "has no attribute 'nothing'" in result.stdout
