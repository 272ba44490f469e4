"""Analyses that answer questions about a program rather than report errors.

``structure`` (the residual wrapper every topology verifier reads), ``env``
(constants per layer), ``facts`` (stated facts), ``keys`` (parameter keys,
shapes and checkpoint reconciliation), ``diff`` (graph comparison) and
``manifest`` (the architecture manifest). The buffer plan and the fold report
live with their verifiers: ``blockir.analyses.liveness.plan`` and
``blockir.analyses.fold_legality.fold_report``.
"""
from blockir.analyses.diff import BlockDiff, diff_blocks
from blockir.analyses.keys import KeyTable, Reconciliation, SizeError, param_keys, reconcile

__all__ = ["BlockDiff", "KeyTable", "Reconciliation", "SizeError", "diff_blocks", "param_keys", "reconcile"]
