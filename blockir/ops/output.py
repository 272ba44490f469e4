"""The OutputOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Sink, Trait


@dataclass(frozen=True)
class OutputOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Sink})

    value: str = role_field("value")
    span: Span = field(**SPAN)
    more: tuple[str, ...] = role_field("value", default=())  # the carried streams returned after the hidden state
    result = "<output>"
    type = None

    @property
    def results(self) -> tuple[str, ...]:
        return ()

    @property
    def values(self) -> tuple[str, ...]:
        return (self.value, *self.more)

    def text(self) -> str:
        return f"return {', '.join(self.values)}"


@LAYOUT.register(OutputOp)
def _layout(op: OutputOp, ctx: Any, analyser: Any) -> None:
    ctx.returns(op, op.value)


@EQUIVALENCE.register(OutputOp)
def _equivalence(op: OutputOp, builder: Any) -> tuple:
    return builder.output_label(op)


@BUILD.register(OutputOp, "return")
def _build(ctx: Any, result: None, span: Any, values: tuple[str, ...]) -> OutputOp:
    """``return y, s1, …``: the hidden state first, then each carried stream."""
    return OutputOp(values[0], span, tuple(values[1:]))


@FX_LOWERING.register(OutputOp)
def _lower(op: OutputOp, b: Any) -> None:
    b.output(tuple(b.env[v] for v in op.values) if op.more else b.env[op.value])


@COST.register(OutputOp)
def _cost(op: OutputOp, c: Any) -> None:
    """Moves nothing."""
