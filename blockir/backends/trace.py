"""Run a compiled module and return every intermediate by its IR name."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from blockir.backends.fx import invoke
from blockir.diagnostics import BlockError, argument_error


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, prefix: str, values: dict[str, torch.Tensor]):
        super().__init__(gm)
        self.prefix = prefix
        self.values = values
        self.by_node = {node: ssa for ssa, node in gm.blockir_values.items()}

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "call_function" and n.target is invoke and is_compiled(self.fetch_attr(n.args[0].target)):
            sub = self.fetch_attr(n.args[0].target)
            _, ctx, *args = self.map_nodes_to_values(n.args, n)
            result = _Recorder(sub, f"{self.prefix}{n.args[0].target}.", self.values).run(*args, **ctx)
        else:
            result = super().run_node(n)
        if n.name in self.by_node:
            self.values[self.prefix + self.by_node[n.name]] = result
        return result

    def placeholder(self, target: str, args: tuple, kwargs: dict) -> Any:
        if target.startswith("**"):
            return self._ctx
        return super().placeholder(target, args, kwargs)

    def run(self, *args: Any, **ctx: Any) -> Any:  # type: ignore[override]
        self._ctx = ctx
        return super().run(*args)


def is_compiled(module: Any) -> bool:
    return isinstance(module, fx.GraphModule) and hasattr(module, "blockir_values")


def trace(module: fx.GraphModule, *inputs: torch.Tensor, **ctx: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(output, {ssa_name: tensor}); values inside sub-blocks and stacks are named ``layers.0.h``."""
    if not is_compiled(module):
        raise BlockError([argument_error("trace", "module", f"trace expects a module returned by blockir.compile, got "
                                         f"{type(module).__name__}")])
    values: dict[str, torch.Tensor] = {}
    out = _Recorder(module, "", values).run(*inputs, **ctx)
    return out, values


__all__ = ["trace"]
