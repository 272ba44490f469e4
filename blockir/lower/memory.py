"""Peak bytes of tensors created during a call, counted at the dispatcher.

A TorchDispatchMode sees every op's outputs; each new storage is counted
until the last tensor referring to it is collected. In-place ops return an
existing storage and add nothing. Unlike process RSS this is exact and
repeatable on CPU, and it ignores tensors that existed before the call.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, int] = {}  # storage pointer → live tensors referring to it
        self._sizes: dict[int, int] = {}
        self._known: set[int] = set()

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live -= self._sizes.pop(key)
            del self._refs[key]

    def track_existing(self, *tensors: torch.Tensor) -> None:
        """Storages that exist before the call (inputs, parameters) are never counted."""
        for t in tensors:
            self._known.add(t.untyped_storage().data_ptr())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            key = t.untyped_storage().data_ptr()
            if key in self._known or key == 0:
                continue
            if key not in self._refs:
                self._refs[key] = 0
                self._sizes[key] = t.untyped_storage().nbytes()
                self.live += self._sizes[key]
                self.peak = max(self.peak, self.live)
            self._refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out


def peak_bytes(fn: Callable[[], Any], existing: tuple[torch.Tensor, ...] = ()) -> int:
    """Peak bytes of storages created while ``fn`` runs (the result's own storage included)."""
    mode = LiveBytes()
    mode.track_existing(*existing)
    with mode:
        result = fn()
    del result
    return mode.peak
