"""The protocol every norm family fills: its schema, its facts, and its forward math.

A family is one object (one per file under ``blockir/norms/``). Every stage reads a norm
declaration through it — the builder its arguments, the key table its parameters and buffers,
the cost ledger its statistics and reductions, the fusion pass whether the fused kernels
implement it, the fold rules what its affine state can become, the manifest its own fields, the
norm contract its own checks — and the one module factory (``blockir.lower.layers.norm_module``)
builds its ``nn.Module`` from ``state`` and ``forward``.

Nothing here imports torch at module level: ``blockir check`` reads the facts without it. The
bodies of ``state``, ``forward`` and the math functions import it when a module is built or run.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from blockir.ir.consts import Num
from blockir.ir.schema import REQUIRED, ArgSpec, Implies, KindSpec

if TYPE_CHECKING:
    from blockir.diagnostics import Diagnostic
    from blockir.ir.decls import KindDecl

Shape = tuple[int, ...]
# a declaration, or a stand-in with the same ``kind``, ``name`` and ``arg`` (``Defaults``)
Decl = Any
# evaluates one argument expression of the declaration (a size, a constant)
Value = Callable[[Any], Any]


class NormFamily:
    """One norm family. Subclasses set the class attributes and override what differs from the defaults."""

    # ---- schema
    name: ClassVar[str]
    doc: ClassVar[str]
    args: ClassVar[tuple[ArgSpec, ...]]
    implies: ClassVar[tuple[Implies, ...]] = ()

    # ---- facts
    rank: ClassVar[int]  # where the language lists it among the families
    module_name: ClassVar[str]  # the module's class name, as ``print(model)`` shows it
    statistics: ClassVar[int]  # row statistics saved for backward
    reductions: ClassVar[tuple[int, int]]  # row reductions per application: forward, backward
    fused_code: ClassVar[str | None] = None  # the fused add+norm kernel that implements it: "layer" | "rms"
    fused_offset: ClassVar[bool] = False  # the fused kernel implements a (1 + weight) gain
    batch_coupled: ClassVar[bool] = False  # moments over rows: a padding policy and running state matter
    elementwise: ClassVar[bool] = False  # no reduction at all (DyT): no reduction axes, no saved statistics
    unit_length: ClassVar[bool] = False  # every output row has unit L2 norm (the hypersphere's retraction)
    qk_norm: ClassVar[int] = 0  # usable as an attention branch's q/k norm: its place among the choices (0: not)
    context: ClassVar[frozenset[str]] = frozenset()  # the context keywords its module reads (the padding mask)
    transitions: ClassVar[bool] = False  # changes its function over training steps (PRepBN)
    scale_role: ClassVar[str] = "weight"  # the gain's role and default key: weight, or ScaleNorm's scalar scale
    scale_kind: ClassVar[str] = "per_channel"  # per_channel | scalar | none: the gain the manifest reports
    extra: ClassVar[tuple[tuple[str, Shape], ...]] = ()  # parameters of fixed shape, before weight and bias
    # the arguments that make an affine-free declaration of the family (what folding the affine writes);
    # None: the family has no affine-free form, so its affine state has nowhere to go
    unaffine: ClassVar[Mapping[str, Any] | None] = None
    affine_note: ClassVar[str] = ""  # said after the keys an affine fold moves ("alpha stays inside tanh")
    statistics_prefix: ClassVar[str] = ""  # where the folded RepBN state sits inside the module ("bn.")
    statistics_note: ClassVar[str] = ""  # what a statistics fold takes ("its RepBN share …, ")
    # the forward as one function torch.fx records as a single call, or None (``forward`` is traced through)
    math: ClassVar[Callable[..., Any] | None] = None

    # ---- schema
    def spec(self) -> KindSpec:
        return KindSpec(self.name, "norm", self.args, self.doc, self.implies)

    def defaults(self, given: Mapping[str, Any] | None = None) -> Defaults:
        """A declaration of the family at its defaults, but for ``given`` (a q/k norm, a module built directly)."""
        return Defaults(self, given)

    # ---- parameters and buffers
    def weight(self, decl: Decl) -> bool:
        """Whether the norm learns a gain (per channel, or ScaleNorm's one scalar)."""
        return decl.arg("affine") is not False

    def bias(self, decl: Decl) -> bool:
        """Whether the norm learns a shift after normalizing."""
        return False

    def scale(self, decl: Decl) -> str:
        return self.scale_kind if self.weight(decl) else "none"

    def centers(self, decl: Decl) -> bool:
        """Whether the norm subtracts a mean (what the manifest reports as ``center``)."""
        return False

    def names(self, decl: Decl) -> dict[str, str]:
        """Role -> key for the parameters the declaration names itself (``weight_name=g``): the gain is
        ``weight`` (ScaleNorm's ``scale``) and the shift ``bias`` unless renamed."""
        given = {self.scale_role: decl.arg("weight_name"), "bias": decl.arg("bias_name")}
        return {role: key for role, key in given.items() if key}

    def keys(self, decl: Decl, shape: Shape) -> list[tuple[str, Shape]]:
        """(key suffix, shape) of every parameter, in the order the module registers them."""
        names = self.names(decl)
        out = list(self.extra)
        if self.weight(decl):
            out.append((names.get("weight", "weight"), shape))
        if self.bias(decl):
            out.append((names.get("bias", "bias"), shape))
        return out

    def buffers(self, decl: Decl, shape: Shape) -> list[tuple[str, Shape]]:
        """(key suffix, shape) of every buffer the state dict carries besides the parameters."""
        return []

    def affine_keys(self, decl: Decl) -> tuple[str, ...]:
        """Key suffixes of the gain and shift applied after normalizing: what a scale or a linear can absorb
        (DyT's ``alpha`` sits inside the tanh and is not among them)."""
        extra = {name for name, _ in self.extra}
        return tuple(name for name, _ in self.keys(decl, ()) if name not in extra)

    def parameters(self, decl: Decl, width: int) -> int:
        """Parameter elements of one declaration over a width-``width`` axis."""
        return sum(_numel(shape) for _, shape in self.keys(decl, (width,)))

    def sharded_backward(self, decl: Decl) -> str:
        """The backward of the declaration's norm of feature-sharded rows: "dtensor" (DTensor's ops on the
        shards, whose backward reduce-scatters the input's gradient) or "row_sums" (a sharded path of the
        family's own, ``sharded_rows``: one all-reduce of the backward's row reductions, and an all-gather of
        the gradient slices of each affine parameter that is replicated)."""
        return "dtensor"

    def fuses(self, decl: Decl) -> bool:
        """Whether the fused add+norm kernels reproduce this declaration exactly."""
        return self.fused_code is not None and (self.fused_offset or not decl.arg("offset", 0))

    # ---- checks and reports
    def contract(self, decl: KindDecl) -> Diagnostic | None:
        """The family's own contract check on one declaration (a contradiction of its definition)."""
        return None

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        """Why a checkpoint whose keys under ``owner`` are ``extra`` / ``lost`` holds another family, if it does."""
        return None

    def manifest(self, decl: Decl, value: Value) -> dict[str, Any]:
        """The family's own fields of a norm site in the manifest."""
        return {}

    def fold_rounds(self, decl: Decl) -> bool:
        """Whether moving the gain into the consumers changes rounding unless the input is exact."""
        return False

    # ---- the module
    def settings(self, decl: Decl, value: Value) -> dict[str, Any]:
        """The module's settings (plain attributes), the declaration's arguments evaluated."""
        raise NotImplementedError(self.name)

    def state(self, module: Any, width: int) -> None:
        """Register the module's parameters, buffers and children (``module.parameter``, ``module.child``)."""
        raise NotImplementedError(self.name)

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        """The arguments ``math`` is called with (after ``x``)."""
        raise NotImplementedError(self.name)

    def forward(self, module: Any, x: Any, mask: object) -> Any:
        """The output of one application; ``mask`` is the attention_mask a batch-coupled norm reads."""
        assert self.math is not None, self.name
        return self.math(x, *self.arguments(module, x))

    def fixed_map(self, state: Mapping[str, Any], at: str, eps: float) -> tuple[Any, Any]:
        """(s, t) of ``s ⊙ x + t``, what a batch-coupled norm computes under its running statistics, from the
        state dict entries under ``at`` (the fold of its statistics into the linears that read it)."""
        raise NotImplementedError(self.name)

    def running(self, module: Any) -> Any | None:
        """The module (``module`` or a child) holding the running moments calibration recomputes; None: none.
        It has ``num_batches_tracked``, ``calibrated_at`` and a ``cumulative`` switch (a plain mean while set)."""
        return None

    def reset(self, module: Any) -> None:
        """Reset the running moments of ``running(…)`` before a calibration."""
        raise NotImplementedError(self.name)

    def progress(self, module: Any) -> tuple[int, int, float] | None:
        """(step, transition steps, share of the starting form now) of a family that transitions; None: it does not."""
        return None

    def describe(self, module: Any) -> str:
        """The module's ``extra_repr``."""
        return f"{module.width}"

    def declared(self, module: Any) -> str | None:
        """The arguments after the axis of the declaration a compiled module of this family was built from, read
        back from its settings (what the lift writes for it); None: the lift reads the family from its trace."""
        return None

    # a family is a singleton: copies of a module share it, and a pickled module finds it again by name
    def __deepcopy__(self, memo: dict[int, Any]) -> NormFamily:
        return self

    def __reduce__(self) -> tuple[Callable[[str], NormFamily], tuple[str]]:
        from blockir.norms import family_named
        return family_named, (self.name,)

    def __repr__(self) -> str:
        return f"<norm family {self.name}>"


class Defaults:
    """A declaration of ``family`` with every argument at its default, except those ``given``: what a q/k norm
    inside an attention branch, or a module built directly, is."""

    def __init__(self, family: NormFamily, given: Mapping[str, Any] | None = None, name: str = "") -> None:
        self.kind, self.name, self.span = family.name, name or family.name, None
        self._args = {a.name: a.default for a in family.args if a.default is not REQUIRED} | dict(given or {})

    def arg(self, name: str, default: Any = None) -> Any:
        return self._args.get(name, default)


def plain(v: Any) -> Any:
    """A default or given argument as a number (a ``Num`` constant, or a Python value as it is)."""
    return v.value if isinstance(v, Num) else v


def number(v: Any) -> str:
    """A setting as the declaration writes it: ``1`` for a whole number, else the shortest ``repr``."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e16 else repr(v)


_ACCUM = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}


def accum_name(dtype: Any) -> str:
    """The ``accum`` name of a torch dtype (the inverse of :func:`accum_dtype`)."""
    return _ACCUM[str(dtype).removeprefix("torch.")]


def accum_dtype(name: str) -> Any:
    """The torch dtype of an ``accum`` name (imports torch)."""
    import torch
    return {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}[name]


def is_dtensor(x: Any) -> bool:
    # a DTensor exists only once its module is loaded, so single-device runs never import it
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)


def offset_weight(weight: Any, offset: int) -> Any:
    """The effective scale: ``weight`` itself, or ``offset + weight`` for zero-centred storage.

    Offset 0 skips the addition so that the multiply sees the stored tensor
    unchanged, as the reference classes do.
    """
    return weight if offset == 0 else offset + weight


def _numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
