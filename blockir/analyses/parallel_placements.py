"""The placement strings a tensor-parallel plan gives its keys, shared by the plan of every branch kind."""
from __future__ import annotations

SUMMED = "replicate (gradient summed over tp)"
WHOLE = "replicate (each rank computes the columns of its own heads or units)"


def stacked(blocks: int | None, dim: int) -> str:
    """A matrix whose rank rows are its 1/P of each of ``blocks`` equal blocks along ``dim`` (one block: a plain
    shard); None: no such pattern, the matrix whole on every rank."""
    if blocks is None:
        return WHOLE
    return f"shard({dim})" if blocks == 1 else f"shard({dim}) within each of its {blocks} stacked blocks"
