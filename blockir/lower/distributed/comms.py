"""Collectives a parallelised forward and backward really issue, counted at the dispatcher, per stacked layer.

The derived plan predicts each layer's collectives (kind and payload), forward
and backward; this counter measures them, so the prediction can be checked
against the engine. A backward collective belongs to the layer whose backward
is running (torch's module tracker follows the gradients through the layers).
DTensor lowers each of its ops to local ops and functional collectives; the
counter lets it do so first and then sees the collectives themselves, with
their local operands, and records the payload as the full tensor moved.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn
from torch.distributed._tools.mod_tracker import ModTracker
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# functional collective → (plan's name, whether its operand is one shard of the payload)
KINDS = {"all_reduce": ("all-reduce", False), "all_gather_into_tensor": ("all-gather", True),
         "reduce_scatter_tensor": ("reduce-scatter", False)}


class LayerCollectives(TorchDispatchMode):
    """While active, counts ``(kind, payload elements)`` per stacked layer of ``module``: forward passes in
    ``seen``, backward passes in ``seen_backward``.

    ``layers`` are the module paths of the sites to count: the stacked layers (``ParallelPlan.layers``), the
    tables and norms outside them, and ``""`` for the root, which then also counts whatever runs outside every
    module (the model's own output gathered); collectives outside the sites given are not counted."""

    def __init__(self, module: nn.Module, layers: list[str], world: int) -> None:
        super().__init__()
        self.world, self.tracker = world, ModTracker()
        self.seen: dict[str, Counter[tuple[str, int]]] = {path: Counter() for path in layers}
        self.seen_backward: dict[str, Counter[tuple[str, int]]] = {path: Counter() for path in layers}
        self.module, self.names = module, {}

    def __enter__(self) -> Any:
        self.tracker.__enter__()
        self.tracker._get_mod_name(self.module)  # names every submodule by its path from the root
        self.names = {self.tracker.get_known_fqn(self.module.get_submodule(path)): path for path in self.seen}
        return super().__enter__()

    def __exit__(self, *exc: object) -> Any:
        self.tracker.__exit__(*exc)
        return super().__exit__(*exc)

    def _layer(self) -> str | None:
        """The innermost counted site whose forward or backward is running; outside every module (the root's
        output hooks, which run after the tracker has left it), the root where it is counted."""
        found = [self.names[n] for n in self.tracker.parents if n in self.names]
        return max(found, key=len, default="" if "" in self.seen else None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(t is DTensor for t in types):
            return NotImplemented
        kind = KINDS.get(func.overloadpacket.__name__)
        layer = None if kind is None else self._layer()
        if layer is not None:
            seen = self.seen_backward if self.tracker.is_bw else self.seen
            seen[layer][(kind[0], args[0].numel() * (self.world if kind[1] else 1))] += 1
        return func(*args, **(kwargs or {}))
