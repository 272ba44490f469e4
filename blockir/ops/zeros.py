"""The ZerosOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import RowLocal, Source, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class ZerosOp(OpBase):
    """A tensor of zeros of a declared type: the value a carried stream starts from before the first layer."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Source, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'zeros(…)'"

    def text(self) -> str:
        return f"{self.result} = zeros([{', '.join(self.type.names)}])"


@LAYOUT.register(ZerosOp)
def _layout(op: ZerosOp, ctx: Any, analyser: Any) -> None:
    """A zeros start is replicated over every mesh axis: it records no placement."""


@EQUIVALENCE.register(ZerosOp)
def _equivalence(op: ZerosOp, builder: Any) -> tuple:
    return builder.label(op, "zeros")


@BUILD.register(ZerosOp, "zeros([…])")
def _build(ctx: Any, result: str, span: Any, axes: tuple[Any, ...], axes_span: Any) -> ZerosOp | None:
    """Zeros over the listed axes; a list that makes no tensor type (an axis twice) is E0111 at the list."""
    try:
        t = TensorType(tuple(axes))
    except ValueError as exc:
        ctx.err("E0111", str(exc), axes_span)
        return None
    return ZerosOp(result, t, span=span)


@FX_LOWERING.register(ZerosOp)
def _lower(op: ZerosOp, b: Any) -> None:
    # in the dtype and on the device of the block's first input, each size read where an input has the axis
    b.fn(b.rt.zeros_of, (b.env[b.block.inputs[0].result], b.runtime_sizes(op.type)), op.result, wrapped=True)


@COST.register(ZerosOp)
def _cost(op: ZerosOp, c: Any) -> None:
    """Moves nothing the ledger counts: a carried stream's start."""
