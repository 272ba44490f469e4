"""RMSNorm (Zhang and Sennrich, 2019): each row over its root mean square, a per-channel gain, no centering.

Two norms with the same formula but a different cast order give different bf16 results, and a
checkpoint is only reproduced by the order it was trained with, so the declaration states it:
``before_weight`` (LLaMA) normalizes in ``accum``, casts back to the input dtype, then multiplies
by the weight; ``after_weight`` (Gemma 2, OLMo 2) multiplies by the weight in ``accum``, then
casts back; ``weight_dtype`` (T5) takes only the mean square in ``accum``, scales the input in its
promoted dtype and casts to the weight's dtype when that is a half type.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockir.diagnostics import error
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, accum_dtype, offset_weight

if TYPE_CHECKING:
    from torch import Tensor

    from blockir.diagnostics import Diagnostic
    from blockir.ir.decls import KindDecl

CASTS = ("before_weight", "after_weight", "weight_dtype")


def _rms_normalize(work: Tensor, eps: float) -> Tensor:
    """Divide each row by its root mean square; ``work`` is already in the accumulation dtype."""
    import torch
    return work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    offset: int = 0,
    cast: str = "before_weight",
    accum: Any = None,
) -> Tensor:
    """RMSNorm over the last axis with one of the three cast orders. ``offset=1`` scales by ``1 + weight``
    (weights stored as a deviation from one). Without a weight the scale is one and only the casts remain."""
    import torch
    accum = torch.float32 if accum is None else accum
    if weight is None and cast in CASTS:
        # weight_dtype scales the input in its own dtype; the other orders scale it in accum
        work = x if cast == "weight_dtype" else x.to(accum)
        return (work * torch.rsqrt(x.to(accum).pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    if cast == "before_weight":
        normalized = _rms_normalize(x.to(accum), eps)
        return offset_weight(weight, offset) * normalized.to(x.dtype)
    if cast == "after_weight":
        normalized = _rms_normalize(x.to(accum), eps)
        return (normalized * offset_weight(weight.to(accum), offset)).type_as(x)
    if cast == "weight_dtype":
        variance = x.to(accum).pow(2).mean(-1, keepdim=True)
        normalized = x * torch.rsqrt(variance + eps)
        if weight.dtype in (torch.float16, torch.bfloat16):
            normalized = normalized.to(weight.dtype)
        return offset_weight(weight, offset) * normalized
    raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {CASTS}")


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
        A.TIED, A.MOMENTS, A.AFFINE_GRAD, A.GAIN_NAME, A.SHIFT_NAME)
    implies = (A.NO_AFFINE_OFFSET, A.NO_AFFINE_BIAS)
    rank = 20
    module_name = "RMSNorm"
    statistics, reductions = 1, (1, 1)
    fused_code, fused_offset = "rms", True
    qk_norm = 1
    unaffine = {"affine": False, "offset": 0}
    math = staticmethod(rms_norm)

    def contract(self, decl: KindDecl) -> Diagnostic | None:
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
        return {"offset": decl.arg("offset"), "cast": decl.arg("cast")}

    def fold_rounds(self, decl: Any) -> bool:
        # the weight multiplies after the cast back: moving it into a linear rounds differently
        return decl.arg("cast") == "before_weight"

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        cast = decl.arg("cast")
        if cast not in CASTS:
            raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {CASTS}")
        return dict(eps=value(decl.arg("eps")), offset=decl.arg("offset"), cast=cast,
                    accum=accum_dtype(decl.arg("accum")), keys=self.names(decl), affine=self.weight(decl))

    def state(self, module: Any, width: int) -> None:
        import torch
        # the zero init for offset=1 keeps the initial scale at one
        weight = (torch.zeros(width) if module.offset else torch.ones(width)) if module.affine else None
        module.parameter("weight", weight)

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        return module.met("weight", x), module.eps, module.offset, module.cast, module.accum

    def describe(self, module: Any) -> str:
        return f"{module.width}, eps={module.eps}, offset={module.offset}, cast={module.cast}, accum={module.accum}"


FAMILY = RMSNorm()
