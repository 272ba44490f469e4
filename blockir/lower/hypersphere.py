"""nGPT's parameter projection: matrices back onto the unit sphere after each optimizer step.

nGPT (Loshchilov et al., arXiv:2410.01131) lets the optimizer update parameters in
ambient coordinates and then retracts every embedding-dimension vector of every
matrix to unit length; the axis of each matrix comes from
:func:`blockir.analyses.hypersphere.sphere_parameters`, which the
compiler records on each block module that declares the sphere. A resumed run reproduces
the trajectory only with the same projection after every step, so the hook is
attached to the optimizer rather than called by hand.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F


def sphere_weights(module: nn.Module) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(key, weight, axis) of every matrix a compiled block or model keeps on its sphere."""
    for prefix, sub in module.named_modules():
        dot = f"{prefix}." if prefix else ""
        for p in getattr(sub, "blockir_sphere", ()):
            yield dot + p.key, sub.get_parameter(p.key), p.axis


@torch.no_grad()
def project(module: nn.Module, extra: tuple[tuple[torch.Tensor, int], ...] = ()) -> int:
    """Normalize every sphere matrix of ``module`` (and each ``(weight, axis)`` of ``extra``) along its
    embedding axis, in place; returns how many tensors were projected."""
    weights = [(w, axis) for _, w, axis in sphere_weights(module)] + list(extra)
    for w, axis in weights:
        w.copy_(F.normalize(w, dim=axis))
    return len(weights)


def project_after_step(optimizer: torch.optim.Optimizer, module: nn.Module,
                       extra: tuple[tuple[torch.Tensor, int], ...] = ()) -> object:
    """Project ``module`` after every ``optimizer.step()``; returns the hook's handle (``.remove()`` detaches it)."""
    return optimizer.register_step_post_hook(lambda *_: project(module, extra))


@torch.no_grad()
def parameter_norm_error(module: nn.Module, extra: tuple[tuple[torch.Tensor, int], ...] = ()) -> float:
    """The largest |‖w_i‖ − 1| over the embedding-axis vectors of every sphere matrix (0 when there are none)."""
    weights = [(w, axis) for _, w, axis in sphere_weights(module)] + list(extra)
    return max((float((w.double().norm(dim=axis) - 1).abs().max()) for w, axis in weights), default=0.0)


def row_norm_error(values: list[torch.Tensor]) -> float:
    """The largest |‖h‖ − 1| over the rows of the given hidden states."""
    return max((float((v.detach().double().norm(dim=-1) - 1).abs().max()) for v in values), default=0.0)
