"""The fused boundary on a stream whose features are split over ranks (the hidden layout).

A row norm needs the statistics of every feature of its row, and the fused ops take them from the row they
are given: on a rank's slice of the features they would normalise by a partial row, and no DTensor rule of
theirs matches a feature-sharded stream (DTensor would gather the stream at every norm instead). No kernel
takes statistics from outside, so here the boundary is composed: the update is added to the shortcut on the
rank's own features (elementwise, no collective), and the norm module normalises the new stream as the fx
backend does, with one all-reduce of each row's partial sums and its family's sharded backward. Values and
collectives are therefore the fx backend's under the same layout, the ones the plan lists.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from blockir.lower.fused import reference
from blockir.lower.fused.functional import split_scale
from blockir.lower.fused.spec import BoundarySpec
from blockir.norms.base import is_dtensor


def feature_sharded(x: Any) -> bool:
    """Whether ``x`` is a DTensor split along its last (feature) axis."""
    return is_dtensor(x) and any(p.is_shard(x.ndim - 1) for p in x.placements)


def boundary(branch: torch.Tensor, shortcut: torch.Tensor, norm: nn.Module,
             branch_scale: torch.Tensor | float | None, shortcut_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, residual) of a boundary whose branch is already dropped out, with the fused op's update
    and residual add (``reference``) on the local features."""
    scale, scale_const = split_scale(branch_scale)
    spec = BoundarySpec(norm.family.name, norm.eps, branch_scale_const=scale_const, shortcut_scale=shortcut_scale)
    update, _ = reference.branch_update(branch, None, scale, None, spec)
    residual = reference.residual_add(update, shortcut, spec)
    return norm(residual), residual
