"""The SubOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar

from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.traits import Combines, Difference, Elementwise, RowLocal, Trait
from blockir.ops.pair import TensorPair


@dataclass(frozen=True)
class SubOp(TensorPair):
    """``lhs - rhs`` of two tensors of one type: the step from a point toward a target, as in the
    normalized interpolation ``h + alpha * (t - h)`` of nGPT (Loshchilov et al., arXiv:2410.01131)."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Combines, Elementwise, RowLocal, Difference})

    SYMBOL: ClassVar[str] = "-"

    def label(self) -> str:
        return "'… - …'"

    def terms(self) -> tuple[str, ...]:
        return (self.lhs, self.rhs)


@LAYOUT.register(SubOp)
def _layout(op: SubOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.lhs)


@EQUIVALENCE.register(SubOp)
def _equivalence(op: SubOp, builder: Any) -> tuple:
    return builder.label(op, "sub")


@BUILD.register(SubOp, "a - b")
def _build(ctx: Any, result: str, span: Any, lhs: str, rhs: str) -> SubOp:
    return SubOp(result, ctx.type_of(lhs), lhs, rhs, span=span)


@FX_LOWERING.register(SubOp)
def _lower(op: SubOp, b: Any) -> None:
    b.fn(operator.sub, (b.env[op.lhs], b.env[op.rhs]), op.result)


@COST.register(SubOp)
def _cost(op: SubOp, c: Any) -> None:
    c.moves(op.lhs, op.rhs, op.result)
