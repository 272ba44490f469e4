"""BlockModule, the ``fx.GraphModule`` of a compiled block, and the generated class its layers share.

One graph is built per distinct block — per block, mode and value of the constants its ops read —
and its code is generated once: the layers of a stack are instances of one generated class that
share the graph until one of them asks for it (``.graph`` hands each instance a private copy on
first use, and ``recompile`` moves that instance to a class of its own). The layer index is an
attribute (``blockir_layer``) read by the graph, not a constant in it.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch.fx as fx
from torch import nn

from blockir.ir import consts as C
from blockir.lower.boundary import Keywords, context_of, placed_contract, union
from blockir.lower.fx.runtime import SPLAT

LAYER_ATTR = "blockir_layer"
CONTRACT_ATTR = "blockir_contract"  # the root's CallContract, read by its input check

_SPLAT_ARG = re.compile(r"(\(|, )\*\* = ")


class BlockCodeGen(fx.graph.CodeGen):
    """fx's code generation, printing a ``"**"`` keyword argument as ``**value``."""

    def _gen_python_code(self, *args: Any, **kwargs: Any) -> Any:
        code = super()._gen_python_code(*args, **kwargs)
        code.src = _SPLAT_ARG.sub(r"\1**", code.src)
        return code


class BlockModule(fx.GraphModule):
    """A compiled block: an ``fx.GraphModule`` whose generated class may be shared by the layers of a stack.

    ``blockir_values`` maps SSA names to node names, ``blockir_block`` names the block and
    ``blockir_layer`` is the layer index inside its stack (0 outside a stack).
    """

    _blockir_shared = False

    def __new__(cls, *args: Any, **kwargs: Any) -> "BlockModule":
        # fx.GraphModule.__new__ makes a class per instance; instances of one compiled block share theirs
        return object.__new__(cls)

    def __init__(self, root: nn.Module | dict[str, Any], graph: fx.Graph, class_name: str | None = None) -> None:
        # fx's own constructor (used by fx passes that copy a module): it installs code for this instance only
        self._blockir_private_class()
        super().__init__(root, graph, class_name or type(self).__name__)

    def _blockir_private_class(self) -> None:
        cls = type(self)
        if cls._blockir_shared:
            # a sibling of the shared class, not a subclass: fx's call wrapper would recurse through both
            attrs = {"_blockir_shared": False, "__module__": cls.__module__}
            self.__class__ = type(cls.__name__, (BlockModule,), attrs)

    @property  # type: ignore[override]
    def graph(self) -> fx.Graph:
        if not self.__dict__.get("_blockir_owns_graph", True):
            g = copy.deepcopy(self._graph)
            g.owning_module = self
            self._graph = g
            self._blockir_owns_graph = True
        return self._graph

    @graph.setter
    def graph(self, g: fx.Graph) -> None:
        self._blockir_owns_graph = True
        fx.GraphModule.graph.fset(self, g)  # type: ignore[attr-defined]

    def recompile(self) -> Any:
        self._blockir_private_class()
        return super().recompile()

    @property
    def blockir_context(self) -> Keywords:
        """The context keywords this block reads: those of everything its graph calls with the context."""
        return union(context_of(self.get_submodule(n.target)) for n in self._graph.nodes
                     if n.op == "call_module" and SPLAT in n.kwargs)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        # .to() / .half() / .cuda() convert through here: the contract follows the parameters' dtype and device
        out = super()._apply(fn, recurse)
        contract = self.__dict__.get(CONTRACT_ATTR)
        if contract is not None:
            self.__dict__[CONTRACT_ATTR] = placed_contract(self, contract)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> "BlockModule":
        res = object.__new__(type(self))
        memo[id(self)] = res
        res.__dict__.update(copy.deepcopy(self.__dict__, memo))
        if res.__dict__.get("_blockir_owns_graph", True):
            res._graph.owning_module = res
        return res

    def __copy__(self) -> "BlockModule":
        res = object.__new__(type(self))
        res.__dict__.update(self.__dict__)
        for key in ("_parameters", "_buffers", "_modules"):
            res.__dict__[key] = dict(self.__dict__[key])
        res.__dict__["_blockir_owns_graph"] = False
        return res


# instance state fx.GraphModule.__init__ would set; given to each instance of a shared class
def _fresh_state() -> dict[str, Any]:
    return dict(_tracer_cls=None, _tracer_extras={}, meta={}, _replace_hooks=[], _create_node_hooks=[],
                _erase_node_hooks=[], _deepcopy_hooks=[], shape_env=None)


@dataclass
class Code:
    """One generated class and the graph it was generated from."""

    cls: type[BlockModule]
    graph: fx.Graph
    state: dict[str, Any]
    values: dict[str, str]
    consts: tuple[tuple[C.ConstExpr, float | int], ...]

    def instance(self, block: str, layer: int) -> BlockModule:
        m = object.__new__(self.cls)
        nn.Module.__init__(m)
        m.__dict__.update(self.state, **_fresh_state(), _graph=self.graph, _blockir_owns_graph=False,
                          blockir_values=self.values, blockir_block=block, **{LAYER_ATTR: layer})
        return m


def generate(name: str, graph: fx.Graph, values: dict[str, str],
             consts: tuple[tuple[C.ConstExpr, float | int], ...]) -> Code:
    """The class of block ``name``, its forward generated once from ``graph``."""
    cls = type(name, (BlockModule,), {"_blockir_shared": True, "__module__": BlockModule.__module__})
    template = object.__new__(cls)
    nn.Module.__init__(template)
    template.__dict__["_graph"] = graph
    fx.GraphModule.recompile(template)  # installs forward and __call__ on the shared class
    state = {k: template.__dict__[k] for k in ("_code", "_lineno_map", "_prologue_start") if k in template.__dict__}
    return Code(cls, graph, state, values, consts)
