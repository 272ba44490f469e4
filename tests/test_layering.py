"""The packages import only down the pipeline, and no module imports itself back through others.

Text becomes IR (frontend, ir, ops, norms), is analysed, verified, rewritten by passes, lowered to torch, and
run by the lifecycle; commands sit on top. Reports read analyses (and lowering, for costs); the lift reads
the language, analyses and verifiers and compiles through lowering for its certificate; importers write
``.block`` text from the language alone. Every import statement counts, including those inside functions,
so a lazy import cannot hide an upward edge; the cycle test reads the imports that run when a module loads.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pytest

from conftest import ROOT

PACKAGE = ROOT / "blockir"

# Known upward imports: (file, imported module). An entry goes when its import does; the test fails on
# any edge not listed here, and on an entry whose import is gone.
ALLOWED_VIOLATIONS: frozenset[tuple[str, str]] = frozenset({
    # the budget check reads the cost ledger, which reports owns
    ("blockir/lower/compile.py", "blockir.reports.budget"),
})
# Known load-time import cycles, as the sorted modules of each (none: keep it that way).
ALLOWED_CYCLES: tuple[tuple[str, ...], ...] = ()

BASE = ("diagnostics", "collector")  # what every layer may use
LANGUAGE = ("frontend", "ir", "ops", "norms", "signatures")
PIPELINE = (LANGUAGE, ("analyses",), ("verifiers", "api"), ("passes",), ("lower",), ("lifecycle",))


def _below(stage: str) -> set[str]:
    """The layers a pipeline stage may import: its own and every earlier one."""
    out = set(BASE)
    for layer in PIPELINE:
        out.update(layer)
        if stage in layer:
            return out
    raise KeyError(stage)


# what each layer may import (top-level modules count as layers: api with the verifiers, cli with the commands)
MAY_IMPORT: dict[str, set[str]] = {
    **{name: _below(name) for layer in PIPELINE for name in layer},
    "lifecycle": _below("lifecycle") | {"reports", "importers"},
    "reports": _below("lower") | {"reports"},
    "lift": {*BASE, *LANGUAGE, "analyses", "verifiers", "api", "lower", "lift"},
    "importers": {*BASE, "ir", "frontend", "importers"},
    # the norm families sit under the kind table, which reads their schemas: only the IR's records below them
    "norms": {*BASE, "ir", "norms"},
    # the public API checks what the importer wrote (importers read only the language, so no cycle)
    "api": _below("api") | {"importers"},
}
# the command layer and the public package may import anything
TOP = ("commands", "cli", "__main__", "__init__", "ngpt")
# who may import the lifecycle: the command layer and the lazy public API
LIFECYCLE_USERS = ("lifecycle", "commands", "cli", "__main__", "__init__", "api")
# who may import the lift: its command, and the package's lazy export
LIFT_USERS = ("lift", "commands", "__init__")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST) -> list[str]:
    """The blockir modules an import statement loads (``from blockir import ops`` loads ``blockir.ops``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "blockir"]
    if not isinstance(node, ast.ImportFrom) or node.level or not node.module or \
            node.module.split(".")[0] != "blockir":
        return []
    subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
    return subs if len(subs) == len(node.names) else subs + [node.module]


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, t) for node in ast.walk(_tree(path)) for t in _targets(node)]


def _layer(module: str) -> str:
    """``blockir.passes.fold`` is in layer passes, ``blockir.api`` is its own, the package itself ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@lru_cache(maxsize=None)
def _edges() -> list[tuple[str, int, str]]:
    return [(str(path.relative_to(ROOT)), line, target) for path in MODULES.values()
            for line, target in _imports(path)]


def _listed(edges: list[tuple[str, int, str]]) -> list[str]:
    return [f"{where}:{line}: {target}" for where, line, target in edges if (where, target) not in ALLOWED_VIOLATIONS]


def _source(where: str) -> str:
    return _layer(_module(ROOT / where))


@pytest.mark.parametrize("layer", sorted(set(MAY_IMPORT) - set(BASE)))
def test_layers_import_only_downward(layer: str) -> None:
    assert _listed([(where, line, target) for where, line, target in _edges() if _source(where) == layer
                    and _layer(target) not in MAY_IMPORT[layer] | {layer}]) == []


def test_every_package_has_a_rule() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    assert packages - set(MAY_IMPORT) - set(TOP) == set()


@pytest.mark.parametrize("layer,users", [("lifecycle", LIFECYCLE_USERS), ("lift", LIFT_USERS)])
def test_only_the_commands_and_the_lazy_public_api_import(layer: str, users: tuple[str, ...]) -> None:
    assert _listed([(where, line, target) for where, line, target in _edges()
                    if _layer(target) == layer and _source(where) not in users]) == []


def test_the_allowed_violations_still_exist() -> None:
    """An entry whose import is gone must leave the list, so that the list only ever shrinks."""
    present = {(where, target) for where, _, target in _edges()}
    assert sorted(ALLOWED_VIOLATIONS - present) == []


def _load_time_imports(path: Path) -> list[str]:
    """The imports a module runs when it is loaded: module-level statements, also under ``if``/``try``
    (``if TYPE_CHECKING:`` blocks excepted, they never run)."""
    out: list[str] = []
    todo = list(_tree(path).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        else:
            out += _targets(node)
    return out


def test_no_module_level_import_cycle() -> None:
    graph = nx.DiGraph()
    graph.add_edges_from((module, target) for module, path in MODULES.items()
                         for target in _load_time_imports(path) if target != module)
    cycles = sorted(tuple(sorted(c)) for c in nx.simple_cycles(graph))
    assert [c for c in cycles if c not in ALLOWED_CYCLES] == []
    assert [c for c in ALLOWED_CYCLES if c not in cycles] == []  # a cycle that is gone leaves the list
