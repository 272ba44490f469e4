"""The MulOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar

from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.traits import Combines, Elementwise, Product, RowLocal, Trait
from blockir.ops.pair import TensorPair


@dataclass(frozen=True)
class MulOp(TensorPair):
    """``lhs * rhs`` of two tensors of one type, elementwise: a gate applied to a value."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Combines, Elementwise, RowLocal, Product})

    SYMBOL: ClassVar[str] = "*"

    def label(self) -> str:
        return "'… * …' (a product of tensors)"


@LAYOUT.register(MulOp)
def _layout(op: MulOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.lhs)


@EQUIVALENCE.register(MulOp)
def _equivalence(op: MulOp, builder: Any) -> tuple:
    return builder.label(op, "mul")


@BUILD.register(MulOp, "a * b")
def _build(ctx: Any, result: str, span: Any, lhs: str, rhs: str) -> MulOp:
    return MulOp(result, ctx.type_of(lhs), lhs, rhs, span=span)


@FX_LOWERING.register(MulOp)
def _lower(op: MulOp, b: Any) -> None:
    b.fn(operator.mul, (b.env[op.lhs], b.env[op.rhs]), op.result)


@COST.register(MulOp)
def _cost(op: MulOp, c: Any) -> None:
    c.moves(op.lhs, op.rhs, op.result)
    c.keeps(op.lhs)  # each factor's gradient needs the other
    c.keeps(op.rhs)
