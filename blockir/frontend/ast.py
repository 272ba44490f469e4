"""Syntax tree of a .block file: what was written, with spans, before any meaning."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from blockir.diagnostics import Span


@dataclass(frozen=True)
class Num:
    value: int | float
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Ref:
    name: str  # dotted names joined with '.', temporaries keep their '%'
    span: Span = field(compare=False)


@dataclass(frozen=True)
class AxesLit:
    names: tuple[str, ...]
    span: Span = field(compare=False)


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / **
    left: "Expr"
    right: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class KwArg:
    name: str
    value: "Expr"
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Call:
    callee: str
    args: tuple["Expr", ...]
    kwargs: tuple[KwArg, ...]
    span: Span = field(compare=False)
    callee_span: Span = field(compare=False)


Expr = Union[Num, Ref, AxesLit, BinOp, Neg, Call]


@dataclass(frozen=True)
class PlacementAst:
    mesh: str
    kind: str
    axis: str | None
    span: Span = field(compare=False)


@dataclass(frozen=True)
class TypeAst:
    axes: tuple[tuple[str, Span], ...]
    dtype: str | None
    span: Span = field(compare=False)
    layout: tuple[PlacementAst, ...] = ()


@dataclass(frozen=True)
class ParamAst:
    name: str
    type: TypeAst
    span: Span = field(compare=False)


@dataclass(frozen=True)
class DimAst:
    name: str
    role: str
    size: Expr | None
    span: Span = field(compare=False)
    role_span: Span = field(compare=False)


@dataclass(frozen=True)
class ConstAst:
    name: str
    value: Expr
    span: Span = field(compare=False)


@dataclass(frozen=True)
class DeclAst:
    name: str
    kind: str
    args: tuple[Expr, ...]
    kwargs: tuple[KwArg, ...]
    span: Span = field(compare=False)
    kind_span: Span = field(compare=False)
    count: Expr | None = None  # `Block * N`
    extern_params: tuple[ParamAst, ...] | None = None
    extern_result: TypeAst | None = None


@dataclass(frozen=True)
class EquationAst:
    target: str
    value: Expr
    attrs: tuple[tuple[str, Span], ...]
    span: Span = field(compare=False)
    more_targets: tuple[tuple[str, Span], ...] = ()  # `y, s = layers(x, s0)`: one name per further result


@dataclass(frozen=True)
class ReturnAst:
    value: Expr
    span: Span = field(compare=False)
    more: tuple[Expr, ...] = ()  # `return y, s`: the carried streams after the hidden state


Stmt = Union[DeclAst, ConstAst, EquationAst, ReturnAst]


@dataclass(frozen=True)
class BlockAst:
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
    filename: str
    items: tuple[Union[DimAst, ConstAst, BlockAst], ...]
