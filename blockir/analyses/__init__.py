"""Read-only analyses: facts about a program that the verifiers, rewrites, backends and commands share.

Each fact has one owner: ``sizes`` (the size environment), ``structure`` (the
residual wrapper: state, spine, each update's shortcut and branches),
``sites`` (residual sites through a model), ``summaries`` (what a block does
to its inputs, seen from a call), ``facts`` (stated facts), ``keys``
(parameter keys, shapes and checkpoint reconciliation), ``classify``
(topology names), ``liveness`` (the buffer plan), ``fold_legality`` (the fold
report), ``diff`` and ``manifest``.

The names below are imported on first use, so that a verifier importing one
analysis does not load the others.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"BlockDiff": "diff", "diff_blocks": "diff", "KeyTable": "keys", "Reconciliation": "keys",
            "param_keys": "keys", "reconcile": "keys"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blockir.analyses' has no attribute {name!r}")
    return getattr(importlib.import_module(f"blockir.analyses.{_EXPORTS[name]}"), name)
