"""Analyses that answer questions about a program rather than report errors.

``structure`` (the residual wrapper every topology verifier reads), ``env``
(constants per layer), ``facts`` (stated facts), ``keys`` (parameter keys,
shapes and checkpoint reconciliation), ``diff`` (graph comparison) and
``manifest`` (the architecture manifest). The buffer plan and the fold report
live with their verifiers: ``blockir.passes.liveness.plan`` and
``blockir.passes.fold_legality.fold_report``.
"""
from blockir.analysis.diff import BlockDiff, diff_blocks
from blockir.analysis.keys import KeyTable, Reconciliation, SizeError, param_keys, reconcile

__all__ = ["BlockDiff", "KeyTable", "Reconciliation", "SizeError", "diff_blocks", "param_keys", "reconcile"]
