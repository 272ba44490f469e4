"""The ComplementOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Complement, Elementwise, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class ComplementOp(OpBase):
    """``1 - operand``: the complementary gate of a convex combination."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Elementwise, RowLocal, Complement})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'1 - …'"

    def text(self) -> str:
        return f"{self.result} = 1 - {self.operand}"


@LAYOUT.register(ComplementOp)
def _layout(op: ComplementOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(ComplementOp)
def _equivalence(op: ComplementOp, builder: Any) -> tuple:
    return builder.label(op, "complement")


@BUILD.register(ComplementOp, "1 - z")
def _build(ctx: Any, result: str, span: Any, operand: str) -> ComplementOp:
    return ComplementOp(result, ctx.type_of(operand), operand, span=span)


@FX_LOWERING.register(ComplementOp)
def _lower(op: ComplementOp, b: Any) -> None:
    b.fn(b.rt.complement, (b.env[op.operand],), op.result)


@COST.register(ComplementOp)
def _cost(op: ComplementOp, c: Any) -> None:
    c.moves(op.operand, op.result)
