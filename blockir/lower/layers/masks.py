"""Attention masks as HF models and torch.nn layers pass them, combined with the block's causality.

The built-in attention reads two masks from its context and obeys both, and its own causality on top:

| form | shape | meaning |
| --- | --- | --- |
| keep-mask (HF ``attention_mask`` from a tokenizer) | ``[B, K]`` bool or integer | nonzero: the key may be attended |
| boolean mask (HF ``sdpa``) | ``[B or 1, H or 1, Q or 1, K]`` bool | ``True``: may attend |
| additive mask (HF ``eager``) | ``[B or 1, H or 1, Q or 1, K]`` float | added to the scores |
| key padding (torch ``key_padding_mask``) | ``[B, K]`` bool or float | bool ``True``: padded key; float: added |

A float 2D mask is refused rather than guessed at: torch reads ``[Q, K]`` float masks as additive,
HF reads ``[B, K]`` masks as keep-masks.
"""
from __future__ import annotations

import torch
from torch import Tensor

from blockir.diagnostics import BlockError, Span, error

FORMS = ("accepted: [B, K] bool or integer keep-mask (1 = attend); [B|1, H|1, Q|1, K] bool (True = attend); "
         "[B|1, H|1, Q|1, K] float added to the scores")
PADDING_FORMS = "accepted: [B, K] bool (True = padded key, torch's convention) or float added to the scores"


def _fits(shape: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    return all(got in (1, want) for got, want in zip(shape, sizes))


class MaskBuilder:
    """Collects the constraints of one attention call: ``allowed`` (bool, True = attend) and ``bias`` (added)."""

    def __init__(self, label: str, span: Span, sizes: tuple[int, int, int, int],
                 first: int | Tensor | None = None) -> None:
        self.label, self.span, self.sizes = label, span, sizes  # sizes: batch, heads, queries, keys
        # the first query's position among the keys; None: the queries are the last keys (after a cache).
        # A context-parallel rank holds rows first … first + queries - 1 of the sequence and all its keys;
        # a load-balanced one two runs of rows: then every query's position (a [queries] tensor)
        self.first = first
        self.allowed: Tensor | None = None
        self.bias: Tensor | None = None
        self.summed = False  # two additive masks were added: their sum may leave the dtype's range

    def _refuse(self, what: str, mask: object, hint: str) -> BlockError:
        form = (f"shape [{', '.join(map(str, mask.shape))}] and dtype {mask.dtype}" if isinstance(mask, Tensor)
                else f"type {type(mask).__name__}")
        return BlockError([error("E0723", f"{self.label}: {what} of {form} is not a mask it reads", self.span,
                                 hint=hint)])

    def _allow(self, allowed: Tensor) -> None:
        self.allowed = allowed if self.allowed is None else self.allowed & allowed

    def _add(self, bias: Tensor) -> None:
        self.summed = self.bias is not None
        self.bias = bias if self.bias is None else self.bias + bias

    def attention_mask(self, mask: object, name: str) -> None:
        """HF's forms: a 2D keep-mask, a 4D boolean (True = attend) or a 4D additive mask."""
        if mask is None:
            return
        batch, heads, queries, keys = self.sizes
        if not isinstance(mask, Tensor):
            raise self._refuse(name, mask, FORMS)
        four_d = mask.dim() == 4 and mask.shape[3] == keys and _fits(mask.shape, self.sizes)
        if mask.dim() == 2 and not mask.is_floating_point() and not mask.is_complex() and \
                mask.shape[1] == keys and _fits(mask.shape, (batch, keys)):
            self._allow(mask.bool()[:, None, None, :])
        elif four_d and mask.dtype == torch.bool:
            self._allow(mask)
        elif four_d and mask.is_floating_point():
            self._add(mask)
        else:  # an integer 4D mask would be ambiguous: 0 keeps in an additive mask, drops in a keep-mask
            raise self._refuse(name, mask, FORMS)

    def key_padding_mask(self, mask: object, name: str) -> None:
        """torch.nn's ``key_padding_mask``: ``[B, K]``, True (or a large negative float) drops the key."""
        if mask is None:
            return
        batch, _, _, keys = self.sizes
        if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[1] != keys or \
                not _fits(mask.shape, (batch, keys)) or not (mask.dtype == torch.bool or mask.is_floating_point()):
            raise self._refuse(name, mask, PADDING_FORMS)
        if mask.dtype == torch.bool:
            self._allow(~mask[:, None, None, :])
        else:
            self._add(mask[:, None, None, :])

    def window(self, size: int, device: torch.device) -> None:
        """Sliding window: query ``i`` sees key ``j`` only while ``i - j < size`` (HF's convention)."""
        keys = self.sizes[3]
        self._allow(self._rows(device) - torch.arange(keys, device=device)[None, :] < size)

    def _rows(self, device: torch.device) -> Tensor:
        """Each query's position among the keys, as a ``[queries, 1]`` column."""
        if isinstance(self.first, Tensor):
            return self.first.to(device)[:, None]
        _, _, queries, keys = self.sizes
        first = keys - queries if self.first is None else self.first
        return torch.arange(first, first + queries, device=device)[:, None]

    def build(self, causal: bool, dtype: torch.dtype, device: torch.device,
              additive: bool = False) -> tuple[Tensor | None, bool]:
        """The mask for ``scaled_dot_product_attention`` and its ``is_causal`` flag.

        ``additive`` asks for the form an eager reference adds to its scores: causality included,
        masked scores at the dtype's minimum (never a boolean, never ``is_causal``).
        """
        _, _, queries, keys = self.sizes
        if self.allowed is None and self.bias is None and not (additive and causal) and \
                (not causal or queries is keys or queries == keys):  # `is`: one traced size, never compared
            return None, causal  # the kernels' own causal path; it aligns the triangle top-left, so not after a cache
        if self.allowed is None and self.bias is None and not additive and queries == 1 and self.first is None:
            return None, False  # one query after the cached keys sees all of them
        if causal:  # query i sees the keys up to its own position
            self._allow(self._rows(device) >= torch.arange(keys, device=device)[None, :])
        if additive and self.bias is None:
            self.bias = torch.zeros((), dtype=dtype, device=device)
        if self.bias is None:
            return self.allowed, False
        # HF's convention: masked scores sit at the dtype's minimum, so a row with nothing to attend stays finite
        low = torch.finfo(dtype).min
        bias = self.bias
        if self.summed or bias.dtype != dtype:
            bias = bias.clamp(min=low).to(dtype)
        if self.allowed is not None:
            bias = torch.where(self.allowed, bias, torch.tensor(low, dtype=dtype, device=bias.device))
        return bias, False
