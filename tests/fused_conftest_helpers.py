"""Shared pieces of the fused-op tests: the unfused graph, input builders, configurations."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from blockir.lower.layers import numerics
from blockir.norms.layernorm import layer_norm
from blockir.norms.rmsnorm import rms_norm
from blockir.lower.rng import dropout_key


@dataclass(frozen=True)
class Case:
    """One boundary configuration; ``scale`` is "none", "scalar", "vector" or "float"."""

    family: str = "rmsnorm"
    cast: str = "before_weight"
    offset: int = 0
    affine: bool = True
    norm_bias: bool = True
    branch_bias: bool = False
    scale: str = "none"
    shortcut_scale: float = 1.0
    p: float = 0.0
    training: bool = True
    out_dtype: torch.dtype | None = None
    eps: float = 1e-5

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)

    @property
    def has_weight(self) -> bool:
        return self.family == "rmsnorm" or self.affine

    @property
    def has_bias(self) -> bool:
        return self.family == "layernorm" and self.affine and self.norm_bias


CASES = {
    "ln": Case(family="layernorm"),
    "ln_plain": Case(family="layernorm", affine=False),
    "ln_all": Case(family="layernorm", branch_bias=True, scale="vector", shortcut_scale=0.75, p=0.2),
    "rms_llama": Case(),
    "rms_gemma": Case(cast="after_weight", offset=1, branch_bias=True, scale="scalar", p=0.1),
    "rms_t5": Case(cast="weight_dtype", scale="float", shortcut_scale=1.5, p=0.3),
    "rms_offset_before": Case(offset=1, scale="vector", p=0.25, branch_bias=True),
}


@dataclass
class Inputs:
    branch: Tensor
    residual: Tensor
    weight: Tensor | None
    bias: Tensor | None
    branch_bias: Tensor | None
    branch_scale: Tensor | float | None
    key: Tensor

    def tensors(self) -> dict[str, Tensor]:
        """The differentiable inputs by name."""
        named = {"branch": self.branch, "residual": self.residual, "weight": self.weight, "bias": self.bias,
                 "branch_bias": self.branch_bias, "branch_scale": self.branch_scale}
        return {k: v for k, v in named.items() if isinstance(v, Tensor)}

    def to(self, dtype: torch.dtype) -> "Inputs":
        """A copy with every tensor in ``dtype`` (fresh leaves, same requires_grad)."""

        def conv(t):
            return t.detach().to(dtype).requires_grad_(t.requires_grad) if isinstance(t, Tensor) else t

        return Inputs(conv(self.branch), conv(self.residual), conv(self.weight), conv(self.bias),
                      conv(self.branch_bias), conv(self.branch_scale), self.key)


def make_inputs(case: Case, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                residual_dtype: torch.dtype | None = None, seed: int = 0, device: str = "cpu",
                requires_grad: bool = True, scale_requires_grad: bool = True) -> Inputs:
    """Random inputs; the branch bias has the branch dtype, the norm parameters and scale the residual's."""
    g = torch.Generator().manual_seed(seed)
    width = shape[-1]
    param = residual_dtype or dtype

    def rnd(*s, scale=1.0, shift=0.0, dt=dtype, grad=requires_grad):
        t = (torch.randn(tuple(s), generator=g, dtype=torch.float64) * scale + shift).to(dt).to(device)
        return t.requires_grad_(grad)

    branch = rnd(*shape)
    residual = rnd(*shape, scale=2.0, shift=0.3, dt=residual_dtype or dtype)
    weight = rnd(width, scale=0.2, shift=0.0 if case.offset else 1.0, dt=param) if case.has_weight else None
    bias = rnd(width, scale=0.1, dt=param) if case.has_bias else None
    branch_bias = rnd(width, scale=0.1) if case.branch_bias else None
    scale: Tensor | float | None = None
    if case.scale == "scalar":
        scale = rnd(scale=0.3, shift=0.8, dt=param, grad=requires_grad and scale_requires_grad)
    elif case.scale == "vector":
        scale = rnd(width, scale=0.3, shift=0.8, dt=param, grad=requires_grad and scale_requires_grad)
    elif case.scale == "float":
        scale = 0.625
    key = dropout_key(torch.tensor(1234, dtype=torch.int64), 3, 1).to(device)
    return Inputs(branch, residual, weight, bias, branch_bias, scale, key)


def unfused(case: Case, x: Inputs, accum: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """The unfused graph, op by op, from ``numerics``: ``(normalized, residual_out)``."""
    u = x.branch if x.branch_bias is None else x.branch + x.branch_bias
    u = numerics.dropout(u, case.p, "element", case.training, x.key)
    if x.branch_scale is not None:
        u = u * x.branch_scale
    h = u.to(x.residual.dtype)
    shortcut = x.residual if case.shortcut_scale == 1.0 else case.shortcut_scale * x.residual
    h = shortcut + h
    if case.family == "layernorm":
        y = layer_norm(h, x.weight, x.bias, case.eps, accum)
    else:
        y = rms_norm(h, x.weight, case.eps, case.offset, case.cast, accum)
    return (y if case.out_dtype is None else y.to(case.out_dtype)), h


def fused(case: Case, x: Inputs, accum: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """The same boundary through the public front ends."""
    from blockir.lower.fused import add_layer_norm, add_rms_norm

    common = dict(eps=case.eps, branch_bias=x.branch_bias, branch_scale=x.branch_scale,
                  shortcut_scale=case.shortcut_scale, p=case.p, training=case.training, dropout_key=x.key,
                  out_dtype=case.out_dtype, accum=accum)
    if case.family == "layernorm":
        return add_layer_norm(x.branch, x.residual, x.weight, x.bias, **common)
    return add_rms_norm(x.branch, x.residual, x.weight, offset=case.offset, cast=case.cast, **common)


def grads(outputs: tuple[Tensor, Tensor], x: Inputs, seed: int = 1) -> dict[str, Tensor]:
    """Gradients of a fixed random projection of both outputs with respect to every tensor input."""
    g = torch.Generator().manual_seed(seed)
    normalized, residual_out = outputs
    w1 = torch.randn(normalized.shape, generator=g, dtype=torch.float64).to(normalized.device, normalized.dtype)
    w2 = torch.randn(residual_out.shape, generator=g, dtype=torch.float64).to(residual_out.device, residual_out.dtype)
    inputs = x.tensors()
    got = torch.autograd.grad((normalized, residual_out), list(inputs.values()), (w1, w2))
    return dict(zip(inputs, got))
