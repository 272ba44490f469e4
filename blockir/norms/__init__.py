"""The norm families, one file each, and the registry every stage reads them through.

=========  ======================  =========================  ==========  =============
family     parameters (keys)       affine default             statistics  reductions
=========  ======================  =========================  ==========  =============
layernorm  weight, bias            affine=true, bias=true     mean, rstd  2 fwd, 2 bwd
rmsnorm    weight                  affine unless false        rstd        1 fwd, 1 bwd
scalenorm  scale (one scalar)      always                     row norm    1 fwd, 1 bwd
dyt        alpha, weight, bias     always                     none        elementwise
l2norm     none                    never                      row norm    1 fwd, 1 bwd
batchnorm  weight, bias (+ eta)    affine=true                per channel 2 fwd, 2 bwd
prepbn     ln.*, bn.* (+ step)     always                     mean, rstd  4 fwd, 4 bwd
=========  ======================  =========================  ==========  =============

Batch-coupled families take their moments per channel over every row, so they also own buffers
(``running_mean``, ``running_var``, ``num_batches_tracked``, ``calibrated_at``, PRepBN's ``step``)
that travel in the state dict but are not parameters.

A declaration may store its gain and shift under a checkpoint's own names (``weight_name=g``,
``bias_name=beta``; ScaleNorm's ``weight_name`` renames ``scale``): every reader takes the key
from ``keys``/``names``. Every family with a gain may store it as a deviation from one
(``offset=1``); the keys are the same, and the fused kernels implement the offset for RMSNorm only.

Adding a family is one new file here whose ``FAMILY`` is its object: the registry finds it.
"""
from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import TYPE_CHECKING

from blockir.norms.base import NormFamily

if TYPE_CHECKING:
    from blockir.ir.decls import KindDecl


def _found() -> list[NormFamily]:
    modules = (import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__))
    return sorted((m.FAMILY for m in modules if hasattr(m, "FAMILY")), key=lambda f: f.rank)


# in the order the language lists them
FAMILIES: dict[str, NormFamily] = {f.name: f for f in _found()}


def family(decl: KindDecl) -> NormFamily:
    """The family of a norm declaration."""
    return FAMILIES[decl.kind]


def family_named(name: str) -> NormFamily:
    return FAMILIES[name]


# the q/k norms an attention branch may declare, in the order its ``qk_norm`` choices list them
QK_NORMS = tuple(f.name for f in sorted((f for f in FAMILIES.values() if f.qk_norm), key=lambda f: f.qk_norm))

__all__ = ["FAMILIES", "NormFamily", "QK_NORMS", "family", "family_named"]
