"""ScaleNorm (Nguyen and Salazar, 2019): one learned scalar times the row over its L2 norm.

The norm is clamped at ``eps`` rather than offset by it, so rows far from zero are normalized
exactly and an all-zero row maps to zero. The scalar starts at ``sqrt(width)``, so outputs begin
with unit RMS like RMSNorm.
"""
from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING, Any

from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, number, offset_weight

if TYPE_CHECKING:
    from torch import Tensor


def scale_norm(x: Tensor, scale: Tensor, eps: float, offset: int = 0) -> Tensor:
    """ScaleNorm over the last axis: ``scale`` (``1 + scale`` with ``offset=1``) times ``x / max(||x||, eps)``."""
    import torch
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
    return offset_weight(scale, offset) * (x / norm)


class ScaleNorm(NormFamily):
    name = "scalenorm"
    doc = "ScaleNorm: one learned scalar over x/||x||"
    args = (A.axes(), A.eps(1e-5), A.offset("scale"), A.TIED, A.name("weight_name", "the scalar's key (scale unless "
                                                                       "set: g, …)"))
    rank = 30
    module_name = "ScaleNorm"
    statistics, reductions = 1, (1, 1)
    scale_role, scale_kind = "scale", "scalar"
    math = staticmethod(scale_norm)

    def weight(self, decl: Any) -> bool:
        return True

    def keys(self, decl: Any, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        return [(self.names(decl).get("scale", "scale"), ())]

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        if lost and extra:
            return f"'{owner}' is a ScaleNorm (one scalar), but the checkpoint has {', '.join(repr(k) for k in extra)}"
        return None

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(eps=value(decl.arg("eps")), offset=decl.arg("offset", 0), keys=self.names(decl))

    def state(self, module: Any, width: int) -> None:
        import torch
        module.parameter("scale", torch.tensor(_math.sqrt(width) - module.offset))

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        return module.param("scale"), module.eps, module.offset

    def describe(self, module: Any) -> str:
        return f"{module.width}, eps={module.eps}, offset={module.offset}"

    def declared(self, module: Any) -> str:
        name = f", weight_name={module.keys['scale']}" if "scale" in module.keys else ""
        return f"eps={number(module.eps)}, offset={module.offset}{name}"


FAMILY = ScaleNorm()
