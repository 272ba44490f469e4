"""Tracing a module with torch.fx: which submodules stay calls, and the graph of the rest.

A submodule is traced through when it holds no matrix (norms, learned gains, dropout, activation
holders) or when it is a *residual container*: a module whose own full trace adds one of its
stream-shaped inputs to something (BERT's ``attention`` / ``attention.output``). Every other
submodule with a matrix is a branch and stays one ``call_module`` node. A residual container that
is an element of a ``ModuleList`` / ``Sequential`` (its name ends in an index) is a layer: it stays a
call too and is lifted as a block of its own. Nothing here reads a class name.
"""
from __future__ import annotations

import contextlib
import inspect
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.fx.passes.shape_prop import ShapeProp

ADDS = (operator.add, operator.iadd, torch.add, "add", "add_")
# unary steps between a placeholder and an add that keep it "the input" for the residual probe
_PASS = {"to", "type_as", "float", "contiguous", torch.nn.functional.dropout, operator.mul, operator.truediv, "mul",
         "div"}


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """torch's Transformer layers without their fused fast path, which branches on tensor properties."""
    mha = torch.backends.mha
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


class TraceFailure(Exception):
    """The module (or a submodule it calls) cannot be traced symbolically; carries torch's message."""


@dataclass
class Call:
    """One recorded call of a module: its forward's arguments by name, as the parent passed them."""

    arguments: dict[str, Any]
    positional: tuple[str, ...]  # names passed positionally (positional-only parameters and *args)


def _has_tensor(v: Any) -> bool:
    if isinstance(v, Tensor):
        return True
    return isinstance(v, (tuple, list)) and any(_has_tensor(x) for x in v)


def bind_call(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """The named arguments of ``module(*args, **kwargs)``; ``**kwargs`` entries keep their own names."""
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    out: dict[str, Any] = {}
    positional: list[str] = []
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:  # what fills *args follows every parameter before it, which is then passed by position too
                positional = list(out)
            for i, v in enumerate(value):
                out[f"{name}_{i}"] = v
                positional.append(f"{name}_{i}")
        else:
            out[name] = value
            if kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(name)
    return Call(out, tuple(positional))


def record_calls(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Call]]:
    """Run ``module`` once; the first call of every submodule, keyed by its qualified name."""
    calls: dict[str, Call] = {}
    handles = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def hook(m: nn.Module, a: tuple, kw: dict, name: str = name) -> None:
            if name not in calls:
                calls[name] = bind_call(m, a, kw)
        handles.append(sub.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        out = module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return out, calls


class _Wrapper(nn.Module):
    """The traced root: a forward whose parameters are exactly the call's tensor arguments."""

    def __init__(self, inner: nn.Module, fixed: dict[str, Any]) -> None:
        super().__init__()
        self.inner = inner
        self.fixed = fixed


def _wrapper(inner: nn.Module, call: Call) -> tuple[_Wrapper, list[str]]:
    tensors = [n for n, v in call.arguments.items() if _has_tensor(v)]
    fixed = {n: v for n, v in call.arguments.items() if not _has_tensor(v)}
    pos = [n for n in call.positional]
    parts = [n if n in tensors else f"self.fixed[{n!r}]" for n in pos]
    parts += [f"{n}={n}" if n in tensors else f"{n}=self.fixed[{n!r}]" for n in call.arguments if n not in pos]
    ns: dict[str, Callable] = {}
    # a generated forward with one named parameter per tensor: fx cannot trace a root taking **kwargs
    exec(f"def forward(self, {', '.join(tensors)}):\n    return self.inner({', '.join(parts)})\n", ns)
    cls = type("LiftRoot", (_Wrapper,), {"forward": ns["forward"]})
    return cls(inner, fixed), tensors


class _Tracer(fx.Tracer):
    def __init__(self, leaves: set[int], stacks: bool) -> None:
        super().__init__()
        self.leaves = leaves
        self.record_stack_traces = stacks  # only the graph that is lifted is located; probes need none

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self.leaves


@dataclass
class Traced:
    """The graph of one module as called once, with its example values and shapes propagated."""

    module: nn.Module
    root: fx.GraphModule
    inputs: list[str]  # placeholder names, in order
    example: dict[str, Any]
    leaves: dict[str, nn.Module] = field(default_factory=dict)  # call_module target (module's own path) → module

    def param(self, target: str) -> Tensor:
        return self.root.get_parameter(target) if target in dict(self.root.named_parameters()) else \
            self.root.get_buffer(target)


def symbolic(inner: nn.Module, call: Call, leaves: set[int], stacks: bool = False) -> tuple[fx.GraphModule, list[str]]:
    wrapper, names = _wrapper(inner, call)
    tracer = _Tracer(leaves, stacks)
    try:
        graph = tracer.trace(wrapper)
    except Exception as exc:  # fx raises whatever the traced Python raises on a proxy
        raise TraceFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return fx.GraphModule(wrapper, graph), names


def _matrices(m: nn.Module) -> bool:
    return any(p.ndim >= 2 for p in m.parameters())


def _strip(node: Any) -> Any:
    while isinstance(node, fx.Node) and node.op in ("call_method", "call_function") and node.target in _PASS:
        inner = [a for a in node.args if isinstance(a, fx.Node)]
        if len(inner) != 1:
            return node
        node = inner[0]
    return node


def is_residual(m: nn.Module, call: Call, calls: dict[str, Call], prefix: str,
                memo: dict[int, bool] | None = None) -> bool:
    """Does ``m``'s trace (its own branches kept as calls) add one of its stream-shaped inputs to something?"""
    memo = {} if memo is None else memo
    if id(m) in memo:
        return memo[id(m)]
    memo[id(m)] = False  # a module reached again while it is probed is no container of itself
    try:
        gm, names = symbolic(m, call, {id(x) for x in branches(m, calls, prefix, memo).values()})
    except TraceFailure:
        return False
    # a residual input has the [batch, seq, features] form of a stream; masks and tables do not
    streams = {n for n in names if isinstance(call.arguments[n], Tensor) and call.arguments[n].is_floating_point()
               and call.arguments[n].dim() == 3}
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method") and node.target in ADDS:
            ops = [_strip(a) for a in node.args[:2]]
            if any(isinstance(a, fx.Node) and a.op == "placeholder" and a.target in streams for a in ops) and \
                    all(isinstance(a, fx.Node) for a in node.args[:2]):
                memo[id(m)] = True
        # a module that runs layers (a compiled stack looping over its own) contains their residual adds
        elif node.op == "call_module" and str(node.target).rsplit(".", 1)[-1].isdigit():
            path = str(node.target).removeprefix("inner.")
            sub, sub_call = gm.get_submodule(str(node.target)), calls.get(prefix + path)
            if sub_call is not None and is_residual(sub, sub_call, calls, prefix + path + ".", memo):
                memo[id(m)] = True
    return memo[id(m)]


def branches(module: nn.Module, calls: dict[str, Call], prefix: str,
             memo: dict[int, bool] | None = None) -> dict[str, nn.Module]:
    """The submodules of ``module`` that stay calls: branches, and layers (indexed residual containers)."""
    memo = {} if memo is None else memo
    leaves: dict[str, nn.Module] = {}
    for name, sub in module.named_modules():
        if not name or not _matrices(sub) or any(name.startswith(k + ".") for k in leaves):
            continue
        sub_call = calls.get(prefix + name)
        if sub_call is None:  # never called: it cannot be on the graph either
            continue
        layer = name.rsplit(".", 1)[-1].isdigit()
        if layer or not is_residual(sub, sub_call, calls, prefix + name + ".", memo):
            leaves[name] = sub
    return leaves


def trace(module: nn.Module, call: Call, calls: dict[str, Call], prefix: str, memo: dict[int, bool]) -> Traced:
    """Trace ``module`` (named ``prefix`` in the lifted root) as ``call`` called it.

    ``calls`` are the recorded calls of the root's submodules, keyed by their path from the root;
    ``memo`` remembers which modules were found to be residual containers.
    """
    leaves = branches(module, calls, prefix, memo)
    gm, names = symbolic(module, call, {id(m) for m in leaves.values()}, stacks=True)
    example = {n: call.arguments[n] for n in names}
    try:
        ShapeProp(gm).propagate(*[example[n] for n in names])
    except Exception as exc:  # the traced graph replays user code on the examples
        raise TraceFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return Traced(module, gm, names, example, leaves)
