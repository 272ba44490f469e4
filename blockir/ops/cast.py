"""The CastOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Converts, Elementwise, Modifier, RowLocal, Trait
from blockir.ir.types import DType, TensorType


@dataclass(frozen=True)
class CastOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Modifier, Elementwise, RowLocal, Converts})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    dtype: DType = field()
    span: Span = field(**SPAN)

    def label(self) -> str:
        return f"'cast(…, {self.dtype.value})'"

    def text(self) -> str:
        return f"{self.result} = cast({self.operand}, {self.dtype.value})"


@LAYOUT.register(CastOp)
def _layout(op: CastOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(CastOp)
def _equivalence(op: CastOp, builder: Any) -> tuple:
    return builder.label(op, "cast")


@BUILD.register(CastOp, "cast(x, t)")
def _build(ctx: Any, result: str, span: Any, operand: str, dtype: DType) -> CastOp:
    return CastOp(result, ctx.type_of(operand).with_dtype(dtype), operand, dtype, span=span)


@FX_LOWERING.register(CastOp)
def _lower(op: CastOp, b: Any) -> None:
    b.method("to", (b.env[op.operand], b.rt.TORCH_DTYPES[op.dtype]), op.result)


@COST.register(CastOp)
def _cost(op: CastOp, c: Any) -> None:
    c.moves(op.operand, op.result)
