"""Axes, dtypes and tensor types. Types validate themselves when constructed."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr


class Role(str, Enum):
    BATCH = "batch"
    SEQ = "seq"
    MODEL = "model"
    HIDDEN = "hidden"
    HEADS = "heads"
    HEAD_DIM = "head_dim"
    MESH = "mesh"  # a device-mesh axis (``dim tp: mesh``): names where values are placed, never a tensor axis
    VOCAB = "vocab"


class DType(str, Enum):
    F64 = "f64"
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"

    @property
    def is_half(self) -> bool:
        return self in (DType.F16, DType.BF16)

    @property
    def itemsize(self) -> int:
        return {DType.F64: 8, DType.F32: 4, DType.F16: 2, DType.BF16: 2}[self]


@dataclass(frozen=True)
class Axis:
    """A named dimension. Two axes are the same only if their names are: S and T
    are different row owners even when their sizes agree."""

    name: str
    role: Role
    size: ConstExpr | None = None
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an axis needs a name")
        if not isinstance(self.role, Role):
            raise TypeError(f"axis role must be a Role, got {self.role!r}")

    @property
    def owns_rows(self) -> bool:
        """Batch and sequence axes index rows; the others index channels."""
        return self.role in (Role.BATCH, Role.SEQ)


@dataclass(frozen=True)
class TensorType:
    """Ordered axes plus an element dtype (None: the activation dtype chosen at compile time)."""

    axes: tuple[Axis, ...]
    dtype: DType | None = None

    def __post_init__(self) -> None:
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names) and not self.is_scores:
            raise ValueError(f"repeated axis in tensor type {names}")
        if self.dtype is not None and not isinstance(self.dtype, DType):
            raise TypeError(f"dtype must be a DType, got {self.dtype!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def is_scores(self) -> bool:
        """Attention scores ``[B, H, T, S]``: one row per query, one column per key (a sequence may be both).

        A kind of value of its own: it never joins the hidden stream, whatever its sizes.
        """
        roles = tuple(a.role for a in self.axes)
        return roles == (Role.BATCH, Role.HEADS, Role.SEQ, Role.SEQ)

    @property
    def rows(self) -> tuple[str, ...]:
        """Row-owner axes (batch and sequence), in order."""
        return tuple(a.name for a in self.axes if a.owns_rows)

    @property
    def last(self) -> Axis | None:
        return self.axes[-1] if self.axes else None

    def with_dtype(self, dtype: DType | None) -> "TensorType":
        return TensorType(self.axes, dtype)

    def with_last(self, axis: Axis) -> "TensorType":
        return TensorType(self.axes[:-1] + (axis,), self.dtype)

    def __str__(self) -> str:
        body = "[" + ", ".join(self.names) + "]"
        return f"{body} {self.dtype.value}" if self.dtype else body


PLACEMENT_KINDS = ("replicate", "shard", "partial")

# One dimension larger than this cannot index a tensor on any backend torch supports; a product of such
# sizes is refused per parameter by the keys analysis before anything is allocated.
MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class Placement:
    """Where a value lives over one mesh axis: a full copy on every rank (replicate), split along one of
    its tensor axes (shard), or one summand per rank of a sum not yet taken (partial)."""

    mesh: str
    kind: str
    axis: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENT_KINDS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENT_KINDS)}, got {self.kind!r}")
        if (self.kind == "shard") != (self.axis is not None):
            raise ValueError("a shard placement names exactly one tensor axis; the others name none")

    def __str__(self) -> str:
        return f"{self.mesh}={self.kind}({self.axis})" if self.axis else f"{self.mesh}={self.kind}"


# A value's placement on each mesh axis it is distributed over; () on a single device.
Layout = tuple[Placement, ...]


def check_layout(t: TensorType, layout: Layout) -> None:
    """A layout names each mesh axis once and shards only axes of its tensor type."""
    meshes = [p.mesh for p in layout]
    if len(set(meshes)) != len(meshes):
        raise ValueError(f"mesh axis placed twice in {format_layout(t, layout)}")
    for p in layout:
        if p.axis is not None and p.axis not in t.names:
            raise ValueError(f"'{p.mesh}' shards {p.axis}, which is not an axis of {t}")


def format_layout(t: TensorType, layout: Layout) -> str:
    """The type with its layout inside the brackets: ``[B, S, D; tp=shard(S)] f32``."""
    if not layout:
        return str(t)
    body = "[" + ", ".join(t.names) + "; " + ", ".join(map(str, layout)) + "]"
    return f"{body} {t.dtype.value}" if t.dtype else body
