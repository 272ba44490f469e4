"""Verifiers by name. Each is a pure function Program → diagnostics, run in registration order."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Iterable

from blockir.diagnostics import Diagnostic, sort_key
from blockir.ir.program import Program

Verifier = Callable[[Program], list[Diagnostic]]
VERIFIERS: dict[str, Verifier] = {}


def verifier(name: str) -> Callable[[Verifier], Verifier]:
    def register(fn: Verifier) -> Verifier:
        VERIFIERS[name] = fn
        return fn
    return register


def run_verifiers(program: Program, names: Iterable[str] | None = None) -> list[Diagnostic]:
    _load_all()
    chosen = list(VERIFIERS) if names is None else list(names)
    out: list[Diagnostic] = []
    for name in chosen:
        out += VERIFIERS[name](program)
    return sorted(out, key=sort_key)


def _load_all() -> None:
    # importing every module of the package registers its verifiers
    import blockir.verifiers as package
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"blockir.verifiers.{info.name}")
