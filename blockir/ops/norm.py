"""The NormOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
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


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)
