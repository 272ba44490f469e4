"""The fused residual-boundary custom ops: ``torch.ops.blockir.*``.

``add_layer_norm`` and ``add_rms_norm`` return ``(normalized, residual_out,
[mean,] rstd)``; the trailing row statistics exist so that autograd can save
them and are not differentiable. ``add_norm_backward`` is the shared
backward. Each op has a fake (meta) implementation, so ``torch.compile``
and ``torch.export`` see through them, and the backward is itself an op, so
a compiled graph keeps the fused backward instead of decomposing it.

On CUDA the ops launch the Triton kernels; without triton installed (it is the
optional ``blockir[triton]`` extra) they run the reference there too, after one
warning. On CPU they run the pure-torch
reference, or, inside :func:`cpu_kernels`, a given kernels module (the
Triton interpreter copy from ``kernels.load_interpreted``), which lets the
kernels be checked end to end without a GPU.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from types import ModuleType

import torch
from torch import Tensor

from blockir.lower.fused import reference
from blockir.lower.fused.spec import BoundarySpec, check_inputs, output_dtype

_cpu_impl: ModuleType = reference


@contextmanager
def cpu_kernels(module: ModuleType) -> Iterator[None]:
    """Run the ops' CPU path through ``module`` (same ``forward``/``backward`` as ``reference``)."""
    global _cpu_impl
    previous, _cpu_impl = _cpu_impl, module
    try:
        yield
    finally:
        _cpu_impl = previous


@lru_cache(maxsize=1)
def triton_kernels() -> ModuleType | None:
    """The Triton kernels module, or None (with one warning per process) when triton is not installed."""
    # imported on first CUDA use so that CPU-only installs never need triton
    try:
        from blockir.lower.fused import kernels
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "triton":
            raise
        warnings.warn("triton is not installed: the fused ops run their PyTorch reference path on CUDA "
                      "(install the Triton kernels with: pip install 'blockir[triton]')", RuntimeWarning, stacklevel=2)
        return None
    return kernels


def _cuda_impl(spec: BoundarySpec, *tensors: Tensor | None, extra: tuple[torch.dtype, ...] = ()) -> ModuleType:
    """The Triton kernels when installed and covering the dtypes, else the reference (it runs on CUDA too)."""
    kernels = triton_kernels()
    dtypes = tuple(t.dtype for t in tensors if t is not None) + extra
    return kernels if kernels is not None and kernels.supports(spec, *dtypes) else reference


def _spec_ln(eps: float, p: float, training: bool, branch_scale_const: float, shortcut_scale: float,
             out_dtype: torch.dtype | None, accum: torch.dtype) -> BoundarySpec:
    return BoundarySpec("layernorm", eps, p=p, training=training, branch_scale_const=branch_scale_const,
                        shortcut_scale=shortcut_scale, out_dtype=out_dtype, accum=accum)


def _spec_rms(eps: float, offset: int, cast: str, p: float, training: bool, branch_scale_const: float,
              shortcut_scale: float, out_dtype: torch.dtype | None, accum: torch.dtype) -> BoundarySpec:
    return BoundarySpec("rmsnorm", eps, offset=offset, cast=cast, p=p, training=training,
                        branch_scale_const=branch_scale_const, shortcut_scale=shortcut_scale,
                        out_dtype=out_dtype, accum=accum)


def _contiguous(*ts: Tensor) -> tuple[Tensor, ...]:
    # the fake kernels promise contiguous outputs, whatever layout the eager ops would pick
    return tuple(t.contiguous() for t in ts)


# ---- add_layer_norm -------------------------------------------------------------------------


@torch.library.custom_op("blockir::add_layer_norm", mutates_args=())
def add_layer_norm(
    branch: Tensor,
    residual: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    branch_bias: Tensor | None,
    branch_scale: Tensor | None,
    dropout_key: Tensor | None,
    eps: float,
    p: float,
    training: bool,
    branch_scale_const: float,
    shortcut_scale: float,
    out_dtype: torch.dtype | None,
    accum: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    spec = _spec_ln(eps, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, bias, branch_bias, branch_scale, dropout_key)
    return _contiguous(*_cpu_impl.forward(branch, residual, weight, bias, branch_bias, branch_scale, dropout_key, spec))


@add_layer_norm.register_kernel("cuda")
def _add_layer_norm_cuda(branch, residual, weight, bias, branch_bias, branch_scale, dropout_key, eps, p, training,
                         branch_scale_const, shortcut_scale, out_dtype, accum):
    spec = _spec_ln(eps, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, bias, branch_bias, branch_scale, dropout_key)
    impl = _cuda_impl(spec, branch, residual, weight, bias, branch_bias, branch_scale)
    return _contiguous(*impl.forward(branch, residual, weight, bias, branch_bias, branch_scale, dropout_key, spec))


def _fake_forward(residual: Tensor, weight: Tensor | None, spec: BoundarySpec, stats: int) -> tuple[Tensor, ...]:
    rows = math.prod(residual.shape[:-1])
    dtype = output_dtype(spec, residual.dtype, None if weight is None else weight.dtype)
    normalized = residual.new_empty(residual.shape, dtype=dtype)
    return (normalized, residual.new_empty(residual.shape)) + tuple(
        residual.new_empty((rows,), dtype=spec.accum) for _ in range(stats)
    )


@add_layer_norm.register_fake
def _(branch, residual, weight, bias, branch_bias, branch_scale, dropout_key, eps, p, training, branch_scale_const,
      shortcut_scale, out_dtype, accum):
    spec = _spec_ln(eps, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, bias, branch_bias, branch_scale, dropout_key)
    return _fake_forward(residual, weight, spec, stats=2)


def _setup_layer_norm(ctx, inputs, output) -> None:
    branch, _, weight, bias, branch_bias, branch_scale, dropout_key, *static = inputs
    _, residual_out, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.spec = _spec_ln(*static)
    _save(ctx, branch, residual_out, mean, rstd, weight, bias, branch_bias, branch_scale, dropout_key, scale_index=5)


def _backward_layer_norm(ctx, grad_normalized, grad_residual_out, _grad_mean, _grad_rstd):
    return _backward(ctx, grad_normalized, grad_residual_out) + (None,) * 8


add_layer_norm.register_autograd(_backward_layer_norm, setup_context=_setup_layer_norm)


# ---- add_rms_norm ---------------------------------------------------------------------------


@torch.library.custom_op("blockir::add_rms_norm", mutates_args=())
def add_rms_norm(
    branch: Tensor,
    residual: Tensor,
    weight: Tensor,
    branch_bias: Tensor | None,
    branch_scale: Tensor | None,
    dropout_key: Tensor | None,
    eps: float,
    offset: int,
    cast: str,
    p: float,
    training: bool,
    branch_scale_const: float,
    shortcut_scale: float,
    out_dtype: torch.dtype | None,
    accum: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    spec = _spec_rms(eps, offset, cast, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, None, branch_bias, branch_scale, dropout_key)
    normalized, residual_out, _, rstd = _cpu_impl.forward(
        branch, residual, weight, None, branch_bias, branch_scale, dropout_key, spec
    )
    return _contiguous(normalized, residual_out, rstd)


@add_rms_norm.register_kernel("cuda")
def _add_rms_norm_cuda(branch, residual, weight, branch_bias, branch_scale, dropout_key, eps, offset, cast, p,
                       training, branch_scale_const, shortcut_scale, out_dtype, accum):
    spec = _spec_rms(eps, offset, cast, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, None, branch_bias, branch_scale, dropout_key)
    impl = _cuda_impl(spec, branch, residual, weight, branch_bias, branch_scale)
    normalized, residual_out, _, rstd = impl.forward(
        branch, residual, weight, None, branch_bias, branch_scale, dropout_key, spec
    )
    return _contiguous(normalized, residual_out, rstd)


@add_rms_norm.register_fake
def _(branch, residual, weight, branch_bias, branch_scale, dropout_key, eps, offset, cast, p, training,
      branch_scale_const, shortcut_scale, out_dtype, accum):
    spec = _spec_rms(eps, offset, cast, p, training, branch_scale_const, shortcut_scale, out_dtype, accum)
    check_inputs(spec, branch, residual, weight, None, branch_bias, branch_scale, dropout_key)
    return _fake_forward(residual, weight, spec, stats=1)


def _setup_rms_norm(ctx, inputs, output) -> None:
    branch, _, weight, branch_bias, branch_scale, dropout_key, *static = inputs
    _, residual_out, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.spec = _spec_rms(*static)
    _save(ctx, branch, residual_out, None, rstd, weight, None, branch_bias, branch_scale, dropout_key, scale_index=4)


def _backward_rms_norm(ctx, grad_normalized, grad_residual_out, _grad_rstd):
    d_branch, d_residual, d_weight, _, d_branch_bias, d_scale = _backward(ctx, grad_normalized, grad_residual_out)
    return (d_branch, d_residual, d_weight, d_branch_bias, d_scale) + (None,) * 10


add_rms_norm.register_autograd(_backward_rms_norm, setup_context=_setup_rms_norm)


# ---- shared backward ------------------------------------------------------------------------


def _save(ctx, branch, residual_out, mean, rstd, weight, bias, branch_bias, branch_scale, dropout_key,
          scale_index: int) -> None:
    """Save the new residual stream and the row statistics; the branch only when its scale needs a gradient."""
    keep_branch = branch_scale is not None and ctx.needs_input_grad[scale_index]
    ctx.branch_dtype = branch.dtype
    ctx.save_for_backward(residual_out, mean, rstd, branch if keep_branch else None, weight, bias, branch_bias,
                          branch_scale, dropout_key)


def _backward(ctx, grad_normalized: Tensor, grad_residual_out: Tensor | None) -> tuple[Tensor | None, ...]:
    residual_out, mean, rstd, branch, weight, bias, branch_bias, branch_scale, dropout_key = ctx.saved_tensors
    s: BoundarySpec = ctx.spec
    grads = add_norm_backward(
        grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias, branch_bias, branch_scale,
        dropout_key, s.family, s.eps, s.offset, s.cast, s.p, s.training, s.branch_scale_const, s.shortcut_scale,
        ctx.branch_dtype, s.accum,
    )
    d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_scale = grads
    return (
        d_branch,
        d_residual,
        d_weight if weight is not None else None,
        d_bias if bias is not None else None,
        d_branch_bias if branch_bias is not None else None,
        d_scale if branch is not None else None,
    )


@torch.library.custom_op("blockir::add_norm_backward", mutates_args=())
def add_norm_backward(
    grad_normalized: Tensor,
    grad_residual_out: Tensor | None,
    residual_out: Tensor,
    mean: Tensor | None,
    rstd: Tensor,
    branch: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    branch_bias: Tensor | None,
    branch_scale: Tensor | None,
    dropout_key: Tensor | None,
    family: str,
    eps: float,
    offset: int,
    cast: str,
    p: float,
    training: bool,
    branch_scale_const: float,
    shortcut_scale: float,
    branch_dtype: torch.dtype,
    accum: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_branch_scale)``; absent ones are empty.

    ``d_branch_scale`` is computed only when ``branch`` is given.
    """
    spec = BoundarySpec(family, eps, offset, cast, p, training, branch_scale_const, shortcut_scale, None, accum)
    grads = _cpu_impl.backward(grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias,
                               branch_bias, branch_scale, dropout_key, branch_dtype, spec)
    return _fill_absent(grads, residual_out)


@add_norm_backward.register_kernel("cuda")
def _add_norm_backward_cuda(grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias,
                            branch_bias, branch_scale, dropout_key, family, eps, offset, cast, p, training,
                            branch_scale_const, shortcut_scale, branch_dtype, accum):
    spec = BoundarySpec(family, eps, offset, cast, p, training, branch_scale_const, shortcut_scale, None, accum)
    impl = _cuda_impl(spec, grad_normalized, grad_residual_out, residual_out, branch, weight, bias, branch_bias,
                      branch_scale, extra=(branch_dtype,))
    grads = impl.backward(grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias,
                          branch_bias, branch_scale, dropout_key, branch_dtype, spec)
    return _fill_absent(grads, residual_out)


def _fill_absent(grads: tuple[Tensor | None, ...], like: Tensor) -> tuple[Tensor, ...]:
    # a custom op cannot return None, so an absent gradient travels as an empty tensor
    return tuple(like.new_empty(0) if g is None else g.contiguous() for g in grads)


@add_norm_backward.register_fake
def _(grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias, branch_bias, branch_scale,
      dropout_key, family, eps, offset, cast, p, training, branch_scale_const, shortcut_scale, branch_dtype, accum):
    def like(t: Tensor | None) -> Tensor:
        return residual_out.new_empty(0) if t is None else t.new_empty(t.shape)

    return (
        residual_out.new_empty(residual_out.shape, dtype=branch_dtype),
        residual_out.new_empty(residual_out.shape),
        like(weight),
        like(bias),
        like(branch_bias),
        like(branch_scale if branch is not None else None),
    )
