"""The SoftcapOp kind: ``cap * tanh(x / cap)``, a smooth bound on a value's magnitude.

Gemma 2 caps its attention logits and its final logits this way (Gemma Team, "Gemma 2: Improving Open
Language Models at a Practical Size", 2024: ``final_logit_softcapping = 30``); the result lies in
``(-cap, cap)`` and equals ``x`` to first order near zero. Written ``softcap(x, cap=30)``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import SPAN, OpBase, role_field
from blockir.ir.traits import Elementwise, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class SoftcapOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    cap: ConstExpr = role_field("expr")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'softcap(…)'"

    def text(self) -> str:
        return f"{self.result} = softcap({self.operand}, cap={format_expr(self.cap)})"


@BUILD.function(SoftcapOp, "softcap", "cap")
def _build(ctx: Any, result: str, span: Span, operand: str, cap: ConstExpr) -> SoftcapOp | None:
    value = ctx.env(cap)
    if value is not None and not value > 0:
        ctx.err("E0120", f"softcap's cap must be > 0, got {value}", span,
                "the result lies in (-cap, cap): Gemma 2 caps its final logits at 30")
        return None
    return SoftcapOp(result, ctx.type_of(operand), operand, cap, span=span)


@LAYOUT.register(SoftcapOp)
def _layout(op: SoftcapOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(SoftcapOp)
def _equivalence(op: SoftcapOp, builder: Any) -> tuple:
    return builder.label(op, "softcap")


@FX_LOWERING.register(SoftcapOp)
def _lower(op: SoftcapOp, b: Any) -> None:
    # in Gemma 2's order: divide, tanh, multiply, so the result is bit-equal to its code
    cap = float(b.value(op.cap))
    scaled = b.fn(operator.truediv, (b.env[op.operand], cap))
    b.fn(operator.mul, (b.fn(b.rt.ACTIVATIONS["tanh"], (scaled,)), cap), op.result)


@COST.register(SoftcapOp)
def _cost(op: SoftcapOp, c: Any) -> None:
    c.moves(op.operand, op.result)
