"""Reports that describe a program as it will be compiled: they run the rewrites a backend runs.

They sit above ``rewrites`` (the cost ledger counts the fused program that
``backend="fused"`` builds), so no analysis depends on a rewrite.
"""
