"""The ActivationOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Elementwise, Function, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class ActivationOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Elementwise, RowLocal, Function})

    result: str = role_field("result")
    type: TensorType = field()
    fn: str = field()
    operand: str = role_field("value")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return f"'{self.fn}(…)'"

    def text(self) -> str:
        return f"{self.result} = {self.fn}({self.operand})"


@LAYOUT.register(ActivationOp)
def _layout(op: ActivationOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(ActivationOp)
def _equivalence(op: ActivationOp, builder: Any) -> tuple:
    return builder.label(op, "activation")


@BUILD.register(ActivationOp, "fn(x)")
def _build(ctx: Any, result: str, span: Any, fn: str, operand: str) -> ActivationOp:
    """A built-in activation or gate function applied to a value."""
    return ActivationOp(result, ctx.type_of(operand), fn, operand, span=span)


@FX_LOWERING.register(ActivationOp)
def _lower(op: ActivationOp, b: Any) -> None:
    b.fn(b.rt.ACTIVATIONS[op.fn], (b.env[op.operand],), op.result)


@COST.register(ActivationOp)
def _cost(op: ActivationOp, c: Any) -> None:
    """Part of a branch's computation, which the ledger does not count."""
