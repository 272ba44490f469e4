"""The AddOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Combines, Elementwise, ResidualSum, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class AddOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({ResidualSum, Combines, Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    lhs: str = role_field("value")
    rhs: str = role_field("value")
    inplace: bool = False
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'… + …'"

    def text(self) -> str:
        return f"{'@inplace ' if self.inplace else ''}{self.result} = {self.lhs} + {self.rhs}"

    SYMBOL: ClassVar[str] = "+"

    def terms(self) -> tuple[str, ...]:
        return (self.lhs, self.rhs)

    def asserts_inplace(self) -> bool:
        return self.inplace


@LAYOUT.register(AddOp)
def _layout(op: AddOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.lhs)


@EQUIVALENCE.register(AddOp)
def _equivalence(op: AddOp, builder: Any) -> tuple:
    return builder.label(op, "add")


@BUILD.register(AddOp, "a + b")
def _build(ctx: Any, result: str, span: Any, lhs: str, rhs: str) -> AddOp:
    """Two tensors of one type summed (``@inplace`` is set afterwards, on the statement's own add)."""
    return AddOp(result, ctx.type_of(lhs), lhs, rhs, span=span)


@FX_LOWERING.register(AddOp)
def _lower(op: AddOp, b: Any) -> None:
    target = b.inplace_target(op)  # in inference, the operand whose buffer the buffer plan lets it overwrite
    if target is None:
        b.fn(operator.add, (b.env[op.lhs], b.env[op.rhs]), op.result)
    else:
        other = op.rhs if target == op.lhs else op.lhs
        b.fn(b.rt.inplace_add, (b.env[target], b.env[other]), op.result, wrapped=True)


@COST.register(AddOp)
def _cost(op: AddOp, c: Any) -> None:
    c.moves(op.lhs, op.rhs, op.result)
