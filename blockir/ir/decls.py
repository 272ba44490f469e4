"""Declarations: the named parameterised things a block owns (its state_dict entries)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr
from blockir.ir.kinds import KINDS, KindSpec
from blockir.ir.types import Layout, TensorType


@dataclass(frozen=True)
class Param:
    """A block parameter: its name, type and declared placement."""

    name: str
    type: TensorType
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)
    layout: Layout = ()  # declared placement over mesh axes at the block boundary


@dataclass(frozen=True)
class KindDecl:
    """An instance of a built-in kind (norm, branch, linear, scale, activation)."""

    name: str
    kind: str
    args: tuple[tuple[str, Any], ...]
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)

    @property
    def spec(self) -> KindSpec:
        return KINDS[self.kind]

    @property
    def category(self) -> str:
        return self.spec.category

    def arg(self, name: str, default: Any = None) -> Any:
        for key, value in self.args:  # a plain loop: compiling a deep stack asks this thousands of times
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class NormContract:
    """What an extern norm states it computes: the built-in ``norm`` of its input, or of the sum of its two
    inputs (a fused add+norm); then ``residual`` is the index of the result that is that sum."""

    norm: KindDecl
    residual: int | None = None
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)

    @property
    def normalized(self) -> int:
        """The index of the normalized result."""
        return 1 - self.residual if self.residual is not None else 0


@dataclass(frozen=True)
class ExternDecl:
    """A branch bound from Python at compile time, with a declared signature."""

    name: str
    params: tuple[Param, ...]
    result: TensorType
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)
    result_layout: Layout = ()
    more: tuple[TensorType, ...] = ()  # the results after the first, in the order the module returns them
    contract: NormContract | None = None
    kind = "extern"
    category = "branch"


@dataclass(frozen=True)
class InstanceDecl:
    """Another block used as a branch (count None) or stacked count times (keys name.i.…)."""

    name: str
    block: str
    count: ConstExpr | None = None
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return "stack" if self.count is not None else "block"

    @property
    def category(self) -> str:
        return self.kind


Decl = Union[KindDecl, ExternDecl, InstanceDecl]
