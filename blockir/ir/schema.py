"""The schema of a declaration kind: its arguments, their defaults and the contradictions between them.

Both the kind table (``blockir.ir.kinds``) and the norm families (``blockir.norms``) state their
arguments with these records; the builder checks every declaration against them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = object()


@dataclass(frozen=True)
class ArgSpec:
    """One argument of a kind: its value kind, default, choices and documentation."""

    name: str
    # axes | dim | expr | bool | enum | dtype | int | numbers | name (a parameter's name, dotted for a nested one) |
    # decl (another declaration of the same block, of a category in ``choices``)
    kind: str
    default: Any = REQUIRED
    choices: tuple[Any, ...] = ()
    positional: bool = False
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Implies:
    """While ``when`` = ``given``, argument ``arg`` can only be ``value``: its default follows, and any
    other value is a contradiction (the module would silently not have what the argument asks for)."""

    when: str
    given: Any
    arg: str
    value: Any
    reason: str


@dataclass(frozen=True)
class KindSpec:
    """A built-in kind: its category, arguments and the contradictions among them."""

    name: str
    category: str  # norm | branch | linear | scale | activation | embedding | head
    args: tuple[ArgSpec, ...]
    doc: str
    implies: tuple[Implies, ...] = ()

    def arg(self, name: str) -> ArgSpec | None:
        return next((a for a in self.args if a.name == name), None)

    @property
    def positional(self) -> tuple[ArgSpec, ...]:
        return tuple(a for a in self.args if a.positional)
