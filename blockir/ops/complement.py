"""The ComplementOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
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


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)

from typing import Any

from blockir.ir.hooks import BUILD, EQUIVALENCE, LAYOUT


@LAYOUT.register(ComplementOp)
def _layout(op: ComplementOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(ComplementOp)
def _equivalence(op: ComplementOp, builder: Any) -> tuple:
    return builder.label(op, "complement")


@BUILD.register(ComplementOp, "1 - z")
def _build(ctx: Any, result: str, span: Any, operand: str) -> ComplementOp:
    return ComplementOp(result, ctx.type_of(operand), operand, span=span)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)

from typing import Any

from blockir.ir.hooks import COST, FX_LOWERING


@FX_LOWERING.register(ComplementOp)
def _lower(op: ComplementOp, b: Any) -> None:
    b.fn(b.rt.complement, (b.env[op.operand],), op.result)


@COST.register(ComplementOp)
def _cost(op: ComplementOp, c: Any) -> None:
    c.moves(op.operand, op.result)
