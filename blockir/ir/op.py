"""The base of every op kind: field roles, traits and the per-kind hook tables.

A block is an ordered SSA list of ops; each kind is one frozen dataclass in its own file under
``blockir/ops/``. A field's role is one of ``result`` (an SSA value it defines), ``value`` (one it
reads), ``decl`` (a declaration it applies) or ``expr`` (a constant expression it evaluates);
:meth:`OpBase.rename` and :meth:`OpBase.reading` map every field of a role, so a rewrite never lists
an op's fields. Spans never take part in equality.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Callable, ClassVar

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.traits import Trait
from blockir.ir.types import DType, TensorType

SPAN = dict(default=UNKNOWN_SPAN, compare=False, repr=False)


def role_field(role: str, **kw: Any) -> Any:
    return field(metadata={"role": role}, **kw)


Rename = Callable[[str], str]


Substitute = Callable[[ConstExpr], ConstExpr]


class OpBase:
    """Behaviour shared by every op kind; each kind overrides what differs."""

    result: str
    type: TensorType | None
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset()

    def has(self, trait: type[Trait]) -> bool:
        """Whether this op's kind states ``trait`` (see ``blockir.ir.traits``)."""
        return trait in self.TRAITS

    @property
    def results(self) -> tuple[str, ...]:
        return (self.result,)

    @property
    def operands(self) -> tuple[str, ...]:
        """The values it reads, in field order (a tuple field contributes each of its values)."""
        out: list[str] = []
        for name in _reads(type(self)):
            v = getattr(self, name)
            if isinstance(v, tuple):
                out += v
            elif v is not None:
                out.append(v)
        return tuple(out)

    @property
    def applied(self) -> tuple[str, ...]:
        """The declarations it applies (fields of role ``decl``), in field order."""
        return tuple(v for name in _decls(type(self)) if (v := getattr(self, name)) is not None)

    def type_of(self, value: str) -> TensorType | None:
        """The type of one of this op's results."""
        return self.type

    def text(self) -> str:
        """The op as one ``.block`` statement (the printer adds the type comment)."""
        raise NotImplementedError

    def label(self) -> str:
        """How a diagnostic names the temporary this op makes: the expression that made it."""
        return f"'{self.result}'"

    def rename(self, value: Rename, decl: Rename, expr: Substitute) -> OpBase:
        """A copy with every value, declaration and constant-expression field mapped."""
        changes: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            role = f.metadata.get("role")
            if v is None or role is None:
                continue
            if role in ("result", "value"):
                changes[f.name] = tuple(value(a) for a in v) if isinstance(v, tuple) else value(v)
            elif role == "decl":
                changes[f.name] = decl(v)
            elif role == "expr":
                changes[f.name] = expr(v)
        return replace(self, **changes)  # type: ignore[type-var]

    def reading(self, names: dict[str, str]) -> OpBase:
        """A copy reading ``names[v]`` wherever it read ``v``; results keep their names."""
        changes: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.metadata.get("role") != "value" or v is None:
                continue
            new = tuple(names.get(a, a) for a in v) if isinstance(v, tuple) else names.get(v, v)
            if new != v:
                changes[f.name] = new
        return replace(self, **changes) if changes else self  # type: ignore[type-var]

    # What some kinds have and others do not, asked without naming a kind; each default says "none".
    SYMBOL: ClassVar[str] = ""  # the infix operator of a kind written ``lhs SYMBOL rhs``

    def terms(self) -> tuple[str, ...]:
        """The values its result adds or subtracts, as written (a fused add: the shortcut, then the branch)."""
        return ()

    def norm_input(self) -> str | None:
        """The value whose rows it normalizes: a norm's operand, or the sum a fused add+norm computes."""
        return None

    def shortcut_scale(self) -> ConstExpr | None:
        """The constant it multiplies the shortcut term of its own sum by."""
        return None

    def branch_scale(self) -> ConstExpr | None:
        """The constant it multiplies the branch term of its own sum by."""
        return None

    def asserts_inplace(self) -> bool:
        """Whether the source asks for its result to take over an operand's storage (``@inplace``)."""
        return False


@lru_cache(maxsize=None)
def _decls(kind: type) -> tuple[str, ...]:
    """The names of the fields of role ``decl`` of an op kind."""
    return tuple(f.name for f in fields(kind) if f.metadata.get("role") == "decl")


@lru_cache(maxsize=None)
def _reads(kind: type) -> tuple[str, ...]:
    """The names of the fields of role ``value`` of an op kind."""
    return tuple(f.name for f in fields(kind) if f.metadata.get("role") == "value")


def factor_text(c: ConstExpr) -> str:
    return format_expr(c, 2)
