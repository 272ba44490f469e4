"""The key/value cache the built-in self-attention reads and writes while a causal LM decodes.

One :class:`KVCache` serves a whole model: each attention module owns one slot, found by the
module itself, so a compiled graph passes the cache through its keyword context unchanged
(``past_key_values=cache``) and no layer index travels with it. A slot is a preallocated
``[B, kv_heads, capacity, head_dim]`` pair of buffers; each call writes the new positions' keys and
values in place after the ones already held and attends over the filled prefix. Keys are stored
after RoPE, so every position is rotated and projected once. A slot that runs out of room grows
to twice its length (one copy), so a cache made without a capacity appends as it goes.

Sliding windows and per-layer patterns need nothing here: every slot holds all positions, and
each layer's mask (causal, window, padding over the cache's key index, as HF masks them) decides
what its queries see.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from blockir.diagnostics import BlockError, Span, error


class _Slot:
    """One attention module's keys and values, the first ``length`` positions filled."""

    def __init__(self, k: Tensor, v: Tensor, capacity: int) -> None:
        batch, heads, _, dim = k.shape
        self.keys = k.new_empty(batch, heads, capacity, dim)
        self.values = v.new_empty(batch, v.shape[1], capacity, v.shape[-1])
        self.length = 0

    def grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.keys.shape[2])
        for name in ("keys", "values"):
            old: Tensor = getattr(self, name)
            new = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)


class KVCache:
    """Keys and values of the positions a model has seen, per attention module.

    ``capacity`` preallocates room for that many positions per slot (``generate`` passes prompt
    plus new tokens, so nothing is reallocated while decoding); without it slots start at the first
    call's length and double when full.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._slots: dict[int, _Slot] = {}
        self._owners: list[nn.Module] = []  # keeps the modules alive, so their ids stay theirs

    def get_seq_length(self) -> int:
        """How many positions are held (HF's name): the length every slot reaches after a full forward."""
        return max((s.length for s in self._slots.values()), default=0)

    def batch_size(self) -> int | None:
        return next((s.keys.shape[0] for s in self._slots.values()), None)

    def update(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``, ``v`` ``[B, H, S, hd]`` after the slot's filled positions; the filled keys and values."""
        slot = self._slots.get(id(module))
        new = k.shape[2]
        if slot is None:
            slot = self._slots[id(module)] = _Slot(k, v, max(self.capacity or 0, new))
            self._owners.append(module)
        elif slot.keys.shape[0] != k.shape[0]:
            raise BlockError([error("E0840", f"the cache holds a batch of {slot.keys.shape[0]} sequences, but this "
                                    f"call passes {k.shape[0]}", Span("blockir.CausalLM(past_key_values=…)", 0, 0),
                                    hint="pass the cache only with the batch it was filled with")])
        end = slot.length + new
        if end > slot.keys.shape[2]:
            slot.grow(end)
        slot.keys[:, :, slot.length:end] = k
        slot.values[:, :, slot.length:end] = v
        slot.length = end
        return slot.keys[:, :, :end], slot.values[:, :, :end]

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self._slots)}, length={self.get_seq_length()})"
