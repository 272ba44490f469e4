"""The op kinds, one file each; importing this package imports every kind's file, which registers its hooks.

A kind is a class named ``…Op`` defined in a module of this package: adding a kind is adding its file.
"""
from __future__ import annotations

import importlib
import pkgutil

from blockir.ir.op import OpBase

Op = OpBase  # any op kind: annotations name the base, code asks traits


def _kinds() -> dict[str, type[OpBase]]:
    found: dict[str, type[OpBase]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.update({name: v for name, v in vars(module).items() if name.endswith("Op") and isinstance(v, type)
                      and issubclass(v, OpBase) and v.__module__ == module.__name__})
    return found


KINDS = _kinds()
globals().update(KINDS)
__all__ = [*KINDS, "Op"]
