"""DTensor sharding rules of the fused add+norm ops (``torch.ops.blockir.*``), so a fused module runs on DTensors.

A boundary normalises each row of the stream over its last axis, so it runs unchanged on any slice of whole
rows: with the stream (branch, residual and their gradients) sharded on a leading axis and the parameters
replicated, every output is sharded the same way, the row statistics too (they keep the stream's leading
axes), and each parameter gradient is a sum over the rows a rank holds, a pending sum over the ranks.
Everything replicated computes replicated. A stream sharded on its feature axis matches no rule, since the
statistics need the whole row: DTensor would gather it first, so ``fused_boundary`` never hands the ops one
(``blockir.lower.fused.feature_sharded`` composes that boundary instead).

A dropout key on a sharded stream matches only the replicated rule: the op draws its mask by the rows it
sees, and a slice's rows are not the whole tensor's (``fused_boundary`` drops out before the op there).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.experimental import register_sharding

from blockir.lower.fused.ops import LAYER_TENSORS, RMS_TENSORS  # importing ops registers torch.ops.blockir.*
from blockir.lower.fused.spec import BackwardInputs

# the tensors holding rows of the stream (its values, gradients and statistics); the others are parameters and
# the dropout key
STREAM = frozenset({"branch", "residual", "grad_normalized", "grad_residual_out", "residual_out", "mean", "rstd"})


def _inputs(names: tuple[str, ...], args: tuple[Any, ...], stream: Any) -> list[Any]:
    """Each tensor argument's placement: ``stream`` for the stream's, replicated for the rest; None where absent."""
    return [None if not isinstance(a, DTensorSpec) else stream if name in STREAM else Replicate()
            for name, a in zip(names, args)]


def _rows(stream: DTensorSpec, key: object) -> range:
    """The axes the stream can be split on: its leading ones, unless a dropout key keys the mask by rows."""
    return range(0 if isinstance(key, DTensorSpec) else stream.ndim - 1)


Rules = list[tuple[list[Any], list[Any]]]  # (output placements, input placements) per strategy


def _forward(names: tuple[str, ...], stats: int) -> Callable[..., Rules]:
    def rule(*args: Any) -> Rules:
        by_name = dict(zip(names, args))
        out = [([Replicate()] * (2 + stats), _inputs(names, args, Replicate()))]
        for axis in _rows(by_name["residual"], by_name["dropout_key"]):
            out.append(([Shard(axis)] * (2 + stats), _inputs(names, args, Shard(axis))))
        return out
    return rule


register_sharding(torch.ops.blockir.add_layer_norm.default)(_forward(LAYER_TENSORS, stats=2))
register_sharding(torch.ops.blockir.add_rms_norm.default)(_forward(RMS_TENSORS, stats=1))


@register_sharding(torch.ops.blockir.add_norm_backward.default)
def _backward(*args: Any) -> Rules:
    t = BackwardInputs(*args[:len(BackwardInputs._fields)])
    names = BackwardInputs._fields
    # an absent gradient is an empty tensor, replicated; the present ones sum over the rows of each rank
    present = [t.weight, t.bias, t.branch_bias, t.branch_scale if t.branch is not None else None]
    out = [([Replicate()] * 6, _inputs(names, args, Replicate()))]
    for axis in _rows(t.residual_out, t.dropout_key):
        grads = [Partial() if isinstance(p, DTensorSpec) else Replicate() for p in present]
        out.append(([Shard(axis), Shard(axis), *grads], _inputs(names, args, Shard(axis))))
    return out
