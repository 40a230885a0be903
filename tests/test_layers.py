"""The package's layers, read off its source: which modules import which.

capture -> analysis / interventions -> auditing.validity -> checklist -> report, gate
-> auditing.result (the Audit and its views) -> auditing.orchestration -> cli. Imports
inside functions count as much as those at the top of a module; those under
``if TYPE_CHECKING:`` (never run) do not.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attnaudit"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``: annotations only, never
    run (modules use ``from __future__ import annotations``), so they import nothing."""
    for child in ast.iter_child_nodes(tree):
        if _type_checking(child):
            yield from (n for part in child.orelse for n in [part, *_nodes(part)])
            continue
        yield child
        yield from _nodes(child)


def _imports(name: str) -> set[str]:
    """The attnaudit modules ``name`` imports anywhere in its source, inside functions too (a
    ``from X import Y`` names module X.Y when Y is a module, else X)."""
    found: set[str] = set()
    for node in _nodes(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES
                          else base)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_walk_sees_the_package():
    assert {"attnaudit.cli", "attnaudit.gate", "attnaudit.auditing.orchestration",
            "attnaudit.report.item_figures"} <= set(MODULES)
    assert "attnaudit.auditing.result" in GRAPH["attnaudit.auditing.orchestration"]
    assert "attnaudit.report" in GRAPH["attnaudit.auditing.result"]


def test_no_import_cycle_among_attnaudit_modules():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_cycle_search_finds_a_planted_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "attnaudit.capturing.recorder",
                        GRAPH["attnaudit.capturing.recorder"] | {"attnaudit.gate"})
    monkeypatch.setitem(GRAPH, "attnaudit.gate", GRAPH["attnaudit.gate"]
                        | {"attnaudit.capturing.recorder"})
    assert _cycle() is not None


def _reach(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


# What each layer may not reach, directly or through others.
ABOVE = {
    "attnaudit.capturing": ("attnaudit.analysis", "attnaudit.interventions",
                            "attnaudit.auditing", "attnaudit.checklist", "attnaudit.report",
                            "attnaudit.gate", "attnaudit.cli"),
    "attnaudit.analysis": ("attnaudit.interventions", "attnaudit.auditing",
                           "attnaudit.checklist", "attnaudit.report", "attnaudit.gate",
                           "attnaudit.cli"),
    "attnaudit.interventions": ("attnaudit.auditing", "attnaudit.checklist",
                                "attnaudit.report", "attnaudit.gate", "attnaudit.cli"),
    "attnaudit.auditing.validity": ("attnaudit.checklist", "attnaudit.report",
                                    "attnaudit.gate", "attnaudit.cli",
                                    "attnaudit.auditing.result",
                                    "attnaudit.auditing.orchestration"),
    "attnaudit.checklist": ("attnaudit.report", "attnaudit.gate", "attnaudit.cli",
                            "attnaudit.auditing.result", "attnaudit.auditing.orchestration"),
    "attnaudit.report": ("attnaudit.gate", "attnaudit.cli", "attnaudit.auditing.result",
                         "attnaudit.auditing.orchestration"),
    "attnaudit.gate": ("attnaudit.report", "attnaudit.cli", "attnaudit.auditing.result",
                       "attnaudit.auditing.orchestration"),
    "attnaudit.auditing.result": ("attnaudit.cli", "attnaudit.auditing.orchestration"),
    "attnaudit.auditing.orchestration": ("attnaudit.cli",),
}


def _inside(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@pytest.mark.parametrize("layer", list(ABOVE))
def test_no_layer_reaches_a_layer_above_it(layer):
    for module in (m for m in MODULES if _inside(m, layer)):
        wrong = sorted(m for m in _reach(module)
                       if any(_inside(m, above) for above in ABOVE[layer]))
        assert not wrong, f"{module} reaches {wrong}"


def test_only_the_cli_imports_argparse():
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        uses = any((isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names))
                   or (isinstance(n, ast.ImportFrom) and n.module == "argparse")
                   for n in ast.walk(tree))
        assert not uses or _inside(name, "attnaudit.cli"), name


def test_importing_the_gate_report_and_interventions_loads_no_cli_module():
    code = ("import sys, json\nimport attnaudit.gate, attnaudit.report, "
            "attnaudit.interventions, attnaudit.auditing.result\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('attnaudit') "
            "or m == 'argparse')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=PACKAGE.parent)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "attnaudit.report" in loaded and "attnaudit.gate" in loaded
    assert not [m for m in loaded if _inside(m, "attnaudit.cli")], loaded


def test_import_attnaudit_stays_light_until_an_audit_is_asked_for():
    code = ("import sys\nimport attnaudit\n"
            "assert 'attnaudit.report' not in sys.modules, 'report imported'\n"
            "assert 'attnaudit.interventions' not in sys.modules, 'interventions imported'\n"
            "from attnaudit.auditing.orchestration import audit\n"
            "assert attnaudit.audit is audit and 'attnaudit.report' in sys.modules\n"
            "assert {'audit', 'Audit', 'capture'} <= set(dir(attnaudit))\n"
            "try:\n    attnaudit.nothing\nexcept AttributeError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert "has no attribute 'nothing'" in result.stdout
