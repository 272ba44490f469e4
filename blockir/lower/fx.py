"""IR → a tree of torch.fx.GraphModules, built node by node from the ops (no tracing).

Every compiled block is a :class:`BlockModule` (an ``fx.GraphModule``).
Declarations become submodules or parameters at their declared (dotted)
names, so ``state_dict()`` keys are the declared names. Branches, sub-blocks
and the layers of a stack are called with ``call_module`` nodes; a stack is
an ``nn.ModuleList`` (``layers.0 … layers.N-1``). SSA names become node
names; the mapping is kept on the module (``blockir_values``) so
:func:`blockir.trace` can return every intermediate by its IR name.

The forward's keyword arguments (``ctx``: masks, position embeddings) reach
every branch, sub-block, stack and bound extern: their ``call_module`` nodes
carry the context under the keyword ``"**"``, which :class:`BlockCodeGen`
prints as ``**context``. A bound extern is a ``BoundExtern`` module at its
declared path, which shares the bound module's parameter tables (so its keys
are the user's) and calls ``adapter(module, *inputs, **ctx)``.

One graph is built per distinct block — per block, mode and value of the
constants its ops read — and its code is generated once: the layers of a
stack are instances of one generated class that share the graph until one of
them asks for it (``.graph`` hands each instance a private copy on first use,
and ``recompile`` moves that instance to a class of its own). The layer index
is an attribute (``blockir_layer``) read by the graph, not a constant in it.
"""
from __future__ import annotations

import builtins
import copy
import keyword
import operator
import re
import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
from torch import nn

from blockir.analyses.hypersphere import sphere_parameters
from blockir.analyses.keys import SINGLE
from blockir.norms import family
from blockir.analyses.sizes import Sizes
from blockir.lower.layers import numerics
from blockir.lower.boundary import (TORCH_DTYPES, CallContract, Keywords, Missing, accepted, check_inputs,
                                      context_of, input_specs, placed_contract, union)
from blockir.lower.layers.modules import bound_extern, kind_factory
from blockir.lower.rng import dropout_key
from blockir.diagnostics import BlockError, Span, error
from blockir.ir import consts as C
from blockir import ops as O
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.types import TensorType

SEED_HIGH = 1 << 62
SPLAT = "**"  # the keyword under which a node passes the whole context on; printed as **ctx
LAYER_ATTR = "blockir_layer"
CONTRACT_ATTR = "blockir_contract"  # the root's CallContract, read by its input check

# Lowering of ops that need more than one node; registered by the fused backend.
OpLowering = Callable[["GraphBuilder", Any], fx.Node]
EXTRA_LOWERINGS: dict[type, OpLowering] = {}


def context(ctx: Any) -> dict[str, Any]:
    """The keyword context a block hands to its branches, sub-blocks and externs.

    Generated code calls this once on its ``**ctx``. Under ``fx.Interpreter``
    (non-strict ``torch.export``) a ``**ctx`` placeholder is bound to a list and
    under ``torch.fx.symbolic_trace`` to a Proxy: both mean "no context". A parent
    run by an interpreter passes its context as the single keyword ``"**"``.
    """
    if type(ctx) is not dict:
        return {}
    if SPLAT in ctx:
        inner = ctx[SPLAT]
        rest = {k: v for k, v in ctx.items() if k != SPLAT}
        return {**(inner if type(inner) is dict else {}), **rest}
    return ctx


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


class Stack(nn.ModuleList):
    """The layers of a stack ``name: Block * N``: an ``nn.ModuleList`` whose forward runs them in order.

    Its items are the compiled layers (``m.layers[3]``, keys ``layers.3.…``); each receives the
    previous one's output, the stack's other inputs (a decoder's ``memory``) and the context.
    A layer with ``carried`` results returns a tuple whose item i becomes input i of the next layer.
    """

    carried = 1

    @property
    def blockir_context(self) -> Keywords:
        """The context keywords its layers read."""
        return union(context_of(layer) for layer in self)

    def forward(self, x: torch.Tensor, *rest: torch.Tensor, **ctx: Any) -> Any:
        if self.carried > 1:
            return self.thread(lambda i, layer, *inputs: layer(*inputs, **ctx), x, *rest)
        for layer in self:
            x = layer(x, *rest, **ctx)
        return x

    def thread(self, call: Callable[..., Any], *inputs: Any) -> Any:
        """Run ``call(i, layer, *inputs)`` layer by layer, each layer's carried results replacing its first inputs."""
        if self.carried == 1:
            x, *rest = inputs
            for i, layer in enumerate(self):
                x = call(i, layer, x, *rest)
            return x
        streams, rest = inputs[:self.carried], inputs[self.carried:]
        for i, layer in enumerate(self):
            streams = tuple(call(i, layer, *streams, *rest))
        return streams


# ---------------------------------------------------------------- code generation

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
class _Code:
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


def _generate(name: str, graph: fx.Graph, values: dict[str, str],
              consts: tuple[tuple[C.ConstExpr, float | int], ...]) -> _Code:
    cls = type(name, (BlockModule,), {"_blockir_shared": True, "__module__": BlockModule.__module__})
    template = object.__new__(cls)
    nn.Module.__init__(template)
    template.__dict__["_graph"] = graph
    fx.GraphModule.recompile(template)  # installs forward and __call__ on the shared class
    state = {k: template.__dict__[k] for k in ("_code", "_lineno_map", "_prologue_start") if k in template.__dict__}
    return _Code(cls, graph, state, values, consts)


# ---------------------------------------------------------------- graph building


def _single_numbers(path: str, value: nn.Module | nn.Parameter) -> list[tuple[str, torch.Size]]:
    """(path, shape) of the one-element parameters a declaration registers directly (a ``scalar``,
    DyT's ``alpha``, ScaleNorm's ``scale``), whose checkpoints store them 0-d or as ``[1]``."""
    if isinstance(value, nn.Parameter):
        return [(path, value.shape)] if value.shape in SINGLE else []
    return [(f"{path}.{name}", p.shape) for name, p in value._parameters.items()
            if p is not None and p.shape in SINGLE]


def _reshape_single(single: tuple[tuple[str, torch.Size], ...], module: nn.Module, state_dict: dict[str, Any],
                    prefix: str, *_: Any) -> None:
    """Load-time hook: give a one-number checkpoint tensor the shape of its parameter, 0-d or ``[1]``."""
    for path, shape in single:
        value = state_dict.get(prefix + path)
        if isinstance(value, torch.Tensor) and value.shape != shape and value.shape in SINGLE:
            state_dict[prefix + path] = value.reshape(shape)


def set_nested(root: nn.Module, dotted: str, value: nn.Module | nn.Parameter, span: Span | None = None) -> None:
    """Install a module or parameter at a dotted path, creating plain containers on the way.

    ``check`` refuses the names torch itself defines; one that another library added to
    ``nn.Module`` at run time is reported here (E0709), located at ``span``. The check is done
    here rather than by ``add_module``, whose ``hasattr`` raises and catches an AttributeError
    for every new name, which a deep stack pays thousands of times.
    """
    *path, leaf = dotted.split(".")
    owner = root
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            _free(owner, part, dotted, span)
            child = nn.Module()
            setattr(owner, part, child)
        owner = child
    _free(owner, leaf, dotted, span)
    setattr(owner, leaf, value)  # nn.Module.__setattr__ registers the module or parameter


def _free(owner: nn.Module, name: str, dotted: str, span: Span | None) -> None:
    """Refuse a name that is already an attribute of ``owner`` (what ``add_module`` refuses)."""
    if name in vars(owner) or hasattr(type(owner), name):
        message = f"attribute '{name}' already exists"
        if span is None:
            raise KeyError(message)
        raise BlockError([error("E0709", f"declaration '{dotted}' cannot be registered: {message}", span,
                                hint="rename the declaration")])


def site_id(ssa: str) -> int:
    """A dropout site's RNG identity: a hash of its value name, stable under fusion and reordering."""
    return zlib.crc32(ssa.encode())


# no value can be called layer_drop (a built-in name), so no dropout site shares this identity
LAYER_DROP_SITE = site_id("layer_drop")


def node_name(ssa: str) -> str:
    """A Python identifier for an SSA name: %3 → t3, and inlined layers.0.%3 → layers_0_t3.

    fx makes the name unique and renames Python keywords and builtins; names the generated
    forward uses itself (``self``, ``ctx``) get a trailing underscore.
    """
    *path, leaf = ssa.split(".")
    leaf = f"t{leaf[1:]}" if leaf.startswith("%") else leaf
    name = "_".join([*path, leaf])
    return f"{name}_" if name in _OWN_NAMES else name


_OWN_NAMES = frozenset({"self", "ctx"})
# globals the generated code may refer to, besides builtins; a parameter must not shadow them
_CODE_GLOBALS = frozenset({"torch", "inf", "nan", "device", "fx_pytree", "pytree", "NoneType", "operator"})


def _parameter_names(block: Block) -> list[str]:
    """The forward's parameter names: the input names, made safe Python identifiers and unique.

    A name that is a keyword, a builtin, a global of the generated code or ``self``/``ctx``
    gets a trailing underscore (``class`` → ``class_``); IR names and traces keep the input's name.
    """
    out: list[str] = []
    for op in block.inputs:
        name = op.result.replace(".", "_")
        if keyword.iskeyword(name) or name in vars(builtins) or name in _OWN_NAMES or name in _CODE_GLOBALS \
                or name.startswith("__"):
            name = f"{name.strip('_') or 'input'}_"
        while name in out:
            name += "_"
        out.append(name)
    return out


class GraphBuilder:
    """Emits fx nodes for one block; ``env`` maps SSA names to nodes.

    Constants are read through :meth:`value`, which records each expression and its
    value: a later layer whose constants evaluate the same reuses the graph.
    """

    def __init__(self, block: Block, sizes: Sizes, inplace: dict[int, str] | None = None):
        self.block = block
        self.inplace = inplace or {}  # id(add) → the operand whose buffer it overwrites
        self.sizes = sizes
        self.graph = fx.Graph()
        self.graph.set_codegen(BlockCodeGen())
        self.env: dict[str, fx.Node] = {}
        self.names: dict[str, str] = {}
        self.consts: list[tuple[C.ConstExpr, float | int]] = []
        self.ctx: fx.Node | None = None
        self.seed: fx.Node | None = None
        self.training: fx.Node | None = None
        self.layer: fx.Node | None = None

    def value(self, expr: C.ConstExpr) -> float | int:
        v = self.sizes.value(expr)
        self.consts.append((expr, v))
        return v

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

    def module(self, target: str, args: tuple, ssa: str | None, with_ctx: bool) -> fx.Node:
        """A call_module node; ``with_ctx`` passes the forward's keyword context on (``**ctx``)."""
        kwargs = {SPLAT: self.ctx} if with_ctx else {}
        name = node_name(ssa) if ssa else target.replace(".", "_")
        node = self.graph.create_node("call_module", target, args, kwargs, name=name)
        return self.bind(ssa, node) if ssa else node

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

    def dropout(self, x: fx.Node, p: float, mask: str, ssa: str) -> fx.Node:
        if p == 0.0:
            return self.bind(ssa, x)
        return self.fn(dropout_site, (x, p, mask, self.training_flag(), self.seed_node(), self.layer_index(),
                                      site_id(ssa)), ssa, wrapped=True)


def _batch_coupled(block: Block, name: str) -> bool:
    decl = block.decl_map[name]
    return isinstance(decl, KindDecl) and family(decl).batch_coupled


def _lower_op(b: GraphBuilder, op: O.Op) -> None:
    decls = b.block.decl_map
    if isinstance(op, O.NormOp):
        # a batch-coupled norm reads the padding mask from the context
        b.module(op.decl, (b.env[op.operand],), op.result, with_ctx=_batch_coupled(b.block, op.decl))
    elif isinstance(op, O.CallOp):
        args = tuple(b.env[a] for a in op.args)
        decl = decls[op.decl]
        ssa = None if op.more else op.result  # a call with carried results returns a tuple, taken apart below
        if isinstance(decl, KindDecl):
            node = b.module(op.decl, args, ssa, with_ctx=decl.category not in ("linear", "activation"))
        elif isinstance(decl, InstanceDecl) and decl.count is not None:
            b.value(decl.count)  # the number of layers is part of what the graph was built for
            node = b.module(op.decl, args, ssa, with_ctx=True)
        else:  # a sub-block, or an extern: its BoundExtern calls the adapter
            node = b.module(op.decl, args, ssa, with_ctx=True)
        for i, r in enumerate(op.results if op.more else ()):
            b.fn(operator.getitem, (node, i), r)
    elif isinstance(op, O.ZerosOp):
        b.fn(zeros_of, (b.env[b.block.inputs[0].result], _runtime_sizes(b, op.type)), op.result, wrapped=True)
    elif isinstance(op, O.ActivationOp):
        b.fn(numerics.ACTIVATIONS[op.fn], (b.env[op.operand],), op.result)
    elif isinstance(op, O.LayerDropOp):
        p = float(b.value(op.p))
        if p == 0.0:
            b.bind(op.result, b.env[op.operand])
        else:
            b.fn(layer_drop_site, (b.env[op.operand], p, b.training_flag(), b.seed_node(), b.layer_index()),
                 op.result, wrapped=True)
    elif isinstance(op, O.DropoutOp):
        b.dropout(b.env[op.operand], float(b.value(op.p)), op.mask, op.result)
    elif isinstance(op, O.ScaleOp):
        factor = b.attr(op.param) if op.param is not None else float(b.value(op.factor))  # type: ignore[arg-type]
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
    elif isinstance(op, O.SubOp):
        b.fn(operator.sub, (b.env[op.lhs], b.env[op.rhs]), op.result)
    elif isinstance(op, O.AddOp):
        target = b.inplace.get(id(op))
        if target is None:
            b.fn(operator.add, (b.env[op.lhs], b.env[op.rhs]), op.result)
        else:
            other = op.rhs if target == op.lhs else op.lhs
            b.fn(inplace_add, (b.env[target], b.env[other]), op.result, wrapped=True)
    elif isinstance(op, O.CastOp):
        node = b.graph.create_node("call_method", "to", (b.env[op.operand], TORCH_DTYPES[op.dtype]), {},
                                   name=node_name(op.result))
        b.bind(op.result, node)
    elif isinstance(op, O.ConcatOp):
        b.fn(torch.cat, (tuple(b.env[a] for a in op.args),), op.result, {"dim": -1})
    elif isinstance(op, O.OutputOp):
        b.graph.output(tuple(b.env[v] for v in op.values) if op.more else b.env[op.value])
    elif type(op) in EXTRA_LOWERINGS:
        EXTRA_LOWERINGS[type(op)](b, op)
    else:
        raise BlockError([error("E0705", f"the fx backend cannot lower {type(op).__name__}", op.span)])


def zeros_of(template: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Zeros in the dtype and on the device of ``template`` (the block's first input)."""
    return template.new_zeros(sizes, dtype=template.dtype if template.is_floating_point() else None)


def _runtime_sizes(b: GraphBuilder, t: TensorType) -> tuple[Any, ...]:
    """Each axis's size: read from an input that has the axis (batch and sequence vary per call), else declared."""
    out: list[Any] = []
    for axis in t.names:
        source = next(((op.result, p.names.index(axis)) for op in b.block.inputs if axis in (p := op.type).names),
                      None)
        if source is None:
            out.append(b.sizes.dim(axis))
        else:
            out.append(b.graph.create_node("call_method", "size", (b.env[source[0]], source[1]), {}))
    return tuple(out)


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


def build_graph(block: Block, sizes: Sizes, *, mode: str = "train", donated: bool = False,
                check: bool = False, program: Program | None = None) -> GraphBuilder:
    """The graph of one block; ``check`` starts it with :func:`check_inputs`."""
    b = GraphBuilder(block, sizes, _inplace_adds(block, donated) if mode == "infer" else None)
    params = _parameter_names(block)
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
        if not isinstance(op, O.InputOp):
            _lower_op(b, op)
    return b


@dataclass
class Lowering:
    """One compilation: the program, its sizes and binds, and the graphs built so far."""

    program: Program
    sizes: Sizes
    bind: Mapping[str, Any]
    act_dtype: torch.dtype | None = None
    mode: str = "train"
    codes: dict[tuple, list[_Code]] = field(default_factory=dict)
    input_types: dict[str, dict[str, Any]] = field(default_factory=dict)
    factories: dict[tuple, Callable[[], nn.Module | nn.Parameter]] = field(default_factory=dict)
    reads_layer: dict[tuple[str, str], bool] = field(default_factory=dict)
    probe: str | None = None  # the first parameter at the activation dtype: the module's dtype and device

    def code(self, block: Block, s: Sizes, donated: bool, check: bool) -> _Code:
        """The generated class for ``block`` under sizes ``s``: reused when its constants agree."""
        candidates = self.codes.setdefault((block.name, donated, check), [])
        for code in candidates:
            if all(type(v) is type(w := s.value(e)) and v == w for e, v in code.consts):
                return code
        b = build_graph(block, s, mode=self.mode, donated=donated, check=check, program=self.program)
        code = _generate(block.name, b.graph, dict(b.names), tuple(b.consts))
        candidates.append(code)
        return code

    def factory(self, block: Block, d: KindDecl, s: Sizes) -> Callable[[], nn.Module | nn.Parameter]:
        """The constructor of declaration ``d`` under sizes ``s``, shared by the layers it agrees across.

        Within one compilation the dims are fixed, so the arguments depend on the layer only
        through ``num_layers``, the block's constants, and ``layer`` where an argument names it.
        """
        reads_layer = self.reads_layer.get((block.name, d.name))
        if reads_layer is None:
            reads_layer = self.reads_layer[(block.name, d.name)] = any(
                C.LAYER in C.names_in(v) for _, v in d.args if isinstance(v, (C.Num, C.Name, C.Bin, C.Neg)))
        env = s.env
        key = (block.name, d.name, env[C.NUM_LAYERS], env[C.LAYER] if reads_layer else None,
               tuple((type(env[c.name]), env[c.name]) for c in block.consts))
        build = self.factories.get(key)
        if build is None:
            build = self.factories[key] = kind_factory(d, self.input_type(block, d.name), s)
        return build

    def input_type(self, block: Block, decl: str):
        types = self.input_types.get(block.name)
        if types is None:
            types = self.input_types[block.name] = {d.name: _first_input_type(block, d.name) for d in block.decls}
        return types[decl]

    def _probe(self, path: str, value: nn.Module | nn.Parameter) -> None:
        if self.probe is not None:
            return
        if isinstance(value, nn.Parameter):
            self.probe = path if value.is_floating_point() else None
            return
        self.probe = next((f"{path}.{k}" for k, p in value.named_parameters() if p.is_floating_point()), None)

    def block(self, block: Block, *, layer: int = 0, num_layers: int = 1, prefix: str = "",
              donated: bool = False, check: bool = False) -> BlockModule:
        s = self.sizes.for_block(block, layer, num_layers)
        infer = self.mode == "infer"
        root = self.code(block, s, donated, check).instance(block.name, layer)
        single: list[tuple[str, torch.Size]] = []
        for d in block.decls:
            if isinstance(d, KindDecl):
                input_type = self.input_type(block, d.name)
                declared = TORCH_DTYPES[input_type.dtype] if input_type is not None and input_type.dtype else None
                value = _placed(self.factory(block, d, s)(), declared or self.act_dtype)
                set_nested(root, d.name, value, d.span)
                if declared is None:
                    self._probe(prefix + d.name, value)
                single += _single_numbers(d.name, value)
            elif isinstance(d, ExternDecl):
                path = prefix + d.name  # looked up directly: a deep stack binds thousands of paths
                bound = {d.name: self.bind[path]} if path in self.bind else {}
                extern = _placed(bound_extern(d, bound, s), self.act_dtype)
                set_nested(root, d.name, extern, d.span)
                self._probe(prefix + d.name, extern)
            elif d.count is None:
                set_nested(root, d.name, self.block(self.program.block(d.block), prefix=f"{prefix}{d.name}.",
                                                    donated=infer and _donates_to(block, d.name, donated)), d.span)
            else:
                n = int(s.value(d.count))
                first = infer and _donates_to(block, d.name, donated)
                sub = self.program.block(d.block)
                stack = Stack(self.block(sub, layer=i, num_layers=n, prefix=f"{prefix}{d.name}.{i}.",
                                         donated=first if i == 0 else infer) for i in range(n))
                if sub.more_results:
                    stack.carried = len(sub.results)
                set_nested(root, d.name, stack, d.span)
        if single:
            root.register_load_state_dict_pre_hook(partial(_reshape_single, tuple(single)))
        sphere = sphere_parameters(block)
        if sphere:  # nGPT: the matrices the optimizer-step projection normalizes, and along which axis
            root.blockir_sphere = sphere
        return root


def lower_block(program: Program, block: Block, sizes: Sizes, bind: Mapping[str, Any], *,
                layer: int = 0, num_layers: int = 1, prefix: str = "",
                act_dtype: torch.dtype | None = None, mode: str = "train", donated: bool = False,
                check: bool = False) -> BlockModule:
    """Build the module tree and the graph of one block (recursing into sub-blocks and stacks).

    A declaration's parameters take the dtype of the value it is applied to when the IR states
    one (a bf16 branch inside an f32 residual stream), else ``act_dtype``. In ``mode="infer"``
    the residual adds that the liveness plan allows write over their shortcut's buffer; inputs
    are overwritten only when ``donated`` (a stack donates each layer's output to the next).
    ``check`` makes the forward check its inputs against the block's declared axes.
    """
    lowering = Lowering(program, sizes, bind, act_dtype, mode)
    root = lowering.block(block, layer=layer, num_layers=num_layers, prefix=prefix, donated=donated, check=check)
    if check:
        contract = CallContract(block.name, block.span.filename, block.span.line, block.span.column,
                                tuple(p.name for p in block.params), accepted(root.blockir_context),
                                probe=lowering.probe)
        root.__dict__[CONTRACT_ATTR] = placed_contract(root, contract)
    return root
