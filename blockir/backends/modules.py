"""Declarations → torch modules and parameters, named so state_dict keys equal the declared names."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from blockir.backends import branches, numerics
from blockir.backends.adapters import call_module
from blockir.backends.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.ir.types import TensorType

# each returns the constructor of the norm's module, its arguments evaluated once
NORMS: dict[str, Callable[..., Callable[[], nn.Module]]] = {
    "layernorm": lambda w, d, s: partial(
        numerics.LayerNorm, w, s.value(d.arg("eps")), bias=d.arg("bias"), affine=d.arg("affine"),
        accum=numerics.ACCUM[d.arg("accum")]),
    "rmsnorm": lambda w, d, s: partial(
        numerics.RMSNorm, w, s.value(d.arg("eps")), offset=d.arg("offset"), cast=d.arg("cast"),
        accum=numerics.ACCUM[d.arg("accum")], affine=d.arg("affine") is not False),
    "scalenorm": lambda w, d, s: partial(numerics.ScaleNorm, w, s.value(d.arg("eps"))),
    "dyt": lambda w, d, s: partial(numerics.DyT, w, s.value(d.arg("alpha"))),
}

# matrices that DeepNorm-style init gains scale; query and key projections keep gain 1
GAINED = {"self_attention": ("v_proj", "o_proj"), "cross_attention": ("v_proj", "o_proj"),
          "mlp": ("fc1", "fc2"), "gated_mlp": ("gate_proj", "up_proj", "down_proj")}
UNGAINED = {"self_attention": ("q_proj", "k_proj"), "cross_attention": ("q_proj", "k_proj")}


class Activation(nn.Module):
    """A declared activation; holds no state."""

    def __init__(self, fn: str) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return numerics.ACTIVATIONS[self.fn](x)

    def extra_repr(self) -> str:
        return self.fn


def _opt_int(s: Sizes, d: KindDecl, name: str) -> int | None:
    v = d.arg(name)
    return int(s.value(v)) if v is not None else None


def _apply_gain(module: nn.Module, kind: str, gain: float) -> None:
    with torch.no_grad():
        for name in UNGAINED.get(kind, ()):
            nn.init.xavier_normal_(getattr(module, name).weight, gain=1.0)
        for name in GAINED[kind]:
            nn.init.xavier_normal_(getattr(module, name).weight, gain=gain)


def _branch(d: KindDecl, width: int, s: Sizes) -> Callable[[], nn.Module]:
    if d.kind in ("self_attention", "cross_attention"):
        kw: dict[str, Any] = dict(heads=int(s.value(d.arg("heads"))), kv_heads=_opt_int(s, d, "kv_heads"),
                                  head_dim=_opt_int(s, d, "head_dim"), bias=d.arg("bias"), out_bias=d.arg("out_bias"))
        if d.kind == "self_attention":
            kw.update(causal=d.arg("causal"), rope=d.arg("rope"), rope_theta=float(s.value(d.arg("rope_theta"))))
            return partial(branches.SelfAttention, width, **kw)
        return partial(branches.CrossAttention, width, **kw)
    cls = branches.MLP if d.kind == "mlp" else branches.GatedMLP
    return partial(cls, width, s.dim(d.arg("hidden")), act=d.arg("act"), bias=d.arg("bias"))


def kind_factory(d: KindDecl, input_type: TensorType | None, s: Sizes) -> Callable[[], nn.Module | nn.Parameter]:
    """The constructor of one declaration's module (or bare parameter), its arguments evaluated now.

    Each call builds fresh state; the layers of a stack whose sizes agree share one factory.
    """
    width = s.dim(input_type.axes[-1].name) if input_type is not None and input_type.axes else None
    if d.category == "norm":
        return NORMS[d.kind](s.dim(d.arg("axes")[-1]), d, s)
    if d.kind == "linear":
        return partial(nn.Linear, s.dim(d.arg("in_dim")), s.dim(d.arg("out_dim")), bias=d.arg("bias"))
    if d.kind == "scalar":
        init = float(s.value(d.arg("init")))
        return lambda: nn.Parameter(torch.tensor(init))
    if d.kind == "vector":
        shape, init = (s.dim(d.arg("axis")),), float(s.value(d.arg("init")))
        return lambda: nn.Parameter(torch.full(shape, init))
    if d.kind == "activation":
        return partial(Activation, d.arg("fn"))
    if width is None:
        raise BlockError([error("E0703", f"'{d.name}' is declared but never applied, so its width is unknown", d.span)])
    build = _branch(d, width, s)
    if d.arg("init_gain") is None:
        return build
    kind, gain = d.kind, float(s.value(d.arg("init_gain")))

    def gained() -> nn.Module:
        module = build()
        _apply_gain(module, kind, gain)
        return module
    return gained


def make_kind(d: KindDecl, input_type: TensorType | None, s: Sizes) -> nn.Module | nn.Parameter:
    """Build the module (or bare parameter, for learned scales) of one declaration."""
    return kind_factory(d, input_type, s)()


def bound_extern(d: ExternDecl, bind: dict[str, Any]) -> nn.Module:
    """The user's module for an extern, with its adapter attached for the graph to call."""
    if d.name not in bind:
        raise BlockError([error("E0704", f"extern '{d.name}' is not bound", d.span,
                                hint=f"pass bind={{'{d.name}': module}} or (module, adapter) to compile")])
    value = bind[d.name]
    module, adapter = value if isinstance(value, tuple) else (value, call_module)
    if not isinstance(module, nn.Module):
        raise BlockError([error("E0704", f"extern '{d.name}' must be bound to an nn.Module, got {type(module).__name__}",
                                d.span)])
    module.blockir_adapter = adapter
    return module
