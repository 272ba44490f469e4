"""One frozen dataclass per op kind. A block is an ordered SSA list of these.

Each op names its result and its operands (other results or block inputs) and
carries the inferred type of its result. Spans never take part in equality.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr
from blockir.ir.types import DType, TensorType

_SPAN = dict(default=UNKNOWN_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class InputOp:
    result: str
    type: TensorType
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class NormOp:
    result: str
    type: TensorType
    decl: str
    operand: str
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class CallOp:
    """A branch, linear, activation declaration, extern, block or stack applied to values."""

    result: str
    type: TensorType
    decl: str
    args: tuple[str, ...]
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return self.args


@dataclass(frozen=True)
class ActivationOp:
    result: str
    type: TensorType
    fn: str
    operand: str
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class DropoutOp:
    """Inverted dropout; ``mask`` says which axes one draw covers (element, row, channel, sample)."""

    result: str
    type: TensorType
    operand: str
    p: ConstExpr
    mask: str
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class ScaleOp:
    """``factor * operand``: a constant expression, or a learned scalar/vector declaration."""

    result: str
    type: TensorType
    operand: str
    factor: ConstExpr | None = None
    param: str | None = None
    span: Span = field(**_SPAN)

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.param is None):
            raise ValueError("a scale has exactly one of a constant factor or a learned parameter")

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class AddOp:
    result: str
    type: TensorType
    lhs: str
    rhs: str
    inplace: bool = False
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.lhs, self.rhs)


@dataclass(frozen=True)
class CastOp:
    result: str
    type: TensorType
    operand: str
    dtype: DType
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class ConcatOp:
    """Concatenation along the last axis (legal syntax; the residual verifier flags it on the stream)."""

    result: str
    type: TensorType
    args: tuple[str, ...]
    span: Span = field(**_SPAN)

    @property
    def operands(self) -> tuple[str, ...]:
        return self.args


@dataclass(frozen=True)
class FusedAddNormOp:
    """``residual = shortcut_scale * shortcut + branch_scale * dropout(branch)``;
    ``normalized = norm(residual)``. Two named results, in ABI order."""

    normalized: str
    residual: str
    type: TensorType
    residual_type: TensorType
    decl: str
    branch: str
    shortcut: str
    p: ConstExpr | None = None
    mask: str = "element"
    branch_factor: ConstExpr | None = None
    branch_param: str | None = None
    shortcut_factor: ConstExpr | None = None
    site: str | None = None  # name of the absorbed dropout: its RNG identity is kept
    span: Span = field(**_SPAN)

    @property
    def result(self) -> str:
        return self.normalized

    @property
    def results(self) -> tuple[str, str]:
        return (self.normalized, self.residual)

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.branch, self.shortcut)


@dataclass(frozen=True)
class OutputOp:
    value: str
    span: Span = field(**_SPAN)
    result = "<output>"
    type = None

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.value,)


Op = Union[InputOp, NormOp, CallOp, ActivationOp, DropoutOp, ScaleOp, AddOp, CastOp, ConcatOp, FusedAddNormOp, OutputOp]


def results_of(op: Op) -> tuple[str, ...]:
    if isinstance(op, FusedAddNormOp):
        return op.results
    if isinstance(op, OutputOp):
        return ()
    return (op.result,)
