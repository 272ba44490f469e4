"""The residual-update ledger (docs/cost.md): what the wrapper of a block costs.

``counts`` holds what is counted in (sizes, tallies, the fused boundary), ``wrapper`` a block's own
ops (each kind's ``COST`` hook), ``walk`` the ledger over sub-blocks and stacks and ``table`` its
table and JSON data.
"""
from __future__ import annotations

from blockir.reports.cost.counts import (BlockCost, CostError, FusedBoundary, Ledger, Tally, fused_boundary_bytes,
                                         norm_parameters)
from blockir.reports.cost.table import SCOPE, format_ledger, ledger_data
from blockir.reports.cost.walk import instances, ledger

__all__ = ["BlockCost", "CostError", "FusedBoundary", "Ledger", "Tally", "fused_boundary_bytes", "norm_parameters",
           "SCOPE", "format_ledger", "ledger_data", "instances", "ledger"]
