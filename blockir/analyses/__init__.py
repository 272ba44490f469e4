"""Read-only analyses: facts about a program that the verifiers, rewrites, backends and commands share.

Each fact has one owner: ``sizes`` (the size environment), ``structure`` (the
residual wrapper: state, spine, each update's shortcut and branches),
``norms`` (the norm-family table), ``summaries`` (what a block does to its
inputs, seen from a call), ``facts`` (stated facts), ``keys`` (parameter keys,
shapes and checkpoint reconciliation), ``classify`` (topology names),
``liveness`` (the buffer plan), ``fold_legality`` (the fold report), ``cost``,
``diff`` and ``manifest``.
"""
from blockir.analyses.diff import BlockDiff, diff_blocks
from blockir.analyses.keys import KeyTable, Reconciliation, param_keys, reconcile

__all__ = ["BlockDiff", "KeyTable", "Reconciliation", "diff_blocks", "param_keys", "reconcile"]
