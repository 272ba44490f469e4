"""The InputOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
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


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)

from typing import Any

from blockir.ir.hooks import BUILD, EQUIVALENCE, LAYOUT


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


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)

from typing import Any

from blockir.ir.hooks import COST, FX_LOWERING


@FX_LOWERING.register(InputOp)
def _lower(op: InputOp, b: Any) -> None:
    """Its placeholder is made with the forward's signature, before any op is lowered."""


@COST.register(InputOp)
def _cost(op: InputOp, c: Any) -> None:
    """Moves nothing."""
