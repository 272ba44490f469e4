"""Launching the fused boundary's Triton kernels (``jit.py``), forward and backward.

A row of ``D`` values fits one block up to ``MAX_ROW_BLOCK`` (the row kernels);
wider rows use the looped kernels in ``LOOP_BLOCK``-wide chunks. The launchers
have the contract of ``reference.forward`` / ``reference.backward``, so the ops
can run either. ``load_interpreted`` gives a copy that runs the kernels on CPU
tensors under the Triton interpreter.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
import triton
import triton.language as tl
from torch import Tensor

from blockir.norms.rmsnorm import CASTS as CAST_ORDERS
from blockir.lower.fused import jit
from blockir.lower.fused.spec import (
    HALF_DTYPES, BackwardInputs, BoundarySpec, Family, Inputs, norm_dtype, output_dtype, update_dtypes,
)
from blockir.lower.rng import drop_threshold

MAX_ROW_BLOCK = 16384
LOOP_BLOCK = 4096
CPU_BACKWARD_PROGRAMS = 4

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


# ---- launchers ------------------------------------------------------------------------------


def _tl_dtype(dtype: torch.dtype) -> tl.dtype:
    try:
        return _TL_DTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"the fused Triton kernels do not support {dtype}") from None


def _block(width: int, block_size: int | None) -> tuple[int, bool]:
    """``(BLOCK, looped)``: one block per row when it fits, else chunks of ``block_size`` or ``LOOP_BLOCK``."""
    whole = triton.next_power_of_2(width)
    if block_size is None:
        return (whole, False) if whole <= MAX_ROW_BLOCK else (LOOP_BLOCK, True)
    block = triton.next_power_of_2(block_size)
    return (whole, False) if block >= whole else (block, True)


def _num_warps(block: int) -> int:
    # about 32 fp32 values per thread per live row vector keeps the widest rows out of local memory
    return 32 if block >= 16384 else 16 if block >= 8192 else 8 if block >= 2048 else 4


def _rows(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def _common_flags(spec: BoundarySpec, weight: Tensor | None, branch_bias: Tensor | None,
                  branch_scale: Tensor | None, residual_dtype: torch.dtype, t1: torch.dtype, t2: torch.dtype) -> dict:
    w_dtype = weight.dtype if weight is not None else torch.float32
    return dict(
        LAYER=spec.family is Family.LAYER,
        HAS_W=weight is not None,
        HAS_BRANCH_BIAS=branch_bias is not None,
        SCALE=0 if branch_scale is None else 1 if branch_scale.numel() == 1 else 2,
        HAS_CONST=spec.branch_scale_const != 1.0,
        HAS_SHORTCUT=spec.shortcut_scale != 1.0,
        DROPOUT=spec.dropout_active,
        CAST=CAST_ORDERS.index(spec.cast),
        OFFSET=spec.offset,
        W_HALF=w_dtype in HALF_DTYPES,
        T1=_tl_dtype(t1),
        T2=_tl_dtype(t2),
        RES=_tl_dtype(residual_dtype),
        W_T=_tl_dtype(w_dtype),
        SOFT=jit.INTERPRETED,
    )


def supports(spec: BoundarySpec, *dtypes: torch.dtype) -> bool:
    """Whether the kernels cover this boundary: fp32 statistics, fp32/bf16/fp16 tensors."""
    return spec.accum == torch.float32 and all(dt in _TL_DTYPES for dt in dtypes)


def _check_accum(spec: BoundarySpec) -> None:
    if spec.accum != torch.float32:
        raise NotImplementedError(f"the fused Triton kernels accumulate in float32, not {spec.accum}")


def _threshold(spec: BoundarySpec) -> int:
    return drop_threshold(spec.p) if spec.dropout_active else 0


def forward(x: Inputs, spec: BoundarySpec, block_size: int | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """``(normalized, residual_out, mean, rstd)``, same contract as ``reference.forward``."""
    _check_accum(spec)
    branch, residual, weight, bias, branch_bias, branch_scale, dropout_key = x
    shape, width, device = residual.shape, residual.shape[-1], residual.device
    b2, r2 = _rows(branch), _rows(residual)
    rows = r2.shape[0]
    t1, t2 = update_dtypes(branch.dtype, branch_bias, branch_scale)
    weight_dtype = None if weight is None else weight.dtype
    norm_out = output_dtype(spec, residual.dtype, weight_dtype)
    out = torch.empty((rows, width), dtype=norm_out, device=device)
    residual_out = torch.empty((rows, width), dtype=residual.dtype, device=device)
    mean = torch.empty(rows, dtype=torch.float32, device=device) if spec.family is Family.LAYER else None
    rstd = torch.empty(rows, dtype=torch.float32, device=device)
    if rows and width:
        block, looped = _block(width, block_size)
        kernel = jit.forward_looped_kernel if looped else jit.forward_row_kernel
        kernel[(rows,)](
            b2, r2, _or(weight, rstd), _or(bias, rstd), _or(branch_bias, rstd), _or(branch_scale, rstd),
            _key(dropout_key, spec, device, rstd),
            out, residual_out, _or(mean, rstd), rstd,
            width, spec.eps, _threshold(spec), spec.keep_scale, spec.branch_scale_const, spec.shortcut_scale,
            HAS_B=bias is not None,
            NORM_T=_tl_dtype(norm_dtype(spec, residual.dtype, weight_dtype)),
            OUT_T=_tl_dtype(norm_out),
            BLOCK=block,
            num_warps=_num_warps(block),
            # no FMA contraction: each product is rounded on its own, as in the unfused eager graph
            enable_fp_fusion=False,
            **_common_flags(spec, weight, branch_bias, branch_scale, residual.dtype, t1, t2),
        )
    # the statistics keep the leading axes: a stream sharded on any of them shards its statistics the same way
    stats = shape[:-1]
    return out.view(shape), residual_out.view(shape), None if mean is None else mean.view(stats), rstd.view(stats)


def _or(t: Tensor | None, placeholder: Tensor) -> Tensor:
    # absent operands are never read (their constexpr flag is off) but still need a pointer
    return placeholder if t is None else t.contiguous()


def _key(dropout_key: Tensor | None, spec: BoundarySpec, device: torch.device, placeholder: Tensor) -> Tensor:
    if not spec.dropout_active:
        return placeholder
    assert dropout_key is not None
    return dropout_key.to(device, non_blocking=True)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _backward_programs(rows: int, device: torch.device) -> int:
    # two programs per SM: enough rows in flight to hide latency, few partial-sum rows to reduce
    if device.type == "cuda":
        return min(rows, 2 * _multiprocessors(device))
    return min(rows, CPU_BACKWARD_PROGRAMS)


def backward(
    t: BackwardInputs, branch_dtype: torch.dtype, spec: BoundarySpec, block_size: int | None = None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """``(d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_branch_scale)``, as ``reference.backward``."""
    _check_accum(spec)
    (grad_normalized, grad_residual_out, residual_out, mean, rstd, branch, weight, bias, branch_bias, branch_scale,
     dropout_key) = t
    shape, width, device = residual_out.shape, residual_out.shape[-1], residual_out.device
    x2 = _rows(residual_out)
    rows = x2.shape[0]
    d_branch = torch.empty((rows, width), dtype=branch_dtype, device=device)
    d_residual = torch.empty((rows, width), dtype=residual_out.dtype, device=device)
    scale_grad = branch_scale is not None and branch is not None
    programs = max(_backward_programs(rows, device), 1)
    block, looped = _block(width, block_size)
    zeros_or_empty = torch.zeros if looped else torch.empty

    def partial(present: bool) -> Tensor | None:
        return zeros_or_empty((programs, width), dtype=torch.float32, device=device) if present else None

    dw, db, dbb, dscale = partial(weight is not None), partial(bias is not None), partial(branch_bias is not None), \
        partial(scale_grad)
    if rows and width:
        t1, t2 = update_dtypes(branch_dtype, branch_bias, branch_scale)
        kernel = jit.backward_looped_kernel if looped else jit.backward_row_kernel
        grad_res = _rows(grad_residual_out) if grad_residual_out is not None else None
        kernel[(programs,)](
            _rows(grad_normalized), _or(grad_res, rstd), x2, _or(mean, rstd), rstd,
            _or(_rows(branch) if scale_grad else None, rstd), _or(weight, rstd), _or(branch_bias, rstd),
            _or(branch_scale, rstd), _key(dropout_key, spec, device, rstd),
            d_branch, d_residual, _or(dw, rstd), _or(db, rstd), _or(dbb, rstd), _or(dscale, rstd),
            rows, width, triton.cdiv(rows, programs), _threshold(spec), spec.keep_scale, spec.branch_scale_const,
            spec.shortcut_scale,
            HAS_B=bias is not None,
            HAS_GRAD_RES=grad_res is not None,
            SCALE_GRAD=scale_grad,
            BRANCH_T=_tl_dtype(branch_dtype),
            BLOCK=block,
            num_warps=_num_warps(block),
            enable_fp_fusion=True,
            **_common_flags(spec, weight, branch_bias, branch_scale, residual_out.dtype, t1, t2),
        )

    def reduce(part: Tensor | None, like: Tensor | None) -> Tensor | None:
        return None if part is None or like is None else part.sum(0).to(like.dtype)

    d_scale = None
    if scale_grad:
        assert branch_scale is not None and dscale is not None
        per_channel = dscale.sum(0) * spec.branch_scale_const
        d_scale = (per_channel if branch_scale.numel() == width else per_channel.sum()).reshape(branch_scale.shape)
        d_scale = d_scale.to(branch_scale.dtype)
    return (d_branch.view(shape), d_residual.view(shape), reduce(dw, weight), reduce(db, bias),
            reduce(dbb, branch_bias), d_scale)


def load_interpreted() -> ModuleType:
    """A separate copy of this module whose kernels run on CPU tensors under the Triton interpreter.

    ``triton.jit`` picks the interpreter when the kernel is defined, so copies of
    ``jit.py`` and of this module are executed with ``TRITON_INTERPRET=1`` and the
    copy launches the interpreted kernels; these modules themselves are left
    untouched and keep launching compiled kernels on a GPU.
    """
    name = f"{__name__}_interpreted"
    if name in sys.modules:
        return sys.modules[name]
    with _interpreter():
        device_code = _copy(jit)
        module = _copy(sys.modules[__name__])
    module.jit = device_code
    sys.modules[name] = module
    return module


@contextmanager
def _interpreter() -> Iterator[None]:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _copy(original: ModuleType) -> ModuleType:
    """``original`` executed afresh from its file, under a name of its own."""
    module_spec = importlib.util.spec_from_file_location(f"{original.__name__}_interpreted", original.__file__)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
