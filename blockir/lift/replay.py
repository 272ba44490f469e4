"""The adapter of a lifted extern: it calls the original submodule exactly as the traced forward did."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

# how one argument of the original call is filled: ("input", i) the i-th tensor the block passes,
# ("ctx", name) a keyword of the compiled module's forward, ("const", value) a value fixed at trace time
Slot = tuple[str, Any]


@dataclass(frozen=True)
class Replay:
    """``module(*args, **kwargs)[index…]`` with every argument filled from its slot."""

    args: tuple[Slot, ...]
    kwargs: tuple[tuple[str, Slot], ...]
    index: tuple[int, ...] = ()

    @property
    def reads_context(self) -> bool:
        """Does the call take a side input of the lifted module (a mask, rotary tables)?"""
        return any(s[0] == "ctx" for s in (*self.args, *(s for _, s in self.kwargs)))

    def _fill(self, slot: Slot, inputs: tuple[Tensor, ...], ctx: dict[str, Any]) -> Any:
        kind, value = slot
        if kind == "input":
            return inputs[value]
        if kind == "ctx":
            return ctx.get(value)
        return value

    def __call__(self, module: nn.Module, *inputs: Tensor, **ctx: Any) -> Any:
        out = module(*(self._fill(s, inputs, ctx) for s in self.args),
                     **{k: self._fill(s, inputs, ctx) for k, s in self.kwargs})
        for i in self.index:
            out = out[i]
        return out
