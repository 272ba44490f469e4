"""The ScaleOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import ConstExpr
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, factor_text, role_field
from blockir.ir.traits import Elementwise, Modifier, RowLocal, Scales, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class ScaleOp(OpBase):
    """``factor * operand``: a constant expression, or a learned scalar/vector declaration."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Scales, Modifier, Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    factor: ConstExpr | None = role_field("expr", default=None)
    param: str | None = role_field("decl", default=None)
    span: Span = field(**SPAN)

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.param is None):
            raise ValueError("a scale has exactly one of a constant factor or a learned parameter")

    def label(self) -> str:
        return f"'{self.param} * …'" if self.param else "'… * …' (a constant scale)"

    def text(self) -> str:
        factor = self.param if self.param is not None else factor_text(self.factor)  # type: ignore[arg-type]
        return f"{self.result} = {factor} * {self.operand}"


@LAYOUT.register(ScaleOp)
def _layout(op: ScaleOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@KEYS.register(ScaleOp)
def _keys(op: ScaleOp, block: Any, arg: int) -> Any:
    return block.type_of(op.operand)


@EQUIVALENCE.register(ScaleOp)
def _equivalence(op: ScaleOp, builder: Any) -> tuple:
    return builder.label(op, "scale")


@BUILD.register(ScaleOp, "s * x")
def _build(ctx: Any, result: str, span: Any, operand: str, factor: Any, param: str | None) -> ScaleOp:
    """A constant ``factor`` or a learned ``param`` declaration times a tensor."""
    return ScaleOp(result, ctx.type_of(operand), operand, factor=factor, param=param, span=span)


@FX_LOWERING.register(ScaleOp)
def _lower(op: ScaleOp, b: Any) -> None:
    factor = b.attr(op.param) if op.param is not None else float(b.value(op.factor))
    offset = b.decl(op.param).arg("offset", 0) if op.param is not None else 0
    if offset:
        factor = b.fn(b.rt.offset_weight, (factor, offset))
    b.fn(operator.mul, (factor, b.env[op.operand]), op.result)


@COST.register(ScaleOp)
def _cost(op: ScaleOp, c: Any) -> None:
    c.moves(op.operand, op.result)
    if op.param is not None:  # a learned gain reads itself and keeps its input for its own gradient
        c.moves_bytes(c.param_bytes(op.param, op.operand))
        c.keeps(op.operand)
