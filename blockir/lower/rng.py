"""Counter-based dropout randomness keyed by logical coordinates.

A keep/drop decision is a pure function of ``(seed, layer, branch, row, col)``,
so a recomputed forward (activation checkpointing) regenerates the same mask
without storing it, and the eager reference and the Triton kernels agree bit
for bit. The hash is the 32-bit MurmurHash3 finaliser (``fmix32``); the key is
folded on the host and the per-element part runs on the device.
"""
from __future__ import annotations

from typing import TypeVar

import torch

MASK32 = 0xFFFFFFFF
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
GOLDEN = 0x9E3779B1
# keep iff the top 24 bits of the hash are >= threshold(p)
KEEP_BITS = 24


Int = TypeVar("Int", int, torch.Tensor)


def dropout_key(seed: Int, layer: int, branch: int) -> Int:
    """Fold the site identity into one 32-bit key.

    ``seed`` is a Python int or an int64 tensor (a 0-d tensor keeps the whole
    computation inside a traced graph); ``layer`` and ``branch`` are static.
    """
    k = fmix32(fmix32(branch & MASK32) ^ ((layer * GOLDEN) & MASK32))
    k = fmix32(((seed >> 32) & MASK32) ^ k)
    return fmix32((seed & MASK32) ^ k)


def drop_threshold(p: float) -> int:
    """Integer threshold on the top 24 hash bits: an element is kept when bits >= it."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
    return int(p * (1 << KEEP_BITS))


def _mul32(h: Int, c: int) -> Int:
    # split the constant so every partial product fits in int64 without wrapping
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def fmix32(h: Int) -> Int:
    """fmix32 on a Python int or elementwise on an int64 tensor, values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX_C1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX_C2)
    return h ^ (h >> 16)


def element_hash(key: int | torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """Hash of (key, row, col); row and col are int64 index tensors (broadcastable)."""
    h = fmix32((row ^ key) & MASK32)
    return fmix32((h + col) & MASK32)


def keep_mask(key: int | torch.Tensor, p: float, rows: int, cols: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean keep mask of shape [rows, cols] for one dropout site."""
    r = torch.arange(rows, device=device, dtype=torch.int64).unsqueeze(1)
    c = torch.arange(cols, device=device, dtype=torch.int64).unsqueeze(0)
    return (element_hash(key, r, c) >> (32 - KEEP_BITS)) >= drop_threshold(p)


def keep_block(key: int | torch.Tensor, p: float, shape: tuple[int, ...], start: tuple[int, ...],
               size: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """The block ``[start, start + size)`` of the keep mask of logical ``shape``, without drawing the rest.

    The row of an element is its flattened index over the leading axes of the whole ``shape`` and its
    column the index on the last axis, exactly as in ``keep_mask(key, p, prod(shape[:-1]), shape[-1])``,
    so a rank holding one slice of a sharded tensor draws the decisions the unsharded run draws there.
    """
    n = len(shape)
    row = torch.zeros((1,) * n, device=device, dtype=torch.int64)
    stride = 1
    for axis in range(n - 2, -1, -1):
        index = torch.arange(start[axis], start[axis] + size[axis], device=device, dtype=torch.int64)
        row = row + (index * stride).view([-1 if a == axis else 1 for a in range(n)])
        stride *= shape[axis]
    col = torch.arange(start[-1], start[-1] + size[-1], device=device, dtype=torch.int64).view((1,) * (n - 1) + (-1,))
    return (element_hash(key, row, col) >> (32 - KEEP_BITS)) >= drop_threshold(p)


def layer_keep(key: int | torch.Tensor, p: float) -> torch.Tensor:
    """One keep decision (a 0-d bool tensor) for a whole layer: the same test as one element of a mask."""
    return torch.as_tensor((fmix32(key) >> (32 - KEEP_BITS)) >= drop_threshold(p))
