"""IR → torch.fx.GraphModule, built node by node from the ops (no tracing).

Declarations become submodules or parameters at their declared (dotted)
names, so ``state_dict()`` keys are the declared names; stacks become
``name.0 … name.N-1``. SSA names become node names; the mapping is kept on
the module (``blockir_values``) so :func:`blockir.trace` can return every
intermediate by its IR name.
"""
from __future__ import annotations

import operator
import zlib
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
from torch import nn

from blockir.backends import numerics
from blockir.backends.modules import bound_extern, make_kind
from blockir.backends.rng import dropout_key
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir import ops as O
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.types import DType

TORCH_DTYPES = {DType.F64: torch.float64, DType.F32: torch.float32, DType.F16: torch.float16,
                DType.BF16: torch.bfloat16}
SEED_HIGH = 1 << 62

# Lowering of ops that need more than one node; registered by the fused backend.
OpLowering = Callable[["GraphBuilder", Any], fx.Node]
EXTRA_LOWERINGS: dict[type, OpLowering] = {}


def _kwargs(ctx: Any) -> dict[str, Any]:
    # fx.Interpreter (used by non-strict torch.export) binds a `**ctx` placeholder to an empty list
    return ctx if isinstance(ctx, dict) else {}


def invoke(module: nn.Module, ctx: dict[str, Any], *args: torch.Tensor) -> torch.Tensor:
    """Call a branch or sub-block with the forward's extra keyword arguments."""
    return module(*args, **_kwargs(ctx))


def inplace_add(target: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """A residual add written over the shortcut's buffer, as the inference buffer plan allows.

    With autograd recording, the overwritten value could still be needed for backward, so the
    add falls back to a fresh tensor: an inference module stays correct when called with grad.
    """
    if torch.is_grad_enabled():
        return target + other
    return target.add_(other)


def draw_seed(training: bool) -> torch.Tensor:
    """One draw from torch's generator per forward; replayed by checkpointing's RNG-state restore."""
    if not training:
        return torch.zeros((), dtype=torch.int64)
    return torch.randint(0, SEED_HIGH, (), dtype=torch.int64)


def dropout_site(x: torch.Tensor, p: float, mask: str, training: bool, seed: torch.Tensor,
                 layer: int, site: int) -> torch.Tensor:
    """Inverted dropout whose mask is a function of (seed, layer, site, row, col)."""
    if not training or p == 0.0:
        return x
    return numerics.dropout(x, p, mask, training, dropout_key(seed, layer, site))


def layer_drop_site(x: torch.Tensor, p: float, training: bool, seed: torch.Tensor, layer: int) -> torch.Tensor:
    """LayerDrop keyed by (seed, layer) only: every ``layer_drop`` of one layer shares the draw."""
    if not training or p == 0.0:
        return x
    return numerics.layer_drop(x, p, training, dropout_key(seed, layer, LAYER_DROP_SITE))


def set_nested(root: nn.Module, dotted: str, value: nn.Module | nn.Parameter) -> None:
    """Install a module or parameter at a dotted path, creating plain containers on the way."""
    *path, leaf = dotted.split(".")
    owner = root
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            child = nn.Module()
            owner.add_module(part, child)
        owner = child
    if isinstance(value, nn.Parameter):
        owner.register_parameter(leaf, value)
    else:
        owner.add_module(leaf, value)


def site_id(ssa: str) -> int:
    """A dropout site's RNG identity: a hash of its value name, stable under fusion and reordering."""
    return zlib.crc32(ssa.encode())


# no value can be called layer_drop (a built-in name), so no dropout site shares this identity
LAYER_DROP_SITE = site_id("layer_drop")


def node_name(ssa: str) -> str:
    """A Python identifier for an SSA name: %3 → t3, and inlined layers.0.%3 → layers_0_t3."""
    *path, leaf = ssa.split(".")
    leaf = f"t{leaf[1:]}" if leaf.startswith("%") else leaf
    return "_".join([*path, leaf])


class GraphBuilder:
    """Emits fx nodes for one block; ``env`` maps SSA names to nodes."""

    def __init__(self, block: Block, sizes: Sizes, layer: int, inplace: dict[int, str] | None = None):
        self.block = block
        self.inplace = inplace or {}  # id(add) → the operand whose buffer it overwrites
        self.sizes = sizes
        self.layer = layer
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}
        self.names: dict[str, str] = {}
        self.ctx: fx.Node | None = None
        self.seed: fx.Node | None = None
        self.training: fx.Node | None = None

    def bind(self, ssa: str, node: fx.Node) -> fx.Node:
        self.env[ssa] = node
        self.names[ssa] = node.name
        return node

    def fn(self, target: Callable[..., Any], args: tuple, ssa: str | None = None, kwargs: dict | None = None) -> fx.Node:
        node = self.graph.create_node("call_function", target, args, kwargs or {},
                                      name=node_name(ssa) if ssa else None)
        return self.bind(ssa, node) if ssa else node

    def attr(self, target: str) -> fx.Node:
        return self.graph.get_attr(target)

    def training_flag(self) -> fx.Node:
        if self.training is None:
            self.training = self.graph.create_node("get_attr", "training", name="training")
        return self.training

    def seed_node(self) -> fx.Node:
        if self.seed is None:
            self.seed = self.fn(draw_seed, (self.training_flag(),))
        return self.seed

    def dropout(self, x: fx.Node, p: float, mask: str, ssa: str) -> fx.Node:
        if p == 0.0:
            return self.bind(ssa, x)
        return self.fn(dropout_site, (x, p, mask, self.training_flag(), self.seed_node(), self.layer, site_id(ssa)),
                       ssa)


def _lower_op(b: GraphBuilder, op: O.Op) -> None:
    decls = b.block.decl_map
    if isinstance(op, O.InputOp):
        b.bind(op.result, b.graph.placeholder(op.result))
    elif isinstance(op, O.NormOp):
        b.bind(op.result, b.graph.create_node("call_module", op.decl, (b.env[op.operand],), {},
                                              name=node_name(op.result)))
    elif isinstance(op, O.CallOp):
        args = tuple(b.env[a] for a in op.args)
        decl = decls[op.decl]
        if isinstance(decl, KindDecl) and decl.category in ("linear", "activation"):
            b.bind(op.result, b.graph.create_node("call_module", op.decl, args, {}, name=node_name(op.result)))
        elif isinstance(decl, InstanceDecl) and decl.count is not None:
            x = args[0]
            count = int(b.sizes.value(decl.count))
            for i in range(count):
                x = b.fn(invoke, (b.attr(f"{op.decl}.{i}"), b.ctx, x, *args[1:]),
                         op.result if i == count - 1 else None)
        else:
            b.fn(invoke, (b.attr(op.decl), b.ctx, *args), op.result)
    elif isinstance(op, O.ActivationOp):
        b.fn(numerics.ACTIVATIONS[op.fn], (b.env[op.operand],), op.result)
    elif isinstance(op, O.LayerDropOp):
        p = float(b.sizes.value(op.p))
        if p == 0.0:
            b.bind(op.result, b.env[op.operand])
        else:
            b.fn(layer_drop_site, (b.env[op.operand], p, b.training_flag(), b.seed_node(), b.layer), op.result)
    elif isinstance(op, O.DropoutOp):
        b.dropout(b.env[op.operand], float(b.sizes.value(op.p)), op.mask, op.result)
    elif isinstance(op, O.ScaleOp):
        factor = b.attr(op.param) if op.param is not None else float(b.sizes.value(op.factor))  # type: ignore[arg-type]
        offset = decls[op.param].arg("offset", 0) if op.param is not None else 0  # type: ignore[union-attr]
        if offset:
            factor = b.fn(numerics.offset_weight, (factor, offset))
        b.fn(operator.mul, (factor, b.env[op.operand]), op.result)
    elif isinstance(op, O.BiasOp):
        b.fn(operator.add, (b.env[op.operand], b.attr(op.param)), op.result)
    elif isinstance(op, O.MulOp):
        b.fn(operator.mul, (b.env[op.lhs], b.env[op.rhs]), op.result)
    elif isinstance(op, O.ComplementOp):
        b.fn(numerics.complement, (b.env[op.operand],), op.result)
    elif isinstance(op, O.AddOp):
        target = b.inplace.get(id(op))
        if target is None:
            b.fn(operator.add, (b.env[op.lhs], b.env[op.rhs]), op.result)
        else:
            other = op.rhs if target == op.lhs else op.lhs
            b.fn(inplace_add, (b.env[target], b.env[other]), op.result)
    elif isinstance(op, O.CastOp):
        node = b.graph.create_node("call_method", "to", (b.env[op.operand], TORCH_DTYPES[op.dtype]), {},
                                   name=node_name(op.result))
        b.bind(op.result, node)
    elif isinstance(op, O.ConcatOp):
        b.fn(torch.cat, (tuple(b.env[a] for a in op.args),), op.result, {"dim": -1})
    elif isinstance(op, O.OutputOp):
        b.graph.output(b.env[op.value])
    elif type(op) in EXTRA_LOWERINGS:
        EXTRA_LOWERINGS[type(op)](b, op)
    else:
        raise BlockError([error("E0705", f"the fx backend cannot lower {type(op).__name__}", op.span)])


def _first_input_type(block: Block, decl: str):
    for op in block.ops:
        if getattr(op, "decl", None) == decl and op.operands:
            return block.type_of(op.operands[0])
    return None


def _placed(value: nn.Module | nn.Parameter, dtype: torch.dtype | None) -> nn.Module | nn.Parameter:
    if dtype is None:
        return value
    if isinstance(value, nn.Parameter):
        return nn.Parameter(value.detach().to(dtype))
    return value.to(dtype)


def _origin(block: Block, value: str) -> str:
    """Follow values that are the identity in inference (dropout, cast) back to their source."""
    op = block.producers.get(value)
    while isinstance(op, (O.DropoutOp, O.CastOp)):
        value = op.operand
        op = block.producers.get(value)
    return value


def _owned(block: Block, value: str, donated: bool) -> bool:
    """May this block overwrite ``value``? Its inputs only when the caller donated them."""
    return donated or _origin(block, value) not in {op.result for op in block.inputs}


def _inplace_adds(block: Block, donated: bool) -> dict[int, str]:
    from blockir.analyses.liveness import plan  # the inference buffer plan decides; this only applies it
    return {id(d.op): d.target for d in plan(block, "infer").adds
            if d.inplace and isinstance(d.op, O.AddOp) and _owned(block, d.target, donated)}


def _donates_to(block: Block, decl: str, donated: bool) -> bool:
    """Whether the value passed to sub-block/stack ``decl`` is dead afterwards and owned here."""
    calls = [(i, op) for i, op in enumerate(block.ops) if getattr(op, "decl", None) == decl]
    if len(calls) != 1:
        return False
    index, call = calls[0]
    arg = call.operands[0]
    later = any(arg in op.operands for op in block.ops[index + 1:])
    return not later and _owned(block, arg, donated)


def lower_block(program: Program, block: Block, sizes: Sizes, bind: Mapping[str, Any], *,
                layer: int = 0, num_layers: int = 1, prefix: str = "",
                act_dtype: torch.dtype | None = None, mode: str = "train", donated: bool = False) -> fx.GraphModule:
    """Build the module tree and the graph of one block (recursing into sub-blocks and stacks).

    A declaration's parameters take the dtype of the value it is applied to when the IR states
    one (a bf16 branch inside an f32 residual stream), else ``act_dtype``. In ``mode="infer"``
    the residual adds that the liveness plan allows write over their shortcut's buffer; inputs
    are overwritten only when ``donated`` (a stack donates each layer's output to the next).
    """
    s = sizes.for_block(block, layer, num_layers)
    root = nn.Module()
    sub = dict(act_dtype=act_dtype, mode=mode)
    infer = mode == "infer"
    for d in block.decls:
        if isinstance(d, KindDecl):
            input_type = _first_input_type(block, d.name)
            declared = TORCH_DTYPES[input_type.dtype] if input_type is not None and input_type.dtype else None
            set_nested(root, d.name, _placed(make_kind(d, input_type, s), declared or act_dtype))
        elif isinstance(d, ExternDecl):
            set_nested(root, d.name, _placed(bound_extern(d, {k[len(prefix):]: v for k, v in bind.items()
                                                              if k.startswith(prefix)}, s), act_dtype))
        elif d.count is None:
            set_nested(root, d.name, lower_block(program, program.block(d.block), sizes, bind,
                                                 prefix=f"{prefix}{d.name}.",
                                                 donated=infer and _donates_to(block, d.name, donated), **sub))
        else:
            n = int(s.value(d.count))
            first = infer and _donates_to(block, d.name, donated)
            layers = nn.ModuleList(lower_block(program, program.block(d.block), sizes, bind, layer=i,
                                               num_layers=n, prefix=f"{prefix}{d.name}.{i}.",
                                               donated=first if i == 0 else infer, **sub)
                                   for i in range(n))
            set_nested(root, d.name, layers)
    b = GraphBuilder(block, s, layer, _inplace_adds(block, donated) if infer else None)
    for op in block.inputs:
        _lower_op(b, op)
    b.ctx = b.graph.placeholder("**ctx")
    for op in block.ops:
        if not isinstance(op, O.InputOp):
            _lower_op(b, op)
    gm = fx.GraphModule(root, b.graph, class_name=block.name)
    gm.blockir_values = dict(b.names)
    gm.blockir_block = block.name
    return gm
