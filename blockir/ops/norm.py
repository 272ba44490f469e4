"""The NormOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Normalizes, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class NormOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Normalizes, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    decl: str = role_field("decl")
    operand: str = role_field("value")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return f"'{self.decl}(…)'"

    def text(self) -> str:
        return f"{self.result} = {self.decl}({self.operand})"

    def norm_input(self) -> str | None:
        return self.operand


@LAYOUT.register(NormOp)
def _layout(op: NormOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@KEYS.register(NormOp)
def _keys(op: NormOp, block: Any, arg: int) -> Any:
    return block.type_of(op.operand)


@EQUIVALENCE.register(NormOp)
def _equivalence(op: NormOp, builder: Any) -> tuple:
    return builder.label(op, "norm")


@BUILD.register(NormOp, "norm(x)")
def _build(ctx: Any, result: str, span: Any, decl: str, operand: str) -> NormOp:
    """A norm declaration applied to a value: the result has the value's type."""
    return NormOp(result, ctx.type_of(operand), decl, operand, span=span)


@FX_LOWERING.register(NormOp)
def _lower(op: NormOp, b: Any) -> None:
    # a batch-coupled norm reads the padding mask from the context
    b.module(op.decl, (b.env[op.operand],), op.result, with_ctx=b.batch_coupled(op.decl))


@COST.register(NormOp)
def _cost(op: NormOp, c: Any) -> None:
    # reads its input and parameters, writes its result and row statistics; backward keeps the input
    rows = c.rows(op.operand)
    stats = c.norm_statistics(op.decl, rows)
    c.moves(op.operand, op.result)
    c.moves_bytes(c.norm_parameter_bytes(op.decl, op.operand) + stats)
    c.keeps(op.operand)
    c.keeps_statistics(stats)
    c.reduces(c.decl(op.decl).kind, rows)
