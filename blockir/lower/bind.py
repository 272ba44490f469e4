"""The rules of ``compile(bind=...)``: which paths are bindable, what a binding may be, and the bound branch.

A binding never changes what the caller passed. The compiled module holds each bound module through a
:class:`BoundExtern`, which carries the adapter and shares the module's parameter, buffer and child tables,
so the module's parameters are the compiled module's parameters (at ``<extern>.<the module's own keys>``)
and nothing is written onto the module itself. When ``compile(dtype=...)`` must convert a bound module,
it converts a copy.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from blockir.lower.adapters import Adapter, adapter_keywords, plain_call
from blockir.lower.boundary import TORCH_DTYPES
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, Diagnostic, Span, argument_error, error
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.program import Block, Program

Binding = tuple[nn.Module, Adapter]
MAX_LISTED = 8  # bindable paths named in a hint; a deep stack lists its first ones and the count
_TABLES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


def extern_paths(program: Program, block: Block, sizes: Sizes, prefix: str = "",
                 layer: int = 0, num_layers: int = 1) -> dict[str, ExternDecl]:
    """Every extern reachable from ``block``, keyed by the path ``bind`` names it with."""
    s = sizes.for_block(block, layer, num_layers)
    out: dict[str, ExternDecl] = {}
    for d in block.decls:
        if isinstance(d, ExternDecl):
            out[prefix + d.name] = d
        elif isinstance(d, InstanceDecl):
            inner = program.block(d.block)
            if d.count is None:
                out.update(extern_paths(program, inner, sizes, f"{prefix}{d.name}."))
            else:
                n = int(s.value(d.count))
                for i in range(n):
                    out.update(extern_paths(program, inner, sizes, f"{prefix}{d.name}.{i}.", i, n))
    return out


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_LISTED])
    return shown if len(paths) <= MAX_LISTED else f"{shown}, … ({len(paths)} in all)"


def _describe(d: ExternDecl | InstanceDecl | KindDecl) -> str:
    if isinstance(d, KindDecl):
        return f"the built-in {d.kind} '{d.name}'"
    if isinstance(d, InstanceDecl):
        return f"the {'sub-block' if d.count is None else 'stack'} '{d.name}'"
    return f"the extern '{d.name}'"


def _declared_at(program: Program, block: Block, key: str, sizes: Sizes) -> tuple[str, Span] | None:
    """What a key that names no extern path refers to, when it refers to a declaration, and where."""
    for d in block.decls:
        if key == d.name:
            return f"names {_describe(d)}, not an extern", d.span
        if isinstance(d, InstanceDecl) and key.startswith(d.name + "."):
            rest = key[len(d.name) + 1:]
            if d.count is not None:
                index, _, rest = rest.partition(".")
                n = int(sizes.for_block(block, 0, 1).value(d.count))
                if not (index.isdigit() and int(index) < n):
                    return f"names no layer of the stack '{d.name}', which has {n} (0–{n - 1})", d.span
                if not rest:
                    return f"names a layer of the stack '{d.name}', not an extern", d.span
            return _declared_at(program, program.block(d.block), rest, sizes)
    return None


def _unknown_key(program: Program, block: Block, key: str, bindable: list[str], sizes: Sizes) -> Diagnostic:
    hint = (f"bindable externs of '{block.name}': {_listed(bindable)}" if bindable
            else f"'{block.name}' declares no extern; only extern declarations can be bound")
    found = _declared_at(program, block, key, sizes)
    if found is None:
        return error("E0720", f"bind key '{key}' names no extern of '{block.name}'", block.span, hint=hint)
    what, span = found
    if "built-in" in what:
        hint += "; binding does not replace a built-in: declare it `extern(...)` to bind a module there"
    return error("E0720", f"bind key '{key}' {what}", span, hint=hint)


def _missing(externs: dict[str, ExternDecl], bind: Mapping[str, Any]) -> list[Diagnostic]:
    """One diagnostic per unbound extern declaration, naming every path (a stack's layers) left unbound."""
    paths: dict[int, list[str]] = {}
    for path, d in externs.items():
        if path not in bind:
            paths.setdefault(id(d), []).append(path)
    out = []
    for path, d in externs.items():
        unbound = paths.pop(id(d), None)
        if unbound is None:
            continue
        if unbound == [d.name]:
            out.append(error("E0704", f"extern '{d.name}' is not bound", d.span,
                             hint=f"pass bind={{'{d.name}': module}} or (module, adapter) to compile"))
        else:
            out.append(error("E0704", f"extern '{d.name}' is not bound at {_listed(unbound)}", d.span,
                             hint=f"pass bind={{'{unbound[0]}': module, …}}: one entry per path"))
    return out


def _binding(path: str, d: ExternDecl, value: Any) -> Binding:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise BlockError([error("E0704", f"extern '{path}' is bound to a tuple of {len(value)} items", d.span,
                                    hint="bind a module, or a pair (module, adapter)")])
        module, adapter = value
        if not callable(adapter):
            raise BlockError([error("E0704", f"the adapter bound to extern '{path}' is not callable "
                                    f"({type(adapter).__name__})", d.span,
                                    hint="an adapter is a function adapter(module, *inputs, **ctx) -> Tensor; "
                                         "see blockir.lower.adapters")])
    else:
        module, adapter = value, None
    if not isinstance(module, nn.Module):
        raise BlockError([error("E0704", f"extern '{path}' must be bound to an nn.Module, got {type(module).__name__}",
                                d.span, hint="wrap a function in an nn.Module, or bind (module, adapter)")])
    return module, adapter if adapter is not None else plain_call(module, len(d.params))


def _converted(module: nn.Module, dtype: torch.dtype | None, copies: dict[int, nn.Module]) -> nn.Module:
    """``module`` itself, or a copy at ``dtype`` when converting would change it (one copy per module)."""
    if dtype is None:
        return module
    tensors = [*module.parameters(), *module.buffers()]
    if all(not t.is_floating_point() or t.dtype == dtype for t in tensors):
        return module
    if id(module) not in copies:
        copies[id(module)] = copy.deepcopy(module).to(dtype)
    return copies[id(module)]


def check_bind(program: Program, block: Block, sizes: Sizes, bind: Any,
               dtype: torch.dtype | None) -> dict[str, Binding]:
    """Validate ``bind`` against the externs of ``block``: every key names one, every value is bindable."""
    if bind is None:
        bind = {}
    if not isinstance(bind, Mapping):
        raise BlockError([argument_error("compile", "bind", f"bind must be a mapping of extern paths to modules, got "
                                         f"{type(bind).__name__}", "bind={'self_attn': module}")])
    externs = extern_paths(program, block, sizes)
    unknown = [_unknown_key(program, block, str(k), list(externs), sizes)
               for k in bind if not isinstance(k, str) or k not in externs]
    if unknown or len(bind) < len(externs):
        raise BlockError(unknown + _missing(externs, bind))
    copies: dict[int, nn.Module] = {}
    out = {}
    for path, value in bind.items():
        module, adapter = _binding(path, externs[path], value)
        out[path] = (_converted(module, dtype, copies), adapter)
    return out


def _sizes_seen(axes: tuple[tuple[str, ...], ...], inputs: tuple[Any, ...]) -> dict[str, int]:
    seen: dict[str, int] = {}
    for names, x in zip(axes, inputs):
        if isinstance(x, Tensor) and x.dim() == len(names):
            seen.update(zip(names, x.shape))
    return seen


_RESULT_HINT = ("the adapter must return the one tensor the layer adds to its residual stream; HF attention "
                "modules return a tuple: bind (module, adapter) with an adapter from blockir.lower.adapters")


class BoundExtern(nn.Module):
    """An extern branch: ``adapter(module, *inputs, **ctx)``, its result checked against the declared type.

    The wrapper shares ``module``'s tables of parameters, buffers and children rather than holding the
    module as a child, so ``state_dict`` keys, ``named_parameters`` and ``get_submodule`` paths under the
    extern are the module's own; the module itself is only referenced. ``blockir_context`` is what the
    adapter reads (its signature, inspected once here); the adapter is called with that part of the context.
    """

    def __init__(self, d: ExternDecl, module: nn.Module, adapter: Callable[..., Any], sizes: Sizes) -> None:
        super().__init__()
        for table in _TABLES:
            self.__dict__[table] = module.__dict__[table]
        # plain attributes: assigning a module would register it in the shared table of children
        self.__dict__["bound"] = module
        self.__dict__["adapter"] = adapter
        self.training = module.training
        self.decl, self.span = d.name, d.span
        self.input_axes = tuple(p.type.names for p in d.params)
        self.result_axes = d.result.names
        self.known = {a: int(sizes.env[a]) for t in (d.result, *d.more) for a in t.names if a in sizes.env}
        self.result_dtype = TORCH_DTYPES[d.result.dtype] if d.result.dtype is not None else None
        self.count = 1 + len(d.more)  # an extern declaring several results returns a tuple of them
        self.blockir_context = adapter_keywords(adapter, len(d.params))

    def forward(self, *inputs: Tensor, **ctx: Any) -> Tensor:
        reads = self.blockir_context
        if reads is not None and ctx:
            ctx = {k: v for k, v in ctx.items() if k in reads}
        out = self.adapter(self.bound, *inputs, **ctx)
        if self.count == 1:
            self._check(out, inputs)
        elif not isinstance(out, (tuple, list)) or len(out) != self.count:
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else f"a {type(out).__name__}"
            raise BlockError([error("E0721", f"extern '{self.decl}' returned {got}, expected a tuple of "
                                    f"{self.count} tensors", self.span,
                                    hint="return the results the declaration lists, in its order")])
        else:
            for item in out:
                self._check(item, inputs)
            out = tuple(out)
        return out

    def _check(self, out: Any, inputs: tuple[Any, ...]) -> None:
        sizes = {**self.known, **_sizes_seen(self.input_axes, inputs)}
        expected = [sizes.get(a) for a in self.result_axes]
        shape = f"[{', '.join(self.result_axes)}]"
        if not isinstance(out, Tensor):
            raise BlockError([error("E0721", f"extern '{self.decl}' returned a {type(out).__name__}, expected a tensor "
                                    f"{shape}", self.span, hint=_RESULT_HINT)])
        if out.dim() != len(expected) or any(e is not None and e != g for e, g in zip(expected, out.shape)):
            want = ", ".join("?" if e is None else str(e) for e in expected)
            raise BlockError([error("E0721", f"extern '{self.decl}' returned shape [{', '.join(map(str, out.shape))}], "
                                    f"expected {shape} = [{want}]", self.span, hint=_RESULT_HINT)])
        first = inputs[0] if inputs and isinstance(inputs[0], Tensor) else None
        want_dtype = self.result_dtype or (first.dtype if first is not None else None)
        if want_dtype is not None and out.dtype != want_dtype and not torch.is_autocast_enabled(out.device.type):
            raise BlockError([error("E0721", f"extern '{self.decl}' returned a {out.dtype} tensor, expected "
                                    f"{want_dtype}", self.span,
                                    hint="the result joins the residual stream in its dtype: return it in that "
                                         "dtype (cast inside the adapter if the module computes in another)")])
        if first is not None and out.device != first.device:
            raise BlockError([error("E0721", f"extern '{self.decl}' returned a tensor on {out.device}, expected "
                                    f"{first.device}, where its input is", self.span,
                                    hint="keep the bound module on the compiled module's device")])

    def train(self, mode: bool = True) -> BoundExtern:
        # the bound module's forward reads its own flag; its children are shared already
        self.training = mode
        self.bound.train(mode)
        return self

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        self.bound._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.bound._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{type(self.bound).__name__} via {getattr(self.adapter, '__name__', type(self.adapter).__name__)}"
