"""L2 normalization: the row over its L2 norm clamped at ``eps``, as ``F.normalize``; nothing learned.

nGPT's hypersphere (``hypersphere=true``) and its q/k norm are this family.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, number

if TYPE_CHECKING:
    from torch import Tensor


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """``F.normalize`` over the last axis: the row over its L2 norm clamped at ``eps`` (not ``eps`` under the root)."""
    import torch.nn.functional as F
    return F.normalize(x, p=2.0, dim=-1, eps=eps)


class L2Norm(NormFamily):
    name = "l2norm"
    doc = "L2 normalization x / max(||x||, eps), as F.normalize; no parameters"
    args = (A.axes(), ArgSpec("eps", "expr", Num(1e-12), doc="lower bound of the row's L2 norm (clamped, not added); "
                              "must be > 0"), A.TIED,
            ArgSpec("hypersphere", "bool", False, doc="nGPT: the stream lives on the unit sphere of this axis, and "
                    "every matrix of the block is projected onto it after each optimizer step"))
    rank = 40
    module_name = "L2Norm"
    statistics, reductions = 1, (1, 1)
    scale_kind = "none"
    unit_length = True
    qk_norm = 3
    math = staticmethod(l2_norm)

    def weight(self, decl: Any) -> bool:
        return False

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(eps=value(decl.arg("eps")), hypersphere=bool(decl.arg("hypersphere")))

    def state(self, module: Any, width: int) -> None:
        pass  # learns nothing

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        return (module.eps,)

    def describe(self, module: Any) -> str:
        return f"{module.width}, eps={module.eps}"

    def declared(self, module: Any) -> str:
        return f"eps={number(module.eps)}" + (", hypersphere=true" if module.hypersphere else "")


FAMILY = L2Norm()
