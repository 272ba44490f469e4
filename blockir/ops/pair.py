"""The base of the kinds written `lhs SYMBOL rhs` (MulOp, SubOp): two tensors of one type."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class TensorPair(OpBase):
    """An elementwise operation of two tensors of one type: ``lhs SYMBOL rhs``."""

    result: str = role_field("result")
    type: TensorType = field()
    lhs: str = role_field("value")
    rhs: str = role_field("value")
    span: Span = field(**SPAN)
    SYMBOL: ClassVar[str] = ""

    def text(self) -> str:
        return f"{self.result} = {self.lhs} {self.SYMBOL} {self.rhs}"
