"""Syntax tree of a .block file: what was written, with spans, before any meaning."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from blockir.diagnostics import Span


@dataclass(frozen=True)
class Num:
    """A number literal."""

    value: int | float
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Ref:
    """A name or a temporary, as written."""

    name: str  # dotted names joined with '.', temporaries keep their '%'
    span: Span = field(compare=False)


@dataclass(frozen=True)
class AxesLit:
    """An axis list literal, ``[B, S, D]``."""

    names: tuple[str, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class NumbersLit:
    """A list of numbers, ``[1.0, 1.25, 2]``."""

    values: tuple[float, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class BinOp:
    """A binary arithmetic expression."""

    op: str  # + - * / **
    left: "Expr"
    right: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Neg:
    """A unary minus."""

    operand: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class KwArg:
    """A keyword argument, ``name=value``."""

    name: str
    value: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Call:
    """A call: of a declared branch or block, or of a built-in."""

    callee: str
    args: tuple["Expr", ...]
    kwargs: tuple[KwArg, ...]
    span: Span = field(compare=False)
    callee_span: Span = field(compare=False)


Expr = Union[Num, Ref, AxesLit, NumbersLit, BinOp, Neg, Call]


@dataclass(frozen=True)
class PlacementAst:
    """One mesh axis of a type's placement: ``tp=shard(S)``, ``tp=replicate``, ``tp=partial``."""

    mesh: str
    kind: str
    axis: str | None
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TypeAst:
    """A tensor type: its axes, dtype and placement, as written."""

    axes: tuple[tuple[str, Span], ...]
    dtype: str | None
    span: Span = field(compare=False)
    layout: tuple[PlacementAst, ...] = ()


@dataclass(frozen=True)
class ParamAst:
    """A block parameter, ``name: type``."""

    name: str
    type: TypeAst
    span: Span = field(compare=False)


@dataclass(frozen=True)
class DimAst:
    """A ``dim`` definition: its role and, when given, its size."""

    name: str
    role: str
    size: Expr | None
    span: Span = field(compare=False)
    role_span: Span = field(compare=False)


@dataclass(frozen=True)
class ConstAst:
    """A ``const`` definition, at file level or in a block."""

    name: str
    value: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class DeclAst:
    """A declaration in a block: a kind instance, a stacked block or an extern."""

    name: str
    kind: str
    args: tuple[Expr, ...]
    kwargs: tuple[KwArg, ...]
    span: Span = field(compare=False)
    kind_span: Span = field(compare=False)
    count: Expr | None = None  # `Block * N`
    extern_params: tuple[ParamAst, ...] | None = None
    extern_result: TypeAst | None = None
    extern_more: tuple[TypeAst, ...] = ()  # the results after the first


@dataclass(frozen=True)
class EquationAst:
    """An equation: its targets, the expression and its ``@`` attributes."""

    target: str
    value: Expr
    attrs: tuple[tuple[str, Span], ...]
    span: Span = field(compare=False)
    more_targets: tuple[tuple[str, Span], ...] = ()  # `y, s = layers(x, s0)`: one name per further result


@dataclass(frozen=True)
class ReturnAst:
    """A block's ``return``."""

    value: Expr
    span: Span = field(compare=False)
    more: tuple[Expr, ...] = ()  # `return y, s`: the carried streams after the hidden state


Stmt = Union[DeclAst, ConstAst, EquationAst, ReturnAst]


@dataclass(frozen=True)
class BlockAst:
    """A ``block`` or ``model`` definition."""

    keyword: str  # block | model
    name: str
    params: tuple[ParamAst, ...]
    result: TypeAst
    body: tuple[Stmt, ...]
    span: Span = field(compare=False)
    keyword_span: Span = field(compare=False)
    more_results: tuple[TypeAst, ...] = ()


@dataclass(frozen=True)
class ProgramAst:
    """One file's items, in file order."""

    filename: str
    items: tuple[Union[DimAst, ConstAst, BlockAst], ...]
