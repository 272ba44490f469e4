"""Reference numerics for the norm families, dropout and activations.

These functions are the eager ground truth that compiled graphs and fused
kernels are checked against, so each one pins down the exact order of
casts and reductions of the implementation it stands for (PyTorch
``nn.LayerNorm``; the RMSNorm variants in HF transformers). Two norms with
the same formula but a different cast order give different bf16 results, and
a checkpoint is only reproduced by the order it was trained with.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blockir.lower.rng import keep_block, keep_mask, layer_keep

ACCUM: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
}

RMS_CASTS = ("before_weight", "after_weight", "weight_dtype")
DROPOUT_BROADCASTS = ("element", "row", "channel", "sample")
_NATIVE_LAYER_NORM_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    accum: torch.dtype = torch.float32,
    offset: int = 0,
    two_pass: bool = False,
    recenter: bool = False,
    upcast: bool = False,
) -> Tensor:
    """LayerNorm over the last axis: biased variance, ``eps`` inside the square root.

    With fp32 statistics on an fp32/bf16/fp16 input this is exactly the ATen
    kernel behind ``nn.LayerNorm``, so checkpoints trained with it are
    reproduced bit for bit. Any other accumulation dtype, or ``two_pass``, is
    spelled out: ``x`` in ``accum``, its mean, the mean of the squared
    deviations, ``(x - mean) * rsqrt(var + eps)``, the affine in ``accum``, one
    cast back at the end — bit for bit what code written that way computes.
    ``offset=1`` scales by ``1 + weight``, the one added in the weight's own
    dtype before the kernel runs (Megatron's LayerNorm1P).
    """
    if weight is not None:
        weight = offset_weight(weight, offset)
    if _is_dtensor(x) and any(p.is_shard(x.ndim - 1) for p in x.placements):  # type: ignore[attr-defined]
        return _feature_sharded_layer_norm(x, weight, bias, eps, accum)
    if upcast and not two_pass:
        cast = (lambda t: t.to(accum) if t is not None else None)
        return F.layer_norm(x.to(accum), (x.shape[-1],), cast(weight), cast(bias), eps).to(x.dtype)
    if not two_pass and accum == torch.float32 and x.dtype in _NATIVE_LAYER_NORM_INPUTS:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    work = x.to(accum)
    mean = work.mean(-1, keepdim=True)
    centered = work - mean
    variance = centered.pow(2).mean(-1, keepdim=True)
    # a second subtraction holds the same values, but autograd sums the input's gradient over both nodes
    y = (work - mean if recenter else centered) * torch.rsqrt(variance + eps)
    if weight is not None:
        y = y * weight.to(accum)
    if bias is not None:
        y = y + bias.to(accum)
    return y.to(x.dtype)


class _RowSums(torch.autograd.Function):
    """All-reduce of each rank's partial row sums. Every rank's sums feed the same whole-row moments, so the
    gradient of one rank's sums is the sum of all ranks' gradients: an all-reduce backward as well."""

    @staticmethod
    def forward(ctx, sums: Tensor, group: str) -> Tensor:  # type: ignore[override]
        ctx.group = group
        return _all_reduce(sums, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return _all_reduce(grad.contiguous(), ctx.group), None


def _all_reduce(t: Tensor, group: str) -> Tensor:
    ops = torch.ops._c10d_functional
    return ops.wait_tensor(ops.all_reduce(t, "sum", group))


def _feature_sharded_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                                accum: torch.dtype) -> Tensor:
    """LayerNorm of rows whose features are split over ranks, the output split the same way.

    Each rank sums its slice of every row, Σx and Σx², and one all-reduce of those two numbers per row gives
    the row's mean and biased variance (E[x²] − mean²); the affine parameters are sliced to the rank's
    features. The whole row is never gathered, so a Post-LN stream stays feature-sharded. The single pass
    replaces ``two_pass`` here: its answer differs from the one-device kernel by rounding only.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard
    mesh, placements = x.device_mesh, x.placements  # type: ignore[attr-defined]
    axis = next(i for i, p in enumerate(placements) if p.is_shard(x.ndim - 1))
    local = x.to_local().to(accum)  # type: ignore[attr-defined]
    sums = torch.stack((local.sum(-1), local.pow(2).sum(-1)), dim=-1)
    sums = _RowSums.apply(sums, mesh.get_group(axis).group_name)
    mean = sums[..., :1] / x.shape[-1]
    variance = (sums[..., 1:] / x.shape[-1] - mean * mean).clamp_min(0)
    y = (local - mean) * torch.rsqrt(variance + eps)
    own = [Shard(0) if i == axis else Replicate() for i in range(mesh.ndim)]
    for p, combine in ((weight, torch.mul), (bias, torch.add)):
        if p is not None:
            part = p.redistribute(mesh, own).to_local()  # type: ignore[attr-defined]
            y = combine(y, part.to(accum))
    return DTensor.from_local(y.to(x.dtype), mesh, placements, run_check=False, shape=x.shape, stride=x.stride())


def _rms_normalize(work: Tensor, eps: float) -> Tensor:
    """Divide each row by its root mean square; ``work`` is already in the accumulation dtype."""
    return work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)


def offset_weight(weight: Tensor, offset: int) -> Tensor:
    """The effective scale: ``weight`` itself, or ``offset + weight`` for zero-centred storage.

    Offset 0 skips the addition so that the multiply sees the stored tensor
    unchanged, as the reference classes do.
    """
    return weight if offset == 0 else offset + weight


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    offset: int = 0,
    cast: str = "before_weight",
    accum: torch.dtype = torch.float32,
) -> Tensor:
    """RMSNorm over the last axis with one of three cast orders.

    ``before_weight`` (LLaMA): normalize in ``accum``, cast back to the input
    dtype, then multiply by the weight. ``after_weight`` (Gemma2, OLMo2):
    multiply by the weight in ``accum``, then cast back. ``weight_dtype``
    (T5): only the mean square is taken in ``accum``; the input itself is
    scaled in its promoted dtype and cast to the weight's dtype when that is
    a half type. ``offset=1`` scales by ``1 + weight`` (weights stored as a
    deviation from one). Without a weight the scale is one and only the casts remain.
    """
    if weight is None and cast in RMS_CASTS:
        # weight_dtype scales the input in its own dtype; the other orders scale it in accum
        work = x if cast == "weight_dtype" else x.to(accum)
        return (work * torch.rsqrt(x.to(accum).pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
    if cast == "before_weight":
        normalized = _rms_normalize(x.to(accum), eps)
        return offset_weight(weight, offset) * normalized.to(x.dtype)
    if cast == "after_weight":
        normalized = _rms_normalize(x.to(accum), eps)
        return (normalized * offset_weight(weight.to(accum), offset)).type_as(x)
    if cast == "weight_dtype":
        variance = x.to(accum).pow(2).mean(-1, keepdim=True)
        normalized = x * torch.rsqrt(variance + eps)
        if weight.dtype in _HALF_DTYPES:
            normalized = normalized.to(weight.dtype)
        return offset_weight(weight, offset) * normalized
    raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {RMS_CASTS}")


def scale_norm(x: Tensor, scale: Tensor, eps: float, offset: int = 0) -> Tensor:
    """ScaleNorm: one learned scalar (``1 + scale`` with ``offset=1``) times the row divided by its L2 norm.

    The norm is clamped at ``eps`` rather than offset by it, so rows far from
    zero are normalized exactly and an all-zero row maps to zero.
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
    return offset_weight(scale, offset) * (x / norm)


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """``F.normalize`` over the last axis: the row over its L2 norm clamped at ``eps`` (not ``eps`` under the root)."""
    return F.normalize(x, p=2.0, dim=-1, eps=eps)


def dyt(x: Tensor, alpha: Tensor, weight: Tensor, bias: Tensor, offset: int = 0) -> Tensor:
    """Dynamic Tanh: an elementwise ``weight * tanh(alpha * x) + bias`` (``1 + weight`` with ``offset=1``)."""
    return offset_weight(weight, offset) * torch.tanh(alpha * x) + bias


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
    if _is_dtensor(x):
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
    outer = BatchSlice.current
    BatchSlice.current = (index, count)
    try:
        yield
    finally:
        BatchSlice.current = outer


def _global_batch(shape: tuple[int, ...], count: int) -> tuple[int, ...]:
    return (shape[0] * count,) + shape[1:]


def _is_dtensor(x: Tensor) -> bool:
    # a DTensor exists only once its module is loaded, so single-device runs never import it
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)


def meeting(param: Tensor | None, x: Tensor) -> Tensor | None:
    """``param`` as it meets ``x``: a distributed parameter applied to a rank's own plain tensor (a q/k norm
    or gain inside an attention branch that holds some of the heads) is used through its local part. A
    replicated one then gets a pending-sum gradient, since each rank applies it to other data; a sharded
    one keeps its shard's gradient."""
    if param is None or not _is_dtensor(param) or _is_dtensor(x):
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
    keep = keep_block(key, p, _global_batch(mask_shape, count), start, size, device=local.device)  # type: ignore[arg-type]
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


class _NormParams(nn.Module):
    """A norm whose parameters may be stored under a checkpoint's own names (``g``, ``gamma``, ``beta``, …).

    ``keys`` maps a role (``weight``, ``bias``, ``scale``, ``alpha``) to the name it is registered under;
    readers ask ``param(role)``, so the arithmetic never depends on the name.
    """

    keys: dict[str, str] = {}

    def _register(self, role: str, value: nn.Parameter | None) -> None:
        self.register_parameter(self.keys.get(role, role), value)

    def param(self, role: str) -> nn.Parameter | None:
        return self._parameters.get(self.keys.get(role, role))


class LayerNorm(_NormParams):
    """LayerNorm whose ``weight``/``bias`` keys match ``nn.LayerNorm`` checkpoints (or the names in ``keys``)."""

    def __init__(
        self,
        width: int,
        eps: float = 1e-5,
        bias: bool = True,
        affine: bool = True,
        accum: torch.dtype = torch.float32,
        offset: int = 0,
        two_pass: bool = False,
        keys: dict[str, str] | None = None,
        recenter: bool = False,
        upcast: bool = False,
    ) -> None:
        super().__init__()
        # the zero init for offset=1 keeps the initial scale at one; settings as in RMSNorm
        vars(self).update(width=width, eps=eps, accum=accum, offset=offset, two_pass=two_pass, keys=keys or {},
                          recenter=recenter, upcast=upcast)
        self._register("weight", nn.Parameter(torch.full((width,), 1.0 - offset)) if affine else None)
        self._register("bias", nn.Parameter(torch.zeros(width)) if affine and bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, meeting(self.param("weight"), x), meeting(self.param("bias"), x), self.eps, self.accum,
                          self.offset, self.two_pass, self.recenter, self.upcast)

    def extra_repr(self) -> str:
        affine, bias = self.param("weight") is not None, self.param("bias") is not None
        return (f"{self.width}, eps={self.eps}, bias={bias}, affine={affine}, accum={self.accum}, "
                f"offset={self.offset}, two_pass={self.two_pass}")


class RMSNorm(_NormParams):
    """RMSNorm with a declared cast order; the zero init for ``offset=1`` keeps the initial scale at one."""

    def __init__(
        self,
        width: int,
        eps: float = 1e-6,
        offset: int = 0,
        cast: str = "before_weight",
        accum: torch.dtype = torch.float32,
        affine: bool = True,
        keys: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        if cast not in RMS_CASTS:
            raise ValueError(f"unknown RMSNorm cast order {cast!r}; expected one of {RMS_CASTS}")
        # plain settings straight to __dict__: nn.Module.__setattr__ costs ~1.5 µs each, paid per layer
        vars(self).update(width=width, eps=eps, offset=offset, cast=cast, accum=accum, keys=keys or {})
        weight = nn.Parameter(torch.zeros(width) if offset else torch.ones(width)) if affine else None
        self._register("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, meeting(self.param("weight"), x), self.eps, self.offset, self.cast, self.accum)

    def extra_repr(self) -> str:
        return f"{self.width}, eps={self.eps}, offset={self.offset}, cast={self.cast}, accum={self.accum}"


class ScaleNorm(_NormParams):
    """ScaleNorm; the scalar starts at ``sqrt(width)`` so outputs begin with unit RMS like RMSNorm."""

    def __init__(self, width: int, eps: float = 1e-5, offset: int = 0, keys: dict[str, str] | None = None) -> None:
        super().__init__()
        vars(self).update(width=width, eps=eps, offset=offset, keys=keys or {})
        self._register("scale", nn.Parameter(torch.tensor(math.sqrt(width) - offset)))

    def forward(self, x: Tensor) -> Tensor:
        return scale_norm(x, self.param("scale"), self.eps, self.offset)

    def extra_repr(self) -> str:
        return f"{self.width}, eps={self.eps}, offset={self.offset}"


class L2Norm(nn.Module):
    """``F.normalize`` over the last axis; learns nothing."""

    def __init__(self, width: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.width = width
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return l2_norm(x, self.eps)

    def extra_repr(self) -> str:
        return f"{self.width}, eps={self.eps}"


class DyT(_NormParams):
    """Dynamic Tanh with the paper's init: ``weight`` ones, ``bias`` zeros, a one-element ``alpha``."""

    def __init__(self, width: int, alpha_init: float = 0.5, offset: int = 0,
                 keys: dict[str, str] | None = None) -> None:
        super().__init__()
        vars(self).update(width=width, offset=offset, keys=keys or {})
        self._register("alpha", nn.Parameter(torch.full((1,), float(alpha_init))))
        self._register("weight", nn.Parameter(torch.full((width,), 1.0 - offset)))
        self._register("bias", nn.Parameter(torch.zeros(width)))

    def forward(self, x: Tensor) -> Tensor:
        return dyt(x, self.param("alpha"), self.param("weight"), self.param("bias"), self.offset)

    def extra_repr(self) -> str:
        return f"{self.width}, offset={self.offset}"


# torch.fx.symbolic_trace records each norm as one call (as it does F.layer_norm) instead of
# tracing into the dtype checks that pick its cast order.
for _name in ("layer_norm", "rms_norm", "scale_norm", "dyt", "l2_norm"):
    torch.fx.wrap(_name)
