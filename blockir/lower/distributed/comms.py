"""Collectives a parallelised forward really issues, counted at the dispatcher, per stacked layer.

The derived plan predicts each layer's collectives (kind and payload); this
counter measures them, so the prediction can be checked against the engine.
DTensor lowers each of its ops to local ops and functional collectives; the
counter lets it do so first and then sees the collectives themselves, with
their local operands, and records the payload as the full tensor moved.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# functional collective → (plan's name, whether its operand is one shard of the payload)
KINDS = {"all_reduce": ("all-reduce", False), "all_gather_into_tensor": ("all-gather", True),
         "reduce_scatter_tensor": ("reduce-scatter", False)}


class LayerCollectives(TorchDispatchMode):
    """While active, counts ``(kind, payload elements)`` per stacked layer of ``module`` for forward passes.

    ``layers`` are the module paths of the stacked layers (``ParallelPlan.layers``); collectives outside
    them (the model's input and output, a final norm) are not counted."""

    def __init__(self, module: nn.Module, layers: list[str], world: int) -> None:
        super().__init__()
        self.world, self.layer = world, None
        self.seen: dict[str, Counter[tuple[str, int]]] = {path: Counter() for path in layers}
        self.hooks = []
        for path in layers:
            sub = module.get_submodule(path)
            self.hooks.append(sub.register_forward_pre_hook(lambda m, a, p=path: setattr(self, "layer", p)))
            self.hooks.append(sub.register_forward_hook(lambda m, a, y: setattr(self, "layer", None)))

    def __exit__(self, *exc: object) -> Any:
        for h in self.hooks:
            h.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(t is DTensor for t in types):
            return NotImplemented
        kind = KINDS.get(func.overloadpacket.__name__)
        if self.layer is not None and kind is not None:
            self.seen[self.layer][(kind[0], args[0].numel() * (self.world if kind[1] else 1))] += 1
        return func(*args, **(kwargs or {}))
