"""The zig-zag order of a load-balanced context-parallel stream.

Under a causal mask the query of position i reads i + 1 keys, so ranks holding consecutive slices of the
sequence do unequal work: the last one the most. Load balancing cuts the sequence into 2P equal chunks and
gives rank r of P chunks r and 2P - 1 - r (one early, one late: every rank then computes the same number of
scores). The stream holds the rows in that order, each rank's two chunks side by side, so that a plain
``Shard`` of the stream's sequence axis is a rank's rows; these helpers map stream positions back to
positions in the sequence.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _chunk(j: int, chunks: int) -> int:
    """The sequence chunk that stream chunk ``j`` of ``chunks`` holds: 2r -> r, 2r + 1 -> chunks - 1 - r."""
    return j // 2 if j % 2 == 0 else chunks - 1 - j // 2


def zigzag_runs(start: int, size: int, total: int, chunks: int) -> list[tuple[int, int]]:
    """Stream positions ``start`` … ``start + size - 1`` of ``total`` as runs of the sequence's positions
    (first position, count), in stream order: one run per chunk they touch."""
    c = total // chunks
    runs, at = [], start
    while at < start + size:
        j, offset = divmod(at, c)
        count = min(c - offset, start + size - at)
        runs.append((_chunk(j, chunks) * c + offset, count))
        at += count
    return runs


def zigzag_order(total: int, chunks: int, device: torch.device | str = "cpu") -> Tensor:
    """The sequence position each stream position holds: ``x[:, order]`` puts a sequence in stream order."""
    return torch.cat([torch.arange(s, s + n, device=device) for s, n in zigzag_runs(0, total, total, chunks)])
