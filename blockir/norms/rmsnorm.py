"""RMSNorm (Zhang and Sennrich, 2019): each row over its root mean square, a per-channel gain, no centering.

Two norms with the same formula but a different cast order give different bf16 results, and a
checkpoint is only reproduced by the order it was trained with, so the declaration states it:
``before_weight`` (LLaMA) normalizes in ``accum``, casts back to the input dtype, then multiplies
by the weight; ``after_weight`` (Gemma 2, OLMo 2) multiplies by the weight in ``accum``, then
casts back; ``weight_dtype`` (T5) takes only the mean square in ``accum``, scales the input in its
promoted dtype and casts to the weight's dtype when that is a half type.

Partial RMSNorm (pRMSNorm, Zhang and Sennrich, 2019: ``partial=p``, 0 < p <= 1) estimates the RMS
from the first ``ceil(p * D)`` features only and divides the whole row by it; unset, every feature.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from blockir.diagnostics import BlockError, error
from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, accum_dtype, offset_weight
from blockir.norms.sharded_rows import feature_axis, like, own_features, whole_row_sums

if TYPE_CHECKING:
    from torch import Tensor

    from blockir.diagnostics import Diagnostic
    from blockir.ir.decls import KindDecl

CASTS = ("before_weight", "after_weight", "weight_dtype")


def _mean_square(work: Tensor, features: int | None) -> Tensor:
    """The mean square of each row, or of its first ``features`` features (pRMSNorm)."""
    return (work if features is None else work[..., :features]).pow(2).mean(-1, keepdim=True)


def _rms_normalize(work: Tensor, eps: float, features: int | None) -> Tensor:
    """Divide each row by its root mean square; ``work`` is already in the accumulation dtype."""
    import torch
    return work * torch.rsqrt(_mean_square(work, features) + eps)


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    offset: int = 0,
    cast: str = "before_weight",
    accum: Any = None,
    features: int | None = None,
) -> Tensor:
    """RMSNorm over the last axis with one of the three cast orders. ``offset=1`` scales by ``1 + weight``
    (weights stored as a deviation from one). Without a weight the scale is one and only the casts remain.
    ``features`` takes the mean square over the row's first ``features`` features only (pRMSNorm)."""
    import torch
    accum = torch.float32 if accum is None else accum
    if features is None and cast in CASTS and feature_axis(x) is not None:
        return _feature_sharded(x, weight, eps, offset, cast, accum)
    if weight is None and cast in CASTS:
        # weight_dtype scales the input in its own dtype; the other orders scale it in accum
        work = x if cast == "weight_dtype" else x.to(accum)
        return (work * torch.rsqrt(_mean_square(x.to(accum), features) + eps)).type_as(x)
    if cast == "before_weight":
        normalized = _rms_normalize(x.to(accum), eps, features)
        return offset_weight(weight, offset) * normalized.to(x.dtype)
    if cast == "after_weight":
        normalized = _rms_normalize(x.to(accum), eps, features)
        return (normalized * offset_weight(weight.to(accum), offset)).type_as(x)
    if cast == "weight_dtype":
        variance = _mean_square(x.to(accum), features)
        normalized = x * torch.rsqrt(variance + eps)
        if weight.dtype in (torch.float16, torch.bfloat16):
            normalized = normalized.to(weight.dtype)
        return offset_weight(weight, offset) * normalized
    raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {CASTS}")


def _feature_sharded(x: Tensor, weight: Tensor | None, eps: float, offset: int, cast: str, accum: Any) -> Tensor:
    """RMSNorm of rows whose features are split over ranks, the output split the same way: each rank sums
    the squares of its slice of every row and one all-reduce of that number per row gives the row's mean
    square; the weight is sliced to the rank's features (``sharded_rows``). The casts are those of
    ``rms_norm`` in the same order, on the rank's features; the row sum differs from the one-device mean by
    rounding only. (pRMSNorm's first features lie on some ranks only: it keeps DTensor's ops.)"""
    import torch
    local = x.to_local()  # type: ignore[attr-defined]
    work = local.to(accum)
    sums = whole_row_sums(x, work.pow(2).sum(-1, keepdim=True))
    scale = torch.rsqrt(sums / x.shape[-1] + eps)
    if weight is None:
        # weight_dtype scales the input in its own dtype; the other orders scale it in accum
        return like(x, ((local if cast == "weight_dtype" else work) * scale).type_as(local))
    own = own_features(x, weight)
    if cast == "before_weight":
        return like(x, offset_weight(own, offset) * (work * scale).to(local.dtype))
    if cast == "after_weight":
        return like(x, (work * scale * offset_weight(own.to(accum), offset)).type_as(local))
    normalized = local * scale
    if own.dtype in (torch.float16, torch.bfloat16):
        normalized = normalized.to(own.dtype)
    return like(x, offset_weight(own, offset) * normalized)


class RMSNorm(NormFamily):
    name = "rmsnorm"
    doc = "RMSNorm: no centering, per-channel scale"
    args = (
        A.axes(), A.eps(1e-6),
        ArgSpec("offset", "int", 0, choices=(0, 1), doc="1 multiplies by (1 + weight)"),
        ArgSpec("cast", "enum", "before_weight", choices=CASTS),
        A.ACCUM, ArgSpec("bias", "bool", False),
        # unset means the usual per-channel weight; only an affine fold writes affine=false
        ArgSpec("affine", "bool", None, doc="false: no weight, the scale lives in the following linears"),
        A.TIED, A.MOMENTS, A.AFFINE_GRAD, A.GAIN_NAME, A.SHIFT_NAME,
        ArgSpec("partial", "expr", None, doc="pRMSNorm: the RMS of the first ceil(partial * D) features stands for "
                "the row's (0 < partial <= 1); unset: every feature"))
    implies = (A.NO_AFFINE_OFFSET, A.NO_AFFINE_BIAS)
    rank = 20
    module_name = "RMSNorm"
    statistics, reductions = 1, (1, 1)
    fused_code, fused_offset = "rms", True
    qk_norm = 1
    unaffine = {"affine": False, "offset": 0}
    math = staticmethod(rms_norm)

    def contract(self, decl: KindDecl) -> Diagnostic | None:
        p = decl.arg("partial")
        if isinstance(p, Num) and (wrong := _partial_error(decl, p.value)) is not None:
            return wrong
        if decl.arg("bias") is True:
            return error("E0306", f"rmsnorm '{decl.name}' declares bias=true, but RMSNorm is scale-only: a bias "
                         "changes the function and no RMSNorm checkpoint has one", decl.span,
                         hint="remove bias=true; a norm with a bias and centering is a layernorm")
        return None

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        if f"{owner}.bias" in extra:
            return f"'{owner}' is an RMSNorm (scale only), but the checkpoint has '{owner}.bias', a LayerNorm bias"
        return None

    def manifest(self, decl: Any, value: Value) -> dict[str, Any]:
        share = value(decl.arg("partial")) if decl.arg("partial") is not None else None
        partial = {} if decl.arg("partial") is None else {"partial": float(share) if share is not None else None}
        return {"offset": decl.arg("offset"), "cast": decl.arg("cast")} | partial

    def sharded_backward(self, decl: Any) -> str:
        # _feature_sharded; pRMSNorm's first features lie on some ranks only, so it keeps DTensor's ops
        return "row_sums" if decl.arg("partial") is None else "dtensor"

    def fuses(self, decl: Any) -> bool:
        return super().fuses(decl) and decl.arg("partial") is None  # the fused kernels take the whole row

    def fold_rounds(self, decl: Any) -> bool:
        # the weight multiplies after the cast back: moving it into a linear rounds differently
        return decl.arg("cast") == "before_weight"

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        cast = decl.arg("cast")
        if cast not in CASTS:
            raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {CASTS}")
        partial = None if decl.arg("partial") is None else float(value(decl.arg("partial")))
        if partial is not None and (wrong := _partial_error(decl, partial)) is not None:
            raise BlockError([wrong])
        return dict(eps=value(decl.arg("eps")), offset=decl.arg("offset"), cast=cast,
                    accum=accum_dtype(decl.arg("accum")), keys=self.names(decl), affine=self.weight(decl),
                    partial=partial)

    def state(self, module: Any, width: int) -> None:
        import torch
        # the zero init for offset=1 keeps the initial scale at one
        weight = (torch.zeros(width) if module.offset else torch.ones(width)) if module.affine else None
        module.parameter("weight", weight)
        # ceil(p * D), rounded first so that a p written in decimal (0.3 of 10) counts what it says
        module.features = None if module.partial is None else math.ceil(round(module.partial * width, 9))

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        given = (module.met("weight", x), module.eps, module.offset, module.cast, module.accum)
        return given if module.features is None else (*given, module.features)

    def describe(self, module: Any) -> str:
        partial = "" if module.partial is None else f", partial={module.partial}"
        return f"{module.width}, eps={module.eps}, offset={module.offset}, cast={module.cast}, accum={module.accum}" \
            + partial


def _partial_error(decl: Any, p: float) -> Diagnostic | None:
    if 0 < p <= 1:
        return None
    return error("E0470", f"rmsnorm '{decl.name}' has partial={p:g}: the share of the features its RMS is estimated "
                 "from must be in (0, 1]", decl.span,
                 hint="give a fraction of the features, e.g. partial=0.0625 for the first 1/16 of them; 1 is the "
                      "full RMSNorm")


FAMILY = RMSNorm()
