"""Reference numerics for dropout, stochastic depth, gates and activations (each norm family's are in its
own file under ``blockir/norms``).

These functions are the eager ground truth that compiled graphs and fused kernels are checked
against, so each one pins down the exact order of operations of the implementation it stands for
(transformers' ACT2FN functions bit for bit).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from blockir.lower.rng import keep_block, keep_mask, layer_keep
from blockir.lower.layers.zigzag import zigzag_runs
from blockir.norms.base import is_dtensor, offset_weight  # noqa: F401  (the learned scales' gain, as a norm's)

DROPOUT_BROADCASTS = ("element", "row", "channel", "sample")


def complement(z: Tensor) -> Tensor:
    """``1 - z``, the complementary gate of a convex combination."""
    return 1 - z


def dropout_mask_shape(shape: tuple[int, ...], broadcast: str) -> tuple[int, ...]:
    """Shape of the keep mask for one broadcast policy; size-1 axes share one draw.

    ``element`` draws per coordinate, ``row`` per token row (the last axis
    shares it), ``channel`` per (sample, channel) across all rows, and
    ``sample`` once per leading-axis entry (stochastic depth).
    """
    shape = tuple(shape)
    if not shape:
        raise ValueError("dropout needs a tensor with at least one axis")
    if broadcast == "element":
        return shape
    if broadcast == "row":
        return shape[:-1] + (1,)
    if broadcast == "channel":
        if len(shape) < 2:
            raise ValueError("channel dropout needs a leading sample axis and a channel axis")
        return (shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],)
    if broadcast == "sample":
        return (shape[0],) + (1,) * (len(shape) - 1)
    raise ValueError(f"unknown dropout broadcast {broadcast!r}; expected one of {DROPOUT_BROADCASTS}")


def dropout(x: Tensor, p: float, broadcast: str, training: bool, key: int | Tensor | None) -> Tensor:
    """Inverted dropout whose mask is a pure function of ``(key, row, col)`` of the mask.

    Kept values are scaled by ``1 / (1 - p)`` so the expectation is
    unchanged; dropped values are exactly zero. Because the mask is hashed
    from coordinates rather than drawn from a stateful generator, recomputing
    the forward with the same key replays the same mask, and a 0-d tensor
    key stays inside a traced graph. Inside a data-parallel forward
    (``BatchSlice``) the coordinates are those of the global batch.
    """
    mask_shape = dropout_mask_shape(tuple(x.shape), broadcast)
    if not training or p == 0.0:
        return x
    index, count = BatchSlice.current
    if is_dtensor(x):
        return _sharded_dropout(x, p, mask_shape, key, index, count)
    if count == 1:
        rows = math.prod(mask_shape[:-1])
        keep = keep_mask(key, p, rows=rows, cols=mask_shape[-1], device=x.device).reshape(mask_shape)
    else:
        start = (index * mask_shape[0],) + (0,) * (len(mask_shape) - 1)
        keep = keep_block(key, p, _global_batch(mask_shape, count), start, mask_shape, device=x.device)  # type: ignore[arg-type]
    return torch.where(keep, x * (1.0 / (1.0 - p)), 0.0)


class BatchSlice:
    """The slice of the global batch (axis 0) this process runs: ``(index, count)``, slice ``index`` of
    ``count`` equal ones, as a data-parallel rank does. Set only inside :func:`batch_slice`, for the
    duration of one data-parallel forward; a plain class attribute, which a compiled graph reads (and guards
    on) like a constant."""

    current: tuple[int, int] = (0, 1)


@contextmanager
def batch_slice(index: int, count: int) -> Iterator[None]:
    """Key dropout by slice ``index`` of ``count`` of the global batch while the block runs; the previous
    slice is restored however the block ends (a forward that raises leaves no slice behind)."""
    with _setting(BatchSlice, (index, count)):
        yield


class SequenceOrder:
    """Where a load-balanced context-parallel stream holds its rows in zig-zag order
    (``blockir.lower.layers.zigzag``): ``(axis, chunks)``, the stream's sequence axis and its 2P chunks; None
    otherwise. Set only inside :func:`sequence_order`, for the duration of one forward, so that dropout on a
    distributed stream keys each row by its position in the sequence, not in the stream."""

    current: tuple[int, int] | None = None


@contextmanager
def sequence_order(axis: int, chunks: int) -> Iterator[None]:
    """Key dropout of distributed tensors by the zig-zag order's sequence positions while the block runs."""
    with _setting(SequenceOrder, (axis, chunks)):
        yield


@contextmanager
def _setting(holder: type, value: object) -> Iterator[None]:
    """``holder.current`` set to ``value`` for the block, the previous one restored however the block ends."""
    outer = holder.current  # type: ignore[attr-defined]
    holder.current = value  # type: ignore[attr-defined]
    try:
        yield
    finally:
        holder.current = outer  # type: ignore[attr-defined]


def _global_batch(shape: tuple[int, ...], count: int) -> tuple[int, ...]:
    return (shape[0] * count,) + shape[1:]


def meeting(param: Tensor | None, x: Tensor) -> Tensor | None:
    """``param`` as it meets ``x``: a distributed parameter applied to a rank's own plain tensor (a q/k norm
    or gain inside an attention branch that holds some of the heads) is used through its local part. A
    replicated one then gets a pending-sum gradient, since each rank applies it to other data; a sharded
    one keeps its shard's gradient."""
    if param is None or not is_dtensor(param) or is_dtensor(x):
        return param
    from torch.distributed.tensor import Partial
    grads = [Partial() if p.is_replicate() else p for p in param.placements]  # type: ignore[attr-defined]
    return param.to_local(grad_placements=grads)  # type: ignore[attr-defined]


def _sharded_dropout(x: Tensor, p: float, mask_shape: tuple[int, ...], key: int | Tensor | None,
                     index: int, count: int) -> Tensor:
    """Dropout of a distributed tensor: each rank draws the decisions of the logical coordinates it holds.

    Rows split over ranks (sequence parallelism) or features split (hidden sharding) then get exactly the
    mask of the unsharded run; a replicated or pending-sum operand draws the whole mask on every rank,
    which for a pending sum is the mask of the sum, since dropout with a fixed mask is linear. Slice
    ``index`` of ``count`` of the batch is offset into the global batch, as in ``dropout``.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    placements = [Replicate() if isinstance(pl, Partial) else pl for pl in x.placements]
    local_shape, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, placements)
    start = tuple(0 if m == 1 else o for m, o in zip(mask_shape, offset))
    start = (start[0] + index * mask_shape[0],) + start[1:]
    size = tuple(1 if m == 1 else n for m, n in zip(mask_shape, local_shape))
    local = x.to_local()
    whole = _global_batch(mask_shape, count)
    order = SequenceOrder.current
    if order is None or mask_shape[order[0]] == 1:
        keep = keep_block(key, p, whole, start, size, device=local.device)  # type: ignore[arg-type]
    else:  # the rows held, in zig-zag order: each run of sequence positions is a block of the whole mask
        axis, chunks = order
        keep = torch.cat([keep_block(key, p, whole, start[:axis] + (first,) + start[axis + 1:],  # type: ignore[arg-type]
                                     size[:axis] + (n,) + size[axis + 1:], device=local.device)
                          for first, n in zigzag_runs(start[axis], size[axis], mask_shape[axis], chunks)], dim=axis)
    out = torch.where(keep, local * (1.0 / (1.0 - p)), 0.0)
    return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def layer_drop(x: Tensor, p: float, training: bool, key: int | Tensor | None) -> Tensor:
    """LayerDrop: ``x`` or zeros, one decision for the whole tensor, kept values not rescaled.

    The decision depends on ``key`` alone, so every site that shares the key
    (all updates of one layer) is kept or dropped together.
    """
    if not training or p == 0.0:
        return x
    return torch.where(layer_keep(key, p).to(x.device), x, 0.0)  # type: ignore[arg-type]


def _identity(x: Tensor) -> Tensor:
    return x


# transformers' ACT2FN functions, written with the same operations in the same order so that
# fp32 and bf16 results agree bit for bit with the checkpoints' own code
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: Tensor) -> Tensor:
    # a named function, not a partial: fx code generation needs a qualified name for every call
    return F.gelu(x, approximate="tanh")


def _gelu_new(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_python_tanh(x: Tensor) -> Tensor:
    return x * 0.5 * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _gelu_accurate(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def _gelu_python(x: Tensor) -> Tensor:
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _gelu_10(x: Tensor) -> Tensor:
    return torch.clip(F.gelu(x), -10, 10)


def _quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


def _relu2(x: Tensor) -> Tensor:
    return torch.square(F.relu(x))


def _laplace(x: Tensor, mu: float = 0.707107, sigma: float = 0.282095) -> Tensor:
    x = (x - mu).div(sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + torch.erf(x))


class _BloomGelu(torch.autograd.Function):
    """BLOOM's tanh GELU with its own written-out derivative (the backward its checkpoints were trained with)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
        return ff * g


def _gelu_bloom(x: Tensor) -> Tensor:
    return _BloomGelu.apply(x)


def _sqrtsoftplus(x: Tensor) -> Tensor:
    return F.softplus(x).sqrt()


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": F.silu,
    "tanh": torch.tanh,
    "identity": _identity,
    "gelu_new": _gelu_new,
    "gelu_fast": _gelu_fast,
    "gelu_accurate": _gelu_accurate,
    "gelu_python": _gelu_python,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_python_tanh,
    "gelu_10": _gelu_10,
    "quick_gelu": _quick_gelu,
    "relu2": _relu2,
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "laplace": _laplace,
    "sqrtsoftplus": _sqrtsoftplus,
    "swish": F.silu,
    "gelu_bloom": _gelu_bloom,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
}
