"""The InputOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import BlockInput, RowLocal, Source, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class InputOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Source, RowLocal, BlockInput})

    result: str = role_field("result")
    type: TensorType = field()
    span: Span = field(**SPAN)

    def text(self) -> str:
        return f"{self.result}: {self.type}"


@LAYOUT.register(InputOp)
def _layout(op: InputOp, ctx: Any, analyser: Any) -> None:
    ctx.bind(op.result)


@EQUIVALENCE.register(InputOp)
def _equivalence(op: InputOp, builder: Any) -> tuple:
    return builder.input_label(op)


@BUILD.register(InputOp, "parameter")
def _build(ctx: Any, result: str, span: Any, t: TensorType) -> InputOp:
    """A block parameter of type ``t``, bound under its name."""
    return InputOp(result, t, span)


@FX_LOWERING.register(InputOp)
def _lower(op: InputOp, b: Any) -> None:
    """Its placeholder is made with the forward's signature, before any op is lowered."""


@COST.register(InputOp)
def _cost(op: InputOp, c: Any) -> None:
    """Moves nothing."""
