"""One frozen dataclass per op kind. A block is an ordered SSA list of these.

Each op kind declares its behaviour in one place: its operands and results,
the type of each result, how it prints as ``.block`` text, how a diagnostic
names it, and — through field roles — how a rewrite renames it. A field's
role is one of ``result`` (an SSA value it defines), ``value`` (one it
reads), ``decl`` (a declaration it applies) or ``expr`` (a constant
expression it evaluates); :meth:`OpBase.rename` and :meth:`OpBase.reading`
map every field of a role, so a rewrite never lists an op's fields. Lowerings are registered per op kind by each backend.
Spans never take part in equality.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Callable, ClassVar, Union

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.types import DType, TensorType

_SPAN = dict(default=UNKNOWN_SPAN, compare=False, repr=False)


def _role(role: str, **kw: Any) -> Any:
    return field(metadata={"role": role}, **kw)


Rename = Callable[[str], str]
Substitute = Callable[[ConstExpr], ConstExpr]


class OpBase:
    """Behaviour shared by every op kind; each kind overrides what differs."""

    result: str
    type: TensorType | None

    @property
    def results(self) -> tuple[str, ...]:
        return (self.result,)

    @property
    def operands(self) -> tuple[str, ...]:
        """The values it reads, in field order (a tuple field contributes each of its values)."""
        out: list[str] = []
        for name in _reads(type(self)):
            v = getattr(self, name)
            if isinstance(v, tuple):
                out += v
            elif v is not None:
                out.append(v)
        return tuple(out)

    @property
    def applied(self) -> tuple[str, ...]:
        """The declarations it applies (fields of role ``decl``), in field order."""
        return tuple(v for name in _decls(type(self)) if (v := getattr(self, name)) is not None)

    def type_of(self, value: str) -> TensorType | None:
        """The type of one of this op's results."""
        return self.type

    def text(self) -> str:
        """The op as one ``.block`` statement (the printer adds the type comment)."""
        raise NotImplementedError

    def label(self) -> str:
        """How a diagnostic names the temporary this op makes: the expression that made it."""
        return f"'{self.result}'"

    def rename(self, value: Rename, decl: Rename, expr: Substitute) -> OpBase:
        """A copy with every value, declaration and constant-expression field mapped."""
        changes: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            role = f.metadata.get("role")
            if v is None or role is None:
                continue
            if role in ("result", "value"):
                changes[f.name] = tuple(value(a) for a in v) if isinstance(v, tuple) else value(v)
            elif role == "decl":
                changes[f.name] = decl(v)
            elif role == "expr":
                changes[f.name] = expr(v)
        return replace(self, **changes)  # type: ignore[type-var]

    def reading(self, names: dict[str, str]) -> OpBase:
        """A copy reading ``names[v]`` wherever it read ``v``; results keep their names."""
        changes: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.metadata.get("role") != "value" or v is None:
                continue
            new = tuple(names.get(a, a) for a in v) if isinstance(v, tuple) else names.get(v, v)
            if new != v:
                changes[f.name] = new
        return replace(self, **changes) if changes else self  # type: ignore[type-var]


@lru_cache(maxsize=None)
def _decls(kind: type) -> tuple[str, ...]:
    """The names of the fields of role ``decl`` of an op kind."""
    return tuple(f.name for f in fields(kind) if f.metadata.get("role") == "decl")


@lru_cache(maxsize=None)
def _reads(kind: type) -> tuple[str, ...]:
    """The names of the fields of role ``value`` of an op kind."""
    return tuple(f.name for f in fields(kind) if f.metadata.get("role") == "value")


def _factor(c: ConstExpr) -> str:
    return format_expr(c, 2)


@dataclass(frozen=True)
class InputOp(OpBase):
    result: str = _role("result")
    type: TensorType = field()
    span: Span = field(**_SPAN)

    def text(self) -> str:
        return f"{self.result}: {self.type}"


@dataclass(frozen=True)
class NormOp(OpBase):
    result: str = _role("result")
    type: TensorType = field()
    decl: str = _role("decl")
    operand: str = _role("value")
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return f"'{self.decl}(…)'"

    def text(self) -> str:
        return f"{self.result} = {self.decl}({self.operand})"


@dataclass(frozen=True)
class CallOp(OpBase):
    """A branch, linear, activation declaration, extern, block or stack applied to values."""

    result: str = _role("result")
    type: TensorType = field()
    decl: str = _role("decl")
    args: tuple[str, ...] = _role("value")
    span: Span = field(**_SPAN)
    # the carried streams a multi-result block (or a score-carrying attention) returns after the hidden state
    more: tuple[str, ...] = _role("result", default=())
    more_types: tuple[TensorType, ...] = ()

    @property
    def results(self) -> tuple[str, ...]:
        return (self.result, *self.more)

    def type_of(self, value: str) -> TensorType | None:
        return self.more_types[self.more.index(value)] if value in self.more else self.type

    def label(self) -> str:
        return f"'{self.decl}(…)'"

    def text(self) -> str:
        return f"{', '.join(self.results)} = {self.decl}({', '.join(self.args)})"


@dataclass(frozen=True)
class ActivationOp(OpBase):
    result: str = _role("result")
    type: TensorType = field()
    fn: str = field()
    operand: str = _role("value")
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return f"'{self.fn}(…)'"

    def text(self) -> str:
        return f"{self.result} = {self.fn}({self.operand})"


@dataclass(frozen=True)
class DropoutOp(OpBase):
    """Inverted dropout; ``mask`` says which axes one draw covers (element, row, channel, sample)."""

    result: str = _role("result")
    type: TensorType = field()
    operand: str = _role("value")
    p: ConstExpr = _role("expr")
    mask: str = field()
    span: Span = field(**_SPAN)

    @property
    def function(self) -> str:
        """The built-in function that writes it."""
        return "drop_path" if self.mask == "sample" else "dropout"

    def label(self) -> str:
        return f"'{self.function}(…)'"

    def text(self) -> str:
        p = format_expr(self.p)
        if self.mask == "sample":
            return f"{self.result} = drop_path({self.operand}, p={p})"
        mask = "" if self.mask == "element" else f", mask={self.mask}"
        return f"{self.result} = dropout({self.operand}, p={p}{mask})"


@dataclass(frozen=True)
class LayerDropOp(DropoutOp):
    """Layer dropout (LayerDrop): one draw per layer and step, shared by the whole batch and by every
    ``layer_drop`` of the layer, so a dropped layer's updates all vanish and the layer is skipped.

    Kept updates are not rescaled. It stays a dropout site for every analysis (the identity in
    inference, a branch modifier); only its mask, scale and randomness differ.
    """

    mask: str = field(default="layer")

    @property
    def function(self) -> str:
        return "layer_drop"

    def text(self) -> str:
        return f"{self.result} = layer_drop({self.operand}, p={format_expr(self.p)})"


@dataclass(frozen=True)
class ScaleOp(OpBase):
    """``factor * operand``: a constant expression, or a learned scalar/vector declaration."""

    result: str = _role("result")
    type: TensorType = field()
    operand: str = _role("value")
    factor: ConstExpr | None = _role("expr", default=None)
    param: str | None = _role("decl", default=None)
    span: Span = field(**_SPAN)

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.param is None):
            raise ValueError("a scale has exactly one of a constant factor or a learned parameter")

    def label(self) -> str:
        return f"'{self.param} * …'" if self.param else "'… * …' (a constant scale)"

    def text(self) -> str:
        factor = self.param if self.param is not None else _factor(self.factor)  # type: ignore[arg-type]
        return f"{self.result} = {factor} * {self.operand}"


@dataclass(frozen=True)
class BiasOp(OpBase):
    """``operand + param``: a learned per-channel ``bias`` declaration added to a value."""

    result: str = _role("result")
    type: TensorType = field()
    operand: str = _role("value")
    param: str = _role("decl")
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return f"'… + {self.param}'"

    def text(self) -> str:
        return f"{self.result} = {self.operand} + {self.param}"


@dataclass(frozen=True)
class _TensorPair(OpBase):
    """An elementwise operation of two tensors of one type: ``lhs SYMBOL rhs``."""

    result: str = _role("result")
    type: TensorType = field()
    lhs: str = _role("value")
    rhs: str = _role("value")
    span: Span = field(**_SPAN)
    SYMBOL: ClassVar[str] = ""

    def text(self) -> str:
        return f"{self.result} = {self.lhs} {self.SYMBOL} {self.rhs}"


@dataclass(frozen=True)
class MulOp(_TensorPair):
    """``lhs * rhs`` of two tensors of one type, elementwise: a gate applied to a value."""

    SYMBOL: ClassVar[str] = "*"

    def label(self) -> str:
        return "'… * …' (a product of tensors)"


@dataclass(frozen=True)
class ComplementOp(OpBase):
    """``1 - operand``: the complementary gate of a convex combination."""

    result: str = _role("result")
    type: TensorType = field()
    operand: str = _role("value")
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return "'1 - …'"

    def text(self) -> str:
        return f"{self.result} = 1 - {self.operand}"


@dataclass(frozen=True)
class SubOp(_TensorPair):
    """``lhs - rhs`` of two tensors of one type: the step from a point toward a target, as in the
    normalized interpolation ``h + alpha * (t - h)`` of nGPT (Loshchilov et al., arXiv:2410.01131)."""

    SYMBOL: ClassVar[str] = "-"

    def label(self) -> str:
        return "'… - …'"


@dataclass(frozen=True)
class AddOp(OpBase):
    result: str = _role("result")
    type: TensorType = field()
    lhs: str = _role("value")
    rhs: str = _role("value")
    inplace: bool = False
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return "'… + …'"

    def text(self) -> str:
        return f"{'@inplace ' if self.inplace else ''}{self.result} = {self.lhs} + {self.rhs}"


@dataclass(frozen=True)
class CastOp(OpBase):
    result: str = _role("result")
    type: TensorType = field()
    operand: str = _role("value")
    dtype: DType = field()
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return f"'cast(…, {self.dtype.value})'"

    def text(self) -> str:
        return f"{self.result} = cast({self.operand}, {self.dtype.value})"


@dataclass(frozen=True)
class ConcatOp(OpBase):
    """Concatenation along the last axis (legal syntax; the residual verifier flags it on the stream)."""

    result: str = _role("result")
    type: TensorType = field()
    args: tuple[str, ...] = _role("value")
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return "'concat(…)'"

    def text(self) -> str:
        return f"{self.result} = concat({', '.join(self.args)})"


@dataclass(frozen=True)
class FusedAddNormOp(OpBase):
    """``residual = shortcut_scale * shortcut + branch_scale * dropout(branch)``;
    ``normalized = norm(residual)``. Two named results, in ABI order."""

    normalized: str = _role("result")
    residual: str = _role("result")
    type: TensorType = field()
    residual_type: TensorType = field()
    decl: str = _role("decl")
    branch: str = _role("value")
    shortcut: str = _role("value")
    p: ConstExpr | None = _role("expr", default=None)
    mask: str = "element"
    branch_factor: ConstExpr | None = _role("expr", default=None)
    branch_param: str | None = _role("decl", default=None)
    shortcut_factor: ConstExpr | None = _role("expr", default=None)
    site: str | None = _role("result", default=None)  # name of the absorbed dropout: its RNG identity is kept
    span: Span = field(**_SPAN)

    @property
    def result(self) -> str:  # type: ignore[override]
        return self.normalized

    @property
    def results(self) -> tuple[str, ...]:
        return (self.normalized, self.residual)

    def type_of(self, value: str) -> TensorType | None:
        return self.residual_type if value == self.residual else self.type

    def text(self) -> str:
        extra = []
        if self.shortcut_factor is not None:
            extra.append(f"shortcut_scale={_factor(self.shortcut_factor)}")
        if self.branch_factor is not None:
            extra.append(f"branch_scale={_factor(self.branch_factor)}")
        if self.branch_param is not None:
            extra.append(f"branch_scale={self.branch_param}")
        if self.p is not None:
            extra.append(f"p={format_expr(self.p)}")
            if self.mask != "element":
                extra.append(f"mask={self.mask}")
        tail = "".join(", " + e for e in extra)
        return (f"{self.normalized}, {self.residual} = fused_add_norm[{self.decl}]"
                f"(branch={self.branch}, shortcut={self.shortcut}{tail})")


@dataclass(frozen=True)
class OutputOp(OpBase):
    value: str = _role("value")
    span: Span = field(**_SPAN)
    more: tuple[str, ...] = _role("value", default=())  # the carried streams returned after the hidden state
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


@dataclass(frozen=True)
class ZerosOp(OpBase):
    """A tensor of zeros of a declared type: the value a carried stream starts from before the first layer."""

    result: str = _role("result")
    type: TensorType = field()
    span: Span = field(**_SPAN)

    def label(self) -> str:
        return "'zeros(…)'"

    def text(self) -> str:
        return f"{self.result} = zeros([{', '.join(self.type.names)}])"


Op = Union[InputOp, NormOp, CallOp, ActivationOp, DropoutOp, LayerDropOp, ScaleOp, BiasOp, MulOp, ComplementOp, AddOp, CastOp,
           ConcatOp, SubOp, FusedAddNormOp, OutputOp, ZerosOp]
