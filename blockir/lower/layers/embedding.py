"""Token and position embedding tables, and the projection to vocabulary logits."""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blockir.lower.boundary import NOTHING


def mask_positions(keep: Tensor) -> Tensor:
    """Positions counted over the kept tokens of a ``[B, S]`` keep-mask, ``-1`` at padded ones (OPT's numbering)."""
    return (torch.cumsum(keep, dim=1) * keep - 1).long()


class Embedding(nn.Module):
    """A lookup table under the key ``weight``: token ids, or (``positions``) positions ``0..S-1`` (or the
    caller's ``position_ids``).

    ``scale`` multiplies the rows in the table's dtype, as Gemma's embedding normaliser does.
    ``padding_idx`` names a row that receives no gradient, as ``nn.Embedding``'s does.
    """

    def __init__(self, rows: int, width: int, positions: bool = False, scale: float | None = None,
                 offset: int = 0, mask_positions: bool = False, padding_idx: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, width) * 0.02)
        self.positions, self.scale, self.offset, self.mask_positions = positions, scale, offset, mask_positions
        self.padding_idx = padding_idx

    @property
    def blockir_context(self) -> frozenset[str]:
        """A position table reads ``position_ids`` (and, numbered by the keep-mask, ``attention_mask``); a token
        table reads nothing."""
        if not self.positions:
            return NOTHING
        return frozenset({"position_ids", "attention_mask"} if self.mask_positions else {"position_ids"})

    def forward(self, ids: Tensor, **ctx: object) -> Tensor:
        if self.positions:
            given, keep = ctx.get("position_ids"), ctx.get("attention_mask")
            if isinstance(given, Tensor):  # the caller's positions win, as in HF's models
                return F.embedding(given.long() + self.offset, self.weight).expand(*ids.shape, -1)
            if self.mask_positions and isinstance(keep, Tensor) and keep.dim() == 2:
                return F.embedding(mask_positions(keep) + self.offset, self.weight)
            index = torch.arange(self.offset, self.offset + ids.shape[-1], device=ids.device)
            return F.embedding(index, self.weight).expand(*ids.shape, -1)
        y = F.embedding(ids.long(), self.weight, self.padding_idx)
        if self.scale is not None:
            y = y * torch.tensor(self.scale, dtype=y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, positions={self.positions}, offset={self.offset}, scale={self.scale}"


class Head(nn.Module):
    """Projection to vocabulary logits (``weight`` [V, D]); its weight may be the token embedding's."""

    def __init__(self, width: int, vocab: int, bias: bool = False, softcap: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, width) * 0.02)
        self.bias = nn.Parameter(torch.zeros(vocab)) if bias else None
        self.softcap = softcap

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        logits = F.linear(x, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}, softcap={self.softcap}"
