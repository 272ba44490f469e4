"""The AddOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Combines, Elementwise, ResidualSum, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class AddOp(OpBase):
    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({ResidualSum, Combines, Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    lhs: str = role_field("value")
    rhs: str = role_field("value")
    inplace: bool = False
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'… + …'"

    def text(self) -> str:
        return f"{'@inplace ' if self.inplace else ''}{self.result} = {self.lhs} + {self.rhs}"

    SYMBOL: ClassVar[str] = "+"

    def terms(self) -> tuple[str, ...]:
        return (self.lhs, self.rhs)

    def asserts_inplace(self) -> bool:
        return self.inplace


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)
