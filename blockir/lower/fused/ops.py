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

import warnings
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from blockir.lower.fused import reference
from blockir.lower.fused.spec import (
    DIFFERENTIABLE, SAVED, BackwardInputs, BoundarySpec, Family, Inputs, check_inputs, output_dtype, required,
)

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


def _data(tensors: Inputs | BackwardInputs) -> tuple[Tensor | None, ...]:
    """The tensors whose dtypes the kernels must support: all but the (int64) dropout key."""
    return tuple(t for name, t in zip(tensors._fields, tensors) if name != "dropout_key")


def _schema(tensors: Sequence[str], optional: Collection[str], statics: str, results: int) -> str:
    """An op's schema: its tensors in the boundary's order, then its static arguments."""
    args = ", ".join(f"Tensor{'?' if name in optional else ''} {name}" for name in tensors)
    return f"({args}, {statics}) -> ({', '.join(['Tensor'] * results)})"


def _spec_ln(eps: float, p: float, training: bool, branch_scale_const: float, shortcut_scale: float,
             out_dtype: torch.dtype | None, accum: torch.dtype) -> BoundarySpec:
    return BoundarySpec(Family.LAYER, eps, p=p, training=training, branch_scale_const=branch_scale_const,
                        shortcut_scale=shortcut_scale, out_dtype=out_dtype, accum=accum)


def _spec_rms(eps: float, offset: int, cast: str, p: float, training: bool, branch_scale_const: float,
              shortcut_scale: float, out_dtype: torch.dtype | None, accum: torch.dtype) -> BoundarySpec:
    return BoundarySpec(Family.RMS, eps, offset=offset, cast=cast, p=p, training=training,
                        branch_scale_const=branch_scale_const, shortcut_scale=shortcut_scale,
                        out_dtype=out_dtype, accum=accum)


# each op's tensors, derived from the boundary's: RMSNorm has a weight and no bias
LAYER_TENSORS = Inputs._fields
RMS_TENSORS = tuple(name for name in Inputs._fields if name != "bias")
_FORWARD_STATICS = "float p, bool training, float branch_scale_const, float shortcut_scale, ScalarType? out_dtype, " \
                   "ScalarType accum"
LAYER_SCHEMA = _schema(LAYER_TENSORS, set(Inputs._fields) - required(Inputs), f"float eps, {_FORWARD_STATICS}", 4)
RMS_SCHEMA = _schema(RMS_TENSORS, set(Inputs._fields) - required(Inputs) - {"weight"},
                     f"float eps, SymInt offset, str cast, {_FORWARD_STATICS}", 3)
BACKWARD_SCHEMA = _schema(BackwardInputs._fields, set(BackwardInputs._fields) - required(BackwardInputs),
                          "str family, float eps, SymInt offset, str cast, float p, bool training, "
                          "float branch_scale_const, float shortcut_scale, ScalarType branch_dtype, ScalarType accum", 6)


def _layer_args(args: Sequence[Any]) -> tuple[Inputs, BoundarySpec]:
    n = len(LAYER_TENSORS)
    return Inputs(*args[:n]), _spec_ln(*args[n:])


def _rms_args(args: Sequence[Any]) -> tuple[Inputs, BoundarySpec]:
    n = len(RMS_TENSORS)
    return Inputs(bias=None, **dict(zip(RMS_TENSORS, args[:n]))), _spec_rms(*args[n:])


def _backward_args(args: Sequence[Any]) -> tuple[BackwardInputs, torch.dtype, BoundarySpec]:
    n = len(BackwardInputs._fields)
    family, eps, offset, cast, p, training, branch_scale_const, shortcut_scale, branch_dtype, accum = args[n:]
    spec = BoundarySpec(family, eps, offset, cast, p, training, branch_scale_const, shortcut_scale, None, accum)
    return BackwardInputs(*args[:n]), branch_dtype, spec


def _contiguous(*ts: Tensor) -> tuple[Tensor, ...]:
    # the fake kernels promise contiguous outputs, whatever layout the eager ops would pick
    return tuple(t.contiguous() for t in ts)


def _forward(x: Inputs, spec: BoundarySpec, impl: ModuleType) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    check_inputs(spec, x)
    return impl.forward(x, spec)


def _fake_forward(x: Inputs, spec: BoundarySpec, stats: int) -> tuple[Tensor, ...]:
    check_inputs(spec, x)
    residual = x.residual
    dtype = output_dtype(spec, residual.dtype, None if x.weight is None else x.weight.dtype)
    normalized = residual.new_empty(residual.shape, dtype=dtype)
    return (normalized, residual.new_empty(residual.shape)) + tuple(
        residual.new_empty(residual.shape[:-1], dtype=spec.accum) for _ in range(stats)
    )


# ---- add_layer_norm -------------------------------------------------------------------------


@torch.library.custom_op("blockir::add_layer_norm", mutates_args=(), schema=LAYER_SCHEMA)
def add_layer_norm(*args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, spec = _layer_args(args)
    return _contiguous(*_forward(x, spec, _cpu_impl))


@add_layer_norm.register_kernel("cuda")
def _add_layer_norm_cuda(*args: Any) -> tuple[Tensor, ...]:
    x, spec = _layer_args(args)
    return _contiguous(*_forward(x, spec, _cuda_impl(spec, *_data(x))))


@add_layer_norm.register_fake
def _(*args: Any) -> tuple[Tensor, ...]:
    x, spec = _layer_args(args)
    return _fake_forward(x, spec, stats=2)


def _setup_layer_norm(ctx, inputs, output) -> None:
    x, spec = _layer_args(inputs)
    _, residual_out, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    _save(ctx, x, spec, residual_out, mean, rstd, LAYER_TENSORS, len(inputs))


def _backward_layer_norm(ctx, grad_normalized, grad_residual_out, _grad_mean, _grad_rstd):
    return _backward(ctx, grad_normalized, grad_residual_out)


add_layer_norm.register_autograd(_backward_layer_norm, setup_context=_setup_layer_norm)


# ---- add_rms_norm ---------------------------------------------------------------------------


@torch.library.custom_op("blockir::add_rms_norm", mutates_args=(), schema=RMS_SCHEMA)
def add_rms_norm(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    x, spec = _rms_args(args)
    normalized, residual_out, _, rstd = _forward(x, spec, _cpu_impl)
    return _contiguous(normalized, residual_out, rstd)


@add_rms_norm.register_kernel("cuda")
def _add_rms_norm_cuda(*args: Any) -> tuple[Tensor, ...]:
    x, spec = _rms_args(args)
    normalized, residual_out, _, rstd = _forward(x, spec, _cuda_impl(spec, *_data(x)))
    return _contiguous(normalized, residual_out, rstd)


@add_rms_norm.register_fake
def _(*args: Any) -> tuple[Tensor, ...]:
    x, spec = _rms_args(args)
    return _fake_forward(x, spec, stats=1)


def _setup_rms_norm(ctx, inputs, output) -> None:
    x, spec = _rms_args(inputs)
    _, residual_out, rstd = output
    ctx.mark_non_differentiable(rstd)
    _save(ctx, x, spec, residual_out, None, rstd, RMS_TENSORS, len(inputs))


def _backward_rms_norm(ctx, grad_normalized, grad_residual_out, _grad_rstd):
    return _backward(ctx, grad_normalized, grad_residual_out)


add_rms_norm.register_autograd(_backward_rms_norm, setup_context=_setup_rms_norm)


# ---- shared backward ------------------------------------------------------------------------


def _save(ctx, x: Inputs, spec: BoundarySpec, residual_out: Tensor, mean: Tensor | None, rstd: Tensor,
          tensors: Sequence[str], arity: int) -> None:
    """Save the new residual stream and the row statistics; the branch only when its scale needs a gradient.
    ``tensors`` are the op's tensor arguments, first of its ``arity``."""
    keep_branch = x.branch_scale is not None and ctx.needs_input_grad[tensors.index("branch_scale")]
    ctx.spec, ctx.tensors, ctx.arity, ctx.branch_dtype = spec, tuple(tensors), arity, x.branch.dtype
    saved = {**x._asdict(), "residual_out": residual_out, "mean": mean, "rstd": rstd,
             "branch": x.branch if keep_branch else None}
    ctx.save_for_backward(*(saved[name] for name in SAVED))
    # an unused output's gradient comes as None, not as a zero tensor autograd would make without the
    # output's subclass (a plain tensor beside DTensor gradients): the backward then skips it
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_normalized: Tensor | None, grad_residual_out: Tensor | None) -> tuple[Tensor | None, ...]:
    """A gradient for each of the op's arguments: its differentiable inputs', None for the rest."""
    saved = ctx.saved_tensors
    if grad_normalized is None:
        grad_normalized = torch.zeros_like(saved[0])  # the new stream's shape, in its type
    t = BackwardInputs(grad_normalized, grad_residual_out, *saved)
    s: BoundarySpec = ctx.spec
    grads = add_norm_backward(*t, s.family.value, s.eps, s.offset, s.cast, s.p, s.training, s.branch_scale_const,
                              s.shortcut_scale, ctx.branch_dtype, s.accum)
    present = {"branch": True, "residual": True, "weight": t.weight is not None, "bias": t.bias is not None,
               "branch_bias": t.branch_bias is not None, "branch_scale": t.branch is not None}
    by_name = {name: g if present[name] else None for name, g in zip(DIFFERENTIABLE, grads)}
    return tuple(by_name.get(name) for name in ctx.tensors) + (None,) * (ctx.arity - len(ctx.tensors))


@torch.library.custom_op("blockir::add_norm_backward", mutates_args=(), schema=BACKWARD_SCHEMA)
def add_norm_backward(*args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_branch_scale)``; absent ones are empty.

    ``d_branch_scale`` is computed only when ``branch`` is given.
    """
    t, branch_dtype, spec = _backward_args(args)
    return _fill_absent(_cpu_impl.backward(t, branch_dtype, spec), t.residual_out)


@add_norm_backward.register_kernel("cuda")
def _add_norm_backward_cuda(*args: Any) -> tuple[Tensor, ...]:
    t, branch_dtype, spec = _backward_args(args)
    impl = _cuda_impl(spec, *_data(t), extra=(branch_dtype,))
    return _fill_absent(impl.backward(t, branch_dtype, spec), t.residual_out)


def _fill_absent(grads: tuple[Tensor | None, ...], like: Tensor) -> tuple[Tensor, ...]:
    # a custom op cannot return None, so an absent gradient travels as an empty tensor
    return tuple(like.new_empty(0) if g is None else g.contiguous() for g in grads)


@add_norm_backward.register_fake
def _(*args: Any) -> tuple[Tensor, ...]:
    t, branch_dtype, _ = _backward_args(args)
    residual_out = t.residual_out

    def like(x: Tensor | None) -> Tensor:
        return residual_out.new_empty(0) if x is None else x.new_empty(x.shape)

    return (
        residual_out.new_empty(residual_out.shape, dtype=branch_dtype),
        residual_out.new_empty(residual_out.shape),
        like(t.weight),
        like(t.bias),
        like(t.branch_bias),
        like(t.branch_scale if t.branch is not None else None),
    )
