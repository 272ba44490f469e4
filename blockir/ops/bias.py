"""The BiasOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Elementwise, Learned, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class BiasOp(OpBase):
    """``operand + param``: a learned per-channel ``bias`` declaration added to a value."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Learned, Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    param: str = role_field("decl")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return f"'… + {self.param}'"

    def text(self) -> str:
        return f"{self.result} = {self.operand} + {self.param}"


@LAYOUT.register(BiasOp)
def _layout(op: BiasOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@KEYS.register(BiasOp)
def _keys(op: BiasOp, block: Any, arg: int) -> Any:
    return block.type_of(op.operand)


@EQUIVALENCE.register(BiasOp)
def _equivalence(op: BiasOp, builder: Any) -> tuple:
    return builder.label(op, "bias")


@BUILD.register(BiasOp, "x + bias")
def _build(ctx: Any, result: str, span: Any, operand: str, param: str) -> BiasOp:
    return BiasOp(result, ctx.type_of(operand), operand, param, span=span)


@FX_LOWERING.register(BiasOp)
def _lower(op: BiasOp, b: Any) -> None:
    b.fn(operator.add, (b.env[op.operand], b.attr(op.param)), op.result)


@COST.register(BiasOp)
def _cost(op: BiasOp, c: Any) -> None:
    # its gradient is the sum of the incoming one: nothing saved
    c.moves(op.operand, op.result)
    c.moves_bytes(c.param_bytes(op.param, op.operand))
