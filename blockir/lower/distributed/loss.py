"""Cross-entropy of logits split by vocabulary, under ``torch.distributed.tensor.parallel.loss_parallel``.

A vocab-parallel head returns its logits as a ``Shard(-1)`` DTensor. ``loss_parallel`` computes the
log-softmax and the picked target logits on each rank's columns, with all-reduces of one value per row
(the maximum, the sum of exponentials, the target's logit), so the ``[N, V]`` logits are never gathered.
Its backward must run inside the context as well; ``cross_entropy`` records the loss's graph inside it
and replays the backward there, so a training loop calls ``loss.backward()`` as it would on one device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel


class _LossParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: DTensor, target: torch.Tensor) -> DTensor:  # type: ignore[override]
        with torch.enable_grad(), loss_parallel():
            leaf = logits.detach().requires_grad_()
            loss = F.cross_entropy(leaf, target)
        ctx.graph = (leaf, loss)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad: DTensor) -> tuple[DTensor, None]:  # type: ignore[override]
        leaf, loss = ctx.graph
        with loss_parallel():
            (dlogits,) = torch.autograd.grad(loss, leaf, grad)
        return dlogits, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[..., V]`` against class ids ``target`` ``[...]``, as a plain scalar
    on every rank; logits split by vocabulary (a ``Shard`` of the last axis) go through ``loss_parallel``."""
    flat, target = logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1)
    if isinstance(flat, DTensor) and flat.placements == (Shard(1),):
        return _LossParallel.apply(flat, target).to_local()
    return F.cross_entropy(flat, target)
