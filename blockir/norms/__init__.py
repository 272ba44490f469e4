"""The norm families, one file each, and the registry every stage reads them through.

A family file holds one ``FAMILY`` object filling the protocol of ``blockir.norms.base``: its
schema, its facts (keys and buffers, statistics, fusion, batch coupling, folds, manifest fields,
contract checks) and its forward. Batch-coupled families take their moments per channel over every
row, so they also own buffers that travel in the state dict but are not parameters.

A declaration may store its gain and shift under a checkpoint's own names (``weight_name=g``,
``bias_name=beta``; ScaleNorm's ``weight_name`` renames ``scale``): every reader takes the key
from ``keys``/``names``.

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
