"""Declarations → torch modules and parameters, named so state_dict keys equal the declared names."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import nn

from blockir.analyses.norms import family
from blockir.analyses.sizes import Sizes
from blockir.backends import branches, numerics
from blockir.backends.bind import Binding, BoundExtern
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.ir.types import TensorType

# which parameters a norm owns comes from the norm-family table; these add only the numerics
NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": lambda w, d, s, f: numerics.LayerNorm(
        w, s.value(d.arg("eps")), bias=f.bias(d), affine=f.weight(d), accum=numerics.ACCUM[d.arg("accum")],
        offset=d.arg("offset", 0), two_pass=bool(d.arg("two_pass"))),
    "rmsnorm": lambda w, d, s, f: numerics.RMSNorm(
        w, s.value(d.arg("eps")), offset=d.arg("offset"), cast=d.arg("cast"), accum=numerics.ACCUM[d.arg("accum")],
        affine=f.weight(d)),
    "scalenorm": lambda w, d, s, f: numerics.ScaleNorm(w, s.value(d.arg("eps")), offset=d.arg("offset", 0)),
    "dyt": lambda w, d, s, f: numerics.DyT(w, s.value(d.arg("alpha")), offset=d.arg("offset", 0)),
    "l2norm": lambda w, d, s, f: numerics.L2Norm(w, s.value(d.arg("eps"))),
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


def _branch(d: KindDecl, width: int, s: Sizes) -> nn.Module:
    if d.kind in ("self_attention", "cross_attention"):
        kw: dict[str, Any] = dict(heads=int(s.value(d.arg("heads"))), kv_heads=_opt_int(s, d, "kv_heads"),
                                  head_dim=_opt_int(s, d, "head_dim"), bias=d.arg("bias"), out_bias=d.arg("out_bias"),
                                  name=f"{d.kind} '{d.name}'", span=d.span)
        if d.kind == "self_attention":
            kw.update(causal=d.arg("causal"), rope=d.arg("rope"), rope_theta=float(s.value(d.arg("rope_theta"))))
            return branches.SelfAttention(width, **kw)
        return branches.CrossAttention(width, **kw)
    cls = branches.MLP if d.kind == "mlp" else branches.GatedMLP
    return cls(width, s.dim(d.arg("hidden")), act=d.arg("act"), bias=d.arg("bias"))


def make_kind(d: KindDecl, input_type: TensorType | None, s: Sizes) -> nn.Module | nn.Parameter:
    """Build the module (or bare parameter, for learned scales) of one declaration."""
    width = s.dim(input_type.axes[-1].name) if input_type is not None and input_type.axes else None
    if d.category == "norm":
        return NORMS[d.kind](s.dim(d.arg("axes")[-1]), d, s, family(d))
    if d.kind == "linear":
        return nn.Linear(s.dim(d.arg("in_dim")), s.dim(d.arg("out_dim")), bias=d.arg("bias"))
    if d.category in ("scale", "shift"):
        # init is the initial gain; with offset=1 the stored deviation starts at init - 1
        init = float(s.value(d.arg("init"))) - d.arg("offset", 0)
        shape = (s.dim(d.arg("axis")),) if d.arg("axis") is not None else ()
        return nn.Parameter(torch.full(shape, init))
    if d.kind == "activation":
        return Activation(d.arg("fn"))
    if width is None:
        raise BlockError([error("E0703", f"'{d.name}' is declared but never applied, so its width is unknown", d.span)])
    module = _branch(d, width, s)
    if d.arg("init_gain") is not None:
        _apply_gain(module, d.kind, float(s.value(d.arg("init_gain"))))
    return module


def bound_extern(d: ExternDecl, bind: Mapping[str, Binding], s: Sizes) -> BoundExtern:
    """The branch of an extern: its binding (checked by compile) called through the adapter."""
    module, adapter = bind[d.name]
    return BoundExtern(d, module, adapter, s)
