"""Analyses that answer questions about a program rather than report errors.

``structure`` (the residual wrapper every topology verifier reads), ``env``
(constants per layer), ``facts`` (stated facts), ``keys`` (parameter keys,
shapes and checkpoint reconciliation), ``diff`` (graph comparison) and
``manifest`` (the architecture manifest). The buffer plan and the fold report
live with their verifiers: ``blockir.analyses.liveness.plan`` and
``blockir.analyses.fold_legality.fold_report``.

The names below are imported on first use, so that a verifier importing one
analysis does not load the others.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"BlockDiff": "diff", "diff_blocks": "diff", "KeyTable": "keys", "Reconciliation": "keys",
            "SizeError": "keys", "param_keys": "keys", "reconcile": "keys"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blockir.analyses' has no attribute {name!r}")
    return getattr(importlib.import_module(f"blockir.analyses.{_EXPORTS[name]}"), name)
