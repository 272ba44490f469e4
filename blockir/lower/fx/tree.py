"""The module tree of a compiled block: declarations at their dotted names, sub-blocks and stacks.

Declarations become submodules or parameters at their declared (dotted) names, so
``state_dict()`` keys are the declared names. A stack is a :class:`Stack` (``layers.0 … layers.N-1``);
a bound extern is a ``BoundExtern`` module at its declared path, which shares the bound module's
parameter tables (so its keys are the user's). Each block's graph comes from
:func:`blockir.lower.fx.builder.build_graph`, generated once per distinct block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping

import torch
from torch import nn

from blockir.analyses.hypersphere import sphere_parameters
from blockir.analyses.keys import SINGLE
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, Span, error
from blockir.ir import consts as C
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.lower.boundary import TORCH_DTYPES, CallContract, Keywords, accepted, context_of, placed_contract, union
from blockir.lower.declared import declared as recorded
from blockir.lower.fx import module as generated
from blockir.lower.fx.builder import FX, Backend, build_graph
from blockir.lower.fx.inplace import donates_to
from blockir.lower.fx.module import CONTRACT_ATTR, BlockModule, Code
from blockir.lower.layers.modules import bound_extern, kind_factory


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


@dataclass
class Lowering:
    """One compilation: the program, its sizes and binds, and the graphs built so far."""

    program: Program
    sizes: Sizes
    bind: Mapping[str, Any]
    act_dtype: torch.dtype | None = None
    mode: str = "train"
    backend: Backend = FX
    codes: dict[tuple, list[Code]] = field(default_factory=dict)
    input_types: dict[str, dict[str, Any]] = field(default_factory=dict)
    factories: dict[tuple, Callable[[], nn.Module | nn.Parameter]] = field(default_factory=dict)
    reads_layer: dict[tuple[str, str], bool] = field(default_factory=dict)
    probe: str | None = None  # the first parameter at the activation dtype: the module's dtype and device

    def code(self, block: Block, s: Sizes, donated: bool, check: bool) -> Code:
        """The generated class for ``block`` under sizes ``s``: reused when its constants agree."""
        candidates = self.codes.setdefault((block.name, donated, check), [])
        for code in candidates:
            if all(type(v) is type(w := s.value(e)) and v == w for e, v in code.consts):
                return code
        b = build_graph(block, s, mode=self.mode, donated=donated, check=check, program=self.program,
                        backend=self.backend)
        code = generated.generate(block.name, b.graph, dict(b.names), tuple(b.consts))
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
                                                    donated=infer and donates_to(block, d.name, donated)), d.span)
            else:
                n = int(s.value(d.count))
                first = infer and donates_to(block, d.name, donated)
                sub = self.program.block(d.block)
                stack = Stack(self.block(sub, layer=i, num_layers=n, prefix=f"{prefix}{d.name}.{i}.",
                                         donated=first if i == 0 else infer) for i in range(n))
                if sub.more_results:
                    stack.carried = len(sub.results)
                set_nested(root, d.name, stack, d.span)
        root.__dict__.update(recorded(self.program, block, s.known))
        if single:
            root.register_load_state_dict_pre_hook(partial(_reshape_single, tuple(single)))
        sphere = sphere_parameters(block)
        if sphere:  # nGPT: the matrices the optimizer-step projection normalizes, and along which axis
            root.blockir_sphere = sphere
        return root


def lower_block(program: Program, block: Block, sizes: Sizes, bind: Mapping[str, Any], *,
                layer: int = 0, num_layers: int = 1, prefix: str = "",
                act_dtype: torch.dtype | None = None, mode: str = "train", donated: bool = False,
                check: bool = False, backend: Backend = FX) -> BlockModule:
    """Build the module tree and the graph of one block (recursing into sub-blocks and stacks).

    A declaration's parameters take the dtype of the value it is applied to when the IR states
    one (a bf16 branch inside an f32 residual stream), else ``act_dtype``. In ``mode="infer"``
    the residual adds that the liveness plan allows write over their shortcut's buffer; inputs
    are overwritten only when ``donated`` (a stack donates each layer's output to the next).
    ``check`` makes the forward check its inputs against the block's declared axes; ``backend``
    says which hook tables lower the ops (:data:`~blockir.lower.fx.builder.FX` by default).
    """
    lowering = Lowering(program, sizes, bind, act_dtype, mode, backend)
    root = lowering.block(block, layer=layer, num_layers=num_layers, prefix=prefix, donated=donated, check=check)
    if check:
        contract = CallContract(block.name, block.span.filename, block.span.line, block.span.column,
                                tuple(p.name for p in block.params), accepted(root.blockir_context),
                                probe=lowering.probe)
        root.__dict__[CONTRACT_ATTR] = placed_contract(root, contract)
    return root
