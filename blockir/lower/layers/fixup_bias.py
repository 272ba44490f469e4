"""Fixup's scalar biases inside a built-in branch (``fixup_bias=true``): learned scalars, zero at initialisation,
added before the layers and the nonlinearity that follow a branch's first weight layer (Zhang et al., 2019)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from blockir.lower.layers.numerics import meeting

ACT, OUT = "fixup_bias_act", "fixup_bias_out"


def add_biases(module: nn.Module, *keys: str) -> None:
    """Register the scalar biases ``keys`` on ``module``, each initialised to 0."""
    for key in keys:
        module.register_parameter(key, nn.Parameter(torch.zeros(())))


def shift(x: Tensor, module: nn.Module, key: str) -> Tensor:
    """``x`` plus ``module``'s scalar bias ``key``, when it has one (a tensor-parallel rank's plain shard meets
    the replicated scalar through its local value, with a pending-sum gradient)."""
    b = meeting(module._parameters.get(key), x)
    return x if b is None else x + b.to(x.dtype)
