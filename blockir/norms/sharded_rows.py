"""Row norms of feature-sharded rows: whole-row statistics from one all-reduce of each rank's partial sums.

A DTensor whose last axis is split over a mesh axis holds a slice of every row on each rank. A family with a
sharded path of its own (``NormFamily.sharded_backward = "row_sums"``: LayerNorm, RMSNorm) sums its slice of
each row, all-reduces those few numbers per row, and normalises its own features with the whole row's
moments; the row is never gathered, so the output keeps the input's placements. Its affine parameters are
sliced to the rank's features. The backward is one all-reduce of the gradient's row sums (the gradient of
the all-reduced sums) and, for a parameter that is replicated, an all-gather of its gradient's slices; a
parameter stored split with the features (a q/k norm over the whole width) needs none, nor does a key
norm's over key/value heads replicated over the ranks (``own_features``).
"""
from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from blockir.norms.base import is_dtensor

if TYPE_CHECKING:
    from torch import Tensor


def feature_axis(x: Any) -> int | None:
    """The mesh axis that splits ``x``'s last axis (its features), or None: not a DTensor, or whole rows."""
    if not is_dtensor(x):
        return None
    return next((i for i, p in enumerate(x.placements) if p.is_shard(x.ndim - 1)), None)


@cache
def _row_sums() -> Any:
    import torch

    class RowSums(torch.autograd.Function):
        """All-reduce of each rank's partial row sums. Every rank's sums feed the same whole-row moments, so
        the gradient of one rank's sums is the sum of all ranks' gradients: an all-reduce backward as well."""

        @staticmethod
        def forward(ctx: Any, sums: Tensor, group: str) -> Tensor:  # type: ignore[override]
            ctx.group = group
            return _all_reduce(sums, group)

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
            return _all_reduce(grad.contiguous(), ctx.group), None
    return RowSums


def _all_reduce(t: Tensor, group: str) -> Tensor:
    import torch
    ops = torch.ops._c10d_functional
    return ops.wait_tensor(ops.all_reduce(t, "sum", group))


def whole_row_sums(x: Any, sums: Tensor) -> Tensor:
    """The sums over whole rows of ``x`` (a feature-sharded DTensor) from this rank's ``sums`` of its slice."""
    axis = feature_axis(x)
    return _row_sums().apply(sums, x.device_mesh.get_group(axis).group_name)


def own_features(x: Any, p: Any) -> Tensor:
    """This rank's slice of ``p``, a parameter over ``x``'s features, as a plain tensor. A replicated
    parameter is sliced (its gradient's slices are all-gathered in backward); one already split with the
    features is this rank's shard as it is (no collective either way).

    A parameter narrower than ``x``'s rows is over features that several ranks hold alike: key/value heads
    replicated over more ranks than there are of them, each rank holding its head's features, so that the
    ranks' slices together are the key row with each head repeated once per rank that computes it (the
    ranks that share a head are consecutive). The moments of that row are the key row's; the rank takes its
    head's block of the replicated parameter, whose gradient, from that rank's query heads only, is then a
    pending sum over the ranks."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    mesh, axis = x.device_mesh, feature_axis(x)
    shared = x.shape[-1] // p.shape[0]
    if shared > 1:
        width = x.to_local().shape[-1]
        block = mesh.get_local_rank(axis) // shared
        grads = [Partial() if i == axis else q for i, q in enumerate(p.placements)]
        return p.to_local(grad_placements=grads)[block * width:(block + 1) * width]
    own = [Shard(0) if i == axis else Replicate() for i in range(mesh.ndim)]
    return p.redistribute(mesh, own).to_local()


def like(x: Any, local: Tensor) -> Any:
    """``local``, this rank's features of a result of ``x``'s shape, as a DTensor placed as ``x`` is."""
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())
