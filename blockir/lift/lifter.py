"""One traced module → the statements of one ``.block`` block, each remembering its Python origin."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import Tensor, nn

from blockir.diagnostics import Diagnostic, Span, error
from blockir.lift.attention import builtin_attention
from blockir.lift.branches import builtin_branch
from blockir.lift.match import canonical, match
from blockir.lift.replay import Replay, Slot
from blockir.lift.rules import RULES
from blockir.lift.sources import detail_span, site_span
from blockir.lift.trace import Traced, is_residual
from blockir.lower.declared import AXES_ATTR, DEPTH_ATTR, DROPPED_ATTR, RESULTS_ATTR, SPAN_ATTR
from blockir.norms.base import number

if TYPE_CHECKING:
    from blockir.lift.blocks import Session

PREFIX = "inner."
_STOCHASTIC = {"bernoulli_", "bernoulli", torch.bernoulli}


class LiftFailure(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass
class Line:
    """One line of the block body and where it comes from in Python."""

    text: str
    site: Span | None
    detail: Span | None = None
    rule: str = ""  # the rule that wrote an equation
    reads: tuple[str, ...] = ()  # the values that equation reads


@dataclass
class Instance:
    decl: str
    block: "LiftedBlock"
    result: str
    inputs: tuple[str, ...]
    line: Line


@dataclass
class LiftedBlock:
    name: str
    module: nn.Module
    inputs: list[tuple[str, tuple[str, ...]]]
    params: list[str] = field(default_factory=list)  # the forward parameters the inputs come from
    decls: dict[str, Line] = field(default_factory=dict)
    eqs: list[Line | Instance] = field(default_factory=list)
    result: str = ""
    result_span: Span | None = None
    externs: dict[str, tuple[nn.Module, Replay]] = field(default_factory=dict)
    residual: bool = False
    output: tuple[str, ...] | None = None  # the result's axes when not those of the first input (a model's logits)
    consts: list[str] = field(default_factory=list)  # ``name = value``: a compiled block's facts and depth constants

    def body(self) -> str:
        """What two layers must share to be one stack: everything but the block's name."""
        eqs = [e.text if isinstance(e, Line) else f"{e.result} = {e.decl}:{e.block.body()}({e.inputs})" for e in self.eqs]
        return "\n".join([*self.consts, *(f"{k}: {v.text}" for k, v in self.decls.items()), *eqs, self.result,
                          str(self.inputs)])


class Lifter:
    """Decides every node reachable from the module's result, by the rule table."""

    def __init__(self, session: "Session", traced: Traced, prefix: str, ctx: dict[str, Slot], name: str) -> None:
        self.session, self.traced, self.prefix, self.ctx = session, traced, prefix, ctx
        self.names: dict[fx.Node, str] = {}
        self.taken: set[str] = set()
        self.index: dict[fx.Node, tuple[int, ...]] = {}
        placeholders = {n.target: n for n in traced.root.graph.nodes if n.op == "placeholder"}
        inputs = []
        for p in traced.inputs:
            v = traced.example[p]
            if isinstance(v, Tensor) and v.is_floating_point() and p not in ctx and \
                    (not inputs or (v.dim() == 3 and v.shape[-1] == session.width)):
                inputs.append(p)
        self.block = LiftedBlock(name, traced.module, [])
        for p in inputs:
            node = placeholders[p]
            vname = self._fresh(p if p != "self" else "x")
            self.names[node] = vname
            self.block.inputs.append((vname, self.axes(node)))
            self.block.params.append(p)

    # --- what builders ask ------------------------------------------------------------
    def meta(self, node: Any) -> Any:
        return node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None

    def shape(self, node: Any) -> tuple[int, ...] | None:
        if isinstance(node, fx.Node) and node.op == "get_attr":
            return tuple(self.param(node).shape)
        m = self.meta(node)
        return tuple(m.shape) if hasattr(m, "shape") else None

    def rank(self, node: Any) -> int | None:
        s = self.shape(node)
        return None if s is None else len(s)

    def dtype(self, node: Any) -> torch.dtype | None:
        m = self.meta(node)
        return getattr(m, "dtype", None)

    def is_tensor(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and (node.op == "get_attr" or hasattr(self.meta(node), "shape"))

    def axes(self, node: Any) -> tuple[str, ...]:
        s = self.shape(node)
        if s is None or len(s) != 3:
            self.fail("E0906", node, f"'{node}' has shape {list(s) if s else '?'}; the lift follows [batch, seq, "
                      "features] values only", "call the module on a 3-D input [B, S, D]")
        return self.session.axes(s)

    def param_path(self, node: fx.Node) -> str:
        return str(node.target).removeprefix(PREFIX)

    def param(self, node: fx.Node) -> Tensor:
        return self.traced.param(str(node.target))

    def constant(self, v: float) -> str:
        """A scale as the lifted block writes it: the name of the compiled block's depth constant that has exactly
        this value in this layer (DeepNorm's ``alpha``), declared in the block, or the number."""
        for name, expr, _, value in getattr(self.traced.module, DEPTH_ATTR, ()):
            if value is not None and float(value) == float(v):
                if f"{name} = {expr}" not in self.block.consts:
                    self.block.consts.append(f"{name} = {expr}")
                return name
        return number(v)

    def submodule(self, path: str) -> nn.Module:
        return self.traced.module.get_submodule(path)

    def owner(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        paths = [str(v[0]).removeprefix(PREFIX) for v in stack.values() if str(v[0]).startswith(PREFIX)]
        if not paths:
            self.fail("E0904", node, f"'{node.name}' is a norm without learned parameters written in the lifted "
                      "forward itself", "compute it in a submodule (nn.LayerNorm(D, elementwise_affine=False))")
        return paths[-1]

    def bernoulli_keep(self, mask: Any) -> float | None:
        """The keep probability when ``mask`` is a rescaled Bernoulli draw, else None."""
        seen, todo = 0, [mask]
        while todo and seen < 12:
            n = todo.pop()
            seen += 1
            if not isinstance(n, fx.Node):
                continue
            if n.target in _STOCHASTIC:
                p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p")
                return float(p) if isinstance(p, (int, float)) else None
            todo += [a for a in n.args if isinstance(a, fx.Node)]
        return None

    def check_offset(self, w: fx.Node, node: fx.Node) -> None:
        """A ``1 + w`` gain whose stored weights already sit around one applies the offset twice."""
        mean = float(self.param(w).detach().float().mean())
        if abs(mean - 1) < 0.5:
            span = detail_span(node) or Span(type(self.traced.module).__name__, 0, 0)
            self.session.findings.append(error(
                "E0909", f"'{self.param_path(w)}' is used as 1 + weight, but its values sit around {mean:.3g}: "
                f"the norm scales by about {1 + mean:.3g}, the offset is applied twice", span,
                hint="store the weight as a deviation from one (Gemma: zeros at init), or drop the `1 +`"))

    def declare(self, name: str, text: str, node: fx.Node) -> str:
        """The declaration ``name: text``; a second site must declare the same thing."""
        have = self.block.decls.get(name)
        if have is not None and have.text != text:
            self.fail("E0904", node, f"'{name}' is applied as {text} here and as {have.text} before",
                      "apply one module one way, or use two modules")
        if have is None:
            self.block.decls[name] = Line(text, self.site(node), detail_span(node))
            self.taken.add(name)
        return name

    def fail(self, code: str, node: Any, message: str, hint: str) -> None:
        span = (detail_span(node) if isinstance(node, fx.Node) else None) or Span(type(self.traced.module).__name__, 0, 0)
        raise LiftFailure(error(code, message, span, hint=hint))

    def site(self, node: fx.Node) -> Span | None:
        return site_span(node, self.traced.module)

    # --- the walk ------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        base = base.removeprefix("inner_") or "v"
        name, i = base, 1
        while name in self.taken or name in self.session.reserved:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def run(self) -> LiftedBlock:
        out = next(n for n in self.traced.root.graph.nodes if n.op == "output").args[0]
        while isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not isinstance(out, fx.Node):
            raise LiftFailure(error("E0906", "the lifted module returns no tensor", self._module_span(),
                                    hint="return the hidden state (or a tuple that starts with it)"))
        self.block.result = self.value(out)
        self.block.result_span = self.site(out) if out.op != "placeholder" else self._module_span()
        return self.block

    def _module_span(self) -> Span:
        try:
            lines, start = inspect.getsourcelines(type(self.traced.module).forward)
            return Span(inspect.getsourcefile(type(self.traced.module)) or "?", start, 1 + len(lines[0]) - len(lines[0].lstrip()))
        except (OSError, TypeError):
            return Span(type(self.traced.module).__name__, 0, 0)

    def value(self, node: fx.Node) -> str:
        if node in self.names:
            return self.names[node]
        if node.op == "placeholder":
            self.fail("E0905", node, f"'{node.target}' is a side input of the forward, but it reaches the residual "
                      "stream outside a branch", "pass masks and position embeddings to branch submodules only")
        if node.op == "call_module":
            return self._call(node, ())
        if canonical(node) == "getitem" and isinstance(node.args[0], fx.Node) and node.args[0].op == "call_module":
            return self._call(node.args[0], (node.args[1],), node)
        for rule, pat, build in RULES:
            caps = match(pat, node, {})
            out = build(self, node, caps) if caps is not None else None
            if out is None:
                continue
            inputs = [self.value(i) for i in out.inputs]
            if not out.expr:
                self.names[node] = inputs[0]
                return inputs[0]
            name = self._fresh(out.name or node.name)
            self.names[node] = name
            self.block.eqs.append(Line(f"{name} = {out.expr.format(*inputs)}", self.site(out.key or node),
                                       detail_span(out.key or node), rule, tuple(inputs)))
            if rule == "residual add":
                self.block.residual = True
            return name
        what = f"{node.op} {getattr(node.target, '__name__', node.target)}"
        self.fail("E0901", node, f"no lift rule matches '{node.name}' ({what})",
                  "the lift reads residual adds, norms, dropout, scales, gates and branch submodules; compute "
                  "anything else inside a branch submodule, which is then bound as an extern")
        raise AssertionError  # fail raised

    # --- submodule calls -----------------------------------------------------------------
    def _call(self, node: fx.Node, index: tuple[Any, ...], key: fx.Node | None = None) -> str:
        path = str(node.target).removeprefix(PREFIX)
        module = self.traced.leaves[path]
        check_signature(module)
        call = self.session.calls[self.prefix + path]
        slots, tensors = self._slots(node, module)
        layer = path.rsplit(".", 1)[-1].isdigit() and is_residual(module, call, self.session.calls,
                                                                    self.prefix + path + ".", self.session.residual)
        name = self._fresh((key or node).name)
        self.names[key or node] = name
        if layer:
            inner_ctx = {k: s for k, s in slots.items() if s[0] == "ctx"}
            block = self.session.lift_block(module, call, self.prefix + path + ".", inner_ctx)
            ins = tuple(self.value(t) for t in tensors)
            self.taken.add(path)
            self.block.eqs.append(Instance(path, block, name, ins, Line("", self.site(node), detail_span(node))))
            return name
        ins = [self.value(t) for t in tensors]
        text = None if index or len(tensors) != 1 else builtin_branch(module, call, self.session.dim)
        applied = f"{path}({', '.join(ins)})"
        if text is None and index in ((), (0,)) and len(tensors) in (1, 2):
            found = builtin_attention(module, call, self.session.calls, self.prefix + path + ".", self.session.context)
            if found is not None:
                text, update_p = found
                applied = f"dropout({applied}, p={update_p:g})" if update_p else applied
        if text is None:
            text = self._extern(node, module, path, slots, tensors, index)
        if path in self.block.decls and self.block.decls[path].text != text:
            self.fail("E0904", node, f"'{path}' is called two different ways", "call one submodule one way")
        self.declare(path, text, node)
        self.block.eqs.append(Line(f"{name} = {applied}", self.site(node), detail_span(node)))
        dropped = getattr(self.traced.module, DROPPED_ATTR, {}).get(path)
        if dropped is not None:  # a compiled dropout of probability 0 on this call's result, which compiles to nothing
            result, rhs = dropped
            self.names[key or node] = dropout = self._fresh(result)
            self.block.eqs.append(Line(f"{dropout} = {rhs.format(name)}", self.site(node), detail_span(node)))
            return dropout
        return name

    def _slots(self, node: fx.Node, module: nn.Module) -> tuple[dict[str, Slot], list[fx.Node]]:
        """Each argument of the call by parameter name, and the stream tensors among them, in order.

        Arguments of ``*args`` are named ``*0``, ``*1``…: they are passed by position again.
        """
        try:
            bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
        except TypeError:
            bound = None
        named: dict[str, Any] = {f"*{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
        if bound is not None:
            named = {}
            for k, a in bound.arguments.items():
                kind = bound.signature.parameters[k].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(a)
                elif kind is inspect.Parameter.VAR_POSITIONAL:
                    if a:  # what fills *args follows every parameter before it, which is then passed by position too
                        named = {f"*{i}": v for i, v in enumerate(named.values())}
                    named.update({f"*{len(named) + i}": v for i, v in enumerate(a)})
                elif kind is inspect.Parameter.POSITIONAL_ONLY:
                    named[f"*{len(named)}"] = a
                else:
                    named[k] = a
        tensors: list[fx.Node] = []
        slots: dict[str, Slot] = {}
        for k, a in named.items():
            if isinstance(a, fx.Node) and a.op == "placeholder" and a not in self.names:
                slot = self.ctx.get(str(a.target), ("ctx", str(a.target)))
                slots[k] = slot
            elif isinstance(a, fx.Node):
                if not self.is_tensor(a):
                    self.fail("E0907", a, f"argument '{k}' of '{node.target}' is computed in the lifted forward",
                              "compute side inputs outside the module and pass them in, or inside the branch")
                if a not in tensors:
                    tensors.append(a)
                slots[k] = ("input", tensors.index(a))
            elif _has_node(a):
                self.fail("E0907", node, f"argument '{k}' of '{node.target}' packs traced values in a container",
                          "pass each tensor on its own")
            else:
                slots[k] = ("const", a)
        return slots, tensors

    def _extern(self, node: fx.Node, module: nn.Module, path: str, slots: dict[str, Slot], tensors: list[fx.Node],
                index: tuple[Any, ...]) -> str:
        args = [s for k, s in slots.items() if k.startswith("*")]
        kwargs = [(k, s) for k, s in slots.items() if not k.startswith("*")]
        self.block.externs[path] = (module, Replay(tuple(args), tuple(kwargs), tuple(index)))
        params = ", ".join(f"x{i or ''}: [{', '.join(self.axes(t))}]" for i, t in enumerate(tensors))
        result = self.shape(node)
        meta = self.meta(node)
        for i in index:
            meta = meta[i] if isinstance(meta, (tuple, list)) else None
        if not hasattr(meta, "shape") or len(meta.shape) != 3:
            self.fail("E0906", node, f"branch '{path}' returns {type(meta).__name__ if meta is not None else result}, "
                      "not one [B, S, D] tensor", "return the update (or a tuple that starts with it)")
        return f"extern({params}) -> [{', '.join(self.session.axes(tuple(meta.shape)))}]"


def check_signature(module: nn.Module) -> None:
    """A compiled block whose inputs or results are not all states: the lift reads one ``[batch, seq, features]``
    result from ``[batch, seq, features]`` inputs, so a stream carried beside the state is not followed. A module
    that is no compiled block but holds compiled layers (a stack) is checked by its first one."""
    if not hasattr(module, RESULTS_ATTR):
        module = next((m for m in module.children() if hasattr(m, RESULTS_ATTR)), module)
    inputs, results = getattr(module, AXES_ATTR, ()), getattr(module, RESULTS_ATTR, ())
    other = [axes for axes in (*inputs, *results) if len(axes) != 3]
    if len(results) > 1 or other:
        what = [f"returns {len(results)} results"] if len(results) > 1 else []
        what += [f"carries a [{', '.join(other[0])}] value"] if other else []
        raise LiftFailure(error(
            "E0920", f"'{type(module).__name__}' {' and '.join(what)} beside its state: the lift reads blocks from "
            "[batch, seq, features] inputs to one such result, so a stream carried beside the state (RealFormer's "
            "attention scores) is not followed", getattr(module, SPAN_ATTR),
            hint="only blocks that carry the state alone lift; this block's .block file stays its source"))


def _has_node(v: Any) -> bool:
    if isinstance(v, fx.Node):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_node(x) for x in v)
    if isinstance(v, dict):
        return any(_has_node(x) for x in v.values())
    return False
