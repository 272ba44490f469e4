"""Run a compiled module and return every intermediate by its IR name."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from blockir.lower.fx.module import BlockModule
from blockir.lower.fx.runtime import SPLAT
from blockir.lower.fx.tree import Stack
from blockir.diagnostics import BlockError, argument_error
from blockir.signatures import public


class _Recorder(fx.Interpreter):
    """Interprets one block's graph; sub-blocks and stack layers are recorded under their path."""

    def __init__(self, gm: BlockModule, prefix: str, values: dict[str, torch.Tensor], ctx: dict[str, Any]):
        # the graph the code was generated from; reading gm.graph would give a layer a private copy
        super().__init__(gm, graph=gm._graph)
        self.prefix = prefix
        self.values = values
        self.ctx = ctx
        self.by_node = {node: ssa for ssa, node in gm.blockir_values.items()}

    @staticmethod
    def _kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """A node's keyword arguments with the context it passes on (``"**"``) spread out."""
        rest = {k: v for k, v in kwargs.items() if k != SPLAT}
        return {**kwargs[SPLAT], **rest} if SPLAT in kwargs else rest

    def call_module(self, target: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        submod = self.fetch_attr(target)
        kwargs = self._kwargs(kwargs)
        if is_compiled(submod):
            return _Recorder(submod, f"{self.prefix}{target}.", self.values, kwargs).run(*args)
        if isinstance(submod, Stack):
            return submod.thread(lambda i, layer, *inputs: _Recorder(
                layer, f"{self.prefix}{target}.{i}.", self.values, kwargs).run(*inputs), *args)
        return submod(*args, **kwargs)

    def call_function(self, target: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        kwargs = self._kwargs(kwargs)
        return target(*args, **kwargs)

    def placeholder(self, target: str, args: tuple, kwargs: dict) -> Any:
        if target.startswith("**"):
            return self.ctx
        return super().placeholder(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.name in self.by_node:
            self.values[self.prefix + self.by_node[n.name]] = result
        return result


def is_compiled(module: Any) -> bool:
    return isinstance(module, BlockModule)


@public("trace")
def trace(module: fx.GraphModule, *inputs: torch.Tensor, **ctx: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(output, {ssa_name: tensor}); values inside sub-blocks and stacks are named ``layers.0.h``."""
    if not is_compiled(module):
        raise BlockError([argument_error("trace", "module", f"trace expects a module returned by blockir.compile, got "
                                         f"{type(module).__name__}")])
    values: dict[str, torch.Tensor] = {}
    out = _Recorder(module, "", values, ctx).run(*inputs)
    return out, values


__all__ = ["trace"]
