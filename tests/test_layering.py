"""The package layers import only downward: ir ← analyses ← verifiers ← rewrites ← reports/backends ← commands.

An analysis that imported a verifier or a rewrite would put a cycle into the one-way pipeline the
architecture section of the README describes; this reads every import statement, including those
inside functions, so a lazy import cannot hide one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "blockir"
# what each layer may not import
FORBIDDEN = {
    "ir": ("analyses", "verifiers", "passes", "reports", "lower", "lifecycle", "commands"),
    # the norm families sit under the kind table, which reads their schemas: only the schema records below them
    "norms": ("frontend", "analyses", "verifiers", "passes", "reports", "lower", "lifecycle", "commands",
              "importers", "lift", "ops"),
    "frontend": ("analyses", "verifiers", "passes", "reports", "lower", "lifecycle", "commands"),
    "analyses": ("verifiers", "passes", "reports", "lower", "lifecycle", "commands"),
    "verifiers": ("passes", "reports", "lower", "lifecycle", "commands"),
    "passes": ("reports", "commands"),
    # lift reads the language, analyses and verifiers, and compiles through the backends for its certificate
    "lift": ("passes", "reports", "importers", "commands"),
}
# who may import the lift: its command, and the package's lazy export
LIFT_USERS = ("lift", "commands")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_downward(layer: str) -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in sorted((PACKAGE / layer).rglob("*.py")) for line, module in _imports(path)
             if any(module == f"blockir.{f}" or module.startswith(f"blockir.{f}.") for f in FORBIDDEN[layer])]
    assert wrong == []


def test_only_the_command_and_the_lazy_export_import_lift() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).parts[0] not in LIFT_USERS and path != PACKAGE / "__init__.py"
             for line, module in _imports(path) if module == "blockir.lift" or module.startswith("blockir.lift.")]
    assert wrong == []
