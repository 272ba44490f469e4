"""GraphBuilder: the graph of one block, built node by node by the lowering hooks of its ops.

Each op kind registers how it lowers in its own file (``blockir/ops/<kind>.py``, table
``FX_LOWERING``, and ``FUSED_LOWERING`` where the fused backend lowers it differently); a
:class:`Backend` names the tables it reads, first match first, and the :class:`Runtime` its graphs
call. A hook is ``hook(op, builder)``: it reads its operands from ``builder.env``, its constants
through :meth:`GraphBuilder.value` and emits nodes with the methods below, naming torch functions
through ``builder.rt`` so that the op kinds never import torch.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch.fx as fx

from blockir.norms import family
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir import consts as C
from blockir.ir.decls import Decl, KindDecl
from blockir.ir.hooks import FX_LOWERING, HookTable
from blockir.ir.program import Block, Program
from blockir.ir.types import TensorType
from blockir.lower.boundary import Missing, check_inputs, input_specs
from blockir.lower.fx.inplace import inplace_adds
from blockir.lower.fx.module import CONTRACT_ATTR, LAYER_ATTR, BlockCodeGen
from blockir.lower.fx.names import node_name, parameter_names
from blockir.lower.fx.runtime import SPLAT, Runtime, context, draw_seed


@dataclass(frozen=True)
class Backend:
    """A lowering: the hook tables it reads (the first that has a hook for a kind lowers it) and its runtime."""

    name: str
    tables: tuple[HookTable, ...]
    runtime: type[Runtime]


FX = Backend("fx", (FX_LOWERING,), Runtime)


class GraphBuilder:
    """Emits fx nodes for one block; ``env`` maps SSA names to nodes.

    Constants are read through :meth:`value`, which records each expression and its
    value: a later layer whose constants evaluate the same reuses the graph.
    """

    def __init__(self, block: Block, sizes: Sizes, inplace: dict[int, str] | None = None,
                 backend: Backend = FX) -> None:
        self.block = block
        self.inplace = inplace or {}  # id(add) → the operand whose buffer it overwrites
        self.sizes = sizes
        self.backend = backend
        self.rt = backend.runtime
        self.graph = fx.Graph()
        self.graph.set_codegen(BlockCodeGen())
        self.env: dict[str, fx.Node] = {}
        self.names: dict[str, str] = {}
        self.consts: list[tuple[C.ConstExpr, float | int]] = []
        self.ctx: fx.Node | None = None
        self.seed: fx.Node | None = None
        self.training: fx.Node | None = None
        self.layer: fx.Node | None = None

    def lower(self, op: Any) -> None:
        """Emit ``op`` through the first of the backend's tables that has a hook for its kind."""
        for table in self.backend.tables:
            hook = table.get(op)
            if hook is not None:
                hook(op, self)
                return
        raise BlockError([error("E0705", f"the {self.backend.name} backend cannot lower {type(op).__name__}",
                                op.span)])

    # ---- what a hook reads

    def value(self, expr: C.ConstExpr) -> float | int:
        v = self.sizes.value(expr)
        self.consts.append((expr, v))
        return v

    def decl(self, name: str) -> Decl:
        return self.block.decl_map[name]

    def batch_coupled(self, name: str) -> bool:
        """Whether declaration ``name`` is a norm whose statistics couple the rows of a batch (it reads the padding mask)."""
        decl = self.decl(name)
        return isinstance(decl, KindDecl) and family(decl).batch_coupled

    def inplace_target(self, op: Any) -> str | None:
        """The operand whose buffer ``op`` may overwrite (inference only), or None."""
        return self.inplace.get(id(op))

    def runtime_sizes(self, t: TensorType) -> tuple[Any, ...]:
        """Each axis's size: read from an input that has the axis (batch and sequence vary per call), else declared."""
        out: list[Any] = []
        for axis in t.names:
            source = next(((op.result, p.names.index(axis)) for op in self.block.inputs
                           if axis in (p := op.type).names), None)
            if source is None:
                out.append(self.sizes.dim(axis))
            else:
                out.append(self.graph.create_node("call_method", "size", (self.env[source[0]], source[1]), {}))
        return tuple(out)

    # ---- what a hook emits

    def bind(self, ssa: str, node: fx.Node) -> fx.Node:
        self.env[ssa] = node
        self.names[ssa] = node.name
        return node

    def fn(self, target: Callable[..., Any], args: tuple, ssa: str | None = None, kwargs: dict | None = None,
           wrapped: bool = False) -> fx.Node:
        """A call_function node; ``wrapped`` ones stay one call under ``torch.fx.symbolic_trace``."""
        node = self.graph.create_node("call_function", target, args, kwargs or {},
                                      name=node_name(ssa) if ssa else None)
        if wrapped:
            node.meta["is_wrapped"] = True
        return self.bind(ssa, node) if ssa else node

    def method(self, name: str, args: tuple, ssa: str) -> fx.Node:
        """A call_method node: ``args[0].name(*args[1:])``."""
        return self.bind(ssa, self.graph.create_node("call_method", name, args, {}, name=node_name(ssa)))

    def module(self, target: str, args: tuple, ssa: str | None, with_ctx: bool) -> fx.Node:
        """A call_module node; ``with_ctx`` passes the forward's keyword context on (``**ctx``)."""
        kwargs = {SPLAT: self.ctx} if with_ctx else {}
        name = node_name(ssa) if ssa else target.replace(".", "_")
        node = self.graph.create_node("call_module", target, args, kwargs, name=name)
        return self.bind(ssa, node) if ssa else node

    def unpack(self, node: fx.Node, results: tuple[str, ...]) -> None:
        """Bind result i to item i of the tuple ``node`` returns."""
        for i, r in enumerate(results):
            self.fn(operator.getitem, (node, i), r)

    def output(self, value: fx.Node | tuple[fx.Node, ...]) -> None:
        self.graph.output(value)

    def attr(self, target: str) -> fx.Node:
        return self.graph.get_attr(target)

    def training_flag(self) -> fx.Node:
        if self.training is None:
            self.training = self.graph.create_node("get_attr", "training", name="training")
        return self.training

    def layer_index(self) -> fx.Node:
        """The layer index inside the stack, read from the module so that layers share the graph."""
        if self.layer is None:
            self.layer = self.graph.create_node("get_attr", LAYER_ATTR, name="layer")
        return self.layer

    def seed_node(self) -> fx.Node:
        if self.seed is None:
            self.seed = self.fn(draw_seed, (self.training_flag(),), wrapped=True)
        return self.seed


def build_graph(block: Block, sizes: Sizes, *, mode: str = "train", donated: bool = False,
                check: bool = False, program: Program | None = None, backend: Backend = FX) -> GraphBuilder:
    """The graph of one block; ``check`` starts it with :func:`check_inputs`."""
    b = GraphBuilder(block, sizes, inplace_adds(block, donated) if mode == "infer" else None, backend)
    params = parameter_names(block)
    inputs = []
    for op, name in zip(block.inputs, params):
        # the checked root gives each input a default and takes any further ones, so that a call with too
        # few or too many reaches check_inputs and is reported there instead of as Python's TypeError
        default = (Missing.INPUT,) if check else ()
        inputs.append(b.bind(op.result, b.graph.create_node("placeholder", name, default, name=name)))
    extra = b.graph.create_node("placeholder", "*extra", name="extra") if check else None
    raw_ctx = b.graph.create_node("placeholder", "**ctx", name="ctx")
    b.ctx = b.fn(context, (raw_ctx,))
    if check:
        contract = b.graph.create_node("get_attr", CONTRACT_ATTR, name="contract")
        b.fn(check_inputs, (contract, input_specs(block, sizes, program), b.ctx, extra, *inputs), wrapped=True)
    for op in block.ops:
        b.lower(op)
    return b
