"""The built-in computation an extern add+norm's contract states: its norm of the sum of its two inputs.

It stands in for the extern where no module is bound (``run``, ``diverge``), and it is the reference a
bound implementation is measured against (``blockir.lifecycle.extern_norms``). Its parameters are the
norm's own, under the norm's keys (``weight``), as Transformer Engine's, Apex's and Liger's are.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from blockir.analyses.sizes import Sizes
from blockir.ir.decls import ExternDecl
from blockir.lower.layers.norm_module import Norm
from blockir.norms import family


class AddNormReference(Norm):
    """``norm(x + residual)`` and ``x + residual``, in the order the contract gives them."""

    def __init__(self, decl: ExternDecl, sizes: Sizes) -> None:
        contract = decl.contract
        assert contract is not None
        fam = family(contract.norm)
        super().__init__(fam, sizes.dim(contract.norm.arg("axes")[-1]), fam.settings(contract.norm, sizes.value))
        vars(self)["residual_first"] = contract.residual == 0

    def forward(self, x: Tensor, residual: Tensor, **_: Any) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        total = x + residual
        normalized = super().forward(total)
        return (total, normalized) if self.residual_first else (normalized, total)
