"""Dynamic Tanh (Zhu et al., 2025, arXiv:2503.10622): ``weight * tanh(alpha * x) + bias``, no reduction.

The paper's init: ``weight`` ones, ``bias`` zeros, a one-element ``alpha``. ``alpha`` sits inside
the tanh, so an affine fold moves only the weight and bias.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blockir.ir.consts import Num
from blockir.ir.schema import ArgSpec
from blockir.norms import args as A
from blockir.norms.base import NormFamily, Value, number, offset_weight

if TYPE_CHECKING:
    from torch import Tensor

# alpha initialisation for LLaMA models: one value for the norm in front of attention, another for every
# other site, by width. Rows: (largest width, attention, other); the table has only 4096 (7B), 5120 (13B) and
# 8192 (34B, 70B), so narrower widths take the first row.
LLM_ALPHA = ((4096, 0.8, 0.2), (5120, 0.6, 0.15), (None, 0.2, 0.05))
GENERIC_ALPHA = 0.5  # the paper's default for non-LLM models, at every site


def llm_alpha(width: int) -> tuple[float, float]:
    """(attention-site alpha, other-site alpha) for a model of width ``width``."""
    return next((a, o) for top, a, o in LLM_ALPHA if top is None or width <= top)


def dyt(x: Tensor, alpha: Tensor, weight: Tensor, bias: Tensor, offset: int = 0) -> Tensor:
    """Dynamic Tanh: an elementwise ``weight * tanh(alpha * x) + bias`` (``1 + weight`` with ``offset=1``)."""
    import torch
    return offset_weight(weight, offset) * torch.tanh(alpha * x) + bias


class DyT(NormFamily):
    name = "dyt"
    doc = "Dynamic Tanh: weight * tanh(alpha * x) + bias, no reduction"
    args = (A.axes(), ArgSpec("alpha", "expr", Num(GENERIC_ALPHA)), A.offset("weight"), A.TIED, A.GAIN_NAME,
            A.SHIFT_NAME)
    rank = 50
    module_name = "DyT"
    statistics, reductions = 0, (0, 0)
    elementwise = True
    extra = (("alpha", (1,)),)
    affine_note = " (alpha stays inside tanh)"
    math = staticmethod(dyt)

    def weight(self, decl: Any) -> bool:
        return True

    def bias(self, decl: Any) -> bool:
        return True

    def mismatch(self, owner: str, extra: list[str], lost: list[str]) -> str | None:
        if f"{owner}.alpha" in lost and f"{owner}.weight" not in lost:
            return f"'{owner}' is DyT, but the checkpoint has no '{owner}.alpha' (a norm's checkpoint)"
        return None

    def manifest(self, decl: Any, value: Value) -> dict[str, Any]:
        alpha = value(decl.arg("alpha"))
        return {"alpha_init": float(alpha) if isinstance(alpha, float) else alpha}

    def settings(self, decl: Any, value: Value) -> dict[str, Any]:
        return dict(alpha_init=float(value(decl.arg("alpha"))), offset=decl.arg("offset", 0), keys=self.names(decl))

    def state(self, module: Any, width: int) -> None:
        import torch
        module.parameter("alpha", torch.full((1,), module.alpha_init))
        module.parameter("weight", torch.full((width,), 1.0 - module.offset))
        module.parameter("bias", torch.zeros(width))

    def arguments(self, module: Any, x: Any) -> tuple[Any, ...]:
        return module.param("alpha"), module.param("weight"), module.param("bias"), module.offset

    def describe(self, module: Any) -> str:
        return f"{module.width}, offset={module.offset}"

    def declared(self, module: Any) -> str:
        names = "".join(f", {role}_name={key}" for role, key in module.keys.items())
        return f"alpha={number(module.alpha_init)}, offset={module.offset}{names}"


FAMILY = DyT()
